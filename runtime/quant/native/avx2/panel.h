/* qmatmul.c's path for calls of many rows (prefill, batched decode): the weights of 16 output
 * columns are unpacked once a call into a panel, then every activation row streams past it.
 *
 * A panel holds KC blocks of 16 weight rows as int16 pairs, transposed: entry (b, p, c) is the
 * 32-bit pair of quants 2p, 2p + 1 of column c's block b (p < 8; pairs 8..15: quants 16 + 2p'
 * ...). A tile of PR activation rows then broadcasts each row's matching pair of int16 quants
 * and multiplies it with the 16 columns at once (two vpmaddwd: 8 columns a vector), so a
 * column's exact block sum builds up in its own int32 lane: no reduction, 32 multiply-adds per
 * pair of loads. The block's scales (unpack_block's, the same floats as scales8's) sit beside
 * the panel; the float32 steps are qmatmul.c's contract, lane by lane. (Tried: the quants as
 * float32 and FMAs, exact for Q4 kinds, whose partial sums stay below 2^24: no faster.)
 */
#ifndef AGL_PANEL_H
#define AGL_PANEL_H
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "qact.h"

#define PN 16       /* columns of a panel */
#define PR 4        /* activation rows of a tile (PR * 2 int32 sums + 2 weights + 1 broadcast) */
#define KC 24       /* blocks of a panel at a time: 24 KB of pairs, in L1 while the rows pass */

typedef struct {
    int32_t pairs[KC * 16 * PN];                  /* (b - b0, p, c) */
    float step[KC][PN], step2[KC][PN], min[KC][PN];
} panel;

/* r[i] lane j -> r[j] lane i (8 x 8 of 32 bits) */
static inline void transpose8(__m256i r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_castsi256_ps(_mm256_unpacklo_epi32(r[i], r[i + 1]));
        t[i + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi32(r[i], r[i + 1]));
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        r[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* Blocks b0..b1-1 (b1 - b0 <= KC) of weight rows n0..n0+nc-1 into pn (columns past nc: 0) */
static inline __attribute__((always_inline)) void pack_panel(const agl_qweight *w, int kind, int64_t n0, int nc, int64_t b0,
                       int64_t b1, panel *pn)
{
    for (int64_t b = b0; b < b1; b++) {
        for (int h = 0; h < 2; h++) {              /* columns 8h..8h+7 */
            __m256i lo[8], hi[8];
            for (int c = 0; c < 8; c++) {
                const int col = 8 * h + c;
                float s = 0.0f, s2 = 0.0f, mn = 0.0f;
                lo[c] = hi[c] = _mm256_setzero_si256();
                if (col < nc)
                    unpack_block(w, kind, n0 + col, b, &lo[c], &hi[c], &s, &s2, &mn);
                pn->step[b - b0][col] = s;
                pn->step2[b - b0][col] = s2;
                pn->min[b - b0][col] = mn;
            }
            transpose8(lo);                        /* lo[p]: pair p of the 8 columns */
            transpose8(hi);
            int32_t *o = pn->pairs + (b - b0) * 16 * PN + 8 * h;
            for (int p = 0; p < 8; p++) {
                _mm256_storeu_si256((__m256i *)(o + p * PN), lo[p]);
                _mm256_storeu_si256((__m256i *)(o + (p + 8) * PN), hi[p]);
            }
        }
    }
}

/* Columns 8h..8h+7 of a block's sums of one row (s1: Q6_K's first half block, then s its
 * second; other kinds: s) scaled into acc by the row's step dx_ and the panel's steps (e: the
 * block in the panel), the min term (the row's sx) into t, lane by lane */
static inline __attribute__((always_inline)) void
finish_half(int kind, float dx_, float sx, const panel *pn, int64_t e, int h, __m256 s1, __m256 s,
            float *acc, float *t)
{
    const __m256 dx = _mm256_set1_ps(dx_);
    {
        __m256 v = _mm256_loadu_ps(acc + 8 * h);
        const __m256 d = _mm256_loadu_ps(pn->step[e] + 8 * h);
        if (kind == AGL_Q6_K) {
            v = _mm256_fmadd_ps(s1, _mm256_mul_ps(d, dx), v);
            v = _mm256_fmadd_ps(s, _mm256_mul_ps(_mm256_loadu_ps(pn->step2[e] + 8 * h), dx), v);
        } else {
            v = _mm256_fmadd_ps(s, _mm256_mul_ps(d, dx), v);
        }
        _mm256_storeu_ps(acc + 8 * h, v);
        if (agl_has_min(kind))
            _mm256_storeu_ps(t + 8 * h, _mm256_fmadd_ps(_mm256_loadu_ps(pn->min[e] + 8 * h),
                                                        _mm256_set1_ps(sx),
                                                        _mm256_loadu_ps(t + 8 * h)));
    }
}

/* Rows m..m+mr-1 (mr <= PR) over the panel's blocks b0..b1-1: acc[i][c] += the blocks'
 * scaled sums, t[i][c] += their min terms, in block order */
static inline __attribute__((always_inline)) void
panel_tile(int kind, const qact *a, int64_t m, int mr, int64_t b0, int64_t b1, const panel *pn,
           float (*acc)[PN], float (*t)[PN])
{
    for (int64_t b = b0; b < b1; b++) {
        const int32_t *wb = pn->pairs + (b - b0) * 16 * PN;
        __m256i s[PR][2], s1[PR][2];              /* s1: Q6_K's first half block */
        for (int i = 0; i < mr; i++)
            s[i][0] = s[i][1] = s1[i][0] = s1[i][1] = _mm256_setzero_si256();
        for (int p = 0; p < 16; p++) {
            if (kind == AGL_Q6_K && p == 8)
                for (int i = 0; i < mr; i++) {
                    s1[i][0] = s[i][0];
                    s1[i][1] = s[i][1];
                    s[i][0] = s[i][1] = _mm256_setzero_si256();
                }
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wb + p * PN));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wb + p * PN + 8));
            const int at = p < 8 ? 2 * p : 16 + 2 * (p - 8);
            for (int i = 0; i < mr; i++) {
                int32_t pair;
                memcpy(&pair, act_q(a, m + i, b) + at, sizeof pair);
                const __m256i x = _mm256_set1_epi32(pair);
                s[i][0] = _mm256_add_epi32(s[i][0], _mm256_madd_epi16(w0, x));
                s[i][1] = _mm256_add_epi32(s[i][1], _mm256_madd_epi16(w1, x));
            }
        }
        for (int i = 0; i < mr; i++)
            for (int h = 0; h < 2; h++)
                finish_half(kind, act_d(a, m + i, b), act_s(a, m + i, b), pn, b - b0, h,
                            _mm256_cvtepi32_ps(s1[i][h]), _mm256_cvtepi32_ps(s[i][h]), acc[i], t[i]);
    }
}

