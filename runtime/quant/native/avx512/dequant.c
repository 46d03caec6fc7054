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

#ifdef AGL_AMX
/* The AMX build's panel kinds (panel.h's layout): row r's words of block b gathered into
 * the file's block order (Q4, Q4_K: 16 bytes, Q8, Q6_K: 32), the steps of its halves (d0, d1:
 * the same but for Q6_K) and its min. */
static void panel_block_bytes(const agl_qweight *w, int64_t r, int64_t b, uint8_t *bytes,
                              float *d0, float *d1, float *mn)
{
    const int64_t p = r / 16, c = r % 16, at = (p * w->kb + b) * 16 + c;
    const int words = agl_quant_bytes(w->kind) / 4;
    const int *s = (const int *)((const uint8_t *)w->qs + (p * w->kb + b) * 64 * words + 4 * c);
    const __m256i word = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);  /* 64 bytes apart */
    if (words == 4)
        _mm_storeu_si128((__m128i *)bytes, _mm_i32gather_epi32(s, _mm256_castsi256_si128(word), 4));
    else
        _mm256_storeu_si256((__m256i *)bytes, _mm256_i32gather_epi32(s, word, 4));
    const int64_t sb = (p * (w->kb >> 3) + (b >> 3)) * 16 + c;   /* K-quants: a super-block */
    *mn = 0.0f;
    if (w->kind == AGL_Q4_K) {                   /* d sc, -dmin mn: exact in float32 */
        *d0 = *d1 = half_to_float(w->d[sb]) * (float)w->sc[at];
        *mn = -(half_to_float(w->m[sb]) * (float)w->mn[at]);
    } else if (w->kind == AGL_Q6_K) {            /* d sc of each half */
        const int8_t *sc = (const int8_t *)w->sc + 2 * (at - c) + c;
        *d0 = half_to_float(w->d[sb]) * (float)sc[0];
        *d1 = half_to_float(w->d[sb]) * (float)sc[16];
    } else {
        *d0 = *d1 = half_to_float(w->d[at]);
        if (w->kind == AGL_Q4 || w->kind == AGL_Q5)
            *mn = w->m ? half_to_float(w->m[at]) : (w->kind == AGL_Q5 ? -16.0f : -8.0f) * *d0;
    }
}

/* Q5's bit 4 of row r's block b (panel.h's masks) as 32 bits: bit j for weight j */
static uint32_t panel_q5_bits(const agl_qweight *w, int64_t r, int64_t b)
{
    const int64_t p = r / 16, c = r % 16;
    const uint64_t *hb = (const uint64_t *)(w->hb + (p * w->kb + b) * 64);
    uint32_t bits = 0;
    for (int kk = 0; kk < 8; kk++)
        bits |= (uint32_t)((hb[kk] >> (4 * c)) & 0xF) << (4 * kk);
    return bits;
}

/* Row r of a weight in panels into out[k] */
static void dequant_panel_row(const agl_qweight *w, int64_t r, uint16_t *out)
{
    for (int64_t b = 0; b < w->k / QK; b++) {
        uint8_t bytes[32];
        float d0, d1, mn;
        panel_block_bytes(w, r, b, bytes, &d0, &d1, &mn);
        __m128i v = _mm_loadu_si128((const __m128i *)bytes);
        if (agl_quant_bytes(w->kind) == 16) {        /* nibbles: weights i and i + 16 */
            __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(0x0F)));
            __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F)));
            if (w->kind == AGL_Q5) {                 /* + 16 where bit 4 is set */
                const uint32_t bits = panel_q5_bits(w, r, b);
                lo = _mm512_mask_add_epi32(lo, (__mmask16)bits, lo, _mm512_set1_epi32(16));
                hi = _mm512_mask_add_epi32(hi, (__mmask16)(bits >> 16), hi, _mm512_set1_epi32(16));
            }
            store_block_half(lo, d0, mn, out + b * QK);
            store_block_half(hi, d1, mn, out + b * QK + 16);
        } else {
            store_block_half(_mm512_cvtepi8_epi32(v), d0, 0.0f, out + b * QK);
            store_block_half(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(bytes + 16))),
                             d1, 0.0f, out + b * QK + 16);
        }
    }
}
#endif

/* Row r of w (its nb = k / 32 real blocks) into out[k]. */
static void dequant_row(const agl_qweight *w, int64_t r, uint16_t *out)
{
#ifdef AGL_AMX
    if (agl_panel_kind(w->kind)) {
        dequant_panel_row(w, r, out);   /* the AMX build keeps these in panels (panel.h) */
        return;
    }
#endif
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
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = r0; r < r1; r++)
        dequant_row(w, r, out + (r - r0) * w->k);
}
