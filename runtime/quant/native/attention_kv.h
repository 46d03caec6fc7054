/* attention_kv.h: the parts of decode_attention.h (and attention_phases.h) that read K/V,
 * for one storage type of the pool. decode_attention.h includes it twice: with KVT float
 * (names ending _f32) and with KVT uint16_t, bfloat16 bits (names ending _bf16; each value
 * widened exactly to float32 as it is loaded, so every sum, softmax and fma is the float32
 * arithmetic of the float32 pool, on those values). Defines before including:
 *   KVT          the element type of k_cache / v_cache
 *   KV(name)     name with the type's suffix
 *   KV_LOAD(p)   VL elements at p as a vf
 *   KV_F(x)      one element as a float
 * No include guard: it is included once per type. */

/* KV_LINES(n): the cache lines n elements span (at least one) */
#define KV_LINES(n) ((int)(((n) * (int64_t)sizeof(KVT) + 63) / 64))

/* dot(q, k) of vecmath.h with k of the pool's type: the same fmas in the same order */
static inline float KV(dot)(const float *q, const KVT *k, int64_t n)
{
    vf acc = vf_zero();
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        acc = vf_fmadd(vf_load(q + i), KV_LOAD(k + i), acc);
    float r = vf_sum(acc);
    for (; i < n; i++)
        r += q[i] * KV_F(k[i]);
    return r;
}

/* axpy(y, a, x) of vecmath.h (y += a x) with x of the pool's type */
static inline void KV(axpy)(float *y, float a, const KVT *x, int64_t n)
{
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        vf_store(y + i, vf_fmadd(vf_set1(a), KV_LOAD(x + i), vf_load(y + i)));
    for (; i < n; i++)
        y[i] += a * KV_F(x[i]);
}

/* s[t - lo] = dot(q, k_t) for t in [t0, t1) of query a (keys at kc + at[t - base]) */
static void KV(scores_each)(const aquery *a, const KVT *kc, const int64_t *at, int64_t base,
                        int64_t t0, int64_t t1, int64_t hd)
{
    for (int64_t t = t0; t < t1; t++)
        a->s[t - a->lo] = KV(dot)(a->q, kc + at[t - base], hd);
}

/* The scores of m queries over keys [c0, c1), every query's range holding them, VL keys at a
 * time: each query's VL partial vectors (dot()'s fmas) reduced together by vf_sum_block.
 * Keys past the last whole block: dot() each. hd: a multiple of VL. */
static void KV(scores_shared)(const aquery *a, int m, const KVT *kc, const int64_t *at,
                          int64_t base, int64_t c0, int64_t c1, int64_t hd)
{
    int64_t t = c0;
    for (; t + VL <= c1; t += VL) {
        const KVT *k[VL];
        for (int j = 0; j < VL; j++)
            k[j] = kc + at[t + j - base];
        if (t + ATT_PF + VL <= c1)
            for (int j = 0; j < VL; j++)
                att_prefetch(kc + at[t + ATT_PF + j - base], KV_LINES(hd));
        for (int i = 0; i < m; i++) {
            vf p[VL];
            for (int j = 0; j < VL; j++)
                p[j] = vf_zero();
            for (int64_t d = 0; d < hd; d += VL) {
                const vf qv = vf_load(a[i].q + d);
                for (int j = 0; j < VL; j++)
                    p[j] = vf_fmadd(qv, KV_LOAD(k[j] + d), p[j]);
            }
            vf_store(a[i].s + (t - a[i].lo), vf_sum_block(p));
        }
    }
    for (int i = 0; i < m; i++)
        KV(scores_each)(a + i, kc, at, base, t, c1, hd);
}

/* out += sum over t in [t0, t1) of p[t] v_t for one query, lanes [c, c + nv VL) (nv <= 4),
 * fma by fma in ascending t */
static inline __attribute__((always_inline)) void
KV(values_each_nv)(const aquery *a, const KVT *vc, const int64_t *at, int64_t base, int64_t t0,
               int64_t t1, int64_t c, const int nv)
{
    vf acc[4];
    for (int e = 0; e < nv; e++)
        acc[e] = vf_load(a->out + c + e * VL);
    for (int64_t t = t0; t < t1; t++) {
        const vf p = vf_set1(a->s[t - a->lo]);
        const KVT *v = vc + at[t - base] + c;
        for (int e = 0; e < nv; e++)
            acc[e] = vf_fmadd(p, KV_LOAD(v + e * VL), acc[e]);
    }
    for (int e = 0; e < nv; e++)
        vf_store(a->out + c + e * VL, acc[e]);
}

