/* matmul_k_avx2.h: AVX2 (+ FMA + F16C) dots of Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS and the I-quant rows with Q8_K
 * activations, for matmul_k.c where AVX-512 is missing (see the variants list at the top of matmul_k.c); empty
 * where AVX2, FMA or F16C is missing too (kquant_simd.h: MK_AVX2).
 *
 * A super-block is first unpacked into a k2sb: eight ymm of 32 weights z_k, each byte in the position of the
 * activation byte q_x[32k + l] it multiplies, and eight ymm of scale words sw_k (the scale of each int16 pair
 * sum of maddubs(z_k, q_x)). Then each token runs k2_token on it:
 *   isum  = sum_k madd(maddubs(z_k, x_k), sw_k)                     8 int32 lanes, lane i: bytes 4i..4i+3 of
 *                                                                   every chunk k; x_k = q_x[32k .. 32k + 31]
 *   acc  += cvt(isum) * (d_x * d)                                   one FMA per super-block
 *   accm += cvt(imin) * (d_x * dmin)                                Q4_K, Q5_K, Q2_K: the mins
 *   y     = hsum(acc) - hsum(accm)
 * Per type:
 *   Q4_K/Q5_K: z unsigned 0..31; imin = madd(bsums, mins) (word j with the min of sub-block j / 2), its 8
 *              lanes (lane j: sub-block j) pairwise added into 4 (lane i: sub-blocks 2i, 2i + 1), the upper 4 zero;
 *   Q6_K:      the weights minus 32 kept signed (sg) with z = |q - 32| <= 32; each token's x_k takes sg's signs
 *              (psignb; a zero weight gives 0), so the -32 offset sits in the same lanes as the products;
 *   Q2_K:      z 0..3, imin = madd(bsums, mins) over the 16 groups (8 lanes);
 *   Q3_K:      z 0..7, isum starts from -4 * madd(bsums, scales) (lanes by group pairs);
 *   IQ4_XS:    z = |level| <= 127, x_k with the level's sign (pair sums <= 2 * 127 * 127: no saturation);
 *   I-quants:  (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; matmul_iq.c gives their formula) the same
 *              signed form: z = the unsigned grid value (IQ2 8..43, IQ3 4..62; never 0), sg = +-1 by its sign
 *              bit, sw = 2 ls + 1 per group of 32 or 16, d = d * f. The grid entries (8 bytes for IQ2, 4 for IQ3)
 *              are loaded one by one and composed into vectors, and each sign byte (bit j: value j negative) is
 *              spread over its 8 weights by one byte shuffle, an and and a compare. IQ1_S / IQ1_M: q = 8 grid
 *              + 8 delta (|q| 1, 7 or 9) with d / 8, their grid codes spread to bytes by shifts (k2_iq1_chunk).
 * The lane layouts of the Q4_K/Q5_K mins and of Q6_K's offset (products and offset in one int16 pair sum) were
 * chosen to round like llama.cpp's AVX2 kernels as far as we know them: the integers are exact either way, but
 * Gemma 3 270M's logits moved by ~0.1 between layouts and tests/test_real_model.py's "Water boils at a
 * temperature of" sits on a three-way near-tie of llama.cpp (19.574 / 19.538 / 19.524): with the mins in 8
 * lanes and the offset via bsums we picked its third token.
 * Decode (k2_dot) and a prefill tile (k2_tile) call the same k2_unpack and k2_token, so every (row, token)
 * gets the same float operations in the same order: the same bits whichever path, token count or thread
 * computes it. maddubs cannot saturate (|z| <= 32 except IQ4_XS's <= 127, and |q_x| <= 127: pair sums
 * <= 2 * 127 * 127), and the integer sums are exact, so only the f32 FMAs and the final sums fix the result. */
#ifndef PI_MATMUL_K_AVX2_H
#define PI_MATMUL_K_AVX2_H
#include "kquant_simd.h"
#if defined(MK_AVX2)
#include <immintrin.h>

#define K2_INLINE static inline __attribute__((always_inline))
#ifndef K2_TILE
#define K2_TILE 8 /* prefill: tokens per tile (a super-block is unpacked once per K2_TILE tokens) */
#endif

typedef struct {
    __m256i z[8];  /* weights of activation bytes 32k .. 32k + 31, unsigned */
    __m256i sw[8]; /* the scale of each int16 pair sum of maddubs(z[k], q_x), one per word */
    __m256i m16;   /* the words paired with the 16 bsums: Q4_K/Q5_K the min of sub-block j / 2 for word j; Q2_K the
                      16 mins; Q3_K the 16 signed scales (for the -4 offset term) */
    __m256i sg[8]; /* IQ4_XS, Q6_K: the signed weights (z holds their magnitudes; each token's q_x takes their signs) */
    __m128i mins;  /* Q4_K / Q5_K: word j the min of sub-block j, so dword i pairs sub-blocks 2i and 2i + 1 */
    float d, dmin;
} k2sb;

