/* pool.h: internal (not read by cffi). How kernels hand work to the thread pool.
 *
 * A job is n_chunks independent chunks; fn(ctx, chunk, thread_id) computes one. Threads take chunks in
 * increasing order from a shared counter, so which thread runs a chunk varies, but each chunk's result
 * never depends on it: kernels that must reduce across chunks write per-chunk partials and reduce them
 * in chunk order afterwards, which keeps results bit-identical from run to run. */
#ifndef PI_POOL_H
#define PI_POOL_H
#include <stddef.h>
#include <stdint.h>
#include "pi.h"

typedef void (*pi_task_fn)(void *ctx, int64_t chunk, int thread_id);

/* Runs fn over chunks 0..n_chunks-1 on all threads of the pool and returns when every chunk is done. */
void pi_pool_run(pi_pool *pool, pi_task_fn fn, void *ctx, int64_t n_chunks);

/* A scratch buffer of at least `bytes`, 64-byte aligned, owned by the pool (valid until the next call). */
void *pi_pool_scratch(pi_pool *pool, size_t bytes);

/* Chunks to split n items into so that each of the pool's threads gets a few (load balance) and no chunk
 * is smaller than min_items. */
int64_t pi_pool_chunks(const pi_pool *pool, int64_t n_items, int64_t min_items);

#endif
