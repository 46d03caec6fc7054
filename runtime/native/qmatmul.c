/* Matmuls over GGUF-style quantized blocks, for x86-64 with AVX-512 VNNI.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k], with w kept as 32-weight blocks:
 *   Q4  (Q4_0, Q4_1): 16 bytes of nibbles a block (low nibbles = weights 0..15, high = 16..31),
 *        w = q * d + mn   (q in 0..15; Q4_1: mn = m; Q4_0: no m, mn = -8 d)
 *   Q8  (Q8_0):       32 int8 a block, w = q * d
 * d, m: float16 bits, as in the file. Every weight row holds kb blocks, kb a multiple of 4
 * (rows padded with zero blocks: zero quants and scales, so padding adds exact zeros).
 *
 * Each input row is first quantized as llama.cpp does (32 values a block, scale = max|x| / 127,
 * round to nearest even; padding blocks zero), then each output is one integer dot product a
 * block (vpdpbusd) scaled in float32, summed in a fixed order: a row's output depends on that
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

/* nb blocks of x into q/d/s (s = d * sum of the block's quants), then zero blocks up to kb */
static void quantize_row(const float *x, int64_t nb, int64_t kb, int8_t *q, float *d, float *s)
{
    for (int64_t b = 0; b < nb; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        _mm_storeu_si128((__m128i *)(q + b * QK), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + b * QK + 16), _mm512_cvtsepi32_epi8(q1));
        d[b] = dd;
        s[b] = dd * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
    memset(q + nb * QK, 0, (size_t)((kb - nb) * QK));
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

static float dot_q4(const uint8_t *wq, const uint16_t *wd, const uint16_t *wm, const int8_t *xq,
                    const float *xd, const float *xs, int64_t kb)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b += 4) {
        __m512i v = _mm512_loadu_si512(wq + b * 16);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, lo4),
                                        _mm512_loadu_si512(xq + b * QK));
        p = _mm512_dpbusd_epi32(p, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4),
                                _mm512_loadu_si512(xq + b * QK + 64));
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
            __m512i xl = _mm512_loadu_si512(xq[i] + b * QK);
            __m512i xh = _mm512_loadu_si512(xq[i] + b * QK + 64);
            __m512 xsc = spread4(_mm_loadu_ps(xd[i] + b));
            for (int j = 0; j < MR; j++) {
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl[j], xl);
                p = _mm512_dpbusd_epi32(p, wh[j], xh);
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws[j], xsc),
                                            acc[i][j]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MR; j++)
            out[i][j] = finish_q4(acc[i][j], wd[j], wm[j], xs[i], kb);
}

static float dot_q8(const int8_t *wq, const uint16_t *wd, const int8_t *xq, const float *xd,
                    int64_t kb)
{
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b += 2) {
        __m512i w = _mm512_loadu_si512(wq + b * QK), x = _mm512_loadu_si512(xq + b * QK);
        /* vpdpbusd multiplies unsigned by signed bytes: |w| times x with w's sign */
        __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
        int32_t h2;
        memcpy(&h2, wd + b, 4);
        __m128 s2 = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h2)),
                               _mm_castpd_ps(_mm_load_sd((const double *)(xd + b))));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                              _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s2)), acc);
    }
    return _mm512_reduce_add_ps(acc);
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
    int8_t *xq = malloc((size_t)(M * kb * QK));
    float *xd = malloc(sizeof(float) * (size_t)(M * kb) * 2);
    if (!xq || !xd) { free(xq); free(xd); return -1; }
    float *xs = xd + M * kb;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * N * K > 65536)
    for (int64_t m = 0; m < M; m++) {
        quantize_row(x + m * K, nb, kb, xq + m * kb * QK, xd + m * kb, xs + m * kb);
        if (w->kind == 4)
            x4_layout(xq + m * kb * QK, kb);
    }
    const int64_t tiles = (N + TILE_N - 1) / TILE_N;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * TILE_N, n1 = n0 + TILE_N < N ? n0 + TILE_N : N;
        int64_t m = 0;
        if (w->kind == 4 && n1 - n0 == TILE_N)            /* 4 x 4 blocks, then the rest */
            for (; m + MR <= M; m += MR)
                for (int64_t n = n0; n < n1; n += MR) {
                    const uint8_t *wq[MR]; const uint16_t *wd[MR], *wm[MR];
                    const int8_t *xr[MR]; const float *xdr[MR], *xsr[MR];
                    float v[MR][MR];
                    for (int i = 0; i < MR; i++) {
                        wq[i] = (const uint8_t *)w->qs + (n + i) * kb * 16;
                        wd[i] = w->d + (n + i) * kb;
                        wm[i] = w->m ? w->m + (n + i) * kb : NULL;
                        xr[i] = xq + (m + i) * kb * QK;
                        xdr[i] = xd + (m + i) * kb;
                        xsr[i] = xs + (m + i) * kb;
                    }
                    dot_q4_4x4(wq, wd, wm, xr, xdr, xsr, kb, v);
                    for (int i = 0; i < MR; i++)
                        for (int j = 0; j < MR; j++)
                            store(w, y, m + i, n + j, v[i][j], accumulate);
                }
        for (; m < M; m++)
            for (int64_t n = n0; n < n1; n++)
                store(w, y, m, n, dot(w, n, xq + m * kb * QK, xd + m * kb, xs + m * kb),
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
