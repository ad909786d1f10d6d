/* step_delta_net.c: pi_delta_net_decode, one decode token of a gated delta-net layer (Qwen3.5, qwen35.py) after its
 * input projections, with the layer's recurrent states updated in place.
 *
 * The numpy path (qwen35.py _conv, _delta_qkv, _recur and the gated norm of _delta_net) spends most of a decode
 * token in small temporaries and in copying each layer's state S (Hv * d * d floats, 1 MB on real shapes) out of
 * the cache and back. Here every step works on the cache's own arrays:
 *   conv:   y[c] = sum_j w[c, j] * s_j[c] (s_0 .. s_{K-2} the stored inputs, oldest first, s_{K-1} = qkv), then
 *           the stored inputs shift by one position (the same oldest-first layout the prefill path reads);
 *           y = silu(y) by pi_silu (the bits of kernels.silu)
 *   q, k:   per key head x / max(|x|, eps); q also times 1/sqrt(d);  v = y's last Hv * d values
 *   gates:  beta = sigmoid(beta_raw), g = ssm_a * softplus(alpha_raw + dt_bias)
 *   per value head h (key head h mod Hk), S [d_v, d_k] row r at a time:
 *           S_r = exp(g) S_r;  delta = beta (v_r - S_r . k);  S_r = S_r + delta k;  o_r = S_r . q
 *   out:    per head rmsnorm(o) * ssm_norm (pi_rmsnorm) times silu(z) (pi_silu)
 * Element-wise steps round as numpy does (a product, then a sum; no fused multiply-add); only the sums of the dot
 * products and norms run in another order, so the result agrees with the numpy path to float rounding.
 * Threads: with split_heads the value heads are split over the pool (each head's rows are independent), else the
 * calling thread runs them all; a head's result never depends on which thread ran it, so the output is the same
 * either way and for every thread count. On the 2 cores of the development machine the split saves 2-10% of a
 * decode token when the host is quiet (Qwen3.5 small shape, 16 heads of 128; benchmarks/bench_qwen35_decode.py)
 * but lost in most A/B pairs while the host ran 4-10 other busy threads; kernels/delta_step.py turns it on.
 * Variants for the row dot products: AVX-512 (16 lanes), AVX2+FMA (8 lanes), scalar; a tail of d not a multiple
 * of the lane count runs scalar after the vector body.
 */
#include <math.h>
#include <string.h>

#include "pool.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* One row r of a head's state: s = s * eg; delta = beta (v_r - s . k); s = s + delta k; returns s . q. */
static float row_step(float *s, const float *k, const float *q, float eg, float beta, float v_r, int64_t d) {
    int64_t j = 0;
    float sk = 0.0f, sq = 0.0f;
#if defined(__AVX512F__)
    {
        __m512 e = _mm512_set1_ps(eg), a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (; j + 32 <= d; j += 32) {
            __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(s + j), e), x1 = _mm512_mul_ps(_mm512_loadu_ps(s + j + 16), e);
            _mm512_storeu_ps(s + j, x0);
            _mm512_storeu_ps(s + j + 16, x1);
            a0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(k + j), a0);
            a1 = _mm512_fmadd_ps(x1, _mm512_loadu_ps(k + j + 16), a1);
        }
        for (; j + 16 <= d; j += 16) {
            __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(s + j), e);
            _mm512_storeu_ps(s + j, x0);
            a0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(k + j), a0);
        }
        sk = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    {
        __m256 e = _mm256_set1_ps(eg), a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; j + 16 <= d; j += 16) {
            __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(s + j), e), x1 = _mm256_mul_ps(_mm256_loadu_ps(s + j + 8), e);
            _mm256_storeu_ps(s + j, x0);
            _mm256_storeu_ps(s + j + 8, x1);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k + j), a0);
            a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(k + j + 8), a1);
        }
        for (; j + 8 <= d; j += 8) {
            __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(s + j), e);
            _mm256_storeu_ps(s + j, x0);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k + j), a0);
        }
        __m256 a = _mm256_add_ps(a0, a1);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        sk = _mm_cvtss_f32(h);
    }
#endif
    for (; j < d; j++) {
        float x = s[j] * eg;
        s[j] = x;
        sk += x * k[j];
    }
    const float delta = beta * (v_r - sk);
    j = 0;
#if defined(__AVX512F__)
    {
        __m512 dl = _mm512_set1_ps(delta), a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (; j + 32 <= d; j += 32) {
            __m512 x0 = _mm512_add_ps(_mm512_loadu_ps(s + j), _mm512_mul_ps(dl, _mm512_loadu_ps(k + j)));
            __m512 x1 = _mm512_add_ps(_mm512_loadu_ps(s + j + 16), _mm512_mul_ps(dl, _mm512_loadu_ps(k + j + 16)));
            _mm512_storeu_ps(s + j, x0);
            _mm512_storeu_ps(s + j + 16, x1);
            a0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(q + j), a0);
            a1 = _mm512_fmadd_ps(x1, _mm512_loadu_ps(q + j + 16), a1);
        }
        for (; j + 16 <= d; j += 16) {
            __m512 x0 = _mm512_add_ps(_mm512_loadu_ps(s + j), _mm512_mul_ps(dl, _mm512_loadu_ps(k + j)));
            _mm512_storeu_ps(s + j, x0);
            a0 = _mm512_fmadd_ps(x0, _mm512_loadu_ps(q + j), a0);
        }
        sq = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    {
        __m256 dl = _mm256_set1_ps(delta), a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (; j + 16 <= d; j += 16) {
            __m256 x0 = _mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_mul_ps(dl, _mm256_loadu_ps(k + j)));
            __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(s + j + 8), _mm256_mul_ps(dl, _mm256_loadu_ps(k + j + 8)));
            _mm256_storeu_ps(s + j, x0);
            _mm256_storeu_ps(s + j + 8, x1);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(q + j), a0);
            a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(q + j + 8), a1);
        }
        for (; j + 8 <= d; j += 8) {
            __m256 x0 = _mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_mul_ps(dl, _mm256_loadu_ps(k + j)));
            _mm256_storeu_ps(s + j, x0);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(q + j), a0);
        }
        __m256 a = _mm256_add_ps(a0, a1);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        sq = _mm_cvtss_f32(h);
    }
