/* matmul_iq.c: the I-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (layouts in quants.h): their grids
 * and the portable unpack of one super-block into signed grid values and integer scales.
 *
 * Every weight is d * f * (2 ls + 1) * grid * sign with an unsigned grid value (IQ2: 8, 25, 43; IQ3_XXS: 4..62;
 * IQ3_S: 1..15) and a separate sign bit, so a super-block's dot with Q8_K activations is exact in integers:
 *   isum = sum_g (2 ls_g + 1) * (grid * sign . q_x over group g),   y += (d_x * (d * f)) * isum
 * (llama.cpp's ggml_vec_dot_iq*_q8_K: the same integers, the same product d_w * d_x per super-block, and the
 * factor f applied once at the end; f is a power of two, so folding it into d changes no bit).
 * IQ1_S / IQ1_M: value = d * (2 ls + 1) * (grid + delta) with grid in {-1, 0, 1} and delta = +-1/8 per 32 (IQ1_S)
 * or 8 (IQ1_M) weights; here q = 8 grid + 8 delta (+-1, +-7, +-9) and f = 1/8, so isum = 8 * (llama.cpp's sumi) +
 * its delta sum (which llama.cpp takes from the Q8_K bsums times +-1 and scales by 1/8 in float): both are exact
 * (|isum| < 2^24), so d_w * d_x * isum / 8 is llama.cpp's d_w * d_x * (sumi + sumi1 / 8) up to the f32 rounding
 * of that last product.
 * Users: pi_unpack_qk (dequantize, axpy.c's AXPY, the scalar dot in matmul_k.c). The AVX-512 unpack, which
 * turns a super-block into grid magnitudes and a sign mask for matmul_k.c's tiles, is in matmul_iq.h.
 */
#include "quants.h"

#include "iq_grids.h"

/* 8 bytes of an IQ2 grid entry or 4 of an IQ3 one, with sign byte `signs` (bit j: value j negative) */
static void put_signed(int8_t *q, const uint8_t *g, uint8_t signs, int n) {
    for (int j = 0; j < n; j++) q[j] = (int8_t)((signs >> j) & 1 ? -(int)g[j] : (int)g[j]);
}

static void put_grid8(int8_t *q, uint64_t entry, uint8_t signs) {
    uint8_t g[8];
    memcpy(g, &entry, 8);
    put_signed(q, g, signs, 8);
}

static void put_grid4(int8_t *q, uint32_t entry, uint8_t signs) {
    uint8_t g[4];
    memcpy(g, &entry, 4);
    put_signed(q, g, signs, 4);
}

/* IQ1: group i of 8 -> 8 grid + 8 delta for its 8 values (delta_neg: delta = -1/8) */
static void put_iq1(int8_t *q, int idx, int delta_neg) {
    const unsigned code = pi_iq1s_grid_code[idx];
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(pi_iq1s_grid_levels8[(code >> 2 * j) & 3] + (delta_neg ? -1 : 1));
}

