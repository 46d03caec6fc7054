/* Matmuls over GGUF-style quantized blocks, for x86-64 with AVX-512 VNNI.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k], with w kept as 32-weight blocks:
 *   Q4  (Q4_0, Q4_1): 16 bytes of nibbles a block (low nibbles = weights 0..15, high = 16..31),
 *        w = q * d + mn   (q in 0..15; Q4_1: mn = m; Q4_0: no m, mn = -8 d)
 *   Q8  (Q8_0):       32 int8 a block, w = q * d
 * d, m: float16 bits [N, K/32], as in the file. Each input row is first quantized as llama.cpp does (32 values a
 * block, scale = max|x| / 127, round to nearest even), then each output is one integer dot
 * product a block (vpdpbusd) scaled in float32, blocks summed in a fixed order: a row's
 * output depends on that row only, never on how many rows a call has or on the threads.
 * Threads (OpenMP, the runtime torch also uses) split the output columns.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"

#define QK 32

static void quantize_row(const float *x, int64_t nb, int8_t *q, float *d, float *s)
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
}

/* the 16 lanes of one vpdpbusd over two blocks: lanes 0..7 block b, 8..15 block b + 1 */
static inline __m512 pair_scale(const uint16_t *wd, const float *xd)
{
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    int32_t h2;
    memcpy(&h2, wd, 4);
    __m128 w2 = _mm_cvtph_ps(_mm_cvtsi32_si128(h2));
    __m128 x2 = _mm_castpd_ps(_mm_load_sd((const double *)xd));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(w2, x2)));
}

static inline float half(uint16_t h) { return _cvtsh_ss(h); }

/* One Q4 block (16 bytes of nibbles) against 32 activations in natural order. */
static inline int32_t block_q4(const uint8_t *wq, const int8_t *xq)
{
    __m128i v = _mm_loadu_si128((const __m128i *)wq);
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
    __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set_m128i(hi, lo),
                                    _mm256_loadu_si256((const __m256i *)xq));
    __m128i p4 = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    p4 = _mm_add_epi32(p4, _mm_shuffle_epi32(p4, _MM_SHUFFLE(1, 0, 3, 2)));
    p4 = _mm_add_epi32(p4, _mm_shuffle_epi32(p4, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(p4);
}

/* Q4 rows read 4 blocks (64 bytes of nibbles) at a time: the low nibbles are weights 0..15 of
 * each block, the high ones 16..31, so the activations of every full group of 4 blocks are
 * stored as [0..15 of each block][16..31 of each block] (x4_layout); lanes 4b..4b+3 of the
 * products then belong to block b. Blocks after the last full group stay in natural order. */
static void x4_layout(int8_t *q, int64_t nb)
{
    for (int64_t g = 0; g + 4 <= nb; g += 4) {
        __m512i a = _mm512_loadu_si512(q + g * QK), b = _mm512_loadu_si512(q + g * QK + 64);
        _mm512_storeu_si512(q + g * QK, _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_si512(q + g * QK + 64, _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

static float dot_q4(const uint8_t *wq, const uint16_t *wd, const uint16_t *wm, const int8_t *xq,
                    const float *xd, const float *xs, int64_t nb)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m512i v = _mm512_loadu_si512(wq + b * 16);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, lo4),
                                        _mm512_loadu_si512(xq + b * QK));
        p = _mm512_dpbusd_epi32(p, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4),
                                _mm512_loadu_si512(xq + b * QK + 64));
        __m128 s4 = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(wd + b))),
                               _mm_loadu_ps(xd + b));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                              _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s4)), acc);
    }
    float r = _mm512_reduce_add_ps(acc);
    for (; b < nb; b++)
        r += (float)block_q4(wq + b * 16, xq + b * QK) * (half(wd[b]) * xd[b]);
    for (int64_t c = 0; c < nb; c++)
        r += (wm ? half(wm[c]) : -8.0f * half(wd[c])) * xs[c];
    return r;
}

static float dot_q8(const int8_t *wq, const uint16_t *wd, const int8_t *xq, const float *xd,
                    int64_t nb)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i w = _mm512_loadu_si512(wq + b * QK), x = _mm512_loadu_si512(xq + b * QK);
        /* vpdpbusd multiplies unsigned by signed bytes: |w| times x with w's sign */
        __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), pair_scale(wd + b, xd + b), acc);
    }
    float r = _mm512_reduce_add_ps(acc);
    if (b < nb) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(wq + b * QK));
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + b * QK));
        __m256i sx = _mm256_mask_sub_epi8(x, _mm256_movepi8_mask(w), _mm256_setzero_si256(), x);
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), sx);
        __m128i p4 = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        p4 = _mm_add_epi32(p4, _mm_shuffle_epi32(p4, _MM_SHUFFLE(1, 0, 3, 2)));
        p4 = _mm_add_epi32(p4, _mm_shuffle_epi32(p4, _MM_SHUFFLE(2, 3, 0, 1)));
        r += (float)_mm_cvtsi128_si32(p4) * (half(wd[b]) * xd[b]);
    }
    return r;
}

#define TILE_N 16   /* output columns a task: their weights stay in L1/L2 across the rows */

int agl_qmm(const agl_qweight *w, const float *x, int64_t M, float *y, int accumulate,
            int nthreads)
{
    const int64_t K = w->k, N = w->n, nb = K / QK;
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc(sizeof(float) * (size_t)(M * nb) * 2);
    if (!xq || !xd) { free(xq); free(xd); return -1; }
    float *xs = xd + M * nb;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * N * K > 65536)
    for (int64_t m = 0; m < M; m++) {
        quantize_row(x + m * K, nb, xq + m * K, xd + m * nb, xs + m * nb);
        if (w->kind == 4)
            x4_layout(xq + m * K, nb);
    }
    const int64_t tiles = (N + TILE_N - 1) / TILE_N;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n1 = t * TILE_N + TILE_N < N ? t * TILE_N + TILE_N : N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = t * TILE_N; n < n1; n++) {
                float v = w->kind == 4
                    ? dot_q4((const uint8_t *)w->qs + n * (K / 2), w->d + n * nb,
                             w->m ? w->m + n * nb : NULL, xq + m * K, xd + m * nb, xs + m * nb, nb)
                    : dot_q8((const int8_t *)w->qs + n * K, w->d + n * nb, xq + m * K,
                             xd + m * nb, nb);
                if (w->bias)
                    v += w->bias[n];
                y[m * N + n] = accumulate ? y[m * N + n] + v : v;
            }
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