#endif
    for (; j < d; j++) {
        float x = s[j] + delta * k[j];
        s[j] = x;
        sq += x * q[j];
    }
    return sq;
}

/* softplus(x) = log(1 + e^x) as numpy's logaddexp(0, x) evaluates it (no overflow for large x) */
static float softplus1(float x) {
    return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

typedef struct {
    pi_pool *pool;
    const pi_delta_net *p;
    const float *q, *k, *v, *beta, *g, *z;
    float *S, *o, *out;
    int64_t heads_per_chunk;
} delta_job;

static void delta_chunk(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const delta_job *J = ctx;
    const int64_t d = J->p->d, hk = J->p->n_k_heads, hv = J->p->n_v_heads;
    int64_t h0 = chunk * J->heads_per_chunk, h1 = h0 + J->heads_per_chunk;
    if (h1 > hv) h1 = hv;
    for (int64_t h = h0; h < h1; h++) {
        const float *kh = J->k + (h % hk) * d, *qh = J->q + (h % hk) * d, *vh = J->v + h * d;
        const float eg = expf(J->g[h]), beta = J->beta[h];
        float *Sh = J->S + h * d * d, *oh = J->o + h * d, *outh = J->out + h * d;
        for (int64_t r = 0; r < d; r++) oh[r] = row_step(Sh + r * d, kh, qh, eg, beta, vh[r], d);
        /* gated norm: one row of d values is below both kernels' threading sizes, so they run right here */
        pi_rmsnorm(J->pool, oh, J->p->ssm_norm, J->p->eps, 1, d, outh);
        pi_silu(J->pool, J->z + h * d, oh, d);
        for (int64_t j = 0; j < d; j++) outh[j] *= oh[j];
    }
}

/* y = x / max(|x|, eps) * scale over each of n rows of d values, in place (scale applied after the division,
 * as qwen35.py does) */
static void l2norm_rows(float *x, int64_t n, int64_t d, float eps, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float *r = x + i * d, ss = 0.0f;
        for (int64_t j = 0; j < d; j++) ss += r[j] * r[j];
        float nrm = sqrtf(ss);
        if (nrm < eps) nrm = eps;
        for (int64_t j = 0; j < d; j++) r[j] = r[j] / nrm * scale;
    }
}

void pi_delta_net_decode(pi_pool *pool, const pi_delta_net *p, const float *qkv, const float *z,
                         const float *beta_raw, const float *alpha_raw, float *conv_state, float *S, float *work,
                         float *out) {
    const int64_t d = p->d, hk = p->n_k_heads, hv = p->n_v_heads, K = p->conv_kernel;
    const int64_t conv_dim = 2 * hk * d + hv * d;
    float *y = work, *beta = work + conv_dim, *g = beta + hv, *o = g + hv;
    /* causal conv over the K-1 stored inputs and this one, in tap order, a product then a sum per tap */
    for (int64_t c = 0; c < conv_dim; c++) {
        const float *w = p->conv_w + c * K;
        float acc = conv_state[c] * w[0];
        for (int64_t j = 1; j < K - 1; j++) acc = acc + conv_state[j * conv_dim + c] * w[j];
        y[c] = acc + qkv[c] * w[K - 1];
    }
    memmove(conv_state, conv_state + conv_dim, (size_t)((K - 2) * conv_dim) * sizeof(float));
    memcpy(conv_state + (K - 2) * conv_dim, qkv, (size_t)conv_dim * sizeof(float));
    pi_silu(pool, y, y, conv_dim);
    l2norm_rows(y, hk, d, p->eps, (float)(1.0 / sqrt((double)d)));
    l2norm_rows(y + hk * d, hk, d, p->eps, 1.0f);
    for (int64_t h = 0; h < hv; h++) {
        beta[h] = 1.0f / (1.0f + expf(-beta_raw[h]));
        g[h] = p->ssm_a[h] * softplus1(alpha_raw[h] + p->dt_bias[h]);
    }
    delta_job J = {pool, p, y, y + hk * d, y + 2 * hk * d, beta, g, z, S, o, out, 1};
    /* split: one head per chunk, the threads take them in turn; else every head on this thread */
    int64_t n_chunks = hv;
    if (!p->split_heads || pi_pool_n_threads(pool) == 1) n_chunks = 1, J.heads_per_chunk = hv;
    pi_pool_run(pool, delta_chunk, &J, n_chunks);
}
