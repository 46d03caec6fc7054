/* The entry points of the native library and the weight they share (qmatmul.c, decode_layer.c,
 * dequant.c, softmax.c, paged_attention.c, glue.c). */
#ifndef AGL_QMATMUL_H
#define AGL_QMATMUL_H
#include <stdint.h>

#define AGL_Q4 4
#define AGL_Q5 5          /* Q5_0 / Q5_1: Q4's nibbles + bit 4 from hb (kquant.h) */
#define AGL_Q8 8
#define AGL_Q4_K 14
#define AGL_Q5_K 15
#define AGL_Q6_K 16

/* What a weight kind is, for every build */
static inline int agl_is_kquant(int kind)       /* super-blocks of 256 weights */
{
    return kind == AGL_Q4_K || kind == AGL_Q5_K || kind == AGL_Q6_K;
}

static inline int agl_has_min(int kind)         /* w = step q + min: Q4, Q5, Q4_K, Q5_K */
{
    return kind == AGL_Q4 || kind == AGL_Q5 || kind == AGL_Q4_K || kind == AGL_Q5_K;
}

static inline int agl_known_kind(int kind)
{
    return kind == AGL_Q8 || kind == AGL_Q6_K || agl_has_min(kind);
}

static inline int agl_panel_kind(int kind)      /* kept in panels by the AMX build (panel.h) */
{
    return kind == AGL_Q4 || kind == AGL_Q5 || kind == AGL_Q8 || kind == AGL_Q4_K ||
           kind == AGL_Q6_K;
}

static inline int agl_quant_bytes(int kind)     /* bytes of quants a 32-weight block */
{
    return kind == AGL_Q8 || kind == AGL_Q6_K ? 32 : 16;
}

/* One quantized weight (layouts at the top of qmatmul.c, K-quants in kquant.h); bias float32
 * [n] or NULL. Both builds take every kind and chains (avx2/kquant.h, avx512/kgroups.h). */
typedef struct agl_qweight_s {
    int32_t kind;               /* AGL_Q4: Q4_0/Q4_1, AGL_Q8: Q8_0, AGL_Q4_K / Q5_K / Q6_K */
    int64_t n, k;               /* out and in features; k % 32 == 0 (K-quants: % 256) */
    int64_t kb;                 /* blocks a stored row: k / 32 rounded up to even */
    const void *qs;             /* Q4, K-quants: uint8 [n, kb * 16]; Q8: int8 [n, kb * 32] */
    const uint16_t *d, *m;      /* float16 [n, kb]; m: Q4_1 only, else NULL (K: a super-block) */
    const float *bias;
    const uint8_t *sc, *mn, *hb;   /* K-quants only (kquant.h), else NULL */
    const struct agl_qweight_s *next;   /* more output rows, of another kind (same k and kb):
                                         * y's columns continue with them */
} agl_qweight;

/* y[M, n] (row stride n) = x[M, k] @ w.T + bias, or y += that with accumulate; with a chain
 * of weights (next), n is the sum of their n and each fills its own columns.
 * 0, -1 without memory for the quantized activations, -2 for a kind this build lacks. */
int agl_qmm(const agl_qweight *w, const float *x, int64_t M, float *y, int accumulate,
            int nthreads);

/* Rows r0..r1-1 of w into out, bfloat16 bits [r1 - r0, w->k]: each weight computed in float32
 * and rounded to nearest even (dequant.c). */
void agl_dequant_bf16(const agl_qweight *w, int64_t r0, int64_t r1, uint16_t *out, int nthreads);

#ifdef AGL_AMX
/* The same for a weight of agl_panel_kind in the AMX build's panels (avx512/panel.h) */
void agl_panel_dequant_bf16(const agl_qweight *w, int64_t r0, int64_t r1, uint16_t *out,
                            int nthreads);
#endif

/* In place: each row of s [rows, L] (float32, or bfloat16 bits with bf16 = 1) becomes its
 * softmax of scale * s; lse[r] = its log-sum-exp (softmax.c). */
void agl_softmax_lse(void *s, int bf16, int64_t rows, int64_t L, float scale, float *lse,
                     int nthreads);
