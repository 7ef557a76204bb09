#include "format.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cbk1_layout.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "metric_matrix.h"

const uint8_t fkvf_magic[9] = {0x89, 'F', 'K', 'V', 'F', 0x0D, 0x0A, 0x1A, 0x0A};
const uint8_t fkvf_trailer_magic[8] = {0x89, 'F', 'K', 'V', 'T', 'R', 'L', 0x0A};

#define BOM UINT32_C(0x0A0B0C0D)
#define BOM_SWAPPED UINT32_C(0x0D0C0B0A)
#define DIRC_MAGIC FKVF_SECTION_DIRC

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* A section must be exactly the size its fields imply (spec 8.2, 10.1,
 * 11.2 step 5, 13.2, 13.5, 14.2): smaller is TRUNCATED, larger CORRUPT.
 * `basis` (printf) says where `want` comes from. */
static int __attribute__((format(printf, 7, 8)))
exact_size(fkvf_diag *d, uint64_t size, uint64_t want, uint64_t off, const char *clause,
           const char *name, const char *basis, ...)
{
    if (size == want)
        return FKVF_OK;
    char why[96];
    va_list ap;
    va_start(ap, basis);
    vsnprintf(why, sizeof why, basis, ap);
    va_end(ap);
    return fkvf_fail(d, size < want ? FKVF_E_TRUNCATED : FKVF_E_CORRUPT, off, clause,
                     "%s: section is %llu bytes, %s %llu", name, (unsigned long long)size, why,
                     (unsigned long long)want);
}

void fkvf_type_name(uint32_t type, char out[12])
{
    uint8_t b[4];
    fkvf_st32(b, type);
    int printable = 1;
    for (int i = 0; i < 4; i++)
        if (b[i] < 0x21 || b[i] > 0x7E)
            printable = 0;
    if (printable) {
        memcpy(out, b, 4);
        out[4] = 0;
    } else {
        static const char hex[] = "0123456789abcdef";
        out[0] = '0';
        out[1] = 'x';
        for (int i = 0; i < 8; i++)
            out[2 + i] = hex[(type >> (28 - 4 * i)) & 15];
        out[10] = 0;
    }
}

size_t fkvf_dtype_size(int dtype)
{
    switch (dtype) {
    case FKVF_DTYPE_F16:
    case FKVF_DTYPE_BF16:
        return 2;
    case FKVF_DTYPE_F32:
        return 4;
    default:
        return 0;
    }
}

/* ---- header --------------------------------------------------------------- */

void fkvf_header_write(uint8_t out[64], const fkvf_header *h)
{
    memset(out, 0, 64);
    memcpy(out, fkvf_magic, 9);
    fkvf_st16(out + 10, h->major);
    fkvf_st16(out + 12, h->minor);
    fkvf_st16(out + 14, FKVF_HEADER_SIZE);
    fkvf_st32(out + 16, BOM);
    fkvf_st64(out + 24, h->required_features);
    fkvf_st64(out + 32, h->optional_features);
    fkvf_st64(out + 56, fkvf_xxh3_64(out, 56, 0));
}

int fkvf_header_parse(const uint8_t *p, size_t avail, fkvf_header *h, fkvf_diag *d)
{
    size_t m = avail < 9 ? avail : 9;
    if (m && memcmp(p, fkvf_magic, m) != 0)
        return fkvf_fail(d, FKVF_E_BAD_MAGIC, 0, "3.1", "header.magic: not an FKVF file");
    if (avail < FKVF_HEADER_SIZE)
        return fkvf_fail(d, FKVF_E_TRUNCATED, 0, "3.1",
                         "header: file has %zu bytes, the header needs 64", avail);
    h->major = fkvf_ld16(p + 10);
    h->minor = fkvf_ld16(p + 12);
    if (h->major != FKVF_FORMAT_MAJOR)
        return fkvf_fail(d, FKVF_E_VERSION, 10, "3.1",
                         "header.format_major: %u, this reader supports %u", h->major,
                         FKVF_FORMAT_MAJOR);
    uint32_t bom = fkvf_ld32(p + 16);
    if (bom != BOM) {
        if (bom == BOM_SWAPPED)
            return fkvf_fail(d, FKVF_E_BYTE_ORDER, 16, "3.1",
                             "header.byte_order: big-endian pattern 0A0B0C0D; file written "
                             "with the wrong byte order");
        return fkvf_fail(d, FKVF_E_BYTE_ORDER, 16, "3.1",
                         "header.byte_order: expected bytes 0D 0C 0B 0A, found 0x%08x", bom);
    }
    uint64_t want = fkvf_xxh3_64(p, 56, 0), got = fkvf_ld64(p + 56);
    if (want != got)
        return fkvf_fail(d, FKVF_E_CHECKSUM, 56, "3.1",
                         "header.checksum: stored %016llx, computed %016llx",
                         (unsigned long long)got, (unsigned long long)want);
    if (fkvf_ld16(p + 14) != FKVF_HEADER_SIZE)
        return fkvf_fail(d, FKVF_E_CORRUPT, 14, "3.1", "header.header_size: %u, must be 64",
                         fkvf_ld16(p + 14));
    if (p[9] != 0 || fkvf_ld32(p + 20) != 0 || !all_zero(p + 40, 16))
        return fkvf_fail(d, FKVF_E_CORRUPT, 9, "3.1", "header: reserved bytes not zero");
    h->required_features = fkvf_ld64(p + 24);
    h->optional_features = fkvf_ld64(p + 32);
    if (h->required_features & ~FKVF_FEATURES_KNOWN)
        return fkvf_fail(d, FKVF_E_FEATURE, 24, "3.1",
                         "header.required_features: unknown bits 0x%llx",
                         (unsigned long long)(h->required_features & ~FKVF_FEATURES_KNOWN));
    return FKVF_OK;
}

/* ---- directory entries, directory header, trailer -------------------------- */

void fkvf_dirent_write(uint8_t out[64], const fkvf_dirent *e)
{
    memset(out, 0, 64);
    fkvf_st32(out + 0, e->type);
    fkvf_st32(out + 4, e->flags);
    fkvf_st64(out + 8, e->offset);
    fkvf_st64(out + 16, e->stored_size);
    fkvf_st64(out + 24, e->size);
    fkvf_st64(out + 32, e->key);
    fkvf_st64(out + 40, e->checksum);
}

void fkvf_dirent_read(const uint8_t p[64], fkvf_dirent *e)
{
    e->type = fkvf_ld32(p + 0);
    e->flags = fkvf_ld32(p + 4);
    e->offset = fkvf_ld64(p + 8);
    e->stored_size = fkvf_ld64(p + 16);
    e->size = fkvf_ld64(p + 24);
    e->key = fkvf_ld64(p + 32);
    e->checksum = fkvf_ld64(p + 40);
}

void fkvf_dirhdr_write(uint8_t out[64], const fkvf_dirhdr *h)
{
    memset(out, 0, 64);
    fkvf_st32(out + 0, DIRC_MAGIC);
    fkvf_st32(out + 4, h->entry_count);
    fkvf_st64(out + 8, h->commit_seq);
    fkvf_st64(out + 16, h->n_positions);
    fkvf_st64(out + 24, h->n_archived);
}

