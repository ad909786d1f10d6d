/* matmul_iq.h: AVX-512 unpack of one I-quant super-block (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
 * into a ksb (kquant_simd.h, as are INLINE and scale_words) for matmul_k.c's kernels; empty without AVX-512.
 *
 * As for IQ4_XS ("magnitudes + sign mask"): z[c] holds the 64 weights of chunk c as their unsigned grid values
 * in the activations' order, neg[c] the mask of the negative ones, sw[c] the integer scale 2 ls + 1 of each
 * int16 pair sum, d = d * f; isum_iq4xs then applies the signs to the activations (masked subtract) and
 * computes maddubs(|w|, +-q_x) * scale (pair sums <= 2 * 62 * 127 fit int16).
 * Grid values: a grid has only 3 (IQ2) or 8 (IQ3) levels, so each entry is also a 16- or 12-bit code (iq_grids.h).
 * The codes of 32 entries come from the code table by two-register word permutes (iq_codes); with VBMI one
 * vpmultishiftqb and one vpermb turn codes into level values (otherwise shifts and a byte shuffle), and sign
 * indices become sign bytes by one 128-byte table permute (otherwise pi_iq_signs4's parity trick, vectorized).
 * Measured on this Zen 5 host, one thread, weights hot in L2 (benchmarks/bench_matvec_hot.py, noisy host,
 * +-10%), before iq3_values_b: against loading each 4- or 8-byte grid entry (scalar loads composed into a
 * vector; vpgatherdd / vpgatherdq were a little slower still) IQ3_S 5.5 -> 10.5 GB/s, IQ3_XXS 4.7 -> 12.1, IQ2_XXS 4.7 -> 7.8, IQ2_XS
 * 5.2 -> 8.1, IQ2_S 5.9 -> 6.6 (IQ4_XS 23, Q4_K 25). Writing the sign masks to the stack and loading them into
 * mask registers measured faster than building them in vector registers (permute, shuffle, test: -5 to -15%).
 * IQ3 with VBMI (iq3_values_b): the codes' low and high bytes are two byte tables, looked up for all 64 indices
 * of a super-block by two-register byte permutes (128 entries each), then one byte permute per chunk pairs
 * them up for the multishift: IQ3_S 8 + 6 + 4 instructions where iq_codes took 16 + 14 + 6 and four widenings.
 * Measured (same host and command as above, the old and new builds alternating, two rounds each): IQ3_S 10.6
 * -> 15.2 GB/s, IQ3_XXS 12.1 -> 14.3 (Q4_K 27.8 in the same runs). Not done for IQ2 (not tried): with 32
 * indices per super-block a byte permute would also cover only 64 entries, as a word permute does.
 * Prefill reuses each unpack over 64 tokens (matmul_iq_tile.h).
 * IQ1_S / IQ1_M: weights 8 grid + 8 delta (grid -1 / 0 / 1, delta +-1/8, so |w| = 1, 7 or 9, never 0) as the same
 * magnitudes + sign mask with d / 8: the rest of the path is the other types'. Their 2048-entry grid is too large
 * for permutes, so the 32 codes of a super-block come from 16-bit loads (iq1_codes). Decode is compute-bound:
 * 2.8 GB/s IQ1_S, 3.0 IQ1_M one thread hot (IQ2_XXS 8.5); gathers in place of the loads, or vector delta masks
 * in place of scalar ones, measured the same, which suggests the per-block dependency chain (index -> code ->
 * levels -> dot) as much as the instruction count sets the pace; k_dot unpacks two IQ1 super-blocks before their
 * dots (2.8 -> 3.0 GB/s IQ1_S, 3.0 -> 3.1-3.2 IQ1_M; the same FMAs in the same order, so the same bits).
 */
#ifndef PI_MATMUL_IQ_H
#define PI_MATMUL_IQ_H
#include "kquant_simd.h"
#if defined(MK_AVX512)

/* 8 dwords, each 4 sign indices of 7 bits (bits 0..27) -> 4 sign bytes each (pi_iq_signs4 per lane) */
INLINE __m256i iq_signs32(__m256i a) {
#if defined(__AVX512VBMI__) /* the four 7-bit fields of each dword to its bytes, then the 128-byte table */
    const __m256i k = _mm256_multishift_epi64_epi8(_mm256_set1_epi64x(0x352e2720150e0700ll), a); /* bits 7j (+32) */
    return _mm512_castsi512_si256(_mm512_permutex2var_epi8(_mm512_loadu_si512(pi_iq_ksigns), _mm512_castsi256_si512(k),
                                                           _mm512_loadu_si512(pi_iq_ksigns + 64)));
#else
    return pi_iq_signs32(a);
#endif
}

