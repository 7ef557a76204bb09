/* The FKVF reader: open (spec 7), the effective directory, and zero-copy
 * access to descriptor, metadata, exact rows and symbol streams. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* A handle whose open failed is still set (for its message, which stays)
 * but may hold a partly loaded state: nothing of it is served. */
int rd_enter(const fkvf_reader *r) { return FKVF_HANDLE_ENTER(r, FKVF_HANDLE_READER, "reader"); }

/* ---- section bytes --------------------------------------------------------- */

static int inflate_exact(fkvf_reader *r, const rd_section *s, const uint8_t *src, uint8_t *dst)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK)
        return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "zlib: inflateInit failed");
    /* zlib counts in uInt: feed in chunks so sizes above 4 GiB work. */
    uint64_t in_left = s->e.stored_size, out_left = s->e.size;
    const uint8_t *in = src;
    uint8_t *out = dst;
    int zr = Z_OK;
    /* inflate() refuses a NULL next_out even with avail_out == 0: an empty
     * section (size 0) never sets it in the loop below. */
    z.next_out = dst;
    while (zr == Z_OK) {
        if (z.avail_in == 0 && in_left) {
            uInt c = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
            z.next_in = (Bytef *)(uintptr_t)in;
            z.avail_in = c;
            in += c;
            in_left -= c;
        }
        if (z.avail_out == 0 && out_left) {
            uInt c = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
            z.next_out = out;
            z.avail_out = c;
            out += c;
            out_left -= c;
        }
        uInt before_in = z.avail_in, before_out = z.avail_out;
        zr = inflate(&z, Z_NO_FLUSH);
        if (zr == Z_BUF_ERROR && z.avail_in == before_in && z.avail_out == before_out)
            break; /* no progress possible */
        if (zr == Z_BUF_ERROR)
            zr = Z_OK;
    }
    uint64_t produced = z.total_out;
    int ended = zr == Z_STREAM_END;
    int trailing = z.avail_in != 0 || in_left != 0;
    inflateEnd(&z);
    if (!ended)
        return FAIL(FKVF_E_DEFLATE, s->e.offset, "4.4",
                    "section: deflate stream invalid or longer than size %llu",
                    (unsigned long long)s->e.size);
    if (produced != s->e.size || trailing)
        return FAIL(FKVF_E_DEFLATE, s->e.offset, "4.4",
                    "section: inflates to %llu bytes (size says %llu)%s",
                    (unsigned long long)produced, (unsigned long long)s->e.size,
                    trailing ? ", with bytes after the stream" : "");
    return FKVF_OK;
}

static int section_check(fkvf_reader *r, rd_section *s)
{
    const uint8_t *src = r->data + s->e.offset;
    size_t stored;
    if (!fkvf_tosz(s->e.stored_size, &stored))
        return FAIL(FKVF_E_LIMIT, s->e.offset, "15", "section too large for this machine");
    uint64_t sum = fkvf_xxh3_64(src, stored, s->e.offset);
    if (sum != s->e.checksum) {
        char tn[12];
        fkvf_type_name(s->e.type, tn);
        return FAIL(FKVF_E_CHECKSUM, s->e.offset, "4.6",
                    "section %s (key %llu): checksum stored %016llx, computed %016llx", tn,
                    (unsigned long long)s->e.key, (unsigned long long)s->e.checksum,
                    (unsigned long long)sum);
    }
    /* Inflate once: views of the buffer handed out earlier stay valid when
     * verify re-checks the section (the checksum above covers the input). */
    if ((s->e.flags & FKVF_SECTION_DEFLATE) && !s->inflated) {
        size_t n;
        if (!fkvf_tosz(s->e.size, &n))
            return FAIL(FKVF_E_LIMIT, s->e.offset, "15", "section too large for this machine");
        uint8_t *buf = fkvf_malloc(r->alloc, n ? n : 1);
        if (!buf)
            return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory to inflate %zu bytes", n);
        int rc = inflate_exact(r, s, src, buf);
        if (rc) {
            fkvf_free(r->alloc, buf);
            return rc;
        }
        s->inflated = buf;
    }
    s->checked = 1;
    return FKVF_OK;
}

int rd_section_bytes(fkvf_reader *r, size_t i, const uint8_t **p, uint64_t *size)
{
    rd_section *s = &r->sections[i];
    if (!s->checked) {
        int rc = section_check(r, s);
        if (rc)
            return rc;
    }
    *p = s->inflated ? s->inflated : r->data + s->e.offset;
    *size = s->e.size;
    return FKVF_OK;
}

/* ---- trailers and the commit chain (spec 6, 7) ---------------------------- */

/* Full validation of the trailer at `off` (spec 6.1) including the directory
 * checksum and header. */
static int trailer_at(fkvf_reader *r, uint64_t off, fkvf_trailer *t, fkvf_dirhdr *dh)
{
    int rc = fkvf_trailer_parse(r->data + off, off, t, &r->diag);
    if (rc)
        return rc;
    size_t dsz;
    if (!fkvf_tosz(t->dir_size, &dsz))
        return FAIL(FKVF_E_LIMIT, off + 24, "15", "directory too large");
    uint64_t sum = fkvf_xxh3_64(r->data + t->dir_offset, dsz, t->dir_offset);
    if (sum != t->dir_checksum)
        return FAIL(FKVF_E_CHECKSUM, t->dir_offset, "6.2",
                    "directory of commit %llu: checksum stored %016llx, computed %016llx",
                    (unsigned long long)t->commit_seq, (unsigned long long)t->dir_checksum,
                    (unsigned long long)sum);
    rc = fkvf_dirhdr_parse(r->data + t->dir_offset, t->dir_offset, dh, &r->diag);
    if (rc)
        return rc;
    if (dh->commit_seq != t->commit_seq)
        return FAIL(FKVF_E_CHAIN, t->dir_offset + 8, "5.3",
                    "directory.commit_seq %llu differs from the trailer's %llu",
                    (unsigned long long)dh->commit_seq, (unsigned long long)t->commit_seq);
    if (t->dir_size != FKVF_DIRHDR_SIZE + (uint64_t)dh->entry_count * FKVF_DIRENT_SIZE)
        return FAIL(FKVF_E_CORRUPT, t->dir_offset + 4, "5.2",
                    "directory: %u entries need %llu bytes, trailer says %llu", dh->entry_count,
                    (unsigned long long)(FKVF_DIRHDR_SIZE +
                                         (uint64_t)dh->entry_count * FKVF_DIRENT_SIZE),
                    (unsigned long long)t->dir_size);
    return FKVF_OK;
}

/* Trailers the torn-tail scan found to lead to a broken chain (spec 18.4:
 * remember what was validated, so that each trailer is examined once). */
typedef struct bad_set {
    uint64_t *slot; /* offsets + 1; 0 = empty */
    size_t mask, n;
} bad_set;

