/* quants.h: internal (not read by cffi). Block layouts of the quantized types and the pieces that the kernel
 * files share (quant.c, rows.c, matmul.c, matmul_k.c, matmul_iq.c, axpy.c, fc2t.c, act.c).
 *
 * Layouts are llama.cpp's (gguf/quants.py decodes the same bytes). Element order inside a block:
 *   Q4_0/Q4_1/Q5_0/Q5_1 (32): element j < 16 in the low nibble of qs[j], j + 16 in its high nibble; bit 4 of
 *     element j (Q5_*) is bit j of the little-endian uint32 qh. Q*_0: value = d * (q - 8 or 16); Q*_1: d * q + m.
 *   IQ4_NL (32): f16 d, then nibbles in the Q4_0 order; value = d * pi_iq4nl_values[nibble] (a fixed table).
 *   MXFP4 (32, 17 bytes): one E8M0 exponent byte e, then nibbles in the Q4_0 order; each nibble is an E2M1 code,
 *     value = 2^(e - 127) * e2m1(nibble) = pi_e8m0_half(e) * pi_mxfp4_values[nibble] (the table holds the
 *     E2M1 values doubled, so that they are integers, and the scale is halved to match).
 *   Q4_K/Q5_K (256 = 8 sub-blocks of 32, 6-bit scale sc and min m each, packed in scales[12]):
 *     chunk c < 4 of 64 elements: sub-block 2c = low nibbles of qs[32c..32c+31], 2c + 1 = high nibbles;
 *     bit 4 (Q5_K) of element l of sub-block s is bit s of qh[l]. value = d * sc * q - dmin * m.
 *   Q6_K (256 = 16 groups of 16, int8 scale each): half h < 2 of 128 elements uses ql[64h..], qh[32h..];
 *     element 32i + l (i < 4, l < 32) = nibble (i >= 2 ? high : low) of ql[64h + 32(i & 1) + l] | bits 2i..2i+1
 *     of qh[32h + l] << 4. value = d * sc * (q - 32).
 *   Q2_K (256 = 16 groups of 16, 4-bit scale sc and min m each: scales[g] = sc | m << 4): element
 *     128n + 32j + l (n < 2, j < 4, l < 32) = bits 2j..2j+1 of qs[32n + l]. value = d * sc * q - dmin * m.
 *   Q3_K (256 = 16 groups of 16, 6-bit scale each, packed in scales[12], used as sc - 32): element
 *     128n + 32j + l = bits 2j..2j+1 of qs[32n + l] | bit 4n + j of hmask[l] << 2; value = d * (sc - 32) * (q - 4).
 *     Group g's scale: low 4 bits = nibble g / 8 of scales[g % 8], high 2 bits = bits 2(g / 4).. of scales[8 + g % 4].
 *   IQ4_XS (256 = 8 sub-blocks of 32, 6-bit scale ls each): f16 d, uint16 scales_h, scales_l[4], qs[128].
 *     ls of sub-block s = nibble s % 2 of scales_l[s / 2] | bits 2s..2s+1 of scales_h << 4; its 32 elements are
 *     the low nibbles of qs[16s..16s+15] then their high nibbles; value = d * (ls - 32) * pi_iq4nl_values[nibble].
 *   I-quants (256 = sub-blocks of 32 or groups of 16, f16 d first; matmul_iq.c): each weight is an unsigned grid
 *     value times a sign, value = d * f * (2 ls + 1) * grid * sign with ls a 4-bit scale and f = 1/8 (IQ2_*),
 *     1/4 (IQ3_XXS) or 1 (IQ3_S). Grids (iq_grids.h, generated from the gguf package) give 8 (IQ2) or 4 (IQ3)
 *     values per index. A 7-bit sign index k stands for the 8 signs k | parity(k) << 7 (bit j set: weight j < 0).
 *     IQ2_XXS (66 B): qs = 8 x {4 grid index bytes, uint32 a}: sub-block s's 4 groups of 8 take grid entries
 *       bytes 0..3, signs a >> 7l (l < 4), ls = a >> 28.
 *     IQ2_XS (74 B): uint16 qs[32] (group i of 8: grid index low 9 bits, sign index high 7), scales[8] (group
 *       of 16 g: nibble g % 2 of scales[g / 2]).
 *     IQ2_S (82 B): qs[32] (grid index low 8 bits of group i of 8), signs[32] (group i: one bit per weight),
 *       qh[8] (bits 8..9 of index i: bits 2(i % 4) of qh[i / 4]), scales[8] as IQ2_XS.
 *     IQ3_XXS (98 B): qs[64] (grid index of group i of 4), then uint32 a[8]: sub-block s's 4 groups of 8 signs
 *       a >> 7l, ls = a >> 28.
 *     IQ3_S (110 B): qs[64] (index low 8 bits, groups of 4), qh[8] (bit 8 of index i: bit i % 8 of qh[i / 8]),
 *       signs[32] (one bit per weight), scales[4] (sub-block s: nibble s % 2 of scales[s / 2]).
 *   IQ1_S, IQ1_M (256 = groups of 8 weights, each one entry of a grid of 2048 x 8 values in {-1, 0, 1}, index
 *     11 bits): value = d * (2 ls + 1) * (grid + delta), delta = +-1/8. The kernels keep the integer
 *     8 * (grid + delta) = 8 grid +- 1 (|.| <= 9, never 0: a magnitude and a sign like the others) with f = 1/8.
 *     IQ1_S (50 B): f16 d, qs[32] (index low 8 bits of group i), uint16 qh[8] (sub-block s of 32: bits 3l..3l+2
 *       = index bits 8..10 of its group l < 4, bits 12..14 = ls, bit 15 set: delta = -1/8 for all 32).
 *     IQ1_M (56 B): qs[32] as IQ1_S, qh[16] (nibble i % 2 of qh[i / 2] for group i: bits 0..2 index bits 8..10,
 *       bit 3 set: delta = -1/8 for its 8), uint16 scales[4] (group of 16 g: bits 3(g % 4).. of word g / 4 = ls;
 *       the f16 d = the top nibbles of words 0, 1, 2, 3 as its bits 0..3, 4..7, 8..11, 12..15; no d field).
 *   Q8_K (activations only): f32 d, int8 qs[256], int16 bsums[16] (sums of 16 consecutive qs).
 */