/* One float32 row of L scores, as agl_softmax_lse with rows = 1 gives it, without opening a
 * parallel region (for callers inside one: decode_attention.h's tasks) */
void agl_softmax_lse_row(float *s, int64_t L, float scale, float *lse);
/* the same, row r seeing only keys 0 .. L - n + (r mod n G) / G: a causal block of the last
 * n keys in (token, head) row order, G heads a token (n = 0: every key); the hidden keys'
 * p is 0 and they are not read (softmax.c). */
void agl_softmax_lse_causal(void *s, int bf16, int64_t rows, int64_t L, int64_t n, int64_t G,
                            float scale, float *lse, int nthreads);

/* Decode attention over a paged KV pool (paged_attention.c): B rows of one query token each. */
typedef struct {
    int64_t B, nh, nkv, hd, page_size;
    int64_t max_pages;              /* page_table's row stride */
    const int64_t *page_table;      /* [B, max_pages]: each row's pages, in order */
    const int64_t *lens;            /* [B]: keys of each row, its pages' first lens[b] positions */
    const void *k, *v;              /* this layer's K and V: [pages, page_size, nkv, hd] */
    int32_t kv_bf16;                /* k, v: bfloat16 bits (1) or float32 (0) */
    float scale;
} agl_paged;

/* out [B, nh, hd] (bf16 bits with out_bf16, else float32) = softmax(scale q k^T) v per query
 * head of q [B, nh, hd] (bf16 bits with q_bf16), lse [B, nh] float32 (or NULL): 0, -1
 * without memory, -2 for dimensions it cannot take (a length outside 1..max_pages*page_size). */
int agl_paged_decode(const agl_paged *p, const void *q, int q_bf16, void *out, int out_bf16,
                     float *lse, int nthreads);

/* In place: o1 [M, H, G, hd] (lse l1 [M, H, G]) becomes the attention over its keys and those
 * of o2 [H, M2, G, hd] (l2 [H, M2, G]: the cascade's shared part, one matmul's layout, of which
 * the first M of each head are o1's), merged by log-sum-exp in float32: (o1 w1 + o2 w2) /
 * (w1 + w2), w = e^(l - max(l1, l2)); o1, o2 bf16 bits with bf16 = 1, else float32
 * (paged_attention.c). */
void agl_merge_lse(void *o1, const float *l1, const void *o2, const float *l2, int64_t M,
                   int64_t H, int64_t G, int64_t hd, int64_t M2, int bf16, int nthreads);

/* out [H, R, hd] = softmax(scale q k^T) v for every row of q [H, R, hd] against head h of k / v
 * [L keys ld elements apart, head h at h * hd], all bf16 bits, on AMX tiles; lse [H, R]
 * (shared_attention.c); cn > 0: a causal block of the last cn keys, rows in (token, head)
 * order with cg heads a token (R = cn cg); qg > 0: q and out laid out [R / qg, H, qg, hd]
 * (tokens first) instead of [H, R, hd]. 0; -1 without memory; -2 for hd other than 64 / 128
 * (or sizes below 1); -3 where the build or the CPU has no bf16 tiles (the caller takes
 * another path). */
int agl_attend_shared_bf16(const uint16_t *q, int64_t H, int64_t R, int64_t qg, int64_t hd,
                           const uint16_t *k, const uint16_t *v, int64_t L, int64_t ld,
                           int64_t cn, int64_t cg, float scale, uint16_t *out, float *lse,
                           int nthreads);

/* The bf16 layer's element-wise steps (glue.c): rows of n (norm) or 2 * inter (gate | up). */
void agl_rmsnorm_bf16(uint16_t *x, const uint16_t *h, const uint16_t *w, int64_t rows,
                      int64_t n, float eps, uint16_t *out, int nthreads);
void agl_silu_mul_bf16(const uint16_t *gu, int64_t rows, int64_t inter, uint16_t *out,
                       int nthreads);
void agl_rope_bf16(const uint16_t *x, int64_t T, int64_t heads, int64_t d, int64_t stride,
                   const uint16_t *cos, const uint16_t *ssin, uint16_t *out, int nthreads);

#endif
