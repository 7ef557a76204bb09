/* fkvf_reader_open_source (issue 18): a reader whose bytes come from a
 * caller's pread-like callback. It reads only what a call needs (counted
 * here: a random read of one position of a multi-megabyte archive reads a
 * small part of it), serves exactly what a reader of the same bytes in
 * memory serves, reports a source that fails as an I/O error (never as a
 * damaged file, never with a torn-tail fallback), and never serves bytes
 * that changed in the source between two reads (checksums). */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "testutil.h"

/* the archive: 4 layers x 4 KV heads x 64 dims, f16, K x2 V x2, k = 256,
 * 4 sinks + 64 recent exact, every other position archived; blocks of 4096 */
enum { L = 4, H = 4, D = 64, K = 256, KS = 2, VS = 2, NPOS = 4096, SINKS = 4, RECENT = 64 };
#define ROW_BYTES ((size_t)L * H * 2 * D * 2)

static void build_archive(tu_buf *b)
{
    memset(b, 0, sizeof *b);
    fkvf_sink sink = tu_buf_sink(b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 4096;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = SINKS;
    d.window = RECENT;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    tu_rng g = {7};
    /* f16 values in [-1, 1): sign, exponent 0x0D..0x0E, random mantissa */
    uint16_t *rows = malloc((SINKS + RECENT) * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    for (size_t i = 0; i < (SINKS + RECENT) * ROW_BYTES / 2; i++)
        rows[i] = (uint16_t)((tu_below(&g, 2) << 15) | ((13 + tu_below(&g, 2)) << 10) |
                             tu_below(&g, 1024));
    tu_le_u16(rows, (SINKS + RECENT) * ROW_BYTES / 2); /* rows are little-endian (fkvf.h) */
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * ROW_BYTES, 0), FKVF_OK);
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.n_layers = L;
    cs.n_heads = H;
    cs.key_dim = cs.value_dim = D;
    cs.k = K;
    cs.k_stages = KS;
    cs.v_stages = VS;
    cs.dtype = FKVF_DTYPE_F16;
    size_t tn = (size_t)(fkvf_codebook_size(&cs) - 64);
    uint16_t *t = malloc(tn);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < tn / 2; i++)
        t[i] = (uint16_t)((tu_below(&g, 2) << 15) | (12 << 10) | tu_below(&g, 1024));
    tu_le_u16(t, tn / 2); /* so are the CBK1 tables */
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &cs, t, tn, 0), FKVF_OK);
    free(t);
    const uint64_t A = NPOS - SINKS - RECENT;
    const size_t nc = (size_t)L * H * (KS + VS);
    uint16_t *codes = malloc(A * nc * sizeof *codes);
    ck_assert_ptr_nonnull(codes);
    for (size_t i = 0; i < A * nc; i++)
        codes[i] = (uint16_t)tu_below(&g, K);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 8;
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, A, codes, nc, 1), FKVF_OK);
    free(codes);
    ck_assert_int_eq(fkvf_writer_add_exact(w, NPOS - RECENT, RECENT,
                                           (uint8_t *)rows + SINKS * ROW_BYTES,
                                           RECENT * ROW_BYTES, 0),
                     FKVF_OK);
    free(rows);
    ck_assert_int_eq(fkvf_writer_set_positions(w, NPOS, A), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
}

/* a source over a buffer: counts, can fail at one offset, can change */
typedef struct mem_source {
    const uint8_t *data;
    size_t size;
    uint64_t reads, bytes, biggest;
    uint64_t fail_at; /* a read covering this offset fails (UINT64_MAX: none) */
    int fail_all;     /* every read fails */
    uint64_t fail_nth; /* the read call with this number (1, 2, ...) fails; 0: none */
    uint64_t calls;
    int fail_code;
    int bad_range; /* a read outside the file was asked for */
} mem_source;

static int mem_read(void *opaque, uint64_t off, void *buf, size_t n)
{
    mem_source *m = opaque;
    if (n == 0 || off > m->size || n > m->size - off) {
        m->bad_range = 1;
        return FKVF_E_IO;
    }
    m->calls++;
    if (m->fail_all || (m->fail_at >= off && m->fail_at - off < n) || m->calls == m->fail_nth)
        return m->fail_code;
    memcpy(buf, m->data + off, n);
    m->reads++;
    m->bytes += n;
    if (n > m->biggest)
        m->biggest = n;
    return FKVF_OK;
}