int fkvf_dirhdr_parse(const uint8_t p[64], uint64_t off, fkvf_dirhdr *h, fkvf_diag *d)
{
    if (fkvf_ld32(p) != DIRC_MAGIC)
        return fkvf_fail(d, FKVF_E_CORRUPT, off, "5.3", "directory.magic: not \"DIRC\"");
    h->entry_count = fkvf_ld32(p + 4);
    h->commit_seq = fkvf_ld64(p + 8);
    h->n_positions = fkvf_ld64(p + 16);
    h->n_archived = fkvf_ld64(p + 24);
    if (!all_zero(p + 32, 32))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 32, "5.3",
                         "directory: reserved bytes not zero");
    if (h->entry_count > FKVF_MAX_DIR_ENTRIES)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 4, "15", "directory.entry_count: %u > %u",
                         h->entry_count, FKVF_MAX_DIR_ENTRIES);
    if (h->n_archived > h->n_positions)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 24, "5.3",
                         "directory.n_archived: %llu > n_positions %llu",
                         (unsigned long long)h->n_archived,
                         (unsigned long long)h->n_positions);
    return FKVF_OK;
}

void fkvf_trailer_write(uint8_t out[64], const fkvf_trailer *t, uint64_t off)
{
    memset(out, 0, 64);
    memcpy(out, fkvf_trailer_magic, 8);
    fkvf_st64(out + 8, t->commit_seq);
    fkvf_st64(out + 16, t->dir_offset);
    fkvf_st64(out + 24, t->dir_size);
    fkvf_st64(out + 32, t->dir_checksum);
    fkvf_st64(out + 40, t->prev_trailer);
    fkvf_st64(out + 48, t->file_size);
    fkvf_st64(out + 56, fkvf_xxh3_64(out, 56, off));
}

int fkvf_trailer_parse(const uint8_t p[64], uint64_t off, fkvf_trailer *t, fkvf_diag *d)
{
    if (memcmp(p, fkvf_trailer_magic, 8) != 0)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "7.2",
                         "trailer.magic: no commit trailer here (truncated or torn file)");
    uint64_t want = fkvf_xxh3_64(p, 56, off), got = fkvf_ld64(p + 56);
    if (want != got)
        return fkvf_fail(d, FKVF_E_CHECKSUM, off + 56, "6.2",
                         "trailer.checksum: stored %016llx, computed %016llx",
                         (unsigned long long)got, (unsigned long long)want);
    t->commit_seq = fkvf_ld64(p + 8);
    t->dir_offset = fkvf_ld64(p + 16);
    t->dir_size = fkvf_ld64(p + 24);
    t->dir_checksum = fkvf_ld64(p + 32);
    t->prev_trailer = fkvf_ld64(p + 40);
    t->file_size = fkvf_ld64(p + 48);
    uint64_t end;
    if (t->file_size != off + 64)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 48, "6.2",
                         "trailer.file_size: %llu, the trailer ends at %llu",
                         (unsigned long long)t->file_size, (unsigned long long)(off + 64));
    if (t->commit_seq == 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 8, "6.2", "trailer.commit_seq: 0");
    if (t->commit_seq > FKVF_MAX_COMMITS)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 8, "6.2", "trailer.commit_seq: %llu > 2^24",
                         (unsigned long long)t->commit_seq);
    if (t->dir_offset % 64)
        return fkvf_fail(d, FKVF_E_ALIGN, off + 16, "4.1",
                         "trailer.dir_offset: %llu is not a multiple of 64",
                         (unsigned long long)t->dir_offset);
    if (t->dir_offset < FKVF_HEADER_SIZE || t->dir_size < FKVF_DIRHDR_SIZE ||
        (t->dir_size - FKVF_DIRHDR_SIZE) % FKVF_DIRENT_SIZE ||
        !fkvf_add64(t->dir_offset, t->dir_size, &end) || end > off || off - end >= 64)
        return fkvf_fail(d, FKVF_E_BOUNDS, off + 16, "6.2",
                         "trailer: directory [%llu, +%llu) must end within 64 bytes before "
                         "the trailer at %llu",
                         (unsigned long long)t->dir_offset, (unsigned long long)t->dir_size,
                         (unsigned long long)off);
    /* prev_trailer + 64 <= dir_offset, written so that it cannot wrap
     * (dir_offset >= 64 here) */
    if (t->commit_seq == 1 ? t->prev_trailer != 0
                           : (t->prev_trailer % 64 || t->prev_trailer < 64 + 64 ||
                              t->prev_trailer > t->dir_offset - 64))
        return fkvf_fail(d, FKVF_E_CHAIN, off + 40, "7.1",
                         "trailer.prev_trailer: %llu invalid for commit %llu",
                         (unsigned long long)t->prev_trailer,
                         (unsigned long long)t->commit_seq);
    if (t->dir_size > FKVF_DIRHDR_SIZE + (uint64_t)FKVF_DIRENT_SIZE * FKVF_MAX_DIR_ENTRIES)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 24, "6.2",
                         "trailer.dir_size: %llu exceeds the largest directory",
                         (unsigned long long)t->dir_size);
    return FKVF_OK;
}

/* ---- stream segment header -------------------------------------------------- */

uint32_t fkvf_strm_align(unsigned profile, unsigned bits, uint32_t span_symbols)
{
    if (profile != FKVF_PROFILE_QUAD)
        return span_symbols;
    uint32_t g = 128;
    while (g > 1 && bits % g) /* gcd(bits, 128): the largest power of two dividing bits */
        g /= 2;
    return 128 / g;
}

int fkvf_strm_hdr_derive(fkvf_strm_hdr *h)
{
    uint64_t bits, db;
    if (h->profile == FKVF_PROFILE_QUAD) {
        if (!fkvf_mul64(h->symbol_count, h->bits, &bits))
            return FKVF_E_LIMIT;
        db = fkvf_ceildiv(bits, 128);
    } else {
        if (h->span_symbols == 0)
            return FKVF_E_CORRUPT;
        db = fkvf_ceildiv(h->symbol_count, h->span_symbols);
    }
    if (!fkvf_mul64(db, 16, &h->stream_bytes) ||
        !fkvf_mul64(h->stream_bytes, h->n_streams, &h->data_bytes) || h->block_size == 0)
        return FKVF_E_LIMIT;
    h->n_blocks = fkvf_ceildiv(h->data_bytes, h->block_size);
    uint64_t t;
    if (!fkvf_mul64(h->n_blocks, 8, &t) || !fkvf_add64(t, 64, &t) ||
        !fkvf_align64(t, &h->data_off) || !fkvf_add64(h->data_off, h->data_bytes, &h->section_size))
        return FKVF_E_LIMIT;
    return h->section_size > FKVF_MAX_SECTION_SIZE ? FKVF_E_LIMIT : FKVF_OK;
}

void fkvf_strm_hdr_write(uint8_t out[64], const fkvf_strm_hdr *h, uint64_t section_off)
{
    memset(out, 0, 64);
    fkvf_st64(out + 0, h->group);
    out[8] = h->profile;
    out[9] = h->bits;
    out[10] = h->k_stages;
    out[11] = h->v_stages;
    fkvf_st32(out + 12, h->alphabet);
    fkvf_st64(out + 16, h->first_symbol);
    fkvf_st64(out + 24, h->symbol_count);
    fkvf_st32(out + 32, h->span_symbols);
    fkvf_st32(out + 36, h->block_size);
    fkvf_stf64(out + 40, h->r);
    fkvf_st32(out + 48, h->n_streams);
    fkvf_st64(out + 56, fkvf_xxh3_64(out, 56, section_off));
}

