/* Matmuls over GGUF-style quantized blocks, for x86-64 with AVX2, FMA and F16C: the kernel of
 * CPUs without AVX-512 VNNI (avx512/qmatmul.c is the other build's).
 *
 * y[m, n] = sum_k x[m, k] * w[n, k]. The weights are in the layout avx512/qmatmul.c documents
 * (rows of kb blocks, kb even, a padding block zero; Q4 the file's 16 bytes a block, weights
 * 0..15 in the low nibbles and 16..31 in the high ones, w = q * d + mn with mn = m (Q4_1) or
 * -8 d (Q4_0); Q8 w = q * d, its bytes permuted in groups of 4 blocks, 2 in a last group when
 * kb % 4 == 2: weights 0..15 of each block, then 16..31). d, m: float16 bits.
 *
 * Each input row is quantized exactly as there, a step a block (d = max|x| / 32767,
 * q = round(x / d), to nearest even), kept here as int16 in the row's order. A block's integer
 * sum q_w . q_x is two vpmaddwd of its weights widened to int16 against those q_x: exact in
 * int32 (|sum| < 32 * 128 * 32767 < 2^27; for Q4 below 2^24, so exact in float32 too). Its 8
 * int32 lanes are scaled in float32 by the two blocks' steps and accumulated per lane over the
 * row's blocks, the 8 lanes then summed in a fixed order (vecmath.h's hsum8); Q4's minimum term
 * sum_b mn_b * d_x,b * sum(q_x,b) is a scalar fused multiply-add chain over the blocks.
 * Every output gets the same operations whatever tile computes it, so a row's output depends
 * on that row only, never on how many rows a call has or on the threads (OpenMP splits the
 * output columns). K-quants (Q4_K, Q5_K, Q6_K) and chains of weights of different kinds
 * (qmatmul.h's next): kquant.h.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "kquant.h"
#include "vecmath.h"

#define QK 32
#define MR 4        /* activation rows of a many-row tile */
#define NR 2        /* its weight rows (MR * NR accumulators + theirs: the 16 registers) */
#define NR1 4       /* weight rows of a one- or two-row tile (Q4 and Q8, each row prefetched) */
#define TILE_N 16   /* output columns a task step: their weights stay in L1 across the rows */
#define CHUNK_BYTES 24576   /* activations a pass: they stay in L1 while weights stream past */
#define QMAX 32767.0f
#define PREFETCH 512   /* bytes ahead in a weight row */

/* The quantized activations of a call: row r's int16 q at q + r * kb * 32, its steps at
 * xd + r * kb, step times the block's sum of q at xs + r * kb (blocks past the row's: 0). */
typedef struct {
    const int16_t *q;
    const float *xd, *xs;
} qact;

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

/* Block b of weight row r as int16: weights 0..15 at lo, 16..31 at hi */
static inline __attribute__((always_inline)) void
weights16(const agl_qweight *w, int kind, int64_t r, int64_t b, __m256i *lo, __m256i *hi)
{
    const int64_t kb = w->kb;
    if (kind == 4) {
        /* the 16 bytes widened to int16: the low nibble masked, the high one shifted down */
        const __m256i v = _mm256_cvtepu8_epi16(
            _mm_loadu_si128((const __m128i *)((const uint8_t *)w->qs + (r * kb + b) * 16)));
        *lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
        *hi = _mm256_srli_epi16(v, 4);
    } else {
        const int64_t g = b >> 2, at = b & 3, blocks = g < kb >> 2 ? 4 : 2;
        const int8_t *p = (const int8_t *)w->qs + r * kb * QK + g * 128;
        *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * at)));
        *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * (blocks + at))));
    }
}

/* out[i][j] = row m + i of x times weight row n + j, for i < mr, j < nr (mr * nr <= MR * NR
 * or mr == 1, nr <= NR1). Every output gets the same operations in the same order whatever
 * mr and nr are (constants where it is inlined). */
