/* fkvf_validate_*: a file against every rule of the spec, reporting every
 * violation found (spec/requirements.md maps each requirement to the check
 * ids used here).
 *
 * Order: the header (every check of spec 3.1 that can be made once the file
 * is FKVF v1); the served commit and its chain (the reader's own procedure
 * of spec 7.2, which stops at the first failure: without a chain there is
 * nothing further to check); then every directory entry, the layout of the
 * committed bytes (padding, dead bytes), every section checksum, the
 * contents of every section and the rules between sections, each reported
 * and validation continuing. Last, the reader's full verification (spec
 * 1.3.3) runs as a net: what it finds that was not reported yet (ngon spans,
 * index symbols, ZIDX order and keys, exact-position coverage) is added.
 * With FKVF_VALIDATE_STRICT the writer-side rules follow. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "filemap.h"
#include "ckd.h"
#include "hash.h"
#include "format/zidx.h"
#include "le.h"
#include "read/reader_impl.h"

#define DEFAULT_CAP 1000
#define NO_OFF FKVF_VALIDATE_NO_OFFSET

/* what validation learnt of one directory entry */
typedef struct vsec {
    size_t commit;        /* index into r->commits */
    uint64_t entry_off;   /* file offset of the directory entry */
    int in_file;          /* [offset, offset + stored_size) is inside its region */
    int sum_ok;           /* whole-section checksum (and inflation) passed */
    const uint8_t *p;     /* contents (inflated) when sum_ok */
    uint64_t n;
    int parsed;           /* contents valid by their clause */
    fkvf_strm_hdr h;      /* STRM */
    uint32_t vtxs_n;      /* VTXS */
    fkvf_codebook_shape cb; /* CBK1 */
    fkvf_zidx_hdr z;        /* ZIDX (spec 20.2) */
    fkvf_cmet_hdr cm;       /* CMET (spec 13.8) */
} vsec;

typedef struct vctx {
    const uint8_t *d;
    uint64_t n;
    const fkvf_allocator *alloc;
    unsigned flags;
    fkvf_violation_fn fn;
    void *opaque;
    size_t count, cap;
    int stop;
    int env_rc; /* an environment failure (NOMEM): abort */
    /* codes and clauses reported so far, for the net's de-duplication */
    struct {
        int code;
        char clause[16];
        uint64_t off;
    } seen[256];
    size_t n_seen;
    fkvf_reader *r; /* chain handle (rd_open_chain) */
    vsec *vs;
    int strm_bad;        /* a segment header is bad (reported): no stream-level rules */
    uint8_t *layout_bad; /* per commit: an entry's place is wrong (reported) */
    int have_desc;
    fkvf_desc_raw desc;
    uint64_t row_bytes;
} vctx;

__attribute__((format(printf, 9, 10))) static void report(vctx *c, int code, const char *clause,
                                                          const char *check, int writer,
                                                          uint64_t off, long sec, uint32_t type,
                                                          const char *fmt, ...)
{
    if (c->stop)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->n_seen < sizeof c->seen / sizeof c->seen[0]) {
        c->seen[c->n_seen].code = code;
        snprintf(c->seen[c->n_seen].clause, sizeof c->seen[0].clause, "%s", clause);
        c->seen[c->n_seen].off = off;
        c->n_seen++;
    }
    fkvf_violation v;
    v.code = code;
    v.clause = clause;
    v.check = check;
    v.writer_rule = writer;
    v.offset = off;
    v.section = sec;
    v.section_type = type;
    v.message = msg;
    c->count++;
    if ((c->fn && c->fn(c->opaque, &v)) || c->count >= c->cap)
        c->stop = 1;
}

#define R(code, clause, check, off, ...) report(c, code, clause, check, 0, off, -1, 0, __VA_ARGS__)
#define RS(code, clause, check, i, ...)                                                         \
    report(c, code, clause, check, 0, c->r->sections[i].e.offset, (long)(i),                   \
           c->r->sections[i].e.type, __VA_ARGS__)
#define W(code, clause, check, off, i, ...)                                                     \
    report(c, code, clause, check, 1, off, (long)(i),                                          \
           (long)(i) >= 0 ? c->r->sections[(size_t)(i)].e.type : 0, __VA_ARGS__)

/* "14" and "14.2" name the same chapter */
static int same_chapter(const char *a, const char *b)
{
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    return la == lb && !strncmp(a, b, la);
}

/* A diagnostic of the format parsers or the reader: its offset, its clause
 * ("16", the error classes, when it cites none) and its text. */
static void diag_facts(const fkvf_diag *dg, uint64_t *off, const char **clause, char *text_out,
                       size_t text_cap)
{
    *off = dg->offset;
    *clause = dg->clause[0] ? dg->clause : "16";
    size_t len;
    const char *text = fkvf_diag_text(dg, &len);
    if (len >= text_cap)
        len = text_cap - 1;
    memcpy(text_out, text, len);
    text_out[len] = 0;
}

/* Was a violation of this class already reported at this offset or in the
 * same chapter of the spec? (The net and the commit-state check see faults
 * the checks above have reported already.) */
static int seen_like(const vctx *c, int code, const char *clause, uint64_t off)
{
    for (size_t i = 0; i < c->n_seen; i++)
        if (c->seen[i].code == code &&
            (same_chapter(c->seen[i].clause, clause) || !strcmp(clause, "15") ||
             !strcmp(c->seen[i].clause, "15") || (off != NO_OFF && c->seen[i].off == off)))
            return 1;
    return 0;
}

/* dedup 0: always; 1: not when seen_like; 2: not when the same class was
 * reported at the same offset */
static void report_diag(vctx *c, const fkvf_diag *dg, const char *check, long sec, int dedup)
{
    if (dg->code == FKVF_E_NOMEM) {
        c->env_rc = FKVF_E_NOMEM;
        c->stop = 1;
        return;
    }
    if (fkvf_error_class(dg->code) != FKVF_ERRCLASS_FORMAT)
        return;
    uint64_t off;
    const char *clause;
    char b[400];
    diag_facts(dg, &off, &clause, b, sizeof b);
    if (dedup == 1 && seen_like(c, dg->code, clause, off))
        return;
    if (dedup == 2) /* the same fault met again */
        for (size_t i = 0; i < c->n_seen; i++)
            if (c->seen[i].code == dg->code && c->seen[i].off == off)
                return;
    uint32_t type = sec >= 0 ? c->r->sections[sec].e.type : 0;
    report(c, dg->code, clause, check, 0, off, sec, type, "%s", b);
}

static void tn_of(uint32_t t, char out[12]) { fkvf_type_name(t, out); }

/* ---- header (spec 3.1, 3.4) ------------------------------------------------ */

