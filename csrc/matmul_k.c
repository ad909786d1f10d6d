/* matmul_k.c: y[t, r] = sum_c w[r, c] * x[t, c] for the K-quants Q2_K ... Q6_K and IQ4_XS (llama.cpp's
 * layouts, see quants.h), dense (pi_matmul) or on selected rows (pi_matmul_rows).
 *
 * As in llama.cpp, each token's activations are first quantized to Q8_K super-blocks of 256:
 *   m = the first element of largest magnitude (sign kept), iscale = -127 / m, q = min(127, round-half-even(
 *   iscale * x)), d = 1 / iscale (f32), bsums = sums of 16 consecutive q.
 * Per (row, token, super-block) the integer parts are then exact:
 *   Q4_K/Q5_K: isum = sum_s sc_s * (q_w . q_x over sub-block s), imin = sum_s m_s * (bsum_2s + bsum_2s+1),
 *              y += (d_x * d) * isum - (d_x * dmin) * imin;
 *   Q6_K:      isum = sum_g sc_g * (q_w . q_x over group g) - 32 * sum_g sc_g * bsum_g  (q_w unsigned 0..63),
 *              y += (d_x * d) * isum.
 *   Q2_K:      as Q4_K over 16 groups of 16: imin = sum_g m_g * bsum_g.
 *   Q3_K:      as Q6_K with s_g = sc_g - 32 and q_w unsigned 0..7: isum = sum_g s_g * (q_w . q_x) - 4 * sum_g s_g * bsum_g.
 *   IQ4_XS:    isum = sum_s (ls_s - 32) * (t_w . q_x over sub-block s), t_w the signed table levels -127..113,
 *              y += (d_x * d) * isum (llama.cpp's ggml_vec_dot_iq4_xs_q8_K: the same integers).
 * (llama.cpp's ggml_vec_dot_q2_K_q8_K / q3_K_q8_K compute the same integers and the same per-super-block f32
 * scale products; only the order of the f32 additions across super-blocks differs.)
 * Variants:
 *   - AMX-INT8 (matmul_k_amx.h; builds for such CPUs, chosen per process): Q4_K, Q5_K, Q6_K prefill on tiles of
 *     16 rows x 16 tokens, exact per-super-block integers, then one f32 FMA per (row, token, super-block); decode
 *     (k_dot_pf with `full`) then reduces each super-block's lanes to the same integers first (one reduction for
 *     isum and imin together) so that it gives the same bits. That reduction costs decode ~15% in cache (1024 x
 *     4096 Q4_K, one thread, before the reduction was shared: 17-19 vs 20.5-22 GMAC/s; after it, see k_dot_pf).
 *   - AVX-512 (F + BW + VL): 64 weights per zmm in the activations' natural order; maddubs(q_w, q_x) gives
 *     int16 pair sums (no saturation: q_w <= 63), then dpwssd (VNNI) or madd + add multiplies them by the
 *     sub-block scales (spread over the words by one vpermw) into int32 lanes; per super-block the lanes go to
 *     f32 with one fma. The min / -32 terms use the int16 bsums with one madd.
 *     IQ4_XS: its levels are signed and reach 127 in magnitude, so offsetting them by +128 (and subtracting
 *     128 * bsums, as Q6_K does with 32) would overflow maddubs' int16 pair sums (2 * 241 * 127). Instead the
 *     tile keeps |t_w| (one pshufb of the nibbles into a table of magnitudes) and the mask of negative levels,
 *     and each token's activations get those signs (one masked subtract): |t_w| * (+-q_x) = t_w * q_x, pair
 *     sums <= 2 * 127 * 127 (q_x >= -127 in Q8_K).
 *     Prefill (batches of KT = 8 tokens or more) is compute-bound, and unpacking a super-block (nibbles, high
 *     bits, 6-bit scales, scale words) costs about as much as one token's dots on it, so a tile unpacks each
 *     super-block of a row once for KT tokens (ksb, kquant_simd.h). Rows go in blocks of RB = 16, and each block walks
 *     its super-blocks in spans of SPAN = 8, all RB rows per span, so the span's activations (KT x SPAN x 320
 *     bytes, 20 KB) are read from L1 by every row: with a row's whole width per tile they came from L2 at
 *     K = 11008 and the tile ran ~30% slower. 4096 x 4096 x 64 tokens, 2 threads, this 2-core Zen 5 host:
 *     Q4_K 73 -> 152 GMAC/s, Q6_K 89 -> 148 (the old and new builds loaded in one process, taking turns).
 *     Per (row, token, super-block) a tile then does 4 activation loads, 4 maddubs, 4 dpwssd, one convert,
 *     one permute and one FMA, plus half of a two-token mins (or offset) step; the activation loads are its
 *     largest cost (a microbenchmark of the token loop alone, in L1: 4 maddubs fed from registers 0.5 ns per
 *     token and super-block, from loads that split cache lines 1.3 ns, from aligned loads 0.9 ns). Hence:
 *       - Q8_K blocks are 320 bytes, qs first and 64-byte aligned (quants.h), so no load splits a
 *         cache line (the 292-byte layout put every qs load across two lines);
 *       - per span, the tile's d_x and bsums are gathered once for all RB rows (ktile): per row super-block
 *         one multiply gives d_x * d for all KT tokens and one permute spreads a token's product over its
 *         lanes (the same f32 product as the scalar d_x * d); the mins (Q4_K, Q5_K, Q2_K) of two tokens take
 *         one madd, convert and FMA in a zmm (accm[p]: token 2p low 8 lanes, 2p + 1 high), and so do the
 *         -32 / -4 offsets of Q6_K / Q3_K (one madd, then each half starts a token's isum);
 *       - Q4_K/Q5_K decode their 6-bit scales with two pshufb, one variable shift and masks, and d, dmin with
 *         one vcvtph2ps (scalar shifts and masks with GPR <-> vector moves before).
 *     Measured with benchmarks/bench_prefill_ab.py (the builds in separate processes, alternating, 64 tokens,
 *     one thread, CPU time, medians of 5 rounds on a loaded host; docs/performance.md has all shapes and two threads):
 *     4096 x 11008 Q4_K 107 -> 123 GMAC/s, Q5_K 101 -> 112, Q6_K 98 -> 114; Q2_K 1.1x, Q3_K, IQ4_XS ~1.0x.
 *     Tried and dropped: unpacking each span once per 64 tokens into a scratch (ksb arrays, 90 KB) that every
 *     tile of 8 tokens reads (no gain: the ksb loads replace the unpack work, 113 vs 114 GMAC/s; 102-108 with
 *     a smaller scratch; the I-quants, whose unpack is dearer, do gain: matmul_iq_tile.h); two rows per tile
 *     sharing each activation load (8 tokens: register spills,
 *     0.87-0.95x with the sums in registers, 1.00x with them in memory); 12 or 16 tokens per tile (0.85x, 0.97x); d_x * d as a broadcast multiply from memory
 *     instead of the permute (0.96-1.01x); with VNNI, vpdpbusd for 4 weights x 4 activations per int32 lane (the
 *     sum fits int16, so two chunks' lanes packed into words by vpackssdw take their scales in one vpdpwssd: 3
 *     port-0 ops per 128 weights where maddubs + dpwssd take 4), on a 2-core Intel AMX host, Q4_K / Q5_K / Q6_K
 *     4096 x 11008 and 11008 x 4096, 128 tokens, 3 rounds: 0.94-1.09x, no gain.
 *   - AVX2 (+ FMA + F16C, no AVX-512; matmul_k_avx2.h), Q4_K, Q5_K, Q6_K, Q2_K, Q3_K and IQ4_XS: the same
 *     integers with 32 weights per ymm: each super-block is unpacked once into 8 ymm of weights (unsigned, in
 *     the activations' order) and 8 ymm of scale words, then per token 8 maddubs, 8 madd with the scale words,
 *     one convert and one FMA into 8 f32 lanes, the mins (Q4_K/Q5_K/Q2_K) one madd of the bsums, one convert
 *     and one FMA (in a prefill tile Q4_K/Q5_K's mins go across its 8 tokens instead, one madd, convert and
 *     FMA per lane for all 8: k2xt; 1.12-1.32x at 128 tokens); Q6_K and IQ4_XS keep signed weights and move
 *     their signs onto the activations (psignb; a Q6_K prefill tile instead offsets the activations by 128 and
 *     takes the signed weights as they are, k2_tile_q6k, 0.97-1.12x, median 1.08x; tried and dropped: unsigned
 *     weights with the -32 taken per int32 lane from per-token sums of 4 activations, 0.88-0.89x), so
 *     Q6_K's -32 needs no bsums term; Q3_K's -4 is one bsums madd. Decode (k2_dot) runs one row whole (a dense
 *     matrix row after row as one stream, prefetched K2_PF_DIST = 4 KB ahead: k2_dot_stream); prefill
 *     (n_tok > 1) takes each row against tiles of K2_TILE = 8 tokens, TOK_BLOCK tokens per pass over the row,
 *     each super-block unpacked once per tile (at 4 tokens: 1.2-1.9x calling the decode dot per token; spans
 *     of 8 super-blocks over blocks of 16 rows, as AVX-512 does, 0.7-1.1x). 8 against 4 tokens, measured
 *     later with the I-quants on this path (`bench_prefill_ab.py OLD NEW --shapes 4096x11008 --threads 2
 *     --rounds 3`, same bits): Q4_K 1.00x, Q6_K 1.21-1.30x, IQ2_XXS 1.29-1.30x, IQ3_S 1.28-1.33x (a first
 *     measurement, on a host shared with another job, had found 8 slower).
 *     This 2-core AMD EPYC (AVX2, no AVX-512), another job sharing the cores, medians:
 *       bench_matvec_hot (1 thread, weights in cache): Q4_K 2.1 -> 16.1-16.7 GB/s, Q5_K 2.1 -> 15.0,
 *         Q6_K 2.4 -> 15.6 (19.4 with the -32 via bsums, see matmul_k_avx2.h for why not), Q2_K 0.6 -> 8-9.5,
 *         Q3_K 0.7 -> 7-8.7, IQ4_XS 0.6 -> 10.2;
 *       bench_kernels --threads 2 (4096 x 11008 / 11008 x 4096): mat-vec Q4_K 17-19 GB/s, Q5_K 17-19,
 *         Q6_K 14-16 (60-73% of a 26.5 GB/s read probe; Q8_0 in the same run 87-92%; scalar before: 2.8-3.7
 *         GB/s), prefill 64 tokens 97-136 GFLOP/s (scalar before: 6-12; Q8_0 78-88 in the same run);
 *       bench_prefill_ab 4096 x 11008, 64 tokens, CPU-time GMAC/s per thread count 1 / 2: Q4_K 2.7 -> 30 /
 *         5.2 -> 45, Q5_K 2.5 -> 29 / 5.3 -> 70, Q6_K 1.9 -> 29 / 4.2 -> 49;
 *       powerinfer_cli bench -m demo -t 2 (Gemma 3 270M Q4_K_M): prompt 102 -> 250-284 tok/s, decode
 *         39 -> 49-52 tok/s (llama.cpp in the same runs 308-319 / 46-51).
 *     The other K-quant-family types (the IQ2 / IQ3 / IQ1 I-quants) stay scalar on AVX2.
 *   - scalar: everything else.
 * Each (row, token) sum sees the same instructions in the same order whether it is computed alone (decode,
 * k_dot), in a tile, or in several spans (the running sums go to memory between spans and come back
 * unchanged), by whichever thread, so results are bit-identical across runs, thread counts, decode/prefill
 * and dense/row-gather.
 */
