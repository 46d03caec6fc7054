/* A quantized weight (qmatmul.h's agl_qweight, layouts at the top of qmatmul.c) decoded to
 * bfloat16 rows, for the calls that run as one dense GEMM (runtime/block_linear.py: prefill-
 * sized calls of a model whose compute dtype is bfloat16).
 *
 * Each weight is first computed exactly in float32 (Q4: q * d + mn, mn = m or -8 d; Q8: q * d;
 * d, m the block's float16 values), then rounded to the nearest bfloat16, ties to even (the
 * rounding torch's .to(torch.bfloat16) does; there are no NaNs: the values are finite).
 * K-quants and Q5_0 / Q5_1: kdequant.h.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "kdequant.h"
#include "qmatmul.h"
#include "vecmath.h"

#define QK 32

/* 16 quants (int32 lanes) of one block as q * d + mn, stored as bfloat16 at out */
static inline void store_block_half(__m512i q, float d, float mn, uint16_t *out)
{
    __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(d), _mm512_set1_ps(mn));
    _mm256_storeu_si256((__m256i *)out, to_bf16(w));
}

static inline float half_to_float(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
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
        const float db = half_to_float(d[b]);
        __m512i lo, hi;                                  /* weights 0..15 and 16..31 */
        float mn = 0.0f;
        if (w->kind == 4) {
            __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)w->qs + (r * kb + b) * 16));
            lo = _mm512_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(0x0F)));
            hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)));
            mn = m ? half_to_float(m[b]) : -8.0f * db;
        } else {                                         /* kernel order: A and B halves */
            const int64_t g = b / 4, full = kb / 4;
            const int blocks = g < full ? 4 : 2, at = (int)(b % 4);
            const int8_t *p = (const int8_t *)w->qs + r * kb * QK + g * 128;
            lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * at)));
            hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * (blocks + at))));
        }
        store_block_half(lo, db, mn, out + b * QK);
        store_block_half(hi, db, mn, out + b * QK + 16);
    }
}

/* Rows r0..r1-1 of w into out: bfloat16 bits [r1 - r0, w->k], row-major. */
void agl_dequant_bf16(const agl_qweight *w, int64_t r0, int64_t r1, uint16_t *out, int nthreads)
{
#ifdef AGL_AMX
    if (agl_panel_kind(w->kind)) {      /* the AMX build keeps these in panels (panel.h) */
        agl_panel_dequant_bf16(w, r0, r1, out, nthreads);
        return;
    }
#endif
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = r0; r < r1; r++)
        dequant_row(w, r, out + (r - r0) * w->k);
}