#ifndef PI_QUANTS_H
#define PI_QUANTS_H
#include <stdint.h>
#include <string.h>

#include "pool.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32    /* elements per Q4_0 ... Q8_0 block */
#define QK_K 256 /* elements per K-quant super-block */

typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } block_q3_K;
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_iq4_nl;
typedef struct { uint8_t e; uint8_t qs[QK / 2]; } block_mxfp4;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
typedef struct { uint16_t d, scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
typedef struct { uint16_t d; uint8_t qs[QK_K / 8]; uint8_t signs[QK_K / 8]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
typedef struct { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t sas[QK_K / 8]; } block_iq3_xxs;
typedef struct { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64]; } block_iq3_s;
typedef struct { uint16_t d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint16_t scales[QK_K / 64]; } block_iq1_m;
/* Q8_K activations (matmul_k.c; our own scratch, never a file): llama.cpp's fields, laid out qs first and
 * padded to 320 bytes so that, in a 64-byte aligned array, every 64-byte load of qs stays in one cache line */
typedef struct __attribute__((aligned(64))) { int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; float d; } block_q8_K;
_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(block_q2_K) == 84, "Q2_K block is 84 bytes");
_Static_assert(sizeof(block_q3_K) == 110, "Q3_K block is 110 bytes");
_Static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");
_Static_assert(sizeof(block_mxfp4) == 17, "MXFP4 block is 17 bytes");
_Static_assert(sizeof(block_q4_K) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(block_q5_K) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(block_q6_K) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(block_iq4_xs) == 136, "IQ4_XS block is 136 bytes");
_Static_assert(sizeof(block_iq2_xxs) == 66, "IQ2_XXS block is 66 bytes");
_Static_assert(sizeof(block_iq2_xs) == 74, "IQ2_XS block is 74 bytes");
_Static_assert(sizeof(block_iq2_s) == 82, "IQ2_S block is 82 bytes");
_Static_assert(sizeof(block_iq3_xxs) == 98, "IQ3_XXS block is 98 bytes");
_Static_assert(sizeof(block_iq3_s) == 110, "IQ3_S block is 110 bytes");
_Static_assert(sizeof(block_iq1_s) == 50, "IQ1_S block is 50 bytes");
_Static_assert(sizeof(block_iq1_m) == 56, "IQ1_M block is 56 bytes");
_Static_assert(sizeof(block_q8_K) == 320, "Q8_K block is 320 bytes");