#include <math.h>
#include "kquant_simd.h"   /* the ISA (MK_AVX512, MK_AVX2), ksb, kacc, scale_words, dot_acc */
#include "matmul_iq.h"      /* AVX-512: unpack_iq, the I-quants' super-blocks into ksb */
#include "matmul_iq_tile.h" /* AVX-512: mk_rows_iq, I-quant prefill, each super-block unpacked once per IQ_GROUP tiles */
#include "matmul_k_avx2.h"  /* AVX2: k2_dot, k2_tile */
#include "matmul_k_amx.h"   /* AMX-INT8: amx_rows, Q4_K / Q5_K / Q6_K prefill on tiles */

#define ROW_BLOCK 16 /* rows per chunk granule */
#define TOK_BLOCK 16 /* scalar and AVX2: tokens per pass over a row (its super-blocks stay in L1) */
#define SPAN 8    /* AVX-512 prefill: super-blocks per span (KT tokens per tile, RB rows per block: kquant_simd.h) */
#define PF_ROWS 2 /* one-token row gathers: rows requested ahead (1-8 and L2-only hints measured alike) */

typedef struct {
    int type;
    const uint8_t *w;
    int64_t row_bytes, n_sb, n_out, n_tok, rows_per_chunk;
    const int32_t *sel;     /* NULL: output row i is weight row i */
    const float *x;         /* f32 [n_tok, n_sb * 256] */
    block_q8_K *xq;         /* [n_tok, n_sb] */
    float *y;               /* f32 [n_tok, n_out] */
    uint8_t *work;          /* AVX-512 I-quant prefill: one iq_work per thread; AMX: one A area per thread */
    int amx;                /* AMX prefill for this call (matmul_k_amx.h); then decode sums as it does (`full`) */
    const void *amx_x;      /* AMX: the B tiles of the tokens (amx_xsb) */
#if defined(MK_AVX2)
    const k2xt *k2x;        /* AVX2 prefill: per tile of K2_TILE tokens, its n_sb k2xt (k2_fill_tile) */
#endif
} mk_job;

/* ==== activation quantization (llama.cpp quantize_row_q8_K_ref) ======================================= */
static inline int nearest_even(float v) { /* |v| < 2^22: adding 1.5 * 2^23 rounds to an integer, ties to even */
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static void quantize_q8_K(const float *x, block_q8_K *y) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < QK_K; j++) {
        float a = x[j] < 0 ? -x[j] : x[j];
        if (a > amax) { amax = a; m = x[j]; }
    }
    if (amax == 0.0f) {
        memset(y, 0, sizeof(*y));
        return;
    }
    const float iscale = -127.0f / m;
#if defined(MK_AVX512)
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int j = 0; j < QK_K; j += 16) { /* cvtps rounds to nearest even (the default MXCSR mode) */
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), vs));
        v = _mm512_min_epi32(v, _mm512_set1_epi32(127));
        _mm_storeu_si128((__m128i *)(y->qs + j), _mm512_cvtepi32_epi8(v));
    }
#else
    for (int j = 0; j < QK_K; j++) {
        int v = nearest_even(iscale * x[j]);
        y->qs[j] = (int8_t)(v > 127 ? 127 : v);
    }
#endif
    for (int g = 0; g < QK_K / 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += y->qs[16 * g + i];
        y->bsums[g] = (int16_t)s;
    }
    y->d = 1.0f / iscale;
}

static void quantize_token(void *ctx, int64_t t, int thread_id) {
    (void)thread_id;
    const mk_job *j = ctx;
    for (int64_t b = 0; b < j->n_sb; b++) quantize_q8_K(j->x + (t * j->n_sb + b) * QK_K, j->xq + t * j->n_sb + b);
}

/* ==== dot products of one row with one token ========================================================== */
#if defined(MK_AVX512)
INLINE float hsum(__m512 acc, __m256 accm) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps(accm, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
}

INLINE __m512i isum_q45k(const ksb *s, const block_q8_K *x) {
    __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        isum = dot_acc(isum, _mm512_maddubs_epi16(s->z[c], _mm512_load_si512(x->qs + 64 * c)), s->sw[c]);
    return isum;
}

INLINE __m512i isum_q6k(const ksb *s, const block_q8_K *x, __m512i isum) { /* isum: the -32 term */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        isum = dot_acc(isum, _mm512_maddubs_epi16(s->z[k], _mm512_load_si512(x->qs + 64 * k)), s->sw[k]);
    return isum;
}

/* Q2_K / Q3_K: 2 bits of element 128n + 32j + l in bits 2j of qs[32n + l]; one zmm holds j = 2c (low half)
 * and 2c + 1 (high half) of one n, i.e. 64 elements in natural order, groups 8n + 4c .. 8n + 4c + 3 */
INLINE void q2_planes(const uint8_t *qs, __m512i *z0, __m512i *z1) {
    const __m512i c02 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i c46 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
    *z0 = _mm512_and_si512(_mm512_srlv_epi16(q, c02), _mm512_set1_epi8(3)); /* spill across bytes masked off */
    *z1 = _mm512_and_si512(_mm512_srlv_epi16(q, c46), _mm512_set1_epi8(3));
}

/* Groups of 16 (Q2_K, Q3_K): one zmm of 64 unsigned weights times 64 activations -> 16 int32 sums of 4 products,
 * so each 128-bit lane holds one group's 4 partial sums (|sum| <= 4 * 7 * 128: they fit in int16) */
INLINE __m512i dot4(__m512i z, const int8_t *xq) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, _mm512_loadu_si512(xq));
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(z, _mm512_loadu_si512(xq)), _mm512_set1_epi16(1));
#endif
}

/* The 16 int16 scales sc16 spread for scale_groups16 by in-lane byte shuffles: lane i of s0 holds the scales of
 * groups i and 4 + i, of s1 those of groups 8 + i and 12 + i */
INLINE void groups16_scales(__m256i sc16, __m512i *s0, __m512i *s1) {
    const __m512i idx = _mm512_set_epi64(0x0f0e0f0e0f0e0f0e, 0x0706070607060706, 0x0d0c0d0c0d0c0d0c,
                                         0x0504050405040504, 0x0b0a0b0a0b0a0b0a, 0x0302030203020302,
                                         0x0908090809080908, 0x0100010001000100); /* lane i: words i, 4 + i */
    *s0 = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16)), idx);
    *s1 = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm256_extracti128_si256(sc16, 1)), idx);
}

/* The 4 zmm of dot4 sums of one super-block (zmm c: groups 4c + lane) scaled and summed into isum: two zmm
 * packed to int16 (lane i: group 8k + i in words 0..3, 8k + 4 + i in words 4..7), then one pair multiply-add
 * with the matching scale words (groups16_scales) */
