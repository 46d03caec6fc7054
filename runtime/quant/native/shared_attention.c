/* Attention of many query rows over one shared K/V on AMX tiles (the AMX build only), for
 * runtime/attention/cascade.py's attend_shared: a decode step whose rows share a prefix
 * attends to it once, every row of a KV head against the same keys.
 *
 * Why: that part is three small matmuls and a softmax a KV head; through torch (oneDNN's bf16
 * matmul, the native softmax) it took ~0.65 ms a layer for 64 rows x 3 heads over 1k keys,
 * ~20 ms of a 64-row bf16 decode step of the shared-prefix workload (issue 29). Here each KV
 * head's keys and values are packed once into the tiles' layouts, and each 16-row tile of
 * queries runs scores, softmax and values in one pass over L2-resident data.
 *
 * Per KV head h (q [H, R, D], k / v [L rows ld elements apart, head h at h * D], bf16):
 *
 *   s[r, l] = q_r . k_l                      (float32 tile sums, D in chunks of 32)
 *   e[r, l] = e^(scale (s - max_l s))         (float32, then rounded to bf16 for the tiles)
 *   z[r] = sum_l e[r, l],  lse[r] = scale max_l s + log z
 *   out[r] = bf16((sum_l e[r, l] v_l) / z)    (float32 tile sums, scaled once)
 *
 * A row's result depends on its own query and the keys alone (not on the other rows, the
 * thread count or R); the scores are not rounded to bf16 (torch's matmul rounds them), so
 * the bits differ from the torch path's in the last places. D must be 64 or 128. With a
 * causal block (cn > 0: rows in (token, head) order, cg heads a token, R = cn cg) row r sees
 * keys 0 .. L - cn + r / cg only: p is 0 past them, and score and value blocks past a
 * tile's last row's keys are not computed (a prefill's causal_attend).
 *
 * Layouts (tile = 16 rows x 64 bytes):
 *   kp [L16 / 16][D / 32][16 kp][16 keys] dwords: (k[l][2 kp'], k[l][2 kp' + 1]) — the B
 *      operand of q k^T (one 16 x 16 dword transpose a block of keys and chunk of D)
 *   vp [L32 / 32][D / 16][16 pairs][16 d][2] bf16: (v[2 i][d], v[2 i + 1][d]) — the B operand
 *      of p v; keys past L are zero in both.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "qmatmul.h"
#include "vecmath.h"

#ifdef AGL_AMX
#include <immintrin.h>

#define SATILE                                                                                 \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) sa_tilecfg;

/* every tile 16 rows x 64 bytes; scores: sums 0 and 2, keys 1 and 3, queries 4-7; values:
 * sums 0-3, p 4, values 5-7 */
