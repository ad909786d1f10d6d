/* attention.c: pi_softmax (rows of f32 [n_rows, n_cols], in place) and pi_attention (causal grouped-query
 * attention of f32 queries over one layer of the f16 KV cache [n_head_kv, n_ctx, head_dim]).
 *
 * Attention, per query token t (position p = pos0 + t) and query head h (kv head h / (n_head / n_head_kv)):
 *   s_j = scale * q.k_j for the visible j (j <= p, and j > p - window when window > 0),
 *   then, when softcap > 0 (Gemma 2's attention logit soft-capping), s_j = softcap * tanh(s_j / softcap),
 *   w = softmax(s) in f32 with the max subtracted, out = sum_j w_j v_j.
 * Attention sinks (gpt-oss; sinks NULL: none): one learned logit per query head that joins the softmax's
 * denominator and nothing else: m = max(max_j s_j, sink_h), w_j = e^(s_j - m) / (sum_i e^(s_i - m) + e^(sink_h - m)),
 * so the weights sum to less than 1. Without sinks the softmax runs exactly as before (same bits).
 * The soft-cap is a separate pass over a head's scores (vectorised tanh from vexp, see softcap_row);
 * softcap == 0 skips it, so uncapped models get the same bits as without it.
 * A work item is one token and a group of query heads that share a kv head, so each cached row is converted
 * from f16 once for the whole group. The group shrinks (to a divisor of n_head / n_head_kv) until there are
 * enough items for every thread; each head's arithmetic is the same whatever the group, so results do not
 * depend on the thread count. Scores live in the pool's scratch, one slice per thread.
 * Variants:
 *   - AVX-512 (+F16C): 16 lanes; q.k with two accumulators per head; out accumulated in registers, 64 dims
 *     x up to 4 heads at a time, over all j.
 *   - AVX2+FMA+F16C: the same with 8 lanes and 16 dims at a time.
 *   - scalar: used for head_dim not a multiple of the vector width, and for everything in PI_NATIVE=0 builds.
 * exp: degree-6 polynomial after range reduction (as in act.c), < 2e-7 relative error; scalar path: expf.
 */
#include <math.h>
#include <string.h>

#include "pool.h"
#include "vmath.h"

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define PAR_MIN 65536   /* multiply-adds below which the calling thread does all the work */
#define SOFTMAX_PAR_MIN 32768

