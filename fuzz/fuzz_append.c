/* Fuzz target: the appender (spec 7.4-7.7, 14.3) and crash recovery.
 * The input chooses a cache shape, codebook (or none), codecs, window and
 * sinks, then up to 5 appends + commits of input-derived rows and tokens
 * into a file on tmpfs (no fsync), with the appender's queue at its
 * default or at its smallest (the appends then write ahead of the commit).
 * After every commit the whole archive is
 * read back and kept as that commit's snapshot (restored rows in the
 * descriptor's dtype + token ids); it must hold the appended rows exactly
 * at exact positions and the RVQ decoding of their greedy/beam codes at
 * archived ones (keys un-rotated and rotated back when archived before
 * RoPE). Then the file is damaged at an input-chosen offset (cut there, or
 * one byte flipped) and:
 *  - a non-strict reader that opens it serves some commit j (n_commits)
 *    and every position it restores equals snapshot j bit for bit; a cut
 *    file serves exactly the last commit that ends at or before the cut;
 *    a strict open succeeds only when the cut is at a commit boundary;
 *  - fkvf_appender_open with recover = 1 on a cut file continues from that
 *    commit: appending one more position and committing gives a file whose
 *    earlier positions are still snapshot j's. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fkvf.h"
#include "fuzz_util.h"

#define MAX_COMMITS 6
#define MAX_N 64

static char path[256];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/fkvf-fuzz-append-%ld.fkvf", dir, (long)getpid());
    return 0;
}

typedef struct snap {
    uint64_t n, A, size; /* positions, archived, committed bytes */
    uint64_t commits;    /* n_commits of the file */
    uint8_t *rows;       /* n restored rows */
    uint32_t *tok;       /* n token ids or NULL */
} snap;

static size_t dsize(fkvf_dtype d) { return d == FKVF_DTYPE_F32 ? 4 : 2; }

static void store_tame(fkvf_dtype dt, uint8_t *p, float v)
{
    if (dt == FKVF_DTYPE_F32) {
        memcpy(p, &v, 4);
        return;
    }
    uint16_t h = dt == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(v) : fkvf_f32_to_bf16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Read the file as it is and take its snapshot (the reader must open it
 * strictly and verify it). */
static void take_snapshot(snap *s, size_t rb, int has_tok)
{
    fkvf_reader *r = NULL;
    FZ_CHECK(fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL) == FKVF_OK);
    FZ_CHECK(fkvf_reader_verify(r) == FKVF_OK);
    fkvf_archive_info ai;
    FZ_CHECK(fkvf_reader_info(r, &ai) == FKVF_OK);
    s->n = ai.n_positions;
    s->A = ai.n_archived;
    s->size = ai.file_size;
    s->commits = ai.n_commits;
    fkvf_desc d;
    FZ_CHECK(fkvf_reader_desc(r, &d) == FKVF_OK);
    s->rows = malloc(rb * (s->n ? s->n : 1));
    FZ_CHECK(s->rows);
    FZ_CHECK(fkvf_reader_restore(r, 0, s->n, d.dtype, s->rows, rb * s->n) == FKVF_OK);
    s->tok = NULL;
    if (has_tok) {
        size_t si;
        s->tok = malloc(sizeof *s->tok * (s->n ? s->n : 1));
        FZ_CHECK(s->tok);
        FZ_CHECK(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &si) == FKVF_OK);
        FZ_CHECK(fkvf_reader_stream_read(r, si, 0, s->tok, s->n) == FKVF_OK);
    }
    fkvf_reader_free(r);
}

/* Positions [0, n) of the file: equal to the snapshot wherever they can be
 * read (all must be readable when `all`). */
