/* axpy.c: the sparse FFN kernels other than the row-gather mat-vec (that one is pi_matmul_rows, matmul.c).
 *
 *   pi_axpy_rows       y[t, :] = sum_j h[t, j] * w[rows[j], :]   (the down projection over ffn_down_t rows)
 *   pi_select_active   ascending i with logits[i] >= threshold    (predictor mode)
 *   pi_select_nonzero  ascending i with x[i] != 0                 (exact mode, after ReLU)
 *
 * AXPY work split. Rows whose h is zero for every token are dropped first (never loaded); the split then
 * depends only on that list of live rows and the thread count, so `exact` mode (which passes only live rows)
 * and `off` (every row, zeros included) get the same split and the same bits.
 *   - one token (decode): by ROWS. The live list is cut into n_part contiguous parts of equal row counts
 *     (one part with one thread; else PARTS_PER_THREAD parts per thread, fewer when there are few rows:
 *     MIN_PART_ROWS each). Threads claim parts from the pool's counter, so a thread the OS preempts on a
 *     shared host leaves its second part to the other one. Part 0 accumulates into y, part k into its own
 *     partial of n_cols floats (pool scratch); afterwards y += partial 1, partial 2, ... in that order, the
 *     columns of y split among the threads (reduce_parts). Each part streams whole rows, which the memory
 *     system serves faster than the half-rows a column split gives each of two threads: on the real active
 *     sets of a 32-layer 7B-shape model, cold, the row split read 16.7 GB/s where column slices read 13.4 (and
 *     column slices with the arithmetic removed, loads only, 14.8). Inside a part the rows go DEC_ROWS (8) at a
 *     time over the tiles of y: a y tile is loaded and stored once per 8 rows (it was 4).
 *     Bits: y = fma(s_j, q_j, .) over each part's rows in list order, then the fixed-order sum of the parts;
 *     deterministic for a given thread count (one part, e.g. one thread, is the plain chain over all rows).
 *   - batches (n_tok > 1): by OUTPUT COLUMNS. Each chunk owns a column slice [c0, c1) of y for all tokens
 *     and walks every live row over that slice, converting each weight vector once for all tokens; nothing
 *     is shared and there is nothing to reduce. Each y element is one fma chain over the live rows in list
 *     order, so a batch gives the bits of a one-part decode of each of its tokens, for any thread count.
 *     Slices are kept >= 1 KB of a row when the thread count allows it and never below 256 B.
 * BF16 rows take h rounded to bf16 (pi_bf_round, in a scratch copy, before the live list is made), as every BF16
 * product does (matmul.c): the AXPY over ffn_down_t then multiplies what the dense down projection would.
 * The next row group is software-prefetched in both splits, since the hardware prefetcher cannot guess which
 * row comes next (decode: into L2, see prefetch_tile).
 *
 * Decode, measured for the model-wide mode (w = a stored transpose: 4096 x 12288 q|k|v, 4096 x 22016 gate|up,
 * 11008 x 4096 down; random rows dropped, cold) on the 2-core Zen 4 host (AVX-512) while three other sessions'
 * jobs ran on it (load average ~6, so every figure moves by tens of percent from call to call):
 *   python benchmarks/bench_kernels.py --axpy --types T --repeat 9 --prefill-tok 0
 * run type by type alternately with the previous axpy.c (4 rows per group, prefetch into L1, vector Q8_0
 * scale, one part per thread) and this one. Touched-bytes GB/s against the probe over as many bytes
 * ("same" column); median over the 3 shapes x 40/50/60% (range), 1 thread / 2 threads:
 *   F16   before 59% (35-67) / 58% (29-79)    after 83% (61-93) / 76% (47-98)
 *   BF16  before 52% (31-76) / 58% (22-94)    after 88% (46-154) / 84% (29-215)
 *   Q8_0  before 52% (28-61) / 51% (30-205)   after 65% (33-77) / 62% (27-116)
 *   F32   before 63% (24-78) / 65% (51-88)    after 94% (43-118) / 91% (74-113)
 * (ratios above 100% are calls that ran while the probe of the same round was preempted.) In a quieter
 * moment, Q8_0 4096 x 12288, 1 thread, after: 74% at 0%, 79% at 1%, 81% at 40% dropped. Q8_0 is bound by its
 * arithmetic on one thread (each 16 weights: a sign extension, a conversion and an fma, plus the block scale):
 * with rows in L1 it converts ~20 G weights/s per thread, about what one thread reads from memory here.
 * Tried and not kept (differences within the noise): prefetching 1-8 KB ahead along the current rows instead
 * of the next group at the same offset, no software prefetch (better for F16, worse for Q8_0), 4 or 8 parts
 * per thread, 4 rows per group with the new prefetch, 256-bit vectors for Q8_0 on the AVX-512 host.
 *
 * Prefill on the same layout, 128 tokens, 2 threads, every row live, against the dense pi_matmul on the
 * original layout of the same matrix (the --prefill-tok 128 part of the command above; batch code unchanged):
 * dense/axpy time F16 1.54 / 0.95 / 1.59, BF16 1.01 / 1.74 / 0.99, F32 1.82 / 2.11 / 2.00, Q8_0 0.48 / 0.86 / 0.77
 * (shapes in the order above; an earlier run: Q8_0 0.73 / 0.71 / 0.64, F16 1.05-1.25). Q8_0 is below 0.9: the dense
 * Q8_0 prefill multiplies in int8 (VNNI dot products on quantized activations) while this path converts the
 * weights to f32 and keeps the decode's bits (fma(h * d, q, y) row after row, which the tests pin); both reach
 * ~45-55 GFLOP/s per f32 fma here.
 *
 * For n_tok > 1 a slice is cut into sub-slices so that y[:, sub-slice] stays in L2 (each weight byte is
 * still read exactly once). From PANEL_MIN_TOK tokens on (vector builds, the types above) the live rows go
 * 64 at a time through an f32 panel while tiles of 6 tokens' outputs stay in registers (panel_rows below):
 * a 128-token prefill of one LLaMA-7B ffn_down_t, 2 threads on the AVX2 EPYC, 21-31 -> 110-140 GFLOP/s.
 *
 * Variants: AVX-512 (F + BW + VL): 16 lanes, 64-column tiles, masked column tails for float types;
 * AVX2 + FMA + F16C: 8 lanes, 32-column tiles, scalar (fmaf) column tails; scalar: everything else.
 * AVX2 Q4_0 (decode and batches) widens the two 8-byte halves of a block to int32 once and takes both nibbles from each
 * (the same values, so the same bits, as four separate 8-nibble loads): on an AVX2-only EPYC, rows in L1
 * (`bench_sparse.py --compute --types Q4_0 --kernels axpy --threads 1`, two alternating runs) 8.4-8.5 ->
 * 11.8-12.3 G weights/s per thread; it remains bound by its arithmetic there (~40% of one thread's read probe).
 * Types: F32, F16, BF16, Q8_0, Q4_0 on those paths (s = h * d once per row and block, then one fma per
 * element); Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K ... Q6_K, IQ4_XS are unpacked block by block to their pi_dequantize
 * values v and applied as y = fma(h, v, y), portable C (correct everywhere, not tuned).
 */