static int bad_has(const bad_set *b, uint64_t off)
{
    if (!b || !b->slot)
        return 0;
    for (size_t k = (size_t)((off / 64) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & b->mask;
         b->slot[k]; k = (k + 1) & b->mask)
        if (b->slot[k] == off + 1)
            return 1;
    return 0;
}

static void bad_add(fkvf_reader *r, bad_set *b, uint64_t off)
{
    if (!b || bad_has(b, off))
        return;
    if (!b->slot || 2 * (b->n + 1) > b->mask + 1) {
        size_t cap = b->slot ? 2 * (b->mask + 1) : 64;
        uint64_t *ns = fkvf_calloc(r->alloc, cap, sizeof *ns);
        if (!ns)
            return; /* only a memo: without it the scan is slower, not wrong */
        size_t nm = cap - 1;
        for (size_t i = 0; b->slot && i <= b->mask; i++) {
            if (!b->slot[i])
                continue;
            size_t k = (size_t)(((b->slot[i] - 1) / 64) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & nm;
            while (ns[k])
                k = (k + 1) & nm;
            ns[k] = b->slot[i];
        }
        fkvf_free(r->alloc, b->slot);
        b->slot = ns;
        b->mask = nm;
    }
    size_t k = (size_t)((off / 64) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & b->mask;
    while (b->slot[k])
        k = (k + 1) & b->mask;
    b->slot[k] = off + 1;
    b->n++;
}

/* Walk back from the head trailer; fill r->commits in commit order. With
 * `bad` (the torn-tail scan), a walk that reaches a trailer known to lead to
 * a broken chain stops there, and the trailers of a failed walk are added. */
static int load_chain(fkvf_reader *r, uint64_t head, int *head_ok, bad_set *bad)
{
    size_t cap = 0;
    *head_ok = 0;
    uint64_t off = head, expect_seq = 0;
    int rc = FKVF_OK;
    for (;;) {
        fkvf_trailer t;
        fkvf_dirhdr dh;
        if (off != head && bad_has(bad, off)) {
            rc = FAIL(FKVF_E_CHAIN, off, "7.1",
                      "commit chain: earlier trailer at %llu leads to a broken chain",
                      (unsigned long long)off);
            break;
        }
        rc = trailer_at(r, off, &t, &dh);
        if (rc) {
            if (off != head)
                rc = fkvf_fail_replace(&r->diag, FKVF_E_CHAIN, off, "7.1",
                                       "commit chain: earlier trailer invalid: %s", r->diag.msg);
            break;
        }
        if (off == head)
            *head_ok = 1;
        if (expect_seq && t.commit_seq != expect_seq) {
            rc = FAIL(FKVF_E_CHAIN, off + 8, "7.1",
                      "commit chain: trailer at %llu has commit_seq %llu, expected %llu",
                      (unsigned long long)off, (unsigned long long)t.commit_seq,
                      (unsigned long long)expect_seq);
            break;
        }
        if (fkvf_grow(r->alloc, (void **)&r->commits, &cap, r->n_commits + 1, sizeof(rd_commit)))
            return FAIL(FKVF_E_NOMEM, off, NULL, "no memory for the commit list");
        rd_commit *c = &r->commits[r->n_commits++];
        memset(c, 0, sizeof *c);
        c->seq = t.commit_seq;
        c->trailer_off = off;
        c->dir_off = t.dir_offset;
        c->dir_size = t.dir_size;
        c->dh = dh;
        if (t.commit_seq == 1)
            break;
        expect_seq = t.commit_seq - 1;
        off = t.prev_trailer;
    }
    if (rc) {
        /* every trailer walked leads to the same broken link */
        for (size_t i = 0; i < r->n_commits; i++)
            bad_add(r, bad, r->commits[i].trailer_off);
        if (!*head_ok)
            bad_add(r, bad, head);
        return rc;
    }
    /* reverse into commit order, set regions */
    for (size_t i = 0, j = r->n_commits - 1; i < j; i++, j--) {
        rd_commit tmp = r->commits[i];
        r->commits[i] = r->commits[j];
        r->commits[j] = tmp;
    }
    for (size_t i = 0; i < r->n_commits; i++)
        r->commits[i].region_start = i ? r->commits[i - 1].trailer_off + 64 : FKVF_HEADER_SIZE;
    return FKVF_OK;
}

int rd_find_head(fkvf_reader *r)
{
    uint64_t size = r->size;
    if (size < FKVF_HEADER_SIZE + 128)
        return FAIL(FKVF_E_TRUNCATED, size, "7.2",
                    "file has %llu bytes; a valid file has at least 192 (header, directory, "
                    "trailer)",
                    (unsigned long long)size);
    uint64_t last = (size & ~(uint64_t)63) - 64;
    int first_rc = FKVF_OK;
    fkvf_diag first_diag;
    if (size % 64) {
        first_rc = FAIL(FKVF_E_TRUNCATED, size, "7.2",
                        "file length %llu is not a multiple of 64 (truncated or torn)",
                        (unsigned long long)size);
    } else {
        int head_ok;
        first_rc = load_chain(r, last, &head_ok, NULL);
        if (first_rc == FKVF_OK) {
            r->committed_size = size;
            return FKVF_OK;
        }
        /* A valid final trailer means the last append completed: damage
         * behind it is not a torn tail, and no earlier commit is served. */
        if (head_ok)
            return first_rc;
    }
    first_diag = r->diag;
    /* Torn tail: scan back for the latest trailer with a valid chain. */
    bad_set bad;
    memset(&bad, 0, sizeof bad);
    int rc = first_rc;
    for (uint64_t off = last; off >= FKVF_HEADER_SIZE + 64; off -= 64) {
        if (memcmp(r->data + off, fkvf_trailer_magic, 8) != 0 || (size % 64 == 0 && off == last) ||
            bad_has(&bad, off))
            continue;
        r->n_commits = 0;
        fkvf_diag_clear(&r->diag);
        int head_ok;
        if (load_chain(r, off, &head_ok, &bad) == FKVF_OK) {
            r->committed_size = off + 64;
            r->torn_bytes = size - r->committed_size;
            rc = FKVF_OK;
            if (r->flags & FKVF_OPEN_STRICT)
                rc = FAIL(FKVF_E_TORN, off + 64, "7.2",
                          "%llu bytes after the last valid commit (seq %llu) at %llu: torn "
                          "tail; first problem: %s",
                          (unsigned long long)r->torn_bytes,
                          (unsigned long long)r->commits[r->n_commits - 1].seq,
                          (unsigned long long)(off + 64), first_diag.msg);
            fkvf_free(r->alloc, bad.slot);
            return rc;
        }
    }
    fkvf_free(r->alloc, bad.slot);
    r->n_commits = 0;
    r->diag = first_diag;
    return first_rc;
}

/* ---- directories ------------------------------------------------------------ */

static int known_type(uint32_t t)
{
    return t == FKVF_SECTION_DESC || t == FKVF_SECTION_META || t == FKVF_SECTION_VTXS ||
           t == FKVF_SECTION_CBK1 || t == FKVF_SECTION_CBRF || t == FKVF_SECTION_EXAC ||
           t == FKVF_SECTION_STRM;
}

int rd_load_directories(fkvf_reader *r)
{
    uint64_t total = 0;
    for (size_t i = 0; i < r->n_commits; i++)
        total += r->commits[i].dh.entry_count;
    if (total > FKVF_MAX_SECTIONS)
        return FAIL(FKVF_E_LIMIT, FKVF_NO_OFFSET, "15", "%llu sections in all commits > %llu",
                    (unsigned long long)total, (unsigned long long)FKVF_MAX_SECTIONS);
    r->sections = fkvf_calloc(r->alloc, total ? (size_t)total : 1, sizeof(rd_section));
    if (!r->sections)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for %llu sections",
                    (unsigned long long)total);
    for (size_t ci = 0; ci < r->n_commits; ci++) {
        rd_commit *c = &r->commits[ci];
        c->first_section = r->n_sections;
        uint64_t prev_end = c->region_start;
        for (uint32_t k = 0; k < c->dh.entry_count; k++) {
            uint64_t eoff = c->dir_off + FKVF_DIRHDR_SIZE + (uint64_t)k * FKVF_DIRENT_SIZE;
            rd_section *s = &r->sections[r->n_sections];
            fkvf_dirent_read(r->data + eoff, &s->e);
            s->commit_seq = c->seq;
            const fkvf_dirent *e = &s->e;
            char tn[12];
            fkvf_type_name(e->type, tn);
            if (e->flags & ~(uint32_t)(FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE))
                return FAIL(FKVF_E_CORRUPT, eoff + 4, "4.2",
                            "directory entry %u (%s): unknown flag bits 0x%x", k, tn, e->flags);
            if (fkvf_ld64(r->data + eoff + 48) || fkvf_ld64(r->data + eoff + 56))
                return FAIL(FKVF_E_CORRUPT, eoff + 48, "4.2",
                            "directory entry %u (%s): reserved bytes not zero", k, tn);
            if (e->type == FKVF_SECTION_DIRC)
                return FAIL(FKVF_E_CORRUPT, eoff, "4.3",
                            "directory entry %u: a directory is never listed as a section", k);
            if (e->offset % 64)
                return FAIL(FKVF_E_ALIGN, eoff + 8, "4.1",
                            "directory entry %u (%s): offset %llu not a multiple of 64", k, tn,
                            (unsigned long long)e->offset);
            if (e->stored_size > FKVF_MAX_SECTION_SIZE || e->size > FKVF_MAX_SECTION_SIZE)
                return FAIL(FKVF_E_LIMIT, eoff + 16, "15",
                            "directory entry %u (%s): size %llu / stored_size %llu over 2^48", k,
                            tn, (unsigned long long)e->size, (unsigned long long)e->stored_size);
            /* stored_size <= 2^48, but offset is any u64: the sum can wrap */
            uint64_t end;
            if (!fkvf_add64(e->offset, e->stored_size, &end) || e->offset < c->region_start ||
                end > c->dir_off)
                return FAIL(FKVF_E_BOUNDS, eoff + 8, "4.5",
                            "directory entry %u (%s): [%llu, +%llu) outside commit %llu's "
                            "region [%llu, %llu)",
                            k, tn, (unsigned long long)e->offset,
                            (unsigned long long)e->stored_size, (unsigned long long)c->seq,
                            (unsigned long long)c->region_start, (unsigned long long)c->dir_off);
            if (e->offset < prev_end)
                return FAIL(FKVF_E_OVERLAP, eoff + 8, "4.5",
                            "directory entry %u (%s): offset %llu overlaps or precedes the "
                            "previous section ending at %llu",
                            k, tn, (unsigned long long)e->offset, (unsigned long long)prev_end);
            prev_end = end;
            if (e->flags & FKVF_SECTION_DEFLATE) {
                if (!(r->hdr.required_features & FKVF_FEAT_DEFLATE))
                    return FAIL(FKVF_E_CORRUPT, eoff + 4, "3.3",
                                "directory entry %u (%s): deflated, but the header does not "
                                "declare the DEFLATE feature",
                                k, tn);
                if (e->type == FKVF_SECTION_STRM)
                    return FAIL(FKVF_E_CORRUPT, eoff + 4, "4.4",
                                "directory entry %u: STRM sections are never deflated", k);
                /* stored_size <= 2^48 here: the product cannot overflow */
                if (e->size > FKVF_MAX_INFLATED || e->size > 1032 * e->stored_size + 64)
                    return FAIL(FKVF_E_LIMIT, eoff + 24, "4.4",
                                "directory entry %u (%s): inflated size %llu from %llu stored "
                                "bytes exceeds the limit",
                                k, tn, (unsigned long long)e->size,
                                (unsigned long long)e->stored_size);
            } else if (e->size != e->stored_size) {
                return FAIL(FKVF_E_CORRUPT, eoff + 24, "4.2",
                            "directory entry %u (%s): size %llu != stored_size %llu without "
                            "deflate",
                            k, tn, (unsigned long long)e->size,
                            (unsigned long long)e->stored_size);
            }
            if (!known_type(e->type) && (e->flags & FKVF_SECTION_REQUIRED))
                return FAIL(FKVF_E_SECTION, eoff, "4.3",
                            "directory entry %u: unknown required section type %s", k, tn);
            r->n_sections++;
        }
        c->n_sections = r->n_sections - c->first_section;
    }
    return FKVF_OK;
}

/* ---- interpretation: descriptor, metadata, exact rows, streams --------------- */

static int load_desc(fkvf_reader *r, size_t i)
{
    const uint8_t *p;
    uint64_t n;
    int rc = rd_section_bytes(r, i, &p, &n);
    if (rc)
        return rc;
    fkvf_desc_raw raw;
    rc = fkvf_desc_parse(p, n, r->sections[i].e.offset, &raw, &r->diag);
    if (rc)
        return rc;
    r->desc = raw.d;
    r->model_id = fkvf_strndup(r->alloc, raw.model_id, raw.model_id_len);
    r->tokenizer_id = fkvf_strndup(r->alloc, raw.tokenizer_id, raw.tokenizer_id_len);
    if (!r->model_id || !r->tokenizer_id)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for descriptor strings");
    r->desc.model_id = r->model_id;
    r->desc.tokenizer_id = r->tokenizer_id;
    r->row_bytes = fkvf_desc_row_bytes(&r->desc);
    r->has_desc = 1;
    return FKVF_OK;
}

int rd_vtxs_table(fkvf_reader *r, size_t i, double **xy, uint32_t *n)
{
    const rd_section *s = &r->sections[i];
    const uint8_t *p;
    uint64_t size;
    int rc;
    if ((rc = rd_section_bytes(r, i, &p, &size)) ||
        (rc = fkvf_vtxs_parse(p, size, s->e.offset, s->e.key, n, &r->diag)))
        return rc;
    double *t = fkvf_calloc(r->alloc, 2 * (size_t)*n, sizeof(double));
    if (!t)
        return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory for a vertex table");
    for (size_t k = 0; k < 2 * (size_t)*n; k++)
        t[k] = fkvf_ldf64(p + 8 + 8 * k);
    *xy = t;
    return FKVF_OK;
}

/* The codec of a segment of commit `seq`. Contexts are made in section
 * order, so a cached one never rests on a VTXS later than `seq`. */
static const fkvf_ngon *get_ngon(fkvf_reader *r, uint32_t n, double rr, uint32_t span,
                                 uint64_t seq, uint64_t at, int *rc)
{
    for (size_t i = 0; i < r->n_ngons; i++) {
        const fkvf_ngon *g = &r->ngons[i]->g;
        if (g->n == n && g->r == rr && g->span == span)
            return g;
    }
    /* the vertex table: the VTXS with key N in this commit or an earlier one
     * (spec 10.3; at most one exists) */
    size_t vi = SIZE_MAX;
    for (size_t i = 0; i < r->n_sections && r->sections[i].commit_seq <= seq; i++)
        if (r->sections[i].e.type == FKVF_SECTION_VTXS && r->sections[i].e.key == n)
            vi = i;
    if (vi == SIZE_MAX) {
        *rc = FAIL(FKVF_E_CORRUPT, at, "10.3",
                   "ngon stream with N=%u has no VTXS section in its commit or before", n);
        return NULL;
    }
    double *xy;
    uint32_t nn;
    if ((*rc = rd_vtxs_table(r, vi, &xy, &nn)))
        return NULL;
    rd_ngonctx *ctx = fkvf_calloc(r->alloc, 1, sizeof *ctx);
    size_t cap = r->n_ngons;
    if (!ctx || fkvf_grow(r->alloc, (void **)&r->ngons, &cap, r->n_ngons + 1, sizeof *r->ngons)) {
        fkvf_free(r->alloc, xy);
        fkvf_free(r->alloc, ctx);
        *rc = FAIL(FKVF_E_NOMEM, at, NULL, "no memory for an ngon context");
        return NULL;
    }
    *rc = fkvf_ngon_check_params(nn, xy, rr, span);
    if (*rc == FKVF_OK)
        *rc = fkvf_ngon_init(&ctx->g, nn, rr, span, xy, r->alloc);
    fkvf_free(r->alloc, xy);
    if (*rc) {
        fkvf_free(r->alloc, ctx);
        *rc = FAIL(*rc, at, "12.2",
                   "ngon parameters N=%u r=%.17g L=%u rejected (vertex table at %llu, r <= "
                   "r_N, L <= L_max(r))",
                   n, rr, span, (unsigned long long)r->sections[vi].e.offset);
        return NULL;
    }
    r->ngons[r->n_ngons++] = ctx;
    return &ctx->g;
}

int rd_seg_init(fkvf_reader *r, size_t i, rd_seg *g)
{
    const rd_section *sec = &r->sections[i];
    uint64_t off = sec->e.offset;
    memset(g, 0, sizeof *g);
    int rc = fkvf_strm_hdr_parse(r->data + off, sec->e.stored_size, off, &g->h, &r->diag);
    if (rc)
        return rc;
    if (g->h.group != sec->e.key)
        return FAIL(FKVF_E_CORRUPT, off, "11.2",
                    "STRM.group %llu differs from the directory key %llu",
                    (unsigned long long)g->h.group, (unsigned long long)sec->e.key);
    g->sec = i;
    g->count = g->h.symbol_count;
    g->data_fileoff = off + g->h.data_off;
    g->data = r->data + g->data_fileoff;
    size_t nb;
    if (!fkvf_tosz(g->h.n_blocks, &nb) || !(g->block_ok = fkvf_calloc(r->alloc, nb ? nb : 1, 1)))
        return FAIL(FKVF_E_NOMEM, off, NULL, "no memory for %llu block flags",
                    (unsigned long long)g->h.n_blocks);
    return FKVF_OK;
}

/* May segment g (of section `sec`) join its group (spec 11.2, 11.6)? The
 * group takes its parameters from its first segment. */
static int seg_admit(fkvf_reader *r, const rd_section *sec, const rd_seg *g)
{
    uint64_t off = sec->e.offset;
    const fkvf_strm_hdr *h = &g->h;
    int rc = FKVF_OK;
    if (h->group == FKVF_GROUP_INDEX) {
        uint64_t want = r->has_desc ? (uint64_t)r->desc.n_layers * r->desc.n_kv_heads *
                                          (h->k_stages + h->v_stages)
                                    : 0;
        if (!r->has_desc || h->n_streams != want)
            return FAIL(FKVF_E_CORRUPT, off + 48, "11.2",
                        "STRM.n_streams %u: %u layers x %u heads x (%u + %u) stages need %llu",
                        h->n_streams, r->desc.n_layers, r->desc.n_kv_heads, h->k_stages,
                        h->v_stages, (unsigned long long)want);
    }
    if (h->profile == FKVF_PROFILE_NGON && !(r->hdr.required_features & FKVF_FEAT_NGON))
        return FAIL(FKVF_E_CORRUPT, off + 8, "3.3",
                    "ngon stream, but the header does not declare the NGON feature");
    rd_group *s = &r->groups[h->group];
    if (!s->present) {
        if (h->profile == FKVF_PROFILE_NGON &&
            !(s->ngon = get_ngon(r, h->alphabet, h->r, h->span_symbols, sec->commit_seq, off, &rc)))
            return rc;
        s->present = 1;
        s->group = (unsigned)h->group;
        s->profile = h->profile;
        s->bits = h->bits;
        s->k_stages = h->k_stages;
        s->v_stages = h->v_stages;
        s->alphabet = h->alphabet;
        s->span = h->span_symbols;
        s->r = h->r;
        s->n_streams = h->n_streams;
    } else if (s->profile != h->profile || s->bits != h->bits || s->alphabet != h->alphabet ||
               s->span != h->span_symbols || memcmp(&s->r, &h->r, sizeof h->r) != 0 ||
               s->k_stages != h->k_stages || s->v_stages != h->v_stages) {
        return FAIL(FKVF_E_CORRUPT, off + 8, "11.6",
                    "STRM segment parameters (codec or stages) differ from the group's earlier "
                    "segments");
    }
    if (h->first_symbol > s->length)
        return FAIL(FKVF_E_CORRUPT, off + 16, "11.6",
                    "STRM.first_symbol %llu beyond the streams' length %llu",
                    (unsigned long long)h->first_symbol, (unsigned long long)s->length);
    return FKVF_OK;
}

static int add_segment(fkvf_reader *r, size_t i)
{
    rd_seg seg;
    int rc = rd_seg_init(r, i, &seg);
    if (rc)
        return rc;
    if ((rc = seg_admit(r, &r->sections[i], &seg))) {
        fkvf_free(r->alloc, seg.block_ok);
        return rc;
    }
    rd_group *s = &r->groups[seg.h.group];
    /* cut earlier segments at first_symbol (spec 11.6) */
    while (s->n_segs) {
        rd_seg *last = &s->segs[s->n_segs - 1];
        if (last->h.first_symbol >= seg.h.first_symbol) {
            fkvf_free(r->alloc, last->block_ok);
            s->n_segs--;
            continue;
        }
        if (last->h.first_symbol + last->count > seg.h.first_symbol)
            last->count = seg.h.first_symbol - last->h.first_symbol;
        break;
    }
    if (fkvf_grow(r->alloc, (void **)&s->segs, &s->cap_segs, s->n_segs + 1, sizeof(rd_seg))) {
        fkvf_free(r->alloc, seg.block_ok);
        return FAIL(FKVF_E_NOMEM, r->sections[i].e.offset, NULL, "no memory for stream segments");
    }
    s->segs[s->n_segs++] = seg;
    s->length = seg.h.first_symbol + seg.h.symbol_count;
    return FKVF_OK;
}

/* The streams of the groups: index streams in canonical order (spec 11.2),
 * then the token stream. Streams are not materialized (a tiny file can
 * declare 2^25 of them): rd_stream_at computes one from its index. */
static int build_streams(fkvf_reader *r)
{
    r->n_streams = 0;
    for (int k = 0; k < 2; k++) {
        rd_group *g = &r->groups[k];
        if (!g->present)
            continue;
        g->stored_per_stream = 0;
        for (size_t i = 0; i < g->n_segs; i++)
            g->stored_per_stream += g->segs[i].h.stream_bytes;
        r->n_streams += g->n_streams;
    }
    return FKVF_OK;
}

int rd_stream_at(const fkvf_reader *r, size_t index, rd_stream *s)
{
    if (index >= r->n_streams)
        return FKVF_E_RANGE;
    const rd_group *ix = &r->groups[FKVF_GROUP_INDEX];
    size_t n_index = ix->present ? ix->n_streams : 0;
    memset(s, 0, sizeof *s);
    if (index >= n_index) {
        s->g = (rd_group *)&r->groups[FKVF_GROUP_TOKENS];
        s->ord = 0;
        s->id = FKVF_STREAM_ID_TOKENS;
    } else {
        s->g = (rd_group *)ix;
        s->ord = (uint32_t)index;
        uint32_t per_head = (uint32_t)ix->k_stages + ix->v_stages;
        uint32_t lh = s->ord / per_head, j = s->ord % per_head;
        uint32_t layer = lh / r->desc.n_kv_heads, head = lh % r->desc.n_kv_heads;
        unsigned kv = j >= ix->k_stages, stage = kv ? j - ix->k_stages : j;
        s->id = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, layer, head, kv, stage);
    }
    s->stored_bytes = s->g->stored_per_stream;
    return FKVF_OK;
}

/* CBK1 header or CBRF reference (spec 13.1, 13.5). */
static int load_codebook(fkvf_reader *r)
{
    if (!r->cb_kind)
        return FKVF_OK;
    const uint8_t *p;
    uint64_t n;
    uint64_t off = r->sections[r->cb_sec].e.offset;
    int rc = rd_section_bytes(r, r->cb_sec, &p, &n);
    if (rc)
        return rc;
    if (r->cb_kind == 1) {
        if ((rc = fkvf_cbk1_parse(p, n, off, &r->cb_shape, &r->diag)))
            return rc;
        if (r->has_desc && !fkvf_cbk1_matches(&r->cb_shape, &r->desc))
            return FAIL(FKVF_E_CORRUPT, off, "13.7",
                        "CBK1 shape (layers %u, heads %u, dims %u/%u) does not match the "
                        "descriptor",
                        r->cb_shape.n_layers, r->cb_shape.n_heads, r->cb_shape.key_dim,
                        r->cb_shape.value_dim);
        r->cb_known = 1;
        return FKVF_OK;
    }
    const uint8_t *hash, *name;
    uint32_t nl;
    if ((rc = fkvf_cbrf_parse(p, n, off, &hash, &name, &nl, &r->diag)))
        return rc;
    memcpy(r->cb_ref_hash, hash, 16);
    if (!(r->cb_ref_name = fkvf_strndup(r->alloc, name, nl)))
        return FAIL(FKVF_E_NOMEM, off, NULL, "no memory for the codebook name");
    r->cb_ref_name_len = nl;
    return FKVF_OK;
}

/* (reader_impl.h) */
int rd_check_index_streams(fkvf_reader *r, int code, const char *ext)
{
    const char *pre = ext ? "codebook " : "", *hx = ext ? ext : "", *sep = ext ? ": " : "";
    const fkvf_codebook_shape *cb = &r->cb_shape;
    const rd_group *g = &r->groups[FKVF_GROUP_INDEX];
    if (!g->present)
        return FKVF_OK; /* n_archived = 0 (checked with the stream lengths) */
    if (g->k_stages != cb->k_stages || g->v_stages != cb->v_stages)
        return FAIL(code, r->sections[g->segs[0].sec].e.offset + 10, "11.8",
                    "%s%s%sthe index streams have %u key and %u value stages, the codebook %u "
                    "and %u",
                    pre, hx, sep, g->k_stages, g->v_stages, cb->k_stages, cb->v_stages);
    return FKVF_OK;
}

/* Codebook, VTXS, META, EXAC and STRM sections in section order (spec 7.3). */
static int apply_sections(fkvf_reader *r)
{
    size_t ecap = 0;
    int rc;
    for (size_t i = 0; i < r->n_sections; i++) {
        rd_section *s = &r->sections[i];
        switch (s->e.type) {
        case FKVF_SECTION_CBK1:
        case FKVF_SECTION_CBRF:
            if (r->cb_kind)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "13.7",
                            "second codebook section (the first is at %llu)",
                            (unsigned long long)r->sections[r->cb_sec].e.offset);
            if (s->e.key != 0)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "4.3", "codebook section key %llu, must be 0",
                            (unsigned long long)s->e.key);
            if (s->e.type == FKVF_SECTION_CBRF &&
                !(r->hdr.required_features & FKVF_FEAT_EXTERNAL_CODEBOOK))
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "3.3",
                            "CBRF section, but the header does not declare EXTERNAL_CODEBOOK");
            r->cb_kind = s->e.type == FKVF_SECTION_CBK1 ? 1 : 2;
            r->cb_sec = i;
            break;
        case FKVF_SECTION_VTXS:
            /* at most one per N (spec 10.3): one bit per possible N */
            if (s->e.key < 2 || s->e.key > FKVF_MAX_NGON_N)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "10.1", "VTXS key %llu is not an N in 2..65536",
                            (unsigned long long)s->e.key);
            if (!r->vtxs_seen &&
                !(r->vtxs_seen = fkvf_calloc(r->alloc, FKVF_MAX_NGON_N / 8 + 1, 1)))
                return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory");
            if (r->vtxs_seen[s->e.key / 8] & (1u << (s->e.key % 8)))
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "10.3", "second VTXS section for N=%llu",
                            (unsigned long long)s->e.key);
            r->vtxs_seen[s->e.key / 8] |= (uint8_t)(1u << (s->e.key % 8));
            break;
        case FKVF_SECTION_META:
            if (s->e.key != 0)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "4.3", "META key %llu, must be 0",
                            (unsigned long long)s->e.key);
            r->has_meta = 1;
            r->meta_sec = i;
            r->meta_checked = 0;
            break;
        case FKVF_SECTION_EXAC: {
            if (!r->has_desc)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "14.2", "EXAC without a DESC section");
            const uint8_t *p;
            uint64_t n;
            /* the header is needed now; the rows are checked with the section */
            if ((rc = rd_section_bytes(r, i, &p, &n)))
                return rc;
            if (fkvf_grow(r->alloc, (void **)&r->exact, &ecap, r->n_exact + 1, sizeof(rd_exact)))
                return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory");
            rd_exact *x = &r->exact[r->n_exact];
            x->sec = i;
            if ((rc = fkvf_exac_hdr_parse(p, n, s->e.offset, r->row_bytes, &x->h, &r->diag)))
                return rc;
            if (x->h.dtype != r->desc.dtype)
                return FAIL(FKVF_E_CORRUPT, s->e.offset + 16, "14.2",
                            "EXAC.dtype %u differs from DESC.dtype %u", x->h.dtype,
                            (unsigned)r->desc.dtype);
            if (s->e.key != x->h.first)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "14.2",
                            "EXAC.first_position %llu differs from the directory key %llu",
                            (unsigned long long)x->h.first, (unsigned long long)s->e.key);
            r->n_exact++;
            break;
        }
        case FKVF_SECTION_STRM:
            if ((rc = add_segment(r, i)))
                return rc;
            break;
        default:
            break;
        }
    }
    return FKVF_OK;
}

