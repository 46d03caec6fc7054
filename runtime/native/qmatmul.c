/* Matmuls over GGUF-style quantized blocks, for x86-64 with AVX-512 VNNI.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k], with w kept as 32-weight blocks:
 *   Q4  (Q4_0, Q4_1): 16 bytes of nibbles a block (low nibbles = weights 0..15, high = 16..31),
 *        w = q * d + mn   (q in 0..15; Q4_1: mn = m; Q4_0: no m, mn = -8 d)
 *   Q8  (Q8_0):       32 int8 a block, w = q * d
 * d, m: float16 bits, as in the file. Every weight row holds kb blocks, kb a multiple of 4
 * (rows padded with zero blocks: zero quants and scales, so padding adds exact zeros).
 *
 * Each input row is first quantized in two 8-bit planes (32 values a block, d = max|x| / 127,
 * q1 = round(x / d) as llama.cpp does, then the residual q2 = round((x - q1 d) * 254 / d), both
 * round to nearest even; x ~ d / 254 (254 q1 + q2): ~16-bit activations, so the result stays
 * within ~1e-5 of the file's weights decoded exactly; padding blocks zero). Then each output
 * is integer dot products a block (vpdpbusd) scaled in float32, summed in a fixed order: a row's output depends on that
 * row only, never on how many rows a call has (the 4 x 4 kernel computes exactly dot_q4's
 * sums) or on the threads (OpenMP, the runtime torch uses too, splits the output columns).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"

#define QK 32
#define MR 4        /* activation rows x weight rows of the 4 x 4 kernel */
#define TILE_N 16   /* output columns a task: their weights stay in L1/L2 across the rows */

#define RES 254.0f   /* the residual plane's step: d / RES */

/* 16 values: q = round(v * id) as int8 at out, the residual's round(.. * RES) at out2 */
static inline __m512i quantize16(__m512 v, float id, float dd, int8_t *out, int8_t *out2)
{
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)out, _mm512_cvtsepi32_epi8(q));
    __m512 r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(dd), v);
    __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(id * RES)));
    _mm_storeu_si128((__m128i *)out2, _mm512_cvtsepi32_epi8(q2));
    return q;
}

/* RES * p1 + p2: |lane| < 2^24, exact as float32 */
static inline __m512i combine(__m512i p1, __m512i p2)
{
    return _mm512_add_epi32(_mm512_mullo_epi32(p1, _mm512_set1_epi32((int)RES)), p2);
}

/* nb blocks of x into the planes q, q2, the step d / RES and s = the step times the block's
 * sum of (RES q + q2) (for Q4's minimum term), then zero blocks up to kb. */
static void quantize_row(const float *x, int64_t nb, int64_t kb, int8_t *q, int8_t *q2,
                         float *d, float *s)
{
    for (int64_t b = 0; b < nb; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m512i q0 = quantize16(v0, id, dd, q + b * QK, q2 + b * QK);
        __m512i q1 = quantize16(v1, id, dd, q + b * QK + 16, q2 + b * QK + 16);
        int32_t sum1 = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)), sum2 = 0;
        for (int i = 0; i < QK; i++)
            sum2 += q2[b * QK + i];
        d[b] = dd / RES;
        s[b] = d[b] * (float)((int32_t)RES * sum1 + sum2);
    }
    memset(q + nb * QK, 0, (size_t)((kb - nb) * QK));
    memset(q2 + nb * QK, 0, (size_t)((kb - nb) * QK));
    for (int64_t b = nb; b < kb; b++)
        d[b] = s[b] = 0.0f;
}

/* Q4 rows are read 4 blocks (64 bytes of nibbles) at a time: the low nibbles are weights 0..15
 * of each block, the high ones 16..31, so a Q4 matmul stores the activations of each group of
 * 4 blocks as [0..15 of each block][16..31 of each block]; lanes 4b..4b+3 of the products then
 * belong to block b of the group. */
static void x4_layout(int8_t *q, int64_t kb)
{
    for (int64_t g = 0; g < kb; g += 4) {
        __m512i a = _mm512_loadu_si512(q + g * QK), b = _mm512_loadu_si512(q + g * QK + 64);
        _mm512_storeu_si512(q + g * QK, _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_si512(q + g * QK + 64, _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

static inline __m512 spread4(__m128 v)     /* [v0 x4, v1 x4, v2 x4, v3 x4] */
{
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

static inline __m512 half4(const uint16_t *h)   /* 4 float16 → spread4 */
{
    return spread4(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h)));
}

/* the lanes of acc, plus the Q4 minimum term sum_b mn[b] * s[b] (16 blocks at a time) */
static inline float finish_q4(__m512 acc, const uint16_t *wd, const uint16_t *wm,
                              const float *xs, int64_t kb)
{
    __m512 t = _mm512_setzero_ps();
    for (int64_t c = 0; c < kb; c += 16) {
        __mmask16 k = kb - c >= 16 ? 0xFFFF : (__mmask16)((1u << (kb - c)) - 1);
        __m512 mn = wm ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, wm + c))
                       : _mm512_mul_ps(_mm512_set1_ps(-8.0f),
                                       _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, wd + c)));
        t = _mm512_fmadd_ps(mn, _mm512_maskz_loadu_ps(k, xs + c), t);
    }
    return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(t);
}

