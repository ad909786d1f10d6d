/* pi_cuda.h: the whole C ABI of the optional CUDA library (powerinfer_py/libpi_cuda.so, `make cuda`).
 *
 * powerinfer_py/kernels/cuda.py opens the library with cffi in ABI mode (dlopen) and hands the text between
 * the "cdef begin/end" markers to cdef(), so that part holds plain C declarations only.
 *
 * Conventions
 *  - Every function returns 0 or a cudaError_t code; pi_cuda_error_string() names it. Launches are
 *    asynchronous on `stream` (NULL = the default stream); errors of a kernel may surface at the next sync.
 *  - Pointers named w, x, y, h, rows, ... are device pointers; Python validates shapes and types first.
 *  - Weight types are GGML type ids: 0 F32, 1 F16, 2 Q4_0, 8 Q8_0. Quantized weights are stored "planar" on
 *    the device: for an [n_rows, n_cols] tensor, first the quant plane (Q8_0: n_cols int8 per row, Q4_0:
 *    n_cols / 2 bytes of nibbles per row, in ggml's order: byte j of a block holds elements j and j + 16),
 *    then the scale plane (n_cols / 32 f16 per row). Same bytes as ggml's blocks, regrouped so that every
 *    row of the quant plane starts on a 16-byte boundary and can be read with 128-bit loads.
 *  - Rows: n_cols must be a multiple of 32 for Q8_0/Q4_0 and of 8 for F16, 4 for F32 (one 16-byte chunk).
 */
#ifndef PI_CUDA_H
#define PI_CUDA_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* cdef begin */
/* Device setup and memory. pi_cuda_init fails with the runtime's error code when there is no usable device
 * (no driver: 35 cudaErrorInsufficientDriver; no GPU: 100 cudaErrorNoDevice). */
int pi_cuda_init(int device, char *name, int name_len, size_t *free_bytes, size_t *total_bytes);
const char *pi_cuda_error_string(int code);
int pi_cuda_malloc(void **ptr, size_t n_bytes);
int pi_cuda_free(void *ptr);
int pi_cuda_memcpy_h2d(void *dst, const void *src, size_t n_bytes, void *stream);
int pi_cuda_memcpy_d2h(void *dst, const void *src, size_t n_bytes, void *stream);
int pi_cuda_memcpy_d2d(void *dst, const void *src, size_t n_bytes, void *stream);
int pi_cuda_memset(void *dst, int value, size_t n_bytes, void *stream);
int pi_cuda_stream_create(void **stream);
int pi_cuda_stream_destroy(void *stream);
int pi_cuda_stream_sync(void *stream);

/* y[j] = w[j, :] . x for j < n_rows (x f32 [n_cols], y f32 [n_rows]); relu != 0 applies max(0, .). */
int pi_cuda_matvec(int type, const void *w, int n_rows, int n_cols, const float *x, float *y, int relu,
                   void *stream);
/* y[j] = w[rows[j], :] . x for j < n_sel: the row gather over an active list (rows int32, ascending or not).
 * n_sel_dev, when not NULL, is a device int32 holding the real count (<= n_sel, which then sizes the grid):
 * the list made by pi_cuda_predictor never comes back to the host. */
int pi_cuda_matvec_rows(int type, const void *w, int n_rows, int n_cols, const int32_t *rows, int n_sel,
                        const int32_t *n_sel_dev, const float *x, float *y, void *stream);

/* The predictor: hidden = relu(fc1 . p) [rank], logits = fc2 . hidden [n_ff], active = ascending indices i
 * with logits[i] >= threshold (NaN never active), *n_active their count (all on the device). */
int pi_cuda_predictor(int type1, const void *fc1, int type2, const void *fc2, int rank, int n_ff, int n_embd,
                      const float *p, float threshold, float *hidden, float *logits, int32_t *active,
                      int32_t *n_active, void *stream);
/* active list alone: ascending i with logits[i] >= threshold, count in *n_active. */
int pi_cuda_select_active(const float *logits, int n, float threshold, int32_t *active, int32_t *n_active,
                          void *stream);

/* h[j] from gating values g[j] and up values u[j] (compact, j < n; n_dev as in matvec_rows):
 * variant 0 relu(g) * u, 1 (g > param ? g : 0) * u, 2 relu(g) * relu(u), 3 relu(g + b[j]) (u unused;
 * b may be NULL). */
int pi_cuda_ffn_act(int variant, const float *g, const float *u, const float *b, float *h, int n,
                    const int32_t *n_dev, float param, void *stream);

/* y[c] = sum_j h[j] * w[rows[j], c] over j < n_sel (n_sel_dev as in matvec_rows), h == 0 skipped.
 * The rows are split over n_splits (1..64) groups of blocks; each writes its partial sums to
 * partials[split][n_cols] and a second kernel adds them in split order: no atomics, no lost updates, the
 * same bits on every run. partials: f32 [64 * n_cols]. */
int pi_cuda_axpy_rows(int type, const void *w, int n_rows, int n_cols, const int32_t *rows, int n_sel,
                      const int32_t *n_sel_dev, const float *h, int n_splits, float *partials, float *y,
                      void *stream);

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w (w may be NULL), x, y f32 [n_tok, dim]. */
int pi_cuda_rmsnorm(const float *x, const float *w, float *y, int n_tok, int dim, float eps, void *stream);
/* In place on x f32 [n_tok, n_head, head_dim]: pair i < n_rot / 2 of token t turns by
 * pos[t] * freq_scale * freq_base^(-2i / n_rot) / freq_factors[i]; pairs (2i, 2i + 1), or (i, i + n_rot / 2)
 * when neox. freq_factors: device f32 [n_rot / 2] (rope_freqs.weight), or NULL for all 1; the rotated pairs are
 * scaled by mscale (YaRN's attention factor; 1 otherwise). */
int pi_cuda_rope(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim, int n_rot,
                 float freq_base, float freq_scale, int neox, const float *freq_factors, float mscale, void *stream);
/* Causal GQA attention over a device f16 cache k, v [n_head_kv, n_ctx, head_dim]: token t (position
 * pos0 + t) of q f32 [n_tok, n_head, head_dim] reads positions j <= pos0 + t (and j > pos0 + t - window
 * when window > 0) of KV head h / (n_head / n_head_kv). head_dim: 32, 64, 128 or 256. */
int pi_cuda_attention(const float *q, const uint16_t *k, const uint16_t *v, float *out, int n_tok, int n_head,
                      int n_head_kv, int head_dim, int n_ctx, int pos0, int window, float scale, void *stream);
/* cdef end */

#ifdef __cplusplus
}
#endif
#endif
