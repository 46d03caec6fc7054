/* The quantized activations of one qmatmul.c call and the write of a tile's outputs: what
 * rows.h and panel.h share. */
#ifndef AGL_QACT_H
#define AGL_QACT_H
#include <stdint.h>

#include "qmatmul.h"

/* Row r's int16 quants at q + r * kb * 32 (block b at + b * 32), its steps at xd + r * kb and
 * each step times its block's sum of quants at xs + r * kb (blocks past the row's: 0). */
typedef struct {
    const int16_t *q;
    const float *xd, *xs;
    int64_t kb;
} qact;

static inline const int16_t *act_q(const qact *a, int64_t r, int64_t b) { return a->q + (r * a->kb + b) * 32; }
static inline float act_d(const qact *a, int64_t r, int64_t b) { return a->xd[r * a->kb + b]; }
static inline float act_s(const qact *a, int64_t r, int64_t b) { return a->xs[r * a->kb + b]; }

/* y[m + i][n + c] (row stride ldy) = out[i * ld + c] + bias[n + c], or += that with accumulate,
 * for i < mr, c < nc */
static inline void store_tile(const agl_qweight *w, const float *out, int ld, int64_t m, int mr,
                              int64_t n, int nc, float *y, int64_t ldy, int accumulate)
{
    for (int i = 0; i < mr; i++)
        for (int c = 0; c < nc; c++) {
            const float o = out[i * ld + c] + (w->bias ? w->bias[n + c] : 0.0f);
            float *d = y + (m + i) * ldy + n + c;
            *d = accumulate ? *d + o : o;
        }
}

#endif