K2_INLINE int k2_has_min(const int type) { return pi_traits_of(type).has_min; } /* Q4_K, Q5_K, Q2_K */
K2_INLINE int k2_signed(const int type) { return type == PI_IQ4_XS || type == PI_Q6_K || pi_is_iq_type(type); }
K2_INLINE int k2_has_offset(const int type) { return type == PI_Q3_K; }

/* Groups of 16 (Q6_K, Q2_K, Q3_K): chunk k of 32 weights holds groups 2k (low 128-bit lane of the maddubs
 * words) and 2k + 1 (high lane), so sw[k] is scale 2k in the low lane's words and 2k + 1 in the high lane's;
 * sc16: the 16 scales as words */
K2_INLINE void k2_scales16(__m256i sc16, k2sb *s) {
    const __m256i s_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00); /* words 0..7 in both lanes */
    const __m256i s_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11); /* words 8..15 */
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const int i = k % 4;
        s->sw[k] = _mm256_shuffle_epi8(
            k < 4 ? s_lo : s_hi,
            _mm256_setr_epi8(4 * i, 4 * i + 1, 4 * i, 4 * i + 1, 4 * i, 4 * i + 1, 4 * i, 4 * i + 1, 4 * i, 4 * i + 1,
                             4 * i, 4 * i + 1, 4 * i, 4 * i + 1, 4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 2,
                             4 * i + 3, 4 * i + 2, 4 * i + 3, 4 * i + 2, 4 * i + 3, 4 * i + 2, 4 * i + 3, 4 * i + 2,
                             4 * i + 3, 4 * i + 2, 4 * i + 3, 4 * i + 2, 4 * i + 3));
    }
}

/* Q4_K / Q5_K (q5 = 1): sub-block 2c is the low nibbles of qs[32c .. 32c + 31], 2c + 1 their high nibbles */
K2_INLINE void k2_unpack_q45k(const uint8_t *blk, k2sb *s, const int q5) {
    const uint8_t *qs = q5 ? ((const block_q5_K *)blk)->qs : ((const block_q4_K *)blk)->qs;
    /* bytes 0..15: d, dmin (f16), the 12 scale bytes s[0..11]. The 6-bit scales and mins:
     * sc j < 4: s[j] & 63,  sc j >= 4: (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,
     * m  j < 4: s[j + 4] & 63, m j >= 4: (s[j + 4] >> 4) | (s[j] >> 6) << 4.
     * `lo` gathers the byte holding each value's low bits, `hi` the byte holding its top two bits (if any) */
    const __m128i v = _mm_loadu_si128((const __m128i *)blk);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i scm = _mm_or_si128( /* bytes 0..7 the scales, 8..15 the mins */
        _mm_and_si128(_mm_srlv_epi32(lo, _mm_setr_epi32(0, 0, 0, 4)),
                      _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15)),
        _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
    const __m128 dm = _mm_cvtph_ps(v);
    const __m256i scm2 = _mm256_broadcastsi128_si256(scm);
    __m256i qh = _mm256_setzero_si256();
    if (q5) qh = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)blk)->qh);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i z0 = _mm256_and_si256(q, m4), z1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (q5) { /* bit j of qh[l]: the fifth bit of element 32j + l, moved to bit 4 (never across a byte) */
            const int j0 = 2 * c, j1 = 2 * c + 1;
            const __m256i b0 = _mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << j0)));
            const __m256i b1 = _mm256_and_si256(qh, _mm256_set1_epi8((char)(1 << j1)));
            z0 = _mm256_or_si256(z0, j0 <= 4 ? _mm256_slli_epi16(b0, 4 - j0) : _mm256_srli_epi16(b0, j0 - 4));
            z1 = _mm256_or_si256(z1, j1 <= 4 ? _mm256_slli_epi16(b1, 4 - j1) : _mm256_srli_epi16(b1, j1 - 4));
        }
        s->z[2 * c] = z0;
        s->z[2 * c + 1] = z1;
        /* every word: scale byte j zero-extended (a shuffle index with the top bit set gives 0) */
        s->sw[2 * c] = _mm256_shuffle_epi8(scm2, _mm256_set1_epi16((short)(0x8000 | (2 * c))));
        s->sw[2 * c + 1] = _mm256_shuffle_epi8(scm2, _mm256_set1_epi16((short)(0x8000 | (2 * c + 1))));
    }
    const __m128i mn = _mm_srli_si128(scm, 8);
    s->m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
    s->mins = _mm_cvtepu8_epi16(mn);
    s->d = _mm_cvtss_f32(dm);
    s->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dm));
}

/* Q6_K: chunk k = 4h + i (elements 128h + 32i + l, l < 32): ql[64h + 32(i & 1) + l] low (i < 2) or high
 * nibble, plus bits 2i, 2i + 1 of qh[32h + l] as bits 4, 5; its 16 + 16 elements are groups 2k and 2k + 1, so
 * the scale words are sc[2k] in the low 128-bit lane and sc[2k + 1] in the high one */
