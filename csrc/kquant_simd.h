/* kquant_simd.h: internal (not read by cffi). What matmul_k.c and its fragments share: which SIMD path this
 * build takes (MK_AVX512 or MK_AVX2, else scalar) and, on AVX-512, the pieces that the K-quant kernels
 * (matmul_k.c), the I-quant unpacks (matmul_iq.h) and the I-quant prefill tiles (matmul_iq_tile.h) all use:
 * the unpacked super-block (ksb), a tile's running sums (kacc), the scale of each int16 pair sum (scale_words)
 * and the int16 -> int32 multiply-add (dot_acc), and the Q4_K / Q5_K / Q6_K unpackers (unpack_q45k, unpack_q6k)
 * that the AMX tiles (matmul_k_amx.h) use too. The algorithms and their measurements: matmul_k.c's header. */
#ifndef PI_KQUANT_SIMD_H
#define PI_KQUANT_SIMD_H
#include "quants.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)
#define MK_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MK_AVX2 1 /* Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS and the I-quants: matmul_k_avx2.h */
#endif

#if defined(MK_AVX512)
#define INLINE static inline __attribute__((always_inline))
#ifndef KT
#define KT 8  /* prefill: tokens per tile (a super-block is unpacked once per KT tokens) */
#endif
#define RB 16 /* prefill: rows per block */

INLINE __m512i dot_acc(__m512i acc, __m512i p, __m512i sc) { /* acc += pairs of p * sc (int16 -> int32) */
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, p, sc);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, sc));
#endif
}

/* word w of 64 weights -> the scale of its group: 2 groups of 32 (idx_32) or 4 of 16 (idx_16), base `g` */
INLINE __m512i scale_words(__m512i s16, int g, int per16) {
    const __m512i w = _mm512_setr_epi32(0x00000000, 0x00010001, 0x00020002, 0x00030003, 0x00040004, 0x00050005,
                                        0x00060006, 0x00070007, 0x00080008, 0x00090009, 0x000a000a, 0x000b000b,
                                        0x000c000c, 0x000d000d, 0x000e000e, 0x000f000f); /* word i = i / 2 */
    /* idx(word i) = g + i / 16 (groups of 32) or g + i / 8 (groups of 16) */
    __m512i idx = _mm512_add_epi16(_mm512_srli_epi16(w, per16 ? 2 : 3), _mm512_set1_epi16((short)g));
    return _mm512_permutexvar_epi16(idx, s16);
}

/* One super-block of one row, unpacked once for every token of a tile.
 * A prefill tile is one row against KT tokens: the weights' bit unpacking (nibbles, high bits, 6-bit scales)
 * is the larger part of a super-block's work, so it is done once per KT tokens. Per token only the integer
 * dots, one convert and one FMA (and the mins / bsum term) remain, in the same order for every token count,
 * so a token's result has the same bits whether it was computed alone (decode) or in a tile (prefill). */
typedef struct {
    __m512i z[4];  /* the 256 weights as unsigned bytes, in the order of the activation bytes they multiply */
    __m512i sw[4]; /* Q4_K/Q5_K/Q6_K: the scale of each int16 pair sum of z[c], one per word;
                      Q2_K/Q3_K: sw[0], sw[1] the 16 scales arranged for scale_groups16 */
    __m256i m16;   /* Q4_K/Q5_K/Q2_K: the mins as words, each paired with its bsum; Q6_K/Q3_K: the signed
                      scales (for the -32 / -4 offset term) */
    __mmask64 neg[4]; /* IQ4_XS: the weights of z[c] whose level is negative (z holds magnitudes) */
    float d, dmin;
    __m128 dm;     /* Q4_K/Q5_K: d, dmin in lanes 0, 1; Q6_K: d, 0 (matmul_k.c's `full` sums) */
} ksb;

/* Running sums of one row against KT tokens (a prefill tile), kept in memory between spans of super-blocks:
 * acc[t] token t's; accm[p] the mins of tokens 2p (low 8 lanes) and 2p + 1 (high 8 lanes) */
