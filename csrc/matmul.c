/* matmul.c: y[t, r] = sum_c w[r, c] * x[t, c] for F32/F16/BF16/Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/IQ4_NL/MXFP4 weights
 * (K-quants: matmul_k.c).
 *
 * Variants (chosen at compile time):
 *   - AVX-512 (F + BW + VL): float types 16 lanes with masked column tails (prefill: 4 x 6 tiles in column
 *     blocks sized from L1d, rows_f_kblocked; BF16 with AVX512-BF16: vdpbf16ps on bf16-rounded activations, 32
 *     columns per step, decoded one row at a time). Q8_0 (with VNNI: the quads, as Q4_0): two blocks per zmm; the
 *     f16 scales of a block pair for all rows of a tile convert in one instruction; times the token's two
 *     scales, one permute per (row, token) spreads them over the lanes of each block; Q5_0 the same with
 *     nibble pairs, its fifth bits made a byte mask with one shuffle + one test. Q4_0: quads of four blocks
 *     (tile_quad): 64 nibbles of 4 blocks per zmm, 4 int32 lanes per block after two dpbusd, so one convert
 *     and one FMA per 4 blocks; Q4_1, Q5_1, MXFP4 and (VNNI) IQ4_NL use the same quads (see kind_quad).
 *   - AVX2 + FMA + F16C: 8 float lanes, scalar column tail. Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL and MXFP4 go in groups
 *     of 8 blocks (g8_* below): the 8 f16 scales by overlapping loads + word blends and one conversion,
 *     maddubs on block pairs, integer horizontal folds to one exact int32 dot per block, then per group one
 *     convert and one FMA by d_w * d_x (8 lanes) per (row, token); decode two rows at a time with software
 *     prefetch, prefill one row against 4 (Q4_0/Q4_1) or 8 tokens. Q8_0 keeps the generic tiles (one block
 *     per ymm, RD = 4 rows for decode, RP = 2 x TP = 4 for prefill): their f32 order is llama.cpp's AVX2 one
 *     and the real-model agreement test pins it. Measured on a 2-core AMD EPYC (Zen 3 class, AVX2, no AVX-512
 *     or VNNI, ~1.6-1.8 GHz, read probe 24-32 GB/s, another job sharing the cores, so noisy): one thread in
 *     L2 (bench_matvec_hot) Q4_0 10.5 -> 18.3 GB/s, Q5_0 9.5 -> 13.6, Q4_1 11.0 -> 15.5, Q5_1 9.7 -> 13.1,
 *     IQ4_NL 8.7 -> 10.4, MXFP4 8.5 -> 14.5 (the first numbers are the generic tiles with a scalar activation
 *     quantization); prefill (bench_prefill_ab, 1 thread) 1.3-2.5x, e.g. Q4_0 25 -> 55 GMAC/s, Q5_0 26 -> 43.
 *     The Q8_0 activation quantization is vectorized (quantize_block, same arithmetic as the scalar one).
 *   - scalar: everything else (PI_NATIVE=0).
 * Block types: the activations are quantized once per call to Q8_0 (d = f16(amax / 127)) in the pool's
 * scratch, with an integer correction term per block, then each (row, token, block) is an integer dot:
 *   VNNI:     dpbusd(u, x) with u = w + 128 (Q8_0) or the raw nibble (Q4_0, = w + 8); the correction
 *             -128 * sum(x) or -8 * sum(x) rides in as dpbusd's accumulator input, so the sum is exact.
 *   no VNNI:  Q8_0 maddubs(|w|, x * sign(w)); Q4_0 maddubs(nibble, x) plus the -8 * sum(x) correction;
 *             then madd with ones. No int16 saturation: |pairs| <= 2 * 128 * 127.
 * and acc[r][t] += float(dot) * (d_w * d_x), 8 or 16 f32 lanes per accumulator, summed at the end.
 * Decode (n_tok == 1), AVX-512: Q8_0, Q4_0 and Q5_0 walk their rows one after another, one sequential stream
 * per thread prefetched ~4 KB ahead (*_decode_rows below; on this code's 2-core Zen 5 host a pure read ran ~33
 * GB/s as one stream per thread and ~26 as 4-8 interleaved rows); F16 and F32 take the 4-row one-token float
 * tiles, BF16 with AVX512-BF16 one row at a time (both prefetch the next rows, see tile_f). Scattered row
 * gathers (pi_matmul_rows) and the other cases use tiles of RD rows (DQ = 8 for the Q4_0 quads; independent FMA
 * chains, one x load per RD rows), each row software-prefetched PF_DIST bytes ahead or, for gathers, the next
 * tile's rows whole: several scattered rows in flight serve a gather better than one stream.
 * Prefill takes ROW_BLOCK rows (kept in L1/L2) against TOK_BLOCK tokens (their activations kept in L2) in
 * tiles of RP rows x TP tokens, so each weight vector is loaded and unpacked once per TP tokens:
 * RP * TP accumulators + RP weights fill the register file (32 zmm: 4 x 4; 16 ymm: 2 x 4). Every output element runs the same instruction sequence
 * whatever tile it lands in, and is computed by exactly one thread, so results are bit-identical from run
 * to run and across thread counts.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "quants.h"
#include "matmul_f16p.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define MM_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MM_AVX2 1
#endif
#if defined(MM_AVX512) || defined(MM_AVX2)
#include <immintrin.h>
#endif
/* BF16 weights: the activations are rounded to bf16 first (round to nearest even, pi_f2bf), on every build, as
 * llama.cpp does for BF16 weights; with AVX512-BF16 the products then run on vdpbf16ps, two per f32 lane and
 * instruction from the raw weight bytes (no conversion), 32 columns per step (see the BF16 note above
 * rows_f_kblocked) */
#if defined(MM_AVX512) && defined(__AVX512BF16__)
#define BF16_DP 1
#ifndef BF_RD
#define BF_RD 1 /* decode rows per tile (see the BF16 note above rows_f_kblocked) */
#endif
#endif

#define ROW_BLOCK 16 /* rows per prefill block; also the chunk granularity (16 f32 = one cache line of y) */
#define FTOK_BLOCK 132 /* float-type prefill: tokens per block (mm_chunk), 22 x TPF */
#define F16_3X4_MIN_ROWS 9 /* AVX2 F16 prefill: fewest rows in a block of 3 x 4 tiles over long rows (frb_for) */
#define TOK_BLOCK 64 /* prefill tokens per pass over a chunk's rows (Q8_0 activations: 64 x ~4.3 KB at K = 4096) */
#define INLINE static inline __attribute__((always_inline))
/* decode streams each row once: the rows in flight are prefetched this many bytes ahead (the hardware
 * prefetcher alone leaves the 2-thread mat-vec ~25% short of the read probe on Zen 5) */
#define STREAM_SPAN 1.1 /* gathers whose rows span <= 1.1 x their count decode as one stream (see mm_job) */
#define STREAM_RUN 16   /* ... and so do gathers made of runs of consecutive rows this long on average */
#ifndef PF_DIST
#define PF_DIST 768
#endif


static inline float bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

typedef struct {
    int type;
    const uint8_t *w;
    int64_t row_bytes, n_rows, n_cols, n_tok;
    const float *x;      /* float types: f32 [n_tok, n_cols] */
    int64_t xstride;     /* float types: elements from one token's x (or xb) to the next (0: n_cols) */
    const uint16_t *xb;  /* BF16 weights where the build has AVX512-BF16: the activations as bf16 (pi_f2bf) */
    int64_t fkb;         /* float-type prefill: columns per block (fkb_for) */
    int64_t frb;         /* float-type prefill: rows per block (frb_for; 0: ROW_BLOCK) */
    const int8_t *xq;    /* block types: int8 [n_tok, nbp * 32] quantized activations (AVX-512: Q4_0 quad order, Q5_0 pair order) */
    const float *xd;     /* f32 [n_tok, nbp] block scales */
    const int32_t *xc;   /* int32 [n_tok, nbp] correction: -128 * sum(q) (Q8_0, IQ4_NL, VNNI), -8 * sum(q) (Q4_0),
                            -12 * sum(q) (MXFP4 quads), else 0 */
    const float *xs;     /* f32 [n_tok, nbp] Q4_1/Q5_1: f16(d_x * sum(q)), the term the weight's min m multiplies */
    const float *xd4;    /* AVX2 Q8_0 prefill (q8_chunk): xd of each group of 4 tokens side by side,
                            f32 [n_tok / 4 rounded up, nbp, 4] (0 past the last token) */
    int64_t nbp;         /* blocks per token, rounded up to the vector's blocks */
    int64_t rows_per_chunk;
    const int32_t *sel;  /* NULL: output row i is weight row i; else weight row sel[i] (pi_matmul_rows) */
    int stream;          /* decode reads its rows as one stream: dense, a selection spanning at most
                            STREAM_SPAN x its row count (mostly neighbours), or one made of runs of
                            consecutive rows (STREAM_RUN on average: the experts of a MoE layer); else the
                            gather tiles */
    float *y;            /* f32 [n_tok, n_rows] */
} mm_job;

/* The 32-element types handled by tile_q, as a compile-time `kind`: 0 = Q8_0, 1 = Q4_0, 2 = Q5_0, 3 = Q4_1,
 * 4 = Q5_1, 5 = IQ4_NL, 6 = MXFP4. Kinds 2-6 share the nibble-pair layout (AVX-512) and the row decoder. Q4_1/Q5_1
 * add m_w * s_x per block (s_x = f16(d_x * sum(q_x)), llama.cpp's Q8_1 activation sum) in a separate f32 sum.
 * MXFP4 is IQ4_NL with another table (pi_mxfp4_values) and a one-byte E8M0 scale in place of the f16 d: its
 * blocks are 17 bytes, the nibbles start at byte 1, and the scale is read by kind_scale. */
#define K_Q8 0
#define K_Q4 1
#define K_Q5 2
#define K_Q41 3
#define K_Q51 4
#define K_IQ4NL 5
#define K_MXFP4 6
static const int kind_types[] = {PI_Q8_0, PI_Q4_0, PI_Q5_0, PI_Q4_1, PI_Q5_1, PI_IQ4_NL, PI_MXFP4}; /* kind -> type */
_Static_assert(sizeof(kind_types) / sizeof(kind_types[0]) == K_MXFP4 + 1, "one type per kind");
INLINE int64_t kind_size(int kind) { return pi_traits[kind_types[kind]].bytes; } /* a constant for a constant kind */
/* the weight scale d of the block at p: f16, or MXFP4's E8M0 byte (2^(e - 128), see pi_e8m0_half) */
INLINE float kind_scale(const uint8_t *p, const int kind) {
    uint16_t h;
    if (kind == K_MXFP4) return pi_e8m0_half(p[0]);
    memcpy(&h, p, 2);
    return pi_h2f(h);
}
INLINE int kind_min(int kind) { return pi_traits[kind_types[kind]].has_min; } /* has m: the s_x term */
INLINE int kind_uns(int kind) { return kind >= K_Q4 && kind <= K_Q51; }       /* unsigned nibble weights */
INLINE int kind_qs(int kind) { return kind == K_Q5 ? 6 : kind == K_Q41 ? 4 : kind == K_Q51 ? 8 : kind == K_MXFP4 ? 1 : 2; } /* qs offset */
INLINE int kind_qh(int kind) { return kind == K_Q5 ? 2 : kind == K_Q51 ? 4 : -1; } /* qh offset, -1: none */
static int type_kind(int type) { /* -1: not one of kind_types (not a 32-element block type) */
    for (int kind = 0; kind <= K_MXFP4; kind++)
        if (kind_types[kind] == type) return kind;
    return -1;
}
INLINE const uint8_t *mm_row(const mm_job *j, int64_t i) { return j->w + (j->sel ? j->sel[i] : i) * j->row_bytes; }
/* row i, or the last row past the end: where the tiles prefetch the rows after theirs */
INLINE const uint8_t *mm_row_or_last(const mm_job *j, int64_t i) {
    return mm_row(j, i < j->n_rows ? i : j->n_rows - 1);
}

/* ==== ISA primitives for the block types ============================================================== */
#if defined(MM_AVX512)
#define BPV 2 /* blocks per vector */
#define RD 4  /* decode rows per tile */
#define RP 4  /* prefill tile: rows x tokens */
#define TP 4
typedef __m512i qv;
typedef __m512 fv;
#if defined(__AVX512VNNI__)
#define Q8_UNSIGNED 1
#endif
/* Lane layout of a block pair: Q8_0 [b0 (32 B) | b1 (32 B)] = 32-bit lanes 0-7 b0, 8-15 b1;
 * Q5_0 [b0 lo nibbles | b1 lo | b0 hi | b1 hi] (16 B each) = lanes 0-3 b0, 4-7 b1, 8-11 b0, 12-15 b1, which is how
 * the nibbles unpack with one shift; the activations are stored in the same order. (Q4_0 goes through the
 * quad tiles below, 4 blocks per vector.) */
INLINE __m512i pair_idx(int q4, int r) { /* lane -> 2r (block 0 of row r) or 2r + 1 (block 1) */
    return q4 ? _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1), _mm512_set1_epi32(2 * r))
              : _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_set1_epi32(2 * r));
}

typedef struct { qv a; __mmask64 neg; } wvec; /* unsigned operand; sign mask of w (Q8_0 without VNNI) */

/* signed int8 weights z (Q8_0, IQ4_NL's levels) as the unsigned dot operand */
INLINE wvec w_signed(__m512i z) {
    wvec v;
#if Q8_UNSIGNED
    v.a = _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80)); /* w + 128 as unsigned bytes */
    v.neg = 0;
#else
    v.a = _mm512_abs_epi8(z);
    v.neg = _mm512_movepi8_mask(z);
#endif
    return v;
}

INLINE wvec w_load_q8(const block_q8_0 *b, int two) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
    return w_signed(two ? _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256((const __m256i *)b[1].qs), 1)
                        : _mm512_zextsi256_si512(lo));
}

/* Q5_0 / Q4_1 / Q5_1 / IQ4_NL, block pair at p (a lone block when !two), in pair order: the nibbles, plus 16
 * where the element's qh bit is set (Q5_*); IQ4_NL maps them through its table to signed levels, then as Q8_0 */
INLINE wvec w_load_nib(const uint8_t *p, const int kind, int two) {
    const int64_t size = kind_size(kind);
    const int qo = kind_qs(kind), ho = kind_qh(kind);
    __m128i q0 = _mm_loadu_si128((const __m128i *)(p + qo));
    __m256i q = two ? _mm256_inserti128_si256(_mm256_castsi128_si256(q0), _mm_loadu_si128((const __m128i *)(p + size + qo)), 1)
                    : _mm256_zextsi128_si256(q0);
    __m512i z = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1),
                                 _mm512_set1_epi8(0x0f));
    wvec v;
    if (kind == K_IQ4NL || kind == K_MXFP4) {
        const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128(
            (const __m128i *)(kind == K_MXFP4 ? pi_mxfp4_values : pi_iq4nl_values)));
        return w_signed(_mm512_shuffle_epi8(tab, z));
    }
    if (ho >= 0) {
        uint32_t h0, h1 = 0;
        memcpy(&h0, p + ho, 4);
        if (two) memcpy(&h1, p + size + ho, 4);
        /* every byte gets the qh byte holding its element's bit (in-lane shuffle of h0 | h1 << 32, broadcast):
         * 16-byte lane 0 = b0 elements 0-15 (qh0 bytes 0, 1), 1 = b1 0-15 (bytes 4, 5), 2 = b0 16-31 (2, 3),
         * 3 = b1 16-31 (6, 7); then bit (element % 8) of it, which is byte % 8 */
        const __m512i hb = _mm512_shuffle_epi8(_mm512_set1_epi64((long long)((uint64_t)h0 | (uint64_t)h1 << 32)),
                                               _mm512_set_epi64(0x0707070707070707LL, 0x0606060606060606LL,
                                                                0x0303030303030303LL, 0x0202020202020202LL,
                                                                0x0505050505050505LL, 0x0404040404040404LL,
                                                                0x0101010101010101LL, 0x0000000000000000LL));
        const __mmask64 hi = _mm512_test_epi8_mask(hb, _mm512_set1_epi64((long long)0x8040201008040201ULL));
        z = _mm512_mask_add_epi8(z, hi, z, _mm512_set1_epi8(16));
    }
    v.a = z;
    v.neg = 0;
    return v;
}

/* the 2R weight scales of a block pair, one conversion: f32 [r0 b0, r0 b1, r1 b0, r1 b1, ...] */
typedef __m256 wscales;
INLINE __m256 w_f16pairs(const uint8_t **rows, int64_t b, const int R, const int kind, const int two, const int off) {
    const int64_t size = kind_size(kind);
    uint32_t u[4] = {0, 0, 0, 0};
    if (kind == K_MXFP4) { /* E8M0 bytes: converted one by one (AVX-512 MXFP4 takes the quads; kept complete) */
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int r = 0; r < R; r++) {
            f[2 * r] = kind_scale(rows[r] + b * size, kind);
            if (two) f[2 * r + 1] = kind_scale(rows[r] + (b + 1) * size, kind);
        }
        return _mm256_loadu_ps(f);
    }
    for (int r = 0; r < R; r++) {
        uint16_t d0, d1 = 0;
        memcpy(&d0, rows[r] + b * size + off, 2);
        if (two) memcpy(&d1, rows[r] + (b + 1) * size + off, 2);
        u[r] = (uint32_t)d0 | ((uint32_t)d1 << 16);
    }
    return _mm256_cvtph_ps(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]));
}
INLINE wscales w_scales(const uint8_t **rows, int64_t b, const int R, const int kind, const int two) {
    return w_f16pairs(rows, b, R, kind, two, 0);
}
/* Q4_1/Q5_1 min terms in the pair tiles: per token one 8-lane sum [r0 b0, r0 b1, r1 b0, ...] of m_w * s_x
 * (on AVX-512 both types take the quads, see kind_quad; this keeps the pair tiles complete for every kind) */
typedef __m256 mvec;
INLINE mvec m_zero(void) { return _mm256_setzero_ps(); }
INLINE mvec m_acc(mvec acc, const uint8_t **rows, int64_t b, const int R, const int kind, const int two, const float *xs) {
    return _mm256_fmadd_ps(w_f16pairs(rows, b, R, kind, two, 2), _mm256_castpd_ps(_mm256_broadcast_sd((const double *)xs)), acc);
}
INLINE float m_get(mvec acc, int r) {
    float l[8];
    _mm256_storeu_ps(l, acc);
    return l[2 * r] + l[2 * r + 1];
}
/* times the token's two block scales (a 64-bit broadcast): every (row, block) product at once */
typedef __m512 tscales;
INLINE tscales t_scales(wscales ws, const float *xd) {
    return _mm512_castps256_ps512(_mm256_mul_ps(ws, _mm256_castpd_ps(_mm256_broadcast_sd((const double *)xd))));
}
INLINE fv scale_rt(tscales m, wscales ws, int r, int q4) { (void)ws; return _mm512_permutexvar_ps(pair_idx(q4, r), m); }

INLINE qv x_load(const int8_t *p) { return _mm512_loadu_si512(p); }
INLINE qv x_corr(const int32_t *c, int q4) { /* c[0], c[1] into one lane of block 0 and of block 1 */
    return _mm512_maskz_permutexvar_epi32(q4 ? 0x0011 : 0x0101, pair_idx(q4, 0),
                                          _mm512_zextsi128_si512(_mm_loadl_epi64((const __m128i *)c)));
}

INLINE qv dot_q(wvec w, qv x, qv c, int q4) {
#if defined(__AVX512VNNI__)
    (void)q4;
    return _mm512_dpbusd_epi32(c, w.a, x);
#else
    qv ones = _mm512_set1_epi16(1);
    if (q4) return _mm512_add_epi32(c, _mm512_madd_epi16(_mm512_maddubs_epi16(w.a, x), ones));
    qv sx = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w.a, sx), ones);
#endif
}

INLINE fv fv_zero(void) { return _mm512_setzero_ps(); }
INLINE fv fv_acc(fv acc, qv d, fv scale) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc); }
INLINE float fv_sum(fv v) { return _mm512_reduce_add_ps(v); }

#elif defined(MM_AVX2)
#define BPV 1
#define RD 4
#define RP 2
#define TP 4
typedef __m256i qv;
typedef __m256 fv;
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define Q8_UNSIGNED 1
#endif
typedef struct { qv a; qv s; } wvec; /* unsigned operand; w itself (sign source for Q8_0 without VNNI) */

