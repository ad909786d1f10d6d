/* quant.c: weight types, quantization and dequantization (rows.c moves rows with these conversions).
 *
 * Variants:
 *   - F16 <-> F32: F16C (8 lanes, round to nearest even) when built with __F16C__, else a bit-exact scalar
 *     conversion (subnormals, inf and NaN included).
 *   - BF16: round to nearest even on the top 16 bits of the f32 pattern (NaN kept quiet), scalar.
 *   - Q8_0 (llama.cpp): per block of 32, d = amax / 127, q = round-half-away(x * (1/d)), d stored as f16.
 *   - Q4_0 (llama.cpp): per block of 32, m = the element of largest magnitude (first one, sign kept),
 *     d = m / -8, q = min(15, trunc(x * (1/d) + 8.5)), two 4-bit values per byte (j low, j + 16 high).
 *   - Q5_0: as Q4_0 with d = m / -16, q = min(31, trunc(x / d + 16.5)), bit 4 of element j in bit j of qh.
 *   - Q4_1 / Q5_1: d = (max - min) / 15 (31), m = min, q = min(15 (31), trunc((x - min) / d + 0.5)).
 *   - K-quants (Q2_K ... Q6_K), IQ4_XS and IQ1_* / IQ2_* / IQ3_*: dequantization only (llama.cpp's 256-element super-blocks, see
 *     quants.h); they are never produced here.
 * Quantization is exact integer/IEEE arithmetic, so kernels/ref.py reproduces it byte for byte.
 */
#include <string.h>

#include "quants.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif



static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in f32 */
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

static inline uint16_t f32_to_f16(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | ((ax >> 13) & 0x3ff); /* NaN, quiet */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                      /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                           /* below 2^-14: subnormal */
        /* a * 2^24 < 1024 is exact; adding 2^23 rounds it to an integer (nearest even) */
        float v = bits_f32(ax) * 0x1p24f;
        volatile float r = v + 0x1p23f; /* volatile: keep the rounding step */
        return sign | (uint16_t)(r - 0x1p23f);
    }
    /* normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even */
    return sign | (uint16_t)((ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1)) >> 13);
#endif
}


static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

const pi_type_traits *pi_type_traits_table(void) { return pi_traits; }

int64_t pi_block_size(int type) {
    const pi_type_traits tt = pi_traits_of(type);
    return tt.block ? tt.block : 1; /* 1 for ids the kernels do not take, as for the float types */
}

int64_t pi_row_size(int type, int64_t n_cols) {
    const pi_type_traits tt = pi_traits_of(type);
    return tt.block ? n_cols / tt.block * tt.bytes : 0;
}

/* round half away from zero, exactly (v - trunc(v) is exact); |v| stays below 2^31 here */
static inline int round_away(float v) {
    int t = (int)v;
    float frac = v - (float)t;
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}

static void quantize_row_q8_0(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK; b++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = x[j] < 0 ? -x[j] : x[j];
            if (a > amax) amax = a;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < QK; j++) y[b].qs[j] = (int8_t)round_away(x[j] * id);
    }
}

static void quantize_row_q4_0(const float *x, block_q4_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK; b++, x += QK) {
        float amax = 0.0f, m = x[0]; /* the first element of largest magnitude, as argmax picks */
        for (int j = 0; j < QK; j++) {
            float a = x[j] < 0 ? -x[j] : x[j];
            if (a > amax) { amax = a; m = x[j]; }
        }
        float d = m / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < QK / 2; j++) {
            int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + QK / 2] * id + 8.5f);
            lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
            hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void quantize_row_q5_0(const float *x, block_q5_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK; b++, x += QK) {
        float amax = 0.0f, m = x[0];
        for (int j = 0; j < QK; j++) {
            float a = x[j] < 0 ? -x[j] : x[j];
            if (a > amax) { amax = a; m = x[j]; }
        }
        float d = m / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < QK / 2; j++) {
            int lo = (int)(x[j] * id + 16.5f), hi = (int)(x[j + QK / 2] * id + 16.5f);
            lo = lo < 0 ? 0 : lo > 31 ? 31 : lo;
            hi = hi < 0 ? 0 : hi > 31 ? 31 : hi;
            y[b].qs[j] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + QK / 2);
        }
        memcpy(y[b].qh, &qh, 4);
    }
}

/* Q4_1 (bits 4) and Q5_1 (bits 5): qh is NULL for Q4_1 */
static void quantize_row_q_1(const float *x, uint16_t *dm, uint8_t *qh_out, uint8_t *qs, int bits) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < QK; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    const int qmax = (1 << bits) - 1;
    float d = (hi - lo) / (float)qmax, id = d != 0.0f ? 1.0f / d : 0.0f;
    dm[0] = f32_to_f16(d);
    dm[1] = f32_to_f16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        int a = (int)((x[j] - lo) * id + 0.5f), b = (int)((x[j + QK / 2] - lo) * id + 0.5f);
        a = a > qmax ? qmax : a;
        b = b > qmax ? qmax : b;
        qs[j] = (uint8_t)((a & 15) | ((b & 15) << 4));
        qh |= (uint32_t)(a >> 4) << j | (uint32_t)(b >> 4) << (j + QK / 2);
    }
    if (qh_out) memcpy(qh_out, &qh, 4);
}

