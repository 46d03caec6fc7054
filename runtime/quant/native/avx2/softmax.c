/* avx512/softmax.c for the avx2/ build: each row of attention scores becomes, in place,
 * p = e^(scale (s - max)) / sum (float32, or bfloat16 rounded to nearest even), with
 * lse = scale max + log(sum) in float32; -inf scores give p = 0. Three passes over a row, 8
 * lanes at a time; a row's last L % 8 scores go through an 8-lane buffer padded with -inf, so
 * every score gets the same operations. A row's result does not depend on the others or on the
 * thread count. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

/* 8 scores from i (n of them, n < 8: the rest -inf) as float32 */
static inline __m256 load8(const void *s, int bf16, int64_t i, int n)
{
    if (n == 8)
        return bf16 ? from_bf16_8(_mm_loadu_si128((const __m128i *)((const uint16_t *)s + i)))
                    : _mm256_loadu_ps((const float *)s + i);
    float t[8];
    for (int k = 0; k < 8; k++)
        t[k] = -INFINITY;
    if (bf16) {
        uint16_t h[8] = {0};
        memcpy(h, (const uint16_t *)s + i, sizeof(uint16_t) * (size_t)n);
        _mm256_storeu_ps(t, from_bf16_8(_mm_loadu_si128((const __m128i *)h)));
        for (int k = n; k < 8; k++)
            t[k] = -INFINITY;
    } else {
        memcpy(t, (const float *)s + i, sizeof(float) * (size_t)n);
    }
    return _mm256_loadu_ps(t);
}

static inline void store8(void *s, int bf16, int64_t i, int n, __m256 v)
{
    if (bf16) {
        uint16_t h[8];
        _mm_storeu_si128((__m128i *)h, to_bf16_8(v));
        memcpy((uint16_t *)s + i, h, sizeof(uint16_t) * (size_t)n);
    } else if (n == 8) {
        _mm256_storeu_ps((float *)s + i, v);
    } else {
        float t[8];
        _mm256_storeu_ps(t, v);
        memcpy((float *)s + i, t, sizeof(float) * (size_t)n);
    }
}

/* e^(scale (x - m)) where x is not -inf, 0 there */
static inline __m256 shifted_exp(__m256 x, __m256 vm, __m256 vs)
{
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    return _mm256_and_ps(live, vf_exp(_mm256_mul_ps(_mm256_sub_ps(x, vm), vs)));
}

/* The row's first vis of its L scores (vis = L: all); the keys from vis on are hidden (a
 * causal block's future keys) and get p = 0 without being read: the lanes a key lands in and
 * the sums are those of the same row with those scores at -inf, so the bits are too. */
static void softmax_row(void *s, int bf16, int64_t L, int64_t vis, float scale, float *lse,
                        float *scratch)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < vis; i += 8)
        mx = _mm256_max_ps(mx, load8(s, bf16, i, vis - i < 8 ? (int)(vis - i) : 8));
    __m128 u = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    u = _mm_max_ps(u, _mm_movehl_ps(u, u));
    const float m = _mm_cvtss_f32(_mm_max_ss(u, _mm_movehdup_ps(u)));
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    __m256 sum = _mm256_setzero_ps();
    float *e = bf16 ? scratch : (float *)s;    /* e^..: in place, or bf16's float32 scratch */
    for (int64_t i = 0; i < vis; i += 8) {
        const int n = vis - i < 8 ? (int)(vis - i) : 8;
        const __m256 v = shifted_exp(load8(s, bf16, i, n), vm, vs);
        sum = _mm256_add_ps(sum, v);
        if (e)
            store8(e, 0, i, n, v);
    }
    const float z = hsum8(sum);
    const __m256 inv = _mm256_set1_ps(1.0f / z);
    for (int64_t i = 0; i < vis; i += 8) {
        const int n = vis - i < 8 ? (int)(vis - i) : 8;
        const __m256 v = e ? load8(e, 0, i, n)
                           : shifted_exp(load8(s, 1, i, n), vm, vs);          /* no scratch */
        store8(s, bf16, i, n, _mm256_mul_ps(v, inv));
    }
    memset((char *)s + vis * (bf16 ? 2 : 4), 0, (size_t)(L - vis) * (bf16 ? 2 : 4));
    *lse = scale * m + logf(z);
}

#include "softmax_rows.h"