/* signed int8 weights z (Q8_0, IQ4_NL's levels) as the unsigned dot operand */
INLINE wvec w_signed(__m256i z) {
    wvec v;
#if Q8_UNSIGNED
    v.a = _mm256_xor_si256(z, _mm256_set1_epi8((char)0x80));
#else
    v.a = _mm256_sign_epi8(z, z);
#endif
    v.s = z;
    return v;
}

INLINE wvec w_load_q8(const block_q8_0 *b, int two) {
    (void)two;
    return w_signed(_mm256_loadu_si256((const __m256i *)b[0].qs));
}

INLINE wvec w_load_q4(const block_q4_0 *b, int two) {
    (void)two;
    __m128i q = _mm_loadu_si128((const __m128i *)b[0].qs);
    __m256i z = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    wvec v = {z, z};
    return v;
}

/* Q5_0 / Q4_1 / Q5_1 / IQ4_NL, one block: nibbles (plus 16 where the qh bit is set); IQ4_NL's table levels as Q8_0 */
INLINE wvec w_load_nib(const uint8_t *p, const int kind, int two) {
    (void)two;
    const int ho = kind_qh(kind);
    __m128i q = _mm_loadu_si128((const __m128i *)(p + kind_qs(kind)));
    __m256i z = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    if (kind == K_IQ4NL || kind == K_MXFP4) {
        const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128(
            (const __m128i *)(kind == K_MXFP4 ? pi_mxfp4_values : pi_iq4nl_values)));
        return w_signed(_mm256_shuffle_epi8(tab, z));
    }
    if (ho >= 0) {
        uint32_t h;
        memcpy(&h, p + ho, 4);
        /* byte i <- byte i / 8 of qh, then test bit i % 8: 0xff where element i has its fifth bit */
        __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                         _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        hb = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit);
        z = _mm256_or_si256(z, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
    }
    wvec v = {z, z};
    return v;
}

typedef struct { fv s[4]; } wscales; /* per row: its block scale in all lanes */
INLINE wscales w_scales(const uint8_t **rows, int64_t b, const int R, const int kind, const int two) {
    (void)two;
    wscales w;
    for (int r = 0; r < R; r++) w.s[r] = _mm256_set1_ps(kind_scale(rows[r] + b * kind_size(kind), kind));
    return w;
}
/* Q4_1/Q5_1 min terms: per token one 4-lane sum [r0, r1, r2, r3] of m_w * s_x */
typedef __m128 mvec;
INLINE mvec m_zero(void) { return _mm_setzero_ps(); }
INLINE mvec m_acc(mvec acc, const uint8_t **rows, int64_t b, const int R, const int kind, const int two, const float *xs) {
    (void)two;
    uint16_t m[4] = {0, 0, 0, 0};
    for (int r = 0; r < R; r++) memcpy(&m[r], rows[r] + b * kind_size(kind) + 2, 2);
    uint64_t u;
    memcpy(&u, m, 8);
    return _mm_fmadd_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)u)), _mm_broadcast_ss(xs), acc);
}
INLINE float m_get(mvec acc, int r) {
    float l[4];
    _mm_storeu_ps(l, acc);
    return l[r];
}
typedef fv tscales;
INLINE tscales t_scales(wscales ws, const float *xd) { (void)ws; return _mm256_broadcast_ss(xd); }
INLINE fv scale_rt(tscales sx, wscales ws, int r, int q4) { (void)q4; return _mm256_mul_ps(ws.s[r], sx); }
INLINE qv x_load(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE qv x_corr(const int32_t *c, int q4) { (void)q4; return _mm256_zextsi128_si256(_mm_cvtsi32_si128(c[0])); }

INLINE qv dot_q(wvec w, qv x, qv c, int q4) {
#if defined(__AVXVNNI__)
    (void)q4;
    return _mm256_dpbusd_avx_epi32(c, w.a, x);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)q4;
    return _mm256_dpbusd_epi32(c, w.a, x);
#else
    qv ones = _mm256_set1_epi16(1);
    if (q4) return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(w.a, x), ones));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w.a, _mm256_sign_epi8(x, w.s)), ones);
#endif
}

INLINE fv fv_zero(void) { return _mm256_setzero_ps(); }
INLINE fv fv_acc(fv acc, qv d, fv scale) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), scale, acc); }
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
INLINE float fv_sum(fv v) { return hsum8(v); }
#else
#define BPV 1
#define RD 1
#define RP 1
#define TP 1
#endif

#if defined(MM_AVX512) && defined(__AVX512VNNI__)
#define Q8_CORR 128
#elif defined(MM_AVX2) && Q8_UNSIGNED
#define Q8_CORR 128
#else
#define Q8_CORR 0
#endif

/* ==== block-type tiles ================================================================================ */
#if defined(MM_AVX512) || defined(MM_AVX2)
/* one vector step (BPV blocks starting at block b) of an R x T tile; `two` = 0 only for a lone last block */
INLINE void tile_q_step(const mm_job *j, const uint8_t **rows, int64_t t0, int64_t b, fv acc[][4], mvec *accm,
                        const int R, const int T, const int kind, const int two) {
    const int lay = kind != K_Q8, uns = kind_uns(kind); /* nibble layout; unsigned weights (correction term) */
    wvec wv[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#if defined(MM_AVX512)
        wv[r] = kind != K_Q8 ? w_load_nib(rows[r] + b * kind_size(kind), kind, two)
                             : w_load_q8((const block_q8_0 *)rows[r] + b, two); /* Q4_0: tile_quad */
#else
        wv[r] = kind == K_Q4   ? w_load_q4((const block_q4_0 *)rows[r] + b, two)
                : kind != K_Q8 ? w_load_nib(rows[r] + b * kind_size(kind), kind, two)
                               : w_load_q8((const block_q8_0 *)rows[r] + b, two);
#endif
    wscales ws = w_scales(rows, b, R, kind, two);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const int64_t o = (t0 + t) * j->nbp + b;
        qv xv = x_load(j->xq + o * QK), xc = x_corr(j->xc + o, lay);
        tscales ts = t_scales(ws, j->xd + o);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = fv_acc(acc[r][t], dot_q(wv[r], xv, xc, uns), scale_rt(ts, ws, r, lay));
        if (kind_min(kind)) accm[t] = m_acc(accm[t], rows, b, R, kind, two, j->xs + o);
    }
}

#if defined(MM_AVX512)
/* Q4_0 on AVX-512: quads of 4 blocks (QB). The 4 blocks' 16-byte qs go to one zmm; its low nibbles are
 * elements 0-15 of each block ("lo", 16 bytes per block) and its high nibbles elements 16-31 ("hi"); the
 * activations are stored in the same order (per quad: 64 bytes lo, then 64 bytes hi). Two dpbusd (lo, hi)
 * leave 4 int32 lanes per block (lane 4k + i: elements 4i..4i+3 and 16+4i..16+4i+3 of block k; the
 * -8 * sum(x) correction rides in lane 4k), so one convert and one FMA serve 4 blocks, against a scale
 * vector [d0 d0 d0 d0 d1 ... d3] (one vpermw of the quad's first 64 bytes, one f16 conversion) times the
 * token's block scales in the same pattern. */
#define QB 4
#ifndef DQ
#define DQ 8 /* decode rows per quad tile */
#endif
/* Q4_1 (20-byte blocks) and, with VNNI, IQ4_NL (18 bytes, like Q4_0) use the same quads: Q4_1's nibbles are
 * its unsigned values (no correction) and its m goes to lane 4k of a vector `m` beside d; IQ4_NL's nibbles
 * index its table (shifted by 128, unsigned for dpbusd; the -128 * sum(x) correction in lane 4k as Q8_0's).
 * Q5_1 (24 bytes) adds 16 where the qh bit is set: bits 0-15 of block k's qh are its lo bytes, 16-31 its hi
 * bytes, so the 4 qh words make one 64-bit byte mask for lo and one for hi. Without VNNI, IQ4_NL keeps the
 * pair tiles (maddubs would saturate on its 8-bit levels). Q5_0 keeps them too: its rounding (the pair tiles'
 * f32 operation order) is what the llama.cpp comparisons pin. */
/* MXFP4 takes the quads with and without VNNI: its doubled levels -12..12 plus MXFP4_OFF are unsigned bytes
 * 0..24 (the -12 * sum(x) correction in lane 4k), small enough for maddubs's int16 pairs (2 * 24 * 127). */
#define MXFP4_OFF 12
/* Q8_0 (34-byte blocks) takes the quads with VNNI (Q8_QUADS): the 4 blocks' first 16 bytes are its "lo", the last
 * 16 its "hi", each + 128 as unsigned bytes (the -128 * sum(x) correction in lane 4k), so one convert, one scale
 * product and one FMA serve 4 blocks where the pair tiles spent a convert, a permute and an FMA per 2. Measured
 * on the 2-core Zen 4 host (`bench_prefill_ab.py OLD NEW --types Q8_0 --n-tok 128 --threads 2`, CPU-time
 * GMAC/s: 93.0 -> 117.2 at 11008 x 4096, 87.3 -> 130.1 at 4096 x 11008; docs/performance.md). Without VNNI it keeps the pair tiles (maddubs takes |w| and sign(w)). */
#ifndef Q8_QUADS
#define Q8_QUADS 1 /* Gemma 3 270M mean NLL minus llama.cpp's over 160 / 400 / 1000 tokens of evaluation.txt: -0.0122 / -0.0013 / +0.0014 nats with the quads, +0.0058 / +0.0047 / +0.0041 without (the 160-token figure is noise) */
#endif
#if defined(__AVX512VNNI__) && Q8_QUADS
#define Q8_IN_QUADS 1
#endif
#if defined(__AVX512VNNI__)
INLINE int kind_quad(int kind) {
    return kind == K_Q4 || kind == K_Q41 || kind == K_Q51 || kind == K_IQ4NL || kind == K_MXFP4 || (Q8_QUADS && kind == K_Q8);
}
#else
INLINE int kind_quad(int kind) { return kind == K_Q4 || kind == K_Q41 || kind == K_Q51 || kind == K_MXFP4; }
#endif
typedef struct { __m512i lo, hi; __m512 d, m; } wquad;
INLINE wquad quad_load(const uint8_t *p, const int kind) { /* p: the quad's first byte (4 blocks) */
    const int64_t size = kind_size(kind), qo = kind_qs(kind);
    if (kind == K_Q8) { /* [b0 | b1] and [b2 | b3] qs, then their 16-byte halves regrouped: lo, hi */
        const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2))),
                                              _mm256_loadu_si256((const __m256i *)(p + size + 2)), 1);
        const __m512i cd = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2 * size + 2))),
                                              _mm256_loadu_si256((const __m256i *)(p + 3 * size + 2)), 1);
        const __m512i sign = _mm512_set1_epi8((char)0x80);
        wquad q;
        q.lo = _mm512_xor_si512(_mm512_permutex2var_epi64(ab, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), cd), sign);
        q.hi = _mm512_xor_si512(_mm512_permutex2var_epi64(ab, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), cd), sign);
        /* block k's f16 d is word 17k of the quad's first 128 bytes: words 0, 17 of a, 34 - 32, 51 - 32 of b2 */
        const __m512i a64 = _mm512_loadu_si512(p), b64 = _mm512_loadu_si512(p + 64);
        const __m512i dw = _mm512_permutex2var_epi16(a64, _mm512_setr_epi32(0, 0, 17 | 17 << 16, 17 | 17 << 16,
                                                     34 | 34 << 16, 34 | 34 << 16, 51 | 51 << 16, 51 | 51 << 16,
                                                     0, 0, 0, 0, 0, 0, 0, 0), b64);
        q.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dw));
        q.m = _mm512_setzero_ps();
        return q;
    }
    __m512i raw = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + qo)));
    raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(p + qo + size)), 1);
    raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(p + qo + 2 * size)), 2);
    raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(p + qo + 3 * size)), 3);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    wquad q = {_mm512_and_si512(raw, m4), _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4), _mm512_setzero_ps(),
               _mm512_setzero_ps()};
    if (kind == K_IQ4NL) {
        const __m512i tab = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pi_iq4nl_values)),
                                             _mm512_set1_epi8((char)0x80));
        q.lo = _mm512_shuffle_epi8(tab, q.lo);
        q.hi = _mm512_shuffle_epi8(tab, q.hi);
    }
    if (kind == K_MXFP4) {
        const __m512i tab = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pi_mxfp4_values)),
                                            _mm512_set1_epi8(MXFP4_OFF));
        q.lo = _mm512_shuffle_epi8(tab, q.lo);
        q.hi = _mm512_shuffle_epi8(tab, q.hi);
        /* block k's E8M0 byte is byte 17k = byte k of 16-byte lane k of the first 64 bytes: one in-lane shuffle
         * puts it in the low byte of int32 lanes 4k..4k+3. d holds the exponent e - 128 itself (as f32): quad_acc
         * forms d_w * d_x as scalef(d_x, e - 128) = d_x * 2^(e - 128), one correctly rounded result, the same as
         * the f32 product pi_e8m0_half(e) * d_x (d_w is a power of two, exact even where it is subnormal) */
        const __m512i e = _mm512_shuffle_epi8(_mm512_loadu_si512(p), _mm512_setr_epi32(
            (int)0x80808000, (int)0x80808000, (int)0x80808000, (int)0x80808000,
            (int)0x80808001, (int)0x80808001, (int)0x80808001, (int)0x80808001,
            (int)0x80808002, (int)0x80808002, (int)0x80808002, (int)0x80808002,
            (int)0x80808003, (int)0x80808003, (int)0x80808003, (int)0x80808003));
        q.d = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(128)));
        return q;
    }
    if (kind == K_Q51) {
        /* the quad's 96 bytes as words 0-31 (a) and 16-47 (b2, indices 32 + word - 16 in the two-source
         * permutes): block k's d and m are words 12k and 12k + 1, its qh words 12k + 2 (bits 0-15: the lo
         * bytes) and 12k + 3 (hi bytes) */
        const __m512i a = _mm512_loadu_si512(p), b2 = _mm512_loadu_si512(p + 32);
        const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi16(a, _mm512_setr_epi32(
            2 | 14 << 16, 26 | 54 << 16, 3 | 15 << 16, 27 | 55 << 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), b2));
        q.lo = _mm512_mask_add_epi8(q.lo, (__mmask64)_mm_cvtsi128_si64(qh), q.lo, _mm512_set1_epi8(16));
        q.hi = _mm512_mask_add_epi8(q.hi, (__mmask64)_mm_extract_epi64(qh, 1), q.hi, _mm512_set1_epi8(16));
        const __m512i dw = _mm512_permutex2var_epi16(a, _mm512_setr_epi32(0, 0, 12 | 12 << 16, 12 | 12 << 16,
                                                     24 | 24 << 16, 24 | 24 << 16, 52 | 52 << 16, 52 | 52 << 16,
                                                     0, 0, 0, 0, 0, 0, 0, 0), b2);
        const __m512i mw = _mm512_maskz_permutex2var_epi16(0x1111, a, _mm512_setr_epi32(1, 0, 13, 0, 25, 0, 53, 0,
                                                           0, 0, 0, 0, 0, 0, 0, 0), b2);
        q.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dw));
        q.m = _mm512_cvtph_ps(_mm512_castsi512_si256(mw));
        return q;
    }
    /* f16 d of block k (word size/2 * k of the first 64 bytes) into words 4k..4k+3; Q4_1's m (the next word)
     * into word 4k alone */
    const int w1 = (int)(size / 2), w2 = 2 * w1, w3 = 3 * w1;
    const __m512i raw64 = _mm512_loadu_si512(p);
    const __m512i dw = _mm512_permutexvar_epi16(_mm512_setr_epi32(0, 0, w1 | w1 << 16, w1 | w1 << 16, w2 | w2 << 16,
                                                w2 | w2 << 16, w3 | w3 << 16, w3 | w3 << 16, 0, 0, 0, 0, 0, 0, 0, 0), raw64);
    q.d = _mm512_cvtph_ps(_mm512_castsi512_si256(dw));
    if (kind_min(kind)) {
        const __m512i mw = _mm512_maskz_permutexvar_epi16(0x1111, _mm512_setr_epi32(1, 0, w1 + 1, 0, w2 + 1, 0,
                                                          w3 + 1, 0, 0, 0, 0, 0, 0, 0, 0, 0), raw64);
        q.m = _mm512_cvtph_ps(_mm512_castsi512_si256(mw));
    }
    return q;
}

INLINE __m512i quad_lanes(void) { return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); }

INLINE __m512i quad_dot(const wquad *w, __m512i xlo, __m512i xhi, __m512i xc) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xc, w->lo, xlo), w->hi, xhi);
#else
    const __m512i ones = _mm512_set1_epi16(1);
    return _mm512_add_epi32(_mm512_add_epi32(xc, _mm512_madd_epi16(_mm512_maddubs_epi16(w->lo, xlo), ones)),
                            _mm512_madd_epi16(_mm512_maddubs_epi16(w->hi, xhi), ones));
#endif
}

/* the token's 4 block sums s_x in the quad's lane order (Q4_1) */
INLINE __m512 quad_xs(const float *xs) { return _mm512_permutexvar_ps(quad_lanes(), _mm512_castps128_ps512(_mm_loadu_ps(xs))); }
/* acc + dot * (d_w * d_x), then (Q4_1) + m_w * s_x in lane 4k: the one operation order of every quad path */
INLINE __m512 quad_acc(const wquad *w, __m512i dot, __m512 xd, __m512 xs, __m512 acc, const int kind) {
    const __m512 s = kind == K_MXFP4 ? _mm512_scalef_ps(xd, w->d) : _mm512_mul_ps(w->d, xd); /* MXFP4: see quad_load */
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc);
    return kind_min(kind) ? _mm512_fmadd_ps(w->m, xs, acc) : acc;
}

/* one quad (x blocks b..b+3) of an R x T tile; wp[r] = the quad's first byte in row r */
INLINE void tile_quad_step(const mm_job *j, const uint8_t *const *wp, int64_t t0, int64_t b, fv acc[][4],
                           const int R, const int T, const int kind) {
    wquad w[8];
    if (T == 1) { /* decode: each row's quad is used once, straight after its load (no 3 x R live registers) */
        const __m512i xlo = _mm512_loadu_si512(j->xq + (t0 * j->nbp + b) * QK);
        const __m512i xhi = _mm512_loadu_si512(j->xq + (t0 * j->nbp + b) * QK + 64);
        const __m512i xc = _mm512_maskz_permutexvar_epi32(0x1111, quad_lanes(),
                                                          _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(j->xc + t0 * j->nbp + b))));
        const __m512 xd = _mm512_permutexvar_ps(quad_lanes(), _mm512_castps128_ps512(_mm_loadu_ps(j->xd + t0 * j->nbp + b)));
        const __m512 xs = kind_min(kind) ? quad_xs(j->xs + t0 * j->nbp + b) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const wquad q = quad_load(wp[r], kind);
            acc[r][0] = quad_acc(&q, quad_dot(&q, xlo, xhi, xc), xd, xs, acc[r][0], kind);
        }
        return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) w[r] = quad_load(wp[r], kind);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const int64_t o = (t0 + t) * j->nbp + b;
        const __m512i xlo = _mm512_loadu_si512(j->xq + o * QK), xhi = _mm512_loadu_si512(j->xq + o * QK + 64);
        const __m512i xc = _mm512_maskz_permutexvar_epi32(0x1111, quad_lanes(),
                                                          _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(j->xc + o))));
        const __m512 xd = _mm512_permutexvar_ps(quad_lanes(), _mm512_castps128_ps512(_mm_loadu_ps(j->xd + o)));
        const __m512 xs = kind_min(kind) ? quad_xs(j->xs + o) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = quad_acc(&w[r], quad_dot(&w[r], xlo, xhi, xc), xd, xs, acc[r][t], kind);
    }
}

