/* fkvf-conf-rand: seeded random valid archives from the public libfkvf
 * writer API, for comparing readers (conformance/README.md, "Second reader").
 *
 *   fkvf-conf-rand OUTDIR COUNT SEED
 *
 * Writes OUTDIR/rand_NNN.fkvf for NNN = 0 .. COUNT-1 (and, for archives that
 * refer to an external codebook, OUTDIR/rand_NNN.cb.fkvf), varying the
 * shape, dtype, profile (quad / ngon) and its parameters, sinks and window,
 * number of commits, deflate, codebook (embedded, external, none), token
 * stream, pre-RoPE keys, META, unknown optional sections and ZIDX. Prints one
 * line per archive: "NAME<TAB>CODEBOOK-or-'-'<TAB>description". Exit 0 when
 * every archive was written. */
/* the second tier of fkvf.h (not ABI-stable): fkvf_ngon_rmax */
#define FKVF_STATIC_LINKING_ONLY
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fkvf.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * UINT64_C(2685821657736338717);
}

/* uniform in [lo, hi] */
static uint32_t rint_in(uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(rnd() % ((uint64_t)hi - lo + 1));
}

static float rfloat(void)
{
    return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

/* n random finite elements of dtype into dst */
static void fill(fkvf_dtype dt, uint8_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f = rfloat();
        if (dt == FKVF_DTYPE_F32) {
            memcpy(dst + 4 * i, &f, 4);
        } else {
            uint16_t h = dt == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(f) : fkvf_f32_to_bf16(f);
            dst[2 * i] = (uint8_t)h;
            dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
}

static size_t esize(fkvf_dtype dt)
{
    return dt == FKVF_DTYPE_F32 ? 4 : 2;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "fkvf-conf-rand: out of memory\n");
        exit(2);
    }
    return p;
}

#define CHECK(call, w)                                                              \
    do {                                                                            \
        int rc_ = (call);                                                           \
        if (rc_) {                                                                  \
            fprintf(stderr, "fkvf-conf-rand: %s: %s: %s\n", name, #call,            \
                    (w) ? fkvf_writer_message(w) : fkvf_strerror(rc_));             \
            goto fail;                                                              \
        }                                                                           \
    } while (0)

/* Smallest even width holding k symbols. */
static unsigned width_for(uint32_t k)
{
    unsigned b = 2;
    while (b < 32 && (UINT64_C(1) << b) < k)
        b += 2;
    return b;
}

static int write_codebook_file(const char *path, const fkvf_codebook_shape *shape, int deflate,
                               uint8_t hash[16], const char *name)
{
    fkvf_writer *w = NULL;
    fkvf_reader *r = NULL;
    uint8_t *tables = NULL;
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    if (deflate)
        o.required_features = FKVF_FEAT_DEFLATE;
    uint64_t size = fkvf_codebook_size(shape);
    if (size < 64)
        goto fail;
    tables = xmalloc((size_t)size - 64);
    fill(shape->dtype, tables, (size_t)(size - 64) / esize(shape->dtype));
    CHECK(fkvf_writer_create_file(&w, path, &o, NULL), w);
    CHECK(fkvf_writer_add_codebooks(w, shape, tables, (size_t)size - 64,
                                    deflate ? FKVF_SECTION_DEFLATE : 0), w);
    CHECK(fkvf_writer_finish(w), w);
    fkvf_writer_free(w);
    w = NULL;
    CHECK(fkvf_reader_open_file(&r, path, FKVF_OPEN_READ, NULL), NULL);
    fkvf_codebook_shape sh;
    const void *contents;
    size_t csize;
    CHECK(fkvf_reader_codebook(r, &sh, &contents, &csize, hash), NULL);
    fkvf_reader_free(r);
    free(tables);
    return 0;
fail:
    fkvf_writer_free(w);
    fkvf_reader_free(r);
    free(tables);
    return -1;
}

