/* act.c: element-wise activations pi_relu, pi_silu, pi_gelu, pi_swiglu, pi_geglu (x, g, u, y: f32 [n]).
 *
 * Variants:
 *   - AVX-512: 16 lanes, tails with masked loads/stores, exp by a degree-6 polynomial and scalef.
 *   - AVX2+FMA: 8 lanes, tails with maskload/maskstore, exp by the same polynomial and an exponent add; gelu's
 *     table read by a 32-bit gather as on AVX-512 (it was a lane-by-lane scalar lookup before).
 *   - scalar (#else, PI_NATIVE=0): libm expf.
 * Formulas: silu(x) = x / (1 + e^-x). gelu is the tanh approximation g(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi)
 * (x + 0.044715 x^3), evaluated the way llama.cpp's CPU backend evaluates it, because GGUF models are tuned and
 * checked against that engine: 0 for x <= -10, x for x >= 10, else f16(g(f16(x))) -- the input rounded to f16
 * and looked up in a 65536-entry table of f16 results (built once, in f32 as llama.cpp builds it). Rounding the GELU to f16
 * is not a detail: on Gemma 3 270M it moves the perplexity by 0.3%, the whole gap to llama.cpp.
 * Tails go through the same vector code as the body, so every element gets the same function wherever the
 * chunk boundaries fall: results do not depend on the thread count. Only long vectors (prefill) are split
 * across the pool; a decode-sized vector is cheaper to do on the calling thread than to hand off.
 */
#include <math.h>

#include <pthread.h>

#include "quants.h" /* pi_h2f, pi_f32_to_f16 */
#include "pool.h"
#include "vmath.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

enum { OP_RELU, OP_SILU, OP_GELU, OP_SWIGLU, OP_GEGLU };

/* gelu of every f16 value, as f16 bits; two spare entries let a 32-bit gather read entry 65535 */
static uint16_t gelu_f16[65536 + 2];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

/* In f32 with tanhf, term for term as llama.cpp builds its table, and without fused multiply-adds, so that the
 * numpy specification (kernels/ref.py gelu) gives the same f16 bits for every input. */
__attribute__((optimize("fp-contract=off"))) static void gelu_table_init(void) {
    for (int i = 0; i < 65536; i++) {
        float x = pi_h2f((uint16_t)i);
        gelu_f16[i] = pi_f32_to_f16(0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x))));
    }
}

static inline float gelu1(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return pi_h2f(gelu_f16[pi_f32_to_f16(x)]); /* NaN in, NaN out (the table holds gelu(NaN) = NaN) */
}

#define PAR_MIN 32768              /* elements below which one thread does everything */
#define CHUNK_MIN 16384            /* elements per chunk at least */


#if defined(__AVX512F__)
#define VW 16
typedef __m512 vf;
static inline vf vexp(vf x) { return pi_vexp16(x); }
#define V_SET1 _mm512_set1_ps
#define V_ADD _mm512_add_ps
#define V_MUL _mm512_mul_ps
#define V_DIV _mm512_div_ps
#define V_MAX _mm512_max_ps
#define V_FMA _mm512_fmadd_ps
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_TAIL_MASK(k) ((__mmask16)((1u << (k)) - 1))
#define V_LOAD_TAIL(p, k) _mm512_maskz_loadu_ps(V_TAIL_MASK(k), p)
#define V_STORE_TAIL(p, v, k) _mm512_mask_storeu_ps(p, V_TAIL_MASK(k), v)
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
typedef __m256 vf;
static inline vf vexp(vf x) { return pi_vexp8(x); }
static inline __m256i tail_mask8(int k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#define V_SET1 _mm256_set1_ps
#define V_ADD _mm256_add_ps
#define V_MUL _mm256_mul_ps
#define V_DIV _mm256_div_ps
#define V_MAX _mm256_max_ps
#define V_FMA _mm256_fmadd_ps
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_LOAD_TAIL(p, k) _mm256_maskload_ps(p, tail_mask8(k))
#define V_STORE_TAIL(p, v, k) _mm256_maskstore_ps(p, tail_mask8(k), v)
#endif

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) vf gelu_vec(vf x) {
    __m512i idx = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m512i g = _mm512_and_si512(_mm512_i32gather_epi32(idx, (const void *)gelu_f16, 2), _mm512_set1_epi32(0xffff));
    vf y = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(10.0f), _CMP_GE_OQ), y, x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-10.0f), _CMP_LE_OQ), y, _mm512_setzero_ps());
}
#elif defined(VW)
/* AVX2: the same table lookup, 8 lanes: f16 bits of x as the index of a 32-bit gather (entry i's f16 in the
 * low half; the table's two spare entries keep the read of entry 65535 inside it), then the range blends */
static inline __attribute__((always_inline)) vf gelu_vec(vf x) {
    __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i g = _mm256_i32gather_epi32((const int *)gelu_f16, idx, 2);
    g = _mm256_packus_epi32(_mm256_and_si256(g, _mm256_set1_epi32(0xffff)), _mm256_setzero_si256());
    vf y = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(g, 0x08)));
    y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
    return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
}
#endif

