/* matmul_f16p.c: F16 prefill as an outer product on converted panels (pi_f16_packed),
 * y[t, r] = sum_c w[r, c] * x[t, c].
 *
 * matmul.c's float tiles compute a prefill as dot products: a tile holds R rows x T tokens of 16-lane partial
 * sums and each step loads R weight vectors and T activation vectors, so an F16 prompt spends much of its time
 * moving operands (85-90 GMAC/s per core on the 2-core Zen 5 host, where the same tile with its rows in L1 runs
 * 111 and plain FMAs 110-117). Here each step is an outer product instead, as BLAS kernels do:
 *
 *   - A tile is RB weight rows x TB tokens of f32 sums in registers, TB = 2 vectors of tokens. One step takes
 *     the TB tokens' activations at one column (two vector loads) and each of the RB rows' weights at that column
 *     (a broadcast load), and does 2 x RB FMAs. The register file sets the sizes: 2 x RB accumulators and 2
 *     activation vectors must fit in 32 zmm, so RB = 12 (26 live, room for the compiler's temporaries).
 *   - The broadcasts need the weights as f32, row by row, so the rows are converted into a per-thread buffer
 *     first (one conversion per vector; no transposes: a 16-bit transpose into [column][row] panels was tried
 *     and cost ~1 cycle per weight). A block of PB panels is converted while the block before it computes:
 *     each tile converts a share of the next block's rows, one vector every few of its steps, into the other of
 *     two buffers, so those loads from memory overlap its FMAs (the hardware prefetcher follows the rows). Done
 *     in bursts between tiles instead, from memory, the conversion ran at ~5 G weights/s and took 12-25% of
 *     the time, with software prefetch or without; inside the tiles it is nearly free.
 *   - The activations are packed once per call, [column][token] in slivers of TB tokens, column panel by column
 *     panel (pack_x), so a tile's vector loads walk one contiguous stream.
 *   - A block of PB panels is passed by every sliver in turn, so per FMA a tile reads 4 / TB bytes of weights
 *     and 4 / (PB x RB) of activations; PB = TB / RB rounded up (3) balances the two streams.
 *     The tiles run over sub-panels of KT columns, the block's rows and one sliver's activations for KT
 *     columns in half of L2 (kt_for), so the rows come from L2 for every sliver after the first.
 *   - KC, columns per conversion: whole rows where all tokens' packed activations fit in half of L3; else the
 *     row in the fewest equal panels that do (kc_for: the activations must stay in L3, every block reads them).
 *   - The conversion costs the same per weight for any number of tokens and the tiles' work grows with them, so
 *     the path starts at PACKED_MIN_TOK tokens. Measured: docs/performance.md, "F16 prefill as an outer product".
 *   - AVX-512 builds only. An AVX2 form (6 rows x 16 tokens in 16 ymm, plus one broadcast register) measured
 *     0.92-1.05x matmul.c's tiles in the haswell build on the Zen 5 host (128 and 512 tokens) and 0.76x at
 *     4096 x 11008 with 512 tokens: there those tiles already run at ~90% of the AVX2 FMA peak. It was removed.
 *
 * Each output is the sum over its sub-panels, in order, of the sequential FMA chain over the sub-panel's
 * columns (the partial sums through a per-thread buffer), wherever its row falls, so results do not depend on
 * the thread count or the chunking. They differ from matmul.c's dot tiles and from a decode of the same token
 * (another summation order); the error against a float64 reference stays at f32 rounding
 * (tests/test_kernels_matmul.py). Rows may be a selection (sel: output row i is weight row sel[i]). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "matmul_f16p.h"
#include "pool.h"

#if defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#define FP_AVX512 1
#define VEC 16
#define RB 12
#endif
#if defined(FP_AVX512)
#define TB (2 * VEC)
#define PB ((TB + RB - 1) / RB) /* row panels per block (see the header) */
#define PACKED_MIN_TOK 64      /* fewer tokens: matmul.c's tiles (24-48 tokens ran 0.76-0.97x of them) */