static fkvf_source source_of(mem_source *m, const tu_buf *b)
{
    memset(m, 0, sizeof *m);
    m->data = b->data;
    m->size = b->size;
    m->fail_at = UINT64_MAX;
    fkvf_source s = {mem_read, m, b->size};
    return s;
}

/* positions [first, first + count), every layer, head and part */
static fkvf_read_request request(uint64_t first, uint64_t count, fkvf_dtype dtype)
{
    fkvf_read_request q;
    memset(&q, 0, sizeof q);
    q.first = first;
    q.count = count;
    q.dtype = dtype;
    return q;
}

/* fkvf_reader_read of q on r: rc_want, and (when FKVF_OK) the bytes ref
 * serves for q */
static void read_as(fkvf_reader *r, fkvf_reader *ref, const fkvf_read_request *q, int rc_want)
{
    size_t n;
    ck_assert_int_eq(fkvf_reader_read_size(ref, q, &n), FKVF_OK);
    uint8_t *a = malloc(n), *c = malloc(n);
    ck_assert(a && c);
    int rc = fkvf_reader_read(r, q, a, n);
    ck_assert_msg(rc == rc_want, "read: %d, want %d (%s)", rc, rc_want, fkvf_reader_message(r));
    if (rc == FKVF_OK) {
        ck_assert_int_eq(fkvf_reader_read(ref, q, c, n), FKVF_OK);
        ck_assert(memcmp(a, c, n) == 0);
    }
    free(a);
    free(c);
}

/* open, info and one position of every layer and head: a small part of the
 * file is read, and the results equal those of a reader of memory */
START_TEST(reads_only_what_is_needed)
{
    tu_buf b;
    build_archive(&b);
    ck_assert_uint_gt(b.size, 2u << 20); /* multi-megabyte */
    mem_source m;
    fkvf_source src = source_of(&m, &b);
    fkvf_reader *r = NULL, *ref = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, "mem://archive", 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_open_memory(&ref, b.data, b.size, 0, NULL), FKVF_OK);
    ck_assert_str_eq(fkvf_reader_file_name(r), "mem://archive");
    uint64_t open_bytes = m.bytes, sb, sr;
    ck_assert_int_eq(fkvf_reader_source_stats(r, &sb, &sr), FKVF_OK);
    ck_assert_uint_eq(sb, m.bytes);
    ck_assert_uint_eq(sr, m.reads);
    fkvf_archive_info ai, ai2;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_info(ref, &ai2), FKVF_OK);
    ck_assert_uint_eq(ai.n_positions, ai2.n_positions);
    ck_assert_uint_eq(ai.file_size, b.size);
    /* info reads nothing more */
    ck_assert_uint_eq(m.bytes, open_bytes);
    /* one archived position, every layer and head, keys and values */
    fkvf_read_request q = request(2000, 1, FKVF_DTYPE_F16);
    uint64_t open_reads = m.reads;
    read_as(r, ref, &q, FKVF_OK);
    uint64_t one = m.bytes - open_bytes;
    /* read coalescing: the blocks of the 64 streams (adjacent in the file)
     * in one read, the codebook in another; not a read a stream (64) */
    ck_assert_uint_le(m.reads - open_reads, 3);
    /* one position: the embedded codebook, whole (its checksum covers it
     * all, spec 4.6), and one 4096-byte block per stream part it touches
     * (64 streams of 4024 bytes: at most 2 blocks each), not the file */
    uint64_t cbk1 = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.type == FKVF_SECTION_CBK1)
            cbk1 = si.stored_size;
    }
    ck_assert_uint_gt(cbk1, 1u << 20);
    ck_assert_uint_le(one, cbk1 + 4096 + 64u * 2 * 4096);
    /* open and info: the header, trailer, directory, DESC, EXAC sections
     * and segment headers, not the codebook nor the streams */
    ck_assert_uint_lt(open_bytes, b.size - cbk1 - 100000);
    /* a second position nearby: only blocks, no codebook again */
    uint64_t before = m.bytes;
    q.first = 2001;
    read_as(r, ref, &q, FKVF_OK);
    ck_assert_uint_le(m.bytes - before, 64u * 2 * 4096);
    ck_assert(!m.bad_range);
    fkvf_reader_free(r);
    fkvf_reader_free(ref);
    tu_buf_free(&b);
}
END_TEST