INLINE void iq_masks(ksb *s, const void *signs) { /* 32 sign bytes, 8 per chunk */
    uint64_t m[4];
    memcpy(m, signs, 32);
    for (int c = 0; c < 4; c++) s->neg[c] = _cvtu64_mask64(m[c]);
}

/* 32 grid indices (words, < 64 * n_pairs) -> their codes (iq_grids.h). The code table sits in n_pairs pairs of
 * zmm (64 words each): one two-register word permute per pair, then a tree of masked moves on index bits
 * 6, 7, ... Cheaper than looking up the 4- or 8-byte entries one by one (scalar loads or gathers) */
INLINE __m512i iq_codes(__m512i idx, const uint16_t *tab, const int n_pairs) {
    __m512i r[16];
    for (int k = 0; k < n_pairs; k++)
        r[k] = _mm512_permutex2var_epi16(_mm512_loadu_si512(tab + 64 * k), idx, _mm512_loadu_si512(tab + 64 * k + 32));
    for (int bit = 6, n = n_pairs; n > 1; bit++, n /= 2) {
        const __mmask32 m = _mm512_test_epi16_mask(idx, _mm512_set1_epi16((short)(1 << bit)));
        for (int k = 0; k < n / 2; k++) r[k] = _mm512_mask_mov_epi16(r[2 * k], m, r[2 * k + 1]);
    }
    return r[0];
}

/* 16 codes (words) -> 64 unsigned values: dword k gets code k's three-bit fields in its 4 bytes, which one
 * byte permute (VBMI: vpmultishiftqb picks the fields, vpermb maps them through the levels repeated) or shifts
 * and one byte shuffle map to the levels; lv: the 8 levels as bytes of one qword */
INLINE __m512i iq3_expand(__m256i codes, uint64_t lv) {
    const __m512i d = _mm512_cvtepu16_epi32(codes);
#if defined(__AVX512VBMI__)
    const __m512i t = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x2926232009060300), d); /* bits 3j (+32) */
    return _mm512_permutexvar_epi8(t, _mm512_set1_epi64((long long)lv)); /* index bits 0..5: level i % 8 */
#else
    __m512i t = _mm512_and_si512(d, _mm512_set1_epi32(7));
    t = _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(d, 5), _mm512_set1_epi32(0x700), 0xf8); /* t | (b & c) */
    t = _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(d, 10), _mm512_set1_epi32(0x70000), 0xf8);
    t = _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(d, 15), _mm512_set1_epi32(0x7000000), 0xf8);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_cvtsi64_si128((long long)lv)), t);
#endif
}

/* z[0..3] from the 64 grid indices of an IQ3 super-block, given as two zmm of 32 words */
INLINE void iq3_values(ksb *s, __m512i i0, __m512i i1, const uint16_t *tab, const uint8_t *lv, const int n_pairs) {
    uint64_t levels;
    memcpy(&levels, lv, 8);
    const __m512i c0 = iq_codes(i0, tab, n_pairs), c1 = iq_codes(i1, tab, n_pairs);
    s->z[0] = iq3_expand(_mm512_castsi512_si256(c0), levels);
    s->z[1] = iq3_expand(_mm512_extracti64x4_epi64(c0, 1), levels);
    s->z[2] = iq3_expand(_mm512_castsi512_si256(c1), levels);
    s->z[3] = iq3_expand(_mm512_extracti64x4_epi64(c1, 1), levels);
}

#if defined(__AVX512VBMI__)
/* VBMI: z[0..3] from the 64 grid indices of an IQ3 super-block, their low 8 bits as the bytes of idx, bit 8 in
 * the mask b8 (IQ3_S; 0 for IQ3_XXS, n_pairs = 2). The codes' low and high bytes (lo, hi: 128 entries per pair
 * of zmm) come by byte permutes of all 64 indices at once, one per pair and byte (index bit 7: vpmovb2m, bit 8:
 * b8, pick the pair by masked moves): 4 + 2 or 8 + 6 instructions where the word permutes of iq_codes took
 * 8 + 6 or 16 + 14 (and 4 or 6 tests). Then per chunk of 16 codes one two-register byte permute puts codes
 * 2q and 2q + 1 (low byte, high byte each) in qword q, vpmultishiftqb picks their eight 3-bit fields, vpermb
 * maps them through the levels: the same z as iq3_values */
