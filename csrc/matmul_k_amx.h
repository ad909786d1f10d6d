/* matmul_k_amx.h: internal (not read by cffi), a fragment of matmul_k.c. Q4_K / Q5_K prefill on CPUs with
 * AMX-INT8 (Intel Sapphire Rapids and later), built where the compiler targets AMX (-march=native on such a host).
 *
 * Why: a 512-bit core of these CPUs runs vector integer multiplies on two ports only, so the AVX-512 tile
 * (maddubs + dpwssd per 64 weights and token, unpacking, scales) is bound at about 28 multiply-adds per cycle,
 * where one TDPBUSD does 16 x 16 x 64 of them in about 16 cycles (1024 per cycle).
 *
 * What it computes: exactly the integers of matmul_k.c's header, per (row, token, super-block)
 *   isum = sum_s sc_s * (q_w . q_x over sub-block s),   imin = sum_s m_s * (bsum_2s + bsum_2s+1),
 * and then, in this order, acc = fma((float)isum, d_x * d, acc), accm = fma((float)imin, d_x * dmin, accm) over
 * the super-blocks, y = acc - accm. The one-token path (k_dot_pf with `full`) computes the same integers
 * with zmm and the same scalar FMAs, so prefill and decode give the same bits; they differ from the lane-wise
 * sums of the plain AVX-512 path (the order of the f32 additions), which is why `full` is chosen per call
 * (mk_job.amx) and not per build.
 *
 * How: the tile multiply takes unsigned 8-bit weights, so the 6-bit scale is folded into them: v = q_w * sc_s
 * (at most 31 * 63 = 1953) is split into its low byte and its high byte (0..7), two A tiles; the two products
 * with the activations' B tile are exact int32 (|sum| <= 256 * 255 * 128) and isum = lo + 256 * hi. Layouts:
 *   - B (amx_xsb, built once per call for each tile of 16 tokens and super-block): chunk c of 64 activation
 *     bytes, row k4 holding bytes 4 k4 .. 4 k4 + 3 of each of the 16 tokens (the layout TDPBUSD reads), plus the
 *     tokens' d and their sub-block bsums paired as words for the mins;
 *   - A (amx_wsb, built per block of 16 rows, in each thread's work area, for all super-blocks of the rows):
 *     chunk c, low / high byte, row r: 64 bytes; plus d, dmin and the mins paired as words.
 * Per (16 rows, 16 tokens, super-block): 8 TDPBUSD into two accumulator tiles, which are stored to memory and
 * scaled with zmm (per row: one add, one convert, one FMA for isum; 4 dpwssd, one convert, one FMA for the
 * mins). Each A block is used by every token tile and each B tile by every row block, so the unpacking is paid
 * once per row block and the activation transpose once per call.
 * Measured on a 2-core Intel AMX host: see docs/performance.md.
 *
 * POWERINFER_AMX=0 in the environment turns it off (then the AVX-512 tiles run, with their own bits). The
 * process asks the kernel for the tile state once (arch_prctl ARCH_REQ_XCOMP_PERM); where that fails, off. */
#ifndef PI_MATMUL_K_AMX_H
#define PI_MATMUL_K_AMX_H
#include "kquant_simd.h" /* MK_AVX512, ksb, unpack_q45k, unpack_q6k, INLINE; quants.h: blocks, pi_k_scale_min */
#if defined(MK_AVX512) && defined(__AVX512VNNI__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define MK_AMX 1
#include <stdlib.h>

#define AMX_TOK 16 /* tokens per B tile (its N), rows per A tile (its M) */

typedef struct __attribute__((aligned(64))) {
    int8_t b[4][16][64]; /* chunk c, row k4: bytes 4 k4 .. 4 k4 + 3 of chunk c of tokens 0..15 */
    float dx[AMX_TOK];   /* the tokens' Q8_K scales (0 past the last token) */
    int32_t bsp[8][AMX_TOK]; /* Q4_K/Q5_K: pair p < 4: sub-block 2p's bsum (low word) and 2p + 1's (high word)
                                of each token; Q6_K: pair p < 8: its bsums 2p and 2p + 1 (groups of 16) */
} amx_xsb;

typedef struct __attribute__((aligned(64))) {
    uint8_t a[4][2][AMX_TOK][64]; /* chunk c, low (0) / high (1) byte of q_w * sc, row r */
    float d[AMX_TOK], dmin[AMX_TOK];
    int32_t mp[8][AMX_TOK]; /* pair p of row r: Q4_K/Q5_K m_2p (low word), m_2p+1 (high word), p < 4;
                               Q6_K the scales sc_2p, sc_2p+1 of groups 2p, 2p + 1, p < 8 */
} amx_wsb;

