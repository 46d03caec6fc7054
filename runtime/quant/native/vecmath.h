/* Vector math shared by the native kernels (decode_layer.c and each build's dequant.c and
 * softmax.c): one set of helpers per instruction set, chosen by the build's flags (AVX-512 for
 * the avx512/ build, AVX2 + FMA + F16C for the avx2/ one; runtime/quant/native/__init__.py). */
#ifndef AGL_VECMATH_H
#define AGL_VECMATH_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* one bfloat16 <-> float32, scalar (the rows' tails) */
static inline float bf16_f(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f_bf16(float f)          /* to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__)

/* float32 x 16 -> bfloat16 x 16, to nearest even */
static inline __m256i to_bf16(__m512 v)
{
    __m512i b = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    b = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

/* bfloat16 x 16 -> float32 x 16 (exact) */
static inline __m512 from_bf16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* the row helpers' vocabulary (below): 16 lanes */
#define vf_load_bf16(p) from_bf16(_mm256_loadu_si256((const __m256i *)(p)))   /* VL bf16 */
#define vf_store_bf16(p, v) _mm256_storeu_si256((__m256i *)(p), to_bf16(v))   /* rounded */
#define vf_bf16(v) from_bf16(to_bf16(v))          /* v rounded to bf16, kept as float32 */
typedef __m512 vf;
#define VL 16
#define vf_load _mm512_loadu_ps
#define vf_store _mm512_storeu_ps
#define vf_set1 _mm512_set1_ps
#define vf_zero _mm512_setzero_ps
#define vf_add _mm512_add_ps
#define vf_sub _mm512_sub_ps
#define vf_mul _mm512_mul_ps
#define vf_div _mm512_div_ps
#define vf_fmadd _mm512_fmadd_ps
#define vf_fnmadd _mm512_fnmadd_ps
#define vf_min _mm512_min_ps
#define vf_max _mm512_max_ps
#define vf_sum hsum16_tree        /* defined below */
#define exp16 vf_exp   /* avx512/softmax.c's name for it */

static inline vf vf_round(vf x)            /* to the nearest integer, ties to even */
{
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* The sum of v's 16 lanes in a fixed order, the tree of GCC's _mm512_reduce_add_ps spelled
 * out (so that vf_sum_block matches it under any compiler): s8 = lanes i + (i + 8), s4 = s8 i +
 * (i + 4), s2 = s4 i + (i + 2), then s2 0 + 1 */
static inline float hsum16_tree(__m512 v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_movehdup_ps(s2));
}

/* Lane j = vf_sum(v[j]) for VL vectors, bit for bit (each lane through the same tree): 16
 * sums in ~46 ops instead of 16 reductions' ~130 */
static inline vf vf_sum_block(const vf v[VL])
{
    __m512 t[8], u[4], w[2];
    for (int j = 0; j < 8; j++)         /* [v 2j's, v 2j+1's] s8 */
        t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
    for (int k = 0; k < 4; k++)         /* quad r: v 4k+r's s4 */
        u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], 0xDD));
    for (int m = 0; m < 2; m++) {       /* quad r: v 8m+r's s2, v 8m+4+r's s2 */
        const __m512d a = _mm512_castps_pd(u[2 * m]), b = _mm512_castps_pd(u[2 * m + 1]);
        w[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    /* quad r: the sums of v r, v 4+r, v 8+r, v 12+r; lane 4r + c holds v 4c+r's */
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88),
                                   _mm512_shuffle_ps(w[0], w[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14,
                                                   3, 7, 11, 15), z);
}

static inline vf vf_scale2(vf p, vf n)     /* p 2^n, n integral */
{
    return _mm512_scalef_ps(p, n);
}

#else

/* The same for AVX2 (8 lanes; the avx2/ build). */

/* float32 x 8 -> bfloat16 x 8, to nearest even */
static inline __m128i to_bf16_8(__m256 v)
{
    __m256i b = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08));
}

