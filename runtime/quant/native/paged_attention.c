/* Decode attention read straight from the paged KV pool, for runtime/attention/torch_backend.py.
 *
 * A decode step appends one token to each of B sequences; each of its query heads attends to
 * its sequence's keys, read through the sequence's page table from this layer's pool
 * ([pages, page_size, nkv, hd], float32 or bfloat16 as stored). The torch path gathers every
 * sequence's pages into a padded copy and multiplies that (two more passes over the K/V and
 * a few rows a matmul); here each (sequence, KV head) is one task that reads its keys once for
 * its G query heads (GQA) and its values once:
 *
 *   s[g, t] = q_g . k_t                       (float32 sums over hd, one fixed order)
 *   p[g] = softmax(scale * s[g]),  lse[g] = log sum e^(scale * s[g])
 *   out_g = sum_t p[g, t] v_t                 (t ascending)
 *
 * The arithmetic is float32 whatever the storage (bf16 values are widened exactly; a bf16
 * output is rounded to nearest even once, at the end). A row's result depends only on its own
 * query, keys and values: not on the other rows of the step, the thread count or the batch
 * size. lse lets the caller merge this part with attention over keys it holds elsewhere (the
 * shared prefix of a cascade, runtime/attention/cascade.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "vecmath.h"

/* n values at p (float32, or bfloat16 bits when bf16) as float32 into dst */
static void widen(const void *p, int bf16, int64_t n, float *dst)
{
    if (!bf16) {
        memcpy(dst, p, sizeof(float) * (size_t)n);
        return;
    }
    const uint16_t *h = p;
    int64_t i = 0;
    for (; i + VL <= n; i += VL)
        vf_store(dst + i, vf_load_bf16(h + i));
    for (; i < n; i++) {
        const uint32_t u = (uint32_t)h[i] << 16;
        memcpy(dst + i, &u, sizeof(float));
    }
}

