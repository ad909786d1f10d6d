/* ssm_scan.c: pi_ssm_scan_step, one decode token of the Mamba-2 selective scan (models/mamba2_mixer.py _scan),
 * with the layer's SSM state updated in place.
 *
 * Per head h (group g = h / (H / G)), with eg = exp(dt_h A_h) and each row p of the head's state S_h [P, N]:
 *     S_h[p, :] = S_h[p, :] * eg + (x_h[p] * dt_h) * B_g        (a product, then a sum: numpy's rounding)
 *     y_h[p]    = S_h[p, :] . C_g                                (the only sum whose order differs from numpy's)
 * The numpy path makes three passes over the state and two temporaries of its size per token; here one pass
 * reads and writes each state value once, which is what a decode token costs at the state sizes of real files
 * (Nemotron-H 4B: 112 heads x 64 x 128 floats, 3.5 MB per mixer layer).
 * Threads: the heads are split over the pool in chunks; a head's result never depends on which thread ran it,
 * so the output is the same for every thread count. Variants for a state row: AVX-512 (16 lanes), AVX2+FMA (8
 * lanes), then a portable loop with 8 partial sums for what is left (all of N without those), then a scalar tail.
 */
#include <math.h>

#include "pool.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

typedef struct {
    int64_t H, P, N, heads_per_group, heads_per_chunk;
    float *S;
    const float *x, *dt, *A, *B, *C;
    float *y;
} scan_job;

/* One row of a head's state: s = s * eg + xdt * b; returns s . c */
static float scan_row(float *restrict s, const float *restrict b, const float *restrict c, float eg, float xdt,
                      int64_t n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = 0;
    float vsum = 0.0f;
#if defined(__AVX512F__)
    {
        __m512 e = _mm512_set1_ps(eg), xd = _mm512_set1_ps(xdt), a = _mm512_setzero_ps();
        for (; j + 16 <= n; j += 16) {
            __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), e), _mm512_mul_ps(xd, _mm512_loadu_ps(b + j)));
            _mm512_storeu_ps(s + j, v);
            a = _mm512_fmadd_ps(v, _mm512_loadu_ps(c + j), a);
        }
        vsum = _mm512_reduce_add_ps(a);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    {
        __m256 e = _mm256_set1_ps(eg), xd = _mm256_set1_ps(xdt), a = _mm256_setzero_ps();
        for (; j + 8 <= n; j += 8) {
            __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + j), e), _mm256_mul_ps(xd, _mm256_loadu_ps(b + j)));
            _mm256_storeu_ps(s + j, v);
            a = _mm256_fmadd_ps(v, _mm256_loadu_ps(c + j), a);
        }
        __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        vsum = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }
#endif
    for (; j + 8 <= n; j += 8) {
        for (int l = 0; l < 8; l++) {
            float v = s[j + l] * eg;
            v = v + xdt * b[j + l];
            s[j + l] = v;
            acc[l] += v * c[j + l];
        }
    }
    float tail = 0.0f;
    for (; j < n; j++) {
        float v = s[j] * eg;
        v = v + xdt * b[j];
        s[j] = v;
        tail += v * c[j];
    }
    return vsum + (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail);
}

static void scan_chunk(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const scan_job *J = ctx;
    const int64_t P = J->P, N = J->N;
    int64_t h0 = chunk * J->heads_per_chunk, h1 = h0 + J->heads_per_chunk;
    if (h1 > J->H) h1 = J->H;
    for (int64_t h = h0; h < h1; h++) {
        const int64_t g = h / J->heads_per_group;
        const float dt = J->dt[h], eg = expf(dt * J->A[h]);
        const float *b = J->B + g * N, *c = J->C + g * N, *xh = J->x + h * P;
        float *Sh = J->S + h * P * N, *yh = J->y + h * P;
        for (int64_t p = 0; p < P; p++) yh[p] = scan_row(Sh + p * N, b, c, eg, xh[p] * dt, N);
    }
}

void pi_ssm_scan_step(pi_pool *pool, int64_t H, int64_t P, int64_t N, int64_t G, float *S, const float *x,
                      const float *dt, const float *A, const float *B, const float *C, float *y) {
    /* at least 4 heads' states (a few hundred KB on real shapes) per chunk, so tiny files stay on one thread */
    int64_t n_chunks = pi_pool_chunks(pool, H, 4);
    if (n_chunks < 1) n_chunks = 1;
    scan_job J = {H, P, N, H / G, (H + n_chunks - 1) / n_chunks, S, x, dt, A, B, C, y};
    n_chunks = (H + J.heads_per_chunk - 1) / J.heads_per_chunk;
    pi_pool_run(pool, scan_chunk, &J, n_chunks);
}
