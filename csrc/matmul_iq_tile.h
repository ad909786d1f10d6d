/* matmul_iq_tile.h: AVX-512 prefill of the I-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with each
 * super-block unpacked once per IQ_GROUP tiles instead of once per tile, for matmul_k.c's mk_rows (ksb, kacc,
 * dot_acc, kacc_zero: kquant_simd.h; unpack_iq: matmul_iq.h); empty without AVX-512.
 *
 * Why: an I-quant super-block's unpack (grid code lookups by permutes, level expansion, sign masks, scales)
 * costs several times a K-quant's, so in k_span's tiles of KT = 8 tokens it was about as much work as the 8
 * tokens' dots. Here a block of RB rows walks its super-blocks in spans of IQ_SPAN: the span of every row is
 * unpacked once into a scratch of iqsb (RB x IQ_SPAN x 640 bytes, 80 KB: L2), then every tile of KT tokens of
 * a group of up to IQ_GROUP x KT = 64 runs over the scratch, all RB rows per tile, so the tile's activations
 * (KT x IQ_SPAN x 256 bytes) stay in L1 while the rows use them. For Q4_K the same scratch did not pay (its
 * unpack is cheap; matmul_k.c's header).
 * Bits: each (row, token) sum takes the same tiles of KT tokens as mk_rows', the same int32 lanes as
 * isum_iq4xs (iqsb), the same d_x * d product (one multiply, one permute), the same FMAs in super-block order
 * and the same reduction (iq_reduce16); only where the unpacked values live between unpack and use changes.
 * Measured with benchmarks/bench_prefill_ab.py (the builds in separate processes, alternating, 64 tokens, one
 * thread, medians of 3 rounds, a shared noisy host; "bits: same" in every run), step by step:
 *   - the scratch (then of ksb, IQ_SPAN 4): 4096 x 11008 IQ3_S 82.8 -> 110.2 GMAC/s, IQ3_XXS 96.0 -> 111.9;
 *     IQ_SPAN 2 / 8 against 4: 0.93-1.06x / 1.02-1.04x, so 8;
 *   - weights stored signed and activations offset to unsigned once per tile (iqsb: no masked subtract per
 *     token): 0.99-1.04x, kept (even);
 *   - the row's next span prefetched during the unpack (perf: a third of the unpack was waiting on the
 *     weights, whose rows are too far apart for the hardware prefetcher): 1.08-1.10x;
 *   - 16 rows reduced at once (iq_reduce16; kacc_sum was 7% of the time), with the prefetch: 1.17-1.21x at
 *     4096 x 11008 against the step before.
 *   Tried and dropped: prefetching the next tile's activations (0.97-0.99x); offsetting every token's qs once
 *   at quantization into a second buffer that the tiles read in place of the per-tile copy (0.97-0.99x).
 * All steps together (and iq3_values_b's faster unpack), 4096 x 11008, one thread: docs/performance.md, "I-quants".
 */
#ifndef PI_MATMUL_IQ_TILE_H
#define PI_MATMUL_IQ_TILE_H
#include "kquant_simd.h"
#include "matmul_iq.h"
#if defined(MK_AVX512)

#ifndef IQ_SPAN
#define IQ_SPAN 8   /* super-blocks per span */
#endif
#ifndef IQ_GROUP
#define IQ_GROUP 8  /* tiles of KT tokens that share one unpack */
#endif

/* One super-block as the tiles use it: w[c] the 64 signed weights of chunk c (grid value, sign applied), sw[c]
 * the scale of each int16 pair sum, init = -128 * (the lanes' sums of sw * pair sums of w): the tiles feed
 * maddubs the activations offset to unsigned, q_x + 128, so maddubs(q_x + 128, w) = maddubs-pairs of q_x * w
 * plus 128 * (w pair sums) (|pair| <= 2 * 255 * 62: no saturation), and init takes the second term back out
 * lane by lane: every int32 lane ends at exactly isum_iq4xs' integer, with no per-token sign work */
typedef struct {
    __m512i w[4], sw[4], init;
    float d;
} iqsb;

/* One tile (nt <= KT tokens) against the unpacked super-blocks sb[0 .. n - 1] of one row; xu: the tile's
 * activations offset to unsigned, token t's super-block i at xu + 256 (IQ_SPAN t + i); dx[i][t]: token t's d
 * for super-block i (0 past nt) */
INLINE void iq_tile_span(const iqsb *sb, const int n, const uint8_t *xu, float (*dx)[16], kacc *a, const int nt) {
    __m512 acc[KT];
    for (int t = 0; t < KT; t++) acc[t] = a->acc[t];
    for (int i = 0; i < n; i++) {
        const iqsb *s = sb + i;
        const __m512 dd = _mm512_mul_ps(_mm512_load_ps(dx[i]), _mm512_set1_ps(s->d));
#pragma GCC unroll 8
        for (int t = 0; t < KT; t++) {
            if (t >= nt) continue;
            const uint8_t *x = xu + 256 * (IQ_SPAN * t + i);
            __m512i isum = s->init;
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                isum = dot_acc(isum, _mm512_maddubs_epi16(_mm512_load_si512(x + 64 * c), s->w[c]), s->sw[c]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(_mm512_set1_epi32(t), dd), acc[t]);
        }
    }
    for (int t = 0; t < KT; t++) a->acc[t] = acc[t];
}