INLINE void iq3_values_b(ksb *s, __m512i idx, __mmask64 b8, const uint8_t *lo, const uint8_t *hi, const uint8_t *lv,
                         const int n_pairs) {
    const __mmask64 b7 = _mm512_movepi8_mask(idx);
    __m512i l[4], h[4];
    for (int k = 0; k < n_pairs; k++) {
        l[k] = _mm512_permutex2var_epi8(_mm512_loadu_si512(lo + 128 * k), idx, _mm512_loadu_si512(lo + 128 * k + 64));
        h[k] = _mm512_permutex2var_epi8(_mm512_loadu_si512(hi + 128 * k), idx, _mm512_loadu_si512(hi + 128 * k + 64));
    }
    __m512i cl = _mm512_mask_mov_epi8(l[0], b7, l[1]), ch = _mm512_mask_mov_epi8(h[0], b7, h[1]);
    if (n_pairs == 4) {
        cl = _mm512_mask_mov_epi8(cl, b8, _mm512_mask_mov_epi8(l[2], b7, l[3]));
        ch = _mm512_mask_mov_epi8(ch, b8, _mm512_mask_mov_epi8(h[2], b7, h[3]));
    }
    uint64_t levels;
    memcpy(&levels, lv, 8);
    const __m512i lvv = _mm512_set1_epi64((long long)levels);
    /* chunk 0: qword q = bytes lo[2q], hi[2q], lo[2q + 1], hi[2q + 1] (hi: operand 2, indices 64..), then unused */
    const __m512i pick = _mm512_set_epi64(0x4f0f4e0e, 0x4d0d4c0c, 0x4b0b4a0a, 0x49094808, 0x47074606, 0x45054404,
                                          0x43034202, 0x41014000);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i p = _mm512_add_epi8(pick, _mm512_set1_epi8((char)(16 * c))); /* codes 16c + 2q, + 1 */
        const __m512i q = _mm512_permutex2var_epi8(cl, p, ch);
        const __m512i t = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x1916131009060300ll), q); /* bits 3j, 16 + 3j */
        s->z[c] = _mm512_permutexvar_epi8(t, lvv);
    }
}
#endif

/* IQ2: the 32 codes of a super-block (words, 2 bits per value) -> z[0..3], z[c] from codes 8c .. 8c + 7. VBMI:
 * qword k = code k, vpmultishiftqb puts value j's field in byte j, vpermb maps it through the levels repeated.
 * Otherwise word w of z[c] takes code 8c + w / 4 (one word permute) shifted right by 4 (w % 4) (one variable
 * shift), so that its two bytes get values 2 (w % 4) and 2 (w % 4) + 1, which one byte shuffle maps to the levels */
INLINE void iq2_expand(ksb *s, const __m512i codes, const uint8_t *lv) {
#if defined(__AVX512VBMI__)
    uint32_t l4;
    memcpy(&l4, lv, 4);
    const __m512i levels = _mm512_set1_epi32((int)l4);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(codes, c));
        s->z[c] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0e0c0a0806040200), q), levels);
    }
#else
    static const uint16_t quarter[32] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                         4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
    static const uint16_t shift[32] = {0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12,
                                       0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12};
    const __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lv));
    const __m512i q = _mm512_loadu_si512(quarter), sh = _mm512_loadu_si512(shift);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i u = _mm512_srlv_epi16(_mm512_permutexvar_epi16(_mm512_add_epi16(q, _mm512_set1_epi16((short)(8 * c))),
                                                                     codes), sh);
        const __m512i t = _mm512_ternarylogic_epi32(_mm512_and_si512(u, _mm512_set1_epi16(3)), _mm512_slli_epi16(u, 6),
                                                    _mm512_set1_epi16(0x300), 0xf8); /* a | (b & c) */
        s->z[c] = _mm512_shuffle_epi8(levels, t);
    }
#endif
}

INLINE void iq2_values(ksb *s, __m512i idx, const uint16_t *tab, const uint8_t *lv, const int n_pairs) {
    iq2_expand(s, iq_codes(idx, tab, n_pairs), lv);
}

/* IQ1_S / IQ1_M: 32 grid indices (words < 2048) -> their 2-bit codes (words). The 2048-entry table is too large
 * for register permutes; one 16-bit load per index (as llama.cpp loads its 8-byte entries). Measured against two
 * dword gathers of the table (scale 2; why it has 2 bytes of padding): the same 2.8 GB/s (IQ1_S, one thread, hot,
 * bench_matvec_hot.py on this Zen 5 host); loads kept, gathers are slower on several older cores */