SATILE static void sa_tiles(void)
{
    sa_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* Whether this CPU multiplies bf16 tiles and Linux lets this process use them (asked once,
 * when the library is loaded; the permission is process-wide) */
static int sa_ok;

__attribute__((constructor)) static void sa_ask(void)
{
    __builtin_cpu_init();
    sa_ok = __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("avx512bf16")
#ifdef SYS_arch_prctl
            && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
            && 0;
#endif
}

/* r[i] = the i-th column of the 16 x 16 dword matrix whose rows were r[0..15] */
SATILE static inline void transpose16(__m512i *r)
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Block blk (keys 16 blk ..) of head h's keys into kp (layout above) */
SATILE static void pack_keys(const uint16_t *k, int64_t L, int64_t ld, int64_t D, int64_t blk,
                             uint32_t *kp)
{
    const int64_t nc = D / 32;
    for (int64_t c = 0; c < nc; c++) {
        __m512i r[16];
        for (int n = 0; n < 16; n++) {
            const int64_t l = blk * 16 + n;
            r[n] = l < L ? _mm512_loadu_si512(k + l * ld + c * 32) : _mm512_setzero_si512();
        }
        transpose16(r);
        for (int i = 0; i < 16; i++)
            _mm512_storeu_si512(kp + ((blk * nc + c) * 16 + i) * 16, r[i]);
    }
}

/* Keys 32 j .. 32 j + 31 of head h's values into vp (layout above) */
SATILE static void pack_values(const uint16_t *v, int64_t L, int64_t ld, int64_t D, int64_t j,
                               uint16_t *vp)
{
    /* lo / hi: d 0..15 / 16..31 of two rows a, b interleaved: a0 b0 a1 b1 .. (words) */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const int64_t d16 = D / 16;
    for (int64_t i = 0; i < 16; i++) {
        const int64_t l = j * 32 + 2 * i;
        for (int64_t d0 = 0; d0 < D; d0 += 32) {
            const __m512i a = l < L ? _mm512_loadu_si512(v + l * ld + d0) : _mm512_setzero_si512();
            const __m512i b = l + 1 < L ? _mm512_loadu_si512(v + (l + 1) * ld + d0)
                                        : _mm512_setzero_si512();
            uint16_t *t = vp + ((j * d16 + d0 / 16) * 16 + i) * 32;   /* tile d0 / 16, row i */
            _mm512_storeu_si512(t, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(t + 512, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* chunk C (32 of D) of the two blocks' products, its queries in tile A (a literal: the tile
 * intrinsics paste it into the instruction): keys b / b2 (b2 NULL: one block left) */
#define SCORE_CHUNK(C, A)                                                                     \
    do {                                                                                      \
        _tile_loadd(1, b + (C) * 256, 64);                                                    \
        _tile_dpbf16ps(0, A, 1);                                                              \
        if (b2) {                                                                             \
            _tile_loadd(3, b2 + (C) * 256, 64);                                               \
            _tile_dpbf16ps(2, A, 3);                                                          \
        }                                                                                     \
    } while (0)

/* s [nb][16 rows][16 keys] = the 16 query rows qt [16, D] (bf16) times the packed keys, nb
 * blocks of 16 (each block's tile stored whole: 1 KB in a row, not 16 rows 4 KB apart),
 * two blocks in flight (sums in tiles 0 and 2, their keys in 1 and 3): a tile's product
 * waits for the last one on that tile, so one chain at a time left the unit idle */
SATILE static void scores(const uint16_t *qt, int64_t D, const uint32_t *kp, int64_t nb,
                          float *s)
{
    _tile_loadd(4, qt, D * 2);
    _tile_loadd(5, qt + 32, D * 2);
    if (D == 128) {
        _tile_loadd(6, qt + 64, D * 2);
        _tile_loadd(7, qt + 96, D * 2);
    }
    const int64_t nc = D / 32;
    for (int64_t blk = 0; blk < nb; blk += 2) {
        const uint32_t *b = kp + blk * nc * 256, *b2 = blk + 1 < nb ? b + nc * 256 : NULL;
        _tile_zero(0);
        _tile_zero(2);
        SCORE_CHUNK(0, 4);
        SCORE_CHUNK(1, 5);
        if (D == 128) {
            SCORE_CHUNK(2, 6);
            SCORE_CHUNK(3, 7);
        }
        _tile_stored(0, s + blk * 256, 64);
        if (b2)
            _tile_stored(2, s + blk * 256 + 256, 64);
    }
}

/* o [16, D] float32 = p [16, 32 nj] (bf16, row stride lp) times the packed values; the four
 * sums' values in tiles 5, 6, 7, 5 (a reload of a tile waits for the product reading it) */
SATILE static void values(const uint16_t *p, int64_t lp, const uint16_t *vp, int64_t nj,
                          int64_t D, float *o)
{
    const int64_t d16 = D / 16;
    for (int64_t g = 0; g < d16; g += 4) {         /* 64 of D at a time: sums in tiles 0-3 */
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t j = 0; j < nj; j++) {
            const uint16_t *b = vp + (j * d16 + g) * 512;
            _tile_loadd(4, p + j * 32, lp * 2);
            _tile_loadd(5, b, 64);
            _tile_loadd(6, b + 512, 64);
            _tile_loadd(7, b + 1024, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, b + 1536, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, o + g * 16, D * 4);
        _tile_stored(1, o + g * 16 + 16, D * 4);
        _tile_stored(2, o + g * 16 + 32, D * 4);
        _tile_stored(3, o + g * 16 + 48, D * 4);
    }
}

/* 2^t for t <= 0 (16 lanes): t = n + f, |f| <= 1/2, 2^f by its degree-6 Taylor polynomial
 * (within 2e-7 relative), scaled by 2^n (vscalefps: 0 once the result underflows) */
SATILE static inline __m512 exp2_nonpositive(__m512 t)
{
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);                 /* ln2^k / k!, k = 6 .. 0 */
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* A row's scores (float32, the first L; key l at s[(l / 16) 256 + l % 16]: its 16 in each of
 * scores()' blocks) -> p [L32] bf16 bits: e = e^(scale (s - max)) unnormalized (the caller
 * scales the row's output by 1 / z: one pass over the scores instead of three), zero past L;
 * *z = the sum of e; returns the log-sum-exp of scale s. e^x as 2^t, t one FMA of s; rounded
 * 32 at a time (vcvtne2ps2bf16: to nearest even, as torch rounds). */
SATILE static float softmax_row(const float *s, int64_t L, int64_t L32, float scale,
                                uint16_t *p, float *z)
{
    __m512 vmax = _mm512_set1_ps(-INFINITY), m1 = vmax, m2 = vmax, m3 = vmax;
    int64_t l = 0;
    for (; l + 64 <= L; l += 64) {        /* four chains: each load is a line of its own */
        vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + l * 16));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + (l + 16) * 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(s + (l + 32) * 16));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(s + (l + 48) * 16));
    }
    vmax = _mm512_max_ps(_mm512_max_ps(vmax, m1), _mm512_max_ps(m2, m3));
    for (; l + 16 <= L; l += 16)
        vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + l * 16));
    if (l < L)
        vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, (__mmask16)((1u << (L - l)) - 1),
                                                        s + l * 16));
    const float m = _mm512_reduce_max_ps(vmax), c = scale * 1.44269504f;     /* log2 e */
    const __m512 vc = _mm512_set1_ps(c), vmc = _mm512_set1_ps(-m * c);
    __m512 vz = _mm512_setzero_ps();
    for (l = 0; l < L32; l += 32) {
        __m512 e[2];
        for (int h = 0; h < 2; h++) {
            const int64_t k0 = l + 16 * h;
            const __mmask16 k = L - k0 >= 16 ? 0xFFFF
                                : L > k0 ? (__mmask16)((1u << (L - k0)) - 1) : 0;
            e[h] = k ? _mm512_maskz_mov_ps(k, exp2_nonpositive(_mm512_min_ps(
                           _mm512_fmadd_ps(_mm512_loadu_ps(s + k0 * 16), vc, vmc),
                           _mm512_setzero_ps())))
                     : _mm512_setzero_ps();
            vz = _mm512_add_ps(vz, e[h]);
        }
        _mm512_storeu_si512(p + l, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
    }
    *z = _mm512_reduce_add_ps(vz);
    return scale * m + logf(*z);
}