/* pack_panel with the kind a constant */
#define PACK(kind) pack_panel(w, kind, n0, nc, b0, b1, pn)

static void pack_any(const agl_qweight *w, int64_t n0, int nc, int64_t b0, int64_t b1, panel *pn)
{
    WITH_KIND(w->kind, PACK)
}

/* rows m..m+mr-1 (mr <= PR) over the panel, the kind and mr as constants */
#define PANEL_CALL(kind, rows) panel_tile(kind, a, m, rows, b0, b1, pn, acc, t)
#define PANEL_TILE(kind) WITH_ROWS(mr, PANEL_CALL, kind)

static void run_panel_tile(int kind, const qact *a, int64_t m, int mr, int64_t b0, int64_t b1,
                           const panel *pn, float (*acc)[PN], float (*t)[PN])
{
    WITH_KIND(kind, PANEL_TILE)
}

/* As rows_matmul (rows.h), through panels: each thread a contiguous range of them. 0, or -1
 * without memory for a thread's panel and sums. (Tried: MC rows at a time, a chunk of blocks
 * for all of a thread's panels, so a chunk's activations stay in L2: no faster at 8192
 * in-features and 512 rows.) */
static int panel_matmul(const agl_qweight *w, const qact *a, int64_t M, float *y, int64_t ldy,
                        int accumulate, int nthreads)
{
    const int64_t N = w->n, kb = w->kb, panels = (N + PN - 1) / PN;
    int fail = 0;
    #pragma omp parallel num_threads(nthreads) reduction(|:fail)
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t p0 = panels * tid / nth, p1 = panels * (tid + 1) / nth;
        panel *pn = aligned_alloc(64, sizeof(panel));
        float (*acc)[PN] = malloc(sizeof(float) * PN * (size_t)M * 2);   /* then t's */
        if (p0 < p1 && (!pn || !acc)) {
            fail = 1;
        } else {
            float (*t)[PN] = acc + M;
            for (int64_t q = p0; q < p1; q++) {
                const int64_t n0 = q * PN;
                const int nc = N - n0 < PN ? (int)(N - n0) : PN;
                memset(acc, 0, sizeof(float) * PN * (size_t)M * 2);
                for (int64_t b0 = 0; b0 < kb; b0 += KC) {
                    const int64_t b1 = b0 + KC < kb ? b0 + KC : kb;
                    pack_any(w, n0, nc, b0, b1, pn);
                    for (int64_t m = 0; m < M; m += PR) {
                        const int mr = M - m < PR ? (int)(M - m) : PR;
                        run_panel_tile(w->kind, a, m, mr, b0, b1, pn, acc + m, t + m);
                    }
                }
                if (agl_has_min(w->kind))
                    for (int64_t m = 0; m < M; m++)
                        for (int c = 0; c < PN; c++)
                            acc[m][c] += t[m][c];
                store_tile(w, acc[0], PN, 0, (int)M, n0, nc, y, ldy, accumulate);
            }
        }
        free(pn);
        free(acc);
    }
    return fail ? -1 : 0;
}

#endif
