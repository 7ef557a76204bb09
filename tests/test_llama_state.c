/* Check suite for tools/llama_state.c: llama.cpp state files.
 *
 * Expected bytes come from the test's own builder (a little-endian writer
 * composing the layout of llama_state.h's comment, which follows
 * llama.cpp's llama_kv_cache::state_write), never from llst_write_mem.
 * Parsing is checked field by field, llst_to_cache element by element
 * (the V transpose included), the round trip parse -> cache -> write byte
 * for byte over types, V layouts, streams, kinds and tokens; every error
 * for its class and a message with offset and field; every truncation and
 * every single-bit flip of small files (the flips in a child process with a
 * 256 MiB address-space limit, where an allocation the file does not
 * justify fails and LLST_E_NOMEM fails the test; not under ASan, whose
 * shadow memory needs more). */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llama_state.h"
#include "testutil.h"

#define ERRLEN 512


/* ---- the builder ------------------------------------------------------- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void b_byte(bb *b, uint8_t v)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    b->p[b->n++] = v;
}
static void b_u32(bb *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b_byte(b, (uint8_t)(v >> (8 * i)));
}
static void b_i32(bb *b, int32_t v) { b_u32(b, (uint32_t)v); }
static void b_u64(bb *b, uint64_t v)
{
    b_u32(b, (uint32_t)v);
    b_u32(b, (uint32_t)(v >> 32));
}

/* What a built file holds. */
typedef struct spec {
    llst_kind kind;
    uint32_t n_tokens; /* tokens written (normally 0 or T) */
    const char *arch;
    uint32_t n_stream, stream;
    uint32_t T, L, H, Dk, Dv;
    int32_t kt, vt;
    uint32_t v_trans;
    int32_t seq;
} spec;

/* Offsets the builder records. */
typedef struct offs {
    size_t n_tokens, tokens, arch, n_stream, count[4], cells, v_trans, n_layer, k[4], v[4], end;
} offs;

static size_t el_size(int32_t t) { return t == LLST_GGML_F32 ? 4 : 2; }

/* Byte i of element j of cell t in layer l (kv 0 K, 1 V): a hash, so every
 * element differs. */
static uint8_t eb(int kv, uint32_t l, uint32_t t, uint32_t j, size_t i)
{
    uint64_t x = ((uint64_t)kv << 56) ^ ((uint64_t)l << 44) ^ ((uint64_t)t << 28) ^ ((uint64_t)j << 8) ^ i;
    x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (uint8_t)x;
}
static void b_elem(bb *b, int kv, uint32_t l, uint32_t t, uint32_t j, size_t el)
{
    for (size_t i = 0; i < el; i++)
        b_byte(b, eb(kv, l, t, j, i));
}
static int32_t tok_of(uint32_t t) { return (int32_t)(t * 37 + 5); }

static uint8_t *build(const spec *s, size_t *size, offs *o)
{
    bb b = {0};
    offs oo;
    if (!o)
        o = &oo;
    memset(o, 0, sizeof *o);
    b_u32(&b, s->kind == LLST_KIND_SEQ ? 0x67677371u : 0x6767736eu);
    b_u32(&b, s->kind == LLST_KIND_SEQ ? 3 : 10);
    o->n_tokens = b.n;
    b_u32(&b, s->n_tokens);
    o->tokens = b.n;
    for (uint32_t t = 0; t < s->n_tokens; t++)
        b_i32(&b, tok_of(t));
    if (s->kind == LLST_KIND_SESSION) {
        b_u32(&b, (uint32_t)strlen(s->arch));
        o->arch = b.n;
        for (const char *c = s->arch; *c; c++)
            b_byte(&b, (uint8_t)*c);
    }
    o->n_stream = b.n;
    b_u32(&b, s->n_stream);
    for (uint32_t st = 0; st < s->n_stream; st++) {
        o->count[st] = b.n;
        uint32_t n = st == s->stream ? s->T : 0;
        b_u32(&b, n);
        if (!n)
            continue;
        o->cells = b.n;
        for (uint32_t t = 0; t < n; t++) {
            b_i32(&b, (int32_t)t);
            b_u32(&b, 1);
            b_i32(&b, s->seq);
        }
        o->v_trans = b.n;
        b_u32(&b, s->v_trans);
        o->n_layer = b.n;
        b_u32(&b, s->L);
        size_t ke = el_size(s->kt), ve = el_size(s->vt);
        for (uint32_t l = 0; l < s->L; l++) {
            o->k[l] = b.n;
            b_i32(&b, s->kt);
            b_u64(&b, (uint64_t)s->H * s->Dk * ke);
            for (uint32_t t = 0; t < n; t++)
                for (uint32_t j = 0; j < s->H * s->Dk; j++)
                    b_elem(&b, 0, l, t, j, ke);
        }
        for (uint32_t l = 0; l < s->L; l++) {
            o->v[l] = b.n;
            b_i32(&b, s->vt);
            if (!s->v_trans) {
                b_u64(&b, (uint64_t)s->H * s->Dv * ve);
                for (uint32_t t = 0; t < n; t++)
                    for (uint32_t j = 0; j < s->H * s->Dv; j++)
                        b_elem(&b, 1, l, t, j, ve);
            } else {
                b_u32(&b, (uint32_t)ve);
                b_u32(&b, s->H * s->Dv);
                for (uint32_t j = 0; j < s->H * s->Dv; j++)
                    for (uint32_t t = 0; t < n; t++)
                        b_elem(&b, 1, l, t, j, ve);
            }
        }
    }
    o->end = b.n;
    *size = b.n;
    return b.p;
}

static void put32(uint8_t *p, size_t off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[off + i] = (uint8_t)(v >> (8 * i));
}

static spec base_spec(void)
{
    spec s = {LLST_KIND_SEQ, 3, "llama", 1, 0, 3, 2, 2, 4, 3, LLST_GGML_F16, LLST_GGML_F16, 0, 0};
    return s;
}
static llst_shape shape_of(const spec *s)
{
    llst_shape sh = {s->L, s->H, s->Dk, s->Dv};
    return sh;
}

/* rc == code and the message contains every given substring */
#define EXPECT_ERR(rc, err, code, ...) \
    TU_EXPECT_ERR((rc), (code), llst_strerror(rc), (err), NULL, __VA_ARGS__)

/* parse a patched file that must fail: the file must be left empty */
static int parse(const uint8_t *p, size_t n, llst_file *f, char *err)
{
    uint8_t *odd = tu_dup_odd(p, n); /* no alignment assumptions */
    int rc = llst_parse(odd, n, "s.bin", f, err, ERRLEN);
    tu_free_odd(odd);
    if (rc) {
        ck_assert_ptr_null(f->tokens);
        ck_assert_ptr_null(f->layers);
        ck_assert_ptr_null(f->pos);
        ck_assert_uint_eq(f->n_cells, 0);
        ck_assert(err[0] != 0);
    } else {
        llst_free(f);
    }
    return rc;
}

/* parse, then llst_to_cache with shape */
static int parse_cache(const uint8_t *p, size_t n, const llst_shape *sh, kvio_cache *c, char *err)
{
    llst_file f;
    memset(c, 0, sizeof *c);
    int rc = llst_parse(p, n, "s.bin", &f, err, ERRLEN);
    if (rc)
        return rc;
    rc = llst_to_cache(&f, sh, "s.bin", c, err, ERRLEN);
    if (rc) {
        ck_assert_ptr_null(c->keys);
        ck_assert(err[0] != 0);
    }
    llst_free(&f);
    return rc;
}

/* ---- files on disk (llst_open, llst_stream) -------------------------------- */

/* A scratch directory for one test (removed by tmp_done, which fails the
 * test if anything is left in it). */