typedef __m512 vf;
#define VLOAD _mm512_load_ps
#define VSTORE _mm512_store_ps
#define VZERO _mm512_setzero_ps
#define VADD _mm512_add_ps
#define FMA _mm512_fmadd_ps
#define BCAST(p) _mm512_set1_ps(*(p))
#define CVT_STORE(dst, src) _mm512_store_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src))))

typedef struct {
    const uint16_t *w;
    const int32_t *sel;
    int64_t n_out, n_cols, n_tok;
    int64_t kc, kt, n_sliver; /* columns per panel and per sub-panel, slivers of TB tokens */
    const float *x;
    float *xp;  /* per column panel: [n_sliver][kc][TB] (pack_x) */
    float *wp;  /* per thread, twice: [PB][RB][kc], kc rounded up to a whole vector */
    float *acc; /* per thread: [PB][n_sliver][RB][TB], a block's sums until its last column panel */
    float *y;
    int64_t rows_per_chunk; /* a multiple of RB */
} fp_job;

static inline const uint16_t *row_ptr(const fp_job *j, int64_t r) {
    return j->w + (j->sel ? (int64_t)j->sel[r] : r) * j->n_cols;
}
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t kc_at(const fp_job *j, int64_t k0) { return min64(j->kc, j->n_cols - k0); }
static inline int64_t wp_stride(const fp_job *j) { return (j->kc + VEC - 1) / VEC * VEC; }

/* sliver s's activations for the column panel at k0: the panels one after another, each [n_sliver][kc][TB] */
static inline float *x_panel(const fp_job *j, int64_t k0, int64_t s) {
    return j->xp + k0 * j->n_sliver * TB + s * kc_at(j, k0) * TB;
}

/* chunk: token sliver s into its place in every column panel (a short sliver padded with zeros) */
static void pack_x(void *ctx, int64_t s, int thread_id) {
    (void)thread_id;
    const fp_job *j = ctx;
    for (int64_t k0 = 0; k0 < j->n_cols; k0 += j->kc) {
        const int64_t kc = kc_at(j, k0);
        float *dst = x_panel(j, k0, s);
        for (int t = 0; t < TB; t++) {
            const int64_t tok = s * TB + t;
            const float *src = tok < j->n_tok ? j->x + tok * j->n_cols + k0 : NULL;
            for (int64_t k = 0; k < kc; k++) dst[k * TB + t] = src ? src[k] : 0.0f;
        }
    }
}

/* One unit of a chunk's work: a block of row panels (rows [b0, be), np panels) and one column panel (k0, kc).
 * The units go block by block, each block's column panels in order. */
typedef struct {
    int64_t b0, be, np, k0, kc;
} fp_unit;

static int unit_at(const fp_job *j, int64_t b0, int64_t k0, int64_t re, fp_unit *u) {
    if (k0 >= j->n_cols) b0 = min64(b0 + PB * RB, re), k0 = 0;
    if (b0 >= re) return 0;
    u->b0 = b0, u->be = min64(b0 + PB * RB, re), u->np = (u->be - b0 + RB - 1) / RB;
    u->k0 = k0, u->kc = kc_at(j, k0);
    return 1;
}
static int unit_next(const fp_job *j, const fp_unit *u, int64_t re, fp_unit *n) {
    return unit_at(j, u->b0, u->k0 + j->kc, re, n);
}

/* A conversion spread over a tile's steps: rows [row, row_end) of unit u (over whole panels, rows past be
 * zero) into buf, one vector every `period` steps; src / dst: the current row's next vector. */
typedef struct {
    const fp_job *j;
    const fp_unit *u;
    float *buf;
    int64_t row, row_end, col;
    const uint16_t *src;
    float *dst;
} fp_conv;