INLINE void tile_quad(const mm_job *j, const uint8_t **rows, int64_t r0, int64_t t0, fv acc[][4], const int R,
                      const int T, const int kind) {
    const int64_t size = kind_size(kind), nb = j->n_cols / QK, nq = nb / QB * QB;
    const uint8_t *wp[8], *next[8];
    /* decode prefetch: PF_DIST bytes ahead along each row, and past a row's end the start of the row that
     * takes its place in the next tile (the rows are not contiguous streams for the hardware prefetcher).
     * Gathered rows (pi_matmul_rows) are scattered, not even runs of neighbours: the next tile's rows are
     * fetched whole, each at the offset this tile is at (~15% faster than the above at 50-95% sparsity);
     * next[] holds the next tile's rows themselves then, else the addresses one row before them. */
    const int gather = T == 1 && j->sel != NULL;
    for (int r = 0; r < R; r++)
        next[r] = mm_row_or_last(j, r0 + R + r) - (gather ? 0 : j->row_bytes);
    const int first = T > 1 && t0 % TOK_BLOCK == 0; /* a prefill's first pass: its rows come from memory */
    for (int64_t b = 0; b < nq; b += QB) {
        const int ahead = b * size + PF_DIST >= j->row_bytes;
        for (int r = 0; r < R; r++) {
            wp[r] = rows[r] + b * size;
            if (gather)
                for (int64_t o = 0; o < QB * size; o += 64) _mm_prefetch((const char *)next[r] + b * size + o, _MM_HINT_T0);
            else if (T == 1)
                _mm_prefetch((const char *)(ahead ? next[r] : rows[r]) + b * size + PF_DIST, _MM_HINT_T0);
            else if (first) /* the next tile's rows at this offset (the note above mm_chunk's token blocks) */
                for (int64_t o = 0; o < QB * size; o += 64)
                    _mm_prefetch((const char *)next[r] + j->row_bytes + b * size + o, _MM_HINT_T0);
        }
        tile_quad_step(j, wp, t0, b, acc, R, T, kind);
    }
    if (nq < nb) { /* the last 1-3 blocks: copied into zeroed quads (zero d, zero x: adds exact zeros) */
        _Alignas(64) uint8_t buf[8][144]; /* the largest quad: Q8_0, 4 x 34 bytes */
        memset(buf, 0, sizeof(buf));
        for (int r = 0; r < R; r++) {
            memcpy(buf[r], rows[r] + nq * size, (size_t)((nb - nq) * size));
            wp[r] = buf[r];
        }
        tile_quad_step(j, wp, t0, nq, acc, R, T, kind);
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) j->y[(t0 + t) * j->n_rows + r0 + r] = fv_sum(acc[r][t]);
}
#endif

#if defined(MM_AVX2)
/* Q8_0 prefill on AVX2 (R <= 2 rows x T <= 4 tokens; q8_chunk below drives it). On AVX2 every other 32-element
 * kind prefills through the 8-block groups (g8_chunk). It does tile_q_step's arithmetic for K_Q8, operation for
 * operation per (row, token, block): the integer dot (dot_q), one convert, the scale d_w * d_x as one f32 product
 * and one FMA into the pair's 8-lane accumulator, so the bits are the other tiles' and decode's. What differs is
 * where the work sits. Without VNNI the dot is five vector-ALU operations per (row, token, block): the sign of x
 * by w, maddubs, madd, convert, FMA; a scratch loop of only those (2 x 4 pairs, operands in L1) ran ~70 GMAC/s
 * per core on the Zen 5 host, against ~60 for F16's one FMA per multiply-add, so anything else in the loop costs
 * in proportion:
 *   - the R x T scale products of a block come from one vector multiply, stored to a small buffer that each FMA
 *     reads as a broadcast from memory: a load-port operation. The generic tile's broadcast and multiply per pair
 *     took one of six vector-ALU operations per (row, token, block); llama.cpp's AVX2 Q8_0 GEMM likewise keeps
 *     its scale off the ALU ports;
 *   - the multiply's operands are loads too: the rows' scales as f32 (wd: q8_chunk converts a row block's once
 *     per token block) and the 4 tokens' scales side by side (xd4: j->xd4, written beside the quantized
 *     activations), where gathering 4 token scales and converting 2 f16 per block had taken ~10 operations;
 *   - the broadcasts go through one base register (the empty asm): gcc otherwise kept the 8 addresses as
 *     separate loop invariants and spilled them and the activation pointers, ~10 stack loads per block;
 *   - the per-token activation pointers are formed once per tile and the accumulators are plain locals.
 * Measured in docs/performance.md ("AVX2 Q8_0 prefill tile"). */
INLINE void q8_tile(const mm_job *j, int64_t r0, int64_t t0, const int R, const int T, const float *wd,
                    const float *xd4) {
    const int64_t nb = j->n_cols / QK, nbp = j->nbp;
    const block_q8_0 *w[2];
    const int8_t *xq[4];
    const int32_t *xc[4]; /* the VNNI correction (dot_q); unused, and not loaded, without VNNI */
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) w[r] = (const block_q8_0 *)mm_row(j, r0 + r);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        xq[t] = j->xq + (t0 + t) * nbp * QK;
        xc[t] = j->xc + (t0 + t) * nbp;
    }
    const float *wd1 = wd + (R - 1) * nb;
    fv acc[2][4]; /* every loop over it unrolled, so that it lives in registers */
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) acc[r][t] = fv_zero();
    float sc[8] __attribute__((aligned(32))); /* sc[4 r + t] = d_w(r) * d_x(t) of the current block */
    /* a token block's first pass reads the rows from memory: fetch the next tile's rows at this offset meanwhile
     * (as the float tiles do, the note above mm_chunk's token blocks) */
    const int first = t0 % TOK_BLOCK == 0;
    const block_q8_0 *next[2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) next[r] = (const block_q8_0 *)mm_row_or_last(j, r0 + R + r);
    for (int64_t b = 0; b < nb; b++) {
        if (first)
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(next[r] + b), _MM_HINT_T0);
        wvec wv[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) wv[r] = w_load_q8(w[r] + b, 1);
        const __m256 dw = _mm256_set_m128(_mm_broadcast_ss(wd1 + b), _mm_broadcast_ss(wd + b)); /* lanes 4r..4r+3 */
        _mm256_store_ps(sc, _mm256_mul_ps(dw, _mm256_broadcast_ps((const __m128 *)(xd4 + b * 4))));
        const float *scp = sc;
        __asm__("" : "+r"(scp)); /* one base register for the broadcasts (see above) */
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const qv xv = x_load(xq[t] + b * QK), c = x_corr(xc[t] + b, 0);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                acc[r][t] = fv_acc(acc[r][t], dot_q(wv[r], xv, c, 0), _mm256_broadcast_ss(scp + 4 * r + t));
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) j->y[(t0 + t) * j->n_rows + r0 + r] = fv_sum(acc[r][t]);
}
#endif

INLINE void tile_q(const mm_job *j, int64_t r0, int64_t t0, const int R, const int T, const int kind) {
    fv acc[8][4]; /* R <= 4, or <= 8 with T == 1 (quad decode) */
    const uint8_t *rows[8];
    mvec accm[4];
    for (int t = 0; t < 4; t++) accm[t] = m_zero();
    for (int r = 0; r < R; r++) {
        rows[r] = mm_row(j, r0 + r);
        for (int t = 0; t < T; t++) acc[r][t] = fv_zero();
    }
#if defined(MM_AVX512)
    if (kind_quad(kind)) {
        tile_quad(j, rows, r0, t0, acc, R, T, kind);
        return;
    }
#endif
    const int64_t nb = j->n_cols / QK, nfull = nb / BPV * BPV;
#if defined(MM_AVX512) || defined(MM_AVX2)
    const uint8_t *next[4]; /* decode prefetch as in tile_quad: along the row, then the next tile's row */
    for (int r = 0; r < R; r++) next[r] = mm_row_or_last(j, r0 + R + r) - j->row_bytes;
#endif
    for (int64_t b = 0; b < nfull; b += BPV) {
#if defined(MM_AVX512) || defined(MM_AVX2)
        if (T == 1) {
            const int64_t o = b * kind_size(kind) + PF_DIST;
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(o >= j->row_bytes ? next[r] : rows[r]) + o, _MM_HINT_T0);
        }
#endif
        tile_q_step(j, rows, t0, b, acc, accm, R, T, kind, 1);
    }
    if (nfull < nb) tile_q_step(j, rows, t0, nfull, acc, accm, R, T, kind, 0);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            j->y[(t0 + t) * j->n_rows + r0 + r] = kind_min(kind) ? fv_sum(acc[r][t]) + m_get(accm[t], r) : fv_sum(acc[r][t]);
}

