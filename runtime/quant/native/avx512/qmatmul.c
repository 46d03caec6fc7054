/* Matmuls over GGUF-style quantized blocks, for x86-64 with AVX-512 VNNI.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k], with w kept as 32-weight blocks, every weight row of kb
 * blocks (kb even; a padding block is zero quants and scales, so it adds exact zeros), read a
 * group of 4 blocks (128 weights) at a time as two 64-byte vectors, A (weights 0..15 of blocks
 * 0..3, block b at bytes 16b..16b+15) and B (weights 16..31); when kb % 4 == 2 the last group
 * has 2 blocks, read as 256-bit halves (a 576-wide row: 18 blocks, not 20):
 *   Q4 (Q4_0, Q4_1): w = q * d + mn, q in 0..15, the file's 64 bytes: A in the low nibbles,
 *        B in the high ones (Q4_1: mn = m; Q4_0: mn = -8 d)
 *   Q8 (Q8_0):       w = q * d, 128 int8 (64 in a half group): A then B (block_linear.py
 *        permutes the file's bytes into this order at load)
 * d, m: float16 bits, one a block, as in the file. The K-quants (Q4_K, Q5_K, Q6_K) and Q5_0 /
 * Q5_1, in the AVX2 build's layout: kgroups.h. Q4_K, Q5_K and Q5 multiply as Q4 does (unsigned
 * quants, a min term); Q6_K as Q8 does, but with the A and B planes' sums apart (each half
 * block has its own step). A chain of weights (qmatmul.h's next) fills its own columns.
 *
 * Each input row is first quantized to 16 bits, a step a block (d = max|x| / 32767,
 * q = round(x / d), to nearest even), kept as two byte planes in the same A / B order:
 * q = 256 h + l, h signed, l unsigned. A group's integer sum q_w . q_x is then exact in int32:
 * 256 (q_w . h) + q_w . l by four vpdpbusd (unsigned x signed bytes; Q8's q_w . h as
 * (q_w + 128) . h - 128 sum(h), the correction kept per row). Its int32 lanes 4b..4b+3 belong
 * to block b; it is scaled in float32 by the two blocks' steps and summed in a fixed order: a
 * row's output depends on that row only, never on how many rows a call has (every tile
 * computes each output with exactly the row kernel's operations) or on the threads (OpenMP,
 * the runtime torch uses too, splits the output columns). A group's integer sum stays below
 * 2^24 for Q4 (exact in float32); for Q8 it may reach 2^25 (one rounding, relative 2^-24).
 * The AMX build (-DAGL_AMX) keeps the kinds of qmatmul.h's agl_panel_kind in panels and
 * multiplies them by panel.h.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qmatmul.h"
#include "kgroups.h"
#ifdef AGL_AMX
#include "panel.h"      /* the AMX build: its panel kinds in panels (its own layout) */
#endif

#define QK 32
#define GB 448      /* activation bytes a group: planes hA hB lA lB (64 each), the signed
                     * kinds' corrections: Q8's (both planes), Q6_K's A plane's, B plane's */
#define MR 4        /* activation rows of a tile */
#define NR 4        /* weight rows of a tile */
#define TILE_N 16   /* output columns a task step: their weights stay in L1 across the rows */
#ifndef BLOCK_BYTES
#define BLOCK_BYTES 262144  /* weight bytes (quants) a pass over the chunks of rows: they stay
                             * in L2 while every row streams past them (0-5 % at 64 rows) */
#endif
#define CHUNK_BYTES 24576   /* activations a pass (rows of kg * GB bytes): they stay in L1 while
                             * a thread's weights stream past them from L2 */
#define QMAX 32767.0f
#define PF_ROWS 4   /* prefetch_ahead's distance in weight rows (2..16 measured alike) */
_Static_assert(MR * NR == 16, "a tile's outputs are the 16 lanes of hsum16");

/* 16 values as 16-bit q: high bytes at h, low bytes at l; returns q as int32 */
static inline __m512i split16(__m512 v, float id, int8_t *h, uint8_t *l)
{
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)h, _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 8)));
    _mm_storeu_si128((__m128i *)l, _mm512_cvtepi32_epi8(q));
    return q;
}

