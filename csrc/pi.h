/* pi.h: the whole boundary between Python (cffi) and the C kernels.
 *
 * cffi reads this file with preprocessor lines stripped (csrc/build_ffi.py), so declarations here must be
 * plain C that cffi's parser accepts: no macros in declarations, no inline bodies.
 *
 * Conventions (see docs/DESIGN.md, "Conventions"):
 *   - `pi_<op>_<type>` names; one .c file per op family.
 *   - Shapes are given in elements, row-major, last dimension contiguous. `n_*` are counts, `*_dim` sizes.
 *   - Weight types use ggml's numbering (enum pi_type). Quantized rows are arrays of blocks in llama.cpp's
 *     layout: Q8_0 = {f16 d; int8 qs[32]} (34 B), Q4_0 = {f16 d; uint8 qs[16]} (18 B, element j in the low
 *     nibble of qs[j] for j < 16, element j+16 in the high nibble; value = (nibble - 8) * d); Q4_1, Q5_0,
 *     Q5_1, IQ4_NL, MXFP4 (32 elements) and Q2_K ... Q6_K, IQ4_XS and the I-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (256) are described in
 *     csrc/quants.h.
 *   - C trusts its arguments: Python validates shapes, types, contiguity and bounds before calling.
 *   - Every multi-threaded kernel takes the pool as its first argument; no kernel keeps hidden global state.
 */
#ifndef PI_H
#define PI_H
#include <stddef.h>
#include <stdint.h>

enum pi_type {
    PI_F32 = 0,
    PI_F16 = 1,
    PI_Q4_0 = 2,
    PI_Q4_1 = 3,
    PI_Q5_0 = 6,
    PI_Q5_1 = 7,
    PI_Q8_0 = 8,
    PI_Q2_K = 10,
    PI_Q3_K = 11,
    PI_Q4_K = 12,
    PI_Q5_K = 13,
    PI_Q6_K = 14,
    PI_IQ2_XXS = 16,
    PI_IQ2_XS = 17,
    PI_IQ3_XXS = 18,
    PI_IQ1_S = 19,
    PI_IQ4_NL = 20,
    PI_IQ3_S = 21,
    PI_IQ2_S = 22,
    PI_IQ4_XS = 23,
    PI_IQ1_M = 29,
    PI_BF16 = 30,
    PI_MXFP4 = 39
};

/* ---- thread pool (threadpool.c) ------------------------------------------------------------------------
 * A pool of n_threads - 1 workers plus the calling thread. Kernels split their work into chunks that
 * the threads take in a fixed order. The pool also owns a scratch buffer that kernels may use for
 * quantized activations; it grows on demand and is freed with the pool. */
typedef struct pi_pool pi_pool;
pi_pool *pi_pool_new(int n_threads);
void pi_pool_free(pi_pool *pool);
int pi_pool_n_threads(const pi_pool *pool);

/* ---- types and quantization (quant.c) ------------------------------------------------------------------
 * The facts of each weight type, one row per type id (enum pi_type), in one table that the kernels read
 * (quants.h: pi_traits) and Python reads through pi_type_traits_table (its twin: TYPE_TRAITS beside the GGMLType
 * enum, tested against it). Ids the kernels do not take have a zero row (kind PI_KIND_NONE). Kinds:
 *   PI_KIND_FLOAT   one value per element: F32, F16, BF16;
 *   PI_KIND_BLOCK   32-element blocks, one scale each: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4;
 *   PI_KIND_K       256-element super-blocks with a scale per group: Q2_K ... Q6_K, IQ4_XS;
 *   PI_KIND_IQ      256-element super-blocks of grid entries (matmul_iq.c): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 *                   IQ3_S, IQ1_S, IQ1_M. */