INLINE __m512i scale_groups16(__m512i isum, const __m512i *s, __m512i d0, __m512i d1, __m512i d2, __m512i d3) {
    isum = dot_acc(isum, _mm512_packs_epi32(d0, d1), s[0]);
    return dot_acc(isum, _mm512_packs_epi32(d2, d3), s[1]);
}

INLINE void unpack_q23k(const uint8_t *blk, ksb *s, const int q3) {
    if (!q3) {
        const block_q2_K *b = (const block_q2_K *)blk;
        const __m128i sm = _mm_loadu_si128((const __m128i *)b->scales);
        s->m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(15)));
        q2_planes(b->qs, &s->z[0], &s->z[1]);
        q2_planes(b->qs + 32, &s->z[2], &s->z[3]);
        groups16_scales(_mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(15))), &s->sw[0], &s->sw[1]);
        s->d = pi_h2f(b->d);
        s->dmin = pi_h2f(b->dmin);
        return;
    }
    const block_q3_K *b = (const block_q3_K *)blk;
    const __m256i sc = pi_q3k_scales16(b->scales); /* the 16 scales minus 32 */
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->hmask));
    q2_planes(b->qs, &s->z[0], &s->z[1]);
    q2_planes(b->qs + 32, &s->z[2], &s->z[3]);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* bit 2c (low half) or 2c + 1 (high half) of hmask[l] adds 4 */
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                               _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
        s->z[c] = _mm512_mask_add_epi8(s->z[c], _mm512_test_epi8_mask(h, bit), s->z[c], _mm512_set1_epi8(4));
    }
    groups16_scales(sc, &s->sw[0], &s->sw[1]);
    s->m16 = sc;
    s->d = pi_h2f(b->d);
}

INLINE __m512i isum_q23k(const ksb *s, const block_q8_K *x, __m512i isum) { /* isum: 0 or Q3_K's -4 term */
    return scale_groups16(isum, s->sw, dot4(s->z[0], x->qs), dot4(s->z[1], x->qs + 64), dot4(s->z[2], x->qs + 128),
                          dot4(s->z[3], x->qs + 192));
}

/* IQ4_XS: chunk c of 64 weights = sub-blocks 2c (bytes 0..31) and 2c + 1 (32..63); sub-block s is the low
 * nibbles of qs[16s..16s+15] then their high nibbles, so the 128-bit lanes of z take qs[32c..32c+15] low, the
 * same high, qs[32c+16..32c+31] low, the same high */
INLINE void unpack_iq4xs(const uint8_t *blk, ksb *s) {
    const block_iq4_xs *b = (const block_iq4_xs *)blk;
    uint32_t sl;
    memcpy(&sl, b->scales_l, 4);
    const __m128i v = _mm_cvtsi32_si128((int)sl);
    const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(v, _mm_set1_epi8(15)),
                                         _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15))); /* byte s: low 4 bits */
    const __m128i hi = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)b->scales_h),
                                                    _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)), _mm_set1_epi16(3));
    const __m128i sc = _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(lo), _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
    const __m512i s16 = _mm512_zextsi128_si512(sc); /* words 0..7: ls - 32 */
    const __m512i mag = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53,
                                                              69, 89, 113)); /* |pi_iq4nl_values| */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * c)));
        __m512i z = _mm512_shuffle_i64x2(q, q, 0x50); /* lanes 0, 0, 1, 1 */
        z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xff00ff00u, z, 4), _mm512_set1_epi8(0x0f));
        s->neg[c] = _mm512_cmplt_epu8_mask(z, _mm512_set1_epi8(8)); /* levels 0..7 are the negative ones */
        s->z[c] = _mm512_shuffle_epi8(mag, z);
        s->sw[c] = scale_words(s16, 2 * c, 0);
    }
    s->d = pi_h2f(b->d);
}

INLINE __m512i isum_iq4xs(const ksb *s, const block_q8_K *x) {
    __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i xq = _mm512_load_si512(x->qs + 64 * c);
        const __m512i xs = _mm512_mask_sub_epi8(xq, s->neg[c], _mm512_setzero_si512(), xq);
        isum = dot_acc(isum, _mm512_maddubs_epi16(s->z[c], xs), s->sw[c]);
    }
    return isum;
}

INLINE int k_has_min(const int type) { return pi_traits_of(type).has_min; } /* Q4_K, Q5_K, Q2_K */

INLINE void k_unpack(const int type, const uint8_t *blk, ksb *s) {
    if (type == PI_Q4_K || type == PI_Q5_K) unpack_q45k(blk, s, type == PI_Q5_K);
    else if (type == PI_Q6_K) unpack_q6k(blk, s);
    else if (type == PI_IQ4_XS) unpack_iq4xs(blk, s);
    else if (pi_is_iq_type(type)) unpack_iq(type, blk, s);
    else unpack_q23k(blk, s, type == PI_Q3_K);
}

/* Q6_K / Q3_K: -32 (-4) * sum_g s_g * bsum_g, in the low 8 int32 lanes, the start of isum (k_isum) */
INLINE int k_has_offset(const int type) { return type == PI_Q6_K || type == PI_Q3_K; }
INLINE __m256i k_offset(const int type, __m256i sc16, __m256i bsums) {
    return _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), type == PI_Q6_K ? 5 : 2);
}

/* The integer sums of one super-block against one token, 16 int32 lanes, starting from init (zero, or the
 * negated k_offset in the low 8 lanes) */
INLINE __m512i k_isum(const int type, const ksb *s, const block_q8_K *x, __m512i init) {
    if (type == PI_Q4_K || type == PI_Q5_K) return isum_q45k(s, x);
    if (type == PI_Q6_K) return isum_q6k(s, x, init);
    if (type == PI_IQ4_XS || pi_is_iq_type(type)) return isum_iq4xs(s, x);
    return isum_q23k(s, x, init);
}

/* The mins term (k_has_min types): word k of the bsums times its min, pairs summed (8 int32 lanes) */
INLINE __m256i k_imin(const ksb *s, const block_q8_K *x) {
    return _mm256_madd_epi16(_mm256_load_si256((const __m256i *)x->bsums), s->m16);
}

/* One token (decode): acc += isum * (d_x * d); accm += imin * (d_x * dmin). Tiles (k_span) do the same FMAs
 * on the same lanes, the scale products taken from a vector and the mins of two tokens in one zmm. */
INLINE void k_token(const int type, const ksb *s, const block_q8_K *x, __m512 *acc, __m256 *accm) {
    const float dx = x->d;
    __m512i init = _mm512_setzero_si512();
    if (k_has_offset(type))
        init = _mm512_sub_epi32(init, _mm512_zextsi256_si512(
                                          k_offset(type, s->m16, _mm256_load_si256((const __m256i *)x->bsums))));
    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(k_isum(type, s, x, init)), _mm512_set1_ps(dx * s->d), *acc);
    if (k_has_min(type))
        *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k_imin(s, x)), _mm256_set1_ps(dx * s->dmin), *accm);
}

/* What a tile's tokens bring to every row, gathered once per span: per super-block their d (0 past nt) and
 * their bsums, two tokens per zmm (zero past nt) */
typedef struct {
    float dx[SPAN][16];
    __m512i bs[SPAN][KT / 2];
} ktile;

static void ktile_fill(ktile *tl, const block_q8_K *x, int64_t n_sb, int64_t i0, int64_t i1, int nt) {
    for (int64_t i = i0; i < i1; i++) {
        for (int t = 0; t < 16; t++) tl->dx[i - i0][t] = t < nt ? x[t * n_sb + i].d : 0.0f;
        for (int p = 0; p < KT / 2; p++) {
            const __m256i b0 = 2 * p < nt ? _mm256_load_si256((const __m256i *)x[2 * p * n_sb + i].bsums)
                                          : _mm256_setzero_si256();
            const __m256i b1 = 2 * p + 1 < nt ? _mm256_load_si256((const __m256i *)x[(2 * p + 1) * n_sb + i].bsums)
                                              : _mm256_setzero_si256();
            tl->bs[i - i0][p] = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
        }
    }
}

/* Super-blocks i0 .. i1 - 1 of one row against KT tokens (x: token 0's super-blocks, each next token's n_sb
 * later; tl: their d and bsums), continuing the sums in a. Per (row, token) lane the
 * same integers and the same FMAs as k_token: the products d_x * d of all tokens in one multiply, each
 * spread over a token's lanes by one permute; the mins of two tokens in one madd, convert and FMA. Whether a
 * row's super-blocks run in one span or several, each sum sees the same FMAs in the same order. */