/* Row x's nb blocks into kg = ceil(kb / 4) groups of GB bytes at a: planes hA hB lA lB
 * (block b of a group at 16b of each) and the corrections -128 * (the sum of h over each int32
 * lane's bytes), int32 x 16: of hA and hB together (Q8), of hA, of hB (Q6_K); each block's step spread over its 4 lanes at xd (16 floats a
 * group) and the step times the block's sum of q at xs (Q4's minimum term; 4 a group). Blocks
 * from nb to 4 kg: zero. */
static void quantize_row(const float *x, int64_t nb, int64_t kg, uint8_t *a, float *xd,
                         float *xs)
{
    if (nb < 4 * kg)
        memset(a, 0, (size_t)(kg * GB));
    for (int64_t b = 0; b < nb; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / QMAX, id = amax > 0.0f ? QMAX / amax : 0.0f;
        uint8_t *g = a + (b / 4) * GB, o = (uint8_t)(16 * (b % 4));
        __m512i q0 = split16(v0, id, (int8_t *)g + o, g + 128 + o);
        __m512i q1 = split16(v1, id, (int8_t *)g + 64 + o, g + 192 + o);
        float *sd = xd + (b / 4) * 16 + (b % 4) * 4;
        sd[0] = sd[1] = sd[2] = sd[3] = d;
        xs[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
    for (int64_t b = nb; b < 4 * kg; b++) {
        float *sd = xd + (b / 4) * 16 + (b % 4) * 4;
        sd[0] = sd[1] = sd[2] = sd[3] = xs[b] = 0.0f;
    }
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < kg; g++) {
        uint8_t *p = a + g * GB;
        const __m512i sa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(p));
        const __m512i sb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(p + 64));
        const __m512i c = _mm512_set1_epi32(-128);
        _mm512_storeu_si512(p + 256, _mm512_mullo_epi32(_mm512_add_epi32(sa, sb), c));
        _mm512_storeu_si512(p + 320, _mm512_mullo_epi32(sa, c));
        _mm512_storeu_si512(p + 384, _mm512_mullo_epi32(sb, c));
    }
}

/* q_w . q_x of one group (lanes 4b..4b+3: block b), a = the row's group (GB bytes) */
static inline __m512i products_q4(__m512i wa, __m512i wb, const uint8_t *a)
{
    __m512i ph = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, _mm512_loadu_si512(a));
    ph = _mm512_dpbusd_epi32(ph, wb, _mm512_loadu_si512(a + 64));
    __m512i p = _mm512_dpbusd_epi32(_mm512_slli_epi32(ph, 8), _mm512_loadu_si512(a + 128), wa);
    return _mm512_dpbusd_epi32(p, _mm512_loadu_si512(a + 192), wb);
}

/* the same for Q8: wa, wb signed, ua, ub = w + 128 (unsigned) */
static inline __m512i products_q8(__m512i wa, __m512i wb, __m512i ua, __m512i ub,
                                  const uint8_t *a)
{
    __m512i ph = _mm512_dpbusd_epi32(_mm512_loadu_si512(a + 256), ua, _mm512_loadu_si512(a));
    ph = _mm512_dpbusd_epi32(ph, ub, _mm512_loadu_si512(a + 64));
    __m512i p = _mm512_dpbusd_epi32(_mm512_slli_epi32(ph, 8), _mm512_loadu_si512(a + 128), wa);
    return _mm512_dpbusd_epi32(p, _mm512_loadu_si512(a + 192), wb);
}

/* Q6_K's sum over one plane of a group (h, l its high and low bytes, c its correction): w
 * signed, u = w + 128 */
static inline __m512i products_plane_s8(__m512i w, __m512i u, const uint8_t *h, const uint8_t *l,
                                        const uint8_t *c)
{
    __m512i ph = _mm512_dpbusd_epi32(_mm512_loadu_si512(c), u, _mm512_loadu_si512(h));
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(ph, 8), _mm512_loadu_si512(l), w);
}