static void tmp_dir(char dir[40])
{
    strcpy(dir, "/tmp/test_llama_state.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}
static void tmp_done(const char *dir)
{
    ck_assert_msg(rmdir(dir) == 0, "%s: not empty (a temporary file left?)", dir);
}

/* bytes p[0..n) as the file path, opened and given to llst_open */
static int open_bytes(const char *path, const uint8_t *p, size_t n, llst_file *f, char *err)
{
    tu_write_file(path, p, n);
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    return llst_open(fd, n, "s.bin", f, err, ERRLEN);
}

/* Every range of positions of sizes 1, 2, 3 and all, from every first
 * position, of every layer's keys and values, read from a (eager) and b
 * (lazy) with tight and padded strides into buffers of the same filler:
 * 0 when every byte agrees, else 1. */
static int reads_agree(const kvio_cache *a, const kvio_cache *b)
{
    uint32_t T = a->n_positions, H = a->n_kv_heads;
    size_t el = kvio_dtype_size(a->dtype), D = a->key_dim > a->value_dim ? a->key_dim : a->value_dim;
    size_t hs = D * el + 3, ps = H * hs + 5, cap = (size_t)(T ? T : 1) * ps;
    uint8_t *x = malloc(cap), *y = malloc(cap);
    char err[ERRLEN];
    int bad = a->dtype != b->dtype || T != b->n_positions || !a->tokens != !b->tokens ||
              (a->tokens && memcmp(a->tokens, b->tokens, T * sizeof *a->tokens)) ||
              a->token_width != b->token_width;
    for (uint32_t l = 0; l < a->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t len = 1; len <= T; len = len == 3 && T > 3 ? T : len + 1)
                for (uint32_t first = 0; first + len <= T; first++)
                    for (int pad = 0; pad < 2; pad++) {
                        size_t rb = (kv ? a->value_dim : a->key_dim) * el;
                        size_t h2 = pad ? hs : rb, p2 = pad ? ps : H * rb;
                        memset(x, 0xA5, cap);
                        memset(y, 0xA5, cap);
                        bad |= kvio_read_kv(a, l, kv, first, len, x, p2, h2, err, ERRLEN) != KVIO_OK;
                        bad |= kvio_read_kv(b, l, kv, first, len, y, p2, h2, err, ERRLEN) != KVIO_OK;
                        bad |= memcmp(x, y, cap) != 0;
                    }
    free(x);
    free(y);
    return bad;
}

/* The file built from s, read eagerly (llst_parse, llst_to_cache) and
 * lazily (llst_open of it on disk, llst_to_cache_lazy): 0 when both agree
 * in every field and every read, else 1. */
static int lazy_vs_eager(const spec *s, const char *path)
{
    size_t n;
    uint8_t *p = build(s, &n, NULL);
    llst_shape sh = shape_of(s);
    llst_file f, g;
    kvio_cache a, b;
    char err[ERRLEN];
    int bad = llst_parse(p, n, "s.bin", &f, err, ERRLEN) != LLST_OK;
    bad |= open_bytes(path, p, n, &g, err) != LLST_OK;
    if (!bad) {
        bad |= f.n_cells != g.n_cells || f.v_trans != g.v_trans || f.n_layer != g.n_layer ||
               f.n_tokens != g.n_tokens || f.stream != g.stream || f.size != g.size;
        for (uint32_t l = 0; !bad && l < f.n_layer; l++)
            bad |= f.layers[l].k_off != g.layers[l].k_off || f.layers[l].v_off != g.layers[l].v_off ||
                   g.layers[l].k || g.layers[l].v;
        bad |= llst_to_cache(&f, &sh, "s.bin", &a, err, ERRLEN) != LLST_OK;
        bad |= llst_to_cache_lazy(&g, &sh, "s.bin", &b, err, ERRLEN) != LLST_OK;
        if (!bad)
            bad |= reads_agree(&a, &b) | (b.lazy == NULL) | (g.src != NULL);
        kvio_cache_free(&a);
        kvio_cache_free(&b);
    }
    llst_free(&f);
    llst_free(&g);
    remove(path);
    free(p);
    return bad;
}

/* ---- parse -------------------------------------------------------------- */

START_TEST(parse_seq_fields)
{
    spec s = base_spec();
    s.n_stream = 2;
    s.stream = 1;
    s.seq = 7;
    offs o;
    size_t n;
    uint8_t *p = build(&s, &n, &o);
    llst_file f;
    char err[ERRLEN];
    ck_assert_int_eq(llst_sniff(p, n), LLST_KIND_SEQ);
    ck_assert_int_eq(llst_parse(p, n, "s.bin", &f, err, ERRLEN), LLST_OK);
    ck_assert_int_eq(f.kind, LLST_KIND_SEQ);
    ck_assert_uint_eq(f.version, 3);
    ck_assert_uint_eq(f.n_tokens, 3);
    for (uint32_t t = 0; t < 3; t++)
        ck_assert_int_eq(f.tokens[t], tok_of(t));
    ck_assert_ptr_null(f.arch);
    ck_assert_uint_eq(f.n_stream, 2);
    ck_assert_uint_eq(f.stream, 1);
    ck_assert_uint_eq(f.n_cells, 3);
    for (uint32_t t = 0; t < 3; t++) {
        ck_assert_int_eq(f.pos[t], (int32_t)t);
        ck_assert_int_eq(f.seq_id[t], 7);
    }
    ck_assert_uint_eq(f.v_trans, 0);
    ck_assert_uint_eq(f.n_layer, 2);
    for (uint32_t l = 0; l < 2; l++) {
        ck_assert_int_eq(f.layers[l].k_type, LLST_GGML_F16);
        ck_assert_uint_eq(f.layers[l].k_row_bytes, 2 * 4 * 2);
        ck_assert_ptr_eq(f.layers[l].k, p + o.k[l] + 12);
        ck_assert_int_eq(f.layers[l].v_type, LLST_GGML_F16);
        ck_assert_uint_eq(f.layers[l].v_row_bytes, 2 * 3 * 2);
        ck_assert_uint_eq(f.layers[l].v_el_bytes, 0);
        ck_assert_uint_eq(f.layers[l].v_n_embd, 0);
        ck_assert_ptr_eq(f.layers[l].v, p + o.v[l] + 12);
    }
    ck_assert_uint_eq(f.size, n);
    llst_free(&f);
    ck_assert_ptr_null(f.layers);
    llst_free(NULL);
    free(p);
}
END_TEST

START_TEST(parse_session_vtrans_fields)
{
    spec s = base_spec();
    s.kind = LLST_KIND_SESSION;
    s.arch = "qwen2";
    s.v_trans = 1;
    s.kt = LLST_GGML_F32;
    s.vt = LLST_GGML_BF16;
    offs o;
    size_t n;
    uint8_t *p = build(&s, &n, &o);
    llst_file f;
    char err[ERRLEN];
    ck_assert_int_eq(llst_sniff(p, n), LLST_KIND_SESSION);
    ck_assert_int_eq(llst_parse(p, n, "s.bin", &f, err, ERRLEN), LLST_OK);
    ck_assert_int_eq(f.kind, LLST_KIND_SESSION);
    ck_assert_uint_eq(f.version, 10);
    ck_assert_str_eq(f.arch, "qwen2");
    ck_assert_uint_eq(f.n_stream, 1);
    ck_assert_uint_eq(f.stream, 0);
    ck_assert_uint_eq(f.v_trans, 1);
    for (uint32_t l = 0; l < 2; l++) {
        ck_assert_int_eq(f.layers[l].k_type, LLST_GGML_F32);
        ck_assert_uint_eq(f.layers[l].k_row_bytes, 2 * 4 * 4);
        ck_assert_int_eq(f.layers[l].v_type, LLST_GGML_BF16);
        ck_assert_uint_eq(f.layers[l].v_el_bytes, 2);
        ck_assert_uint_eq(f.layers[l].v_n_embd, 6);
        ck_assert_uint_eq(f.layers[l].v_row_bytes, 12);
        ck_assert_ptr_eq(f.layers[l].v, p + o.v[l] + 12);
    }
    llst_free(&f);
    free(p);
}
END_TEST

START_TEST(parse_empty_state)
{
    for (int k = 0; k < 2; k++) {
        spec s = base_spec();
        s.kind = k ? LLST_KIND_SESSION : LLST_KIND_SEQ;
        s.T = 0;
        s.n_tokens = 0;
        s.n_stream = 3;
        size_t n;
        uint8_t *p = build(&s, &n, NULL);
        llst_file f;
        char err[ERRLEN];
        ck_assert_int_eq(llst_parse(p, n, "s.bin", &f, err, ERRLEN), LLST_OK);
        ck_assert_uint_eq(f.n_cells, 0);
        ck_assert_uint_eq(f.n_stream, 3);
        ck_assert_uint_eq(f.stream, 0);
        ck_assert_uint_eq(f.n_layer, 0);
        kvio_cache c;
        llst_shape sh = shape_of(&s);
        ck_assert_int_eq(llst_to_cache(&f, &sh, "s.bin", &c, err, ERRLEN), LLST_OK);
        ck_assert_uint_eq(c.n_positions, 0);
        ck_assert_uint_eq(c.n_layers, 2);
        ck_assert_ptr_null(c.tokens);
        kvio_cache_free(&c);
        llst_free(&f);
        free(p);
    }
}
END_TEST

START_TEST(names)
{
    ck_assert_str_eq(llst_kind_name(LLST_KIND_SEQ), "sequence state");
    ck_assert_str_eq(llst_kind_name(LLST_KIND_SESSION), "session");
    ck_assert_str_eq(llst_kind_name(LLST_KIND_NONE), "none");
    ck_assert_str_eq(llst_type_name(0), "f32");
    ck_assert_str_eq(llst_type_name(1), "f16");
    ck_assert_str_eq(llst_type_name(30), "bf16");
    ck_assert_str_eq(llst_type_name(8), "ggml type 8");
    ck_assert_str_eq(llst_type_name(-3), "ggml type -3");
    static const uint8_t gguf[4] = {'G', 'G', 'U', 'F'};
    ck_assert_int_eq(llst_sniff(gguf, 4), LLST_KIND_NONE);
    ck_assert_int_eq(llst_sniff("qsgg", 3), LLST_KIND_NONE);
    ck_assert_int_eq(llst_sniff("qsgg", 4), LLST_KIND_SEQ);
    ck_assert_int_eq(llst_sniff("nsgg", 4), LLST_KIND_SESSION);
    ck_assert(strlen(llst_strerror(LLST_E_UNSUPPORTED)) > 0);
}
END_TEST

/* ---- to_cache ------------------------------------------------------------ */

static void expect_elem(const kvio_cache *c, int kv, uint32_t l, uint32_t h, uint32_t t, uint32_t d,
                        size_t file_el)
{
    uint32_t D = kv ? c->value_dim : c->key_dim;
    const uint8_t *base = (kv ? c->values : c->keys)[l];
    size_t cel = kvio_dtype_size(c->dtype);
    const uint8_t *got = base + (((size_t)h * c->n_positions + t) * D + d) * cel;
    uint32_t j = h * D + d;
    uint8_t want[4];
    for (size_t i = 0; i < file_el; i++)
        want[i] = eb(kv, l, t, j, i);
    if (cel == file_el) {
        EXPECTF(!memcmp(got, want, cel), "%s l%u h%u t%u d%u differs", kv ? "V" : "K", l, h, t, d);
        return;
    }
    /* widened: exact f16 / bf16 -> f32 */
    ck_assert_uint_eq(cel, 4);
    uint16_t bits = (uint16_t)(want[0] | want[1] << 8);
    float w = c->dtype == FKVF_DTYPE_F32 && file_el == 2 ? fkvf_f16_to_f32(bits) : 0;
    float g = tu_ldf32le(got); /* the cache holds little-endian elements (cacheio.h) */
    EXPECTF(!memcmp(&g, &w, 4) || (w != w && g != g), "%s l%u h%u t%u d%u: %g, want %g", kv ? "V" : "K", l, h, t,
            d, (double)g, (double)w);
}

START_TEST(to_cache_elements)
{
    static const int32_t types[3] = {LLST_GGML_F16, LLST_GGML_F32, LLST_GGML_BF16};
    static const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_F32, FKVF_DTYPE_BF16};
    for (int ti = 0; ti < 3; ti++)
        for (uint32_t vt = 0; vt < 2; vt++) {
            spec s = base_spec();
            s.kt = s.vt = types[ti];
            s.v_trans = vt;
            s.T = 5;
            s.n_tokens = 5;
            s.H = 3;
            size_t n;
            uint8_t *p = build(&s, &n, NULL);
            kvio_cache c;
            char err[ERRLEN];
            llst_shape sh = shape_of(&s);
            int rc = parse_cache(p, n, &sh, &c, err);
            if (rc)
                ck_abort_msg("%s", err);
            ck_assert_int_eq(c.dtype, dts[ti]);
            ck_assert_uint_eq(c.n_layers, 2);
            ck_assert_uint_eq(c.n_kv_heads, 3);
            ck_assert_uint_eq(c.n_positions, 5);
            ck_assert_uint_eq(c.key_dim, 4);
            ck_assert_uint_eq(c.value_dim, 3);
            ck_assert_uint_eq(c.token_width, 4);
            for (uint32_t t = 0; t < 5; t++)
                ck_assert_int_eq(c.tokens[t], tok_of(t));
            /* chosen positions, then all of them */
            expect_elem(&c, 0, 0, 0, 0, 0, el_size(s.kt));
            expect_elem(&c, 0, 1, 2, 4, 3, el_size(s.kt));
            expect_elem(&c, 1, 0, 1, 3, 2, el_size(s.vt));
            expect_elem(&c, 1, 1, 2, 1, 0, el_size(s.vt));
            for (uint32_t l = 0; l < 2; l++)
                for (uint32_t h = 0; h < 3; h++)
                    for (uint32_t t = 0; t < 5; t++) {
                        for (uint32_t d = 0; d < 4; d++)
                            expect_elem(&c, 0, l, h, t, d, el_size(s.kt));
                        for (uint32_t d = 0; d < 3; d++)
                            expect_elem(&c, 1, l, h, t, d, el_size(s.vt));
                    }
            kvio_cache_free(&c);
            free(p);
        }
}
END_TEST

/* V transposed, by hand: 1 layer, 2 heads, dim 1, 2 cells, f32. Channel j
 * (head j) holds cells 0, 1; the cache wants [head][position]. */
START_TEST(to_cache_vtrans_by_hand)
{
    bb b = {0};
    b_u32(&b, 0x67677371u);
    b_u32(&b, 3);
    b_u32(&b, 0); /* no tokens */
    b_u32(&b, 1);
    b_u32(&b, 2);
    for (int t = 0; t < 2; t++) {
        b_i32(&b, t);
        b_u32(&b, 1);
        b_i32(&b, 0);
    }
    b_u32(&b, 1); /* v_trans */
    b_u32(&b, 1); /* n_layer */
    b_i32(&b, 0);
    b_u64(&b, 8); /* K rows: cell t = (head 0, head 1) */
    const float k[4] = {1, 2, 3, 4};
    const float v[4] = {10, 11, 20, 21}; /* channel 0: cells 0,1; channel 1: cells 0,1 */
    for (int i = 0; i < 4; i++) {
        uint32_t u;
        memcpy(&u, &k[i], 4);
        b_u32(&b, u);
    }
    b_i32(&b, 0);
    b_u32(&b, 4);
    b_u32(&b, 2);
    for (int i = 0; i < 4; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        b_u32(&b, u);
    }
    llst_shape sh = {1, 2, 1, 1};
    kvio_cache c;
    char err[ERRLEN];
    int rc = parse_cache(b.p, b.n, &sh, &c, err);
    if (rc)
        ck_abort_msg("%s", err);
    /* the cache's elements are little-endian bytes (cacheio.h) */
    float K[4], V[4];
    for (int i = 0; i < 4; i++) {
        K[i] = tu_ldf32le(c.keys[0] + 4 * i);
        V[i] = tu_ldf32le(c.values[0] + 4 * i);
    }
    /* keys [head][pos]: h0 = (1, 3), h1 = (2, 4); values h0 = (10, 11), h1 = (20, 21) */
    ck_assert(K[0] == 1 && K[1] == 3 && K[2] == 2 && K[3] == 4);
    ck_assert(V[0] == 10 && V[1] == 11 && V[2] == 20 && V[3] == 21);
    ck_assert_ptr_null(c.tokens);
    kvio_cache_free(&c);
    free(b.p);
}
END_TEST

START_TEST(mixed_types_to_f32_and_back)
{
    static const int32_t kv[3][2] = {{LLST_GGML_F16, LLST_GGML_F32}, {LLST_GGML_F32, LLST_GGML_F16}, {LLST_GGML_BF16, LLST_GGML_F16}};
    for (int i = 0; i < 3; i++)
        for (uint32_t vt = 0; vt < 2; vt++) {
            spec s = base_spec();
            s.kt = kv[i][0];
            s.vt = kv[i][1];
            s.v_trans = vt;
            size_t n;
            uint8_t *p = build(&s, &n, NULL);
            llst_file f;
            char err[ERRLEN];
            ck_assert_int_eq(llst_parse(p, n, "s.bin", &f, err, ERRLEN), LLST_OK);
            llst_shape sh = shape_of(&s);
            kvio_cache c;
            ck_assert_int_eq(llst_to_cache(&f, &sh, "s.bin", &c, err, ERRLEN), LLST_OK);
            ck_assert_int_eq(c.dtype, FKVF_DTYPE_F32);
            if (s.kt == LLST_GGML_F16)
                expect_elem(&c, 0, 1, 1, 2, 3, 2);
            if (s.vt == LLST_GGML_F16)
                for (uint32_t t = 0; t < s.T; t++)
                    expect_elem(&c, 1, 0, 1, t, 2, 2);
            if (s.kt == LLST_GGML_F32)
                expect_elem(&c, 0, 0, 1, 2, 1, 4);
            if (s.vt == LLST_GGML_F32)
                expect_elem(&c, 1, 1, 0, 1, 2, 4);
            llst_params prm;
            llst_params_from_file(&f, &prm);
            ck_assert_int_eq(prm.k_type, s.kt);
            ck_assert_int_eq(prm.v_type, s.vt);
            uint8_t *out;
            size_t on;
            ck_assert_int_eq(llst_write_mem(&c, &prm, &out, &on, err, ERRLEN), LLST_OK);
            ck_assert_uint_eq(on, n);
            ck_assert(!memcmp(out, p, n));
            free(out);
            kvio_cache_free(&c);
            llst_free(&f);
            free(p);
        }
}
END_TEST

/* ---- the round trip ------------------------------------------------------- */

START_TEST(round_trip_matrix)
{
    static const int32_t types[3] = {LLST_GGML_F16, LLST_GGML_F32, LLST_GGML_BF16};
    static const uint32_t streams[4][2] = {{1, 0}, {2, 0}, {2, 1}, {4, 3}};
    int cases = 0;
    for (int ti = 0; ti < 3; ti++)
        for (uint32_t vt = 0; vt < 2; vt++)
            for (int si = 0; si < 4; si++)
                for (int kind = 1; kind <= 2; kind++)
                    for (int tok = 0; tok < 2; tok++)
                        for (uint32_t T = 0; T <= 4; T += 2) {
                            spec s = base_spec();
                            s.kt = s.vt = types[ti];
                            s.v_trans = vt;
                            s.n_stream = streams[si][0];
                            s.stream = streams[si][1];
                            s.kind = (llst_kind)kind;
                            s.arch = kind == 2 && tok ? "" : "llama";
                            s.T = T;
                            s.n_tokens = tok ? T : 0;
                            s.seq = T == 4 ? 3 : 0;
                            size_t n;
                            uint8_t *p = build(&s, &n, NULL);
                            llst_file f;
                            char err[ERRLEN];
                            int rc = llst_parse(p, n, "s.bin", &f, err, ERRLEN);
                            if (rc)
                                ck_abort_msg("%s", err);
                            llst_shape sh = shape_of(&s);
                            kvio_cache c;
                            if ((rc = llst_to_cache(&f, &sh, "s.bin", &c, err, ERRLEN)))
                                ck_abort_msg("%s", err);
                            llst_params prm;
                            llst_params_from_file(&f, &prm);
                            uint8_t *out;
                            size_t on;
                            if ((rc = llst_write_mem(&c, &prm, &out, &on, err, ERRLEN)))
                                ck_abort_msg("%s", err);
                            EXPECTF(on == n && !memcmp(out, p, n),
                                    "type %d v_trans %u streams %u/%u kind %d tokens %d T %u: %zu bytes, want %zu",
                                    types[ti], vt, s.n_stream, s.stream, kind, tok, T, on, n);
                            free(out);
                            kvio_cache_free(&c);
                            llst_free(&f);
                            free(p);
                            cases++;
                        }
    ck_assert_int_eq(cases, 3 * 2 * 4 * 2 * 2 * 3);
}
END_TEST

/* A cache built in memory (f32) written as f16, compared with the builder. */
START_TEST(write_from_cache)
{
    spec s = base_spec();
    s.v_trans = 1;
    s.kt = s.vt = LLST_GGML_F32;
    size_t n;
    uint8_t *p = build(&s, &n, NULL);
    kvio_cache c;
    char err[ERRLEN];
    ck_assert_int_eq(kvio_cache_init(&c, s.L, s.H, s.T, s.Dk, s.Dv, FKVF_DTYPE_F32, 1, err, sizeof err), KVIO_OK);
    for (uint32_t l = 0; l < s.L; l++)
        for (uint32_t h = 0; h < s.H; h++)
            for (uint32_t t = 0; t < s.T; t++) {
                for (uint32_t d = 0; d < s.Dk; d++)
                    for (size_t i = 0; i < 4; i++)
                        c.keys[l][((h * s.T + t) * s.Dk + d) * 4 + i] = eb(0, l, t, h * s.Dk + d, i);
                for (uint32_t d = 0; d < s.Dv; d++)
                    for (size_t i = 0; i < 4; i++)
                        c.values[l][((h * s.T + t) * s.Dv + d) * 4 + i] = eb(1, l, t, h * s.Dv + d, i);
            }
    for (uint32_t t = 0; t < s.T; t++)
        c.tokens[t] = tok_of(t);
    llst_params prm = {LLST_KIND_SEQ, 1, 0, 0, 1, LLST_GGML_F32, LLST_GGML_F32, NULL};
    uint8_t *out;
    size_t on;
    ck_assert_int_eq(llst_write_mem(&c, &prm, &out, &on, err, ERRLEN), LLST_OK);
    ck_assert_uint_eq(on, n);
    ck_assert(!memcmp(out, p, n));
    free(out);
    /* f32 1.5 written as f16 is 0x3E00, as bf16 0x3FC0 */
    float one5 = 1.5f;
    tu_le_f32(&one5, 1); /* a cache element: little-endian bytes (cacheio.h) */
    memcpy(c.keys[0], &one5, 4);
    prm.k_type = LLST_GGML_F16;
    prm.v_trans = 0;
    ck_assert_int_eq(llst_write_mem(&c, &prm, &out, &on, err, ERRLEN), LLST_OK);
    size_t k0 = 12 + 4 * s.T + 4 + 4 + 12 * s.T + 8 + 12; /* first K element */
    ck_assert_uint_eq(out[k0], 0x00);
    ck_assert_uint_eq(out[k0 + 1], 0x3E);
    free(out);
    prm.k_type = LLST_GGML_BF16;
    ck_assert_int_eq(llst_write_mem(&c, &prm, &out, &on, err, ERRLEN), LLST_OK);
    ck_assert_uint_eq(out[k0], 0xC0);
    ck_assert_uint_eq(out[k0 + 1], 0x3F);
    free(out);
    kvio_cache_free(&c);
    free(p);
}
END_TEST

/* The size llama.cpp's f16 sequence state of the stories260K model was
 * observed to have (issue 14): 148 + 656 N bytes for N tokens (5 layers,
 * 4 KV heads, head dim 8), for either V layout. */
START_TEST(write_size_matches_llama_cpp)
{
    for (uint32_t N = 0; N <= 7; N += 7)
        for (uint32_t vt = 0; vt < 2; vt++) {
            kvio_cache c;
            char err[ERRLEN];
            ck_assert_int_eq(kvio_cache_init(&c, 5, 4, N, 8, 8, FKVF_DTYPE_F16, 1, err, sizeof err), KVIO_OK);
            llst_params prm = {LLST_KIND_SEQ, 1, 0, 0, vt, LLST_GGML_F16, LLST_GGML_F16, NULL};
            uint8_t *out;
            size_t on;
            ck_assert_int_eq(llst_write_mem(&c, &prm, &out, &on, err, ERRLEN), LLST_OK);
            ck_assert_uint_eq(on, N ? 148 + 656 * N : 20);
            free(out);
            kvio_cache_free(&c);
        }
}
END_TEST

START_TEST(write_refuses_bad_params)
{
    kvio_cache c;
    char err[ERRLEN];
    ck_assert_int_eq(kvio_cache_init(&c, 1, 1, 2, 2, 2, FKVF_DTYPE_F16, 1, err, sizeof err), KVIO_OK);
    const llst_params good = {LLST_KIND_SEQ, 1, 0, 0, 0, LLST_GGML_F16, LLST_GGML_F16, NULL};
    uint8_t *out;
    size_t on;
    llst_params p = good;
    ck_assert_int_eq(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), LLST_OK);
    free(out);
    p.kind = LLST_KIND_NONE;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "kind");
    ck_assert_ptr_null(out);
    p = good;
    p.stream = 1;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "stream 1 of 1");
    p = good;
    p.k_type = 8;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "K type ggml type 8");
    p = good;
    p.v_trans = 2;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "v_trans 2");
    p = good;
    p.seq_id = -1;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "seq_id -1");
    p = good;
    p.kind = LLST_KIND_SESSION;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "architecture");
    p = good;
    c.tokens[1] = (int64_t)INT32_MAX + 1;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "does not fit int32");
    c.tokens[1] = -2;
    EXPECT_ERR(llst_write_mem(&c, &p, &out, &on, err, ERRLEN), err, LLST_E_ARG, "negative");
    kvio_cache_free(&c);
}
END_TEST

