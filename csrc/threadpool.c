/* threadpool.c: a persistent pthread pool (n_threads - 1 workers + the caller).
 *
 * Decoding calls a few hundred short kernels per token, so waking workers must cost microseconds: workers
 * spin on a job generation counter for a while after each job and only then sleep on a condition variable.
 * The caller takes part in every job and spins until the workers have finished theirs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* about a few milliseconds of spinning before a worker sleeps */
#define SPIN_ROUNDS 20000

struct pi_pool {
    int n_threads;
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int generation;   /* bumped once per job */
    atomic_int stop;
    atomic_int pending;      /* workers that have not finished the current job */
    atomic_llong next_chunk;
    pi_task_fn fn;
    void *ctx;
    int64_t n_chunks;
    void *scratch;
    size_t scratch_size;
};

typedef struct {
    pi_pool *pool;
    int thread_id;
} worker_arg;

static void take_chunks(pi_pool *pool, int thread_id) {
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&pool->next_chunk, 1, memory_order_relaxed);
        if (c >= pool->n_chunks) break;
        pool->fn(pool->ctx, c, thread_id);
    }
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    pi_pool *pool = arg->pool;
    int thread_id = arg->thread_id;
    free(arg);
    int seen = 0;
    for (;;) {
        int gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        for (int i = 0; gen == seen && i < SPIN_ROUNDS; i++) {
            cpu_relax();
            gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        }
        if (gen == seen) {
            pthread_mutex_lock(&pool->mu);
            while ((gen = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = gen;
        take_chunks(pool, thread_id);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

pi_pool *pi_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    pi_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->workers = calloc((size_t)n_threads, sizeof(pthread_t));
    for (int t = 1; t < n_threads; t++) {
        worker_arg *arg = malloc(sizeof *arg);
        arg->pool = pool;
        arg->thread_id = t;
        if (pthread_create(&pool->workers[t], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = t; /* run with the threads we got */
            break;
        }
    }
    return pool;
}

void pi_pool_free(pi_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int t = 1; t < pool->n_threads; t++) pthread_join(pool->workers[t], NULL);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool->scratch);
    free(pool);
}

int pi_pool_n_threads(const pi_pool *pool) { return pool->n_threads; }

void pi_pool_run(pi_pool *pool, pi_task_fn fn, void *ctx, int64_t n_chunks) {
    if (n_chunks <= 0) return;
    if (pool->n_threads == 1 || n_chunks == 1) {
        for (int64_t c = 0; c < n_chunks; c++) fn(ctx, c, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_chunks = n_chunks;
    atomic_store_explicit(&pool->next_chunk, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    take_chunks(pool, 0);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) cpu_relax();
}

void *pi_pool_scratch(pi_pool *pool, size_t bytes) {
    if (bytes > pool->scratch_size) {
        free(pool->scratch);
        size_t size = (bytes + 63) & ~(size_t)63;
        pool->scratch = aligned_alloc(64, size);
        pool->scratch_size = pool->scratch ? size : 0;
    }
    return pool->scratch;
}

int64_t pi_pool_chunks(const pi_pool *pool, int64_t n_items, int64_t min_items) {
    if (min_items < 1) min_items = 1;
    int64_t n = (int64_t)pool->n_threads * 4;
    if (n_items / n < min_items) n = n_items / min_items;
    return n < 1 ? 1 : n;
}