/* The type-traits table (pi.h: pi_type_traits): one row per type id, zero rows for the ids the kernels do not
 * take. static const in every file that includes this header, so that a lookup with a type known at compile time
 * (the kernels' per-type copies) folds to its constant, as the switches it replaced did. */
static const pi_type_traits pi_traits[PI_TYPE_COUNT] = {
    [PI_F32] = {1, 4, PI_KIND_FLOAT, 0, 0},
    [PI_F16] = {1, 2, PI_KIND_FLOAT, 0, 0},
    [PI_BF16] = {1, 2, PI_KIND_FLOAT, 0, 0},
    [PI_Q4_0] = {QK, sizeof(block_q4_0), PI_KIND_BLOCK, QK, 0},
    [PI_Q4_1] = {QK, sizeof(block_q4_1), PI_KIND_BLOCK, QK, 1},
    [PI_Q5_0] = {QK, sizeof(block_q5_0), PI_KIND_BLOCK, QK, 0},
    [PI_Q5_1] = {QK, sizeof(block_q5_1), PI_KIND_BLOCK, QK, 1},
    [PI_Q8_0] = {QK, sizeof(block_q8_0), PI_KIND_BLOCK, QK, 0},
    [PI_IQ4_NL] = {QK, sizeof(block_iq4_nl), PI_KIND_BLOCK, QK, 0},
    [PI_MXFP4] = {QK, sizeof(block_mxfp4), PI_KIND_BLOCK, QK, 0},
    [PI_Q2_K] = {QK_K, sizeof(block_q2_K), PI_KIND_K, 16, 1},
    [PI_Q3_K] = {QK_K, sizeof(block_q3_K), PI_KIND_K, 16, 0},
    [PI_Q4_K] = {QK_K, sizeof(block_q4_K), PI_KIND_K, 32, 1},
    [PI_Q5_K] = {QK_K, sizeof(block_q5_K), PI_KIND_K, 32, 1},
    [PI_Q6_K] = {QK_K, sizeof(block_q6_K), PI_KIND_K, 16, 0},
    [PI_IQ4_XS] = {QK_K, sizeof(block_iq4_xs), PI_KIND_K, 32, 0},
    [PI_IQ2_XXS] = {QK_K, sizeof(block_iq2_xxs), PI_KIND_IQ, 32, 0},
    [PI_IQ2_XS] = {QK_K, sizeof(block_iq2_xs), PI_KIND_IQ, 16, 0},
    [PI_IQ2_S] = {QK_K, sizeof(block_iq2_s), PI_KIND_IQ, 16, 0},
    [PI_IQ3_XXS] = {QK_K, sizeof(block_iq3_xxs), PI_KIND_IQ, 32, 0},
    [PI_IQ3_S] = {QK_K, sizeof(block_iq3_s), PI_KIND_IQ, 32, 0},
    [PI_IQ1_S] = {QK_K, sizeof(block_iq1_s), PI_KIND_IQ, 32, 0},
    [PI_IQ1_M] = {QK_K, sizeof(block_iq1_m), PI_KIND_IQ, 16, 0},
};