#else
static void tile_q(const mm_job *j, int64_t r0, int64_t t0, const int R, const int T, const int kind) {
    const int64_t nb = j->n_cols / QK;
    for (int r = 0; r < R; r++) {
        const uint8_t *row = mm_row(j, r0 + r);
        for (int t = 0; t < T; t++) {
            const int8_t *xq = j->xq + (t0 + t) * j->nbp * QK;
            const float *xd = j->xd + (t0 + t) * j->nbp;
            float acc = 0.0f, accm = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t s = 0;
                float dw;
                if (kind >= K_Q41) { /* Q4_1, Q5_1, IQ4_NL, MXFP4 */
                    int8_t q[QK];
                    float m;
                    pi_unpack_q32(j->type, row + b * kind_size(kind), q, &dw, &m);
                    for (int i = 0; i < QK; i++) s += q[i] * xq[b * QK + i];
                    if (kind_min(kind)) accm += m * j->xs[(t0 + t) * j->nbp + b];
                } else if (kind == 2) {
                    const block_q5_0 *wb = (const block_q5_0 *)row + b;
                    uint32_t qh;
                    memcpy(&qh, wb->qh, 4);
                    for (int i = 0; i < QK / 2; i++)
                        s += (((wb->qs[i] & 0x0f) | ((qh >> i) & 1) << 4) - 16) * xq[b * QK + i] +
                             (((wb->qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - 16) * xq[b * QK + i + 16];
                    dw = pi_h2f(wb->d);
                } else if (kind == 1) {
                    const block_q4_0 *wb = (const block_q4_0 *)row + b;
                    for (int i = 0; i < QK / 2; i++)
                        s += ((wb->qs[i] & 0x0f) - 8) * xq[b * QK + i] + ((wb->qs[i] >> 4) - 8) * xq[b * QK + i + 16];
                    dw = pi_h2f(wb->d);
                } else {
                    const block_q8_0 *wb = (const block_q8_0 *)row + b;
                    for (int i = 0; i < QK; i++) s += wb->qs[i] * xq[b * QK + i];
                    dw = pi_h2f(wb->d);
                }
                acc += (float)s * (dw * xd[b]);
            }
            j->y[(t0 + t) * j->n_rows + r0 + r] = kind_min(kind) ? acc + accm : acc;
        }
    }
}
#endif

/* ==== float-type tiles ================================================================================ */
#if defined(MM_AVX512)
#define FL 16 /* f32 lanes */
typedef __mmask32 lanemask; /* the column tail's lanes: 16 f32 lanes, or 32 bf16 columns (BF16_DP) */
INLINE fv wf_load(const int type, const void *row, int64_t k, const int tail, lanemask m) {
    if (type == PI_F32) return tail ? _mm512_maskz_loadu_ps((__mmask16)m, (const float *)row + k) : _mm512_loadu_ps((const float *)row + k);
    const uint16_t *p = (const uint16_t *)row + k;
    __m256i h = tail ? _mm256_maskz_loadu_epi16((__mmask16)m, p) : _mm256_loadu_si256((const __m256i *)p);
    if (type == PI_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16: top half of f32 */
}
INLINE fv xf_load(const float *p, const int tail, lanemask m) { return tail ? _mm512_maskz_loadu_ps((__mmask16)m, p) : _mm512_loadu_ps(p); }
INLINE fv fv_fma(fv a, fv b, fv c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(MM_AVX2)
#define FL 8
typedef int lanemask;
INLINE fv wf_load(const int type, const void *row, int64_t k, const int tail, lanemask m) {
    (void)tail; (void)m;
    if (type == PI_F32) return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (type == PI_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
INLINE fv xf_load(const float *p, const int tail, lanemask m) { (void)tail; (void)m; return _mm256_loadu_ps(p); }
INLINE fv fv_fma(fv a, fv b, fv c) { return _mm256_fmadd_ps(a, b, c); }
#endif
/* An x vector that several rows' fmas share, held in a register: left to itself gcc folds the load into each of
 * those fmas as a memory operand, so a 2 x 6 tile issued 12 x loads + 2 weight loads per step where 6 + 2 do.
 * (On the AVX2 EPYC the change alone measured within the noise, 11008 x 4096 F16 114-117 GFLOP/s either way.) */
#if defined(MM_AVX512) || defined(MM_AVX2)
INLINE fv xf_shared(const float *p, const int tail, lanemask m) {
    fv v = xf_load(p, tail, m);
#if defined(MM_AVX512)
    __asm__("" : "+v"(v)); /* "v": any of the 32 zmm */
#else
    __asm__("" : "+x"(v));
#endif
    return v;
}
#endif

static inline float wf_scalar(int type, const void *row, int64_t k) {
    if (type == PI_F32) return ((const float *)row)[k];
    if (type == PI_F16) return pi_h2f(((const uint16_t *)row)[k]);
    return bf16_to_f32(((const uint16_t *)row)[k]);
}

#if defined(MM_AVX512) || defined(MM_AVX2)
/* columns per tile step: one f32 vector, or (BF16_DP) 32 bf16 columns, two per f32 lane */
INLINE int64_t fstep(const int type) {
#if defined(BF16_DP)
    if (type == PI_BF16) return 32;
#endif
    (void)type;
    return FL;
}
#if defined(BF16_DP)
/* BF16 weights on AVX512-BF16: vdpbf16ps adds to f32 lane i the products of columns 2i + 1 and 2i of the step's 32
 * (each product exact in f32, then two f32 adds in that order); the weights go in as they lie in the row, the
 * activations come from their bf16 copy j->xb (one register shared by the R rows, as xf_shared) */
INLINE void tile_b_step(const mm_job *j, const uint8_t **rows, int64_t t0, int64_t k, fv acc[][8], const int R,
                        const int T, const int tail, lanemask m) {
    __m512i wv[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint16_t *p = (const uint16_t *)rows[r] + k;
        wv[r] = tail ? _mm512_maskz_loadu_epi16(m, p) : _mm512_loadu_si512(p);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const uint16_t *xp = j->xb + (t0 + t) * (j->xstride ? j->xstride : j->n_cols) + k;
        __m512i xv = tail ? _mm512_maskz_loadu_epi16(m, xp) : _mm512_loadu_si512(xp);
        if (R > 1) __asm__("" : "+v"(xv));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);
    }
}
#endif
INLINE void tile_f_step(const mm_job *j, const uint8_t **rows, int64_t t0, int64_t k, fv acc[][8], const int R,
                        const int T, const int type, const int tail, lanemask m) {
#if defined(BF16_DP)
    if (type == PI_BF16) {
        tile_b_step(j, rows, t0, k, acc, R, T, tail, m);
        return;
    }
#endif
    fv wv[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) wv[r] = wf_load(type, rows[r], k, tail, m);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const float *xp = j->x + (t0 + t) * (j->xstride ? j->xstride : j->n_cols) + k;
        fv xv = R > 1 ? xf_shared(xp, tail, m) : xf_load(xp, tail, m);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r][t] = fv_fma(wv[r], xv, acc[r][t]);
    }
}

/* y for a tile's R rows x T tokens: each accumulator's lanes summed, then (AVX2) the columns past the last full
 * vector, as scalars */
INLINE void tile_f_store(const mm_job *j, const uint8_t *const *rows, int64_t r0, int64_t t0, fv acc[][8],
                         const int R, const int T, const int type) {
    const int64_t K = j->n_cols, kfull = K / FL * FL;
    (void)rows; (void)type; (void)kfull;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = fv_sum(acc[r][t]);
#if defined(MM_AVX2)
            const float *x = j->x + (t0 + t) * (j->xstride ? j->xstride : K);
            for (int64_t k = kfull; k < K; k++) s += wf_scalar(type, rows[r], k) * x[k];
#endif
            j->y[(t0 + t) * j->n_rows + r0 + r] = s;
        }
}

INLINE void tile_f(const mm_job *j, int64_t r0, int64_t t0, const int R, const int T, const int type) {
    fv acc[4][8];
    const uint8_t *rows[4];
    for (int r = 0; r < R; r++) {
        rows[r] = mm_row(j, r0 + r);
        for (int t = 0; t < T; t++) acc[r][t] = fv_zero();
    }
    const int64_t K = j->n_cols, step = fstep(type), kfull = K / step * step;
    if (T == 1 || t0 % FTOK_BLOCK == 0) {
        /* fetch the next tile's rows at this tile's offset, as the Q4_0 quads do: gathered rows are scattered
           (+5-12% at 50-95% sparsity, F16 7B shape, cold), and every dense float decode comes here too (measured
           first for rows past 8192 columns, 4096 x 11008, 2 threads, `bench_prefill_ab.py --n-tok 1 --rounds
           11`, two runs: F16 1.05x / 1.07x, BF16 1.20x / 1.05x wall; same bits; the rest: the F16 / BF16
           decode note above tile_dec). So does a prefill's first token group of a token block, the one that
           reads the rows from memory (the later groups find them in L2): the note above mm_chunk's blocks. */
        const int64_t esz = type == PI_F32 ? 4 : 2;
        const uint8_t *next[4];
        for (int r = 0; r < R; r++) next[r] = mm_row_or_last(j, r0 + R + r);
        for (int64_t k = 0; k < kfull; k += step) {
            if (!((k * esz) & 63))
                for (int r = 0; r < R; r++) _mm_prefetch((const char *)next[r] + k * esz, _MM_HINT_T0);
            tile_f_step(j, rows, t0, k, acc, R, T, type, 0, 0);
        }
    } else {
        for (int64_t k = 0; k < kfull; k += step) tile_f_step(j, rows, t0, k, acc, R, T, type, 0, 0);
    }
#if defined(MM_AVX512)
    if (kfull < K) tile_f_step(j, rows, t0, kfull, acc, R, T, type, 1, (lanemask)((1u << (K - kfull)) - 1));
#endif
    tile_f_store(j, rows, r0, t0, acc, R, T, type);
}
#else
static void tile_f(const mm_job *j, int64_t r0, int64_t t0, const int R, const int T, const int type) {
    for (int r = 0; r < R; r++) {
        const uint8_t *row = mm_row(j, r0 + r);
        for (int t = 0; t < T; t++) {
            const float *x = j->x + (t0 + t) * (j->xstride ? j->xstride : j->n_cols);
            float s = 0.0f;
            for (int64_t k = 0; k < j->n_cols; k++) s += wf_scalar(type, row, k) * x[k];
            j->y[(t0 + t) * j->n_rows + r0 + r] = s;
        }
    }
}
#endif

/* ==== row-at-a-time decode: the prefetch stream ===============================================================
 * The row decoders below walk their rows one after another and prefetch `dist` bytes ahead in the sequence of
 * those rows laid end to end: for a dense matrix that is plain address + dist; for gathered rows (matmul_rows)
 * it crosses into the next selected rows, so scattered rows are requested before they are reached as well. */
#if defined(MM_AVX512) || defined(MM_AVX2)
typedef struct { int64_t r, off; } pf_stream;
INLINE pf_stream pf_start(const mm_job *j, int64_t r, int64_t dist) {
    pf_stream a = {r + dist / j->row_bytes, dist % j->row_bytes};
    return a;
}
INLINE void pf_step(const mm_job *j, pf_stream *a, int64_t r1, int64_t step) {
    if (a->r < r1) _mm_prefetch((const char *)mm_row(j, a->r) + a->off, _MM_HINT_T0);
    a->off += step;
    if (a->off >= j->row_bytes) {
        a->off -= j->row_bytes;
        a->r++;
    }
}
#endif

/* ==== decode: one row at a time, or several side by side =======================================================
 * Three decode paths can read their rows one at a time or several side by side: F16 (vector builds: one row,
 * or RD = 4 in tile_dec), Q8_0 on AVX2 (one row, or 4 in tile_dec; with VNNI Q8_0 decodes one row at a time
 * already, as quads) and the AVX2 8-block groups (g8_rows: one row, or two sharing the activation loads). Either
 * way each row is computed by the same operations in the same order, so both give the prefill tiles' bits; they
 * differ in how the rows are read. One row alone is one contiguous stream per thread, which the 2-core Zen 5 host
 * reads fastest. Measured there, in one process, the rows switched between turns of 16 greedy decode tokens (9-10
 * turns each, medians of the paired ratios), 8-layer 7B-shape files:
 *   - F16, AVX-512: one row 1.10x over four (and the sparse F16 PWRI file of bench_sparse_e2e.py 1.13x in
 *     predictor and in exact mode); kernel A/B (`bench_prefill_ab.py OLD NEW --types F16 --shapes
 *     11008x4096,4096x11008 --threads 2 --n-tok 1 --rounds 15 --reps 5`) 1.16x / 1.05x; two rows 0.96x / 0.97x;
 *   - Q8_0, AVX2 build: one row 1.14x / 1.16x over four (two rows 0.80x, three 0.92x);
 *   - Q4_0 and Q5_0 files, AVX2 build: one row 1.16x and 1.10x over two.
 * One row is one dependent chain, though: one FMA per vector of F16 (FL x 2 bytes), per Q8_0 block (34 bytes) or
 * per 8-block group (144-192 bytes), each waiting for the last. 32 or 34 bytes per 4-cycle FMA latency is ~32
 * GB/s per thread at 4 GHz, enough there, but ~16 GB/s on a 2.0 GHz core (the 2-core Intel AMX host, where one
 * F16 row per thread lost to four by 1.3x, see the F16 / BF16 decode note) and for F16 in 8-lane AVX2 vectors
 * even at 4 GHz (the AVX2 build on the Zen 5 host: 0.49x end to end). So the choice follows the one fact that
 * decides it, measured once per process: the time of a dependent FMA chain (best of 8 runs of 2048 FMAs, ~40
 * us), from which each path's one-row streaming rate follows; one row where that is at least ONE_ROW_GBS, about
 * one of two cores' share of DRAM bandwidth on the hosts measured (40-60 GB/s for two cores), else several.
 * Scattered gathers (the sparse FFN's rows) keep the AVX2 groups' two rows, whose prefetch looks rows ahead.
 * POWERINFER_DECODE_ROWS=1 fixes one row for all three, any other number >= 2 the several rows (benchmarks). */
#if defined(MM_AVX512) || defined(MM_AVX2)
#define ONE_ROW_GBS 24.0
enum { DR_F16, DR_Q8, DR_G8, DR_N };
static int one_row[DR_N];
#if defined(MM_AVX2)
static int f16_rows = RD; /* dense F16 (where not one row) and BF16 decode: 2 or RD rows per tile (AVX2 note above
                            tile_dec) */
#endif
static pthread_once_t decode_rows_once = PTHREAD_ONCE_INIT;
static double mono_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static void decode_rows_init(void) {
    const char *env = getenv("POWERINFER_DECODE_ROWS");
    if (env && atoi(env) >= 1) {
        for (int i = 0; i < DR_N; i++) one_row[i] = atoi(env) == 1;
#if defined(MM_AVX2)
        f16_rows = atoi(env) == 2 ? 2 : RD;
#endif
        return;
    }
    double best = 1e9; /* seconds per dependent FMA */
    fv a = fv_zero(), b = fv_zero(), c = fv_zero();
    for (int rep = 0; rep < 8; rep++) {
        const double t0 = mono_seconds();
        for (int i = 0; i < 2048; i++) {
            a = fv_fma(a, b, c);
            __asm__ volatile("" : "+x"(a)); /* one chain, kept as written */
        }
        const double t = (mono_seconds() - t0) / 2048;
        if (t < best) best = t;
    }
    const double per_fma[DR_N] = {FL * 2, (double)sizeof(block_q8_0), 8 * (double)sizeof(block_q4_0)};
    for (int i = 0; i < DR_N; i++) one_row[i] = per_fma[i] / best / 1e9 >= ONE_ROW_GBS;
#if defined(MM_AVX2)
    f16_rows = 2 * per_fma[DR_F16] / best / 1e9 >= ONE_ROW_GBS ? 2 : RD; /* two chains stream enough */
#endif
}
/* whether decode path `path` (DR_*) reads one row at a time */
static int decode_one_row(int path) {
    pthread_once(&decode_rows_once, decode_rows_init);
    return one_row[path];
}
#endif
/* the DR_* path of a type's decode in this build, or -1 (no choice) */
static int decode_path(int type) {
#if defined(MM_AVX512)
    return type == PI_F16 ? DR_F16 : -1;
#elif defined(MM_AVX2)
    if (type == PI_F16) return DR_F16;
    if (type == PI_Q8_0) return DR_Q8;
    return type == PI_Q4_0 || type == PI_Q4_1 || type == PI_Q5_0 || type == PI_Q5_1 || type == PI_IQ4_NL ||
                   type == PI_MXFP4
               ? DR_G8
               : -1;
#else
    (void)type;
    return -1;
#endif
}
int pi_decode_rows(int type, int set) {
#if defined(MM_AVX2)
    if (type == PI_BF16) { /* dense AVX2 BF16 rows take the F16 count, 2 or RD (no one-row path: set = 1 ignored) */
        decode_one_row(DR_F16);
        if (set >= 2) f16_rows = set == 2 ? 2 : RD;
        return f16_rows;
    }
#endif
    const int path = decode_path(type);
    if (path < 0) return 0;
#if defined(MM_AVX512) || defined(MM_AVX2)
    decode_one_row(path);
    if (set >= 1) one_row[path] = set == 1;
#if defined(MM_AVX2)
    if (path == DR_F16 && set >= 2) f16_rows = set == 2 ? 2 : RD;
    if (path == DR_F16) return one_row[path] ? 1 : f16_rows;
#endif
    return one_row[path] ? 1 : path == DR_G8 ? 2 : RD;
#else
    (void)set;
    return 0;
#endif
}
/* ==== AVX2: groups of 8 blocks =================================================================================
 * Without AVX-512 the per-block work of the generic tiles (a scalar f16 conversion and broadcast of the weight
 * scale, a convert and an FMA for every block) made decode compute-bound at ~6-7 GB/s per thread for Q4_0/Q5_0.
 * Here the unit of work is a group of GB = 8 consecutive blocks of a row:
 *   - the 8 f16 scales d (and Q4_1/Q5_1's m) come out of 8 overlapping 16-byte loads, the k-th taken at
 *     k * (size - 2) bytes so that block k's field is its word k, merged by 7 word blends: one conversion;
 *   - the nibbles go in pairs of blocks (i, i + 4) per ymm, lane 0 block i, lane 1 block i + 4: `lo` holds their
 *     elements 0-15, `hi` 16-31 (Q5_*: plus 16 where the qh bit is set; MXFP4: its doubled levels + MXFP4_OFF,
 *     0..24), and the activations are stored in that order (quantize_token);
 *   - maddubs(lo, x) + maddubs(hi, x) per pair (int16, 4 products per lane), then integer folds (g8_tree) make
 *     one int32 vector whose lane k is block k's whole dot: exact, since the int16 partial sums stay small
 *     (nibbles <= 15: horizontal adds up to 16 products per int16 lane, |sum| <= 16 * 15 * 127; nibbles <= 31
 *     (Q5_*, MXFP4): madd to int32 at 4 products, then a transpose-add);
 *   - + the blocks' correction -off * sum(x) (int32, from xc), one convert, and one FMA by d_w * d_x (8 lanes),
 *     then Q4_1/Q5_1's + m_w * s_x (one more FMA), per group, into one 8-lane accumulator per (row, token),
 *     reduced once at the end (hsum8).
 * A row whose block count is not a multiple of 8 ends with a group copied into a zeroed buffer (zero weights and
 * scales against the zero activations the padding holds: it adds exact zeros). Decode (g8_rows) walks its
 * rows two at a time (sharing the activation loads) with software prefetch; prefill (g8_tile) unpacks a row's group once for up to G8_TP
 * tokens. Both call g8_acc for every (row, token, group) in the same order, so decode, prefill, gathers and any
 * thread count give the same bits. IQ4_NL (signed 8-bit levels) takes the groups with one block per ymm
 * (maddubs(|w|, x * sign(w)), madd, an 8 x 8 transpose-add: g8_s*); Q8_0 could too (prefill measured +25%,
 * decode the same) but keeps the generic tiles for the llama.cpp agreement, see kind_g8. */
#if defined(MM_AVX2)
#define GB 8
#define G8_TP 8          /* prefill tokens per tile, at most (see g8_tp) */
#define G8_PF_DIST 4096  /* decode: bytes ahead in the row stream */
#define G8_AHEAD 4       /* scattered gathers: the row this many places later is prefetched at this row's offset */
#ifndef MXFP4_OFF
#define MXFP4_OFF 12
#endif
/* Q8_0 keeps the generic tiles: their f32 order (8 lanes of partial block dots times the scale, one reduction at
 * the end) is llama.cpp's AVX2 one, and the top-1 agreement with llama.cpp on the real model
 * (tests/test_real_model.py) fell below its bound with the groups' whole-block order (92.6% against 93.5%) */
INLINE int kind_g8(int kind) { return kind != K_Q8; }
INLINE int kind_signed(int kind) { return kind == K_Q8 || kind == K_IQ4NL; } /* signed 8-bit levels, natural order */
INLINE int kind_g8_16(int kind) { return kind == K_Q4 || kind == K_Q41; } /* nibbles <= 15: 16-product int16 sums */
/* prefill tokens per tile: one row's group is unpacked once per tile. Q5_0/Q5_1/MXFP4 (dearer to unpack) take 8
 * (measured +14% over 4, Q5_0 4096 x 4096, one thread); Q4_0/Q4_1 4 (8 measured -18%: register spills) */
INLINE int g8_tp(int kind) { return kind_g8_16(kind) ? 4 : 8; }
INLINE int kind_corr(int kind) { return kind == K_Q4 || kind == K_Q5 || kind == K_MXFP4; }

typedef struct { __m256i lo[4], hi[4]; __m256 d, m; } wg8;

/* the f16 fields at p + k * S, k = 0..7, as 8 words: the k-th of 8 overlapping 16-byte loads, taken at
 * k * (S - 2), holds block k's field as its word k; 7 word blends merge them */
INLINE __m128i g8_words(const uint8_t *p, const int64_t S) {
    const int64_t step = S - 2;
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 1 * step)), 0x02);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 2 * step)), 0x04);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 3 * step)), 0x08);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 4 * step)), 0x10);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 5 * step)), 0x20);
    v = _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 6 * step)), 0x40);
    return _mm_blend_epi16(v, _mm_loadu_si128((const __m128i *)(p + 7 * step)), 0x80);
}
/* MXFP4: the 8 E8M0 bytes (block k's at 17k) as pi_e8m0_half, bit for bit */
INLINE __m256 g8_e8m0(const uint8_t *p) {
    uint64_t u = 0;
    for (int k = 0; k < GB; k++) u |= (uint64_t)p[17 * k] << (8 * k);
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)u));
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e); /* e = 0, 1: subnormal */
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* pair i (blocks i, i + 4) of the group at p: lo = elements 0-15, hi = 16-31 as unsigned bytes */
INLINE void g8_pair(__m256i *lo_out, __m256i *hi_out, const uint8_t *p, const int i, const int kind) {
    const int64_t S = kind_size(kind);
    const int qo = kind_qs(kind), ho = kind_qh(kind);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i v = _mm256_loadu2_m128i((const __m128i *)(p + (i + 4) * S + qo), (const __m128i *)(p + i * S + qo));
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (ho >= 0) {
        /* byte e of lo gets qh bit e (qh byte e / 8), of hi bit 16 + e; lane 0 from block i, lane 1 from i + 4 */
        const __m256i h = _mm256_loadu2_m128i((const __m128i *)(p + (i + 4) * S + ho), (const __m128i *)(p + i * S + ho));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL), b16 = _mm256_set1_epi8(16);
        __m256i hl = _mm256_shuffle_epi8(h, _mm256_setr_epi64x(0, 0x0101010101010101LL, 0, 0x0101010101010101LL));
        __m256i hh = _mm256_shuffle_epi8(h, _mm256_setr_epi64x(0x0202020202020202LL, 0x0303030303030303LL,
                                                               0x0202020202020202LL, 0x0303030303030303LL));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hl, bit), bit), b16));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hh, bit), bit), b16));
    }
    if (kind == K_MXFP4) {
        const __m256i tab = _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pi_mxfp4_values)),
                                            _mm256_set1_epi8(MXFP4_OFF));
        lo = _mm256_shuffle_epi8(tab, lo);
        hi = _mm256_shuffle_epi8(tab, hi);
    }
    *lo_out = lo;
    *hi_out = hi;
}
/* the group's 8 weight scales d (and Q4_1/Q5_1's m) as f32 */
INLINE void g8_scales(wg8 *w, const uint8_t *p, const int kind) {
    const int64_t S = kind_size(kind);
    w->d = kind == K_MXFP4 ? g8_e8m0(p) : _mm256_cvtph_ps(g8_words(p, S));
    w->m = kind_min(kind) ? _mm256_cvtph_ps(g8_words(p + 2, S)) : _mm256_setzero_ps();
}
/* Q8_0 / IQ4_NL: block k's 32 signed levels (IQ4_NL: its nibbles through the table), elements in order */
INLINE __m256i g8_sload(const uint8_t *p, const int k, const int kind) {
    if (kind == K_Q8) return _mm256_loadu_si256((const __m256i *)(p + k * (int64_t)sizeof(block_q8_0) + 2));
    const __m128i q = _mm_loadu_si128((const __m128i *)(p + k * (int64_t)sizeof(block_iq4_nl) + 2));
    const __m256i z = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pi_iq4nl_values)), z);
}
/* one signed block against its 32 activations: maddubs(|z|, x * sign(z)) (pairs <= 2 * 128 * 127), madd: int32 x 8 */
INLINE __m256i g8_sblock(__m256i z, const int8_t *x) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(z, z), _mm256_sign_epi8(xv, z)), _mm256_set1_epi16(1));
}
/* 8 blocks' int32 x 8 -> lane k = block k's dot: 4 x 4 transpose-adds per 128-bit lane (lane 0 elements 0-15,
 * lane 1 16-31), then the two lanes added across */
INLINE __m256i g8_stree(const __m256i *E) {
    __m256i s[4], F[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(E[2 * i], E[2 * i + 1]), _mm256_unpackhi_epi32(E[2 * i], E[2 * i + 1]));
    F[0] = _mm256_add_epi32(_mm256_unpacklo_epi64(s[0], s[1]), _mm256_unpackhi_epi64(s[0], s[1]));
    F[1] = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2], s[3]), _mm256_unpackhi_epi64(s[2], s[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(F[0], F[1], 0x20), _mm256_permute2x128_si256(F[0], F[1], 0x31));
}
/* a signed group's dot straight from the row bytes (decode) */
INLINE __m256i g8_sdot(const uint8_t *p, const int8_t *x, const int kind) {
    __m256i E[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) E[k] = g8_sblock(g8_sload(p, k, kind), x + 32 * k);
    return g8_stree(E);
}
/* unpack the group of 8 blocks at p (signed kinds: block k's levels in lo[k], k < 4, and hi[k - 4]) */
INLINE void g8_load(wg8 *w, const uint8_t *p, const int kind) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        if (kind_signed(kind)) {
            w->lo[i] = g8_sload(p, i, kind);
            w->hi[i] = g8_sload(p, i + 4, kind);
        } else
            g8_pair(&w->lo[i], &w->hi[i], p, i, kind);
    }
    g8_scales(w, p, kind);
}
/* one pair's products with the activations x of the group (pair order): int16, 4 products per lane */
INLINE __m256i g8_pdot(__m256i lo, __m256i hi, const int8_t *x, const int i) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x + 64 * i))),
                            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64 * i + 32))));
}
/* the 4 pairs' int16 products -> int32 lane k = block k's dot, plus the correction (kinds with one).
 * Nibbles <= 15 (Q4_0, Q4_1): horizontal adds, exact in int16 up to 16 products (hadd(P0, P1): lane 0 [block 0
 * x 4, block 1 x 4], lane 1 [4 x 4, 5 x 4]; hadd(P2, P3) the same for 2, 3, 6, 7; one more hadd, then madd).
 * Nibbles <= 31 (Q5_0, Q5_1, MXFP4): one madd per pair to int32 first, then a 4 x 4 transpose-add (unpacks and
 * adds, measured a little faster here than the hadd tree with a madd in its middle). */
INLINE __m256i g8_tree(const __m256i *P, const mm_job *j, int64_t o, const int kind) {
    if (kind_g8_16(kind)) { /* Q4_0, Q4_1: int16 to 16 products (|sum| <= 16 * 15 * 127), then madd */
        const __m256i A = _mm256_hadd_epi16(P[0], P[1]), B = _mm256_hadd_epi16(P[2], P[3]);
        __m256i d = _mm256_madd_epi16(_mm256_hadd_epi16(A, B), _mm256_set1_epi16(1));
        if (kind_corr(kind)) d = _mm256_add_epi32(d, _mm256_loadu_si256((const __m256i *)(j->xc + o)));
        return d;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i M0 = _mm256_madd_epi16(P[0], ones), M1 = _mm256_madd_epi16(P[1], ones);
    const __m256i M2 = _mm256_madd_epi16(P[2], ones), M3 = _mm256_madd_epi16(P[3], ones);
    const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(M0, M1), _mm256_unpackhi_epi32(M0, M1));
    const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(M2, M3), _mm256_unpackhi_epi32(M2, M3));
    __m256i d = _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
    if (kind_corr(kind)) d = _mm256_add_epi32(d, _mm256_loadu_si256((const __m256i *)(j->xc + o)));
    return d;
}
/* acc + the group's block dots d (token offset o = t * nbp + b): the one float operation order */
INLINE __m256 g8_fin(const mm_job *j, const wg8 *w, __m256i d, int64_t o, __m256 acc, const int kind) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(w->d, _mm256_loadu_ps(j->xd + o)), acc);
    if (kind_min(kind)) acc = _mm256_fmadd_ps(w->m, _mm256_loadu_ps(j->xs + o), acc);
    return acc;
}

/* acc + the group (blocks b..b+7 of the token at offset o = t * nbp + b) */
INLINE __m256 g8_acc(const mm_job *j, const wg8 *w, int64_t o, __m256 acc, const int kind) {
    if (kind_signed(kind)) {
        __m256i E[8];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            E[i] = g8_sblock(w->lo[i], j->xq + o * QK + 32 * i);
            E[i + 4] = g8_sblock(w->hi[i], j->xq + o * QK + 32 * (i + 4));
        }
        return g8_fin(j, w, g8_stree(E), o, acc, kind);
    }
    __m256i P[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) P[i] = g8_pdot(w->lo[i], w->hi[i], j->xq + o * QK, i);
    return g8_fin(j, w, g8_tree(P, j, o, kind), o, acc, kind);
}

/* the last 1-7 blocks of a row as a zero-padded group in buf */
INLINE const uint8_t *g8_tail(uint8_t *buf, const uint8_t *row, int64_t ng, int64_t nb, const int kind) {
    const int64_t S = kind_size(kind);
    memset(buf, 0, (size_t)(GB * S));
    memcpy(buf, row + ng * S, (size_t)((nb - ng) * S));
    return buf;
}

/* decode: row r's last 1-7 blocks (from block ng of nb) as a group. Copying them into a zeroed buffer (g8_tail)
 * costs a dense 640-column row (Gemma 3 270M) more than its two whole groups do: the buffer's narrow stores stall
 * the wide loads that read it back (one thread, rows in L2: Q4_0 6.7 GB/s at 640 columns against 15.8 at 512).
 * So where 8 whole blocks from the group's start lie inside the weights (dense rows: all but the last rows), the
 * group is read in place, the lanes past the row's end given zero scales d (and m): their activations are the
 * zero padding (quantize_token), so those lanes add +0, as the buffer's zero blocks do, and the bits are the
 * same. Gathered rows (sel) are copied. */
INLINE void g8_load_tail(wg8 *w, uint8_t *buf, const mm_job *j, int64_t r, const uint8_t *row, int64_t ng,
                         int64_t nb, const int kind) {
    const int64_t S = kind_size(kind);
    if (j->sel || r * j->row_bytes + (ng + GB) * S > j->n_rows * j->row_bytes) {
        g8_load(w, g8_tail(buf, row, ng, nb, kind), kind);
        return;
    }
    g8_load(w, row + ng * S, kind);
    const __m256 keep = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nb - ng)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    w->d = _mm256_and_ps(w->d, keep);
    w->m = _mm256_and_ps(w->m, keep);
}

/* decode: rows r0..r1, one token, two rows at a time (they share the activation loads; each row's arithmetic is
 * g8_acc's). Prefetch: dense or neighbouring rows (j->stream) G8_PF_DIST / 2 bytes ahead in both rows, past the
 * rows' end into the next two; scattered gathers the rows G8_AHEAD places on, at the current offset. */