START_TEST(write_file_atomic)
{
    char dir[] = "/tmp/test_llama_state.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[300], err[ERRLEN];
    snprintf(path, sizeof path, "%s/s.bin", dir);
    spec s = base_spec();
    s.kind = LLST_KIND_SESSION;
    size_t n;
    uint8_t *p = build(&s, &n, NULL);
    kvio_cache c;
    llst_shape sh = shape_of(&s);
    ck_assert_int_eq(parse_cache(p, n, &sh, &c, err), LLST_OK);
    llst_params prm = {LLST_KIND_SESSION, 1, 0, 0, 0, LLST_GGML_F16, LLST_GGML_F16, "llama"};
    ck_assert_int_eq(llst_write_file(path, KVIO_WRITE_NO_REPLACE, &c, &prm, err, ERRLEN), LLST_OK);
    size_t gn;
    uint8_t *g = tu_slurp(path, &gn);
    ck_assert_uint_eq(gn, n);
    ck_assert(!memcmp(g, p, n));
    free(g);
    /* NO_REPLACE refuses the existing file and leaves it as it was */
    prm.v_trans = 1;
    EXPECT_ERR(llst_write_file(path, KVIO_WRITE_NO_REPLACE, &c, &prm, err, ERRLEN), err, LLST_E_IO, "s.bin");
    g = tu_slurp(path, &gn);
    ck_assert(gn == n && !memcmp(g, p, n));
    free(g);
    /* without it, replaced */
    ck_assert_int_eq(llst_write_file(path, 0, &c, &prm, err, ERRLEN), LLST_OK);
    g = tu_slurp(path, &gn);
    ck_assert_uint_eq(gn, n);
    ck_assert(memcmp(g, p, n) != 0);
    free(g);
    char nodir[320];
    snprintf(nodir, sizeof nodir, "%s/no/s.bin", dir);
    ck_assert_int_eq(llst_write_file(nodir, 0, &c, &prm, err, ERRLEN), LLST_E_IO);
    remove(path);
    ck_assert_int_eq(rmdir(dir), 0); /* no temporary file left */
    kvio_cache_free(&c);
    free(p);
}
END_TEST