/* The same for m <= ATT_QG queries over keys [t0, t1) that all of them see: v_t's lanes loaded
 * once for the m */
static inline __attribute__((always_inline)) void
KV(values_group)(const aquery *a, const int m, const KVT *vc, const int64_t *at, int64_t base,
             int64_t t0, int64_t t1, int64_t c, const int nv)
{
    vf acc[ATT_QG][4];
    for (int i = 0; i < m; i++)
        for (int e = 0; e < nv; e++)
            acc[i][e] = vf_load(a[i].out + c + e * VL);
    for (int64_t t = t0; t < t1; t++) {
        if (t + ATT_PF < t1)
            att_prefetch(vc + at[t + ATT_PF - base] + c, KV_LINES(nv * VL));
        const KVT *v = vc + at[t - base] + c;
        vf vv[4];
        for (int e = 0; e < nv; e++)
            vv[e] = KV_LOAD(v + e * VL);
        for (int i = 0; i < m; i++) {
            const vf p = vf_set1(a[i].s[t - a[i].lo]);
            for (int e = 0; e < nv; e++)
                acc[i][e] = vf_fmadd(p, vv[e], acc[i][e]);
        }
    }
    for (int i = 0; i < m; i++)
        for (int e = 0; e < nv; e++)
            vf_store(a[i].out + c + e * VL, acc[i][e]);
}

_Static_assert(ATT_QG == 4 || ATT_QG == 2, "values_shared spells out 1..ATT_QG queries");

/* values_group for m queries, ATT_QG at a time (constants where inlined) */
static inline __attribute__((always_inline)) void
KV(values_shared_nv)(const aquery *a, int m, const KVT *vc, const int64_t *at, int64_t base,
                 int64_t t0, int64_t t1, int64_t c, const int nv)
{
    for (int i = 0; i < m; i += ATT_QG) {
        const int g = m - i < ATT_QG ? m - i : ATT_QG;
        if (g == 1)
            KV(values_group)(a + i, 1, vc, at, base, t0, t1, c, nv);
        else if (g == 2)
            KV(values_group)(a + i, 2, vc, at, base, t0, t1, c, nv);
#if VL == 16
        else if (g == 3)
            KV(values_group)(a + i, 3, vc, at, base, t0, t1, c, nv);
        else
            KV(values_group)(a + i, 4, vc, at, base, t0, t1, c, nv);
#endif
    }
}

/* Lanes [c, c + nv VL) of the m queries' outputs: each query's keys before the shared ones
 * [c0, c1), the shared ones together, then each query's after them; nv a constant where
 * inlined (the accumulators stay in registers) */
static inline __attribute__((always_inline)) void
KV(values_lanes)(const aquery *a, int m, const KVT *vc, const int64_t *at, int64_t base,
             int64_t c0, int64_t c1, int64_t c, const int nv)
{
    for (int i = 0; i < m; i++)
        KV(values_each_nv)(a + i, vc, at, base, a[i].lo, c0 < a[i].n ? c0 : a[i].n, c, nv);
    KV(values_shared_nv)(a, m, vc, at, base, c0, c1, c, nv);
    for (int i = 0; i < m; i++)
        KV(values_each_nv)(a + i, vc, at, base, c1 > a[i].lo ? c1 : a[i].lo, a[i].n, c, nv);
}

static void KV(values_lanes_any)(const aquery *a, int m, const KVT *vc, const int64_t *at,
                             int64_t base, int64_t c0, int64_t c1, int64_t c, int nv)
{
    if (nv == 4)
        KV(values_lanes)(a, m, vc, at, base, c0, c1, c, 4);
    else if (nv == 3)
        KV(values_lanes)(a, m, vc, at, base, c0, c1, c, 3);
    else if (nv == 2)
        KV(values_lanes)(a, m, vc, at, base, c0, c1, c, 2);
    else
        KV(values_lanes)(a, m, vc, at, base, c0, c1, c, 1);
}

/* One query alone (heads whose dims are not a multiple of VL; at: its own keys'): dot() a
 * key, then the weights' fmas in ascending t (axpy's, then the scalar tail) */
static void KV(attend_one)(const agl_dims *dm, const KVT *kc, const KVT *vc, const int64_t *at,
                       aquery *a)
{
    KV(scores_each)(a, kc, at, a->lo, a->lo, a->n, dm->hd);
    probabilities(dm, a);
    for (int64_t t = 0; t < a->n - a->lo; t++)
        KV(axpy)(a->out, a->s[t], vc + at[t], dm->hd);
}

/* The m queries together (hd a multiple of VL): each query's own keys one by one, the keys
 * all of them see [c0, c1) VL at a time, then the values 4 VL lanes at a time */