/* restore of every position and full verification: the same bytes as a
 * reader of memory; every byte read once at most (units are kept) */
START_TEST(restore_and_verify_equal)
{
    tu_buf b;
    build_archive(&b);
    mem_source m;
    fkvf_source src = source_of(&m, &b);
    fkvf_reader *r = NULL, *ref = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 512, NULL, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_open_memory(&ref, b.data, b.size, 0, NULL), FKVF_OK);
    size_t all = NPOS * ROW_BYTES;
    uint8_t *a = malloc(all), *c = malloc(all);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, a, all), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(ref, 0, NPOS, FKVF_DTYPE_F16, c, all), FKVF_OK);
    ck_assert(memcmp(a, c, all) == 0);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    ck_assert_uint_le(m.bytes, b.size);
    ck_assert_uint_ge(m.bytes, b.size - 64); /* verify read (nearly) all */
    ck_assert(!m.bad_range);
    free(a);
    free(c);
    fkvf_reader_free(r);
    fkvf_reader_free(ref);
    tu_buf_free(&b);
}
END_TEST

/* a source that fails: at open (the trailer) an I/O error, not a damaged
 * or torn file; later (a stream block) the call fails with the source's
 * code and a later call asks again */
START_TEST(failing_source)
{
    tu_buf b;
    build_archive(&b);
    mem_source m;
    fkvf_source src = source_of(&m, &b);
    m.fail_at = b.size - 10; /* inside the last trailer */
    m.fail_code = FKVF_E_IO;
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, NULL, 0, NULL), FKVF_E_IO);
    ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "source"));
    fkvf_reader_free(r);
    /* a code that is not an environment code is reported as FKVF_E_IO: the
     * file is not at fault */
    m.fail_code = FKVF_E_CHECKSUM;
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, NULL, 0, NULL), FKVF_E_IO);
    fkvf_reader_free(r);
    m.fail_code = FKVF_E_NOMEM;
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, NULL, 0, NULL), FKVF_E_NOMEM);
    fkvf_reader_free(r);
    /* open fine; then every read fails: a random read fails with the
     * source's code; once the source works again the same read succeeds */
    m.fail_at = UINT64_MAX;
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, NULL, 0, NULL), FKVF_OK);
    fkvf_reader *ref = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&ref, b.data, b.size, 0, NULL), FKVF_OK);
    fkvf_read_request q = request(1234, 2, FKVF_DTYPE_F32);
    m.fail_all = 1;
    m.fail_code = FKVF_E_IO;
    read_as(r, ref, &q, FKVF_E_IO);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_E_IO);
    m.fail_all = 0;
    read_as(r, ref, &q, FKVF_OK);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_reader_free(r);
    fkvf_reader_free(ref);
    tu_buf_free(&b);
}
END_TEST

/* the source changes after the open (the object was replaced): bytes read
 * afterwards fail their checksums; nothing wrong is served */
START_TEST(changed_source)
{
    tu_buf b;
    build_archive(&b);
    mem_source m;
    fkvf_source src = source_of(&m, &b);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, NULL, 0, NULL), FKVF_OK);
    uint8_t *other = malloc(b.size);
    ck_assert_ptr_nonnull(other);
    memcpy(other, b.data, b.size);
    /* every byte of the middle of the file changed: the index streams */
    for (size_t i = b.size / 4; i < b.size / 4 * 3; i++)
        other[i] ^= 0x5A;
    m.data = other;
    size_t all = (size_t)NPOS * ROW_BYTES;
    uint8_t *out = malloc(all);
    ck_assert_ptr_nonnull(out);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, out, all), FKVF_E_CHECKSUM);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_E_CHECKSUM);
    free(out);
    free(other);
    fkvf_reader_free(r);
    tu_buf_free(&b);
}
END_TEST

/* SQLite-style failure loop: read call n fails, for every n until a run
 * makes fewer calls; each run either fails with the source's code (at
 * open, in the random read, the restore or verify) or serves exactly the
 * reference, and a failed call retried on the same reader succeeds */
