/* fkvf-conf-gen: rebuilds the FKVF conformance suite (conformance/README.md).
 *
 *   fkvf-conf-gen OUTDIR
 *
 * Writes OUTDIR/files/ (the .fkvf files) and OUTDIR/manifest.tsv. Valid files are made
 * with the public libfkvf writer API from seeded synthetic data; invalid
 * files are made from them by byte-level surgery on the spec's layouts
 * (re-sealing the checksums that must stay valid so that each file has one
 * fault). Same bytes on every run and every host. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>
#include "conf_digest.h"
#include "search/zidx_legacy.h" /* the 1.0 ZIDX builder: valid_zidx.fkvf */

static const char *outdir;
static FILE *manifest;
static int failures;

/* ---- deterministic data ------------------------------------------------ */
static uint64_t rng_state;
static uint64_t rng(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static float unitf(void) { return (float)((double)(rng() >> 40) / 16777216.0 * 2.0 - 1.0); }

/* ---- little-endian helpers -------------------------------------------- */
static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

/* ---- files -------------------------------------------------------------- */
typedef struct {
    unsigned char *p;
    size_t n;
} buf;

static char *path_of(const char *name)
{
    static char p[4096];
    snprintf(p, sizeof p, "%s/files/%s", outdir, name);
    return p;
}
static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fkvf-conf-gen: %s: %s\n", what, detail);
    exit(1);
}
static buf load(const char *name)
{
    buf b = {NULL, 0};
    FILE *f = fopen(path_of(name), "rb");
    if (!f)
        die("cannot open", name);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.n = (size_t)n;
    b.p = malloc(b.n + 1);
    if (!b.p || fread(b.p, 1, b.n, f) != b.n)
        die("cannot read", name);
    fclose(f);
    return b;
}
static void save(const char *name, const void *p, size_t n)
{
    FILE *f = fopen(path_of(name), "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f))
        die("cannot write", name);
}
static buf copy(buf b)
{
    buf c = {malloc(b.n + 1), b.n};
    if (!c.p)
        die("out of memory", "copy");
    memcpy(c.p, b.p, b.n);
    return c;
}

/* ---- manifest ----------------------------------------------------------- */
/* name verify open class clause digest codebook provenance */
static void row(const char *name, const char *verify, const char *open, const char *cls,
                const char *clause, const char *codebook, const char *prov)
{
    char digest[32] = "-";
    if (!strcmp(open, "accept") || !strcmp(verify, "accept")) {
        /* the digest of what an accepting (non-strict) reader serves */
        fkvf_reader *r = NULL, *cb = NULL;
        int rc = fkvf_reader_open_file(&r, path_of(name), FKVF_OPEN_READ, NULL);
        if (!rc && codebook[0] != '-') {
            rc = fkvf_reader_open_file(&cb, path_of(codebook), FKVF_OPEN_READ, NULL);
            if (!rc)
                rc = fkvf_reader_attach_codebook(r, cb);
        }
        uint64_t d;
        if (!rc)
            rc = conf_digest(r, &d);
        if (rc == FKVF_OK)
            snprintf(digest, sizeof digest, "%016" PRIx64, d);
        if (!rc && !strcmp(open, "accept"))
            rc = conf_decode_all(r);
        if (rc) {
            fprintf(stderr, "fkvf-conf-gen: %s: expected to decode: %s\n", name,
                    r ? fkvf_reader_message(r) : fkvf_strerror(rc));
            failures++;
        }
        fkvf_reader_free(r);
        fkvf_reader_free(cb);
    }
    fprintf(manifest, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, verify, open, cls, clause, digest,
            codebook, prov);
}
static void acc(const char *name, const char *clause, const char *prov)
{
    row(name, "accept", "accept", "-", clause, "-", prov);
}
/* rejected both by full verification and by a reader that decodes everything */
static void rej(const char *name, const char *cls, const char *clause, const char *prov)
{
    row(name, "reject", "reject", cls, clause, "-", prov);
}

/* ---- search indexes (§20) ------------------------------------------------ */

/* dst = a copy of base with one appended commit holding an index section of
 * `type` (ZIDX: the 1.0 builder; ZPOS: fkvf_search_index_build) for the
 * first and the last stream */
static void index_copy(const char *base, const char *dst, uint32_t type)
{
    buf q = load(base);
    save(dst, q.p, q.n);
    free(q.p);
    fkvf_reader *r = NULL;
    if (fkvf_reader_open_file(&r, path_of(dst), FKVF_OPEN_READ, NULL))
        die("open", dst);
    size_t ns = 0;
    fkvf_reader_stream_count(r, &ns);
    fkvf_section_add secs[2];
    void *data[2] = {NULL, NULL};
    size_t k = 0;
    for (size_t i = 0; i < ns && k < 2; i += ns - 1 ? ns - 1 : 1) {
        size_t sz;
        uint64_t key;
        int rc = type == FKVF_SECTION_ZIDX
                     ? fkvf_search_zidx_build(r, i, &data[k], &sz, &key, NULL)
                     : fkvf_search_index_build(r, i, &data[k], &sz, &key, NULL);
        if (rc)
            die("index build", fkvf_reader_message(r));
        secs[k].type = type;
        secs[k].flags = 0;
        secs[k].key = key;
        secs[k].data = data[k];
        secs[k].size = sz;
        k++;
        if (ns < 2)
            break;
    }
    fkvf_reader_free(r);
    fkvf_archive_op *op = NULL;
    if (fkvf_archive_append_sections(&op, path_of(dst), secs, k, FKVF_SYNC_NONE)) {
        fkvf_error_info e;
        fkvf_archive_op_error(op, &e);
        die("append index", e.message);
    }
    fkvf_archive_op_free(op);
    for (size_t i = 0; i < k; i++)
        fkvf_search_buffer_free(data[i], NULL);
}

/* a growing buffer as a writer's sink */
static long long membuf_write(void *o, const void *d, size_t n)
{
    buf *b = o;
    unsigned char *q = realloc(b->p, b->n + n + 1);
    if (!q)
        return -1;
    b->p = q;
    memcpy(b->p + b->n, d, n);
    b->n += n;
    return (long long)n;
}

/* A token stream of 512 positions (commit 1), its ZPOS (commit 2), then a
 * segment from 256 with other symbols and 288 more positions (commit 3):
 * the ZPOS is stale (§20.4). dup: its entry 1 repeats entry 0's position. */
static void zpos_stale(const char *name, int dup)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    o.block_size = 256;
    fkvf_writer *w = NULL;
    buf mb = {NULL, 0};
    fkvf_sink sink = {membuf_write, NULL, &mb};
    if (fkvf_writer_create_sink(&w, &sink, &o, NULL))
        die("create", name);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F16;
    uint32_t sym[800];
    unsigned x = 7;
    for (int i = 0; i < 800; i++) {
        x = x * 1103515245u + 12345u;
        sym[i] = (x >> 16) % 5; /* few symbols: many equal keys */
    }
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 8;
    static const unsigned char rows[800 * 4]; /* K and V of 1 dim, f16 zeros */
    if (fkvf_writer_set_desc(w, &d) || fkvf_writer_add_token_segment(w, &sp, 0, sym, 512) ||
        fkvf_writer_add_exact(w, 0, 512, rows, 512 * 4, 0) || fkvf_writer_set_positions(w, 512, 0) ||
        fkvf_writer_commit(w))
        die("commit 1", fkvf_writer_message(w));
    fkvf_reader *r = NULL;
    int orc = fkvf_reader_open_memory(&r, mb.p, mb.n, 0, NULL);
    if (orc)
        die("open", r ? fkvf_reader_message(r) : fkvf_strerror(orc));
    void *zd;
    size_t zs;
    uint64_t key;
    if (fkvf_search_index_build(r, 0, &zd, &zs, &key, NULL))
        die("index build", fkvf_reader_message(r));
    fkvf_reader_free(r);
    if (dup)
        memcpy((unsigned char *)zd + 68, (unsigned char *)zd + 64, 4);
    if (fkvf_writer_add_section(w, FKVF_SECTION_ZPOS, 0, key, zd, zs) || fkvf_writer_commit(w))
        die("commit 2", fkvf_writer_message(w));
    fkvf_search_buffer_free(zd, NULL);
    for (int i = 256; i < 800; i++)
        sym[i] = (sym[i] + 1) % 5;
    if (fkvf_writer_add_token_segment(w, &sp, 256, sym + 256, 800 - 256) ||
        fkvf_writer_add_exact(w, 512, 288, rows, 288 * 4, 0) ||
        fkvf_writer_set_positions(w, 800, 0) || fkvf_writer_finish(w))
        die("commit 3", fkvf_writer_message(w));
    fkvf_writer_free(w);
    save(name, mb.p, mb.n);
    free(mb.p);
}

/* ---- building valid archives with the writer -------------------------- */
typedef struct {
    unsigned L, H, KD, VD;
    fkvf_dtype dtype;
    unsigned n_pos, sinks, window;
    int codec;          /* 0 none (every position exact), 1 quad, 2 ngon */
    int cb_mode;        /* 0 embedded, 1 reference to cb_file */
    const char *cb_file;
    unsigned ks, vs, k, qbits;
    const uint8_t *lst; /* stage counts per layer (LAYER_STAGES), NULL: ks, vs */
    int pooled;
    fkvf_dtype cb_dtype;
    int rope;           /* keys archived before RoPE */
    int tokens;         /* token stream, bits */
    unsigned tok_bits;
    int meta;
    unsigned deflate;   /* FKVF_SECTION_DEFLATE on DESC-less sections we add */
    int deflate_all;    /* also for EXAC and CBK1 */
    int commits;        /* 1 or 3: commit 2 replaces META, commit 3 adds exact rows of... */
    const char *extra_type; /* an extra section of this type */
    unsigned extra_flags;
    const void *extra_data; /* its contents (NULL: a fixed text) */
    size_t extra_size;
    uint32_t block_size;
    uint64_t seed;
    const char *model_id, *tok_id; /* NULL: the defaults */
    const char *long_key;          /* an extra META key */
    unsigned metric_parts;  /* version 1.2: a CMET section (spec 13.8) with these parts, 0 none */
    unsigned metric_flags;  /* its flags (FKVF_SECTION_DEFLATE) */
    int metric_commit2;     /* archives: the CMET alone in a second commit */
} cfg;

static void cfg_init(cfg *c)
{
    memset(c, 0, sizeof *c);
    c->L = 2, c->H = 2, c->KD = 8, c->VD = 8;
    c->dtype = FKVF_DTYPE_F16;
    c->n_pos = 40, c->sinks = 2, c->window = 6;
    c->codec = 1;
    c->ks = 2, c->vs = 1, c->k = 16, c->qbits = 4;
    c->cb_dtype = FKVF_DTYPE_F16;
    c->tokens = 1, c->tok_bits = 10;
    c->meta = 1;
    c->commits = 1;
    c->seed = 1;
}

static size_t esize(fkvf_dtype d) { return d == FKVF_DTYPE_F32 ? 4 : 2; }
static void put_elem(unsigned char *p, fkvf_dtype d, float v)
{
    if (d == FKVF_DTYPE_F32) {
        uint32_t x;
        memcpy(&x, &v, 4);
        put32(p, x);
    } else if (d == FKVF_DTYPE_BF16) {
        put16(p, fkvf_f32_to_bf16(v));
    } else {
        put16(p, fkvf_f32_to_f16(v));
    }
}

static void wfail(fkvf_writer *w, int rc, const char *what)
{
    fprintf(stderr, "fkvf-conf-gen: %s: %s\n", what,
            w && *fkvf_writer_message(w) ? fkvf_writer_message(w) : fkvf_strerror(rc));
    exit(1);
}
#define W(call, what)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_)                                                                                   \
            wfail(w, rc_, what);                                                               \
    } while (0)

static fkvf_codebook_shape cb_shape(const cfg *c)
{
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.n_layers = c->L;
    cs.n_heads = c->pooled ? 1 : c->H;
    cs.key_dim = c->KD;
    cs.value_dim = c->VD;
    cs.k = c->k;
    cs.k_stages = (uint8_t)c->ks;
    cs.v_stages = (uint8_t)c->vs;
    cs.dtype = c->cb_dtype;
    cs.pooled = (uint8_t)c->pooled;
    cs.layer_stages = c->lst;
    return cs;
}
/* centroid tables in spec 13.2 order (the generator only needs the size) */
static unsigned char *cb_tables(const cfg *c, size_t *size)
{
    fkvf_codebook_shape cs = cb_shape(c);
    uint64_t total = fkvf_codebook_size(&cs);
    if (total < 64)
        die("codebook", "bad shape");
    *size = (size_t)(total - fkvf_codebook_tables_offset(&cs));
    size_t e = esize(c->cb_dtype);
    unsigned char *t = malloc(*size);
    if (!t)
        die("out of memory", "codebook");
    for (size_t i = 0; i + e <= *size; i += e)
        put_elem(t + i, c->cb_dtype, unitf() * 0.5f);
    return t;
}

/* ---- encoder metric (CMET, version 1.2, spec 13.8) ------------------------ */
/* optional_features bit 1 (spec 3.4) */
#define GEN_OPTFEAT_ENCODER_METRIC (UINT64_C(1) << 1)

/* The CMET of a codebook of shape cs whose content hash is hash: the 64-byte
 * header, then per layer and codebook head MK (parts bit 0) and MV (bit 1),
 * f32 row-major, each M = A A^T / n + I / 2 with A from a generator of its own
 * (seed), so symmetric (M(j, i) copied from M(i, j)) and positive definite
 * (smallest eigenvalue >= 1/2). extra: that many zero bytes appended (or,
 * when negative, removed). */
static unsigned char *cmet_bytes(const fkvf_codebook_shape *cs, const uint8_t hash[16],
                                 unsigned parts, uint64_t seed, long extra, size_t *size)
{
    uint64_t per = (uint64_t)((parts & 1) ? cs->key_dim * cs->key_dim : 0) +
                   ((parts & 2) ? cs->value_dim * cs->value_dim : 0);
    size_t n = (size_t)(64 + (uint64_t)cs->n_layers * cs->n_heads * per * 4);
    unsigned char *p = calloc(1, n + (extra > 0 ? (size_t)extra : 0) + 1);
    if (!p || cs->key_dim > 64 || cs->value_dim > 64)
        die("cmet_bytes", "out of memory or dimensions above 64");
    memcpy(p, hash, 16);
    put32(p + 16, cs->n_layers);
    put32(p + 20, cs->n_heads);
    put32(p + 24, cs->key_dim);
    put32(p + 28, cs->value_dim);
    p[32] = (unsigned char)parts;
    p[33] = 3; /* f32 */
    uint64_t saved = rng_state;
    rng_state = seed;
    size_t o = 64;
    for (uint32_t l = 0; l < cs->n_layers; l++)
        for (uint32_t h = 0; h < cs->n_heads; h++)
            for (unsigned part = 0; part < 2; part++) {
                if (!(parts & (1u << part)))
                    continue;
                unsigned d = part ? cs->value_dim : cs->key_dim;
                double a[64 * 64];
                for (unsigned i = 0; i < d * d; i++)
                    a[i] = unitf();
                for (unsigned i = 0; i < d; i++)
                    for (unsigned j = i; j < d; j++) {
                        double m = i == j ? 0.5 : 0.0;
                        for (unsigned q = 0; q < d; q++)
                            m += a[i * d + q] * a[j * d + q] / d;
                        float f = (float)m;
                        uint32_t x;
                        memcpy(&x, &f, 4);
                        put32(p + o + 4 * (i * d + j), x);
                        put32(p + o + 4 * (j * d + i), x);
                    }
                o += (size_t)d * d * 4;
            }
    rng_state = saved;
    *size = extra < 0 ? n - (size_t)-extra : n + (size_t)extra;
    return p;
}

/* offset, within a CMET of shape cs and parts, of matrix part (0 MK, 1 MV) of
 * layer l, codebook head h (spec 13.8) */
static size_t cmet_matrix(const fkvf_codebook_shape *cs, unsigned parts, uint32_t l, uint32_t h,
                          unsigned part)
{
    size_t kk = (parts & 1) ? (size_t)cs->key_dim * cs->key_dim : 0;
    size_t vv = (parts & 2) ? (size_t)cs->value_dim * cs->value_dim : 0;
    return 64 + 4 * (((size_t)l * cs->n_heads + h) * (kk + vv) + (part ? kk : 0));
}

/* the content hash (spec 13.3) of the CBK1 the writer makes of shape cs and
 * tables t: a codebook file written to memory and read back */