static void conv_row_start(fp_conv *c) {
    for (; c->row < c->row_end; c->row++) {
        const int64_t stride = wp_stride(c->j);
        c->dst = c->buf + (c->row / RB) * RB * stride + (c->row % RB) * stride;
        c->col = 0;
        if (c->u->b0 + c->row < c->u->be) {
            c->src = row_ptr(c->j, c->u->b0 + c->row) + c->u->k0;
            return;
        }
        memset(c->dst, 0, (size_t)c->u->kc * sizeof(float)); /* a zero row of the last panel */
    }
}

/* vectors the conversion has left (an upper bound: the zero rows count too) */
static inline int64_t conv_left(const fp_conv *c) {
    if (c->row >= c->row_end) return 0;
    const int64_t per_row = c->u->kc / VEC;
    return (c->row_end - c->row) * per_row - c->col / VEC;
}

/* the next segment a tile converts: at most `want` whole vectors, all in the current row */
static inline int64_t conv_segment(const fp_conv *c, int64_t want) {
    if (c->row >= c->row_end) return 0;
    return min64(want, (c->u->kc - c->col) / VEC);
}

/* after a tile converted nv vectors: move on; at the row's end convert its scalar tail and start the next row */
static void conv_advance(fp_conv *c, int64_t nv) {
    if (c->row >= c->row_end) return;
    c->col += nv * VEC;
    if (c->col + VEC > c->u->kc) {
        for (; c->col < c->u->kc; c->col++) c->dst[c->col] = _cvtsh_ss(c->src[c->col]);
        c->row++;
        conv_row_start(c);
    }
}

/* the rest of the conversion at once (the first block, and what a block's tiles left) */
static void conv_finish(fp_conv *c) {
    while (c->row < c->row_end) {
        const int64_t nv = conv_segment(c, conv_left(c));
        for (int64_t v = 0; v < nv; v++) CVT_STORE(c->dst + c->col + v * VEC, c->src + c->col + v * VEC);
        conv_advance(c, nv);
    }
}

/* acc[RB][TB] (+)= the panel's RB rows times the sliver's V x VEC tokens over kc columns (V = 2, or 1 for a
 * last sliver of at most VEC tokens); meanwhile `nv` vectors of the conversion cv, one every kc / nv steps, so
 * that their loads from memory overlap the FMAs */
static inline __attribute__((always_inline)) void tile(const int V, const float *wp, int64_t stride,
                                                         const float *xp, int64_t kc, float *acc, int add,
                                                         const uint16_t *csrc, float *cdst, int64_t nv) {
    vf a0[RB], a1[RB];
    for (int r = 0; r < RB; r++) a0[r] = VZERO(), a1[r] = VZERO();
    const int64_t period = nv > 0 ? (kc / nv > 0 ? kc / nv : 1) : kc;
    for (int64_t k = 0; k < kc;) {
        const int64_t end = min64(k + period, kc);
        for (; k < end; k++) {
            const vf x0 = VLOAD(xp + k * TB), x1 = V == 2 ? VLOAD(xp + k * TB + VEC) : VZERO();
#pragma GCC unroll 12
            for (int r = 0; r < RB; r++) {
                const vf b = BCAST(wp + r * stride + k);
                a0[r] = FMA(x0, b, a0[r]);
                if (V == 2) a1[r] = FMA(x1, b, a1[r]);
            }
        }
        if (nv > 0) {
            _mm_prefetch((const char *)csrc + 512, _MM_HINT_T0);
            CVT_STORE(cdst, csrc);
            csrc += VEC, cdst += VEC, nv--;
        }
    }
    for (; nv > 0; nv--, csrc += VEC, cdst += VEC) CVT_STORE(cdst, csrc);
    for (int r = 0; r < RB; r++) {
        float *a = acc + r * TB;
        if (add) {
            a0[r] = VADD(VLOAD(a), a0[r]);
            if (V == 2) a1[r] = VADD(VLOAD(a + VEC), a1[r]);
        }
        VSTORE(a, a0[r]);
        if (V == 2) VSTORE(a + VEC, a1[r]);
    }
}