typedef struct xevent {
    uint64_t pos;
    size_t x;
    int start;
} xevent;

static int xevent_cmp(const void *a, const void *b)
{
    const xevent *p = a, *q = b;
    return p->pos < q->pos ? -1 : p->pos > q->pos;
}

/* Which EXAC section supplies each position (spec 7.3: the last covering one
 * in section order): a sweep over range starts and ends with a max-heap of
 * the sections covering the current position. O(m log m) for m sections. */
static int build_xruns(fkvf_reader *r)
{
    size_t m = r->n_exact;
    if (!m)
        return FKVF_OK;
    xevent *ev = fkvf_calloc(r->alloc, 2 * m, sizeof *ev);
    size_t *heap = fkvf_calloc(r->alloc, m, sizeof *heap);
    uint8_t *active = fkvf_calloc(r->alloc, m, 1);
    r->xruns = fkvf_calloc(r->alloc, 2 * m, sizeof *r->xruns);
    if (!ev || !heap || !active || !r->xruns) {
        fkvf_free(r->alloc, ev);
        fkvf_free(r->alloc, heap);
        fkvf_free(r->alloc, active);
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for %zu EXAC ranges", m);
    }
    size_t ne = 0;
    for (size_t x = 0; x < m; x++) {
        if (!r->exact[x].h.count)
            continue;
        ev[ne++] = (xevent){r->exact[x].h.first, x, 1};
        ev[ne++] = (xevent){r->exact[x].h.first + r->exact[x].h.count, x, 0};
    }
    qsort(ev, ne, sizeof *ev, xevent_cmp);
    size_t hn = 0;
    for (size_t i = 0; i < ne;) {
        uint64_t p = ev[i].pos;
        for (; i < ne && ev[i].pos == p; i++) {
            size_t x = ev[i].x;
            if (!ev[i].start) {
                active[x] = 0;
                continue;
            }
            active[x] = 1;
            size_t k = hn++; /* sift up */
            while (k && heap[(k - 1) / 2] < x) {
                heap[k] = heap[(k - 1) / 2];
                k = (k - 1) / 2;
            }
            heap[k] = x;
        }
        while (hn && !active[heap[0]]) { /* pop ended sections */
            size_t last = heap[--hn], k = 0;
            for (;;) {
                size_t c = 2 * k + 1;
                if (c >= hn)
                    break;
                if (c + 1 < hn && heap[c + 1] > heap[c])
                    c++;
                if (heap[c] <= last)
                    break;
                heap[k] = heap[c];
                k = c;
            }
            if (hn)
                heap[k] = last;
        }
        if (!hn || i >= ne)
            continue;
        uint64_t q = ev[i].pos;
        size_t owner = heap[0];
        rd_xrun *prev = r->n_xruns ? &r->xruns[r->n_xruns - 1] : NULL;
        if (prev && prev->x == owner && prev->end == p)
            prev->end = q;
        else
            r->xruns[r->n_xruns++] = (rd_xrun){p, q, owner};
    }
    fkvf_free(r->alloc, ev);
    fkvf_free(r->alloc, heap);
    fkvf_free(r->alloc, active);
    return FKVF_OK;
}

