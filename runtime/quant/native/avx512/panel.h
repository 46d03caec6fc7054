/* The AMX build's Q4 / Q5 / Q8 / Q4_K / Q6_K matmul (qmatmul.c includes it with -DAGL_AMX, the kinds
 * of qmatmul.h's agl_panel_kind): weights in panels of
 * 16 output rows, multiplied by AMX tiles (TDPBSSD / TDPBUSD) when a call has AMX_ROWS rows or
 * more (AMX_ROWS_NIBBLES for the 4-bit kinds) and by AVX-512 VNNI (VPDPWSSD) with one weight
 * row a lane below that (or where Linux refuses the
 * tiles); both give every output bit for bit the same value, so a row's output never depends
 * on how many rows its call has.
 *
 * Panel layout (runtime/quant/block_linear.py: panel_order). A weight of n rows and kb blocks
 * a row is cut into P = ceil(n / 16) panels of 16 rows (the last padded with zero rows); panel
 * p's block b holds words kk of 4 bytes (Q4: 4 words, Q8: 8) of its 16 rows, row c's word kk
 * at byte 64 kk + 4 c:
 *   Q4: qs uint8 [P, kb, 4, 16, 4], the file's bytes moved word by word: the low nibbles of
 *       word kk are weights 4 kk .. 4 kk + 3 of the block, the high ones 16 + 4 kk ..
 *   Q8: qs int8 [P, kb, 8, 16, 4], word kk = weights 4 kk .. 4 kk + 3
 *   d (and Q4_1's m): float16 [P, kb, 16], row c's step (min) of block b at c
 *   Q4_K: qs as Q4 (kquant.h's low 4 bits, in Q4_1's order); d and dmin (m) float16
 *       [P, kb / 8, 16] a super-block; sc, mn uint8 [P, kb, 16] a block: its step d sc and
 *       min -dmin mn, both exact in float32
 *   Q5 (Q5_0 / Q5_1): qs and d, m as Q4's (m NULL: Q5_0, -16 d); hb uint8 [P, kb, 8, 8]: bit
 *       4 of the unpacked word-row kk as a 64-bit mask (bit 4 c + e: weight 4 kk + e of row c)
 *   Q6_K: qs as Q8 (kquant.h's q - 32, int8); d float16 [P, kb / 8, 16]; sc int8
 *       [P, kb, 2, 16], the steps d sc of a block's halves (words 0..3, 4..7), each half's sum
 *       kept apart (in the tiles: two products of K = 16)
 * Unpacked to int8 (Q4: low nibbles as words 0..3, high ones as 4..7), a block is an AMX B tile
 * of 8 rows of 64 bytes: C[i][c] += sum over K of x[i][k] w[c][k] is the block's sum of row c.
 *
 * Activations (quantize_panel_row): each row quantized as qmatmul.c's are, 16 bits a weight,
 * a step a block (d = max|x| / 32767, q = round(x / d)), with the block's step dx and xs =
 * dx * sum(q) (the min term); kept a block at a time for the path that reads them: for the
 * tiles as q = 256 h + l, h int8 [32] then l uint8 [32] (an AMX A tile's row: rows of a call
 * at a stride of kb * 64 bytes); for VNNI as q int16 [32] in pairs, word 2j = (q[4j], q[4j+2])
 * and word 2j + 1 = (q[4j+1], q[4j+3]) (low half first): the pairs of weights that
 * vpdpwssd multiplies, taken from word j of the unpacked block (weights 4j .. 4j + 3).
 *
 * Arithmetic, the same in both paths: block b's integer sum s = w . q (the tiles: 256 (w . h)
 * + w . l) is exact (int32); then, in block order, acc = fma(float(s), dw * dx, acc) (Q6_K:
 * each half's sum with its step, first half first) and, the 4-bit kinds, accm = fma(mn, xs,
 * accm) (mn = m, -8 dw for Q4_0, -dmin mn for Q4_K); the output is acc + accm (+ bias). The
 * lanes of acc are the panel's 16 rows: each output's float operations are its own, whatever the
 * number of rows, the path or the threads (OpenMP splits the panels).
 */
#ifndef AGL_PANEL_H
#define AGL_PANEL_H
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "qmatmul.h"
#include "vecmath.h"

