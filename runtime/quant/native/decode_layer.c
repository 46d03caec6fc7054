/* One decoder layer of a step, whole: a decode (one new token per sequence), a verify or a
 * prefill chunk (several: a row each, row j of a sequence attending to its first prefix + j + 1
 * keys, a decode's arithmetic), for a Llama-family model whose linears are quantized blocks
 * (the build's qmatmul.c) and whose KV pool is float32 or bfloat16 (agl_layer's kv_bf16):
 *
 *   x += o_proj(attention(rope(qkv_proj(rmsnorm(x)))))      (K/V of the new token stored first)
 *   x += down_proj(silu(gate) * up),  [gate, up] = gate_up_proj(rmsnorm(x))
 *
 * The same arithmetic as runtime/models/llama.py's layer with the torch attention backend, in
 * float32, in one call instead of ~45 small torch ops: RMSNorm x * rsqrt(mean(x^2) + eps) * w;
 * Qwen3's q/k norms (the same RMSNorm over each head, when the layer has them); RoPE
 * x * cos + roll(x, D/2) * signed_sin over the first D = rd dims of each head (partial rotary:
 * the rest pass through; the caller's tables, rd wide); softmax attention of each
 * query head over its sequence's K/V read through the page table (GQA: G query heads a KV
 * head; the softmax is the build's agl_softmax_lse). Sums run in a fixed order: a sequence's
 * result does not depend on the others in the step or on the thread count.
 *
 * Gemma 2 / 3 (runtime/models/gemma_config.py), when the layer and dims say so: a norm of the
 * attention's output and of the MLP's before each residual add (post_attn_norm, post_ffn_norm;
 * ffn_norm is then the norm before the MLP), GeGLU (gelu with the tanh approximation, as
 * torch's approximate="tanh"), each query seeing only its last `window` keys, scores capped
 * as softcap * tanh(score * scale / softcap) before the softmax, and the sliding layers' own
 * RoPE table (the batch's lcos / lssin).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

typedef struct {
    int64_t hidden, nh, nkv, hd, inter;
    float eps, scale;
    int64_t rd;                             /* rotated dims of a head (<= hd, even) */
    float softcap;                          /* > 0: scores capped (Gemma 2); 0: not */
    int64_t gelu;                           /* 1: GeGLU (Gemma), 0: SwiGLU */
} agl_dims;

typedef struct {
    const float *attn_norm, *ffn_norm;      /* [hidden] */
    agl_qweight qkv, o, gate_up, down;
    void *k_cache, *v_cache;                /* this layer's pool: [pages * page_size, nkv, hd],
                                             * float32, or bfloat16 bits with kv_bf16 */
    const float *q_norm, *k_norm;           /* [hd] each, or NULL: no q/k norms */
    const float *post_attn_norm, *post_ffn_norm;   /* [hidden] each (Gemma), or NULL */
    int64_t window;                         /* keys a query sees, its last ones; 0: all */
    int64_t local_rope;                     /* 1: the batch's lcos / lssin (a sliding layer) */
    int64_t kv_bf16;                        /* 1: the pool stores K/V as bfloat16 (each new
                                             * row rounded to nearest even as it is stored) */
} agl_layer;

typedef struct {
    int64_t B;                              /* sequences, one new token each */
    const float *cos, *ssin;                /* [B, rd]: cos and signed sin of each position */
    const int64_t *slots;                   /* [B] pool row of each new token */
    const int32_t *page_table;              /* [B, max_pages] */
    int64_t max_pages, page_size;
    const int32_t *seq_lens;                /* [B] tokens after this step */
    const float *lcos, *lssin;              /* [B, rd]: the sliding layers' table, or NULL */
    const int64_t *wslots;                  /* [B] the sliding layers' rows (their own pages), */
    const int32_t *wpage_table;             /* [B, max_pages] and table; NULL: slots, page_table */
} agl_batch;

#define PAR_ROWS 16      /* rows from which the per-row steps (norms, RoPE, the K/V store, the
                          * activation) run on every thread: a prefill chunk's; each row's
                          * arithmetic is the same on any thread */

static void rmsnorm(const float *x, const float *w, int64_t B, int64_t n, float eps,
                    float *out, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (B >= PAR_ROWS)
    for (int64_t b = 0; b < B; b++) {
        const float *r = x + b * n;
        float inv = 1.0f / sqrtf(dot(r, r, n) / (float)n + eps);
        for (int64_t i = 0; i < n; i++)
            out[b * n + i] = w[i] * (r[i] * inv);
    }
}

static void rope(float *h, int64_t heads, int64_t hd, int64_t rd, const float *cos,
                 const float *ssin)
{
    const int64_t half = rd / 2;                 /* the partner of dim i: i + half mod rd */
    float tmp[512];
    for (int64_t j = 0; j < heads; j++) {
        float *v = h + j * hd;
        for (int64_t i = 0; i < half; i++)
            tmp[i] = v[i] * cos[i] + v[i + half] * ssin[i];
        for (int64_t i = half; i < rd; i++)
            tmp[i] = v[i] * cos[i] + v[i - half] * ssin[i];
        memcpy(v, tmp, sizeof(float) * (size_t)rd);
    }
}

#include "decode_attention.h"     /* needs the structs above */

/* gate [n] = gelu_tanh(gate) * up (torch's gelu, approximate="tanh") */
static void gelu_mul(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * up[i];
    }
}