INLINE __m512i iq1_codes(__m512i idx) {
    uint16_t ix[32];
    uint64_t c[8];
    _mm512_storeu_si512(ix, idx);
    for (int k = 0; k < 8; k++)
        c[k] = (uint64_t)pi_iq1s_grid_code[ix[4 * k]] | (uint64_t)pi_iq1s_grid_code[ix[4 * k + 1]] << 16
             | (uint64_t)pi_iq1s_grid_code[ix[4 * k + 2]] << 32 | (uint64_t)pi_iq1s_grid_code[ix[4 * k + 3]] << 48;
    return _mm512_loadu_si512(c);
}

/* IQ1: the 32 indices -> z[c] = |8 grid + 8 delta|, neg[c] its sign; dn[c]: the weights of chunk c whose delta is
 * -1/8 (8 grid comes from the levels times 8; 8 grid +- 1 is never 0, so every weight has a definite sign) */
INLINE void iq1_values(ksb *s, __m512i idx, const __mmask64 *dn) {
    iq2_expand(s, iq1_codes(idx), (const uint8_t *)pi_iq1s_grid_levels8);
    const __m512i one = _mm512_set1_epi8(1);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i w = _mm512_mask_sub_epi8(_mm512_add_epi8(s->z[c], one), dn[c], s->z[c], one);
        s->neg[c] = _mm512_movepi8_mask(w);
        s->z[c] = _mm512_abs_epi8(w);
    }
}

static const uint16_t iq1_quarter[32] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                         4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
static const uint16_t iq1_shift3[32] = {0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9,
                                        0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9};

INLINE void unpack_iq1s(const uint8_t *blk, ksb *s) {
    const block_iq1_s *b = (const block_iq1_s *)blk;
    const __m128i qh = _mm_loadu_si128((const __m128i *)b->qh); /* sub-block k: word k */
    /* index of group i: qs[i] | bits 3 (i % 4) .. of qh[i / 4] << 8 */
    const __m512i h = _mm512_srlv_epi16(_mm512_permutexvar_epi16(_mm512_loadu_si512(iq1_quarter), _mm512_zextsi128_si512(qh)),
                                        _mm512_loadu_si512(iq1_shift3));
    const __m512i idx = _mm512_ternarylogic_epi32(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b->qs)),
                                                  _mm512_slli_epi16(h, 8), _mm512_set1_epi16(0x700), 0xf8);
    /* delta signs: bit 15 of qh[k] for the 32 weights of sub-block k; chunk c = sub-blocks 2c (128-bit lanes 0, 1)
     * and 2c + 1 (lanes 2, 3): each lane's bytes all take the high byte of its word, whose bit 7 vpmovb2m reads */
    const __m512i qb = _mm512_broadcast_i32x4(qh);
    const __m512i hib = _mm512_set_epi32(0x03030303, 0x03030303, 0x03030303, 0x03030303, 0x03030303, 0x03030303,
                                         0x03030303, 0x03030303, 0x01010101, 0x01010101, 0x01010101, 0x01010101,
                                         0x01010101, 0x01010101, 0x01010101, 0x01010101);
    __mmask64 dn[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        dn[c] = _mm512_movepi8_mask(_mm512_shuffle_epi8(qb, _mm512_add_epi8(hib, _mm512_set1_epi8((char)(4 * c)))));
    iq1_values(s, idx, dn);
    const __m128i ls = _mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7));
    const __m512i s16 = _mm512_zextsi128_si512(_mm_add_epi16(_mm_add_epi16(ls, ls), _mm_set1_epi16(1)));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 2 * c, 0);
    s->d = pi_h2f(b->d) * 0.125f;
}