#include <math.h>
#include <string.h>

#include "quants.h" /* block layouts, pi_h2f, pi_unpack_q32 / pi_unpack_qk (other block types) */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define SP_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SP_AVX2 1
#endif
#if defined(SP_AVX512) || defined(SP_AVX2)
#include <immintrin.h>
#endif

#define INLINE static inline __attribute__((always_inline))
#define MIN_SLICE_BYTES 1024  /* preferred contiguous run per row and chunk */
#define MIN_SLICE_FLOOR 256   /* accepted when fewer chunks than threads would leave cores idle */
#define L2_Y_BYTES (256 * 1024) /* y[:, sub-slice] budget for n_tok > 1 */
#define DEC_ROWS 8          /* decode: live rows per group (one load and store of each y tile per group) */
#define PARTS_PER_THREAD 2  /* decode with > 1 thread: parts of the live list per thread (see the header) */
#define MIN_PART_ROWS 16        /* decode: fewer live rows per thread than this are not worth a partial */

static inline float sp_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

typedef struct {
    int type;
    const uint8_t *w;
    int64_t row_bytes, n_cols, n_sel, n_tok;
    const int32_t *rows;   /* [n_sel] neuron (row) ids */
    const float *h;        /* f32 [n_tok, n_sel] */
    const int32_t *act;    /* [n_act] positions j in 0..n_sel-1 with some h[t, j] != 0, ascending */
    int64_t n_act;
    int64_t cols_per_chunk;
    float *y;              /* f32 [n_tok, n_cols] */
    int64_t n_part;        /* decode: parts of the live list */
    float *partial;        /* decode: f32 [n_part - 1, n_cols], part k >= 1 writes row k - 1 */
    const float *hact;     /* batches on the panel path: f32 [n_tok, n_act], h[t, act[a]]; else NULL */
} axpy_job;

/* ---- one weight value group: the scale of the block holding column c, and the values at c ------------- */
/* Column c of a row p: block types store q (integers) and a per-block f16 scale d; float types have d = 1. */
INLINE float blk_scale(const int T, const uint8_t *p, int64_t c) {
    if (T == PI_Q8_0) return pi_h2f(((const block_q8_0 *)p)[c / QK].d);
    if (T == PI_Q4_0) return pi_h2f(((const block_q4_0 *)p)[c / QK].d);
    return 1.0f;
}

static inline float scalar_q(const int T, const uint8_t *p, int64_t c) {
    switch (T) {
    case PI_F32: return ((const float *)p)[c];
    case PI_F16: return pi_h2f(((const uint16_t *)p)[c]);
    case PI_BF16: return sp_bf16(((const uint16_t *)p)[c]);
    case PI_Q8_0: return (float)((const block_q8_0 *)p)[c / QK].qs[c % QK];
    default: {
        const block_q4_0 *b = (const block_q4_0 *)p + c / QK;
        int j = (int)(c % QK);
        return (float)((j < QK / 2 ? b->qs[j] & 0x0f : b->qs[j - QK / 2] >> 4) - 8);
    }
    }
}