/* n float32 values into p (float32, or bfloat16 bits rounded to nearest even when bf16) */
static void narrow(const float *src, int64_t n, int bf16, void *p)
{
    if (!bf16) {
        memcpy(p, src, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *h = p;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof(float));
        h[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
}

/* Keys are walked page by page (no division a key): page pg of a row holds keys pg * S ..
 * pg * S + S - 1, key t0 + o at page_row(..) + o * key_step(p) bytes. */
static inline const char *page_row(const agl_paged *p, int64_t page, int64_t kvh, const void *cache)
{
    const int64_t esz = p->kv_bf16 ? 2 : 4;
    return (const char *)cache + ((page * p->page_size * p->nkv + kvh) * p->hd) * esz;
}

static inline int64_t key_step(const agl_paged *p)
{
    return p->nkv * p->hd * (p->kv_bf16 ? 2 : 4);
}

#define PAGE_KEYS(p, n, t0)  ((n) - (t0) < (p)->page_size ? (n) - (t0) : (p)->page_size)

/* Keys are asked for AHEAD keys before they are read, through the page table: a page holds
 * only page_size keys, so a fixed stride past the current key (the hardware prefetcher's, or
 * the old 4 keys on) lands in another sequence's page at each page end, and every page's first
 * keys were read from memory while the core waited. A cursor walks the table beside the loop
 * (no division a key). What it asks for a key (fetch_t): the KV head's own hd values, or the
 * key's whole slot (every KV head's: contiguous lines the hardware streams, read once for a
 * row whose heads run one after another on one core), or nothing (the slot is in cache).
 * Whole slots go to L2 (a row's keys or values fit there; into L1 they crowded out the lines
 * in use: −4 % a layer at 64 rows, bf16), a head's own lines to L1. */
#define AHEAD 16

typedef enum { FETCH_HEAD, FETCH_SLOT, FETCH_NONE } fetch_t;

typedef struct {
    const agl_paged *p;
    const int64_t *pages;
    const char *cache;
    int64_t kvh, n, bytes, t, pg, o;   /* next key to ask for: t = pg * page_size + o */
    int slot;                          /* FETCH_SLOT: into L2 */
} ahead_t;

/* asks for key a->t's bytes (when t < n) and moves on one key */
static inline __attribute__((always_inline)) void ahead_one(ahead_t *a)
{
    if (a->t >= a->n)
        return;
    const agl_paged *p = a->p;
    const char *row = page_row(p, a->pages[a->pg], a->kvh, a->cache) + a->o * key_step(p);
    if (a->slot)
        for (int64_t o = 0; o < a->bytes; o += 64)
            _mm_prefetch(row + o, _MM_HINT_T1);
    else
        for (int64_t o = 0; o < a->bytes; o += 64)
            _mm_prefetch(row + o, _MM_HINT_T0);
    a->t++;
    if (++a->o == p->page_size) {
        a->o = 0;
        a->pg++;
    }
}

/* a cursor at key 0 of cache (p->k or p->v) for KV head kvh that has asked for the first
 * AHEAD keys */
static inline ahead_t ahead_start(const agl_paged *p, const int64_t *pages, int64_t n,
                                  int64_t kvh, const void *cache, fetch_t fetch)
{
    const int64_t head = p->hd * (p->kv_bf16 ? 2 : 4);
    ahead_t a = {p, pages, cache, fetch == FETCH_SLOT ? 0 : kvh, fetch == FETCH_NONE ? 0 : n,
                 fetch == FETCH_SLOT ? head * p->nkv : head, 0, 0, 0, fetch == FETCH_SLOT};
    for (int i = 0; i < AHEAD; i++)
        ahead_one(&a);
    return a;
}

/* NV vectors of VL values at row (float32, or bf16 bits) into r */
#define LOAD_ROW(r, row, bf16, NV)                                                             \
    for (int c_ = 0; c_ < (NV); c_++)                                                          \
        r[c_] = (bf16) ? vf_load_bf16((const uint16_t *)(row) + c_ * VL)                       \
                       : vf_load((const float *)(row) + c_ * VL)

/* r = the NV vectors of the key at row, the key AHEAD on asked for meanwhile */
static inline __attribute__((always_inline)) void
load_key(vf *r, const char *row, ahead_t *a, int bf16, const int NV)
{
    ahead_one(a);
    LOAD_ROW(r, row, bf16, NV);
}

/* s[g * n + t] = q_g . k_t, hd = NV * VL: each key's vectors loaded once for the G heads */
static inline __attribute__((always_inline)) void
key_scores_nv(const agl_paged *p, const int64_t *pages, int64_t n, int64_t kvh,
              const float *qf, int64_t G, float *s, fetch_t fetch, const int NV)
{
    const int bf16 = p->kv_bf16;
    const int64_t step = key_step(p);
    ahead_t a = ahead_start(p, pages, n, kvh, p->k, fetch);
    for (int64_t t0 = 0, pg = 0; t0 < n; t0 += p->page_size, pg++) {
        const char *row = page_row(p, pages[pg], kvh, p->k);
        for (int64_t t = t0; t < t0 + PAGE_KEYS(p, n, t0); t++, row += step) {
            vf kr[NV];
            load_key(kr, row, &a, bf16, NV);
            for (int64_t g = 0; g < G; g++) {
                const float *q = qf + g * NV * VL;
                vf a = vf_mul(vf_load(q), kr[0]), b = vf_zero();
                for (int c = 1; c < NV; c++) {
                    if (c & 1)
                        b = vf_fmadd(vf_load(q + c * VL), kr[c], b);
                    else
                        a = vf_fmadd(vf_load(q + c * VL), kr[c], a);
                }
                s[g * n + t] = vf_sum(vf_add(a, b));
            }
        }
    }
}

/* acc [gn, hd] += sum_t p[g * n + t] v_t for gn heads' weights at s (row g n apart), t
 * ascending, hd = NV * VL; GN the number of heads (1..4) when known when compiled (their sums
 * stay in registers), else 0 and gn says (runtime bound: the sums live in memory) */
static inline __attribute__((always_inline)) void
weigh_group(const agl_paged *p, const int64_t *pages, int64_t n, int64_t kvh, const float *s,
            int64_t gn, float *acc, ahead_t *ah, const int NV, const int GN)
{
    const int bf16 = p->kv_bf16;
    const int64_t step = key_step(p), heads = GN ? GN : gn;
    vf a[16];
    for (int i = 0; i < 16; i++)
        a[i] = vf_zero();
    for (int64_t t0 = 0, pg = 0; t0 < n; t0 += p->page_size, pg++) {
        const char *row = page_row(p, pages[pg], kvh, p->v);
        for (int64_t t = t0; t < t0 + PAGE_KEYS(p, n, t0); t++, row += step) {
            vf vr[NV];
            load_key(vr, row, ah, bf16, NV);
            for (int64_t g = 0; g < heads; g++) {
                const vf w = vf_set1(s[g * n + t]);
                for (int c = 0; c < NV; c++)
                    a[g * NV + c] = vf_fmadd(w, vr[c], a[g * NV + c]);
            }
        }
    }
    for (int64_t g = 0; g < heads; g++)
        for (int c = 0; c < NV; c++)
            vf_store(acc + g * NV * VL + c * VL, a[g * NV + c]);
}

/* acc [G, hd] = sum_t p[g * n + t] v_t, t ascending, hd = NV * VL: up to 16 / NV heads' sums
 * in registers a pass over the values */
static inline __attribute__((always_inline)) void
weigh_values_nv(const agl_paged *p, const int64_t *pages, int64_t n, int64_t kvh,
                const float *s, int64_t G, float *acc, fetch_t fetch, const int NV)
{
    const int GB = NV >= 16 ? 1 : 16 / NV;
    for (int64_t g0 = 0; g0 < G; g0 += GB) {
        const int64_t gn = G - g0 < GB ? G - g0 : GB;
        ahead_t ah = ahead_start(p, pages, n, kvh, p->v, g0 ? FETCH_NONE : fetch);
        const float *sg = s + g0 * n;
        float *ag = acc + g0 * NV * VL;
        switch (gn) {
        case 1: weigh_group(p, pages, n, kvh, sg, 1, ag, &ah, NV, 1); break;
        case 2: weigh_group(p, pages, n, kvh, sg, 2, ag, &ah, NV, NV <= 8 ? 2 : 0); break;
        case 3: weigh_group(p, pages, n, kvh, sg, 3, ag, &ah, NV, NV <= 4 ? 3 : 0); break;
        default: weigh_group(p, pages, n, kvh, sg, gn, ag, &ah, NV, NV <= 4 ? 4 : 0);
        }
    }
}

#if VL == 16
/* bf16 queries over a bf16 pool on CPUs with AVX512_BF16 (vdpbf16ps: 32 bf16 products a
 * key chunk, summed into float32 lanes without widening the keys), hd a multiple of 32 up to
 * 256: each key's 16 lanes are summed by one transpose tree for 16 keys at once instead of a
 * horizontal sum a key and head (the scores' cost, 2 of every 3 instructions, on the old path).
 * A key's score takes the same additions wherever it sits in its block of 16, so a row's
 * result still depends on its own query and keys alone. */
#define BF16DP __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))

/* out[i] = the sum of v[i]'s 16 lanes (i < 16), by one tree whatever i: chunks (0+2, 1+3),
 * their sum, then within a chunk (e0+e2) + (e1+e3) */
BF16DP static inline __m512 lane_sums16(const __m512 *v)
{
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int j = 0; j < 4; j++)                          /* b[j]'s chunk k: key 4j + k */
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xDD));
    const __m512 q0 = _mm512_add_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
    const __m512 q1 = _mm512_add_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
    const __m512 r = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(q0), _mm512_castps_pd(q1))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(q0), _mm512_castps_pd(q1))));
    /* r[4k + j] holds key 4j + k */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, r);
}