/* 1 when the file is FKVF v1 enough to go on. */
static int check_header(vctx *c)
{
    static const uint8_t magic[9] = {0x89, 0x46, 0x4B, 0x56, 0x46, 0x0D, 0x0A, 0x1A, 0x0A};
    const uint8_t *p = c->d;
    size_t pre = c->n < 9 ? (size_t)c->n : 9;
    if (memcmp(p, magic, pre) != 0) {
        R(FKVF_E_BAD_MAGIC, "3.1", "HDR-MAGIC", 0, "not an FKVF file: the magic differs");
        return 0;
    }
    if (c->n < 64) {
        R(FKVF_E_TRUNCATED, "3.1", "HDR-SHORT", c->n, "file of %llu bytes, a header needs 64",
          (unsigned long long)c->n);
        return 0;
    }
    if (fkvf_ld16(p + 10) != 1) {
        R(FKVF_E_VERSION, "3.1", "HDR-VERSION", 10, "format_major %u, this is version 1",
          fkvf_ld16(p + 10));
        return 0;
    }
    if (memcmp(p + 16, "\x0d\x0c\x0b\x0a", 4) != 0) {
        R(FKVF_E_BYTE_ORDER, "3.1", "HDR-BYTEORDER", 16, "byte_order is not 0D 0C 0B 0A%s",
          memcmp(p + 16, "\x0a\x0b\x0c\x0d", 4) ? "" : " (written big-endian)");
        return 0;
    }
    uint64_t want = fkvf_xxh3_64(p, 56, 0), got = fkvf_ld64(p + 56);
    if (want != got)
        R(FKVF_E_CHECKSUM, "3.1", "HDR-CHECKSUM", 56,
          "header_checksum stored %016llx, computed %016llx", (unsigned long long)got,
          (unsigned long long)want);
    if (fkvf_ld16(p + 14) != 64)
        R(FKVF_E_CORRUPT, "3.1", "HDR-SIZE", 14, "header_size %u, must be 64", fkvf_ld16(p + 14));
    if (p[9])
        R(FKVF_E_CORRUPT, "3.1", "HDR-RESERVED", 9, "reserved byte 9 is 0x%02x", p[9]);
    if (fkvf_ld32(p + 20))
        R(FKVF_E_CORRUPT, "3.1", "HDR-RESERVED", 20, "flags 0x%08x, must be 0",
          fkvf_ld32(p + 20));
    for (int i = 40; i < 56; i++)
        if (p[i]) {
            R(FKVF_E_CORRUPT, "3.1", "HDR-RESERVED", (uint64_t)i,
              "reserved bytes [40, 56) not zero");
            break;
        }
    uint64_t req = fkvf_ld64(p + 24);
    if (req & ~FKVF_FEATURES_KNOWN)
        R(FKVF_E_FEATURE, "3.1", "HDR-FEATURE", 24,
          "required_features 0x%llx has bits this version does not define",
          (unsigned long long)req);
    uint64_t opt = fkvf_ld64(p + 32);
    /* a file created under a later minor version may use optional bits that
     * version defines (spec 17.2): the writer rule binds files of the minor
     * versions this one knows; bit 1 came with 1.2 (spec 3.4, 1.3.1) */
    unsigned minor = fkvf_ld16(p + 12);
    uint64_t known_opt = minor >= 2 ? FKVF_OPTFEATURES_KNOWN : FKVF_OPTFEAT_TOKEN_STREAM;
    if ((c->flags & FKVF_VALIDATE_STRICT) && minor <= FKVF_FORMAT_MINOR && (opt & ~known_opt))
        report(c, FKVF_E_CORRUPT, "3.4", "W-OPTBITS", 1, 32, -1, 0,
               "optional_features 0x%llx: bits %s-63 are reserved in a file of format 1.%u, "
               "writers write 0",
               (unsigned long long)opt, minor >= 2 ? "2" : "1", minor);
    if (c->n > FKVF_MAX_FILE)
        R(FKVF_E_LIMIT, "7.2", "LIM-FILE", NO_OFF, "file larger than 2^62 bytes");
    return 1;
}

/* ---- directory entries (spec 4.2-4.5) -------------------------------------- */

static int known_type(uint32_t t)
{
    return t == FKVF_SECTION_DESC || t == FKVF_SECTION_META || t == FKVF_SECTION_VTXS ||
           t == FKVF_SECTION_CBK1 || t == FKVF_SECTION_CBRF || t == FKVF_SECTION_EXAC ||
           t == FKVF_SECTION_STRM || fkvf_zidx_is_index(t) || t == FKVF_SECTION_CMET;
}

/* the arrays for every directory entry of the chain (at most 2^22, spec
 * 4.5); 0 when there are more (reported) or no memory */
static int alloc_entries(vctx *c)
{
    fkvf_reader *r = c->r;
    uint64_t total = 0;
    for (size_t i = 0; i < r->n_commits; i++)
        total += r->commits[i].dh.entry_count;
    if (total > FKVF_MAX_SECTIONS) {
        R(FKVF_E_LIMIT, "4.5", "DIR-TOTAL", NO_OFF,
          "%llu directory entries over the chain, the limit is 2^22", (unsigned long long)total);
        return 0;
    }
    r->sections = fkvf_calloc(r->alloc, total ? (size_t)total : 1, sizeof(rd_section));
    c->vs = fkvf_calloc(r->alloc, total ? (size_t)total : 1, sizeof(vsec));
    c->layout_bad = fkvf_calloc(r->alloc, r->n_commits ? r->n_commits : 1, 1);
    if (!r->sections || !c->vs || !c->layout_bad) {
        c->env_rc = FKVF_E_NOMEM;
        return 0;
    }
    return 1;
}

/* entry k (section i, at eoff): its flags, reserved bytes and type (spec
 * 4.2, 4.3) */
static void check_entry_bits(vctx *c, size_t i, uint32_t k, uint64_t eoff, const char *tn)
{
    const fkvf_dirent *e = &c->r->sections[i].e;
    if (e->flags & ~(uint32_t)(FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE))
        RS(FKVF_E_CORRUPT, "4.2", "ENT-FLAGS", i,
           "directory entry %u (%s) at %llu: flags 0x%x has bits 2-31 set", k, tn,
           (unsigned long long)eoff, e->flags);
    if (fkvf_ld64(c->d + eoff + 48) || fkvf_ld64(c->d + eoff + 56))
        RS(FKVF_E_CORRUPT, "4.2", "ENT-RESERVED", i,
           "directory entry %u (%s) at %llu: reserved bytes not zero", k, tn,
           (unsigned long long)eoff);
    if (e->type == FKVF_SECTION_DIRC)
        RS(FKVF_E_CORRUPT, "4.3", "ENT-DIRC", i,
           "directory entry %u: type DIRC (a directory is never a section)", k);
}

/* entry k (section i) of commit ci: aligned, within the size limits, inside
 * the commit's region and not before prev_end, the end of the previous entry
 * (spec 4.1, 4.2, 4.5). 0 when its place is wrong; *end is the end of the
 * section when the sizes are within the limits. An entry out of order marks
 * the layout of the commit bad. */
static int check_entry_place(vctx *c, size_t i, uint32_t k, const char *tn, size_t ci,
                             uint64_t prev_end, uint64_t *end)
{
    const rd_commit *cm = &c->r->commits[ci];
    const fkvf_dirent *e = &c->r->sections[i].e;
    int ok = 1;
    if (e->offset % 64) {
        RS(FKVF_E_ALIGN, "4.1", "ENT-ALIGN", i,
           "directory entry %u (%s): offset %llu is not a multiple of 64", k, tn,
           (unsigned long long)e->offset);
        ok = 0;
    }
    if (e->stored_size > FKVF_MAX_SECTION_SIZE || e->size > FKVF_MAX_SECTION_SIZE) {
        RS(FKVF_E_LIMIT, "4.2", "ENT-LIMIT", i,
           "directory entry %u (%s): stored_size %llu / size %llu above 2^48", k, tn,
           (unsigned long long)e->stored_size, (unsigned long long)e->size);
        ok = 0;
    }
    *end = 0;
    if (!ok) {
        /* no bounds for an entry whose sizes are already wrong */
    } else if (!fkvf_add64(e->offset, e->stored_size, end) || e->offset < cm->region_start ||
               *end > cm->dir_off) {
        RS(FKVF_E_BOUNDS, "4.5", "ENT-BOUNDS", i,
           "directory entry %u (%s): [%llu, +%llu) outside commit %llu's region "
           "[%llu, %llu)",
           k, tn, (unsigned long long)e->offset, (unsigned long long)e->stored_size,
           (unsigned long long)cm->seq, (unsigned long long)cm->region_start,
           (unsigned long long)cm->dir_off);
        ok = 0;
    } else if (e->offset < prev_end) {
        RS(FKVF_E_OVERLAP, "4.5", "ENT-ORDER", i,
           "directory entry %u (%s): offset %llu before the end %llu of the previous "
           "entry (sections overlap or are not in ascending order)",
           k, tn, (unsigned long long)e->offset, (unsigned long long)prev_end);
        c->layout_bad[ci] = 1;
    }
    return ok;
}

/* entry k (section i): DEFLATE where allowed, its inflated size within the
 * limit, or size == stored_size without it (spec 3.3, 4.2, 4.4, 20.1); 0
 * when the sizes are wrong */