int fkvf_strm_hdr_parse(const uint8_t *p, uint64_t size, uint64_t off, fkvf_strm_hdr *h,
                        fkvf_diag *d)
{
    if (size < FKVF_STRM_HDR_SIZE)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "11.2",
                         "STRM: section has %llu bytes, the header needs 64",
                         (unsigned long long)size);
    uint64_t want = fkvf_xxh3_64(p, 56, off), got = fkvf_ld64(p + 56);
    if (want != got)
        return fkvf_fail(d, FKVF_E_CHECKSUM, off + 56, "11.2",
                         "STRM.head_checksum: stored %016llx, computed %016llx",
                         (unsigned long long)got, (unsigned long long)want);
    memset(h, 0, sizeof *h);
    h->group = fkvf_ld64(p + 0);
    h->profile = p[8];
    h->bits = p[9];
    h->k_stages = p[10];
    h->v_stages = p[11];
    h->alphabet = fkvf_ld32(p + 12);
    h->first_symbol = fkvf_ld64(p + 16);
    h->symbol_count = fkvf_ld64(p + 24);
    h->span_symbols = fkvf_ld32(p + 32);
    h->block_size = fkvf_ld32(p + 36);
    h->r = fkvf_ldf64(p + 40);
    h->n_streams = fkvf_ld32(p + 48);
    if (fkvf_ld32(p + 52) != 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 52, "11.2", "STRM: reserved bytes not zero");
    if (h->group == FKVF_GROUP_INDEX) {
        if (h->k_stages > 16 || h->v_stages > 16 || h->k_stages + h->v_stages == 0)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 10, "11.2",
                             "STRM: index group with %u key and %u value stages (0..16 each, "
                             "at least one)",
                             h->k_stages, h->v_stages);
        if (h->n_streams == 0 || h->n_streams > FKVF_MAX_GROUP_STREAMS)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 48, "11.2",
                             "STRM.n_streams: %u out of range", h->n_streams);
    } else if (h->group == FKVF_GROUP_TOKENS) {
        if (h->k_stages || h->v_stages || h->n_streams != 1)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 10, "11.2",
                             "STRM: token group needs 0 stages and n_streams 1 (stages %u/%u, "
                             "n_streams %u)",
                             h->k_stages, h->v_stages, h->n_streams);
    } else {
        return fkvf_fail(d, FKVF_E_CORRUPT, off, "11.2", "STRM.group: %llu unknown",
                         (unsigned long long)h->group);
    }
    if (h->profile == FKVF_PROFILE_QUAD) {
        if (h->bits < 2 || h->bits > 32 || (h->bits & 1))
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 9, "11.2",
                             "STRM.symbol_bits: %u (quad needs an even width 2..32)", h->bits);
        if (h->alphabet != 0 || h->span_symbols != 0 || fkvf_ld64(p + 40) != 0)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 12, "11.2",
                             "STRM: alphabet, span_symbols and r must be 0 for quad");
    } else if (h->profile == FKVF_PROFILE_NGON) {
        if (h->bits != 0)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 9, "11.2",
                             "STRM.symbol_bits: must be 0 for ngon");
        if (h->alphabet < 2 || h->alphabet > FKVF_MAX_NGON_N)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 12, "11.2",
                             "STRM.alphabet: %u (ngon needs 2..65536)", h->alphabet);
        if (!isfinite(h->r) || !(h->r > 0.0) || !(h->r <= 0.5))
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 40, "12.2", "STRM.r: %g out of (0, 1/2]",
                             h->r);
        /* L_max depends on r alone (spec 12.2.2): checked with the fields */
        if (h->span_symbols < 1 || h->span_symbols > fkvf_ngon_max_span(h->r))
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 32, "12.2.2",
                             "STRM.span_symbols: %u out of 1..L_max(r) = %u", h->span_symbols,
                             fkvf_ngon_max_span(h->r));
    } else {
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 8, "11.2", "STRM.profile: %u unknown",
                         h->profile);
    }
    uint32_t u = fkvf_strm_align(h->profile, h->bits, h->span_symbols);
    if (h->first_symbol % u)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 16, "11.6",
                         "STRM.first_symbol: %llu not a multiple of the alignment unit %u",
                         (unsigned long long)h->first_symbol, u);
    if (h->block_size < FKVF_MIN_BLOCK || h->block_size > FKVF_MAX_BLOCK || h->block_size % 64)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 36, "11.2",
                         "STRM.block_size: %u (multiple of 64 in 64..2^20)", h->block_size);
    if (fkvf_strm_hdr_derive(h) != FKVF_OK)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 24, "15",
                         "STRM.symbol_count: %llu symbols of %u streams do not fit the limits",
                         (unsigned long long)h->symbol_count, h->n_streams);
    return exact_size(d, size, h->section_size, off, "11.2", "STRM", "its header implies");
}

/* ---- descriptor ---------------------------------------------------------- */

int fkvf_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

uint64_t fkvf_desc_row_bytes(const fkvf_desc *desc)
{
    uint64_t v, per;
    if (!fkvf_add64(desc->key_dim, desc->value_dim, &per) ||
        !fkvf_mul64(per, desc->n_kv_heads, &v) || !fkvf_mul64(v, desc->n_layers, &v) ||
        !fkvf_mul64(v, fkvf_dtype_size(desc->dtype), &v))
        return 0;
    return v;
}

/* Shared semantic checks; `off` is the section offset, or FKVF_NO_OFFSET
 * for a caller's descriptor (writer side): then every failure is the
 * caller's, FKVF_E_INVALID_ARG, in the message too. */
static int desc_validate(const fkvf_desc *x, uint64_t off, fkvf_diag *d)
{
#define AT(o) (off == FKVF_NO_OFFSET ? FKVF_NO_OFFSET : off + (o))
    const int bad = off == FKVF_NO_OFFSET ? FKVF_E_INVALID_ARG : FKVF_E_CORRUPT;
    const int limit = off == FKVF_NO_OFFSET ? FKVF_E_INVALID_ARG : FKVF_E_LIMIT;
    if (x->n_layers < 1 || x->n_layers > FKVF_MAX_LAYERS)
        return fkvf_fail(d, bad, AT(0), "8.2", "DESC.n_layers: %u (1..%u)",
                         x->n_layers, FKVF_MAX_LAYERS);
    if (x->n_kv_heads < 1 || x->n_kv_heads > FKVF_MAX_HEADS)
        return fkvf_fail(d, bad, AT(4), "8.2", "DESC.n_kv_heads: %u (1..%u)",
                         x->n_kv_heads, FKVF_MAX_HEADS);
    if (x->key_dim < 1 || x->key_dim > FKVF_MAX_DIM)
        return fkvf_fail(d, bad, AT(8), "8.2", "DESC.key_dim: %u (1..%u)", x->key_dim,
                         FKVF_MAX_DIM);
    if (x->value_dim < 1 || x->value_dim > FKVF_MAX_DIM)
        return fkvf_fail(d, bad, AT(12), "8.2", "DESC.value_dim: %u (1..%u)",
                         x->value_dim, FKVF_MAX_DIM);
    if (fkvf_dtype_size(x->dtype) == 0)
        return fkvf_fail(d, bad, AT(16), "8.2", "DESC.dtype: %d unknown",
                         (int)x->dtype);
    if (x->key_transform == 0) {
        if (x->rope_layout || x->key_storage || x->rope_dims || x->rope_theta != 0.0)
            return fkvf_fail(d, bad, AT(17), "8.2",
                             "DESC: RoPE fields must be zero when key_transform is none");
    } else if (x->key_transform == 1) {
        if (x->rope_layout != 1 && x->rope_layout != 2)
            return fkvf_fail(d, bad, AT(18), "8.2", "DESC.rope_layout: %u unknown",
                             x->rope_layout);
        if (x->key_storage > 1)
            return fkvf_fail(d, bad, AT(19), "8.2", "DESC.key_storage: %u unknown",
                             x->key_storage);
        if (x->rope_dims < 2 || (x->rope_dims & 1) || x->rope_dims > x->key_dim)
            return fkvf_fail(d, bad, AT(20), "8.2",
                             "DESC.rope_dims: %u (even, 2..key_dim %u)", x->rope_dims,
                             x->key_dim);
        if (!isfinite(x->rope_theta) || !(x->rope_theta > 0.0))
            return fkvf_fail(d, bad, AT(24), "8.2", "DESC.rope_theta: %g",
                             x->rope_theta);
    } else {
        return fkvf_fail(d, bad, AT(17), "8.2", "DESC.key_transform: %u unknown",
                         x->key_transform);
    }
    if (x->weights_hash_kind > 2)
        return fkvf_fail(d, bad, AT(48), "8.2", "DESC.weights_hash_kind: %u unknown",
                         x->weights_hash_kind);
    size_t hl = x->weights_hash_kind == 1 ? 32 : x->weights_hash_kind == 2 ? 16 : 0;
    if (!all_zero(x->weights_hash + hl, 32 - hl))
        return fkvf_fail(d, bad, AT(56), "8.2",
                         "DESC.weights_hash: bytes beyond the hash length not zero");
    if (fkvf_desc_row_bytes(x) == 0)
        return fkvf_fail(d, limit, AT(0), "15", "DESC: row size overflows");
#undef AT
    return FKVF_OK;
}