START_TEST(read_failure_loop)
{
    tu_buf b;
    build_archive(&b);
    fkvf_reader *ref = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&ref, b.data, b.size, 0, NULL), FKVF_OK);
    fkvf_read_request q = request(3000, 1, FKVF_DTYPE_F16);
    size_t n, all = (size_t)NPOS * ROW_BYTES;
    ck_assert_int_eq(fkvf_reader_read_size(ref, &q, &n), FKVF_OK);
    uint8_t *want1 = malloc(n), *got1 = malloc(n), *want = malloc(all), *got = malloc(all);
    ck_assert(want1 && got1 && want && got);
    ck_assert_int_eq(fkvf_reader_read(ref, &q, want1, n), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(ref, 0, NPOS, FKVF_DTYPE_F16, want, all), FKVF_OK);
    int failures = 0;
    for (uint64_t nth = 1;; nth++) {
        mem_source m;
        fkvf_source src = source_of(&m, &b);
        m.fail_nth = nth;
        m.fail_code = FKVF_E_IO;
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_source(&r, &src, 512, NULL, 0, NULL);
        if (rc == FKVF_OK) {
            /* each step once more after a failure: the retry succeeds */
            for (int step = 0; step < 3 && rc == FKVF_OK; step++) {
                for (int attempt = 0; attempt < 2; attempt++) {
                    rc = step == 0   ? fkvf_reader_read(r, &q, got1, n)
                         : step == 1 ? fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, got, all)
                                     : fkvf_reader_verify(r);
                    if (rc == FKVF_OK)
                        break;
                    ck_assert_int_eq(rc, FKVF_E_IO);
                    ck_assert_int_eq(attempt, 0);
                    failures++;
                    rc = FKVF_OK;
                }
            }
            ck_assert(memcmp(got1, want1, n) == 0);
            ck_assert(memcmp(got, want, all) == 0);
        } else {
            ck_assert_int_eq(rc, FKVF_E_IO);
            failures++;
        }
        fkvf_reader_free(r);
        if (m.calls < nth)
            break; /* no call failed: every failure point was tried */
        ck_assert_uint_lt(nth, 100000);
    }
    ck_assert_int_ge(failures, 5); /* open: header, trailer, directory, sections; blocks */
    free(want1);
    free(got1);
    free(want);
    free(got);
    fkvf_reader_free(ref);
    tu_buf_free(&b);
}
END_TEST

/* everything the reader does on one file, as a list of return codes and
 * the bytes served: open, verify, restore of every position, every stream */
static void exercise(fkvf_reader *r, int open_rc, int *rcs, uint8_t **out, size_t *out_n)
{
    rcs[0] = open_rc;
    rcs[1] = rcs[2] = rcs[3] = -1;
    *out = NULL;
    *out_n = 0;
    if (open_rc != FKVF_OK)
        return;
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    size_t rb = 0;
    if (fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &rb) == FKVF_OK && ai.n_positions &&
        ai.n_positions * rb < (64u << 20)) {
        *out_n = (size_t)ai.n_positions * rb;
        *out = malloc(*out_n);
        ck_assert_ptr_nonnull(*out);
        rcs[1] = fkvf_reader_restore(r, 0, ai.n_positions, FKVF_DTYPE_F32, *out, *out_n);
    }
    rcs[2] = FKVF_OK;
    for (size_t i = 0; i < ai.n_streams && rcs[2] == FKVF_OK; i++) {
        fkvf_stream_info si;
        ck_assert_int_eq(fkvf_reader_stream_info(r, i, &si), FKVF_OK);
        uint32_t sym[256];
        for (uint64_t a = 0; a < si.length && rcs[2] == FKVF_OK; a += 256)
            rcs[2] = fkvf_reader_stream_read(r, i, a, sym,
                                             si.length - a < 256 ? (size_t)(si.length - a) : 256);
    }
    rcs[3] = fkvf_reader_verify(r);
}

/* the first code of rcs that is not FKVF_OK (-1: not run), or FKVF_OK */
static int first_error(const int *rcs)
{
    for (int k = 0; k < 4; k++)
        if (rcs[k] != FKVF_OK && rcs[k] != -1)
            return rcs[k];
    return FKVF_OK;
}

/* every file of the conformance suite (valid and damaged, small units):
 * a source reader fails with the same first error as a reader of memory,
 * and serves the same bytes when neither fails (a byte used without being
 * read first would read as zero and differ). The first error may come
 * later with a source: it defers the CBK1 to the codebook's first use
 * (spec 7.5 step 4), a reader of memory loads it at open. */