INLINE void unpack_iq1m(const uint8_t *blk, ksb *s) {
    const block_iq1_m *b = (const block_iq1_m *)blk;
    static const uint16_t half[32] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7,
                                      8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
    static const uint16_t shift4[32] = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4,
                                        0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};
    const __m128i qh = _mm_loadu_si128((const __m128i *)b->qh); /* group i: nibble i % 2 of byte i / 2 */
    const __m512i h = _mm512_srlv_epi16(_mm512_permutexvar_epi16(_mm512_loadu_si512(half),
                                                                 _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(qh))),
                                        _mm512_loadu_si512(shift4));
    const __m512i idx = _mm512_ternarylogic_epi32(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b->qs)),
                                                  _mm512_slli_epi16(h, 8), _mm512_set1_epi16(0x700), 0xf8);
    /* delta signs: 128-bit lane L of chunk c = groups 8c + 2L (bytes 0..7: bit 3 of qh[4c + L]) and 8c + 2L + 1
     * (bytes 8..15: bit 7) */
    const __m512i qb = _mm512_broadcast_i32x4(qh);
    const __m512i lane = _mm512_set_epi32(0x03030303, 0x03030303, 0x03030303, 0x03030303, 0x02020202, 0x02020202,
                                          0x02020202, 0x02020202, 0x01010101, 0x01010101, 0x01010101, 0x01010101,
                                          0, 0, 0, 0);
    const __m512i bit = _mm512_set4_epi32((int)0x80808080, (int)0x80808080, 0x08080808, 0x08080808);
    __mmask64 dn[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        dn[c] = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qb, _mm512_add_epi8(lane, _mm512_set1_epi8((char)(4 * c)))), bit);
    iq1_values(s, idx, dn);
    /* scale of group g of 16: bits 3 (g % 4) .. of word g / 4 */
    const __m256i sc = _mm256_permutexvar_epi16(_mm256_loadu_si256((const __m256i *)iq1_quarter),
                                                _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)b->scales)));
    const __m256i ls = _mm256_and_si256(_mm256_srlv_epi16(sc, _mm256_loadu_si256((const __m256i *)iq1_shift3)),
                                        _mm256_set1_epi16(7));
    const __m512i s16 = _mm512_zextsi256_si512(_mm256_add_epi16(_mm256_add_epi16(ls, ls), _mm256_set1_epi16(1)));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 4 * c, 1);
    s->d = pi_h2f(pi_iq1m_d(b)) * 0.125f;
}

INLINE void unpack_iq2xxs(const uint8_t *blk, ksb *s) {
    const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
    const __m512i raw = _mm512_loadu_si512(b->qs); /* qword k: sub-block k's 4 grid indices, then its a */
    const __m128i ls = _mm512_cvtepi64_epi16(_mm512_srli_epi64(raw, 60));
    const __m512i s16 = _mm512_zextsi128_si512(_mm_add_epi16(_mm_add_epi16(ls, ls), _mm_set1_epi16(1)));
    uint8_t sg[32];
    _mm256_storeu_si256((__m256i *)sg, iq_signs32(_mm512_cvtepi64_epi32(_mm512_srli_epi64(raw, 32))));
    iq_masks(s, sg);
    iq2_values(s, _mm512_cvtepu8_epi16(_mm512_cvtepi64_epi32(raw)), pi_iq2xxs_grid_code, pi_iq2xxs_grid_levels, 4);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 2 * c, 0);
    s->d = pi_h2f(b->d) * 0.125f;
}

INLINE void unpack_iq2xs(const uint8_t *blk, ksb *s) {
    const block_iq2_xs *b = (const block_iq2_xs *)blk;
    const __m512i w = _mm512_loadu_si512(b->qs); /* 32 words: grid index (9 bits) | sign index << 9 */
    const __m512i k = _mm512_srli_epi16(w, 9);
#if defined(__AVX512VBMI__) /* every byte through the 128-byte table (the high bytes, 0, are dropped below) */
    const __m512i sb = _mm512_permutex2var_epi8(_mm512_loadu_si512(pi_iq_ksigns), k, _mm512_loadu_si512(pi_iq_ksigns + 64));
#else
    __m512i p = _mm512_xor_si512(k, _mm512_srli_epi16(k, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 1));
    const __m512i sb = _mm512_or_si512(k, _mm512_slli_epi16(_mm512_and_si512(p, _mm512_set1_epi16(1)), 7));
#endif
    uint8_t sg[32];
    _mm256_storeu_si256((__m256i *)sg, _mm512_cvtepi16_epi8(sb));
    iq_masks(s, sg);
    iq2_values(s, _mm512_and_si512(w, _mm512_set1_epi16(511)), pi_iq2xs_grid_code, pi_iq2xs_grid_levels, 8);
    const __m512i s16 = _mm512_zextsi256_si512(pi_iq_scales16(b->scales));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 4 * c, 1);
    s->d = pi_h2f(b->d) * 0.125f;
}