/* type's row; the zero row (PI_KIND_NONE) for any id outside the table (e.g. PI_FC2T + type) */
static inline pi_type_traits pi_traits_of(int type) {
    const pi_type_traits none = {0, 0, PI_KIND_NONE, 0, 0};
    return type >= 0 && type < PI_TYPE_COUNT ? pi_traits[type] : none;
}
/* bytes of one block of type */
static inline size_t pi_block_bytes(int type) { return (size_t)pi_traits_of(type).bytes; }
/* The I-quants with grids (matmul_iq.c) */
static inline int pi_is_iq_type(int type) { return pi_traits_of(type).kind == PI_KIND_IQ; }
/* The 256-element super-block types: the K-quants, IQ4_XS and the I-quants (matmul_k.c) */
static inline int pi_is_k_type(int type) {
    const int kind = pi_traits_of(type).kind;
    return kind == PI_KIND_K || kind == PI_KIND_IQ;
}
/* elements per scale group of a K-quant: 32 (Q4_K, Q5_K, IQ4_XS, ...) or 16 (Q2_K, Q3_K, Q6_K, ...) */
static inline int pi_qk_group(int type) { return pi_traits_of(type).group; }

uint16_t pi_f32_to_f16(float f); /* round to nearest even (quant.c) */
void pi_f32_to_f16_row(const float *x, uint16_t *y, int64_t n); /* n values, the same rounding (quant.c) */
void pi_dequantize_row(int type, const void *src, float *y, int64_t n_cols); /* one row -> f32 (quant.c) */

static inline float pi_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) { float f = (float)man * 0x1p-24f; return sign ? -f : f; }
    u = sign | (exp == 0x1f ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    float f; memcpy(&f, &u, 4); return f;
#endif
}

/* f32 -> bf16 bits, round to nearest even; a NaN stays a NaN, made quiet (pi_quantize's BF16, llama.cpp's). Every
 * kernel that multiplies a BF16 weight rounds the other factor with it first (matmul.c, axpy.c). */
