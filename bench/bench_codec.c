/* Symbol codec benchmark (spec 12) and the span-rule experiment.
 *
 *   bench_codec [nsym]            throughput / latency / storage table
 *   bench_codec spanrule [nsym [N,N,.. [E,E,..]]]
 *                                 encode + canonical decode of nsym random
 *                                 symbols per N plus adversarial patterns,
 *                                 at r = r_N and span exponents E (spans of
 *                                 the largest L with q^L <= 2^E)
 *
 * Output is a markdown table. Timings use CLOCK_MONOTONIC; each figure is
 * the best and the median of several repetitions. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/codec.h"

/* ---- utilities ------------------------------------------------------------ */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = UINT64_C(0x2545F4914F6CDD1D);
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static uint32_t below(uint32_t n) { return (uint32_t)(rnd() % n); }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(p, 0, n); /* touch every page before timing */
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define MAXREP 15
typedef struct timing {
    double best, median;
} timing;

static timing summarize(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    timing s = {t[0], t[n / 2]};
    return s;
}

static volatile uint32_t sink;

static void die_rc(const char *what, int rc)
{
    if (rc) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
}

/* ---- benchmark ------------------------------------------------------------ */

typedef struct config {
    const char *name;
    int ngon;
    unsigned bits; /* quad bits; ngon: bits of the packed index (log2 N) */
    uint32_t n;    /* ngon N */
} config;

/* time memcpy of `bytes` bytes */
static timing time_memcpy(const uint8_t *src, uint8_t *dst, size_t bytes, int reps)
{
    double t[MAXREP];
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        memcpy(dst, src, bytes);
        t[i] = now() - t0;
        sink += dst[bytes / 2];
    }
    return summarize(t, reps);
}

static void row(const char *codec, const char *op, size_t nsym, size_t packed, timing t,
                timing mc)
{
    printf("| %s | %s | %.1f | %.1f | %.0f | %.0f | %.2f |\n", codec, op, nsym / t.best / 1e6,
           nsym / t.median / 1e6, packed / t.best / 1e6, packed / mc.best / 1e6,
           t.best / mc.best);
}