static int make_one(const char *dir, unsigned idx, uint64_t seed)
{
    char name[64], path[4096], cbname[64], cbpath[4096], desc_txt[512];
    snprintf(name, sizeof name, "rand_%03u.fkvf", idx);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(cbname, sizeof cbname, "rand_%03u.cb.fkvf", idx);
    snprintf(cbpath, sizeof cbpath, "%s/%s", dir, cbname);
    rng_state = seed * UINT64_C(0x9E3779B97F4A7C15) + idx + 1;
    for (int i = 0; i < 4; i++)
        rnd();

    fkvf_writer *w = NULL;
    fkvf_reader *r = NULL;
    uint8_t *rows = NULL, *tables = NULL;
    uint16_t *codes = NULL;
    uint32_t *toks = NULL;
    void *zdata = NULL;

    /* shape */
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = rint_in(1, 3);
    d.n_kv_heads = rint_in(1, 3);
    d.key_dim = rint_in(1, 8);
    d.value_dim = rint_in(1, 8);
    d.dtype = (fkvf_dtype)rint_in(1, 3);
    if (d.key_dim >= 2 && rint_in(0, 1)) {
        d.key_transform = 1;
        d.rope_layout = (uint8_t)rint_in(1, 2);
        d.key_storage = (uint8_t)rint_in(0, 1);
        d.rope_dims = 2 * rint_in(1, d.key_dim / 2);
        d.rope_theta = rint_in(0, 1) ? 10000.0 : 500000.0;
    }
    d.n_sinks = rint_in(0, 4);
    d.window = rint_in(0, 12);
    d.model_id = "rand-model";
    d.tokenizer_id = rint_in(0, 1) ? "rand-tok" : "";

    /* codebook: 0 none, 1 embedded, 2 external */
    int cbkind = (int)rint_in(0, 2);
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.pooled = (uint8_t)rint_in(0, 1);
    cs.n_layers = d.n_layers;
    cs.n_heads = cs.pooled ? 1 : d.n_kv_heads;
    cs.key_dim = d.key_dim;
    cs.value_dim = d.value_dim;
    static const uint32_t ks_[] = {16, 32, 64, 256};
    cs.k = ks_[rint_in(0, 3)];
    cs.k_stages = (uint8_t)rint_in(0, 3);
    cs.v_stages = (uint8_t)rint_in(cs.k_stages ? 0 : 1, 3);
    cs.dtype = rint_in(0, 1) ? FKVF_DTYPE_F16 : FKVF_DTYPE_F32;
    int cb_deflate = (int)rint_in(0, 1);

    /* codecs */
    fkvf_stream_spec ispec, tspec;
    memset(&ispec, 0, sizeof ispec);
    memset(&tspec, 0, sizeof tspec);
    if (cs.k <= 64 && rint_in(0, 2) == 0) {
        ispec.profile = FKVF_PROFILE_NGON;
        ispec.alphabet = cs.k;
        ispec.r = rint_in(0, 1) ? 0.0 : 0.5 * fkvf_ngon_rmax(cs.k);
        ispec.span_symbols = rint_in(0, 1) ? 0 : rint_in(1, 4);
    } else {
        ispec.profile = FKVF_PROFILE_QUAD;
        ispec.symbol_bits = width_for(cs.k) + 2 * rint_in(0, 2);
    }
    int tokens = (int)rint_in(0, 1);
    if (rint_in(0, 3) == 0) {
        tspec.profile = FKVF_PROFILE_NGON;
        tspec.alphabet = rint_in(2, 40);
        tspec.r = 0.0;
        tspec.span_symbols = rint_in(0, 1) ? 0 : rint_in(1, 5);
    } else {
        tspec.profile = FKVF_PROFILE_QUAD;
        tspec.symbol_bits = 2 * rint_in(1, 16);
    }
    int deflate_exac = (int)rint_in(0, 2) == 0;
    unsigned n_commits = rint_in(1, 3);
    int zidx = (int)rint_in(0, 1);
    int xtra = (int)rint_in(0, 3) == 0;

    /* positions per commit: n grows, A grows; A > 0 needs a codebook */
    uint64_t n_c[3], a_c[3];
    uint64_t n = 0, a = 0;
    for (unsigned c = 0; c < n_commits; c++) {
        n += rint_in(c == 0 ? 0 : 1, 60);
        uint64_t amax = (cbkind && n > d.n_sinks) ? n - d.n_sinks : 0;
        uint64_t want = amax > d.window ? amax - d.window : 0; /* appender-like policy */
        if (rint_in(0, 3) == 0)
            want = rint_in(0, (uint32_t)amax);
        if (want < a)
            want = a;
        if (want > amax)
            want = amax;
        a = want;
        n_c[c] = n;
        a_c[c] = a;
    }
    uint64_t N = n_c[n_commits - 1], A = a_c[n_commits - 1];
    int need_index = cbkind && (A > 0 || rint_in(0, 1));

    uint64_t req = 0;
    if (ispec.profile == FKVF_PROFILE_NGON && need_index)
        req |= FKVF_FEAT_NGON;
    if (tokens && tspec.profile == FKVF_PROFILE_NGON)
        req |= FKVF_FEAT_NGON;
    if (deflate_exac || (cbkind == 1 && cb_deflate) || xtra)
        req |= FKVF_FEAT_DEFLATE;
    uint8_t hash[16];
    if (cbkind == 2) {
        req |= FKVF_FEAT_EXTERNAL_CODEBOOK;
        if (write_codebook_file(cbpath, &cs, cb_deflate, hash, name))
            goto fail;
    }

    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.required_features = req;
    o.optional_features = tokens ? FKVF_OPTFEAT_TOKEN_STREAM : 0;
    o.block_size = rint_in(0, 1) ? 64u * rint_in(1, 8) : 0;
    CHECK(fkvf_writer_create_file(&w, path, &o, NULL), w);
    CHECK(fkvf_writer_set_desc(w, &d), w);

    size_t row_bytes = (size_t)d.n_layers * d.n_kv_heads * (d.key_dim + d.value_dim) * esize(d.dtype);
    rows = xmalloc(row_bytes * (size_t)(N ? N : 1));
    fill(d.dtype, rows, row_bytes * (size_t)N / esize(d.dtype));
    size_t ncodes = (size_t)d.n_layers * d.n_kv_heads * (cs.k_stages + cs.v_stages);
    codes = xmalloc(sizeof *codes * ncodes * (size_t)(A ? A : 1));
    for (size_t i = 0; i < ncodes * A; i++)
        codes[i] = (uint16_t)(rnd() % cs.k);
    uint64_t tmax = tspec.profile == FKVF_PROFILE_NGON ? tspec.alphabet
                    : (UINT64_C(1) << tspec.symbol_bits);
    toks = xmalloc(sizeof *toks * (size_t)(N ? N : 1));
    for (size_t i = 0; i < N; i++)
        toks[i] = (uint32_t)(rnd() % tmax);

    if (cbkind == 1) {
        uint64_t size = fkvf_codebook_size(&cs);
        tables = xmalloc((size_t)size - 64);
        fill(cs.dtype, tables, (size_t)(size - 64) / esize(cs.dtype));
        CHECK(fkvf_writer_add_codebooks(w, &cs, tables, (size_t)size - 64,
                                        cb_deflate ? FKVF_SECTION_DEFLATE : 0), w);
    } else if (cbkind == 2) {
        CHECK(fkvf_writer_add_codebook_ref(w, &cs, hash, cbname), w);
    }
    uint32_t iu = fkvf_stream_spec_align(&ispec), tu = fkvf_stream_spec_align(&tspec);
    if (!iu || !tu) {
        fprintf(stderr, "fkvf-conf-rand: %s: invalid codec\n", name);
        goto fail;
    }
    uint64_t prev_n = 0, prev_a = 0;
    for (unsigned c = 0; c < n_commits; c++) {
        uint64_t nn = n_c[c], aa = a_c[c];
        if (rint_in(0, 2) == 0) {
            CHECK(fkvf_writer_meta_u64(w, "org.example.commit", c + 1), w);
            CHECK(fkvf_writer_meta_utf8(w, "org.example.text", "r\xc3\xa9sum\xc3\xa9"), w);
            CHECK(fkvf_writer_meta_f64(w, "org.example.temperature", 0.7), w);
        }
        /* exact rows: sinks and the window [S + A, n) */
        uint64_t s_end = nn < d.n_sinks ? nn : d.n_sinks;
        unsigned ef = deflate_exac && rint_in(0, 1) ? FKVF_SECTION_DEFLATE : 0;
        if (s_end)
            CHECK(fkvf_writer_add_exact(w, 0, s_end, rows, (size_t)s_end * row_bytes, ef), w);
        uint64_t w0 = aa ? d.n_sinks + aa : s_end;
        if (w0 < nn)
            CHECK(fkvf_writer_add_exact(w, w0, nn - w0, rows + (size_t)w0 * row_bytes,
                                        (size_t)(nn - w0) * row_bytes, ef), w);
        if (need_index && (c == 0 || aa > prev_a)) {
            uint64_t f = prev_a / iu * iu;
            CHECK(fkvf_writer_add_index_segment(w, &ispec, f, aa - f, codes + f * ncodes,
                                                ncodes, 1), w);
        }
        if (tokens && (c == 0 || nn > prev_n)) {
            uint64_t f = prev_n / tu * tu;
            CHECK(fkvf_writer_add_token_segment(w, &tspec, f, toks + f, (size_t)(nn - f)), w);
        }
        if (xtra && c == n_commits - 1) {
            static const char note[] = "an unknown optional section, ignored by readers";
            CHECK(fkvf_writer_add_section(w, FKVF_FOURCC('x', 'n', 'o', 't'),
                                          rint_in(0, 1) ? FKVF_SECTION_DEFLATE : 0, 7, note,
                                          sizeof note), w);
        }
        CHECK(fkvf_writer_set_positions(w, nn, aa), w);
        CHECK(fkvf_writer_commit(w), w);
        prev_n = nn;
        prev_a = aa;
    }
    CHECK(fkvf_writer_finish(w), w);
    fkvf_writer_free(w);
    w = NULL;

    snprintf(desc_txt, sizeof desc_txt,
             "L%u H%u Dk%u Dv%u dtype%d rope%u/%u/%u S%u W%u n%" PRIu64 " A%" PRIu64
             " commits%u cb%d(k%u %u+%u %s%s) idx:%s%u tok:%s%u deflate%d zidx%d xtra%d",
             d.n_layers, d.n_kv_heads, d.key_dim, d.value_dim, (int)d.dtype, d.key_transform,
             d.rope_layout, d.key_storage, d.n_sinks, d.window, N, A, n_commits, cbkind, cs.k,
             cs.k_stages, cs.v_stages, cs.pooled ? "pooled " : "",
             cs.dtype == FKVF_DTYPE_F16 ? "f16" : "f32",
             need_index ? (ispec.profile == FKVF_PROFILE_NGON ? "ngon" : "quad") : "none",
             ispec.profile == FKVF_PROFILE_NGON ? ispec.alphabet : ispec.symbol_bits,
             tokens ? (tspec.profile == FKVF_PROFILE_NGON ? "ngon" : "quad") : "none",
             tspec.profile == FKVF_PROFILE_NGON ? tspec.alphabet : tspec.symbol_bits,
             (req & FKVF_FEAT_DEFLATE) != 0, zidx, xtra);
    int zidx_done = 0;
    if (zidx) {
        size_t ns = 0;
        CHECK(fkvf_reader_open_file(&r, path, FKVF_OPEN_READ, NULL), NULL);
        CHECK(fkvf_reader_stream_count(r, &ns), NULL);
        if (ns) {
            size_t si = (size_t)rint_in(0, (uint32_t)ns - 1);
            size_t zsize = 0;
            uint64_t key = 0;
            CHECK(fkvf_search_index_build(r, si, &zdata, &zsize, &key, NULL), NULL);
            fkvf_reader_free(r);
            r = NULL;
            fkvf_section_add sec = {FKVF_SECTION_ZPOS, 0, key, zdata, zsize};
            fkvf_archive_op *op = NULL;
            if (fkvf_archive_append_sections(&op, path, &sec, 1, FKVF_SYNC_COMMIT)) {
                fkvf_error_info e;
                fkvf_archive_op_error(op, &e);
                fprintf(stderr, "fkvf-conf-rand: %s (%s): append ZPOS: %s\n", name, desc_txt,
                        e.message);
                fkvf_archive_op_free(op);
                goto fail;
            }
            fkvf_archive_op_free(op);
            zidx_done = 1;
        }
        fkvf_reader_free(r);
        r = NULL;
    }
    printf("%s\t%s\t%s%s\n", name, cbkind == 2 ? cbname : "-", desc_txt,
           zidx && !zidx_done ? " (no stream to index)" : "");
    fkvf_search_buffer_free(zdata, NULL);
    free(rows);
    free(tables);
    free(codes);
    free(toks);
    return 0;
fail:
    fkvf_writer_free(w);
    fkvf_reader_free(r);
    fkvf_search_buffer_free(zdata, NULL);
    free(rows);
    free(tables);
    free(codes);
    free(toks);
    return -1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: fkvf-conf-rand OUTDIR COUNT SEED\n");
        return 2;
    }
    unsigned count = (unsigned)strtoul(argv[2], NULL, 10);
    uint64_t seed = strtoull(argv[3], NULL, 10);
    int bad = 0;
    for (unsigned i = 0; i < count; i++)
        if (make_one(argv[1], i, seed))
            bad = 1;
    return bad;
}
