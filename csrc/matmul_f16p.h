/* matmul_f16p.h: internal (not read by cffi). F16 prefill as an outer product on packed panels (matmul_f16p.c). */
#ifndef PI_MATMUL_F16P_H
#define PI_MATMUL_F16P_H
#include <stdint.h>
#include "pi.h"

/* y[t, i] = sum_c w[row i][c] * x[t, c] (row i = sel ? sel[i] : i) for F16 weights of n_cols columns, x and y
 * dense. Returns 0, having done nothing, where the path does not apply (too few tokens, a build without
 * AVX-512, no memory for its buffers): the caller then runs matmul.c's tiles. */
int pi_f16_packed(pi_pool *pool, const void *w, const int32_t *sel, int64_t n_out, int64_t n_cols, const float *x,
                  int64_t n_tok, float *y);
#endif