/* s[g * n + t] = q_g . k_t for bf16 q [G, hd] and a bf16 pool, 16 keys of a page at a time;
 * NC = hd / 32 when known when compiled (the key loop unrolled), else 0 */
BF16DP static inline __attribute__((always_inline)) void
key_scores_dp_nc(const agl_paged *p, const int64_t *pages, int64_t n, int64_t kvh,
                 const uint16_t *q, int64_t G, float *s, fetch_t fetch, const int NC)
{
    const int64_t step = key_step(p), nc = NC ? NC : p->hd / 32;
    ahead_t a = ahead_start(p, pages, n, kvh, p->k, fetch);
    for (int64_t t0 = 0, pg = 0; t0 < n; t0 += p->page_size, pg++) {
        const char *page = page_row(p, pages[pg], kvh, p->k);
        const int64_t keys = PAGE_KEYS(p, n, t0);
        for (int64_t i0 = 0; i0 < keys; i0 += 16) {
            const int cnt = keys - i0 < 16 ? (int)(keys - i0) : 16;
            const char *rows = page + i0 * step;
            for (int i = 0; i < cnt; i++)
                ahead_one(&a);
            for (int64_t g = 0; g < G; g++) {
                __m512bh qv[8];
                for (int64_t c = 0; c < nc; c++)
                    qv[c] = (__m512bh)_mm512_loadu_si512(q + g * p->hd + c * 32);
                __m512 v[16];
                for (int i = 0; i < 16; i++) {
                    __m512 acc = _mm512_setzero_ps();
                    if (i < cnt)
                        for (int64_t c = 0; c < nc; c++)
                            acc = _mm512_dpbf16_ps(acc, qv[c], (__m512bh)_mm512_loadu_si512(
                                                       rows + i * step + c * 64));
                    v[i] = acc;
                }
                if (cnt == 16)     /* a masked store would not forward to the max's loads */
                    _mm512_storeu_ps(s + g * n + t0 + i0, lane_sums16(v));
                else
                    _mm512_mask_storeu_ps(s + g * n + t0 + i0, (__mmask16)((1u << cnt) - 1),
                                          lane_sums16(v));
            }
        }
    }
}