static void tile_any(const float *wp, int64_t stride, const float *xp, int64_t kc, float *acc, int64_t ntok, int add,
                     fp_conv *cv, int64_t want) {
    const int64_t nv = conv_segment(cv, want);
    const uint16_t *csrc = nv ? cv->src + cv->col : NULL;
    float *cdst = nv ? cv->dst + cv->col : NULL;
    if (ntok > VEC) tile(2, wp, stride, xp, kc, acc, add, csrc, cdst, nv);
    else tile(1, wp, stride, xp, kc, acc, add, csrc, cdst, nv);
    conv_advance(cv, nv);
}

/* chunk: output rows [chunk x rows_per_chunk, ...), unit by unit (see the header). While a unit's tiles run, the
 * next unit's rows are converted into the other weight buffer, a share after each tile. */
static void fp_chunk(void *ctx, int64_t chunk, int thread_id) {
    const fp_job *j = ctx;
    const int64_t stride = wp_stride(j), panel_acc = j->n_sliver * RB * TB, wp_size = PB * RB * stride;
    float *wbuf[2] = {j->wp + (int64_t)thread_id * 2 * wp_size, j->wp + ((int64_t)thread_id * 2 + 1) * wp_size};
    float *acc = j->acc + (int64_t)thread_id * PB * panel_acc;
    const int64_t rb = chunk * j->rows_per_chunk, re = min64(rb + j->rows_per_chunk, j->n_out);
    fp_unit u, n;
    if (!unit_at(j, rb, 0, re, &u)) return;
    fp_conv first = {.j = j, .u = &u, .buf = wbuf[0], .row = 0, .row_end = u.np * RB};
    conv_row_start(&first);
    conv_finish(&first);
    for (int cur = 0;; cur ^= 1) {
        const int has_n = unit_next(j, &u, re, &n);
        const int64_t n_sub = (u.kc + j->kt - 1) / j->kt, n_tiles = n_sub * j->n_sliver * u.np;
        fp_conv cv = {.j = j, .u = &n, .buf = wbuf[cur ^ 1], .row = 0, .row_end = has_n ? n.np * RB : 0};
        conv_row_start(&cv);
        const int64_t per_tile = (conv_left(&cv) + n_tiles - 1) / n_tiles;
        const float *wp = wbuf[cur];
        for (int64_t c0 = 0; c0 < u.kc; c0 += j->kt) { /* sub-panels: their rows and a sliver's x in L2 */
            const int64_t kt = min64(j->kt, u.kc - c0);
            for (int64_t s = 0; s < j->n_sliver; s++) {
                const float *xs = x_panel(j, u.k0, s) + c0 * TB;
                const int64_t ntok = j->n_tok - s * TB;
                for (int64_t p = 0; p < u.np; p++)
                    tile_any(wp + p * RB * stride + c0, stride, xs, kt, acc + p * panel_acc + s * RB * TB, ntok,
                             u.k0 + c0 > 0, &cv, per_tile);
            }
        }
        conv_finish(&cv); /* what the tiles left */
        if (u.k0 + u.kc >= j->n_cols) /* the block's last column panel: its sums go to y */
            for (int64_t p = 0; p < u.np; p++) { /* acc [sliver][row][token] -> y [token][row] */
                const int64_t r0 = u.b0 + p * RB, nrow = min64(RB, u.be - r0);
                const float *a = acc + p * panel_acc;
                for (int64_t t = 0; t < j->n_tok; t++) {
                    const float *at = a + (t / TB) * RB * TB + t % TB;
                    float *yt = j->y + t * j->n_out + r0;
                    for (int64_t r = 0; r < nrow; r++) yt[r] = at[r * TB];
                }
            }
        if (!has_n) break;
        u = n;
    }
}

/* a cache size as the C library reports it (sysconf), or `fallback` where it does not know or says something
 * outside [lo, hi] */
