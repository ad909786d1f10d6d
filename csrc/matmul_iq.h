/* matmul_iq.h: AVX-512 unpack of one I-quant super-block (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) into
 * matmul_k.c's ksb; included by matmul_k.c inside its AVX-512 part (it uses ksb, INLINE and scale_words).
 *
 * As for IQ4_XS ("magnitudes + sign mask"): z[c] holds the 64 weights of chunk c as their unsigned grid values
 * (gathered from the grid tables, one qword per IQ2 entry, one dword per IQ3 entry, in the activations' order),
 * neg[c] the mask of the negative ones, sw[c] the integer scale 2 ls + 1 of each int16 pair sum, d = d * f.
 * token_iq4xs then applies the signs to the activations (masked subtract) and computes
 * maddubs(|w|, +-q_x) * scale: pair sums <= 2 * 62 * 127 fit int16. Sign indices become sign bytes with
 * pi_iq_signs4's bit trick, vectorized (bit 7 = parity of the 7-bit index).
 */
#ifndef PI_MATMUL_IQ_H
#define PI_MATMUL_IQ_H

INLINE size_t iq_block_size(const int type) {
    return type == PI_IQ2_XXS ? sizeof(block_iq2_xxs) : type == PI_IQ2_XS ? sizeof(block_iq2_xs)
         : type == PI_IQ2_S ? sizeof(block_iq2_s) : type == PI_IQ3_XXS ? sizeof(block_iq3_xxs) : sizeof(block_iq3_s);
}

/* 8 dwords, each 4 sign indices of 7 bits (bits 0..27) -> 4 sign bytes each (pi_iq_signs4 per lane) */
INLINE __m256i iq_signs32(__m256i a) {
    __m256i b = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7f)),
                                _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_set1_epi32(0x7f00)));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_set1_epi32(0x7f0000)));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_set1_epi32(0x7f000000)));
    __m256i p = _mm256_xor_si256(b, _mm256_srli_epi32(b, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    return _mm256_or_si256(b, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi32(0x01010101)), 7));
}

/* 16 four-bit scales, nibble g % 2 of byte g / 2 of the 8 bytes at p -> words 2 ls + 1 */
INLINE __m256i iq_scales16(const uint8_t *p) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)p);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(v, _mm_set1_epi8(15)),
                                        _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)));
    const __m256i w = _mm256_cvtepu8_epi16(n);
    return _mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1));
}

INLINE void iq_masks(ksb *s, const void *signs) { /* 32 sign bytes, 8 per chunk */
    uint64_t m[4];
    memcpy(m, signs, 32);
    for (int c = 0; c < 4; c++) s->neg[c] = _cvtu64_mask64(m[c]);
}

INLINE void unpack_iq2xxs(const uint8_t *blk, ksb *s) {
    const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
    const __m512i raw = _mm512_loadu_si512(b->qs); /* qword k: sub-block k's 4 grid indices, then its a */
    const __m128i ls = _mm512_cvtepi64_epi16(_mm512_srli_epi64(raw, 60));
    const __m512i s16 = _mm512_zextsi128_si512(_mm_add_epi16(_mm_add_epi16(ls, ls), _mm_set1_epi16(1)));
    uint8_t sg[32];
    _mm256_storeu_si256((__m256i *)sg, iq_signs32(_mm512_cvtepi64_epi32(_mm512_srli_epi64(raw, 32))));
    iq_masks(s, sg);
    const __m128i pick = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m128i q = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(b->qs + 8 * c)), pick);
        s->z[c] = _mm512_i32gather_epi64(_mm256_cvtepu8_epi32(q), (const void *)pi_iq2xxs_grid, 8);
        s->sw[c] = scale_words(s16, 2 * c, 0);
    }
    s->d = pi_h2f(b->d) * 0.125f;
}