#if defined(SP_AVX512)
#define VL 16
#define NV 4  /* vectors per tile */
#define GB 4  /* rows per group, n_tok > 1 */
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_SET1(x) _mm512_set1_ps(x)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
/* 16 weight values at column c (c % 16 == 0) of row p */
INLINE vf vq(const int T, const uint8_t *p, int64_t c) {
    switch (T) {
    case PI_F32: return _mm512_loadu_ps((const float *)p + c);
    case PI_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + c)));
    case PI_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + c))), 16));
    case PI_Q8_0:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i *)(((const block_q8_0 *)p)[c / QK].qs + (c & 16)))));
    default: { /* Q4_0: permutexvar reads only the low 4 bits of each index: nibble -> (nibble - 8) as f32 */
        __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((const block_q4_0 *)p)[c / QK].qs));
        if (c & 16) x = _mm512_srli_epi32(x, 4);
        return _mm512_permutexvar_ps(x, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
    }
    }
}
/* float types only: the first n (< 16) values at column c, the rest zero */
INLINE vf vq_part(const int T, const uint8_t *p, int64_t c, int64_t n) {
    __mmask16 m = (__mmask16)((1u << n) - 1);
    if (T == PI_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + c);
    __m256i x = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + c);
    if (T == PI_F16) return _mm512_cvtph_ps(x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
#define V_LOAD_PART(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1), p)
#define V_STORE_PART(p, v, n) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (n)) - 1), v)
#elif defined(SP_AVX2)
#define VL 8
#define NV 4
#define GB 2
typedef __m256 vf;
#define V_ZERO() _mm256_setzero_ps()
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_SET1(x) _mm256_set1_ps(x)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
INLINE vf vq(const int T, const uint8_t *p, int64_t c) {
    switch (T) {
    case PI_F32: return _mm256_loadu_ps((const float *)p + c);
    case PI_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + c)));
    case PI_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + c))), 16));
    case PI_Q8_0:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(((const block_q8_0 *)p)[c / QK].qs + (c & 31)))));
    default: {
        __m128i x = _mm_loadl_epi64((const __m128i *)(((const block_q4_0 *)p)[c / QK].qs + (c & 15)));
        if (c & 16) x = _mm_srli_epi16(x, 4);
        x = _mm_sub_epi8(_mm_and_si128(x, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
    }
    }
}
#else
#define VL 1
#define NV 4
#define GB 4
#endif

/* y[0:n) += sum over the group's rows, one column at a time (tails and the scalar build). Same operation
 * order as the vector path: y = fma(h * d, q, y) row after row. */
INLINE void axpy_cols_scalar(const int T, const int G, const uint8_t *const *p, const float *hs, float *y,
                             int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c++) {
        float acc = y[c];
        for (int r = 0; r < G; r++) acc = fmaf(hs[r] * blk_scale(T, p[r], c), scalar_q(T, p[r], c), acc);
        y[c] = acc;
    }
}

#if VL > 1
/* Tiles: TILE columns, a whole number of blocks (AVX-512: 64 columns = 2 blocks; AVX2: 32 = 1 block).
 * Slices start at a multiple of 64 columns, so tile k of a row starts at byte k * tile_bytes(T) and every
 * offset inside it is a compile-time constant. */
#define TILE (VL * NV)
INLINE int64_t tile_bytes(const int T) { return TILE / pi_traits[T].block * pi_traits[T].bytes; }
/* per-block scales per tile (block types), else 1; the scale of vector v is s[sidx(T, v)] */
#define NS(T) ((T) == PI_Q8_0 || (T) == PI_Q4_0 ? TILE / QK : 1)
#define SIDX(T, v) ((T) == PI_Q8_0 || (T) == PI_Q4_0 ? (v) * VL / QK : 0)

#if defined(SP_AVX2)
/* Q4_0, AVX2: the 32 values (nibble - 8) of the block at pt, as the tile's NV = 4 vectors in column order. Each
 * 8-byte half of the block is widened to int32 once and gives two vectors (low nibbles: columns 0-7 / 8-15,
 * high nibbles: 16-23 / 24-31); vq's four narrow loads give the same values, so the same bits. */
INLINE void q4_tile_avx2(const uint8_t *pt, vf *q) {
    const uint8_t *qs = ((const block_q4_0 *)pt)->qs;
    const __m256i w0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
    const __m256i w1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
    const __m256i m = _mm256_set1_epi32(15), e = _mm256_set1_epi32(8);
    q[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(w0, m), e));
    q[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(w1, m), e));
    q[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(w0, 4), e));
    q[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(w1, 4), e));
}
#endif

/* The hardware prefetcher cannot guess the next active row: fetch the next group's tile a group ahead, one
 * prefetch per 64 bytes from the tile's start. Successive prefetch addresses along a row are never more than
 * 64 bytes apart (the next tile starts tile_bytes on), so every line of the row slice is requested.
 * Into L2 (T1), not L1: a group ahead is a whole pass over DEC_ROWS rows (8 x 8-44 KB here), far more than L1
 * holds, so lines sent to L1 were evicted before use and took L1 fill slots from the demand loads; see the
 * header for what the change gave. */
INLINE void prefetch_tile(const int T, const uint8_t *pt) {
    for (int64_t o = 0; o < tile_bytes(T); o += 64) _mm_prefetch((const char *)pt + o, _MM_HINT_T1);
}
#endif

/* ---- n_tok == 1: one group of G rows over the columns [c0, c1) of y ----------------------------------
 * p: the G rows, hs: their h; pn: the next group's 4 rows (or PN == 0), prefetched tile by tile. */
