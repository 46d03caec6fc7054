/* attention_phases.h: decode_attention.h's attention for a step of few tasks (its phases,
 * scores_chunk and attend_phased, read K/V: attention_kv.h, one a pool type).
 *
 * A step of few tasks (one sequence's decode row or verify rows, a handful of sequences) cut
 * a task a thread leaves threads idle, and cut finer it reads a KV head's pages once a thread;
 * past a few hundred keys such a step is bound by those reads. So there: every task's scores
 * by chunks of keys (all threads: a thread's chunk of every head is one contiguous span of the
 * pages), then every query's softmax, then every task's values by chunks of lanes. Each K and
 * V byte is read once, the threads' shares are even, and every number is attend_grouped's: a
 * score per key is dot()'s, a softmax per query, each lane's fmas in ascending t. So a row's
 * result stays bit for bit the same whichever cut its step takes. */
#ifndef AGL_ATTENTION_PHASES_H
#define AGL_ATTENTION_PHASES_H

/* The tasks through attend_phased: each run's offsets once (from its first row's first key
 * to its last row's last), each task's scores buffer. 0, or -1 without memory. */
static int attend_few(const agl_dims *dm, const agl_layer *L, const agl_batch *bt,
                      const int32_t *table, const float *qkv, int64_t wq, float *att,
                      const atask *tasks, int64_t nt, int nthreads)
{
    const int64_t G = dm->nh / dm->nkv, hd = dm->hd;
    ptask *T = malloc(sizeof(ptask) * (size_t)nt);
    int64_t **ats = calloc((size_t)nt, sizeof(int64_t *));
    float **ss = calloc((size_t)nt, sizeof(float *));
    int fail = !T || !ats || !ss;
    for (int64_t k = 0; k < nt && !fail; k++) {
        const atask *tk = tasks + k;
        ptask *t = T + k;
        t->m = (int)(tk->j1 - tk->j0);
        task_queries(dm, L, bt, qkv, wq, att, tk, t->a);
        const int64_t first = tk->kvh * hd * (L->kv_bf16 ? 2 : 4);     /* bytes */
        t->kc = (const char *)L->k_cache + first;
        t->vc = (const char *)L->v_cache + first;
        if (k > 0 && tk->r0 == tasks[k - 1].r0 && T[k - 1].base == t->a[0].lo &&
            T[k - 1].a[T[k - 1].m - 1].n >= t->a[t->m - 1].n) {
            t->at = T[k - 1].at;                         /* the run's offsets: shared */
            t->base = T[k - 1].base;
        } else {
            const int64_t last = tk->r0 + (tk->j1 - 1) / G, lo = t->a[0].lo,
                          top = t->a[t->m - 1].n;
            fail |= !(ats[k] = malloc(sizeof(int64_t) * (size_t)(top - lo)));
            if (!fail)
                row_offsets(table + last * bt->max_pages, bt->page_size, lo, top,
                            dm->nkv * hd, ats[k]);
            t->at = ats[k];
            t->base = lo;
        }
        const int64_t span = t->a[t->m - 1].n - t->a[0].lo + 1;
        fail |= !(ss[k] = malloc(sizeof(float) * (size_t)(t->m * span)));
        for (int i = 0; i < t->m && !fail; i++)
            t->a[i].s = ss[k] + i * span;
    }
    if (!fail)
        (L->kv_bf16 ? attend_phased_bf16 : attend_phased_f32)(dm, T, nt, nthreads);
    for (int64_t k = 0; k < nt && ats && ss; k++) {
        free(ats[k]);
        free(ss[k]);
    }
    free(ats);
    free(ss);
    free(T);
    return fail ? -1 : 0;
}

#endif