K2_INLINE void k2_unpack_q6k(const uint8_t *blk, k2sb *s) {
    const block_q6_K *b = (const block_q6_K *)blk;
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        /* bits 2i..2i+1 -> bits 4..5: shifts within words, the spill into the neighbour byte masked off */
        s->z[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        s->z[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        s->z[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
        s->z[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* q - 32 signed, z its magnitude */
        s->sg[k] = _mm256_sub_epi8(s->z[k], _mm256_set1_epi8(32));
        s->z[k] = _mm256_abs_epi8(s->sg[k]);
    }
    k2_scales16(_mm256_cvtepi8_epi16(sc8), s);
    s->m16 = _mm256_setzero_si256();
    s->d = pi_h2f(b->d);
    s->dmin = 0.0f;
}

/* Q2_K / Q3_K: the 2 low bits of element 128n + 32j + l are bits 2j of qs[32n + l] (chunk k = 4n + j); Q3_K
 * adds 4 where bit k of hmask[l] is set; the scales are per group of 16 (k2_scales16) */
K2_INLINE void k2_planes2(const uint8_t *qs, k2sb *s) {
    const __m256i m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
        s->z[4 * n + 0] = _mm256_and_si256(q, m3);
        s->z[4 * n + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
        s->z[4 * n + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
        s->z[4 * n + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
    }
}

K2_INLINE void k2_unpack_q2k(const uint8_t *blk, k2sb *s) {
    const block_q2_K *b = (const block_q2_K *)blk;
    const __m128i sm = _mm_loadu_si128((const __m128i *)b->scales); /* low nibble scale, high nibble min */
    k2_planes2(b->qs, s);
    k2_scales16(_mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(15))), s);
    s->m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(15)));
    s->d = pi_h2f(b->d);
    s->dmin = pi_h2f(b->dmin);
}

K2_INLINE void k2_unpack_q3k(const uint8_t *blk, k2sb *s) {
    const block_q3_K *b = (const block_q3_K *)blk;
    const __m256i sc = pi_q3k_scales16(b->scales);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
    k2_planes2(b->qs, s);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* bit k -> 4: shifts within a byte */
        const __m256i bit = _mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << k)));
        s->z[k] = _mm256_or_si256(s->z[k], k <= 2 ? _mm256_slli_epi16(bit, 2 - k) : _mm256_srli_epi16(bit, k - 2));
    }
    k2_scales16(sc, s);
    s->m16 = sc;
    s->d = pi_h2f(b->d);
    s->dmin = 0.0f;
}

/* IQ4_XS: sub-block j is the low nibbles of qs[16j .. 16j + 15] then their high nibbles; its levels (signed,
 * up to 127 in magnitude) enter maddubs as |t_w| against q_x with t_w's sign: pair sums <= 2 * 127 * 127 */
K2_INLINE void k2_unpack_iq4xs(const uint8_t *blk, k2sb *s) {
    const block_iq4_xs *b = (const block_iq4_xs *)blk;
    uint32_t sl;
    memcpy(&sl, b->scales_l, 4);
    const __m128i v = _mm_cvtsi32_si128((int)sl);
    const __m128i lo = _mm_unpacklo_epi8(_mm_and_si128(v, _mm_set1_epi8(15)),
                                         _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15))); /* byte j: low 4 bits */
    const __m256i h32 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->scales_h),
                                                           _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                         _mm256_set1_epi32(3));
    const __m128i hi = _mm_packus_epi32(_mm256_castsi256_si128(h32), _mm256_extracti128_si256(h32, 1));
    const __m128i sc = _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(lo), _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
    const __m256i sc2 = _mm256_broadcastsi128_si256(sc); /* words 0..7: ls - 32 */
    const __m256i vals = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pi_iq4nl_values));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* sub-blocks 2c (bytes 0..15 of the load) and 2c + 1 (16..31) */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
        const __m256i ql = _mm256_and_si256(q, m4), qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        const __m256i t0 = _mm256_shuffle_epi8(vals, _mm256_permute2x128_si256(ql, qh, 0x20));
        const __m256i t1 = _mm256_shuffle_epi8(vals, _mm256_permute2x128_si256(ql, qh, 0x31));
        s->sg[2 * c] = t0;
        s->sg[2 * c + 1] = t1;
        s->z[2 * c] = _mm256_abs_epi8(t0);
        s->z[2 * c + 1] = _mm256_abs_epi8(t1);
        s->sw[2 * c] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
        s->sw[2 * c + 1] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
    }
    s->d = pi_h2f(b->d);
    s->dmin = 0.0f;
}

/* ---- I-quants ---- */
/* Dword k of 8 dwords of sign bytes (byte b of dword k: the 8 weights 8b .. 8b + 7 of chunk k, bit j: weight
 * 8b + j negative; pi_iq_signs32's output, or IQ2_S / IQ3_S's 32 sign bytes as they are) -> chunk k's 32 sign
 * sources, -1 or +1 per weight */