static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 is exact in f32 */
        f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    u = sign | (exp == 0x1f ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* ---- vector helpers --------------------------------------------------------------------------------- */

#if defined(__AVX512F__)
#define VW 16
#define PV_NB 4 /* vectors of out per head kept in registers while sweeping j */
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1 _mm512_set1_ps
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MUL _mm512_mul_ps
#define V_MAX _mm512_max_ps
#define V_FMA _mm512_fmadd_ps
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_LOAD_PH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_MASK_T __mmask16
#define V_MASK(k) ((__mmask16)((1u << (k)) - 1))
#define V_LOAD_FILL(p, m, fill) _mm512_mask_loadu_ps(V_SET1(fill), m, p)
#define V_KEEP(v, m) _mm512_maskz_mov_ps(m, v)
#define V_STORE_TAIL(p, v, m) _mm512_mask_storeu_ps(p, m, v)
#define V_DIV _mm512_div_ps
#define V_BITS(op, a, b) _mm512_castsi512_ps(op(_mm512_castps_si512(a), _mm512_castps_si512(b)))
#define V_AND(a, b) V_BITS(_mm512_and_si512, a, b)
#define V_OR(a, b) V_BITS(_mm512_or_si512, a, b)
#define V_ANDNOT(a, b) V_BITS(_mm512_andnot_si512, a, b) /* ~a & b */
static inline float v_hsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline float v_hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline vf vexp(vf x) { return pi_vexp16(x); }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VW 8
#define PV_NB 2
typedef __m256 vf;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1 _mm256_set1_ps
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MUL _mm256_mul_ps
#define V_MAX _mm256_max_ps
#define V_FMA _mm256_fmadd_ps
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_LOAD_PH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_MASK_T __m256i
#define V_MASK(k) _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define V_LOAD_FILL(p, m, fill) _mm256_blendv_ps(V_SET1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m))
#define V_KEEP(v, m) _mm256_and_ps(v, _mm256_castsi256_ps(m))
#define V_STORE_TAIL(p, v, m) _mm256_maskstore_ps(p, m, v)
#define V_DIV _mm256_div_ps
#define V_AND _mm256_and_ps
#define V_OR _mm256_or_ps
#define V_ANDNOT _mm256_andnot_ps /* ~a & b */
static inline float v_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float v_hmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline vf vexp(vf x) { return pi_vexp8(x); }
#endif

/* ---- softmax ------------------------------------------------------------------------------------------ */
#ifdef VW
/* sink: a pointer to the row's sink logit (joins the max and the denominator only), or NULL */
static void softmax_row_sink(float *x, int64_t n, const float *sink) {
    int64_t i, nv = n / VW * VW;
    V_MASK_T m = V_MASK((int)(n - nv));
    vf mx = V_SET1(-INFINITY);
    for (i = 0; i < nv; i += VW) mx = V_MAX(mx, V_LOAD(x + i));
    if (nv < n) mx = V_MAX(mx, V_LOAD_FILL(x + nv, m, -INFINITY));
    float fmax = v_hmax(mx);
    if (sink && *sink > fmax) fmax = *sink;
    vf vmax = V_SET1(fmax), sum = V_ZERO();
    for (i = 0; i < nv; i += VW) {
        vf e = vexp(V_SUB(V_LOAD(x + i), vmax));
        V_STORE(x + i, e);
        sum = V_ADD(sum, e);
    }
    if (nv < n) {
        vf e = V_KEEP(vexp(V_SUB(V_LOAD_FILL(x + nv, m, 0.0f), vmax)), m);
        V_STORE_TAIL(x + nv, e, m);
        sum = V_ADD(sum, e);
    }
    float total = v_hsum(sum);
    if (sink) total += expf(*sink - fmax);
    vf inv = V_SET1(1.0f / total);
    for (i = 0; i < nv; i += VW) V_STORE(x + i, V_MUL(V_LOAD(x + i), inv));
    if (nv < n) V_STORE_TAIL(x + nv, V_MUL(V_LOAD_FILL(x + nv, m, 0.0f), inv), m);
}
#else
static void softmax_row_sink(float *x, int64_t n, const float *sink) {
    float mx = -INFINITY;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    if (sink && *sink > mx) mx = *sink;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    if (sink) sum += expf(*sink - mx);
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
#endif
static void softmax_row(float *x, int64_t n) { softmax_row_sink(x, n, NULL); }

typedef struct {
    float *x;
    int64_t n_rows, n_cols, n_chunks;
} softmax_job;

static void softmax_chunk(void *ctx, int64_t c, int thread_id) {
    (void)thread_id;
    const softmax_job *j = ctx;
    for (int64_t r = c * j->n_rows / j->n_chunks; r < (c + 1) * j->n_rows / j->n_chunks; r++)
        softmax_row(j->x + r * j->n_cols, j->n_cols);
}

void pi_softmax(pi_pool *pool, float *x, int64_t n_rows, int64_t n_cols) {
    softmax_job j = {x, n_rows, n_cols, 1};
    if (n_rows > 1 && n_rows * n_cols >= SOFTMAX_PAR_MIN)
        j.n_chunks = pi_pool_chunks(pool, n_rows, (SOFTMAX_PAR_MIN / 2 + n_cols - 1) / n_cols);
    pi_pool_run(pool, softmax_chunk, &j, j.n_chunks);
}

/* ---- attention ---------------------------------------------------------------------------------------- */
typedef struct {
    const float *q;
    const uint16_t *k, *v;
    float *out;
    int64_t n_tok, n_head, n_head_kv, head_dim, n_ctx, pos0, window;
    float scale, softcap; /* softcap 0: no soft-capping */
    const float *sinks;   /* f32 [n_head] sink logits, or NULL */
    int64_t group;       /* query heads per item (divides n_head / n_head_kv) */
    int64_t n_items, n_chunks;
    int64_t sc_stride;   /* floats of scores per head */
    int64_t th_stride;   /* floats of scratch per thread */
    float *scratch;
} attn_job;

/* s = cap * tanh(s / cap) over n scores, as llama.cpp writes it: a multiply by 1/cap, tanh, a multiply by cap.
 * Vector form: tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|) in [0, 1] (no overflow for any x), the sign of x
 * put back; its absolute error is vexp's (~1e-7), so a score moves by < cap * 1e-7 from the correctly rounded
 * value, far below the f16 rounding of the cached keys. The tail of the row goes through the same vector code
 * (masked), so a score's value never depends on its place in the row. Scalar builds: tanhf. */
#ifdef VW
static inline vf v_softcap(vf s, vf inv, vf cap) {
    const vf sign = V_SET1(-0.0f), one = V_SET1(1.0f);
    vf x = V_MUL(s, inv);
    vf e = vexp(V_MUL(V_SET1(-2.0f), V_ANDNOT(sign, x)));
    vf t = V_MUL(cap, V_DIV(V_SUB(one, e), V_ADD(one, e)));
    return V_OR(t, V_AND(x, sign));
}

static void softcap_row(float *s, int64_t n, float cap) {
    const vf inv = V_SET1(1.0f / cap), vcap = V_SET1(cap);
    int64_t i, nv = n / VW * VW;
    for (i = 0; i < nv; i += VW) V_STORE(s + i, v_softcap(V_LOAD(s + i), inv, vcap));
    if (nv < n) {
        V_MASK_T m = V_MASK((int)(n - nv));
        V_STORE_TAIL(s + nv, v_softcap(V_LOAD_FILL(s + nv, m, 0.0f), inv, vcap), m);
    }
}
#else
static void softcap_row(float *s, int64_t n, float cap) {
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] * inv);
}
#endif