#define PN 16            /* weight rows a panel: the lanes of an accumulator */
#define PBLK 64          /* activation bytes a block: h[32], l[32] */
#define PROWS 16         /* activation rows an AMX tile */
#define AMX_ROWS 4       /* calls of at least this many rows run on AMX tiles (8-bit kinds) */
#define AMX_ROWS_NIBBLES 9   /* the same for the 4-bit kinds, whose tiles are unpacked first.
                          * Measured on a 2-core Xeon, both builds in one process, 30 layers'
                          * weights streamed from memory: the tiles' products are stored and
                          * scaled a block at a time, so below 9 rows of Q4_1 VNNI is faster
                          * (6 rows: 7.8 vs 8.9 ms a model's worth, 8: 9.7 vs 10.2), from 9 the
                          * tiles (13: 11.9 vs 13.1); Q8_0 (the 49k-row head) from 4 rows
                          * (2.8 vs 3.0 ms) */
#define VNNI_ROWS 6      /* activation rows a VNNI pass (the weights unpacked once for them;
                          * 5 or 6 rows in one pass rather than 4 + 1 or 4 + 2: faster steps) */

/* The quantized activations of a call (quantize_panel_row): row r's block b at
 * q + (r * kb + b) * PBLK (h, l: the tiles' layout) and at q16 + (r * kb + b) * 32 (pairs: the
 * VNNI path's), each NULL where no part of the call takes that path; dx, xs float [rows, kb]. */
typedef struct {
    const uint8_t *q;
    const int16_t *q16;
    const float *dx, *xs;
    int64_t kb;
} pact;

/* 1 where this process may use AMX tiles (asks Linux for the tile data permission: process-
 * wide, idempotent), else 0 */