int fkvf_desc_parse(const uint8_t *p, uint64_t size, uint64_t off, fkvf_desc_raw *out,
                    fkvf_diag *d)
{
    memset(out, 0, sizeof *out);
    if (size < FKVF_DESC_FIXED)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "8.2", "DESC: %llu bytes, needs at least 128",
                         (unsigned long long)size);
    fkvf_desc *x = &out->d;
    x->n_layers = fkvf_ld32(p + 0);
    x->n_kv_heads = fkvf_ld32(p + 4);
    x->key_dim = fkvf_ld32(p + 8);
    x->value_dim = fkvf_ld32(p + 12);
    x->dtype = (fkvf_dtype)p[16];
    x->key_transform = p[17];
    x->rope_layout = p[18];
    x->key_storage = p[19];
    x->rope_dims = fkvf_ld32(p + 20);
    x->rope_theta = fkvf_ldf64(p + 24);
    x->n_sinks = fkvf_ld32(p + 32);
    x->window = fkvf_ld32(p + 36);
    out->model_id_len = fkvf_ld32(p + 40);
    out->tokenizer_id_len = fkvf_ld32(p + 44);
    x->weights_hash_kind = p[48];
    memcpy(x->weights_hash, p + 56, 32);
    if (!all_zero(p + 49, 7) || !all_zero(p + 88, 40))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 49, "8.2", "DESC: reserved bytes not zero");
    int rc = desc_validate(x, off, d);
    if (rc)
        return rc;
    if (out->model_id_len > FKVF_MAX_ID_LEN || out->tokenizer_id_len > FKVF_MAX_ID_LEN)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 40, "15",
                         "DESC: model_id_len %u / tokenizer_id_len %u over %u",
                         out->model_id_len, out->tokenizer_id_len, FKVF_MAX_ID_LEN);
    uint64_t want = (uint64_t)FKVF_DESC_FIXED + out->model_id_len + out->tokenizer_id_len;
    if ((rc = exact_size(d, size, want, off, "8.2", "DESC", "its lengths imply")))
        return rc;
    out->model_id = p + FKVF_DESC_FIXED;
    out->tokenizer_id = out->model_id + out->model_id_len;
    if (!fkvf_utf8_valid(out->model_id, out->model_id_len) ||
        !fkvf_utf8_valid(out->tokenizer_id, out->tokenizer_id_len))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + FKVF_DESC_FIXED, "8.2",
                         "DESC: model_id or tokenizer_id is not valid UTF-8");
    return FKVF_OK;
}

int fkvf_desc_check(const fkvf_desc *desc, fkvf_diag *d)
{
    int rc = desc_validate(desc, FKVF_NO_OFFSET, d);
    if (rc)
        return rc;
    const char *ids[2] = {desc->model_id, desc->tokenizer_id};
    for (int i = 0; i < 2; i++) {
        size_t n = ids[i] ? strlen(ids[i]) : 0;
        if (n > FKVF_MAX_ID_LEN || !fkvf_utf8_valid((const uint8_t *)ids[i], n))
            return fkvf_fail(d, FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, "8.2",
                             "desc.%s: longer than %u bytes or not UTF-8",
                             i ? "tokenizer_id" : "model_id", FKVF_MAX_ID_LEN);
    }
    return FKVF_OK;
}

size_t fkvf_desc_size(const fkvf_desc *desc)
{
    return FKVF_DESC_FIXED + (desc->model_id ? strlen(desc->model_id) : 0) +
           (desc->tokenizer_id ? strlen(desc->tokenizer_id) : 0);
}

void fkvf_desc_write(uint8_t *out, const fkvf_desc *x)
{
    size_t ml = x->model_id ? strlen(x->model_id) : 0;
    size_t tl = x->tokenizer_id ? strlen(x->tokenizer_id) : 0;
    memset(out, 0, FKVF_DESC_FIXED);
    fkvf_st32(out + 0, x->n_layers);
    fkvf_st32(out + 4, x->n_kv_heads);
    fkvf_st32(out + 8, x->key_dim);
    fkvf_st32(out + 12, x->value_dim);
    out[16] = (uint8_t)x->dtype;
    out[17] = x->key_transform;
    out[18] = x->rope_layout;
    out[19] = x->key_storage;
    fkvf_st32(out + 20, x->rope_dims);
    fkvf_stf64(out + 24, x->rope_theta);
    fkvf_st32(out + 32, x->n_sinks);
    fkvf_st32(out + 36, x->window);
    fkvf_st32(out + 40, (uint32_t)ml);
    fkvf_st32(out + 44, (uint32_t)tl);
    out[48] = x->weights_hash_kind;
    memcpy(out + 56, x->weights_hash, 32);
    if (ml)
        memcpy(out + FKVF_DESC_FIXED, x->model_id, ml);
    if (tl)
        memcpy(out + FKVF_DESC_FIXED + ml, x->tokenizer_id, tl);
}

/* ---- metadata ------------------------------------------------------------ */

static int meta_value_len_ok(uint8_t type, uint32_t len)
{
    switch (type) {
    case FKVF_META_U64:
    case FKVF_META_I64:
    case FKVF_META_F64:
        return len == 8;
    case FKVF_META_BOOL:
        return len == 1;
    case FKVF_META_UTF8:
    case FKVF_META_BYTES:
        return len <= FKVF_MAX_META_VALUE;
    default:
        return 0;
    }
}

struct mkey {
    const uint8_t *key;
    size_t len;
    uint32_t index;
};

static int mkey_cmp(const void *a, const void *b)
{
    const struct mkey *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, m);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* Spec 9.2: no key twice. Sorts the keys and compares neighbours,
 * O(n log n). */