INLINE void decode_group(const int T, const int G, const uint8_t *const *p, const float *hs,
                         const uint8_t *const *pn, const int PN, float *y, int64_t c0, int64_t c1) {
    int64_t c = c0;
#if VL > 1
    const int64_t tb = tile_bytes(T);
    for (int64_t off = c0 / TILE * tb; c + TILE <= c1; c += TILE, off += tb) {
        for (int r = 0; r < PN; r++) prefetch_tile(T, pn[r] + off);
        vf acc[NV];
        for (int v = 0; v < NV; v++) acc[v] = V_LOAD(y + c + v * VL);
        for (int r = 0; r < G; r++) {
            const uint8_t *pt = p[r] + off;
#if defined(SP_AVX512)
            if (T == PI_Q8_0 || T == PI_Q4_0) { /* h * d in all lanes: broadcast the f16, convert 16 at once */
                __m512 s[TILE / QK];
                /* s = h * d (one f32 rounding either way), a scalar product broadcast once. Q4_0: measured
                 * 42-44% against 36-39% of the read probe at 95% sparsity, 75-81% against 53-73% at 0% (three
                 * alternating runs) over the vector form. Q8_0 had kept the vector form (2-3 points better with
                 * 4 rows per group); with 8 rows per group the scalar form converted ~5-10% more weights per
                 * second with rows in L1 (two alternating runs, 1 thread). */
                for (int b = 0; b < NS(T); b++)
                    s[b] = _mm512_set1_ps(hs[r] * _cvtsh_ss(T == PI_Q4_0 ? ((const block_q4_0 *)pt)[b].d
                                                                          : ((const block_q8_0 *)pt)[b].d));
                for (int v = 0; v < NV; v++) acc[v] = V_FMA(s[SIDX(T, v)], vq(T, pt, v * VL), acc[v]);
                continue;
            }
#endif
#if defined(SP_AVX2)
            if (T == PI_Q4_0) {
                vf q[NV];
                q4_tile_avx2(pt, q);
                const vf s = V_SET1(hs[r] * blk_scale(T, pt, 0));
                for (int v = 0; v < NV; v++) acc[v] = V_FMA(s, q[v], acc[v]);
                continue;
            }
#endif
            float s[TILE / QK];
            for (int b = 0; b < NS(T); b++) s[b] = hs[r] * blk_scale(T, pt, b * QK);
            for (int v = 0; v < NV; v++) acc[v] = V_FMA(V_SET1(s[SIDX(T, v)]), vq(T, pt, v * VL), acc[v]);
        }
        for (int v = 0; v < NV; v++) V_STORE(y + c + v * VL, acc[v]);
    }
    for (; c + VL <= c1; c += VL) {
        vf acc = V_LOAD(y + c);
        for (int r = 0; r < G; r++) acc = V_FMA(V_SET1(hs[r] * blk_scale(T, p[r], c)), vq(T, p[r], c), acc);
        V_STORE(y + c, acc);
    }
#if defined(SP_AVX512)
    if (c < c1 && T != PI_Q8_0 && T != PI_Q4_0) { /* float types: the last < 16 columns, masked */
        int64_t n = c1 - c;
        vf acc = V_LOAD_PART(y + c, n);
        for (int r = 0; r < G; r++) acc = V_FMA(V_SET1(hs[r]), vq_part(T, p[r], c, n), acc);
        V_STORE_PART(y + c, acc, n);
        c = c1;
    }
#endif
#endif
    axpy_cols_scalar(T, G, p, hs, y, c, c1);
}

/* ---- n_tok > 1: one group of G rows (positions pos[] in the active list) over columns [c0, c1) -------
 * Each weight vector is converted once and applied to every token; tokens whose h is zero add
 * fma(0, q, y) = y, the same bits as skipping them (y is never -0 here and weights are finite). */
INLINE void batch_group(const int T, const int G, const axpy_job *j, const uint8_t *const *p, const int32_t *pos,
                        int64_t c0, int64_t c1) {
    const int64_t n_tok = j->n_tok, n_sel = j->n_sel, n_cols = j->n_cols;
    int64_t c = c0;
#if VL > 1
    const int64_t tb = tile_bytes(T);
    for (int64_t off = c0 / TILE * tb; c + TILE <= c1; c += TILE, off += tb) {
        vf q[GB][NV]; /* G <= GB: fixed sizes, not variable-length arrays */
        float d[GB][TILE / QK];
        for (int r = 0; r < G; r++) {
#if defined(SP_AVX2)
            if (T == PI_Q4_0) q4_tile_avx2(p[r] + off, q[r]);
            else
#endif
            for (int v = 0; v < NV; v++) q[r][v] = vq(T, p[r] + off, v * VL);
            for (int b = 0; b < NS(T); b++) d[r][b] = blk_scale(T, p[r] + off, b * QK);
        }
        for (int64_t t = 0; t < n_tok; t++) {
            const float *ht = j->h + t * n_sel;
            float *yt = j->y + t * n_cols + c;
            vf acc[NV];
            for (int v = 0; v < NV; v++) acc[v] = V_LOAD(yt + v * VL);
            for (int r = 0; r < G; r++) {
                float s[TILE / QK];
                for (int b = 0; b < NS(T); b++) s[b] = ht[pos[r]] * d[r][b];
                for (int v = 0; v < NV; v++) acc[v] = V_FMA(V_SET1(s[SIDX(T, v)]), q[r][v], acc[v]);
            }
            for (int v = 0; v < NV; v++) V_STORE(yt + v * VL, acc[v]);
        }
    }
    for (; c < c1 && (c + VL <= c1 || VL == 16); c += VL) { /* whole vectors, then (AVX-512) a masked tail */
        int64_t n = c1 - c < VL ? c1 - c : VL;
        (void)n; /* used by the AVX-512 masked tail */
        vf q[GB];
        float d[GB];
        for (int r = 0; r < G; r++) {
            d[r] = blk_scale(T, p[r], c);
#if defined(SP_AVX512)
            q[r] = n == VL ? vq(T, p[r], c) : vq_part(T, p[r], c, n);
#else
            q[r] = vq(T, p[r], c);
#endif
        }
        for (int64_t t = 0; t < n_tok; t++) {
            const float *ht = j->h + t * n_sel;
            float *yt = j->y + t * n_cols + c;
#if defined(SP_AVX512)
            vf acc = n == VL ? V_LOAD(yt) : V_LOAD_PART(yt, n);
#else
            vf acc = V_LOAD(yt);
#endif
            for (int r = 0; r < G; r++) acc = V_FMA(V_SET1(ht[pos[r]] * d[r]), q[r], acc);
#if defined(SP_AVX512)
            if (n == VL) V_STORE(yt, acc); else V_STORE_PART(yt, acc, n);
#else
            V_STORE(yt, acc);
#endif
        }
    }
#endif
    if (c < c1)
        for (int64_t t = 0; t < n_tok; t++) {
            float hs[GB];
            for (int r = 0; r < G; r++) hs[r] = j->h[t * n_sel + pos[r]];
            axpy_cols_scalar(T, G, p, hs, j->y + t * n_cols, c, c1);
        }
}