/* products_q4 and products_q8 of a half group (2 blocks, lanes 4b..4b+3 of 8) */
static inline __m256i products_q4_half(__m256i wa, __m256i wb, const uint8_t *a)
{
    __m256i ph = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, _mm256_loadu_si256((const __m256i *)a));
    ph = _mm256_dpbusd_epi32(ph, wb, _mm256_loadu_si256((const __m256i *)(a + 64)));
    __m256i p = _mm256_dpbusd_epi32(_mm256_slli_epi32(ph, 8),
                                    _mm256_loadu_si256((const __m256i *)(a + 128)), wa);
    return _mm256_dpbusd_epi32(p, _mm256_loadu_si256((const __m256i *)(a + 192)), wb);
}

static inline __m256i products_q8_half(__m256i wa, __m256i wb, __m256i ua, __m256i ub,
                                       const uint8_t *a)
{
    __m256i ph = _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)(a + 256)), ua,
                                     _mm256_loadu_si256((const __m256i *)a));
    ph = _mm256_dpbusd_epi32(ph, ub, _mm256_loadu_si256((const __m256i *)(a + 64)));
    __m256i p = _mm256_dpbusd_epi32(_mm256_slli_epi32(ph, 8),
                                    _mm256_loadu_si256((const __m256i *)(a + 128)), wa);
    return _mm256_dpbusd_epi32(p, _mm256_loadu_si256((const __m256i *)(a + 192)), wb);
}

static inline __m512 half4(const uint16_t *h)   /* 4 float16 → [h0 x4, h1 x4, h2 x4, h3 x4] */
{
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m128 v = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

static inline __m256 half2(const uint16_t *h)  /* 2 float16 → [h0 x4, h1 x4] */
{
    const __m256i idx = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
    int32_t two;
    memcpy(&two, h, sizeof two);
    return _mm256_permutexvar_ps(idx, _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(two))));
}

/* The sum of v's 16 lanes in a fixed order: ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)),
 * s_i = v_i + v_(i+8). hsum16 computes the same sums for 16 vectors at once. */
static inline float hsum(__m512 v)
{
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));                    /* u0 + u2, u1 + u3 */
    return _mm_cvtss_f32(t) + _mm_cvtss_f32(_mm_movehdup_ps(t));
}

/* Lane 4 i + j of the result: hsum(v[4 j + i]) (the same operations, 16 sums at once). */
static inline __m512 hsum16(const __m512 v[16])
{
    __m512 w[8], x[4], y[2];
    for (int k = 0; k < 8; k++)            /* halves: v[2k] + its high half, v[2k+1] likewise */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++)            /* quarter q of x[k]: v[4k + q]'s u0..u3 */
        x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++)            /* u0 + u2, u1 + u3 */
        y[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * k]),
                                                                 _mm512_castps_pd(x[2 * k + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * k]),
                                                                 _mm512_castps_pd(x[2 * k + 1]))));
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
}

/* The minimum term of outputs (i, j) of the kinds with one, as lanes: sum over blocks b of
 * mn[j][b] * xs[i][b] (kgroups.h's block_mins: Q4 m or -8 d), 16 blocks a vector, into t[i][j]. */
static inline __attribute__((always_inline)) void
min_terms(const agl_qweight *w, int kind, const float *xs, int64_t kg, int64_t m, int mr,
          int64_t n, int nr, __m512 t[MR][NR])
{
    const int64_t kb = w->kb;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            t[i][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < kb; c += 16) {
        __mmask16 k = kb - c >= 16 ? 0xFFFF : (__mmask16)((1u << (kb - c)) - 1);
        __m512 mn[NR], x[MR];
        for (int j = 0; j < nr; j++)
            mn[j] = block_mins(w, kind, n + j, c);
        for (int i = 0; i < mr; i++)
            x[i] = _mm512_maskz_loadu_ps(k, xs + (m + i) * kg * 4 + c);
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++)
                t[i][j] = _mm512_fmadd_ps(mn[j], x[i], t[i][j]);
    }
}