/* Keys row r sees: all L, or with a causal block of the last cn keys (rows in (token, head)
 * order, cg heads a token) those up to its own token's */
static inline int64_t seen(int64_t L, int64_t cn, int64_t cg, int64_t r)
{
    return cn ? L - cn + r / cg + 1 : L;
}

/* Row r of head h in q or out: [H, R, D] (qg = 0) or [R / qg, H, qg, D] (tokens first, qg rows
 * a token and head: a prefill's own layout, read and written without transposing it) */
static inline int64_t row_at(int64_t H, int64_t R, int64_t qg, int64_t D, int64_t h, int64_t r)
{
    return (qg ? ((r / qg) * H + h) * qg + r % qg : h * R + r) * D;
}

SATILE static int attend(const uint16_t *q, int64_t H, int64_t R, int64_t qg, int64_t D,
                         const uint16_t *k, const uint16_t *v, int64_t L, int64_t ld, int64_t cn,
                         int64_t cg, float scale, uint16_t *out, float *lse, int nthreads)
{
    const int64_t nb = (L + 15) / 16, nj = (L + 31) / 32, L16 = nb * 16, L32 = nj * 32;
    const int64_t tiles = (R + 15) / 16;
    uint32_t *kp = malloc(sizeof(uint16_t) * (size_t)(H * L16 * D));
    uint16_t *vp = malloc(sizeof(uint16_t) * (size_t)(H * L32 * D));
    int fail = !kp || !vp;
    if (!fail) {
        #pragma omp parallel num_threads(nthreads) reduction(|:fail)
        {
            #pragma omp for schedule(static)
            for (int64_t i = 0; i < H * nb; i++)
                pack_keys(k + (i / nb) * D, L, ld, D, i % nb, kp + (i / nb) * L16 * D / 2);
            #pragma omp for schedule(static)
            for (int64_t i = 0; i < H * nj; i++)
                pack_values(v + (i / nj) * D, L, ld, D, i % nj, vp + (i / nj) * L32 * D);
            float *s = malloc(sizeof(float) * (size_t)(16 * L16 + 16 * D));
            uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)(16 * L32 + 16 * D));
            if (!s || !buf)
                fail = 1;
            else
                sa_tiles();
            #pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < H * tiles; i++) {
                if (!s || !buf)
                    continue;
                const int64_t h = i / tiles, r0 = (i % tiles) * 16;
                const int64_t rn = R - r0 < 16 ? R - r0 : 16;
                /* keys the tile's rows see: blocks past its last row's are not computed */
                const int64_t Lt = seen(L, cn, cg, r0 + rn - 1);
                const int64_t nbt = (Lt + 15) / 16, njt = (Lt + 31) / 32;
                uint16_t *p = buf, *qt = buf + 16 * L32;
                float *o = s + 16 * L16;
                memset(qt, 0, sizeof(uint16_t) * (size_t)(16 * D));
                for (int64_t r = 0; r < rn; r++)
                    memcpy(qt + r * D, q + row_at(H, R, qg, D, h, r0 + r),
                           sizeof(uint16_t) * (size_t)D);
                scores(qt, D, kp + h * L16 * D / 2, nbt, s);
                float z[16];
                for (int64_t r = 0; r < 16; r++) {
                    const int64_t Lr = r < rn ? seen(L, cn, cg, r0 + r) : Lt;
                    const float l = softmax_row(s + r * 16, Lr, njt * 32, scale, p + r * L32,
                                                z + r);
                    if (r < rn)
                        lse[h * R + r0 + r] = l;
                }
                values(p, L32, vp + h * L32 * D, njt, D, o);
                for (int64_t r = 0; r < rn; r++) {
                    const vf inv = vf_set1(1.0f / z[r]);        /* p was not normalized */
                    for (int64_t d = 0; d < D; d += VL)
                        vf_store_bf16(out + row_at(H, R, qg, D, h, r0 + r) + d,
                                      vf_mul(vf_load(o + r * D + d), inv));
                }
            }
            if (s && buf)
                _tile_release();
            free(s);
            free(buf);
        }
    }
    free(kp);
    free(vp);
    return fail ? -1 : 0;
}
#endif

int agl_attend_shared_bf16(const uint16_t *q, int64_t H, int64_t R, int64_t qg, int64_t D,
                           const uint16_t *k, const uint16_t *v, int64_t L, int64_t ld,
                           int64_t cn, int64_t cg, float scale, uint16_t *out, float *lse,
                           int nthreads)
{
#ifdef AGL_AMX
    if (!sa_ok)
        return -3;
    if ((D != 64 && D != 128) || H < 1 || R < 1 || L < 1 || ld < H * D || cn < 0 || cn > L
        || qg < 0 || (qg && R % qg)
        || (cn && (cg < 1 || R != cn * cg)))
        return -2;
    return attend(q, H, R, qg, D, k, v, L, ld, cn, cg, scale, out, lse, nthreads);
#else
    (void)q, (void)H, (void)R, (void)qg, (void)D, (void)k, (void)v, (void)L, (void)ld;
    (void)scale;
    (void)cn, (void)cg, (void)out, (void)lse, (void)nthreads;
    return -3;
#endif
}