static void bench(size_t nsym)
{
    const config cfgs[] = {
        {"quad 8-bit", 0, 8, 0},  {"quad 16-bit", 0, 16, 0}, {"quad 12-bit", 0, 12, 0},
        {"ngon N=4", 1, 2, 4},
        {"ngon N=16", 1, 4, 16}, {"ngon N=256", 1, 8, 256},
    };
    const int ncfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    uint32_t *sym = xmalloc(nsym * sizeof *sym);
    uint32_t *out = xmalloc(nsym * sizeof *out);
    const int reps = 7;
    const size_t nlook = 1000000;
    uint64_t *pos = xmalloc(nlook * sizeof *pos);
    for (size_t i = 0; i < nlook; i++)
        pos[i] = rnd() % nsym;
    double lat[8];
    double bps[8];
    /* the floor of any decode: writing the uint32_t output (4 bytes/symbol) */
    double ft[MAXREP];
    for (int i = 0; i < MAXREP; i++) {
        double t0 = now();
        memset(out, i, nsym * sizeof *out);
        ft[i] = now() - t0;
        sink += out[nsym / 3];
    }
    timing floor_t = summarize(ft, MAXREP);

    printf("%zu random symbols per codec; best and median of %d runs; MB/s counts packed index\n"
           "bytes (nsym * log2(alphabet) / 8), the bytes memcpy moves in the same run;\n"
           "ratio = codec time / memcpy time (best).\n\n",
           nsym, reps);
    printf("| codec | operation | Msym/s best | Msym/s median | MB/s best | memcpy MB/s | ratio |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int ci = 0; ci < ncfg; ci++) {
        const config *c = &cfgs[ci];
        uint32_t alpha = c->ngon ? c->n : (uint32_t)1 << c->bits;
        for (size_t i = 0; i < nsym; i++)
            sym[i] = below(alpha);
        size_t packed = (nsym * c->bits + 7) / 8;
        uint64_t dbytes = 0;
        fkvf_ngon g;
        if (c->ngon) {
            die_rc("ngon_init", fkvf_ngon_init(&g, c->n, 0, 0, NULL, NULL));
            fkvf_ngon_data_bytes(&g, nsym, &dbytes);
        } else {
            fkvf_quad_data_bytes(nsym, c->bits, &dbytes);
        }
        uint8_t *data = xmalloc((size_t)dbytes);
        uint64_t qbytes = 0;
        fkvf_quad_data_bytes(nsym, c->bits, &qbytes);
        uint8_t *pk = xmalloc((size_t)qbytes), *pk2 = xmalloc((size_t)qbytes);
        die_rc("pack", fkvf_quad_encode(sym, nsym, c->bits, pk, (size_t)qbytes));
        double t[MAXREP];
        int er = c->ngon ? 3 : reps;
        timing mc = time_memcpy(pk, pk2, packed, MAXREP);
        for (int i = 0; i < er; i++) {
            double t0 = now();
            int rc = c->ngon ? fkvf_ngon_encode(&g, sym, nsym, data, (size_t)dbytes)
                             : fkvf_quad_encode(sym, nsym, c->bits, data, (size_t)dbytes);
            t[i] = now() - t0;
            die_rc("encode", rc);
        }
        row(c->name, "encode", nsym, packed, summarize(t, er), mc);
        for (int v = 0; v < (c->ngon ? 2 : 1); v++) {
            for (int i = 0; i < reps; i++) {
                double t0 = now();
                int rc = c->ngon ? fkvf_ngon_decode(&g, data, (size_t)dbytes, nsym, 0, nsym, out, v)
                                 : fkvf_quad_decode(data, (size_t)dbytes, c->bits, 0, nsym, out);
                t[i] = now() - t0;
                die_rc("decode", rc);
            }
            if (memcmp(out, sym, nsym * sizeof *sym) != 0) {
                fprintf(stderr, "%s: decode mismatch\n", c->name);
                exit(1);
            }
            row(c->name, !c->ngon ? "decode" : v ? "decode (verified)" : "decode (fast)", nsym,
                packed, summarize(t, reps), mc);
        }
        if (!c->ngon && c->bits <= 8) {
            /* into bytes (fkvf_quad_decode_u8): the output is the packed size */
            uint8_t *o8 = xmalloc(nsym);
            for (int i = 0; i < reps; i++) {
                double t0 = now();
                die_rc("decode_u8", fkvf_quad_decode_u8(data, (size_t)dbytes, c->bits, 0, nsym, o8));
                t[i] = now() - t0;
            }
            for (size_t i = 0; i < nsym; i++)
                if (o8[i] != sym[i]) {
                    fprintf(stderr, "%s: decode_u8 mismatch\n", c->name);
                    exit(1);
                }
            row(c->name, "decode to uint8", nsym, packed, summarize(t, reps), mc);
            free(o8);
        }
        if (!c->ngon) {
            /* chunked: 4096 symbols at a time into a reused (cache-resident)
             * uint32_t buffer, the way a consumer streams through indices;
             * baseline: memcpy of the same packed chunks into a reused buffer */
            enum { CH = 4096 };
            static uint32_t cbuf[CH];
            static uint8_t mbuf[CH * 4];
            size_t cb = (size_t)CH * c->bits / 8;
            double mt[MAXREP];
            for (int i = 0; i < MAXREP; i++) {
                double t0 = now();
                for (size_t a = 0; a + CH <= nsym; a += CH)
                    memcpy(mbuf, pk + a * c->bits / 8, cb);
                mt[i] = now() - t0;
                sink += mbuf[i];
            }
            timing mcc = summarize(mt, MAXREP);
            for (int i = 0; i < reps; i++) {
                uint32_t acc = 0;
                double t0 = now();
                for (size_t a = 0; a + CH <= nsym; a += CH) {
                    die_rc("decode", fkvf_quad_decode(data, (size_t)dbytes, c->bits, a, CH, cbuf));
                    acc += cbuf[a % CH];
                }
                t[i] = now() - t0;
                sink += acc;
            }
            row(c->name, "decode, 4096-symbol chunks (memcpy chunked too)", nsym / CH * CH,
                nsym / CH * cb, summarize(t, reps), mcc);
        }
        /* random access */
        double lt[MAXREP];
        for (int i = 0; i < reps; i++) {
            uint32_t acc = 0;
            double t0 = now();
            if (c->ngon) {
                for (size_t k = 0; k < nlook; k++) {
                    uint32_t s;
                    fkvf_ngon_get(&g, data, (size_t)dbytes, nsym, pos[k], &s);
                    acc += s;
                }
            } else {
                for (size_t k = 0; k < nlook; k++)
                    acc += fkvf_quad_get(data, (size_t)dbytes, c->bits, pos[k]);
            }
            lt[i] = (now() - t0) / (double)nlook * 1e9;
            sink += acc;
        }
        lat[ci] = summarize(lt, reps).best;
        bps[ci] = (double)dbytes / (double)nsym;
        if (c->ngon)
            fkvf_ngon_fini(&g);
        free(data);
        free(pk);
        free(pk2);
    }
    printf("\nOutput floor: memset of the %zu-byte uint32_t output buffer: %.2f ms best "
           "(%.0f MB/s, %.1f Msym/s).\n",
           nsym * sizeof *out, floor_t.best * 1e3, nsym * sizeof *out / floor_t.best / 1e6,
           nsym / floor_t.best / 1e6);
    printf("\n| codec | get latency ns (best) | stored bytes/symbol | packed index bytes/symbol |\n");
    printf("|---|---|---|---|\n");
    for (int ci = 0; ci < ncfg; ci++)
        printf("| %s | %.1f | %.4f | %.4f |\n", cfgs[ci].name, lat[ci], bps[ci],
               cfgs[ci].bits / 8.0);
    free(sym);
    free(out);
    free(pos);
}