INLINE void g8_rows(const mm_job *j, int64_t r0, int64_t r1, const int kind) {
    const int64_t S = kind_size(kind), nb = j->n_cols / QK, ng = nb / GB * GB, rb = j->row_bytes;
    int64_t r = r0;
    const int pairs = !j->stream || !decode_one_row(DR_G8); /* one row or two: the note above decode_rows_init */
    for (; pairs && r + 2 <= r1; r += 2) {
        const uint8_t *row0 = mm_row(j, r), *row1 = mm_row(j, r + 1);
        const int gather = !j->stream && r + G8_AHEAD + 1 < r1;
        const uint8_t *ahead0 = gather ? mm_row(j, r + G8_AHEAD) : NULL, *ahead1 = gather ? mm_row(j, r + G8_AHEAD + 1) : NULL;
        int64_t pr = r + (G8_PF_DIST / 2) / rb * 2, po = (G8_PF_DIST / 2) % rb, issued = 0;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < ng; b += GB) {
            if (gather) {
                for (int64_t o = 0; o < GB * S; o += 64) {
                    _mm_prefetch((const char *)ahead0 + b * S + o, _MM_HINT_T0);
                    _mm_prefetch((const char *)ahead1 + b * S + o, _MM_HINT_T0);
                }
            } else if (j->stream) {
                for (; issued < (b + GB) * S; issued += 64) {
                    if (pr + 1 < r1) {
                        _mm_prefetch((const char *)mm_row(j, pr) + po, _MM_HINT_T0);
                        _mm_prefetch((const char *)mm_row(j, pr + 1) + po, _MM_HINT_T0);
                    }
                    po += 64;
                    if (po >= rb) {
                        po -= rb;
                        pr += 2;
                    }
                }
            }
            const int8_t *x = j->xq + b * QK;
            __m256i D0, D1;
            if (kind_signed(kind)) {
                D0 = g8_sdot(row0 + b * S, x, kind);
                D1 = g8_sdot(row1 + b * S, x, kind);
            } else {
                __m256i P0[4], P1[4];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    __m256i lo, hi;
                    g8_pair(&lo, &hi, row0 + b * S, i, kind);
                    P0[i] = g8_pdot(lo, hi, x, i);
                    g8_pair(&lo, &hi, row1 + b * S, i, kind);
                    P1[i] = g8_pdot(lo, hi, x, i);
                }
                D0 = g8_tree(P0, j, b, kind);
                D1 = g8_tree(P1, j, b, kind);
            }
            wg8 w0, w1;
            g8_scales(&w0, row0 + b * S, kind);
            g8_scales(&w1, row1 + b * S, kind);
            acc0 = g8_fin(j, &w0, D0, b, acc0, kind);
            acc1 = g8_fin(j, &w1, D1, b, acc1, kind);
        }
        if (ng < nb) {
            uint8_t buf[GB * 34];
            wg8 w;
            g8_load_tail(&w, buf, j, r, row0, ng, nb, kind);
            acc0 = g8_acc(j, &w, ng, acc0, kind);
            g8_load_tail(&w, buf, j, r + 1, row1, ng, nb, kind);
            acc1 = g8_acc(j, &w, ng, acc1, kind);
        }
        j->y[r] = hsum8(acc0);
        j->y[r + 1] = hsum8(acc1);
    }
    for (; r < r1; r++) { /* a last odd row */
        const uint8_t *row = mm_row(j, r);
        __m256 acc = _mm256_setzero_ps();
        int64_t pr = r + G8_PF_DIST / rb, po = G8_PF_DIST % rb, issued = 0;
        for (int64_t b = 0; b < ng; b += GB) {
            if (j->stream)
                for (; issued < (b + GB) * S; issued += 64) {
                    if (pr < r1) _mm_prefetch((const char *)mm_row(j, pr) + po, _MM_HINT_T0);
                    po += 64;
                    if (po >= rb) po -= rb, pr++;
                }
            wg8 w;
            g8_load(&w, row + b * S, kind);
            acc = g8_acc(j, &w, b, acc, kind);
        }
        if (ng < nb) {
            uint8_t buf[GB * 34];
            wg8 w;
            g8_load_tail(&w, buf, j, r, row, ng, nb, kind);
            acc = g8_acc(j, &w, ng, acc, kind);
        }
        j->y[r] = hsum8(acc);
    }
}

/* prefill: row r against tokens t0..t0+T-1 */
INLINE void g8_tile(const mm_job *j, int64_t r, int64_t t0, const int T, const int kind) {
    const int64_t S = kind_size(kind), nb = j->n_cols / QK, ng = nb / GB * GB;
    const uint8_t *row = mm_row(j, r);
    __m256 acc[G8_TP];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < ng; b += GB) {
        wg8 w;
        g8_load(&w, row + b * S, kind);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = g8_acc(j, &w, (t0 + t) * j->nbp + b, acc[t], kind);
    }
    if (ng < nb) {
        uint8_t buf[GB * 34];
        wg8 w;
        g8_load(&w, g8_tail(buf, row, ng, nb, kind), kind);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = g8_acc(j, &w, (t0 + t) * j->nbp + ng, acc[t], kind);
    }
    for (int t = 0; t < T; t++) j->y[(t0 + t) * j->n_rows + r] = hsum8(acc[t]);
}

INLINE void g8_chunk_kind(const mm_job *j, int64_t r_beg, int64_t r_end, const int kind) {
    if (j->n_tok == 1) {
        g8_rows(j, r_beg, r_end, kind);
        return;
    }
    for (int64_t tb = 0; tb < j->n_tok; tb += TOK_BLOCK) {
        const int64_t te = tb + TOK_BLOCK < j->n_tok ? tb + TOK_BLOCK : j->n_tok;
        for (int64_t rb = r_beg; rb < r_end; rb += ROW_BLOCK) {
            const int64_t re = rb + ROW_BLOCK < r_end ? rb + ROW_BLOCK : r_end;
            int64_t t = tb;
            if (g8_tp(kind) == 8)
                for (; t + 8 <= te; t += 8)
                    for (int64_t r = rb; r < re; r++) g8_tile(j, r, t, 8, kind);
            for (; t + 4 <= te; t += 4)
                for (int64_t r = rb; r < re; r++) g8_tile(j, r, t, 4, kind);
            switch (te - t) {
            case 3: for (int64_t r = rb; r < re; r++) g8_tile(j, r, t, 3, kind); break;
            case 2: for (int64_t r = rb; r < re; r++) g8_tile(j, r, t, 2, kind); break;
            case 1: for (int64_t r = rb; r < re; r++) g8_tile(j, r, t, 1, kind); break;
            default: break;
            }
        }
    }
}
/* the rows r_beg..r_end of a chunk for the group kinds; 0 if j's type is not one */
static int g8_chunk(const mm_job *j, int64_t r_beg, int64_t r_end) {
    switch (j->type) {
    case PI_Q4_0: g8_chunk_kind(j, r_beg, r_end, K_Q4); return 1;
    case PI_Q5_0: g8_chunk_kind(j, r_beg, r_end, K_Q5); return 1;
    case PI_Q4_1: g8_chunk_kind(j, r_beg, r_end, K_Q41); return 1;
    case PI_Q5_1: g8_chunk_kind(j, r_beg, r_end, K_Q51); return 1;
    case PI_MXFP4: g8_chunk_kind(j, r_beg, r_end, K_MXFP4); return 1;
    case PI_IQ4_NL: g8_chunk_kind(j, r_beg, r_end, K_IQ4NL); return 1;
    default: return 0;
    }
}
#endif

/* ==== Q8_0 decode on AVX-512: one row at a time ================================================================
 * Each thread walks its rows in order, so its weights are one sequential stream that the hardware prefetcher
 * follows (the R-row tiles above interleave R streams; for Q8_0's 34-byte blocks that measured ~31 GB/s against
 * ~37 here). The arithmetic is tile_q_step's for R = T = 1, operation for operation, so decode still gives the
 * bits of the batched (prefill) path: per block pair one dpbusd with the correction lanes, one convert, one FMA
 * by [d_w0 * d_x0 (8 lanes) | d_w1 * d_x1 (8 lanes)], one reduction at the end. Only the scales are formed
 * differently (two scalar products, the same f32 roundings), which avoids the store-to-load stall of gathering
 * them through memory. Rows picked by `sel` are not a stream: each row prefetches the one GATHER_AHEAD rows
 * later (measured against prefetching the next row as this one ends: ~1.5x at 50-95% sparsity). */
#if defined(MM_AVX512)
#define Q8_ROW_DECODE 1
INLINE int q8_row_path(const mm_job *j) { (void)j; return 1; } /* gathers too */
#define GATHER_AHEAD 4
#define Q8_ROW_PF_DIST 4096
INLINE __m512 pair_scale(const block_q8_0 *w, int64_t b, const float *xd, const int two) {
    const float s0 = pi_h2f(w[b].d) * xd[b], s1 = (two ? pi_h2f(w[b + 1].d) : 0.0f) * xd[b + 1];
    return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
}

static void q8_decode_rows(const mm_job *j, int64_t r0, int64_t r1) {
    const int64_t nb = j->n_cols / QK, nfull = nb / 2 * 2;
    for (int64_t r = r0; r < r1; r++) {
        const block_q8_0 *w = (const block_q8_0 *)mm_row(j, r);
        /* gathered rows: row r + GATHER_AHEAD at this row's offset, so several scattered rows are in flight */
        const uint8_t *ahead = j->sel && r + GATHER_AHEAD < r1 ? mm_row(j, r + GATHER_AHEAD) : NULL;
        fv acc = fv_zero();
        for (int64_t b = 0; b < nfull; b += 2) {
            if (!j->sel) /* dense: the stream itself, Q8_ROW_PF_DIST ahead (+4-7% over the hardware prefetcher alone) */
                _mm_prefetch((const char *)w + b * (int64_t)sizeof(block_q8_0) + Q8_ROW_PF_DIST, _MM_HINT_T0);
            if (ahead) {
                _mm_prefetch((const char *)ahead + b * (int64_t)sizeof(block_q8_0), _MM_HINT_T0);
                _mm_prefetch((const char *)ahead + b * (int64_t)sizeof(block_q8_0) + 64, _MM_HINT_T0);
            }
            acc = fv_acc(acc, dot_q(w_load_q8(w + b, 1), x_load(j->xq + b * QK), x_corr(j->xc + b, 0), 0),
                         pair_scale(w, b, j->xd, 1));
        }
        if (nfull < nb)
            acc = fv_acc(acc, dot_q(w_load_q8(w + nfull, 0), x_load(j->xq + nfull * QK), x_corr(j->xc + nfull, 0), 0),
                         pair_scale(w, nfull, j->xd, 0));
        j->y[r] = fv_sum(acc);
    }
}
#endif

/* ==== Q8_0 decode on AVX2, short rows: four rows at a time, prefetched as one stream ===========================
 * The decode tile (RD = 4 rows side by side) prefetches PF_DIST bytes along each of its rows, past a row's end
 * into the next tile's. On short rows that is barely one tile ahead, and four rows interleaved within a page give
 * the hardware prefetcher no stream to follow: one thread streamed Gemma 3's 262144 x 640 output head (680-byte
 * rows) from memory at 10-12 GB/s against 14-19 for 4096-column rows, while in L2 it digests either at 24-25
 * (2-core AMD EPYC, AVX2). Here a thread still works on four rows at once (four FMA chains; one row alone is
 * latency-bound at half the speed) but prefetches Q8_ROW_PF_DIST bytes ahead in its rows laid end to end, which
 * for rows this short is the order it reads them in. Measured, 178 MB of Q8_0, median of 15 calls, old / new:
 * one thread 640 columns 11.5-11.9 / 17.9-18.1 GB/s, 1152 columns 10.2-12.7 / 17.9; two threads 640 columns
 * 18.0-21.0 / 23.6-28.0, 1152 columns 19.9-24.1 / 24.7-27.4. Longer rows keep the tiles (2048 columns: the same
 * either way; 4096: the tiles ahead), as do scattered gathers (!j->stream). Every row's arithmetic is
 * tile_q_step's for one row and one token, operation for operation (the scale d_w * d_x formed by one f32
 * product, one convert and one FMA per block into the row's accumulator, one hsum8), so decode keeps the bits of
 * the tiles and of the batched path. */
#if defined(MM_AVX2)
#define Q8_ROW_DECODE 1
#define Q8_ROWS 4
#ifndef Q8_ROW_PF_DIST
#define Q8_ROW_PF_DIST 8192
#endif
INLINE int q8_row_path(const mm_job *j) { return j->stream && Q8_ROWS * j->row_bytes <= Q8_ROW_PF_DIST; }
INLINE __m256 q8_row_block(const mm_job *j, const block_q8_0 *w, int64_t b, __m256i x, __m256 sx, __m256 acc) {
    return fv_acc(acc, dot_q(w_load_q8(w + b, 0), x, x_corr(j->xc + b, 0), 0),
                  _mm256_mul_ps(_mm256_set1_ps(pi_h2f(w[b].d)), sx));
}

static void q8_decode_rows(const mm_job *j, int64_t r0, int64_t r1) {
    const int64_t nb = j->n_cols / QK, S = (int64_t)sizeof(block_q8_0);
    pf_stream pf = pf_start(j, r0, Q8_ROW_PF_DIST);
    int64_t issued = 0, used = 0; /* bytes prefetched and bytes read since row r0, less the distance */
    int64_t r = r0;
    for (; r + Q8_ROWS <= r1; r += Q8_ROWS) {
        const block_q8_0 *w[Q8_ROWS];
        __m256 a[Q8_ROWS];
#pragma GCC unroll 4
        for (int i = 0; i < Q8_ROWS; i++) {
            w[i] = (const block_q8_0 *)mm_row(j, r + i);
            a[i] = fv_zero();
        }
        for (int64_t b = 0; b < nb; b++) {
            for (used += Q8_ROWS * S; issued < used; issued += 64) pf_step(j, &pf, r1, 64);
            const __m256i x = x_load(j->xq + b * QK);
            const __m256 sx = _mm256_broadcast_ss(j->xd + b);
#pragma GCC unroll 4
            for (int i = 0; i < Q8_ROWS; i++) a[i] = q8_row_block(j, w[i], b, x, sx, a[i]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < Q8_ROWS; i++) j->y[r + i] = fv_sum(a[i]);
    }
    for (; r < r1; r++) { /* the chunk's last rows */
        const block_q8_0 *w0 = (const block_q8_0 *)mm_row(j, r);
        __m256 a0 = fv_zero();
        for (int64_t b = 0; b < nb; b++)
            a0 = q8_row_block(j, w0, b, x_load(j->xq + b * QK), _mm256_broadcast_ss(j->xd + b), a0);
        j->y[r] = fv_sum(a0);
    }
}
#endif

/* ==== Q4_0 decode on AVX-512: one row at a time ================================================================
 * The same reason as Q8_0's above: DQ-row quad tiles read DQ interleaved streams per thread, while one row after
 * another is one sequential stream (a pure read of a 7B-shape matrix measured ~33 GB/s that way against ~26 with
 * 4-8 rows interleaved). One row alone cannot share the activation side of a quad across rows, so that side
 * (the correction and scale vectors in quad-lane order, two permutes per quad) is laid out once per chunk on
 * the stack and each quad of each row then needs loads only for it. The arithmetic is tile_quad_step's for
 * R = T = 1, operation for operation: the same bits as the quad tiles and the batched path. Measured cold, two
 * threads, against the 8-row quads: 4096 x 4096 +22-24%, 11008 x 4096 +16-19%, 4096 x 11008 +19%. Dense decode
 * and gathers of mostly neighbouring rows (mm_job.stream) only: scattered rows keep the quad tiles, whose 8 rows
 * in flight serve them better (measured 26 against 34 GB/s at 50% of the rows), up to Q4_ROW_MAX_QUADS quads. */
#if defined(MM_AVX512)
#define Q4_ROW_DECODE 1
#define Q4_ROW_MAX_QUADS 256 /* 32768 columns: 2 x 16 KB of activation-side vectors on the stack */
#ifndef Q4_ROW_PF_DIST
#define Q4_ROW_PF_DIST 4096 /* one stream per thread: further ahead than the tiles (2048: -4%, 8192: -1..3%) */
#endif
/* acc + one quad (blocks b..b+3, its bytes at p) of one row, as tile_quad_step computes it for R = T = 1 */
INLINE __m512 q4_row_quad(const mm_job *j, const uint8_t *p, int64_t b, const __m512i *xcv, const __m512 *xdv,
                          const __m512 *xsv, __m512 acc, const int kind) {
    const wquad w = quad_load(p, kind);
    const __m512i xlo = _mm512_loadu_si512(j->xq + b * QK), xhi = _mm512_loadu_si512(j->xq + b * QK + 64);
    return quad_acc(&w, quad_dot(&w, xlo, xhi, xcv[b / QB]), xdv[b / QB], kind_min(kind) ? xsv[b / QB] : xdv[0], acc,
                    kind);
}

INLINE void quad_decode_rows(const mm_job *j, int64_t r0, int64_t r1, const int kind) {
    const int64_t size = kind_size(kind), nb = j->n_cols / QK, nq = nb / QB * QB;
    const int64_t n_quads = (nb + QB - 1) / QB;
    _Alignas(64) __m512i xcv[Q4_ROW_MAX_QUADS];
    _Alignas(64) __m512 xdv[Q4_ROW_MAX_QUADS], xsv[kind_min(kind) ? Q4_ROW_MAX_QUADS : 1];
    for (int64_t q = 0; q < n_quads; q++) {
        const __m128i c4 = _mm_loadu_si128((const __m128i *)(j->xc + q * QB));
        xcv[q] = _mm512_maskz_permutexvar_epi32(0x1111, quad_lanes(), _mm512_castsi128_si512(c4));
        xdv[q] = _mm512_permutexvar_ps(quad_lanes(), _mm512_castps128_ps512(_mm_loadu_ps(j->xd + q * QB)));
        if (kind_min(kind)) xsv[q] = quad_xs(j->xs + q * QB);
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = mm_row(j, r);
        __m512 acc = _mm512_setzero_ps();
        pf_stream ahead = pf_start(j, r, Q4_ROW_PF_DIST);
        for (int64_t b = 0; b < nq; b += QB) {
            pf_step(j, &ahead, r1, QB * size / 2); /* two per quad: Q8_0's 136 bytes span 3 lines */
            pf_step(j, &ahead, r1, QB * size - QB * size / 2);
            acc = q4_row_quad(j, row + b * size, b, xcv, xdv, xsv, acc, kind);
        }
        if (nq < nb) { /* the last 1-3 blocks in a zeroed quad, as tile_quad does */
            _Alignas(64) uint8_t buf[144];
            memset(buf, 0, sizeof(buf));
            memcpy(buf, row + nq * size, (size_t)((nb - nq) * size));
            acc = q4_row_quad(j, buf, nq, xcv, xdv, xsv, acc, kind);
        }
        j->y[r] = fv_sum(acc);
    }
}
static void q4_decode_rows(const mm_job *j, int64_t r0, int64_t r1) {
    switch (j->type) {
    case PI_Q4_0: quad_decode_rows(j, r0, r1, K_Q4); break;
    case PI_Q4_1: quad_decode_rows(j, r0, r1, K_Q41); break;
    case PI_Q5_1: quad_decode_rows(j, r0, r1, K_Q51); break;
    case PI_MXFP4: quad_decode_rows(j, r0, r1, K_MXFP4); break;
#if defined(__AVX512VNNI__) && Q8_QUADS
    case PI_Q8_0: quad_decode_rows(j, r0, r1, K_Q8); break;
#endif
    default: quad_decode_rows(j, r0, r1, K_IQ4NL); break;
    }
}
#endif

/* ==== Q5_0 / IQ4_NL (without VNNI) decode on AVX-512: one row at a time ================================
 * tile_q for R = T = 1 (the same arithmetic, so the same bits as the 4-row tiles and the batched path), with
 * the row stream prefetched Q5_ROW_PF_DIST ahead: one sequential stream per thread instead of four. Measured
 * (Q5_0) cold, two threads, against the 4-row tiles: 4096 x 4096 +20%, 11008 x 4096 +26%, 4096 x 11008 +18%. */
#if defined(MM_AVX512)
#define Q5_ROW_DECODE 1
#define Q5_ROW_PF_DIST 4096
INLINE void pair_decode_rows(const mm_job *j, int64_t r0, int64_t r1, const int kind) {
    const int64_t size = kind_size(kind), nb = j->n_cols / QK, nfull = nb / BPV * BPV;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *rows[1] = {mm_row(j, r)};
        fv acc[1][4] = {{fv_zero()}};
        mvec accm[1] = {m_zero()};
        pf_stream ahead = pf_start(j, r, Q5_ROW_PF_DIST);
        for (int64_t b = 0; b < nfull; b += BPV) {
            pf_step(j, &ahead, r1, BPV * size);
            tile_q_step(j, rows, 0, b, acc, accm, 1, 1, kind, 1);
        }
        if (nfull < nb) tile_q_step(j, rows, 0, nfull, acc, accm, 1, 1, kind, 0);
        j->y[r] = kind_min(kind) ? fv_sum(acc[0][0]) + m_get(accm[0], 0) : fv_sum(acc[0][0]);
    }
}
/* the pair-tile kinds on AVX-512: Q5_0, and IQ4_NL without VNNI (Q4_1 and Q5_1 always take the quads) */
static void q5_decode_rows(const mm_job *j, int64_t r0, int64_t r1) {
    if (j->type == PI_Q5_0) pair_decode_rows(j, r0, r1, K_Q5);
    else pair_decode_rows(j, r0, r1, K_IQ4NL);
}
#endif