static int check_entry_sizes(vctx *c, size_t i, uint32_t k, const char *tn)
{
    const fkvf_dirent *e = &c->r->sections[i].e;
    if (!(e->flags & FKVF_SECTION_DEFLATE)) {
        if (e->size == e->stored_size)
            return 1;
        RS(FKVF_E_CORRUPT, "4.2", "ENT-SIZE", i,
           "directory entry %u (%s): size %llu != stored_size %llu without DEFLATE", k, tn,
           (unsigned long long)e->size, (unsigned long long)e->stored_size);
        return 0;
    }
    if (!(c->r->hdr.required_features & FKVF_FEAT_DEFLATE))
        RS(FKVF_E_CORRUPT, "3.3", "FEAT-DEFLATE", i,
           "directory entry %u (%s): DEFLATE flag, but the header does not declare "
           "the DEFLATE feature",
           k, tn);
    if (e->type == FKVF_SECTION_STRM)
        RS(FKVF_E_CORRUPT, "4.4", "ENT-STRM-DEFLATE", i,
           "directory entry %u: a STRM section is never deflated", k);
    if (fkvf_zidx_is_index(e->type))
        RS(FKVF_E_CORRUPT, "20.1", "ZIDX-DEFLATE", i,
           "directory entry %u: a %s section is never deflated", k, tn);
    if (e->size > FKVF_MAX_INFLATED ||
        (e->stored_size <= FKVF_MAX_SECTION_SIZE && e->size > 1032 * e->stored_size + 64)) {
        RS(FKVF_E_LIMIT, "4.4", "ENT-INFLATE-LIMIT", i,
           "directory entry %u (%s): inflated size %llu from %llu stored bytes "
           "exceeds the limit",
           k, tn, (unsigned long long)e->size, (unsigned long long)e->stored_size);
        return 0;
    }
    return 1;
}

/* entry k (section i): the REQUIRED flag and the key its type asks for
 * (spec 4.3, 13.8, 20.1, 20.7) */
static void check_entry_type_rules(vctx *c, size_t i, uint32_t k, const char *tn)
{
    const fkvf_dirent *e = &c->r->sections[i].e;
    if (e->type == FKVF_SECTION_CMET && (e->flags & FKVF_SECTION_REQUIRED))
        RS(FKVF_E_SECTION, "13.8", "CMET-REQUIRED", i,
           "directory entry %u: CMET with REQUIRED set (MUST be clear)", k);
    if (!known_type(e->type) && (e->flags & FKVF_SECTION_REQUIRED))
        RS(FKVF_E_SECTION, "4.3", "ENT-UNKNOWN-REQ", i,
           "directory entry %u: unknown section type %s with REQUIRED set", k, tn);
    if (fkvf_zidx_is_index(e->type) && (e->flags & FKVF_SECTION_REQUIRED))
        RS(FKVF_E_SECTION, e->type == FKVF_SECTION_ZPOS ? "20.7" : "20.1", "ZIDX-REQUIRED", i,
           "directory entry %u: %s with REQUIRED set (MUST be clear)", k, tn);
    if ((e->type == FKVF_SECTION_DESC || e->type == FKVF_SECTION_VTXS ||
         e->type == FKVF_SECTION_CBK1 || e->type == FKVF_SECTION_CBRF ||
         e->type == FKVF_SECTION_EXAC || e->type == FKVF_SECTION_STRM) &&
        !(e->flags & FKVF_SECTION_REQUIRED))
        RS(FKVF_E_CORRUPT, "4.3", "ENT-REQUIRED-FLAG", i,
           "directory entry %u: %s section without the REQUIRED flag", k, tn);
    /* key per type (spec 4.3); EXAC, STRM, VTXS and ZIDX keys are
     * checked against their contents */
    if ((e->type == FKVF_SECTION_DESC || e->type == FKVF_SECTION_META ||
         e->type == FKVF_SECTION_CBK1 || e->type == FKVF_SECTION_CBRF) &&
        e->key != 0)
        RS(FKVF_E_CORRUPT, "4.3", "ENT-KEY", i, "directory entry %u (%s): key %llu, must be 0",
           k, tn, (unsigned long long)e->key);
    if (e->type == FKVF_SECTION_STRM && e->key > FKVF_GROUP_TOKENS)
        RS(FKVF_E_CORRUPT, "4.3", "ENT-KEY", i,
           "directory entry %u (STRM): key %llu is no group (0 or 1)", k,
           (unsigned long long)e->key);
}

/* directory entry k of commit ci read into the next section and checked;
 * *prev_end is the end of the entries before it */
static void load_entry(vctx *c, size_t ci, uint32_t k, uint64_t *prev_end)
{
    fkvf_reader *r = c->r;
    const rd_commit *cm = &r->commits[ci];
    size_t i = r->n_sections++;
    uint64_t eoff = cm->dir_off + FKVF_DIRHDR_SIZE + (uint64_t)k * FKVF_DIRENT_SIZE;
    rd_section *s = &r->sections[i];
    vsec *v = &c->vs[i];
    fkvf_dirent_read(c->d + eoff, &s->e);
    s->commit_seq = cm->seq;
    v->commit = ci;
    v->entry_off = eoff;
    const fkvf_dirent *e = &s->e;
    char tn[12];
    tn_of(e->type, tn);
    check_entry_bits(c, i, k, eoff, tn);
    uint64_t end;
    int ok = check_entry_place(c, i, k, tn, ci, *prev_end, &end);
    if (ok && end > *prev_end)
        *prev_end = end;
    if (!check_entry_sizes(c, i, k, tn))
        ok = 0;
    check_entry_type_rules(c, i, k, tn);
    v->in_file = ok && end <= cm->dir_off && e->offset >= cm->region_start;
    if (!ok)
        c->layout_bad[ci] = 1; /* the layout of this commit is not checked further */
}

static int load_entries(vctx *c)
{
    fkvf_reader *r = c->r;
    if (!alloc_entries(c))
        return 0;
    for (size_t ci = 0; ci < r->n_commits && !c->stop; ci++) {
        rd_commit *cm = &r->commits[ci];
        cm->first_section = r->n_sections;
        uint64_t prev_end = cm->region_start;
        for (uint32_t k = 0; k < cm->dh.entry_count && !c->stop; k++)
            load_entry(c, ci, k, &prev_end);
        cm->n_sections = r->n_sections - cm->first_section;
    }
    return 1;
}

/* ---- layout: padding and dead bytes (spec 4.1) ----------------------------- */

static void gap(vctx *c, uint64_t from, uint64_t to, const char *what)
{
    if (to <= from)
        return; /* overlap: reported with the entry */
    if (to - from >= 64) {
        R(FKVF_E_CORRUPT, "4.1", "LAYOUT-DEAD", from,
          "%llu bytes [%llu, %llu) before %s belong to no structure (dead bytes; padding is "
          "at most 63)",
          (unsigned long long)(to - from), (unsigned long long)from, (unsigned long long)to,
          what);
        return;
    }
    for (uint64_t i = from; i < to; i++)
        if (c->d[i]) {
            R(FKVF_E_PADDING, "4.1", "LAYOUT-PAD", i, "padding byte 0x%02x before %s is not zero",
              c->d[i], what);
            return;
        }
}

static void check_layout(vctx *c)
{
    fkvf_reader *r = c->r;
    uint64_t pos = FKVF_HEADER_SIZE;
    for (size_t ci = 0; ci < r->n_commits && !c->stop; ci++) {
        const rd_commit *cm = &r->commits[ci];
        if (c->layout_bad[ci]) {
            pos = cm->trailer_off + 64;
            continue;
        }
        for (size_t k = 0; k < cm->n_sections; k++) {
            size_t i = cm->first_section + k;
            if (!c->vs[i].in_file)
                continue;
            const fkvf_dirent *e = &r->sections[i].e;
            char tn[12], what[48];
            tn_of(e->type, tn);
            snprintf(what, sizeof what, "section %zu (%s)", i, tn);
            gap(c, pos, e->offset, what);
            if (e->offset + e->stored_size > pos)
                pos = e->offset + e->stored_size;
        }
        char what[48];
        snprintf(what, sizeof what, "the directory of commit %llu", (unsigned long long)cm->seq);
        gap(c, pos, cm->dir_off, what);
        snprintf(what, sizeof what, "the trailer of commit %llu", (unsigned long long)cm->seq);
        gap(c, cm->dir_off + cm->dir_size, cm->trailer_off, what);
        pos = cm->trailer_off + 64;
    }
}

/* ---- section checksums and contents ---------------------------------------- */

static void check_sums(vctx *c)
{
    fkvf_reader *r = c->r;
    for (size_t i = 0; i < r->n_sections && !c->stop; i++) {
        vsec *v = &c->vs[i];
        if (!v->in_file)
            continue;
        fkvf_diag_clear(&r->diag);
        const uint8_t *p;
        uint64_t n;
        if (rd_section_bytes(r, i, &p, &n) == FKVF_OK) {
            v->sum_ok = 1;
            v->p = p;
            v->n = n;
        } else {
            report_diag(c, &r->diag, r->diag.code == FKVF_E_CHECKSUM ? "SEC-CHECKSUM" : "SEC-DEFLATE",
                        (long)i, 0);
        }
    }
}