K2_INLINE __m256i k2_iq_signs_at(__m256i signs8, const int k) {
    const __m256i dw = _mm256_permutevar8x32_epi32(signs8, _mm256_set1_epi32(k));
    const __m256i spread = _mm256_shuffle_epi8(dw, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(1));
}
/* the odd dwords of the 16 at p, in order (IQ2_XXS: each chunk's sign indices and ls) */
K2_INLINE __m256i k2_odd_dwords(const void *p) {
    const __m256 a = _mm256_loadu_ps((const float *)p), b = _mm256_loadu_ps((const float *)p + 8);
    const __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)); /* a1 a3 b1 b3 | a5 a7 b5 b7 */
    return _mm256_permute4x64_epi64(_mm256_castps_si256(o), _MM_SHUFFLE(3, 1, 2, 0));
}
K2_INLINE __m256i k2_grid8(const uint64_t *grid, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_setr_epi64x((long long)grid[i0], (long long)grid[i1], (long long)grid[i2], (long long)grid[i3]);
}
/* chunk k of an IQ3 super-block: the 8 four-value entries idx[0..7] */
K2_INLINE __m256i k2_grid4(const uint32_t *grid, const uint32_t *idx) {
    return _mm256_setr_epi32((int)grid[idx[0]], (int)grid[idx[1]], (int)grid[idx[2]], (int)grid[idx[3]],
                             (int)grid[idx[4]], (int)grid[idx[5]], (int)grid[idx[6]], (int)grid[idx[7]]);
}
K2_INLINE void k2_iq_finish(k2sb *s, float d) {
    s->m16 = _mm256_setzero_si256();
    s->d = d;
    s->dmin = 0.0f;
}

K2_INLINE void k2_unpack_iq2xxs(const uint8_t *blk, k2sb *s) {
    const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
    const __m256i signs8 = pi_iq_signs32(k2_odd_dwords(b->qs)); /* all 8 chunks' sign bytes at once */
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        uint32_t a[2]; /* a[0]: 4 grid indices, a[1]: 4 seven-bit sign indices and ls */
        memcpy(a, b->qs + 4 * k, 8);
        s->z[k] = k2_grid8(pi_iq2xxs_grid, a[0] & 255, (a[0] >> 8) & 255, (a[0] >> 16) & 255, a[0] >> 24);
        s->sg[k] = k2_iq_signs_at(signs8, k);
        s->sw[k] = _mm256_set1_epi16((short)(2 * (a[1] >> 28) + 1));
    }
    k2_iq_finish(s, pi_h2f(b->d) * 0.125f);
}

K2_INLINE void k2_unpack_iq2xs(const uint8_t *blk, k2sb *s) {
    const block_iq2_xs *b = (const block_iq2_xs *)blk;
    /* the 32 sign bytes at once: each word's 7-bit index (bits 9..15) moved to bits 0..6 of its byte of a
     * dword of four (word 2i + 1 to bits 7..13 first, pi_iq_signs32's packing), words 4k .. 4k + 3 as dword k */
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)b->qs), w1 = _mm256_loadu_si256((const __m256i *)b->qs + 1);
    const __m256i i0 = _mm256_srli_epi16(w0, 9), i1 = _mm256_srli_epi16(w1, 9);          /* words: indices */
    const __m256i p0 = _mm256_madd_epi16(i0, _mm256_set1_epi32(0x00800001));             /* dword: i_lo + 128 i_hi */
    const __m256i p1 = _mm256_madd_epi16(i1, _mm256_set1_epi32(0x00800001));
    /* dwords of 14 bits (two indices) -> pairs of them into one dword of four indices: lo | hi << 14 */
    const __m256i q0 = _mm256_or_si256(_mm256_and_si256(p0, _mm256_set1_epi64x(0x3fff)),
                                       _mm256_srli_epi64(p0, 32 - 14));
    const __m256i q1 = _mm256_or_si256(_mm256_and_si256(p1, _mm256_set1_epi64x(0x3fff)),
                                       _mm256_srli_epi64(p1, 32 - 14));
    /* q0: qwords 0..3 = dwords (chunk 0, -, 1, -, 2, -, 3, -) in their low halves; q1 chunks 4..7 */
    const __m256i packed = _mm256_permutevar8x32_epi32(
        _mm256_blend_epi32(q0, _mm256_slli_epi64(q1, 32), 0xaa), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    const __m256i signs8 = pi_iq_signs32(_mm256_and_si256(packed, _mm256_set1_epi32(0x0fffffff)));
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* 9-bit grid index per 8 weights */
        const uint16_t *q = b->qs + 4 * k;
        s->z[k] = k2_grid8(pi_iq2xs_grid, q[0] & 511, q[1] & 511, q[2] & 511, q[3] & 511);
        s->sg[k] = k2_iq_signs_at(signs8, k);
    }
    k2_scales16(pi_iq_scales16(b->scales), s);
    k2_iq_finish(s, pi_h2f(b->d) * 0.125f);
}