/* the scalar form of one head: scores, softmax, weighted sum of v rows (n visible rows from k, v) */
static void attn_head_scalar(const float *q, const uint16_t *k, const uint16_t *v, int64_t n, int64_t hd,
                             float scale, float softcap, const float *sink, float *sc, float *out) {
    for (int64_t jj = 0; jj < n; jj++) {
        const uint16_t *kj = k + jj * hd;
        float s = 0.0f;
        for (int64_t d = 0; d < hd; d++) s += q[d] * f16_to_f32(kj[d]);
        sc[jj] = s * scale;
    }
    if (softcap > 0.0f) softcap_row(sc, n, softcap);
    softmax_row_sink(sc, n, sink);
    for (int64_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (int64_t jj = 0; jj < n; jj++) {
        const uint16_t *vj = v + jj * hd;
        for (int64_t d = 0; d < hd; d++) out[d] += sc[jj] * f16_to_f32(vj[d]);
    }
}

#ifdef VW
/* scores of G heads (q: G rows of hd) against n rows of k; two accumulators per head shorten the FMA chains */
static inline __attribute__((always_inline)) void qk_tile(const float *q, const uint16_t *k, int64_t n, int64_t hd,
                                                          float scale, float *sc, int64_t sc_stride, const int G) {
    for (int64_t jj = 0; jj < n; jj++) {
        const uint16_t *kj = k + jj * hd;
        vf acc0[4], acc1[4];
        for (int g = 0; g < G; g++) acc0[g] = acc1[g] = V_ZERO();
        int64_t d = 0;
        for (; d + 2 * VW <= hd; d += 2 * VW) {
            vf k0 = V_LOAD_PH(kj + d), k1 = V_LOAD_PH(kj + d + VW);
            for (int g = 0; g < G; g++) {
                acc0[g] = V_FMA(V_LOAD(q + g * hd + d), k0, acc0[g]);
                acc1[g] = V_FMA(V_LOAD(q + g * hd + d + VW), k1, acc1[g]);
            }
        }
        if (d < hd) {
            vf k0 = V_LOAD_PH(kj + d);
            for (int g = 0; g < G; g++) acc0[g] = V_FMA(V_LOAD(q + g * hd + d), k0, acc0[g]);
        }
        for (int g = 0; g < G; g++) sc[g * sc_stride + jj] = v_hsum(V_ADD(acc0[g], acc1[g])) * scale;
    }
}

/* out rows of G heads = sum_j w[g][j] v_j, NB vectors of dims at a time held in registers over all j */
static inline __attribute__((always_inline)) void pv_block(const uint16_t *v, int64_t n, int64_t hd, const float *w,
                                                           int64_t w_stride, float *out, int64_t d0, const int G,
                                                           const int NB) {
    vf acc[4][PV_NB];
    for (int g = 0; g < G; g++)
        for (int b = 0; b < NB; b++) acc[g][b] = V_ZERO();
    for (int64_t jj = 0; jj < n; jj++) {
        const uint16_t *vj = v + jj * hd + d0;
        vf vv[PV_NB];
        for (int b = 0; b < NB; b++) vv[b] = V_LOAD_PH(vj + b * VW);
        for (int g = 0; g < G; g++) {
            vf wg = V_SET1(w[g * w_stride + jj]);
            for (int b = 0; b < NB; b++) acc[g][b] = V_FMA(wg, vv[b], acc[g][b]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int b = 0; b < NB; b++) V_STORE(out + g * hd + d0 + b * VW, acc[g][b]);
}

static inline __attribute__((always_inline)) void attn_tile(const float *q, const uint16_t *k, const uint16_t *v,
                                                            int64_t n, int64_t hd, float scale, float softcap,
                                                            const float *sinks, float *sc, int64_t sc_stride,
                                                            float *out, const int G) {
    qk_tile(q, k, n, hd, scale, sc, sc_stride, G);
    if (softcap > 0.0f)
        for (int g = 0; g < G; g++) softcap_row(sc + g * sc_stride, n, softcap);
    for (int g = 0; g < G; g++) softmax_row_sink(sc + g * sc_stride, n, sinks ? sinks + g : NULL);
    int64_t d0 = 0;
    for (; d0 + PV_NB * VW <= hd; d0 += PV_NB * VW) pv_block(v, n, hd, sc, sc_stride, out, d0, G, PV_NB);
    for (; d0 < hd; d0 += VW) pv_block(v, n, hd, sc, sc_stride, out, d0, G, 1);
}
#endif

static void attn_item(const attn_job *j, int64_t item, float *sc) {
    int64_t n_groups = j->n_head / j->group, hd = j->head_dim;
    int64_t t = item / n_groups, h0 = item % n_groups * j->group;
    int64_t p = j->pos0 + t, j0 = 0;
    if (j->window > 0 && p - j->window + 1 > 0) j0 = p - j->window + 1;
    int64_t n = p - j0 + 1, kvh = h0 / (j->n_head / j->n_head_kv);
    const uint16_t *k = j->k + (kvh * j->n_ctx + j0) * hd, *v = j->v + (kvh * j->n_ctx + j0) * hd;
    const float *q = j->q + (t * j->n_head + h0) * hd;
    float *out = j->out + (t * j->n_head + h0) * hd;
#ifdef VW
    if (hd % VW == 0) {
        for (int64_t g0 = 0; g0 < j->group; g0 += 4) {
            int64_t g = j->group - g0 < 4 ? j->group - g0 : 4;
            const float *qg = q + g0 * hd, *sk = j->sinks ? j->sinks + h0 + g0 : NULL;
            float *og = out + g0 * hd;
            switch (g) {
            case 1: attn_tile(qg, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, og, 1); break;
            case 2: attn_tile(qg, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, og, 2); break;
            case 3: attn_tile(qg, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, og, 3); break;
            default: attn_tile(qg, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, og, 4); break;
            }
        }
        return;
    }
#endif
    for (int64_t g = 0; g < j->group; g++)
        attn_head_scalar(q + g * hd, k, v, n, hd, j->scale, j->softcap, j->sinks ? j->sinks + h0 + g : NULL, sc,
                         out + g * hd);
}

static void attn_chunk(void *ctx, int64_t c, int thread_id) {
    const attn_job *j = ctx;
    float *sc = j->scratch + (int64_t)thread_id * j->th_stride;
    for (int64_t i = c * j->n_items / j->n_chunks; i < (c + 1) * j->n_items / j->n_chunks; i++) attn_item(j, i, sc);
}

void pi_attention(pi_pool *pool, const float *q, const uint16_t *k, const uint16_t *v, int64_t n_tok,
                  int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx, int64_t pos0, int64_t window,
                  float scale, float softcap, const float *sinks, float *out) {
    if (n_tok <= 0 || n_head <= 0) return;
    int64_t n_rep = n_head / n_head_kv, n_threads = pi_pool_n_threads(pool);
    int64_t span = pos0 + n_tok; /* most kv rows one query sees */
    if (window > 0 && window < span) span = window;
    double work = (double)n_tok * (double)n_head * (double)span * (double)head_dim;
    attn_job j = {.q = q, .k = k, .v = v, .out = out, .n_tok = n_tok, .n_head = n_head, .n_head_kv = n_head_kv,
                  .head_dim = head_dim, .n_ctx = n_ctx, .pos0 = pos0, .window = window, .scale = scale,
                  .softcap = softcap, .sinks = sinks, .group = n_rep};
    if (work >= PAR_MIN && n_threads > 1) {
        /* the largest group (fewest re-reads of the cache) that still gives every thread an item */
        for (int64_t g = n_rep; g >= 1; g--)
            if (n_rep % g == 0 && (n_tok * n_head / g >= n_threads || g == 1)) {
                j.group = g;
                break;
            }
    }
    j.n_items = n_tok * (n_head / j.group);
    j.n_chunks = (work >= PAR_MIN && n_threads > 1) ? j.n_items : 1;
    j.sc_stride = (span + 15) / 16 * 16;
    j.th_stride = j.group * j.sc_stride;
    int64_t n_slots = j.n_chunks > 1 ? n_threads : 1;
    j.scratch = pi_pool_scratch(pool, (size_t)(n_slots * j.th_stride) * sizeof(float));
    pi_pool_run(pool, attn_chunk, &j, j.n_chunks);
}
