/* bench.c: what the kernel benchmarks measure with: a stopwatch, and read-bandwidth probes.
 *
 * Each pi_timed_* makes one call of the kernel it names, with the same arguments, and returns the call's wall
 * time in seconds, read in C just before and after it. Timed from Python instead, a figure also holds the cffi
 * call around the kernel, and with the caches flushed between calls (as the benchmarks do, so that weights come
 * from memory) that call alone took ~10 us on this project's 2-core host: 15% of a 95%-sparse Q4_0 AXPY over
 * a LLaMA-7B layer. The decode paths call these kernels from C (step_ffn.c, step_attn.c), so the C-side time
 * is the one a token pays.
 * The probes (pi_read_probe, pi_read_rows_probe) read memory the way the kernels do, with no arithmetic: the
 * GB/s a kernel is compared with. */
#define _POSIX_C_SOURCE 199309L
#include <string.h>
#include <time.h>

#include "pool.h"

/* the probes' vector paths: the same conditions as matmul.c's (MM_AVX512, MM_AVX2) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define PROBE_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PROBE_AVX2 1
#endif
#if defined(PROBE_AVX512) || defined(PROBE_AVX2)
#include <immintrin.h>
#endif

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

double pi_timed_axpy_q8t(pi_pool *pool, const int8_t *q, const float *d, int64_t n_in, int64_t n_cols,
                         const int32_t *rows, const float *h, int64_t n_sel, int64_t n_tok, float *y) {
    TIMED(pi_axpy_q8t(pool, q, d, n_in, n_cols, rows, h, n_sel, n_tok, y));
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

/* ==== read-bandwidth probe ============================================================================ */
#define PROBE_MAX_CHUNKS 256
typedef struct {
    const uint8_t *buf;
    int64_t bytes, per_chunk;
    uint64_t partial[PROBE_MAX_CHUNKS];
} probe_job;

/* The sum of the 8-byte words of b[0, n) (wrapping), then of its tail bytes: four independent chains keep
 * many loads in flight. pf: when not NULL, the same offsets of another buffer are prefetched as b is read (the
 * rows probe's next row). */
static uint64_t sum_words(const uint8_t *b, int64_t n, const uint8_t *pf) {
    uint64_t s = 0;
    int64_t i = 0;
#if defined(PROBE_AVX512)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 256 <= n; i += 256) {
        if (pf)
            for (int o = 0; o < 256; o += 64) _mm_prefetch((const char *)pf + i + o, _MM_HINT_T0);
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(b + i));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(b + i + 64));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(b + i + 128));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(b + i + 192));
    }
    s = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#elif defined(PROBE_AVX2)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 128 <= n; i += 128) {
        if (pf)
            for (int o = 0; o < 128; o += 64) _mm_prefetch((const char *)pf + i + o, _MM_HINT_T0);
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(b + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(b + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(b + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(b + i + 96)));
    }
    uint64_t l[4];
    _mm256_storeu_si256((__m256i *)l, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    s = l[0] + l[1] + l[2] + l[3];
#endif
    for (; i + 8 <= n; i += 8) {
        if (pf && !(i & 63)) __builtin_prefetch(pf + i); /* also in scalar builds (no immintrin.h) */
        uint64_t v;
        memcpy(&v, b + i, 8);
        s += v;
    }
    for (; i < n; i++) s += b[i];
    return s;
}

static void probe_chunk(void *ctx, int64_t c, int thread_id) {
    (void)thread_id;
    probe_job *p = ctx;
    int64_t beg = c * p->per_chunk, end = beg + p->per_chunk < p->bytes ? beg + p->per_chunk : p->bytes;
    p->partial[c] = sum_words(p->buf + beg, end - beg, NULL);
}

static double sum_partials(const uint64_t *partial, int64_t n) {
    uint64_t s = 0;
    for (int64_t c = 0; c < n; c++) s += partial[c]; /* chunk order: same sum every run */
    return (double)s;
}

double pi_read_probe(pi_pool *pool, const void *buf, int64_t bytes) {
    if (bytes <= 0) return 0.0;
    probe_job p = {.buf = buf, .bytes = bytes};
    int64_t n = pi_pool_chunks(pool, (bytes + 4095) / 4096, 16);
    if (n > PROBE_MAX_CHUNKS) n = PROBE_MAX_CHUNKS;
    p.per_chunk = ((bytes + n - 1) / n + 63) & ~(int64_t)63; /* whole cache lines per chunk */
    n = (bytes + p.per_chunk - 1) / p.per_chunk;
    pi_pool_run(pool, probe_chunk, &p, n);
    return sum_partials(p.partial, n);
}

/* ---- the same probe over scattered rows --------------------------------------------------------------------
 * Reads only the listed rows of a row-major matrix, as a sparse kernel's gathers do, but with no arithmetic:
 * what the access pattern itself allows. Threads take equal runs of the list; each row is summed as the
 * probe sums its chunks (sum_words) and, when `ahead` > 0, prefetches the row `ahead` places later at the same offset (the
 * kernels' scheme). Benchmarks print a kernel's GB/s against this beside the sequential probe. */
typedef struct {
    const uint8_t *buf;
    const int32_t *rows;
    int64_t row_bytes, n_sel, per_chunk;
    int ahead;
    uint64_t partial[PROBE_MAX_CHUNKS];
} rows_probe_job;

static void rows_probe_chunk(void *ctx, int64_t c, int thread_id) {
    (void)thread_id;
    rows_probe_job *p = ctx;
    int64_t beg = c * p->per_chunk, end = beg + p->per_chunk < p->n_sel ? beg + p->per_chunk : p->n_sel;
    uint64_t s = 0;
    for (int64_t r = beg; r < end; r++) {
        const uint8_t *next = p->ahead > 0 && r + p->ahead < p->n_sel
                              ? p->buf + (int64_t)p->rows[r + p->ahead] * p->row_bytes : NULL;
        s += sum_words(p->buf + (int64_t)p->rows[r] * p->row_bytes, p->row_bytes, next);
    }
    p->partial[c] = s;
}

double pi_read_rows_probe(pi_pool *pool, const void *buf, int64_t row_bytes, const int32_t *rows, int64_t n_sel,
                          int ahead) {
    if (n_sel <= 0 || row_bytes <= 0) return 0.0;
    rows_probe_job p = {.buf = buf, .rows = rows, .row_bytes = row_bytes, .n_sel = n_sel, .ahead = ahead};
    int64_t n = pi_pool_chunks(pool, n_sel, 1);
    if (n > PROBE_MAX_CHUNKS) n = PROBE_MAX_CHUNKS;
    p.per_chunk = (n_sel + n - 1) / n;
    n = (n_sel + p.per_chunk - 1) / p.per_chunk;
    pi_pool_run(pool, rows_probe_chunk, &p, n);
    return sum_partials(p.partial, n);
}