/* ---- errors ---------------------------------------------------------------- */

START_TEST(parse_errors)
{
    spec s = base_spec();
    offs o;
    size_t n;
    uint8_t *p = build(&s, &n, &o);
    uint8_t *q = malloc(n + 64);
    llst_file f;
    char err[ERRLEN], want[96];

    memcpy(q, p, n);
    memcpy(q, "GGUF", 4);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, "s.bin: offset 0: magic", "not a llama.cpp state file");

    memcpy(q, p, n);
    put32(q, 4, 2);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_UNSUPPORTED, "offset 4: version", "version 2", "reads version 3");

    memcpy(q, p, n);
    put32(q, o.n_tokens, 1000);
    snprintf(want, sizeof want, "offset %zu: n_tokens 1000", o.n_tokens + 4);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, want, "do not fit");

    memcpy(q, p, n);
    put32(q, o.n_stream, 0);
    snprintf(want, sizeof want, "offset %zu: n_stream: 0", o.n_stream);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, want);

    memcpy(q, p, n);
    put32(q, o.n_stream, 0xFFFFFFFFu);
    snprintf(want, sizeof want, "offset %zu: n_stream: 4294967295 streams", o.n_stream);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, want);

    { /* more streams than llama.cpp has sequences (LLST_MAX_STREAMS), each
       * empty one the 4 bytes of its count, there in the file: refused all
       * the same; exactly LLST_MAX_STREAMS parse. p's one stream comes
       * first, the empty ones after it. */
        for (uint32_t ns = LLST_MAX_STREAMS; ns <= LLST_MAX_STREAMS + 1; ns++) {
            size_t mn = n + 4 * (size_t)(ns - 1);
            uint8_t *mp = calloc(mn, 1);
            ck_assert_ptr_nonnull(mp);
            memcpy(mp, p, n);
            put32(mp, o.n_stream, ns);
            if (ns > LLST_MAX_STREAMS) {
                snprintf(want, sizeof want, "offset %zu: n_stream: %u streams, more than %u",
                         o.n_stream, ns, LLST_MAX_STREAMS);
                EXPECT_ERR(parse(mp, mn, &f, err), err, LLST_E_FORMAT, want);
            } else {
                ck_assert_int_eq(parse(mp, mn, &f, err), LLST_OK);
            }
            free(mp);
        }
    }

    memcpy(q, p, n);
    put32(q, o.count[0], 0x7FFFFFFFu);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, "cell_count 2147483647 x 8 bytes");

    memcpy(q, p, n);
    put32(q, o.cells + 12 + 4, 2); /* cell 1 n_seq_id */
    snprintf(want, sizeof want, "offset %zu: stream 0 cell 1 n_seq_id", o.cells + 16);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_UNSUPPORTED, want, "cell 1 is in 2 sequences");

    memcpy(q, p, n);
    put32(q, o.cells + 4, 0);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_UNSUPPORTED, "cell 0 is in 0 sequences");

    memcpy(q, p, n);
    put32(q, o.v_trans, 2);
    snprintf(want, sizeof want, "offset %zu: v_trans: 2", o.v_trans);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, want);

    memcpy(q, p, n);
    put32(q, o.n_layer, 1000);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, "n_layer 1000 x 24 bytes");

    memcpy(q, p, n);
    put32(q, o.k[0] + 4, 640);
    snprintf(want, sizeof want, "offset %zu: layer 0 K row bytes 640 do not fit", o.k[0] + 4);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, want, "(3 cells)");

    memcpy(q, p, n);
    put32(q, o.k[0] + 8, 1); /* row bytes >= 2^32 */
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, "layer 0 K row bytes 4294967312");

    memcpy(q, p, n);
    put32(q, o.v[1] + 4, 13);
    EXPECT_ERR(parse(q, n, &f, err), err, LLST_E_FORMAT, "layer 1 V row bytes 13");

    /* one byte less in the last row, one more after it */
    memcpy(q, p, n);
    q[n] = 0;
    snprintf(want, sizeof want, "offset %zu: 1 trailing bytes after the memory block", n);
    EXPECT_ERR(parse(q, n + 1, &f, err), err, LLST_E_FORMAT, want);
    EXPECT_ERR(parse(q, n - 1, &f, err), err, LLST_E_FORMAT, "layer 1 V row bytes");

    /* two non-empty streams: stream 0's block again as stream 1 */
    spec s2 = s;
    s2.n_stream = 2;
    offs o2;
    size_t n2;
    uint8_t *p2 = build(&s2, &n2, &o2);
    size_t blk = o2.count[1] - o2.count[0];
    uint8_t *q2 = malloc(n2 - 4 + blk);
    memcpy(q2, p2, o2.count[1]);
    memcpy(q2 + o2.count[1], p2 + o2.count[0], blk);
    snprintf(want, sizeof want, "offset %zu: stream 1 cell_count: 3 cells in stream 1 as well as stream 0",
             o2.count[1]);
    EXPECT_ERR(parse(q2, o2.count[1] + blk, &f, err), err, LLST_E_UNSUPPORTED, want, "several sequences",
               "llama_state_seq_save_file");
    free(q2);
    free(p2);

    /* session: version, arch length, a NUL in the arch */
    spec ss = s;
    ss.kind = LLST_KIND_SESSION;
    ss.arch = "llama";
    offs os;
    size_t ns;
    uint8_t *ps = build(&ss, &ns, &os);
    uint8_t *qs = malloc(ns);
    memcpy(qs, ps, ns);
    put32(qs, 4, 9);
    EXPECT_ERR(parse(qs, ns, &f, err), err, LLST_E_UNSUPPORTED, "session file version 9", "reads version 10");
    memcpy(qs, ps, ns);
    put32(qs, os.arch - 4, 0xFFFFFFF0u);
    snprintf(want, sizeof want, "offset %zu: arch length 4294967280", os.arch);
    EXPECT_ERR(parse(qs, ns, &f, err), err, LLST_E_FORMAT, want);
    memcpy(qs, ps, ns);
    qs[os.arch + 2] = 0;
    snprintf(want, sizeof want, "offset %zu: arch: contains a NUL byte", os.arch);
    EXPECT_ERR(parse(qs, ns, &f, err), err, LLST_E_FORMAT, want);
    free(qs);
    free(ps);

    ck_assert_int_eq(llst_parse(p, n, "s.bin", NULL, err, ERRLEN), LLST_E_ARG);
    EXPECT_ERR(llst_parse(NULL, 4, "s.bin", &f, err, ERRLEN), err, LLST_E_ARG, "s.bin");
    EXPECT_ERR(llst_parse(p, 0, "s.bin", &f, err, ERRLEN), err, LLST_E_FORMAT, "offset 0: magic", "truncated");
    free(q);
    free(p);
}
END_TEST