static inline uint16_t pi_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static inline float pi_bf_round(float f) { /* f rounded to bf16, as an f32 */
    const uint32_t u = (uint32_t)pi_f2bf(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* IQ4_NL's 16 levels (llama.cpp's non-uniform 4-bit grid, finer near zero) */
static const int8_t pi_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* MXFP4's 16 codes (E2M1: sign, 2-bit exponent, 1-bit mantissa) as twice their value: 0, 0.5, 1, 1.5, 2, 3, 4, 6
 * and their negatives become small integers, so a block's dot product stays an integer one */
static const int8_t pi_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* An E8M0 scale byte e as 2^(e - 128): the block scale 2^(e - 127) halved for the doubled table. Exact for every
 * e (e = 0, 1 are the subnormals 2^-128, 2^-127; 255 is 2^127, not NaN, as llama.cpp and gguf read it). */
static inline float pi_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Their grids (iq_grids.h) */
extern const uint64_t pi_iq2xxs_grid[256], pi_iq2xs_grid[512], pi_iq2s_grid[1024];
extern const uint32_t pi_iq3xxs_grid[256], pi_iq3s_grid[512];
/* the grids' levels (IQ2: 3, IQ3: 8, then zeros) and entries as codes: value j's level index in bits 2j.. (IQ2)
 * or 3j.. (IQ3) */
extern const uint8_t pi_iq2xxs_grid_levels[16], pi_iq2xs_grid_levels[16], pi_iq2s_grid_levels[16];
extern const uint8_t pi_iq3xxs_grid_levels[16], pi_iq3s_grid_levels[16];
extern const uint16_t pi_iq2xxs_grid_code[256], pi_iq2xs_grid_code[512], pi_iq2s_grid_code[1024];
extern const uint16_t pi_iq3xxs_grid_code[256], pi_iq3s_grid_code[512];
extern const uint8_t pi_iq3xxs_grid_code_lo[256], pi_iq3xxs_grid_code_hi[256]; /* the codes' low, high bytes */
extern const uint8_t pi_iq3s_grid_code_lo[512], pi_iq3s_grid_code_hi[512];
/* IQ1_S / IQ1_M: their grid's 2048 entries as 2-bit codes (then two zero entries: 4-byte gathers stay inside) and
 * the 3 levels times 8 */
extern const uint16_t pi_iq1s_grid_code[2050];
extern const int8_t pi_iq1s_grid_levels8[16];
extern const uint8_t pi_iq_ksigns[128]; /* sign byte of each 7-bit sign index (pi_iq_signs4 computes the same) */

/* I-quant super-block -> the integer scales 2 ls + 1 of its groups (8 of 32 or 16 of 16; returns the group
 * size) and *d = d * f (exact: f is a power of two), and if q is not NULL the 256 signed values grid * sign
 * (IQ1_S / IQ1_M: 8 grid + 8 delta, f = 1/8) */
int pi_iq_unpack(int type, const uint8_t *blk, int8_t *q, uint8_t sc[16], float *d);

/* IQ1_M's f16 super-block scale: the top nibbles of its four scale words */
static inline uint16_t pi_iq1m_d(const block_iq1_m *b) {
    return (uint16_t)((b->scales[0] >> 12) | ((b->scales[1] >> 8) & 0xf0) | ((b->scales[2] >> 4) & 0xf00)
                      | (b->scales[3] & 0xf000));
}

/* The 8 signs of a 7-bit sign index k (I-quants): k with bit 7 = the parity of k */
static inline uint32_t pi_iq_signs4(uint32_t a) { /* 4 indices (bits 0..27 of a) -> 4 sign bytes */
    uint32_t b = (a & 0x7f) | ((a << 1) & 0x7f00) | ((a << 2) & 0x7f0000) | ((a << 3) & 0x7f000000);
    uint32_t p = b ^ (b >> 4); /* bit 0 of each byte ends as the xor of the byte's bits (shifts bring no */
    p ^= p >> 2;               /* bits from the next byte into bits 0..3) */
    p ^= p >> 1;
    return b | (p & 0x01010101u) << 7;
}
#if defined(__AVX2__)
/* pi_iq_signs4 in each of 8 dwords (the AVX2 and the AVX-512 builds without VBMI) */
static inline __m256i pi_iq_signs32(__m256i a) {
    __m256i b = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7f)),
                                _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_set1_epi32(0x7f00)));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_set1_epi32(0x7f0000)));
    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_set1_epi32(0x7f000000)));
    __m256i p = _mm256_xor_si256(b, _mm256_srli_epi32(b, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    return _mm256_or_si256(b, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi32(0x01010101)), 7));
}
/* IQ2_XS / IQ2_S: 16 four-bit scales, nibble g % 2 of byte g / 2 of the 8 bytes at p -> words 2 ls + 1 */
static inline __m256i pi_iq_scales16(const uint8_t *p) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)p);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(v, _mm_set1_epi8(15)),
                                        _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)));
    const __m256i w = _mm256_cvtepu8_epi16(n);
    return _mm256_add_epi16(_mm256_add_epi16(w, w), _mm256_set1_epi16(1));
}
/* Q3_K: its 16 six-bit scales minus 32 as words (p: the block's 12 scale bytes). Group g: the low nibble of byte
 * g (g < 8) or the high nibble of byte g - 8, its top two bits bits 2 (g / 4) of byte 8 + g % 4. The 16 bytes
 * loaded end at the last scale byte (p - 4 is still inside the block), then shift down */
static inline __m256i pi_q3k_scales16(const uint8_t *p) {
    const __m128i raw = _mm_srli_si128(_mm_loadu_si128((const __m128i *)(p - 4)), 4);
    const __m128i nib = _mm_unpacklo_epi64(_mm_and_si128(raw, _mm_set1_epi8(15)),
                                           _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
    const __m128i top = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(raw, 0xaa), _mm_setr_epi32(0, 2, 4, 6)),
                                      _mm_set1_epi8(3));
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_or_si128(nib, _mm_slli_epi16(top, 4))), _mm256_set1_epi16(32));
}
#endif

/* IQ4_XS: the 8 six-bit sub-block scales of a super-block, minus 32 */
static inline void pi_iq4xs_scales(const block_iq4_xs *b, int8_t ls[8]) {
    for (int s = 0; s < 8; s++)
        ls[s] = (int8_t)((((b->scales_l[s / 2] >> (4 * (s % 2))) & 15) | ((b->scales_h >> (2 * s)) & 3) << 4) - 32);
}