/* ==== F16 / BF16 decode on AVX-512: the one-token 4-row tiles (tile_dec), and what was tried instead ===========
 * A float decode takes tile_f with R = RD = 4 rows, T = 1: each x vector is loaded once for the four rows, each
 * row is one FMA chain in column order (so a decode gives the prefill tiles' bits, tests/test_kernels_matmul.py),
 * and the next four rows are prefetched at the offset reached (tile_f's T == 1 branch).
 * Until 2026-12-02 rows of at most 8192 columns took a path of their own instead, one row at a time as one
 * software-prefetched stream per thread (measured then, before the tiles prefetched: 4096 x 4096 +19%,
 * 11008 x 4096 +13-17% over the 4-row tiles). One row's chain is one FMA per 4-cycle latency, 8 bytes of F16 per
 * cycle, less than a ~2 GHz core's share of DRAM bandwidth: on a 2-core Intel host with AMX and AVX512-FP16
 * (2.0 GHz TSC, 48 KB L1d, 2 MB L2), `bench_prefill_ab.py OLD NEW --types F16,BF16 --shapes 4096x4096,11008x4096
 * --threads 2 --n-tok 1 --rounds 7 --reps 5`, wall GMAC/s, the 4-row tiles against it: F16 1.38x / 1.31x, BF16
 * 1.23x / 1.33x (two rows at a time: F16 1.06x / 1.25x, BF16 1.51x / 1.18x); end to end (`powerinfer bench -m
 * FILE -t 2 -p 16 -n 32 -r 3`, 8-layer 7B-shape files, two alternating rounds) F16 decode 0.84x / 0.95x
 * llama.cpp before, 1.10x / 1.05x after, BF16 1.18x / 1.02x before, 1.32x / 1.52x after. On the 2-core Zen 5 host
 * (~3.3 GHz+) the same grouping had measured 0.94-1.09x on 11008 x 4096 (DRAM, noise) and 1.17-1.75x on
 * 4096 x 4096 (in L3). So the path was removed.
 * Four FMA chains per row (vectors k, k+1, k+2, k+3 of each step, summed at the end) decoded faster on the
 * Zen 5 host (`bench_prefill_ab.py --types F16 --n-tok 1 --threads 2 --rounds 15`, wall GMAC/s: 4096 x 4096
 * 17.4 -> 21.5, 11008 x 4096 17.6 -> 19.9) but are not taken: the prefill tiles would need the same four strided
 * chains. Two ways of giving the tiles those chains were built and measured (same host, `bench_prefill_ab.py OLD
 * NEW --types F16,BF16,F32 --threads 2`, --n-tok 1 --rounds 7 and --n-tok 128 --rounds 3 --reps 3), both dropped:
 *   - all four chains in the prefill tile's registers (2 rows x 3 tokens x 4 chains = 24 zmm): decode 4096 x 4096
 *     1.21-1.23x, 11008 x 4096 1.02-1.07x, but prefill 0.49-0.78x (five loads per six fmas where 4 x 6 has ten
 *     per 24);
 *   - chains over segments of FSEG columns (segment i to chain i % 4), the 4 x 6 tile keeping one chain in
 *     registers and the others in the block buffer: FSEG 128 decode 1.40x / 1.20x (4096 x 11008: 0.76x) but
 *     prefill 0.60-0.77x (the buffer round trip per segment); FSEG 512 prefill 0.89-0.93x and the decode gain
 *     gone (1.00x / 0.93x: four streams 1 KB apart); one chain per quarter row (streams 2 KB apart) decoded
 *     at 0.72-0.82x.
 * One row per tile for F16 too (tile_f with R = 1 over a whole decode, the next row prefetched) was measured on the
 * Zen 5 host on 2026-12-04 (`bench_prefill_ab.py OLD NEW --types F16 --shapes 4096x4096,11008x4096,4096x11008
 * --threads 2 --n-tok 1 --rounds 15 --reps 5`, against the 4-row tiles): 0.81x / 1.12x / 1.07x (the first stays in
 * that host's 32 MB L3 between calls); end to end (`powerinfer bench -m f16.gguf -t 2 -p 16 -n 64 -r 3`, two
 * alternating rounds, three pairs) 0.97x / 0.92x -> 1.13x / 1.10x, 1.09x / 0.95x -> 1.11x / 1.06x, 1.04x / 1.03x
 * -> 0.98x / 0.71x. Not taken then: one f32 FMA chain carries 32 bytes of F16 per FMA latency (4 cycles), about 30
 * GB/s per thread at Zen 5's ~3.7 GHz but 16 on the 2.0 GHz Intel host, where the one-row stream lost to these tiles
 * by 1.3x (above). Since 2026-12-04 the F16 decode takes one row where a timed FMA chain says one row's stream
 * is fast enough (decode_rows_init, before the AVX2 groups), and these tiles elsewhere. BF16's vdpbf16ps chain
 * carries 64 bytes per latency, and BF16 takes one row (see the BF16 note).
 * AVX2, F16: one row's chain carries only 16 bytes per FMA latency there (8 lanes), so the one-row stream is never
 * chosen; dense rows go two per tile where two chains carry ONE_ROW_GBS (the same timed chain: ~15 GB/s each on
 * the Zen 5 host, 8 on a 2 GHz core, which keeps RD = 4 rows), gathers always RD (their next tile is fetched
 * whole). POWERINFER_DECODE_ROWS=2 fixes two rows, 4 four. Two rows are two streams per thread (and two
 * prefetched), four are four (and four). The 2-core Zen 5 host's bandwidth swings between two states, a read
 * probe of ~45-50 GB/s and one of ~65-75, and the two counts trade places between them. In one process, taking
 * turns of 16 greedy decode tokens with the AVX2 llama.cpp on the 8-layer 7B-shape F16 file after a 6-token
 * prompt (7 rounds, medians of the paired ratios, 2026-12-08): in the slower state 2 rows 1.08x / 1.05x / 1.01x
 * llama.cpp where 4 gave 0.96x / 0.97x / 0.96x; in the faster one 2 rows 1.08x / 1.06x / 1.12x / 1.09x against
 * 4 rows' 1.17x / 1.19x / 1.28x / 1.18x. After 128-token prompts (`bench_dense_interleaved.py -p 128 -n 16`):
 * 2 rows 0.98x / 0.97x / 1.00x / 1.06x, 4 rows 0.91x / 0.93x / 0.98x and (faster state) 1.18x / 1.16x. So on
 * this host the two are even on average; two rows keep near or above llama.cpp in the slower state, and halve the
 * streams per thread, which should count for more where more threads read at once (not measured: no larger
 * AVX2 host was at hand). Also measured, none better in both states: 3 rows (0.96x-1.19x), 4 rows prefetching
 * 1-2 KB ahead along their own rows instead of the next tile's rows (1.01x-1.16x), 2 rows prefetching the tile
 * after next (1.01x in the slower state), and no software prefetch at all (a cold mat-vec then read 62-79% of
 * the probe against 80-91% with it). Same bits either way.
 * AVX2, BF16: the same 16 bytes per FMA (8 bf16 widened by a zero-extend and a shift), so dense BF16 rows take
 * F16's count. The same host in the slower state, the two counts taking turns of 16 tokens with the AVX2
 * llama.cpp on the 8-layer BF16 file (7 and 9 rounds, 2026-12-08): 2 rows 1.10x / 1.16x llama.cpp, 4 rows 0.93x
 * / 1.03x; kernel (`bench_prefill_ab.py --types BF16 --n-tok 1 --threads 2 --rounds 11 --reps 5`) 11008 x 4096
 * 1.07x, 4096 x 11008 1.12x, 4096 x 4096 0.87x (32 MB: partly in L3 between calls, which a model's layers are
 * not). */

/* ==== tile instances and the row-chunk driver ========================================================= */
#define TILE_FN(name, R, T)                                                                                  \
    static void name(const mm_job *j, int64_t r0, int64_t t0) {                                             \
        switch (j->type) {                                                                                   \
        case PI_Q8_0: tile_q(j, r0, t0, R, T, 0); break;                                                     \
        case PI_Q4_0: tile_q(j, r0, t0, R, T, 1); break;                                                     \
        case PI_Q5_0: tile_q(j, r0, t0, R, T, 2); break;                                                     \
        case PI_Q4_1: tile_q(j, r0, t0, R, T, K_Q41); break;                                                 \
        case PI_Q5_1: tile_q(j, r0, t0, R, T, K_Q51); break;                                                 \
        case PI_IQ4_NL: tile_q(j, r0, t0, R, T, K_IQ4NL); break;                                             \
        case PI_MXFP4: tile_q(j, r0, t0, R, T, K_MXFP4); break;                                              \
        case PI_F32: tile_f(j, r0, t0, R, T, PI_F32); break;                                                 \
        case PI_F16: tile_f(j, r0, t0, R, T, PI_F16); break;                                                 \
        default: tile_f(j, r0, t0, R, T, PI_BF16); break;                                                    \
        }                                                                                                    \
    }
TILE_FN(tile_dec, RD, 1)  /* decode: RD rows, one token */
TILE_FN(tile_rt, RP, TP)  /* prefill tile */
TILE_FN(tile_r1, RP, 1)   /* prefill, leftover tokens */
TILE_FN(tile_1t, 1, TP)   /* prefill, leftover rows */
TILE_FN(tile_11, 1, 1)
#if defined(MM_AVX2)
/* functions of their own, never inlined: instantiated inside mm_chunk, either made gcc spill the prefill tiles'
 * sums there (the 128-token F16 prompt ran at half speed; with two of them gcc inlined both unless told not to) */
static __attribute__((noinline)) void tile_dec_f16(const mm_job *j, int64_t r0) { tile_f(j, r0, 0, 2, 1, PI_F16); }
static __attribute__((noinline)) void tile_dec_bf16(const mm_job *j, int64_t r0) { tile_f(j, r0, 0, 2, 1, PI_BF16); }
#endif
#if TP == 4 /* the 2 or 3 tokens left after the TP-token tiles, in one pass over the rows (see mm_chunk) */
TILE_FN(tile_r2, RP, 2)
TILE_FN(tile_r3, RP, 3)
TILE_FN(tile_12, 1, 2)
TILE_FN(tile_13, 1, 3)
#endif
#if defined(MM_AVX512) || defined(MM_AVX2)
/* Float-type prefill: tiles of RPF rows x TPF tokens, in column blocks (rows_f_kblocked below).
 * AVX2: RPF = RP = 2 rows x 6 tokens = 12 accumulators (of 16 ymm), where the RP x TP tiles hold 8: more fmas
 * per converted weight vector. With the padded x copy in mm_run, 128 tokens, 2 threads on the AVX2 EPYC, three
 * alternating runs: F16 11008 x 4096 60-82 -> 112-127 GFLOP/s, 4096 x 11008 104-122 -> 114-130; F32 11008 x 4096
 * 73-78 -> 83-121.
 * AVX-512: 4 rows x 6 tokens = 24 accumulators + 4 converted weight vectors + 1 x vector = 29 of the 32 zmm:
 * one weight conversion per 6 fmas (the 4 x 4 tiles: per 4) and one x load per 4 (the loads folded into the
 * fmas as memory operands made it 24 x loads per step, more than the load ports serve beside the fmas; see
 * xf_shared). On the 2-core Zen 4 host (AVX-512 + VNNI + BF16), `bench_prefill_ab.py OLD NEW --types
 * F16,BF16,F32 --shapes 11008x4096,4096x11008 --threads 2 --n-tok 128`, CPU-time GMAC/s against the 4 x 4 tiles
 * over whole rows: F16 57.5 -> 81.8 and 52.3 -> 86.8, BF16 49.6 -> 73.2 and 49.8 -> 79.6, F32 32.9 -> 71.7 and
 * 33.6 -> 72.8 (same bits).
 * How the sizes follow from the machine (vector width and register count from the ISA the build targets, the
 * L1d size read at run time, fkb_for below):
 *   - registers: RPF x TPF accumulators + RPF weight vectors + 1 x vector <= the register file, with TPF >= RPF
 *     so that a weight conversion (the costlier operand) is shared by the most fmas: 32 zmm -> 4 x 6 (29),
 *     16 ymm -> 2 x 6 (15). Fewer conversions per fma lost on the 2-core Zen 5 host (same command, F16,
 *     --rounds 5 --reps 3, wall GMAC/s against 4 x 6): 2 x 8 0.76x / 0.87x, 3 x 8 0.90x / 0.83x;
 *   - L1d: a column block holds TPF tokens' x (TPF x FKB x 4 bytes) and the RPF weight rows' block (RPF x FKB x
 *     element size); both must stay in L1 for the tile's whole pass, so they get half of L1d (the rest: the
 *     next rows streaming in, the accumulator buffer). FKB = the largest power of two (in 128..2048) that fits:
 *     32 KB L1d gives 512 for F16/BF16 and 256 for F32; 48 KB gives 512 and 512 (three quarters of L1d, 1024 for
 *     F16/BF16 at 48 KB, measured 0.99-1.03x on the Zen 5 host, 128 tokens, --rounds 6: no gain);
 *   - L2: the ROW_BLOCK rows' blocks (16 x FKB x element size <= 32 KB) and the token block's x slice (132 x FKB
 *     x 4: 264 KB at FKB 512) stay in L2 while the tiles pass them; the whole token block's x only in L3 (see
 *     mm_chunk);
 *   - F16 takes whole rows instead where a tile's TPF tokens' x and RPF rows, whole, fit in half of L2 (TPF x K x 4
 *     + RPF x K x 2: 128 KB at K = 4096 and 352 KB at 11008 on AVX-512, so with 1 MB of L2 up to K = 16384; with
 *     512 KB only K = 4096 on AVX2): the tile then streams its rows and x from L2 once, with no accumulator
 *     buffer between blocks (and the row blocks grow where L2 holds more rows beside a tile's x: frb_for).
 *     On the 2-core Zen 5 host (48 KB L1d, 1 MB L2), pi_matmul F16, 2 threads, the two
 *     rules taking turns call by call in one process (medians of 5-16 rounds): 4096 x 4096 1.09x at 64 tokens,
 *     1.09x at 200, 1.10x at 512; 11008 x 4096 1.08x at 128, 1.11x at 200; 4096 x 11008 1.08x at 128, 1.10-1.15x
 *     at 512; 4096 x 14336 1.09x at 256; 1000 x 4000 1.00x; the 8-layer F16 file's prompt 1.04x at 128 tokens and
 *     1.09x at 512 (same bits). The haswell build there: 1.03x / 1.00x (4096 x 4096 / 4096 x 11008, 512 tokens),
 *     the file's prompt 1.03x at 128 tokens and 1.05x at 512.
 *     Not for the others: BF16 (vdpbf16ps moves twice the bytes per instruction) lost at K = 4096 (0.90-0.95x)
 *     while it gained at 11008, and F32 lost on 1000 x 4000 (0.88x); they keep the L1 rule.
 * BF16 on AVX512-BF16 (BF16_DP): the same 4 x 6 tiles and column blocks, each step 32 columns: vdpbf16ps takes a
 * row's 32 weights as they lie and a token's 32 activations from their bf16 copy (mm_round_bf16), two products
 * per f32 lane, so a step does twice the multiply-adds of an f32 one for the same loads and no conversion. x is
 * 2 bytes a column there, so the L1 rule above gives FKB 1024 at 48 KB L1d (512 measured 0.94-0.97x). On the 2-core
 * Zen 5 host (AVX-512 with VNNI and BF16, 48 KB L1d, 1 MB L2), `bench_prefill_ab.py OLD NEW --types BF16 --shapes
 * 11008x4096,4096x11008 --threads 2 --n-tok 128 --rounds 5`, wall GMAC/s against the tiles that convert BF16 to
 * f32: 153.7 -> 249.9 and 144.6 -> 260.8 (new bits: the activations are rounded now). Its decode takes BF_RD = 1
 * row per tile (tile_f's one-token branch prefetches the next row at the offset reached): against the 4-row tiles
 * converting to f32, `--n-tok 1 --rounds 9 --reps 5`, 11008 x 4096 1.24x, 4096 x 11008 1.04x (two rows: 1.22x /
 * 1.06x; the dp tiles kept at 4 rows: 0.95-1.05x). One row against two: 1.20x at 4096 x 4096 (in the host's L3
 * between calls), 0.97x / 1.05x on the others; `bench_kernels.py --types BF16 --repeat 9` read 95% / 93% of the
 * probe with one row, 75% / 94% with two. One chain carries 64 bytes per dp latency: ~20 GB/s per thread even
 * at 2 GHz (the F16 / BF16 decode note). */
#if defined(MM_AVX512)
#define RPF 4
#else
#define RPF RP
#endif
#define TPF 6
_Static_assert(FTOK_BLOCK % TPF == 0 && FTOK_BLOCK % 4 == 0, "whole TPF and 3 x 4 token groups per block");
INLINE void tile_f_any(const mm_job *j, int64_t r0, int64_t t0, const int R, const int T) {
    if (j->type == PI_F16) tile_f(j, r0, t0, R, T, PI_F16);
    else if (j->type == PI_BF16) tile_f(j, r0, t0, R, T, PI_BF16);
    else tile_f(j, r0, t0, R, T, PI_F32);
}
/* The RPF x TPF tiles of rows [rb, re) (at most ROW_BLOCK) against tokens t0.., in column blocks of j->fkb: one
 * block of the TPF tokens' x stays in L1 while every row group of the block passes it, and the groups'
 * accumulators wait in a buffer (4 KB AVX2, 8 KB AVX-512) between blocks. Over whole rows the 6 tokens' x is
 * 96 KB at K = 4096 (from L2) and 264 KB at K = 11008, more than an L2 of 512 KB holds beside the rows: that
 * is where the blocks pay (F16 with 1 MB of L2 does better over whole rows: the L2 bullet above). Every lane
 * sees the same fmas in the same order (AVX-512: the masked column tail last, as in tile_f): the same bits,
 * whatever the block size.
 * `bench_prefill_ab.py OLD NEW --types F16 --n-tok 128 --threads 2` on the AVX2 EPYC (32 KB L1d), three runs:
 * 4096 x 11008 1.08-1.25x, 11008 x 4096 0.98-1.06x (FKB 256 and 1024 no better than 512). Returns the rows done
 * (whole groups). */