/* ---- n_tok >= PANEL_MIN_TOK: register tiles over a converted panel ---------------------------------------
 * batch_group reloads and stores y for every group of GB rows and re-derives every scale, which holds a
 * prefill to 21-31 GFLOP/s on AVX2 (one LLaMA-7B ffn_down_t, 128 tokens, 2 threads), a tenth of the mat-vec
 * kernels' prefill. Here, for PANEL_ROWS live rows and one column tile, the weights are converted once into an
 * f32 panel (in L1), their scales into a row-major vector, and each token's h for those rows into a compact
 * copy (hact, filled once per call); then TB tokens x NA vectors of y stay in registers while the panel's rows
 * go by: one broadcast of s = h * d per (token, row, block) and NA fmas on it. Each y element still runs
 * acc = fma(h * d, q, acc) over the live rows in list order from 0, so the bits are batch_group's and a
 * one-part decode's. */
#if VL > 1
#define PANEL_ROWS 64
#define PANEL_MIN_TOK 4
#define PANEL_PF 256 /* bytes ahead along each panel row */
#if defined(SP_AVX512)
#define TB 6     /* tokens per register tile: TB x NA accumulators of the 32 zmm */
#define NPASS 1  /* the tile's NV vectors in NPASS passes of NA */
#else
#define TB 6
#define NPASS 2
#endif
#define NA (NV / NPASS)
#define NSM (TILE / QK) /* scales per tile, at most (block types); the stride of d and sp */

/* tokens t0 .. t0 + TT - 1, vectors pass * NA .. of the tile at column c, rows 0 .. R - 1 of the panel */
INLINE void panel_tokens(const int T, const int TT, const vf *q, const float *sp, int64_t R, float *y,
                         int64_t n_cols, int64_t t0, int64_t c, int pass) {
    vf acc[TB][NA];
    for (int t = 0; t < TT; t++)
        for (int v = 0; v < NA; v++) acc[t][v] = V_LOAD(y + (t0 + t) * n_cols + c + (pass * NA + v) * VL);
    /* sp: s for [token][block][row] of this panel, rows contiguous */
    for (int64_t r = 0; r < R; r++) {
        const vf *qr = q + r * NV + pass * NA;
        for (int t = 0; t < TT; t++) {
            const float *st = sp + (int64_t)t * NSM * PANEL_ROWS;
            for (int v = 0; v < NA; v++) {
                const vf sv = V_SET1(st[SIDX(T, pass * NA + v) * PANEL_ROWS + r]);
                acc[t][v] = V_FMA(sv, qr[v], acc[t][v]);
            }
        }
    }
    for (int t = 0; t < TT; t++)
        for (int v = 0; v < NA; v++) V_STORE(y + (t0 + t) * n_cols + c + (pass * NA + v) * VL, acc[t][v]);
}

/* live rows a0 .. a0 + R - 1 over the whole tiles of columns [c0, c1) (c0 a multiple of TILE), all tokens */
INLINE void panel_rows(const int T, const axpy_job *j, const float *hact, int64_t a0, int64_t R, int64_t c0,
                       int64_t c1) {
    const int64_t n_tok = j->n_tok, n_cols = j->n_cols, n_act = j->n_act, tb = tile_bytes(T);
    vf q[PANEL_ROWS * NV] __attribute__((aligned(64)));
    float d[NSM][PANEL_ROWS], sp[TB * NSM * PANEL_ROWS];
    const uint8_t *p[PANEL_ROWS];
    for (int64_t r = 0; r < R; r++) p[r] = j->w + (int64_t)j->rows[j->act[a0 + r]] * j->row_bytes;
    for (int64_t c = c0, off = c0 / TILE * tb; c + TILE <= c1; c += TILE, off += tb) {
        for (int64_t r = 0; r < R; r++) {
            /* the rows' next tiles: the panel's rows are scattered, and rows a multiple of 4 KB apart share
             * cache sets, so a line is not always still there when its next tile comes */
            _mm_prefetch((const char *)p[r] + off + PANEL_PF, _MM_HINT_T0);
#if defined(SP_AVX2)
            if (T == PI_Q4_0) q4_tile_avx2(p[r] + off, q + r * NV);
            else
#endif
            for (int v = 0; v < NV; v++) q[r * NV + v] = vq(T, p[r] + off, v * VL);
            for (int b = 0; b < NS(T); b++) d[b][r] = blk_scale(T, p[r] + off, b * QK);
        }
        for (int64_t t0 = 0; t0 < n_tok; t0 += TB) {
            const int TT = n_tok - t0 < TB ? (int)(n_tok - t0) : TB;
            for (int t = 0; t < TT; t++)
                for (int b = 0; b < NS(T); b++)
                    for (int64_t r = 0; r < R; r++)
                        sp[((int64_t)t * NSM + b) * PANEL_ROWS + r] = hact[(t0 + t) * n_act + a0 + r] * d[b][r];
            for (int pass = 0; pass < NPASS; pass++) switch (TT) {
                case 1: panel_tokens(T, 1, q, sp, R, j->y, n_cols, t0, c, pass); break;
                case 2: panel_tokens(T, 2, q, sp, R, j->y, n_cols, t0, c, pass); break;
                case 3: panel_tokens(T, 3, q, sp, R, j->y, n_cols, t0, c, pass); break;
                case 4: panel_tokens(T, 4, q, sp, R, j->y, n_cols, t0, c, pass); break;
                case 5: panel_tokens(T, 5, q, sp, R, j->y, n_cols, t0, c, pass); break;
                default: panel_tokens(T, TB, q, sp, R, j->y, n_cols, t0, c, pass); break;
            }
        }
    }
}
#endif