enum pi_type_kind { PI_KIND_NONE = 0, PI_KIND_FLOAT = 1, PI_KIND_BLOCK = 2, PI_KIND_K = 3, PI_KIND_IQ = 4 };
enum { PI_TYPE_COUNT = 40 };  /* type ids 0 .. PI_TYPE_COUNT - 1 */
typedef struct {
    int32_t block;    /* elements per block: 1 (float types), 32 or 256 */
    int32_t bytes;    /* bytes per block */
    int32_t kind;     /* enum pi_type_kind */
    int32_t group;    /* elements per scale: 32 (PI_KIND_BLOCK; Q4_K, Q5_K, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S)
                         or 16 (Q2_K, Q3_K, Q6_K, IQ2_XS, IQ2_S, IQ1_M); 0 for float types */
    int32_t has_min;  /* 1: an offset per scale, value = d * q + m (Q4_1, Q5_1) or d * sc * q - dmin * m (Q2_K,
                         Q4_K, Q5_K) */
} pi_type_traits;
const pi_type_traits *pi_type_traits_table(void); /* PI_TYPE_COUNT rows, row i for type id i */
int64_t pi_block_size(int type);                 /* elements per block: 1 (float types), 32 or 256 (K-quants) */
int64_t pi_row_size(int type, int64_t n_cols);   /* bytes of one row of n_cols elements */
/* src f32 [n_rows, n_cols] -> dst rows of `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; not K-quants).
 * Returns bytes written (0: type not supported). */
int64_t pi_quantize(int type, const float *src, void *dst, int64_t n_rows, int64_t n_cols);
/* src rows of `type` -> dst f32 [n_rows, n_cols] */
void pi_dequantize(int type, const void *src, float *dst, int64_t n_rows, int64_t n_cols);
/* ---- moving rows (rows.c) ------------------------------------------------------------------------------ */
/* KV-cache store: x f32 [n_tok, n_head_kv, head_dim] -> cache f16 [n_head_kv, n_ctx, head_dim] at positions
 * p0 .. p0 + n_tok - 1 (round to nearest even, as numpy's astype(float16)). The caller checks the bounds. */
void pi_store_kv(const float *x, int64_t n_tok, int64_t n_head_kv, int64_t head_dim, uint16_t *cache,
                 int64_t n_ctx, int64_t p0);
/* Transpose: dst [cols, rows] = src [rows, cols] for elements of esize bytes (1, 2, 4 or 8), in strips of 8
 * source rows (the copies of fc2 and ffn_down made at load). */
void pi_transpose(const void *src, int64_t rows, int64_t cols, int64_t esize, void *dst);
/* Embedding lookup: out[i, :] = dequantized row ids[i] of w (n_cols per row). */
void pi_get_rows(int type, const void *w, int64_t n_cols, const int32_t *ids, int64_t n_ids, float *out);

/* ---- dense matrix products (matmul.c) ------------------------------------------------------------------
 * y[t, r] = sum_c w[r, c] * x[t, c]   for t < n_tok, r < n_rows, c < n_cols.
 * w: n_rows rows of `type`, each pi_row_size(type, n_cols) bytes, contiguous.
 * x: f32 [n_tok, n_cols]; y: f32 [n_tok, n_rows].
 * For Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 the activations are first quantized to Q8_0 blocks (Q4_1, Q5_1: the same plus
 * llama.cpp's Q8_1 block sum s = f16(d * sum(q)), which the weights' m multiplies), for the K-quants (Q2_K ...
 * Q6_K), IQ4_XS and the IQ2 / IQ3 types to
 * Q8_K super-blocks (as llama.cpp does), and the dot products run in integers. n_tok == 1 is the decode
 * mat-vec; n_tok > 1 reuses each weight block for all
 * tokens while it is in cache. */
void pi_matmul(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols,
               const float *x, int64_t n_tok, float *y);
/* Row gather for the sparse FFN: y[t, j] = w[rows[j], :] . x[t, :] for j < n_sel (rows ascending, distinct,
 * in [0, n_rows)); y f32 [n_tok, n_sel]. Each selected row's result is bit-identical to pi_matmul's for that
 * row; the work is split by the number of selected rows. */
void pi_matmul_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows, int64_t n_sel,
                    const float *x, int64_t n_tok, float *y);

/* Expert groups of a mixture-of-experts layer in one call: w holds n_expert experts of n_rows rows each, one
 * after another (a 3-D GGUF tensor); group g applies expert experts[g] to the tokens tok_off[g] ..
 * tok_off[g + 1] - 1 of x (f32 [tok_off[n_group], n_cols]) and writes the same rows of y (f32
 * [tok_off[n_group], n_rows]). Each value has the bits pi_matmul gives that expert and group of tokens. */