K2_INLINE void k2_unpack_iq2s(const uint8_t *blk, k2sb *s) {
    const block_iq2_s *b = (const block_iq2_s *)blk;
    const __m256i signs8 = _mm256_loadu_si256((const __m256i *)b->signs);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* index: qs byte plus two bits of qh[k]; the sign bytes as they are */
        const uint32_t h = b->qh[k];
        s->z[k] = k2_grid8(pi_iq2s_grid, b->qs[4 * k] | (h & 3) << 8, b->qs[4 * k + 1] | (h >> 2 & 3) << 8,
                           b->qs[4 * k + 2] | (h >> 4 & 3) << 8, b->qs[4 * k + 3] | (h >> 6 & 3) << 8);
        s->sg[k] = k2_iq_signs_at(signs8, k);
    }
    k2_scales16(pi_iq_scales16(b->scales), s);
    k2_iq_finish(s, pi_h2f(b->d) * 0.125f);
}

K2_INLINE void k2_unpack_iq3xxs(const uint8_t *blk, k2sb *s) {
    const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
    const __m256i sas = _mm256_loadu_si256((const __m256i *)b->sas), signs8 = pi_iq_signs32(sas);
    uint32_t scale[8]; /* 2 ls + 1, ls the top 4 bits of each chunk's dword */
    _mm256_storeu_si256((__m256i *)scale,
                        _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(sas, 28), 1), _mm256_set1_epi32(1)));
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        uint32_t idx[8];
        for (int i = 0; i < 8; i++) idx[i] = b->qs[8 * k + i];
        s->z[k] = k2_grid4(pi_iq3xxs_grid, idx);
        s->sg[k] = k2_iq_signs_at(signs8, k);
        s->sw[k] = _mm256_set1_epi16((short)scale[k]);
    }
    k2_iq_finish(s, pi_h2f(b->d) * 0.25f);
}

K2_INLINE void k2_unpack_iq3s(const uint8_t *blk, k2sb *s) {
    const block_iq3_s *b = (const block_iq3_s *)blk;
    const __m256i signs8 = _mm256_loadu_si256((const __m256i *)b->signs);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* index: qs byte plus bit i of qh[k]; the sign bytes as they are */
        uint32_t idx[8];
        for (int i = 0; i < 8; i++) idx[i] = b->qs[8 * k + i] | ((uint32_t)(b->qh[k] >> i) & 1) << 8;
        s->z[k] = k2_grid4(pi_iq3s_grid, idx);
        s->sg[k] = k2_iq_signs_at(signs8, k);
        s->sw[k] = _mm256_set1_epi16((short)(2 * ((b->scales[k / 2] >> 4 * (k % 2)) & 15) + 1));
    }
    k2_iq_finish(s, pi_h2f(b->d));
}

/* IQ1_S / IQ1_M: chunk k's 4 groups of 8 weights, group l with 11-bit grid index idx[l] and delta neg[l] (1:
 * -1/8). Each grid code (16 bits, 2 per weight: level 0, 1, 2 = -1, 0, +1) goes as two bytes into two dwords,
 * whose 4 two-bit fields x | x << 6 | x << 12 | x << 18 spread one per byte; a byte shuffle maps them to 8 grid
 * (-8, 0, 8), and + 8 delta (+-1) gives q = 8 grid + 8 delta, |q| = 1, 7 or 9 as the portable unpack's */
K2_INLINE __m256i k2_iq1_chunk(const uint32_t *idx, const int *neg) {
    uint32_t c[4];
    for (int l = 0; l < 4; l++) c[l] = pi_iq1s_grid_code[idx[l]];
    const __m256i x = _mm256_setr_epi32((int)(c[0] & 255), (int)(c[0] >> 8), (int)(c[1] & 255), (int)(c[1] >> 8),
                                        (int)(c[2] & 255), (int)(c[2] >> 8), (int)(c[3] & 255), (int)(c[3] >> 8));
    __m256i f = _mm256_or_si256(x, _mm256_slli_epi32(x, 6));
    f = _mm256_or_si256(f, _mm256_or_si256(_mm256_slli_epi32(x, 12), _mm256_slli_epi32(x, 18)));
    f = _mm256_and_si256(f, _mm256_set1_epi8(3));
    const __m256i grid = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pi_iq1s_grid_levels8)), f);
    const __m256i delta = _mm256_setr_epi64x(neg[0] ? -1 : 0x0101010101010101LL, neg[1] ? -1 : 0x0101010101010101LL,
                                             neg[2] ? -1 : 0x0101010101010101LL, neg[3] ? -1 : 0x0101010101010101LL);
    return _mm256_add_epi8(grid, delta);
}
K2_INLINE void k2_iq1_set(k2sb *s, const int k, __m256i q) {
    s->sg[k] = q;
    s->z[k] = _mm256_abs_epi8(q);
}