INLINE int64_t rows_f_kblocked(const mm_job *j, int64_t rb, int64_t re, int64_t t0, const int type) {
    fv buf[ROW_BLOCK / RPF][RPF][8]; /* [8]: tile_f_store takes acc[][8] */
    const int64_t ngrp = (re - rb) / RPF, K = j->n_cols, step = fstep(type), kfull = K / step * step;
    const int64_t esz = type == PI_F32 ? 4 : 2;
    const int first = t0 % FTOK_BLOCK == 0; /* the token block's first group: the rows come from memory */
    for (int64_t p = 0; p < ngrp; p++)
        for (int r = 0; r < RPF; r++)
            for (int t = 0; t < TPF; t++) buf[p][r][t] = fv_zero();
    for (int64_t kb = 0; kb < kfull; kb += j->fkb) {
        const int64_t ke = kb + j->fkb < kfull ? kb + j->fkb : kfull;
        for (int64_t p = 0; p < ngrp; p++) {
            const uint8_t *rows[RPF], *next[RPF]; /* next: the rows after this group's, as tile_f fetches them */
            fv acc[RPF][8];
            for (int r = 0; r < RPF; r++) {
                rows[r] = mm_row(j, rb + p * RPF + r);
                next[r] = mm_row_or_last(j, rb + (p + 1) * RPF + r);
                for (int t = 0; t < TPF; t++) acc[r][t] = buf[p][r][t];
            }
            if (first)
                for (int64_t k = kb; k < ke; k += step) {
                    if (!((k * esz) & 63))
                        for (int r = 0; r < RPF; r++) _mm_prefetch((const char *)next[r] + k * esz, _MM_HINT_T0);
                    tile_f_step(j, rows, t0, k, acc, RPF, TPF, type, 0, 0);
                }
            else
                for (int64_t k = kb; k < ke; k += step) tile_f_step(j, rows, t0, k, acc, RPF, TPF, type, 0, 0);
            for (int r = 0; r < RPF; r++)
                for (int t = 0; t < TPF; t++) buf[p][r][t] = acc[r][t];
        }
    }
    for (int64_t p = 0; p < ngrp; p++) {
        const uint8_t *rows[RPF];
        for (int r = 0; r < RPF; r++) rows[r] = mm_row(j, rb + p * RPF + r);
#if defined(MM_AVX512)
        if (kfull < K) {
            fv acc[RPF][8];
            for (int r = 0; r < RPF; r++)
                for (int t = 0; t < TPF; t++) acc[r][t] = buf[p][r][t];
            tile_f_step(j, rows, t0, kfull, acc, RPF, TPF, type, 1, (lanemask)((1u << (K - kfull)) - 1));
            for (int r = 0; r < RPF; r++)
                for (int t = 0; t < TPF; t++) buf[p][r][t] = acc[r][t];
        }
#endif
        tile_f_store(j, rows, rb + p * RPF, t0, buf[p], RPF, TPF, type);
    }
    return ngrp * RPF;
}
static int64_t rows_fw(const mm_job *j, int64_t rb, int64_t re, int64_t t0) {
    if (j->type == PI_F16) return rows_f_kblocked(j, rb, re, t0, PI_F16);
    if (j->type == PI_BF16) return rows_f_kblocked(j, rb, re, t0, PI_BF16);
    return rows_f_kblocked(j, rb, re, t0, PI_F32);
}
/* one row, the TPF - TP tokens after a TP-token tile_1t */
static void tile_1t2(const mm_job *j, int64_t r0, int64_t t0) { tile_f_any(j, r0, t0, 1, TPF - TP); }
#endif

#if defined(MM_AVX2)
/* AVX2, F16 over whole rows in blocks of whole 3-row groups (frb_for; 1 MB of L2 or more): tiles of
 * 3 rows x 4 tokens instead of 2 x 6. Both fill the 16 ymm (3 x 4: 12 accumulators + 3 weight vectors + 1 x
 * vector); over whole rows a tile's rows and x stream from L2, and a 3 x 4 step fetches 3 x 16 bytes of weights
 * and 4 x 32 of x for its 12 FMAs where a 2 x 6 one fetches 2 x 16 and 6 x 32 (176 bytes against 224), for one
 * conversion more. The column blocks (x in L1) keep 2 x 6, as do 16-row blocks where not even F16_3X4_MIN_ROWS
 * rows fit in L2 beside x. Each output's fmas run in the same
 * order either way (tile_f: one pass over the row, then the lane sum and the scalar tail): the same bits. The
 * haswell build on the 2-core Zen 5 host (1 MB L2), `bench_prefill_ab.py OLD NEW --types F16 --shapes
 * 4096x4096,11008x4096,4096x11008 --threads 1,2 --n-tok 128 --rounds 9`: 4096 x 4096 1.04x (one thread) / 1.05x
 * (two), 11008 x 4096 1.05x / 1.08x, 4096 x 11008 (unchanged) 1.00x / 0.99x; the 8-layer F16 file's prompt
 * (`--model f16.gguf`) 1.05x at 128 tokens and 1.04x at 512. No Intel AVX2 host was at hand, where the
 * conversion shares the FMA ports (three conversions per 12 FMAs instead of two). */
static int f16_tiles_3x4(const mm_job *j, int64_t rb, int64_t re) {
    return j->type == PI_F16 && j->fkb >= j->n_cols && j->frb % 3 == 0 && (re - rb) % 3 == 0;
}
#endif

#if defined(MM_AVX2)
/* q8_tile's shapes, each a function of its own (inlined together into one caller, gcc spilled their sums) */
typedef void q8_tile_fn(const mm_job *j, int64_t r0, int64_t t0, const float *wd, const float *xd4);
#define Q8_TILE_FN(name, R, T)                                                                                 \
    static __attribute__((noinline)) void name(const mm_job *j, int64_t r0, int64_t t0, const float *wd,       \
                                               const float *xd4) {                                               \
        q8_tile(j, r0, t0, R, T, wd, xd4);                                                                     \
    }
Q8_TILE_FN(q8_tile_24, 2, 4)
Q8_TILE_FN(q8_tile_14, 1, 4)
Q8_TILE_FN(q8_tile_23, 2, 3)
Q8_TILE_FN(q8_tile_13, 1, 3)
Q8_TILE_FN(q8_tile_22, 2, 2)
Q8_TILE_FN(q8_tile_12, 1, 2)
#define Q8_WD_MAX_BLOCKS 2048 /* q8_chunk's f32 row scales on the stack: 16 rows x 2048 blocks = 128 KB at most */

/* AVX2 Q8_0 prefill of the rows r_beg..r_end of a chunk: mm_chunk's token and row blocks, each row block's
 * weight scales converted to f32 once per token block (wd) for q8_tile; the last token of a count 1 mod 4 goes
 * to the decode tile. The token groups' scales come from j->xd4, or, where a job has none (an expert's tokens
 * starting off a multiple of 4), are gathered per group and row block into xl (1-3% slower: measured against
 * j->xd4 on the haswell build, 128 tokens). 0 where it does not apply (decode; rows over Q8_WD_MAX_BLOCKS
 * blocks, left to the generic tiles). */
static int q8_chunk(const mm_job *j, int64_t r_beg, int64_t r_end) {
    const int64_t nb = j->n_cols / QK;
    if (j->type != PI_Q8_0 || j->n_tok == 1 || nb > Q8_WD_MAX_BLOCKS) return 0;
    float wd[ROW_BLOCK * nb];
    float xl[nb * 4] __attribute__((aligned(16)));
    for (int64_t tb = 0; tb < j->n_tok; tb += TOK_BLOCK) {
        const int64_t te = tb + TOK_BLOCK < j->n_tok ? tb + TOK_BLOCK : j->n_tok;
        for (int64_t rb = r_beg; rb < r_end; rb += ROW_BLOCK) {
            const int64_t re = rb + ROW_BLOCK < r_end ? rb + ROW_BLOCK : r_end;
            for (int64_t r = rb; r < re; r++) {
                const block_q8_0 *row = (const block_q8_0 *)mm_row(j, r);
                for (int64_t b = 0; b < nb; b++) wd[(r - rb) * nb + b] = pi_h2f(row[b].d);
            }
            for (int64_t t = tb; t < te; t += 4) {
                const int64_t left = te - t;
                if (left == 1) {
                    for (int64_t r = rb; r < re; r++) tile_q(j, r, t, 1, 1, K_Q8);
                    break;
                }
                const float *x4 = j->xd4 ? j->xd4 + t / 4 * j->nbp * 4 : xl; /* t - tb is a multiple of 4 */
                if (!j->xd4)
                    for (int64_t b = 0; b < nb; b++)
                        for (int k = 0; k < 4; k++) xl[b * 4 + k] = k < left ? j->xd[(t + k) * j->nbp + b] : 0.0f;
                q8_tile_fn *two = left >= 4 ? q8_tile_24 : left == 3 ? q8_tile_23 : q8_tile_22;
                q8_tile_fn *one = left >= 4 ? q8_tile_14 : left == 3 ? q8_tile_13 : q8_tile_12;
                int64_t r = rb;
                for (; r + 2 <= re; r += 2) two(j, r, t, wd + (r - rb) * nb, x4);
                if (r < re) one(j, r, t, wd + (r - rb) * nb, x4);
            }
        }
    }
    return 1;
}
#endif
static void mm_chunk(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const mm_job *j = ctx;
    const int64_t r_beg = chunk * j->rows_per_chunk;
    const int64_t r_end = r_beg + j->rows_per_chunk < j->n_rows ? r_beg + j->rows_per_chunk : j->n_rows;
#if defined(MM_AVX2)
    if (g8_chunk(j, r_beg, r_end) || q8_chunk(j, r_beg, r_end)) return;
#endif
    if (j->n_tok == 1) {
        int64_t r = r_beg;
#if defined(Q4_ROW_DECODE)
        const int quads = type_kind(j->type) >= 0 && kind_quad(type_kind(j->type));
        if (quads && j->stream && (j->n_cols / QK + QB - 1) / QB <= Q4_ROW_MAX_QUADS) {
            q4_decode_rows(j, r, r_end);
            return;
        }
#endif
#if defined(MM_AVX512)
        if (type_kind(j->type) >= 0 && kind_quad(type_kind(j->type))) /* quads: DQ rows share each activation load */
            for (; r + DQ <= r_end; r += DQ) switch (j->type) {
                case PI_Q4_0: tile_q(j, r, 0, DQ, 1, K_Q4); break;
                case PI_Q4_1: tile_q(j, r, 0, DQ, 1, K_Q41); break;
                case PI_Q5_1: tile_q(j, r, 0, DQ, 1, K_Q51); break;
                case PI_MXFP4: tile_q(j, r, 0, DQ, 1, K_MXFP4); break;
                case PI_Q8_0: tile_q(j, r, 0, DQ, 1, K_Q8); break;
                default: tile_q(j, r, 0, DQ, 1, K_IQ4NL); break;
                }
#endif
#if defined(Q8_ROW_DECODE) && !defined(Q8_IN_QUADS) /* with VNNI Q8_0 decodes as quads (above) */
        if (j->type == PI_Q8_0 && q8_row_path(j)) {
            q8_decode_rows(j, r, r_end);
            return;
        }
#endif
#if defined(Q5_ROW_DECODE)
        if (type_kind(j->type) >= K_Q5 && !kind_quad(type_kind(j->type)) && j->stream) {
            q5_decode_rows(j, r, r_end);
            return;
        }
#endif
#if defined(BF16_DP)
        if (j->type == PI_BF16) {
            for (; r + BF_RD <= r_end; r += BF_RD) tile_f(j, r, 0, BF_RD, 1, PI_BF16);
            for (; r < r_end; r++) tile_f(j, r, 0, 1, 1, PI_BF16);
            return;
        }
#endif
#if defined(MM_AVX512) || defined(MM_AVX2)
        const int path = decode_path(j->type); /* F16, AVX2 Q8_0: one row at a time (note above decode_rows_init) */
        if ((path == DR_F16 || path == DR_Q8) && decode_one_row(path)) {
            for (; r < r_end; r++) tile_11(j, r, 0);
            return;
        }
#endif
#if defined(MM_AVX2)
        if (j->stream && f16_rows == 2) { /* two rows per tile: the AVX2 note above tile_dec */
            if (j->type == PI_F16)
                for (; r + 2 <= r_end; r += 2) tile_dec_f16(j, r);
            else if (j->type == PI_BF16)
                for (; r + 2 <= r_end; r += 2) tile_dec_bf16(j, r);
        }
#endif
        for (; r + RD <= r_end; r += RD) tile_dec(j, r, 0);
        for (; r < r_end; r++) tile_11(j, r, 0);
        return;
    }
    /* TOK_BLOCK tokens' activations stay in L2 while the chunk's rows pass by in blocks of ROW_BLOCK rows,
     * which stay in L1/L2 for all of those tokens. Float types on vector builds take 132 (22 x TPF): their
     * tiles block the columns (rows_f_kblocked), so a token block's x need only stay in L3 (2.1 MB at K = 4096,
     * 5.8 MB at 11008, shared by the threads), and each row block then comes from DRAM once per 22 token groups
     * instead of 11. A multiple of TPF, so only the last block leaves tokens to the smaller tiles. Measured on the
     * 2-core Zen 5 host, `bench_prefill_ab.py OLD NEW --types F16,BF16,F32 --shapes 11008x4096,4096x11008
     * --threads 2`, wall GMAC/s against 66: 128 tokens (--rounds 7) F16 1.13x / 1.06x, F32 1.06x / 1.07x, BF16
     * (--rounds 5) 1.04x / 1.13x; 512 tokens (--rounds 3) F16 1.12x / 1.05x, BF16 1.12x / 1.13x. Larger blocks at
     * 512 tokens lost on the long rows: 264 tokens 1.02x / 0.75x, 528 1.02x / 0.78x; 30 and 42 lost at 128.
     * A token block's first group of tokens reads each row block from memory, the later ones from L2; that first
     * pass over a block prefetches the next tile's rows at its own offset as a decode does (tile_f and
     * rows_f_kblocked at t0 % FTOK_BLOCK == 0; the quantized q8_tile and tile_quad at t0 % TOK_BLOCK == 0; the
     * K-quants in matmul_k.c). Short prompts are mostly that pass. `bench_prefill_ab.py OLD NEW
     * --types F16[,BF16] --shapes 4096x4096,11008x4096,4096x11008 --threads 2 --n-tok N --rounds 5` on the Zen 5
     * host, wall GMAC/s, same bits: haswell build F16 at 2 tokens 1.33-2.21x, 8 1.14-1.44x, 32 1.10-1.12x, 128
     * 1.02-1.04x; native F16 (under 64 tokens: these tiles) 1.30-1.68x, 1.22-1.60x and 1.18-1.21x at 2 / 8 / 32,
     * BF16 0.92-1.06x at 2 (noise), 1.22-1.44x at 8, 1.02-1.13x at 32, 1.03-1.08x at 128. The 8-layer files against
     * llama.cpp (`bench_dense_interleaved.py FILE -p N -n 4 --rounds 5`): native F16 0.90x -> 1.14x at 16 tokens,
     * 0.89x -> 1.03x at 32; BF16 0.82x -> 1.17x at 16; the haswell build against the AVX2 llama.cpp F16 0.93x ->
     * 1.09x at 16, 0.94x -> 1.04x at 32. */
#if defined(MM_AVX512) || defined(MM_AVX2)
    const int64_t tok_block = type_kind(j->type) < 0 ? FTOK_BLOCK : TOK_BLOCK;
#else
    const int64_t tok_block = TOK_BLOCK;
#endif
    const int64_t rbs = j->frb > 0 ? j->frb : ROW_BLOCK; /* rows per block (frb_for) */
    for (int64_t tb = 0; tb < j->n_tok; tb += tok_block) {
        const int64_t te = tb + tok_block < j->n_tok ? tb + tok_block : j->n_tok;
        for (int64_t rb = r_beg; rb < r_end; rb += rbs) {
            const int64_t re = rb + rbs < r_end ? rb + rbs : r_end;
            int64_t t = tb, r;
#if defined(MM_AVX512) || defined(MM_AVX2)
#if defined(MM_AVX2)
            if (f16_tiles_3x4(j, rb, re))
                for (; t + 4 <= te; t += 4)
                    for (r = rb; r < re; r += 3) tile_f(j, r, t, 3, 4, PI_F16);
#endif
            if (j->type == PI_F16 || j->type == PI_BF16 || j->type == PI_F32) /* TPF tokens: see rows_f_kblocked */
                for (; t + TPF <= te; t += TPF)
                    for (int64_t sb = rb; sb < re; sb += ROW_BLOCK) { /* rows_fw takes at most ROW_BLOCK rows */
                        const int64_t se = sb + ROW_BLOCK < re ? sb + ROW_BLOCK : re;
                        for (r = sb + rows_fw(j, sb, se, t); r < se; r++) tile_1t(j, r, t), tile_1t2(j, r, t + TP);
                    }
#endif
            for (; t + TP <= te; t += TP) {
                for (r = rb; r + RP <= re; r += RP) tile_rt(j, r, t);
                for (; r < re; r++) tile_1t(j, r, t);
            }
#if TP == 4
            if (te - t >= 2) { /* one pass over the rows for the 2 or 3 left, not one per token (every type) */
                const int two = te - t == 2;
                for (r = rb; r + RP <= re; r += RP) two ? tile_r2(j, r, t) : tile_r3(j, r, t);
                for (; r < re; r++) two ? tile_12(j, r, t) : tile_13(j, r, t);
                t = te;
            }
#endif
            for (; t < te; t++) {
                for (r = rb; r + RP <= re; r += RP) tile_r1(j, r, t);
                for (; r < re; r++) tile_11(j, r, t);
            }
        }
    }
}

/* ==== activation quantization (Q8_0, same arithmetic as pi_quantize) =================================== */
static inline int round_away(float v) {
    int t = (int)v;
    float frac = v - (float)t;
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}

static inline float f16_round(float f) {
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
    /* only reached by scalar builds: pi_quantize's scalar conversion, via a 1-element round trip */
    uint16_t h;
    pi_quantize(PI_F16, &f, &h, 1, 1);
    return pi_h2f(h);
#endif
}

/* one block of 32 floats -> q[32], returns the f16-rounded scale, *sum = sum(q) */
#if defined(MM_AVX512)
INLINE __m512i round_away16(__m512 v) { /* as round_away: trunc, then +-1 where |frac| >= 0.5 */
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(v, t), one = _mm512_set1_ps(1.0f);
    t = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t, one);
    t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), t, one);
    return _mm512_cvttps_epi32(t);
}

static float quantize_block(const float *x, int8_t *q, int32_t *sum, float *draw) {
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *draw = d;
    __m512 vid = _mm512_set1_ps(id);
    __m512i qa = round_away16(_mm512_mul_ps(a, vid)), qb = round_away16(_mm512_mul_ps(b, vid));
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    return f16_round(d);
}
#elif defined(MM_AVX2)
INLINE __m256i round_away8(__m256 v) { /* as round_away: trunc, then +-1 where |frac| >= 0.5 */
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(v, t);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one);
    const __m256 dn = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one);
    return _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(t, up), dn));
}

static float quantize_block(const float *x, int8_t *q, int32_t *sum, float *draw) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m;
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *draw = d;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i qi[4];
    for (int i = 0; i < 4; i++) qi[i] = round_away8(_mm256_mul_ps(v[i], vid));
    /* |q| <= 127: the packs do not saturate; packs work per 128-bit lane, the permute restores element order */
    const __m256i s01 = _mm256_packs_epi32(qi[0], qi[1]), s23 = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(s01, s23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *sum = _mm_cvtsi128_si32(s4);
    return f16_round(d);
}
#else
static float quantize_block(const float *x, int8_t *q, int32_t *sum, float *draw) {
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *draw = d;
    int32_t s = 0;
    for (int i = 0; i < QK; i++) { q[i] = (int8_t)round_away(x[i] * id); s += q[i]; }
    *sum = s;
    return f16_round(d);
}
#endif