void pi_matmul_experts(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols, const int32_t *experts,
                       const int64_t *tok_off, int64_t n_group, const float *x, float *y);
/* 1 where Q4_K / Q5_K / Q6_K products take the AMX-INT8 tiles in this process (a build for such a CPU, the
 * kernel's tile permission granted, POWERINFER_AMX not 0), else 0. Those sums then run in another order of f32
 * additions than the AVX-512 tiles' (each path gives decode and prefill the same bits). */
int pi_k_amx(void);
/* How the decode mat-vec of `type` reads its rows where the build has a choice (F16 on vector builds; Q8_0, BF16
 * and the Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 groups on AVX2): 1 row at a time (one stream per thread) or
 * several side by side (4, or 2 for the AVX2 groups; AVX2 F16 and BF16 2 or 4, BF16 never one), chosen once per
 * process from a timed FMA chain (matmul.c, the note above decode_rows_init) or by POWERINFER_DECODE_ROWS.
 * set = 1 switches to one row (ignored for BF16), set >= 2 to
 * several, 0 only asks (benchmarks, tests). Both give the same bits. Returns the rows in use, 0 where the type
 * has no choice. */
int pi_decode_rows(int type, int set);

/* Read-bandwidth probe (bench.c): reads `bytes` bytes of buf on all threads of the pool (a wide sum, so
 * nothing can be skipped) and returns the sum so the compiler keeps the loads. Used by benchmarks to print
 * kernel GB/s beside what this machine can read. */
double pi_read_probe(pi_pool *pool, const void *buf, int64_t bytes);
/* The probe over the listed rows (ascending indices into a row-major matrix of row_bytes-byte rows) only:
 * what a sparse kernel's access pattern allows with no arithmetic. ahead > 0: each row prefetches the row
 * `ahead` places later, as the gathers do; 0: the hardware prefetcher alone. */
double pi_read_rows_probe(pi_pool *pool, const void *buf, int64_t row_bytes, const int32_t *rows, int64_t n_sel,
                          int ahead);

/* Benchmark stopwatch (bench.c): one call of the kernel named, same arguments; returns its wall time in seconds
 * measured in C, without the Python call around it. */
double pi_timed_matmul(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                       int64_t n_tok, float *y);
double pi_timed_matmul_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows,
                            int64_t n_sel, const float *x, int64_t n_tok, float *y);
double pi_timed_axpy_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows,
                          const float *h, int64_t n_sel, int64_t n_tok, float *y);
double pi_timed_axpy_q8t(pi_pool *pool, const int8_t *q, const float *d, int64_t n_in, int64_t n_cols,
                         const int32_t *rows, const float *h, int64_t n_sel, int64_t n_tok, float *y);
double pi_timed_read_probe(pi_pool *pool, const void *buf, int64_t bytes);
double pi_timed_read_rows_probe(pi_pool *pool, const void *buf, int64_t row_bytes, const int32_t *rows,
                                int64_t n_sel, int ahead);

/* ---- norms (norm.c) ------------------------------------------------------------------------------------
 * x, y: f32 [n_tok, dim] (y may alias x). w, b: f32 [dim] or NULL (NULL = 1 for w, 0 for b). */
void pi_rmsnorm(pi_pool *pool, const float *x, const float *w, float eps, int64_t n_tok, int64_t dim, float *y);
void pi_layernorm(pi_pool *pool, const float *x, const float *w, const float *b, float eps,
                  int64_t n_tok, int64_t dim, float *y);

/* ---- rotary position embedding (rope.c) ----------------------------------------------------------------
 * x: f32 [n_tok, n_head, head_dim], rotated in place. pos: int32 [n_tok]. Only the first n_rot dims of each
 * head rotate. theta_i = pos * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i] (freq_factors: f32 [n_rot/2]
 * or NULL for all 1; GGUF rope_freqs.weight of LLaMA 3.1+ files); the rotated pairs are also scaled by mscale
 * (cos and sin times mscale, as ggml's attention factor does: YaRN; 1 for plain RoPE).
 * neox == 0: pairs are (x[2i], x[2i+1]) (llama.cpp "normal", GGUF llama Q/K are permuted for it);
 * neox != 0: pairs are (x[i], x[i + n_rot/2]) (NeoX / HF layout: qwen2, gemma3, falcon). */