K2_INLINE void k2_unpack_iq1s(const uint8_t *blk, k2sb *s) {
    const block_iq1_s *b = (const block_iq1_s *)blk;
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* qh[k]: 3 index bits per group, ls (bits 12..14), the delta's sign (15) */
        const uint32_t h = b->qh[k];
        uint32_t idx[4];
        int neg[4];
        for (int l = 0; l < 4; l++) {
            idx[l] = b->qs[4 * k + l] | ((h >> 3 * l) & 7) << 8;
            neg[l] = (int)(h >> 15);
        }
        k2_iq1_set(s, k, k2_iq1_chunk(idx, neg));
        s->sw[k] = _mm256_set1_epi16((short)(2 * ((h >> 12) & 7) + 1));
    }
    k2_iq_finish(s, pi_h2f(b->d) * 0.125f);
}

K2_INLINE void k2_unpack_iq1m(const uint8_t *blk, k2sb *s) {
    const block_iq1_m *b = (const block_iq1_m *)blk;
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* group i's nibble of qh: 3 index bits, then the delta's sign */
        uint32_t idx[4];
        int neg[4];
        for (int l = 0; l < 4; l++) {
            const int i = 4 * k + l, nib = (b->qh[i / 2] >> 4 * (i % 2)) & 15;
            idx[l] = b->qs[i] | (uint32_t)(nib & 7) << 8;
            neg[l] = nib >> 3;
        }
        k2_iq1_set(s, k, k2_iq1_chunk(idx, neg));
    }
    uint16_t sc[16]; /* 16 groups of 16: three bits each, four per scale word */
    for (int g = 0; g < 16; g++) sc[g] = (uint16_t)(2 * ((b->scales[g / 4] >> 3 * (g % 4)) & 7) + 1);
    k2_scales16(_mm256_loadu_si256((const __m256i *)sc), s);
    k2_iq_finish(s, pi_h2f(pi_iq1m_d(b)) * 0.125f);
}

K2_INLINE void k2_unpack(const int type, const uint8_t *blk, k2sb *s) {
    if (type == PI_Q6_K) k2_unpack_q6k(blk, s);
    else if (type == PI_Q2_K) k2_unpack_q2k(blk, s);
    else if (type == PI_Q3_K) k2_unpack_q3k(blk, s);
    else if (type == PI_IQ4_XS) k2_unpack_iq4xs(blk, s);
    else if (type == PI_IQ2_XXS) k2_unpack_iq2xxs(blk, s);
    else if (type == PI_IQ2_XS) k2_unpack_iq2xs(blk, s);
    else if (type == PI_IQ2_S) k2_unpack_iq2s(blk, s);
    else if (type == PI_IQ3_XXS) k2_unpack_iq3xxs(blk, s);
    else if (type == PI_IQ3_S) k2_unpack_iq3s(blk, s);
    else if (type == PI_IQ1_S) k2_unpack_iq1s(blk, s);
    else if (type == PI_IQ1_M) k2_unpack_iq1m(blk, s);
    else k2_unpack_q45k(blk, s, type == PI_Q5_K);
}

/* One token's isum against one unpacked super-block: 8 int32 lanes */
K2_INLINE __m256i k2_isum(const int type, const k2sb *s, const block_q8_K *x) {
    __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256(); /* two chains (integer sums: exact) */
    if (k2_has_offset(type))
        i0 = _mm256_sub_epi32(
            i0, _mm256_slli_epi32(_mm256_madd_epi16(_mm256_load_si256((const __m256i *)x->bsums), s->m16), 2));
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
        __m256i x0 = _mm256_load_si256((const __m256i *)(x->qs + 32 * k));
        __m256i x1 = _mm256_load_si256((const __m256i *)(x->qs + 32 * k + 32));
        if (k2_signed(type)) x0 = _mm256_sign_epi8(x0, s->sg[k]), x1 = _mm256_sign_epi8(x1, s->sg[k + 1]);
        const __m256i p0 = _mm256_maddubs_epi16(s->z[k], x0);
        const __m256i p1 = _mm256_maddubs_epi16(s->z[k + 1], x1);
        i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(p0, s->sw[k]));
        i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(p1, s->sw[k + 1]));
    }
    return _mm256_add_epi32(i0, i1);
}

/* One token against one unpacked super-block: acc += isum * (d_x * d); accm += imin * (d_x * dmin) */
K2_INLINE void k2_token(const int type, const k2sb *s, const block_q8_K *x, __m256 *acc, __m256 *accm) {
    const float dx = x->d;
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k2_isum(type, s, x)), _mm256_set1_ps(dx * s->d), *acc);
    if (k2_has_min(type)) {
        __m256i imin = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)x->bsums), s->m16);
        if (type != PI_Q2_K) /* lanes 2i, 2i + 1 added: lane i */
            imin = _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_hadd_epi32(_mm256_castsi256_si128(imin),
                                                                               _mm256_extracti128_si256(imin, 1)), 0);
        *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_set1_ps(dx * s->dmin), *accm);
    }
}