static inline int panel_amx_permitted(void)
{
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

/* Whether the tiles may run, asked once when the library is loaded (set only there): without
 * the permission a tile instruction kills the process, so calls then take the VNNI path,
 * which gives the same outputs. */
static int panel_amx_ok;

__attribute__((constructor)) static void panel_ask_amx(void)
{
    panel_amx_ok = panel_amx_permitted();
}

/* Row x (nb blocks) into kb blocks: h, l at a (PBLK bytes a block) and the pairs at a16 (32
 * int16 a block), each unless NULL; their steps at dx, min terms at xs; blocks nb..kb-1 zero. */
static void quantize_panel_row(const float *x, int64_t nb, int64_t kb, uint8_t *a, int16_t *a16,
                               float *dx, float *xs)
{
    /* int16 i of a block's pairs is q[pair_of[i]]: in each 4, q[0], q[2], q[1], q[3] */
    const __m512i pair_of = _mm512_set_epi16(31, 29, 30, 28, 27, 25, 26, 24, 23, 21, 22, 20,
                                             19, 17, 18, 16, 15, 13, 14, 12, 11, 9, 10, 8,
                                             7, 5, 6, 4, 3, 1, 2, 0);
    for (int64_t b = 0; b < kb; b++) {
        if (b >= nb) {
            if (a)
                memset(a + b * PBLK, 0, PBLK);
            if (a16)
                memset(a16 + b * 32, 0, 64);
            dx[b] = xs[b] = 0.0f;
            continue;
        }
        __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 32767.0f, id = amax > 0.0f ? 32767.0f / amax : 0.0f;
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
        if (a) {
            uint8_t *g = a + b * PBLK;
            __m512i h0 = _mm512_srai_epi32(q0, 8), h1 = _mm512_srai_epi32(q1, 8);
            _mm_storeu_si128((__m128i *)g, _mm512_cvtepi32_epi8(h0));
            _mm_storeu_si128((__m128i *)(g + 16), _mm512_cvtepi32_epi8(h1));
            _mm_storeu_si128((__m128i *)(g + 32), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(g + 48), _mm512_cvtepi32_epi8(q1));
        }
        if (a16) {                       /* |q| <= 32767: exact in int16 */
            const __m512i q16 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(q0)),
                                                   _mm512_cvtepi32_epi16(q1), 1);
            _mm512_storeu_si512(a16 + b * 32, _mm512_permutexvar_epi16(pair_of, q16));
        }
        dx[b] = d;
        xs[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/* The panel kinds (qmatmul.h's agl_panel_kind) stored as nibbles (Q5 with a bit 4 besides):
 * unsigned quants, with a min */
static inline int panel_nibbles(int kind)
{
    return kind == AGL_Q4 || kind == AGL_Q4_K || kind == AGL_Q5;
}

/* Block b of panel p as 8 words-rows of int8 (a B tile): Q4 unpacked from its nibbles, Q8 read
 * as stored */
static inline __attribute__((always_inline)) void
panel_block(const agl_qweight *w, int64_t p, int64_t b, __m512i wv[8])
{
    if (panel_nibbles(w->kind)) {
        const uint8_t *s = (const uint8_t *)w->qs + (p * w->kb + b) * 256;
        const __m512i lo4 = _mm512_set1_epi8(0x0F);
        for (int kk = 0; kk < 4; kk++) {
            __m512i v = _mm512_loadu_si512(s + 64 * kk);
            wv[kk] = _mm512_and_si512(v, lo4);
            wv[kk + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
        }
        if (w->kind == AGL_Q5) {            /* bit 4 */
            const uint64_t *hb = (const uint64_t *)(w->hb + (p * w->kb + b) * 64);
            for (int kk = 0; kk < 8; kk++)
                wv[kk] = _mm512_mask_add_epi8(wv[kk], (__mmask64)hb[kk], wv[kk], _mm512_set1_epi8(16));
        }
    } else {
        const int8_t *s = (const int8_t *)w->qs + (p * w->kb + b) * 512;
        for (int kk = 0; kk < 8; kk++)
            wv[kk] = _mm512_loadu_si512(s + 64 * kk);
    }
}

/* Block b's steps of panel p's rows (16 floats): the first half's, returned, and the second
 * half's at *step1 (Q6_K its own, the other kinds the same); its min at *mn (Q4_1 m, Q4_0
 * -8 d, Q5_0 -16 d, Q4_K -dmin mn; 0 for Q8 and Q6_K) */
static inline __m512 panel_steps(const agl_qweight *w, int64_t p, int64_t b, __m512 *mn,
                                 __m512 *step1)
{
    const int64_t at = (p * w->kb + b) * PN;
    *mn = _mm512_setzero_ps();
    if (w->kind == AGL_Q6_K) {
        const int64_t sb = (p * (w->kb >> 3) + (b >> 3)) * PN;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + sb)));
        const int8_t *sc = (const int8_t *)w->sc + 2 * at;
        *step1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + PN)))));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc))));
    }
    if (w->kind == AGL_Q4_K) {
        const int64_t sb = (p * (w->kb >> 3) + (b >> 3)) * PN;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + sb)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->m + sb)));
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->sc + at))));
        const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->mn + at))));
        *mn = _mm512_xor_ps(_mm512_mul_ps(dmin, m), _mm512_set1_ps(-0.0f));
        return *step1 = _mm512_mul_ps(d, sc);
    }
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + at)));
    if (w->kind == AGL_Q4 || w->kind == AGL_Q5)
        *mn = w->m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->m + at)))
                   : _mm512_mul_ps(dw, _mm512_set1_ps(w->kind == AGL_Q5 ? -16.0f : -8.0f));
    return *step1 = dw;
}

/* Block words j0..j0+n-1 (n = 4: a half block, 8: the whole) of the unpacked weights wv as the
 * int16 pairs vpdpwssd takes (lane c, weight row c): wa[j] = (w[4j], w[4j+2]), wb[j] =
 * (w[4j+1], w[4j+3]), the quants zero-extended (nibble kinds: 0..31) or sign-extended (Q8,
 * Q6_K) */
static inline __attribute__((always_inline)) void
panel_pairs(int nibbles, const __m512i wv[8], __m512i wa[8], __m512i wb[8])
{
    for (int j = 0; j < 8; j++) {
        if (nibbles) {
            wa[j] = _mm512_and_si512(wv[j], _mm512_set1_epi16(0x00FF));
            wb[j] = _mm512_srli_epi16(wv[j], 8);
        } else {
            wa[j] = _mm512_srai_epi16(_mm512_slli_epi16(wv[j], 8), 8);
            wb[j] = _mm512_srai_epi16(wv[j], 8);
        }
    }
}

/* The exact sum w . q over block words j0..j0+n-1 of one activation row's pairs q (32-bit
 * words, quantize_panel_row's order) against the weight pairs: 16 lanes, one a weight row.
 * |sum| < 2^31: 32 products of |w| <= 128 and |q| <= 32767. */