/* ---- other block types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K ... Q6_K, IQ4_XS): one block at a time ---------
 * Each block is unpacked to its f32 values exactly as pi_dequantize computes them (d * q + m, or
 * dsc * q - dmn), then y = fma(h, value, y) row after row: the same determinism as the fast types, at a
 * lower speed (the unpack is scalar). */
static void block_values(int type, const uint8_t *blk, float *v) {
    if (pi_is_k_type(type)) {
        int8_t q[QK_K];
        float dsc[16], dmn[16];
        pi_unpack_qk(type, blk, q, dsc, dmn);
        const int g = pi_qk_group(type);
        for (int i = 0; i < QK_K; i++) v[i] = dsc[i / g] * (float)q[i] - dmn[i / g];
    } else {
        int8_t q[QK];
        float d, m;
        pi_unpack_q32(type, blk, q, &d, &m);
        for (int i = 0; i < QK; i++) v[i] = d * (float)q[i] + m;
    }
}

static void axpy_chunk_blocks(const axpy_job *j, int64_t c0, int64_t c1) {
    const int64_t bs = pi_block_size(j->type), bbytes = pi_row_size(j->type, bs);
    const int64_t n_tok = j->n_tok, n_sel = j->n_sel, n_cols = j->n_cols;
    float v[QK_K];
    int64_t sw = L2_Y_BYTES / (n_tok * (int64_t)sizeof(float)) / bs * bs; /* y sub-slice kept in L2 */
    if (sw < bs) sw = bs;
    for (int64_t s0 = c0; s0 < c1; s0 += sw) {
        const int64_t s1 = s0 + sw < c1 ? s0 + sw : c1;
        for (int64_t a = 0; a < j->n_act; a++) {
            const uint8_t *p = j->w + (int64_t)j->rows[j->act[a]] * j->row_bytes;
            for (int64_t c = s0; c < s1; c += bs) {
                block_values(j->type, p + c / bs * bbytes, v);
                for (int64_t t = 0; t < n_tok; t++) {
                    const float hv = j->h[t * n_sel + j->act[a]];
                    float *yt = j->y + t * n_cols + c;
                    for (int64_t i = 0; i < bs; i++) yt[i] = fmaf(hv, v[i], yt[i]);
                }
            }
        }
    }
}

/* ---- decode: one part = a contiguous run [a0, a1) of the live list, every column ---------------------- */
INLINE void decode_part_t(const int T, const axpy_job *j, int64_t a0, int64_t a1, float *y) {
    const int64_t n_cols = j->n_cols, rb = j->row_bytes;
    const int32_t *act = j->act;
    const uint8_t *p[DEC_ROWS], *pn[DEC_ROWS];
    float hs[DEC_ROWS];
    memset(y, 0, (size_t)n_cols * sizeof(float));
    int64_t a = a0;
    for (; a + DEC_ROWS <= a1; a += DEC_ROWS) {
        for (int r = 0; r < DEC_ROWS; r++) {
            p[r] = j->w + (int64_t)j->rows[act[a + r]] * rb;
            hs[r] = j->h[act[a + r]];
        }
        for (int r = 0; r < DEC_ROWS; r++) /* past the end: the last rows again (cached, harmless) */
            pn[r] = j->w + (int64_t)j->rows[act[a + DEC_ROWS + r < a1 ? a + DEC_ROWS + r : a1 - 1]] * rb;
        decode_group(T, DEC_ROWS, p, hs, pn, DEC_ROWS, y, 0, n_cols);
    }
    for (; a < a1; a++) {
        p[0] = j->w + (int64_t)j->rows[act[a]] * rb;
        hs[0] = j->h[act[a]];
        decode_group(T, 1, p, hs, pn, 0, y, 0, n_cols);
    }
}

static void decode_part(void *ctx, int64_t part, int thread_id) {
    (void)thread_id;
    const axpy_job *j = ctx;
    const int64_t a0 = j->n_act * part / j->n_part, a1 = j->n_act * (part + 1) / j->n_part;
    float *y = part == 0 ? j->y : j->partial + (part - 1) * j->n_cols;
    switch (j->type) {
    case PI_F32: decode_part_t(PI_F32, j, a0, a1, y); break;
    case PI_F16: decode_part_t(PI_F16, j, a0, a1, y); break;
    case PI_BF16: decode_part_t(PI_BF16, j, a0, a1, y); break;
    case PI_Q8_0: decode_part_t(PI_Q8_0, j, a0, a1, y); break;
    default: decode_part_t(PI_Q4_0, j, a0, a1, y); break;
    }
}