int rd_load_contents(fkvf_reader *r)
{
    size_t desc_i = SIZE_MAX;
    int rc;
    rd_commit *last = &r->commits[r->n_commits - 1];
    r->n_positions = last->dh.n_positions;
    r->n_archived = last->dh.n_archived;
    for (size_t i = 0; i < r->n_sections; i++) {
        rd_section *s = &r->sections[i];
        if (s->e.type != FKVF_SECTION_DESC)
            continue;
        if (desc_i != SIZE_MAX)
            return FAIL(FKVF_E_CORRUPT, s->e.offset, "8.2",
                        "second DESC section (the first is at %llu)",
                        (unsigned long long)r->sections[desc_i].e.offset);
        desc_i = i;
    }
    if (desc_i != SIZE_MAX) {
        const rd_section *ds = &r->sections[desc_i];
        if (ds->commit_seq != 1 || ds->e.key != 0)
            return FAIL(FKVF_E_CORRUPT, ds->e.offset, "8.3",
                        "DESC must be in commit 1 with key 0 (commit %llu, key %llu)",
                        (unsigned long long)ds->commit_seq, (unsigned long long)ds->e.key);
        if ((rc = load_desc(r, desc_i)))
            return rc;
    }
    if ((rc = apply_sections(r)))
        return rc;
    /* stream lengths (spec 11.6, 11.8) */
    for (int k = 0; k < 2; k++) {
        const rd_group *g = &r->groups[k];
        uint64_t want = k == FKVF_GROUP_TOKENS ? r->n_positions : r->n_archived;
        if (k == FKVF_GROUP_INDEX && !g->present && want)
            return FAIL(FKVF_E_CORRUPT, last->dir_off + 24, "11.8",
                        "%llu archived positions but no index streams",
                        (unsigned long long)want);
        if (g->present && g->length != want)
            return FAIL(FKVF_E_CORRUPT, r->sections[g->segs[g->n_segs - 1].sec].e.offset, "11.6",
                        "the %s %llu symbols, the last commit needs %llu",
                        k == FKVF_GROUP_TOKENS ? "token stream has" : "index streams have",
                        (unsigned long long)g->length, (unsigned long long)want);
    }
    if ((rc = build_streams(r)))
        return rc;
    if ((rc = load_codebook(r)))
        return rc;
    if (!r->has_desc) {
        if (r->n_exact || r->n_positions || r->n_streams || r->cb_kind != 1)
            return FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "13.4",
                        "no DESC section, and not a codebook file (exactly one CBK1; no "
                        "streams, exact rows, CBRF or positions)");
        return FKVF_OK;
    }
    if (r->n_archived && !r->cb_kind)
        return FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "13.7",
                    "%llu archived positions but no codebook section (CBK1 or CBRF)",
                    (unsigned long long)r->n_archived);
    if (r->groups[FKVF_GROUP_INDEX].present && !r->cb_kind)
        return FAIL(FKVF_E_CORRUPT, r->sections[r->groups[FKVF_GROUP_INDEX].segs[0].sec].e.offset,
                    "11.8", "index streams but no codebook section (CBK1 or CBRF)");
    if (r->cb_known && (rc = rd_check_index_streams(r, FKVF_E_CORRUPT, NULL)))
        return rc;
    /* positions (spec 14) */
    uint64_t S = r->desc.n_sinks < r->n_positions ? r->desc.n_sinks : r->n_positions;
    if (r->n_archived && (r->desc.n_sinks > r->n_positions ||
                          r->n_archived > r->n_positions - r->desc.n_sinks))
        return FAIL(FKVF_E_CORRUPT, last->dir_off + 24, "14.2",
                    "n_archived %llu does not fit after %u sinks in %llu positions",
                    (unsigned long long)r->n_archived, r->desc.n_sinks,
                    (unsigned long long)r->n_positions);
    /* every exact position must be covered (r->exact keeps section order,
     * which exact_row needs: sort a copy) */
    fkvf_range *cover = fkvf_calloc(r->alloc, r->n_exact ? r->n_exact : 1, sizeof *cover);
    if (!cover)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory to check %zu EXAC sections",
                    r->n_exact);
    for (size_t x = 0; x < r->n_exact; x++) {
        cover[x].first = r->exact[x].h.first;
        cover[x].count = r->exact[x].h.count;
    }
    uint64_t ranges[2][2] = {{0, S}, {S + r->n_archived, r->n_positions}};
    rc = FKVF_OK;
    for (int k = 0; k < 2 && rc == FKVF_OK; k++) {
        uint64_t p = fkvf_ranges_first_gap(cover, r->n_exact, ranges[k][0], ranges[k][1]);
        if (p < ranges[k][1])
            rc = FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "14.2",
                      "exact position %llu is not covered by any EXAC section",
                      (unsigned long long)p);
    }
    fkvf_free(r->alloc, cover);
    if (rc)
        return rc;
    return build_xruns(r);
}

