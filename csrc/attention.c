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
 * A work item is a group of query heads that share a kv head, of one token or (prefill where no token's window
 * cuts its past, groups under 4 heads) of up to 4 / group consecutive tokens, so each cached row is converted
 * from f16 once for up to 4 query rows. The group shrinks (to a divisor of n_head / n_head_kv) until there are
 * enough items for every thread; each row's arithmetic is the same whatever the item, so results do not
 * depend on the thread count or on the batch (a prefill gives each token the bits of its one-token call).
 * Scores live in the pool's scratch, one slice per thread. Rows of several tokens per item, measured on the AVX2 EPYC (32 heads, no GQA,
 * head_dim 128, 2 threads, from position 0): 512 tokens 53-54 -> 23-26 ms, 1024 tokens 277-378 -> 131-174 ms;
 * in a 1421-token prompt on the 8-layer 7B-shape Q4_0 PWRI file, attention went from 16% to 6% of the `perf`
 * samples (the prompt's tok/s, 34-40 either way in two alternating pairs, is within this host's noise).
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
    int64_t tq;          /* tokens per item (1 with a sliding window) */
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
/* A tile is R <= 4 query rows (heads of one kv group, of one or several tokens) over the same cached k, v rows:
 * each k / v row is converted from f16 once for all of them. Row r sees the first n[r] cached rows; the tile
 * runs to n_max = max n[r]. Every row's arithmetic is the one-row arithmetic (the same FMA chains in the same
 * order), so its bits do not depend on the tile it is in. */

/* scores of the R rows against the first n_max rows of k (those past a row's own n are computed, never used);
 * two accumulators per row shorten the FMA chains */
static inline __attribute__((always_inline)) void qk_rows(const float *const *q, const uint16_t *k, int64_t n_max,
                                                          int64_t hd, float scale, float *sc, int64_t sc_stride,
                                                          const int R) {
    for (int64_t jj = 0; jj < n_max; jj++) {
        const uint16_t *kj = k + jj * hd;
        vf acc0[4], acc1[4];
        for (int r = 0; r < R; r++) acc0[r] = acc1[r] = V_ZERO();
        int64_t d = 0;
        for (; d + 2 * VW <= hd; d += 2 * VW) {
            vf k0 = V_LOAD_PH(kj + d), k1 = V_LOAD_PH(kj + d + VW);
            for (int r = 0; r < R; r++) {
                acc0[r] = V_FMA(V_LOAD(q[r] + d), k0, acc0[r]);
                acc1[r] = V_FMA(V_LOAD(q[r] + d + VW), k1, acc1[r]);
            }
        }
        if (d < hd) {
            vf k0 = V_LOAD_PH(kj + d);
            for (int r = 0; r < R; r++) acc0[r] = V_FMA(V_LOAD(q[r] + d), k0, acc0[r]);
        }
        for (int r = 0; r < R; r++) sc[r * sc_stride + jj] = v_hsum(V_ADD(acc0[r], acc1[r])) * scale;
    }
}

/* out[r] dims d0 .. d0 + NB * VW = sum over j < n[r] of w[r][j] v_j, held in registers: the rows share the
 * v loads up to the shortest row's n, then each longer row continues its own chains */