/* ---- span-rule experiment ------------------------------------------------- */

typedef struct tally {
    uint64_t spans, symbols;
    uint64_t canon_fail;   /* canonical decode != input (the writer would refuse) */
    uint64_t fast_diff;    /* fast decoder != canonical decoder */
    uint64_t loss;         /* verified decode returns OK but wrong symbols */
    double bmin, bmax;     /* extreme |b_k| of the canonical backward points */
} tally;

static void try_span(const fkvf_ngon *g, const uint32_t *s, uint32_t len, tally *t)
{
    uint32_t a[64], b[64];
    double ax, ay;
    fkvf_ngon_encode_span(g, s, len, &ax, &ay);
    fkvf_ngon_decode_span_canonical(g, ax, ay, len, a);
    t->spans++;
    t->symbols += len;
    int cf = memcmp(a, s, len * sizeof *s) != 0;
    t->canon_fail += (uint64_t)cf;
    fkvf_ngon_decode_span_fast(g, ax, ay, len, b);
    t->fast_diff += (uint64_t)(memcmp(a, b, len * sizeof *a) != 0);
    if (fkvf_ngon_decode_span(g, ax, ay, len, b) == FKVF_OK && memcmp(b, s, len * sizeof *s))
        t->loss++;
    /* the canonical backward trajectory (same formulas as the decoder) */
    double px = ax, py = ay;
    for (uint32_t k = len; k > 0; k--) {
        double m = px * px + py * py;
        if (m < t->bmin)
            t->bmin = m;
        if (m > t->bmax)
            t->bmax = m;
        double vx = g->vx[a[k - 1]], vy = g->vy[a[k - 1]];
        px = vx + (px - vx) / g->r;
        py = vy + (py - vy) / g->r;
    }
}