void pi_rope(pi_pool *pool, float *x, const int32_t *pos, int64_t n_tok, int64_t n_head, int64_t head_dim,
             int64_t n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
             float mscale);

/* ---- softmax and attention (attention.c) ---------------------------------------------------------------
 * softmax over the last dim of x f32 [n_rows, n_cols], in place. */
void pi_softmax(pi_pool *pool, float *x, int64_t n_rows, int64_t n_cols);
/* Causal grouped-query attention over an f16 KV cache.
 * q:   f32 [n_tok, n_head, head_dim], query t sits at position pos0 + t.
 * k,v: f16 [n_head_kv, n_ctx, head_dim] (one layer of the cache); positions < pos0 + n_tok are filled.
 * out: f32 [n_tok, n_head, head_dim].
 * Query head h uses kv head h / (n_head / n_head_kv). Query at position p sees kv positions j with
 * j <= p and (window == 0 or j > p - window). Scores are scale * q.k, then, if softcap > 0, softcap *
 * tanh(score / softcap) (Gemma 2's attention logit soft-capping; 0: off), softmax in f32. sinks: f32 [n_head]
 * per-head logits that join each softmax's denominator (gpt-oss's attention sinks), or NULL for none. */
void pi_attention(pi_pool *pool, const float *q, const uint16_t *k, const uint16_t *v,
                  int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx,
                  int64_t pos0, int64_t window, float scale, float softcap, const float *sinks, float *out);

/* ---- activations (act.c); x, g, u, y: f32 [n]; y may alias an input ----------------------------------- */
void pi_relu(pi_pool *pool, const float *x, float *y, int64_t n);
void pi_silu(pi_pool *pool, const float *x, float *y, int64_t n);
void pi_gelu(pi_pool *pool, const float *x, float *y, int64_t n);            /* tanh approximation */
void pi_swiglu(pi_pool *pool, const float *g, const float *u, float *y, int64_t n);  /* silu(g) * u */
void pi_geglu(pi_pool *pool, const float *g, const float *u, float *y, int64_t n);   /* gelu(g) * u */

/* ---- sparse FFN (axpy.c) -------------------------------------------------------------------------------
 * AXPY over selected rows of ffn_down_t (rows of n_cols = n_embd values of `type`: F32, F16, BF16, Q8_0, Q4_0
 * with SIMD paths; Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K ... Q6_K, IQ4_XS, IQ2_* / IQ3_* unpacked block by block):
 *   y[t, c] = sum_{j < n_sel, h[t, j] != 0} h[t, j] * w[rows[j], c]
 * rows: int32 [n_sel], ascending, in range; h: f32 [n_tok, n_sel]; y: f32 [n_tok, n_cols], overwritten.
 * Rows whose h is zero for every token are never read, and the threads' split depends only on the rows left
 * (and the thread count): the same bits with or without zero-h rows in the list. One token (F32/F16/BF16/
 * Q8_0/Q4_0): the live rows are cut into one contiguous part per thread, whose partial outputs are summed in
 * a fixed order (bit-identical from run to run for a thread count). Batches: threads split the output
 * columns, each y element one fixed fma chain over j (bit-identical across thread counts too). */
void pi_axpy_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows, const float *h,
                  int64_t n_sel, int64_t n_tok, float *y);