static inline __attribute__((always_inline)) void pv_rows(const uint16_t *v, const int64_t *n, int64_t n_min,
                                                          int64_t n_max, int64_t hd, const float *w,
                                                          int64_t w_stride, float *const *out, int64_t d0, const int R,
                                                          const int NB) {
    vf acc[4][PV_NB];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) acc[r][b] = V_ZERO();
    int64_t jj = 0;
    for (; jj < n_min; jj++) {
        const uint16_t *vj = v + jj * hd + d0;
        vf vv[PV_NB];
        for (int b = 0; b < NB; b++) vv[b] = V_LOAD_PH(vj + b * VW);
        for (int r = 0; r < R; r++) {
            vf wr = V_SET1(w[r * w_stride + jj]);
            for (int b = 0; b < NB; b++) acc[r][b] = V_FMA(wr, vv[b], acc[r][b]);
        }
    }
    for (; jj < n_max; jj++) {
        const uint16_t *vj = v + jj * hd + d0;
        vf vv[PV_NB];
        for (int b = 0; b < NB; b++) vv[b] = V_LOAD_PH(vj + b * VW);
        for (int r = 0; r < R; r++)
            if (jj < n[r]) {
                vf wr = V_SET1(w[r * w_stride + jj]);
                for (int b = 0; b < NB; b++) acc[r][b] = V_FMA(wr, vv[b], acc[r][b]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) V_STORE(out[r] + d0 + b * VW, acc[r][b]);
}

static inline __attribute__((always_inline)) void attn_rows(const float *const *q, const uint16_t *k,
                                                            const uint16_t *v, const int64_t *n, int64_t hd,
                                                            float scale, float softcap, const float *const *sinks,
                                                            float *sc, int64_t sc_stride, float *const *out,
                                                            const int R) {
    int64_t n_min = n[0], n_max = n[0];
    for (int r = 1; r < R; r++) {
        if (n[r] < n_min) n_min = n[r];
        if (n[r] > n_max) n_max = n[r];
    }
    qk_rows(q, k, n_max, hd, scale, sc, sc_stride, R);
    if (softcap > 0.0f)
        for (int r = 0; r < R; r++) softcap_row(sc + r * sc_stride, n[r], softcap);
    for (int r = 0; r < R; r++) softmax_row_sink(sc + r * sc_stride, n[r], sinks[r]);
    int64_t d0 = 0;
    for (; d0 + PV_NB * VW <= hd; d0 += PV_NB * VW) pv_rows(v, n, n_min, n_max, hd, sc, sc_stride, out, d0, R, PV_NB);
    for (; d0 < hd; d0 += VW) pv_rows(v, n, n_min, n_max, hd, sc, sc_stride, out, d0, R, 1);
}
#endif

/* An item is tq consecutive tokens (tq > 1 only where the window, if any, still covers every token's whole
 * past, so all of them see the cache from row 0) times a group of query heads that share a kv head: up to
 * tq * group rows, taken 4 at a time. */
static void attn_item(const attn_job *j, int64_t item, float *sc) {
    const int64_t n_groups = j->n_head / j->group, hd = j->head_dim;
    const int64_t t0 = item / n_groups * j->tq, h0 = item % n_groups * j->group;
    const int64_t t1 = t0 + j->tq < j->n_tok ? t0 + j->tq : j->n_tok, n_rows = (t1 - t0) * j->group;
    int64_t j0 = 0;
    if (j->window > 0 && j->pos0 + t0 - j->window + 1 > 0) j0 = j->pos0 + t0 - j->window + 1; /* then tq == 1 */
    const int64_t kvh = h0 / (j->n_head / j->n_head_kv);
    const uint16_t *k = j->k + (kvh * j->n_ctx + j0) * hd, *v = j->v + (kvh * j->n_ctx + j0) * hd;
    for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
        const int R = n_rows - r0 < 4 ? (int)(n_rows - r0) : 4;
        const float *q[4], *sk[4];
        float *out[4];
        int64_t n[4];
        for (int r = 0; r < R; r++) { /* rows token-major: token t0 + i / group, head h0 + i % group */
            const int64_t i = r0 + r, t = t0 + i / j->group, h = h0 + i % j->group;
            q[r] = j->q + (t * j->n_head + h) * hd;
            out[r] = j->out + (t * j->n_head + h) * hd;
            n[r] = j->pos0 + t - j0 + 1;
            sk[r] = j->sinks ? j->sinks + h : NULL;
        }
#ifdef VW
        if (hd % VW == 0) {
            switch (R) {
            case 1: attn_rows(q, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, out, 1); break;
            case 2: attn_rows(q, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, out, 2); break;
            case 3: attn_rows(q, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, out, 3); break;
            default: attn_rows(q, k, v, n, hd, j->scale, j->softcap, sk, sc, j->sc_stride, out, 4); break;
            }
            continue;
        }
#endif
        for (int r = 0; r < R; r++) attn_head_scalar(q[r], k, v, n[r], hd, j->scale, j->softcap, sk[r], sc, out[r]);
    }
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
    /* prefill without a window: up to 4 query rows per item share each converted k / v row (same bits: see
     * attn_rows), as long as every thread still gets items */
    j.tq = 1;
    if ((window <= 0 || pos0 + n_tok <= window) && j.group < 4) /* every token sees the cache from row 0 */
        for (int64_t tq = 4 / j.group; tq > 1; tq--)
            if ((n_tok + tq - 1) / tq * (n_head / j.group) >= n_threads) {
                j.tq = tq;
                break;
            }
    j.n_items = (n_tok + j.tq - 1) / j.tq * (n_head / j.group);
    j.n_chunks = (work >= PAR_MIN && n_threads > 1) ? j.n_items : 1;
    j.sc_stride = (span + 15) / 16 * 16;
    j.th_stride = (j.group * j.tq < 4 ? j.group * j.tq : 4) * j.sc_stride;
    int64_t n_slots = j.n_chunks > 1 ? n_threads : 1;
    j.scratch = pi_pool_scratch(pool, (size_t)(n_slots * j.th_stride) * sizeof(float));
    pi_pool_run(pool, attn_chunk, &j, j.n_chunks);
}