/* also rows.c's KV-cache store */
void pi_f32_to_f16_row(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

uint16_t pi_f32_to_f16(float f) { return f32_to_f16(f); }

static void f16_to_f32_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = f16_to_f32(x[i]);
}

int64_t pi_quantize(int type, const float *src, void *dst, int64_t n_rows, int64_t n_cols) {
    int64_t rs = pi_row_size(type, n_cols);
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = src + r * n_cols;
        char *y = (char *)dst + r * rs;
        switch (type) {
        case PI_F32: memcpy(y, x, (size_t)rs); break;
        case PI_F16: pi_f32_to_f16_row(x, (uint16_t *)y, n_cols); break;
        case PI_BF16:
            for (int64_t i = 0; i < n_cols; i++) ((uint16_t *)y)[i] = pi_f2bf(x[i]); /* quants.h */
            break;
        case PI_Q8_0: quantize_row_q8_0(x, (block_q8_0 *)y, n_cols); break;
        case PI_Q4_0: quantize_row_q4_0(x, (block_q4_0 *)y, n_cols); break;
        case PI_Q5_0: quantize_row_q5_0(x, (block_q5_0 *)y, n_cols); break;
        case PI_Q4_1:
            for (int64_t b = 0; b < n_cols / QK; b++) {
                block_q4_1 *o = (block_q4_1 *)y + b;
                quantize_row_q_1(x + b * QK, &o->d, NULL, o->qs, 4);
            }
            break;
        case PI_Q5_1:
            for (int64_t b = 0; b < n_cols / QK; b++) {
                block_q5_1 *o = (block_q5_1 *)y + b;
                quantize_row_q_1(x + b * QK, &o->d, o->qh, o->qs, 5);
            }
            break;
        default: return 0;
        }
    }
    return rs * n_rows;
}

/* one row of `type` (n_cols elements) -> f32 (also rows.c's embedding lookup) */
void pi_dequantize_row(int type, const void *src, float *y, int64_t n_cols) {
    switch (type) { /* the types with a loop of their own */
    case PI_F32: memcpy(y, src, (size_t)n_cols * 4); return;
    case PI_F16: f16_to_f32_row(src, y, n_cols); return;
    case PI_BF16:
        for (int64_t i = 0; i < n_cols; i++) y[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        return;
    case PI_Q8_0: {
        const block_q8_0 *b = src;
        for (int64_t k = 0; k < n_cols / QK; k++, y += QK) {
            float d = f16_to_f32(b[k].d);
            for (int j = 0; j < QK; j++) y[j] = d * (float)b[k].qs[j];
        }
        return;
    }
    case PI_Q4_0: {
        const block_q4_0 *b = src;
        for (int64_t k = 0; k < n_cols / QK; k++, y += QK) {
            float d = f16_to_f32(b[k].d);
            for (int j = 0; j < QK / 2; j++) {
                y[j] = d * (float)((b[k].qs[j] & 0x0f) - 8);
                y[j + QK / 2] = d * (float)((b[k].qs[j] >> 4) - 8);
            }
        }
        return;
    }
    default: break;
    }
    const pi_type_traits tt = pi_traits_of(type); /* the others by their kind */
    if (tt.kind == PI_KIND_BLOCK) { /* Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 */
        for (int64_t k = 0; k < n_cols / QK; k++, y += QK) {
            int8_t q[QK];
            float d, m;
            pi_unpack_q32(type, (const uint8_t *)src + k * tt.bytes, q, &d, &m);
            for (int j = 0; j < QK; j++) y[j] = d * (float)q[j] + m;
        }
    } else if (tt.kind == PI_KIND_K || tt.kind == PI_KIND_IQ) {
        for (int64_t k = 0; k < n_cols / QK_K; k++, y += QK_K) {
            int8_t q[QK_K];
            float dsc[16], dmn[16];
            pi_unpack_qk(type, (const uint8_t *)src + k * tt.bytes, q, dsc, dmn);
            /* value = d * sc * q - dmin * m (Q2_K, Q4_K/Q5_K) or d * sc * q (Q3_K, Q6_K; q already centred; IQ4_XS: q the table's levels) */
            const int g = tt.group;
            for (int j = 0; j < QK_K; j++) y[j] = dsc[j / g] * (float)q[j] - dmn[j / g];
        }
    }
}

void pi_dequantize(int type, const void *src, float *dst, int64_t n_rows, int64_t n_cols) {
    int64_t rs = pi_row_size(type, n_cols);
    for (int64_t r = 0; r < n_rows; r++) pi_dequantize_row(type, (const char *)src + r * rs, dst + r * n_cols, n_cols);
}