static void cb_hash(const fkvf_codebook_shape *cs, const unsigned char *t, size_t tn,
                    uint8_t hash[16])
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    if (cs->layer_stages)
        o.required_features |= FKVF_FEAT_LAYER_STAGES;
    fkvf_writer *w = NULL;
    buf mb = {NULL, 0};
    fkvf_sink sink = {membuf_write, NULL, &mb};
    W(fkvf_writer_create_sink(&w, &sink, &o, NULL), "cb_hash");
    W(fkvf_writer_add_codebooks(w, cs, t, tn, 0), "cb_hash codebooks");
    W(fkvf_writer_finish(w), "cb_hash");
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    fkvf_codebook_shape rs;
    const void *cc = NULL;
    size_t cn = 0;
    uint8_t h2[16];
    if (fkvf_reader_open_memory(&r, mb.p, mb.n, 0, NULL) ||
        fkvf_reader_codebook(r, &rs, &cc, &cn, hash))
        die("cb_hash", "cannot read the codebook back");
    fkvf_codebook_hash(cc, cn, h2); /* the public hash over the contents: the same */
    if (memcmp(h2, hash, 16))
        die("cb_hash", "fkvf_codebook_hash differs from the reader's hash");
    fkvf_reader_free(r);
    free(mb.p);
}

/* the CMET (as cmet_bytes) of the codebook of file b (an archive with an
 * embedded codebook, or a codebook file); *shape (may be NULL): its shape */
static unsigned char *cmet_of(const buf *b, unsigned parts, uint64_t seed, long extra,
                              size_t *size, fkvf_codebook_shape *shape)
{
    fkvf_reader *r = NULL;
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    const void *cc;
    size_t cn;
    uint8_t h[16] = {0};
    if (fkvf_reader_open_memory(&r, b->p, b->n, 0, NULL) ||
        fkvf_reader_codebook(r, &cs, &cc, &cn, h))
        die("cmet_of", "no codebook");
    fkvf_reader_free(r);
    cs.layer_stages = NULL; /* owned by the reader */
    if (shape)
        *shape = cs;
    return cmet_bytes(&cs, h, parts, seed, extra, size);
}

/* sets optional_features bit 1 (ENCODER_METRIC, spec 3.4) of a written file
 * and the format_minor 2 that goes with it (spec 1.3.1; header re-sealed;
 * nothing changes when the writer set them already) */
static void set_metric_bit(const char *name)
{
    buf b = load(name);
    put64(b.p + 32, get64(b.p + 32) | GEN_OPTFEAT_ENCODER_METRIC);
    b.p[12] = 2;
    b.p[13] = 0;
    put64(b.p + 56, XXH3_64bits_withSeed(b.p, 56, 0));
    save(name, b.p, b.n);
    free(b.p);
}
/* the writer option, where libfkvf knows the bit (it refuses unknown bits) */
static void metric_option(fkvf_writer_options *o)
{
#ifdef FKVF_OPTFEAT_ENCODER_METRIC
    o->optional_features |= FKVF_OPTFEAT_ENCODER_METRIC;
#else
    (void)o;
#endif
}

/* a codebook file (spec 13.4), with a CMET when c->metric_parts */
static void build_codebook_file(const char *name, const cfg *c)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    if (c->lst)
        o.required_features |= FKVF_FEAT_LAYER_STAGES;
    if (c->metric_parts) {
        metric_option(&o);
        if (c->metric_flags & FKVF_SECTION_DEFLATE)
            o.required_features |= FKVF_FEAT_DEFLATE;
    }
    fkvf_writer *w = NULL;
    W(fkvf_writer_create_file(&w, path_of(name), &o, NULL), name);
    rng_state = c->seed;
    size_t n;
    unsigned char *t = cb_tables(c, &n);
    fkvf_codebook_shape cs = cb_shape(c);
    W(fkvf_writer_add_codebooks(w, &cs, t, n, 0), "codebooks");
    if (c->metric_parts) {
        uint8_t h[16];
        size_t mn;
        cb_hash(&cs, t, n, h);
        unsigned char *m = cmet_bytes(&cs, h, c->metric_parts, c->seed + 1000, 0, &mn);
        W(fkvf_writer_add_section(w, FKVF_FOURCC('C', 'M', 'E', 'T'), c->metric_flags, 0, m, mn),
          "CMET");
        free(m);
    }
    free(t);
    W(fkvf_writer_finish(w), name);
    fkvf_writer_free(w);
    if (c->metric_parts)
        set_metric_bit(name);
}

static void build(const char *name, const cfg *c)
{
    rng_state = c->seed;
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = c->block_size;
    if (c->tokens)
        o.optional_features |= FKVF_OPTFEAT_TOKEN_STREAM;
    if (c->codec == 2)
        o.required_features |= FKVF_FEAT_NGON;
    if (c->deflate)
        o.required_features |= FKVF_FEAT_DEFLATE;
    if (c->codec && c->cb_mode == 1)
        o.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    if (c->lst)
        o.required_features |= FKVF_FEAT_LAYER_STAGES;
    if (c->metric_parts)
        metric_option(&o);
    fkvf_writer *w = NULL;
    W(fkvf_writer_create_file(&w, path_of(name), &o, NULL), name);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = c->L;
    d.n_kv_heads = c->H;
    d.key_dim = c->KD;
    d.value_dim = c->VD;
    d.dtype = c->dtype;
    if (c->rope) {
        d.key_transform = 1;
        d.rope_layout = (uint8_t)c->rope; /* 1 interleaved, 2 half-split */
        d.key_storage = 1;
        d.rope_dims = c->KD;
        d.rope_theta = 10000.0;
    }
    d.n_sinks = c->sinks;
    d.window = c->window;
    d.model_id = c->model_id ? c->model_id : "fkvf-conformance synthetic";
    d.tokenizer_id = c->tok_id ? c->tok_id : c->tokens ? "synthetic-1024" : "";
    W(fkvf_writer_set_desc(w, &d), "descriptor");

    /* which positions are exact: [0, S) and [n - W, n), or all when the
     * codec is none or the window covers the cache (spec 14.3) */
    unsigned n = c->n_pos;
    unsigned s = c->sinks < n ? c->sinks : n;
    unsigned tail = c->window < n - s ? c->window : n - s;
    unsigned n_arch = c->codec ? n - s - tail : 0;
    if (!c->codec)
        s = n, tail = 0;
    size_t row = (size_t)c->L * c->H * (c->KD + c->VD) * esize(c->dtype);
    unsigned char *rows = calloc(1, (size_t)n * row + 1); /* n may be 0 */
    if (!rows)
        die("out of memory", "rows");
    for (size_t i = 0; i + esize(c->dtype) <= (size_t)n * row; i += esize(c->dtype))
        put_elem(rows + i, c->dtype, unitf() * 2.0f);
    unsigned xf = c->deflate_all ? c->deflate : 0;
    if (s)
        W(fkvf_writer_add_exact(w, 0, s, rows, (size_t)s * row, xf), "exact rows");
    unsigned char *metric = NULL; /* the CMET (spec 13.8), when c->metric_parts */
    size_t metric_n = 0;
    if (c->codec) {
        if (c->cb_mode == 0) {
            size_t tn;
            unsigned char *t = cb_tables(c, &tn);
            fkvf_codebook_shape cs = cb_shape(c);
            W(fkvf_writer_add_codebooks(w, &cs, t, tn, xf), "codebooks");
            if (c->metric_parts) {
                uint8_t h[16];
                cb_hash(&cs, t, tn, h);
                metric = cmet_bytes(&cs, h, c->metric_parts, c->seed + 1000, 0, &metric_n);
            }
            free(t);
            if (metric && !c->metric_commit2)
                W(fkvf_writer_add_section(w, FKVF_FOURCC('C', 'M', 'E', 'T'), c->metric_flags, 0,
                                          metric, metric_n),
                  "CMET");
        } else {
            fkvf_reader *cr = NULL;
            if (fkvf_reader_open_file(&cr, path_of(c->cb_file), 0, NULL))
                die("cannot open codebook file", c->cb_file);
            fkvf_codebook_shape cs;
            const void *cc;
            size_t cn;
            uint8_t h[16];
            if (fkvf_reader_codebook(cr, &cs, &cc, &cn, h))
                die("not a codebook file", c->cb_file);
            W(fkvf_writer_add_codebook_ref(w, &cs, h, c->cb_file), "codebook ref");
            fkvf_reader_free(cr);
        }
        fkvf_codebook_shape ics = cb_shape(c);
        size_t n_idx = (size_t)fkvf_index_stream_count(&ics, c->H);
        uint16_t *codes = malloc((n_idx * n_arch + 1) * sizeof *codes);
        if (!codes)
            die("out of memory", "codes");
        for (size_t i = 0; i < n_idx * n_arch; i++)
            codes[i] = (uint16_t)(rng() % c->k);
        fkvf_stream_spec sp;
        memset(&sp, 0, sizeof sp);
        if (c->codec == 2) {
            sp.profile = FKVF_PROFILE_NGON;
            sp.alphabet = c->k;
        } else {
            sp.profile = FKVF_PROFILE_QUAD;
            sp.symbol_bits = c->qbits;
        }
        W(fkvf_writer_add_index_segment(w, &sp, 0, n_arch, codes, 1, n_arch), "index streams");
        free(codes);
    }
    if (tail)
        W(fkvf_writer_add_exact(w, n - tail, tail, rows + (size_t)(n - tail) * row,
                                (size_t)tail * row, xf),
          "exact rows");
    free(rows);
    if (c->tokens) {
        uint32_t *tok = malloc((n + 1) * sizeof *tok);
        if (!tok)
            die("out of memory", "tokens");
        for (unsigned t = 0; t < n; t++)
            tok[t] = (uint32_t)(rng() % (1u << (c->tok_bits > 20 ? 20 : c->tok_bits)));
        if (c->tok_bits == 32 && n)
            tok[n - 1] = UINT32_C(0xFFFFFFFF);
        fkvf_stream_spec ts;
        memset(&ts, 0, sizeof ts);
        ts.profile = FKVF_PROFILE_QUAD;
        ts.symbol_bits = c->tok_bits;
        W(fkvf_writer_add_token_segment(w, &ts, 0, tok, n), "token stream");
        free(tok);
    }
    if (c->meta) {
        W(fkvf_writer_meta_utf8(w, "conformance.generator", "fkvf-conf-gen"), "meta");
        W(fkvf_writer_meta_u64(w, "conformance.seed", c->seed), "meta");
        W(fkvf_writer_meta_i64(w, "conformance.i64", -5), "meta");
        W(fkvf_writer_meta_f64(w, "conformance.f64", 0.25), "meta");
        W(fkvf_writer_meta_bool(w, "conformance.bool", 1), "meta");
        W(fkvf_writer_meta_bytes(w, "conformance.bytes", "\x00\x01\x02", 3), "meta");
        if (c->long_key)
            W(fkvf_writer_meta_utf8(w, c->long_key, "a key of 255 bytes"), "meta");
    }
    if (c->extra_type) {
        static const char payload[] = "an extension section a v1.0 reader does not know";
        W(fkvf_writer_add_section(w, FKVF_FOURCC(c->extra_type[0], c->extra_type[1],
                                                 c->extra_type[2], c->extra_type[3]),
                                  c->extra_flags, 0, c->extra_data ? c->extra_data : payload,
                                  c->extra_data ? c->extra_size : sizeof payload),
          "extra section");
    }
    W(fkvf_writer_set_positions(w, n, n_arch), "positions");
    if (c->commits > 1) {
        W(fkvf_writer_commit(w), "commit 1");
        /* commit 2: replacement metadata (spec 9.3) */
        W(fkvf_writer_meta_utf8(w, "conformance.generator", "fkvf-conf-gen commit 2"), "meta");
        W(fkvf_writer_set_positions(w, n, n_arch), "positions");
        W(fkvf_writer_commit(w), "commit 2");
        /* commit 3: an optional section of an unknown type and more metadata */
        static const char note[] = "commit 3";
        W(fkvf_writer_add_section(w, FKVF_FOURCC('X', 'N', 'O', 'T'), 0, 0, note, sizeof note),
          "note");
        W(fkvf_writer_meta_u64(w, "conformance.commit", 3), "meta");
        W(fkvf_writer_set_positions(w, n, n_arch), "positions");
    }
    if (metric && c->metric_commit2) {
        /* the metric added later, alone in commit 2 (spec 13.8: one per chain) */
        W(fkvf_writer_commit(w), "commit 1");
        W(fkvf_writer_add_section(w, FKVF_FOURCC('C', 'M', 'E', 'T'), c->metric_flags, 0, metric,
                                  metric_n),
          "CMET");
        W(fkvf_writer_set_positions(w, n, n_arch), "positions");
    }
    free(metric);
    W(fkvf_writer_finish(w), name);
    fkvf_writer_free(w);
    if (c->metric_parts)
        set_metric_bit(name);
}

/* ---- surgery ------------------------------------------------------------ */
static uint64_t h64(const buf *b, uint64_t off, uint64_t n)
{
    return XXH3_64bits_withSeed(b->p + off, (size_t)n, off);
}
static void reseal_header(buf *b) { put64(b->p + 56, XXH3_64bits_withSeed(b->p, 56, 0)); }
static void reseal_trailer(buf *b, uint64_t T) { put64(b->p + T + 56, h64(b, T, 56)); }
/* directory checksum of the commit whose trailer is at T, then the trailer */
static void reseal_dir(buf *b, uint64_t T)
{
    uint64_t off = get64(b->p + T + 16), size = get64(b->p + T + 24);
    put64(b->p + T + 32, h64(b, off, size));
    reseal_trailer(b, T);
}
static uint64_t last_trailer(const buf *b) { return b->n - 64; }
static uint64_t prev_trailer(const buf *b, uint64_t T) { return get64(b->p + T + 40); }
/* absolute offset of the nth (0-based) entry of type in the directory of the
 * commit at T; dies when absent */
static uint64_t entry(const buf *b, uint64_t T, const char *type, int nth)
{
    uint64_t d = get64(b->p + T + 16);
    uint32_t count = get32(b->p + d + 4);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t e = d + 64 + 64 * (uint64_t)i;
        if (!memcmp(b->p + e, type, 4) && nth-- == 0)
            return e;
    }
    die("no such section", type);
    return 0;
}
static uint64_t sec_off(const buf *b, uint64_t e) { return get64(b->p + e + 8); }
static uint64_t sec_size(const buf *b, uint64_t e) { return get64(b->p + e + 16); }
static void reseal_section(buf *b, uint64_t e)
{
    put64(b->p + e + 40, h64(b, sec_off(b, e), sec_size(b, e)));
}
/* STRM: segment header checksum and every block checksum (spec 11.2-11.4) */
static uint64_t strm_data_off(const buf *b, uint64_t e, uint64_t *data_bytes, uint64_t *n_blocks)
{
    const unsigned char *h = b->p + sec_off(b, e);
    uint64_t count = get64(h + 24), bs = get32(h + 36), ns = get32(h + 48), sb;
    if (h[8] == 1)
        sb = (count * h[9] + 127) / 128 * 16;
    else
        sb = (count + get32(h + 32) - 1) / get32(h + 32) * 16;
    *data_bytes = ns * sb;
    *n_blocks = (*data_bytes + bs - 1) / bs;
    return (64 + 8 * *n_blocks + 63) / 64 * 64;
}
static void reseal_strm(buf *b, uint64_t e)
{
    uint64_t off = sec_off(b, e), db, nb;
    put64(b->p + off + 56, h64(b, off, 56));
    uint64_t doff = strm_data_off(b, e, &db, &nb), bs = get32(b->p + off + 36);
    for (uint64_t i = 0; i < nb; i++) {
        uint64_t start = off + doff + i * bs, len = db - i * bs < bs ? db - i * bs : bs;
        put64(b->p + off + 64 + 8 * i, h64(b, start, len));
    }
    reseal_section(b, e);
}
static void cut(const char *name, buf b, size_t n) { save(name, b.p, n < b.n ? n : b.n); }

/* a section one byte shorter than its fields require (the freed byte zeroed,
 * section and directory re-sealed) */
static void trunc_section(const char *base, const char *type, const char *clause,
                          const char *open)
{
    buf b = load(base);
    uint64_t T = last_trailer(&b), e = entry(&b, T, type, 0), off = sec_off(&b, e);
    uint64_t sz = sec_size(&b, e);
    b.p[off + sz - 1] = 0;
    put64(b.p + e + 16, sz - 1);
    put64(b.p + e + 24, sz - 1);
    reseal_section(&b, e);
    reseal_dir(&b, T);
    char name[64], prov[256];
    snprintf(name, sizeof name, "trunc_section_%s.fkvf", type);
    snprintf(prov, sizeof prov,
             "%s with the %s entry's stored_size = size = size - 1 (the freed byte zeroed); "
             "section and directory re-sealed", base, type);
    save(name, b.p, b.n);
    free(b.p);
    row(name, "reject", open, "TRUNCATED", clause, "-", prov);
}

