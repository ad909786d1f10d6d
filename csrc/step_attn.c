/* step_attn.c: one decode step (one token) of a LLaMA attention block, in one call.
 *
 *   pi_attn_block_decode   rmsnorm -> Q, K, V mat-vecs [+ biases] [-> per-head Q/K norms] -> RoPE -> KV store ->
 *                          attention [sliding window] -> output mat-vec [-> its norm] -> residual add
 *                          [-> the FFN's rmsnorm]
 *
 * The kernels of norm.c, matmul.c, rope.c and attention.c in the order models/llama.py calls them, so the
 * result is bit-identical to that Python path (tests/test_attn_block.py). What it saves is the Python between
 * the kernels: on a decode token every layer streams tens of MB of weights through the caches, so the
 * interpreter's own data is cold each time it runs between two kernels, and a dozen numpy calls and wrapper
 * checks per layer cost far more than their warm microsecond each. llama, bamboo, qwen2 (Q/K/V biases),
 * gemma3 (Q/K norms, post-attention norm, sliding-window layers), gemma and gemma2 (attention soft-cap), smollm3
 * (n_rot 0 on its NoPE layers), gemma4 and gemma3n (weightless V norm, layers without attn_v, layers sharing
 * another's K/V), olmo2 (no pre-norm, whole-width Q/K norms, output norm), granite (the output scaled before the
 * residual add), gpt-oss (Q/K/V and output biases, attention sinks, sliding-window layers); other architectures
 * and batches keep the Python path.
 */
#include <string.h>

#include "pi.h"

static void add_bias(float *y, const float *bias, int64_t n) {
    if (bias)
        for (int64_t i = 0; i < n; i++) y[i] += bias[i];
}

void pi_attn_block_decode(pi_pool *pool, const pi_attn_block *b, float *x, int32_t pos, uint16_t *k_cache,
                          uint16_t *v_cache, int64_t n_ctx, float *work, float *ffn_in) {
    const int64_t n_embd = b->n_embd, n_q = b->n_head * b->head_dim, n_kv = b->n_head_kv * b->head_dim;
    float *h = work, *q = h + n_embd, *k = q + n_q, *v = k + n_kv, *a = v + n_kv, *o = a + n_q;

    /* olmo2 norms no input (attn_norm NULL) and norms q and k over their full width (qk_norm_full) */
    const int64_t q_rows = b->qk_norm_full ? 1 : b->n_head, kv_rows = b->qk_norm_full ? 1 : b->n_head_kv;
    if (b->attn_norm) pi_rmsnorm(pool, x, b->attn_norm, b->eps, 1, n_embd, h);
    else memcpy(h, x, (size_t)n_embd * sizeof(float));
    pi_matmul(pool, b->wq_type, b->wq, n_q, n_embd, h, 1, q);
    add_bias(q, b->bq, n_q);
    const int norm_first = !b->qk_norm_post_rope; /* hunyuan-dense norms q and k after RoPE */
    if (b->q_norm && norm_first) pi_rmsnorm(pool, q, b->q_norm, b->eps, q_rows, n_q / q_rows, q);
    if (b->wk) { /* NULL: a layer sharing another's K/V (gemma4, gemma3n) computes and stores none */
        pi_matmul(pool, b->wk_type, b->wk, n_kv, n_embd, h, 1, k);
        add_bias(k, b->bk, n_kv);
        if (!b->wv) memcpy(v, k, (size_t)n_kv * sizeof(float)); /* gemma4's layers without attn_v */
        if (b->k_norm && norm_first) pi_rmsnorm(pool, k, b->k_norm, b->eps, kv_rows, n_kv / kv_rows, k);
        if (b->wv) {
            pi_matmul(pool, b->wv_type, b->wv, n_kv, n_embd, h, 1, v);
            add_bias(v, b->bv, n_kv);
        }
        if (b->v_norm) pi_rmsnorm(pool, v, NULL, b->eps, b->n_head_kv, b->head_dim, v);
    }
    if (b->n_rot) {
        pi_rope(pool, q, &pos, 1, b->n_head, b->head_dim, b->n_rot, b->rope_base, b->rope_scale, b->rope_neox,
                b->rope_ff, b->rope_mscale);
        if (b->wk)
            pi_rope(pool, k, &pos, 1, b->n_head_kv, b->head_dim, b->n_rot, b->rope_base, b->rope_scale,
                    b->rope_neox, b->rope_ff, b->rope_mscale);
    }
    if (b->q_norm && !norm_first) pi_rmsnorm(pool, q, b->q_norm, b->eps, q_rows, n_q / q_rows, q);
    if (b->wk) {
        if (b->k_norm && !norm_first) pi_rmsnorm(pool, k, b->k_norm, b->eps, kv_rows, n_kv / kv_rows, k);
        pi_store_kv(k, 1, b->n_head_kv, b->head_dim, k_cache, n_ctx, pos);
        pi_store_kv(v, 1, b->n_head_kv, b->head_dim, v_cache, n_ctx, pos);
    }
    pi_attention(pool, q, k_cache, v_cache, 1, b->n_head, b->n_head_kv, b->head_dim, n_ctx, pos, b->window,
                 b->attn_scale, b->attn_softcap, b->sinks, a);
    pi_matmul(pool, b->wo_type, b->wo, n_embd, n_q, a, 1, o);
    add_bias(o, b->bo, n_embd);
    if (b->post_norm) pi_rmsnorm(pool, o, b->post_norm, b->eps, 1, n_embd, o);
    if (b->res_scale != 0.0f && b->res_scale != 1.0f) /* its own pass: the product is rounded before the add */
        for (int64_t i = 0; i < n_embd; i++) o[i] *= b->res_scale;
    for (int64_t i = 0; i < n_embd; i++) x[i] += o[i];
    if (ffn_in && b->ffn_norm) pi_rmsnorm(pool, x, b->ffn_norm, b->eps, 1, n_embd, ffn_in);
    else if (ffn_in) memcpy(ffn_in, x, (size_t)n_embd * sizeof(float));
}