static inline __attribute__((always_inline)) __m512i
panel_dot(const __m512i wa[8], const __m512i wb[8], const int32_t *q, int j0, int n)
{
    __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};       /* four chains: integer sums, any order */
    for (int j = j0; j < j0 + n; j += 2) {
        s[0] = _mm512_dpwssd_epi32(s[0], wa[j], _mm512_set1_epi32(q[2 * j]));
        s[1] = _mm512_dpwssd_epi32(s[1], wb[j], _mm512_set1_epi32(q[2 * j + 1]));
        s[2] = _mm512_dpwssd_epi32(s[2], wa[j + 1], _mm512_set1_epi32(q[2 * j + 2]));
        s[3] = _mm512_dpwssd_epi32(s[3], wb[j + 1], _mm512_set1_epi32(q[2 * j + 3]));
    }
    return _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
}

/* y's columns 16 p .. (at most n) for rows m..m+mr-1: v + bias, or += with accumulate */
static inline void panel_store(const agl_qweight *w, int64_t p, float *y, int64_t ldy,
                               int64_t m, __m512 v, int accumulate)
{
    const int64_t c0 = p * PN, cols = w->n - c0 < PN ? w->n - c0 : PN;
    const __mmask16 k = (__mmask16)((1u << cols) - 1);
    if (w->bias)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, w->bias + c0));
    float *o = y + m * ldy + c0;
    if (accumulate)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, o), v);
    _mm512_mask_storeu_ps(o, k, v);
}

#ifndef PF_BYTES
#define PF_BYTES 4096    /* how far ahead of a VNNI pass its weights are fetched into L2 */
#endif

/* The quants PF_BYTES ahead of panel block pb (the panels are one stream: a thread's panels
 * follow each other) into L2, a cache line at a time */
static inline __attribute__((always_inline)) void panel_prefetch(const agl_qweight *w, int64_t pb)
{
    const int bytes = agl_quant_bytes(w->kind) * PN;                 /* a panel block's */
    const char *q = (const char *)w->qs + pb * bytes + PF_BYTES;
    for (int o = 0; o < bytes; o += 64)
        _mm_prefetch(q + o, _MM_HINT_T1);
}

/* One panel, activation rows m..m+mr-1 (mr <= VNNI_ROWS), by VNNI: each block unpacked once */
static inline __attribute__((always_inline)) void
panel_rows_vnni(const agl_qweight *w, const pact *a, int64_t p, int64_t m, int mr, float *y,
                int64_t ldy, int accumulate)
{
    const int64_t kb = w->kb;
    __m512 acc[VNNI_ROWS], accm[VNNI_ROWS];
    for (int i = 0; i < mr; i++)
        acc[i] = accm[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b++) {
        __m512i wv[8], wa[8], wb[8];
        __m512 mn, dw1;
        panel_prefetch(w, p * kb + b);
        panel_block(w, p, b, wv);
        const int nib = panel_nibbles(w->kind);
        panel_pairs(nib, wv, wa, wb);
        const __m512 dw = panel_steps(w, p, b, &mn, &dw1);
        for (int i = 0; i < mr; i++) {
            const int64_t at = (m + i) * kb + b;
            const int32_t *x = (const int32_t *)(a->q16 + at * 32);
            const __m512 dx = _mm512_set1_ps(a->dx[at]);
            if (w->kind == AGL_Q6_K) {   /* each half with its own step */
                __m512i s0 = panel_dot(wa, wb, x, 0, 4);
                __m512i s1 = panel_dot(wa, wb, x, 4, 4);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw, dx), acc[i]);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, dx), acc[i]);
                continue;
            }
            __m512i s = panel_dot(wa, wb, x, 0, 8);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx), acc[i]);
            if (nib)
                accm[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a->xs[at]), accm[i]);
        }
    }
    for (int i = 0; i < mr; i++)
        panel_store(w, p, y, ldy, m + i, _mm512_add_ps(acc[i], accm[i]), accumulate);
}

_Static_assert(VNNI_ROWS == 6, "panel_vnni spells out 1..VNNI_ROWS rows");