static int64_t cache_size(long reported, int64_t lo, int64_t hi, int64_t fallback) {
    return reported >= lo && reported <= hi ? (int64_t)reported : fallback;
}
#if defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
#define CACHE_SYSCONF(name) sysconf(name)
#else
#define CACHE_SYSCONF(name) (-1L)
#endif
/* L3: 8 MB where unknown */
static int64_t l3_size(void) {
    static int64_t cached;
    if (!cached) cached = cache_size(CACHE_SYSCONF(_SC_LEVEL3_CACHE_SIZE), 1L << 20, 1L << 30, 8L << 20);
    return cached;
}
/* L2 per core: 256 KB where unknown */
static int64_t l2_size(void) {
    static int64_t cached;
    if (!cached) cached = cache_size(CACHE_SYSCONF(_SC_LEVEL2_CACHE_SIZE), 64L << 10, 64L << 20, 256L << 10);
    return cached;
}

/* columns per panel: whole rows where the packed activations of all tokens fit in half of L3; else the row in
 * the fewest equal panels (whole vectors) that do */
static int64_t kc_for(int64_t n_cols, int64_t n_sliver) {
    const int64_t per_col = n_sliver * TB * 4, budget = l3_size() / 2;
    int64_t parts = (n_cols * per_col + budget - 1) / budget;
    if (parts < 1) parts = 1;
    const int64_t kc = ((n_cols + parts - 1) / parts + VEC - 1) / VEC * VEC;
    return min64(kc, n_cols);
}

/* columns per sub-panel: a block's rows (PB x RB x 4 bytes a column) and a sliver's activations (TB x 4) in half
 * of L2, whole vectors, at least 4 */
static int64_t kt_for(int64_t kc) {
    int64_t kt = l2_size() / 2 / ((PB * RB + TB) * 4) / (4 * VEC) * (4 * VEC);
    if (kt < 4 * VEC) kt = 4 * VEC;
    return min64(kt, kc);
}

int pi_f16_packed(pi_pool *pool, const void *w, const int32_t *sel, int64_t n_out, int64_t n_cols, const float *x,
                  int64_t n_tok, float *y) {
    if (n_tok < PACKED_MIN_TOK || n_out <= 0) return 0;
    fp_job j = {.w = w, .sel = sel, .n_out = n_out, .n_cols = n_cols, .n_tok = n_tok, .x = x, .y = y};
    j.n_sliver = (n_tok + TB - 1) / TB;
    j.kc = kc_for(n_cols, j.n_sliver);
    j.kt = kt_for(j.kc);
    const int64_t n_threads = pi_pool_n_threads(pool);
    const size_t xp_bytes = ((size_t)(j.n_sliver * TB * n_cols) * 4 + 63) / 64 * 64;
    const size_t acc_bytes = (size_t)(n_threads * PB * j.n_sliver * RB * TB) * 4;
    const size_t wp_bytes = (size_t)(n_threads * 2 * PB * RB * wp_stride(&j)) * 4;
    char *s = pi_pool_scratch(pool, xp_bytes + acc_bytes + wp_bytes);
    if (!s) return 0; /* no memory for the panels: matmul.c's tiles need none */
    j.xp = (float *)s;
    j.acc = (float *)(s + xp_bytes);
    j.wp = (float *)(s + xp_bytes + acc_bytes);
    pi_pool_run(pool, pack_x, &j, j.n_sliver);
    const int64_t n_panels = (n_out + RB - 1) / RB, n_chunks = pi_pool_chunks(pool, n_panels, 1);
    j.rows_per_chunk = (n_panels + n_chunks - 1) / n_chunks * RB;
    pi_pool_run(pool, fp_chunk, &j, (n_out + j.rows_per_chunk - 1) / j.rows_per_chunk);
    return 1;
}
#else
int pi_f16_packed(pi_pool *pool, const void *w, const int32_t *sel, int64_t n_out, int64_t n_cols, const float *x,
                  int64_t n_tok, float *y) {
    (void)pool, (void)w, (void)sel, (void)n_out, (void)n_cols, (void)x, (void)n_tok, (void)y;
    return 0;
}
#endif
