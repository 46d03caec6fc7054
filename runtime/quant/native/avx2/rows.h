/* qmatmul.c's path for calls of few rows (a decode step, a short verify): up to RR activation
 * rows by 8 weight rows at a time, everything in registers, nothing packed.
 *
 * Each block's quants are widened to int16 once and multiplied with every row's (two
 * vpmaddwd); the 8 int32 lanes of a (row, column) are summed across the 8 columns by a
 * vphaddd tree, which leaves the 8 columns' exact block sums in one vector (Q6_K: one vector
 * a half block). Those are scaled and accumulated as qmatmul.c's contract says, lane by lane.
 */
#ifndef AGL_ROWS_H
#define AGL_ROWS_H
#include <immintrin.h>
#include <stdint.h>

#include "blocks.h"
#include "qact.h"

#define RR 4        /* activation rows of a tile */

/* The 8 columns' sums from the two 4-column hadd trees: q0 = columns 0..3, q1 = 4..7, each
 * [c0 c1 c2 c3 | c0 c1 c2 c3] over the lanes 0..3 and 4..7 of their products */
static inline __m256i fold8(__m256i q0, __m256i q1)
{
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31));
}

/* out[i][c] = rows m + i (i < mr) of the activations times weight rows n + c (c < nc <= 8),
 * without bias. Every output gets qmatmul.c's operations, whatever mr and nc are. */
static inline __attribute__((always_inline)) void
rows_tile(const agl_qweight *w, int kind, const qact *a, int64_t m, int mr, int64_t n, int nc,
          float out[RR][8])
{
    const int64_t kb = w->kb;
    const int halves = kind == AGL_Q6_K ? 2 : 1;   /* block sums a column: Q6_K one a half */
    __m256 acc[RR], t[RR];
    for (int i = 0; i < mr; i++)
        acc[i] = t[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < kb; b++) {
        __m256 step, step2, mn;
        scales8(w, kind, n, nc, b, &step, &step2, &mn);
        __m256i q[RR][2][2];                     /* [row][half block][columns 0..3, 4..7] */
        for (int g = 0; g < 2; g++) {            /* columns 4g..4g+3 */
            __m256i hp[RR][2][2];                /* [row][half][pair]: hadd of 2 columns */
            for (int jp = 0; jp < 2; jp++) {
                const int j0 = 4 * g + 2 * jp;
                __m256i lo0 = _mm256_setzero_si256(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
                float s, s2, mm;
                if (j0 < nc)
                    unpack_block(w, kind, n + j0, b, &lo0, &hi0, &s, &s2, &mm);
                if (j0 + 1 < nc)
                    unpack_block(w, kind, n + j0 + 1, b, &lo1, &hi1, &s, &s2, &mm);
                for (int i = 0; i < mr; i++) {
                    const __m256i *xr = (const __m256i *)act_q(a, m + i, b);
                    const __m256i xl = _mm256_loadu_si256(xr), xh = _mm256_loadu_si256(xr + 1);
                    const __m256i a0 = _mm256_madd_epi16(lo0, xl), b0 = _mm256_madd_epi16(hi0, xh);
                    const __m256i a1 = _mm256_madd_epi16(lo1, xl), b1 = _mm256_madd_epi16(hi1, xh);
                    if (halves == 2) {
                        hp[i][0][jp] = _mm256_hadd_epi32(a0, a1);
                        hp[i][1][jp] = _mm256_hadd_epi32(b0, b1);
                    } else {
                        hp[i][0][jp] = _mm256_hadd_epi32(_mm256_add_epi32(a0, b0),
                                                         _mm256_add_epi32(a1, b1));
                    }
                }
            }
            for (int i = 0; i < mr; i++)
                for (int h = 0; h < halves; h++)
                    q[i][h][g] = _mm256_hadd_epi32(hp[i][h][0], hp[i][h][1]);
        }
        for (int i = 0; i < mr; i++) {
            const __m256 dx = _mm256_set1_ps(act_d(a, m + i, b));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold8(q[i][0][0], q[i][0][1])),
                                     _mm256_mul_ps(step, dx), acc[i]);
            if (halves == 2)
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold8(q[i][1][0], q[i][1][1])),
                                         _mm256_mul_ps(step2, dx), acc[i]);
            if (agl_has_min(kind))
                t[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(act_s(a, m + i, b)), t[i]);
        }
    }
    for (int i = 0; i < mr; i++)
        _mm256_storeu_ps(out[i], agl_has_min(kind) ? _mm256_add_ps(acc[i], t[i]) : acc[i]);
}

/* rows_tile with mr (1..RR) and the kind as constants */
#define ROWS_CALL(kind, rows) rows_tile(w, kind, a, m, rows, n, nc, out)
#define ROWS_TILE(kind) WITH_ROWS(mr, ROWS_CALL, kind)

static void run_rows_tile(const agl_qweight *w, const qact *a, int64_t m, int mr, int64_t n,
                          int nc, float out[RR][8])
{
    WITH_KIND(w->kind, ROWS_TILE)
}

/* y's columns n0.. of one weight of the chain (stride ldy), all M rows, this thread's share
 * of the 8-column groups */
static void rows_matmul(const agl_qweight *w, const qact *a, int64_t M, float *y, int64_t ldy,
                        int accumulate, int nthreads)
{
    const int64_t N = w->n, groups = (N + 7) / 8;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t n = g * 8;
        const int nc = N - n < 8 ? (int)(N - n) : 8;
        for (int64_t m = 0; m < M;) {
            const int mr = M - m < RR ? (int)(M - m) : RR;
            float out[RR][8];
            run_rows_tile(w, a, m, mr, n, nc, out);
            store_tile(w, out[0], 8, m, mr, n, nc, y, ldy, accumulate);
            m += mr;
        }
    }
}

#endif