INLINE void k_span(const int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb, int64_t i0, int64_t i1,
                   const ktile *tl, kacc *a, const int nt) { /* nt <= KT tokens: KT in full tiles (a constant) */
    const size_t size = pi_block_bytes(type);
    __m512 acc[KT], accm[KT / 2];
    for (int t = 0; t < KT; t++) acc[t] = a->acc[t];
    for (int p = 0; p < KT / 2; p++) accm[p] = a->accm[p];
    for (int64_t i = i0; i < i1; i++) {
        ksb s;
        k_unpack(type, row + i * size, &s);
        const __m512 dxv = _mm512_load_ps(tl->dx[i - i0]);
        const __m512 dd = _mm512_mul_ps(dxv, _mm512_set1_ps(s.d));
#pragma GCC unroll 8
        for (int t = 0; t < KT; t++) {
            if (t >= nt) continue;
            __m512i init = _mm512_setzero_si512();
            if (k_has_offset(type)) { /* two tokens' offsets per madd: the same int32 lanes as k_token's */
                const __m512i o = _mm512_sub_epi32(init, _mm512_slli_epi32(
                    _mm512_madd_epi16(tl->bs[i - i0][t / 2], _mm512_broadcast_i64x4(s.m16)), type == PI_Q6_K ? 5 : 2));
                init = t % 2 ? _mm512_zextsi256_si512(_mm512_extracti64x4_epi64(o, 1))
                             : _mm512_zextsi256_si512(_mm512_castsi512_si256(o));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(k_isum(type, &s, x + t * n_sb + i, init)),
                                     _mm512_permutexvar_ps(_mm512_set1_epi32(t), dd), acc[t]);
        }
        if (k_has_min(type)) {
            const __m512 dm = _mm512_mul_ps(dxv, _mm512_set1_ps(s.dmin));
            const __m512i m2 = _mm512_broadcast_i64x4(s.m16);
            for (int p = 0; p < KT / 2; p++) {
                if (2 * p >= nt) continue;
                const __m512i bs = tl->bs[i - i0][p];
                const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
                accm[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(bs, m2)),
                                          _mm512_permutexvar_ps(idx, dm), accm[p]);
            }
        }
    }
    for (int t = 0; t < KT; t++) a->acc[t] = acc[t];
    for (int p = 0; p < KT / 2; p++) a->accm[p] = accm[p];
}

/* A dense matrix decoded row after row is one sequential stream per thread: each super-block also requests the
 * lines K_PF_DIST bytes further on (the AVX2 loop's k2_dot_stream, measured there; not measured on AVX-512) */
#ifndef K_PF_DIST
#define K_PF_DIST 4096
#endif
INLINE void k_stream_prefetch(const uint8_t *p, const size_t size) {
    for (size_t o = 0; o < size; o += 64) _mm_prefetch((const char *)p + K_PF_DIST + o, _MM_HINT_T0);
}

/* `full` sums (Q4_K, Q5_K, Q6_K): a super-block's isum lanes folded to 8 (low half) and its imin lanes (high
 * half; 0 for Q6_K, whose -32 term starts isum) */
INLINE __m512i k_full_halves(const int type, const ksb *s, const block_q8_K *x) {
    const __m512i v = type == PI_Q6_K
                          ? isum_q6k(s, x, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(k_offset(
                                                     type, s->m16, _mm256_load_si256((const __m256i *)x->bsums)))))
                          : isum_q45k(s, x);
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))),
        type == PI_Q6_K ? _mm256_setzero_si256() : k_imin(s, x), 1);
}
/* d_x * d in the low half, d_x * dmin in the high half (0 for Q6_K) */
INLINE __m512 k_full_scales(const int type, const ksb *s, const block_q8_K *x) {
    (void)type;
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_mul_ps(_mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(s->dm)), _mm512_set1_ps(x->d));
}

/* One row against one token, all its super-blocks: per token the same FMAs as in k_span; stream: prefetch ahead */
INLINE float k_dot_pf(const int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb, const int stream,
                      const int full) {
    const size_t size = pi_block_bytes(type);
    if (full && (type == PI_Q4_K || type == PI_Q5_K || type == PI_Q6_K)) {
        /* the sums of the AMX path (matmul_k_amx.h): each super-block's integers whole, then f32 FMAs in the
         * order of the super-blocks. Lane 0 carries isum and its running sum, lane 8 imin and its: one reduction
         * and one FMA serve both (a lane's convert and FMA are the scalar ones); two super-blocks share the
         * reduction. One row after another in cache (256 rows x 16 super-blocks, one thread), ns per
         * super-block against the plain path's lane-wise sums: Q4_K one reduction each 13.5 vs 11.4, shared and
         * d, dmin kept as a vector (ksb.dm) 11.9 vs 11.5; Q6_K 15.0-15.3 vs 12.3-13.0 (its plain path has no
         * mins to pay, so the reduction weighs more; two isums per reduction did not change that, nor did two
         * dpwssd chains per super-block) */
        __m512 acc = _mm512_setzero_ps();
        int64_t i = 0;
        if (type == PI_Q6_K) /* no mins: two super-blocks' isums share one zmm (lanes 0 and 8) and its reduction */
            for (; i + 1 < n_sb; i += 2) {
                if (stream) k_stream_prefetch(row + i * size, 2 * size);
                ksb s0, s1;
                k_unpack(type, row + i * size, &s0);
                const __m512i v0 = k_full_halves(type, &s0, x + i);
                k_unpack(type, row + (i + 1) * size, &s1);
                const __m512i v1 = k_full_halves(type, &s1, x + i + 1);
                __m512i z = _mm512_inserti64x4(v0, _mm512_castsi512_si256(v1), 1);
                z = _mm512_add_epi32(z, _mm512_shuffle_i32x4(z, z, 0xb1));
                z = _mm512_add_epi32(z, _mm512_shuffle_epi32(z, (_MM_PERM_ENUM)0x4e));
                z = _mm512_add_epi32(z, _mm512_shuffle_epi32(z, (_MM_PERM_ENUM)0xb1));
                const __m512 f = _mm512_cvtepi32_ps(z);
                acc = _mm512_fmadd_ps(f, k_full_scales(type, &s0, x + i), acc);
                acc = _mm512_fmadd_ps(_mm512_shuffle_f32x4(f, f, 0x02), k_full_scales(type, &s1, x + i + 1), acc);
            }
        for (; i + 1 < n_sb; i += 2) {
            if (stream) k_stream_prefetch(row + i * size, 2 * size);
            ksb s0, s1;
            k_unpack(type, row + i * size, &s0);
            const __m512i u0 = k_full_halves(type, &s0, x + i);
            k_unpack(type, row + (i + 1) * size, &s1);
            const __m512i u1 = k_full_halves(type, &s1, x + i + 1);
            /* per 128-bit lane: (u0 e0 + e2, u1 e0 + e2, u0 e1 + e3, u1 e1 + e3), then each one's 4-sum in lanes 0 and 1,
             * then lanes 0 + 1 and 2 + 3 added: isum of i, i + 1 in words 0, 1, imin in 8, 9 */
            __m512i z = _mm512_add_epi32(_mm512_unpacklo_epi32(u0, u1), _mm512_unpackhi_epi32(u0, u1));
            z = _mm512_add_epi32(z, _mm512_shuffle_epi32(z, (_MM_PERM_ENUM)0x4e));
            z = _mm512_add_epi32(z, _mm512_shuffle_i32x4(z, z, 0xb1));
            const __m512 f = _mm512_cvtepi32_ps(z);
            acc = _mm512_fmadd_ps(f, k_full_scales(type, &s0, x + i), acc);
            acc = _mm512_fmadd_ps(_mm512_permute_ps(f, 0x01), k_full_scales(type, &s1, x + i + 1), acc);
        }
        for (; i < n_sb; i++) {
            if (stream) k_stream_prefetch(row + i * size, size);
            ksb s;
            k_unpack(type, row + i * size, &s);
            __m512i z = k_full_halves(type, &s, x + i);
            z = _mm512_add_epi32(z, _mm512_shuffle_i32x4(z, z, 0xb1));
            z = _mm512_add_epi32(z, _mm512_shuffle_epi32(z, (_MM_PERM_ENUM)0x4e));
            z = _mm512_add_epi32(z, _mm512_shuffle_epi32(z, (_MM_PERM_ENUM)0xb1));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(z), k_full_scales(type, &s, x + i), acc);
        }
        return _mm512_cvtss_f32(acc) - _mm512_cvtss_f32(_mm512_shuffle_f32x4(acc, acc, 0x02));
    }
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    int64_t i = 0;
    if (type == PI_IQ1_S || type == PI_IQ1_M) /* two super-blocks unpacked before their dots (see matmul_iq.h) */
        for (; i + 1 < n_sb; i += 2) {
            if (stream) k_stream_prefetch(row + i * size, 2 * size);
            ksb s0, s1;
            k_unpack(type, row + i * size, &s0);
            k_unpack(type, row + (i + 1) * size, &s1);
            k_token(type, &s0, x + i, &acc, &accm);
            k_token(type, &s1, x + i + 1, &acc, &accm);
        }
    for (; i < n_sb; i++) {
        if (stream) k_stream_prefetch(row + i * size, size);
        ksb s;
        k_unpack(type, row + i * size, &s);
        k_token(type, &s, x + i, &acc, &accm);
    }
    return k_has_min(type) ? hsum(acc, accm) : _mm512_reduce_add_ps(acc);
}
INLINE float k_dot(const int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb) {
    return k_dot_pf(type, row, x, n_sb, 0, 0);
}