static void quantize_token(void *ctx, int64_t t, int thread_id) {
    (void)thread_id;
    const mm_job *j = ctx;
    const int64_t nb = j->n_cols / QK;
    const float *x = j->x + t * j->n_cols;
    int8_t *xq = (int8_t *)j->xq + t * j->nbp * QK;
    float *xd = (float *)j->xd + t * j->nbp;
    int32_t *xc = (int32_t *)j->xc + t * j->nbp;
    float *xs = (float *)j->xs + t * j->nbp;
    const int kind = type_kind(j->type);
#if defined(MM_AVX512) || defined(MM_AVX2)
    const int32_t corr_mx = MXFP4_OFF; /* the quads' (AVX2: the groups') unsigned MXFP4 levels */
#else
    const int32_t corr_mx = Q8_CORR; /* signed levels as Q8_0's */
#endif
    const int32_t corr = kind == K_Q4 ? 8 : kind == K_Q5 ? 16 : kind_min(kind) ? 0 : kind == K_MXFP4 ? corr_mx : Q8_CORR;
    for (int64_t b = 0; b < j->nbp; b++) {
        int8_t q[QK] = {0};
        int32_t s = 0;
        float draw = 0.0f;
        xd[b] = b < nb ? quantize_block(x + b * QK, q, &s, &draw) : 0.0f;
        if (j->xd4) ((float *)j->xd4)[(t / 4 * j->nbp + b) * 4 + t % 4] = xd[b];
        xc[b] = -corr * s;
        xs[b] = f16_round(draw * (float)s); /* llama.cpp's Q8_1 s: the unrounded d times the sum, as f16 */
#if defined(MM_AVX512)
        if (kind_quad(kind)) { /* quad order [b0..b3 elements 0..15 | b0..b3 elements 16..31], as tile_quad */
            memcpy(xq + (b & ~3) * QK + 16 * (b & 3), q, 16);
            memcpy(xq + (b & ~3) * QK + 64 + 16 * (b & 3), q + 16, 16);
        } else if (kind != K_Q8) { /* pair order [b0 0..15 | b1 0..15 | b0 16..31 | b1 16..31], as w_load_nib */
            memcpy(xq + (b & ~1) * QK + 16 * (b & 1), q, 16);
            memcpy(xq + (b & ~1) * QK + 32 + 16 * (b & 1), q + 16, 16);
        } else
            memcpy(xq + b * QK, q, QK);
#elif defined(MM_AVX2)
        if (kind_g8(kind) && !kind_signed(kind)) { /* group order: pair i (blocks i, i + 4) at 64 i: [b_i 0..15 | b_i+4 0..15 | b_i 16..31 | b_i+4 16..31] */
            const int64_t k = b & 7, at = (b & ~7) * QK + 64 * (k & 3) + 16 * (k >> 2);
            memcpy(xq + at, q, 16);
            memcpy(xq + at + 32, q + 16, 16);
        } else
            memcpy(xq + b * QK, q, QK);
#else
        memcpy(xq + b * QK, q, QK);
#endif
    }
}

/* BF16 weights: each activation rounded to bf16 as pi_quantize rounds (nearest even, NaN kept and made quiet),
 * which is what llama.cpp does to the activations of BF16 weights; with BF16_DP the copy is bf16 (j->xb), else
 * f32 holding the rounded values (j->x), so every build computes on the same activations. A token's row is
 * padded by 64 bytes where its length is a multiple of 4 KB (the L1 set conflict described in mm_run). */
typedef struct { const float *x; int64_t n_cols, xs; uint16_t *xb; float *xf; } bf16_job;
#if defined(MM_AVX512)
/* pi_f2bf on 16 lanes: the rounded bits in the low 16 of each 32-bit lane */
INLINE __m512i bf16_round16(__m512i u) {
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                    _mm512_set1_epi32(0x7f800000));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    return _mm512_mask_mov_epi32(r, isnan, nan);
}
#elif defined(MM_AVX2)
INLINE __m256i bf16_round8(__m256i u) { /* the same on 8 lanes */
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    return _mm256_blendv_epi8(r, nan, isnan);
}
#endif
static void bf16_token(void *ctx, int64_t t, int thread_id) {
    (void)thread_id;
    const bf16_job *b = ctx;
    const float *x = b->x + t * b->n_cols;
    if (b->xb) {
        uint16_t *o = b->xb + t * b->xs;
        int64_t k = 0;
#if defined(MM_AVX512)
        for (; k + 16 <= b->n_cols; k += 16)
            _mm256_storeu_si256((__m256i *)(o + k), _mm512_cvtepi32_epi16(bf16_round16(_mm512_loadu_si512(x + k))));
#endif
        for (; k < b->n_cols; k++) o[k] = pi_f2bf(x[k]);
        for (int64_t k = b->n_cols; k < b->xs; k++) o[k] = 0;
    } else {
        float *o = b->xf + t * b->xs;
        int64_t k = 0;
#if defined(MM_AVX512)
        for (; k + 16 <= b->n_cols; k += 16)
            _mm512_storeu_si512(o + k, _mm512_slli_epi32(bf16_round16(_mm512_loadu_si512(x + k)), 16));
#elif defined(MM_AVX2)
        for (; k + 8 <= b->n_cols; k += 8)
            _mm256_storeu_si256((__m256i *)(o + k), _mm256_slli_epi32(bf16_round8(_mm256_loadu_si256((const __m256i *)(x + k))), 16));
#endif
        for (; k < b->n_cols; k++) o[k] = pi_bf_round(x[k]);
        for (k = b->n_cols; k < b->xs; k++) o[k] = 0.0f;
    }
}
static void mm_round_bf16(pi_pool *pool, mm_job *j) {
#if defined(BF16_DP)
    const int64_t esz = 2;
#else
    const int64_t esz = 4;
#endif
    bf16_job b = {.x = j->x, .n_cols = j->n_cols, .xs = j->n_cols + ((j->n_cols * esz) % 4096 ? 0 : 64 / esz)};
    void *s = pi_pool_scratch(pool, (size_t)(j->n_tok * b.xs * esz));
#if defined(BF16_DP)
    b.xb = s;
    j->xb = b.xb;
#else
    b.xf = s;
    j->x = b.xf;
#endif
    j->xstride = b.xs;
    if (j->n_tok == 1) /* decode: a few microseconds, less than waking the pool */
        bf16_token(&b, 0, 0);
    else
        pi_pool_run(pool, bf16_token, &b, j->n_tok);
}

/* The activations of j's n_tok tokens, quantized for the block types (into the pool's scratch); BF16 weights get
 * them rounded to bf16 (mm_round_bf16); F32 and F16 read x as it is. */
static void mm_quantize(pi_pool *pool, mm_job *j) {
    if (j->type == PI_BF16) {
        mm_round_bf16(pool, j);
        return;
    }
    if (type_kind(j->type) < 0) return;
    const int64_t nb = j->n_cols / QK;
    int64_t per = BPV; /* blocks per vector step */
#if defined(MM_AVX512)
    if (kind_quad(type_kind(j->type))) per = QB;
#elif defined(MM_AVX2)
    if (kind_g8(type_kind(j->type))) per = GB;
#endif
    j->nbp = (nb + per - 1) / per * per;
    const size_t nq = (size_t)(j->n_tok * j->nbp);
#if defined(MM_AVX2)
    const size_t n4 = j->type == PI_Q8_0 && j->n_tok > 1 ? (size_t)((j->n_tok + 3) / 4 * 4 * j->nbp) : 0; /* xd4 */
#else
    const size_t n4 = 0;
#endif
    char *s = pi_pool_scratch(pool, nq * QK + 3 * nq * 4 + n4 * 4);
    j->xq = (const int8_t *)s;
    j->xd = (const float *)(s + nq * QK);
    j->xc = (const int32_t *)(s + nq * QK + nq * 4);
    j->xs = (const float *)(s + nq * QK + 2 * nq * 4);
    if (n4) { /* the token groups' scales side by side (q8_tile), written by quantize_token; 0 past the last token */
        float *d4 = (float *)(s + nq * QK + 3 * nq * 4);
        memset(d4 + (j->n_tok / 4) * j->nbp * 4, 0, (n4 - (size_t)(j->n_tok / 4 * j->nbp * 4)) * 4);
        j->xd4 = d4;
    }
    pi_pool_run(pool, quantize_token, j, j->n_tok);
}

/* Whether the decode of a selection should read it as one stream (mm_job.stream): rows that are mostly
 * neighbours, or long runs of consecutive rows. The stream paths prefetch by position in the selection, so
 * they are right for any selection; this only picks the faster path. */
static int is_stream(const int32_t *sel, int64_t n) {
    if (n <= 0 || (double)(sel[n - 1] - sel[0] + 1) <= STREAM_SPAN * (double)n) return 1;
    const int64_t max_breaks = n / STREAM_RUN - 1; /* more and the runs average under STREAM_RUN rows */
    int64_t breaks = 0;
    for (int64_t i = 1; i < n && breaks <= max_breaks; i++) breaks += sel[i] != sel[i - 1] + 1;
    return breaks <= max_breaks;
}

#if defined(MM_AVX512) || defined(MM_AVX2)
/* A cache size in bytes as the C library reports it (sysconf), or `fallback` where it does not know or reports
 * something outside [lo, hi]. */
static int64_t cache_bytes(long reported, int64_t lo, int64_t hi, int64_t fallback) {
    return reported >= lo && reported <= hi ? (int64_t)reported : fallback;
}
#if !defined(_SC_LEVEL1_DCACHE_SIZE) || !defined(_SC_LEVEL2_CACHE_SIZE)
#define CACHE_SYSCONF(name) (-1L)
#else
#define CACHE_SYSCONF(name) sysconf(name)
#endif
/* L1d, read once: 32 KB where unknown, the smallest seen on x86 hosts with AVX2 */
static int64_t l1d_bytes(void) {
    static int64_t cached;
    if (!cached) cached = cache_bytes(CACHE_SYSCONF(_SC_LEVEL1_DCACHE_SIZE), 8192, 1L << 22, 32768);
    return cached;
}
/* L2 per core, read once: 256 KB where unknown, the smallest seen beside AVX2 */
static int64_t l2_bytes(void) {
    static int64_t cached;
    if (!cached) cached = cache_bytes(CACHE_SYSCONF(_SC_LEVEL2_CACHE_SIZE), 65536, 1L << 26, 262144);
    return cached;
}
/* float-type prefill column block (see the derivation above rows_f_kblocked): F16, whole rows (n_cols) where a
 * tile's TPF tokens' x and RPF weight rows, whole, fit in half of L2; else the largest power of two in 128..2048
 * whose TPF tokens' x and RPF weight rows fit in half of L1d */
static int64_t fkb_for(int type, int64_t n_cols) {
#if defined(BF16_DP)
    const int64_t x_size = type == PI_BF16 ? 2 : 4; /* BF16: the activations' bf16 copy */
#else
    const int64_t x_size = 4;
#endif
    const int64_t per_col = TPF * x_size + RPF * (type == PI_F32 ? 4 : 2);
    if (type == PI_F16 && n_cols * per_col <= l2_bytes() / 2) return n_cols;
    const int64_t budget = l1d_bytes() / 2;
    int64_t fkb = 2048;
    while (fkb > 128 && fkb * per_col > budget) fkb /= 2;
    return fkb;
}

/* Rows per float prefill block (mm_chunk). Over whole rows (fkb_for gave n_cols) the token tiles pass a block's
 * rows once each, and each tile's x comes from L3 for the block's first row group and from L2 for the others;
 * a block of more rows shares that one read among more groups. The block's rows and one tile's x must then stay
 * in L2 together: ROW_BLOCK x m rows with m x ROW_BLOCK x K x 2 + TPF x K x 4 <= half of L2 (F16). With 1 MB of L2
 * that is 48 rows at K = 4096 and stays 16 at 11008 (already 616 KB); with 512 KB it stays 16. Measured on the
 * 2-core Zen 5 host (1 MB L2), 48 rows against 16, 128 tokens, `bench_prefill_ab.py OLD NEW --types F16 --shapes
 * 4096x4096,11008x4096 --threads 1,2 --n-tok 128 --rounds 9`: 4096 x 4096 1.05x (one thread and two), 11008 x 4096
 * 1.05x / 1.02x; the 8-layer F16 file's 128-token prompt 1.03-1.04x; the haswell build 1.03x / 1.04x (two threads)
 * and 1.02x (same bits). Rows of 48 at K = 11008 lost 6%.
 * AVX2, where not even m = 2 fits (K = 11008 with 1 MB of L2), 16-row blocks would leave the 3 x 4 tiles for the
 * 2 x 6 ones, ~15% slower per multiply-add there. Such a block is instead as many whole 3-row groups as fit in
 * half of L2 beside one 3 x 4 tile's x (4 tokens): 15 rows at K = 11008 (at least F16_3X4_MIN_ROWS, else 16 rows
 * of 2 x 6 as before). The haswell build on the Zen 5 host, `bench_prefill_ab.py OLD NEW --types F16 --shapes
 * 4096x11008,11008x4096,4096x4096 --threads 1,2 --n-tok 128 --rounds 5`: 4096 x 11008 1.10x (one thread) / 1.08x
 * (two), the other shapes (unchanged) 0.99-1.03x; blocks of 9 to 36 rows all gained 1.04-1.08x, 18 rows 1.03x
 * at 512 tokens; the 8-layer F16 file's prompt (`--model f16.gguf`) 1.01x / 1.05x at 128 tokens and 1.01x / 1.06x
 * at 512 (two runs each; same bits). */
static int64_t frb_for(int type, int64_t n_cols, int64_t fkb) {
    if (type != PI_F16 || fkb < n_cols) return ROW_BLOCK;
    const int64_t room = l2_bytes() / 2 - TPF * n_cols * 4, per_block = ROW_BLOCK * n_cols * 2;
    int64_t m = room > 0 ? room / per_block : 0;
#if defined(MM_AVX2)
    if (m >= 3) return (m - m % 3) * ROW_BLOCK; /* whole 3-row groups for the 3 x 4 tiles (f16_tiles_3x4) */
    if (m < 2) { /* long rows: as many whole 3-row groups as fit beside one 3 x 4 tile's x (4 tokens) */
        const int64_t rows = (l2_bytes() / 2 - 4 * n_cols * 4) / (n_cols * 2);
        if (rows >= F16_3X4_MIN_ROWS) return rows - rows % 3;
    }
#endif
    return (m > 1 ? m : 1) * ROW_BLOCK;
}
#endif

/* y [n_tok, n_out] from output row i = weight row (sel ? sel[i] : i); the chunks split the output rows */
static void mm_run(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *sel, int64_t n_out,
                   const float *x, int64_t n_tok, float *y) {
    if (n_out <= 0 || n_tok <= 0) return;
    if (pi_is_k_type(type)) {
        pi_matmul_k(pool, type, w, n_cols, sel, n_out, x, n_tok, y);
        return;
    }
    /* F16 prompts of 64 tokens or more on AVX-512 builds: outer-product tiles on converted rows (matmul_f16p.c);
     * their bits differ from these dot tiles' (another summation order) */
    if (type == PI_F16 && n_tok > 1 && pi_f16_packed(pool, w, sel, n_out, n_cols, x, n_tok, y)) return;
    mm_job j = {.type = type, .w = w, .row_bytes = pi_row_size(type, n_cols), .n_rows = n_out, .n_cols = n_cols,
                .n_tok = n_tok, .x = x, .sel = sel, .y = y,
                .stream = !sel || is_stream(sel, n_out)};
    mm_quantize(pool, &j);
#if defined(MM_AVX512) || defined(MM_AVX2)
    /* float-type prefill on rows a multiple of 4 KB long: the tiles read RPF weight rows and TPF token rows at
     * the same column, all at one offset mod 4 KB, so they share L1 sets and evict each other. The tokens' x
     * go to a copy whose rows are 64 bytes longer (measured on 11008 x 4096 F16, 128 tokens, 2 threads). */
    if (type_kind(type) < 0 && n_tok > 1) j.fkb = fkb_for(type, n_cols), j.frb = frb_for(type, n_cols, j.fkb);
    if ((type == PI_F16 || type == PI_F32) && n_tok >= TPF && (n_cols * 4) % 4096 == 0) { /* BF16: mm_round_bf16 */
        const int64_t xs = n_cols + 16;
        float *xp = pi_pool_scratch(pool, (size_t)(n_tok * xs) * sizeof(float));
        if (xp) {
            for (int64_t t = 0; t < n_tok; t++) memcpy(xp + t * xs, x + t * n_cols, (size_t)n_cols * sizeof(float));
            j.x = xp;
            j.xstride = xs;
        }
    }
#endif
    const int64_t n_blocks = (n_out + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t n_chunks = pi_pool_chunks(pool, n_blocks, 1);
    /* Each chunk of a scattered decode gather starts cold: its first rows were never prefetched by a row before
     * them. Two chunks per thread instead of four: measured in one process, old and new alternating (Q4_0 and
     * Q8_0 gathers over a LLaMA-7B ffn_gate, two runs), +4-6 points of the read probe at 95% sparsity, +2-3 at
     * 90%, the same at 50-80%. Each output row is computed alike in any chunk, so the bits do not change. */
    if (sel && n_tok == 1 && !j.stream && n_chunks > 2 * (int64_t)pi_pool_n_threads(pool))
        n_chunks = 2 * (int64_t)pi_pool_n_threads(pool);
    j.rows_per_chunk = (n_blocks + n_chunks - 1) / n_chunks * ROW_BLOCK;
    n_chunks = (n_out + j.rows_per_chunk - 1) / j.rows_per_chunk;
    pi_pool_run(pool, mm_chunk, &j, n_chunks);
}

void pi_matmul(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int64_t n_tok,
               float *y) {
    mm_run(pool, type, w, n_cols, NULL, n_rows, x, n_tok, y);
}

void pi_matmul_rows(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows, int64_t n_sel,
                    const float *x, int64_t n_tok, float *y) {
    mm_run(pool, type, w, n_cols, rows, n_sel, x, n_tok, y);
}

/* ==== expert groups: one call for the experts of a mixture-of-experts layer ============================
 * Every token's activations are quantized once, then one pool job runs chunks of (group, rows): each chunk is
 * the chunk of a pi_matmul of that expert over that group's tokens, with the same row code, so every value
 * has the bits pi_matmul gives it. */
typedef struct {
    mm_job base;          /* all tokens; n_rows, row_bytes and rows_per_chunk of one expert */
    const int32_t *experts;
    const int64_t *tok_off;
    int64_t chunks_each;
} mm_group_job;

static void mm_group_chunk(void *ctx, int64_t chunk, int thread_id) {
    const mm_group_job *g = ctx;
    const int64_t e = chunk / g->chunks_each, t0 = g->tok_off[e];
    mm_job j = g->base;
    j.n_tok = g->tok_off[e + 1] - t0;
    if (j.n_tok <= 0) return;
    j.w += (int64_t)g->experts[e] * j.n_rows * j.row_bytes;
    if (j.xb) /* BF16_DP: the bf16 copy (padded rows); x itself is not read */
        j.xb += t0 * j.xstride;
    else
        j.x += t0 * (j.xstride ? j.xstride : j.n_cols);
    j.y += t0 * j.n_rows;
    if (j.xq) {
        j.xq += t0 * j.nbp * QK;
        j.xd += t0 * j.nbp;
        j.xc += t0 * j.nbp;
        j.xs += t0 * j.nbp;
        if (j.xd4) j.xd4 = t0 % 4 == 0 ? j.xd4 + t0 / 4 * j.nbp * 4 : NULL; /* q8_chunk: groups of 4 from t0 */
    }
    mm_chunk(&j, chunk % g->chunks_each, thread_id);
}

/* chunks per group: enough for every thread when the groups are few (decode: one token per expert), one per
 * group when they are many (prefill) */
int64_t pi_expert_chunks(pi_pool *pool, int64_t n_rows, int64_t n_group) {
    const int64_t n_blocks = (n_rows + ROW_BLOCK - 1) / ROW_BLOCK, want = 4 * (int64_t)pi_pool_n_threads(pool);
    int64_t each = (want + n_group - 1) / n_group;
    if (each > n_blocks) each = n_blocks;
    if (each < 1) each = 1;
    return each;
}

void pi_matmul_experts(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols, const int32_t *experts,
                       const int64_t *tok_off, int64_t n_group, const float *x, float *y) {
    const int64_t n_tok = n_group > 0 ? tok_off[n_group] : 0;
    if (n_tok <= 0 || n_rows <= 0) return;
    if (pi_is_k_type(type)) {
        pi_matmul_k_experts(pool, type, w, n_rows, n_cols, experts, tok_off, n_group, x, y);
        return;
    }
    mm_group_job g = {.base = {.type = type, .w = w, .row_bytes = pi_row_size(type, n_cols), .n_rows = n_rows,
                               .n_cols = n_cols, .n_tok = n_tok, .x = x, .y = y, .stream = 1},
                      .experts = experts, .tok_off = tok_off};
#if defined(MM_AVX512) || defined(MM_AVX2)
    if (type_kind(type) < 0) /* the float prefill tiles' column and row blocks (mm_run) */
        g.base.fkb = fkb_for(type, n_cols), g.base.frb = frb_for(type, n_cols, g.base.fkb);
#endif
    mm_quantize(pool, &g.base);
    const int64_t n_blocks = (n_rows + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t each = pi_expert_chunks(pool, n_rows, n_group);
    g.base.rows_per_chunk = (n_blocks + each - 1) / each * ROW_BLOCK;
    g.chunks_each = (n_rows + g.base.rows_per_chunk - 1) / g.base.rows_per_chunk;
    pi_pool_run(pool, mm_group_chunk, &g, n_group * g.chunks_each);
}