/* finite centroid elements (spec 13.2): a property of the file, which full
 * verification checks too (the first one that is not finite) */
/* Every matrix of CMET section i (spec 13.8 step 7), its header parsed. */
static void check_cmet_matrices(vctx *c, size_t i)
{
    const vsec *v = &c->vs[i];
    uint32_t dk = (v->cm.parts & 1) ? v->cm.key_dim : 0, dv = (v->cm.parts & 2) ? v->cm.value_dim : 0;
    size_t nn = (size_t)(dk > dv ? dk : dv) * (dk > dv ? dk : dv); /* dims <= 1024 (step 3) */
    float *m = fkvf_calloc(c->r->alloc, nn, sizeof(float));
    double *l = fkvf_calloc(c->r->alloc, nn, sizeof(double));
    fkvf_diag dg;
    dg.name = "";
    fkvf_diag_clear(&dg);
    if (!m || !l)
        c->env_rc = FKVF_E_NOMEM;
    else if (fkvf_cmet_matrices(v->p, &v->cm, c->r->sections[i].e.offset, m, l, &dg))
        report_diag(c, &dg, "CMET-MATRIX", (long)i, 0);
    fkvf_free(c->r->alloc, m);
    fkvf_free(c->r->alloc, l);
}

static void check_cbk1_values(vctx *c, size_t i)
{
    const vsec *v = &c->vs[i];
    uint64_t bad;
    if (!fkvf_cbk1_finite(v->p, v->n, v->cb.dtype, &bad))
        RS(FKVF_E_CORRUPT, "13.2", "CBK1-VALUES", i,
           "CBK1 section %zu: centroid element at content offset %llu is not finite", i,
           (unsigned long long)bad);
}

/* A ZPOS section's positions (spec 20.7): each below n_indexed, none twice
 * (the order, which needs the stream's keys, is checked by the net). */
static int check_zpos_entries(vctx *c, size_t i)
{
    vsec *v = &c->vs[i];
    size_t n = (size_t)v->z.n_indexed; /* the section, 64 + 4n bytes, is in memory */
    uint8_t *seen = fkvf_calloc(c->r->alloc, n / 8 + 1, 1);
    if (!seen) {
        c->env_rc = FKVF_E_NOMEM;
        return 0;
    }
    int ok = 1;
    for (size_t k = 0; k < n && ok && !c->stop; k++) {
        uint64_t t = fkvf_zpos_at(v->p + 64, v->z.entry_size, k);
        if (t >= v->z.n_indexed) {
            RS(FKVF_E_CORRUPT, "20.7", "ZIDX-POSITION", i,
               "ZPOS section %zu: entry %zu has position %llu, n_indexed is %llu", i, k,
               (unsigned long long)t, (unsigned long long)v->z.n_indexed);
            ok = 0;
        } else if (seen[t >> 3] & (1u << (t & 7))) {
            RS(FKVF_E_CORRUPT, "20.7", "ZIDX-POSITION", i,
               "ZPOS section %zu: entry %zu repeats position %llu", i, k,
               (unsigned long long)t);
            ok = 0;
        } else {
            seen[t >> 3] |= (uint8_t)(1u << (t & 7));
        }
    }
    fkvf_free(c->r->alloc, seen);
    return ok;
}

/* A ZIDX section's entry order and positions (spec 20.3), its header and
 * size having passed fkvf_zidx_hdr_parse; the stream it names and the keys
 * are checked with the streams. */
static int check_zidx_entries(vctx *c, size_t i)
{
    vsec *v = &c->vs[i];
    const uint8_t *p = v->p;
    const uint16_t esz = v->z.entry_size;
    int pos_bad = 0, order_bad = 0;
    uint64_t ph = 0, pl = 0, pp = 0;
    for (uint64_t k = 0; k < v->z.n_indexed && !c->stop; k++) {
        const uint8_t *q = p + 64 + k * esz;
        uint64_t hi, lo, pos;
        if (esz == 24) {
            lo = fkvf_ld64(q);
            hi = fkvf_ld64(q + 8);
            pos = fkvf_ld64(q + 16);
        } else {
            hi = fkvf_ld64(q);
            lo = 0;
            pos = fkvf_ld64(q + 8);
        }
        if (pos >= v->z.n_indexed && !pos_bad) {
            RS(FKVF_E_CORRUPT, "20.3", "ZIDX-POSITION", i,
               "ZIDX section %zu: entry %llu has position %llu, n_indexed is %llu", i,
               (unsigned long long)k, (unsigned long long)pos,
               (unsigned long long)v->z.n_indexed);
            pos_bad = 1;
        }
        if (k && !order_bad &&
            !(hi > ph || (hi == ph && (lo > pl || (lo == pl && pos > pp))))) {
            RS(FKVF_E_CORRUPT, "20.3", "ZIDX-ORDER", i,
               "ZIDX section %zu: entry %llu is not above entry %llu in (key, position) order",
               i, (unsigned long long)k, (unsigned long long)(k - 1));
            order_bad = 1;
        }
        ph = hi;
        pl = lo;
        pp = pos;
    }
    return !pos_bad && !order_bad;
}

static void check_contents(vctx *c)
{
    fkvf_reader *r = c->r;
    fkvf_diag dg;
    dg.name = "";
    for (size_t i = 0; i < r->n_sections && !c->stop; i++) {
        vsec *v = &c->vs[i];
        const fkvf_dirent *e = &r->sections[i].e;
        if (!v->sum_ok || e->type == FKVF_SECTION_STRM)
            continue;
        fkvf_diag_clear(&dg);
        int rc = FKVF_OK;
        const char *chk = NULL; /* set by every case that parses */
        switch (e->type) {
        case FKVF_SECTION_DESC: {
            fkvf_desc_raw d;
            chk = "DESC-FIELDS";
            rc = fkvf_desc_parse(v->p, v->n, e->offset, &d, &dg);
            if (rc == FKVF_OK && !c->have_desc && r->commits[v->commit].seq == 1) {
                c->have_desc = 1;
                c->desc = d;
                c->row_bytes = fkvf_desc_row_bytes(&d.d);
            }
            if (rc == FKVF_OK && (c->flags & FKVF_VALIDATE_STRICT) && v->p[17] == 0 &&
                fkvf_ld64(v->p + 24) != 0)
                W(FKVF_E_CORRUPT, "8", "W-THETA-BYTES", e->offset + 24, (long)i,
                  "DESC: key_transform 0 with rope_theta bytes %016llx (writers write eight "
                  "zero bytes)",
                  (unsigned long long)fkvf_ld64(v->p + 24));
            break;
        }
        case FKVF_SECTION_META: {
            uint32_t cnt;
            size_t *offs = NULL;
            chk = "META-FIELDS";
            rc = fkvf_meta_parse(v->p, v->n, e->offset, &cnt, &offs, r->alloc, &dg);
            if (rc == FKVF_E_DUP_KEY)
                chk = "META-DUPKEY";
            if (rc == FKVF_OK && (c->flags & FKVF_VALIDATE_STRICT)) {
                for (uint32_t k = 0; k < cnt; k++) {
                    fkvf_meta_entry me;
                    fkvf_meta_entry_at(v->p, offs[k], &me);
                    if (strncmp(me.key, "fkvf.", 5) == 0) {
                        W(FKVF_E_CORRUPT, "9.2", "W-META-RESERVED-KEY", e->offset, (long)i,
                          "META section %zu: key \"%.60s\" uses the reserved prefix fkvf.", i,
                          me.key);
                        break;
                    }
                }
            }
            fkvf_free(r->alloc, offs);
            break;
        }
        case FKVF_SECTION_VTXS: {
            uint32_t n;
            chk = "VTXS-FIELDS";
            rc = fkvf_vtxs_parse(v->p, v->n, e->offset, e->key, &n, &dg);
            if (rc == FKVF_OK) {
                double *xy = fkvf_calloc(r->alloc, 2 * (size_t)n, sizeof(double));
                if (!xy) {
                    c->env_rc = FKVF_E_NOMEM;
                    c->stop = 1;
                    return;
                }
                for (size_t k = 0; k < 2 * (size_t)n; k++)
                    xy[k] = fkvf_ldf64(v->p + 8 + 8 * k);
                if (fkvf_ngon_check_table(n, xy))
                    RS(FKVF_E_CORRUPT, "10.2", "VTXS-VALUES", i,
                       "VTXS N=%u: a coordinate is not finite, V(0) is not (+1, +0), or some "
                       "|V(c)|^2 is off 1 by more than 2^-40",
                       n);
                fkvf_free(r->alloc, xy);
                v->vtxs_n = n;
            }
            break;
        }
        case FKVF_SECTION_CBK1:
            chk = "CBK1-FIELDS";
            rc = fkvf_cbk1_parse(v->p, v->n, e->offset,
                                 (r->hdr.required_features & FKVF_FEAT_LAYER_STAGES) != 0, &v->cb,
                                 &dg);
            if (rc == FKVF_OK)
                check_cbk1_values(c, i);
            break;
        case FKVF_SECTION_CBRF: {
            const uint8_t *h, *nm;
            uint32_t nl;
            chk = "CBRF-FIELDS";
            rc = fkvf_cbrf_parse(v->p, v->n, e->offset, &h, &nm, &nl, &dg);
            break;
        }
        case FKVF_SECTION_EXAC:
            chk = "EXAC-FIELDS";
            if (!c->have_desc)
                continue; /* placement rules below */
            {
                fkvf_exac_hdr xh;
                rc = fkvf_exac_hdr_parse(v->p, v->n, e->offset, c->row_bytes, &xh, &dg);
                if (rc == FKVF_OK && xh.dtype != (uint8_t)c->desc.d.dtype)
                    RS(FKVF_E_CORRUPT, "14.2", "EXAC-DTYPE", i,
                       "EXAC section %zu: dtype %u, the descriptor's is %u", i, xh.dtype,
                       (unsigned)c->desc.d.dtype);
                if (rc == FKVF_OK && xh.first != e->key)
                    RS(FKVF_E_CORRUPT, "14.2", "EXAC-KEY", i,
                       "EXAC section %zu: first_position %llu != directory key %llu", i,
                       (unsigned long long)xh.first, (unsigned long long)e->key);
            }
            break;
        case FKVF_SECTION_CMET:
            chk = "CMET-FIELDS";
            rc = fkvf_cmet_parse(v->p, v->n, e->offset, e->key, &v->cm, &dg);
            if (rc == FKVF_OK)
                check_cmet_matrices(c, i);
            break;
        case FKVF_SECTION_ZIDX:
        case FKVF_SECTION_ZPOS:
            if (e->flags & FKVF_SECTION_DEFLATE)
                continue; /* reported with the directory */
            chk = "ZIDX-HEADER";
            rc = fkvf_zidx_hdr_parse(e->type, v->p, v->n, e->key, e->offset, &v->z, &dg);
            if (rc == FKVF_OK && !(e->type == FKVF_SECTION_ZPOS ? check_zpos_entries(c, i)
                                                                : check_zidx_entries(c, i)))
                continue; /* reported there */
            break;
        default:
            continue; /* unknown: ignored */
        }
        if (rc) {
            report_diag(c, &dg, chk, (long)i, 0);
            if (c->env_rc)
                return;
        } else {
            v->parsed = 1;
        }
    }
}

