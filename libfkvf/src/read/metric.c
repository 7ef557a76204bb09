/* The codebook's encoder metric, a CMET section (spec 13.8): the checks of
 * the clause, made by fkvf_reader_metric (the encoders' use) and by full
 * verification, and the matrices handed to encoders. */
#include <string.h>

#include "alloc.h"
#include "le.h"
#include "metric_matrix.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

int rd_metric_check(fkvf_reader *r, size_t *sec, fkvf_cmet_hdr *h)
{
    size_t first = r->n_sections, n_cmet = 0;
    size_t i0 = 0;
    while (i0 < r->n_sections && r->sections[i0].e.type != FKVF_SECTION_CMET)
        i0++;
    if (i0 == r->n_sections) /* no CMET: nothing read (a codebook over a network stays there) */
        return fkvf_fail(&r->diag, FKVF_E_NOT_FOUND, FKVF_NO_OFFSET, "13.8",
                         "the file has no encoder metric (CMET)");
    /* the codebook section's own checks come first (spec 13.8) */
    int rc = r->cb_kind == 1 ? rd_cbk1_load(r) : FKVF_OK;
    if (rc)
        return rc;
    /* steps 1-4 (the header, the limit, the size) on every CMET, in chain
     * order; the first one's header is kept */
    for (size_t i = i0; i < r->n_sections; i++) {
        const rd_section *s = &r->sections[i];
        if (s->e.type != FKVF_SECTION_CMET)
            continue;
        const uint8_t *p;
        uint64_t n;
        fkvf_cmet_hdr hi;
        if ((rc = rd_section_bytes(r, i, &p, &n)) ||
            (rc = fkvf_cmet_parse(p, n, s->e.offset, s->e.key, &hi, &r->diag)))
            return rc;
        if (n_cmet++ == 0) {
            first = i;
            *h = hi;
        }
    }
    /* step 5: one CMET, in a chain with a CBK1 */
    const rd_section *s = &r->sections[first];
    if (n_cmet > 1)
        return FAIL(FKVF_E_CORRUPT, s->e.offset, "13.8",
                    "%zu CMET sections (at most one in a chain)", n_cmet);
    if (r->cb_kind != 1)
        return FAIL(FKVF_E_CORRUPT, s->e.offset, "13.8",
                    "a CMET section in a file without an embedded codebook (CBK1)%s",
                    r->cb_kind == 2 ? ": an archive that refers to an external codebook finds "
                                      "the metric in the codebook file"
                                    : "");
    const uint8_t *p;
    uint64_t n;
    if ((rc = rd_section_bytes(r, first, &p, &n)))
        return rc;
    /* step 6: bound to the CBK1 (whose own checks come first) */
    fkvf_codebook_shape cb;
    uint8_t hash[16];
    if ((rc = rd_codebook(r, &cb, NULL, NULL, hash)) ||
        (rc = fkvf_cmet_match(h, &cb, hash, s->e.offset, &r->diag)))
        return rc;
    /* step 7: every matrix */
    uint32_t dmax = 0;
    if ((h->parts & 1) && h->key_dim > dmax)
        dmax = h->key_dim;
    if ((h->parts & 2) && h->value_dim > dmax)
        dmax = h->value_dim;
    size_t nn = (size_t)dmax * dmax;
    float *m = fkvf_malloc(r->alloc, nn * sizeof(float));
    double *l = fkvf_malloc(r->alloc, nn * sizeof(double));
    if (!m || !l)
        rc = FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, "13.8",
                  "no memory to check the encoder metric's matrices");
    else
        rc = fkvf_cmet_matrices(p, h, s->e.offset, m, l, &r->diag);
    fkvf_free(r->alloc, m);
    fkvf_free(r->alloc, l);
    if (rc)
        return rc;
    *sec = first;
    return FKVF_OK;
}

/* The matrices of part kv, binary32, into a new array. */
static float *metric_part(fkvf_reader *r, const uint8_t *p, const fkvf_cmet_hdr *h, unsigned kv)
{
    uint32_t dim = kv ? h->value_dim : h->key_dim;
    size_t n_tabs = (size_t)h->n_layers * h->n_heads, nn = (size_t)dim * dim;
    float *out = fkvf_calloc(r->alloc, n_tabs, nn * sizeof(float));
    if (!out)
        return NULL;
    for (size_t tab = 0; tab < n_tabs; tab++) {
        const uint8_t *src = p + fkvf_cmet_matrix_off(h, tab, kv);
        for (size_t i = 0; i < nn; i++)
            out[tab * nn + i] = fkvf_ldf32(src + 4 * i);
    }
    return out;
}

FKVF_API int fkvf_reader_metric(fkvf_reader *r, fkvf_rvq_metric *out)
{
    ENTER(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    out->keys = out->values = NULL;
    if (r->cb_kind == 2) {
        /* a CMET of the archive itself is a fault (step 5: it belongs with a
         * CBK1), whatever the codebook file holds */
        size_t sec;
        fkvf_cmet_hdr h;
        int rc = rd_metric_check(r, &sec, &h);
        if (rc != FKVF_E_NOT_FOUND)
            return rc; /* never FKVF_OK here: no CBK1 in the chain */
        fkvf_diag_clear(&r->diag);
        if (!r->cb_known)
            return FAIL(FKVF_E_CODEBOOK, r->sections[r->cb_sec].e.offset, "13.5",
                        "the external codebook is not attached: its file holds the metric");
        rc = fkvf_reader_metric(r->cb_file, out);
        if (rc && rc != FKVF_E_NOT_FOUND)
            fkvf_fail(&r->diag, rc, FKVF_NO_OFFSET, "13.8", "codebook file %s: %s",
                      r->cb_file->diag.name, r->cb_file->diag.msg);
        return rc;
    }
    if (!r->metric_loaded) {
        size_t sec;
        fkvf_cmet_hdr h;
        int rc = rd_metric_check(r, &sec, &h); /* without a CBK1: NOT_FOUND or CORRUPT */
        if (rc)
            return rc;
        const uint8_t *p;
        uint64_t n;
        if ((rc = rd_section_bytes(r, sec, &p, &n)))
            return rc;
        float *k = (h.parts & 1) ? metric_part(r, p, &h, 0) : NULL;
        float *v = (h.parts & 2) ? metric_part(r, p, &h, 1) : NULL;
        if (((h.parts & 1) && !k) || ((h.parts & 2) && !v)) {
            fkvf_free(r->alloc, k);
            fkvf_free(r->alloc, v);
            return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, "13.8",
                        "no memory for the encoder metric's matrices");
        }
        r->metric_k = k;
        r->metric_v = v;
        r->metric_loaded = 1;
    }
    out->keys = r->metric_k;
    out->values = r->metric_v;
    return FKVF_OK;
}