static void iq_tile_full(const iqsb *sb, int n, const uint8_t *xu, float (*dx)[16], kacc *a) {
    iq_tile_span(sb, n, xu, dx, a, KT);
}

static void iq_tile_part(const iqsb *sb, int n, const uint8_t *xu, float (*dx)[16], kacc *a, int nt) {
    iq_tile_span(sb, n, xu, dx, a, nt);
}

static void iq_unpack_span(const int type, const uint8_t *row, int64_t i0, int n, iqsb *out) {
    const size_t size = pi_block_bytes(type);
    for (int i = 0; i < n; i++) {
        ksb s;
        unpack_iq(type, row + (i0 + i) * size, &s);
        __m512i bias = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i w = _mm512_mask_sub_epi8(s.z[c], s.neg[c], _mm512_setzero_si512(), s.z[c]);
            bias = dot_acc(bias, _mm512_maddubs_epi16(_mm512_set1_epi8((char)0x80), w), s.sw[c]);
            out[i].w[c] = w;
            out[i].sw[c] = s.sw[c];
        }
        out[i].init = _mm512_sub_epi32(_mm512_setzero_si512(), bias);
        out[i].d = s.d;
    }
}

#define IQ_UNPACK_FN(name, TYPE) \
    static void name(const uint8_t *row, int64_t i0, int n, iqsb *out) { iq_unpack_span(TYPE, row, i0, n, out); }
IQ_UNPACK_FN(iq_unpack_iq2xxs, PI_IQ2_XXS)
IQ_UNPACK_FN(iq_unpack_iq2xs, PI_IQ2_XS)
IQ_UNPACK_FN(iq_unpack_iq2s, PI_IQ2_S)
IQ_UNPACK_FN(iq_unpack_iq3xxs, PI_IQ3_XXS)
IQ_UNPACK_FN(iq_unpack_iq3s, PI_IQ3_S)
IQ_UNPACK_FN(iq_unpack_iq1s, PI_IQ1_S)
IQ_UNPACK_FN(iq_unpack_iq1m, PI_IQ1_M)

/* _mm512_reduce_add_ps of 16 vectors at once, with the same additions: GCC's reduction adds the two 256-bit
 * halves, then the two 128-bit halves of that, then elements (0, 2) and (1, 3), then the two results; here each
 * level adds the matching halves of two vectors at a time (shuffles put them side by side), 15 adds and 30
 * shuffles in all instead of 16 x 7 dependent steps. Lane 4j + e of the result is the sum of v[4e + j]. */
INLINE __m512 iq_reduce16(const __m512 *v) {
    __m512 c[8], e[4], h[2];
    for (int m = 0; m < 8; m++) /* 128-bit lanes 0, 1: v[2m]'s 8 sums, lanes 2, 3: v[2m + 1]'s */
        c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0xee));
    for (int k = 0; k < 4; k++) /* lane j: v[4k + j]'s 4 sums */
        e[k] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], 0xdd));
    for (int q = 0; q < 2; q++) /* lane j: elements 0, 1 of v[8q + j], 2, 3 of v[8q + 4 + j] */
        h[q] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * q], e[2 * q + 1], 0x44), _mm512_shuffle_ps(e[2 * q], e[2 * q + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(h[0], h[1], 0x88), _mm512_shuffle_ps(h[0], h[1], 0xdd));
}

/* One thread's working set (~200 KB: too much for every thread's stack, e.g. musl's 128 KB): a slice of the
 * pool's scratch, after the quantized activations (iq_work_bytes). Measured 0.95-0.97x against the same arrays
 * on the stack (bench_prefill_ab.py, IQ3_S / IQ3_XXS, 4096x4096 and 11008x4096, one thread, 5 rounds, three
 * runs; the order of the members and restrict pointers did not change it): the price of not overflowing a
 * small thread stack */
typedef struct {
    uint8_t xu[KT * IQ_SPAN * 256] __attribute__((aligned(64)));
    float dx[IQ_GROUP][IQ_SPAN][16];
    iqsb scr[RB][IQ_SPAN];
    kacc a[RB][IQ_GROUP];
} iq_work;