/* ---- open / free ------------------------------------------------------------- */

static int reader_new(fkvf_reader **out, const fkvf_allocator *alloc, const char *name,
                      unsigned flags)
{
    alloc = fkvf_alloc_or_default(alloc);
    fkvf_reader *r = fkvf_calloc(alloc, 1, sizeof *r);
    if (!r)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&r->h, FKVF_HANDLE_READER);
    fkvf_handle_fail(&r->h, FKVF_E_STATE); /* until it is loaded */
    r->alloc = alloc;
    r->flags = flags;
    if (name) {
        r->name = fkvf_strndup(alloc, name, strlen(name));
        if (!r->name) {
            fkvf_free(alloc, r);
            return FKVF_E_NOMEM;
        }
    }
    r->diag.name = r->name ? r->name : "<memory>";
    *out = r;
    return FKVF_OK;
}

static int reader_load(fkvf_reader *r)
{
    size_t avail = r->size < FKVF_HEADER_SIZE ? (size_t)r->size : FKVF_HEADER_SIZE;
    int rc = fkvf_header_parse(r->data, avail, &r->hdr, &r->diag);
    if (rc)
        return rc;
    if (r->size > FKVF_MAX_FILE)
        return FAIL(FKVF_E_LIMIT, FKVF_NO_OFFSET, "15", "file larger than 2^62 bytes");
    if ((rc = rd_find_head(r)) || (rc = rd_load_directories(r)) || (rc = rd_load_contents(r)))
        return rc;
    r->h.state = FKVF_HANDLE_OPEN;
    return FKVF_OK;
}