/* ---- appending commits byte by byte --------------------------------------- */
static uint64_t align64(uint64_t x) { return (x + 63) / 64 * 64; }

/* a section for append_commit */
typedef struct {
    const char *type;
    uint32_t flags;
    uint64_t key;
    const unsigned char *data; /* stored bytes; never inside the buf appended to */
    size_t size;
} new_sec;

/* the first section of `type` in the last commit of b, as it is stored (not
 * deflated), to be appended elsewhere; b must outlive the result */
static new_sec sec_of(const buf *b, const char *type)
{
    uint64_t e = entry(b, last_trailer(b), type, 0);
    if (get32(b->p + e + 4) & FKVF_SECTION_DEFLATE)
        die("sec_of: deflated", type);
    new_sec s = {type, get32(b->p + e + 4), get64(b->p + e + 32), b->p + sec_off(b, e),
                 (size_t)sec_size(b, e)};
    return s;
}

/* Appends to b (whose last commit is complete) one commit holding the n
 * sections s, tiled as spec 4.1 lays them out, with the n_positions and
 * n_archived of the previous commit; every checksum sealed (STRM: segment
 * header and blocks too). As a writer appends, but with sections a writer
 * would refuse (known types, copies, faults made afterwards). */
static void append_commit(buf *b, const new_sec *s, size_t n)
{
    uint64_t Tp = last_trailer(b), dp = get64(b->p + Tp + 16), seq = get64(b->p + Tp + 8) + 1;
    uint64_t off[4], end = b->n;
    if (n > 4 || b->n % 64)
        die("append_commit", "too many sections or a torn file");
    for (size_t i = 0; i < n; i++) {
        off[i] = align64(end);
        end = off[i] + s[i].size;
    }
    uint64_t d = align64(end), T = d + 64 + 64 * (uint64_t)n;
    unsigned char *p = realloc(b->p, T + 64 + 1);
    if (!p)
        die("out of memory", "append_commit");
    memset(p + b->n, 0, T + 64 - b->n);
    for (size_t i = 0; i < n; i++)
        memcpy(p + off[i], s[i].data, s[i].size);
    /* directory (spec 5.1) */
    memcpy(p + d, "DIRC", 4);
    put32(p + d + 4, (uint32_t)n);
    put64(p + d + 8, seq);
    put64(p + d + 16, get64(p + dp + 16));
    put64(p + d + 24, get64(p + dp + 24));
    for (size_t i = 0; i < n; i++) {
        unsigned char *e = p + d + 64 + 64 * i;
        memcpy(e, s[i].type, 4);
        put32(e + 4, s[i].flags);
        put64(e + 8, off[i]);
        put64(e + 16, s[i].size);
        put64(e + 24, s[i].size);
        put64(e + 32, s[i].key);
    }
    /* trailer (spec 6) */
    memcpy(p + T, "\x89" "FKVTRL\n", 8);
    put64(p + T + 8, seq);
    put64(p + T + 16, d);
    put64(p + T + 24, 64 + 64 * (uint64_t)n);
    put64(p + T + 40, Tp);
    put64(p + T + 48, T + 64);
    b->p = p;
    b->n = T + 64;
    for (size_t i = 0; i < n; i++) {
        uint64_t e = d + 64 + 64 * i;
        if (!memcmp(s[i].type, "STRM", 4))
            reseal_strm(b, e);
        else
            reseal_section(b, e);
    }
    reseal_dir(b, T);
}

/* base + one commit holding two copies of base's index segment (its first
 * STRM, group 0): both start at symbol 0, so the second cuts the first away
 * whole (spec 11.6) and no commit serves a symbol of the first. *first: the
 * entry of the first copy, for the caller to damage and re-seal. */
static buf cut_away_pair(const buf *base, uint64_t *first)
{
    new_sec s = sec_of(base, "STRM");
    if (s.key != 0)
        die("cut_away_pair", "the first STRM is not the index group");
    new_sec two[2] = {s, s};
    buf b = copy(*base);
    append_commit(&b, two, 2);
    *first = entry(&b, last_trailer(&b), "STRM", 0);
    return b;
}

/* ---- codebook values ------------------------------------------------------ */
/* The first symbol of b's first index stream (L0.H0.K.0, quad): the row of
 * the first key table that restoring position n_sinks reads (spec 13.6). */
static unsigned first_index_symbol(const buf *b)
{
    uint64_t e = entry(b, last_trailer(b), "STRM", 0), db, nb;
    const unsigned char *h = b->p + sec_off(b, e);
    if (get64(h) != 0 || h[8] != 1 || h[9] > 8 || get64(h + 24) == 0)
        die("first_index_symbol", "no quad index stream of 8 bits or fewer");
    return b->p[sec_off(b, e) + strm_data_off(b, e, &db, &nb)] & ((1u << h[9]) - 1);
}
/* Element 0 of row c of the first key table K[0][0][0] (spec 13.2) of the
 * f16 CBK1 in the last commit of b set to the bits v; CBK1 and directory
 * re-sealed. */
static void cbk1_set_value(buf *b, unsigned c, uint16_t v)
{
    uint64_t T = last_trailer(b), e = entry(b, T, "CBK1", 0), off = sec_off(b, e);
    if (b->p[off + 22] != FKVF_DTYPE_F16 || b->p[off + 20] == 0 || c >= get32(b->p + off + 16))
        die("cbk1_set_value", "not an f16 CBK1 with key stages");
    put16(b->p + off + 64 + (uint64_t)c * get32(b->p + off + 8) * 2, v);
    reseal_section(b, e);
    reseal_dir(b, T);
}

/* name = base with the size of its first deflated `type` section (last
 * commit) set to 1032 x stored_size + 65, one more than spec 4.4 allows;
 * directory re-sealed */
static void deflate_over_ratio(const buf *base, const char *type, const char *name)
{
    buf b = copy(*base);
    uint64_t T = last_trailer(&b), e = entry(&b, T, type, 0);
    put64(b.p + e + 24, sec_size(&b, e) * 1032 + 65);
    reseal_dir(&b, T);
    save(name, b.p, b.n);
    free(b.p);
}

