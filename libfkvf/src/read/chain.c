/* Opening, first steps: the trailers and the commit chain (spec 6, 7.1,
 * 7.2: the served commit, torn tails) and every commit's directory (spec
 * 4.2, 5) into the effective directory (spec 7.3). */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"
#include "format/zidx.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* ---- trailers and the commit chain (spec 6, 7) ---------------------------- */

/* Full validation of the trailer at `off` (spec 6.1) including the directory
 * checksum and header. */
static int trailer_at(fkvf_reader *r, uint64_t off, fkvf_trailer *t, fkvf_dirhdr *dh)
{
    int rc = rd_ensure(r, off, 64);
    if (rc || (rc = fkvf_trailer_parse(r->data + off, off, t, &r->diag)))
        return rc;
    size_t dsz;
    if (!fkvf_tosz(t->dir_size, &dsz))
        return FAIL(FKVF_E_LIMIT, off + 24, "15", "directory too large");
    /* the parse checked that the directory lies before the trailer */
    if ((rc = rd_ensure(r, t->dir_offset, t->dir_size)))
        return rc;
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
            if (off != head && fkvf_error_class(rc) == FKVF_ERRCLASS_FORMAT)
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
        /* an environment failure (a source that cannot be read, memory)
         * says nothing about the file: no torn-tail scan */
        if (first_rc != FKVF_OK && fkvf_error_class(first_rc) != FKVF_ERRCLASS_FORMAT)
            return first_rc;
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
        int erc = rd_ensure(r, off, 8);
        if (erc) {
            fkvf_free(r->alloc, bad.slot);
            r->n_commits = 0;
            return erc;
        }
        if (memcmp(r->data + off, fkvf_trailer_magic, 8) != 0 || (size % 64 == 0 && off == last) ||
            bad_has(&bad, off))
            continue;
        r->n_commits = 0;
        fkvf_diag_clear(&r->diag);
        int head_ok, lrc = load_chain(r, off, &head_ok, &bad);
        if (lrc != FKVF_OK && fkvf_error_class(lrc) != FKVF_ERRCLASS_FORMAT) {
            /* not a broken chain (memory, a source that cannot be read):
             * an earlier commit is no answer */
            fkvf_free(r->alloc, bad.slot);
            r->n_commits = 0;
            return lrc;
        }
        if (lrc == FKVF_OK) {
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
            /* A ZIDX or ZPOS with REQUIRED set is rejected here as a reader
             * that does not know the type rejects it (spec 20.1, 20.7) */
            if (fkvf_zidx_is_index(e->type) && (e->flags & FKVF_SECTION_REQUIRED))
                return FAIL(FKVF_E_SECTION, eoff, e->type == FKVF_SECTION_ZPOS ? "20.7" : "20.1",
                            "directory entry %u: %s section with the REQUIRED flag (it MUST be "
                            "clear)",
                            k, tn);
            if (e->type == FKVF_SECTION_CMET && (e->flags & FKVF_SECTION_REQUIRED))
                return FAIL(FKVF_E_SECTION, eoff, "13.8",
                            "directory entry %u: CMET section with the REQUIRED flag (it MUST "
                            "be clear)",
                            k);
            if (!known_type(e->type) && (e->flags & FKVF_SECTION_REQUIRED))
                return FAIL(FKVF_E_SECTION, eoff, "4.3",
                            "directory entry %u: unknown required section type %s", k, tn);
            r->n_sections++;
        }
        c->n_sections = r->n_sections - c->first_section;
    }
    return FKVF_OK;
}
