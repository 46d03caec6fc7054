/* Vector math shared by the native kernels (decode_layer.c and each build's dequant.c and
 * softmax.c): one set of helpers per instruction set, chosen by the build's flags (AVX-512 for
 * the avx512/ build, AVX2 + FMA + F16C for the avx2/ one; runtime/quant/native/__init__.py). */
#ifndef AGL_VECMATH_H
#define AGL_VECMATH_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__)

/* e^x, 16 lanes, within 3e-7 relative for |x| <= 88 (larger |x| is clamped there): x = n ln2 + r,
 * |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial, scaled by 2^n */
static inline __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);      /* ln2, high bits */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);           /* and the rest */
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

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

static inline float dot(const float *a, const float *b, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    float r = _mm512_reduce_add_ps(acc);
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static inline void axpy(float *y, float a, const float *x, int64_t n)    /* y += a x */
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(_mm512_set1_ps(a), _mm512_loadu_ps(x + i),
                                                _mm512_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* out[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, n values (out may be g) */
static inline void silu_mul(const float *g, const float *u, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gv, den), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#else

/* The same for AVX2 (8 lanes; the avx2/ build). */

/* e^x, 8 lanes: exp16's method; 2^n built in the exponent field, so e^x under 2^-126
 * (x < -87.3) gives 0 instead of a subnormal */
static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    e = _mm256_max_epi32(e, _mm256_setzero_si256());                /* n = -127: 0 */
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

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

static inline float dot(const float *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float r = hsum8(acc);
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static inline void axpy(float *y, float a, const float *x, int64_t n)    /* y += a x */
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_set1_ps(a), _mm256_loadu_ps(x + i),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* out[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u, n values (out may be g) */
static inline void silu_mul(const float *g, const float *u, int64_t n, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#endif
#endif