#ifdef VW
/* one vector of the activation; `op` is a constant after inlining, so each op gets its own loop */
static inline __attribute__((always_inline)) vf act_vec(int op, vf x, vf u) {
    vf one = V_SET1(1.0f);
    switch (op) {
    case OP_RELU: return V_MAX(V_SET1(0.0f), x);
    case OP_SILU: return V_DIV(x, V_ADD(one, vexp(V_MUL(V_SET1(-1.0f), x))));
    case OP_SWIGLU: return V_MUL(V_DIV(x, V_ADD(one, vexp(V_MUL(V_SET1(-1.0f), x)))), u);
    default: { /* gelu, geglu: the f16 table (see the top of the file) */
        vf y = gelu_vec(x);
        return op == OP_GEGLU ? V_MUL(y, u) : y;
    }
    }
}

static inline __attribute__((always_inline)) void act_range_op(int op, const float *x, const float *u, float *y,
                                                               int64_t i0, int64_t i1) {
    int gated = op == OP_SWIGLU || op == OP_GEGLU;
    vf zero = V_SET1(0.0f);
    int64_t i = i0;
    for (; i + VW <= i1; i += VW)
        V_STORE(y + i, act_vec(op, V_LOAD(x + i), gated ? V_LOAD(u + i) : zero));
    if (i < i1) {
        int k = (int)(i1 - i);
        V_STORE_TAIL(y + i, act_vec(op, V_LOAD_TAIL(x + i, k), gated ? V_LOAD_TAIL(u + i, k) : zero), k);
    }
}
#else
static inline __attribute__((always_inline)) void act_range_op(int op, const float *x, const float *u, float *y,
                                                               int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
        float v = x[i];
        switch (op) {
        case OP_RELU: y[i] = v < 0.0f ? 0.0f : v; break; /* NaN stays NaN, as in the vector code */
        case OP_SILU: y[i] = v / (1.0f + expf(-v)); break;
        case OP_SWIGLU: y[i] = v / (1.0f + expf(-v)) * u[i]; break;
        case OP_GELU: y[i] = gelu1(v); break;
        default: y[i] = gelu1(v) * u[i]; break;
        }
    }
}
#endif

static void act_range(int op, const float *x, const float *u, float *y, int64_t i0, int64_t i1) {
    switch (op) {
    case OP_RELU: act_range_op(OP_RELU, x, u, y, i0, i1); break;
    case OP_SILU: act_range_op(OP_SILU, x, u, y, i0, i1); break;
    case OP_GELU: act_range_op(OP_GELU, x, u, y, i0, i1); break;
    case OP_SWIGLU: act_range_op(OP_SWIGLU, x, u, y, i0, i1); break;
    default: act_range_op(OP_GEGLU, x, u, y, i0, i1); break;
    }
}

typedef struct {
    int op;
    const float *x, *u;
    float *y;
    int64_t n, n_chunks;
} act_job;

static void act_chunk(void *ctx, int64_t c, int thread_id) {
    (void)thread_id;
    const act_job *j = ctx;
    /* chunk bounds in units of 64 elements keep every chunk but the last a whole number of vectors */
    int64_t n_blocks = (j->n + 63) / 64;
    int64_t i0 = c * n_blocks / j->n_chunks * 64, i1 = (c + 1) * n_blocks / j->n_chunks * 64;
    if (i1 > j->n) i1 = j->n;
    if (i0 < i1) act_range(j->op, j->x, j->u, j->y, i0, i1);
}

static void act_run(pi_pool *pool, int op, const float *x, const float *u, float *y, int64_t n) {
    if (op == OP_GELU || op == OP_GEGLU) pthread_once(&gelu_once, gelu_table_init);
    if (n < PAR_MIN || pi_pool_n_threads(pool) == 1) {
        act_range(op, x, u, y, 0, n);
        return;
    }
    act_job job = {op, x, u, y, n, pi_pool_chunks(pool, (n + 63) / 64, CHUNK_MIN / 64)};
    pi_pool_run(pool, act_chunk, &job, job.n_chunks);
}

void pi_relu(pi_pool *pool, const float *x, float *y, int64_t n) { act_run(pool, OP_RELU, x, NULL, y, n); }
void pi_silu(pi_pool *pool, const float *x, float *y, int64_t n) { act_run(pool, OP_SILU, x, NULL, y, n); }
void pi_gelu(pi_pool *pool, const float *x, float *y, int64_t n) { act_run(pool, OP_GELU, x, NULL, y, n); }
void pi_swiglu(pi_pool *pool, const float *g, const float *u, float *y, int64_t n) {
    act_run(pool, OP_SWIGLU, g, u, y, n);
}
void pi_geglu(pi_pool *pool, const float *g, const float *u, float *y, int64_t n) {
    act_run(pool, OP_GEGLU, g, u, y, n);
}