START_TEST(suite_same_as_memory)
{
    const char *srcdir = getenv("FKVF_SRCDIR");
    ck_assert_ptr_nonnull(srcdir);
    char dir[4096];
    int dn = snprintf(dir, sizeof dir, "%s/conformance/files", srcdir);
    ck_assert(dn > 0 && (size_t)dn < sizeof dir);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl < 5 || strcmp(e->d_name + nl - 5, ".fkvf"))
            continue;
        char path[4400];
        int pn = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ck_assert(pn > 0 && (size_t)pn < sizeof path); /* checked: never cut */
        tu_buf b = {NULL, 0, 0};
        b.data = tu_slurp(path, &b.size);
        mem_source m;
        fkvf_source src = source_of(&m, &b);
        fkvf_reader *rs = NULL, *rm = NULL;
        int a[4], c[4];
        uint8_t *oa, *oc;
        size_t na, nc;
        int orc = fkvf_reader_open_source(&rs, &src, 512, path, 0, NULL);
        exercise(rs, orc, a, &oa, &na);
        orc = fkvf_reader_open_memory(&rm, b.data, b.size, 0, NULL);
        exercise(rm, orc, c, &oc, &nc);
        ck_assert_msg(first_error(a) == first_error(c),
                      "%s: source %d %d %d %d, memory %d %d %d %d (%s)", e->d_name, a[0], a[1],
                      a[2], a[3], c[0], c[1], c[2], c[3], fkvf_reader_message(rs));
        if (first_error(a) == FKVF_OK) {
            ck_assert_uint_eq(na, nc);
            ck_assert_msg(na == 0 || memcmp(oa, oc, na) == 0, "%s: restore", e->d_name);
        }
        ck_assert(!m.bad_range);
        free(oa);
        free(oc);
        fkvf_reader_free(rs);
        fkvf_reader_free(rm);
        free(b.data);
        files++;
    }
    closedir(d);
    ck_assert_int_gt(files, 150);
}
END_TEST

/* argument checks; a reader of memory reads nothing from a source */
/* the block cache (fkvf_reader_set_source_cache): with a budget of 16
 * blocks, random reads, a restore of everything and verify serve the
 * memory reader's bytes while the cache stays within the budget plus one
 * step's blocks; dropped blocks are read again, verified again (a source
 * changed since is caught), and a failure while reading one again is an
 * I/O error that a later call recovers from */