static void panel_vnni(const agl_qweight *w, const pact *a, int64_t p, int64_t M, float *y,
                       int64_t ldy, int accumulate)
{
    for (int64_t m = 0; m < M; m += VNNI_ROWS) {
        const int mr = M - m < VNNI_ROWS ? (int)(M - m) : VNNI_ROWS;
        if (mr == 1)                     /* constants where inlined */
            panel_rows_vnni(w, a, p, m, 1, y, ldy, accumulate);
        else if (mr == 2)
            panel_rows_vnni(w, a, p, m, 2, y, ldy, accumulate);
        else if (mr == 3)
            panel_rows_vnni(w, a, p, m, 3, y, ldy, accumulate);
        else if (mr == 4)
            panel_rows_vnni(w, a, p, m, 4, y, ldy, accumulate);
        else if (mr == 5)
            panel_rows_vnni(w, a, p, m, 5, y, ldy, accumulate);
        else
            panel_rows_vnni(w, a, p, m, 6, y, ldy, accumulate);
    }
}

/* The AMX tiles: 0, 1 and 5, 6 the h and l sums of even and odd blocks (rows x 16 int32),
 * 2, 3 the h and l activations (rows x 32 bytes), 4 a block's weights (8 x 64 bytes); Q6_K
 * (half): 0, 1 and 5, 6 a block's first and second halves, 2, 3 rows x 16 bytes, 4 4 x 64 */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tilecfg;

static inline void panel_tiles(int rows, int half)
{
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; t++) {
        c.rows[t] = (uint8_t)rows;
        c.colsb[t] = 64;
    }
    c.colsb[2] = c.colsb[3] = half ? 16 : 32;
    c.rows[4] = half ? 4 : 8;
    _tile_loadconfig(&c);
}

/* Block b's sums of rows x (stride bytes apart) into tiles ch, cl; from byte `at` of its h
 * and of its l, over the B tile at byte `wat` of the block's weights (a whole block: 0, 0; a
 * Q6_K half: 0, 0 or 16, 256) */
#define PANEL_ISSUE(ch, cl, x, stride, wt, b, at, wat)                               \
    do {                                                                            \
        _tile_zero(ch);                                                             \
        _tile_zero(cl);                                                             \
        _tile_loadd(2, (x) + (b) * PBLK + (at), stride);                            \
        _tile_loadd(3, (x) + (b) * PBLK + 32 + (at), stride);                       \
        _tile_loadd(4, (wt) + (b) * 512 + (wat), 64);                               \
        _tile_dpbssd(ch, 2, 4);          /* h signed . w signed */                  \
        _tile_dpbusd(cl, 3, 4);          /* l unsigned . w signed */                \
    } while (0)

/* acc[i] += block b's sums (sh, sl: the C tiles as stored) times dw dx, rows m0..m0+mr-1 */
static inline __attribute__((always_inline)) void
panel_scale(const agl_qweight *w, const pact *a, int64_t m0, int mr, int64_t b,
            const int32_t *sh, const int32_t *sl, __m512 dw, __m512 acc[PROWS])
{
    for (int i = 0; i < mr; i++) {
        __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_loadu_si512(sh + 16 * i), 8),
                                     _mm512_loadu_si512(sl + 16 * i));
        const float d = a->dx[(m0 + i) * w->kb + b];
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(d)), acc[i]);
    }
}

/* One panel, activation rows m0..m0+mr-1 (mr <= PROWS; the tiles read rows up to m0 + rows,
 * which the caller's buffer holds), by AMX: the next block's tile products run while this
 * one's sums are scaled. wt: the panel's kb blocks as B tiles (kb * 512 bytes); mins: their
 * mins (4-bit kinds: kb x 16 floats); c: scratch for four C tiles. */