/* Q3_K: the 16 six-bit scales of a super-block from its 12 packed bytes, minus 32 */
static inline void pi_q3k_scales(const uint8_t *p, int8_t sc[16]) {
    for (int g = 0; g < 16; g++) {
        const int lo = g < 8 ? p[g] & 15 : p[g - 8] >> 4;
        sc[g] = (int8_t)((lo | ((p[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32);
    }
}

/* Q4_K/Q5_K: the 8 six-bit scales and mins of a super-block from its 12 packed bytes */
static inline void pi_k_scale_min(const uint8_t *p, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        mn[j] = p[j + 4] & 63;
        sc[j + 4] = (uint8_t)((p[j + 8] & 15) | ((p[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
    }
}

/* One 32-element block of Q4_1/Q5_0/Q5_1/IQ4_NL/MXFP4 -> integer values q (Q5_0: already minus 16; IQ4_NL,
 * MXFP4: the table's levels), d (MXFP4: pi_e8m0_half) and m (0 for Q5_0, IQ4_NL and MXFP4) */
static inline void pi_unpack_q32(int type, const uint8_t *blk, int8_t q[QK], float *d, float *m) {
    uint16_t dh, mh = 0;
    uint32_t qh = 0;
    const uint8_t *qs;
    if (type == PI_MXFP4) {
        for (int j = 0; j < QK / 2; j++) {
            q[j] = pi_mxfp4_values[blk[1 + j] & 15];
            q[j + QK / 2] = pi_mxfp4_values[blk[1 + j] >> 4];
        }
        *d = pi_e8m0_half(blk[0]);
        *m = 0.0f;
        return;
    }
    memcpy(&dh, blk, 2);
    *d = pi_h2f(dh);
    if (type == PI_IQ4_NL) {
        for (int j = 0; j < QK / 2; j++) {
            q[j] = pi_iq4nl_values[blk[2 + j] & 15];
            q[j + QK / 2] = pi_iq4nl_values[blk[2 + j] >> 4];
        }
        *m = 0.0f;
        return;
    }
    if (type == PI_Q5_0) { memcpy(&qh, blk + 2, 4); qs = blk + 6; }
    else if (type == PI_Q5_1) { memcpy(&mh, blk + 2, 2); memcpy(&qh, blk + 4, 4); qs = blk + 8; }
    else { memcpy(&mh, blk + 2, 2); qs = blk + 4; }
    const int off = type == PI_Q5_0 ? 16 : 0;
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | ((qh >> j) & 1) << 4) - off);
        q[j + QK / 2] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + QK / 2)) & 1) << 4) - off);
    }
    *m = type == PI_Q5_0 ? 0.0f : pi_h2f(mh);
}

/* One K-quant super-block -> q int8 [256] (Q6_K: minus 32; Q3_K: minus 4; Q2_K/Q4_K/Q5_K: unsigned; IQ4_XS:
 * the table's levels; IQ2/IQ3: grid * sign, dsc = d * f * (2 ls + 1)), and per group the f32 factors of value = dsc[g] * q - dmn[g]: groups of 32 (Q4_K/Q5_K:
 * dsc = d * sc, dmn = dmin * m; IQ4_XS: dsc = d * (ls - 32), dmn = 0) or of 16 (Q2_K: the same; Q3_K: dsc = d * (sc - 32), dmn = 0; Q6_K: dsc = d * sc, dmn = 0). The products are
 * rounded to f32 the way gguf's numpy decoder rounds them. */
