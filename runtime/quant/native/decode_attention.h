/* The attention of decode_layer.c: softmax(q k^T * scale) v of each query head of each row,
 * over its sequence's K/V read through the page table (GQA: G query heads a KV head), its
 * last `window` keys only (Gemma's sliding layers), scores capped when the model says so.
 *
 * The work is cut into tasks of up to `qc` queries that read the same keys: the query heads
 * of one KV head, of one row or of consecutive rows of a *run* (rows r - 1, r read the same
 * pages and row r one more key: a verify's or a short extend's rows of one sequence). A task
 * loads each key's K and V once for all its queries, where a task a query head would load
 * them G x rows times.
 *
 * Every query's result is bit for bit what it would be alone: each score is dot()'s
 * (vf_sum_block reduces VL of them at once through vf_sum's own tree), each softmax its own
 * row of agl_softmax_lse (agl_softmax_lse_row: no nested parallel region), each output the
 * fma of p[t] v_t in ascending t from zero, whatever the task's other queries or the thread
 * that runs it (heads of other than VL multiples of dims take the one-query path, which gives
 * the same numbers). So a row's output does not depend on the rows beside it in the step, on
 * the task cut or on the thread count. */
#ifndef AGL_DECODE_ATTENTION_H
#define AGL_DECODE_ATTENTION_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

#define ATT_QC 16        /* queries a task at most */
#define ATT_QG (VL == 16 ? 4 : 2)   /* queries whose outputs a V pass keeps in registers */
#define ATT_PHASED_KEYS 512    /* keys from which a step of few tasks attends in phases */

/* at[t - lo] = where position t's row starts in this layer's cache (K or V), in floats, for
 * positions lo..n-1 of a sequence's pages (walked page by page: no division a position; a
 * sliding layer's window starts at lo, the positions before it are not walked) */
static void row_offsets(const int32_t *pages, int64_t page_size, int64_t lo, int64_t n,
                        int64_t row, int64_t *at)
{
    for (int64_t t = lo, pg = lo / page_size, o = lo % page_size; t < n; pg++, o = 0)
        for (; o < page_size && t < n; o++, t++)
            at[t - lo] = ((int64_t)pages[pg] * page_size + o) * row;
}

#define ATT_PF 16        /* keys ahead whose K or V rows a loop fetches into L2 */

/* Fetch `lines` cache lines from p into L2 (no arithmetic: results unchanged) */
static inline __attribute__((always_inline)) void att_prefetch(const void *p, int lines)
{
    for (int l = 0; l < lines; l++)
        __builtin_prefetch((const char *)p + 64 * l, 0, 2);
}

/* One query of a task: its vector, its output, its keys lo..n-1 and its scores (s[t - lo];
 * the lse after them) */
typedef struct {
    const float *q;
    float *out;
    int64_t lo, n;
    float *s;
} aquery;

/* Query a's scores in place: capped (cap * tanh(s * scale / cap)) where the model says so,
 * then p = softmax(scale * s) with the lse after them (agl_softmax_lse_row); its output
 * zeroed for the values' fmas */
static void probabilities(const agl_dims *dm, aquery *a)
{
    const int64_t n = a->n - a->lo;
    if (dm->softcap > 0.0f) {
        for (int64_t t = 0; t < n; t++)
            a->s[t] = dm->softcap * tanhf(a->s[t] * dm->scale / dm->softcap);
        agl_softmax_lse_row(a->s, n, 1.0f, a->s + n);
    } else {
        agl_softmax_lse_row(a->s, n, dm->scale, a->s + n);
    }
    memset(a->out, 0, sizeof(float) * (size_t)dm->hd);
}

/* 1 where row r reads the keys row r - 1 reads and one more: seq_lens one more, the same
 * pages of `table` (the layer's) for all of them */
static int same_run(const agl_batch *bt, const int32_t *table, int64_t r)
{
    const int64_t n = bt->seq_lens[r];
    if (n != (int64_t)bt->seq_lens[r - 1] + 1)
        return 0;
    const int64_t pages = (n + bt->page_size - 1) / bt->page_size;
    return memcmp(table + r * bt->max_pages, table + (r - 1) * bt->max_pages,
                  sizeof(int32_t) * (size_t)pages) == 0;
}

/* A task: queries j0..j1-1 of run rows r0.. (query j: row r0 + j / G, head kvh G + j % G) */
typedef struct {
    int64_t r0, kvh, j0, j1;
} atask;

