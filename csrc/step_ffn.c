/* step_ffn.c: one decode step (one token) of a predictor-driven ReLU-family FFN layer, in one call.
 *
 *   pi_sparse_ffn_decode   predictor -> active list -> gate gather -> activation -> up gather (live rows
 *                          only) -> h -> AXPY over ffn_down_t; or (exact mode) the dense gate -> its non-zero
 *                          activations -> the same up gather and AXPY
 *
 * It is a composition of the kernels in matmul.c and axpy.c, called in the order ffn.py calls them for
 * one token, so its output is bit-identical to that Python path (tests/test_kernels_sparse.py checks it).
 * What it saves is the Python between the kernels: ~10 numpy operations, wrapper checks and array
 * allocations per layer, ~100 us per layer on a 2-core machine, 5-10% of a sparse 7B token. Batches
 * (prefill), the hybrid split, observers and the variants with biases keep the Python path.
 *
 * Per token, with p the predictor input and x the normed FFN input:
 *   r      = relu(fc1 . p)                      f32 [rank]   (NaN stays NaN, as numpy's maximum)
 *   logits = fc2 . r                            mat-vec; or, with fc2_t and few enough non-zero r_k, the AXPY
 *                                               sum_{r_k != 0} r_k * fc2_t[k, :] (float fc2) or pi_fc2t_logits
 *                                               (Q4_0 / Q8_0 fc2: its copy by hidden unit) (predictor_logits)
 *   rows   = ascending i with logits[i] >= threshold
 *   a_j    = act(gate[rows[j]] . x)             relu; fatrelu: a if a > act_param else 0
 *   live   = the j with a_j != 0                (a zero activation makes h zero whatever up is: skip its up row)
 *   h_j    = a_j * (up[rows[j]] . x)            dReLU: a_j * relu(up . x)        for j in live
 *   y      = sum_{j in live, h_j != 0} h_j * down_t[rows[j], :]
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <string.h>
#include <time.h>

#include "pi.h"

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline float relu_keep_nan(float v) { return v < 0.0f ? 0.0f : v; } /* -0 and NaN pass, as np.maximum */
/* the gating activation: relu; FATReLU a if a > act_param else 0 (NaN -> 0) */
static inline float gate_act(const pi_sparse_ffn *f, float v) {
    return f->variant == PI_FFN_FATREGLU ? (v > f->act_param ? v : 0.0f) : relu_keep_nan(v);
}

/* logits f32 [n_ff] = fc2 . relu(fc1 . p); r: f32 [2 * rank] scratch, ridx: int32 [rank] scratch. Returns the
 * number of non-zero hidden units. */
static int64_t predictor_logits(pi_pool *pool, const pi_sparse_ffn *f, const float *p, float *r, int32_t *ridx,
                                float *logits) {
    const int64_t rank = f->rank;
    pi_matmul(pool, f->fc1_type, f->fc1, rank, f->n_embd, p, 1, r);
    for (int64_t i = 0; i < rank; i++) r[i] = relu_keep_nan(r[i]);
    const int64_t n = pi_select_nonzero(r, rank, ridx);
    if (f->fc2_t && n * 100 <= rank * PI_FC2_AXPY_MAX_PERCENT) {
        if (f->fc2_t_type >= PI_FC2T) { /* a quantized fc2's copy by hidden unit (on no scratch: the mat-vec) */
            if (pi_fc2t_logits(pool, f->fc2_t_type - PI_FC2T, f->fc2_t, f->n_ff, rank, r, logits) == 0) return n;
        } else {
            float *rv = r + rank;
            for (int64_t k = 0; k < n; k++) rv[k] = r[ridx[k]];
            if (n > 0) pi_axpy_rows(pool, f->fc2_t_type, f->fc2_t, f->n_ff, ridx, rv, n, 1, logits);
            else memset(logits, 0, (size_t)f->n_ff * sizeof(float));
            return n;
        }
    }
    pi_matmul(pool, f->fc2_type, f->fc2, f->n_ff, rank, r, 1, logits);
    return n;
}

int64_t pi_sparse_ffn_decode(pi_pool *pool, const pi_sparse_ffn *f, const float *x, const float *p,
                             float *fwork, int32_t *iwork, float *y, int64_t *n_nonzero) {
    const int64_t n_ff = f->n_ff, n_embd = f->n_embd;
    float *r = fwork, *logits = fwork + 2 * f->rank, *a = logits + n_ff, *u = a + n_ff;
    int32_t *rows = iwork, *live = iwork + n_ff, *ridx = iwork + 2 * n_ff;

    int64_t n_active, n_live = 0;
    const double t0 = f->timing ? seconds() : 0.0;
    if (f->exact) { /* exact mode: the gate for every neuron (ffn.py's dense matmul), its non-zero ones live */
        pi_matmul(pool, f->gate_type, f->gate, n_ff, n_embd, x, 1, logits);
        for (int64_t i = 0; i < n_ff; i++) logits[i] = gate_act(f, logits[i]);
        n_active = n_live = pi_select_nonzero(logits, n_ff, rows);
        for (int64_t k = 0; k < n_live; k++) a[k] = logits[rows[k]];
    } else {
        const int64_t n_hidden = predictor_logits(pool, f, p, r, ridx, logits);
        n_active = pi_select_active(logits, n_ff, f->threshold, rows);
        if (f->timing) {
            f->timing[1] += seconds() - t0;
            f->timing[3] += (double)n_hidden / (double)f->rank;
        }
    }
    if (!f->exact && n_active > 0) {
        pi_matmul_rows(pool, f->gate_type, f->gate, n_embd, rows, n_active, x, 1, a);
        for (int64_t j = 0; j < n_active; j++) a[j] = gate_act(f, a[j]);
        /* compact the live neurons in place: rows[k] and a[k] for k < n_live (k <= j, so nothing is lost) */
        n_live = pi_select_nonzero(a, n_active, live);
        for (int64_t k = 0; k < n_live; k++) {
            rows[k] = rows[live[k]];
            a[k] = a[live[k]];
        }
    }
    int64_t nz = 0;
    if (n_live > 0) {
        pi_matmul_rows(pool, f->up_type, f->up, n_embd, rows, n_live, x, 1, u);
        for (int64_t k = 0; k < n_live; k++) {
            const float uk = f->variant == PI_FFN_DREGLU ? relu_keep_nan(u[k]) : u[k];
            a[k] *= uk; /* h */
            nz += a[k] != 0.0f;
        }
        pi_axpy_rows(pool, f->down_type, f->down_t, n_embd, rows, a, n_live, 1, y);
    } else {
        memset(y, 0, (size_t)n_embd * sizeof(float));
    }
    *n_nonzero = nz;
    if (f->timing) {
        f->timing[0] += 1.0;
        f->timing[2] += seconds() - t0;
    }
    return n_active;
}