static inline __attribute__((always_inline)) void
tile(const agl_qweight *w, int kind, const qact *a, int64_t m, int mr, int64_t n, int nr,
     float out[MR][NR1])
{
    const int64_t kb = w->kb;
    __m256 acc[MR][NR1];
    float t[MR][NR1];                       /* Q4: the minimum term, sum_b mn_b * xs_b */
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            acc[i][j] = _mm256_setzero_ps();
            t[i][j] = 0.0f;
        }
    for (int64_t b = 0; b < kb; b++) {
        float dx[MR];
        for (int i = 0; i < mr; i++)
            dx[i] = a->xd[(m + i) * kb + b];
        for (int j = 0; j < nr; j++) {
            __m256i lo, hi;
            if (nr > 1)   /* several weight rows stream at once: help the prefetcher */
                _mm_prefetch((const char *)w->qs + ((n + j) * kb + b) * (kind == 8 || kind == AGL_Q6_K ? QK : 16) + PREFETCH,
                             _MM_HINT_T0);
            if (kind == AGL_Q4_K || kind == AGL_Q5_K || kind == AGL_Q6_K) {
                float dlo, dhi, mn;
                kq_weights16(w, kind, n + j, b, &lo, &hi, &dlo, &dhi, &mn);
                if (kind != AGL_Q6_K)
                    for (int i = 0; i < mr; i++)
                        t[i][j] = fmaf(mn, a->xs[(m + i) * kb + b], t[i][j]);
                for (int i = 0; i < mr; i++) {
                    const int16_t *x = a->q + ((m + i) * kb + b) * QK;
                    const __m256i plo = _mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)x));
                    const __m256i phi = _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 16)));
                    if (kind == AGL_Q6_K) {     /* the halves apart: their own steps */
                        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(plo),
                                                    _mm256_set1_ps(dlo * dx[i]), acc[i][j]);
                        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(phi),
                                                    _mm256_set1_ps(dhi * dx[i]), acc[i][j]);
                    } else {
                        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(plo, phi)),
                                                    _mm256_set1_ps(dlo * dx[i]), acc[i][j]);
                    }
                }
                continue;
            }
            if (kind == AGL_Q5)
                q5_weights16(w, n + j, b, &lo, &hi);
            else
                weights16(w, kind, n + j, b, &lo, &hi);
            const float dw = _cvtsh_ss(w->d[(n + j) * kb + b]);
            if (kind == 4 || kind == AGL_Q5) {
                const float mn = w->m ? _cvtsh_ss(w->m[(n + j) * kb + b])
                                      : (kind == 4 ? -8.0f : -16.0f) * dw;
                for (int i = 0; i < mr; i++)
                    t[i][j] = fmaf(mn, a->xs[(m + i) * kb + b], t[i][j]);
            }
            for (int i = 0; i < mr; i++) {
                const int16_t *x = a->q + ((m + i) * kb + b) * QK;
                const __m256i p = _mm256_add_epi32(
                    _mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)x)),
                    _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 16))));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx[i]),
                                            acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            out[i][j] = kind == 4 || kind == AGL_Q5 || kind == AGL_Q4_K || kind == AGL_Q5_K
                            ? hsum8(acc[i][j]) + t[i][j] : hsum8(acc[i][j]);
}

/* the tile shapes: 4 or 3 rows by NR or 1 columns, 2 or 1 rows by NR1, NR or 1 (each a
 * constant-shaped inlined copy of tile) */
#define TILES(kind)                                                                      \
    do {                                                                                 \
        if (mr == 4) {                                                                   \
            if (nr == NR) tile(w, kind, a, m, 4, n, NR, v);                              \
            else tile(w, kind, a, m, 4, n, 1, v);                                        \
        } else if (mr == 3) {                                                            \
            if (nr == NR) tile(w, kind, a, m, 3, n, NR, v);                              \
            else tile(w, kind, a, m, 3, n, 1, v);                                        \
        } else if (mr == 2) {                                                            \
            if (nr == NR1) tile(w, kind, a, m, 2, n, NR1, v);                            \
            else if (nr == NR) tile(w, kind, a, m, 2, n, NR, v);                         \
            else tile(w, kind, a, m, 2, n, 1, v);                                        \
        } else {                                                                         \
            if (nr == NR1) tile(w, kind, a, m, 1, n, NR1, v);                            \
            else if (nr == NR) tile(w, kind, a, m, 1, n, NR, v);                         \
            else tile(w, kind, a, m, 1, n, 1, v);                                        \
        }                                                                                \
    } while (0)