static void panel_rows_amx(const agl_qweight *w, const pact *a, int64_t p, int64_t m0, int mr,
                           const int8_t *wt, const float *mins, int32_t *c, float *y,
                           int64_t ldy, int accumulate)
{
    const int64_t kb = w->kb, stride = kb * PBLK;
    const uint8_t *x = a->q + m0 * stride;
    int32_t *sh = c, *sl = c + PROWS * 16, *sh1 = c + 2 * PROWS * 16, *sl1 = c + 3 * PROWS * 16;
    __m512 acc[PROWS], mn, dw1;
    for (int i = 0; i < mr; i++)
        acc[i] = _mm512_setzero_ps();
    const int stream = !panel_nibbles(w->kind) && m0 == 0;   /* tiles read from the weight:
                                                              * fetched ahead, the first pass */
    if (w->kind == AGL_Q6_K) {          /* each half its own products (K = 16) and step */
        for (int64_t b = 0; b < kb; b++) {
            if (stream)
                panel_prefetch(w, p * kb + b);
            PANEL_ISSUE(0, 1, x, stride, wt, b, 0, 0);
            PANEL_ISSUE(5, 6, x, stride, wt, b, 16, 256);
            _tile_stored(0, sh, 64);
            _tile_stored(1, sl, 64);
            _tile_stored(5, sh1, 64);
            _tile_stored(6, sl1, 64);
            const __m512 dw = panel_steps(w, p, b, &mn, &dw1);
            for (int i = 0; i < mr; i++) {   /* the VNNI path's order: half 0, then half 1 */
                panel_scale(w, a, m0 + i, 1, b, sh + 16 * i, sl + 16 * i, dw, acc + i);
                panel_scale(w, a, m0 + i, 1, b, sh1 + 16 * i, sl1 + 16 * i, dw1, acc + i);
            }
        }
    } else {                            /* block b + 1's products run while b's are scaled */
        PANEL_ISSUE(0, 1, x, stride, wt, 0, 0, 0);
        for (int64_t b = 0; b < kb; b += 2) {
            if (stream) {
                panel_prefetch(w, p * kb + b);
                panel_prefetch(w, p * kb + b + 1);
            }
            if (b + 1 < kb)
                PANEL_ISSUE(5, 6, x, stride, wt, b + 1, 0, 0);
            _tile_stored(0, sh, 64);
            _tile_stored(1, sl, 64);
            panel_scale(w, a, m0, mr, b, sh, sl, panel_steps(w, p, b, &mn, &dw1), acc);
            if (b + 1 >= kb)
                break;
            if (b + 2 < kb)
                PANEL_ISSUE(0, 1, x, stride, wt, b + 2, 0, 0);
            _tile_stored(5, sh, 64);
            _tile_stored(6, sl, 64);
            panel_scale(w, a, m0, mr, b + 1, sh, sl, panel_steps(w, p, b + 1, &mn, &dw1), acc);
        }
    }
    for (int i = 0; i < mr; i++) {
        __m512 accm = _mm512_setzero_ps();
        if (panel_nibbles(w->kind))
            for (int64_t b = 0; b < kb; b++)
                accm = _mm512_fmadd_ps(_mm512_load_ps(mins + 16 * b),
                                       _mm512_set1_ps(a->xs[(m0 + i) * kb + b]), accm);
        panel_store(w, p, y, ldy, m0 + i, _mm512_add_ps(acc[i], accm), accumulate);
    }
}

/* The panel's kb blocks unpacked to B tiles at wt (4-bit kinds; the 8-bit kinds' stored
 * blocks are B tiles) and their mins at mins (kb x 16 floats) */
static const int8_t *panel_unpack(const agl_qweight *w, int64_t p, int8_t *wt, float *mins)
{
    if (!panel_nibbles(w->kind))
        return (const int8_t *)w->qs + p * w->kb * 512;
    for (int64_t b = 0; b < w->kb; b++) {
        __m512i wv[8];
        __m512 mn, dw1;
        panel_prefetch(w, p * w->kb + b);
        panel_block(w, p, b, wv);
        for (int kk = 0; kk < 8; kk++)
            _mm512_storeu_si512(wt + b * 512 + 64 * kk, wv[kk]);
        panel_steps(w, p, b, &mn, &dw1);
        _mm512_store_ps(mins + 16 * b, mn);
    }
    return wt;
}

/* The rows of a call's tiles: M split into the fewest tiles of at most PROWS rows, evenly
 * (17 rows: two tiles of 9, not 16 and 1) */
static inline int64_t panel_tile_rows(int64_t M)
{
    const int64_t tiles = (M + PROWS - 1) / PROWS;
    return (M + tiles - 1) / tiles;
}

/* Whether a call of M rows multiplies w on the tiles (else by VNNI) */
static inline int panel_uses_amx(const agl_qweight *w, int64_t M)
{
    return M >= (panel_nibbles(w->kind) ? AMX_ROWS_NIBBLES : AMX_ROWS) && panel_amx_ok;
}

/* y (row stride ldy) = the M activation rows of a times w (a Q4 or Q8 panel weight); a's
 * buffer holds rows up to M rounded up to a multiple of panel_tile_rows(M).
 * 0, or -1 without memory for a thread's unpacked panel. */