BF16DP static void key_scores_dp(const agl_paged *p, const int64_t *pages, int64_t n,
                                 int64_t kvh, const uint16_t *q, int64_t G, float *s,
                                 fetch_t fetch)
{
    switch (p->hd) {
    case 64: key_scores_dp_nc(p, pages, n, kvh, q, G, s, fetch, 2); break;
    case 128: key_scores_dp_nc(p, pages, n, kvh, q, G, s, fetch, 4); break;
    default: key_scores_dp_nc(p, pages, n, kvh, q, G, s, fetch, 0);
    }
}

/* Whether this CPU runs key_scores_dp (asked once, when the library is loaded) */
static int bf16dp_ok;

__attribute__((constructor)) static void ask_bf16dp(void)
{
    __builtin_cpu_init();
    bf16dp_ok = __builtin_cpu_supports("avx512bf16");
}
#endif

/* the same for any hd (slower: each key widened into kf, dot / axpy per head) */
static void key_scores_any(const agl_paged *p, const int64_t *pages, int64_t n, int64_t kvh,
                           const float *qf, int64_t G, float *kf, float *s)
{
    const int64_t hd = p->hd;
    for (int64_t t0 = 0, pg = 0; t0 < n; t0 += p->page_size, pg++) {
        const char *row = page_row(p, pages[pg], kvh, p->k);
        for (int64_t t = t0; t < t0 + PAGE_KEYS(p, n, t0); t++, row += key_step(p)) {
            widen(row, p->kv_bf16, hd, kf);
            for (int64_t g = 0; g < G; g++)
                s[g * n + t] = dot(qf + g * hd, kf, hd);
        }
    }
}

static void weigh_values_any(const agl_paged *p, const int64_t *pages, int64_t n, int64_t kvh,
                             const float *s, int64_t G, float *vrow, float *acc)
{
    const int64_t hd = p->hd;
    memset(acc, 0, sizeof(float) * (size_t)(G * hd));
    for (int64_t t0 = 0, pg = 0; t0 < n; t0 += p->page_size, pg++) {
        const char *row = page_row(p, pages[pg], kvh, p->v);
        for (int64_t t = t0; t < t0 + PAGE_KEYS(p, n, t0); t++, row += key_step(p)) {
            widen(row, p->kv_bf16, hd, vrow);
            for (int64_t g = 0; g < G; g++)
                axpy(acc + g * hd, s[g * n + t], vrow, hd);
        }
    }
}

/* s [n] = softmax(scale * s) in place; returns the log-sum-exp of scale * s */
static float softmax_lse(float *s, int64_t n, float scale)
{
    float m = -INFINITY;
    int64_t t = 0;
    if (n >= VL) {                        /* the max is exact in any order: VL lanes at once */
        vf vmax = vf_load(s);
        for (t = VL; t + VL <= n; t += VL)
            vmax = vf_max(vmax, vf_load(s + t));
        float lanes[VL];
        vf_store(lanes, vmax);
        for (int i = 0; i < VL; i++)
            m = lanes[i] > m ? lanes[i] : m;
    }
    for (; t < n; t++)
        m = s[t] > m ? s[t] : m;
    const vf vm = vf_set1(m), vs = vf_set1(scale);
    vf vz = vf_zero();
    for (t = 0; t + VL <= n; t += VL) {
        const vf e = vf_exp(vf_mul(vf_sub(vf_load(s + t), vm), vs));
        vf_store(s + t, e);
        vz = vf_add(vz, e);
    }
    float z = vf_sum(vz);
    for (; t < n; t++) {
        s[t] = expf((s[t] - m) * scale);
        z += s[t];
    }
    const float inv = 1.0f / z;
    for (t = 0; t < n; t++)
        s[t] *= inv;
    return scale * m + logf(z);
}

/* One (row b, KV head kvh): its G query heads' outputs and lse, asking for the keys ahead as
 * fetch says. 0, or -1 without memory. */