/* adversarial patterns, every span of length len */
static void adversarial(const fkvf_ngon *g, uint32_t len, tally *t)
{
    const uint32_t n = g->n;
    uint32_t s[64];
    uint32_t step = n > 4096 ? n / 4096 : 1; /* sample c for large N */
    for (uint32_t c = 0; c < n; c += step) {
        uint32_t c1 = (c + 1) % n, ch = (c + n / 2) % n, cm = (c + n - 1) % n;
        /* constant */
        for (uint32_t k = 0; k < len; k++)
            s[k] = c;
        try_span(g, s, len, t);
        /* alternating neighbours, both phases */
        for (uint32_t k = 0; k < len; k++)
            s[k] = (k & 1) ? c1 : c;
        try_span(g, s, len, t);
        for (uint32_t k = 0; k < len; k++)
            s[k] = (k & 1) ? c : c1;
        try_span(g, s, len, t);
        /* N/2 steps */
        for (uint32_t k = 0; k < len; k++)
            s[k] = (k & 1) ? ch : c;
        try_span(g, s, len, t);
        for (uint32_t k = 0; k < len; k++)
            s[k] = (uint32_t)((c + (uint64_t)k * (n / 2)) % n);
        try_span(g, s, len, t);
        /* the geometric worst case: a run of d, then c, where d lies about a
         * quarter turn away (p' near the polygon's extreme in the direction
         * of V(c+-1) - V(c) puts p next to the Voronoi boundary) */
        for (int dd = -2; dd <= 2; dd++) {
            for (int side = -1; side <= 1; side += 2) {
                int64_t dv = (int64_t)c + side * ((int64_t)(n / 4) + dd);
                uint32_t d = (uint32_t)(((dv % n) + n) % n);
                for (uint32_t cut = 1; cut < len; cut++) {
                    for (uint32_t k = 0; k < len; k++)
                        s[k] = k < cut ? d : c;
                    try_span(g, s, len, t);
                    if (len > 8 && cut > 3 && cut < len - 3)
                        cut += len / 8;
                }
                /* alternate the two vertices around the extreme, end in c */
                uint32_t d1 = (d + 1) % n;
                for (uint32_t k = 0; k < len; k++)
                    s[k] = k + 1 == len ? c : ((k & 1) ? d1 : d);
                try_span(g, s, len, t);
                for (uint32_t k = 0; k + 1 < len; k++)
                    s[k] = below(2) ? d1 : d;
                s[len - 1] = c;
                try_span(g, s, len, t);
            }
        }
        /* random over small sub-alphabets */
        const uint32_t sub4[4] = {c, c1, cm, ch};
        for (uint32_t k = 0; k < len; k++)
            s[k] = sub4[below(4)];
        try_span(g, s, len, t);
    }
    /* extremes 0 / N-1: runs and random mixes */
    for (uint32_t cut = 0; cut <= len; cut++) {
        for (uint32_t k = 0; k < len; k++)
            s[k] = k < cut ? 0 : n - 1;
        try_span(g, s, len, t);
        for (uint32_t k = 0; k < len; k++)
            s[k] = k < cut ? n - 1 : 0;
        try_span(g, s, len, t);
    }
    for (int i = 0; i < 20000; i++) {
        for (uint32_t k = 0; k < len; k++)
            s[k] = below(2) ? 0 : n - 1;
        try_span(g, s, len, t);
    }
}

static uint32_t span_for_exponent(double r, int e)
{
    double q = 1.0 / r, p = 1.0, lim = 1.0;
    for (int i = 0; i < e; i++)
        lim *= 2.0;
    uint32_t l = 0;
    while (l < 64 && p * q <= lim) {
        p *= q;
        l++;
    }
    return l;
}

