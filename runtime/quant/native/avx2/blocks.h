/* One weight block as qmatmul.c multiplies it, for every kind: its 32 quants widened to int16
 * and its scales in float32 (the layouts: qmatmul.c's opening comment, kquant.h).
 *
 * A block b of weight row r is w[k] = step * q[k] + min, except Q6_K, whose halves (weights
 * 0..15 and 16..31) have steps of their own (step, step2) and no min. unpack_block gives one
 * row's, scales8 the same values for 8 consecutive rows at once (one gather a block instead of
 * 8 scalar reads): each value is computed by the same float32 operations either way, so the
 * two paths of qmatmul.c (rows.h, panel.h) multiply by identical scales.
 */
#ifndef AGL_BLOCKS_H
#define AGL_BLOCKS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qmatmul.h"
#include "kquant.h"

#define QK 32

/* CALL(kind) with the weight kind k a compile-time constant (each case its own inlined copy),
 * and CALL(kind, rows) with mr (1..4) one too */
#define WITH_KIND(k, CALL)                                                    \
    switch (k) {                                                              \
    case AGL_Q4: CALL(AGL_Q4); break;                                         \
    case AGL_Q5: CALL(AGL_Q5); break;                                         \
    case AGL_Q4_K: CALL(AGL_Q4_K); break;                                     \
    case AGL_Q5_K: CALL(AGL_Q5_K); break;                                     \
    case AGL_Q6_K: CALL(AGL_Q6_K); break;                                     \
    default: CALL(AGL_Q8);                                                    \
    }
#define WITH_ROWS(mr, CALL, kind)                                             \
    do {                                                                      \
        if (mr == 4) CALL(kind, 4);                                           \
        else if (mr == 3) CALL(kind, 3);                                      \
        else if (mr == 2) CALL(kind, 2);                                      \
        else CALL(kind, 1);                                                   \
    } while (0)

/* Q4 / Q8 block b of weight row r as int16: weights 0..15 at lo, 16..31 at hi */
static inline __attribute__((always_inline)) void
weights16(const agl_qweight *w, int kind, int64_t r, int64_t b, __m256i *lo, __m256i *hi)
{
    const int64_t kb = w->kb;
    if (kind == AGL_Q4) {
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

/* Block b of row r, any kind: quants at lo / hi; with scales, its step, step2 and min too */
static inline __attribute__((always_inline)) void
unpack_block(const agl_qweight *w, int kind, int64_t r, int64_t b, __m256i *lo, __m256i *hi,
             float *step, float *step2, float *min)
{
    if (agl_is_kquant(kind)) {
        kq_weights16(w, kind, r, b, lo, hi, step, step2, min);
        return;
    }
    if (kind == AGL_Q5)
        q5_weights16(w, r, b, lo, hi);
    else
        weights16(w, kind, r, b, lo, hi);
    const float d = _cvtsh_ss(w->d[r * w->kb + b]);
    *step = *step2 = d;
    *min = !agl_has_min(kind) ? 0.0f
           : w->m ? _cvtsh_ss(w->m[r * w->kb + b]) : (kind == AGL_Q4 ? -8.0f : -16.0f) * d;
}

/* 8 lanes from p[0], p[stride], ..., the first nc (the rest 0): 16-bit and 8-bit gathers */
static inline __m128i gather16(const uint16_t *p, int64_t stride, int nc)
{
    __m128i v = _mm_setzero_si128();
#define LANE(j) if (j < nc) v = _mm_insert_epi16(v, p[(j) * stride], j);
    LANE(0) LANE(1) LANE(2) LANE(3) LANE(4) LANE(5) LANE(6) LANE(7)
#undef LANE
    return v;
}

static inline __m128i gather8(const uint8_t *p, int64_t stride, int nc)
{
    __m128i v = _mm_setzero_si128();
#define LANE(j) if (j < nc) v = _mm_insert_epi8(v, p[(j) * stride], j);
    LANE(0) LANE(1) LANE(2) LANE(3) LANE(4) LANE(5) LANE(6) LANE(7)
#undef LANE
    return v;
}

static inline __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
static inline __m256 i8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* Block b's scales of rows n..n+nc-1 (nc <= 8; lanes past nc: 0), as unpack_block computes each */
static inline __attribute__((always_inline)) void
scales8(const agl_qweight *w, int kind, int64_t n, int nc, int64_t b, __m256 *step,
        __m256 *step2, __m256 *min)
{
    const int64_t kb = w->kb;
    if (!agl_is_kquant(kind)) {
        const __m256 d = _mm256_cvtph_ps(gather16(w->d + n * kb + b, kb, nc));
        *step = *step2 = d;
        if (agl_has_min(kind))
            *min = w->m ? _mm256_cvtph_ps(gather16(w->m + n * kb + b, kb, nc))
                        : _mm256_mul_ps(_mm256_set1_ps(kind == AGL_Q4 ? -8.0f : -16.0f), d);
        else
            *min = _mm256_setzero_ps();
        return;
    }
    const int64_t sb = kb >> 3;                    /* super-blocks a row */
    const __m256 d = _mm256_cvtph_ps(gather16(w->d + n * sb + (b >> 3), sb, nc));
    if (kind == AGL_Q6_K) {
        const uint8_t *sc = w->sc + n * kb * 2 + (b >> 2) * 8 + (b & 3);
        *step = _mm256_mul_ps(d, i8_ps(gather8(sc, kb * 2, nc)));
        *step2 = _mm256_mul_ps(d, i8_ps(gather8(sc + 4, kb * 2, nc)));
        *min = _mm256_setzero_ps();
        return;
    }
    *step = *step2 = _mm256_mul_ps(d, u8_ps(gather8(w->sc + n * kb + b, kb, nc)));
    const __m256 dmin = _mm256_cvtph_ps(gather16(w->m + n * sb + (b >> 3), sb, nc));
    *min = _mm256_xor_ps(_mm256_mul_ps(dmin, u8_ps(gather8(w->mn + n * kb + b, kb, nc))),
                         _mm256_set1_ps(-0.0f));
}

#endif
