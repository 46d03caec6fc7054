/* The bfloat16 layer's element-wise steps in one pass each, for runtime/models/llama.py.
 *
 * On a bf16 model each of these is several torch ops over the step's activations (a cast to
 * float32, the op, a cast back, a separate multiply), each a pass over memory; here each is
 * one pass with the arithmetic of torch's ops:
 *
 *   agl_rmsnorm_bf16:  [x += h, rounded to bf16, when h is given]
 *                      out = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))   (Llama's order)
 *   agl_silu_mul_bf16: out = bf16(bf16(g / (1 + e^-g)) * u)   for gu = [g | u] a row
 *   agl_rope_bf16:     out = bf16(bf16(x * cos) + bf16(roll(x, d / 2) * signed_sin))
 *
 * The statistics and products are float32 (bf16 widened exactly), rounded to nearest even
 * where torch rounds. Sums run in the build's lane order rather than torch's and e^x is
 * vecmath.h's (3e-7 relative), so a value can differ from torch's in its last bf16 bit,
 * rarely; a row's result depends on that row alone. Rows are split across threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

static void rmsnorm_row(uint16_t *x, const uint16_t *h, const uint16_t *w, int64_t n,
                        float eps, uint16_t *out)
{
    vf ss = vf_zero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf v = vf_load_bf16(x + i);
        if (h) {                                   /* the residual add, rounded as torch's */
            v = vf_bf16(vf_add(v, vf_load_bf16(h + i)));
            vf_store_bf16(x + i, v);
        }
        ss = vf_fmadd(v, v, ss);
    }
    float sum = vf_sum(ss);
    for (; i < n; i++) {
        if (h)
            x[i] = f_bf16(bf16_f(x[i]) + bf16_f(h[i]));
        const float v = bf16_f(x[i]);
        sum += v * v;
    }
    const float inv = 1.0f / sqrtf(sum / (float)n + eps);
    const vf vinv = vf_set1(inv);
    for (i = 0; i + VL <= n; i += VL)                                  /* w * bf16(x / rms) */
        vf_store_bf16(out + i, vf_mul(vf_load_bf16(w + i), vf_bf16(vf_mul(vf_load_bf16(x + i), vinv))));
    for (; i < n; i++)
        out[i] = f_bf16(bf16_f(w[i]) * bf16_f(f_bf16(bf16_f(x[i]) * inv)));
}

void agl_rmsnorm_bf16(uint16_t *x, const uint16_t *h, const uint16_t *w, int64_t rows,
                      int64_t n, float eps, uint16_t *out, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++)
        rmsnorm_row(x + r * n, h ? h + r * n : NULL, w, n, eps, out + r * n);
}

void agl_silu_mul_bf16(const uint16_t *gu, int64_t rows, int64_t inter, uint16_t *out,
                       int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * inter >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *g = gu + r * 2 * inter, *u = g + inter;
        uint16_t *o = out + r * inter;
        int64_t i = 0;
        for (; i + VL <= inter; i += VL) {
            const vf gv = vf_load_bf16(g + i);
            const vf den = vf_add(vf_set1(1.0f), vf_exp(vf_sub(vf_zero(), gv)));
            vf_store_bf16(o + i, vf_mul(vf_bf16(vf_div(gv, den)), vf_load_bf16(u + i)));
        }
        for (; i < inter; i++) {
            const float gf = bf16_f(g[i]);
            o[i] = f_bf16(bf16_f(f_bf16(gf / (1.0f + expf(-gf)))) * bf16_f(u[i]));
        }
    }
}

/* out [T, heads, d] = bf16(bf16(x * cos) + bf16(roll(x, d / 2) * ssin)) per head, the
 * rotation of rope.py's RotaryEmbedding.rotate (full rotary: the table is d wide); x's rows
 * (one a token) are `stride` values apart, its heads d apart; cos, ssin [T, d]. */
void agl_rope_bf16(const uint16_t *x, int64_t T, int64_t heads, int64_t d, int64_t stride,
                   const uint16_t *cos, const uint16_t *ssin, uint16_t *out, int nthreads)
{
    const int64_t half = d / 2;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (T * heads * d >= 32768)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *c = cos + t * d, *s = ssin + t * d;
        for (int64_t j = 0; j < heads; j++) {
            const uint16_t *v = x + t * stride + j * d;
            uint16_t *o = out + (t * heads + j) * d;
            int64_t i = 0;
            if (half % VL == 0)
                for (; i < d; i += VL) {
                    const vf a = vf_bf16(vf_mul(vf_load_bf16(v + i), vf_load_bf16(c + i)));
                    const vf b = vf_bf16(vf_mul(vf_load_bf16(v + (i + half) % d), vf_load_bf16(s + i)));
                    vf_store_bf16(o + i, vf_add(a, b));
                }
            for (; i < d; i++)
                o[i] = f_bf16(bf16_f(f_bf16(bf16_f(v[i]) * bf16_f(c[i])))
                              + bf16_f(f_bf16(bf16_f(v[(i + half) % d]) * bf16_f(s[i]))));
        }
    }
}