/* ---- the suite ---------------------------------------------------------- */
int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fkvf-conf-gen OUTDIR\n");
        return 2;
    }
    outdir = argv[1];
    char mp[4096];
    snprintf(mp, sizeof mp, "%s/files", outdir);
    mkdir(outdir, 0777);
    mkdir(mp, 0777);
    snprintf(mp, sizeof mp, "%s/manifest.tsv", outdir);
    manifest = fopen(mp, "wb");
    if (!manifest)
        die("cannot write", mp);
    fprintf(manifest, "name\tverify\topen\tclass\tclause\tdigest\tcodebook\tprovenance\n");
    cfg c;

    /* == valid files ==================================================== */
    cfg_init(&c);
    c.rope = 1;
    build("valid_quad_f16_rope.fkvf", &c);
    acc("valid_quad_f16_rope.fkvf", "§1.3",
        "writer: quad 4-bit index streams, embedded f16 CBK1 (k=16, 2+1 stages), keys archived "
        "before interleaved RoPE, f16 EXAC sinks+window, 10-bit token stream, META of every type");

    cfg_init(&c);
    c.codec = 2;
    c.rope = 2;
    c.seed = 2;
    build("valid_ngon_f16.fkvf", &c);
    acc("valid_ngon_f16.fkvf", "§12.2",
        "writer: ngon N=16 index streams (r = r_N, L = L_max) with VTXS, half-split RoPE pre-rope "
        "keys, embedded codebook, token stream");

    cfg_init(&c);
    c.dtype = FKVF_DTYPE_F32;
    c.cb_dtype = FKVF_DTYPE_F32;
    c.seed = 3;
    c.KD = 4;
    c.VD = 12;
    build("valid_quad_f32.fkvf", &c);
    acc("valid_quad_f32.fkvf", "§8, §14.2",
        "writer: f32 cache and f32 codebook, key_dim 4 != value_dim 12, no RoPE");

    cfg_init(&c);
    c.dtype = FKVF_DTYPE_BF16;
    c.seed = 4;
    c.pooled = 1;
    c.k = 64;
    c.qbits = 6;
    c.ks = 3;
    c.vs = 2;
    build("valid_quad_bf16_pooled.fkvf", &c);
    acc("valid_quad_bf16_pooled.fkvf", "§13.1",
        "writer: bf16 cache, pooled codebook (one per layer), k=64, 6-bit quad symbols");

    cfg_init(&c);
    c.seed = 5;
    c.deflate = FKVF_SECTION_DEFLATE;
    c.deflate_all = 1;
    c.extra_type = "XDFL";
    c.extra_flags = FKVF_SECTION_DEFLATE;
    build("valid_deflate.fkvf", &c);
    acc("valid_deflate.fkvf", "§4.4",
        "writer: DEFLATE feature; EXAC, CBK1 and an unknown optional section stored deflated");

    cfg_init(&c);
    c.seed = 6;
    c.commits = 3;
    build("valid_multicommit3.fkvf", &c);
    acc("valid_multicommit3.fkvf", "§7.1, §7.3, §9.3",
        "writer: 3 commits (2: replacement META; 3: META + unknown optional section XNOT)");

    cfg_init(&c);
    c.seed = 7;
    build_codebook_file("valid_codebook_file.fkvf", &c);
    acc("valid_codebook_file.fkvf", "§13.4",
        "writer: a codebook file (CBK1 only, no DESC); digest = XXH3-64 of the CBK1 contents");
    c.cb_mode = 1;
    c.cb_file = "valid_codebook_file.fkvf";
    c.seed = 8;
    build("valid_cbrf.fkvf", &c);
    row("valid_cbrf.fkvf", "accept", "accept", "-", "§13.5", "valid_codebook_file.fkvf",
        "writer: CBRF reference (EXTERNAL_CODEBOOK) to valid_codebook_file.fkvf");

    /* version 1.1: stage counts per layer (LAYER_STAGES, spec 13.1) */
    static const uint8_t lst4[8] = {2, 1, 0, 1, 0, 0, 1, 2};
    cfg_init(&c);
    c.seed = 20;
    c.L = 4;
    c.ks = 2;
    c.vs = 2;
    c.lst = lst4;
    c.rope = 1;
    build("valid_layer_stages.fkvf", &c);
    acc("valid_layer_stages.fkvf", "§11.2, §13.1, §13.2",
        "writer: LAYER_STAGES (format 1.1), embedded codebook of 4 layers with (2, 1), (0, 1), "
        "(0, 0), (1, 2) key and value stages (14 index streams), keys pre-RoPE, token stream");
    cfg_init(&c);
    c.seed = 21;
    c.L = 4;
    c.ks = 2;
    c.vs = 2;
    c.lst = lst4;
    build_codebook_file("valid_layer_stages_codebook_file.fkvf", &c);
    acc("valid_layer_stages_codebook_file.fkvf", "§13.1, §13.4",
        "writer: a codebook file with a layer table (LAYER_STAGES)");
    c.cb_mode = 1;
    c.cb_file = "valid_layer_stages_codebook_file.fkvf";
    c.seed = 22;
    build("valid_layer_stages_cbrf.fkvf", &c);
    row("valid_layer_stages_cbrf.fkvf", "accept", "accept", "-", "§11.2, §13.5",
        "valid_layer_stages_codebook_file.fkvf",
        "writer: CBRF reference to valid_layer_stages_codebook_file.fkvf (LAYER_STAGES, "
        "EXTERNAL_CODEBOOK)");

    cfg_init(&c);
    c.seed = 9;
    c.tok_bits = 32;
    c.block_size = 64;
    build("valid_tokens32_block64.fkvf", &c);
    acc("valid_tokens32_block64.fkvf", "§11.3, §11.4",
        "writer: 32-bit token stream (last id 0xFFFFFFFF), block_size 64 (many blocks)");

    cfg_init(&c);
    c.n_pos = 0;
    c.seed = 10;
    build("edge_no_positions.fkvf", &c);
    acc("edge_no_positions.fkvf", "§5.1", "writer: n_positions = 0, codebook, empty streams");

    cfg_init(&c);
    c.n_pos = 1;
    c.seed = 11;
    build("edge_one_position.fkvf", &c);
    acc("edge_one_position.fkvf", "§14.3", "writer: one position (a sink)");

    cfg_init(&c);
    c.codec = 0;
    c.n_pos = 12;
    c.seed = 12;
    build("edge_window_only.fkvf", &c);
    acc("edge_window_only.fkvf", "§14.3", "writer: every position exact, no codebook, no index streams");

    cfg_init(&c);
    c.n_pos = 5;
    c.window = 32;
    c.seed = 13;
    build("edge_window_gt_cache.fkvf", &c);
    acc("edge_window_gt_cache.fkvf", "§14.3",
        "writer: window 32 > 5 positions: all exact although a codebook is present");

    cfg_init(&c);
    c.tokens = 0;
    c.meta = 0;
    c.seed = 14;
    build("edge_no_tokens_no_meta.fkvf", &c);
    acc("edge_no_tokens_no_meta.fkvf", "§11.8", "writer: no token stream, no META");

    {
        static char mid[4097], tid[4097], key[256];
        memset(mid, 'm', 4096);
        memset(tid, 't', 4096);
        memset(key, 'k', 255);
        cfg_init(&c);
        c.seed = 19;
        c.model_id = mid;
        c.tok_id = tid;
        c.long_key = key;
        build("edge_max_strings.fkvf", &c);
        acc("edge_max_strings.fkvf", "§8, §9.1, §15",
            "writer: model_id and tokenizer_id of 4096 bytes (the limit), a META key of 255 bytes");
        buf b = load("edge_max_strings.fkvf");
        uint64_t T = last_trailer(&b), e = entry(&b, T, "DESC", 0), off = sec_off(&b, e);
        put32(b.p + off + 40, 4097);
        put32(b.p + off + 44, 4095);
        reseal_section(&b, e);
        reseal_dir(&b, T);
        save("limit_model_id_len.fkvf", b.p, b.n);
        rej("limit_model_id_len.fkvf", "LIMIT", "§8.2, §15",
            "edge_max_strings with model_id_len 4097, tokenizer_id_len 4095 (sizes still add up); "
            "DESC and directory re-sealed");
        free(b.p);
    }
    cfg_init(&c);
    c.seed = 20;
    c.L = 1, c.H = 1, c.KD = 2, c.VD = 2;
    c.ks = 16, c.vs = 16;
    c.n_pos = 20;
    build("edge_max_stages.fkvf", &c);
    acc("edge_max_stages.fkvf", "§13.1", "writer: k_stages = v_stages = 16 (the maximum), k = 16");
    cfg_init(&c);
    c.seed = 21;
    c.L = 1, c.H = 1, c.KD = 1, c.VD = 1;
    c.ks = 1, c.vs = 1, c.k = 4096, c.qbits = 12;
    c.n_pos = 30;
    build("edge_k4096.fkvf", &c);
    acc("edge_k4096.fkvf", "§13.1", "writer: k = 4096 (the maximum), 12-bit quad symbols, dims 1");
    {
        /* an archive grown by the appender: 4 commits */
        cfg_init(&c);
        c.seed = 22;
        rng_state = c.seed;
        size_t tn;
        unsigned char *t = cb_tables(&c, &tn);
        fkvf_codebook_shape cs = cb_shape(&c);
        fkvf_rvq *q = NULL;
        if (fkvf_rvq_from_tables(&q, &cs, c.H, t, tn, NULL))
            die("rvq", "from tables");
        free(t);
        fkvf_desc d;
        memset(&d, 0, sizeof d);
        d.n_layers = c.L, d.n_kv_heads = c.H, d.key_dim = c.KD, d.value_dim = c.VD;
        d.dtype = FKVF_DTYPE_F16;
        d.key_transform = 1, d.rope_layout = 1, d.key_storage = 1, d.rope_dims = c.KD;
        d.rope_theta = 10000.0;
        d.n_sinks = 2, d.window = 6;
        d.model_id = "fkvf-conformance appender";
        fkvf_append_create ac;
        memset(&ac, 0, sizeof ac);
        ac.desc = &d;
        ac.codebook = q;
        ac.token_codec.profile = FKVF_PROFILE_QUAD;
        ac.token_codec.symbol_bits = 10;
        fkvf_append_options ao;
        fkvf_append_options_init(&ao);
        ao.sync = FKVF_SYNC_NONE;
        ao.no_auto_compact = 1; /* the file is about its 4 commits */
        remove(path_of("valid_appender_4commits.fkvf"));
        fkvf_appender *a = NULL;
        if (fkvf_appender_create(&a, path_of("valid_appender_4commits.fkvf"), &ac, &ao, NULL))
            die("appender", a ? fkvf_appender_message(a) : "create");
        size_t rowb = (size_t)c.L * c.H * (c.KD + c.VD) * 2;
        static const unsigned counts[3] = {10, 15, 20};
        for (int k = 0; k < 3; k++) {
            unsigned char rows[20 * 128];
            if (counts[k] * rowb > sizeof rows)
                die("appender", "row buffer");
            uint32_t tok[20];
            for (size_t i = 0; i < counts[k] * rowb; i += 2)
                put16(rows + i, fkvf_f32_to_f16(unitf()));
            for (unsigned i = 0; i < counts[k]; i++)
                tok[i] = (uint32_t)(rng() % 1024);
            if (fkvf_appender_append(a, rows, counts[k] * rowb, counts[k], tok) ||
                fkvf_appender_commit(a))
                die("appender", fkvf_appender_message(a));
        }
        fkvf_appender_free(a);
        fkvf_rvq_free(q);
        acc("valid_appender_4commits.fkvf", "§7.6, §14.3",
            "fkvf_appender: create (commit 1, empty), then 10, 15 and 20 positions (sinks 2, "
            "window 6, keys pre-RoPE), RVQ-encoded with a synthetic codebook");
    }

    /* ZIDX (1.0) and ZPOS (§20.7): one commit appended to a copy of a file */
    index_copy("valid_quad_f16_rope.fkvf", "valid_zidx.fkvf", FKVF_SECTION_ZIDX);
    acc("valid_zidx.fkvf", "§20",
        "valid_quad_f16_rope + fkvf_archive_append_sections: commit 2 with ZIDX of the first "
        "and last stream");
    index_copy("valid_quad_f16_rope.fkvf", "valid_zpos.fkvf", FKVF_SECTION_ZPOS);
    acc("valid_zpos.fkvf", "§20.7",
        "valid_quad_f16_rope + fkvf_archive_append_sections: commit 2 with ZPOS (positions "
        "only) of the first and last stream (quad 4-bit index, 10-bit tokens)");
    index_copy("valid_ngon_f16.fkvf", "valid_zpos_ngon.fkvf", FKVF_SECTION_ZPOS);
    acc("valid_zpos_ngon.fkvf", "§20.7",
        "valid_ngon_f16 + commit 2 with ZPOS of the first (ngon N=16) and last (token) stream");
    zpos_stale("valid_zpos_stale.fkvf", 0);
    acc("valid_zpos_stale.fkvf", "§20.4, §20.7",
        "writer: token stream (quad 8-bit) of 512 positions, commit 2 a ZPOS of it, commit 3 a "
        "token segment from 256 with other symbols and 288 more: the ZPOS is stale (ignored; "
        "its order no longer holds)");

    /* from the future */
    {
        buf b = load("valid_multicommit3.fkvf");
        put16(b.p + 12, 7);                 /* format_minor 7 */
        put64(b.p + 32, UINT64_C(0x8000000000000021)); /* unknown optional bits */
        reseal_header(&b);
        save("future_minor_optional.fkvf", b.p, b.n);
        acc("future_minor_optional.fkvf", "§3.2, §17.2",
            "valid_multicommit3 (has unknown optional section XNOT) with format_minor 7 and "
            "unknown optional_features bits 5 and 63; header re-sealed");
        put64(b.p + 24, UINT64_C(1) << 9);  /* unknown required bit */
        reseal_header(&b);
        save("future_required_bit.fkvf", b.p, b.n);
        rej("future_required_bit.fkvf", "FEATURE", "§3.1 step 8, §3.4",
            "future_minor_optional with required_features bit 9; header re-sealed");
        free(b.p);
        cfg_init(&c);
        c.seed = 15;
        c.extra_type = "XREQ";
        c.extra_flags = FKVF_SECTION_REQUIRED;
        build("future_required_section.fkvf", &c);
        rej("future_required_section.fkvf", "SECTION", "§4.3",
            "writer: an unknown section type XREQ with REQUIRED set");
        cfg_init(&c);
        c.seed = 16;
        c.extra_type = "XOPT";
        build("future_optional_section.fkvf", &c);
        acc("future_optional_section.fkvf", "§4.3",
            "writer: an unknown section type XOPT without REQUIRED (ignored)");
    }

    /* == invalid files ================================================== */
    buf q = load("valid_quad_f16_rope.fkvf");
    uint64_t T = last_trailer(&q);
    buf b;

    /* header (§3.1) */
    save("hdr_empty.fkvf", "", 0);
    rej("hdr_empty.fkvf", "TRUNCATED", "§3.1 step 2", "empty file");
    {
        static const char text[] = "PK\x03\x04 not an fkvf file\n";
        save("hdr_not_fkvf.fkvf", text, sizeof text - 1);
    }
    rej("hdr_not_fkvf.fkvf", "BAD_MAGIC", "§3.1 step 1", "22 bytes: PK 03 04 and text");
    b = copy(q);
    b.p[1] = 'G';
    save("hdr_bad_magic.fkvf", b.p, b.n);
    rej("hdr_bad_magic.fkvf", "BAD_MAGIC", "§3.1 step 1", "valid_quad_f16_rope, magic byte 1 'F' -> 'G'");
    b.p[1] = 'F';
    b.p[5] = '\n';
    save("hdr_magic_crlf.fkvf", b.p, b.n);
    rej("hdr_magic_crlf.fkvf", "BAD_MAGIC", "§3.1 step 1",
        "valid_quad_f16_rope, magic CR (byte 5) -> LF as a line-ending conversion would");
    free(b.p);
    cut("hdr_truncated_40.fkvf", q, 40);
    rej("hdr_truncated_40.fkvf", "TRUNCATED", "§3.1 step 2", "first 40 bytes of valid_quad_f16_rope");
    cut("hdr_truncated_5.fkvf", q, 5);
    rej("hdr_truncated_5.fkvf", "TRUNCATED", "§3.1 step 2", "first 5 bytes (a magic prefix)");
    b = copy(q);
    put16(b.p + 10, 2);
    reseal_header(&b);
    save("hdr_major_2.fkvf", b.p, b.n);
    rej("hdr_major_2.fkvf", "VERSION", "§3.1 step 3, §17.1", "format_major 2; header re-sealed");
    free(b.p);
    b = copy(q);
    put16(b.p + 10, 0x100);
    put16(b.p + 12, 0);
    b.p[16] = 0x0A, b.p[17] = 0x0B, b.p[18] = 0x0C, b.p[19] = 0x0D;
    reseal_header(&b);
    save("hdr_big_endian.fkvf", b.p, b.n);
    rej("hdr_big_endian.fkvf", "VERSION", "§3.1 note",
        "major and byte_order written big-endian: major reads 256 (VERSION before BYTE_ORDER)");
    free(b.p);
    b = copy(q);
    b.p[16] = 0x0A, b.p[17] = 0x0B, b.p[18] = 0x0C, b.p[19] = 0x0D;
    reseal_header(&b);
    save("hdr_byte_order.fkvf", b.p, b.n);
    rej("hdr_byte_order.fkvf", "BYTE_ORDER", "§3.1 step 4", "byte_order bytes 0A 0B 0C 0D; re-sealed");
    free(b.p);
    b = copy(q);
    b.p[56] ^= 1;
    save("hdr_checksum.fkvf", b.p, b.n);
    rej("hdr_checksum.fkvf", "CHECKSUM", "§3.1 step 5", "header_checksum bit 0 flipped");
    free(b.p);
    b = copy(q);
    put16(b.p + 14, 128);
    reseal_header(&b);
    save("hdr_size_128.fkvf", b.p, b.n);
    rej("hdr_size_128.fkvf", "CORRUPT", "§3.1 step 6", "header_size 128; re-sealed");
    free(b.p);
    b = copy(q);
    b.p[44] = 1;
    reseal_header(&b);
    save("hdr_reserved.fkvf", b.p, b.n);
    rej("hdr_reserved.fkvf", "CORRUPT", "§3.1 step 7", "header reserved byte 44 = 1; re-sealed");
    free(b.p);
    b = copy(q);
    put64(b.p + 24, get64(b.p + 24) | (UINT64_C(1) << 4));
    reseal_header(&b);
    save("hdr_feature_bit4.fkvf", b.p, b.n);
    rej("hdr_feature_bit4.fkvf", "FEATURE", "§3.1 step 8, §3.4",
        "required_features bit 4 (the first bit version 1.1 leaves reserved); re-sealed");
    free(b.p);
    /* bit 3 (LAYER_STAGES, version 1.1) declared and not used: valid (§3.3) */
    b = copy(q);
    put64(b.p + 24, get64(b.p + 24) | (UINT64_C(1) << 3));
    reseal_header(&b);
    save("hdr_feature_bit3_unused.fkvf", b.p, b.n);
    acc("hdr_feature_bit3_unused.fkvf", "§3.3, §3.4",
        "valid_quad_f16_rope with required_features bit 3 (LAYER_STAGES) and a codebook without "
        "a layer table; re-sealed");
    free(b.p);

    /* open / truncation (§7.2) */
    cut("trunc_128.fkvf", q, 128);
    rej("trunc_128.fkvf", "TRUNCATED", "§7.2", "first 128 bytes (< 192)");
    {
        uint64_t e0 = entry(&q, T, "DESC", 0), d = get64(q.p + T + 16);
        cut("trunc_in_first_section.fkvf", q, sec_off(&q, e0) + 10);
        rej("trunc_in_first_section.fkvf", "TRUNCATED", "§7.2", "cut 10 bytes into the first section");
        cut("trunc_at_directory.fkvf", q, d);
        rej("trunc_at_directory.fkvf", "TRUNCATED", "§7.2",
            "cut where the directory starts (a multiple of 64, last slot without trailer magic)");
        cut("trunc_in_directory.fkvf", q, d + 70);
        rej("trunc_in_directory.fkvf", "TRUNCATED", "§7.2", "cut 70 bytes into the directory");
        cut("trunc_at_trailer.fkvf", q, T);
        rej("trunc_at_trailer.fkvf", "TRUNCATED", "§7.2", "the trailer removed");
        cut("trunc_in_trailer.fkvf", q, T + 32);
        rej("trunc_in_trailer.fkvf", "TRUNCATED", "§7.2", "cut 32 bytes into the trailer");
        cut("trunc_last_byte.fkvf", q, q.n - 1);
        rej("trunc_last_byte.fkvf", "TRUNCATED", "§7.2", "the last byte removed");
    }

    /* trailer (§6.2) */
    b = copy(q);
    b.p[T + 60] ^= 0x40;
    save("trl_checksum.fkvf", b.p, b.n);
    rej("trl_checksum.fkvf", "CHECKSUM", "§6.2 step 2, §7.2 rule 4", "trailer_checksum flipped");
    free(b.p);
    b = copy(q);
    put64(b.p + T + 48, T + 128);
    reseal_trailer(&b, T);
    save("trl_file_size.fkvf", b.p, b.n);
    rej("trl_file_size.fkvf", "CORRUPT", "§6.2 step 3", "trailer file_size + 64; re-sealed");
    free(b.p);
    b = copy(q);
    put64(b.p + T + 8, 0);
    reseal_trailer(&b, T);
    save("trl_seq_zero.fkvf", b.p, b.n);
    rej("trl_seq_zero.fkvf", "CORRUPT", "§6.2 step 4", "trailer commit_seq 0; re-sealed");
    free(b.p);
    b = copy(q);
    put64(b.p + T + 8, (UINT64_C(1) << 24) + 1);
    reseal_trailer(&b, T);
    save("limit_commit_seq.fkvf", b.p, b.n);
    rej("limit_commit_seq.fkvf", "LIMIT", "§6.2 step 4, §15", "trailer commit_seq 2^24+1; re-sealed");
    free(b.p);
    b = copy(q);
    put64(b.p + T + 16, get64(b.p + T + 16) + 8);
    reseal_trailer(&b, T);
    save("align_dir_offset.fkvf", b.p, b.n);
    rej("align_dir_offset.fkvf", "ALIGN", "§6.2 step 5", "trailer dir_offset + 8; re-sealed");
    free(b.p);
    b = copy(q);
    put64(b.p + T + 16, get64(b.p + T + 16) - 64);
    reseal_trailer(&b, T);
    save("bounds_dir_offset.fkvf", b.p, b.n);
    rej("bounds_dir_offset.fkvf", "BOUNDS", "§6.2 step 6",
        "trailer dir_offset - 64 (directory does not end at the trailer); re-sealed");
    free(b.p);
    b = copy(q);
    put64(b.p + T + 40, 64);
    reseal_trailer(&b, T);
    save("chain_prev_in_commit1.fkvf", b.p, b.n);
    rej("chain_prev_in_commit1.fkvf", "CHAIN", "§6.2 step 7",
        "commit 1's trailer prev_trailer = 64 (must be 0); re-sealed");
    free(b.p);
    b = copy(q);
    b.p[get64(q.p + T + 16) + 20] ^= 1;
    save("dir_checksum.fkvf", b.p, b.n);
    rej("dir_checksum.fkvf", "CHECKSUM", "§6.2 step 9", "a directory byte (n_positions) flipped");
    free(b.p);
    {
        uint64_t d = get64(q.p + T + 16);
        b = copy(q);
        b.p[d] = 'X';
        reseal_dir(&b, T);
        save("dir_magic.fkvf", b.p, b.n);
        rej("dir_magic.fkvf", "CORRUPT", "§5.3", "directory magic XIRC; re-sealed");
        free(b.p);
        b = copy(q);
        put64(b.p + d + 8, 2);
        reseal_dir(&b, T);
        save("chain_dir_seq.fkvf", b.p, b.n);
        rej("chain_dir_seq.fkvf", "CHAIN", "§5.3",
            "directory commit_seq 2 != trailer commit_seq 1; re-sealed");
        free(b.p);
        b = copy(q);
        put32(b.p + d + 4, (UINT32_C(1) << 20) + 1);
        reseal_dir(&b, T);
        save("limit_entry_count.fkvf", b.p, b.n);
        rej("limit_entry_count.fkvf", "LIMIT", "§5.3, §6.2 step 10, §15",
            "directory entry_count 2^20 + 1 (checked before dir_size, §5.3 order); re-sealed");
        free(b.p);
        b = copy(q);
        put64(b.p + d + 24, get64(b.p + d + 16) + 1);
        reseal_dir(&b, T);
        save("dir_archived_gt_positions.fkvf", b.p, b.n);
        rej("dir_archived_gt_positions.fkvf", "CORRUPT", "§5.3", "n_archived = n_positions + 1; re-sealed");
        free(b.p);
    }

    /* directory entries (§4.2-§4.5) */
    {
        uint64_t e = entry(&q, T, "EXAC", 0);
        b = copy(q);
        put64(b.p + e + 8, sec_off(&q, e) + 16);
        reseal_dir(&b, T);
        save("align_section.fkvf", b.p, b.n);
        rej("align_section.fkvf", "ALIGN", "§4.1, §4.2", "EXAC entry offset + 16; re-sealed");
        free(b.p);
        uint64_t e1 = entry(&q, T, "CBK1", 0);
        b = copy(q);
        put64(b.p + e1 + 8, sec_off(&q, e));
        reseal_dir(&b, T);
        save("overlap_sections.fkvf", b.p, b.n);
        rej("overlap_sections.fkvf", "OVERLAP", "§4.5",
            "CBK1 entry offset = the preceding EXAC's offset; re-sealed");
        free(b.p);
        b = copy(q);
        put64(b.p + e + 8, 0);
        reseal_dir(&b, T);
        save("bounds_section_before_region.fkvf", b.p, b.n);
        rej("bounds_section_before_region.fkvf", "BOUNDS", "§4.5",
            "EXAC entry offset 0 (inside the header); re-sealed");
        free(b.p);
        uint64_t em = entry(&q, T, "META", 0);
        b = copy(q);
        put64(b.p + em + 8, get64(q.p + T + 16));
        reseal_dir(&b, T);
        save("bounds_section_past_dir.fkvf", b.p, b.n);
        rej("bounds_section_past_dir.fkvf", "BOUNDS", "§4.5",
            "META entry offset = dir_offset (ends inside the directory); re-sealed");
        free(b.p);
        b = copy(q);
        b.p[e + 6] = 1;
        reseal_dir(&b, T);
        save("entry_flags.fkvf", b.p, b.n);
        rej("entry_flags.fkvf", "CORRUPT", "§4.2", "EXAC entry flags bit 16; re-sealed");
        free(b.p);
        b = copy(q);
        memcpy(b.p + em, "DIRC", 4);
        reseal_dir(&b, T);
        save("entry_type_dirc.fkvf", b.p, b.n);
        rej("entry_type_dirc.fkvf", "CORRUPT", "§4.2", "META entry type DIRC; re-sealed");
        free(b.p);
        b = copy(q);
        put32(b.p + e + 4, get32(b.p + e + 4) | FKVF_SECTION_DEFLATE);
        reseal_dir(&b, T);
        save("deflate_flag_without_feature.fkvf", b.p, b.n);
        rej("deflate_flag_without_feature.fkvf", "CORRUPT", "§3.3, §4.2",
            "EXAC entry DEFLATE flag while the header's DEFLATE bit is clear; re-sealed");
        free(b.p);
        b = copy(q);
        put64(b.p + e + 24, sec_size(&q, e) + 64);
        reseal_dir(&b, T);
        save("entry_size_mismatch.fkvf", b.p, b.n);
        rej("entry_size_mismatch.fkvf", "CORRUPT", "§4.2", "EXAC size != stored_size without DEFLATE");
        free(b.p);
        b = copy(q);
        put64(b.p + e + 16, (UINT64_C(1) << 48) + 64);
        put64(b.p + e + 24, (UINT64_C(1) << 48) + 64);
        reseal_dir(&b, T);
        save("limit_section_size.fkvf", b.p, b.n);
        rej("limit_section_size.fkvf", "LIMIT", "§4.2, §15", "EXAC stored_size = size = 2^48 + 64");
        free(b.p);
        b = copy(q);
        uint64_t es = entry(&q, T, "STRM", 0);
        put32(b.p + es + 4, get32(b.p + es + 4) & ~FKVF_SECTION_REQUIRED);
        reseal_dir(&b, T);
        save("strm_not_required.fkvf", b.p, b.n);
        row("strm_not_required.fkvf", "reject", "either", "CORRUPT", "§4.3",
            "-", "STRM entry without REQUIRED (full verification rejects; readers process it)");
        free(b.p);
    }

    /* padding (§4.1) */
    {
        /* the gap after the last section before the directory */
        uint64_t d = get64(q.p + T + 16), last = 0;
        uint32_t cnt = get32(q.p + d + 4);
        for (uint32_t i = 0; i < cnt; i++) {
            uint64_t e = d + 64 + 64 * (uint64_t)i;
            if (sec_off(&q, e) + sec_size(&q, e) > last)
                last = sec_off(&q, e) + sec_size(&q, e);
        }
        if (last == d)
            die("padding", "no gap before the directory");
        b = copy(q);
        b.p[d - 1] = 0x55;
        save("padding_before_directory.fkvf", b.p, b.n);
        row("padding_before_directory.fkvf", "reject", "either", "PADDING", "§4.1",
            "-", "last padding byte before the directory = 0x55 (no checksum covers it)");
        free(b.p);
        /* inside STRM: the padding between the block table and the data */
        uint64_t e = entry(&q, T, "STRM", 0), db, nb;
        uint64_t doff = strm_data_off(&q, e, &db, &nb);
        if (64 + 8 * nb < doff) {
            b = copy(q);
            b.p[sec_off(&q, e) + doff - 1] = 1;
            reseal_section(&b, e);
            reseal_dir(&b, T);
            save("padding_strm_table.fkvf", b.p, b.n);
            row("padding_strm_table.fkvf", "reject", "either", "PADDING", "§11.3",
                "-", "STRM padding byte before the data = 1; section checksum re-sealed");
            free(b.p);
        }
        /* unused bits of the token stream's last span: the token STRM (key 1) */
        uint64_t et = entry(&q, T, "STRM", 1);
        if (get64(q.p + et + 32) != 1)
            die("padding", "second STRM is not the token group");
        uint64_t off = sec_off(&q, et);
        doff = strm_data_off(&q, et, &db, &nb);
        /* 40 symbols of 10 bits = 400 bits; the 4 spans hold 512 */
        b = copy(q);
        b.p[off + doff + db - 1] |= 0x80;
        reseal_strm(&b, et);
        reseal_dir(&b, T);
        save("padding_unused_bits.fkvf", b.p, b.n);
        row("padding_unused_bits.fkvf", "reject", "either", "PADDING", "§11.7",
            "-", "token stream's last unused bit set; block and section checksums re-sealed");
        free(b.p);
    }

    /* checksum per section kind (§4.6, §11.2, §11.4) */
    {
        static const char *kinds[] = {"DESC", "META", "CBK1", "EXAC"};
        for (int i = 0; i < 4; i++) {
            uint64_t e = entry(&q, T, kinds[i], 0);
            char name[64], prov[128];
            snprintf(name, sizeof name, "checksum_%s.fkvf", kinds[i]);
            snprintf(prov, sizeof prov, "one byte of the %s section flipped", kinds[i]);
            b = copy(q);
            b.p[sec_off(&q, e) + sec_size(&q, e) / 2] ^= 0x10;
            save(name, b.p, b.n);
            row(name, "reject", strcmp(kinds[i], "META") ? "reject" : "either", "CHECKSUM",
                "§4.6", "-", prov);
            free(b.p);
        }
        uint64_t e = entry(&q, T, "STRM", 0), db, nb, off = sec_off(&q, e);
        uint64_t doff = strm_data_off(&q, e, &db, &nb);
        b = copy(q);
        b.p[off + 20] ^= 1;
        save("checksum_STRM_header.fkvf", b.p, b.n);
        rej("checksum_STRM_header.fkvf", "CHECKSUM", "§11.2 step 2",
            "a byte of the index segment header flipped");
        free(b.p);
        b = copy(q);
        b.p[off + doff + 3] ^= 0x01;
        save("checksum_STRM_block.fkvf", b.p, b.n);
        rej("checksum_STRM_block.fkvf", "CHECKSUM", "§11.4", "a data byte of block 0 flipped");
        free(b.p);
        b = copy(q);
        b.p[off + doff + 3] ^= 0x01;
        put64(b.p + off + 64, h64(&b, off + doff, db < 4096 ? db : 4096));
        save("checksum_STRM_section.fkvf", b.p, b.n);
        row("checksum_STRM_section.fkvf", "reject", "either", "CHECKSUM", "§4.6",
            "-", "a data byte flipped and its block checksum re-sealed: only the whole-section "
            "checksum catches it (the symbol changes)");
        free(b.p);

        buf n = load("valid_ngon_f16.fkvf");
        uint64_t Tn = last_trailer(&n), ev = entry(&n, Tn, "VTXS", 0);
        b = copy(n);
        b.p[sec_off(&n, ev) + 70] ^= 0x01;
        save("checksum_VTXS.fkvf", b.p, b.n);
        rej("checksum_VTXS.fkvf", "CHECKSUM", "§4.6", "one byte of the VTXS section flipped");
        free(b.p);
        /* ngon span that does not decode: anchor x of span 0 = NaN */
        e = entry(&n, Tn, "STRM", 0);
        off = sec_off(&n, e);
        doff = strm_data_off(&n, e, &db, &nb);
        b = copy(n);
        memset(b.p + off + doff, 0xFF, 8);
        reseal_strm(&b, e);
        reseal_dir(&b, Tn);
        save("span_nan_anchor.fkvf", b.p, b.n);
        rej("span_nan_anchor.fkvf", "SPAN", "§12.2.5",
            "valid_ngon_f16, first span's anchor x = NaN bits; checksums re-sealed");
        free(b.p);
        b = copy(n);
        b.p[off + doff + 1] ^= 0x01; /* a low mantissa bit of anchor x */
        reseal_strm(&b, e);
        reseal_dir(&b, Tn);
        save("span_not_canonical.fkvf", b.p, b.n);
        rej("span_not_canonical.fkvf", "SPAN", "§12.2.5",
            "valid_ngon_f16, bit 8 of the first span's anchor x flipped (does not re-encode to "
            "itself); checksums re-sealed");
        free(b.p);
        /* the NaN anchor of span_nan_anchor in a segment no commit serves:
         * full verification checks every span, the access path need not */
        uint64_t ec2;
        b = cut_away_pair(&n, &ec2);
        memset(b.p + sec_off(&b, ec2) + doff, 0xFF, 8);
        reseal_strm(&b, ec2);
        reseal_dir(&b, last_trailer(&b));
        save("span_in_cutaway_segment.fkvf", b.p, b.n);
        row("span_in_cutaway_segment.fkvf", "reject", "either", "SPAN", "§11.6, §12.2.5", "-",
            "valid_ngon_f16 + commit 2 with two copies of its index segment (both from symbol "
            "0, so the second cuts the first away whole), the first's first anchor x = NaN "
            "bits; re-sealed");
        free(b.p);
        /* span_symbols one above L_max(r) = 16 (the stream size does not change) */
        b = copy(n);
        put32(b.p + off + 32, get32(n.p + off + 32) + 1);
        uint64_t db2, nb2;
        if (strm_data_off(&b, e, &db2, &nb2) != doff || db2 != db)
            die("ngon_span_above_max", "the segment size changed");
        reseal_strm(&b, e);
        reseal_dir(&b, Tn);
        save("ngon_span_above_max.fkvf", b.p, b.n);
        rej("ngon_span_above_max.fkvf", "CORRUPT", "§11.2, §12.2.2",
            "valid_ngon_f16 with the index segment's span_symbols L = 17 > L_max(r) = 16 (2 "
            "spans per stream either way); re-sealed");
        free(b.p);
        /* a vertex table no stream uses is still checked (§10.2) */
        b = copy(q);
        new_sec vt = sec_of(&n, "VTXS");
        append_commit(&b, &vt, 1);
        uint64_t Tv = last_trailer(&b), ev2 = entry(&b, Tv, "VTXS", 0);
        put64(b.p + sec_off(&b, ev2) + 8 + 16 * 3, UINT64_C(0x4000000000000000)); /* 2.0 */
        reseal_section(&b, ev2);
        reseal_dir(&b, Tv);
        save("vtxs_unused_bad_values.fkvf", b.p, b.n);
        row("vtxs_unused_bad_values.fkvf", "reject", "either", "CORRUPT", "§7.5, §10.2", "-",
            "valid_quad_f16_rope (no ngon stream) + commit 2 with valid_ngon_f16's VTXS (N = 16) "
            "whose Vx(3) = 2.0 (off the unit circle); re-sealed");
        free(b.p);
        free(n.p);

        buf df = load("valid_deflate.fkvf");
        uint64_t Td = last_trailer(&df), ec = entry(&df, Td, "CBK1", 0);
        b = copy(df);
        b.p[sec_off(&df, ec) + sec_size(&df, ec) / 2] ^= 0x08;
        save("checksum_deflated_CBK1.fkvf", b.p, b.n);
        rej("checksum_deflated_CBK1.fkvf", "CHECKSUM", "§4.4, §4.6",
            "a stored (compressed) byte of the deflated CBK1 flipped");
        reseal_section(&b, ec);
        reseal_dir(&b, Td);
        save("deflate_bad_stream.fkvf", b.p, b.n);
        rej("deflate_bad_stream.fkvf", "DEFLATE", "§4.4",
            "as checksum_deflated_CBK1 with the section checksum re-sealed (zlib/Adler-32 fails)");
        free(b.p);
        deflate_over_ratio(&df, "CBK1", "limit_deflate_ratio.fkvf");
        rej("limit_deflate_ratio.fkvf", "LIMIT", "§4.4",
            "deflated CBK1 size = 1032 * stored_size + 65; re-sealed");
        b = copy(df);
        put64(b.p + ec + 24, get64(df.p + ec + 24) + 1);
        reseal_dir(&b, Td);
        save("deflate_size_short.fkvf", b.p, b.n);
        rej("deflate_size_short.fkvf", "DEFLATE", "§4.4",
            "deflated CBK1 size + 1 (the stream ends before size bytes); re-sealed");
        free(b.p);
        uint64_t ex = entry(&df, Td, "EXAC", 0);
        b = copy(df);
        b.p[sec_off(&df, ex) + 3] ^= 0x20;
        save("checksum_deflated_EXAC.fkvf", b.p, b.n);
        rej("checksum_deflated_EXAC.fkvf", "CHECKSUM", "§4.6", "a stored byte of a deflated EXAC flipped");
        free(b.p);
        free(df.p);

        buf z = load("valid_zidx.fkvf");
        uint64_t Tz = last_trailer(&z), ez = entry(&z, Tz, "ZIDX", 0);
        b = copy(z);
        b.p[sec_off(&z, ez) + sec_size(&z, ez) - 1] ^= 0x01;
        save("checksum_ZIDX.fkvf", b.p, b.n);
        row("checksum_ZIDX.fkvf", "reject", "either", "CHECKSUM", "§4.6, §20",
            "-", "last byte of the first ZIDX section flipped (the digest does not use ZIDX)");
        free(b.p);
        free(z.p);

        buf r = load("valid_cbrf.fkvf");
        uint64_t Tr = last_trailer(&r), er = entry(&r, Tr, "CBRF", 0);
        b = copy(r);
        b.p[sec_off(&r, er) + 3] ^= 0x01;
        save("checksum_CBRF.fkvf", b.p, b.n);
        row("checksum_CBRF.fkvf", "reject", "reject", "CHECKSUM", "§4.6",
            "valid_codebook_file.fkvf", "a byte of the CBRF content hash flipped");
        reseal_section(&b, er);
        reseal_dir(&b, Tr);
        save("codebook_hash_mismatch.fkvf", b.p, b.n);
        row("codebook_hash_mismatch.fkvf", "reject", "reject", "CODEBOOK", "§13.5",
            "valid_codebook_file.fkvf",
            "CBRF content hash changed (re-sealed): the given codebook file does not match");
        free(b.p);
        free(r.p);
    }

    /* section contents */
    {
        /* duplicate metadata keys */
        /* two keys of the same length; the second renamed to the first */
        fkvf_writer_options o;
        fkvf_writer_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        fkvf_writer *w = NULL;
        W(fkvf_writer_create_file(&w, path_of("dup_key_meta.fkvf"), &o, NULL), "dup");
        fkvf_desc d;
        memset(&d, 0, sizeof d);
        d.n_layers = 1, d.n_kv_heads = 1, d.key_dim = 4, d.value_dim = 4;
        d.dtype = FKVF_DTYPE_F16;
        W(fkvf_writer_set_desc(w, &d), "desc");
        unsigned char rows2[2 * 16];
        for (int i = 0; i < 16; i++)
            put16(rows2 + 2 * i, fkvf_f32_to_f16((float)i / 8.0f));
        W(fkvf_writer_add_exact(w, 0, 2, rows2, sizeof rows2, 0), "exact");
        W(fkvf_writer_meta_u64(w, "dupkey.a", 1), "meta");
        W(fkvf_writer_meta_u64(w, "dupkey.b", 2), "meta");
        W(fkvf_writer_set_positions(w, 2, 0), "positions");
        W(fkvf_writer_finish(w), "dup");
        fkvf_writer_free(w);
        b = load("dup_key_meta.fkvf");
        uint64_t Tk = last_trailer(&b), e = entry(&b, Tk, "META", 0), off = sec_off(&b, e);
        int found = 0;
        for (uint64_t i = off; i + 8 <= off + sec_size(&b, e); i++)
            if (!memcmp(b.p + i, "dupkey.b", 8)) {
                b.p[i + 7] = 'a';
                found = 1;
            }
        if (!found)
            die("dup key", "key not found in META");
        reseal_section(&b, e);
        reseal_dir(&b, Tk);
        save("dup_key_meta.fkvf", b.p, b.n);
        free(b.p);
        row("dup_key_meta.fkvf", "reject", "either", "DUP_KEY", "§9.2", "-",
            "writer: META with keys dupkey.a, dupkey.b; the second renamed dupkey.a; re-sealed");
    }
    trunc_section("valid_quad_f16_rope.fkvf", "DESC", "§8.2", "reject");
    trunc_section("valid_quad_f16_rope.fkvf", "META", "§9.1", "either");
    trunc_section("valid_quad_f16_rope.fkvf", "EXAC", "§14.2", "reject");
    trunc_section("valid_quad_f16_rope.fkvf", "STRM", "§11.2 step 5", "reject");
    trunc_section("valid_quad_f16_rope.fkvf", "CBK1", "§13.2", "reject");
    trunc_section("valid_ngon_f16.fkvf", "VTXS", "§10.1", "reject");
    trunc_section("valid_cbrf.fkvf", "CBRF", "§13.5", "reject");
    trunc_section("valid_zidx.fkvf", "ZIDX", "§20.2", "either");
    trunc_section("valid_zpos.fkvf", "ZPOS", "§20.7", "either");
    {
        /* the first index section of valid_zidx.fkvf / valid_zpos.fkvf (stream
         * L0.H0.K.0, quad 4-bit) changed, section and directory re-sealed */
        static const struct {
            const char *name, *type, *cls, *clause, *prov;
        } zm[] = {
            {"zidx_order.fkvf", "ZIDX", "CORRUPT", "§20.3",
             "valid_zidx.fkvf with ZIDX entries 0 and 1 swapped"},
            {"zidx_key.fkvf", "ZIDX", "CORRUPT", "§20.3",
             "valid_zidx.fkvf with the last ZIDX entry's key all ones: the order holds, the key "
             "is not the stream's"},
            {"zpos_position.fkvf", "ZPOS", "CORRUPT", "§20.7",
             "valid_zpos.fkvf with the last ZPOS position = n_indexed"},
            {"zpos_order.fkvf", "ZPOS", "CORRUPT", "§20.7",
             "valid_zpos.fkvf with ZPOS entries 0 and 1 swapped (each position once, the order "
             "by the stream's keys broken)"},
            {"zpos_duplicate.fkvf", "ZPOS", "CORRUPT", "§20.7",
             "valid_zpos.fkvf with ZPOS entry 1 = entry 0's position"},
            {"zpos_entry_size.fkvf", "ZPOS", "CORRUPT", "§20.7",
             "valid_zpos.fkvf with ZPOS entry_size 8 (n_indexed <= 2^32 needs 4)"},
            {"limit_zpos_size.fkvf", "ZPOS", "LIMIT", "§20.7, §16.2",
             "valid_zpos.fkvf with ZPOS n_indexed = 2^46 and entry_size 8 (64 + 2^49 > 2^48; "
             "the section is also too short)"},
        };
        for (size_t k = 0; k < sizeof zm / sizeof zm[0]; k++) {
            int zp = !strcmp(zm[k].type, "ZPOS");
            buf zb = load(zp ? "valid_zpos.fkvf" : "valid_zidx.fkvf");
            uint64_t zT = last_trailer(&zb), ze = entry(&zb, zT, zm[k].type, 0);
            unsigned char *z = zb.p + sec_off(&zb, ze);
            uint64_t n = get64(z + 16), es = zp ? 4 : 24;
            unsigned char t[24];
            switch (k) {
            case 0:
            case 3:
                memcpy(t, z + 64, es);
                memcpy(z + 64, z + 64 + es, es);
                memcpy(z + 64 + es, t, es);
                break;
            case 1: memset(z + 64 + (n - 1) * 24, 0xFF, 16); break;
            case 2: put32(z + 64 + (n - 1) * 4, (uint32_t)n); break;
            case 4: memcpy(z + 68, z + 64, 4); break;
            case 5: put16(z + 10, 8); break;
            default:
                put64(z + 16, (uint64_t)1 << 46);
                put16(z + 10, 8);
                break;
            }
            reseal_section(&zb, ze);
            reseal_dir(&zb, zT);
            save(zm[k].name, zb.p, zb.n);
            free(zb.p);
            row(zm[k].name, "reject", "either", zm[k].cls, zm[k].clause, "-", zm[k].prov);
        }
        /* REQUIRED set on an index section (writers leave it clear): SECTION,
         * as for a section of an unknown type with REQUIRED (§4.3) */
        static const struct {
            const char *name, *base, *type, *clause;
        } req[] = {
            {"zidx_required_flag.fkvf", "valid_zidx.fkvf", "ZIDX", "§4.3, §20.1"},
            {"zpos_required_flag.fkvf", "valid_zpos.fkvf", "ZPOS", "§4.3, §20.7"},
        };
        for (size_t k = 0; k < sizeof req / sizeof req[0]; k++) {
            buf zb = load(req[k].base);
            uint64_t zT = last_trailer(&zb), ze = entry(&zb, zT, req[k].type, 0);
            put32(zb.p + ze + 4, get32(zb.p + ze + 4) | FKVF_SECTION_REQUIRED);
            reseal_dir(&zb, zT);
            save(req[k].name, zb.p, zb.n);
            free(zb.p);
            char prov[160];
            snprintf(prov, sizeof prov,
                     "%s with the first %s entry's REQUIRED flag set; directory re-sealed",
                     req[k].base, req[k].type);
            rej(req[k].name, "SECTION", req[k].clause, prov);
        }
        zpos_stale("zpos_stale_duplicate.fkvf", 1);
        row("zpos_stale_duplicate.fkvf", "reject", "either", "CORRUPT", "§20.4, §20.7", "-",
            "valid_zpos_stale.fkvf with the stale ZPOS's entry 1 = entry 0's position (a stale "
            "index still lists each position once)");
    }
    {
        /* A field over its limit in a section too short for what the field
         * declares: LIMIT, not TRUNCATED (§16.2: the limit check of a field
         * precedes the size checks that use it). */
        buf lb = load("valid_quad_f16_rope.fkvf");
        uint64_t lT = last_trailer(&lb), le = entry(&lb, lT, "META", 0);
        put32(lb.p + sec_off(&lb, le), 65537);
        reseal_section(&lb, le);
        reseal_dir(&lb, lT);
        save("limit_meta_count.fkvf", lb.p, lb.n);
        row("limit_meta_count.fkvf", "reject", "either", "LIMIT", "§9.1, §15, §16.2", "-",
            "valid_quad_f16_rope.fkvf with META count 65537 (the entries cannot fit either); "
            "re-sealed");
        free(lb.p);

        lb = load("valid_cbrf.fkvf");
        lT = last_trailer(&lb), le = entry(&lb, lT, "CBRF", 0);
        put32(lb.p + sec_off(&lb, le) + 16, 4097);
        reseal_section(&lb, le);
        reseal_dir(&lb, lT);
        save("limit_cbrf_name_len.fkvf", lb.p, lb.n);
        row("limit_cbrf_name_len.fkvf", "reject", "reject", "LIMIT", "§13.5, §15, §16.2",
            "valid_codebook_file.fkvf",
            "valid_cbrf.fkvf with CBRF name_len 4097 (the section is also too short for it); "
            "re-sealed");
        free(lb.p);

        lb = load("valid_zidx.fkvf");
        lT = last_trailer(&lb), le = entry(&lb, lT, "ZIDX", 0);
        put64(lb.p + sec_off(&lb, le) + 16, (uint64_t)1 << 44);
        reseal_section(&lb, le);
        reseal_dir(&lb, lT);
        save("limit_zidx_size.fkvf", lb.p, lb.n);
        row("limit_zidx_size.fkvf", "reject", "either", "LIMIT", "§20.2 step 3, §16.2", "-",
            "valid_zidx.fkvf with the first ZIDX n_indexed = 2^44 (64 + 2^44 x 24 > 2^48; "
            "the section is also too short); re-sealed");
        free(lb.p);

        /* EXAC rows of exactly 2^48 bytes: the section (64 + rows) exceeds 2^48 */
        lb = load("valid_quad_f16_rope.fkvf");
        lT = last_trailer(&lb), le = entry(&lb, lT, "EXAC", 0);
        const unsigned char *dd = lb.p + sec_off(&lb, entry(&lb, lT, "DESC", 0));
        uint64_t row_bytes =
            (uint64_t)get32(dd) * get32(dd + 4) * (get32(dd + 8) + get32(dd + 12)) * 2; /* f16 */
        if (row_bytes & (row_bytes - 1))
            die("limit_exac_rows_2p48", "row_bytes is not a power of two");
        put64(lb.p + sec_off(&lb, le) + 8, ((uint64_t)1 << 48) / row_bytes);
        reseal_section(&lb, le);
        reseal_dir(&lb, lT);
        save("limit_exac_rows_2p48.fkvf", lb.p, lb.n);
        rej("limit_exac_rows_2p48.fkvf", "LIMIT", "§14.2, §15, §16.2",
            "valid_quad_f16_rope.fkvf with the first EXAC count = 2^41 (x 128-byte rows = 2^48 "
            "exactly, so 64 + count x row_bytes > 2^48; the section is also too short); "
            "re-sealed");
        free(lb.p);
    }
    {
        /* symbol out of range: k = 16 with 8-bit quad symbols */
        cfg_init(&c);
        c.seed = 18;
        c.qbits = 8;
        build("symbol_base.fkvf", &c);
        buf s = load("symbol_base.fkvf");
        remove(path_of("symbol_base.fkvf"));
        uint64_t Ts = last_trailer(&s), e = entry(&s, Ts, "STRM", 0), db, nb, off = sec_off(&s, e);
        uint64_t doff = strm_data_off(&s, e, &db, &nb);
        b = copy(s);
        b.p[off + doff + 5] = 0xF3;
        reseal_strm(&b, e);
        reseal_dir(&b, Ts);
        save("symbol_out_of_range.fkvf", b.p, b.n);
        rej("symbol_out_of_range.fkvf", "SYMBOL", "§11.8, §13.7",
            "8-bit quad index streams with k = 16; symbol 5 of stream 0 set to 243; checksums "
            "re-sealed");
        free(b.p);
        /* the same symbol in a segment no commit serves: never decoded for a
         * restore, but full verification checks every stored symbol */
        uint64_t ec;
        b = cut_away_pair(&s, &ec);
        b.p[sec_off(&b, ec) + doff + 5] = 0xF3;
        reseal_strm(&b, ec);
        reseal_dir(&b, last_trailer(&b));
        save("symbol_in_cutaway_segment.fkvf", b.p, b.n);
        row("symbol_in_cutaway_segment.fkvf", "reject", "either", "SYMBOL",
            "§1.3.3, §11.6, §11.8", "-",
            "writer: 8-bit quad index streams with k = 16 (symbol_out_of_range before its "
            "change) + commit 2 with two copies of the index segment (both from symbol 0, so "
            "the second cuts the first away whole), the first's symbol 5 of stream 0 = 243 >= k; "
            "re-sealed");
        free(b.p);
        free(s.p);
    }

    /* more single-field faults */
    {
        save("hdr_short_not_magic.fkvf", "\x89" "FX", 3);
        rej("hdr_short_not_magic.fkvf", "BAD_MAGIC", "§3.1 step 1",
            "3 bytes 89 46 58: not a prefix of the magic");
        b = copy(q);
        b.p[20] = 1;
        reseal_header(&b);
        save("hdr_flags.fkvf", b.p, b.n);
        rej("hdr_flags.fkvf", "CORRUPT", "§3.1 step 7", "header flags = 1; re-sealed");
        free(b.p);
        b = copy(q);
        b.p[9] = 1;
        reseal_header(&b);
        save("hdr_byte9.fkvf", b.p, b.n);
        rej("hdr_byte9.fkvf", "CORRUPT", "§3.1 step 7", "header byte 9 = 1; re-sealed");
        free(b.p);
        uint64_t d = get64(q.p + T + 16);
        b = copy(q);
        b.p[d + 40] = 1;
        reseal_dir(&b, T);
        save("dir_reserved.fkvf", b.p, b.n);
        rej("dir_reserved.fkvf", "CORRUPT", "§5.3", "directory header reserved byte 40 = 1; re-sealed");
        free(b.p);
        b = copy(q);
        put64(b.p + d + 24, get64(q.p + d + 16) - 1); /* S + A > n */
        reseal_dir(&b, T);
        save("dir_archived_past_end.fkvf", b.p, b.n);
        rej("dir_archived_past_end.fkvf", "CORRUPT", "§14.3",
            "n_archived = n_positions - 1 with 2 sinks (S + A > n; the index streams are then "
            "also shorter than A, §11.6, CORRUPT as well); re-sealed");
        free(b.p);
        {
            buf nt = load("edge_no_tokens_no_meta.fkvf");
            uint64_t Tn = last_trailer(&nt), dn = get64(nt.p + Tn + 16);
            put64(nt.p + dn + 16, get64(nt.p + dn + 16) + 1);
            reseal_dir(&nt, Tn);
            save("dir_exact_uncovered.fkvf", nt.p, nt.n);
            free(nt.p);
            rej("dir_exact_uncovered.fkvf", "CORRUPT", "§14.3",
                "edge_no_tokens_no_meta with n_positions + 1: the new last position is exact but "
                "no EXAC covers it; re-sealed");
        }
        uint64_t e = entry(&q, T, "EXAC", 0), off = sec_off(&q, e);
        b = copy(q);
        b.p[e + 50] = 1;
        reseal_dir(&b, T);
        save("entry_reserved.fkvf", b.p, b.n);
        rej("entry_reserved.fkvf", "CORRUPT", "§4.2", "EXAC entry reserved byte 50 = 1; re-sealed");
        free(b.p);
        b = copy(q);
        b.p[off + 16] = FKVF_DTYPE_F32;
        reseal_section(&b, e);
        reseal_dir(&b, T);
        save("exac_dtype.fkvf", b.p, b.n);
        rej("exac_dtype.fkvf", "CORRUPT", "§14.2", "first EXAC header dtype f32 (descriptor f16); re-sealed");
        free(b.p);
        b = copy(q);
        put64(b.p + off, 1);
        reseal_section(&b, e);
        reseal_dir(&b, T);
        save("exac_first_position.fkvf", b.p, b.n);
        rej("exac_first_position.fkvf", "CORRUPT", "§14.2",
            "first EXAC first_position 1 != directory key 0; re-sealed");
        free(b.p);
        uint64_t ed = entry(&q, T, "DESC", 0);
        b = copy(q);
        b.p[sec_off(&q, ed) + 100] = 1;
        reseal_section(&b, ed);
        reseal_dir(&b, T);
        save("desc_reserved.fkvf", b.p, b.n);
        rej("desc_reserved.fkvf", "CORRUPT", "§8.2", "DESC reserved byte 100 = 1; re-sealed");
        free(b.p);
        {
            buf f = load("valid_quad_f32.fkvf"); /* key_transform 0 */
            uint64_t Tf = last_trailer(&f), ef = entry(&f, Tf, "DESC", 0);
            put64(f.p + sec_off(&f, ef) + 24, UINT64_C(0x7FF8000000000000));
            reseal_section(&f, ef);
            reseal_dir(&f, Tf);
            save("desc_theta_nan.fkvf", f.p, f.n);
            free(f.p);
            rej("desc_theta_nan.fkvf", "CORRUPT", "§8.2",
                "valid_quad_f32 (key_transform 0) with rope_theta = NaN (not zero as a number); "
                "re-sealed");
        }

        buf df = load("valid_deflate.fkvf");
        uint64_t Td = last_trailer(&df), ex = entry(&df, Td, "XDFL", 0), es = entry(&df, Td, "STRM", 0);
        b = copy(df);
        b.p[sec_off(&df, ex) + sec_size(&df, ex) - 2] ^= 0x01; /* the Adler-32 */
        save("unknown_optional_checksum.fkvf", b.p, b.n);
        row("unknown_optional_checksum.fkvf", "reject", "either", "CHECKSUM", "§4.3, §4.6", "-",
            "valid_deflate with a stored byte of the unknown optional section XDFL flipped");
        reseal_section(&b, ex);
        reseal_dir(&b, Td);
        save("unknown_optional_deflate.fkvf", b.p, b.n);
        row("unknown_optional_deflate.fkvf", "reject", "either", "DEFLATE", "§4.3, §4.4", "-",
            "as unknown_optional_checksum with the section checksum re-sealed: its zlib stream "
            "(Adler-32) is invalid; readers ignore the contents, full verification checks them");
        free(b.p);
        /* the bound of §4.4 holds for a section readers otherwise ignore */
        deflate_over_ratio(&df, "XDFL", "limit_unknown_optional_deflate_ratio.fkvf");
        rej("limit_unknown_optional_deflate_ratio.fkvf", "LIMIT", "§4.3, §4.4",
            "valid_deflate with the unknown optional section XDFL's size = 1032 * stored_size "
            "+ 65; re-sealed");
        b = copy(df);
        put32(b.p + es + 4, get32(b.p + es + 4) | FKVF_SECTION_DEFLATE);
        reseal_dir(&b, Td);
        save("strm_deflate_flag.fkvf", b.p, b.n);
        rej("strm_deflate_flag.fkvf", "CORRUPT", "§4.4",
            "valid_deflate (DEFLATE feature set) with the DEFLATE flag on a STRM entry; re-sealed");
        free(b.p);
        free(df.p);

        buf r = load("valid_cbrf.fkvf");
        save("codebook_wrong_file.fkvf", r.p, r.n);
        free(r.p);
        row("codebook_wrong_file.fkvf", "reject", "reject", "CODEBOOK", "§13.5",
            "valid_quad_f16_rope.fkvf",
            "a copy of valid_cbrf given an archive, not a codebook file, as its codebook");
        cfg_init(&c);
        c.seed = 23;
        build_codebook_file("valid_codebook_file2.fkvf", &c);
        acc("valid_codebook_file2.fkvf", "§13.4",
            "writer: a codebook file of the same shape as valid_codebook_file, other values");
        r = load("valid_cbrf.fkvf");
        save("codebook_other_codebook.fkvf", r.p, r.n);
        free(r.p);
        row("codebook_other_codebook.fkvf", "reject", "reject", "CODEBOOK", "§13.5",
            "valid_codebook_file2.fkvf",
            "a copy of valid_cbrf given a codebook file of the right shape whose content hash "
            "differs");
    }

    /* commit chain and torn tails (§7) */
    {
        buf m = load("valid_multicommit3.fkvf");
        uint64_t T3 = last_trailer(&m), T2 = prev_trailer(&m, T3), T1 = prev_trailer(&m, T2);
        b = copy(m);
        b.p = realloc(b.p, m.n + 200);
        memcpy(b.p + m.n, q.p + 64, 200);
        b.n = m.n + 200;
        save("torn_partial_append.fkvf", b.p, b.n);
        row("torn_partial_append.fkvf", "reject", "accept", "TORN", "§7.2 rule 3, §1.3.3",
            "-", "valid_multicommit3 + 200 bytes of an append that did not complete; non-strict "
            "open serves commit 3");
        free(b.p);
        b = copy(m);
        b.p[T3 + 50] ^= 0x01;
        save("torn_last_trailer_damaged.fkvf", b.p, b.n);
        row("torn_last_trailer_damaged.fkvf", "reject", "accept", "TORN", "§7.2 rule 3",
            "-", "valid_multicommit3 with commit 3's trailer damaged: serves commit 2");
        free(b.p);
        cut("torn_cut_commit3.fkvf", m, T2 + 64 + 100);
        row("torn_cut_commit3.fkvf", "reject", "accept", "TORN", "§7.2 rule 3",
            "-", "valid_multicommit3 cut 100 bytes into commit 3: serves commit 2");
        b = copy(m);
        b.p[T1 + 20] ^= 0x01;
        save("chain_commit1_trailer.fkvf", b.p, b.n);
        rej("chain_commit1_trailer.fkvf", "CHAIN", "§7.1, §7.2 rule 1",
            "valid_multicommit3 with commit 1's trailer damaged; the last trailer is valid");
        free(b.p);
        b = copy(m);
        put64(b.p + T3 + 40, T1);
        reseal_trailer(&b, T3);
        save("chain_prev_link.fkvf", b.p, b.n);
        rej("chain_prev_link.fkvf", "CHAIN", "§7.1",
            "commit 3's prev_trailer points at commit 1 (sequence 3 -> 1); re-sealed");
        free(b.p);
        b = copy(m);
        put64(b.p + T3 + 8, 4);
        put64(b.p + get64(m.p + T3 + 16) + 8, 4);
        reseal_dir(&b, T3);
        save("chain_seq_gap.fkvf", b.p, b.n);
        rej("chain_seq_gap.fkvf", "CHAIN", "§7.1",
            "commit 3 numbered 4 in its trailer and directory (gap); re-sealed");
        free(b.p);
        b = copy(m);
        put64(b.p + T2 + 40, 64);
        reseal_trailer(&b, T2);
        save("chain_prev_misaligned.fkvf", b.p, b.n);
        rej("chain_prev_misaligned.fkvf", "CHAIN", "§6.2 step 7, §7.1",
            "commit 2's prev_trailer = 64 (< 128); re-sealed");
        free(b.p);
        free(m.p);

        /* an earlier commit that is not valid on its own (§7.3): only the
         * served commit's effective contents are checked */
        buf a = load("valid_appender_4commits.fkvf");
        uint64_t A4 = last_trailer(&a), A3 = prev_trailer(&a, A4), A2 = prev_trailer(&a, A3);
        uint64_t d2 = get64(a.p + A2 + 16);
        put64(a.p + d2 + 16, get64(a.p + d2 + 16) + 1);
        reseal_dir(&a, A2);
        save("commit_state_earlier_invalid.fkvf", a.p, a.n);
        acc("commit_state_earlier_invalid.fkvf", "§7.3",
            "valid_appender_4commits with commit 2's directory n_positions 10 -> 11 (its token "
            "stream and exact rows no longer fit); re-sealed. Commit 4, valid, is served");
        cut("commit_state_torn_serves_invalid.fkvf", a, A2 + 64 + 100);
        rej("commit_state_torn_serves_invalid.fkvf", "CORRUPT", "§7.2, §7.3",
            "commit_state_earlier_invalid cut 100 bytes into commit 3: commit 2, not valid, is "
            "served");
        free(a.p);
    }

    /* embedded codebooks (§11.8, §13): checked whether or not any position
     * is archived */
    {
        buf np = load("edge_no_positions.fkvf");
        uint64_t Tp = last_trailer(&np), es = entry(&np, Tp, "STRM", 0);
        uint64_t ec = entry(&np, Tp, "CBK1", 0);
        b = copy(np);
        unsigned char *h = b.p + sec_off(&b, es), ks = h[10];
        h[10] = h[11];
        h[11] = ks;
        reseal_strm(&b, es);
        reseal_dir(&b, Tp);
        save("stages_mismatch_no_archived.fkvf", b.p, b.n);
        rej("stages_mismatch_no_archived.fkvf", "CORRUPT", "§11.8",
            "edge_no_positions (n_archived = 0) with the empty index segment's k_stages and "
            "v_stages swapped (1 + 2; the CBK1 has 2 + 1; n_streams unchanged); re-sealed");
        free(b.p);
        b = copy(np);
        put32(b.p + sec_off(&b, ec), 1);
        put32(b.p + sec_off(&b, ec) + 4, 4);
        reseal_section(&b, ec);
        reseal_dir(&b, Tp);
        save("cbk1_shape_no_archived.fkvf", b.p, b.n);
        rej("cbk1_shape_no_archived.fkvf", "CORRUPT", "§13.7",
            "edge_no_positions (n_archived = 0) with the CBK1's n_layers 1 and n_heads 4 (the "
            "descriptor has 2 and 2; the size is unchanged); re-sealed");
        free(b.p);
        free(np.p);

        buf wg = load("edge_window_gt_cache.fkvf"); /* 5 positions, every one exact */
        uint64_t Tw = last_trailer(&wg), ew = entry(&wg, Tw, "CBK1", 0);
        b = copy(wg);
        b.p[sec_off(&b, ew) + 40] = 1;
        reseal_section(&b, ew);
        reseal_dir(&b, Tw);
        save("cbk1_reserved_no_archived.fkvf", b.p, b.n);
        rej("cbk1_reserved_no_archived.fkvf", "CORRUPT", "§7.5, §13.1",
            "edge_window_gt_cache (n_archived = 0) with CBK1 reserved byte 40 = 1; re-sealed");
        free(b.p);

        /* LAYER_STAGES (version 1.1, spec 13.1): the layer table's rules */
        {
            buf ls = load("valid_layer_stages.fkvf");
            uint64_t Tl = last_trailer(&ls), el = entry(&ls, Tl, "CBK1", 0);
            uint64_t co = sec_off(&ls, el);
            b = copy(ls);
            put64(b.p + 24, get64(b.p + 24) & ~(UINT64_C(1) << 3));
            reseal_header(&b);
            save("layer_stages_bit_clear.fkvf", b.p, b.n);
            rej("layer_stages_bit_clear.fkvf", "CORRUPT", "§3.3, §13.1",
                "valid_layer_stages with required_features bit 3 cleared (its CBK1 has "
                "layer_stages = 1); header re-sealed");
            free(b.p);
            struct {
                const char *name, *clause, *prov;
                uint64_t at;
                uint8_t v;
            } lc[] = {
                {"layer_stages_flag2.fkvf", "§13.1", "CBK1.layer_stages = 2", 24, 2},
                {"layer_stages_count17.fkvf", "§13.1, §15", "layer 3's value count 17", 64 + 7, 17},
                {"layer_stages_maxima.fkvf", "§13.1",
                 "CBK1.k_stages 3 (the largest key count of the layer table is 2)", 20, 3},
                {"layer_stages_padding.fkvf", "§13.1", "a non-zero padding byte after the pairs",
                 64 + 40, 1},
            };
            for (size_t i = 0; i < sizeof lc / sizeof lc[0]; i++) {
                b = copy(ls);
                b.p[co + lc[i].at] = lc[i].v;
                reseal_section(&b, el);
                reseal_dir(&b, Tl);
                save(lc[i].name, b.p, b.n);
                char prov[256];
                snprintf(prov, sizeof prov, "valid_layer_stages with %s; re-sealed", lc[i].prov);
                rej(lc[i].name, "CORRUPT", lc[i].clause, prov);
                free(b.p);
            }
            /* a sound index segment of 12 streams (the layer table (2, 2), (2, 0),
             * (0, 0), (0, 0), key_dim 16, value_dim 8) under a CBK1 whose table
             * says (2, 1), (0, 1), (0, 0), (1, 2): the same maxima and the same
             * table bytes (so the section keeps its size), 14 streams; within
             * step 6's bound, refused by the count of spec 11.8 */
            static const uint8_t lst_b[8] = {2, 2, 2, 0, 0, 0, 0, 0};
            cfg cb12;
            cfg_init(&cb12);
            cb12.seed = 23;
            cb12.L = 4;
            cb12.KD = 16;
            cb12.VD = 8;
            cb12.ks = 2;
            cb12.vs = 2;
            cb12.lst = lst_b;
            build("layer_stages_nstreams.fkvf", &cb12);
            buf ns = load("layer_stages_nstreams.fkvf");
            uint64_t Tn = last_trailer(&ns), en = entry(&ns, Tn, "CBK1", 0);
            memcpy(ns.p + sec_off(&ns, en) + 64, lst4, sizeof lst4);
            reseal_section(&ns, en);
            reseal_dir(&ns, Tn);
            save("layer_stages_nstreams.fkvf", ns.p, ns.n);
            rej("layer_stages_nstreams.fkvf", "CORRUPT", "§11.2, §11.8",
                "writer: LAYER_STAGES, 4 layers, key_dim 16, value_dim 8, an index segment of 12 "
                "streams for the layer table (2, 2), (2, 0), (0, 0), (0, 0), whose CBK1 table was "
                "then replaced by (2, 1), (0, 1), (0, 0), (1, 2) (the same maxima and table bytes: "
                "14 streams); CBK1 re-sealed");
            free(ns.p);
            free(ls.p);
        }
        /* a value that is not finite (f16 NaN 7E00): rejected by full
         * verification, and by the access path when a restore uses it */
        b = copy(wg);
        cbk1_set_value(&b, 0, 0x7E00);
        save("cbk1_value_nan_no_archived.fkvf", b.p, b.n);
        row("cbk1_value_nan_no_archived.fkvf", "reject", "either", "CORRUPT", "§13.2", "-",
            "edge_window_gt_cache (n_archived = 0) with the first CBK1 table element = f16 NaN; "
            "re-sealed");
        free(b.p);
        free(wg.p);
        b = copy(q);
        cbk1_set_value(&b, first_index_symbol(&q), 0x7E00);
        save("cbk1_value_nan.fkvf", b.p, b.n);
        rej("cbk1_value_nan.fkvf", "CORRUPT", "§13.2",
            "valid_quad_f16_rope with element 0 of row s of the first key table = f16 NaN, s "
            "the first symbol of stream L0.H0.K.0 (restoring position n_sinks uses it); "
            "re-sealed");
        free(b.p);

        /* A deflated CBK1 whose header implies more than 2^40 bytes:
         * TRUNCATED, the section being shorter (the 2^40 bound of §4.4 is on
         * the entry's size). The descriptor has the CBK1's shape, so that
         * the size is the only fault; the writer deflates the header as an
         * optional section, renamed afterwards. */
        cfg_init(&c);
        c.seed = 25;
        c.L = 1024, c.H = 4, c.KD = 16384, c.VD = 8;
        c.k = 4096;
        c.codec = 0, c.n_pos = 0, c.tokens = 0, c.meta = 0;
        fkvf_codebook_shape cs = cb_shape(&c);
        uint64_t implied = fkvf_codebook_size(&cs);
        if (implied <= (UINT64_C(1) << 40) || implied > (UINT64_C(1) << 48))
            die("cbk1_deflated_implied_gt_2p40", "the implied size is not in (2^40, 2^48]");
        unsigned char hdr[64];
        memset(hdr, 0, sizeof hdr);
        put32(hdr, c.L);
        put32(hdr + 4, c.H);
        put32(hdr + 8, c.KD);
        put32(hdr + 12, c.VD);
        put32(hdr + 16, c.k);
        hdr[20] = (unsigned char)c.ks, hdr[21] = (unsigned char)c.vs;
        hdr[22] = (unsigned char)c.cb_dtype;
        c.deflate = FKVF_SECTION_DEFLATE;
        c.extra_type = "XCBK";
        c.extra_flags = FKVF_SECTION_DEFLATE;
        c.extra_data = hdr, c.extra_size = sizeof hdr;
        build("cbk1_deflated_implied_gt_2p40.fkvf", &c);
        b = load("cbk1_deflated_implied_gt_2p40.fkvf");
        uint64_t Tx = last_trailer(&b), ex = entry(&b, Tx, "XCBK", 0);
        memcpy(b.p + ex, "CBK1", 4);
        put32(b.p + ex + 4, get32(b.p + ex + 4) | FKVF_SECTION_REQUIRED);
        reseal_dir(&b, Tx);
        save("cbk1_deflated_implied_gt_2p40.fkvf", b.p, b.n);
        free(b.p);
        rej("cbk1_deflated_implied_gt_2p40.fkvf", "TRUNCATED", "§13.1, §13.2, §15",
            "writer: a descriptor of 1024 layers, 4 heads, key_dim 16384, value_dim 8, no "
            "positions, and a deflated optional section XCBK of only a CBK1 header of that "
            "shape (k 4096, 2 + 1 stages, f16: 64 + 2^24 x 65552 bytes > 2^40), the entry "
            "renamed CBK1 with REQUIRED; directory re-sealed");
    }

    /* External codebooks (§13.5). A candidate codebook file is opened by
     * §7.2 (non-strict) and only its CBK1 is used; each candidate is also a
     * row of its own. The archives are copies of valid_cbrf. */
    {
        buf cb = load("valid_codebook_file.fkvf"), r = load("valid_cbrf.fkvf");
        uint64_t Tc = last_trailer(&cb), ec = entry(&cb, Tc, "CBK1", 0);

        b = copy(cb);
        b.p[sec_off(&cb, ec) + 100] ^= 0x01;
        save("codebook_file_checksum_CBK1.fkvf", b.p, b.n);
        rej("codebook_file_checksum_CBK1.fkvf", "CHECKSUM", "§4.6, §13.4",
            "valid_codebook_file with a byte of its CBK1 tables flipped");
        free(b.p);
        save("codebook_candidate_checksum_CBK1.fkvf", r.p, r.n);
        row("codebook_candidate_checksum_CBK1.fkvf", "reject", "reject", "CODEBOOK", "§13.5",
            "codebook_file_checksum_CBK1.fkvf",
            "a copy of valid_cbrf given codebook_file_checksum_CBK1 (its CBK1 fails its "
            "checksum) as its codebook");

        /* faults the codebook does not use: a META, a torn tail */
        static const unsigned char no_meta[8]; /* count 0 */
        new_sec m = {"META", 0, 0, no_meta, sizeof no_meta};
        buf cm = copy(cb);
        append_commit(&cm, &m, 1);
        b = copy(cm);
        b.p[sec_off(&b, entry(&b, last_trailer(&b), "META", 0)) + 4] = 1;
        save("codebook_file_checksum_META.fkvf", b.p, b.n);
        row("codebook_file_checksum_META.fkvf", "reject", "either", "CHECKSUM", "§4.6, §9.3", "-",
            "valid_codebook_file + commit 2 holding a META (count 0) whose reserved byte 4 was "
            "then set to 1: its checksum fails");
        free(b.p);
        save("codebook_candidate_checksum_META.fkvf", r.p, r.n);
        row("codebook_candidate_checksum_META.fkvf", "accept", "accept", "-", "§13.5",
            "codebook_file_checksum_META.fkvf",
            "a copy of valid_cbrf given codebook_file_checksum_META as its codebook: the "
            "candidate's META is not checked, not even by full verification of the archive");
        cut("torn_codebook_file.fkvf", cm, cb.n + 100);
        row("torn_codebook_file.fkvf", "reject", "accept", "TORN", "§7.2 rule 3, §13.4", "-",
            "valid_codebook_file + the first 100 bytes of a commit holding a META (an append "
            "cut short): serves commit 1");
        free(cm.p);
        save("codebook_candidate_torn.fkvf", r.p, r.n);
        row("codebook_candidate_torn.fkvf", "accept", "accept", "-", "§7.2, §13.5",
            "torn_codebook_file.fkvf",
            "a copy of valid_cbrf given torn_codebook_file as its codebook: opened by §7.2, "
            "non-strict, its commit 1 is the codebook");

        /* a value that is not finite in the codebook file an archive uses */
        b = copy(cb);
        cbk1_set_value(&b, first_index_symbol(&r), 0x7C00);
        save("codebook_file_value_inf.fkvf", b.p, b.n);
        row("codebook_file_value_inf.fkvf", "reject", "either", "CORRUPT", "§13.2", "-",
            "valid_codebook_file with element 0 of row s of the first key table = f16 +Inf, s "
            "the first symbol of valid_cbrf's stream L0.H0.K.0; re-sealed");
        buf ri = copy(r);
        uint64_t Tr = last_trailer(&ri), er = entry(&ri, Tr, "CBRF", 0);
        XXH128_canonical_t ch;
        XXH128_canonicalFromHash(&ch, XXH3_128bits_withSeed(b.p + sec_off(&b, ec),
                                                             (size_t)sec_size(&b, ec), 0));
        memcpy(ri.p + sec_off(&ri, er), ch.digest, 16);
        reseal_section(&ri, er);
        reseal_dir(&ri, Tr);
        save("codebook_candidate_value_inf.fkvf", ri.p, ri.n);
        row("codebook_candidate_value_inf.fkvf", "reject", "reject", "CODEBOOK", "§13.2, §13.5",
            "codebook_file_value_inf.fkvf",
            "valid_cbrf with the CBRF content_hash of codebook_file_value_inf (re-sealed), "
            "given it as its codebook: restoring position n_sinks uses the +Inf");
        free(ri.p);
        free(b.p);

        /* no candidate: only a restore of an archived position needs one */
        save("cbrf_no_codebook.fkvf", r.p, r.n);
        row("cbrf_no_codebook.fkvf", "accept", "reject", "CODEBOOK", "§13.5", "-",
            "a copy of valid_cbrf given no codebook: full verification skips only the checks "
            "that need it; restoring an archived position fails");
        cfg_init(&c);
        c.seed = 24;
        c.cb_mode = 1;
        c.cb_file = "valid_codebook_file.fkvf";
        c.n_pos = 5;
        c.window = 32;
        build("cbrf_no_archived_no_codebook.fkvf", &c);
        acc("cbrf_no_archived_no_codebook.fkvf", "§13.5",
            "writer: CBRF reference to valid_codebook_file, 5 positions all exact (window 32), "
            "given no codebook: nothing needs it");

        /* codebook files with other sections in a later commit (§13.4) */
        static const struct {
            const char *name, *src, *type, *verify, *open, *cls, *clause, *prov;
        } cx[] = {
            {"codebook_file_vtxs.fkvf", "valid_ngon_f16.fkvf", "VTXS", "accept", "accept", "-",
             "§10.3, §13.4",
             "valid_codebook_file + commit 2 holding valid_ngon_f16's VTXS (N = 16): allowed"},
            {"codebook_file_zidx.fkvf", "valid_zidx.fkvf", "ZIDX", "reject", "either", "CORRUPT",
             "§13.4, §20.2",
             "valid_codebook_file + commit 2 holding valid_zidx's first ZIDX: an index of "
             "stream L0.H0.K.0, which a codebook file does not have"},
            {"codebook_file_zpos.fkvf", "valid_zpos.fkvf", "ZPOS", "reject", "either", "CORRUPT",
             "§13.4, §20.7",
             "valid_codebook_file + commit 2 holding valid_zpos's first ZPOS: an index of "
             "stream L0.H0.K.0, which a codebook file does not have"},
        };
        for (size_t k = 0; k < sizeof cx / sizeof cx[0]; k++) {
            buf src = load(cx[k].src);
            new_sec s = sec_of(&src, cx[k].type);
            b = copy(cb);
            append_commit(&b, &s, 1);
            save(cx[k].name, b.p, b.n);
            free(b.p);
            free(src.p);
            row(cx[k].name, cx[k].verify, cx[k].open, cx[k].cls, cx[k].clause, "-", cx[k].prov);
        }
        free(cb.p);
        free(r.p);
    }

    /* == version 1.2: the encoder metric (CMET, spec 13.8) =================== */
    {
        /* valid: written by the writer, optional_features bit 1 set */
        cfg_init(&c);
        c.seed = 30;
        c.KD = 4, c.VD = 2;
        c.n_pos = 16;
        c.meta = 0;
        c.metric_parts = 3;
        build("valid_metric.fkvf", &c);
        acc("valid_metric.fkvf", "§3.4, §13.8",
            "writer: 16 positions (8 archived), embedded f16 CBK1 (2 layers, 2 heads, key_dim 4, "
            "value_dim 2) and a CMET "
            "with parts 3 (MK 4x4 and MV 2x2 per layer and head, symmetric positive definite), "
            "ENCODER_METRIC optional bit; the digest ignores the CMET");

        cfg_init(&c);
        c.seed = 31;
        c.KD = 3, c.VD = 2;
        c.metric_parts = 3;
        c.metric_flags = FKVF_SECTION_DEFLATE;
        build_codebook_file("valid_metric_codebook_file.fkvf", &c);
        acc("valid_metric_codebook_file.fkvf", "§4.4, §13.4, §13.8",
            "writer: a codebook file (key_dim 3, value_dim 2) with a deflated CMET, parts 3 "
            "(DEFLATE and ENCODER_METRIC set)");
        c.cb_mode = 1;
        c.cb_file = "valid_metric_codebook_file.fkvf";
        c.metric_parts = 0, c.metric_flags = 0;
        c.seed = 32;
        build("valid_metric_cbrf.fkvf", &c);
        row("valid_metric_cbrf.fkvf", "accept", "accept", "-", "§13.5, §13.8",
            "valid_metric_codebook_file.fkvf",
            "writer: CBRF reference to valid_metric_codebook_file (whose CMET is the archive's "
            "metric; the archive holds none)");

        cfg_init(&c);
        c.seed = 33;
        c.KD = 2, c.VD = 3;
        c.pooled = 1;
        c.metric_parts = 2;
        build("valid_metric_pooled.fkvf", &c);
        acc("valid_metric_pooled.fkvf", "§13.8",
            "writer: pooled codebook (n_heads 1, 2 kv heads, key_dim 2, value_dim 3) and a CMET "
            "with parts 2 (one MV 3x3 per layer)");

        static const uint8_t lstm[8] = {2, 1, 0, 1, 0, 0, 1, 2};
        cfg_init(&c);
        c.seed = 34;
        c.L = 4;
        c.KD = 2, c.VD = 2;
        c.ks = 2, c.vs = 2;
        c.lst = lstm;
        c.metric_parts = 1;
        build("valid_metric_layer_stages.fkvf", &c);
        acc("valid_metric_layer_stages.fkvf", "§13.1, §13.8",
            "writer: LAYER_STAGES codebook of 4 layers with (2, 1), (0, 1), (0, 0), (1, 2) "
            "stages, key_dim 2, and a CMET with parts 1: an MK for every layer and head, those "
            "without key stages included");

        cfg_init(&c);
        c.seed = 35;
        c.L = 1;
        c.KD = 2, c.VD = 2;
        c.metric_parts = 3;
        c.metric_commit2 = 1;
        build("valid_metric_commit2.fkvf", &c);
        acc("valid_metric_commit2.fkvf", "§7.3, §13.8",
            "writer: commit 1 an archive with an embedded codebook (1 layer, 2 heads, dims 2), "
            "commit 2 a CMET (parts 3) alone");

        /* invalid, each from valid_metric with one change (re-sealed) */
        buf vm = load("valid_metric.fkvf");
        uint64_t Tm = last_trailer(&vm), em = entry(&vm, Tm, "CMET", 0), mo = sec_off(&vm, em);
        fkvf_codebook_shape ms;
        size_t mn;
        free(cmet_of(&vm, 3, 0, 0, &mn, &ms));
        if (mn != sec_size(&vm, em) || (get32(vm.p + em + 4) & FKVF_SECTION_DEFLATE))
            die("metric", "valid_metric's CMET is not as expected");
        struct {
            const char *name, *cls, *open, *clause, *prov;
            uint64_t at;   /* offset in the CMET */
            int width;     /* bytes written: 1, 4 (u32 or f32 bits), 0: the entry (below) */
            uint32_t v;
        } mc[] = {
            {"metric_key.fkvf", "CORRUPT", "either", "§4.3, §13.8 check 2",
             "the CMET entry's key = 1", 0, 0, 1},
            {"metric_required.fkvf", "SECTION", "reject", "§13.8, §20.1",
             "the CMET entry's REQUIRED flag set", 0, 0, 2},
            {"metric_checksum.fkvf", "CHECKSUM", "either", "§4.6, §13.8",
             "a byte of the CMET's first matrix flipped (not re-sealed)", 0, 0, 3},
            {"metric_reserved.fkvf", "CORRUPT", "either", "§13.8 check 2",
             "CMET reserved byte 63 = 1", 63, 1, 1},
            {"metric_parts0.fkvf", "CORRUPT", "either", "§13.8 check 2", "CMET parts = 0", 32, 1,
             0},
            {"metric_parts4.fkvf", "CORRUPT", "either", "§13.8 check 2", "CMET parts = 4", 32, 1,
             4},
            {"metric_dtype.fkvf", "CORRUPT", "either", "§13.8 check 2",
             "CMET dtype = 1 (f16; only 3, f32, is allowed)", 33, 1, 1},
            {"metric_dim_limit.fkvf", "LIMIT", "either", "§13.8 check 3, §15, §16.2",
             "CMET key_dim = 1025 with parts bit 0 set (within the range of §13.1; the section "
             "is also too short for it and the CBK1's key_dim is 4: the limit comes first)",
             24, 4, 1025},
            {"metric_hash.fkvf", "CORRUPT", "either", "§13.3, §13.8 check 6",
             "CMET content_hash byte 0 changed (the CBK1's hash differs)", 0, 1,
             (uint32_t)(vm.p[mo] ^ 1)},
            {"metric_shape.fkvf", "CORRUPT", "either", "§13.8 check 6",
             "CMET key_dim 2 and value_dim 4 (the CBK1 has 4 and 2; the size is unchanged)", 24,
             8, 0},
            {"metric_nonfinite.fkvf", "CORRUPT", "either", "§13.8 check 7",
             "element (1, 1) of the last matrix (MV of layer 1, head 1) = +Inf (symmetric; "
             "every Cholesky pivot stays > 0)",
             cmet_matrix(&ms, 3, 1, 1, 1) + 4 * 3, 4, UINT32_C(0x7F800000)},
            {"metric_asymmetric.fkvf", "CORRUPT", "either", "§13.8 check 7",
             "element (1, 2) of MK of layer 1, head 0 one unit in the last place larger in "
             "magnitude than element (2, 1)", cmet_matrix(&ms, 3, 1, 0, 0) + 4 * (1 * 4 + 2), 4, 1},
            {"metric_indefinite.fkvf", "CORRUPT", "either", "§13.8 check 7",
             "MV of layer 0, head 1 = [[1, 2], [2, 1]] (eigenvalues 3 and -1: the second "
             "Cholesky pivot is -3)", cmet_matrix(&ms, 3, 0, 1, 1), 16, 0},
            {"metric_zero_diag.fkvf", "CORRUPT", "either", "§13.8 check 7",
             "element (0, 0) of MK of layer 1, head 1 = +0.0 (the first Cholesky pivot is "
             "exactly 0, not greater than 0)", cmet_matrix(&ms, 3, 1, 1, 0), 4, 0},
        };
        for (size_t k = 0; k < sizeof mc / sizeof mc[0]; k++) {
            b = copy(vm);
            unsigned char *m = b.p + mo;
            if (mc[k].width == 0) {
                if (mc[k].v == 1)
                    put64(b.p + em + 32, 1);
                else if (mc[k].v == 2)
                    put32(b.p + em + 4, get32(b.p + em + 4) | FKVF_SECTION_REQUIRED);
                else
                    m[64 + 5] ^= 0x10;
            } else if (mc[k].width == 1) {
                m[mc[k].at] = (unsigned char)mc[k].v;
            } else if (mc[k].width == 8) { /* swap key_dim and value_dim */
                uint32_t kd = get32(m + 24);
                put32(m + 24, get32(m + 28));
                put32(m + 28, kd);
            } else if (mc[k].width == 16) { /* a 2x2 matrix [[1, 2], [2, 1]] */
                put32(m + mc[k].at, UINT32_C(0x3F800000));
                put32(m + mc[k].at + 4, UINT32_C(0x40000000));
                put32(m + mc[k].at + 8, UINT32_C(0x40000000));
                put32(m + mc[k].at + 12, UINT32_C(0x3F800000));
            } else if (!strcmp(mc[k].name, "metric_asymmetric.fkvf")) {
                put32(m + mc[k].at, get32(m + mc[k].at) + 1); /* one ulp in magnitude */
            } else {
                put32(m + mc[k].at, mc[k].v);
            }
            if (strcmp(mc[k].name, "metric_checksum.fkvf"))
                reseal_section(&b, em);
            reseal_dir(&b, Tm);
            save(mc[k].name, b.p, b.n);
            free(b.p);
            char prov[400];
            snprintf(prov, sizeof prov, "valid_metric with %s; re-sealed", mc[k].prov);
            if (!strcmp(mc[k].name, "metric_checksum.fkvf"))
                snprintf(prov, sizeof prov, "valid_metric with %s", mc[k].prov);
            row(mc[k].name, "reject", mc[k].open, mc[k].cls, mc[k].clause, "-", prov);
        }
        {
            /* the section shorter than the header, than its matrices, longer:
             * commit 1 of valid_metric_commit2 (its archive, no CMET) + a
             * commit holding a CMET of its codebook (parts 1: MK 2x2 for each
             * of 2 heads) of the wrong size */
            static const struct {
                const char *name, *cls, *clause, *prov;
                long extra;
            } ms2[] = {
                {"metric_short_header.fkvf", "TRUNCATED", "§13.8 check 1",
                 "a CMET of 40 bytes (the first 40 of its header)", -56},
                {"metric_size_short.fkvf", "TRUNCATED", "§13.8 check 4",
                 "a CMET 4 bytes shorter than 64 + 1 x 2 x 4 x 4 = 96 (its last 4 removed)", -4},
                {"metric_size_long.fkvf", "CORRUPT", "§13.8 check 4",
                 "a CMET 4 bytes longer than 96 (4 zero bytes appended)", 4},
            };
            buf c2 = load("valid_metric_commit2.fkvf");
            c2.n = (size_t)prev_trailer(&c2, last_trailer(&c2)) + 64; /* commit 1 */
            for (size_t k = 0; k < sizeof ms2 / sizeof ms2[0]; k++) {
                size_t n;
                unsigned char *m = cmet_of(&c2, 1, 36, ms2[k].extra, &n, NULL);
                if ((ms2[k].extra == -56 && n != 40) || (ms2[k].extra == 4 && n != 100))
                    die(ms2[k].name, "not of the intended size");
                new_sec s = {"CMET", 0, 0, m, n};
                b = copy(c2);
                append_commit(&b, &s, 1);
                save(ms2[k].name, b.p, b.n);
                free(b.p);
                free(m);
                char prov[300];
                snprintf(prov, sizeof prov,
                         "valid_metric_commit2 cut after commit 1 + a commit holding %s, made for "
                         "its codebook", ms2[k].prov);
                row(ms2[k].name, "reject", "either", ms2[k].cls, ms2[k].clause, "-", prov);
            }
            free(c2.p);
        }
        {
            /* where the chain may not hold it (spec 13.8 check 5) */
            new_sec s = sec_of(&vm, "CMET");
            b = copy(vm);
            append_commit(&b, &s, 1);
            save("metric_twice.fkvf", b.p, b.n);
            free(b.p);
            row("metric_twice.fkvf", "reject", "either", "CORRUPT", "§13.8 check 5", "-",
                "valid_metric + commit 2 holding a copy of its CMET (valid on its own): two in "
                "the chain");
            buf wo = load("edge_window_only.fkvf");
            b = copy(wo);
            append_commit(&b, &s, 1);
            save("metric_no_codebook.fkvf", b.p, b.n);
            free(b.p);
            free(wo.p);
            row("metric_no_codebook.fkvf", "reject", "either", "CORRUPT", "§13.8 check 5", "-",
                "edge_window_only (no codebook) + commit 2 holding valid_metric's CMET");
            buf cbf = load("valid_codebook_file.fkvf"), rf = load("valid_cbrf.fkvf");
            size_t n;
            unsigned char *m = cmet_of(&cbf, 3, 37, 0, &n, NULL);
            new_sec s2 = {"CMET", 0, 0, m, n};
            append_commit(&rf, &s2, 1);
            save("metric_in_cbrf_archive.fkvf", rf.p, rf.n);
            free(m);
            free(rf.p);
            free(cbf.p);
            row("metric_in_cbrf_archive.fkvf", "reject", "either", "CORRUPT", "§13.5, §13.8 check 5",
                "valid_codebook_file.fkvf",
                "valid_cbrf + commit 2 holding a CMET of valid_codebook_file's codebook (right "
                "hash and shape): the archive's chain holds no CBK1 (the metric belongs in the "
                "codebook file)");
        }
        free(vm.p);
    }
    free(q.p);
    fclose(manifest);
    if (failures) {
        fprintf(stderr, "fkvf-conf-gen: %d files did not decode as expected\n", failures);
        return 1;
    }
    return 0;
}
