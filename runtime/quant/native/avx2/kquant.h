/* K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 weights, 8 blocks of 32) as qmatmul.c reads them.
 *
 * runtime/quant/kquant.py repacks the file's super-blocks at load without changing a value
 * (in the file's size; Q4_K / Q5_K 4 bytes more a super-block for their unpacked 6-bit scales):
 *   qs: the low 4 bits of every weight in Q4_1's order (block b's byte i: weights i, i + 16);
 *   hb: the higher bits as bit masks, a group of 4 blocks at a time over the group's A half
 *       (weights 0..15 of its blocks, block j at bits 16 j..16 j + 15) and B half (16..31),
 *       8 bytes each — Q5_K: bit 4 of A, of B; Q6_K: bit 4 of A, of B, bit 5 of A, of B;
 *   d:  float16 a super-block; m: Q4_K / Q5_K's dmin, float16 a super-block;
 *   sc: Q4_K / Q5_K: each block's 6-bit scale (uint8 a block); Q6_K: the int8 scales of the
 *       16-weight halves, a group at a time: the A halves of its 4 blocks, then the B halves;
 *   mn: Q4_K / Q5_K: each block's 6-bit min (uint8 a block).
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

/* 16 bits of the mask at p (bit 16 j + i: lane i) → int16 lanes of value where set, else 0 */
static inline __m256i kq_bits16(const uint8_t *p, int j, int16_t value)
{
    uint64_t m;
    memcpy(&m, p, sizeof m);
    const __m256i sel = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)0x8000);
    const __m256i bits = _mm256_and_si256(_mm256_set1_epi16((short)(m >> (16 * j))), sel);
    return _mm256_and_si256(_mm256_cmpeq_epi16(bits, sel), _mm256_set1_epi16(value));
}

/* Block b of K-quant weight row r as int16 q (Q6_K: q - 32): weights 0..15 at lo, 16..31 at
 * hi; the steps of the halves at dlo, dhi (equal but for Q6_K); Q4_K / Q5_K's min at mn. */
static inline __attribute__((always_inline)) void
kq_weights16(const agl_qweight *w, int kind, int64_t r, int64_t b, __m256i *lo, __m256i *hi,
             float *dlo, float *dhi, float *mn)
{
    const int64_t kb = w->kb, g = b >> 2;
    const int at = (int)(b & 3);
    const __m256i v = _mm256_cvtepu8_epi16(
        _mm_loadu_si128((const __m128i *)((const uint8_t *)w->qs + (r * kb + b) * 16)));
    *lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
    *hi = _mm256_srli_epi16(v, 4);
    const float d = _cvtsh_ss(w->d[r * (kb >> 3) + (b >> 3)]);
    if (kind == AGL_Q6_K) {
        const uint8_t *hb = w->hb + (r * (kb >> 2) + g) * 32;
        const int8_t *sc = (const int8_t *)w->sc + r * kb * 2 + g * 8;
        const __m256i off = _mm256_set1_epi16(32);
        *lo = _mm256_sub_epi16(_mm256_or_si256(_mm256_or_si256(*lo, kq_bits16(hb, at, 16)),
                                               kq_bits16(hb + 16, at, 32)), off);
        *hi = _mm256_sub_epi16(_mm256_or_si256(_mm256_or_si256(*hi, kq_bits16(hb + 8, at, 16)),
                                               kq_bits16(hb + 24, at, 32)), off);
        *dlo = d * (float)sc[at];
        *dhi = d * (float)sc[4 + at];
        *mn = 0.0f;
        return;
    }
    if (kind == AGL_Q5_K) {
        const uint8_t *hb = w->hb + (r * (kb >> 2) + g) * 16;
        *lo = _mm256_or_si256(*lo, kq_bits16(hb, at, 16));
        *hi = _mm256_or_si256(*hi, kq_bits16(hb + 8, at, 16));
    }
    *dlo = *dhi = d * (float)w->sc[r * kb + b];
    *mn = -(_cvtsh_ss(w->m[r * (kb >> 3) + (b >> 3)]) * (float)w->mn[r * kb + b]);
}

#endif