/* For the validator (validate.c): a handle over `data` with the header
 * parsed and the served commit's chain established (spec 3.1, 7.2), in
 * non-strict mode; no directory is loaded. *out is set whenever a handle was
 * made (its message says what failed); free it with fkvf_reader_free. */
int rd_open_chain(fkvf_reader **out, const void *data, size_t size, const char *name,
                  const fkvf_allocator *alloc)
{
    *out = NULL;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, name, 0);
    if (rc)
        return rc;
    static const uint8_t empty[1] = {0};
    r->data = size ? data : empty;
    r->size = size;
    *out = r;
    size_t avail = r->size < FKVF_HEADER_SIZE ? (size_t)r->size : FKVF_HEADER_SIZE;
    if ((rc = fkvf_header_parse(r->data, avail, &r->hdr, &r->diag)))
        return rc;
    if (r->size > FKVF_MAX_FILE)
        return FAIL(FKVF_E_LIMIT, FKVF_NO_OFFSET, "15", "file larger than 2^62 bytes");
    return rd_find_head(r);
}

FKVF_API int fkvf_reader_open_memory(fkvf_reader **out, const void *data, size_t size,
                                     unsigned flags, const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!data && size)
        return FKVF_E_INVALID_ARG;
    if (flags & ~FKVF_OPEN_STRICT)
        return FKVF_E_INVALID_ARG;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, NULL, flags);
    if (rc)
        return rc;
    static const uint8_t empty[1] = {0};
    r->data = size ? data : empty;
    r->size = size;
    *out = r;
    return reader_load(r);
}

/* The file open as fd into r (r->flags): mapped, or read into memory with
 * FKVF_OPEN_READ (from offset 0), then loaded. Does not close fd. */
static int load_fd(fkvf_reader *r, int fd)
{
    int rc = fkvf_filemap_fd(&r->file, fd, (r->flags & FKVF_OPEN_READ) != 0, r->alloc, &r->diag);
    if (rc)
        return rc;
    r->data = r->file.data;
    r->size = r->file.size;
    return reader_load(r);
}

int rd_open_fd(fkvf_reader **out, int fd, const char *name, unsigned flags,
               const fkvf_allocator *alloc)
{
    *out = NULL;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, name, flags);
    if (rc)
        return rc;
    *out = r;
    return load_fd(r, fd);
}

FKVF_API int fkvf_reader_open_file(fkvf_reader **out, const char *path, unsigned flags,
                                   const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!path || (flags & ~(FKVF_OPEN_STRICT | FKVF_OPEN_READ)))
        return FKVF_E_INVALID_ARG;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, path, flags);
    if (rc)
        return rc;
    *out = r;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return FAIL(FKVF_E_IO, FKVF_NO_OFFSET, NULL, "open: %s", strerror(errno));
    rc = load_fd(r, fd);
    close(fd);
    return rc;
}

FKVF_API void fkvf_reader_free(fkvf_reader *r)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return;
    const fkvf_allocator *a = r->alloc;
    fkvf_rvq_free(r->rvq);
    fkvf_free(a, r->cb_streams);
    for (size_t i = 0; i < r->n_sections; i++)
        fkvf_free(a, r->sections[i].inflated);
    for (int g = 0; g < 2; g++) {
        for (size_t k = 0; k < r->groups[g].n_segs; k++)
            fkvf_free(a, r->groups[g].segs[k].block_ok);
        fkvf_free(a, r->groups[g].segs);
    }
    for (size_t i = 0; i < r->n_ngons; i++) {
        fkvf_ngon_fini(&r->ngons[i]->g);
        fkvf_free(a, r->ngons[i]);
    }
    fkvf_free(a, r->ngons);
    fkvf_free(a, r->exact);
    fkvf_free(a, r->xruns);
    fkvf_free(a, r->sections);
    fkvf_free(a, r->commits);
    fkvf_free(a, r->cb_ref_name);
    fkvf_free(a, r->meta_off);
    fkvf_free(a, r->vtxs_seen);
    fkvf_free(a, r->model_id);
    fkvf_free(a, r->tokenizer_id);
    fkvf_filemap_release(&r->file, a);
    fkvf_free(a, r->name);
    r->h.magic = 0;
    fkvf_free(a, r);
}

FKVF_API const char *fkvf_reader_message(const fkvf_reader *r)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return "not a reader handle";
    return r->diag.msg;
}

FKVF_API const char *fkvf_reader_file_name(const fkvf_reader *r)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return NULL;
    return r->name;
}

FKVF_API int fkvf_reader_error(const fkvf_reader *r, fkvf_error_info *out)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER)) {
        memset(out, 0, sizeof *out);
        out->code = FKVF_E_STATE;
        out->offset = FKVF_ERROR_NO_OFFSET;
        out->message = "not a reader handle";
        return FKVF_E_STATE;
    }
    fkvf_diag_info(&r->diag, out);
    return FKVF_OK;
}

/* ---- queries ------------------------------------------------------------------ */

