/* rope.c: pi_rope, rotary position embedding of x f32 [n_tok, n_head, head_dim] in place.
 *
 * Pair i (i < n_rot/2) of every head of token t turns by theta = pos[t] * freq_scale * freq_base^(-2i/n_rot) / ff[i]:
 *   (a, b) -> (a cos theta - b sin theta, a sin theta + b cos theta)
 * Layouts: normal (neox == 0) pairs (x[2i], x[2i+1]); NeoX (neox != 0) pairs (x[i], x[i + n_rot/2]).
 * Dims n_rot..head_dim-1 are left as they are. ff is NULL (all 1) or f32 [n_rot/2]: per-pair frequency factors
 * (GGUF rope_freqs.weight, LLaMA 3.1+ long-context scaling; llama.cpp divides the angle by them the same way).
 * mscale multiplies cos and sin, so the rotated dims come out scaled by it (YaRN's attention factor; 1 otherwise).
 * The angles are computed in double (theta reaches thousands of radians at long contexts, where a float angle
 * would be off by ~1e-4 rad) once per token and pair block, and shared by all heads. The rotation itself is a
 * plain loop over float arrays that the compiler vectorises (AVX-512/AVX2 under -march=native, SSE2 in
 * PI_NATIVE=0 builds); the work is small next to the matmuls, so it has no hand-written SIMD variant.
 * Tokens are split across the pool only for long batches (prefill).
 */
#include <math.h>

#include "pool.h"

#define PAIR_BLOCK 256 /* pairs whose cos/sin are kept on the stack at once */
#define PAR_MIN 16384  /* n_tok * n_head * n_rot below which one thread does everything */

typedef struct {
    float *x;
    const int32_t *pos;
    int64_t n_tok, n_head, head_dim, n_rot, n_chunks;
    float freq_base, freq_scale;
    int neox;
    const float *ff;
    float mscale;
} rope_job;

static void rotate_heads(float *x, int64_t n_head, int64_t head_dim, int64_t half, int neox, int64_t i0,
                         int64_t nb, const float *c, const float *s) {
    for (int64_t h = 0; h < n_head; h++) {
        float *a = x + h * head_dim;
        if (neox) {
            float *lo = a + i0, *hi = a + half + i0;
            for (int64_t i = 0; i < nb; i++) {
                float x0 = lo[i], x1 = hi[i];
                lo[i] = x0 * c[i] - x1 * s[i];
                hi[i] = x0 * s[i] + x1 * c[i];
            }
        } else {
            float *p = a + 2 * i0;
            for (int64_t i = 0; i < nb; i++) {
                float x0 = p[2 * i], x1 = p[2 * i + 1];
                p[2 * i] = x0 * c[i] - x1 * s[i];
                p[2 * i + 1] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

static void rope_tokens(const rope_job *j, int64_t t0, int64_t t1) {
    int64_t half = j->n_rot / 2;
    double inv_freq[PAIR_BLOCK];
    float c[PAIR_BLOCK], s[PAIR_BLOCK];
    for (int64_t i0 = 0; i0 < half; i0 += PAIR_BLOCK) {
        int64_t nb = half - i0 < PAIR_BLOCK ? half - i0 : PAIR_BLOCK;
        for (int64_t i = 0; i < nb; i++)
            inv_freq[i] = (double)j->freq_scale * pow((double)j->freq_base, -2.0 * (double)(i0 + i) / (double)j->n_rot)
                          / (j->ff ? (double)j->ff[i0 + i] : 1.0);
        for (int64_t t = t0; t < t1; t++) {
            double p = (double)j->pos[t];
            for (int64_t i = 0; i < nb; i++) {
                double theta = p * inv_freq[i];
                c[i] = (float)cos(theta) * j->mscale;
                s[i] = (float)sin(theta) * j->mscale;
            }
            rotate_heads(j->x + t * j->n_head * j->head_dim, j->n_head, j->head_dim, half, j->neox, i0, nb, c, s);
        }
    }
}

static void rope_chunk(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const rope_job *j = ctx;
    rope_tokens(j, chunk * j->n_tok / j->n_chunks, (chunk + 1) * j->n_tok / j->n_chunks);
}

void pi_rope(pi_pool *pool, float *x, const int32_t *pos, int64_t n_tok, int64_t n_head, int64_t head_dim,
             int64_t n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors, float mscale) {
    rope_job j = {x, pos, n_tok, n_head, head_dim, n_rot, 1, freq_base, freq_scale, neox, freq_factors, mscale};
    int64_t per_tok = n_head * n_rot;
    if (n_tok < 2 || n_tok * per_tok < PAR_MIN || pi_pool_n_threads(pool) == 1) {
        rope_tokens(&j, 0, n_tok);
        return;
    }
    j.n_chunks = pi_pool_chunks(pool, n_tok, (PAR_MIN / 2 + per_tok - 1) / per_tok);
    pi_pool_run(pool, rope_chunk, &j, j.n_chunks);
}