static inline void pi_unpack_qk(int type, const uint8_t *blk, int8_t q[QK_K], float dsc[16], float dmn[16]) {
    if (pi_is_iq_type(type)) { /* value = (d * f) * (2 ls + 1) * q, q = grid * sign */
        uint8_t sc[16];
        float d;
        const int n_g = QK_K / pi_iq_unpack(type, blk, q, sc, &d);
        for (int g = 0; g < n_g; g++) { dsc[g] = d * (float)sc[g]; dmn[g] = 0.0f; }
        return;
    }
    if (type == PI_Q2_K || type == PI_Q3_K) { /* same element order; Q3_K adds a high bit from hmask */
        const block_q2_K *b2 = (const block_q2_K *)blk;
        const block_q3_K *b3 = (const block_q3_K *)blk;
        const uint8_t *qs = type == PI_Q2_K ? b2->qs : b3->qs;
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    int v = (qs[32 * n + l] >> (2 * j)) & 3;
                    if (type == PI_Q3_K) v += (((b3->hmask[l] >> (4 * n + j)) & 1) << 2) - 4;
                    q[128 * n + 32 * j + l] = (int8_t)v;
                }
        if (type == PI_Q2_K) {
            const float d = pi_h2f(b2->d), dmin = pi_h2f(b2->dmin);
            for (int g = 0; g < 16; g++) {
                dsc[g] = d * (float)(b2->scales[g] & 15);
                dmn[g] = dmin * (float)(b2->scales[g] >> 4);
            }
        } else {
            int8_t sc[16];
            pi_q3k_scales(b3->scales, sc);
            const float d = pi_h2f(b3->d);
            for (int g = 0; g < 16; g++) { dsc[g] = d * (float)sc[g]; dmn[g] = 0.0f; }
        }
        return;
    }
    if (type == PI_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)blk;
        int8_t ls[8];
        pi_iq4xs_scales(b, ls);
        const float d = pi_h2f(b->d);
        for (int s = 0; s < 8; s++) {
            for (int l = 0; l < 16; l++) {
                q[32 * s + l] = pi_iq4nl_values[b->qs[16 * s + l] & 15];
                q[32 * s + 16 + l] = pi_iq4nl_values[b->qs[16 * s + l] >> 4];
            }
            dsc[s] = d * (float)ls[s];
            dmn[s] = 0.0f;
        }
        return;
    }
    if (type == PI_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)blk;
        const float d = pi_h2f(b->d);
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t lo = b->ql[64 * h + 32 * (i & 1) + l];
                    const int v = (i >= 2 ? lo >> 4 : lo & 15) | ((b->qh[32 * h + l] >> (2 * i)) & 3) << 4;
                    q[128 * h + 32 * i + l] = (int8_t)(v - 32);
                }
        for (int g = 0; g < 16; g++) { dsc[g] = d * (float)b->scales[g]; dmn[g] = 0.0f; }
        return;
    }
    const block_q4_K *b4 = (const block_q4_K *)blk; /* Q5_K starts with the same fields */
    const uint8_t *qs = type == PI_Q5_K ? ((const block_q5_K *)blk)->qs : b4->qs;
    const uint8_t *qh = type == PI_Q5_K ? ((const block_q5_K *)blk)->qh : NULL;
    uint8_t sc[8], mn[8];
    pi_k_scale_min(b4->scales, sc, mn);
    const float d = pi_h2f(b4->d), dmin = pi_h2f(b4->dmin);
    for (int s = 0; s < 8; s++) {
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = qs[32 * (s / 2) + l];
            int v = s & 1 ? byte >> 4 : byte & 15;
            if (qh) v |= ((qh[l] >> s) & 1) << 4;
            q[32 * s + l] = (int8_t)v;
        }
        dsc[s] = d * (float)sc[s];
        dmn[s] = dmin * (float)mn[s];
    }
}

/* K-quant matmuls (matmul_k.c), called by pi_matmul / pi_matmul_rows for Q2_K ... Q6_K and IQ4_XS.
 * rows == NULL: all n_rows rows; else the n_rows selected rows rows[0..n_rows-1]. y f32 [n_tok, n_rows]. */
void pi_matmul_k(pi_pool *pool, int type, const void *w, int64_t n_cols, const int32_t *rows, int64_t n_rows,
                 const float *x, int64_t n_tok, float *y);
/* pi_matmul_experts for the K-quants (matmul_k.c); pi_expert_chunks: its chunks per group (matmul.c) */
void pi_matmul_k_experts(pi_pool *pool, int type, const void *w, int64_t n_rows, int64_t n_cols,
                         const int32_t *experts, const int64_t *tok_off, int64_t n_group, const float *x, float *y);
int64_t pi_expert_chunks(pi_pool *pool, int64_t n_rows, int64_t n_group);

#endif