/* ---- stream segments (spec 11) --------------------------------------------- */

typedef struct vgroup {
    int present;
    size_t first; /* section of the first segment */
    uint64_t length;
} vgroup;

/* 1 when a VTXS entry with key n is in commit `commit` or earlier; *sec is
 * then its section, or SIZE_MAX when its contents are bad (reported) */
static int vtxs_for(vctx *c, uint32_t n, size_t commit, size_t *sec)
{
    for (size_t i = 0; i < c->r->n_sections; i++)
        if (c->r->sections[i].e.type == FKVF_SECTION_VTXS && c->r->sections[i].e.key == n &&
            c->vs[i].commit <= commit) {
            *sec = c->vs[i].parsed && c->vs[i].vtxs_n == n ? i : SIZE_MAX;
            return 1;
        }
    return 0;
}

static void check_segment(vctx *c, size_t i, vgroup *groups)
{
    fkvf_reader *r = c->r;
    vsec *v = &c->vs[i];
    const fkvf_dirent *e = &r->sections[i].e;
    fkvf_diag dg;
    dg.name = "";
    fkvf_diag_clear(&dg);
    fkvf_strm_hdr *h = &v->h;
    if (fkvf_strm_hdr_parse(c->d + e->offset, e->stored_size, e->offset, h, &dg)) {
        report_diag(c, &dg, "STRM-HEADER", (long)i, 0);
        c->strm_bad = 1;
        return;
    }
    int ok = 1;
    if (h->group != e->key) {
        RS(FKVF_E_CORRUPT, "11.2", "STRM-GROUP", i, "STRM section %zu: group %llu != key %llu", i,
           (unsigned long long)h->group, (unsigned long long)e->key);
        ok = 0;
    }
    if (h->group == FKVF_GROUP_INDEX && c->have_desc) {
        uint64_t want = (uint64_t)c->desc.d.n_layers * c->desc.d.n_kv_heads *
                        ((uint64_t)h->k_stages + h->v_stages);
        /* per-layer stage counts: at most that, exactly the codebook's
         * count (below, STRM-STAGES) */
        if (r->hdr.required_features & FKVF_FEAT_LAYER_STAGES ? h->n_streams > want
                                                               : h->n_streams != want)
            RS(FKVF_E_CORRUPT, "11.2", "STRM-NSTREAMS", i,
               "STRM section %zu: n_streams %u, the descriptor gives %s%llu", i, h->n_streams,
               r->hdr.required_features & FKVF_FEAT_LAYER_STAGES ? "at most " : "",
               (unsigned long long)want);
    }
    if (h->profile == FKVF_PROFILE_NGON) {
        size_t vt;
        if (!(r->hdr.required_features & FKVF_FEAT_NGON))
            RS(FKVF_E_CORRUPT, "3.3", "FEAT-NGON", i,
               "STRM section %zu: ngon segment, but the header does not declare NGON", i);
        if (!vtxs_for(c, h->alphabet, v->commit, &vt)) {
            RS(FKVF_E_CORRUPT, "10.3", "STRM-VTXS", i,
               "STRM section %zu: ngon N=%u without a VTXS section for N in this or an "
               "earlier commit",
               i, h->alphabet);
        } else if (vt != SIZE_MAX) {
            double *xy = fkvf_calloc(r->alloc, 2 * (size_t)h->alphabet, sizeof(double));
            if (!xy) {
                c->env_rc = FKVF_E_NOMEM;
                c->stop = 1;
                return;
            }
            for (size_t k = 0; k < 2 * (size_t)h->alphabet; k++)
                xy[k] = fkvf_ldf64(c->vs[vt].p + 8 + 8 * k);
            if (fkvf_ngon_check_params(h->alphabet, xy, h->r, h->span_symbols))
                RS(FKVF_E_CORRUPT, "12.2.1", "STRM-NGON-PARAMS", i,
                   "STRM section %zu: r = %.17g, L = %u fail the checks of 12.2.1-12.2.2 "
                   "against the vertex table",
                   i, h->r, h->span_symbols);
            fkvf_free(r->alloc, xy);
        }
    }
    /* group rules (spec 11.6) */
    if (ok) {
        vgroup *g = &groups[h->group];
        if (!g->present) {
            g->present = 1;
            g->first = i;
            g->length = 0;
        } else {
            const fkvf_strm_hdr *f = &c->vs[g->first].h;
            uint64_t rb1, rb2;
            memcpy(&rb1, &f->r, 8);
            memcpy(&rb2, &h->r, 8);
            if (f->profile != h->profile || f->bits != h->bits || f->alphabet != h->alphabet ||
                f->span_symbols != h->span_symbols || rb1 != rb2 ||
                f->k_stages != h->k_stages || f->v_stages != h->v_stages ||
                f->n_streams != h->n_streams)
                RS(FKVF_E_CORRUPT, "11.6", "STRM-SAME-CODEC", i,
                   "STRM section %zu: codec parameters or stage counts differ from the group's "
                   "first segment (section %zu)",
                   i, g->first);
        }
        if (h->first_symbol > g->length)
            RS(FKVF_E_CORRUPT, "11.6", "STRM-FIRST", i,
               "STRM section %zu: first_symbol %llu beyond the streams' length %llu", i,
               (unsigned long long)h->first_symbol, (unsigned long long)g->length);
        else
            g->length = h->first_symbol + h->symbol_count;
    }
    /* padding between the block table and the data (spec 11.3) */
    const uint8_t *sp = c->d + e->offset;
    for (uint64_t o = 64 + 8 * h->n_blocks; o < h->data_off; o++)
        if (sp[o]) {
            RS(FKVF_E_PADDING, "11.3", "STRM-PAD", i,
               "STRM section %zu: padding byte at section offset %llu before the data is not "
               "zero",
               i, (unsigned long long)o);
            break;
        }
    /* every block checksum (spec 11.4) */
    uint64_t data_start = e->offset + h->data_off;
    for (uint64_t b = 0; b < h->n_blocks && !c->stop; b++) {
        uint64_t from = b * h->block_size;
        uint64_t len = h->data_bytes - from < h->block_size ? h->data_bytes - from : h->block_size;
        uint64_t want = fkvf_xxh3_64(c->d + data_start + from, (size_t)len, data_start + from);
        uint64_t got = fkvf_ld64(sp + 64 + 8 * b);
        if (want != got)
            report(c, FKVF_E_CHECKSUM, "11.4", "STRM-BLOCK", 0, data_start + from, (long)i,
                   FKVF_SECTION_STRM, "STRM section %zu: block %llu checksum stored %016llx, "
                   "computed %016llx",
                   i, (unsigned long long)b, (unsigned long long)got, (unsigned long long)want);
    }
    /* unused bits after each quad stream's last symbol (spec 11.7) */
    if (h->profile == FKVF_PROFILE_QUAD)
        for (uint32_t o = 0; o < h->n_streams && !c->stop; o++) {
            uint64_t at = (uint64_t)o * h->stream_bytes;
            if (!fkvf_quad_padding_zero(c->d + data_start + at, (size_t)h->stream_bytes, h->bits,
                                        h->symbol_count)) {
                report(c, FKVF_E_PADDING, "11.7", "STRM-UNUSED-BITS", 0,
                       data_start + at + h->stream_bytes - 16, (long)i, FKVF_SECTION_STRM,
                       "STRM section %zu, stream %u of the group: bits after the last symbol "
                       "are not zero",
                       i, o);
            }
        }
}