INLINE void unpack_iq2xs(const uint8_t *blk, ksb *s) {
    const block_iq2_xs *b = (const block_iq2_xs *)blk;
    const __m512i w = _mm512_loadu_si512(b->qs); /* 32 words: grid index (9 bits) | sign index << 9 */
    const __m512i k = _mm512_srli_epi16(w, 9);
    __m512i p = _mm512_xor_si512(k, _mm512_srli_epi16(k, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi16(p, 1));
    const __m512i sb = _mm512_or_si512(k, _mm512_slli_epi16(_mm512_and_si512(p, _mm512_set1_epi16(1)), 7));
    uint8_t sg[32];
    _mm256_storeu_si256((__m256i *)sg, _mm512_cvtepi16_epi8(sb));
    iq_masks(s, sg);
    const __m512i idx = _mm512_and_si512(w, _mm512_set1_epi16(511));
    const __m512i s16 = _mm512_zextsi256_si512(iq_scales16(b->scales));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i ix = _mm256_cvtepu16_epi32(_mm512_extracti32x4_epi32(idx, c));
        s->z[c] = _mm512_i32gather_epi64(ix, (const void *)pi_iq2xs_grid, 8);
        s->sw[c] = scale_words(s16, 4 * c, 1);
    }
    s->d = pi_h2f(b->d) * 0.125f;
}

INLINE void unpack_iq2s(const uint8_t *blk, ksb *s) {
    const block_iq2_s *b = (const block_iq2_s *)blk;
    iq_masks(s, b->signs);
    const __m512i s16 = _mm512_zextsi256_si512(iq_scales16(b->scales));
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* groups 8c .. 8c + 7; their index bits 8..9 are the 16 bits of qh[2c..2c+1] */
        uint16_t h;
        memcpy(&h, b->qh + 2 * c, 2);
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(h), shifts), _mm256_set1_epi32(3));
        const __m256i ix = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * c))),
                                           _mm256_slli_epi32(hi, 8));
        s->z[c] = _mm512_i32gather_epi64(ix, (const void *)pi_iq2s_grid, 8);
        s->sw[c] = scale_words(s16, 4 * c, 1);
    }
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
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * c)));
        s->z[c] = _mm512_i32gather_epi32(ix, (const void *)pi_iq3xxs_grid, 4);
        s->sw[c] = scale_words(s16, 2 * c, 0);
    }
    s->d = pi_h2f(b->d) * 0.25f;
}

INLINE void unpack_iq3s(const uint8_t *blk, ksb *s) {
    const block_iq3_s *b = (const block_iq3_s *)blk;
    iq_masks(s, b->signs);
    uint32_t sc4;
    memcpy(&sc4, b->scales, 4);
    const __m128i v = _mm_cvtsi32_si128((int)sc4);
    const __m128i n = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(v, _mm_set1_epi8(15)),
                                                          _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15))));
    const __m512i s16 = _mm512_zextsi128_si512(_mm_add_epi16(_mm_add_epi16(n, n), _mm_set1_epi16(1)));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* entries 16c .. 16c + 15; bit 8 of their indices: the 16 bits of qh[2c..2c+1] */
        uint16_t h;
        memcpy(&h, b->qh + 2 * c, 2);
        __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * c)));
        ix = _mm512_mask_or_epi32(ix, (__mmask16)h, ix, _mm512_set1_epi32(256));
        s->z[c] = _mm512_i32gather_epi32(ix, (const void *)pi_iq3s_grid, 4);
        s->sw[c] = scale_words(s16, 2 * c, 0);
    }
    s->d = pi_h2f(b->d);
}

INLINE void unpack_iq(const int type, const uint8_t *blk, ksb *s) {
    if (type == PI_IQ2_XXS) unpack_iq2xxs(blk, s);
    else if (type == PI_IQ2_XS) unpack_iq2xs(blk, s);
    else if (type == PI_IQ2_S) unpack_iq2s(blk, s);
    else if (type == PI_IQ3_XXS) unpack_iq3xxs(blk, s);
    else unpack_iq3s(blk, s);
}

#endif