static int panel_matmul(const agl_qweight *w, const pact *a, int64_t M, float *y, int64_t ldy,
                        int accumulate, int nthreads)
{
    const int64_t P = (w->n + PN - 1) / PN;
    const int amx = panel_uses_amx(w, M);
    const int rows = (int)panel_tile_rows(M);
    int fail = 0;
    #pragma omp parallel num_threads(nthreads) reduction(|:fail)
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t p0 = P * tid / nth, p1 = P * (tid + 1) / nth;
        int8_t *wt = NULL;
        int32_t *c = NULL;
        float *mins = NULL;
        if (amx) {
            wt = aligned_alloc(64, (size_t)(w->kb * 512));
            c = aligned_alloc(64, 4 * PROWS * 64);
            mins = aligned_alloc(64, (size_t)(w->kb * 64));
            if (!wt || !c || !mins)
                fail = 1;
            else
                panel_tiles(rows, w->kind == AGL_Q6_K);
        }
        for (int64_t p = p0; p < p1 && !fail; p++) {
            if (!amx) {
                panel_vnni(w, a, p, M, y, ldy, accumulate);
                continue;
            }
            const int8_t *t = panel_unpack(w, p, wt, mins);
            for (int64_t m = 0; m < M; m += rows) {
                const int mr = M - m < rows ? (int)(M - m) : rows;
                panel_rows_amx(w, a, p, m, mr, t, mins, c, y, ldy, accumulate);
            }
        }
        if (amx)
            _tile_release();
        free(wt);
        free(c);
        free(mins);
    }
    return fail ? -1 : 0;
}

/* Rows r0..r1-1 of a panel weight as bfloat16 bits at out (rows of k), for the bf16-GEMM path:
 * each panel block unpacked once for its rows (panel_block, panel_steps), each weight
 * fma(q, step, min) in float32 (exact but for that one rounding: the value the other builds'
 * dequant.c give), then rounded to the nearest bfloat16, ties to even. */
static void panel_dequant_bf16(const agl_qweight *w, int64_t r0, int64_t r1, uint16_t *out,
                               int nthreads)
{
    const int64_t nb = w->k / 32, p0 = r0 / PN, p1 = (r1 + PN - 1) / PN;
    const int sig = !panel_nibbles(w->kind);            /* signed quants: Q8, Q6_K */
    const __m256i word = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);   /* 64 bytes apart */
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t p = p0; p < p1; p++) {
        const int64_t c0 = r0 > p * PN ? r0 - p * PN : 0;
        const int64_t c1 = r1 < (p + 1) * PN ? r1 - p * PN : PN;
        for (int64_t b = 0; b < nb; b++) {
            __m512i wv[8];
            __m512 mn, dw1;
            panel_block(w, p, b, wv);
            const __m512 dw = panel_steps(w, p, b, &mn, &dw1);
            int32_t words[8][PN];                       /* row c's word kk at [kk][c] */
            float s0[PN], s1[PN], m[PN];
            for (int kk = 0; kk < 8; kk++)
                _mm512_storeu_si512(words[kk], wv[kk]);
            _mm512_storeu_ps(s0, dw);
            _mm512_storeu_ps(s1, dw1);
            _mm512_storeu_ps(m, mn);
            for (int64_t c = c0; c < c1; c++) {        /* weights 0..15, then 16..31 */
                const __m256i q8 = _mm256_i32gather_epi32(&words[0][c], word, 4);
                const __m128i lo = _mm256_castsi256_si128(q8), hi = _mm256_extracti128_si256(q8, 1);
                const __m512i q0 = sig ? _mm512_cvtepi8_epi32(lo) : _mm512_cvtepu8_epi32(lo);
                const __m512i q1 = sig ? _mm512_cvtepi8_epi32(hi) : _mm512_cvtepu8_epi32(hi);
                uint16_t *o = out + (p * PN + c - r0) * w->k + b * 32;
                _mm256_storeu_si256((__m256i *)o, to_bf16(_mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(q0), _mm512_set1_ps(s0[c]), _mm512_set1_ps(m[c]))));
                _mm256_storeu_si256((__m256i *)(o + 16), to_bf16(_mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(q1), _mm512_set1_ps(s1[c]), _mm512_set1_ps(m[c]))));
            }
        }
    }
}

#endif