/* AXPY over selected rows of a matrix in Q8 tiles (axpy_q8t.c; kernels/ref.py's axpy_tiles is the spec):
 * q int8 [n_in, n_cols] row-major, d f32 [ceil(n_in/32), ceil(n_cols/32)], w[i, c] ~ d[i/32, c/32] * q[i, c].
 * Per token t and tile row B (the rows[j] with rows[j] / 32 == B): a = max |h[t, j]|, dx = a / 127,
 * xq = rint(h * (1 / dx)); isum[c] = sum_j xq * q[rows[j], c] exactly; y[t, c] = fma(dx * d[B, c/32], isum[c], y)
 * over B ascending from 0 (a = 0: nothing). rows ascending, in range; y f32 [n_tok, n_cols], overwritten.
 * A batch gives each token the bits of its one-token result on one thread; one token on n threads splits the
 * tile rows into parts summed in a fixed order (bit-identical from run to run for a thread count). */
void pi_axpy_q8t(pi_pool *pool, const int8_t *q, const float *d, int64_t n_in, int64_t n_cols, const int32_t *rows,
                 const float *h, int64_t n_sel, int64_t n_tok, float *y);
/* Ascending i < n with logits[i] >= threshold (NaN: not selected) into out (room for n); returns the count. */
int64_t pi_select_active(const float *logits, int64_t n, float threshold, int32_t *out);
/* Ascending i < n with x[i] != 0 (NaN selected, -0 not) into out (room for n); returns the count. */
int64_t pi_select_nonzero(const float *x, int64_t n, int32_t *out);

/* ---- a Q4_0 / Q8_0 predictor fc2 repacked by hidden unit (fc2t.c) -----------------------------------------
 * fc2 [n_ff, rank] of `type` PI_Q4_0 or PI_Q8_0 (rank a multiple of 32) copied into a layout whose row k holds
 * hidden unit k's codes for every output (the f16 scales apart), the same codes and scales as the file, so
 * that logits = fc2 . r reads only the rows of the units whose Q8_0 code is non-zero (r = relu(fc1 . p) is
 * about half zeros). Layout and arithmetic: fc2t.c. pi_fc2t_bytes: the copy's size (-1: bad type or shape);
 * pi_fc2t_pack: fc2 -> out (pi_fc2t_bytes bytes); pi_fc2t_logits: r f32 [rank] -> logits f32 [n_ff]
 * (overwritten). The logits are the mat-vec's exact block dots summed in another order; bit-identical from
 * run to run for a thread count. Both return 0 (-1: bad type or shape, -2: out of memory). */
int64_t pi_fc2t_bytes(int type, int64_t n_ff, int64_t rank);
int pi_fc2t_pack(pi_pool *pool, int type, const void *fc2, int64_t n_ff, int64_t rank, void *out);
int pi_fc2t_logits(pi_pool *pool, int type, const void *copy, int64_t n_ff, int64_t rank, const float *r,
                   float *logits);

/* ---- one decode step of a predictor-driven FFN layer (step_ffn.c) --------------------------------------
 * The composition ffn.py runs for one token in predictor mode, in one call (no Python between kernels):
 * r = relu(fc1 . p); rows = ascending i with (fc2 . r)[i] >= threshold; a = act(gate[rows] . x);
 * live = rows with a != 0; h = a * (up[live] . x) (dReLU: a * relu(up . x)); y = AXPY of h over down_t[live].
 * Gated ReLU-family variants without biases only. Weights: fc1 [rank, n_embd], fc2 [n_ff, rank],
 * gate/up [n_ff, n_embd], down_t [n_ff, n_embd], each of its own type.
 * fc2_t (optional, NULL if none): fc2 transposed [rank, n_ff], the same values (float types), or for a Q4_0 /
 * Q8_0 fc2 its copy by hidden unit (pi_fc2t_pack; fc2_t_type PI_FC2T + the type). The predictor's hidden layer
 * relu(fc1 . p) is sparse (about half its units are 0), so fc2 . r then reads only the rows of the non-zero
 * r_k (the AXPY over them, or pi_fc2t_logits), when they are at most PI_FC2_AXPY_MAX_PERCENT of the rank (past
 * that the dense mat-vec reads as fast); same values, another summation order than the mat-vec. */
