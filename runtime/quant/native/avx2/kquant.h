/* K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 weights, 8 blocks of 32) as qmatmul.c reads them.
 *
 * runtime/quant/kquant.py repacks the file's super-blocks at load without changing a value
 * (in the file's size; Q4_K / Q5_K 4 bytes more a super-block for their unpacked 6-bit scales):
 *   qs: the low 4 bits of every weight in Q4_1's order (block b's byte i: weights i, i + 16);
 *       Q6_K: q - 32 as int8, one byte a weight in the row's order (8 bits for the file's
 *       6.56: a 22% larger tensor, read without unpacking);
 *   hb: Q5_K's bit 4 as bit masks, a group of 4 blocks at a time over the group's A half
 *       (weights 0..15 of its blocks, block j at bits 16 j..16 j + 15) and B half (16..31),
 *       8 bytes each;
 *   d:  float16 a super-block; m: Q4_K / Q5_K's dmin, float16 a super-block;
 *   sc: Q4_K / Q5_K: each block's 6-bit scale (uint8 a block); Q6_K: the int8 scales of the
 *       16-weight halves, a group at a time: the A halves of its 4 blocks, then the B halves;
 *   mn: Q4_K / Q5_K: each block's 6-bit min (uint8 a block).
 * Q5_0 / Q5_1 (AGL_Q5, 32-weight blocks) are read the same way: qs in Q4_1's order, hb the
 * file's 4 bytes of bit 4 a block (bit j: weight j), d and m (Q5_1; Q5_0: m = -16 d) a block
 * as for Q4: w = d q + m, q in 0..31.
 * Weights: Q4_K / Q5_K w = (d sc) q - dmin mn, q in 0..15 / 0..31: a Q4 block whose step d sc
 * and min -dmin mn are exact in float32. Q6_K w = (d sc) (q - 32): the block's two halves have
 * their own steps, so their two vpmaddwd products are scaled apart. Rows are whole
 * super-blocks (kb = k / 32, a multiple of 8: no padding block).
 */
#ifndef AGL_KQUANT_H
#define AGL_KQUANT_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qmatmul.h"

/* 16 bits (bit i: lane i) → int16 lanes of value where set, else 0 */
static inline __m256i kq_mask16(uint16_t m, int16_t value)
{
    const __m256i sel = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
    const __m256i bits = _mm256_and_si256(_mm256_set1_epi16((short)m), sel);
    return _mm256_and_si256(_mm256_cmpeq_epi16(bits, sel), _mm256_set1_epi16(value));
}

/* bits 16 j .. 16 j + 15 of the 8-byte mask at p as kq_mask16 lanes */
static inline __m256i kq_bits16(const uint8_t *p, int j, int16_t value)
{
    uint64_t m;
    memcpy(&m, p, sizeof m);
    return kq_mask16((uint16_t)(m >> (16 * j)), value);
}

/* Block b of Q5_0 / Q5_1 weight row r as int16 q (0..31): weights 0..15 at lo, 16..31 at hi */
static inline __attribute__((always_inline)) void
q5_weights16(const agl_qweight *w, int64_t r, int64_t b, __m256i *lo, __m256i *hi)
{
    const int64_t kb = w->kb;
    const __m256i v = _mm256_cvtepu8_epi16(
        _mm_loadu_si128((const __m128i *)((const uint8_t *)w->qs + (r * kb + b) * 16)));
    uint32_t qh;
    memcpy(&qh, w->hb + (r * kb + b) * 4, sizeof qh);
    *lo = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0x0F)), kq_mask16((uint16_t)qh, 16));
    *hi = _mm256_or_si256(_mm256_srli_epi16(v, 4), kq_mask16((uint16_t)(qh >> 16), 16));
}

/* Block b of K-quant weight row r as int16 q (Q6_K: q - 32): weights 0..15 at lo, 16..31 at
 * hi; the steps of the halves at dlo, dhi (equal but for Q6_K); Q4_K / Q5_K's min at mn. */
static inline __attribute__((always_inline)) void
kq_weights16(const agl_qweight *w, int kind, int64_t r, int64_t b, __m256i *lo, __m256i *hi,
             float *dlo, float *dhi, float *mn)
{
    const int64_t kb = w->kb, g = b >> 2;
    const int at = (int)(b & 3);
    const float d = _cvtsh_ss(w->d[r * (kb >> 3) + (b >> 3)]);
    if (kind == AGL_Q6_K) {
        const int8_t *q = (const int8_t *)w->qs + (r * kb + b) * 32;
        const int8_t *sc = (const int8_t *)w->sc + r * kb * 2 + g * 8;
        *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q));
        *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
        *dlo = d * (float)sc[at];
        *dhi = d * (float)sc[4 + at];
        *mn = 0.0f;
        return;
    }
    const __m256i v = _mm256_cvtepu8_epi16(
        _mm_loadu_si128((const __m128i *)((const uint8_t *)w->qs + (r * kb + b) * 16)));
    *lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
    *hi = _mm256_srli_epi16(v, 4);
    if (kind == AGL_Q5_K) {
        const uint8_t *hb = w->hb + (r * (kb >> 2) + g) * 16;
        *lo = _mm256_or_si256(*lo, kq_bits16(hb, at, 16));
        *hi = _mm256_or_si256(*hi, kq_bits16(hb + 8, at, 16));
    }
    *dlo = *dhi = d * (float)w->sc[r * kb + b];
    *mn = -(_cvtsh_ss(w->m[r * (kb >> 3) + (b >> 3)]) * (float)w->mn[r * kb + b]);
}

#endif