/* rows m.. (mr <= MR) and columns n.. (nr: see TILES) of y (row stride ldy) */
static void run_tile(const agl_qweight *w, const qact *a, int64_t m, int mr, int64_t n, int nr,
                     float *y, int64_t ldy, int accumulate)
{
    float v[MR][NR1];
    switch (w->kind) {
    case AGL_Q4: TILES(AGL_Q4); break;
    case AGL_Q5: TILES(AGL_Q5); break;
    case AGL_Q4_K: TILES(AGL_Q4_K); break;
    case AGL_Q5_K: TILES(AGL_Q5_K); break;
    case AGL_Q6_K: TILES(AGL_Q6_K); break;
    default: TILES(AGL_Q8);
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float o = v[i][j] + (w->bias ? w->bias[n + j] : 0.0f);
            float *d = y + (m + i) * ldy + n + j;
            *d = accumulate ? *d + o : o;
        }
}

int agl_qmm(const agl_qweight *w, const float *x, int64_t M, float *y, int accumulate,
            int nthreads)
{
    const int64_t K = w->k, nb = K / QK, kb = w->kb;
    int64_t ldy = 0;                     /* y's row stride: the chain's output columns */
    for (const agl_qweight *p = w; p; p = p->next) {
        if (p->kind != AGL_Q4 && p->kind != AGL_Q5 && p->kind != AGL_Q8 && p->kind != AGL_Q4_K
            && p->kind != AGL_Q5_K && p->kind != AGL_Q6_K)
            return -2;
        ldy += p->n;
    }
    int16_t *q = malloc(sizeof(int16_t) * (size_t)(M * kb * QK));
    float *xd = malloc(sizeof(float) * (size_t)(M * kb) * 2);
    if (!q || !xd) { free(q); free(xd); return -1; }
    float *xs = xd + M * kb;
    const qact act = {q, xd, xs}, *a = &act;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1 && M * ldy * K > 65536)
    for (int64_t m = 0; m < M; m++)
        quantize_row(x + m * K, nb, kb, q + m * kb * QK, xd + m * kb, xs + m * kb);
    const int64_t fit = CHUNK_BYTES / (kb * QK * 2) / MR * MR, chunk = fit > MR ? fit : MR;
    for (int64_t col = 0; w; col += w->n, w = w->next) {   /* each part its own columns */
    const int64_t N = w->n, tiles = (N + TILE_N - 1) / TILE_N;
    float *yw = y + col;
    #pragma omp parallel num_threads(nthreads)
    {   /* each thread a contiguous range of column tiles, chunk rows at a time */
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t t0 = tiles * tid / nth, t1 = tiles * (tid + 1) / nth;
        for (int64_t m0 = 0; m0 < M; m0 += chunk) {
            const int64_t m1 = m0 + chunk < M ? m0 + chunk : M;
            for (int64_t n = t0 * TILE_N; n < t1 * TILE_N && n < N;) {
                /* 3 or more rows: tiles of up to MR rows by NR columns (a remainder of 2
                 * or 3 rows one tile); one or two rows (a decode, a one-token verify): one
                 * tile by NR1, so the weights stream past once for both rows (with the
                 * prefetch, 4 weight streams at once beat one for Q8 too: lm_head 4.5 ->
                 * 3.1 ms). 3 rows: 1.4x faster than 3 one-row passes (matmuls alone) */
                const int want = m1 - m0 >= 3 ? NR : NR1;
                const int nr = want > 1 && n % TILE_N + want <= TILE_N && n + want <= N ? want : 1;
                for (int64_t m = m0; m < m1;) {
                    const int mr = m1 - m >= MR ? MR : (int)(m1 - m);
                    run_tile(w, a, m, mr, n, nr, yw, ldy, accumulate);
                    m += mr;
                }
                n += nr;
            }
        }
    }
    }
    free(q);
    free(xd);
    return 0;
}

/* y = x @ w.T (+ bias): x float32 [M, k], y float32 [M, n]. 0, or -1 without memory. */
int agl_qmatmul(const agl_qweight *w, const float *x, int64_t M, float *y, int nthreads)
{
    return agl_qmm(w, x, M, y, 0, nthreads);
}