/* both planes of one 4-block group (at x; plane 2 kb * QK bytes later) against its weights */
static inline __m512i q4_products(__m512i wl, __m512i wh, const int8_t *x, int64_t kb)
{
    const __m512i zero = _mm512_setzero_si512();
    const int8_t *x2 = x + kb * QK;
    __m512i p1 = _mm512_dpbusd_epi32(zero, wl, _mm512_loadu_si512(x));
    p1 = _mm512_dpbusd_epi32(p1, wh, _mm512_loadu_si512(x + 64));
    __m512i p2 = _mm512_dpbusd_epi32(zero, wl, _mm512_loadu_si512(x2));
    p2 = _mm512_dpbusd_epi32(p2, wh, _mm512_loadu_si512(x2 + 64));
    return combine(p1, p2);
}

static float dot_q4(const uint8_t *wq, const uint16_t *wd, const uint16_t *wm, const int8_t *xq,
                    const float *xd, const float *xs, int64_t kb)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b += 4) {
        __m512i v = _mm512_loadu_si512(wq + b * 16);
        __m512i p = q4_products(_mm512_and_si512(v, lo4),
                                _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4), xq + b * QK, kb);
        __m512 sc = _mm512_mul_ps(half4(wd + b), spread4(_mm_loadu_ps(xd + b)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc);
    }
    return finish_q4(acc, wd, wm, xs, kb);
}

/* dot_q4 for 4 activation rows x 4 weight rows, each weight group unpacked once: the same
 * products, scales and order as dot_q4, so every output is bitwise dot_q4's. */