/* bfloat16 x 8 -> float32 x 8 (exact) */
static inline __m256 from_bf16_8(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The sum of v's 8 lanes in a fixed order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) */
static inline float hsum8(__m256 v)
{
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(t) + _mm_cvtss_f32(_mm_movehdup_ps(t));
}

/* the row helpers' vocabulary (below): 8 lanes */
#define vf_load_bf16(p) from_bf16_8(_mm_loadu_si128((const __m128i *)(p)))      /* VL bf16 */
#define vf_store_bf16(p, v) _mm_storeu_si128((__m128i *)(p), to_bf16_8(v))      /* rounded */
#define vf_bf16(v) from_bf16_8(to_bf16_8(v))      /* v rounded to bf16, kept as float32 */
typedef __m256 vf;
#define VL 8
#define vf_load _mm256_loadu_ps
#define vf_store _mm256_storeu_ps
#define vf_set1 _mm256_set1_ps
#define vf_zero _mm256_setzero_ps
#define vf_add _mm256_add_ps
#define vf_sub _mm256_sub_ps
#define vf_mul _mm256_mul_ps
#define vf_div _mm256_div_ps
#define vf_fmadd _mm256_fmadd_ps
#define vf_fnmadd _mm256_fnmadd_ps
#define vf_min _mm256_min_ps
#define vf_max _mm256_max_ps
#define vf_sum hsum8

static inline vf vf_round(vf x)
{
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Lane j = vf_sum(v[j]) = hsum8(v[j]) for VL vectors, bit for bit (each lane through hsum8's
 * tree) */
static inline vf vf_sum_block(const vf v[VL])
{
    __m256 t[4], u[2];
    for (int j = 0; j < 4; j++)         /* [v 2j's, v 2j+1's] lanes i + (i + 4) */
        t[j] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * j], v[2 * j + 1], 0x31));
    for (int k = 0; k < 2; k++) {       /* half h: v 4k+h's and v 4k+2+h's two pair sums */
        const __m256d a = _mm256_castps_pd(t[2 * k]), b = _mm256_castps_pd(t[2 * k + 1]);
        u[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    /* half h: the sums of v h, v 2+h, v 4+h, v 6+h */
    const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0x88),
                                   _mm256_shuffle_ps(u[0], u[1], 0xDD));
    return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* p 2^n for integral n in [-127, 127], 2^n built in the exponent field: 2^-127 (a subnormal)
 * gives 0, so e^x under 2^-126 (x < -87.3) is 0 here */
static inline vf vf_scale2(vf p, vf n)
{
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    e = _mm256_max_epi32(e, _mm256_setzero_si256());
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

#endif

/* e^x in VL lanes, within 3e-7 relative for |x| <= 88 (larger |x| is clamped
 * there): x = n ln2 + r, |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial, scaled by 2^n */
static inline vf vf_exp(vf x)
{
    x = vf_min(vf_max(x, vf_set1(-88.0f)), vf_set1(88.0f));
    vf n = vf_round(vf_mul(x, vf_set1(1.44269504f)));
    vf r = vf_fnmadd(n, vf_set1(0.693145752f), x);      /* ln2, high bits */
    r = vf_fnmadd(n, vf_set1(1.42860677e-6f), r);       /* and the rest */
    vf p = vf_set1(1.0f / 720);
    p = vf_fmadd(p, r, vf_set1(1.0f / 120));
    p = vf_fmadd(p, r, vf_set1(1.0f / 24));
    p = vf_fmadd(p, r, vf_set1(1.0f / 6));
    p = vf_fmadd(p, r, vf_set1(0.5f));
    p = vf_fmadd(p, r, vf_set1(1.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f));
    return vf_scale2(p, n);
}

/* Row helpers of decode_layer.c, in the build's VL lanes. */

static inline float dot(const float *a, const float *b, int64_t n)
{
    vf acc = vf_zero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        acc = vf_fmadd(vf_load(a + i), vf_load(b + i), acc);
    float r = vf_sum(acc);
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static inline void axpy(float *y, float a, const float *x, int64_t n)    /* y += a x */
{
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        vf_store(y + i, vf_fmadd(vf_set1(a), vf_load(x + i), vf_load(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* out[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, n values (out may be g) */
static inline void silu_mul(const float *g, const float *u, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf gv = vf_load(g + i);
        vf den = vf_add(vf_set1(1.0f), vf_exp(vf_sub(vf_zero(), gv)));
        vf_store(out + i, vf_mul(vf_div(gv, den), vf_load(u + i)));
    }
    for (; i < n; i++)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#endif
