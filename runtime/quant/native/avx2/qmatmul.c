/* Matmuls over GGUF-style quantized blocks, for x86-64 with AVX2, FMA and F16C: the kernel of
 * CPUs without AVX-512 VNNI (avx512/qmatmul.c is the other build's).
 *
 * y[m, n] = sum_k x[m, k] * w[n, k]. The weights are in the layout avx512/qmatmul.c documents
 * (rows of kb blocks, kb even, a padding block zero; Q4 the file's 16 bytes a block, weights
 * 0..15 in the low nibbles and 16..31 in the high ones, w = q * d + mn with mn = m (Q4_1) or
 * -8 d (Q4_0); Q8 w = q * d, its bytes permuted in groups of 4 blocks, 2 in a last group when
 * kb % 4 == 2: weights 0..15 of each block, then 16..31). d, m: float16 bits. K-quants (Q4_K,
 * Q5_K, Q6_K) and Q5_0 / Q5_1: kquant.h; one block of any kind as the paths read it: blocks.h.
 *
 * The arithmetic, the same for every output whatever computes it:
 *   - each input row is quantized a step a block (d_x = max|x| / 32767, q_x = round(x / d_x),
 *     to nearest even) to int16, in the row's order;
 *   - a block's sum S_b = q_w . q_x is exact in int32 (|S_b| < 32 * 127 * 32767 < 2^28; for Q4
 *     below 2^24, so exact in float32 too); Q6_K has one a half block, each with its step;
 *   - the output is, in float32, a = fma(float(S_b), step_b * d_x,b, a) over the blocks in
 *     order (Q6_K: the first half's then the second's), plus, for kinds with a min,
 *     t = fma(min_b, s_x,b, t) over the blocks (s_x,b = d_x,b * sum(q_x,b)), as a + t; then
 *     + bias, then (accumulate) added to y.
 * So a row's output depends on that row only, never on how many rows a call has, which path
 * runs it or the threads (OpenMP splits the output columns). Two paths: rows.h (few rows: the
 * weights unpacked per block in registers and the sums folded across 8 columns) and panel.h
 * (many rows: the weights unpacked once into panels that every row streams past); they differ
 * in speed only, which PANEL_ROWS picks. Chains of weights of different kinds (qmatmul.h's
 * next) fill their own columns.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "qact.h"
#include "rows.h"
#include "panel.h"
#include "vecmath.h"

#define QMAX 32767.0f
#define PANEL_ROWS 20   /* calls from this many rows on run through panels (panel.h): the
                         * crossover measured on a 2-core Zen 1, 12..24 rows */

static inline float hmax8(__m256 v)
{
    __m128 u = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    u = _mm_max_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_max_ss(u, _mm_movehdup_ps(u)));
}

static inline int32_t hsum8_epi32(__m256i v)
{
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1)));
}

/* 8 int32 (in [-32767, 32767]) x 2 -> 16 int16 in order */
static inline __m256i pack16(__m256i a, __m256i b)
{
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
}

/* Row x's nb blocks into q [kb * 32], xd [kb], xs [kb] (qact); blocks nb..kb-1 zero. */
static void quantize_row(const float *x, int64_t nb, int64_t kb, int16_t *q, float *xd,
                         float *xs)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + b * QK + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
        }
        const float amax = hmax8(mx), d = amax / QMAX, id = amax > 0.0f ? QMAX / amax : 0.0f;
        __m256i qi[4], s = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
            s = _mm256_add_epi32(s, qi[k]);
        }
        _mm256_storeu_si256((__m256i *)(q + b * QK), pack16(qi[0], qi[1]));
        _mm256_storeu_si256((__m256i *)(q + b * QK + 16), pack16(qi[2], qi[3]));
        xd[b] = d;
        xs[b] = d * (float)hsum8_epi32(s);
    }
    if (nb < kb)
        memset(q + nb * QK, 0, sizeof(int16_t) * (size_t)((kb - nb) * QK));
    for (int64_t b = nb; b < kb; b++)
        xd[b] = xs[b] = 0.0f;
}

int agl_qmm(const agl_qweight *w, const float *x, int64_t M, float *y, int accumulate,
            int nthreads)
{
    const int64_t K = w->k, nb = K / QK, kb = w->kb;
    int64_t ldy = 0;                     /* y's row stride: the chain's output columns */
    for (const agl_qweight *p = w; p; p = p->next) {
        if (!agl_known_kind(p->kind))
            return -2;
        ldy += p->n;
    }
    if (M <= 0)                          /* no rows (a step without logits rows) */
        return 0;
    int16_t *q = malloc(sizeof(int16_t) * (size_t)(M * kb * QK));
    float *xd = malloc(sizeof(float) * (size_t)(M * kb) * 2);
    if (!q || !xd) { free(q); free(xd); return -1; }
    float *xs = xd + M * kb;
    const qact act = {q, xd, xs, kb};
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1 && M * ldy * K > 65536)
    for (int64_t m = 0; m < M; m++)
        quantize_row(x + m * K, nb, kb, q + m * kb * QK, xd + m * kb, xs + m * kb);
    int rc = 0;
    for (int64_t col = 0; w && rc == 0; col += w->n, w = w->next) {   /* each part its columns */
        if (M >= PANEL_ROWS)
            rc = panel_matmul(w, &act, M, y + col, ldy, accumulate, nthreads);
        else
            rows_matmul(w, &act, M, y + col, ldy, accumulate, nthreads);
    }
    free(q);
    free(xd);
    return rc;
}

/* y = x @ w.T (+ bias): x float32 [M, k], y float32 [M, n]. 0, or -1 without memory. */
int agl_qmatmul(const agl_qweight *w, const float *x, int64_t M, float *y, int nthreads)
{
    return agl_qmm(w, x, M, y, 0, nthreads);
}
