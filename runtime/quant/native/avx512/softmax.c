/* Softmax of attention scores with its log-sum-exp, in place, for runtime/attention/cascade.py.
 *
 * Each of `rows` rows of L scores s (float32, or bfloat16 as a bf16 matmul leaves them) becomes
 * p = e^(scale (s - max)) / sum, written over s in s's dtype (bfloat16: rounded to nearest
 * even), and lse = scale max + log(sum) in float32: the same quantities as torch's
 * mul / amax / sub / exp / sum / div sequence, in three passes over the row instead of six and
 * with the 16-lane exp of vecmath.h (3e-7 relative). A score of -inf (a masked key) gives
 * p = 0; a row must have a finite score. Rows are split across threads; a row's result does
 * not depend on the others or on the thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

static inline __m512 load16(const void *s, int bf16, int64_t i, __mmask16 k)
{
    if (bf16)
        return from_bf16(_mm256_maskz_loadu_epi16(k, (const uint16_t *)s + i));
    return _mm512_maskz_loadu_ps(k, (const float *)s + i);
}

static inline void store16(void *s, int bf16, int64_t i, __mmask16 k, __m512 v)
{
    if (bf16)
        _mm256_mask_storeu_epi16((uint16_t *)s + i, k, to_bf16(v));
    else
        _mm512_mask_storeu_ps((float *)s + i, k, v);
}

static inline __mmask16 tail(int64_t L, int64_t i)
{
    return L - i >= 16 ? 0xFFFF : (__mmask16)((1u << (L - i)) - 1);
}

/* e^(scale (x - m)) in the lanes of k whose score is not -inf, 0 elsewhere */
static inline __m512 shifted_exp(__m512 x, __m512 vm, __m512 vs, __mmask16 k)
{
    const __mmask16 live = k & _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    return _mm512_maskz_mov_ps(live, exp16(_mm512_mul_ps(_mm512_sub_ps(x, vm), vs)));
}

/* The row's first vis of its L scores (vis = L: all); the keys from vis on are hidden (a
 * causal block's future keys) and get p = 0 without being read: the lanes a key lands in and
 * the sums are those of the same row with those scores at -inf, so the bits are too. */
static void softmax_row(void *s, int bf16, int64_t L, int64_t vis, float scale, float *lse,
                        float *scratch)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < vis; i += 16) {
        const __mmask16 k = tail(vis, i);
        mx = _mm512_mask_max_ps(mx, k, mx, load16(s, bf16, i, k));
    }
    const float m = _mm512_reduce_max_ps(mx);
    const __m512 vm = _mm512_set1_ps(m), vs = _mm512_set1_ps(scale);
    __m512 sum = _mm512_setzero_ps();
    float *e = bf16 ? scratch : (float *)s;    /* e^..: in place, or bf16's float32 scratch */
    for (int64_t i = 0; i < vis; i += 16) {
        const __mmask16 k = tail(vis, i);
        const __m512 v = shifted_exp(load16(s, bf16, i, k), vm, vs, k);
        sum = _mm512_add_ps(sum, v);
        if (e)
            _mm512_mask_storeu_ps(e + i, k, v);
    }
    const float z = _mm512_reduce_add_ps(sum);
    const __m512 inv = _mm512_set1_ps(1.0f / z);
    for (int64_t i = 0; i < vis; i += 16) {
        const __mmask16 k = tail(vis, i);
        const __m512 v = e ? _mm512_maskz_loadu_ps(k, e + i)
                           : shifted_exp(load16(s, bf16, i, k), vm, vs, k);   /* no scratch */
        store16(s, bf16, i, k, _mm512_mul_ps(v, inv));
    }
    memset((char *)s + vis * (bf16 ? 2 : 4), 0, (size_t)(L - vis) * (bf16 ? 2 : 4));
    *lse = scale * m + logf(z);
}

#include "softmax_rows.h"