/* The quantized activations of a call: row r's kg groups at q + r * kg * GB, its spread
 * steps at xd + r * kg * 16, its block sums at xs + r * kg * 4. */
typedef struct {
    const uint8_t *q;
    const float *xd, *xs;
} qact;

/* The quants of group g of weight row r + PF_ROWS into L2: the next tile's, as the hardware
 * prefetcher does not fetch several interleaved rows early enough at batch 1 (measured on a
 * 2-core Zen 4: a Q4_K / Q4_0 row 1.3-1.9x faster with it, near the machine's stream rate) */
static inline __attribute__((always_inline)) void
prefetch_ahead(const agl_qweight *w, int kind, int64_t r, int64_t g)
{
    const int bytes = 4 * agl_quant_bytes(kind);                      /* a group's quants */
    const char *p = (const char *)w->qs + (r + PF_ROWS) * w->kb * (bytes / 4) + g * bytes;
    _mm_prefetch(p, _MM_HINT_T1);      /* into L2: measured 1.1-1.3x faster than into L1 */
    if (bytes == 128)
        _mm_prefetch(p + 64, _MM_HINT_T1);
}

/* out[i][j] = row m + i of x times weight row n + j, for i < mr, j < nr. Every output gets the
 * same operations in the same order whatever mr and nr are (constants where it is inlined). */
