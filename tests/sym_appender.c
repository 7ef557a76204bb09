/* Symbol appender (fkvf_sym_appender, internal): O(1) amortized append of
 * symbols to a quad or ngon stream, whose serialization at any moment is
 * byte-for-byte what fkvf_quad_encode / fkvf_ngon_encode give for the same
 * symbols.
 *
 * quad: the packed bitstream grows in place (the buffer beyond the last
 * symbol is kept zero, which is the padding of spec 11.7).
 * ngon: full spans are encoded, checked with the canonical decoder (the
 * writer's obligation of spec 12.2) and stored as they complete; the open
 * span's symbols are kept and its anchor is computed on demand. */
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "le.h"
#include "sym_appender.h"

static void appender_zero(fkvf_sym_appender *a, const fkvf_allocator *alloc)
{
    memset(a, 0, sizeof *a);
    a->alloc = alloc;
}

int fkvf_sym_appender_init_quad(fkvf_sym_appender *a, unsigned bits, const fkvf_allocator *alloc)
{
    if (!a)
        return FKVF_E_INVALID_ARG;
    appender_zero(a, alloc);
    if (bits < 2 || bits > 32 || (bits & 1u))
        return FKVF_E_INVALID_ARG;
    a->profile = FKVF_PROFILE_QUAD;
    a->bits = bits;
    return FKVF_OK;
}

int fkvf_sym_appender_init_ngon(fkvf_sym_appender *a, const fkvf_ngon *g, const fkvf_allocator *alloc)
{
    if (!a)
        return FKVF_E_INVALID_ARG;
    appender_zero(a, alloc);
    if (!g || !g->vx || g->span < 1 || g->span > 64)
        return FKVF_E_INVALID_ARG;
    a->profile = FKVF_PROFILE_NGON;
    a->ngon = g;
    return FKVF_OK;
}

/* Make room for `need` bytes, zero-filling what is new. */
static int reserve(fkvf_sym_appender *a, uint64_t need)
{
    size_t want;
    if (!fkvf_tosz(need, &want))
        return FKVF_E_NOMEM;
    if (want <= a->cap)
        return FKVF_OK;
    size_t old = a->cap;
    void *buf = a->data;
    size_t cap = old;
    int rc = fkvf_grow(a->alloc, &buf, &cap, want < 64 ? 64 : want, 1);
    if (rc != FKVF_OK)
        return rc;
    a->data = buf;
    a->cap = cap;
    memset(a->data + old, 0, cap - old);
    return FKVF_OK;
}

static int push_quad(fkvf_sym_appender *a, uint32_t sym)
{
    const unsigned bits = a->bits;
    if (bits < 32 && (sym >> bits))
        return FKVF_E_SYMBOL;
    uint64_t need, pos;
    if (a->n == UINT64_MAX || !fkvf_quad_data_bytes(a->n + 1, bits, &need))
        return FKVF_E_LIMIT;
    int rc = reserve(a, need);
    if (rc != FKVF_OK)
        return rc;
    pos = a->n * bits; /* fits: (n+1)*bits did */
    /* The symbol occupies bits [pos, pos+bits) within bytes pos/8 ..
     * (pos+bits-1)/8, at most 5 bytes, all inside `need`. Those bits are
     * zero now. */
    size_t byte = (size_t)(pos >> 3);
    unsigned sh = (unsigned)(pos & 7u);
    uint64_t v = (uint64_t)sym << sh;
    unsigned nbytes = (sh + bits + 7) / 8;
    for (unsigned i = 0; i < nbytes; i++)
        a->data[byte + i] |= (uint8_t)(v >> (8 * i));
    a->n++;
    return FKVF_OK;
}

/* Encode and check the open span (len symbols) into the anchor slot j. */
static int store_open_span(fkvf_sym_appender *a, uint32_t len, uint64_t j)
{
    const fkvf_ngon *g = a->ngon;
    uint32_t back[64];
    double ax, ay;
    fkvf_ngon_encode_span(g, a->open, len, &ax, &ay);
    fkvf_ngon_decode_span_canonical(g, ax, ay, len, back);
    if (memcmp(back, a->open, len * sizeof(uint32_t)) != 0)
        return FKVF_E_CODEC;
    uint8_t *p = a->data + 16 * (size_t)j;
    fkvf_stf64(p, ax);
    fkvf_stf64(p + 8, ay);
    return FKVF_OK;
}

static int push_ngon(fkvf_sym_appender *a, uint32_t sym)
{
    const fkvf_ngon *g = a->ngon;
    const uint32_t L = g->span;
    if (sym >= g->n)
        return FKVF_E_SYMBOL;
    if (a->n == UINT64_MAX)
        return FKVF_E_LIMIT;
    uint64_t j = a->n / L;
    uint32_t k = (uint32_t)(a->n % L);
    uint64_t need;
    /* room for span j's anchor (also used by fkvf_sym_appender_bytes) */
    if (!fkvf_mul64(j + 1, 16, &need))
        return FKVF_E_LIMIT;
    int rc = reserve(a, need);
    if (rc != FKVF_OK)
        return rc;
    a->open[k] = sym;
    if (k + 1 == L) {
        rc = store_open_span(a, L, j);
        if (rc != FKVF_OK)
            return rc; /* the symbol is not appended */
    }
    a->n++;
    return FKVF_OK;
}

int fkvf_sym_appender_push(fkvf_sym_appender *a, uint32_t sym)
{
    if (!a)
        return FKVF_E_INVALID_ARG;
    if (a->profile == FKVF_PROFILE_QUAD)
        return push_quad(a, sym);
    if (a->profile == FKVF_PROFILE_NGON)
        return push_ngon(a, sym);
    return FKVF_E_STATE;
}

int fkvf_sym_appender_bytes(fkvf_sym_appender *a, const uint8_t **data, size_t *size)
{
    if (!a || !data || !size)
        return FKVF_E_INVALID_ARG;
    uint64_t bytes;
    if (a->profile == FKVF_PROFILE_QUAD) {
        if (!fkvf_quad_data_bytes(a->n, a->bits, &bytes))
            return FKVF_E_LIMIT;
    } else if (a->profile == FKVF_PROFILE_NGON) {
        const uint32_t L = a->ngon->span;
        uint32_t k = (uint32_t)(a->n % L);
        if (!fkvf_ngon_data_bytes(a->ngon, a->n, &bytes))
            return FKVF_E_LIMIT;
        if (k) {
            /* the slot was reserved by the push that opened the span */
            int rc = store_open_span(a, k, a->n / L);
            if (rc != FKVF_OK)
                return rc;
        }
    } else {
        return FKVF_E_STATE;
    }
    *data = a->data;
    *size = (size_t)bytes; /* <= a->cap */
    return FKVF_OK;
}

void fkvf_sym_appender_fini(fkvf_sym_appender *a)
{
    if (!a)
        return;
    fkvf_free(a->alloc, a->data);
    a->data = NULL;
    a->cap = 0;
    a->n = 0;
}