START_TEST(block_cache_bounded)
{
    tu_buf b;
    build_archive(&b);
    mem_source m;
    fkvf_source src = source_of(&m, &b);
    fkvf_reader *r = NULL, *ref = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 4096, NULL, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_open_memory(&ref, b.data, b.size, 0, NULL), FKVF_OK);
    const uint64_t budget = 16 * 4096, step = 64u * 2 * 4096; /* one position's blocks */
    uint64_t cached, dropped;
    ck_assert_int_eq(fkvf_reader_set_source_cache(r, budget), FKVF_OK);
    /* a reader of memory has no cache: a no-op */
    ck_assert_int_eq(fkvf_reader_set_source_cache(ref, budget), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_source_cache(ref, &cached, &dropped), FKVF_OK);
    ck_assert_uint_eq(cached + dropped, 0);
    tu_rng g = {11};
    for (int k = 0; k < 200; k++) {
        fkvf_read_request q = request(SINKS + tu_below(&g, NPOS - SINKS - RECENT), 1,
                                      FKVF_DTYPE_F16);
        read_as(r, ref, &q, FKVF_OK);
        ck_assert_int_eq(fkvf_reader_source_cache(r, &cached, &dropped), FKVF_OK);
        ck_assert_uint_le(cached, budget + step);
    }
    ck_assert_uint_gt(dropped, 0);
    uint64_t before = m.bytes;
    size_t all = NPOS * ROW_BYTES;
    uint8_t *a = malloc(all), *c = malloc(all);
    ck_assert(a && c);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, a, all), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(ref, 0, NPOS, FKVF_DTYPE_F16, c, all), FKVF_OK);
    ck_assert(memcmp(a, c, all) == 0);
    ck_assert_int_eq(fkvf_reader_source_cache(r, &cached, &dropped), FKVF_OK);
    ck_assert_uint_le(cached, budget + 2 * 4096);
    ck_assert_uint_gt(m.bytes - before, 100000); /* blocks read again */
    /* a failing source while blocks are read again: an I/O error, then
     * the same restore succeeds */
    m.fail_all = 1;
    m.fail_code = FKVF_E_IO;
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, a, all), FKVF_E_IO);
    m.fail_all = 0;
    memset(a, 0, all);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, a, all), FKVF_OK);
    ck_assert(memcmp(a, c, all) == 0);
    /* the object replaced by one with a changed byte in the index data:
     * the dropped block that holds it is verified again when read again */
    uint8_t *other = malloc(b.size);
    ck_assert_ptr_nonnull(other);
    memcpy(other, b.data, b.size);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    uint64_t at = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.type == FKVF_SECTION_STRM && si.key == 0)
            at = si.offset + si.stored_size / 3;
    }
    ck_assert_uint_gt(at, 0);
    other[at] ^= 0x40;
    m.data = other;
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, a, all), FKVF_E_CHECKSUM);
    m.data = b.data;
    /* verify (its section checksums keep every section) with a budget */
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    /* 0: everything kept from now on, nothing counted */
    ck_assert_int_eq(fkvf_reader_set_source_cache(r, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_source_cache(r, &cached, &dropped), FKVF_OK);
    ck_assert_uint_eq(cached, 0);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NPOS, FKVF_DTYPE_F16, a, all), FKVF_OK);
    ck_assert(memcmp(a, c, all) == 0);
    ck_assert(!m.bad_range);
    fkvf_reader_free(r);
    /* units below the page size: no cache */
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 512, NULL, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_set_source_cache(r, budget), FKVF_E_UNSUPPORTED);
    ck_assert_int_eq(fkvf_reader_set_source_cache(r, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_set_source_cache(NULL, 0), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_source_cache(r, NULL, &dropped), FKVF_E_INVALID_ARG);
    free(a);
    free(c);
    free(other);
    fkvf_reader_free(r);
    fkvf_reader_free(ref);
    tu_buf_free(&b);
}
END_TEST

START_TEST(source_arguments)
{
    tu_buf b;
    build_archive(&b);
    mem_source m;
    fkvf_source src = source_of(&m, &b);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(NULL, &src, 0, NULL, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_open_source(&r, NULL, 0, NULL, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(r);
    static const uint32_t bad_units[] = {1, 256, 1000, 4097, (UINT32_C(1) << 24) * 2};
    for (size_t i = 0; i < sizeof bad_units / sizeof bad_units[0]; i++)
        ck_assert_int_eq(fkvf_reader_open_source(&r, &src, bad_units[i], NULL, 0, NULL),
                         FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_open_source(&r, &src, 0, NULL, FKVF_OPEN_READ, NULL),
                     FKVF_E_INVALID_ARG);
    fkvf_source none = src;
    none.read = NULL;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &none, 0, NULL, 0, NULL), FKVF_E_INVALID_ARG);
    /* a source shorter than the file: the tail is torn (an earlier commit, if
     * any, or TRUNCATED), as for a file cut short */
    fkvf_source cut = src;
    cut.size = b.size - 100;
    ck_assert_int_eq(fkvf_reader_open_source(&r, &cut, 0, NULL, 0, NULL), FKVF_E_TRUNCATED);
    fkvf_reader_free(r);
    ck_assert(!m.bad_range);
    fkvf_reader *mr = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&mr, b.data, b.size, 0, NULL), FKVF_OK);
    uint64_t by = 1, rd = 1;
    ck_assert_int_eq(fkvf_reader_source_stats(mr, &by, &rd), FKVF_OK);
    ck_assert_uint_eq(by, 0);
    ck_assert_uint_eq(rd, 0);
    ck_assert_int_eq(fkvf_reader_source_stats(mr, NULL, &rd), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_source_stats(NULL, &by, &rd), FKVF_E_STATE);
    fkvf_reader_free(mr);
    tu_buf_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("source");
    TCase *t = tcase_create("source");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, reads_only_what_is_needed);
    tcase_add_test(t, restore_and_verify_equal);
    tcase_add_test(t, failing_source);
    tcase_add_test(t, changed_source);
    tcase_add_test(t, read_failure_loop);
    tcase_add_test(t, suite_same_as_memory);
    tcase_add_test(t, source_arguments);
    tcase_add_test(t, block_cache_bounded);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