#define K_SPAN_FN(name, dname, TYPE)                                                                           \
    static void name(const uint8_t *row, const block_q8_K *x, int64_t n_sb, int64_t i0, int64_t i1,           \
                     const ktile *tl, kacc *a, int nt) {                                                      \
        if (nt == KT) k_span(TYPE, row, x, n_sb, i0, i1, tl, a, KT);                                          \
        else k_span(TYPE, row, x, n_sb, i0, i1, tl, a, nt);                                                   \
    }                                                                                                         \
    static float dname(const uint8_t *row, const block_q8_K *x, int64_t n_sb) { return k_dot(TYPE, row, x, n_sb); }
K_SPAN_FN(span_q2k, dot_q2k, PI_Q2_K)
K_SPAN_FN(span_q3k, dot_q3k, PI_Q3_K)
K_SPAN_FN(span_q4k, dot_q4k, PI_Q4_K)
K_SPAN_FN(span_q5k, dot_q5k, PI_Q5_K)
K_SPAN_FN(span_q6k, dot_q6k, PI_Q6_K)
K_SPAN_FN(span_iq4xs, dot_iq4xs, PI_IQ4_XS)
K_SPAN_FN(span_iq2xxs, dot_iq2xxs, PI_IQ2_XXS)
K_SPAN_FN(span_iq2xs, dot_iq2xs, PI_IQ2_XS)
K_SPAN_FN(span_iq2s, dot_iq2s, PI_IQ2_S)
K_SPAN_FN(span_iq3xxs, dot_iq3xxs, PI_IQ3_XXS)
K_SPAN_FN(span_iq3s, dot_iq3s, PI_IQ3_S)
K_SPAN_FN(span_iq1s, dot_iq1s, PI_IQ1_S)
K_SPAN_FN(span_iq1m, dot_iq1m, PI_IQ1_M)

