/* The K-quant super-blocks (Q4_K, Q5_K, Q6_K) and Q5_0 / Q5_1 blocks as avx512/qmatmul.c's
 * tile reads them: a group of 4 blocks (128 weights) of one weight row at a time, as the two
 * 64-byte planes A (weights 0..15 of blocks 0..3, block b at bytes 16b..16b+15) and B (weights
 * 16..31), with each block's step spread over its 4 int32 lanes (4b..4b+3), and the blocks'
 * mins 16 at a time. The stored layouts are the AVX2 build's (avx2/kquant.h; written by
 * runtime/quant/kquant.py), read here without repacking:
 *   Q4_K / Q5_K: qs in Q4_1's nibble order (the low nibbles of a group's 64 bytes are A, the
 *       high ones B); Q5_K's bit 4 as the group's A and B 64-bit masks (hb, 16 bytes a group);
 *       w = (d sc) q - dmin mn, q in 0..15 / 0..31: an unsigned Q4-style block;
 *   Q6_K: int8 q - 32 in the row's order (a group's 128 bytes are blocks 0..3 whole: A and B
 *       are 128-bit lanes 0, 2 and 1, 3 of them); its steps, one a half block: the group's 8
 *       int8 scales (A halves, then B halves) times d;
 *   Q5_0 / Q5_1: Q4's nibbles plus each block's 4 bytes of bit 4 (bit j: weight j); d and m
 *       a block (Q5_0: min -16 d); rows of an even number of blocks (a last group of 2).
 * Every step and min is computed in float32 by the operations of avx2/blocks.h (d sc exact;
 * min -(dmin mn)), so the builds multiply by the same scales.
 */
#ifndef AGL_KGROUPS_H
#define AGL_KGROUPS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qmatmul.h"

/* 4 int32 lanes (low 128 bits of v) spread as [v0 x4, v1 x4, v2 x4, v3 x4], in float32 */
static inline __m512 spread4(__m512i v)
{
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(idx, v));
}

static inline float kq_half(uint16_t h) { return _cvtsh_ss(h); }

/* Group g of row r of a nibble kind (Q4_K, Q5_K, Q5_0 / Q5_1): A and B as bytes q (0..31),
 * blocks past nblocks (a last group of 2) zero. */
static inline __attribute__((always_inline)) void
nibble_group(const agl_qweight *w, int kind, int64_t r, int64_t g, int nblocks, __m512i *wa,
             __m512i *wb)
{
    const int64_t kb = w->kb;
    const __mmask64 keep = nblocks == 4 ? ~(__mmask64)0 : ((__mmask64)1 << (16 * nblocks)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(keep, (const uint8_t *)w->qs + (r * kb + 4 * g) * 16);
    const __m512i lo4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    *wa = _mm512_and_si512(v, lo4);
    *wb = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
    uint64_t ma, mb;
    if (kind == AGL_Q5_K) {
        const uint8_t *hb = w->hb + (r * (kb >> 2) + g) * 16;
        memcpy(&ma, hb, 8);
        memcpy(&mb, hb + 8, 8);
    } else if (kind == AGL_Q5) {      /* bytes 0, 1 of each block's qh are A's, 2, 3 B's */
        const __m128i qh = _mm_maskz_loadu_epi32((__mmask8)((1u << nblocks) - 1),
                                                 w->hb + (r * kb + 4 * g) * 4);
        const __m128i ab = _mm_shuffle_epi8(qh, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13,
                                                              2, 3, 6, 7, 10, 11, 14, 15));
        ma = (uint64_t)_mm_cvtsi128_si64(ab);
        mb = (uint64_t)_mm_extract_epi64(ab, 1);
    } else {
        return;
    }
    *wa = _mm512_mask_add_epi8(*wa, ma, *wa, sixteen);
    *wb = _mm512_mask_add_epi8(*wb, mb, *wb, sixteen);
}

/* Group g of row r of Q6_K: A and B as int8 q - 32 */
static inline __attribute__((always_inline)) void
q6_group(const agl_qweight *w, int64_t r, int64_t g, __m512i *wa, __m512i *wb)
{
    const int8_t *p = (const int8_t *)w->qs + (r * w->kb + 4 * g) * 32;
    const __m512i z0 = _mm512_loadu_si512(p), z1 = _mm512_loadu_si512(p + 64);
    *wa = _mm512_shuffle_i64x2(z0, z1, 0x88);     /* 128-bit lanes z0.0 z0.2 z1.0 z1.2 */
    *wb = _mm512_shuffle_i64x2(z0, z1, 0xDD);     /* z0.1 z0.3 z1.1 z1.3 */
}

/* The steps of group g of row r, block b's at lanes 4b..4b+3 (Q6_K: sa for the A halves, sb
 * for the B ones; other kinds sb = sa); Q5 blocks past nblocks: 0. */
static inline __attribute__((always_inline)) void
group_steps(const agl_qweight *w, int kind, int64_t r, int64_t g, int nblocks, __m512 *sa,
            __m512 *sb)
{
    const int64_t kb = w->kb;
    if (kind == AGL_Q5) {
        const __m128i h = _mm_maskz_loadu_epi16((__mmask8)((1u << nblocks) - 1), w->d + r * kb + 4 * g);
        const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        *sa = *sb = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
        return;
    }
    const __m512 d = _mm512_set1_ps(kq_half(w->d[r * (kb >> 3) + (g >> 1)]));
    if (kind == AGL_Q6_K) {
        uint64_t eight;                                   /* A halves' 4 scales, then B's */
        memcpy(&eight, w->sc + r * kb * 2 + g * 8, 8);
        const __m512i s = _mm512_cvtepi8_epi32(_mm_cvtsi64_si128((int64_t)eight));
        *sa = _mm512_mul_ps(d, spread4(s));
        *sb = _mm512_mul_ps(d, spread4(_mm512_shuffle_i32x4(s, s, 0x01)));
        return;
    }
    uint32_t four;
    memcpy(&four, w->sc + r * kb + 4 * g, 4);
    *sa = *sb = _mm512_mul_ps(d, spread4(_mm512_cvtepu8_epi32(_mm_cvtsi32_si128((int)four))));
}

/* The mins of blocks c..c+15 of row r (lanes past kb - c: 0), for the kinds with one */
static inline __attribute__((always_inline)) __m512
block_mins(const agl_qweight *w, int kind, int64_t r, int64_t c)
{
    const int64_t kb = w->kb;
    const __mmask16 k = kb - c >= 16 ? 0xFFFF : (__mmask16)((1u << (kb - c)) - 1);
    if (!agl_is_kquant(kind)) {
        const __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w->d + r * kb + c));
        return w->m ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w->m + r * kb + c))
                    : _mm512_mul_ps(_mm512_set1_ps(kind == AGL_Q4 ? -8.0f : -16.0f), d);
    }
    const int64_t sb = kb >> 3;               /* lanes 0..7: super-block c / 8, 8..15 the next */
    const __m128i dm = _mm_maskz_loadu_epi16(kb - c >= 16 ? 3 : 1, w->m + r * sb + (c >> 3));
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 dmin = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(dm)));
    const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, w->mn + r * kb + c)));
    return _mm512_xor_ps(_mm512_mul_ps(dmin, mn), _mm512_set1_ps(-0.0f));
}

#endif