typedef struct __attribute__((packed, aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

/* Whether this process may use the tiles: asked once (the answer is the same for every thread) */
static int mk_amx_enabled(void) {
    static int state; /* 0 not asked yet, 1 on, -1 off */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    const char *env = getenv("POWERINFER_AMX");
    long ret = -1;
#if defined(__linux__) && defined(__x86_64__)
    if (!(env && env[0] == '0')) /* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), x86-64 Linux system call 158 */
        __asm__ volatile("syscall" : "=a"(ret) : "a"(158L), "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
#endif
    const int on = ret == 0;
    __atomic_store_n(&state, on ? 1 : -1, __ATOMIC_RELEASE);
    return on;
}

static inline int amx_type(int type) { return type == PI_Q4_K || type == PI_Q5_K || type == PI_Q6_K; }
static inline int64_t amx_tiles(int64_t n_tok) { return (n_tok + AMX_TOK - 1) / AMX_TOK; }

/* B tiles of the tokens xq[0 .. n_tok - 1] (each n_sb super-blocks): amx_tiles(n_tok) * n_sb of them */
static void amx_fill_tokens(int type, const block_q8_K *xq, int64_t n_sb, int64_t n_tok, amx_xsb *out) {
    for (int64_t tb = 0; tb < amx_tiles(n_tok); tb++) {
        const int nt = n_tok - tb * AMX_TOK < AMX_TOK ? (int)(n_tok - tb * AMX_TOK) : AMX_TOK;
        for (int64_t i = 0; i < n_sb; i++) {
            amx_xsb *s = out + tb * n_sb + i;
            memset(s, 0, sizeof *s);
            for (int t = 0; t < nt; t++) {
                const block_q8_K *x = xq + (tb * AMX_TOK + t) * n_sb + i;
                for (int c = 0; c < 4; c++)
                    for (int k4 = 0; k4 < 16; k4++) memcpy(&s->b[c][k4][4 * t], x->qs + 64 * c + 4 * k4, 4);
                s->dx[t] = x->d;
                for (int p = 0; p < (type == PI_Q6_K ? 8 : 4); p++) {
                    const int b0 = type == PI_Q6_K ? x->bsums[2 * p] : x->bsums[4 * p] + x->bsums[4 * p + 1];
                    const int b1 = type == PI_Q6_K ? x->bsums[2 * p + 1] : x->bsums[4 * p + 2] + x->bsums[4 * p + 3];
                    s->bsp[p][t] = (int32_t)((uint32_t)(uint16_t)b0 | (uint32_t)(uint16_t)b1 << 16);
                }
            }
        }
    }
}

/* Chunk c of Q6_K's weights times their group scales: two zmm of words (groups 4c, 4c + 1 and 4c + 2, 4c + 3),
 * split into the unsigned low bytes and the signed high bytes (v = 256 hi + lo, |v| <= 63 * 128) */
INLINE void amx_q6k_chunk(const ksb *k, const int8_t *sc, int c, uint8_t *lo, uint8_t *hi) {
    for (int h = 0; h < 2; h++) {
        const __m512i sw = _mm512_inserti64x4(_mm512_set1_epi16(sc[4 * c + 2 * h]), _mm256_set1_epi16(sc[4 * c + 2 * h + 1]), 1);
        const __m256i q = h ? _mm512_extracti64x4_epi64(k->z[c], 1) : _mm512_castsi512_si256(k->z[c]);
        const __m512i v = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(q), sw);
        _mm256_store_si256((__m256i *)(lo + 32 * h), _mm512_cvtepi16_epi8(v));
        _mm256_store_si256((__m256i *)(hi + 32 * h), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
    }
}

/* A blocks of rows rows[0 .. nr - 1] (weight row pointers), all their super-blocks; rows past nr are zero */
static void amx_fill_rows(int type, const uint8_t *const rows[AMX_TOK], int nr, int64_t n_sb, amx_wsb *wa) {
    const size_t size = pi_block_bytes(type);
    const int q5 = type == PI_Q5_K;
    for (int64_t i = 0; i < n_sb; i++) {
        amx_wsb *s = wa + i;
        if (nr < AMX_TOK) memset(s, 0, sizeof *s);
        for (int r = 0; r < nr; r++) {
            const uint8_t *blk = rows[r] + i * size;
            if (type == PI_Q6_K) {
                const block_q6_K *b = (const block_q6_K *)blk;
                ksb k;
                unpack_q6k(blk, &k);
                for (int c = 0; c < 4; c++) amx_q6k_chunk(&k, b->scales, c, s->a[c][0][r], s->a[c][1][r]);
                s->d[r] = k.d;
                for (int p = 0; p < 8; p++)
                    s->mp[p][r] = (int32_t)((uint32_t)(uint16_t)b->scales[2 * p] | (uint32_t)(uint16_t)b->scales[2 * p + 1] << 16);
                continue;
            }
            ksb k;
            unpack_q45k(blk, &k, q5);
            uint8_t sc[8], mn[8];
            pi_k_scale_min(((const block_q4_K *)blk)->scales, sc, mn); /* the same place in Q5_K */
            for (int c = 0; c < 4; c++) { /* bytes 0..31: sub-block 2c, 32..63: 2c + 1 */
                const __m512i v0 = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(k.z[c])),
                                                      _mm512_set1_epi16(sc[2 * c]));
                const __m512i v1 = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(k.z[c], 1)),
                                                      _mm512_set1_epi16(sc[2 * c + 1]));
                _mm256_store_si256((__m256i *)s->a[c][0][r], _mm512_cvtepi16_epi8(v0));
                _mm256_store_si256((__m256i *)(s->a[c][0][r] + 32), _mm512_cvtepi16_epi8(v1));
                _mm256_store_si256((__m256i *)s->a[c][1][r], _mm512_cvtepi16_epi8(_mm512_srli_epi16(v0, 8)));
                _mm256_store_si256((__m256i *)(s->a[c][1][r] + 32), _mm512_cvtepi16_epi8(_mm512_srli_epi16(v1, 8)));
            }
            s->d[r] = k.d;
            s->dmin[r] = k.dmin;
            for (int p = 0; p < 4; p++) s->mp[p][r] = (int32_t)((uint32_t)mn[2 * p] | (uint32_t)mn[2 * p + 1] << 16);
        }
    }
}