static void spanrule(size_t nsym, const char *nlist, const char *elist)
{
    uint32_t ns[16] = {2, 3, 4, 5, 8, 16, 64, 256, 1024, 65536};
    int es[16] = {44, 46, 48, 50, 52, 53, 54, 56};
    size_t nn = 10, ne = 8;
    if (nlist)
        for (nn = 0; nn < 16 && *nlist; nn++) {
            char *end;
            ns[nn] = (uint32_t)strtoul(nlist, &end, 10);
            nlist = *end ? end + 1 : end;
        }
    if (elist)
        for (ne = 0; ne < 16 && *elist; ne++) {
            char *end;
            es[ne] = (int)strtol(elist, &end, 10);
            elist = *end ? end + 1 : end;
        }
    printf("r = r_N; L = largest L with q^L <= 2^E (q = 1/r). random: %zu uniform symbols per "
           "(N, E);\nadversarial: patterns listed in bench/bench_codec.c. canon_fail = spans the "
           "canonical decoder\ndoes not give back (a writer refuses them); fast!=canon = spans where "
           "the fast decoder differs;\nloss = verified decode accepted wrong symbols; norm^2 of b = range "
           "of squared norms of the canonical\nbackward points.\n\n",
           nsym);
    printf("| N | E | L | random spans | random canon_fail | adversarial spans | adversarial "
           "canon_fail | fast!=canon | loss | norm^2 of b: min..max |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t ni = 0; ni < nn; ni++) {
        fkvf_ngon g;
        die_rc("ngon_init", fkvf_ngon_init(&g, ns[ni], 0, 0, NULL, NULL));
        uint32_t prev = 0;
        for (size_t ei = 0; ei < ne; ei++) {
            uint32_t len = span_for_exponent(g.r, es[ei]);
            if (len == prev || len > 64)
                continue;
            prev = len;
            tally tr = {0, 0, 0, 0, 0, 1e300, 0};
            tally ta = tr;
            uint32_t s[64];
            for (size_t done = 0; done < nsym; done += len) {
                for (uint32_t k = 0; k < len; k++)
                    s[k] = below(ns[ni]);
                try_span(&g, s, len, &tr);
            }
            adversarial(&g, len, &ta);
            double bmin = tr.bmin < ta.bmin ? tr.bmin : ta.bmin;
            double bmax = tr.bmax > ta.bmax ? tr.bmax : ta.bmax;
            printf("| %u | %d%s | %u | %llu | %llu | %llu | %llu | %llu | %llu | %.4g..%.4g |\n",
                   ns[ni], es[ei], es[ei] == 44 ? " (spec)" : "", len,
                   (unsigned long long)tr.spans, (unsigned long long)tr.canon_fail,
                   (unsigned long long)ta.spans, (unsigned long long)ta.canon_fail,
                   (unsigned long long)(tr.fast_diff + ta.fast_diff),
                   (unsigned long long)(tr.loss + ta.loss), bmin, bmax);
            fflush(stdout);
        }
        fkvf_ngon_fini(&g);
    }
}

/* ---- streams inside an archive: storage overhead and reader latency ------- */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static long long mem_write(void *opaque, const void *data, size_t size)
{
    membuf *b = opaque;
    if (b->n + size > b->cap) {
        size_t nc = b->cap ? b->cap : 1 << 16;
        while (nc < b->n + size)
            nc *= 2;
        uint8_t *q = realloc(b->p, nc);
        if (!q)
            return -1;
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, data, size);
    b->n += size;
    return (long long)size;
}

/* One index stream of n symbols (1 layer, 1 head, one key stage, k = 256)
 * written through the public writer; reports the stream's share of the file
 * and the latency of fkvf_reader_stream_get at random positions. */