static inline __attribute__((always_inline)) void
tile(const agl_qweight *w, int kind, const qact *a, int64_t m, int mr, int64_t n, int nr,
     int pf, float out[MR][NR])
{
    const int64_t kb = w->kb, kg = (kb + 3) / 4, arow = kg * GB;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), sign = _mm512_set1_epi8((char)0x80);
    __m512 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            acc[i][j] = _mm512_setzero_ps();
    /* the groups of 4 blocks, then (Q5, kb % 4 == 2) a last group of 2, full width */
    const int64_t groups = kind == AGL_Q5 ? kg : kb / 4;
    for (int64_t g = 0; g < groups; g++)
        for (int j = 0; j < nr; j++) {
            __m512i wa, wb, ua = _mm512_setzero_si512(), ub = ua;
            __m512 ws, ws2;
            if (pf)                           /* few rows: the weights stream from memory */
                prefetch_ahead(w, kind, n + j, g);
            if (kind == AGL_Q4) {
                __m512i v = _mm512_loadu_si512((const uint8_t *)w->qs + (n + j) * kb * 16 + g * 64);
                wa = _mm512_and_si512(v, lo4);
                wb = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                ws = ws2 = half4(w->d + (n + j) * kb + g * 4);
            } else if (kind == AGL_Q8) {
                const int8_t *p = (const int8_t *)w->qs + (n + j) * kb * QK + g * 128;
                wa = _mm512_loadu_si512(p);
                wb = _mm512_loadu_si512(p + 64);
                ua = _mm512_xor_si512(wa, sign);
                ub = _mm512_xor_si512(wb, sign);
                ws = ws2 = half4(w->d + (n + j) * kb + g * 4);
            } else {
                const int nblocks = kb - 4 * g < 4 ? (int)(kb - 4 * g) : 4;
                if (kind == AGL_Q6_K) {
                    q6_group(w, n + j, g, &wa, &wb);
                    ua = _mm512_xor_si512(wa, sign);
                    ub = _mm512_xor_si512(wb, sign);
                } else {
                    nibble_group(w, kind, n + j, g, nblocks, &wa, &wb);
                }
                group_steps(w, kind, n + j, g, nblocks, &ws, &ws2);
            }
            for (int i = 0; i < mr; i++) {
                const uint8_t *x = a->q + (m + i) * arow + g * GB;
                const __m512 xd = _mm512_loadu_ps(a->xd + (m + i) * kg * 16 + g * 16);
                if (kind == AGL_Q6_K) {            /* each plane with its halves' steps */
                    __m512i pa = products_plane_s8(wa, ua, x, x + 128, x + 320);
                    __m512i pb = products_plane_s8(wb, ub, x + 64, x + 192, x + 384);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pa), _mm512_mul_ps(ws, xd), acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pb), _mm512_mul_ps(ws2, xd), acc[i][j]);
                    continue;
                }
                __m512i p = kind == AGL_Q8 ? products_q8(wa, wb, ua, ub, x) : products_q4(wa, wb, x);
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws, xd), acc[i][j]);
            }
        }
    if ((kind == AGL_Q4 || kind == AGL_Q8) && kb % 4)            /* the half group */
        for (int j = 0; j < nr; j++) {
            const int64_t g = kb / 4;
            const __m256i lo4h = _mm512_castsi512_si256(lo4), signh = _mm512_castsi512_si256(sign);
            __m256i wa, wb, ua = _mm256_setzero_si256(), ub = ua;
            if (kind == AGL_Q4) {
                __m256i v = _mm256_loadu_si256((const __m256i *)((const uint8_t *)w->qs + (n + j) * kb * 16 + g * 64));
                wa = _mm256_and_si256(v, lo4h);
                wb = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4h);
            } else {
                const int8_t *p = (const int8_t *)w->qs + (n + j) * kb * QK + g * 128;
                wa = _mm256_loadu_si256((const __m256i *)p);
                wb = _mm256_loadu_si256((const __m256i *)(p + 32));
                ua = _mm256_xor_si256(wa, signh);
                ub = _mm256_xor_si256(wb, signh);
            }
            __m256 ws = half2(w->d + (n + j) * kb + g * 4);
            for (int i = 0; i < mr; i++) {
                const uint8_t *x = a->q + (m + i) * arow + g * GB;
                __m256i p = kind == AGL_Q4 ? products_q4_half(wa, wb, x)
                                           : products_q8_half(wa, wb, ua, ub, x);
                __m256 sc = _mm256_mul_ps(ws, _mm256_loadu_ps(a->xd + (m + i) * kg * 16 + g * 16));
                acc[i][j] = _mm512_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(p)),
                                            _mm512_zextps256_ps512(sc), acc[i][j]);
            }
        }
    __m512 t[MR][NR];                      /* the minimum term of each output */
    if (agl_has_min(kind))
        min_terms(w, kind, a->xs, kg, m, mr, n, nr, t);
    if (mr == 1 && nr == 1) {
        out[0][0] = agl_has_min(kind) ? hsum(acc[0][0]) + hsum(t[0][0]) : hsum(acc[0][0]);
        return;
    }
    __m512 v[16], u[16];                   /* output (i, j) at 4 j + i: lane 4 i + j of hsum16 */
    for (int o = 0; o < 16; o++)
        v[o] = u[o] = _mm512_setzero_ps();
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            v[4 * j + i] = acc[i][j];
            if (agl_has_min(kind))
                u[4 * j + i] = t[i][j];
        }
    __m512 s = hsum16(v);
    if (agl_has_min(kind))
        s = _mm512_add_ps(s, hsum16(u));
    _mm512_storeu_ps(&out[0][0], s);
}

/* y[m][n] (row stride ldy) = v + bias, or += that with accumulate */
static inline void store(const agl_qweight *w, float *y, int64_t ldy, int64_t m, int64_t n,
                         float v, int accumulate)
{
    if (w->bias)
        v += w->bias[n];
    y[m * ldy + n] = accumulate ? y[m * ldy + n] + v : v;
}

#define TILE_ROWS(kind, rows)                                                            \
    do {                                                                                 \
        if (nr == NR) tile(w, kind, a, m, rows, n, NR, pf, v);                           \
        else tile(w, kind, a, m, rows, n, 1, pf, v);                                     \
    } while (0)
#define TILES(kind)                                                                      \
    do {                                                                                 \
        if (mr == 4) TILE_ROWS(kind, 4);                                                 \
        else if (mr == 3) TILE_ROWS(kind, 3);                                            \
        else if (mr == 2) TILE_ROWS(kind, 2);                                            \
        else TILE_ROWS(kind, 1);                                                         \
    } while (0)
