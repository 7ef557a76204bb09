/* The codebook of an open reader (spec 13): the embedded CBK1 or the
 * external codebook attached to it; and the key settings a codebook file's
 * training recorded (fkvf_codebook_key_settings). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* ---- codebooks ------------------------------------------------------------------ */

int rd_codebook(fkvf_reader *r, fkvf_codebook_shape *shape, const void **contents, size_t *size,
                uint8_t hash[16])
{
    if (!r->cb_kind)
        return fkvf_fail(&r->diag, FKVF_E_NOT_FOUND, FKVF_NO_OFFSET, "13",
                         "the archive has no codebook");
    int rc = rd_cbk1_load(r); /* deferred by a source reader */
    if (rc)
        return rc;
    if (!r->cb_known) {
        char hx[33];
        fkvf_hex16(r->cb_ref_hash, hx);
        return fkvf_fail(&r->diag, FKVF_E_CODEBOOK, r->sections[r->cb_sec].e.offset, "13.5",
                         "external codebook %s (name hint \"%s\") is not attached", hx,
                         r->cb_ref_name);
    }
    fkvf_reader *src = r->cb_kind == 1 ? r : r->cb_file;
    size_t sec = r->cb_kind == 1 ? r->cb_sec : r->cb_file_sec;
    const uint8_t *p;
    uint64_t n;
    rc = rd_section_bytes(src, sec, &p, &n);
    if (rc) {
        if (src != r)
            fkvf_fail(&r->diag, rc, FKVF_NO_OFFSET, "13", "attached codebook: %s",
                      src->diag.msg);
        return rc;
    }
    if (shape)
        *shape = r->cb_shape;
    if (contents)
        *contents = p;
    if (size && !fkvf_tosz(n, size))
        return FKVF_E_LIMIT;
    if (hash)
        fkvf_xxh3_128(p, (size_t)n, hash);
    return FKVF_OK;
}

FKVF_API int fkvf_reader_codebook(fkvf_reader *r, fkvf_codebook_shape *shape,
                                  const void **contents, size_t *size, uint8_t hash[16])
{
    ENTER(r);
    return rd_codebook(r, shape, contents, size, hash);
}

FKVF_API int fkvf_reader_codebook_ref(const fkvf_reader *r, int *is_external, uint8_t hash[16],
                                      const char **name)
{
    ENTER(r);
    if (!is_external)
        return FKVF_E_INVALID_ARG;
    *is_external = r->cb_kind == 2;
    if (r->cb_kind == 2) {
        if (hash)
            memcpy(hash, r->cb_ref_hash, 16);
        if (name)
            *name = r->cb_ref_name;
    }
    return FKVF_OK;
}