/* ---- rules between sections (spec 3.3, 8.3, 10.3, 11.8, 13.4, 13.7, 14.3) -- */

/* what the pass over the entries (check_between) counted and found */
typedef struct vbetween {
    size_t n_desc, n_cb, cb_sec, n_cmet, cmet_sec;
    int cb_kind; /* the codebook section: 1 CBK1, 2 CBRF, 0 none */
    vgroup groups[2];
} vbetween;

/* one DESC, in commit 1 (spec 8.3) */
static void between_desc(vctx *c, size_t i, vbetween *b)
{
    fkvf_reader *r = c->r;
    const vsec *v = &c->vs[i];
    if (b->n_desc++)
        RS(FKVF_E_CORRUPT, "8.3", "DESC-ONE", i, "a second DESC section (section %zu)", i);
    else if (r->commits[v->commit].seq != 1)
        RS(FKVF_E_CORRUPT, "8.3", "DESC-COMMIT1", i,
           "DESC section %zu in commit %llu: it must be in commit 1", i,
           (unsigned long long)r->commits[v->commit].seq);
}

/* at most one CBK1 or CBRF (spec 13.7); a CBRF needs EXTERNAL_CODEBOOK (3.3) */
static void between_codebook(vctx *c, size_t i, vbetween *b)
{
    const fkvf_dirent *e = &c->r->sections[i].e;
    if (b->n_cb++)
        RS(FKVF_E_CORRUPT, "13.7", "CB-ONE", i,
           "a second codebook section (section %zu; at most one CBK1 or CBRF)", i);
    else {
        b->cb_kind = e->type == FKVF_SECTION_CBK1 ? 1 : 2;
        b->cb_sec = i;
    }
    if (e->type == FKVF_SECTION_CBRF &&
        !(c->r->hdr.required_features & FKVF_FEAT_EXTERNAL_CODEBOOK))
        RS(FKVF_E_CORRUPT, "3.3", "FEAT-EXTCB", i,
           "CBRF section %zu, but the header does not declare EXTERNAL_CODEBOOK", i);
}

/* at most one CMET in a chain (spec 13.8 step 5) */
static void between_cmet(vctx *c, size_t i, vbetween *b)
{
    if (b->n_cmet++)
        RS(FKVF_E_CORRUPT, "13.8", "CMET-ONE", i,
           "a second CMET section (section %zu; at most one in a chain)", i);
    else
        b->cmet_sec = i;
}

/* one VTXS per N (spec 10.3): the first earlier one with the same key */
static void between_vtxs(vctx *c, size_t i)
{
    fkvf_reader *r = c->r;
    const fkvf_dirent *e = &r->sections[i].e;
    for (size_t j = 0; j < i; j++)
        if (r->sections[j].e.type == FKVF_SECTION_VTXS && r->sections[j].e.key == e->key) {
            RS(FKVF_E_CORRUPT, "10.3", "VTXS-ONE", i,
               "a second VTXS section for N = %llu (section %zu)", (unsigned long long)e->key,
               i);
            break;
        }
}

/* a STRM segment in the file is checked and counted into its group; one
 * outside the file leaves the stream rules unknown */
static void between_strm(vctx *c, size_t i, vbetween *b)
{
    const fkvf_dirent *e = &c->r->sections[i].e;
    const vsec *v = &c->vs[i];
    if (v->in_file && e->stored_size >= 64)
        check_segment(c, i, b->groups);
    else if (v->in_file)
        RS(FKVF_E_TRUNCATED, "11.2", "STRM-HEADER", i,
           "STRM section %zu: %llu bytes, the header needs 64", i,
           (unsigned long long)e->stored_size);
    if (!v->in_file)
        c->strm_bad = 1;
}

static void between_section(vctx *c, size_t i, vbetween *b)
{
    switch (c->r->sections[i].e.type) {
    case FKVF_SECTION_DESC:
        between_desc(c, i, b);
        break;
    case FKVF_SECTION_CBK1:
    case FKVF_SECTION_CBRF:
        between_codebook(c, i, b);
        break;
    case FKVF_SECTION_CMET:
        between_cmet(c, i, b);
        break;
    case FKVF_SECTION_VTXS:
        between_vtxs(c, i);
        break;
    case FKVF_SECTION_STRM:
        between_strm(c, i, b);
        break;
    default:
        break;
    }
}

/* 1 when the stream `id` that a ZIDX names exists; h is the header of the
 * first segment of its group (NULL: no such group) */
static int zidx_stream_exists(const vctx *c, const vbetween *b, uint64_t id,
                              const fkvf_strm_hdr *h)
{
    unsigned kind = (unsigned)(id >> 56);
    if (h && kind == 1)
        return id == (UINT64_C(1) << 56);
    if (!(h && kind == 0 && c->have_desc))
        return 0;
    unsigned layer = (unsigned)(id & 0xFFFF), hd = (unsigned)((id >> 16) & 0xFFFF);
    unsigned kv = (unsigned)((id >> 32) & 0xFF), stage = (unsigned)((id >> 40) & 0xFF);
    int exists = ((id >> 48) & 0xFF) == 0 && layer < c->desc.d.n_layers &&
                 hd < c->desc.d.n_kv_heads && kv <= 1 &&
                 stage < (kv ? h->v_stages : h->k_stages);
    /* per-layer counts: the embedded codebook's layer table says
     * (an external one is checked by the net, with its candidate) */
    const vsec *cb = &c->vs[b->cb_sec];
    if (exists && b->cb_kind == 1 && cb->parsed && cb->cb.layer_stages)
        exists = fkvf_index_stream_ord(&cb->cb, c->desc.d.n_kv_heads, layer, hd, kv, stage) !=
                 UINT64_MAX;
    return exists;
}

/* the stream ZIDX section i names exists, with the header's codec (spec 20.2
 * step 5) */