/* x += norm(y) (Gemma's post norms; y [B, hidden] normalized in place) */
static void add_normed(float *x, float *y, const float *w, int64_t B, int64_t H, float eps,
                       int nthreads)
{
    rmsnorm(y, w, B, H, eps, y, nthreads);
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (B >= PAR_ROWS)
    for (int64_t i = 0; i < B * H; i++)
        x[i] += y[i];
}

/* x: float32 [B, hidden], updated in place. 0, or -1 without memory (x is then unchanged
 * only if the failure came before the first residual add: the caller treats -1 as fatal). */
int agl_decode_layer(const agl_dims *dm, const agl_layer *L, const agl_batch *bt, float *x,
                     int nthreads)
{
    const int64_t B = bt->B, H = dm->hidden, hd = dm->hd, nq = dm->nh * hd,
                  nk = dm->nkv * hd, wq = nq + 2 * nk, I = dm->inter;
    float *h = malloc(sizeof(float) * (size_t)(B * H)), *qkv = malloc(sizeof(float) * (size_t)(B * wq));
    float *att = malloc(sizeof(float) * (size_t)(B * nq)), *gu = malloc(sizeof(float) * (size_t)(B * 2 * I));
    float *act = malloc(sizeof(float) * (size_t)(B * I));     /* act(gate) * up [B, I] */
    int rc = -1, fail = 0;
    if (!h || !qkv || !att || !gu || !act || hd > 512)
        goto done;
    rmsnorm(x, L->attn_norm, B, H, dm->eps, h, nthreads);
    if (agl_qmm(&L->qkv, h, B, qkv, 0, nthreads))
        goto done;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (B >= PAR_ROWS)
    for (int64_t b = 0; b < B; b++) {
        float *r = qkv + b * wq;
        if (L->q_norm) {                                   /* each head in place */
            for (int64_t j = 0; j < dm->nh + dm->nkv; j++)
                rmsnorm(r + j * hd, j < dm->nh ? L->q_norm : L->k_norm, 1, hd, dm->eps,
                        r + j * hd, 1);
        }
        const int local = L->local_rope && bt->lcos;
        rope(r, dm->nh + dm->nkv, hd, dm->rd, (local ? bt->lcos : bt->cos) + b * dm->rd,
             (local ? bt->lssin : bt->ssin) + b * dm->rd);
        const int64_t slot = (L->window && bt->wslots ? bt->wslots : bt->slots)[b];
        if (L->kv_bf16) {
            uint16_t *kd = (uint16_t *)L->k_cache + slot * nk, *vd = (uint16_t *)L->v_cache + slot * nk;
            for (int64_t i = 0; i < nk; i++) {
                kd[i] = f_bf16(r[nq + i]);
                vd[i] = f_bf16(r[nq + nk + i]);
            }
        } else {
            float *kd = (float *)L->k_cache + slot * nk, *vd = (float *)L->v_cache + slot * nk;
            memcpy(kd, r + nq, sizeof(float) * (size_t)nk);
            memcpy(vd, r + nq + nk, sizeof(float) * (size_t)nk);
        }
    }
    fail = decode_attention(dm, L, bt, qkv, wq, att, nthreads);
    if (fail || agl_qmm(&L->o, att, B, L->post_attn_norm ? h : x, !L->post_attn_norm, nthreads))
        goto done;
    if (L->post_attn_norm)                                /* Gemma: x += norm(o) */
        add_normed(x, h, L->post_attn_norm, B, H, dm->eps, nthreads);
    rmsnorm(x, L->ffn_norm, B, H, dm->eps, h, nthreads);
    if (agl_qmm(&L->gate_up, h, B, gu, 0, nthreads))
        goto done;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (B >= PAR_ROWS)
    for (int64_t b = 0; b < B; b++) {
        float *g = gu + b * 2 * I, *dst = act + b * I;
        if (dm->gelu) {
            gelu_mul(g, g + I, I);
            for (int64_t i = 0; i < I; i++)
                dst[i] = g[i];
        } else {
            silu_mul(g, g + I, I, dst);
        }
    }
    if (L->post_ffn_norm) {                               /* Gemma: x += norm(down) */
        rc = agl_qmm(&L->down, act, B, h, 0, nthreads);
        if (rc == 0)
            add_normed(x, h, L->post_ffn_norm, B, H, dm->eps, nthreads);
    } else {
        rc = agl_qmm(&L->down, act, B, x, 1, nthreads);
    }
done:
    free(h); free(qkv); free(att); free(gu); free(act);
    return rc;
}

/* Layers first..n-1 of a step (L: the model's n layers), one after the other on x. After each
 * layer but the last, when *pending is nonzero (the engine queued an arrival: the caller
 * serves it between layers, runtime/engine/layer_break.py), returns the next layer's index;
 * else n once all ran. pending may be NULL (never stop). -1 without memory. One call a step
 * instead of one a layer: no interpreter lock to take back between layers. */
int agl_decode_layers(const agl_dims *dm, const agl_layer *L, int64_t first, int64_t n,
                      const agl_batch *bt, float *x, const volatile int32_t *pending,
                      int nthreads)
{
    for (int64_t i = first; i < n; i++) {
        if (agl_decode_layer(dm, L + i, bt, x, nthreads))
            return -1;
        if (i + 1 < n && pending && *pending)
            return (int)(i + 1);
    }
    return (int)n;
}
