/* norm.c: pi_rmsnorm and pi_layernorm over the last dim of x f32 [n_tok, dim] (y may alias x).
 *
 *   rmsnorm:   y = x / sqrt(mean(x^2) + eps) * w
 *   layernorm: y = (x - mean(x)) / sqrt(mean((x - mean)^2) + eps) * w + b      (two passes over the row)
 * Variants:
 *   - AVX-512: row sums in four 16-lane accumulators, masked tail; then one vectorised scaling pass.
 *   - AVX2+FMA: the same with 8 lanes and maskload/maskstore.
 *   - scalar (#else, PI_NATIVE=0): sums in double.
 * A row's summation order depends only on dim, so results are the same for any thread count. Rows are split
 * across the pool only when there are many (prefill, or per-head norms of a long batch).
 */
#include <math.h>

#include "pool.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define PAR_MIN 32768   /* elements below which one thread does all rows */
#define CHUNK_MIN 16384 /* elements per chunk at least */

#if defined(__AVX512F__)
#define VW 16
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1 _mm512_set1_ps
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MUL _mm512_mul_ps
#define V_FMA _mm512_fmadd_ps
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_MASK_T __mmask16
#define V_MASK(k) ((__mmask16)((1u << (k)) - 1))
#define V_LOAD_TAIL(p, m) _mm512_maskz_loadu_ps(m, p)
#define V_STORE_TAIL(p, v, m) _mm512_mask_storeu_ps(p, m, v)
#define V_SUB_TAIL(a, b, m) _mm512_maskz_sub_ps(m, a, b)
static inline float v_hsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vf;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1 _mm256_set1_ps
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MUL _mm256_mul_ps
#define V_FMA _mm256_fmadd_ps
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_MASK_T __m256i
#define V_MASK(k) _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define V_LOAD_TAIL(p, m) _mm256_maskload_ps(p, m)
#define V_STORE_TAIL(p, v, m) _mm256_maskstore_ps(p, m, v)
#define V_SUB_TAIL(a, b, m) _mm256_and_ps(_mm256_sub_ps(a, b), _mm256_castsi256_ps(m))
static inline float v_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#ifdef VW
/* sum over the row of (x - shift)^2 if square, else of x - shift; fixed order for a given dim */
static float row_sum(const float *x, int64_t dim, float shift, int square) {
    vf acc[4] = {V_ZERO(), V_ZERO(), V_ZERO(), V_ZERO()};
    vf s = V_SET1(shift);
    int64_t i = 0;
    for (; i + 4 * VW <= dim; i += 4 * VW)
        for (int a = 0; a < 4; a++) {
            vf v = V_SUB(V_LOAD(x + i + a * VW), s);
            acc[a] = square ? V_FMA(v, v, acc[a]) : V_ADD(v, acc[a]);
        }
    for (; i + VW <= dim; i += VW) {
        vf v = V_SUB(V_LOAD(x + i), s);
        acc[0] = square ? V_FMA(v, v, acc[0]) : V_ADD(v, acc[0]);
    }
    if (i < dim) {
        V_MASK_T m = V_MASK((int)(dim - i));
        vf v = V_SUB_TAIL(V_LOAD_TAIL(x + i, m), s, m); /* lanes past the row stay 0, not -shift */
        acc[1] = square ? V_FMA(v, v, acc[1]) : V_ADD(v, acc[1]);
    }
    return v_hsum(V_ADD(V_ADD(acc[0], acc[1]), V_ADD(acc[2], acc[3])));
}

/* y = (x - shift) * scale * w + b, w and b optional */
static void row_scale(const float *x, float *y, int64_t dim, float shift, float scale, const float *w,
                      const float *b) {
    vf s = V_SET1(shift), k = V_SET1(scale), one = V_SET1(1.0f), zero = V_ZERO();
    int64_t i = 0;
    for (; i + VW <= dim; i += VW) {
        vf v = V_MUL(V_SUB(V_LOAD(x + i), s), k);
        v = V_FMA(v, w ? V_LOAD(w + i) : one, b ? V_LOAD(b + i) : zero);
        V_STORE(y + i, v);
    }
    if (i < dim) {
        V_MASK_T m = V_MASK((int)(dim - i));
        vf v = V_MUL(V_SUB(V_LOAD_TAIL(x + i, m), s), k);
        v = V_FMA(v, w ? V_LOAD_TAIL(w + i, m) : one, b ? V_LOAD_TAIL(b + i, m) : zero);
        V_STORE_TAIL(y + i, v, m);
    }
}
#else
static float row_sum(const float *x, int64_t dim, float shift, int square) {
    double acc = 0.0;
    for (int64_t i = 0; i < dim; i++) {
        double v = (double)x[i] - shift;
        acc += square ? v * v : v;
    }
    return (float)acc;
}

static void row_scale(const float *x, float *y, int64_t dim, float shift, float scale, const float *w,
                      const float *b) {
    for (int64_t i = 0; i < dim; i++) {
        float v = (x[i] - shift) * scale;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}
#endif

typedef struct {
    const float *x, *w, *b;
    float *y;
    float eps;
    int layer; /* 0: rmsnorm, 1: layernorm */
    int64_t n_tok, dim, n_chunks;
} norm_job;

static void norm_rows(const norm_job *j, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->dim;
        float *y = j->y + r * j->dim;
        float mean = 0.0f;
        if (j->layer) mean = row_sum(x, j->dim, 0.0f, 0) / (float)j->dim;
        float var = row_sum(x, j->dim, mean, 1) / (float)j->dim;
        row_scale(x, y, j->dim, mean, 1.0f / sqrtf(var + j->eps), j->w, j->b);
    }
}

static void norm_chunk(void *ctx, int64_t c, int thread_id) {
    (void)thread_id;
    const norm_job *j = ctx;
    norm_rows(j, c * j->n_tok / j->n_chunks, (c + 1) * j->n_tok / j->n_chunks);
}

static void norm_run(pi_pool *pool, norm_job *j) {
    if (j->n_tok * j->dim < PAR_MIN || j->n_tok < 2 || pi_pool_n_threads(pool) == 1) {
        norm_rows(j, 0, j->n_tok);
        return;
    }
    j->n_chunks = pi_pool_chunks(pool, j->n_tok, (CHUNK_MIN + j->dim - 1) / j->dim);
    pi_pool_run(pool, norm_chunk, j, j->n_chunks);
}

void pi_rmsnorm(pi_pool *pool, const float *x, const float *w, float eps, int64_t n_tok, int64_t dim, float *y) {
    norm_job j = {x, w, NULL, y, eps, 0, n_tok, dim, 1};
    norm_run(pool, &j);
}

void pi_layernorm(pi_pool *pool, const float *x, const float *w, const float *b, float eps, int64_t n_tok,
                  int64_t dim, float *y) {
    norm_job j = {x, w, b, y, eps, 1, n_tok, dim, 1};
    norm_run(pool, &j);
}