static void check_zidx_stream(vctx *c, size_t i, const vbetween *b)
{
    const vsec *v = &c->vs[i];
    uint64_t id = v->z.stream_id;
    unsigned kind = (unsigned)(id >> 56);
    const vgroup *g = kind <= 1 ? &b->groups[kind] : NULL;
    if (g && g->present == 2)
        return; /* a segment header is bad: unknown */
    const fkvf_strm_hdr *h = g && g->present ? &c->vs[g->first].h : NULL;
    if (!zidx_stream_exists(c, b, id, h)) {
        RS(FKVF_E_CORRUPT, "20.2", "ZIDX-STREAM", i,
           "ZIDX section %zu: stream %016llx does not exist", i, (unsigned long long)id);
        return;
    }
    uint32_t u = fkvf_strm_align(h->profile, h->bits, h->span_symbols);
    if (v->z.profile != h->profile ||
        (h->profile == FKVF_PROFILE_QUAD
             ? v->z.bits != h->bits
             : (v->z.alphabet != h->alphabet || memcmp(&v->z.r, &h->r, 8) ||
                v->z.span != h->span_symbols)))
        RS(FKVF_E_CORRUPT, "20.2", "ZIDX-STREAM", i,
           "ZIDX section %zu: codec parameters differ from those of stream %016llx", i,
           (unsigned long long)id);
    else if (u && v->z.n_indexed % u)
        RS(FKVF_E_CORRUPT, "20.2", "ZIDX-STREAM", i,
           "ZIDX section %zu: n_indexed %llu is not a multiple of the stream's unit %u", i,
           (unsigned long long)v->z.n_indexed, u);
}

/* the encoder metric belongs with a CBK1 and matches it (spec 13.8 steps
 * 5 and 6) */
static void check_cmet_pairing(vctx *c, const vbetween *b)
{
    size_t cmet_sec = b->cmet_sec, cb_sec = b->cb_sec;
    if (b->n_cmet && b->cb_kind != 1)
        RS(FKVF_E_CORRUPT, "13.8", "CMET-CBK1", cmet_sec,
           "CMET section %zu in a file without an embedded codebook (CBK1)%s", cmet_sec,
           b->cb_kind == 2 ? ": an archive that refers to a codebook file finds the metric there"
                           : "");
    else if (b->n_cmet && c->vs[cmet_sec].parsed && c->vs[cb_sec].parsed) {
        uint8_t h[16];
        fkvf_diag dg;
        dg.name = "";
        fkvf_diag_clear(&dg);
        fkvf_codebook_hash(c->vs[cb_sec].p, (size_t)c->vs[cb_sec].n, h);
        if (fkvf_cmet_match(&c->vs[cmet_sec].cm, &c->vs[cb_sec].cb, h,
                            c->r->sections[cmet_sec].e.offset, &dg))
            report_diag(c, &dg, "CMET-MATCH", (long)cmet_sec, 0);
    }
}

/* a file without DESC is a codebook file (spec 13.4) */
static void check_codebook_file(vctx *c, const vbetween *b)
{
    fkvf_reader *r = c->r;
    const rd_commit *head = &r->commits[r->n_commits - 1];
    uint64_t npos = head->dh.n_positions, nar = head->dh.n_archived;
    for (size_t i = 0; i < r->n_sections; i++) {
        uint32_t t = r->sections[i].e.type;
        if (t == FKVF_SECTION_EXAC || t == FKVF_SECTION_STRM || t == FKVF_SECTION_CBRF) {
            char tn[12];
            tn_of(t, tn);
            RS(FKVF_E_CORRUPT, "13.4", "CBFILE-CONTENTS", i,
               "a file without DESC (a codebook file) holds a %s section", tn);
        }
    }
    if (b->cb_kind != 1)
        R(FKVF_E_CORRUPT, "13.4", "CBFILE-CBK1", NO_OFF,
          "a file without DESC (a codebook file) has no CBK1 section");
    if (npos || nar)
        R(FKVF_E_CORRUPT, "13.4", "CBFILE-POSITIONS", head->dir_off + 16,
          "a codebook file with n_positions %llu, n_archived %llu (must be 0)",
          (unsigned long long)npos, (unsigned long long)nar);
}

/* the codebook, the index streams and the counts of the head commit agree
 * (spec 11.6, 11.8, 13.7); groups present == 2 are unknown */
static void check_stream_counts(vctx *c, const vbetween *b)
{
    const rd_commit *head = &c->r->commits[c->r->n_commits - 1];
    uint64_t npos = head->dh.n_positions, nar = head->dh.n_archived;
    const vgroup *groups = b->groups;
    if (nar && !b->n_cb)
        R(FKVF_E_CORRUPT, "13.7", "CB-NEEDED", head->dir_off + 24,
          "n_archived %llu but the archive has no codebook section", (unsigned long long)nar);
    if (groups[0].present == 1 && !b->n_cb)
        R(FKVF_E_CORRUPT, "11.8", "STRM-INDEX-NOCB", NO_OFF,
          "index streams in a file without a codebook section");
    if (nar && !groups[0].present)
        R(FKVF_E_CORRUPT, "11.8", "STRM-INDEX-MISSING", NO_OFF,
          "n_archived %llu but no index streams", (unsigned long long)nar);
    if (groups[0].present == 1 && groups[0].length != nar)
        R(FKVF_E_CORRUPT, "11.6", "STRM-LENGTH", head->dir_off + 24,
          "the index streams have %llu symbols, n_archived is %llu",
          (unsigned long long)groups[0].length, (unsigned long long)nar);
    if (groups[1].present == 1 && groups[1].length != npos)
        R(FKVF_E_CORRUPT, "11.6", "STRM-LENGTH", head->dir_off + 16,
          "the token stream has %llu symbols, n_positions is %llu",
          (unsigned long long)groups[1].length, (unsigned long long)npos);
}

/* the CBK1 matches the descriptor and the index streams' stages (spec 13.7,
 * 11.8) */
static void check_cbk1_shape(vctx *c, const vbetween *b)
{
    size_t cb_sec = b->cb_sec;
    const fkvf_codebook_shape *s = &c->vs[cb_sec].cb;
    if (!fkvf_cbk1_matches(s, &c->desc.d))
        RS(FKVF_E_CORRUPT, "13.7", "CB-MATCH", cb_sec,
           "the CBK1 shape (layers %u, heads %u, dims %u/%u, pooled %u) does not match the "
           "descriptor",
           s->n_layers, s->n_heads, s->key_dim, s->value_dim, s->pooled);
    if (b->groups[0].present != 1)
        return;
    size_t first = b->groups[0].first;
    const fkvf_strm_hdr *h = &c->vs[first].h;
    if (h->k_stages != s->k_stages || h->v_stages != s->v_stages)
        RS(FKVF_E_CORRUPT, "11.8", "STRM-STAGES", first,
           "index streams with %u+%u stages, the codebook has %u+%u", h->k_stages, h->v_stages,
           s->k_stages, s->v_stages);
    else if (fkvf_cbk1_matches(s, &c->desc.d) &&
             h->n_streams != fkvf_index_stream_count(s, c->desc.d.n_kv_heads))
        RS(FKVF_E_CORRUPT, "11.8", "STRM-STAGES", first,
           "%u index streams, the codebook's layer table makes %llu", h->n_streams,
           (unsigned long long)fkvf_index_stream_count(s, c->desc.d.n_kv_heads));
}

static void check_between(vctx *c)
{
    fkvf_reader *r = c->r;
    const rd_commit *head = &r->commits[r->n_commits - 1];
    uint64_t npos = head->dh.n_positions, nar = head->dh.n_archived;
    vbetween b;
    memset(&b, 0, sizeof b);
    for (size_t i = 0; i < r->n_sections && !c->stop; i++) {
        between_section(c, i, &b);
        if (c->env_rc)
            return;
    }
    if (c->stop)
        return;
    /* the ZIDX streams; their keys are compared with the stream by the net */
    for (size_t i = 0; i < r->n_sections && !c->stop; i++)
        if (fkvf_zidx_is_index(r->sections[i].e.type) && c->vs[i].parsed)
            check_zidx_stream(c, i, &b);
    check_cmet_pairing(c, &b);
    if (!b.n_desc) {
        check_codebook_file(c, &b);
        return;
    }
    if (c->strm_bad) /* unknown: the group rules are not checked */
        b.groups[0].present = b.groups[1].present = 2;
    check_stream_counts(c, &b);
    if (b.cb_kind == 1 && c->vs[b.cb_sec].parsed && c->have_desc)
        check_cbk1_shape(c, &b);
    if (c->have_desc && nar && c->desc.d.n_sinks + nar > npos)
        R(FKVF_E_CORRUPT, "14.3", "POS-RANGE", head->dir_off + 24,
          "n_sinks %u + n_archived %llu > n_positions %llu", c->desc.d.n_sinks,
          (unsigned long long)nar, (unsigned long long)npos);
}

