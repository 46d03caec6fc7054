/* attention_phases.h: decode_attention.h's attention for a step of few tasks.
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

typedef struct {
    aquery a[ATT_QC];
    int m;
    const float *kc, *vc;
    const int64_t *at;      /* its run's offsets, from position base */
    int64_t base;
} ptask;

/* Scores of task T's queries for keys [k0, k1) (attend_grouped's split of own and shared
 * keys, cut to the chunk) */
static void scores_chunk(ptask *T, int64_t k0, int64_t k1, int64_t hd)
{
    aquery *a = T->a;
    const int m = T->m;
    const int64_t c0 = a[m - 1].lo, c1 = a[0].n > c0 ? a[0].n : c0;
#define CLIP(lo_, hi_, f_) do { const int64_t l_ = (lo_) > k0 ? (lo_) : k0, \
        h_ = (hi_) < k1 ? (hi_) : k1; if (l_ < h_) f_; } while (0)
    for (int i = 0; i < m; i++) {
        CLIP(a[i].lo, c0 < a[i].n ? c0 : a[i].n,
             scores_each(a + i, T->kc, T->at, T->base, l_, h_, hd));
        CLIP(c1 > a[i].lo ? c1 : a[i].lo, a[i].n,
             scores_each(a + i, T->kc, T->at, T->base, l_, h_, hd));
    }
    CLIP(c0, c1, scores_shared(a, m, T->kc, T->at, T->base, l_, h_, hd));
#undef CLIP
}

/* The phases over nt tasks (hd a multiple of VL; scores buffers and offsets set). */
static void attend_phased(const agl_dims *dm, ptask *T, int64_t nt, int nthreads)
{
    const int64_t hd = dm->hd, lanes = hd >= 2 * VL ? 2 * VL : VL, nl = hd / lanes;
    const int64_t kch = nthreads;             /* key chunks a task (a window's may be empty) */
    #pragma omp parallel num_threads(nthreads)
    {
        /* chunk-major, static: a thread's keys of every head are one contiguous span */
        #pragma omp for schedule(static)
        for (int64_t w = 0; w < nt * kch; w++) {
            ptask *t = T + w % nt;
            const int64_t lo = t->a[0].lo, n = t->a[t->m - 1].n, j = w / nt;
            const int64_t step = ((n - lo + kch - 1) / kch + VL - 1) / VL * VL;
            const int64_t k0 = lo + j * step, k1 = k0 + step < n ? k0 + step : n;
            if (k0 < k1)
                scores_chunk(t, k0, k1, hd);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < nt * ATT_QC; w++)
            if (w % ATT_QC < T[w / ATT_QC].m)
                probabilities(dm, T[w / ATT_QC].a + w % ATT_QC);
        #pragma omp for schedule(static)
        for (int64_t w = 0; w < nt * nl; w++) {       /* lane-major, as the keys */
            ptask *t = T + w % nt;
            const int64_t c0 = t->a[t->m - 1].lo, c1 = t->a[0].n > c0 ? t->a[0].n : c0;
            values_lanes_any(t->a, t->m, t->vc, t->at, t->base, c0, c1, (w / nt) * lanes,
                             (int)(lanes / VL));
        }
    }
}

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
        t->kc = L->k_cache + tk->kvh * hd;
        t->vc = L->v_cache + tk->kvh * hd;
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
        attend_phased(dm, T, nt, nthreads);
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
