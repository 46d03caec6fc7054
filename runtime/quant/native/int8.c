/* The two passes around an int8 GEMM (runtime/quant/int8_linear.py): activations quantized
 * per row before it, its int32 products scaled back after it.
 *
 *   agl_quantize_rows:  for each row r of x [rows, k] (float32 or bfloat16 bits), with
 *                       y = x[r, j] * mul[j] (float32; y = x[r, j] when mul is NULL):
 *                         a = max |y|;  scale[r] = a / 127 (0 for a zero row);
 *                         q[r, j] = rne(y * (127 / a)) in [-127, 127] (0 for a zero row)
 *   agl_dequant_rows:   out[r, c] = float(acc[r, c]) * sw[c] * sx[r]  (+ bias[c]),
 *                         float32 in that order, stored as float32 or rounded to bfloat16
 *
 * rne: to nearest, ties to even (vf_round). A row's result depends on that row alone; rows
 * are split across threads. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

#if defined(__AVX512F__)
static inline vf vf_abs(vf v) { return _mm512_abs_ps(v); }
static inline vf vf_load_i32(const int32_t *p) { return _mm512_cvtepi32_ps(_mm512_loadu_si512(p)); }
static inline void vf_store_i8(int8_t *p, vf v)          /* v integral, in [-127, 127] */
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
}
#else
static inline vf vf_abs(vf v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
static inline vf vf_load_i32(const int32_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void vf_store_i8(int8_t *p, vf v)
{
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}
#endif

static inline float load1(const void *x, int bf16, int64_t i)
{
    return bf16 ? bf16_f(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

static inline vf loadv(const void *x, int bf16, const float *mul, int64_t i)
{
    const vf v = bf16 ? vf_load_bf16((const uint16_t *)x + i) : vf_load((const float *)x + i);
    return mul ? vf_mul(v, vf_load(mul + i)) : v;
}

static inline float loadm(const void *x, int bf16, const float *mul, int64_t i)
{
    return mul ? load1(x, bf16, i) * mul[i] : load1(x, bf16, i);
}

static void quantize_row(const void *x, int bf16, const float *mul, int64_t k, int8_t *q,
                         float *scale)
{
    vf m = vf_zero();
    int64_t j = 0;
    for (; j + VL <= k; j += VL)
        m = vf_max(m, vf_abs(loadv(x, bf16, mul, j)));
    float tmp[VL], a = 0.0f;
    vf_store(tmp, m);
    for (int i = 0; i < VL; i++)
        a = tmp[i] > a ? tmp[i] : a;
    for (; j < k; j++) {
        const float v = loadm(x, bf16, mul, j);
        const float av = v < 0 ? -v : v;
        a = av > a ? av : a;
    }
    if (!(a > 0.0f)) {                          /* a zero row (or one with a NaN): zeros */
        memset(q, 0, (size_t)k);
        *scale = 0.0f;
        return;
    }
    const float inv = 127.0f / a;
    *scale = a / 127.0f;
    const vf vinv = vf_set1(inv), hi = vf_set1(127.0f), lo = vf_set1(-127.0f);
    for (j = 0; j + VL <= k; j += VL)
        vf_store_i8(q + j, vf_min(hi, vf_max(lo, vf_round(vf_mul(loadv(x, bf16, mul, j), vinv)))));
    for (; j < k; j++) {
        const float r = nearbyintf(loadm(x, bf16, mul, j) * inv);    /* to nearest even */
        q[j] = (int8_t)(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
    }
}

void agl_quantize_rows(const void *x, int bf16, const float *mul, int64_t rows, int64_t k,
                       int8_t *q, float *scale, int nthreads)
{
    const int64_t esz = bf16 ? 2 : 4;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * k >= 65536)
    for (int64_t r = 0; r < rows; r++)
        quantize_row((const char *)x + r * k * esz, bf16, mul, k, q + r * k, scale + r);
}

__attribute__((optimize("fp-contract=off")))   /* the bias added after the rounding */
void agl_dequant_rows(const int32_t *acc, int64_t rows, int64_t n, const float *sx,
                      const float *sw, const float *bias, void *out, int bf16, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *a = acc + r * n;
        const float s = sx[r];
        const vf vs = vf_set1(s);
        int64_t c = 0;
        for (; c + VL <= n; c += VL) {
            vf y = vf_mul(vf_mul(vf_load_i32(a + c), vf_load(sw + c)), vs);
            if (bias)
                y = vf_add(y, vf_load(bias + c));
            if (bf16)
                vf_store_bf16((uint16_t *)out + r * n + c, y);
            else
                vf_store((float *)out + r * n + c, y);
        }
        for (; c < n; c++) {
            float y = (float)a[c] * sw[c];
            y = y * s;
            if (bias)
                y = y + bias[c];
            if (bf16)
                ((uint16_t *)out)[r * n + c] = f_bf16(y);
            else
                ((float *)out)[r * n + c] = y;
        }
    }
}