/* ---- one chunk = one column slice of y, all tokens, all active rows in list order -------------------- */
INLINE void axpy_chunk_t(const int T, const axpy_job *j, int64_t chunk) {
    const int64_t n_cols = j->n_cols, n_act = j->n_act, rb = j->row_bytes;
    const int64_t c0 = chunk * j->cols_per_chunk;
    const int64_t c1 = c0 + j->cols_per_chunk < n_cols ? c0 + j->cols_per_chunk : n_cols;
    const int32_t *act = j->act;
    const uint8_t *p[4];
    for (int64_t t = 0; t < j->n_tok; t++) memset(j->y + t * n_cols + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    /* sub-slices of y that stay in L2 across all tokens; a multiple of the 64-column tile */
    int64_t sw = L2_Y_BYTES / (j->n_tok * (int64_t)sizeof(float)) / 64 * 64;
    if (sw < 64) sw = 64;
    for (int64_t s0 = c0; s0 < c1; s0 += sw) {
        int64_t s1 = s0 + sw < c1 ? s0 + sw : c1, a = 0, b0 = s0; /* batch_group's columns: [b0, s1) */
#if VL > 1
        if (j->hact) { /* whole tiles on the panel path, then the last < TILE columns (row tails) below */
            b0 = s0 + (s1 - s0) / TILE * TILE;
            for (int64_t a0 = 0; a0 < n_act; a0 += PANEL_ROWS)
                panel_rows(T, j, j->hact, a0, n_act - a0 < PANEL_ROWS ? n_act - a0 : PANEL_ROWS, s0, b0);
            if (b0 == s1) continue;
        }
#endif
        for (; a + GB <= n_act; a += GB) {
            for (int r = 0; r < GB; r++) p[r] = j->w + (int64_t)j->rows[act[a + r]] * rb;
            batch_group(T, GB, j, p, act + a, b0, s1);
        }
        for (; a < n_act; a++) {
            p[0] = j->w + (int64_t)j->rows[act[a]] * rb;
            batch_group(T, 1, j, p, act + a, b0, s1);
        }
    }
}

static void axpy_chunk(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const axpy_job *j = ctx;
    switch (j->type) {
    case PI_F32: axpy_chunk_t(PI_F32, j, chunk); break;
    case PI_F16: axpy_chunk_t(PI_F16, j, chunk); break;
    case PI_BF16: axpy_chunk_t(PI_BF16, j, chunk); break;
    case PI_Q8_0: axpy_chunk_t(PI_Q8_0, j, chunk); break;
    case PI_Q4_0: axpy_chunk_t(PI_Q4_0, j, chunk); break;
    default: {
        const int64_t c0 = chunk * j->cols_per_chunk;
        const int64_t c1 = c0 + j->cols_per_chunk < j->n_cols ? c0 + j->cols_per_chunk : j->n_cols;
        for (int64_t t = 0; t < j->n_tok; t++) memset(j->y + t * j->n_cols + c0, 0, (size_t)(c1 - c0) * sizeof(float));
        axpy_chunk_blocks(j, c0, c1);
    }
    }
}

/* decode: y += partial 1, partial 2, ... in that order for the columns of one chunk */
static void reduce_parts(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const axpy_job *j = ctx;
    const int64_t c0 = chunk * j->cols_per_chunk;
    const int64_t c1 = c0 + j->cols_per_chunk < j->n_cols ? c0 + j->cols_per_chunk : j->n_cols;
    for (int64_t k = 1; k < j->n_part; k++) {
        const float *pk = j->partial + (k - 1) * j->n_cols;
        for (int64_t c = c0; c < c1; c++) j->y[c] += pk[c];
    }
}

void pi_axpy_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows, const float *h,
                  int64_t n_sel, int64_t n_tok, float *y) {
    if (n_tok <= 0 || n_cols <= 0) return;
    const int n_threads = pi_pool_n_threads(pool);
    const int fast = type == PI_F32 || type == PI_F16 || type == PI_BF16 || type == PI_Q8_0 || type == PI_Q4_0;
    /* scratch: the live list (int32 [n_sel]), then for decode by rows the partials f32 [n_threads - 1, n_cols] */
    const size_t act_bytes = ((size_t)(n_sel > 0 ? n_sel : 1) * sizeof(int32_t) + 63) & ~(size_t)63;
    const int64_t max_part = n_threads > 1 ? (int64_t)n_threads * PARTS_PER_THREAD : 1;
    const size_t part_bytes = n_tok == 1 && fast ? (size_t)(max_part - 1) * (size_t)n_cols * sizeof(float) : 0;
#if VL > 1
    const int panel = fast && n_tok >= PANEL_MIN_TOK;
#else
    const int panel = 0;
#endif
    /* the panel path's h[t, act[a]]: at most n_tok * n_sel floats, after the live list */
    const size_t hact_bytes = panel ? (size_t)n_tok * (size_t)n_sel * sizeof(float) : 0;
    /* BF16 rows: h rounded to bf16 (pi_bf_round), as matmul.c rounds a BF16 weight's activations, last */
    const size_t hbf_bytes = type == PI_BF16 ? (size_t)n_tok * (size_t)n_sel * sizeof(float) : 0;
    uint8_t *scratch = pi_pool_scratch(pool, act_bytes + part_bytes + hact_bytes + hbf_bytes);
    int32_t *act = (int32_t *)scratch;
    if (hbf_bytes) {
        float *hb = (float *)(scratch + act_bytes + part_bytes + hact_bytes);
        for (int64_t i = 0; i < n_tok * n_sel; i++) hb[i] = pi_bf_round(h[i]);
        h = hb;
    }
    /* positions j with some nonzero h[t, j]: flags first (token-major scan of h), then compacted in place */
    int64_t n_act = 0;
    if (n_tok == 1) {
        for (int64_t s = 0; s < n_sel; s++)
            if (h[s] != 0.0f) act[n_act++] = (int32_t)s;
    } else {
        memset(act, 0, (size_t)n_sel * sizeof(int32_t));
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t s = 0; s < n_sel; s++) act[s] |= h[t * n_sel + s] != 0.0f;
        for (int64_t s = 0; s < n_sel; s++)
            if (act[s]) act[n_act++] = (int32_t)s;
    }
    if (n_act == 0) {
        memset(y, 0, (size_t)(n_tok * n_cols) * sizeof(float));
        return;
    }
    const int64_t row_bytes = pi_row_size(type, n_cols);
    if (n_tok == 1 && fast) { /* decode: parts of the live list, whole rows (see the header) */
        int64_t n_part = n_act / MIN_PART_ROWS;
        if (n_part > max_part) n_part = max_part;
        if (n_part < 1) n_part = 1;
        axpy_job job = {.type = type, .w = w, .row_bytes = row_bytes, .n_cols = n_cols, .n_sel = n_sel,
                        .n_tok = 1, .rows = rows, .h = h, .act = act, .n_act = n_act, .y = y,
                        .n_part = n_part, .partial = (float *)(scratch + act_bytes)};
        pi_pool_run(pool, decode_part, &job, n_part);
        if (n_part > 1) {
            job.cols_per_chunk = (n_cols + n_threads - 1) / n_threads;
            job.cols_per_chunk = (job.cols_per_chunk + 15) / 16 * 16;
            pi_pool_run(pool, reduce_parts, &job, (n_cols + job.cols_per_chunk - 1) / job.cols_per_chunk);
        }
        return;
    }
    /* one column slice per thread, cut at 64-column tiles (whole blocks; 256 for K-quants); for decode (the
     * other block types) no slice shorter than MIN_SLICE_FLOOR bytes of a row, so many threads on a narrow
     * row leave some out */
    const int64_t unit = pi_block_size(type) > 64 ? pi_block_size(type) : 64;
    const int64_t n_units = (n_cols + unit - 1) / unit;
    int64_t k = n_threads;
    if (n_tok == 1) {
        int64_t kmax = row_bytes / MIN_SLICE_FLOOR;
        if (row_bytes / MIN_SLICE_BYTES >= k) kmax = k; /* the preferred length fits: nothing to cap */
        if (k > kmax) k = kmax;
    }
    if (k > n_units) k = n_units;
    if (k < 1) k = 1;
    const int64_t cpc = (n_units + k - 1) / k * unit;
    float *hact = NULL;
    if (panel) {
        hact = (float *)(scratch + act_bytes + part_bytes);
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t a = 0; a < n_act; a++) hact[t * n_act + a] = h[t * n_sel + act[a]];
    }
    axpy_job job = {.type = type, .w = w, .row_bytes = row_bytes, .n_cols = n_cols, .n_sel = n_sel,
                    .n_tok = n_tok, .rows = rows, .h = h, .act = act, .n_act = n_act, .cols_per_chunk = cpc, .y = y,
                    .hact = hact};
    pi_pool_run(pool, axpy_chunk, &job, (n_cols + cpc - 1) / cpc);
}