int rd_attach_codebook(fkvf_reader *r, fkvf_reader *cf)
{
    if (!FKVF_HANDLE_IS_OPEN(cf, FKVF_HANDLE_READER) || cf == r)
        return FKVF_E_INVALID_ARG;
    char hx[33];
    fkvf_hex16(r->cb_ref_hash, hx);
    if (r->cb_kind != 2)
        return fkvf_fail(&r->diag, FKVF_E_STATE, FKVF_NO_OFFSET, "13.5",
                         "the archive does not refer to an external codebook");
    if (cf->has_desc || cf->cb_kind != 1)
        return fkvf_fail(&r->diag, FKVF_E_CODEBOOK, FKVF_NO_OFFSET, "13.4",
                         "%s is not a codebook file; expected codebook %s", cf->diag.name, hx);
    const uint8_t *p;
    uint64_t n;
    int rc = rd_cbk1_load(cf); /* a codebook file over a source: on first use */
    if (rc == FKVF_OK)
        rc = rd_section_bytes(cf, cf->cb_sec, &p, &n);
    if (rc)
        return fkvf_fail(&r->diag, FKVF_E_CODEBOOK, FKVF_NO_OFFSET, "13.5",
                         "codebook file %s unreadable: %s", cf->diag.name, cf->diag.msg);
    uint8_t h[16];
    fkvf_xxh3_128(p, (size_t)n, h);
    if (memcmp(h, r->cb_ref_hash, 16) != 0) {
        char got[33];
        fkvf_hex16(h, got);
        return fkvf_fail(&r->diag, FKVF_E_CODEBOOK, r->sections[r->cb_sec].e.offset, "13.5",
                         "codebook file %s has content hash %s; the archive expects %s",
                         cf->diag.name, got, hx);
    }
    if (!fkvf_cbk1_matches(&cf->cb_shape, &r->desc))
        return fkvf_fail(&r->diag, FKVF_E_CODEBOOK, FKVF_NO_OFFSET, "13.7",
                         "codebook %s does not match the descriptor's shape", hx);
    if (cf->cb_shape.layer_stages && !(r->hdr.required_features & FKVF_FEAT_LAYER_STAGES))
        return fkvf_fail(&r->diag, FKVF_E_CODEBOOK, FKVF_NO_OFFSET, "13.5",
                         "codebook %s has stage counts per layer, but the archive does not "
                         "declare the LAYER_STAGES feature",
                         hx);
    fkvf_codebook_shape saved = r->cb_shape;
    r->cb_shape = cf->cb_shape;
    if ((rc = rd_check_index_streams(r, FKVF_E_CODEBOOK, hx))) {
        r->cb_shape = saved;
        return rc;
    }
    r->cb_file = cf;
    r->cb_file_sec = cf->cb_sec;
    r->cb_known = 1;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_attach_codebook(fkvf_reader *r, fkvf_reader *cf)
{
    ENTER(r);
    return rd_attach_codebook(r, cf);
}

/* ---- a codebook file's key settings (train.* metadata, docs/codebooks.md) ---- */

/* Is entry e the UTF-8 text word? */
static int meta_word(const fkvf_meta_entry *e, const char *word)
{
    size_t n = strlen(word);
    return e->type == FKVF_META_UTF8 && e->value_len == n && !memcmp(e->value, word, n);
}

static void key_clash(fkvf_key_clash *c, const char *setting, const char *trained,
                      const char *given)
{
    c->setting = setting;
    snprintf(c->trained, sizeof c->trained, "%s", trained);
    snprintf(c->given, sizeof c->given, "%s", given);
}

static const char *rope_layout_name(unsigned layout)
{
    return layout == 2 ? "half-split" : "interleaved";
}

FKVF_API int fkvf_codebook_key_settings(fkvf_reader *codebook_file, uint32_t key_dim,
                                        fkvf_key_settings *k, fkvf_key_clash *clash)
{
    if (!codebook_file || !k || !clash)
        return FKVF_E_INVALID_ARG;
    memset(clash, 0, sizeof *clash);
    k->layout_taken = 0;
    fkvf_reader *r = codebook_file;
    fkvf_meta_entry e;
    char t[32], g[32];
    if (fkvf_reader_meta_find(r, "train.keys", &e) == FKVF_OK &&
        (meta_word(&e, "pre-rope") || meta_word(&e, "as-is"))) {
        uint8_t v = meta_word(&e, "pre-rope");
        if (!k->keys_set)
            k->pre_rope = v;
        else if (k->pre_rope != v && !k->no_rope)
            key_clash(clash, "keys", v ? "pre-rope" : "as-is", k->pre_rope ? "pre-rope" : "as-is");
    }
    int un_rotated = k->pre_rope && !k->no_rope; /* only then do the RoPE settings matter */
    if (fkvf_reader_meta_find(r, "train.rope_theta", &e) == FKVF_OK &&
        e.type == FKVF_META_F64 && isfinite(e.f64) && e.f64 > 0) {
        if (!k->theta_set) {
            k->theta = e.f64;
        } else if (k->theta != e.f64 && un_rotated && !clash->setting) {
            snprintf(t, sizeof t, "%.10g", e.f64);
            snprintf(g, sizeof g, "%.10g", k->theta);
            key_clash(clash, "rope_theta", t, g);
        }
    }
    if (fkvf_reader_meta_find(r, "train.rope_dims", &e) == FKVF_OK &&
        e.type == FKVF_META_U64 && e.u64 >= 2 && e.u64 <= key_dim && e.u64 % 2 == 0) {
        uint32_t given = k->dims ? k->dims : key_dim;
        if (!k->dims_set) {
            k->dims = (uint32_t)e.u64;
        } else if (given != e.u64 && un_rotated && !clash->setting) {
            snprintf(t, sizeof t, "%u", (unsigned)e.u64);
            snprintf(g, sizeof g, "%u", (unsigned)given);
            key_clash(clash, "rope_dims", t, g);
        }
    }
    if (fkvf_reader_meta_find(r, "train.rope_layout", &e) == FKVF_OK &&
        (meta_word(&e, "interleaved") || meta_word(&e, "half-split"))) {
        uint8_t v = meta_word(&e, "half-split") ? 2 : 1;
        if (!k->layout_set) {
            k->layout = v;
            k->layout_taken = 1;
        } else if (k->layout != v && un_rotated && !clash->setting) {
            key_clash(clash, "rope_layout", rope_layout_name(v), rope_layout_name(k->layout));
        }
    }
    return clash->setting ? FKVF_E_CODEBOOK : FKVF_OK;
}