K2_INLINE float k2_hsum(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

K2_INLINE float k2_result(const int type, __m256 acc, __m256 accm) {
    return k2_has_min(type) ? k2_hsum(acc) - k2_hsum(accm) : k2_hsum(acc);
}

/* One row against one token (decode, gathers, tokens left over by the tiles) */
K2_INLINE float k2_dot(const int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb) {
    const size_t size = pi_block_bytes(type);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n_sb; i++) {
        k2sb s;
        k2_unpack(type, row + i * size, &s);
        k2_token(type, &s, x + i, &acc, &accm);
    }
    return k2_result(type, acc, accm);
}

/* k2_dot for a row of a dense matrix read row after row (decode): one sequential stream per thread, which the
 * hardware prefetcher alone served at 60-68% of the read probe for Q4_K / Q6_K; each super-block also requests
 * the lines K2_PF_DIST bytes further on (past the row's end: the next rows, as the matrix is contiguous) */
#ifndef K2_PF_DIST
#define K2_PF_DIST 4096
#endif
K2_INLINE float k2_dot_stream(const int type, const uint8_t *row, const block_q8_K *x, int64_t n_sb) {
    const size_t size = pi_block_bytes(type);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n_sb; i++) {
        const uint8_t *p = row + i * size;
        for (size_t o = 0; o < size; o += 64) _mm_prefetch((const char *)p + K2_PF_DIST + o, _MM_HINT_T0);
        k2sb s;
        k2_unpack(type, p, &s);
        k2_token(type, &s, x + i, &acc, &accm);
    }
    return k2_result(type, acc, accm);
}

/* Prefill: what a tile of K2_TILE tokens needs of each super-block, across its tokens (lane t: token t), gathered
 * once per call for all rows (k2_fill_tile), so that a row's super-block spends a few vector operations on all
 * K2_TILE tokens where k2_token spends them per token:
 *   dx:   the tokens' d (0 past the tile's last token); one multiply by the row's d (or dmin) gives all 8
 *         products d_x * d, the same f32 products as k2_token's scalar one, and each FMA reads its token's
 *         product back as a broadcast load (a load port, not a vector-ALU one): every type but Q2_K (Q6_K,
 *         Q3_K, IQ4_XS 1.02-1.14x at 128 tokens, 9 rounds, noisy);
 *   spair (Q4_K / Q5_K): words 2t and 2t + 1 of spair[i] token t's S_2i and S_2i+1, S_j = bsums 2j + 2j + 1 (the
 *         Q8_K sum of sub-block j; |S_j| <= 32 * 127 fits a word), so one madd with the row's mins 2i, 2i + 1
 *         gives all tokens' imin lane i: the integer k2_token's hadd leaves in lane i, so one FMA per lane i
 *         (accm[i], lane t: token t) does what 8 tokens' min FMAs did, lane by lane the same f32 operations.
 * A Q4_K token then costs per super-block 8 maddubs, 8 madd, 8 add, a convert and an FMA, its mins an eighth
 * of a madd, convert and FMA per lane; with k2_token's per-token mins (madd, hadd, insert, convert, multiply,
 * broadcast, FMA) a kernel without the mins ran 1.20-1.27x faster (4096 x 4096 and 11008 x 4096, 128 tokens,
 * one thread, this AVX2 build on a 2-core Intel Xeon), which is what moving them across the tokens recovers. */
_Static_assert(K2_TILE == 8, "k2xt holds one token per ymm lane");
typedef struct {
    __m256i spair[4];
    float dx[K2_TILE];
} k2xt;

/* The k2xt of the nt <= K2_TILE tokens at x (token t's super-blocks n_sb after token t - 1's), all super-blocks */
static inline void k2_fill_tile(const int type, const block_q8_K *x, int64_t n_sb, const int nt, k2xt *out) {
    for (int64_t i = 0; i < n_sb; i++) {
        k2xt *e = out + i;
        int16_t sp[4][2 * K2_TILE];
        for (int t = 0; t < K2_TILE; t++) {
            const block_q8_K *b = t < nt ? x + t * n_sb + i : NULL;
            e->dx[t] = b ? b->d : 0.0f;
            for (int jj = 0; jj < 8; jj++)
                sp[jj / 2][2 * t + jj % 2] =
                    b && (type == PI_Q4_K || type == PI_Q5_K) ? (int16_t)(b->bsums[2 * jj] + b->bsums[2 * jj + 1]) : 0;
        }
        for (int p = 0; p < 4; p++) e->spair[p] = _mm256_loadu_si256((const __m256i *)sp[p]);
    }
}

/* Q6_K prefill with the roles of maddubs' operands swapped: k2_token's lane L of isum is
 *   sum_k sc(k, L) * sum_b w_b * x_b          (w_b = q_b - 32 signed, b: bytes 4L' .. 4L' + 3 of chunk k, L' = L
 *                                               mod 4, sc(k, L) the scale of their group of 16)
 * = sum_k sc(k, L) * sum_b w_b * (x_b + 128)  -  128 * sum_k sc(k, L) * sum_b w_b,
 * the same integer, so the same bits. x_b + 128 is unsigned (0..255: one xor of the sign bit, off the multiply
 * ports), so maddubs takes it as its unsigned operand and the signed weights as they are (pair sums <= 2 * 255 *
 * 32: no saturation), and the second term depends on the row alone: made once per super-block for all tokens.
 * Per token and super-block: 8 maddubs, 8 madd, a convert and an FMA on the multiply ports, where k2_token adds 8
 * psignb to them. */
