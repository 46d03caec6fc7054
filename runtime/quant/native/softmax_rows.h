/* The rows of agl_softmax_lse / agl_softmax_lse_causal (qmatmul.h), for each build's
 * softmax.c, which includes this after defining its own
 *
 *   static void softmax_row(void *s, int bf16, int64_t L, int64_t vis, float scale,
 *                           float *lse, float *scratch);
 *
 * (row s's first vis of L scores in place, the rest p = 0; scratch: L floats for a bf16
 * row's exponentials, or NULL). Rows are split across threads; a row's result depends on
 * that row alone. */
#include <stdint.h>
#include <stdlib.h>

/* s: [rows, L] float32 (bf16 = 0) or bfloat16 bits (bf16 = 1), contiguous; lse: [rows]. */
void agl_softmax_lse(void *s, int bf16, int64_t rows, int64_t L, float scale, float *lse,
                     int nthreads)
{
    agl_softmax_lse_causal(s, bf16, rows, L, 0, 1, scale, lse, nthreads);
}

/* One float32 row, no parallel region */
void agl_softmax_lse_row(float *s, int64_t L, float scale, float *lse)
{
    softmax_row(s, 0, L, L, scale, lse, NULL);
}

/* The same with a causal block's mask implied: row r (of every n * G) is token (r mod n G) / G
 * of the last n keys' block, which sees keys 0 .. L - n + that token (n = 0: every key). */
void agl_softmax_lse_causal(void *s, int bf16, int64_t rows, int64_t L, int64_t n, int64_t G,
                            float scale, float *lse, int nthreads)
{
    const int64_t esize = bf16 ? 2 : 4, R = n * G;
    /* bf16 rows keep their e^.. in a float32 row a thread (then computed once, not twice;
     * the same values either way); without memory for it they compute it again */
    #pragma omp parallel num_threads(nthreads) if (rows * L >= 32768)
    {
        float *scratch = bf16 ? malloc(sizeof(float) * (size_t)L) : NULL;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            softmax_row((char *)s + r * L * esize, bf16, L, n ? L - n + (r % R) / G + 1 : L,
                        scale, lse + r, scratch);
        free(scratch);
    }
}