typedef struct {
    __m512 acc[KT];
    __m512 accm[KT / 2];
} kacc;

static inline void kacc_zero(kacc *a) {
    for (int t = 0; t < KT; t++) a->acc[t] = _mm512_setzero_ps();
    for (int p = 0; p < KT / 2; p++) a->accm[p] = _mm512_setzero_ps();
}

/* The super-block unpackers that the AVX-512 tiles (matmul_k.c) and the AMX tiles (matmul_k_amx.h) share */
/* Q4_K / Q5_K (q5 = 1) */
INLINE void unpack_q45k(const uint8_t *blk, ksb *s, const int q5) {
    const block_q4_K *b = (const block_q4_K *)blk;
    const uint8_t *qs = q5 ? ((const block_q5_K *)b)->qs : b->qs;
    /* the block's first 16 bytes: d, dmin (f16), then the 12 scale bytes s[0..11]; bytes of scm: sc 0..7, m 0..7
     * sc j < 4: s[j] & 63, sc j >= 4: (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,
     * m j < 4: s[j + 4] & 63, m j >= 4: (s[j + 4] >> 4) | (s[j] >> 6) << 4 */
    const __m128i v = _mm_loadu_si128((const __m128i *)blk);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i scm = _mm_or_si128(
        _mm_and_si128(_mm_srlv_epi16(lo, _mm_setr_epi16(0, 0, 0, 0, 0, 0, 4, 4)),
                      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15)),
        _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
    const __m128 dm = _mm_cvtph_ps(v); /* d, dmin */
    const __m512i s16 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(scm)); /* words 0..7 sc, 8..15 m */
    __m256i hb = _mm256_setzero_si256();
    if (q5) hb = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)b)->qh);
    const __m512i h = _mm512_broadcast_i64x4(hb);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* 64 weights: sub-block 2c (low nibbles), 2c + 1 (high nibbles) */
        __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * c)));
        z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xffff0000u, z, 4), _mm512_set1_epi8(0x0f));
        if (q5) {
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                   _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
            z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(h, bit), z, _mm512_set1_epi8(16));
        }
        s->z[c] = z;
        s->sw[c] = scale_words(s16, 2 * c, 0);
    }
    /* mins: word k of the bsums pairs with m_(k / 2) */
    s->m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_srli_si128(scm, 8), _mm_srli_si128(scm, 8)));
    s->d = _mm_cvtss_f32(dm);
    s->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dm));
    s->dm = dm;
}

/* Q6_K: z[2 hf] the 6-bit values of the low nibbles of ql[64 hf ..], z[2 hf + 1] of the high nibbles */
INLINE void unpack_q6k(const uint8_t *blk, ksb *s) {
    const block_q6_K *b = (const block_q6_K *)blk;
    const __m512i c02 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i c46 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    const __m512i s16 = _mm512_zextsi256_si512(sc);
#pragma GCC unroll 2
    for (int hf = 0; hf < 2; hf++) {
        const __m512i l = _mm512_loadu_si512(b->ql + 64 * hf);
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * hf)));
        const __m512i lo = _mm512_and_si512(l, _mm512_set1_epi8(0x0f));
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(l, 4), _mm512_set1_epi8(0x0f));
        /* bits 2i..2i+1 of qh -> bits 4..5 of the byte (shifts within 16-bit words; the mask drops spill) */
        const __m512i h0 = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(h, c02), 4), _mm512_set1_epi8(0x30));
        const __m512i h1 = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(h, c46), 4), _mm512_set1_epi8(0x30));
        s->z[2 * hf] = _mm512_or_si512(lo, h0);
        s->z[2 * hf + 1] = _mm512_or_si512(hi, h1);
        s->sw[2 * hf] = scale_words(s16, 8 * hf, 1);
        s->sw[2 * hf + 1] = scale_words(s16, 8 * hf + 4, 1);
    }
    s->m16 = sc;
    s->d = pi_h2f(b->d);
    s->dm = _mm_set_ss(s->d);
}

#endif

#endif