static void container(size_t n, fkvf_profile prof)
{
    membuf mb = {0};
    fkvf_sink sk = {mem_write, NULL, &mb};
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    if (prof == FKVF_PROFILE_NGON)
        o.required_features = FKVF_FEAT_NGON;
    fkvf_writer *w = NULL;
    die_rc("create", fkvf_writer_create_sink(&w, &sk, &o, NULL));
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F16;
    die_rc("desc", fkvf_writer_set_desc(w, &d));
    fkvf_codebook_shape cs = {1, 1, 1, 1, 256, 1, 0, FKVF_DTYPE_F16, 0, NULL};
    uint16_t tables[256] = {0};
    die_rc("codebook", fkvf_writer_add_codebooks(w, &cs, tables, sizeof tables, 0));
    uint16_t *sym = xmalloc(n * sizeof *sym);
    for (size_t i = 0; i < n; i++)
        sym[i] = (uint16_t)below(256);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = prof;
    sp.symbol_bits = prof == FKVF_PROFILE_QUAD ? 8 : 0;
    sp.alphabet = prof == FKVF_PROFILE_QUAD ? 0 : 256;
    die_rc("stream", fkvf_writer_add_index_segment(w, &sp, 0, n, sym, 1, n));
    die_rc("positions", fkvf_writer_set_positions(w, n, n));
    die_rc("finish", fkvf_writer_finish(w));
    fkvf_writer_free(w);

    fkvf_reader *r = NULL;
    die_rc("open", fkvf_reader_open_memory(&r, mb.p, mb.n, 0, NULL));
    size_t ns = 0, si = 0;
    fkvf_archive_info ai;
    fkvf_reader_info(r, &ai);
    uint64_t stored = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info sec;
        fkvf_reader_section(r, i, &sec);
        if (sec.type == FKVF_SECTION_STRM)
            stored = sec.stored_size;
    }
    (void)ns;
    die_rc("find", fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 0, 0, 0, 0), &si));
    /* + its 64-byte directory entry and at most 63 bytes of alignment padding */
    double per = (double)(stored + 64) / (double)n;
    double payload = prof == FKVF_PROFILE_QUAD ? 1.0 : 16.0 / fkvf_ngon_max_span(fkvf_ngon_rmax(256));
    /* latency: first pass touches (verifies) every block, then timed passes */
    enum { NL = 1000000 };
    uint64_t *pos = xmalloc(NL * sizeof *pos);
    for (size_t i = 0; i < NL; i++)
        pos[i] = rnd() % n;
    uint32_t v;
    for (size_t i = 0; i < n; i += 64)
        die_rc("get", fkvf_reader_stream_get(r, si, i, &v));
    double lt[MAXREP];
    for (int rep = 0; rep < 5; rep++) {
        uint32_t acc = 0;
        double t0 = now();
        for (size_t i = 0; i < NL; i++) {
            fkvf_reader_stream_get(r, si, pos[i], &v);
            acc += v;
        }
        lt[rep] = (now() - t0) / NL * 1e9;
        sink += acc;
    }
    printf("| %s 8-bit symbols (N=256) | %zu | %llu | %.4f | %.4f | %.2f%% | %.1f |\n",
           prof == FKVF_PROFILE_QUAD ? "quad" : "ngon", n, (unsigned long long)stored + 64, per,
           payload, (per / payload - 1.0) * 100.0, summarize(lt, 5).best);
    fkvf_reader_free(r);
    free(pos);
    free(sym);
    free(mb.p);
}

static void containers(void)
{
    printf("\nStreams inside an archive (public writer and reader; block size 4096):\n\n");
    printf("| stream | symbols | section + dir entry bytes | bytes/symbol | codec payload "
           "bytes/symbol | container overhead | fkvf_reader_stream_get ns (best of 5) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    static const size_t ns[] = {1000, 100000, 10000000};
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 3; i++)
            container(ns[i], p ? FKVF_PROFILE_NGON : FKVF_PROFILE_QUAD);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "spanrule") == 0) {
        size_t n = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 10000000;
        spanrule(n, argc > 3 ? argv[3] : NULL, argc > 4 ? argv[4] : NULL);
        return 0;
    }
    size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 10000000;
    if (n < 1000)
        n = 1000;
    bench(n);
    containers();
    return 0;
}