/* ---- active-neuron selection ------------------------------------------------------------------------
 * out must hold n entries (the vector paths store whole vectors of indices past the count, never past n). */
int64_t pi_select_active(const float *logits, int64_t n, float threshold, int32_t *out) {
    int64_t k = 0, i = 0;
#if defined(SP_AVX512)
    const __m512 th = _mm512_set1_ps(threshold);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16))) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + i), th, _CMP_GE_OQ); /* NaN: inactive */
        _mm512_storeu_si512(out + k, _mm512_maskz_compress_epi32(m, idx));
        k += __builtin_popcount(m);
    }
#elif defined(SP_AVX2)
    const __m256 th = _mm256_set1_ps(threshold);
    for (; i + 8 <= n; i += 8) {
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits + i), th, _CMP_GE_OQ));
        for (; m; m &= m - 1) out[k++] = (int32_t)(i + __builtin_ctz(m));
    }
#endif
    for (; i < n; i++)
        if (logits[i] >= threshold) out[k++] = (int32_t)i;
    return k;
}

int64_t pi_select_nonzero(const float *x, int64_t n, int32_t *out) {
    int64_t k = 0, i = 0;
#if defined(SP_AVX512)
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16))) {
        /* unordered: NaN counts as nonzero, as numpy's flatnonzero does; -0 is zero */
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_storeu_si512(out + k, _mm512_maskz_compress_epi32(m, idx));
        k += __builtin_popcount(m);
    }
#elif defined(SP_AVX2)
    for (; i + 8 <= n; i += 8) {
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        for (; m; m &= m - 1) out[k++] = (int32_t)(i + __builtin_ctz(m));
    }
#endif
    for (; i < n; i++)
        if (x[i] != 0.0f) out[k++] = (int32_t)i;
    return k;
}