INLINE void unpack_iq2s(const uint8_t *blk, ksb *s) {
    const block_iq2_s *b = (const block_iq2_s *)blk;
    static const uint16_t quarter[32] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                         4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
    static const uint16_t twice[32] = {0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6,
                                       0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6};
    iq_masks(s, b->signs);
    /* index i = qs[i] | bits 2 (i % 4) .. of qh[i / 4] << 8: qh[i / 4] to word i, shifted by 2 (i % 4) */
    const __m512i qh = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)b->qh)));
    const __m512i hi = _mm512_srlv_epi16(_mm512_permutexvar_epi16(_mm512_loadu_si512(quarter), qh), _mm512_loadu_si512(twice));
    const __m512i idx = _mm512_ternarylogic_epi32(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b->qs)),
                                                  _mm512_slli_epi16(hi, 8), _mm512_set1_epi16(0x300), 0xf8);
    iq2_values(s, idx, pi_iq2s_grid_code, pi_iq2s_grid_levels, 16);
    const __m512i s16 = _mm512_zextsi256_si512(pi_iq_scales16(b->scales));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 4 * c, 1);
    s->d = pi_h2f(b->d) * 0.125f;
}

INLINE void unpack_iq3xxs(const uint8_t *blk, ksb *s) {
    const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
    const __m256i a = _mm256_loadu_si256((const __m256i *)b->sas); /* sub-block k: 4 sign indices, ls */
    const __m256i ls = _mm256_srli_epi32(a, 28);
    const __m512i s16 = _mm512_zextsi128_si512(
        _mm256_cvtepi32_epi16(_mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1))));
    uint8_t sg[32];
    _mm256_storeu_si256((__m256i *)sg, iq_signs32(a));
    iq_masks(s, sg);
#if defined(__AVX512VBMI__)
    iq3_values_b(s, _mm512_loadu_si512(b->qs), 0, pi_iq3xxs_grid_code_lo, pi_iq3xxs_grid_code_hi, pi_iq3xxs_grid_levels, 2);
#else
    const __m512i i0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b->qs));
    const __m512i i1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b->qs + 32)));
    iq3_values(s, i0, i1, pi_iq3xxs_grid_code, pi_iq3xxs_grid_levels, 4);
#endif
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 2 * c, 0);
    s->d = pi_h2f(b->d) * 0.25f;
}

INLINE void unpack_iq3s(const uint8_t *blk, ksb *s) {
    const block_iq3_s *b = (const block_iq3_s *)blk;
    iq_masks(s, b->signs);
    uint32_t sc4, h[2];
    memcpy(&sc4, b->scales, 4);
    memcpy(h, b->qh, 8); /* bit k: bit 8 of index k (32 per word) */
    const __m128i v = _mm_cvtsi32_si128((int)sc4);
    const __m128i n = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(v, _mm_set1_epi8(15)),
                                                          _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15))));
    const __m512i s16 = _mm512_zextsi128_si512(_mm_add_epi16(_mm_add_epi16(n, n), _mm_set1_epi16(1)));
#if defined(__AVX512VBMI__)
    iq3_values_b(s, _mm512_loadu_si512(b->qs), _cvtu64_mask64((uint64_t)h[0] | (uint64_t)h[1] << 32),
                 pi_iq3s_grid_code_lo, pi_iq3s_grid_code_hi, pi_iq3s_grid_levels, 4);
#else
    __m512i i0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)b->qs));
    __m512i i1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b->qs + 32)));
    i0 = _mm512_mask_add_epi16(i0, (__mmask32)h[0], i0, _mm512_set1_epi16(256)); /* bit 8 was clear: add = or */
    i1 = _mm512_mask_add_epi16(i1, (__mmask32)h[1], i1, _mm512_set1_epi16(256));
    iq3_values(s, i0, i1, pi_iq3s_grid_code, pi_iq3s_grid_levels, 8);
#endif
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) s->sw[c] = scale_words(s16, 2 * c, 0);
    s->d = pi_h2f(b->d);
}

INLINE void unpack_iq(const int type, const uint8_t *blk, ksb *s) {
    if (type == PI_IQ2_XXS) unpack_iq2xxs(blk, s);
    else if (type == PI_IQ2_XS) unpack_iq2xs(blk, s);
    else if (type == PI_IQ2_S) unpack_iq2s(blk, s);
    else if (type == PI_IQ3_XXS) unpack_iq3xxs(blk, s);
    else if (type == PI_IQ1_S) unpack_iq1s(blk, s);
    else if (type == PI_IQ1_M) unpack_iq1m(blk, s);
    else unpack_iq3s(blk, s);
}

#endif

#endif