enum { PI_FC2_AXPY_MAX_PERCENT = 80, PI_FC2T = 1000 };
enum pi_ffn_variant { PI_FFN_REGLU = 0, PI_FFN_FATREGLU = 1, PI_FFN_DREGLU = 2 };
typedef struct {
    int variant;          /* enum pi_ffn_variant */
    int exact;            /* 1: exact mode, no predictor: the gate for every neuron, live where act != 0
                             (fc1/fc2 unused; the return value is the live count) */
    float act_param;      /* FATReLU: a is kept where a > act_param */
    float threshold;      /* predictor: neuron i is active where logits[i] >= threshold */
    int64_t n_embd, n_ff, rank;
    int fc1_type, fc2_type, gate_type, up_type, down_type, fc2_t_type;
    const void *fc1, *fc2, *gate, *up, *down_t, *fc2_t;
    double *timing;       /* optional (NULL: none), 4 sums each call adds to: [0] 1 (calls), [1] seconds in the
                             predictor (fc1, fc2, the selection), [2] seconds in the whole step, [3] the share of
                             the predictor's hidden units that were non-zero (so [3] / [0] is its mean) */
} pi_sparse_ffn;
/* x: normed FFN input f32 [n_embd]; p: predictor input f32 [n_embd]; fwork: f32 [2 * rank + 3 * n_ff];
 * iwork: int32 [rank + 2 * n_ff]; y: f32 [n_embd], overwritten. Returns the number of predicted-active neurons and
 * stores the number of non-zero h in *n_nonzero. Bit-identical to the separate kernels. */
int64_t pi_sparse_ffn_decode(pi_pool *pool, const pi_sparse_ffn *f, const float *x, const float *p,
                             float *fwork, int32_t *iwork, float *y, int64_t *n_nonzero);

/* ---- one decode step of a LLaMA attention block (step_attn.c) ------------------------------------------
 * For one token at position pos, with x the residual stream f32 [n_embd] (updated in place):
 *   h = rmsnorm(x) * attn_norm; q, k, v = Wq h, Wk h, Wv h; RoPE on q and k (n_rot dims, if n_rot > 0);
 *   k, v stored at pos in the f16 cache planes [n_head_kv, n_ctx, head_dim]; a = attention over positions
 *   0..pos; x += Wo a; then, if ffn_in is not NULL, ffn_in = rmsnorm(x) * ffn_norm (the FFN's input).
 * Optional (NULL / 0 for LLaMA): per-head RMSNorms of q and k right after their mat-vecs, an RMSNorm of the
 * output before the residual add, a sliding window (gemma3); Q/K/V biases (qwen2); attention logit soft-capping
 * (gemma2: attn_softcap > 0, see pi_attention); a scale of the output before the add (granite: res_scale); q/k norms
 * after RoPE instead of before (hunyuan-dense: qk_norm_post_rope). The same kernels in the order the Python path
 * calls them: bit-identical to it. Blocks without biases. work: f32 [2 * n_embd + 2 * n_head * head_dim
 * + 2 * n_head_kv * head_dim]. olmo2: attn_norm NULL (no pre-norm: h = x), ffn_norm NULL (ffn_in = x), and
 * qk_norm_full = 1 (q_norm, k_norm are f32 [n_head * head_dim], [n_head_kv * head_dim]: one RMSNorm over the
 * whole q and the whole k instead of one per head). gemma4 / gemma3n: v_norm = 1 (a per-head RMSNorm of v without
 * weight); wv NULL (v is Wk h, taken before k's norm); wk and wv NULL (a layer that shares another's K/V: it
 * computes and stores none and attends over the cache planes it is given, which that layer filled at pos). */