static int meta_dup_check(const uint8_t *p, uint64_t off, uint32_t n, const size_t *at,
                          const fkvf_allocator *alloc, fkvf_diag *d)
{
    struct mkey *keys = fkvf_calloc(alloc, n, sizeof *keys);
    if (!keys)
        return fkvf_fail(d, FKVF_E_NOMEM, off, NULL, "META: no memory for %u keys", n);
    for (uint32_t i = 0; i < n; i++) {
        keys[i].len = fkvf_ld16(p + at[i]);
        keys[i].key = p + at[i] + 8;
        keys[i].index = i;
    }
    qsort(keys, n, sizeof *keys, mkey_cmp);
    int rc = FKVF_OK;
    for (uint32_t i = 1; i < n && rc == FKVF_OK; i++)
        if (mkey_cmp(&keys[i - 1], &keys[i]) == 0)
            rc = fkvf_fail(d, FKVF_E_DUP_KEY, off, "9.2",
                           "META: key \"%.*s\" appears twice (entries %u and %u)",
                           (int)keys[i].len, (const char *)keys[i].key, keys[i - 1].index,
                           keys[i].index);
    fkvf_free(alloc, keys);
    return rc;
}

int fkvf_meta_parse(const uint8_t *p, uint64_t size, uint64_t off, uint32_t *count,
                    size_t **entry_off, const fkvf_allocator *alloc, fkvf_diag *d)
{
    size_t sz;
    *entry_off = NULL;
    if (!fkvf_tosz(size, &sz))
        return fkvf_fail(d, FKVF_E_LIMIT, off, "15", "META: too large");
    fkvf_rd rd = fkvf_rd_make(p, sz);
    uint32_t n = fkvf_rd_u32(&rd);
    uint32_t res = fkvf_rd_u32(&rd);
    if (!fkvf_rd_ok(&rd))
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "9.1", "META: shorter than its 8-byte header");
    if (res != 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 4, "9.1", "META: reserved field not zero");
    if (n > FKVF_MAX_META)
        return fkvf_fail(d, FKVF_E_LIMIT, off, "15", "META.count: %u > %u", n, FKVF_MAX_META);
    /* Each entry needs >= 9 bytes: a count the bytes cannot hold is rejected
     * before any work proportional to it. */
    if ((uint64_t)n * 9 > size - 8)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "9.1",
                         "META.count: %u entries cannot fit in %llu bytes", n,
                         (unsigned long long)size);
    size_t *at = NULL;
    if (n && !(at = fkvf_calloc(alloc, n, sizeof *at)))
        return fkvf_fail(d, FKVF_E_NOMEM, off, NULL, "META: no memory for %u entries", n);
    int rc = FKVF_OK;
    for (uint32_t i = 0; i < n && rc == FKVF_OK; i++) {
        at[i] = rd.pos;
        uint16_t kl = fkvf_rd_u16(&rd);
        uint8_t type = fkvf_rd_u8(&rd);
        uint8_t r0 = fkvf_rd_u8(&rd);
        uint32_t vl = fkvf_rd_u32(&rd);
        const uint8_t *key = fkvf_rd_take(&rd, kl);
        const uint8_t *val = fkvf_rd_take(&rd, vl);
        uint64_t eo = off + at[i];
        if (!fkvf_rd_ok(&rd))
            rc = fkvf_fail(d, FKVF_E_TRUNCATED, eo, "9.1",
                           "META entry %u: runs past the end of the section", i);
        else if (r0 != 0)
            rc = fkvf_fail(d, FKVF_E_CORRUPT, eo + 3, "9.1",
                           "META entry %u: reserved byte not zero", i);
        else if (kl == 0 || kl > 255 || memchr(key, 0, kl) || !fkvf_utf8_valid(key, kl))
            rc = fkvf_fail(d, FKVF_E_CORRUPT, eo, "9.1",
                           "META entry %u: key must be 1..255 bytes of UTF-8 without NUL", i);
        else if (!meta_value_len_ok(type, vl))
            rc = fkvf_fail(d, FKVF_E_CORRUPT, eo + 2, "9.1",
                           "META entry %u: type %u with value length %u", i, type, vl);
        else if (type == FKVF_META_BOOL && val[0] > 1)
            rc = fkvf_fail(d, FKVF_E_CORRUPT, eo + 8 + kl, "9.1", "META entry %u: bool value %u",
                           i, val[0]);
        else if (type == FKVF_META_UTF8 && !fkvf_utf8_valid(val, vl))
            rc = fkvf_fail(d, FKVF_E_CORRUPT, eo + 8 + kl, "9.1",
                           "META entry %u: utf8 value is not valid UTF-8", i);
    }
    if (rc == FKVF_OK && rd.pos != sz)
        rc = fkvf_fail(d, FKVF_E_CORRUPT, off + rd.pos, "9.1",
                       "META: %zu bytes after the last entry", sz - rd.pos);
    if (rc == FKVF_OK && n > 1)
        rc = meta_dup_check(p, off, n, at, alloc, d);
    if (rc != FKVF_OK) {
        fkvf_free(alloc, at);
        return rc;
    }
    *count = n;
    *entry_off = at;
    return FKVF_OK;
}

void fkvf_meta_entry_at(const uint8_t *p, size_t at, fkvf_meta_entry *e)
{
    uint16_t kl = fkvf_ld16(p + at);
    const uint8_t *v = p + at + 8 + kl;
    memset(e, 0, sizeof *e);
    e->type = (fkvf_meta_type)p[at + 2];
    e->key = (const char *)(p + at + 8);
    e->key_len = kl;
    e->value = v;
    e->value_len = fkvf_ld32(p + at + 4);
    if (e->type == FKVF_META_U64)
        e->u64 = fkvf_ld64(v);
    else if (e->type == FKVF_META_I64)
        e->i64 = (int64_t)fkvf_ld64(v);
    else if (e->type == FKVF_META_F64)
        e->f64 = fkvf_ldf64(v);
    else if (e->type == FKVF_META_BOOL)
        e->u64 = v[0];
}

/* ---- exact rows, vertices --------------------------------------------------- */

void fkvf_exac_hdr_write(uint8_t out[64], const fkvf_exac_hdr *h)
{
    memset(out, 0, 64);
    fkvf_st64(out + 0, h->first);
    fkvf_st64(out + 8, h->count);
    out[16] = h->dtype;
}

int fkvf_exac_hdr_parse(const uint8_t *p, uint64_t size, uint64_t off, uint64_t row_bytes,
                        fkvf_exac_hdr *h, fkvf_diag *d)
{
    if (size < FKVF_SUBHDR_SIZE)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "14.2", "EXAC: %llu bytes, header needs 64",
                         (unsigned long long)size);
    h->first = fkvf_ld64(p);
    h->count = fkvf_ld64(p + 8);
    h->dtype = p[16];
    if (!all_zero(p + 17, 47))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 17, "14.2", "EXAC: reserved bytes not zero");
    uint64_t want, end;
    if (!fkvf_mul64(h->count, row_bytes, &want) || !fkvf_add64(want, 64, &want) ||
        !fkvf_add64(h->first, h->count, &end))
        return fkvf_fail(d, FKVF_E_LIMIT, off + 8, "15", "EXAC.count: %llu overflows",
                         (unsigned long long)h->count);
    /* the section within 2^48 bytes (spec 15), before the size check that
     * uses count (spec 16.2) */
    if (want > FKVF_MAX_SECTION_SIZE)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 8, "15",
                         "EXAC.count: %llu rows of %llu bytes exceed 2^48 bytes",
                         (unsigned long long)h->count, (unsigned long long)row_bytes);
    return exact_size(d, size, want, off, "14.2", "EXAC", "%llu rows of %llu bytes need",
                      (unsigned long long)h->count, (unsigned long long)row_bytes);
}