static int attend_head(const agl_paged *p, int64_t b, int64_t kvh, const void *q, int q_bf16,
                       void *out, int out_bf16, float *lse, fetch_t fetch)
{
    const int64_t hd = p->hd, G = p->nh / p->nkv, n = p->lens[b], h0 = kvh * G;
    const int64_t *pages = p->page_table + b * p->max_pages;
    float *buf = malloc(sizeof(float) * (size_t)(G * n + 2 * G * hd + 4 * hd));
    if (!buf)
        return -1;
    float *s = buf, *qf = s + G * n, *acc = qf + G * hd, *kf = acc + G * hd;
    const int64_t qsize = q_bf16 ? 2 : 4, osize = out_bf16 ? 2 : 4;
    const char *qrow = (const char *)q + (b * p->nh + h0) * hd * qsize;
#if VL == 16
    if (bf16dp_ok && q_bf16 && p->kv_bf16 && hd % 32 == 0 && hd <= 256)
        key_scores_dp(p, pages, n, kvh, (const uint16_t *)qrow, G, s, fetch);
    else
#endif
    {
        widen(qrow, q_bf16, G * hd, qf);
        switch (hd == 4 * VL ? 4 : hd == 8 * VL ? 8 : hd == 16 * VL ? 16 : 0) {
        case 4: key_scores_nv(p, pages, n, kvh, qf, G, s, fetch, 4); break;
        case 8: key_scores_nv(p, pages, n, kvh, qf, G, s, fetch, 8); break;
        case 16: key_scores_nv(p, pages, n, kvh, qf, G, s, fetch, 16); break;
        default: key_scores_any(p, pages, n, kvh, qf, G, kf, s);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        const float l = softmax_lse(s + g * n, n, p->scale);
        if (lse)
            lse[b * p->nh + h0 + g] = l;
    }
    switch (hd == 4 * VL ? 4 : hd == 8 * VL ? 8 : hd == 16 * VL ? 16 : 0) {
    case 4: weigh_values_nv(p, pages, n, kvh, s, G, acc, fetch, 4); break;
    case 8: weigh_values_nv(p, pages, n, kvh, s, G, acc, fetch, 8); break;
    case 16: weigh_values_nv(p, pages, n, kvh, s, G, acc, fetch, 16); break;
    default: weigh_values_any(p, pages, n, kvh, s, G, kf, acc);
    }
    narrow(acc, G * hd, out_bf16, (char *)out + (b * p->nh + h0) * hd * osize);
    free(buf);
    return 0;
}

int agl_paged_decode(const agl_paged *p, const void *q, int q_bf16, void *out, int out_bf16,
                     float *lse, int nthreads)
{
    if (p->nkv < 1 || p->nh % p->nkv || p->hd < 1 || p->page_size < 1)
        return -2;
    for (int64_t b = 0; b < p->B; b++)
        if (p->lens[b] < 1 || p->lens[b] > p->max_pages * p->page_size)
            return -2;
    int fail = 0;
    if (p->B >= 2 * (int64_t)nthreads) {
        /* a task a row: its first KV head's passes ask for whole key slots, the others find
         * them in this core's cache */
        #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) reduction(|:fail)
        for (int64_t b = 0; b < p->B; b++)
            for (int64_t kvh = 0; kvh < p->nkv; kvh++)
                fail |= attend_head(p, b, kvh, q, q_bf16, out, out_bf16, lse,
                                    kvh ? FETCH_NONE : FETCH_SLOT);
    } else {
        /* few rows: a task a (row, KV head), so every thread has work */
        #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) reduction(|:fail)
        for (int64_t j = 0; j < p->B * p->nkv; j++)
            fail |= attend_head(p, j / p->nkv, j % p->nkv, q, q_bf16, out, out_bf16, lse,
                                FETCH_HEAD);
    }
    return fail ? -1 : 0;
}

void agl_merge_lse(void *o1, const float *l1, const void *o2, const float *l2, int64_t M,
                   int64_t H, int64_t G, int64_t hd, int64_t M2, int bf16, int nthreads)
{
    const int64_t esz = bf16 ? 2 : 4;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M * H * G * hd >= 32768)
    for (int64_t r = 0; r < M * H * G; r++) {
        const int64_t m = r / (H * G), h = r / G % H, g = r % G;
        const int64_t r2 = (h * M2 + m) * G + g;           /* the same row in o2's layout */
        const float mx = l1[r] > l2[r2] ? l1[r] : l2[r2];
        const float w1 = expf(l1[r] - mx), w2 = expf(l2[r2] - mx), z = w1 + w2;
        char *x = (char *)o1 + r * hd * esz;
        const char *y = (const char *)o2 + r2 * hd * esz;
        for (int64_t d0 = 0; d0 < hd; d0 += 16) {
            const int64_t n = hd - d0 < 16 ? hd - d0 : 16;
            float a[16], b[16];
            widen(x + d0 * esz, bf16, n, a);
            widen(y + d0 * esz, bf16, n, b);
            for (int64_t i = 0; i < n; i++)
                a[i] = (a[i] * w1 + b[i] * w2) / z;
            narrow(a, n, bf16, x + d0 * esz);
        }
    }
}