/* ---- the net: the reader's own open and full verification ------------------ */

/* Every stream read in full through the opened reader: every span that is
 * not valid (spec 12.2.5, SPAN: the first of each run of 1024 symbols) and,
 * with the codebook known, the first index symbol >= k of each stream (spec
 * 11.8, SYMBOL). Block checksum faults met here were reported above. */
static void check_symbols(vctx *c, fkvf_reader *r)
{
    size_t ns;
    if (fkvf_reader_stream_count(r, &ns))
        return;
    fkvf_codebook_shape cs;
    int have_k = fkvf_reader_codebook(r, &cs, NULL, NULL, NULL) == FKVF_OK;
    uint32_t buf[1024];
    for (size_t i = 0; i < ns && !c->stop; i++) {
        fkvf_stream_info si;
        if (fkvf_reader_stream_info(r, i, &si))
            continue;
        int is_index = (si.id >> 56) == 0, sym_done = 0;
        for (uint64_t t = 0; t < si.length && !c->stop; t += 1024) {
            size_t n = si.length - t < 1024 ? (size_t)(si.length - t) : 1024;
            int rc = fkvf_reader_stream_read(r, i, t, buf, n);
            if (rc) {
                fkvf_reader *keep = c->r;
                c->r = r;
                report_diag(c, &r->diag, rc == FKVF_E_SPAN ? "NET-SPAN" : "NET-VERIFY", -1,
                            rc == FKVF_E_SPAN ? 2 : 1);
                c->r = keep;
                continue;
            }
            for (size_t k = 0; k < n && is_index && have_k && !sym_done; k++)
                if (buf[k] >= cs.k) {
                    report(c, FKVF_E_SYMBOL, "11.8", "NET-SYMBOL", 0, NO_OFF, -1, 0,
                           "index stream %016llx: symbol %llu is %u, the codebook has k = %u",
                           (unsigned long long)si.id, (unsigned long long)(t + k), buf[k],
                           cs.k);
                    sym_done = 1;
                }
        }
    }
}

static void run_net(vctx *c, const fkvf_validate_options *opt)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_memory(&r, c->d, (size_t)c->n, 0, c->alloc);
    if (rc == FKVF_E_NOMEM && !r) { /* no handle to report through: nothing was checked */
        c->env_rc = FKVF_E_NOMEM;
        c->stop = 1;
        return;
    }
    if (rc == FKVF_OK && opt && opt->codebook) {
        rc = fkvf_reader_attach_codebook(r, opt->codebook);
        if (rc == FKVF_E_CODEBOOK)
            report_diag(c, &r->diag, "CB-EXTERNAL", -1, 1);
        rc = FKVF_OK;
    }
    if (rc == FKVF_OK)
        check_symbols(c, r);
    if (rc == FKVF_OK && !c->stop)
        rc = fkvf_reader_verify(r);
    if (rc && r && rc != FKVF_E_TORN && !c->stop) {
        fkvf_reader *keep = c->r;
        c->r = r; /* sections of the reader's own list for the type */
        report_diag(c, &r->diag, "NET-VERIFY", -1, 1);
        c->r = keep;
    }
    fkvf_reader_free(r);
}

/* ---- strict: every earlier commit a valid state on its own (spec 7.3) ------ */

static void check_prefixes(vctx *c)
{
    fkvf_reader *r = c->r;
    /* opening a prefix costs its directories: bound the total work */
    uint64_t work = 0;
    for (size_t ci = 0; ci + 1 < r->n_commits && !c->stop; ci++) {
        work += r->commits[ci].dh.entry_count + 1;
        if (work > FKVF_MAX_SECTIONS)
            break;
        fkvf_reader *p = NULL;
        uint64_t len = r->commits[ci].trailer_off + 64;
        int rc = fkvf_reader_open_memory(&p, c->d, (size_t)len, FKVF_OPEN_STRICT, c->alloc);
        if (rc && p && fkvf_error_class(rc) == FKVF_ERRCLASS_FORMAT) {
            uint64_t off;
            const char *clause;
            char b[400];
            diag_facts(&p->diag, &off, &clause, b, sizeof b);
            if (!seen_like(c, rc, clause, off))
                report(c, rc, "7.3", "W-COMMIT-STATE", 1, r->commits[ci].trailer_off, -1, 0,
                       "commit %llu alone (the file cut after its trailer) is not valid: %s "
                       "(spec %s)",
                       (unsigned long long)r->commits[ci].seq, b, clause);
        } else if (rc == FKVF_E_NOMEM)
            c->env_rc = rc;
        fkvf_reader_free(p);
    }
}

FKVF_API int fkvf_validate_memory(const void *data, size_t size,
                                  const fkvf_validate_options *opt, fkvf_violation_fn fn,
                                  void *opaque, fkvf_validate_result *res)
{
    if (res)
        memset(res, 0, sizeof *res);
    if (!data && size)
        return FKVF_E_INVALID_ARG;
    if (opt && (opt->flags & ~FKVF_VALIDATE_STRICT))
        return FKVF_E_INVALID_ARG;
    static const uint8_t empty[1] = {0};
    vctx c;
    memset(&c, 0, sizeof c);
    c.d = size ? data : empty;
    c.n = size;
    c.alloc = fkvf_alloc_or_default(opt ? opt->alloc : NULL);
    c.flags = opt ? opt->flags : 0;
    c.fn = fn;
    c.opaque = opaque;
    c.cap = opt && opt->max_violations ? opt->max_violations : DEFAULT_CAP;
    if (check_header(&c) && !c.stop) {
        int rc = rd_open_chain(&c.r, c.d, size, "", c.alloc);
        if (rc == FKVF_E_NOMEM || !c.r) {
            c.env_rc = FKVF_E_NOMEM;
        } else if (rc) {
            /* header faults were reported above; anything else stops here */
            report_diag(&c, &c.r->diag, "OPEN-CHAIN", -1, 1);
        } else {
            if (c.r->torn_bytes)
                report(&c, FKVF_E_TORN, "7.2", "TORN", 0, c.r->committed_size, -1, 0,
                       "%llu bytes after the last valid commit (commit %llu): torn tail "
                       "(recoverable by truncation, spec 7.7)",
                       (unsigned long long)c.r->torn_bytes,
                       (unsigned long long)c.r->commits[c.r->n_commits - 1].seq);
            if (load_entries(&c) && !c.stop && !c.env_rc) {
                check_layout(&c);
                check_sums(&c);
                if (!c.env_rc)
                    check_contents(&c);
                if (!c.env_rc && !c.stop)
                    check_between(&c);
                if (!c.env_rc && !c.stop)
                    run_net(&c, opt);
                if (!c.env_rc && !c.stop && (c.flags & FKVF_VALIDATE_STRICT))
                    check_prefixes(&c);
            }
        }
    }
    if (c.r) {
        /* sections were filled here: the handle frees their buffers */
        fkvf_reader_free(c.r);
    }
    fkvf_free(c.alloc, c.vs);
    fkvf_free(c.alloc, c.layout_bad);
    if (res) {
        res->violations = c.count;
        res->capped = c.stop && !c.env_rc; /* the cap or the callback */
    }
    return c.env_rc ? c.env_rc : FKVF_OK;
}

FKVF_API int fkvf_validate_file(const char *path, const fkvf_validate_options *opt,
                                fkvf_violation_fn fn, void *opaque, fkvf_validate_result *res)
{
    if (res)
        memset(res, 0, sizeof *res);
    if (!path)
        return FKVF_E_INVALID_ARG;
    /* O_NONBLOCK: a FIFO opens at once (and is refused as not a regular
     * file) instead of waiting for a writer; no effect on a regular file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return FKVF_E_IO;
    fkvf_diag d; /* no handle to report through: the return code says it */
    d.name = path;
    fkvf_diag_clear(&d);
    fkvf_filemap m;
    int rc = fkvf_filemap_fd(&m, fd, 0, NULL, &d);
    close(fd);
    if (rc)
        return rc == FKVF_E_LIMIT ? rc : FKVF_E_IO; /* LIMIT: larger than the address space */
    rc = fkvf_validate_memory(m.data, m.size, opt, fn, opaque, res);
    fkvf_filemap_release(&m, NULL);
    return rc;
}