_Static_assert(MR == 4, "TILES spells out 1..MR rows");

/* rows m.. and columns n.. of y: mr in 1..MR rows by nr in {NR, 1} columns */
static void run_tile(const agl_qweight *w, const qact *a, int64_t m, int mr, int64_t n, int nr,
                     int pf, float *y, int64_t ldy, int accumulate)
{
    float v[MR][NR];
    switch (w->kind) {                   /* each kind its own inlined copies */
    case AGL_Q4: TILES(AGL_Q4); break;
    case AGL_Q5: TILES(AGL_Q5); break;
    case AGL_Q4_K: TILES(AGL_Q4_K); break;
    case AGL_Q5_K: TILES(AGL_Q5_K); break;
    case AGL_Q6_K: TILES(AGL_Q6_K); break;
    default: TILES(AGL_Q8);
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            store(w, y, ldy, m + i, n + j, v[i][j], accumulate);
}

/* One weight of a chain: its N columns of y (row stride ldy), all M rows */
static void weight_matmul(const agl_qweight *w, const qact *a, int64_t M, int64_t kg, float *y,
                          int64_t ldy, int accumulate, int nthreads)
{
    const int64_t N = w->n, tiles = (N + TILE_N - 1) / TILE_N;
    const int64_t fit = CHUNK_BYTES / (kg * GB) / MR * MR, chunk = fit > MR ? fit : MR;
    const int64_t row_bytes = w->kb * agl_quant_bytes(w->kind);
    const int64_t blk = BLOCK_BYTES / row_bytes / TILE_N * TILE_N, cols = blk > TILE_N ? blk : TILE_N;
    const int pf = M <= 2 * MR;          /* the weights used by one or two chunks of rows */
    /* 8-bit weights under MR rows: one weight row at a time (4 interleaved 128-byte streams
     * measured 1.8x slower at batch 1: the prefetcher loses them); 4-bit rows gain from 4 */
    const int wide = M >= MR || agl_quant_bytes(w->kind) == 16;
    #pragma omp parallel num_threads(nthreads)
    {   /* each thread a contiguous range of column tiles, cols columns (weights that stay in
         * L2) at a time, and over those chunk rows (activations that stay in L1) at a time */
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t c0 = tiles * tid / nth * TILE_N, t1 = tiles * (tid + 1) / nth * TILE_N;
        const int64_t c1 = t1 < N ? t1 : N;
        for (int64_t b0 = c0; b0 < c1; b0 += cols) {
            const int64_t b1 = b0 + cols < c1 ? b0 + cols : c1;
            for (int64_t m0 = 0; m0 < M; m0 += chunk) {
                const int64_t m1 = m0 + chunk < M ? m0 + chunk : M;
                for (int64_t n = b0; n < b1;) {
                    const int nr = wide && n % TILE_N + NR <= TILE_N && n + NR <= N ? NR : 1;
                    for (int64_t m = m0; m < m1;) {
                        const int mr = m + MR <= m1 ? MR : (int)(m1 - m);   /* a call's 2, 3
                                                   * rows (a speculative verify): one tile */
                        run_tile(w, a, m, mr, n, nr, pf, y, ldy, accumulate);
                        m += mr;
                    }
                    n += nr;
                }
            }
        }
    }
}

/* 1 where w's layout is panel.h's (the AMX build's panel kinds), else 0 */
static inline int in_panels(const agl_qweight *w)
{
#ifdef AGL_AMX
    return agl_panel_kind(w->kind);
#else
    (void)w;
    return 0;
#endif
}

#ifdef AGL_AMX
/* Rows r0..r1-1 of a weight in panels as bfloat16 (dequant.c's agl_dequant_bf16 for them) */
void agl_panel_dequant_bf16(const agl_qweight *w, int64_t r0, int64_t r1, uint16_t *out,
                            int nthreads)
{
    panel_dequant_bf16(w, r0, r1, out, nthreads);
}

/* 1 where this process may run AMX tiles (the build is usable), else 0 */
int agl_amx_ready(void)
{
    return panel_amx_ok;
}

/* The panel parts of the chain w: their activations quantized (panel.h), then each its columns
 * of y. 0, -1 without memory. */
static int panel_parts(const agl_qweight *w, const float *x, int64_t M, float *y, int64_t ldy,
                       int accumulate, int nthreads)
{
    const int64_t K = w->k, nb = K / QK, kb = w->kb;
    const int64_t t = panel_tile_rows(M), rows = (M + t - 1) / t * t;    /* the tiles' */
    int tiles = 0, vnni = 0;             /* the paths the parts take (panel_matmul's rule) */
    for (const agl_qweight *v = w; v; v = v->next)
        if (in_panels(v))
            *(panel_uses_amx(v, M) ? &tiles : &vnni) = 1;
    uint8_t *q = tiles ? malloc((size_t)(rows * kb * PBLK)) : NULL;
    int16_t *q16 = vnni ? malloc((size_t)(M * kb * 64)) : NULL;
    float *dx = malloc(sizeof(float) * (size_t)(M * kb) * 2);     /* dx, xs */
    if ((tiles && !q) || (vnni && !q16) || !dx) { free(q); free(q16); free(dx); return -1; }
    float *xs = dx + M * kb;
    const int64_t work = M * K;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1 && work > 65536)
    for (int64_t m = 0; m < M; m++)
        quantize_panel_row(x + m * K, nb, kb, q ? q + m * kb * PBLK : NULL,
                           q16 ? q16 + m * kb * 32 : NULL, dx + m * kb, xs + m * kb);
    const pact act = {q, q16, dx, xs, kb};
    int rc = 0;
    for (int64_t col = 0; w && !rc; col += w->n, w = w->next)
        if (in_panels(w))
            rc = panel_matmul(w, &act, M, y + col, ldy, accumulate, nthreads);
    free(q);
    free(q16);
    free(dx);
    return rc;
}
#endif