K2_INLINE void k2_tile_q6k(const uint8_t *row, const block_q8_K *x, const k2xt *xt, int64_t n_sb, float *y,
                           int64_t y_stride, const int nt) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8(1);
    __m256 acc[K2_TILE];
    for (int t = 0; t < K2_TILE; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n_sb; i++) {
        k2sb s;
        k2_unpack_q6k(row + i * sizeof(block_q6_K), &s);
        __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, s.sg[k]), s.sw[k]));
            c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, s.sg[k + 1]), s.sw[k + 1]));
        }
        const __m256i corr = _mm256_slli_epi32(_mm256_add_epi32(c0, c1), 7);
        float dd[K2_TILE] __attribute__((aligned(32)));
        _mm256_store_ps(dd, _mm256_mul_ps(_mm256_load_ps(xt[i].dx), _mm256_set1_ps(s.d)));
#pragma GCC unroll 4
        for (int t = 0; t < K2_TILE; t++) {
            if (t >= nt) break;
            const block_q8_K *b = x + t * n_sb + i;
            __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int k = 0; k < 8; k += 2) {
                const __m256i u0 = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(b->qs + 32 * k)), flip);
                const __m256i u1 = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(b->qs + 32 * k + 32)), flip);
                i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(u0, s.sg[k]), s.sw[k]));
                i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(_mm256_maddubs_epi16(u1, s.sg[k + 1]), s.sw[k + 1]));
            }
            const __m256i isum = _mm256_sub_epi32(_mm256_add_epi32(i0, i1), corr);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(dd + t), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) y[t * y_stride] = k2_hsum(acc[t]);
}

/* One row against nt <= K2_TILE tokens (x: token 0's super-blocks, each next token n_sb later; xt: their k2xt),
 * each super-block unpacked once; y[t * y_stride] gets token t's sum, with the bits of k2_dot */
K2_INLINE void k2_tile(const int type, const uint8_t *row, const block_q8_K *x, const k2xt *xt, int64_t n_sb,
                       float *y, int64_t y_stride, const int nt) {
    if (type == PI_Q6_K) {
        k2_tile_q6k(row, x, xt, n_sb, y, y_stride, nt);
        return;
    }
    const size_t size = pi_block_bytes(type);
    const int q45 = type == PI_Q4_K || type == PI_Q5_K; /* the mins across tokens; Q2_K keeps k2_token whole */
    __m256 acc[K2_TILE], accm[K2_TILE], accq[4];
    for (int t = 0; t < K2_TILE; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int c = 0; c < 4; c++) accq[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n_sb; i++) {
        k2sb s;
        k2_unpack(type, row + i * size, &s);
        if (k2_has_min(type) && !q45) { /* Q2_K */
#pragma GCC unroll 4
            for (int t = 0; t < K2_TILE; t++)
                if (t < nt) k2_token(type, &s, x + t * n_sb + i, &acc[t], &accm[t]);
            continue;
        }
        const k2xt *e = xt + i;
        const __m256 dx = _mm256_load_ps(e->dx);
        float dd[K2_TILE] __attribute__((aligned(32)));
        _mm256_store_ps(dd, _mm256_mul_ps(dx, _mm256_set1_ps(s.d)));
        if (q45) {
            int32_t mp[4] __attribute__((aligned(16)));
            _mm_store_si128((__m128i *)mp, s.mins);
            const __m256 dm = _mm256_mul_ps(dx, _mm256_set1_ps(s.dmin));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                accq[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(e->spair[c], _mm256_set1_epi32(mp[c]))),
                                          dm, accq[c]);
        }
#pragma GCC unroll 4
        for (int t = 0; t < K2_TILE; t++)
            if (t < nt)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k2_isum(type, &s, x + t * n_sb + i)),
                                         _mm256_broadcast_ss(dd + t), acc[t]);
    }
    if (q45) {
        /* k2_hsum of k2_token's accm, [a0, a1, a2, a3, 0, 0, 0, 0]: ((a0 + 0) + (a2 + 0)) + ((a1 + 0) + (a3 + 0)) */
        const __m256 z = _mm256_setzero_ps();
        const __m256 h = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(accq[0], z), _mm256_add_ps(accq[2], z)),
                                       _mm256_add_ps(_mm256_add_ps(accq[1], z), _mm256_add_ps(accq[3], z)));
        float hm[K2_TILE];
        _mm256_storeu_ps(hm, h);
        for (int t = 0; t < nt; t++) y[t * y_stride] = k2_hsum(acc[t]) - hm[t];
        return;
    }
    for (int t = 0; t < nt; t++) y[t * y_stride] = k2_result(type, acc[t], accm[t]);
}

#endif

#endif