static int range_cmp(const void *a, const void *b)
{
    const fkvf_range *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

uint64_t fkvf_ranges_first_gap(fkvf_range *ranges, size_t n, uint64_t lo, uint64_t hi)
{
    if (n > 1)
        qsort(ranges, n, sizeof *ranges, range_cmp);
    uint64_t p = lo; /* [lo, p) is covered */
    for (size_t i = 0; i < n && p < hi && ranges[i].first <= p; i++)
        if (ranges[i].first + ranges[i].count > p)
            p = ranges[i].first + ranges[i].count;
    return p < hi ? p : hi;
}

int fkvf_vtxs_parse(const uint8_t *p, uint64_t size, uint64_t off, uint64_t key, uint32_t *n,
                    fkvf_diag *d)
{
    if (size < 8)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "10.1", "VTXS: %llu bytes",
                         (unsigned long long)size);
    uint32_t nn = fkvf_ld32(p);
    if (nn < 2 || nn > FKVF_MAX_NGON_N || key != nn || fkvf_ld32(p + 4) != 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off, "10.1",
                         "VTXS.N: %u (2..65536, equal to the directory key %llu)", nn,
                         (unsigned long long)key);
    int rc = exact_size(d, size, 8 + 16 * (uint64_t)nn, off, "10.1", "VTXS", "N=%u needs", nn);
    if (rc)
        return rc;
    *n = nn;
    return FKVF_OK;
}

/* ---- codebooks ------------------------------------------------------------- */

/* The layer table of a shape (spec 13.1): fkvf_cbk1_table_bad's answer. */
static uint32_t layer_table_bad(const fkvf_codebook_shape *s)
{
    return fkvf_cbk1_table_bad(s->layer_stages, s->n_layers, s->k_stages, s->v_stages);
}

/* Every field in its range (spec 13.1), the layer table included? */
static int cbk1_shape_ok(const fkvf_codebook_shape *s)
{
    return !(s->n_layers < 1 || s->n_layers > FKVF_MAX_LAYERS || s->n_heads < 1 ||
             s->n_heads > FKVF_MAX_HEADS || s->key_dim < 1 || s->key_dim > FKVF_MAX_DIM ||
             s->value_dim < 1 || s->value_dim > FKVF_MAX_DIM || s->k < 16 || s->k > 4096 ||
             (s->k & (s->k - 1)) || s->k_stages > 16 || s->v_stages > 16 ||
             (s->dtype != FKVF_DTYPE_F16 && s->dtype != FKVF_DTYPE_F32) || s->pooled > 1 ||
             (s->pooled && s->n_heads != 1) || (s->layer_stages && layer_table_bad(s)));
}

uint64_t fkvf_cbk1_head_size(const fkvf_codebook_shape *s)
{
    /* n_layers <= 1024: no overflow */
    return s->layer_stages ? 64 + (((uint64_t)2 * s->n_layers + 63) & ~(uint64_t)63) : 64;
}

/* Section size of a shape whose fields are in range (spec 13.2); 0 when it
 * exceeds the section limit of spec 15. */
static uint64_t cbk1_bytes(const fkvf_codebook_shape *s)
{
    uint64_t all = 0;
    /* the sum over layers of k * (ks(l) * key_dim + vs(l) * value_dim):
     * each term below 2^12 * 2^5 * 2^14, n_layers <= 2^10, no overflow */
    for (uint32_t l = 0; l < s->n_layers; l++)
        all += (uint64_t)s->k * ((uint64_t)fkvf_layer_k_stages(s, l) * s->key_dim +
                                 (uint64_t)fkvf_layer_v_stages(s, l) * s->value_dim);
    if (!fkvf_mul64(all, fkvf_dtype_size(s->dtype), &all) || !fkvf_mul64(all, s->n_heads, &all) ||
        !fkvf_add64(all, fkvf_cbk1_head_size(s), &all) || all > FKVF_MAX_SECTION_SIZE)
        return 0;
    return all;
}

uint64_t fkvf_cbk1_size(const fkvf_codebook_shape *s)
{
    return cbk1_shape_ok(s) ? cbk1_bytes(s) : 0;
}

void fkvf_cbk1_layer_table_write(uint8_t *out, const fkvf_codebook_shape *s)
{
    size_t t = (size_t)(fkvf_cbk1_head_size(s) - 64);
    memset(out, 0, t);
    if (s->layer_stages)
        memcpy(out, s->layer_stages, 2 * (size_t)s->n_layers);
}

void fkvf_cbk1_hdr_write(uint8_t out[64], const fkvf_codebook_shape *s)
{
    memset(out, 0, 64);
    fkvf_st32(out + 0, s->n_layers);
    fkvf_st32(out + 4, s->n_heads);
    fkvf_st32(out + 8, s->key_dim);
    fkvf_st32(out + 12, s->value_dim);
    fkvf_st32(out + 16, s->k);
    out[20] = s->k_stages;
    out[21] = s->v_stages;
    out[22] = (uint8_t)s->dtype;
    out[23] = s->pooled;
    out[24] = s->layer_stages ? 1 : 0;
}

int fkvf_cbk1_parse(const uint8_t *p, uint64_t size, uint64_t off, int layer_stages_ok,
                    fkvf_codebook_shape *s, fkvf_diag *d)
{
    if (size < 64)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "13.2", "CBK1: %llu bytes, header needs 64",
                         (unsigned long long)size);
    memset(s, 0, sizeof *s);
    s->n_layers = fkvf_ld32(p);
    s->n_heads = fkvf_ld32(p + 4);
    s->key_dim = fkvf_ld32(p + 8);
    s->value_dim = fkvf_ld32(p + 12);
    s->k = fkvf_ld32(p + 16);
    s->k_stages = p[20];
    s->v_stages = p[21];
    s->dtype = (fkvf_dtype)p[22];
    s->pooled = p[23];
    if (!all_zero(p + 25, 39))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 25, "13.1", "CBK1: reserved bytes not zero");
    /* the header's fields, then the layer table (spec 13.1 gives the order) */
    if (!cbk1_shape_ok(s))
        return fkvf_fail(d, FKVF_E_CORRUPT, off, "13.1",
                         "CBK1: shape out of range (layers %u, heads %u, dims %u/%u, k %u, "
                         "stages %u/%u, dtype %u, pooled %u)",
                         s->n_layers, s->n_heads, s->key_dim, s->value_dim, s->k, s->k_stages,
                         s->v_stages, (unsigned)s->dtype, s->pooled);
    if (p[24] > 1)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 24, "13.1", "CBK1.layer_stages: %u, must be 0 or 1",
                         p[24]);
    if (p[24] == 1) {
        if (!layer_stages_ok)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 24, "3.3",
                             "CBK1.layer_stages: 1, but the header does not declare the "
                             "LAYER_STAGES feature");
        s->layer_stages = p + 64; /* a flag for fkvf_cbk1_head_size until checked below */
        uint64_t head = fkvf_cbk1_head_size(s);
        if (size < head)
            return fkvf_fail(d, FKVF_E_TRUNCATED, off, "13.1",
                             "CBK1: %llu bytes, the header and layer table of %u layers need %llu",
                             (unsigned long long)size, s->n_layers, (unsigned long long)head);
        uint32_t bad = layer_table_bad(s);
        if (bad && bad <= s->n_layers)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 64 + 2 * (uint64_t)(bad - 1), "13.1",
                             "CBK1 layer table: layer %u has %u + %u stages, at most 16 each",
                             bad - 1, p[64 + 2 * (size_t)(bad - 1)], p[65 + 2 * (size_t)(bad - 1)]);
        if (bad)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 20, "13.1",
                             "CBK1: k_stages %u and v_stages %u are not the largest counts of "
                             "the layer table",
                             s->k_stages, s->v_stages);
        size_t used = 64 + 2 * (size_t)s->n_layers;
        if (!all_zero(p + used, (size_t)head - used))
            return fkvf_fail(d, FKVF_E_CORRUPT, off + used, "13.1",
                             "CBK1 layer table: padding bytes not zero");
    }
    uint64_t want = cbk1_bytes(s);
    if (want == 0)
        return fkvf_fail(d, FKVF_E_LIMIT, off, "13.2",
                         "CBK1: the shape needs a section of more than 2^48 bytes (spec 15)");
    return exact_size(d, size, want, off, "13.2", "CBK1", "the shape needs");
}