/* Rows r_beg .. r_end - 1 against all n_tok tokens (n_tok > KT), tiles of KT tokens as in mk_rows */
static void mk_rows_iq(const int type, const uint8_t *w, int64_t row_bytes, const int32_t *sel, const block_q8_K *xq,
                       int64_t n_sb, int64_t n_tok, float *y, int64_t n_out, int64_t r_beg, int64_t r_end, iq_work *wk) {
    void (*unpack)(const uint8_t *, int64_t, int, iqsb *) =
        type == PI_IQ2_XXS ? iq_unpack_iq2xxs : type == PI_IQ2_XS ? iq_unpack_iq2xs : type == PI_IQ2_S ? iq_unpack_iq2s
        : type == PI_IQ3_XXS ? iq_unpack_iq3xxs : type == PI_IQ1_S ? iq_unpack_iq1s : type == PI_IQ1_M ? iq_unpack_iq1m
        : iq_unpack_iq3s;
    const int64_t size = (int64_t)pi_block_bytes(type);
    iqsb (*__restrict scr)[IQ_SPAN] = wk->scr;
    kacc (*__restrict a)[IQ_GROUP] = wk->a;
    float (*__restrict dx)[IQ_SPAN][16] = wk->dx;
    uint8_t *__restrict xu = wk->xu;
    for (int64_t rb = r_beg; rb < r_end; rb += RB) {
        const int64_t nr = r_end - rb < RB ? r_end - rb : RB;
        for (int64_t tg = 0; tg < n_tok; tg += (int64_t)KT * IQ_GROUP) {
            const int64_t ng = n_tok - tg < (int64_t)KT * IQ_GROUP ? n_tok - tg : (int64_t)KT * IQ_GROUP;
            const int n_tiles = (int)((ng + KT - 1) / KT);
            for (int64_t r = 0; r < nr; r++)
                for (int g = 0; g < n_tiles; g++) kacc_zero(&a[r][g]);
            for (int64_t i0 = 0; i0 < n_sb; i0 += IQ_SPAN) {
                const int n = n_sb - i0 < IQ_SPAN ? (int)(n_sb - i0) : IQ_SPAN;
                for (int g = 0; g < n_tiles; g++) {
                    const int64_t t0 = tg + (int64_t)KT * g;
                    for (int i = 0; i < n; i++)
                        for (int t = 0; t < 16; t++) dx[g][i][t] = t0 + t < n_tok && t < KT ? xq[(t0 + t) * n_sb + i0 + i].d : 0.0f;
                }
                for (int64_t r = 0; r < nr; r++) {
                    const int64_t o = rb + r;
                    unpack(w + (sel ? sel[o] : o) * row_bytes, i0, n, scr[r]);
                    /* the row's next span (or, after its last, the same row of the next block and token group)
                     * is requested now, so that it arrives during this span's dots: the rows are too far apart
                     * for the hardware prefetcher, and the misses took a third of the unpack time */
                    const uint8_t *p = NULL;
                    int64_t bytes = 0;
                    if (i0 + n < n_sb) {
                        p = w + (sel ? sel[o] : o) * row_bytes + (i0 + n) * size;
                        bytes = (n_sb - i0 - n < IQ_SPAN ? n_sb - i0 - n : IQ_SPAN) * size;
                    } else if (tg + (int64_t)KT * IQ_GROUP < n_tok || o + RB < r_end) {
                        const int64_t o2 = tg + (int64_t)KT * IQ_GROUP < n_tok ? o : o + RB;
                        p = w + (sel ? sel[o2] : o2) * row_bytes;
                        bytes = (n_sb < IQ_SPAN ? n_sb : IQ_SPAN) * size;
                    }
                    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
                }
                for (int g = 0; g < n_tiles; g++) {
                    const int64_t t0 = tg + (int64_t)KT * g;
                    const int nt = n_tok - t0 < KT ? (int)(n_tok - t0) : KT;
                    for (int t = 0; t < nt; t++)
                        for (int i = 0; i < n; i++)
                            for (int c = 0; c < 4; c++)
                                _mm512_store_si512(xu + 256 * (IQ_SPAN * t + i) + 64 * c, _mm512_xor_si512(
                                    _mm512_load_si512(xq[(t0 + t) * n_sb + i0 + i].qs + 64 * c), _mm512_set1_epi8((char)0x80)));
                    for (int64_t r = 0; r < nr; r++) {
                        if (nt == KT) iq_tile_full(scr[r], n, xu, dx[g], &a[r][g]);
                        else iq_tile_part(scr[r], n, xu, dx[g], &a[r][g], nt);
                    }
                }
            }
            for (int g = 0; g < n_tiles; g++) {
                const int64_t t0 = tg + (int64_t)KT * g;
                const int nt = n_tok - t0 < KT ? (int)(n_tok - t0) : KT;
                for (int u = 0; u < nt; u++) {
                    __m512 v[RB];
                    for (int k = 0; k < RB; k++) { /* k = 4e + j takes row 4j + e: the tree's lanes come out transposed */
                        const int r = 4 * (k % 4) + k / 4;
                        v[k] = r < nr ? a[r][g].acc[u] : _mm512_setzero_ps();
                    }
                    _mm512_mask_storeu_ps(y + (t0 + u) * n_out + rb, (__mmask16)((1u << nr) - 1), iq_reduce16(v));
                }
            }
        }
    }
}

#endif

#endif
