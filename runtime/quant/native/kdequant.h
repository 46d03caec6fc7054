/* One row of a K-quant (Q4_K, Q5_K, Q6_K) or Q5_0 / Q5_1 weight as bfloat16, for every build's
 * dequant.c: the calls a bfloat16 model runs as dense GEMMs (runtime/quant/block_linear.py).
 *
 * The layouts are avx2/kquant.h's (runtime/quant/kquant.py writes them). Each weight is
 * computed in float32 as the kernels scale it — step = d sc (Q6_K: a half block's), min =
 * -(dmin mn) (Q5_0: -16 d, Q5_1: m), w = fma(q, step, min) — which is the gguf package's value
 * bit for bit (q step is exact, so the one rounding is the sum's), then rounded to the nearest
 * bfloat16, ties to even. Plain C: the compiler vectorizes the 32-weight loops.
 */
#ifndef AGL_KDEQUANT_H
#define AGL_KDEQUANT_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

static inline int kd_is_block(int kind)          /* the kinds this header decodes */
{
    return kind == AGL_Q5 || agl_is_kquant(kind);
}

/* Block b of row r: its 32 quants (Q6_K: q - 32) and the steps of its halves and its min */
static inline void kd_block(const agl_qweight *w, int64_t r, int64_t b, int32_t q[32],
                            float *step, float *step2, float *min)
{
    const int64_t kb = w->kb, g = b >> 2, at = b & 3;
    if (w->kind == AGL_Q6_K) {
        const int8_t *p = (const int8_t *)w->qs + (r * kb + b) * 32;
        const int8_t *sc = (const int8_t *)w->sc + r * kb * 2 + g * 8;
        const float d = _cvtsh_ss(w->d[r * (kb >> 3) + (b >> 3)]);
        for (int i = 0; i < 32; i++)
            q[i] = p[i];
        *step = d * (float)sc[at];
        *step2 = d * (float)sc[4 + at];
        *min = 0.0f;
        return;
    }
    const uint8_t *p = (const uint8_t *)w->qs + (r * kb + b) * 16;   /* Q4_1's nibble order */
    for (int i = 0; i < 16; i++) {
        q[i] = p[i] & 15;
        q[i + 16] = p[i] >> 4;
    }
    if (w->kind == AGL_Q5) {                              /* the file's qh: bit j, weight j */
        uint32_t qh;
        memcpy(&qh, w->hb + (r * kb + b) * 4, sizeof qh);
        for (int i = 0; i < 32; i++)
            q[i] |= (int32_t)((qh >> i) & 1) << 4;
        const float d = _cvtsh_ss(w->d[r * kb + b]);
        *step = *step2 = d;
        *min = w->m ? _cvtsh_ss(w->m[r * kb + b]) : -16.0f * d;
        return;
    }
    if (w->kind == AGL_Q5_K) {       /* the group's A and B masks, block at bits 16 at.. */
        uint64_t ma, mb;
        memcpy(&ma, w->hb + (r * (kb >> 2) + g) * 16, 8);
        memcpy(&mb, w->hb + (r * (kb >> 2) + g) * 16 + 8, 8);
        for (int i = 0; i < 16; i++) {
            q[i] |= (int32_t)((ma >> (16 * at + i)) & 1) << 4;
            q[i + 16] |= (int32_t)((mb >> (16 * at + i)) & 1) << 4;
        }
    }
    const float d = _cvtsh_ss(w->d[r * (kb >> 3) + (b >> 3)]);
    *step = *step2 = d * (float)w->sc[r * kb + b];
    *min = -(_cvtsh_ss(w->m[r * (kb >> 3) + (b >> 3)]) * (float)w->mn[r * kb + b]);
}

/* Row r of w into out[k], bfloat16 bits */
static inline void kd_row_bf16(const agl_qweight *w, int64_t r, uint16_t *out)
{
    for (int64_t b = 0; b < w->k / 32; b++) {
        int32_t q[32];
        float step, step2, min;
        kd_block(w, r, b, q, &step, &step2, &min);
        for (int i = 0; i < 32; i++)
            out[b * 32 + i] = f_bf16(fmaf((float)q[i], i < 16 ? step : step2, min));
    }
}

#endif