typedef struct {
    int64_t n_embd, n_head, n_head_kv, head_dim, n_rot;
    float eps, rope_base, rope_scale, attn_scale;
    float attn_softcap;                  /* attention logit soft-cap (gemma2), 0: off */
    float res_scale;                     /* the output is multiplied by it before the add (granite); 0 or 1: none */
    int rope_neox;
    const float *attn_norm, *ffn_norm;   /* f32 [n_embd] (ffn_norm used only when ffn_in is given), or NULL */
    const float *q_norm, *k_norm;        /* f32 [head_dim] per-head RMSNorms of q and k (gemma3), or NULL */
    int qk_norm_full;                    /* 1: q_norm, k_norm span the whole q and k (olmo2) */
    int qk_norm_post_rope;               /* 1: q_norm, k_norm applied after RoPE, not before (hunyuan-dense) */
    const float *post_norm;              /* f32 [n_embd] RMSNorm of the block's output before the add, or NULL */
    int64_t window;                      /* sliding window (0: full attention) */
    const float *bq, *bk, *bv;           /* f32 biases added after the Q, K, V mat-vecs (qwen2), or NULL */
    const float *bo;                     /* f32 [n_embd] bias added after the output mat-vec (gpt-oss), or NULL */
    const float *sinks;                  /* f32 [n_head] attention sink logits (gpt-oss, see pi_attention), or NULL */
    const float *rope_ff;                /* f32 [n_rot/2] RoPE frequency factors (rope_freqs.weight), or NULL */
    float rope_mscale;                   /* scale of the rotated dims (YaRN attention factor; 1 otherwise) */
    int wq_type, wk_type, wv_type, wo_type;
    const void *wq, *wk, *wv, *wo;       /* [n_head*head_dim, n_embd] x 1, [n_head_kv*head_dim, n_embd] x 2,
                                            [n_embd, n_head*head_dim]; wk, wv may be NULL (see above) */
    int v_norm;                          /* 1: per-head RMSNorm of v without weight (gemma4, gemma3n) */
} pi_attn_block;
void pi_attn_block_decode(pi_pool *pool, const pi_attn_block *b, float *x, int32_t pos, uint16_t *k_cache,
                          uint16_t *v_cache, int64_t n_ctx, float *work, float *ffn_in);

/* ---- one decode step of a SwiGLU/GeGLU FFN, threshold-mode or dense (step_ffn.c) -----------------------
 * a = act(gate . x); keep i where |a_i| * scale_i >= cut (scale NULL: |a_i|); h = a[kept] * (up[kept] . x);
 * y = AXPY of h over down_t[kept] (down_transposed) or down . h scattered into zeros. Bit-identical to the
 * separate kernels in threshold.py's order. gate/up [n_ff, n_embd]; down [n_embd, n_ff] or down_t
 * [n_ff, n_embd]. fwork: f32 [4 * n_ff]; iwork: int32 [2 * n_ff]; y: f32 [n_embd]. Returns the kept count.
 * refine (two-stage files, threshold.py): the score rule with up_cut picks the candidates whose up row is read;
 * of them only those with |h_j| >= cut are kept (down projection, count); the others count as zero.
 * up_read: NULL, or where each call writes how many up rows it read (the kept count, or refine: the candidates).
 * pi_ffn_step describes one layer for both steps (the dense one reads only its shapes, act and weights). */
enum pi_act { PI_ACT_SILU = 0, PI_ACT_GELU = 1 };
typedef struct {
    int act;              /* enum pi_act */
    float cut;
    const float *scale;   /* f32 [n_ff] or NULL */
    int refine;           /* 1: candidates by |a_i| * scale_i >= up_cut, kept by |h_j| >= cut */
    float up_cut;
    int64_t n_embd, n_ff;
    int gate_type, up_type, down_type, down_transposed;
    const void *gate, *up, *down;
    int64_t *up_read;     /* NULL or out, see above */
} pi_ffn_step;
int64_t pi_threshold_ffn_decode(pi_pool *pool, const pi_ffn_step *f, const float *x, float *fwork,
                                int32_t *iwork, float *y, int64_t *n_nonzero);
/* The dense SwiGLU/GeGLU FFN for one token: y = down . (act(gate . x) * (up . x)), with the same description
 * (cut, scale and down_transposed unused; down [n_embd, n_ff]). fwork: f32 [2 * n_ff]. */
void pi_dense_ffn_decode(pi_pool *pool, const pi_ffn_step *f, const float *x, float *fwork, float *y);