FKVF_API int fkvf_reader_info(const fkvf_reader *r, fkvf_archive_info *out)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    if (!out)
        return FKVF_E_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->format_major = r->hdr.major;
    out->format_minor = r->hdr.minor;
    out->required_features = r->hdr.required_features;
    out->optional_features = r->hdr.optional_features;
    out->file_size = r->size;
    out->committed_size = r->committed_size;
    out->torn_bytes = r->torn_bytes;
    out->n_commits = r->n_commits;
    out->n_positions = r->n_positions;
    out->n_archived = r->n_archived;
    out->n_sections = r->n_sections;
    out->n_streams = r->n_streams;
    out->has_desc = r->has_desc;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_section(const fkvf_reader *r, size_t index, fkvf_section_info *out)
{
    ENTER(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    if (index >= r->n_sections)
        return FKVF_E_RANGE;
    const rd_section *s = &r->sections[index];
    out->type = s->e.type;
    out->flags = s->e.flags;
    out->offset = s->e.offset;
    out->stored_size = s->e.stored_size;
    out->size = s->e.size;
    out->key = s->e.key;
    out->checksum = s->e.checksum;
    out->commit_seq = s->commit_seq;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_section_data(fkvf_reader *r, size_t index, const void **data,
                                      size_t *size)
{
    ENTER(r);
    if (!data || !size)
        return FKVF_E_INVALID_ARG;
    if (index >= r->n_sections)
        return FKVF_E_RANGE;
    const uint8_t *p;
    uint64_t n;
    int rc = rd_section_bytes(r, index, &p, &n);
    if (rc)
        return rc;
    if (!fkvf_tosz(n, size))
        return FKVF_E_LIMIT;
    *data = p;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_desc(fkvf_reader *r, fkvf_desc *out)
{
    ENTER(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    if (!r->has_desc)
        return fkvf_fail(&r->diag, FKVF_E_NOT_FOUND, FKVF_NO_OFFSET, "13",
                         "no DESC section (a codebook file?)");
    *out = r->desc;
    return FKVF_OK;
}

static int meta_ready(fkvf_reader *r)
{
    if (!r->has_meta)
        return FKVF_OK;
    if (r->meta_checked)
        return FKVF_OK;
    const uint8_t *p;
    uint64_t n;
    int rc = rd_section_bytes(r, r->meta_sec, &p, &n);
    if (rc)
        return rc;
    fkvf_free(r->alloc, r->meta_off); /* verify checks it again */
    r->meta_off = NULL;
    rc = fkvf_meta_parse(p, n, r->sections[r->meta_sec].e.offset, &r->meta_count, &r->meta_off,
                         r->alloc, &r->diag);
    if (rc)
        return rc;
    r->meta_checked = 1;
    return FKVF_OK;
}

int rd_meta_count(fkvf_reader *r, size_t *count)
{
    if (!count)
        return FKVF_E_INVALID_ARG;
    int rc = meta_ready(r);
    if (rc)
        return rc;
    *count = r->has_meta ? r->meta_count : 0;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_meta_count(fkvf_reader *r, size_t *count)
{
    ENTER(r);
    return rd_meta_count(r, count);
}

int rd_meta(fkvf_reader *r, size_t index, fkvf_meta_entry *out)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    int rc = meta_ready(r);
    if (rc)
        return rc;
    if (!r->has_meta || index >= r->meta_count)
        return FKVF_E_RANGE;
    const uint8_t *p;
    uint64_t n;
    if ((rc = rd_section_bytes(r, r->meta_sec, &p, &n)))
        return rc;
    fkvf_meta_entry_at(p, r->meta_off[index], out);
    return FKVF_OK;
}

FKVF_API int fkvf_reader_meta(fkvf_reader *r, size_t index, fkvf_meta_entry *out)
{
    ENTER(r);
    return rd_meta(r, index, out);
}

FKVF_API int fkvf_reader_meta_find(fkvf_reader *r, const char *key, fkvf_meta_entry *out)
{
    ENTER(r);
    if (!key || !out)
        return FKVF_E_INVALID_ARG;
    size_t n, kl = strlen(key);
    int rc = rd_meta_count(r, &n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        fkvf_meta_entry e;
        if ((rc = rd_meta(r, i, &e)))
            return rc;
        if (e.key_len == kl && memcmp(e.key, key, kl) == 0) {
            *out = e;
            return FKVF_OK;
        }
    }
    return FKVF_E_NOT_FOUND;
}

/* ---- exact rows ----------------------------------------------------------------- */

static int exact_position(const fkvf_reader *r, uint64_t pos)
{
    uint64_t S = r->desc.n_sinks;
    return pos < r->n_positions && (pos < S || pos >= S + r->n_archived);
}

FKVF_API int fkvf_reader_is_exact(const fkvf_reader *r, uint64_t position, int *is_exact)
{
    ENTER(r);
    if (!is_exact)
        return FKVF_E_INVALID_ARG;
    if (!r->has_desc || position >= r->n_positions)
        return FKVF_E_RANGE;
    *is_exact = exact_position(r, position);
    return FKVF_OK;
}

int rd_exact_row(fkvf_reader *r, uint64_t position, const void **row, size_t *row_bytes)
{
    if (!row || !row_bytes)
        return FKVF_E_INVALID_ARG;
    if (!r->has_desc || !exact_position(r, position))
        return fkvf_fail(&r->diag, FKVF_E_RANGE, FKVF_NO_OFFSET, NULL,
                         "position %llu is not an exact position",
                         (unsigned long long)position);
    /* the latest section covering the position wins (spec 7.3): the runs */
    size_t lo = 0, hi = r->n_xruns;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->xruns[mid].end <= position)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < r->n_xruns && r->xruns[lo].first <= position) {
        const rd_exact *e = &r->exact[r->xruns[lo].x];
        const uint8_t *p;
        uint64_t n;
        int rc = rd_section_bytes(r, e->sec, &p, &n);
        if (rc)
            return rc;
        *row = p + FKVF_SUBHDR_SIZE + (position - e->h.first) * r->row_bytes;
        *row_bytes = (size_t)r->row_bytes;
        return FKVF_OK;
    }
    return fkvf_fail(&r->diag, FKVF_E_CORRUPT, FKVF_NO_OFFSET, "14.2",
                     "exact position %llu not covered", (unsigned long long)position);
}

FKVF_API int fkvf_reader_exact_row(fkvf_reader *r, uint64_t position, const void **row,
                                   size_t *row_bytes)
{
    ENTER(r);
    return rd_exact_row(r, position, row, row_bytes);
}

/* ---- streams ------------------------------------------------------------------- */

FKVF_API int fkvf_reader_stream_count(const fkvf_reader *r, size_t *count)
{
    ENTER(r);
    if (!count)
        return FKVF_E_INVALID_ARG;
    *count = r->n_streams;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_stream_info(const fkvf_reader *r, size_t index, fkvf_stream_info *out)
{
    ENTER(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    rd_stream st;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    const rd_stream *s = &st;
    const rd_group *g = s->g;
    memset(out, 0, sizeof *out);
    out->id = s->id;
    out->profile = (fkvf_profile)g->profile;
    out->symbol_bits = g->bits;
    if (g->profile == FKVF_PROFILE_QUAD) {
        out->alphabet = g->bits < 32 ? (uint32_t)1 << g->bits : 0;
        out->span_symbols = fkvf_quad_span_symbols(g->bits);
    } else {
        out->alphabet = g->alphabet;
        out->span_symbols = g->span;
        out->r = g->r;
    }
    out->align = fkvf_strm_align(g->profile, g->bits, g->span);
    out->length = g->length;
    out->n_segments = g->n_segs;
    out->stored_bytes = s->stored_bytes;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_stream_spec(const fkvf_reader *r, size_t index, fkvf_stream_spec *out)
{
    ENTER(r);
    rd_stream st;
    if (!out)
        return FKVF_E_INVALID_ARG;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    memset(out, 0, sizeof *out);
    out->profile = (fkvf_profile)st.g->profile;
    if (st.g->profile == FKVF_PROFILE_QUAD) {
        out->symbol_bits = st.g->bits;
    } else {
        out->alphabet = st.g->alphabet;
        out->r = st.g->r;
        out->span_symbols = st.g->span;
    }
    return FKVF_OK;
}

int rd_stream_find(const fkvf_reader *r, uint64_t id, size_t *index)
{
    if (!index)
        return FKVF_E_INVALID_ARG;
    const rd_group *ix = &r->groups[FKVF_GROUP_INDEX];
    size_t n_index = ix->present ? ix->n_streams : 0;
    if (id == FKVF_STREAM_ID_TOKENS) {
        if (!r->groups[FKVF_GROUP_TOKENS].present)
            return FKVF_E_NOT_FOUND;
        *index = n_index;
        return FKVF_OK;
    }
    uint32_t layer = (uint32_t)(id & 0xFFFF), head = (uint32_t)(id >> 16 & 0xFFFF);
    unsigned kv = (unsigned)(id >> 32 & 0xFF), stage = (unsigned)(id >> 40 & 0xFF);
    if (!ix->present || (id >> 48) != 0 || kv > 1 || layer >= r->desc.n_layers ||
        head >= r->desc.n_kv_heads || stage >= (kv ? ix->v_stages : ix->k_stages))
        return FKVF_E_NOT_FOUND;
    uint32_t per_head = (uint32_t)ix->k_stages + ix->v_stages;
    *index = ((size_t)layer * r->desc.n_kv_heads + head) * per_head +
             (kv ? ix->k_stages + stage : stage);
    return FKVF_OK;
}

FKVF_API int fkvf_reader_stream_find(const fkvf_reader *r, uint64_t id, size_t *index)
{
    ENTER(r);
    return rd_stream_find(r, id, index);
}

int rd_block_check(fkvf_reader *r, const rd_group *gr, rd_seg *g, uint64_t b)
{
    if (g->block_ok[b])
        return FKVF_OK;
    const fkvf_strm_hdr *h = &g->h;
    uint64_t start = b * h->block_size;
    uint64_t len = h->data_bytes - start < h->block_size ? h->data_bytes - start : h->block_size;
    uint64_t table = r->sections[g->sec].e.offset + FKVF_STRM_HDR_SIZE + 8 * b;
    uint64_t want = fkvf_ld64(r->data + table);
    uint64_t got = fkvf_xxh3_64(g->data + start, (size_t)len, g->data_fileoff + start);
    if (want != got)
        return FAIL(FKVF_E_CHECKSUM, g->data_fileoff + start, "11.4",
                    "STRM section at %llu, block %llu: checksum stored %016llx, computed %016llx",
                    (unsigned long long)r->sections[g->sec].e.offset, (unsigned long long)b,
                    (unsigned long long)want, (unsigned long long)got);
    if (gr->profile == FKVF_PROFILE_NGON) {
        /* every span in the block must re-encode to its anchor (spec 12.2); a
         * block can hold spans of several streams */
        uint32_t tmp[64];
        for (uint64_t o = start; o < start + len; o += 16) {
            uint64_t ord = o / h->stream_bytes, j = o % h->stream_bytes / 16;
            uint64_t s0 = j * h->span_symbols;
            uint64_t cnt = h->symbol_count - s0 < h->span_symbols ? h->symbol_count - s0
                                                                  : h->span_symbols;
            const uint8_t *a = g->data + o;
            if (fkvf_ngon_decode_span(gr->ngon, fkvf_ldf64(a), fkvf_ldf64(a + 8), (uint32_t)cnt,
                                      tmp) != FKVF_OK)
                return FAIL(FKVF_E_SPAN, g->data_fileoff + o, "12.2.5",
                            "STRM section at %llu, stream %llu of the group, span %llu: anchor "
                            "does not decode to %llu symbols that re-encode to it",
                            (unsigned long long)r->sections[g->sec].e.offset,
                            (unsigned long long)ord, (unsigned long long)j,
                            (unsigned long long)cnt);
        }
    }
    g->block_ok[b] = 1;
    return FKVF_OK;
}

/* Segment holding symbol t (binary search on first_symbol). */
static rd_seg *seg_for(const rd_group *s, uint64_t t)
{
    size_t lo = 0, hi = s->n_segs;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (s->segs[mid].h.first_symbol <= t)
            lo = mid;
        else
            hi = mid;
    }
    return &s->segs[lo];
}

/* Make sure the blocks holding local symbols [a, b) of stream `ord` in
 * segment g are verified. */
static int seg_touch(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t ord, uint64_t a,
                     uint64_t b)
{
    uint64_t lo, hi, base = (uint64_t)ord * g->h.stream_bytes;
    if (s->profile == FKVF_PROFILE_QUAD) {
        lo = a * s->bits / 8;
        hi = (b * s->bits + 7) / 8;
    } else {
        lo = a / s->span * 16;
        hi = ((b - 1) / s->span + 1) * 16;
    }
    lo += base;
    hi += base;
    for (uint64_t k = lo / g->h.block_size; k <= (hi - 1) / g->h.block_size; k++) {
        int rc = rd_block_check(r, s, g, k);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

static const uint8_t *seg_stream(const rd_seg *g, uint32_t ord)
{
    return g->data + (size_t)((uint64_t)ord * g->h.stream_bytes);
}

static int seg_read(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t ord, uint64_t a,
                    size_t n, uint32_t *out)
{
    int rc = seg_touch(r, s, g, ord, a, a + n);
    if (rc)
        return rc;
    size_t db = (size_t)g->h.stream_bytes;
    if (s->profile == FKVF_PROFILE_QUAD)
        return fkvf_quad_decode(seg_stream(g, ord), db, s->bits, a, n, out);
    return fkvf_ngon_decode(s->ngon, seg_stream(g, ord), db, g->h.symbol_count, a, n, out, 0);
}

/* Symbols [a, a+n) of segment g as bytes (the stream's symbols fit). */
static int seg_read_u8(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t ord, uint64_t a,
                       size_t n, uint8_t *out)
{
    if (s->profile == FKVF_PROFILE_QUAD) {
        int rc = seg_touch(r, s, g, ord, a, a + n);
        if (rc)
            return rc;
        return fkvf_quad_decode_u8(seg_stream(g, ord), (size_t)g->h.stream_bytes, s->bits, a, n,
                                   out);
    }
    uint32_t tmp[256];
    for (size_t done = 0; done < n;) {
        size_t c = n - done < 256 ? n - done : 256;
        int rc = seg_read(r, s, g, ord, a + done, c, tmp);
        if (rc)
            return rc;
        for (size_t k = 0; k < c; k++)
            out[done + k] = (uint8_t)tmp[k];
        done += c;
    }
    return FKVF_OK;
}

/* Symbols [first, first+count) of stream s, segment by segment, into out32
 * or (when out8 is not NULL) out8. */
static int stream_read_at(fkvf_reader *r, rd_stream *st, uint64_t first, size_t count,
                          uint32_t *out32, uint8_t *out8)
{
    rd_group *s = st->g;
    if (first > s->length || count > s->length - first)
        return fkvf_fail(&r->diag, FKVF_E_RANGE, FKVF_NO_OFFSET, NULL,
                         "symbols [%llu, +%zu) outside stream of %llu",
                         (unsigned long long)first, count, (unsigned long long)s->length);
    for (size_t done = 0; done < count;) {
        rd_seg *g = seg_for(s, first + done);
        uint64_t a = first + done - g->h.first_symbol;
        uint64_t avail = g->count - a;
        size_t n = avail < count - done ? (size_t)avail : count - done;
        int rc = out8 ? seg_read_u8(r, s, g, st->ord, a, n, out8 + done)
                      : seg_read(r, s, g, st->ord, a, n, out32 + done);
        if (rc)
            return rc;
        done += n;
    }
    return FKVF_OK;
}

int rd_stream_read(fkvf_reader *r, size_t index, uint64_t first, uint32_t *out, size_t count)
{
    if (!out && count)
        return FKVF_E_INVALID_ARG;
    rd_stream st;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    return stream_read_at(r, &st, first, count, out, NULL);
}

FKVF_API int fkvf_reader_stream_read(fkvf_reader *r, size_t index, uint64_t first, uint32_t *out,
                                     size_t count)
{
    ENTER(r);
    return rd_stream_read(r, index, first, out, count);
}

FKVF_API int fkvf_reader_stream_read_u8(fkvf_reader *r, size_t index, uint64_t first,
                                        uint8_t *out, size_t count)
{
    ENTER(r);
    if (!out && count)
        return FKVF_E_INVALID_ARG;
    rd_stream st;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    rd_stream *s = &st;
    if (s->g->profile == FKVF_PROFILE_QUAD ? s->g->bits > 8 : s->g->alphabet > 256)
        return fkvf_fail(&r->diag, FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL,
                         "stream %016llx: symbols do not fit in a byte",
                         (unsigned long long)s->id);
    return stream_read_at(r, s, first, count, NULL, out);
}

FKVF_API int fkvf_reader_stream_get(fkvf_reader *r, size_t index, uint64_t t, uint32_t *symbol)
{
    ENTER(r);
    return rd_stream_read(r, index, t, symbol, 1);
}

FKVF_API int fkvf_reader_stream_point(fkvf_reader *r, size_t index, uint64_t t, fkvf_point *out)
{
    ENTER(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    rd_stream st_;
    if (rd_stream_at(r, index, &st_))
        return FKVF_E_RANGE;
    rd_stream *st = &st_;
    rd_group *s = st->g;
    if (t >= s->length)
        return FKVF_E_RANGE;
    memset(out, 0, sizeof *out);
    /* the point depends on a bounded window of symbols before t */
    uint32_t win = s->profile == FKVF_PROFILE_QUAD ? (128u + s->bits - 1u) / s->bits : s->span;
    uint64_t first = t + 1 >= win ? t + 1 - win : 0;
    rd_seg *g = seg_for(s, first);
    if (g == seg_for(s, t)) {
        uint64_t a = first - g->h.first_symbol, lt = t - g->h.first_symbol;
        int rc = seg_touch(r, s, g, st->ord, a, lt + 1);
        if (rc)
            return rc;
        if (s->profile == FKVF_PROFILE_QUAD) {
            fkvf_quad_point(seg_stream(g, st->ord), (size_t)g->h.stream_bytes, s->bits, lt,
                            &out->x, &out->y);
            return FKVF_OK;
        }
    }
    uint32_t sym[128];
    size_t n = (size_t)(t + 1 - first);
    int rc = stream_read_at(r, st, first, n, sym, NULL);
    if (rc)
        return rc;
    if (s->profile == FKVF_PROFILE_QUAD) {
        /* first == 0 or the window covers >= 128 bits: the recurrence from the
         * origin over these symbols gives the point */
        fkvf_quad_point_ref(sym, n - 1, s->bits, &out->x, &out->y);
    } else {
        fkvf_ngon_encode_span(s->ngon, sym, (uint32_t)n, &out->fx, &out->fy);
    }
    return FKVF_OK;
}

/* ---- codebooks ------------------------------------------------------------------ */

int rd_codebook(fkvf_reader *r, fkvf_codebook_shape *shape, const void **contents, size_t *size,
                uint8_t hash[16])
{
    if (!r->cb_kind)
        return fkvf_fail(&r->diag, FKVF_E_NOT_FOUND, FKVF_NO_OFFSET, "13",
                         "the archive has no codebook");
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
    int rc = rd_section_bytes(src, sec, &p, &n);
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
    int rc = rd_section_bytes(cf, cf->cb_sec, &p, &n);
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