int pi_iq_unpack(int type, const uint8_t *blk, int8_t *q, uint8_t sc[16], float *d) {
    uint16_t dh;
    memcpy(&dh, blk, 2);
    const float d0 = pi_h2f(dh);
    switch (type) {
    case PI_IQ1_S: {
        const block_iq1_s *b = (const block_iq1_s *)blk;
        for (int s = 0; s < 8; s++) {
            sc[s] = (uint8_t)(2 * ((b->qh[s] >> 12) & 7) + 1);
            if (!q) continue;
            for (int l = 0; l < 4; l++)
                put_iq1(q + 32 * s + 8 * l, b->qs[4 * s + l] | ((b->qh[s] >> 3 * l) & 7) << 8, b->qh[s] >> 15);
        }
        *d = d0 * 0.125f;
        break;
    }
    case PI_IQ1_M: {
        const block_iq1_m *b = (const block_iq1_m *)blk;
        for (int g = 0; g < 16; g++) sc[g] = (uint8_t)(2 * ((b->scales[g / 4] >> 3 * (g % 4)) & 7) + 1);
        if (q)
            for (int i = 0; i < 32; i++) {
                const int nib = (b->qh[i / 2] >> 4 * (i % 2)) & 15;
                put_iq1(q + 8 * i, b->qs[i] | (nib & 7) << 8, nib >> 3);
            }
        *d = pi_h2f(pi_iq1m_d(b)) * 0.125f;
        break;
    }
    case PI_IQ2_XXS: {
        const block_iq2_xxs *b = (const block_iq2_xxs *)blk;
        for (int s = 0; s < 8; s++) {
            uint32_t a[2];
            memcpy(a, b->qs + 4 * s, 8); /* a[0]: 4 grid indices, a[1]: 4 sign indices and ls */
            sc[s] = (uint8_t)(2 * (a[1] >> 28) + 1);
            if (!q) continue;
            const uint32_t signs = pi_iq_signs4(a[1]);
            for (int l = 0; l < 4; l++)
                put_grid8(q + 32 * s + 8 * l, pi_iq2xxs_grid[(a[0] >> 8 * l) & 255], (uint8_t)(signs >> 8 * l));
        }
        *d = d0 * 0.125f;
        break;
    }
    case PI_IQ2_XS: {
        const block_iq2_xs *b = (const block_iq2_xs *)blk;
        for (int g = 0; g < 16; g++) sc[g] = (uint8_t)(2 * ((b->scales[g / 2] >> 4 * (g % 2)) & 15) + 1);
        if (q)
            for (int i = 0; i < 32; i++)
                put_grid8(q + 8 * i, pi_iq2xs_grid[b->qs[i] & 511], (uint8_t)pi_iq_signs4(b->qs[i] >> 9));
        *d = d0 * 0.125f;
        break;
    }
    case PI_IQ2_S: {
        const block_iq2_s *b = (const block_iq2_s *)blk;
        for (int g = 0; g < 16; g++) sc[g] = (uint8_t)(2 * ((b->scales[g / 2] >> 4 * (g % 2)) & 15) + 1);
        if (q)
            for (int i = 0; i < 32; i++) {
                const int idx = b->qs[i] | ((b->qh[i / 4] >> 2 * (i % 4)) & 3) << 8;
                put_grid8(q + 8 * i, pi_iq2s_grid[idx], b->signs[i]);
            }
        *d = d0 * 0.125f;
        break;
    }
    case PI_IQ3_XXS: {
        const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
        for (int s = 0; s < 8; s++) {
            uint32_t a;
            memcpy(&a, b->sas + 4 * s, 4);
            sc[s] = (uint8_t)(2 * (a >> 28) + 1);
            if (!q) continue;
            const uint32_t signs = pi_iq_signs4(a);
            for (int i = 0; i < 8; i++) /* group i of 4: half of the sign byte of group i / 2 of 8 */
                put_grid4(q + 32 * s + 4 * i, pi_iq3xxs_grid[b->qs[8 * s + i]],
                          (uint8_t)((signs >> 8 * (i / 2)) >> 4 * (i % 2)) & 15);
        }
        *d = d0 * 0.25f;
        break;
    }
    default: { /* PI_IQ3_S */
        const block_iq3_s *b = (const block_iq3_s *)blk;
        for (int s = 0; s < 8; s++) sc[s] = (uint8_t)(2 * ((b->scales[s / 2] >> 4 * (s % 2)) & 15) + 1);
        if (q)
            for (int i = 0; i < 64; i++) {
                const int idx = b->qs[i] | ((b->qh[i / 8] >> (i % 8)) & 1) << 8;
                put_grid4(q + 4 * i, pi_iq3s_grid[idx], (uint8_t)(b->signs[i / 2] >> 4 * (i % 2)) & 15);
            }
        *d = d0;
        break;
    }
    }
    return pi_qk_group(type); /* the elements per scale that its case wrote: 32 or 16 (8 or 16 scales) */
}
