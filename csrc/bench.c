/* bench.c: a stopwatch for the kernel benchmarks.
 *
 * Each pi_timed_* makes one call of the kernel it names, with the same arguments, and returns the call's wall
 * time in seconds, read in C just before and after it. Timed from Python instead, a figure also holds the cffi
 * call around the kernel, and with the caches flushed between calls (as the benchmarks do, so that weights come
 * from memory) that call alone took ~10 us on this project's 2-core host: 15% of a 95%-sparse Q4_0 AXPY over
 * a LLaMA-7B layer. The decode paths call these kernels from C (sparse_ffn.c, attn_block.c), so the C-side time
 * is the one a token pays. */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#include "pi.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TIMED(call)                                                                                            \
    do {                                                                                                       \
        double t0 = now_s();                                                                                   \
        call;                                                                                                  \
        return now_s() - t0;                                                                                   \
    } while (0)

double pi_timed_matmul(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                       int64_t n_tok, float *y) {
    TIMED(pi_matmul(pool, type, w, n_rows, n_cols, x, n_tok, y));
}

double pi_timed_matmul_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows,
                            int64_t n_sel, const float *x, int64_t n_tok, float *y) {
    TIMED(pi_matmul_rows(pool, type, w, n_cols, rows, n_sel, x, n_tok, y));
}

double pi_timed_axpy_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows,
                          const float *h, int64_t n_sel, int64_t n_tok, float *y) {
    TIMED(pi_axpy_rows(pool, type, w, n_cols, rows, h, n_sel, n_tok, y));
}

/* the probes' sums are dropped: their loads cannot be skipped anyway (each returns its sum to its caller) */
double pi_timed_read_probe(pi_pool *pool, const void *buf, int64_t bytes) {
    volatile double sink;
    TIMED(sink = pi_read_probe(pool, buf, bytes); (void)sink);
}

double pi_timed_read_rows_probe(pi_pool *pool, const void *buf, int64_t row_bytes, const int32_t *rows,
                                int64_t n_sel, int ahead) {
    volatile double sink;
    TIMED(sink = pi_read_rows_probe(pool, buf, row_bytes, rows, n_sel, ahead); (void)sink);
}
