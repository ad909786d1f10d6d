/* kquant_simd.h: internal (not read by cffi). What matmul_k.c and its fragments share: which SIMD path this
 * build takes (MK_AVX512 or MK_AVX2, else scalar) and, on AVX-512, the pieces that the K-quant kernels
 * (matmul_k.c), the I-quant unpacks (matmul_iq.h) and the I-quant prefill tiles (matmul_iq_tile.h) all use:
 * the unpacked super-block (ksb), a tile's running sums (kacc), the scale of each int16 pair sum (scale_words)
 * and the int16 -> int32 multiply-add (dot_acc). The algorithms and their measurements: matmul_k.c's header. */
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

#endif

#endif