static void KV(attend_grouped)(const agl_dims *dm, const KVT *kc, const KVT *vc,
                           const int64_t *at, int64_t base, aquery *a, int m)
{
    const int64_t hd = dm->hd, c0 = a[m - 1].lo, c1 = a[0].n > c0 ? a[0].n : c0;
    for (int i = 0; i < m; i++) {
        KV(scores_each)(a + i, kc, at, base, a[i].lo, c0 < a[i].n ? c0 : a[i].n, hd);
        KV(scores_each)(a + i, kc, at, base, c1 > a[i].lo ? c1 : a[i].lo, a[i].n, hd);
    }
    KV(scores_shared)(a, m, kc, at, base, c0, c1, hd);
    for (int i = 0; i < m; i++)
        probabilities(dm, a + i);
    for (int64_t c = 0; c < hd; c += 4 * VL)
        KV(values_lanes_any)(a, m, vc, at, base, c0, c1, c,
                         (int)((hd - c < 4 * VL ? hd - c : 4 * VL) / VL));
}

/* The m queries of a task (ascending lo and n: consecutive rows of a run, a row's heads
 * together), all reading KV head kvh of `table`'s pages. 0, or -1 without memory. */
static int KV(attend_task)(const agl_dims *dm, const agl_layer *L, const agl_batch *bt,
                       const int32_t *table, int64_t kvh, aquery *a, int m)
{
    const int64_t hd = dm->hd, base = a[0].lo, top = a[m - 1].n;
    float *s = malloc(sizeof(float) * (size_t)(m * (top - base + 1)));
    int64_t *at = malloc(sizeof(int64_t) * (size_t)(top - base));
    if (s && at) {
        for (int i = 0; i < m; i++)
            a[i].s = s + i * (top - base + 1);
        row_offsets(table, bt->page_size, base, top, dm->nkv * hd, at);
        const KVT *kc = (const KVT *)L->k_cache + kvh * hd, *vc = (const KVT *)L->v_cache + kvh * hd;
        if (hd % VL)
            for (int i = 0; i < m; i++)
                KV(attend_one)(dm, kc, vc, at + (a[i].lo - base), a + i);
        else
            KV(attend_grouped)(dm, kc, vc, at, base, a, m);
    }
    const int rc = s && at ? 0 : -1;
    free(s);
    free(at);
    return rc;
}

/* Scores of task T's queries for keys [k0, k1) (attend_grouped's split of own and shared
 * keys, cut to the chunk) */
static void KV(scores_chunk)(ptask *T, int64_t k0, int64_t k1, int64_t hd)
{
    aquery *a = T->a;
    const int m = T->m;
    const int64_t c0 = a[m - 1].lo, c1 = a[0].n > c0 ? a[0].n : c0;
#define CLIP(lo_, hi_, f_) do { const int64_t l_ = (lo_) > k0 ? (lo_) : k0, \
        h_ = (hi_) < k1 ? (hi_) : k1; if (l_ < h_) f_; } while (0)
    for (int i = 0; i < m; i++) {
        CLIP(a[i].lo, c0 < a[i].n ? c0 : a[i].n,
             KV(scores_each)(a + i, (const KVT *)T->kc, T->at, T->base, l_, h_, hd));
        CLIP(c1 > a[i].lo ? c1 : a[i].lo, a[i].n,
             KV(scores_each)(a + i, (const KVT *)T->kc, T->at, T->base, l_, h_, hd));
    }
    CLIP(c0, c1, KV(scores_shared)(a, m, (const KVT *)T->kc, T->at, T->base, l_, h_, hd));
#undef CLIP
}

/* The phases over nt tasks (hd a multiple of VL; scores buffers and offsets set). */
static void KV(attend_phased)(const agl_dims *dm, ptask *T, int64_t nt, int nthreads)
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
                KV(scores_chunk)(t, k0, k1, hd);
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < nt * ATT_QC; w++)
            if (w % ATT_QC < T[w / ATT_QC].m)
                probabilities(dm, T[w / ATT_QC].a + w % ATT_QC);
        #pragma omp for schedule(static)
        for (int64_t w = 0; w < nt * nl; w++) {       /* lane-major, as the keys */
            ptask *t = T + w % nt;
            const int64_t c0 = t->a[t->m - 1].lo, c1 = t->a[0].n > c0 ? t->a[0].n : c0;
            KV(values_lanes_any)(t->a, t->m, (const KVT *)t->vc, t->at, t->base, c0, c1, (w / nt) * lanes,
                             (int)(lanes / VL));
        }
    }
}

#undef KV_LINES