/* ---- one decode step of a threshold-mode SwiGLU/GeGLU FFN (threshold.py) ---------------------------------
 *   a     = act(gate . x)                       silu or gelu, dense (pi_silu / pi_gelu)
 *   rows  = ascending i with |a_i| * scale_i >= cut   (scale NULL: |a_i|)
 *   h_j   = a[rows[j]] * (up[rows[j]] . x)
 *   refine: rows as above with up_cut instead of cut (the candidates whose up row is read), then only the j
 *           with |h_j| >= cut stay in rows and h (compacted in order); the others count as zero
 *   y     = sum_j h_j * down_t[rows[j], :]      (transposed copy), or down . (h scattered into n_ff zeros)
 * The kernels threshold.py calls for one token, in its order: the same bits. */
int64_t pi_threshold_ffn_decode(pi_pool *pool, const pi_ffn_step *f, const float *x, float *fwork,
                                int32_t *iwork, float *y, int64_t *n_nonzero) {
    const int64_t n_ff = f->n_ff, n_embd = f->n_embd;
    float *pre = fwork, *a = pre + n_ff, *score = a + n_ff, *u = score + n_ff;
    int32_t *rows = iwork;

    pi_matmul(pool, f->gate_type, f->gate, n_ff, n_embd, x, 1, pre);
    if (f->act == PI_ACT_GELU) pi_gelu(pool, pre, a, n_ff);
    else pi_silu(pool, pre, a, n_ff);
    for (int64_t i = 0; i < n_ff; i++) {
        const float m = a[i] < 0.0f ? -a[i] : a[i]; /* |a|, exact (NaN stays NaN and is never kept) */
        score[i] = f->scale ? m * f->scale[i] : m;
    }
    int64_t n_kept = pi_select_active(score, n_ff, f->refine ? f->up_cut : f->cut, rows);
    int64_t nz = 0;
    if (n_kept > 0) pi_matmul_rows(pool, f->up_type, f->up, n_embd, rows, n_kept, x, 1, u);
    for (int64_t j = 0; j < n_kept; j++) u[j] = a[rows[j]] * u[j]; /* h */
    if (f->up_read) *f->up_read = n_kept;
    if (f->refine && n_kept > 0) { /* second stage: keep |h| >= cut, compacted in place (k <= j) */
        int32_t *keep = iwork + n_ff;
        for (int64_t j = 0; j < n_kept; j++) score[j] = u[j] < 0.0f ? -u[j] : u[j];
        const int64_t n2 = pi_select_active(score, n_kept, f->cut, keep);
        for (int64_t k = 0; k < n2; k++) {
            rows[k] = rows[keep[k]];
            u[k] = u[keep[k]];
        }
        n_kept = n2;
    }
    for (int64_t j = 0; j < n_kept; j++) nz += u[j] != 0.0f;
    *n_nonzero = nz;
    if (f->down_transposed) {
        if (n_kept > 0) pi_axpy_rows(pool, f->down_type, f->down, n_embd, rows, u, n_kept, 1, y);
        else memset(y, 0, (size_t)n_embd * sizeof(float));
    } else { /* the dense down projection of h scattered into zeros (score's space is free again) */
        memset(score, 0, (size_t)n_ff * sizeof(float));
        for (int64_t j = 0; j < n_kept; j++) score[rows[j]] = u[j];
        pi_matmul(pool, f->down_type, f->down, n_embd, n_ff, score, 1, y);
    }
    return n_kept;
}

/* ---- one decode step of a dense SwiGLU/GeGLU FFN (ffn.py's `off` path for ordinary GGUF files) ---------------
 *   y = down . (act(gate . x) * (up . x))      pi_matmul x 3 and pi_swiglu / pi_geglu, in ffn.py's order */
void pi_dense_ffn_decode(pi_pool *pool, const pi_ffn_step *f, const float *x, float *fwork, float *y) {
    const int64_t n_ff = f->n_ff, n_embd = f->n_embd;
    float *g = fwork, *u = fwork + n_ff;
    pi_matmul(pool, f->gate_type, f->gate, n_ff, n_embd, x, 1, g);
    pi_matmul(pool, f->up_type, f->up, n_ff, n_embd, x, 1, u);
    if (f->act == PI_ACT_GELU) pi_geglu(pool, g, u, g, n_ff);
    else pi_swiglu(pool, g, u, g, n_ff);
    pi_matmul(pool, f->down_type, f->down, n_embd, n_ff, g, 1, y);
}