/* ---- one token through a stack of decoder layers (step_stack.c) ---------------------------------------------
 * Per layer l, in order: pi_attn_block_decode(attn[l], x, pos, k_cache[l], v_cache[l], n_ctx[l]) giving the
 * FFN input m; by kind[l]: PI_STACK_DENSE y = pi_dense_ffn_decode(ffn[l], m), PI_STACK_SPARSE y =
 * pi_sparse_ffn_decode(sparse[l], m, x), PI_STACK_THRESHOLD y = pi_threshold_ffn_decode(ffn[l], m) (these two
 * leave their counts in n_active[l], n_nonzero[l]); y = rmsnorm(y) * post_norm[l] with post_eps where post_norm[l]
 * is not NULL; x += y. The bits of the same calls made one by one. work: f32 [attn_work + 2 * n_embd + the
 * largest FFN work (2 * n_ff dense, 2 * rank + 3 * n_ff sparse, 4 * n_ff threshold)], attn_work >= every
 * block's work; iwork: int32 [the largest rank + 2 * n_ff (sparse) or 2 * n_ff (threshold)], NULL if neither. */
enum { PI_STACK_DENSE = 0, PI_STACK_SPARSE = 1, PI_STACK_THRESHOLD = 2 };
void pi_decode_stack(pi_pool *pool, int64_t n_layer, const pi_attn_block *const *attn, const int32_t *kind,
                     const pi_ffn_step *const *ffn, const pi_sparse_ffn *const *sparse,
                     const float *const *post_norm, float post_eps, float *x, int32_t pos, uint16_t *const *k_cache,
                     uint16_t *const *v_cache, const int64_t *n_ctx, float *work, int64_t attn_work, int32_t *iwork,
                     int64_t *n_active, int64_t *n_nonzero);

/* ---- one decode token of a gated delta-net layer (step_delta_net.c) -------------------------------------
 * Qwen3.5's delta net after its input projections (qwen35.py): qkv f32 [conv_dim] (conv_dim = 2 Hk d + Hv d,
 * rows q | k | v), z f32 [Hv d] (the output gate's projection), beta_raw, alpha_raw f32 [Hv]. The causal conv
 * (conv_w f32 [conv_dim, K], K >= 2) reads conv_state f32 [K-1, conv_dim] (oldest input first) and this token's
 * qkv, then SiLU; q and k are L2-normed per key head (x / max(|x|, eps)), q scaled by 1/sqrt(d); value head h reads
 * key head h mod Hk; beta = sigmoid(beta_raw), g = ssm_a * softplus(alpha_raw + dt_bias); per value head, S
 * f32 [Hv, d_v, d_k] gets S = exp(g) S, S += beta (v - S k) k^T, and o = S q; out f32 [Hv d] = per head
 * rmsnorm(o) * ssm_norm * silu(z). conv_state and S are updated in place. work: f32 [conv_dim + 2 Hv + Hv d].
 * split_heads: 1 splits the value heads over the pool, 0 runs them on the calling thread; the result is the same
 * either way and for every thread count. */
typedef struct {
    int64_t d, n_k_heads, n_v_heads, conv_kernel;
    float eps;                           /* of the L2 norms and of the output RMS norm */
    int split_heads;                     /* 1: the value heads over the pool's threads; 0: all on the caller */
    const float *conv_w;                 /* f32 [conv_dim, conv_kernel] */
    const float *ssm_a, *dt_bias;        /* f32 [Hv]: the decay rate (-exp(A_log)) and the dt bias */
    const float *ssm_norm;               /* f32 [d] weight of the output RMS norm */
} pi_delta_net;
void pi_delta_net_decode(pi_pool *pool, const pi_delta_net *p, const float *qkv, const float *z,
                         const float *beta_raw, const float *alpha_raw, float *conv_state, float *S, float *work,
                         float *out);

/* ---- one decode token of the Mamba-2 selective scan (ssm_scan.c) -----------------------------------------
 * H heads of P values, G groups of B and C (head h reads group h / (H / G)), state width N. S f32 [H, P, N] is
 * updated in place: S_h = exp(dt_h A_h) S_h + dt_h x_h B_g^T; y f32 [H, P] = S_h C_g. x f32 [H, P]; dt (already
 * softplus'd) and A f32 [H]; B and C f32 [G, N]. The result is the same for every thread count. */
void pi_ssm_scan_step(pi_pool *pool, int64_t H, int64_t P, int64_t N, int64_t G, float *S, const float *x,
                      const float *dt, const float *A, const float *B, const float *C, float *y);

#endif