static void check_against(fkvf_reader *r, const snap *s, size_t rb, fkvf_dtype dt, int all)
{
    uint8_t *row = malloc(rb);
    FZ_CHECK(row);
    for (uint64_t p = 0; p < s->n; p++) {
        int rc = fkvf_reader_restore(r, p, 1, dt, row, rb);
        FZ_CHECK(!all || rc == FKVF_OK);
        if (rc == FKVF_OK)
            FZ_CHECK(memcmp(row, s->rows + p * rb, rb) == 0);
    }
    free(row);
    if (s->tok) {
        size_t si;
        int rc = fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &si);
        FZ_CHECK(!all || rc == FKVF_OK);
        for (uint64_t p = 0; p < s->n && rc == FKVF_OK; p++) {
            uint32_t t;
            int rg = fkvf_reader_stream_get(r, si, p, &t);
            FZ_CHECK(!all || rg == FKVF_OK);
            if (rg == FKVF_OK)
                FZ_CHECK(t == s->tok[p]);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0])
        LLVMFuzzerInitialize(NULL, NULL);
    fz f = {data, size};
    uint8_t m0 = fz_u8(&f), m1 = fz_u8(&f), m2 = fz_u8(&f);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = 1 + m0 % 2;
    d.n_kv_heads = 1 + (m0 >> 1) % 2;
    d.key_dim = 2 * (1 + (m0 >> 2) % 2);
    d.value_dim = 1 + (m0 >> 3) % 4;
    d.dtype = (fkvf_dtype)(1 + (m0 >> 5) % 3);
    if (m1 & 1) {
        d.key_transform = 1;
        d.rope_layout = 1 + ((m1 >> 1) & 1);
        d.key_storage = (m1 >> 2) & 1;
        d.rope_dims = d.key_dim;
        d.rope_theta = 10000.0;
    }
    d.n_sinks = (m1 >> 3) % 4;
    d.window = (m1 >> 5) % 8;
    int with_cb = m2 & 1, with_tok = (m2 >> 1) & 1, ngon_tok = (m2 >> 2) & 1;
    int ngon_ix = (m2 >> 3) & 1;
    fkvf_rvq *q = NULL;
    if (with_cb) {
        fkvf_codebook_shape cs;
        memset(&cs, 0, sizeof cs);
        cs.n_layers = d.n_layers;
        cs.n_heads = d.n_kv_heads;
        cs.key_dim = d.key_dim;
        cs.value_dim = d.value_dim;
        cs.k = 16;
        cs.k_stages = (uint8_t)(1 + (m2 >> 4) % 2);
        cs.v_stages = (uint8_t)((m2 >> 5) % 2);
        cs.dtype = (m2 >> 6) & 1 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
        size_t ts = (size_t)(fkvf_codebook_size(&cs) - 64), es = dsize(cs.dtype);
        uint8_t *t = malloc(ts + 1);
        FZ_CHECK(t);
        for (size_t i = 0; i < ts / es; i++)
            store_tame(cs.dtype, t + i * es, (float)((int8_t)fz_u8(&f)) / 16.0f);
        FZ_CHECK(fkvf_rvq_from_tables(&q, &cs, d.n_kv_heads, t, ts, NULL) == FKVF_OK);
        free(t);
    }
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    if (ngon_ix && with_cb) {
        c.index_codec.profile = FKVF_PROFILE_NGON;
        c.index_codec.alphabet = 16;
    }
    uint32_t talpha = 0;
    if (with_tok) {
        if (ngon_tok) {
            c.token_codec.profile = FKVF_PROFILE_NGON;
            c.token_codec.alphabet = talpha = 2 + fz_u8(&f) % 100u;
        } else {
            c.token_codec.profile = FKVF_PROFILE_QUAD;
            c.token_codec.symbol_bits = 2u * (1u + fz_u8(&f) % 16u);
            talpha = c.token_codec.symbol_bits == 32 ? 0 : 1u << c.token_codec.symbol_bits;
        }
    }
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.sync = FKVF_SYNC_NONE;
    uint8_t beam_byte = fz_u8(&f);
    ao.beam_width = beam_byte % 3;
    ao.block_size = 64u * (1u + fz_u8(&f) % 4u);
    ao.no_auto_compact = 1; /* the properties are about the chain of commits */
    unlink(path);
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &ao, NULL);
    FZ_CHECK(rc == FKVF_OK);
    /* the top bit of the beam's byte: the smallest queue, so that appends
     * write index segments and sink rows before their commit (fkvf.h
     * fkvf_appender_append); the properties below are the same */
    FZ_CHECK(fkvf_appender_set_queue_bytes(a, beam_byte >> 7 ? 1 : 0) == FKVF_OK);

    size_t row_elems = (size_t)d.n_layers * d.n_kv_heads * (d.key_dim + d.value_dim);
    size_t rb = row_elems * dsize(d.dtype);
    uint8_t *all = malloc(rb * MAX_N);
    uint32_t *tok = malloc(sizeof *tok * MAX_N);
    FZ_CHECK(all && tok);
    snap sn[MAX_COMMITS + 1];
    size_t ns = 0;
    take_snapshot(&sn[ns++], rb, with_tok);
    uint64_t n = 0;
    unsigned n_commits = 1 + fz_u8(&f) % MAX_COMMITS;
    for (unsigned ci = 0; ci < n_commits; ci++) {
        size_t k = fz_u8(&f) % 9;
        if (n + k > MAX_N)
            k = (size_t)(MAX_N - n);
        for (size_t i = 0; i < k * row_elems; i++)
            store_tame(d.dtype, all + n * rb + i * dsize(d.dtype),
                       (float)((int8_t)fz_u8(&f)) / 16.0f);
        for (size_t i = 0; i < k; i++) {
            uint32_t v = fz_u32(&f);
            tok[n + i] = talpha ? v % talpha : v;
        }
        FZ_CHECK(fkvf_appender_append(a, all + n * rb, k * rb, k, with_tok ? tok + n : NULL) ==
                 FKVF_OK);
        rc = fkvf_appender_commit(a);
        if (rc != FKVF_OK) {
            fprintf(stderr, "commit: %s\n", fkvf_appender_message(a));
            FZ_CHECK(rc == FKVF_OK);
        }
        n += k;
        fkvf_append_info st;
        FZ_CHECK(fkvf_appender_info(a, &st) == FKVF_OK);
        FZ_CHECK(st.n_positions == n && st.pending == 0);
        snap *s = &sn[ns++];
        take_snapshot(s, rb, with_tok);
        FZ_CHECK(s->commits == st.commit_seq);
        if (s->commits == s[-1].commits) {
            /* an empty commit writes nothing: the same file */
            FZ_CHECK(k == 0 && s->size == s[-1].size);
            free(s->rows);
            free(s->tok);
            s--;
            ns--;
        }
        FZ_CHECK(s->n == n && s->A == st.n_archived && s->size == st.file_size);
        /* exact positions hold the appended rows; archived ones their codes' decoding */
        uint64_t S = d.n_sinks < n ? d.n_sinks : n;
        FZ_CHECK(s->A == 0 || S + s->A <= n);
        FZ_CHECK(with_cb || s->A == 0);
        for (uint64_t p = 0; p < n; p++) {
            int exact = p < S || p >= S + s->A;
            if (exact) {
                FZ_CHECK(memcmp(s->rows + p * rb, all + p * rb, rb) == 0);
            } else {
                size_t cpp = fkvf_rvq_codes_per_position(q);
                uint16_t codes[64];
                uint8_t *want = malloc(rb);
                FZ_CHECK(want && cpp <= 64);
                fkvf_rope rope = {d.rope_layout, d.rope_dims, d.rope_theta};
                fkvf_rows one = {all + p * rb, 1, d.dtype, p};
                FZ_CHECK(fkvf_rvq_encode(q, &one, d.key_storage ? &rope : NULL, ao.beam_width,
                                         codes, cpp, 1) == FKVF_OK);
                FZ_CHECK(fkvf_rvq_decode(q, codes, cpp, 1, 1, p, d.key_storage ? &rope : NULL,
                                         d.dtype, want, rb) == FKVF_OK);
                FZ_CHECK(memcmp(s->rows + p * rb, want, rb) == 0);
                free(want);
            }
            if (with_tok)
                FZ_CHECK(s->tok[p] == tok[p]);
        }
    }
    fkvf_appender_free(a);

    /* damage the file: cut (mode 0) or flip one byte (mode 1) */
    uint64_t fsize = sn[ns - 1].size;
    uint8_t mode = fz_u8(&f) & 1;
    uint64_t off = fz_u64(&f) % (fsize + (mode ? 0 : 1));
    int fd = open(path, O_RDWR);
    FZ_CHECK(fd >= 0);
    if (mode == 0) {
        FZ_CHECK(ftruncate(fd, (off_t)off) == 0);
    } else {
        uint8_t b;
        FZ_CHECK(pread(fd, &b, 1, (off_t)off) == 1);
        b ^= (uint8_t)(1u << (fz_u8(&f) % 8));
        FZ_CHECK(pwrite(fd, &b, 1, (off_t)off) == 1);
    }
    close(fd);
    /* the commit a cut file must serve */
    size_t want = ns;
    for (size_t j = 0; j < ns; j++)
        if (sn[j].size <= off)
            want = j;
    fkvf_reader *r = NULL;
    rc = fkvf_reader_open_file(&r, path, FKVF_OPEN_READ, NULL);
    if (mode == 0)
        FZ_CHECK((rc == FKVF_OK) == (want < ns));
    if (rc == FKVF_OK) {
        fkvf_archive_info ai;
        fkvf_desc dd;
        FZ_CHECK(fkvf_reader_info(r, &ai) == FKVF_OK);
        size_t j = 0;
        while (j < ns && sn[j].commits != ai.n_commits)
            j++;
        FZ_CHECK(j < ns);
        const snap *s = &sn[j];
        if (mode == 0)
            FZ_CHECK(j == want);
        if (!(ai.n_positions == s->n && ai.n_archived == s->A && ai.committed_size == s->size))
            fprintf(stderr, "mode %u off %llu: commit %llu: n %llu/%llu A %llu/%llu size %llu/%llu\n",
                    mode, (unsigned long long)off, (unsigned long long)ai.n_commits,
                    (unsigned long long)ai.n_positions, (unsigned long long)s->n,
                    (unsigned long long)ai.n_archived, (unsigned long long)s->A,
                    (unsigned long long)ai.committed_size, (unsigned long long)s->size);
        FZ_CHECK(ai.n_positions == s->n && ai.n_archived == s->A && ai.committed_size == s->size);
        FZ_CHECK(fkvf_reader_desc(r, &dd) == FKVF_OK);
        check_against(r, s, rb, d.dtype, mode == 0);
    }
    fkvf_reader_free(r);
    r = NULL;
    rc = fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL);
    if (mode == 0)
        FZ_CHECK((rc == FKVF_OK) == (want < ns && sn[want].size == off));
    fkvf_reader_free(r);

    if (mode == 0 && want < ns) {
        /* recover and continue */
        const snap *s = &sn[want];
        fkvf_append_options ro = ao;
        ro.recover = 1;
        a = NULL;
        rc = fkvf_appender_open(&a, path, &ro, NULL);
        if (rc != FKVF_OK)
            fprintf(stderr, "recover: %s\n", fkvf_appender_message(a));
        FZ_CHECK(rc == FKVF_OK);
        fkvf_append_info st;
        FZ_CHECK(fkvf_appender_info(a, &st) == FKVF_OK);
        FZ_CHECK(st.n_positions == s->n && st.recovered_bytes == off - s->size &&
                 st.file_size == s->size);
        uint32_t t1 = 1;
        FZ_CHECK(fkvf_appender_append(a, all, rb, 1, with_tok ? &t1 : NULL) == FKVF_OK);
        FZ_CHECK(fkvf_appender_commit(a) == FKVF_OK);
        fkvf_appender_free(a);
        r = NULL;
        FZ_CHECK(fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL) == FKVF_OK);
        FZ_CHECK(fkvf_reader_verify(r) == FKVF_OK);
        fkvf_archive_info ai;
        FZ_CHECK(fkvf_reader_info(r, &ai) == FKVF_OK && ai.n_positions == s->n + 1);
        /* positions that stay exact keep their rows; archived ones may
         * have moved out of the window since: compare only the ones that
         * have the same status */
        uint8_t *row = malloc(rb);
        FZ_CHECK(row);
        uint64_t S = d.n_sinks < s->n ? d.n_sinks : s->n;
        for (uint64_t p = 0; p < s->n; p++) {
            int was_exact = p < S || p >= S + s->A, ex;
            FZ_CHECK(fkvf_reader_is_exact(r, p, &ex) == FKVF_OK);
            FZ_CHECK(fkvf_reader_restore(r, p, 1, d.dtype, row, rb) == FKVF_OK);
            if (was_exact == ex)
                FZ_CHECK(memcmp(row, s->rows + p * rb, rb) == 0);
        }
        free(row);
        fkvf_reader_free(r);
    }

    for (size_t j = 0; j < ns; j++) {
        free(sn[j].rows);
        free(sn[j].tok);
    }
    free(all);
    free(tok);
    fkvf_rvq_free(q);
    unlink(path);
    return 0;
}
