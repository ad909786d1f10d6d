/* step_stack.c: one token through a stack of decoder layers in one call.
 *
 * models/base.py's one-token step used to come back to Python twice per layer (the attention block, then the
 * FFN, then the residual add): ~100 us of interpreter work per layer, 1.7-1.9 ms of a 16 ms Gemma 3 270M token
 * on the 2-core AVX2 EPYC. Here the same C calls run back to back in the same order:
 *   pi_attn_block_decode   x += attention block,  m = rmsnorm(x) * ffn_norm
 *   pi_dense_ffn_decode    y = down . (act(gate . m) * (up . m))              (kind PI_STACK_DENSE: ffn[l])
 *   pi_sparse_ffn_decode   y = the predictor / exact sparse FFN of m, its predictor reading the residual x
 *                          (PI_STACK_SPARSE: sparse[l], PWRI files)
 *   pi_threshold_ffn_decode  y = the threshold-mode FFN of m (PI_STACK_THRESHOLD: ffn[l], calibrated files)
 *                          (sparse and threshold layers: their counts go to n_active[l], n_nonzero[l])
 *   pi_rmsnorm             y = rmsnorm(y) * post_norm[l]                       (gemma2/3, olmo2: post_norm[l])
 *   x += y                 one f32 add per element, as numpy's in-place add
 * so the result has the bits of the Python loop. */
#include "pi.h"

void pi_decode_stack(pi_pool *pool, int64_t n_layer, const pi_attn_block *const *attn, const int32_t *kind,
                     const pi_ffn_step *const *ffn, const pi_sparse_ffn *const *sparse,
                     const float *const *post_norm, float post_eps, float *x, int32_t pos, uint16_t *const *k_cache,
                     uint16_t *const *v_cache, const int64_t *n_ctx, float *work, int64_t attn_work, int32_t *iwork,
                     int64_t *n_active, int64_t *n_nonzero) {
    for (int64_t l = 0; l < n_layer; l++) {
        const int64_t n_embd = attn[l]->n_embd;
        float *m = work + attn_work, *y = m + n_embd, *fwork = y + n_embd;
        pi_attn_block_decode(pool, attn[l], x, pos, k_cache[l], v_cache[l], n_ctx[l], work, m);
        switch (kind[l]) {
        case PI_STACK_SPARSE:
            n_active[l] = pi_sparse_ffn_decode(pool, sparse[l], m, x, fwork, iwork, y, &n_nonzero[l]);
            break;
        case PI_STACK_THRESHOLD:
            n_active[l] = pi_threshold_ffn_decode(pool, ffn[l], m, fwork, iwork, y, &n_nonzero[l]);
            break;
        default: pi_dense_ffn_decode(pool, ffn[l], m, fwork, y);
        }
        if (post_norm[l]) pi_rmsnorm(pool, y, post_norm[l], post_eps, 1, n_embd, y);
        for (int64_t i = 0; i < n_embd; i++) x[i] += y[i];
    }
}
