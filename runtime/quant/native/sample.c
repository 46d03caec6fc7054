/* The logits of one step's vocabulary rows: a grammar's bitmask applied to them
 * (agl_apply_bitmask, at the end, for runtime/grammar/xgrammar_backend.py), and one token
 * drawn from softmax(logits / T) of a row (agl_sample_row, for runtime/sampling/sampler.py:
 * rows without top-k / top-p / min-p).
 *
 * torch's way is five passes and as many temporaries (max, subtract-and-divide, softmax,
 * renormalize, running sum) before the search; here:
 *
 *   pass 1  m = max_i x_i
 *   pass 2  e_i = exp((x_i - m) / T) into a scratch row, and the sum of each block of BLOCK
 *   pass 3  target = u * sum(blocks, in block order); whole blocks are skipped while their
 *           running total stays <= target, then the block that crosses it is walked token by
 *           token: the first i with running sum > target is the token.
 *
 * A token at -inf (masked by a grammar, banned) is never drawn: it is skipped in the walk
 * (its e^x is floored at e^-80, not 0: FLOOR). If rounding leaves the walk short of the target,
 * the last token not at -inf is taken. The result depends only on the row, T and u: not on
 * the thread count (one thread) or the other rows.
 */
#include <math.h>
#include <stdint.h>

#include "qmatmul.h"
#include "vecmath.h"

#define BLOCK 1024
#define MAX_BLOCKS 4096                  /* vocabularies up to 4M tokens */

#define FLOOR (-80.0f)   /* exponents below: e^-80 (a masked or negligible token), a normal
                            float: e^-88 would be subnormal, and sums of subnormals run ~100x
                            slower (a grammar-masked row is mostly -inf) */

/* e[j - s] = exp(max((x_j - m) / T, FLOOR)) for the block [s, end), vectorized as in every
 * pass; returns the block's sum */
static float block_exp(const float *x, int64_t s, int64_t end, float m, float inv, float *e)
{
    const vf vm = vf_set1(m), vinv = vf_set1(inv), floor = vf_set1(FLOOR);
    vf acc = vf_zero();
    int64_t j = s;
    for (; j + VL <= end; j += VL) {
        const vf v = vf_exp(vf_max(vf_mul(vf_sub(vf_load(x + j), vm), vinv), floor));
        vf_store(e + (j - s), v);
        acc = vf_add(acc, v);
    }
    float sum = vf_sum(acc);
    for (; j < end; j++) {
        const float y = (x[j] - m) * inv;
        e[j - s] = expf(y > FLOOR ? y : FLOOR);
        sum += e[j - s];
    }
    return sum;
}

/* x: [V] float32 logits (-inf allowed); t > 0; u in [0, 1). Returns the token, -1 when every
 * logit is -inf, -2 when V is beyond MAX_BLOCKS blocks. No heap memory: the crossing block's
 * exponentials are computed again, by the same code, into a stack row. */
int64_t agl_sample_row(const float *x, int64_t V, float t, double u)
{
    const int64_t nb = (V + BLOCK - 1) / BLOCK;
    if (nb > MAX_BLOCKS)
        return -2;
    vf vm = vf_set1(-INFINITY);
    int64_t i = 0;
    for (; i + VL <= V; i += VL)
        vm = vf_max(vm, vf_load(x + i));
    float m = -INFINITY;
    {
        float lanes[VL];
        vf_store(lanes, vm);
        for (int l = 0; l < VL; l++)
            m = lanes[l] > m ? lanes[l] : m;
    }
    for (; i < V; i++)
        m = x[i] > m ? x[i] : m;
    if (m == -INFINITY)
        return -1;
    const float inv = 1.0f / t;
    float e[BLOCK], sums[MAX_BLOCKS];
    double z = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t s = b * BLOCK, end = s + BLOCK < V ? s + BLOCK : V;
        sums[b] = block_exp(x, s, end, m, inv, e);
        z += sums[b];
    }
    const double target = u * z;
    double run = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        if (run + sums[b] <= target) {
            run += sums[b];
            continue;
        }
        const int64_t s = b * BLOCK, end = s + BLOCK < V ? s + BLOCK : V;
        block_exp(x, s, end, m, inv, e);
        for (int64_t j = s; j < end; j++) {
            if (x[j] == -INFINITY)
                continue;
            run += e[j - s];
            if (run > target)
                return j;
        }
    }
    for (int64_t j = V - 1; j >= 0; j--)
        if (x[j] != -INFINITY)
            return j;
    return -1;
}

/* Grammar masks: in each row r of rows (nrows of them; every row when rows is NULL), the
 * logits of the tokens whose bit is 0 in mask row r become -inf. logits: float32 rows `stride`
 * floats apart; mask: int32 rows `mstride` words apart, bit t % 32 of word t / 32 for token t;
 * tokens from V on are left alone. The same result as xgrammar's CPU kernel (~100 us a row at
 * 49k tokens there; one pass over the mask here, a masked store per 16 tokens). */
void agl_apply_bitmask(float *logits, int64_t stride, const int32_t *mask, int64_t mstride,
                       const int64_t *rows, int64_t nrows, int64_t V)
{
    const int64_t words = (V + 31) / 32;
    for (int64_t i = 0; i < nrows; i++) {
        const int64_t r = rows ? rows[i] : i;
        float *x = logits + r * stride;
        const uint32_t *m = (const uint32_t *)mask + r * mstride;
        for (int64_t w = 0; w < words; w++) {
            uint32_t off = ~m[w];
            if (!off)
                continue;
            const int64_t t0 = w * 32;
            if (V - t0 < 32)
                off &= (1u << (V - t0)) - 1u;                /* tokens past V: not ours */
#if VL == 16
            _mm512_mask_storeu_ps(x + t0, (__mmask16)(off & 0xFFFFu), _mm512_set1_ps(-INFINITY));
            _mm512_mask_storeu_ps(x + t0 + 16, (__mmask16)(off >> 16), _mm512_set1_ps(-INFINITY));
#else
            for (; off; off &= off - 1u)
                x[t0 + __builtin_ctz(off)] = -INFINITY;
#endif
        }
    }
}
