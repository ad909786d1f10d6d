/* threadpool.c: a persistent pthread pool (n_threads - 1 workers + the caller).
 *
 * Decoding calls a few hundred short kernels per token, so waking workers must cost microseconds: workers
 * spin on a job generation counter for a while after each job and only then sleep on a condition variable.
 * The caller takes part in every job.
 *
 * A job is finished when all of its CHUNKS are done, not when every worker has checked in: on a busy machine
 * (more runnable threads than cores) a worker may not get a core for milliseconds, and a caller that waited
 * for it would idle that long on each of the hundreds of kernels of a token (measured: Gemma 3 270M decoded at
 * 4.5 tok/s with two threads beside one busy process, instead of ~120 alone). So whoever is running takes the
 * chunks, and a worker that wakes after its job is over finds nothing left to claim.
 *
 * Claims are made on one 64-bit word, job number << 32 | next chunk, so that a late worker cannot claim a chunk
 * of a later job with the function and context it read for an earlier one: the caller first moves the word to
 * the new job, then (after a release fence) writes the job's fields; a worker reads the fields, then (after an
 * acquire fence) claims with the job number it woke for, which fails once the word has moved on. The caller
 * waits for the done count with a bounded spin, then yields the core, which lets a preempted worker that holds
 * a chunk finish it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
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
/* the caller's spin on unfinished chunks before it starts yielding its core (a few microseconds) */
#define WAIT_SPIN_ROUNDS 256

struct pi_pool {
    int n_threads;
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int generation;       /* bumped once per job, after its fields are written: wakes the workers */
    atomic_int stop;
    atomic_ullong claim;         /* (uint64)job << 32 | next chunk to take */
    atomic_llong done;           /* chunks of the current job finished */
    /* the current job; written by the caller only between jobs (see the header comment) */
    _Atomic(pi_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_llong n_chunks;
    uint32_t job;                /* caller only */
    void *scratch;
    size_t scratch_size;
};

typedef struct {
    pi_pool *pool;
    int thread_id;
} worker_arg;

/* Run chunks of job `job` until none is left (or the pool has moved on to another job). */
static void take_chunks(pi_pool *pool, uint32_t job, int thread_id) {
    pi_task_fn fn = atomic_load_explicit(&pool->fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&pool->ctx, memory_order_relaxed);
    const uint64_t n = (uint64_t)atomic_load_explicit(&pool->n_chunks, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire); /* fields read above: a claim below sees any newer job */
    uint64_t c = atomic_load_explicit(&pool->claim, memory_order_relaxed);
    for (;;) {
        if ((uint32_t)(c >> 32) != job || (c & 0xffffffffu) >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&pool->claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue; /* c now holds the current word */
        fn(ctx, (int64_t)(c & 0xffffffffu), thread_id);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
        c = atomic_load_explicit(&pool->claim, memory_order_relaxed);
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
        take_chunks(pool, (uint32_t)gen, thread_id); /* the job number is the generation that woke us */
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
    const uint32_t job = ++pool->job;
    /* move the claim word to the new job first: from here on no late worker can claim with an older job */
    atomic_store_explicit(&pool->claim, (uint64_t)job << 32, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&pool->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&pool->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&pool->n_chunks, n_chunks, memory_order_relaxed);
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_store_explicit(&pool->generation, (int)job, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    take_chunks(pool, job, 0);
    for (int i = 0; atomic_load_explicit(&pool->done, memory_order_acquire) < n_chunks; i++) {
        if (i < WAIT_SPIN_ROUNDS) cpu_relax();
        else sched_yield(); /* a worker holding a chunk may be waiting for this core */
    }
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
