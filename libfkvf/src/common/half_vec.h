/* Vector forms of the conversions in half.h, instantiated by half.h for
 * FKVF_CVT_VBYTES-byte vectors with names suffixed FKVF_CVT_VSFX (_4 or _8 lanes).
 * Bit-identical to the scalar functions. No include guard: included once per
 * width. */
#define Q_CAT2(a, b) a##b
#define Q_CAT(a, b) Q_CAT2(a, b)
#define Q_VI Q_CAT(fkvf_cvt_vi, FKVF_CVT_VSFX)
#define Q_VU Q_CAT(fkvf_cvt_vu, FKVF_CVT_VSFX)
#define Q_VF Q_CAT(fkvf_cvt_vf, FKVF_CVT_VSFX)
#define Q_VH Q_CAT(fkvf_cvt_vh, FKVF_CVT_VSFX)

typedef int32_t Q_VI __attribute__((vector_size(FKVF_CVT_VBYTES)));
typedef uint32_t Q_VU __attribute__((vector_size(FKVF_CVT_VBYTES)));
typedef float Q_VF __attribute__((vector_size(FKVF_CVT_VBYTES)));
typedef uint16_t Q_VH __attribute__((vector_size(FKVF_CVT_VBYTES / 2)));

/* f32 lanes (as bits) -> f16 lanes */
static inline void Q_CAT(fkvf_cvt_v_f16, FKVF_CVT_VSFX)(const Q_VI *xp, Q_VH *out)
{
    Q_VI x = *xp, a, sub;
    Q_VF af;
    a = x & 0x7FFFFFFF;
    Q_VI sign = (x >> 16) & 0x8000;
    /* normal: drop 13 bits with round-half-even, rebias 127 -> 15 */
    Q_VI nrm = (a - 0x38000000 + 0x0FFF + ((a >> 13) & 1)) >> 13;
    /* subnormal: binary32 addition of 0.5 rounds to the 2^-24 grid */
    af = (Q_VF)a + 0.5f;
    sub = (Q_VI)af - 0x3F000000;
    Q_VI pay = (a >> 13) & 0x3FF;
    Q_VI nan = 0x7C00 | pay | ((pay == 0) & 0x200);
    Q_VI m_nan = a > 0x7F800000, m_inf = a >= 0x477FF000, m_nrm = a >= 0x38800000;
    Q_VI r = (m_nrm & nrm) | (~m_nrm & sub);
    r = (m_inf & 0x7C00) | (~m_inf & r);
    r = (m_nan & nan) | (~m_nan & r);
    r = r | sign;
    *out = __builtin_convertvector(r, Q_VH);
}

/* f32 lanes (as bits) -> bf16 lanes */
static inline void Q_CAT(fkvf_cvt_v_bf16, FKVF_CVT_VSFX)(const Q_VI *xp, Q_VH *out)
{
    Q_VU x = (Q_VU)*xp;
    Q_VU rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    Q_VU hi = x >> 16;
    Q_VU nan = hi | ((Q_VU)((hi & 0x7Fu) == 0) & 0x40u);
    Q_VU m_nan = (Q_VU)((Q_VI)(x & 0x7FFFFFFFu) > 0x7F800000);
    Q_VU r = (m_nan & nan) | (~m_nan & rounded);
    *out = __builtin_convertvector(r, Q_VH);
}

static inline void Q_CAT(fkvf_cvt_f32_to_f16, FKVF_CVT_VSFX)(const float *src, uint16_t *dst)
{
    Q_VI x;
    Q_VH h;
    memcpy(&x, src, sizeof x);
    Q_CAT(fkvf_cvt_v_f16, FKVF_CVT_VSFX)(&x, &h);
    memcpy(dst, &h, sizeof h);
}

static inline void Q_CAT(fkvf_cvt_f16_to_f32, FKVF_CVT_VSFX)(const uint16_t *src, float *dst)
{
    Q_VH hv;
    memcpy(&hv, src, sizeof hv);
    Q_VI h = __builtin_convertvector(hv, Q_VI);
    Q_VI em = h & 0x7FFF;
    Q_VU sign = (Q_VU)(h & 0x8000) << 16;
    Q_VI normal = (em << 13) + 0x38000000;
    Q_VI special = (em << 13) | 0x7F800000;
    Q_VI sub = (Q_VI)(__builtin_convertvector(em, Q_VF) * 0x1p-24f);
    Q_VI m_sp = em >= 0x7C00, m_n = em >= 0x0400;
    Q_VI r = (m_n & normal) | (~m_n & sub);
    r = (m_sp & special) | (~m_sp & r);
    Q_VU o = (Q_VU)r | sign;
    memcpy(dst, &o, sizeof o);
}

static inline void Q_CAT(fkvf_cvt_f32_to_bf16, FKVF_CVT_VSFX)(const float *src, uint16_t *dst)
{
    Q_VI x;
    Q_VH h;
    memcpy(&x, src, sizeof x);
    Q_CAT(fkvf_cvt_v_bf16, FKVF_CVT_VSFX)(&x, &h);
    memcpy(dst, &h, sizeof h);
}

static inline void Q_CAT(fkvf_cvt_bf16_to_f32, FKVF_CVT_VSFX)(const uint16_t *src, float *dst)
{
    Q_VH hv;
    memcpy(&hv, src, sizeof hv);
    Q_VU o = __builtin_convertvector(hv, Q_VU) << 16;
    memcpy(dst, &o, sizeof o);
}

#undef Q_VI
#undef Q_VU
#undef Q_VF
#undef Q_VH
#undef Q_CAT
#undef Q_CAT2
#undef FKVF_CVT_VBYTES
#undef FKVF_CVT_VSFX
