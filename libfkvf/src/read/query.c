/* Queries of an open reader: the archive, its sections, the descriptor,
 * metadata and exact rows (spec 7.3, 8, 9, 14). */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

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
    return fkvf_fail(&r->diag, FKVF_E_CORRUPT, FKVF_NO_OFFSET, "14.3",
                     "exact position %llu not covered", (unsigned long long)position);
}

FKVF_API int fkvf_reader_exact_row(fkvf_reader *r, uint64_t position, const void **row,
                                   size_t *row_bytes)
{
    ENTER(r);
    return rd_exact_row(r, position, row, row_bytes);
}