int fkvf_cbrf_parse(const uint8_t *p, uint64_t size, uint64_t off, const uint8_t **hash,
                    const uint8_t **name, uint32_t *name_len, fkvf_diag *d)
{
    if (size < FKVF_CBRF_FIXED)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "13.5", "CBRF: %llu bytes, needs 24",
                         (unsigned long long)size);
    uint32_t nl = fkvf_ld32(p + 16);
    if (fkvf_ld32(p + 20) != 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 20, "13.5", "CBRF: reserved field not zero");
    if (nl > FKVF_MAX_ID_LEN)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 16, "13.5", "CBRF.name_len: %u > %u", nl,
                         FKVF_MAX_ID_LEN);
    int rc = exact_size(d, size, FKVF_CBRF_FIXED + (uint64_t)nl, off, "13.5", "CBRF",
                        "name_len %u needs", nl);
    if (rc)
        return rc;
    if (!fkvf_utf8_valid(p + FKVF_CBRF_FIXED, nl))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + FKVF_CBRF_FIXED, "13.5",
                         "CBRF.name: not valid UTF-8");
    *hash = p;
    *name = p + FKVF_CBRF_FIXED;
    *name_len = nl;
    return FKVF_OK;
}

/* ---- CMET (spec 13.8) ---------------------------------------------------------- */

int fkvf_cmet_parse(const uint8_t *p, uint64_t size, uint64_t off, uint64_t key,
                    fkvf_cmet_hdr *h, fkvf_diag *d)
{
    if (size < FKVF_CMET_HDR)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, "13.8", "CMET: %llu bytes, needs %u",
                         (unsigned long long)size, FKVF_CMET_HDR);
    memcpy(h->hash, p, 16);
    h->n_layers = fkvf_ld32(p + 16);
    h->n_heads = fkvf_ld32(p + 20);
    h->key_dim = fkvf_ld32(p + 24);
    h->value_dim = fkvf_ld32(p + 28);
    h->parts = p[32];
    if (key != 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off, "13.8", "CMET: directory key %llu, must be 0",
                         (unsigned long long)key);
    if (!all_zero(p + 34, FKVF_CMET_HDR - 34))
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 34, "13.8", "CMET: reserved bytes not zero");
    if (h->parts < 1 || h->parts > 3)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 32, "13.8", "CMET.parts: %u, must be 1, 2 or 3",
                         h->parts);
    if (p[33] != FKVF_DTYPE_F32)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 33, "13.8", "CMET.dtype: %u, must be 3 (f32)",
                         p[33]);
    if (h->n_layers < 1 || h->n_layers > 1024 || h->n_heads < 1 || h->n_heads > 1024)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 16, "13.8",
                         "CMET: %u layers x %u heads outside 1..1024", h->n_layers, h->n_heads);
    if (h->key_dim < 1 || h->key_dim > 16384 || h->value_dim < 1 || h->value_dim > 16384)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 24, "13.8",
                         "CMET: dims %u / %u outside 1..16384", h->key_dim, h->value_dim);
    if (((h->parts & 1) && h->key_dim > FKVF_METRIC_MAX_DIM) ||
        ((h->parts & 2) && h->value_dim > FKVF_METRIC_MAX_DIM))
        return fkvf_fail(d, FKVF_E_LIMIT, off + 24, "15",
                         "CMET: a matrix of dimension %u > %u",
                         (h->parts & 1) && h->key_dim > FKVF_METRIC_MAX_DIM ? h->key_dim
                                                                           : h->value_dim,
                         FKVF_METRIC_MAX_DIM);
    return exact_size(d, size, fkvf_cmet_size(h), off, "13.8", "CMET", "its header implies");
}

static uint64_t cmet_per_tab(const fkvf_cmet_hdr *h)
{
    return ((h->parts & 1) ? (uint64_t)h->key_dim * h->key_dim : 0) +
           ((h->parts & 2) ? (uint64_t)h->value_dim * h->value_dim : 0);
}

uint64_t fkvf_cmet_size(const fkvf_cmet_hdr *h)
{
    /* at most 2^20 tables x 2^21 elements x 4 bytes: no overflow */
    return FKVF_CMET_HDR + (uint64_t)h->n_layers * h->n_heads * cmet_per_tab(h) * 4;
}

uint64_t fkvf_cmet_matrix_off(const fkvf_cmet_hdr *h, size_t tab, unsigned kv)
{
    uint64_t o = FKVF_CMET_HDR + (uint64_t)tab * cmet_per_tab(h) * 4;
    if (kv == 1 && (h->parts & 1))
        o += (uint64_t)h->key_dim * h->key_dim * 4;
    return o;
}

int fkvf_cmet_match(const fkvf_cmet_hdr *h, const fkvf_codebook_shape *cb,
                    const uint8_t hash[16], uint64_t off, fkvf_diag *d)
{
    if (memcmp(h->hash, hash, 16) != 0)
        return fkvf_fail(d, FKVF_E_CORRUPT, off, "13.8",
                         "CMET: content_hash is not the codebook's (the metric belongs to "
                         "another CBK1)");
    if (h->n_layers != cb->n_layers || h->n_heads != cb->n_heads ||
        h->key_dim != cb->key_dim || h->value_dim != cb->value_dim)
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 16, "13.8",
                         "CMET: %u layers x %u heads, dims %u / %u; the codebook has %u x %u, "
                         "%u / %u",
                         h->n_layers, h->n_heads, h->key_dim, h->value_dim, cb->n_layers,
                         cb->n_heads, cb->key_dim, cb->value_dim);
    return FKVF_OK;
}

int fkvf_cmet_matrices(const uint8_t *p, const fkvf_cmet_hdr *h, uint64_t off, float *m,
                       double *l, fkvf_diag *d)
{
    static const char *const what[] = {"", "an infinity or a NaN", "not symmetric",
                                       "not positive definite"};
    size_t n_tabs = (size_t)h->n_layers * h->n_heads;
    for (size_t tab = 0; tab < n_tabs; tab++)
        for (unsigned kv = 0; kv < 2; kv++) {
            if (!(h->parts & (1u << kv)))
                continue;
            uint32_t n = kv ? h->value_dim : h->key_dim;
            uint64_t mo = fkvf_cmet_matrix_off(h, tab, kv);
            size_t nn = (size_t)n * n, bad = 0;
            for (size_t i = 0; i < nn; i++)
                m[i] = fkvf_ldf32(p + mo + 4 * i);
            int v = fkvf_metric_check(m, n, l, &bad);
            if (v != FKVF_METRIC_OK)
                return fkvf_fail(d, FKVF_E_CORRUPT, off + mo + 4 * (uint64_t)bad, "13.8",
                                 "CMET: the %s matrix of layer %zu, head %zu is %s (element "
                                 "%zu, %zu)",
                                 kv ? "value" : "key", tab / h->n_heads, tab % h->n_heads,
                                 what[v], bad / n, bad % n);
        }
    return FKVF_OK;
}