/* Rows r_beg .. r_end - 1 against all n_tok tokens (n_tok >= 2), the B tiles in xb, A in this thread's wa */
static void amx_rows(int type, const uint8_t *w, int64_t row_bytes, const int32_t *sel, int64_t n_sb, int64_t n_tok,
                     const amx_xsb *xb, amx_wsb *wa, float *y, int64_t n_out, int64_t r_beg, int64_t r_end) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 5; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg); /* tmm0, tmm1: isum low / high; tmm2, tmm3: A low / high; tmm4: B */
    const int q6 = type == PI_Q6_K;
    int32_t cl[AMX_TOK][AMX_TOK] __attribute__((aligned(64))), ch[AMX_TOK][AMX_TOK] __attribute__((aligned(64)));
    float acc[AMX_TOK][AMX_TOK] __attribute__((aligned(64))), accm[AMX_TOK][AMX_TOK] __attribute__((aligned(64)));
    for (int64_t rb = r_beg; rb < r_end; rb += AMX_TOK) {
        const int nr = r_end - rb < AMX_TOK ? (int)(r_end - rb) : AMX_TOK;
        const uint8_t *rows[AMX_TOK];
        for (int r = 0; r < nr; r++) rows[r] = w + (sel ? sel[rb + r] : rb + r) * row_bytes;
        amx_fill_rows(type, rows, nr, n_sb, wa);
        for (int64_t tb = 0; tb < amx_tiles(n_tok); tb++) {
            const int nt = n_tok - tb * AMX_TOK < AMX_TOK ? (int)(n_tok - tb * AMX_TOK) : AMX_TOK;
            const amx_xsb *xt = xb + tb * n_sb;
            memset(acc, 0, sizeof acc);
            memset(accm, 0, sizeof accm);
            for (int64_t i = 0; i < n_sb; i++) {
                const amx_wsb *s = wa + i;
                _tile_zero(0);
                _tile_zero(1);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    _tile_loadd(4, xt[i].b[c], 64);
                    _tile_loadd(2, s->a[c][0], 64);
                    _tile_loadd(3, s->a[c][1], 64);
                    _tile_dpbusd(0, 2, 4);
                    if (q6) _tile_dpbssd(1, 3, 4); /* Q6_K's high bytes are signed */
                    else _tile_dpbusd(1, 3, 4);
                }
                _tile_stored(0, cl, 64);
                _tile_stored(1, ch, 64);
                const __m512 dxv = _mm512_load_ps(xt[i].dx);
                if (q6) { /* isum = lo + 256 hi - 32 sum_g sc_g bsum_g; no mins */
                    for (int r = 0; r < nr; r++) {
                        __m512i off = _mm512_setzero_si512();
#pragma GCC unroll 8
                        for (int p = 0; p < 8; p++)
                            off = _mm512_dpwssd_epi32(off, _mm512_load_si512(xt[i].bsp[p]), _mm512_set1_epi32(s->mp[p][r]));
                        const __m512i is = _mm512_sub_epi32(
                            _mm512_add_epi32(_mm512_load_si512(cl[r]), _mm512_slli_epi32(_mm512_load_si512(ch[r]), 8)),
                            _mm512_slli_epi32(off, 5));
                        _mm512_store_ps(acc[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dxv, _mm512_set1_ps(s->d[r])),
                                                                _mm512_load_ps(acc[r])));
                    }
                    continue;
                }
                for (int r = 0; r < nr; r++) {
                    const __m512i is = _mm512_add_epi32(_mm512_load_si512(cl[r]), _mm512_slli_epi32(_mm512_load_si512(ch[r]), 8));
                    _mm512_store_ps(acc[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dxv, _mm512_set1_ps(s->d[r])),
                                                            _mm512_load_ps(acc[r])));
                    __m512i im = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++)
                        im = _mm512_dpwssd_epi32(im, _mm512_load_si512(xt[i].bsp[p]), _mm512_set1_epi32(s->mp[p][r]));
                    _mm512_store_ps(accm[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(im),
                                                             _mm512_mul_ps(dxv, _mm512_set1_ps(s->dmin[r])),
                                                             _mm512_load_ps(accm[r])));
                }
            }
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < nr; r++) y[(tb * AMX_TOK + t) * n_out + rb + r] = acc[r][t] - accm[r][t];
        }
    }
    _tile_release();
}

#endif
#endif