static void dot_q4_4x4(const uint8_t *const wq[MR], const uint16_t *const wd[MR],
                       const uint16_t *const wm[MR], const int8_t *const xq[MR],
                       const float *const xd[MR], const float *const xs[MR], int64_t kb,
                       float out[MR][MR])
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc[MR][MR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MR; j++)
            acc[i][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b += 4) {
        __m512i wl[MR], wh[MR];
        __m512 ws[MR];
        for (int j = 0; j < MR; j++) {
            __m512i v = _mm512_loadu_si512(wq[j] + b * 16);
            wl[j] = _mm512_and_si512(v, lo4);
            wh[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            ws[j] = half4(wd[j] + b);
        }
        for (int i = 0; i < MR; i++) {
            __m512 xsc = spread4(_mm_loadu_ps(xd[i] + b));
            for (int j = 0; j < MR; j++) {
                __m512i p = q4_products(wl[j], wh[j], xq[i] + b * QK, kb);
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws[j], xsc),
                                            acc[i][j]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MR; j++)
            out[i][j] = finish_q4(acc[i][j], wd[j], wm[j], xs[i], kb);
}

static inline __m512 spread2(__m128 v)     /* [v0 x8, v1 x8] */
{
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

static inline __m128 half2(const uint16_t *h)   /* 2 float16 (in lanes 0, 1) */
{
    int32_t h2;
    memcpy(&h2, h, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(h2));
}

static inline __m128 float2(const float *f)
{
    return _mm_castpd_ps(_mm_load_sd((const double *)f));
}

/* RES * (w . x1) + w . x2 over 4-byte lanes; vpdpbusd multiplies unsigned by signed bytes:
 * |w| times x with w's sign (neg = w < 0). |lane| < 2^24: exact as float32. */
static inline __m512i q8_products(__m512i aw, __mmask64 neg, __m512i x1, __m512i x2)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i p1 = _mm512_dpbusd_epi32(zero, aw, _mm512_mask_sub_epi8(x1, neg, zero, x1));
    __m512i p2 = _mm512_dpbusd_epi32(zero, aw, _mm512_mask_sub_epi8(x2, neg, zero, x2));
    return combine(p1, p2);
}

static float dot_q8(const int8_t *wq, const uint16_t *wd, const int8_t *xq, const float *xd,
                    int64_t kb)
{
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b += 2) {
        __m512i w = _mm512_loadu_si512(wq + b * QK);
        __m512i p = q8_products(_mm512_abs_epi8(w), _mm512_movepi8_mask(w),
                                _mm512_loadu_si512(xq + b * QK),
                                _mm512_loadu_si512(xq + (kb + b) * QK));
        __m512 sc = spread2(_mm_mul_ps(half2(wd + b), float2(xd + b)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* dot_q8 for 4 activation rows x 4 weight rows (bitwise dot_q8's, as dot_q4_4x4) */
static void dot_q8_4x4(const int8_t *const wq[MR], const uint16_t *const wd[MR],
                       const int8_t *const xq[MR], const float *const xd[MR], int64_t kb,
                       float out[MR][MR])
{
    __m512 acc[MR][MR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MR; j++)
            acc[i][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b += 2) {
        __m512i aw[MR];
        __mmask64 neg[MR];
        __m512 ws[MR];
        for (int j = 0; j < MR; j++) {
            __m512i w = _mm512_loadu_si512(wq[j] + b * QK);
            aw[j] = _mm512_abs_epi8(w);
            neg[j] = _mm512_movepi8_mask(w);
            ws[j] = spread2(half2(wd[j] + b));
        }
        for (int i = 0; i < MR; i++) {
            __m512i x1 = _mm512_loadu_si512(xq[i] + b * QK);
            __m512i x2 = _mm512_loadu_si512(xq[i] + (kb + b) * QK);
            __m512 xsc = spread2(float2(xd[i] + b));
            for (int j = 0; j < MR; j++)
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_products(aw[j], neg[j], x1, x2)),
                                            _mm512_mul_ps(ws[j], xsc), acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MR; j++)
            out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

static inline void store(const agl_qweight *w, float *y, int64_t m, int64_t n, float v,
                         int accumulate)
{
    if (w->bias)
        v += w->bias[n];
    y[m * w->n + n] = accumulate ? y[m * w->n + n] + v : v;
}

static inline float dot(const agl_qweight *w, int64_t n, const int8_t *xq, const float *xd,
                        const float *xs)
{
    const int64_t kb = w->kb;
    if (w->kind == 8)
        return dot_q8((const int8_t *)w->qs + n * kb * QK, w->d + n * kb, xq, xd, kb);
    return dot_q4((const uint8_t *)w->qs + n * kb * 16, w->d + n * kb,
                  w->m ? w->m + n * kb : NULL, xq, xd, xs, kb);
}

int agl_qmm(const agl_qweight *w, const float *x, int64_t M, float *y, int accumulate,
            int nthreads)
{
    const int64_t K = w->k, N = w->n, nb = K / QK, kb = w->kb;
    const int64_t xrow = 2 * kb * QK;             /* plane 1, then the residual plane */
    int8_t *xq = malloc((size_t)(M * xrow));
    float *xd = malloc(sizeof(float) * (size_t)(M * kb) * 2);
    if (!xq || !xd) { free(xq); free(xd); return -1; }
    float *xs = xd + M * kb;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * N * K > 65536)
    for (int64_t m = 0; m < M; m++) {
        int8_t *row = xq + m * xrow;
        quantize_row(x + m * K, nb, kb, row, row + kb * QK, xd + m * kb, xs + m * kb);
        if (w->kind == 4) {
            x4_layout(row, kb);
            x4_layout(row + kb * QK, kb);
        }
    }
    const int64_t tiles = (N + TILE_N - 1) / TILE_N;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * TILE_N, n1 = n0 + TILE_N < N ? n0 + TILE_N : N;
        int64_t m = 0;
        if (n1 - n0 == TILE_N)                            /* 4 x 4 blocks, then the rest */
            for (; m + MR <= M; m += MR)
                for (int64_t n = n0; n < n1; n += MR) {
                    const uint8_t *wq[MR]; const int8_t *w8[MR]; const uint16_t *wd[MR], *wm[MR];
                    const int8_t *xr[MR]; const float *xdr[MR], *xsr[MR];
                    float v[MR][MR];
                    for (int i = 0; i < MR; i++) {
                        wq[i] = (const uint8_t *)w->qs + (n + i) * kb * 16;
                        w8[i] = (const int8_t *)w->qs + (n + i) * kb * QK;
                        wd[i] = w->d + (n + i) * kb;
                        wm[i] = w->m ? w->m + (n + i) * kb : NULL;
                        xr[i] = xq + (m + i) * xrow;
                        xdr[i] = xd + (m + i) * kb;
                        xsr[i] = xs + (m + i) * kb;
                    }
                    if (w->kind == 4)
                        dot_q4_4x4(wq, wd, wm, xr, xdr, xsr, kb, v);
                    else
                        dot_q8_4x4(w8, wd, xr, xdr, kb, v);
                    for (int i = 0; i < MR; i++)
                        for (int j = 0; j < MR; j++)
                            store(w, y, m + i, n + j, v[i][j], accumulate);
                }
        for (; m < M; m++)
            for (int64_t n = n0; n < n1; n++)
                store(w, y, m, n, dot(w, n, xq + m * xrow, xd + m * kb, xs + m * kb),
                      accumulate);
    }
    free(xq);
    free(xd);
    return 0;
}

/* y = x @ w.T (+ bias): x float32 [M, k], y float32 [M, n]. 0, or -1 without memory. */
int agl_qmatmul(const agl_qweight *w, const float *x, int64_t M, float *y, int nthreads)
{
    return agl_qmm(w, x, M, y, 0, nthreads);
}