/* A tile: nt <= KT tokens */
static void row_span(int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb, int64_t i0, int64_t i1,
                     const ktile *tl, kacc *a, int nt) {
    switch (type) {
    case PI_Q2_K: span_q2k(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_Q3_K: span_q3k(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_Q5_K: span_q5k(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_Q6_K: span_q6k(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ4_XS: span_iq4xs(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ2_XXS: span_iq2xxs(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ2_XS: span_iq2xs(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ2_S: span_iq2s(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ3_XXS: span_iq3xxs(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ3_S: span_iq3s(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ1_S: span_iq1s(row, x, n_sb, i0, i1, tl, a, nt); return;
    case PI_IQ1_M: span_iq1m(row, x, n_sb, i0, i1, tl, a, nt); return;
    default: span_q4k(row, x, n_sb, i0, i1, tl, a, nt); return;
    }
}

static float dot_row(int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb) {
    switch (type) {
    case PI_Q2_K: return dot_q2k(row, x, n_sb);
    case PI_Q3_K: return dot_q3k(row, x, n_sb);
    case PI_Q5_K: return dot_q5k(row, x, n_sb);
    case PI_Q6_K: return dot_q6k(row, x, n_sb);
    case PI_IQ4_XS: return dot_iq4xs(row, x, n_sb);
    case PI_IQ2_XXS: return dot_iq2xxs(row, x, n_sb);
    case PI_IQ2_XS: return dot_iq2xs(row, x, n_sb);
    case PI_IQ2_S: return dot_iq2s(row, x, n_sb);
    case PI_IQ3_XXS: return dot_iq3xxs(row, x, n_sb);
    case PI_IQ3_S: return dot_iq3s(row, x, n_sb);
    case PI_IQ1_S: return dot_iq1s(row, x, n_sb);
    case PI_IQ1_M: return dot_iq1m(row, x, n_sb);
    default: return dot_q4k(row, x, n_sb);
    }
}

static float kacc_sum(int type, const kacc *a, int t) {
    const __m512 m = a->accm[t / 2];
    const __m256 accm = t % 2 ? _mm512_extractf32x8_ps(m, 1) : _mm512_castps512_ps256(m);
    return k_has_min(type) ? hsum(a->acc[t], accm) : _mm512_reduce_add_ps(a->acc[t]);
}

#else
static float dot_row(int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb) {
#if defined(MK_AVX2)
    switch (type) {
    case PI_Q4_K: return k2_dot(PI_Q4_K, row, x, n_sb);
    case PI_Q5_K: return k2_dot(PI_Q5_K, row, x, n_sb);
    case PI_Q6_K: return k2_dot(PI_Q6_K, row, x, n_sb);
    case PI_Q2_K: return k2_dot(PI_Q2_K, row, x, n_sb);
    case PI_Q3_K: return k2_dot(PI_Q3_K, row, x, n_sb);
    case PI_IQ4_XS: return k2_dot(PI_IQ4_XS, row, x, n_sb);
    case PI_IQ2_XXS: return k2_dot(PI_IQ2_XXS, row, x, n_sb);
    case PI_IQ2_XS: return k2_dot(PI_IQ2_XS, row, x, n_sb);
    case PI_IQ2_S: return k2_dot(PI_IQ2_S, row, x, n_sb);
    case PI_IQ3_XXS: return k2_dot(PI_IQ3_XXS, row, x, n_sb);
    case PI_IQ3_S: return k2_dot(PI_IQ3_S, row, x, n_sb);
    case PI_IQ1_S: return k2_dot(PI_IQ1_S, row, x, n_sb);
    case PI_IQ1_M: return k2_dot(PI_IQ1_M, row, x, n_sb);
    default: break;
    }
#endif
    const int64_t size = pi_row_size(type, QK_K);
    float acc = 0.0f;
    for (int64_t i = 0; i < n_sb; i++, x++) {
        const uint8_t *blk = row + i * size;
        int8_t q[QK_K];
        int32_t isum = 0, imin = 0;
        if (pi_is_iq_type(type)) { /* q = grid * sign, integer scales 2 ls + 1 per group (matmul_iq.c) */
            uint8_t sc[16];
            float d;
            const int g = pi_iq_unpack(type, blk, q, sc, &d);
            for (int s = 0; s < QK_K / g; s++) {
                int32_t t = 0;
                for (int l = 0; l < g; l++) t += q[g * s + l] * x->qs[g * s + l];
                isum += sc[s] * t;
            }
            acc += (x->d * d) * (float)isum;
            continue;
        }
        float dsc[16], dmn[16];
        pi_unpack_qk(type, blk, q, dsc, dmn);
        if (type == PI_Q2_K || type == PI_Q3_K) { /* 16 groups of 16; Q3_K's q already minus 4 */
            int8_t s3[16];
            if (type == PI_Q3_K) pi_q3k_scales(((const block_q3_K *)blk)->scales, s3);
            const block_q2_K *b2 = (const block_q2_K *)blk;
            for (int g = 0; g < 16; g++) {
                int32_t s = 0;
                for (int l = 0; l < 16; l++) s += q[16 * g + l] * x->qs[16 * g + l];
                isum += (type == PI_Q3_K ? s3[g] : b2->scales[g] & 15) * s;
                if (type == PI_Q2_K) imin += (b2->scales[g] >> 4) * x->bsums[g];
            }
            if (type == PI_Q3_K) {
                acc += (x->d * pi_h2f(((const block_q3_K *)blk)->d)) * (float)isum;
                continue;
            }
            acc += (x->d * pi_h2f(b2->d)) * (float)isum - (x->d * pi_h2f(b2->dmin)) * (float)imin;
            continue;
        }
        if (type == PI_IQ4_XS) { /* q the signed levels; 8 sub-blocks of 32, scales ls - 32 */
            const block_iq4_xs *b = (const block_iq4_xs *)blk;
            int8_t ls[8];
            pi_iq4xs_scales(b, ls);
            for (int s = 0; s < 8; s++) {
                int32_t d = 0;
                for (int l = 0; l < 32; l++) d += q[32 * s + l] * x->qs[32 * s + l];
                isum += ls[s] * d;
            }
            acc += (x->d * pi_h2f(b->d)) * (float)isum;
            continue;
        }
        if (type == PI_Q6_K) { /* q already minus 32: the same integer as the -32 * bsums form */
            const block_q6_K *b = (const block_q6_K *)blk;
            for (int g = 0; g < 16; g++) {
                int32_t s = 0;
                for (int l = 0; l < 16; l++) s += q[16 * g + l] * x->qs[16 * g + l];
                isum += b->scales[g] * s;
            }
            acc += (x->d * pi_h2f(b->d)) * (float)isum;
            continue;
        }
        const block_q4_K *b = (const block_q4_K *)blk;
        uint8_t sc[8], mn[8];
        pi_k_scale_min(b->scales, sc, mn);
        for (int s = 0; s < 8; s++) {
            int32_t d = 0;
            for (int l = 0; l < 32; l++) d += q[32 * s + l] * x->qs[32 * s + l];
            isum += sc[s] * d;
            imin += mn[s] * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
        }
        acc += (x->d * pi_h2f(b->d)) * (float)isum - (x->d * pi_h2f(b->dmin)) * (float)imin;
    }
    return acc;
}
#endif

/* ==== driver ========================================================================================== */
/* A row gather one token at a time (decode) reads scattered rows of a few KB: each would start with a cache
 * miss the hardware prefetcher cannot foresee, so the row PF_ROWS ahead is requested whole */
static inline void prefetch_row(const mk_job *j, int64_t i) {
    const uint8_t *p = j->w + i * j->row_bytes;
    for (int64_t o = 0; o < j->row_bytes; o += 64) __builtin_prefetch(p + o);
}

#if defined(MK_AVX512)
/* Rows r_beg .. r_end - 1: blocks of RB rows, each against the tokens KT at a time; within a block the rows'
 * super-blocks go in spans of SPAN, all RB rows per span, so the span's activations (KT x SPAN x 320 bytes,
 * 20 KB) stay in L1 while the rows use them. Tokens left over after the last full tile of KT (and decode)
 * take one row at a time: the same FMAs per (row, token) as in a tile, so the same bits. */
/* Decode (one token): rows r_beg .. r_end - 1, each whole (k_dot), one loop per type so that the type is a
 * constant in the loop (a switch per row let the compiler lay out every type's code in one loop: measured
 * 6-13% slower for Q4_K / Q6_K once the I-quants joined the switch) */
#define K_DECODE_FN(name, TYPE)                                                                                \
    static void name(const mk_job *j, int64_t r_beg, int64_t r_end) {                                         \
        if (!j->sel) {                                                                                        \
            for (int64_t o = r_beg; o < r_end; o++)                                                           \
                j->y[o] = k_dot_pf(TYPE, j->w + o * j->row_bytes, j->xq, j->n_sb, 1, j->amx);                 \
            return;                                                                                           \
        }                                                                                                     \
        for (int64_t o = r_beg; o < r_end; o++) {                                                             \
            if (o + PF_ROWS < r_end) prefetch_row(j, j->sel[o + PF_ROWS]);                                    \
            j->y[o] = k_dot_pf(TYPE, j->w + j->sel[o] * j->row_bytes, j->xq, j->n_sb, 0, j->amx);             \
        }                                                                                                     \
    }
K_DECODE_FN(decode_q2k, PI_Q2_K)
K_DECODE_FN(decode_q3k, PI_Q3_K)
K_DECODE_FN(decode_q4k, PI_Q4_K)
K_DECODE_FN(decode_q5k, PI_Q5_K)
K_DECODE_FN(decode_q6k, PI_Q6_K)
K_DECODE_FN(decode_iq4xs, PI_IQ4_XS)
K_DECODE_FN(decode_iq2xxs, PI_IQ2_XXS)
K_DECODE_FN(decode_iq2xs, PI_IQ2_XS)
K_DECODE_FN(decode_iq2s, PI_IQ2_S)
K_DECODE_FN(decode_iq3xxs, PI_IQ3_XXS)
K_DECODE_FN(decode_iq3s, PI_IQ3_S)
K_DECODE_FN(decode_iq1s, PI_IQ1_S)
K_DECODE_FN(decode_iq1m, PI_IQ1_M)

static void mk_decode(const mk_job *j, int64_t r_beg, int64_t r_end) {
    switch (j->type) {
    case PI_Q2_K: decode_q2k(j, r_beg, r_end); return;
    case PI_Q3_K: decode_q3k(j, r_beg, r_end); return;
    case PI_Q5_K: decode_q5k(j, r_beg, r_end); return;
    case PI_Q6_K: decode_q6k(j, r_beg, r_end); return;
    case PI_IQ4_XS: decode_iq4xs(j, r_beg, r_end); return;
    case PI_IQ2_XXS: decode_iq2xxs(j, r_beg, r_end); return;
    case PI_IQ2_XS: decode_iq2xs(j, r_beg, r_end); return;
    case PI_IQ2_S: decode_iq2s(j, r_beg, r_end); return;
    case PI_IQ3_XXS: decode_iq3xxs(j, r_beg, r_end); return;
    case PI_IQ3_S: decode_iq3s(j, r_beg, r_end); return;
    case PI_IQ1_S: decode_iq1s(j, r_beg, r_end); return;
    case PI_IQ1_M: decode_iq1m(j, r_beg, r_end); return;
    default: decode_q4k(j, r_beg, r_end); return;
    }
}

static void mk_rows(const mk_job *j, int64_t r_beg, int64_t r_end, int thread_id) {
#if defined(MK_AMX)
    if (j->amx && j->n_tok > 1) {
        amx_rows(j->type, j->w, j->row_bytes, j->sel, j->n_sb, j->n_tok, j->amx_x,
                 (amx_wsb *)(j->work + (size_t)thread_id * (size_t)j->n_sb * sizeof(amx_wsb)), j->y, j->n_out, r_beg,
                 r_end);
        return;
    }
#endif
    /* Tiles take every token of a batch, the last one fewer than KT if need be (a mixture-of-experts layer gives
     * each expert a few tokens): measured 3-6 tokens at 4096 x 4096, two threads, one build per process, 1.2-2.3x
     * the one-token path for Q4_K, Q5_K, Q3_K and IQ4_XS, about even for Q2_K, but 0.5-0.9x for Q6_K, whose
     * leftover tokens keep k_dot (as one token, decode, always does) */
    if (j->work && j->n_tok > KT) { /* an expert of a group may have KT tokens or fewer */
        mk_rows_iq(j->type, j->w, j->row_bytes, j->sel, j->xq, j->n_sb, j->n_tok, j->y, j->n_out, r_beg, r_end,
                   (iq_work *)(j->work + (size_t)thread_id * sizeof(iq_work)));
        return;
    }
    if (j->n_tok == 1) {
        mk_decode(j, r_beg, r_end);
        return;
    }
    const int64_t n_sb = j->n_sb, sb_bytes = j->row_bytes / n_sb;
    const int64_t n_tiled = j->type == PI_Q6_K ? j->n_tok / KT * KT : j->n_tok;
    kacc a[RB];
    ktile tl;
    for (int64_t rb = r_beg; rb < r_end; rb += RB) {
        const int64_t nr = r_end - rb < RB ? r_end - rb : RB;
        for (int64_t tb = 0; tb < n_tiled; tb += KT) {
            const int nt = n_tiled - tb < KT ? (int)(n_tiled - tb) : KT;
            const block_q8_K *x = j->xq + tb * n_sb;
            for (int64_t r = 0; r < nr; r++) kacc_zero(&a[r]);
            for (int64_t i0 = 0; i0 < n_sb; i0 += SPAN) {
                const int64_t i1 = i0 + SPAN < n_sb ? i0 + SPAN : n_sb;
                ktile_fill(&tl, x, n_sb, i0, i1, nt);
                if (tb == 0) /* the first tile reads the rows from memory: the next block's span meanwhile */
                    for (int64_t r = rb + RB; r < rb + 2 * RB && r < r_end; r++) {
                        const uint8_t *p = j->w + (j->sel ? j->sel[r] : r) * j->row_bytes + i0 * sb_bytes;
                        for (int64_t o = 0; o < (i1 - i0) * sb_bytes; o += 64)
                            _mm_prefetch((const char *)p + o, _MM_HINT_T0);
                    }
                for (int64_t r = 0; r < nr; r++) {
                    const int64_t o = rb + r;
                    row_span(j->type, j->w + (j->sel ? j->sel[o] : o) * j->row_bytes, x, n_sb, i0, i1, &tl, &a[r], nt);
                }
            }
            for (int64_t r = 0; r < nr; r++)
                for (int u = 0; u < nt; u++) j->y[(tb + u) * j->n_out + rb + r] = kacc_sum(j->type, &a[r], u);
        }
        if (n_tiled == j->n_tok) continue;
        for (int64_t r = 0; r < nr; r++) {
            const int64_t o = rb + r;
            if (j->sel && o + PF_ROWS < r_end) prefetch_row(j, j->sel[o + PF_ROWS]);
            const uint8_t *row = j->w + (j->sel ? j->sel[o] : o) * j->row_bytes;
            for (int64_t t = n_tiled; t < j->n_tok; t++) j->y[t * j->n_out + o] = dot_row(j->type, row, j->xq + t * n_sb, n_sb);
        }
    }
}
/* Bytes of the per-thread I-quant prefill work areas, 0 where mk_rows_iq is not used */
static size_t iq_work_bytes(const pi_pool *pool, int type, int64_t n_tok) {
    return pi_is_iq_type(type) && n_tok > KT ? (size_t)pi_pool_n_threads(pool) * sizeof(iq_work) : 0;
}
#else
static size_t iq_work_bytes(const pi_pool *pool, int type, int64_t n_tok) {
    (void)pool, (void)type, (void)n_tok;
    return 0;
}

#if defined(MK_AVX2)
/* Rows r_beg .. r_end - 1 of an AVX2 type (pi_is_k_type), the type a constant: one token each row whole (k2_dot), more
 * tokens TOK_BLOCK at a time per row, in tiles of K2_TILE (the leftover tile smaller); a tile gives each
 * (row, token) the operations of k2_dot, so the same bits. Each pass over the rows prefetches the row PF_ROWS
 * ahead: the first reads them from memory, a later token block from L3 or memory (the chunk's rows exceed L2).
 * Prefetching in the later passes too, against the first only (haswell build on the Zen 5 host, 2026-12-08,
 * `bench_prefill_ab.py OLD NEW --types Q4_K,Q6_K --shapes 4096x4096,11008x4096,4096x11008 --threads 2 --n-tok
 * 128 --rounds 5`): 0.98-1.09x, the 8-layer Q4_K_M file's prompt (`--model q4_k_m.gguf --pause 0`) 1.00x at 128
 * tokens, 1.035x and 1.016x at 512 (same bits). */
#define K2_ROWS_FN(name, TYPE)                                                                                 \
    static void name(const mk_job *j, int64_t r_beg, int64_t r_end) {                                         \
        if (j->n_tok == 1) {                                                                                  \
            if (!j->sel) {                                                                                    \
                for (int64_t o = r_beg; o < r_end; o++)                                                       \
                    j->y[o] = k2_dot_stream(TYPE, j->w + o * j->row_bytes, j->xq, j->n_sb);                   \
                return;                                                                                       \
            }                                                                                                 \
            for (int64_t o = r_beg; o < r_end; o++) {                                                         \
                if (o + PF_ROWS < r_end) prefetch_row(j, j->sel[o + PF_ROWS]);                                \
                j->y[o] = k2_dot(TYPE, j->w + j->sel[o] * j->row_bytes, j->xq, j->n_sb);                      \
            }                                                                                                 \
            return;                                                                                           \
        }                                                                                                     \
        for (int64_t tb = 0; tb < j->n_tok; tb += TOK_BLOCK) {                                                \
            const int64_t te = tb + TOK_BLOCK < j->n_tok ? tb + TOK_BLOCK : j->n_tok;                         \
            for (int64_t o = r_beg; o < r_end; o++) {                                                         \
                if (o + PF_ROWS < r_end) /* every pass: a later token block finds the rows in L3 at best */    \
                    prefetch_row(j, j->sel ? j->sel[o + PF_ROWS] : o + PF_ROWS);                              \
                const uint8_t *row = j->w + (j->sel ? j->sel[o] : o) * j->row_bytes;                          \
                int64_t t = tb;                                                                               \
                for (; t + K2_TILE <= te; t += K2_TILE) /* nt a constant here: a tile without its checks */    \
                    k2_tile(TYPE, row, j->xq + t * j->n_sb, j->k2x + t / K2_TILE * j->n_sb, j->n_sb,            \
                            j->y + t * j->n_out + o, j->n_out, K2_TILE);                                      \
                if (t < te)                                                                                   \
                    k2_tile(TYPE, row, j->xq + t * j->n_sb, j->k2x + t / K2_TILE * j->n_sb, j->n_sb,            \
                            j->y + t * j->n_out + o, j->n_out, (int)(te - t));                                \
            }                                                                                                 \
        }                                                                                                     \
    }
K2_ROWS_FN(rows2_q4k, PI_Q4_K)
K2_ROWS_FN(rows2_q5k, PI_Q5_K)
K2_ROWS_FN(rows2_q6k, PI_Q6_K)
K2_ROWS_FN(rows2_q2k, PI_Q2_K)
K2_ROWS_FN(rows2_q3k, PI_Q3_K)
K2_ROWS_FN(rows2_iq4xs, PI_IQ4_XS)
K2_ROWS_FN(rows2_iq2xxs, PI_IQ2_XXS)
K2_ROWS_FN(rows2_iq2xs, PI_IQ2_XS)
K2_ROWS_FN(rows2_iq2s, PI_IQ2_S)
K2_ROWS_FN(rows2_iq3xxs, PI_IQ3_XXS)
K2_ROWS_FN(rows2_iq3s, PI_IQ3_S)
K2_ROWS_FN(rows2_iq1s, PI_IQ1_S)
K2_ROWS_FN(rows2_iq1m, PI_IQ1_M)
#endif

static void mk_rows(const mk_job *j, int64_t r_beg, int64_t r_end, int thread_id) {
    (void)thread_id;
#if defined(MK_AVX2)
    switch (j->type) {
    case PI_Q4_K: rows2_q4k(j, r_beg, r_end); return;
    case PI_Q5_K: rows2_q5k(j, r_beg, r_end); return;
    case PI_Q6_K: rows2_q6k(j, r_beg, r_end); return;
    case PI_Q2_K: rows2_q2k(j, r_beg, r_end); return;
    case PI_Q3_K: rows2_q3k(j, r_beg, r_end); return;
    case PI_IQ4_XS: rows2_iq4xs(j, r_beg, r_end); return;
    case PI_IQ2_XXS: rows2_iq2xxs(j, r_beg, r_end); return;
    case PI_IQ2_XS: rows2_iq2xs(j, r_beg, r_end); return;
    case PI_IQ2_S: rows2_iq2s(j, r_beg, r_end); return;
    case PI_IQ3_XXS: rows2_iq3xxs(j, r_beg, r_end); return;
    case PI_IQ3_S: rows2_iq3s(j, r_beg, r_end); return;
    case PI_IQ1_S: rows2_iq1s(j, r_beg, r_end); return;
    case PI_IQ1_M: rows2_iq1m(j, r_beg, r_end); return;
    default: break;
    }
#endif
    for (int64_t tb = 0; tb < j->n_tok; tb += TOK_BLOCK) {
        const int64_t te = tb + TOK_BLOCK < j->n_tok ? tb + TOK_BLOCK : j->n_tok;
        for (int64_t r = r_beg; r < r_end; r++) {
            if (j->sel && r + PF_ROWS < r_end) prefetch_row(j, j->sel[r + PF_ROWS]);
            const uint8_t *row = j->w + (j->sel ? j->sel[r] : r) * j->row_bytes;
            for (int64_t t = tb; t < te; t++) j->y[t * j->n_out + r] = dot_row(j->type, row, j->xq + t * j->n_sb, j->n_sb);
        }
    }
}
#endif

static void mk_chunk(void *ctx, int64_t chunk, int thread_id) {
    const mk_job *j = ctx;
    const int64_t r_beg = chunk * j->rows_per_chunk;
    mk_rows(j, r_beg, r_beg + j->rows_per_chunk < j->n_out ? r_beg + j->rows_per_chunk : j->n_out, thread_id);
}

/* Whether a call takes the AMX prefill (and decode its sums): Q4_K / Q5_K where the build and process have AMX */
static int k_use_amx(int type, int64_t n_tok) {
#if defined(MK_AMX)
    (void)n_tok;
    return amx_type(type) && mk_amx_enabled();
#else
    (void)type, (void)n_tok;
    return 0;
#endif
}

#if defined(MK_AMX)
/* The AMX work area: one A area (amx_wsb per super-block) per thread, then the tokens' B tiles */
static size_t amx_work_bytes(const pi_pool *pool, int64_t n_sb, int64_t n_tiles) {
    return (size_t)pi_pool_n_threads(pool) * (size_t)n_sb * sizeof(amx_wsb) + (size_t)(n_tiles * n_sb) * sizeof(amx_xsb);
}
static amx_xsb *amx_x_area(const pi_pool *pool, uint8_t *work, int64_t n_sb) {
    return (amx_xsb *)(work + (size_t)pi_pool_n_threads(pool) * (size_t)n_sb * sizeof(amx_wsb));
}
typedef struct {
    int type;
    const block_q8_K *xq;
    int64_t n_sb, n_tok;
    const int64_t *tok_off; /* experts: token ranges */
    amx_xsb *out;
} amx_fill_job;
static void amx_fill_tile(void *ctx, int64_t tb, int thread_id) {
    (void)thread_id;
    const amx_fill_job *f = ctx;
    const int64_t t0 = tb * AMX_TOK, nt = f->n_tok - t0 < AMX_TOK ? f->n_tok - t0 : AMX_TOK;
    amx_fill_tokens(f->type, f->xq + t0 * f->n_sb, f->n_sb, nt, f->out + tb * f->n_sb);
}
static int64_t amx_tile_base(const int64_t *tok_off, int64_t e) {
    int64_t n = 0;
    for (int64_t k = 0; k < e; k++) n += amx_tiles(tok_off[k + 1] - tok_off[k]);
    return n;
}
static void amx_fill_expert(void *ctx, int64_t e, int thread_id) {
    (void)thread_id;
    const amx_fill_job *f = ctx;
    const int64_t t0 = f->tok_off[e], n = f->tok_off[e + 1] - t0;
    if (n > 0) amx_fill_tokens(f->type, f->xq + t0 * f->n_sb, f->n_sb, n, f->out + amx_tile_base(f->tok_off, e) * f->n_sb);
}
#else
static size_t amx_work_bytes(const pi_pool *pool, int64_t n_sb, int64_t n_tiles) {
    (void)pool, (void)n_sb, (void)n_tiles;
    return 0;
}
static int64_t amx_tiles(int64_t n_tok) { return n_tok; }
#endif

int pi_k_amx(void) { return k_use_amx(PI_Q4_K, 2); }

/* AVX2 prefill: the k2xt of each tile of K2_TILE tokens, after the quantization (experts: each expert's tokens
 * tiled on their own, expert e's tiles after those of experts 0 .. e - 1) */
#if defined(MK_AVX2)
_Static_assert(TOK_BLOCK % K2_TILE == 0, "the AVX2 prefill tiles start at multiples of K2_TILE");
static int64_t k2_tiles(int64_t n_tok) { return (n_tok + K2_TILE - 1) / K2_TILE; }
static size_t k2_bytes(int64_t n_tiles, int64_t n_sb) { return (size_t)(n_tiles * n_sb) * sizeof(k2xt); }
static int64_t k2_tile_base(const int64_t *tok_off, int64_t e) { /* experts: the first tile of expert e */
    int64_t n = 0;
    for (int64_t k = 0; k < e; k++) n += k2_tiles(tok_off[k + 1] - tok_off[k]);
    return n;
}
typedef struct {
    int type;
    const block_q8_K *xq;
    int64_t n_sb;
    const int64_t *tok_off; /* experts: token ranges; NULL: one range of n_tok */
    int64_t n_tok;
    k2xt *out;
} k2_fill_job;
static void k2_fill_range(const k2_fill_job *f, int64_t t0, int64_t n, k2xt *out) {
    for (int64_t tb = 0; tb < k2_tiles(n); tb++) {
        const int64_t nt = n - tb * K2_TILE < K2_TILE ? n - tb * K2_TILE : K2_TILE;
        k2_fill_tile(f->type, f->xq + (t0 + tb * K2_TILE) * f->n_sb, f->n_sb, (int)nt, out + tb * f->n_sb);
    }
}
static void k2_fill_chunk(void *ctx, int64_t c, int thread_id) { /* c: a tile, or an expert */
    (void)thread_id;
    const k2_fill_job *f = ctx;
    if (!f->tok_off) {
        const int64_t t0 = c * K2_TILE;
        k2_fill_range(f, t0, f->n_tok - t0 < K2_TILE ? f->n_tok - t0 : K2_TILE, f->out + c * f->n_sb);
        return;
    }
    k2_fill_range(f, f->tok_off[c], f->tok_off[c + 1] - f->tok_off[c], f->out + k2_tile_base(f->tok_off, c) * f->n_sb);
}
#else
static size_t k2_bytes(int64_t n_tiles, int64_t n_sb) {
    (void)n_tiles, (void)n_sb;
    return 0;
}
static int64_t k2_tiles(int64_t n_tok) { return n_tok; }
#endif

void pi_matmul_k(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows, int64_t n_rows,
                 const float *x, int64_t n_tok, float *y) {
    if (n_rows <= 0 || n_tok <= 0) return;
    mk_job j = {.type = type, .w = w, .row_bytes = pi_row_size(type, n_cols), .n_sb = n_cols / QK_K,
                .n_out = n_rows, .n_tok = n_tok, .sel = rows, .x = x, .y = y};
    const size_t xq_bytes = ((size_t)(n_tok * j.n_sb) * sizeof(block_q8_K) + 63) & ~(size_t)63;
    j.amx = k_use_amx(type, n_tok);
    const size_t work_bytes = j.amx ? (n_tok > 1 ? amx_work_bytes(pool, j.n_sb, amx_tiles(n_tok)) : 0)
                                    : iq_work_bytes(pool, type, n_tok);
    const size_t k2x_bytes = n_tok > 1 ? k2_bytes(k2_tiles(n_tok), j.n_sb) : 0;
    j.xq = pi_pool_scratch(pool, xq_bytes + work_bytes + k2x_bytes);
    j.work = work_bytes ? (uint8_t *)j.xq + xq_bytes : NULL;
    pi_pool_run(pool, quantize_token, &j, n_tok);
#if defined(MK_AVX2)
    if (k2x_bytes) {
        k2_fill_job f = {.type = type, .xq = j.xq, .n_sb = j.n_sb, .n_tok = n_tok,
                         .out = (k2xt *)((uint8_t *)j.xq + xq_bytes + work_bytes)};
        j.k2x = f.out;
        pi_pool_run(pool, k2_fill_chunk, &f, k2_tiles(n_tok));
    }
#endif
#if defined(MK_AMX)
    if (j.amx && n_tok > 1) {
        amx_fill_job f = {.type = type, .xq = j.xq, .n_sb = j.n_sb, .n_tok = n_tok, .out = amx_x_area(pool, j.work, j.n_sb)};
        j.amx_x = f.out;
        pi_pool_run(pool, amx_fill_tile, &f, amx_tiles(n_tok));
    }
#endif
    const int64_t n_blocks = (n_rows + ROW_BLOCK - 1) / ROW_BLOCK;
    int64_t n_chunks = pi_pool_chunks(pool, n_blocks, 1);
    j.rows_per_chunk = (n_blocks + n_chunks - 1) / n_chunks * ROW_BLOCK;
    n_chunks = (n_rows + j.rows_per_chunk - 1) / j.rows_per_chunk;
    pi_pool_run(pool, mk_chunk, &j, n_chunks);
}

/* ==== expert groups (pi_matmul_experts for the K-quants; see matmul.c) =================================== */
typedef struct {
    mk_job base; /* all tokens; n_out and rows_per_chunk of one expert */
    const int32_t *experts;
    const int64_t *tok_off;
    int64_t chunks_each;
    const void *amx_x; /* AMX: B tiles of all experts, expert e's after those of experts 0 .. e - 1 */
} mk_group_job;

static void mk_group_chunk(void *ctx, int64_t chunk, int thread_id) {
    const mk_group_job *g = ctx;
    const int64_t e = chunk / g->chunks_each, t0 = g->tok_off[e];
    mk_job j = g->base;
    j.n_tok = g->tok_off[e + 1] - t0;
    if (j.n_tok <= 0) return;
    j.w += (int64_t)g->experts[e] * j.n_out * j.row_bytes;
    j.x += t0 * j.n_sb * QK_K;
    j.xq += t0 * j.n_sb;
    j.y += t0 * j.n_out;
#if defined(MK_AMX)
    if (j.amx) j.amx_x = (const amx_xsb *)g->amx_x + amx_tile_base(g->tok_off, e) * j.n_sb;
#endif
#if defined(MK_AVX2)
    if (j.k2x) j.k2x += k2_tile_base(g->tok_off, e) * j.n_sb;
#endif
    mk_chunk(&j, chunk % g->chunks_each, thread_id);
}

void pi_matmul_k_experts(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols,
                         const int32_t *experts, const int64_t *tok_off, int64_t n_group, const float *x, float *y) {
    const int64_t n_tok = tok_off[n_group];
    mk_group_job g = {.base = {.type = type, .w = w, .row_bytes = pi_row_size(type, n_cols), .n_sb = n_cols / QK_K,
                               .n_out = n_rows, .n_tok = n_tok, .x = x, .y = y},
                      .experts = experts, .tok_off = tok_off};
    const size_t xq_bytes = ((size_t)(n_tok * g.base.n_sb) * sizeof(block_q8_K) + 63) & ~(size_t)63;
    g.base.amx = k_use_amx(type, n_tok);
    /* AMX: each expert's tokens get B tiles of their own, at most one partial tile per expert more in all */
    const size_t work_bytes = g.base.amx ? (n_tok > 1 ? amx_work_bytes(pool, g.base.n_sb, amx_tiles(n_tok) + n_group) : 0)
                                         : iq_work_bytes(pool, type, n_tok);
    const size_t k2x_bytes = n_tok > 1 ? k2_bytes(k2_tiles(n_tok) + n_group, g.base.n_sb) : 0;
    g.base.xq = pi_pool_scratch(pool, xq_bytes + work_bytes + k2x_bytes);
    g.base.work = work_bytes ? (uint8_t *)g.base.xq + xq_bytes : NULL;
    pi_pool_run(pool, quantize_token, &g.base, n_tok);
#if defined(MK_AVX2)
    if (k2x_bytes) {
        k2_fill_job f = {.type = type, .xq = g.base.xq, .n_sb = g.base.n_sb, .tok_off = tok_off,
                         .out = (k2xt *)((uint8_t *)g.base.xq + xq_bytes + work_bytes)};
        g.base.k2x = f.out;
        pi_pool_run(pool, k2_fill_chunk, &f, n_group);
    }
#endif
#if defined(MK_AMX)
    if (g.base.amx && n_tok > 1) {
        amx_fill_job f = {.type = type, .xq = g.base.xq, .n_sb = g.base.n_sb, .tok_off = tok_off,
                          .out = amx_x_area(pool, g.base.work, g.base.n_sb)};
        g.amx_x = f.out;
        pi_pool_run(pool, amx_fill_expert, &f, n_group);
    }
#endif
    const int64_t n_blocks = (n_rows + ROW_BLOCK - 1) / ROW_BLOCK;
    const int64_t each = pi_expert_chunks(pool, n_rows, n_group);
    g.base.rows_per_chunk = (n_blocks + each - 1) / each * ROW_BLOCK;
    g.chunks_each = (n_rows + g.base.rows_per_chunk - 1) / g.base.rows_per_chunk;
    pi_pool_run(pool, mk_group_chunk, &g, n_group * g.chunks_each);
}