void fkvf_cmet_hdr_write(uint8_t out[64], const fkvf_cmet_hdr *h)
{
    memset(out, 0, FKVF_CMET_HDR);
    memcpy(out, h->hash, 16);
    fkvf_st32(out + 16, h->n_layers);
    fkvf_st32(out + 20, h->n_heads);
    fkvf_st32(out + 24, h->key_dim);
    fkvf_st32(out + 28, h->value_dim);
    out[32] = (uint8_t)h->parts;
    out[33] = FKVF_DTYPE_F32;
}

int fkvf_cbk1_matches(const fkvf_codebook_shape *s, const fkvf_desc *desc)
{
    return s->n_layers == desc->n_layers && s->key_dim == desc->key_dim &&
           s->value_dim == desc->value_dim &&
           (s->pooled ? s->n_heads == 1 : s->n_heads == desc->n_kv_heads);
}

uint64_t fkvf_cbk1_elements_at(const uint8_t *p, uint64_t size)
{
    /* the tables start after the layer table, if any (a parsed section:
     * size covers it) */
    uint64_t first = FKVF_SUBHDR_SIZE;
    if (size >= 64 && p[24] == 1)
        first += ((uint64_t)2 * fkvf_ld32(p) + 63) & ~(uint64_t)63;
    return first;
}

int fkvf_cbk1_finite_range(const uint8_t *p, uint64_t from, uint64_t to, fkvf_dtype dtype,
                           uint64_t *bad)
{
    /* f16: exponent bits all set; f32: likewise (spec 13.1: no bf16) */
    const uint64_t e = dtype == FKVF_DTYPE_F16 ? 2 : 4;
    for (uint64_t o = from; o + e <= to; o += e) {
        int inf_nan = e == 2 ? (fkvf_ld16(p + o) & 0x7C00u) == 0x7C00u
                             : (fkvf_ld32(p + o) & 0x7F800000u) == 0x7F800000u;
        if (inf_nan) {
            if (bad)
                *bad = o;
            return 0;
        }
    }
    return 1;
}

int fkvf_cbk1_finite(const uint8_t *p, uint64_t size, fkvf_dtype dtype, uint64_t *bad)
{
    return fkvf_cbk1_finite_range(p, fkvf_cbk1_elements_at(p, size), size, dtype, bad);
}

FKVF_API uint64_t fkvf_codebook_size(const fkvf_codebook_shape *shape)
{
    return shape ? fkvf_cbk1_size(shape) : 0;
}

FKVF_API uint64_t fkvf_codebook_tables_offset(const fkvf_codebook_shape *shape)
{
    return shape && fkvf_cbk1_size(shape) ? fkvf_cbk1_head_size(shape) : 0;
}

FKVF_API uint32_t fkvf_codebook_auto_k(const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                                       uint64_t n_rows)
{
    if (!shape)
        return 0;
    /* fp16 bytes of the rows, in double: n_rows may be any uint64 */
    double fp16 = (double)n_rows * (double)shape->n_layers * (double)n_kv_heads *
                  ((double)shape->key_dim + (double)shape->value_dim) * 2.0;
    fkvf_codebook_shape sh = *shape;
    uint32_t best = 0;
    for (uint32_t k = FKVF_AUTO_K_MIN; k <= FKVF_AUTO_K_MAX; k *= 2) {
        sh.k = k;
        uint64_t cb = fkvf_cbk1_size(&sh);
        if (cb && (double)cb * FKVF_AUTO_K_FRACTION <= fp16 &&
            (uint64_t)k * FKVF_AUTO_K_ROWS_PER_K <= n_rows)
            best = k;
    }
    return best;
}

FKVF_API int fkvf_codebook_pays(const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                                uint64_t n_rows, uint64_t row_bytes, double *index_bytes)
{
    if (index_bytes)
        *index_bytes = 0.0;
    uint64_t cb = shape ? fkvf_cbk1_size(shape) : 0;
    if (!cb)
        return 0;
    /* in double: n_rows and row_bytes may be any uint64 */
    double idx = (double)n_rows * (double)fkvf_index_stream_count(shape, n_kv_heads) *
                 (double)fkvf_quad_bits_for((uint64_t)shape->k - 1) / 8.0;
    if (index_bytes)
        *index_bytes = idx;
    return (double)cb + idx < (double)n_rows * (double)row_bytes;
}

FKVF_API void fkvf_codebook_hash(const void *cbk1, size_t size, uint8_t out[16])
{
    fkvf_xxh3_128(cbk1, size, out);
}

FKVF_API uint64_t fkvf_index_stream_id(uint32_t n_layers, uint32_t n_kv_heads, unsigned k_stages,
                                       unsigned v_stages, uint64_t j)
{
    if (!n_layers || !n_kv_heads || n_layers > 65536 || n_kv_heads > 65536 || k_stages > 16 ||
        v_stages > 16 || k_stages + v_stages == 0)
        return UINT64_MAX;
    uint64_t per = (uint64_t)k_stages + v_stages; /* products below 2^37: no overflow */
    if (j >= (uint64_t)n_layers * n_kv_heads * per)
        return UINT64_MAX;
    uint64_t lh = j / per, s = j % per;
    unsigned kv = s >= k_stages;
    return FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, lh / n_kv_heads, lh % n_kv_heads, kv,
                          kv ? s - k_stages : s);
}

/* m(0) + ... + m(l-1) of spec 11.2 (stages per head of the layers before l) */
static uint64_t stages_before(const fkvf_codebook_shape *s, uint32_t l)
{
    if (!s->layer_stages)
        return (uint64_t)l * ((uint64_t)s->k_stages + s->v_stages);
    uint64_t n = 0;
    for (uint32_t i = 0; i < l; i++)
        n += (uint64_t)s->layer_stages[2 * (size_t)i] + s->layer_stages[2 * (size_t)i + 1];
    return n;
}

static int ids_shape_ok(const fkvf_codebook_shape *s, uint32_t n_kv_heads)
{
    return s && n_kv_heads >= 1 && n_kv_heads <= FKVF_MAX_HEADS && fkvf_cbk1_size(s) != 0;
}

FKVF_API uint64_t fkvf_index_stream_count(const fkvf_codebook_shape *shape, uint32_t n_kv_heads)
{
    if (!ids_shape_ok(shape, n_kv_heads))
        return 0;
    return n_kv_heads * stages_before(shape, shape->n_layers); /* <= 2^10 * 2^15 */
}

FKVF_API uint64_t fkvf_index_stream_id_shape(const fkvf_codebook_shape *shape,
                                             uint32_t n_kv_heads, uint64_t j)
{
    if (!ids_shape_ok(shape, n_kv_heads))
        return UINT64_MAX;
    uint64_t base = 0;
    for (uint32_t l = 0; l < shape->n_layers; l++) {
        uint64_t ks = fkvf_layer_k_stages(shape, l), m = ks + fkvf_layer_v_stages(shape, l);
        uint64_t here = m * n_kv_heads;
        if (j < base + here) {
            uint64_t r = j - base, s = r % m;
            unsigned kv = s >= ks;
            return FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, r / m, kv, kv ? s - ks : s);
        }
        base += here;
    }
    return UINT64_MAX;
}

FKVF_API uint64_t fkvf_index_stream_ord(const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                                        uint32_t layer, uint32_t head, unsigned kv,
                                        unsigned stage)
{
    if (!ids_shape_ok(shape, n_kv_heads) || layer >= shape->n_layers || head >= n_kv_heads ||
        kv > 1)
        return UINT64_MAX;
    uint64_t ks = fkvf_layer_k_stages(shape, layer), vs = fkvf_layer_v_stages(shape, layer);
    if (stage >= (kv ? vs : ks))
        return UINT64_MAX;
    return n_kv_heads * stages_before(shape, layer) + head * (ks + vs) + (kv ? ks + stage : stage);
}
