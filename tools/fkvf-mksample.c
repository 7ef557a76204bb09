/* fkvf-mksample: writes the deterministic sample archive used by the README
 * quick start and the tests (testdata/sample.fkvf). Public API only.
 *
 * The cache has the shape of the stories260K model (5 layers, 4 KV heads,
 * head dim 8, RoPE theta 10000 on all 8 dims, interleaved pairs) with 100
 * positions: 4 sinks and 32 recent positions are exact f16 rows; the 64 in
 * between are archived as RVQ indices (keys x4 stages, values x2, k = 256)
 * in quad-coded 8-bit streams, with an embedded codebook section and a
 * 10-bit token-id stream. Values are synthetic (a seeded generator), so the
 * sample exercises every structure without needing the quantizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"

/* the default sample; --tiny shrinks it to a few KB (fuzz seeds, fixtures) */
static unsigned L = 5, H = 4, D = 8, N_POS = 100, SINKS = 4, WINDOW = 32, KS = 4, VS = 2, K = 256,
                KBITS = 8;
#define MAX_POS 128

static uint64_t rng_state = 1;
static uint64_t rng(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static double unit(void) { return (double)(rng() >> 11) / 9007199254740992.0 * 2.0 - 1.0; }

/* float -> IEEE half, round to nearest even (values here are small normals) */
static uint16_t to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t e = (int32_t)((x >> 23) & 0xFF) - 127 + 15;
    uint32_t m = x & 0x7FFFFF;
    if (e <= 0)
        return (uint16_t)sign; /* flush tiny values to zero */
    if (e >= 31)
        return (uint16_t)(sign | 0x7C00);
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    uint32_t rest = m & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)h;
}

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static int fail(fkvf_writer *w, int rc, const char *what)
{
    fprintf(stderr, "fkvf-mksample: %s: %s\n", what,
            w && *fkvf_writer_message(w) ? fkvf_writer_message(w) : fkvf_strerror(rc));
    fkvf_writer_free(w);
    /* exit 2: usage or I/O (FKVF_E_IO, memory); 1: the output exists */
    return rc == FKVF_E_EXISTS ? 1 : 2;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *model_id = "stories260K (synthetic sample)";
    int ngon = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fkvf-mksample [--ngon] [--tiny] [--model-id TEXT] [--force] -o FILE\n\n"
                   "Writes the deterministic sample archive (same bytes on every run).\n"
                   "--ngon codes the index streams with the ngon profile (N=k).\n"
                   "--tiny writes a few-KB archive (2 layers, 1 head, dim 4, 12 positions,\n"
                   "       k = 16) for fixtures and fuzz seeds.\n"
                   "--model-id TEXT replaces the model id (tests of how tools show it).\n"
                   "--force replaces FILE if it exists (default: refused, exit 1).\n"
                   "Exit status: 0 ok, 1 FILE exists, 2 usage or I/O error.\n");
            return 0;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--model-id") && i + 1 < argc) {
            model_id = argv[++i];
        } else if (!strcmp(argv[i], "--ngon")) {
            ngon = 1;
        } else if (!strcmp(argv[i], "--tiny")) {
            L = 2, H = 1, D = 4, N_POS = 12, SINKS = 1, WINDOW = 3, KS = 2, VS = 1, K = 16, KBITS = 4;
        } else {
            fprintf(stderr, "fkvf-mksample: unknown argument '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "fkvf-mksample: missing -o FILE (try --help)\n");
        return 2;
    }
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    if (ngon)
        o.required_features |= FKVF_FEAT_NGON;
    o.no_replace = !force;
    fkvf_writer *w = NULL;
    int rc = fkvf_writer_create_file(&w, out, &o, NULL);
    if (rc == FKVF_E_EXISTS) {
        fprintf(stderr, "fkvf-mksample: %s: exists; not replaced (give --force to replace it)\n",
                out);
        fkvf_writer_free(w);
        return 1;
    }
    if (rc)
        return fail(w, rc, out);

    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = D;
    d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.key_transform = 1;
    d.rope_layout = 1;
    d.key_storage = 1;
    d.rope_dims = D;
    d.rope_theta = 10000.0;
    d.n_sinks = SINKS;
    d.window = WINDOW;
    d.model_id = model_id;
    d.tokenizer_id = "llama2.c-tok512";
    if ((rc = fkvf_writer_set_desc(w, &d)))
        return fail(w, rc, "descriptor");

    /* exact rows: positions [0, SINKS) and [N_POS - WINDOW, N_POS) */
    size_t row = (size_t)L * H * 2 * D * 2;
    unsigned char *rows = calloc(N_POS, row);
    if (!rows)
        return fail(w, FKVF_E_NOMEM, "rows");
    for (size_t i = 0; i < (size_t)N_POS * row / 2; i++)
        put16(rows + 2 * i, to_f16((float)(unit() * 2.0)));
    if ((rc = fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * row, 0)) ||
        (rc = fkvf_writer_add_exact(w, N_POS - WINDOW, WINDOW, rows + (N_POS - WINDOW) * row,
                                    WINDOW * row, 0))) {
        free(rows);
        return fail(w, rc, "exact rows");
    }
    free(rows);

    /* embedded codebooks (spec 13), f16 */
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.n_layers = L;
    cs.n_heads = H;
    cs.key_dim = D;
    cs.value_dim = D;
    cs.k = K;
    cs.k_stages = (uint8_t)KS;
    cs.v_stages = (uint8_t)VS;
    cs.dtype = FKVF_DTYPE_F16;
    size_t cb_elems = (size_t)L * H * K * (KS * D + VS * D);
    unsigned char *cb = calloc(cb_elems, 2);
    if (!cb)
        return fail(w, FKVF_E_NOMEM, "codebooks");
    for (size_t i = 0; i < cb_elems; i++)
        put16(cb + 2 * i, to_f16((float)(unit() / (1 + (double)(i % 7)))));
    rc = fkvf_writer_add_codebooks(w, &cs, cb, cb_elems * 2, 0);
    free(cb);
    if (rc)
        return fail(w, rc, "codebooks");

    /* index streams: every (layer, head, K|V, stage), one array per stream */
    const uint64_t n_arch = N_POS - SINKS - WINDOW;
    const size_t n_idx = (size_t)L * H * (KS + VS);
    uint16_t *codes = malloc(n_idx * (size_t)n_arch * sizeof *codes);
    if (!codes)
        return fail(w, FKVF_E_NOMEM, "index streams");
    for (size_t i = 0; i < n_idx * (size_t)n_arch; i++)
        codes[i] = (uint16_t)(rng() % K);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    if (ngon) {
        sp.profile = FKVF_PROFILE_NGON;
        sp.alphabet = K;
    } else {
        sp.profile = FKVF_PROFILE_QUAD;
        sp.symbol_bits = KBITS;
    }
    rc = fkvf_writer_add_index_segment(w, &sp, 0, n_arch, codes, 1, (size_t)n_arch);
    free(codes);
    if (rc)
        return fail(w, rc, "index streams");
    uint32_t sym[MAX_POS];
    /* token ids: BOS then ids below the 512-token vocabulary */
    sym[0] = 1;
    for (unsigned t = 1; t < N_POS; t++)
        sym[t] = (uint32_t)(3 + rng() % 509);
    fkvf_stream_spec ts;
    memset(&ts, 0, sizeof ts);
    ts.profile = FKVF_PROFILE_QUAD;
    ts.symbol_bits = 10;
    if ((rc = fkvf_writer_add_token_segment(w, &ts, 0, sym, N_POS)))
        return fail(w, rc, "token stream");

    if ((rc = fkvf_writer_meta_utf8(w, "sample.generator", "fkvf-mksample")) ||
        (rc = fkvf_writer_meta_u64(w, "sample.seed", 1)) ||
        (rc = fkvf_writer_meta_bool(w, "sample.synthetic", 1)) ||
        (rc = fkvf_writer_meta_f64(w, "sample.value_scale", 2.0)))
        return fail(w, rc, "metadata");
    if ((rc = fkvf_writer_set_positions(w, N_POS, n_arch)) || (rc = fkvf_writer_finish(w)))
        return fail(w, rc, out);
    fkvf_writer_free(w);
    return 0;
}