/* build, patch, parse (must succeed), llst_to_cache (its result) */
static int cache_rc(const spec *s, const llst_shape *sh, size_t patch_at, uint32_t patch, size_t patch2_at,
                    uint32_t patch2, char *err)
{
    size_t n;
    uint8_t *p = build(s, &n, NULL);
    if (patch_at)
        put32(p, patch_at, patch);
    if (patch2_at)
        put32(p, patch2_at, patch2);
    llst_file f;
    int rc = llst_parse(p, n, "s.bin", &f, err, ERRLEN);
    if (rc)
        ck_abort_msg("parse: %s", err);
    kvio_cache c;
    rc = llst_to_cache(&f, sh, "s.bin", &c, err, ERRLEN);
    if (rc) {
        ck_assert_ptr_null(c.keys);
        ck_assert_uint_eq(c.n_layers, 0);
    }
    kvio_cache_free(&c);
    llst_free(&f);
    free(p);
    return rc;
}

START_TEST(to_cache_errors)
{
    spec s = base_spec();
    offs o;
    size_t n;
    free(build(&s, &n, &o));
    llst_shape sh = shape_of(&s);
    char err[ERRLEN];

    EXPECT_ERR(cache_rc(&s, &sh, o.k[0], 8, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "s.bin: layer 0: K type q8_0 (ggml type 8) is quantized: use an f16, bf16 or f32 cache "
               "(llama.cpp --cache-type-k f16; node-llama-cpp experimentalKvCacheKeyType \"F16\")");
    EXPECT_ERR(cache_rc(&s, &sh, o.v[1], 2, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "layer 1: V type q4_0 (ggml type 2) is quantized", "--cache-type-v f16");
    EXPECT_ERR(cache_rc(&s, &sh, o.k[1], 26, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "layer 1: K type i32 (ggml type 26) is not a cache type supported");
    EXPECT_ERR(cache_rc(&s, &sh, o.k[0], 99, 0, 0, err), err, LLST_E_UNSUPPORTED, "K type (ggml type 99)");
    EXPECT_ERR(cache_rc(&s, &sh, o.k[1], LLST_GGML_BF16, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "layer 1: K type bf16 differs from layer 0's");
    EXPECT_ERR(cache_rc(&s, &sh, o.v[1], LLST_GGML_BF16, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "layer 1: V type bf16 differs");

    llst_shape bad = sh;
    bad.key_dim = 5;
    EXPECT_ERR(cache_rc(&s, &bad, 0, 0, 0, 0, err), err, LLST_E_FORMAT,
               "layer 0 K row bytes 16 do not match the model: 2 KV heads x 5 dims x 2 bytes (f16) = 20");
    bad = sh;
    bad.value_dim = 2;
    EXPECT_ERR(cache_rc(&s, &bad, 0, 0, 0, 0, err), err, LLST_E_FORMAT, "layer 0 V row bytes 12 do not match");
    bad = sh;
    bad.n_layers = 3;
    EXPECT_ERR(cache_rc(&s, &bad, 0, 0, 0, 0, err), err, LLST_E_FORMAT, "n_layer: the file has 2 layers, the model 3");
    bad = sh;
    bad.n_kv_heads = 0;
    EXPECT_ERR(cache_rc(&s, &bad, 0, 0, 0, 0, err), err, LLST_E_ARG, "model shape");
    /* f32 K in a file whose rows are f16-sized */
    EXPECT_ERR(cache_rc(&s, &sh, o.k[0], LLST_GGML_F32, o.k[1], LLST_GGML_F32, err), err, LLST_E_FORMAT,
               "layer 0 K row bytes 16 do not match the model: 2 KV heads x 4 dims x 4 bytes (f32) = 32");

    /* transposed V: element bytes 4 and n_embd 3 (the same 12 bytes a cell) */
    spec st = s;
    st.v_trans = 1;
    offs ot;
    free(build(&st, &n, &ot));
    EXPECT_ERR(cache_rc(&st, &sh, ot.v[0] + 4, 4, ot.v[0] + 8, 3, err), err, LLST_E_FORMAT,
               "layer 0 V (transposed): element bytes 4 and n_embd_v_gqa 3 do not match the model");

    /* cells */
    EXPECT_ERR(cache_rc(&s, &sh, o.cells + 2 * 12, 5, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "cell 2 has position 5, not 2: the cells are not positions 0..n-1 in order (after a context shift or a removed range");
    EXPECT_ERR(cache_rc(&s, &sh, o.cells, 1, o.cells + 12, 0, err), err, LLST_E_UNSUPPORTED,
               "cell 0 has position 1");
    EXPECT_ERR(cache_rc(&s, &sh, o.cells + 12 + 8, 4, 0, 0, err), err, LLST_E_UNSUPPORTED,
               "cell 1 is in sequence 4, cell 0 in 0: several sequences");
    EXPECT_ERR(cache_rc(&s, &sh, o.cells + 8, 0xFFFFFFFFu, 0, 0, err), err, LLST_E_FORMAT,
               "cell 0: sequence id -1 is negative");
    EXPECT_ERR(cache_rc(&s, &sh, o.tokens + 4, 0xFFFFFFFEu, 0, 0, err), err, LLST_E_FORMAT,
               "token 1 is negative (-2)");
    spec sn = s;
    sn.n_tokens = 2;
    EXPECT_ERR(cache_rc(&sn, &sh, 0, 0, 0, 0, err), err, LLST_E_UNSUPPORTED, "n_tokens: 2 tokens for 3 cells");
    sn.T = 0;
    EXPECT_ERR(cache_rc(&sn, &sh, 0, 0, 0, 0, err), err, LLST_E_UNSUPPORTED, "n_tokens: 2 tokens for 0 cells");
    /* 0 tokens with cells is fine: a cache without tokens */
    sn.T = 3;
    sn.n_tokens = 0;
    ck_assert_int_eq(cache_rc(&sn, &sh, 0, 0, 0, 0, err), LLST_OK);
}
END_TEST

/* ---- hostile input --------------------------------------------------------- */

static uint8_t *small_file(int which, size_t *n)
{
    spec s = base_spec();
    s.T = 2;
    s.n_tokens = 2;
    s.L = 2;
    s.H = 1;
    s.Dk = 2;
    s.Dv = 2;
    if (which == 1) {
        s.kind = LLST_KIND_SESSION;
        s.arch = "ab";
        s.v_trans = 1;
        s.n_stream = 2;
        s.stream = 1;
        s.kt = LLST_GGML_F32;
    }
    return build(&s, n, NULL);
}

START_TEST(every_truncation_is_format)
{
    char dir[40], path[80];
    tmp_dir(dir);
    snprintf(path, sizeof path, "%s/s.bin", dir);
    int differ = 0; /* llst_open's result or message is not llst_parse's */
    for (int w = 0; w < 2; w++) {
        size_t n;
        uint8_t *p = small_file(w, &n);
        for (size_t k = 0; k < n; k++) {
            uint8_t *q = malloc(k ? k : 1);
            memcpy(q, p, k);
            llst_file f;
            char err[ERRLEN];
            err[0] = 0;
            int rc = llst_parse(q, k, "s.bin", &f, err, ERRLEN);
            EXPECTF(rc == LLST_E_FORMAT && err[0] && strstr(err, "offset "), "prefix %zu of %zu: rc %d: %s", k, n,
                    rc, err);
            EXPECT(f.layers == NULL && f.tokens == NULL && f.n_cells == 0);
            char err2[ERRLEN];
            err2[0] = 0;
            int rc2 = open_bytes(path, q, k, &f, err2);
            differ |= rc2 != rc || strcmp(err, err2) != 0 || f.layers || f.tokens || f.src;
            free(q);
        }
        free(p);
    }
    remove(path);
    tmp_done(dir);
    ck_assert_msg(!differ, "llst_open of a truncated file differs from llst_parse");
}
END_TEST

/* Every flip of one bit: parse, and if that works llst_to_cache, and if
 * that works llst_write_mem; no crash, and every failure has a message. */
/* The flipped file through llst_open and llst_to_cache_lazy: the same
 * results and messages as in memory (rc, err: llst_parse's, then cache_rc,
 * err2: llst_to_cache's when it ran), the same rows; 8 if not. */
static int flip_lazy(const uint8_t *q, size_t n, const llst_shape *sh, int rc, const char *err,
                     int cache_rc, const char *err2, const kvio_cache *eager)
{
    char path[64], e[ERRLEN];
    snprintf(path, sizeof path, "/tmp/test_llama_state.flip.%ld", (long)getpid());
    llst_file g;
    e[0] = 0;
    int bad = open_bytes(path, q, n, &g, e) != rc || strcmp(e, err) != 0;
    if (!bad && rc == LLST_OK) {
        kvio_cache b;
        e[0] = 0;
        int r2 = llst_to_cache_lazy(&g, sh, "s.bin", &b, e, ERRLEN);
        bad = r2 != cache_rc || strcmp(e, err2) != 0 || (r2 == LLST_OK && reads_agree(eager, &b));
        kvio_cache_free(&b);
    }
    llst_free(&g);
    remove(path);
    return bad ? 8 : 0;
}

static int flip_all(const uint8_t *p, size_t n, const llst_shape *sh)
{
    uint8_t *q = malloc(n);
    int bad = 0;
    for (size_t bit = 0; bit < 8 * n; bit++) {
        memcpy(q, p, n);
        q[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        llst_file f;
        char err[ERRLEN], err2[ERRLEN];
        err[0] = 0;
        int rc = llst_parse(q, n, "s.bin", &f, err, ERRLEN);
        if (rc != LLST_OK)
            bad |= flip_lazy(q, n, sh, rc, err, 0, "", NULL);
        if (rc != LLST_OK) {
            bad |= (!err[0]) | (rc == LLST_E_NOMEM) << 2;
            continue;
        }
        kvio_cache c;
        err2[0] = 0;
        int crc = llst_to_cache(&f, sh, "s.bin", &c, err2, ERRLEN);
        bad |= flip_lazy(q, n, sh, rc, err, crc, err2, &c);
        if (crc != LLST_OK) {
            bad |= (!err2[0]) | (crc == LLST_E_NOMEM) << 2;
            llst_free(&f);
            continue;
        }
        llst_params prm;
        llst_params_from_file(&f, &prm);
        uint8_t *out;
        size_t on;
        /* a flip that still parses to a cache writes back to the flipped bytes */
        if (llst_write_mem(&c, &prm, &out, &on, err, ERRLEN) != LLST_OK || on != n || memcmp(out, q, n))
            bad |= 2;
        else
            free(out);
        kvio_cache_free(&c);
        llst_free(&f);
    }
    free(q);
    return bad;
}

typedef struct flips_of {
    const uint8_t *p;
    size_t n;
    const llst_shape *sh;
} flips_of;

static int flip_all_child(void *ctx)
{
    const flips_of *fo = ctx;
    return flip_all(fo->p, fo->n, fo->sh);
}

START_TEST(every_bit_flip_no_crash)
{
    for (int w = 0; w < 2; w++) {
        size_t n;
        uint8_t *p = small_file(w, &n);
        llst_shape sh = {2, 1, 2, 2};
        flips_of fo = {p, n, &sh};
        int status = tu_run_limited((size_t)256 << 20, flip_all_child, &fo);
        ck_assert_msg(status >= 0, "file %d: the child died of signal %d", w, -status);
        ck_assert_msg(status == 0, "file %d: child status %d (bits: 1 a failure without a message, 2 a "
                      "flipped file that parsed did not write back to its bytes, 4 out of memory: an "
                      "allocation the file does not justify, 8 llst_open or llst_to_cache_lazy "
                      "differ from llst_parse or llst_to_cache)", w, status);
        free(p);
    }
}
END_TEST

/* ---- lazy reads and streamed writes ---------------------------------------- */

/* For every K type and V type (mixed ones read as f32), both V layouts,
 * both kinds, with and without token ids, each of three piece sizes (1
 * byte: every read a row or an element; 7; the default): what a lazy
 * cache reads equals the eager cache, range by range. */
START_TEST(lazy_matches_eager)
{
    static const int32_t types[3] = {LLST_GGML_F16, LLST_GGML_F32, LLST_GGML_BF16};
    static const size_t pieces[3] = {1, 7, 0};
    char dir[40], path[80];
    tmp_dir(dir);
    snprintf(path, sizeof path, "%s/s.bin", dir);
    int bad = 0, cases = 0, first_bad = -1;
    for (int pi = 0; pi < 3; pi++) {
        llst_set_piece(pieces[pi]);
        for (int kt = 0; kt < 3; kt++)
            for (int vt = 0; vt < 3; vt++)
                for (uint32_t tr = 0; tr < 2; tr++)
                    for (int kind = 1; kind <= 2; kind++) {
                        spec s = base_spec();
                        s.kt = types[kt];
                        s.vt = types[vt];
                        s.v_trans = tr;
                        s.kind = (llst_kind)kind;
                        s.T = 7;
                        s.n_tokens = kind == 1 ? 7 : 0;
                        s.L = 2;
                        s.H = 3;
                        s.Dk = 4;
                        s.Dv = 5;
                        int b = lazy_vs_eager(&s, path);
                        if (b && first_bad < 0)
                            first_bad = cases;
                        bad |= b;
                        cases++;
                    }
    }
    llst_set_piece(0);
    tmp_done(dir);
    ck_assert_msg(bad == 0 && cases == 3 * 3 * 3 * 2 * 2, "%d cases, the first that differs: %d",
                  cases, first_bad);
}
END_TEST

/* A state file cut after llst_open: reading what is gone is KVIO_E_IO
 * naming the file, the layer and the offset; what remains still reads. */
START_TEST(lazy_truncated_is_io_error)
{
    char dir[40], path[80], err[ERRLEN];
    tmp_dir(dir);
    snprintf(path, sizeof path, "%s/s.bin", dir);
    spec s = base_spec();
    s.T = 40;
    s.n_tokens = 40;
    s.v_trans = 1;
    size_t n;
    offs o;
    uint8_t *p = build(&s, &n, &o);
    llst_file f;
    kvio_cache c;
    llst_shape sh = shape_of(&s);
    ck_assert_int_eq(open_bytes(path, p, n, &f, err), LLST_OK);
    ck_assert_int_eq(llst_to_cache_lazy(&f, &sh, "s.bin", &c, err, ERRLEN), LLST_OK);
    ck_assert_int_eq(truncate(path, (off_t)o.v[1]), 0); /* layer 1's V gone */
    uint8_t buf[4096];
    size_t rb = (size_t)s.Dv * 2;
    char want[64];
    snprintf(want, sizeof want, "offset %zu", o.v[1] + 12); /* its first channel */
    EXPECT_ERR(kvio_read_kv(&c, 1, 1, 0, 3, buf, s.H * rb, rb, err, ERRLEN), err, KVIO_E_IO, "s.bin",
               want, "layer 1 V", "ended early");
    ck_assert_int_eq(kvio_read_kv(&c, 1, 0, 0, 40, buf, s.H * (size_t)s.Dk * 2, (size_t)s.Dk * 2, err,
                                  ERRLEN),
                     KVIO_OK);
    kvio_cache_free(&c);
    llst_free(&f);
    remove(path);
    tmp_done(dir);
    free(p);
}
END_TEST

/* The state written through llst_stream, a chunk of c positions at a time
 * (forward or backward), into path: its bytes (malloc'd), or NULL after a
 * failure. */
static uint8_t *stream_out(const kvio_cache *cache, const llst_params *prm, const char *path,
                           uint32_t c, int backward, size_t *n)
{
    char err[ERRLEN];
    llst_stream *w;
    uint32_t T = cache->n_positions, H = cache->n_kv_heads;
    size_t el = kvio_dtype_size(cache->dtype), kb = cache->key_dim * el, vb = cache->value_dim * el;
    if (llst_stream_open(&w, path, 0, cache, cache->tokens != NULL, prm, err, ERRLEN) != LLST_OK)
        return NULL;
    uint8_t *k = malloc((size_t)(T ? T : 1) * H * kb), *v = malloc((size_t)(T ? T : 1) * H * vb);
    int rc = LLST_OK;
    for (uint32_t i = 0; rc == LLST_OK && i < T; i += c) {
        uint32_t m = T - i < c ? T - i : c, first = backward ? T - i - m : i;
        for (uint32_t l = 0; rc == LLST_OK && l < cache->n_layers; l++) {
            /* the rows positions-first, as a restored chunk holds them */
            kvio_read_kv(cache, l, 0, first, m, k, H * kb, kb, err, ERRLEN);
            kvio_read_kv(cache, l, 1, first, m, v, H * vb, vb, err, ERRLEN);
            rc = llst_stream_kv(w, l, 0, first, m, k, H * kb, kb, err, ERRLEN);
            if (rc == LLST_OK)
                rc = llst_stream_kv(w, l, 1, first, m, v, H * vb, vb, err, ERRLEN);
        }
        if (rc == LLST_OK && cache->tokens)
            rc = llst_stream_tokens(w, first, m, cache->tokens + first, err, ERRLEN);
    }
    free(k);
    free(v);
    if (rc != LLST_OK) {
        llst_stream_discard(w);
        return NULL;
    }
    if (llst_stream_finish(w, err, ERRLEN) != LLST_OK)
        return NULL;
    uint8_t *out = tu_slurp(path, n);
    remove(path);
    return out;
}

/* llst_stream writes what llst_write_mem writes: for caches of every
 * dtype (f16 also with 0 and 1 positions, several streams, without token
 * ids), every K and V type of the file and both V layouts, the kinds,
 * chunks of 1, 2 and all positions forward and backward, pieces of 1 byte
 * and the default. (Each write ends with an fsync: 144 of them.) */
START_TEST(stream_matches_write_mem)
{
    static const int32_t types[3] = {LLST_GGML_F16, LLST_GGML_F32, LLST_GGML_BF16};
    /* cache dtype, positions, n_stream, stream, token ids */
    static const uint32_t caches[8][5] = {{0, 5, 1, 0, 1}, {1, 5, 1, 0, 1}, {2, 5, 1, 0, 1},
                                          {0, 5, 3, 0, 0}, {0, 5, 3, 2, 1}, {0, 0, 1, 0, 0},
                                          {0, 0, 3, 2, 0}, {0, 1, 1, 0, 1}};
    char dir[40], path[80];
    tmp_dir(dir);
    snprintf(path, sizeof path, "%s/s.bin", dir);
    int bad = 0, cases = 0, first_bad = -1;
    for (int ci = 0; ci < 8; ci++) {
        const uint32_t *cc = caches[ci];
        spec s = base_spec();
        s.kt = s.vt = types[cc[0]];
        s.T = cc[1];
        s.n_tokens = cc[4] ? s.T : 0;
        s.H = 3;
        size_t n;
        uint8_t *p = build(&s, &n, NULL);
        llst_shape sh = shape_of(&s);
        kvio_cache c;
        char err[ERRLEN];
        bad |= parse_cache(p, n, &sh, &c, err) != LLST_OK;
        free(p);
        for (int kt = 0; kt < 3; kt++)
            for (int vt = 0; vt < 3; vt++)
                for (uint32_t tr = 0; tr < 2; tr++) {
                    int kind = 1 + (kt + ci) % 2, ch = (int)((vt + tr + (uint32_t)ci) % 3);
                    llst_params prm = {(llst_kind)kind, cc[2], cc[3], 2, tr, types[kt], types[vt], "llama"};
                    uint8_t *want = NULL, *got;
                    size_t wn = 0, gn = 0;
                    llst_set_piece(ch == 1 ? 1 : 0);
                    bad |= llst_write_mem(&c, &prm, &want, &wn, err, ERRLEN) != LLST_OK;
                    got = stream_out(&c, &prm, path, ch == 0 ? 1 : ch == 1 ? 2 : s.T + 1, (kt + vt) % 2, &gn);
                    int b = !got || gn != wn || memcmp(got, want, wn) != 0;
                    if (b && first_bad < 0)
                        first_bad = cases;
                    bad |= b;
                    free(want);
                    free(got);
                    cases++;
                }
        kvio_cache_free(&c);
    }
    llst_set_piece(0);
    tmp_done(dir);
    ck_assert_msg(bad == 0 && cases == 8 * 18, "%d cases, the first that differs: %d (bad %d)", cases,
                  first_bad, bad);
}
END_TEST

/* What llst_stream refuses, and that nothing is left at path unless the
 * file is complete. */
START_TEST(stream_refusals)
{
    char dir[40], path[80], err[ERRLEN];
    tmp_dir(dir);
    snprintf(path, sizeof path, "%s/s.bin", dir);
    spec s = base_spec();
    size_t n;
    uint8_t *p = build(&s, &n, NULL);
    llst_shape sh = shape_of(&s);
    kvio_cache c;
    ck_assert_int_eq(parse_cache(p, n, &sh, &c, err), LLST_OK);
    llst_params prm = {LLST_KIND_SEQ, 1, 0, 0, 0, LLST_GGML_F16, LLST_GGML_F16, NULL};
    size_t kb = (size_t)s.Dk * 2, vb = (size_t)s.Dv * 2;
    uint8_t k[256], v[256];
    llst_stream *w;
    ck_assert_int_eq(llst_stream_open(&w, path, 0, &c, 1, &prm, err, ERRLEN), LLST_OK);
    ck_assert_int_ne(access(path, F_OK), 0); /* nothing at path while it is written */
    EXPECT_ERR(llst_stream_kv(w, 2, 0, 0, 1, k, s.H * kb, kb, err, ERRLEN), err, LLST_E_ARG, "layer 2",
               "outside");
    EXPECT_ERR(llst_stream_kv(w, 0, 1, 2, 2, v, s.H * vb, vb, err, ERRLEN), err, LLST_E_ARG, "[2, 4)");
    int64_t big[1] = {(int64_t)INT32_MAX + 1};
    EXPECT_ERR(llst_stream_tokens(w, 0, 1, big, err, ERRLEN), err, LLST_E_ARG, "does not fit int32");
    for (uint32_t l = 0; l < s.L; l++) { /* every row but layer 1's last value */
        kvio_read_kv(&c, l, 0, 0, s.T, k, s.H * kb, kb, err, ERRLEN);
        kvio_read_kv(&c, l, 1, 0, s.T, v, s.H * vb, vb, err, ERRLEN);
        ck_assert_int_eq(llst_stream_kv(w, l, 0, 0, s.T, k, s.H * kb, kb, err, ERRLEN), LLST_OK);
        ck_assert_int_eq(llst_stream_kv(w, l, 1, 0, s.T - (l == 1), v, s.H * vb, vb, err, ERRLEN), LLST_OK);
    }
    ck_assert_int_eq(llst_stream_tokens(w, 0, s.T, c.tokens, err, ERRLEN), LLST_OK);
    int rc = llst_stream_finish(w, err, ERRLEN); /* once: it frees w */
    EXPECT_ERR(rc, err, LLST_E_ARG, "incomplete");
    ck_assert_int_ne(access(path, F_OK), 0);
    /* discarded: nothing left */
    ck_assert_int_eq(llst_stream_open(&w, path, 0, &c, 1, &prm, err, ERRLEN), LLST_OK);
    llst_stream_discard(w);
    /* NO_REPLACE: an existing file stays */
    tu_write_file(path, "x", 1);
    uint8_t *got = stream_out(&c, &prm, path, 5, 0, &n);
    ck_assert_ptr_nonnull(got); /* replaced without the flag */
    free(got);
    tu_write_file(path, "x", 1);
    ck_assert_int_eq(llst_stream_open(&w, path, KVIO_WRITE_NO_REPLACE, &c, 0, &prm, err, ERRLEN), LLST_OK);
    for (uint32_t l = 0; l < s.L; l++) {
        kvio_read_kv(&c, l, 0, 0, s.T, k, s.H * kb, kb, err, ERRLEN);
        kvio_read_kv(&c, l, 1, 0, s.T, v, s.H * vb, vb, err, ERRLEN);
        llst_stream_kv(w, l, 0, 0, s.T, k, s.H * kb, kb, err, ERRLEN);
        llst_stream_kv(w, l, 1, 0, s.T, v, s.H * vb, vb, err, ERRLEN);
    }
    rc = llst_stream_finish(w, err, ERRLEN);
    EXPECT_ERR(rc, err, LLST_E_IO, "s.bin");
    size_t xn;
    uint8_t *x = tu_slurp(path, &xn);
    ck_assert(xn == 1 && x[0] == 'x');
    free(x);
    remove(path);
    char nodir[100];
    snprintf(nodir, sizeof nodir, "%s/no/s.bin", dir);
    ck_assert_int_eq(llst_stream_open(&w, nodir, 0, &c, 0, &prm, err, ERRLEN), LLST_E_IO);
    prm.k_type = 8; /* q8_0 */
    EXPECT_ERR(llst_stream_open(&w, path, 0, &c, 0, &prm, err, ERRLEN), err, LLST_E_ARG, "K type");
    tmp_done(dir);
    kvio_cache_free(&c);
    free(p);
}
END_TEST

/* ---- META ------------------------------------------------------------------ */

static const char *get_meta(void *ctx, const char *key) { return kvio_cache_get_meta(ctx, key); }

START_TEST(meta_round_trip)
{
    kvio_cache c;
    char err[ERRLEN];
    ck_assert_int_eq(kvio_cache_init(&c, 1, 1, 1, 1, 1, FKVF_DTYPE_F16, 0, err, sizeof err), KVIO_OK);
    llst_params p = {LLST_KIND_SESSION, 4, 3, 17, 1, LLST_GGML_BF16, LLST_GGML_F32, "gemma3"};
    ck_assert_int_eq(llst_meta_set(&c, &p), LLST_OK);
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.kind"), "session");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.n_stream"), "4");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.stream"), "3");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.seq_id"), "17");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.v_trans"), "1");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.k_type"), "30");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.v_type"), "0");
    ck_assert_str_eq(kvio_cache_get_meta(&c, "llama.arch"), "gemma3");
    llst_params q;
    ck_assert_int_eq(llst_meta_get(get_meta, &c, &q, "a.fkvf", err, ERRLEN), LLST_OK);
    ck_assert_int_eq(q.kind, LLST_KIND_SESSION);
    ck_assert_uint_eq(q.n_stream, 4);
    ck_assert_uint_eq(q.stream, 3);
    ck_assert_int_eq(q.seq_id, 17);
    ck_assert_uint_eq(q.v_trans, 1);
    ck_assert_int_eq(q.k_type, LLST_GGML_BF16);
    ck_assert_int_eq(q.v_type, LLST_GGML_F32);
    ck_assert_str_eq(q.arch, "gemma3");
    ck_assert_ptr_eq(q.arch, kvio_cache_get_meta(&c, "llama.arch"));
    kvio_cache_free(&c);

    ck_assert_int_eq(kvio_cache_init(&c, 1, 1, 1, 1, 1, FKVF_DTYPE_F16, 0, err, sizeof err), KVIO_OK);
    llst_params s = {LLST_KIND_SEQ, 1, 0, 0, 0, LLST_GGML_F16, LLST_GGML_F16, NULL};
    ck_assert_int_eq(llst_meta_set(&c, &s), LLST_OK);
    ck_assert_ptr_null(kvio_cache_get_meta(&c, "llama.arch"));
    ck_assert_int_eq(llst_meta_get(get_meta, &c, &q, "a.fkvf", err, ERRLEN), LLST_OK);
    ck_assert_int_eq(q.kind, LLST_KIND_SEQ);
    ck_assert_ptr_null(q.arch);
    s.seq_id = -1;
    ck_assert_int_eq(llst_meta_set(&c, &s), LLST_E_ARG);
    s.seq_id = 0;
    s.kind = LLST_KIND_SESSION;
    ck_assert_int_eq(llst_meta_set(&c, &s), LLST_E_ARG); /* a session without arch */
    kvio_cache_free(&c);
}
END_TEST

START_TEST(meta_errors)
{
    static const struct {
        const char *key, *value, *msg;
    } bad[] = {
        {"llama.kind", NULL, "META llama.kind is missing"},
        {"llama.kind", "Seq", "neither 'seq' nor 'session'"},
        {"llama.n_stream", NULL, "META llama.n_stream is missing"},
        {"llama.n_stream", "0", "need stream < n_stream"},
        {"llama.n_stream", "4294967296", "META llama.n_stream: '4294967296' is not a decimal number"},
        {"llama.stream", "1", "need stream < n_stream"},
        {"llama.stream", "+0", "META llama.stream: '+0'"},
        {"llama.seq_id", "-1", "META llama.seq_id: '-1'"},
        {"llama.seq_id", "2147483648", "META llama.seq_id: '2147483648'"},
        {"llama.seq_id", " 1", "META llama.seq_id: ' 1'"},
        {"llama.seq_id", "1 ", "META llama.seq_id: '1 '"},
        {"llama.seq_id", "", "META llama.seq_id: ''"},
        {"llama.v_trans", "2", "META llama.v_trans: '2' is not a decimal number 0..1"},
        {"llama.k_type", "8", "META llama.k_type: ggml type 8 is not f32, f16 or bf16"},
        {"llama.v_type", "0x1", "META llama.v_type: '0x1'"},
        {"llama.v_type", "2", "META llama.v_type: ggml type 2"},
        {"llama.v_type", NULL, "META llama.v_type is missing"},
        {"llama.arch", NULL, "META llama.arch is missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvio_cache c;
        char err[ERRLEN];
        ck_assert_int_eq(kvio_cache_init(&c, 1, 1, 1, 1, 1, FKVF_DTYPE_F16, 0, err, sizeof err), KVIO_OK);
        llst_params p = {LLST_KIND_SESSION, 1, 0, 2, 0, LLST_GGML_F16, LLST_GGML_F16, "llama"};
        ck_assert_int_eq(llst_meta_set(&c, &p), LLST_OK);
        if (bad[i].value) {
            ck_assert_int_eq(kvio_cache_set_meta(&c, bad[i].key, bad[i].value), KVIO_OK);
        } else { /* remove the entry: rename its key */
            for (size_t m = 0; m < c.n_meta; m++)
                if (!strcmp(c.meta[m].key, bad[i].key))
                    c.meta[m].key[0] = 'X';
        }
        llst_params q;
        int rc = llst_meta_get(get_meta, &c, &q, "a.fkvf", err, ERRLEN);
        if (rc != LLST_E_FORMAT)
            ck_abort_msg("%s = %s: rc %d", bad[i].key, bad[i].value ? bad[i].value : "(none)", rc);
        EXPECT_ERR(rc, err, LLST_E_FORMAT, "a.fkvf: ", bad[i].msg);
        ck_assert_int_eq(q.kind, LLST_KIND_NONE);
        kvio_cache_free(&c);
    }
}
END_TEST

static Suite *llama_state_suite(void)
{
    Suite *s = suite_create("llama_state");
    TCase *t = tcase_create("parse");
    tcase_add_test(t, parse_seq_fields);
    tcase_add_test(t, parse_session_vtrans_fields);
    tcase_add_test(t, parse_empty_state);
    tcase_add_test(t, names);
    tcase_add_test(t, parse_errors);
    suite_add_tcase(s, t);
    t = tcase_create("cache");
    tcase_add_test(t, to_cache_elements);
    tcase_add_test(t, to_cache_vtrans_by_hand);
    tcase_add_test(t, mixed_types_to_f32_and_back);
    tcase_add_test(t, to_cache_errors);
    suite_add_tcase(s, t);
    t = tcase_create("write");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, round_trip_matrix);
    tcase_add_test(t, write_from_cache);
    tcase_add_test(t, write_size_matches_llama_cpp);
    tcase_add_test(t, write_refuses_bad_params);
    tcase_add_test(t, write_file_atomic);
    tcase_add_test(t, meta_round_trip);
    tcase_add_test(t, meta_errors);
    suite_add_tcase(s, t);
    t = tcase_create("lazy");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, lazy_matches_eager);
    tcase_add_test(t, lazy_truncated_is_io_error);
    tcase_add_test(t, stream_matches_write_mem);
    tcase_add_test(t, stream_refusals);
    suite_add_tcase(s, t);
    t = tcase_create("hostile");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, every_truncation_is_format);
    tcase_add_test(t, every_bit_flip_no_crash);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(llama_state_suite()); }