int agl_qmm(const agl_qweight *w, const float *x, int64_t M, float *y, int accumulate,
            int nthreads)
{
    const int64_t K = w->k, nb = K / QK, kg = (w->kb + 3) / 4;
    int64_t ldy = 0;                     /* y's row stride: the chain's output columns */
    int rows_layout = 0, panels = 0;     /* some part in qmatmul.c's layout, in panel.h's */
    for (const agl_qweight *p = w; p; p = p->next) {
        if (!agl_known_kind(p->kind))
            return -2;
        ldy += p->n;
        rows_layout |= !in_panels(p);
        panels |= in_panels(p);
    }
    if (M <= 0)                          /* no rows (a step without logits rows): */
        return 0;                        /* nothing to do (the tile split divides by M) */
#ifdef AGL_AMX
    if (panels && panel_parts(w, x, M, y, ldy, accumulate, nthreads))
        return -1;
#else
    (void)panels;
#endif
    if (!rows_layout)
        return 0;
    const int64_t work = M * ldy * K;
    uint8_t *q = malloc((size_t)(M * kg * GB));
    float *xd = malloc(sizeof(float) * (size_t)(M * kg) * 20);   /* 16 spread steps + 4 sums */
    if (!q || !xd) { free(q); free(xd); return -1; }
    float *xs = xd + M * kg * 16;
    const qact act = {q, xd, xs};
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (M > 1 && work > 65536)
    for (int64_t m = 0; m < M; m++)
        quantize_row(x + m * K, nb, kg, q + m * kg * GB, xd + m * kg * 16, xs + m * kg * 4);
    for (int64_t col = 0; w; col += w->n, w = w->next)        /* each part its columns */
        if (!in_panels(w))
            weight_matmul(w, &act, M, kg, y + col, ldy, accumulate, nthreads);
    free(q);
    free(xd);
    return 0;
}

/* y = x @ w.T (+ bias): x float32 [M, k], y float32 [M, n]. 0, or -1 without memory. */
int agl_qmatmul(const agl_qweight *w, const float *x, int64_t M, float *y, int nthreads)
{
    return agl_qmm(w, x, M, y, 0, nthreads);
}