/* a[0 .. j1 - j0) = task tk's queries (query j: row r0 + j / G, head kvh G + j % G) */
static void task_queries(const agl_dims *dm, const agl_layer *L, const agl_batch *bt,
                         const float *qkv, int64_t wq, float *att, const atask *tk, aquery *a)
{
    const int64_t G = dm->nh / dm->nkv, hd = dm->hd, nq = dm->nh * hd;
    for (int64_t i = 0; i < tk->j1 - tk->j0; i++) {
        const int64_t b = tk->r0 + (tk->j0 + i) / G, h = tk->kvh * G + (tk->j0 + i) % G,
                      n = bt->seq_lens[b];
        a[i] = (aquery){qkv + b * wq + h * hd, att + b * nq + h * hd,
                        L->window && n > L->window ? n - L->window : 0, n, NULL};
    }
}

/* ptask (attention_phases.h): a task of a step attended in phases */
typedef struct {
    aquery a[ATT_QC];
    int m;
    const void *kc, *vc;    /* its KV head's first K and V element (the pool's type) */
    const int64_t *at;      /* its run's offsets, from position base */
    int64_t base;
} ptask;

/* The K/V readers for a float32 pool, then for a bfloat16 one (attention_kv.h) */
#define KVT float
#define KV(name) name##_f32
#define KV_LOAD(p) vf_load(p)
#define KV_F(x) (x)
#include "attention_kv.h"
#undef KVT
#undef KV
#undef KV_LOAD
#undef KV_F
#define KVT uint16_t
#define KV(name) name##_bf16
#define KV_LOAD(p) vf_load_bf16(p)
#define KV_F(x) bf16_f(x)
#include "attention_kv.h"
#undef KVT
#undef KV
#undef KV_LOAD
#undef KV_F

#include "attention_phases.h"     /* needs the task structs above */

/* att [B, nh * hd] = the attention of every row's query heads (qkv: [B, wq], the heads
 * first). 0, or -1 without memory. */
static int decode_attention(const agl_dims *dm, const agl_layer *L, const agl_batch *bt,
                            const float *qkv, int64_t wq, float *att, int nthreads)
{
    const int64_t B = bt->B, hd = dm->hd, G = dm->nh / dm->nkv;
    const int32_t *table = L->window && bt->wpage_table ? bt->wpage_table : bt->page_table;
    int64_t qc = B * dm->nh / (2 * (int64_t)nthreads);    /* ~2 tasks a thread (measured:
                                                             * 4 or 8 a thread were slower) */
    qc = qc < 1 ? 1 : qc > ATT_QC ? ATT_QC : qc;
    atask *tasks = malloc(sizeof(atask) * (size_t)(B * dm->nh));
    int64_t *ends = malloc(sizeof(int64_t) * (size_t)B);     /* each run's row after its last */
    if (!tasks || !ends) {
        free(tasks);
        free(ends);
        return -1;
    }
    /* phased: fewer than 4 tasks a thread with a run's queries of a KV head in one task
     * (more rows than ATT_QC / G: tasks of their own, measured no slower) */
    int64_t runs = 0, one = 1, keys = 0;
    for (int64_t r0 = 0, r1; r0 < B; r0 = r1) {
        for (r1 = r0 + 1; r1 < B && same_run(bt, table, r1); r1++)
            ;
        ends[runs++] = r1;
        one &= (r1 - r0) * G <= ATT_QC;
        keys = keys > bt->seq_lens[r1 - 1] ? keys : bt->seq_lens[r1 - 1];
    }
    const int phased = nthreads > 1 && hd % VL == 0 && one && runs * dm->nkv < 4 * nthreads &&
                       keys >= ATT_PHASED_KEYS;
    int64_t nt = 0;
    for (int64_t i = 0, r0 = 0, r1; i < runs; i++, r0 = r1) {
        r1 = ends[i];
        const int64_t nr = (r1 - r0) * G, pieces = (nr + ATT_QC - 1) / ATT_QC;
        const int64_t per = phased ? (nr + pieces - 1) / pieces : qc;
        for (int64_t kvh = 0; kvh < dm->nkv; kvh++)
            for (int64_t j = 0; j < nr; j += per)
                tasks[nt++] = (atask){r0, kvh, j, j + per < nr ? j + per : nr};
    }
    free(ends);
    int fail = 0;
    if (phased) {
        fail = attend_few(dm, L, bt, table, qkv, wq, att, tasks, nt, nthreads);
        free(tasks);
        return fail;
    }
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) reduction(|:fail)
    for (int64_t k = 0; k < nt; k++) {
        const atask *tk = tasks + k;
        aquery a[ATT_QC];
        const int m = (int)(tk->j1 - tk->j0);
        task_queries(dm, L, bt, qkv, wq, att, tk, a);
        const int64_t last = tk->r0 + (tk->j1 - 1) / G;       /* its table covers them all */
        fail |= (L->kv_bf16 ? attend_task_bf16 : attend_task_f32)(
            dm, L, bt, table + last * bt->max_pages, tk->kvh, a, m);
    }
    free(tasks);
    return fail ? -1 : 0;
}

#endif
