/* avx512/dequant.c for the avx2/ build: rows of a quantized weight as bfloat16, each weight
 * computed exactly in float32 (Q4: q * d + mn, mn = m or -8 d; Q8: q * d) and rounded to the
 * nearest bfloat16, ties to even; K-quants and Q5_0 / Q5_1: kdequant.h. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "kdequant.h"
#include "qmatmul.h"
#include "vecmath.h"

#define QK 32

/* 8 quants (int32 lanes) as q * d + mn, stored as bfloat16 at out */
static inline void store8(__m256i q, float d, float mn, uint16_t *out)
{
    __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(d), _mm256_set1_ps(mn));
    _mm_storeu_si128((__m128i *)out, to_bf16_8(w));
}

/* 16 bytes of quants (int8 or uint8, by sign) as bfloat16 at out */
static inline void store16(__m128i v, int sign, float d, float mn, uint16_t *out)
{
    __m128i up = _mm_unpackhi_epi64(v, v);
    store8(sign ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v), d, mn, out);
    store8(sign ? _mm256_cvtepi8_epi32(up) : _mm256_cvtepu8_epi32(up), d, mn, out + 8);
}

/* Row r of w (its nb = k / 32 real blocks) into out[k]. */
static void dequant_row(const agl_qweight *w, int64_t r, uint16_t *out)
{
    if (kd_is_block(w->kind)) {                 /* K-quants, Q5_0 / Q5_1: kdequant.h */
        kd_row_bf16(w, r, out);
        return;
    }
    const int64_t kb = w->kb, nb = w->k / QK;
    const uint16_t *d = w->d + r * kb, *m = w->m ? w->m + r * kb : NULL;
    for (int64_t b = 0; b < nb; b++) {
        const float db = _cvtsh_ss(d[b]);
        if (w->kind == 4) {
            const __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)w->qs + (r * kb + b) * 16));
            const float mn = m ? _cvtsh_ss(m[b]) : -8.0f * db;
            store16(_mm_and_si128(v, _mm_set1_epi8(0x0F)), 0, db, mn, out + b * QK);
            store16(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)), 0, db, mn, out + b * QK + 16);
        } else {                                         /* kernel order: A and B halves */
            const int64_t g = b / 4, blocks = g < kb / 4 ? 4 : 2, at = b % 4;
            const int8_t *p = (const int8_t *)w->qs + r * kb * QK + g * 128;
            store16(_mm_loadu_si128((const __m128i *)(p + 16 * at)), 1, db, 0.0f, out + b * QK);
            store16(_mm_loadu_si128((const __m128i *)(p + 16 * (blocks + at))), 1, db, 0.0f,
                    out + b * QK + 16);
        }
    }
}

/* Rows r0..r1-1 of w into out: bfloat16 bits [r1 - r0, w->k], row-major. */
void agl_dequant_bf16(const agl_qweight *w, int64_t r0, int64_t r1, uint16_t *out, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = r0; r < r1; r++)
        dequant_row(w, r, out + (r - r0) * w->k);
}
