/* fc2t.c: a Q4_0 or Q8_0 predictor's fc2 repacked by hidden unit (a "QT" copy), and fc2 . r reading only the
 * rows of the hidden units that are non-zero.
 *
 *   pi_fc2t_bytes    the size of the repacked copy
 *   pi_fc2t_pack     Q4_0 / Q8_0 fc2 [n_ff, rank] -> the copy (the same codes and f16 scales, moved)
 *   pi_fc2t_logits   logits f32 [n_ff] = fc2 . r, from the copy
 *
 * Why. A PowerInfer predictor is logits = fc2 . relu(fc1 . p); about half the hidden units relu(fc1 . p) are
 * zero for a token, so fc2 . r only needs the fc2 columns of the others. In the file fc2 is row-major by
 * output neuron (each row a run of blocks along the rank), so a column is scattered over every row; the copy
 * turns each hidden unit's column into one contiguous row of codes, which is then read only when the unit is
 * non-zero. Float fc2 types get a plain transposed copy and the AXPY of axpy.c (ffn.py); a quantized column
 * cannot be re-quantized along the other axis without changing the values, so the copy keeps every code and
 * scale of the file and only moves them.
 *
 * Layout, with np = n_ff rounded up to a multiple of 64 (the outputs past n_ff are padding) and nb = rank / 32.
 * Outputs go in tiles of 64:
 *   codes, row k = hidden unit k, one row after the other:
 *     Q4_0: uint8 [np / 2] per row, 32 bytes per tile: byte j of tile t holds the code (0..15) of output
 *           64 t + j in its low nibble and of 64 t + 32 + j in its high nibble;
 *     Q8_0: int8 [np] per row, the code of output i at i.
 *   d    uint16 (f16) [nb][np]: the scale of block b of row i (fc2[i, 32 b .. 32 b + 31]); 0 in padding.
 * fc2[i, k] = d[k / 32][i] * (q - 8) (Q4_0) or d * q (Q8_0), as in the file. The copy is the tensor's size
 * when 64 | n_ff.
 *
 * Arithmetic (what a Q4_0 / Q8_0 mat-vec computes, in another order). r is quantized to Q8_0 like every such
 * mat-vec's activations (pi_quantize: codes qr[k], an f16-rounded scale dr[b] per block). Per output i, block b
 *   isum[i][b] = sum_{k in b} w[i][k] * qr[k]     w = q - 8 (Q4_0) or q (Q8_0): the mat-vec's exact block dot
 *   logits[i]  = fma chain over the blocks b with some qr[k] != 0, ascending, of (d[b][i] * dr[b]) * isum
 * within each of P parts (below), then the parts' sums added in part order. Rows k with qr[k] == 0 (r_k = 0,
 * or too small to survive the quantization) are never read: they add nothing to isum.
 *
 * Work split. The blocks are cut into P contiguous parts, P = the thread count (at most nb), balanced by their
 * count of non-zero qr, so each thread streams whole rows (row splits read faster than column slices on this
 * class of machine: axpy.c); part p accumulates into its own partial of np floats, and the partials are
 * summed in part order into logits. Bit-identical from run to run for a given thread count.
 *
 * Kernels (AVX2). The rows of a block's non-zero units are walked side by side, 64 outputs at a time, their
 * codes interleaved byte by byte and multiplied by the units' qr bytes with maddubs, which leaves 16-bit sums
 * of two products. Q4_0: two units at a time, codes 0..15 the unsigned operand (|pair| <= 2 * 15 * 128); eight
 * pairs are summed in 16 bits before widening to 32, and the -8 offset is the block's constant -8 * sum(qr)
 * added once. Q8_0: four units at a time, interleaved into one 32-bit lane per output; the qr are maddubs's
 * unsigned operand (relu outputs are >= 0; otherwise |w| is and qr takes w's sign), |pair| <= 2 * 128 * 127,
 * and madd with ones adds each output's two pairs into 32 bits. Software prefetch runs 256 bytes ahead along the
 * rows and fetches the first lines of the next block's rows while the current ones end. Portable C elsewhere,
 * with the same integers and the same fma chain (same bits).
 */
#include <math.h>
#include <string.h>

#include "quants.h" /* block_q4_0, block_q8_0, pi_h2f */

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QT_AVX2 1
#include <immintrin.h>
#endif

#define TILE 64          /* outputs per tile */
#define PAIRS_16 8       /* Q4_0: pairs of units whose maddubs sums fit in int16: 8 * 2 * 15 * 128 < 32768 */
#define PF_BYTES 256     /* software prefetch distance along a row (bench_fc2_qt.py: 256 and 512 B alike for Q4_0;
                            Q8_0 at 50% non-zero ~1.9x the mat-vec with 256-512 B, ~1.45x with 1 KB) */

static int64_t padded(int64_t n_ff) { return (n_ff + TILE - 1) / TILE * TILE; }
static int64_t row_bytes(int type, int64_t np) { return type == PI_Q4_0 ? np / 2 : np; }

int64_t pi_fc2t_bytes(int type, int64_t n_ff, int64_t rank) {
    if ((type != PI_Q4_0 && type != PI_Q8_0) || n_ff <= 0 || rank <= 0 || rank % QK) return -1;
    const int64_t np = padded(n_ff);
    return rank * row_bytes(type, np) + rank / QK * np * 2;
}

/* ---- packing ---------------------------------------------------------------------------------------------- */
typedef struct {
    int type;
    const uint8_t *w; /* fc2's rows of blocks */
    int64_t n_ff, nb, np, rowb;
    uint8_t *codes;
    uint16_t *d;
} pack_job;

/* block column b: rows 32 b .. 32 b + 31 of the codes and row b of d */
static void pack_column(void *ctx, int64_t b, int thread_id) {
    (void)thread_id;
    const pack_job *j = ctx;
    const int64_t rowb = j->rowb;
    uint8_t *codes = j->codes + b * QK * rowb;
    uint16_t *d = j->d + b * j->np;
    memset(codes, 0, (size_t)(QK * rowb));
    memset(d, 0, (size_t)j->np * sizeof(uint16_t));
    for (int64_t i = 0; i < j->n_ff; i++) {
        if (j->type == PI_Q8_0) {
            const block_q8_0 *blk = (const block_q8_0 *)j->w + i * j->nb + b;
            d[i] = blk->d;
            for (int e = 0; e < QK; e++) codes[e * rowb + i] = (uint8_t)blk->qs[e];
            continue;
        }
        const block_q4_0 *blk = (const block_q4_0 *)j->w + i * j->nb + b;
        d[i] = blk->d;
        const int64_t at = i / TILE * (TILE / 2) + (i % TILE) % (TILE / 2);
        const int shift = (i % TILE) >= TILE / 2 ? 4 : 0;
        for (int e = 0; e < QK / 2; e++) { /* element e: low nibble of qs[e]; element e + 16: its high nibble */
            codes[e * rowb + at] |= (uint8_t)((blk->qs[e] & 15) << shift);
            codes[(e + QK / 2) * rowb + at] |= (uint8_t)((blk->qs[e] >> 4) << shift);
        }
    }
}

int pi_fc2t_pack(pi_pool *pool, int type, const void *fc2, int64_t n_ff, int64_t rank, void *out) {
    if (pi_fc2t_bytes(type, n_ff, rank) < 0) return -1;
    const int64_t np = padded(n_ff);
    pack_job j = {type, fc2, n_ff, rank / QK, np, row_bytes(type, np), out, NULL};
    j.d = (uint16_t *)((uint8_t *)out + rank * j.rowb);
    pi_pool_run(pool, pack_column, &j, j.nb);
    return 0;
}

/* ---- logits ----------------------------------------------------------------------------------------------- */
typedef struct {
    int type;
    const uint8_t *codes;
    const uint16_t *d;
    int64_t np, nb, rowb;
    const block_q8_0 *qr;    /* r as Q8_0 blocks */
    const int32_t *nz;       /* the k with qr[k] != 0, ascending */
    const int32_t *blk_beg;  /* block b's entries are nz[blk_beg[b] .. blk_beg[b + 1]) */
    const int32_t *part_beg; /* part p covers blocks part_beg[p] .. part_beg[p + 1] - 1 */
    float *partial;          /* [n_parts][np] */
} logits_job;

static inline int8_t code_of(const block_q8_0 *qr, int64_t k) { return qr[k / QK].qs[k % QK]; }

/* the block's constant: -8 * sum(qr) for Q4_0's offset codes, 0 for Q8_0 */
static int32_t block_offset(const logits_job *j, int64_t b) {
    if (j->type != PI_Q4_0) return 0;
    int32_t sum = 0;
    for (int e = 0; e < QK; e++) sum += j->qr[b].qs[e];
    return -8 * sum;
}

#if defined(QT_AVX2)
/* acc[v] (outputs 8 v .. 8 v + 7 of a tile) += the 16-bit sums of a (outputs {0-7 | 16-23} + o) and
 * c (outputs {8-15 | 24-31} + o), o = 0 or 32: v0 = o / 8 */
static inline void widen_into(__m256i *acc, int v0, __m256i a, __m256i c) {
    acc[v0] = _mm256_add_epi32(acc[v0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a)));
    acc[v0 + 2] = _mm256_add_epi32(acc[v0 + 2], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a, 1)));
    acc[v0 + 1] = _mm256_add_epi32(acc[v0 + 1], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(c)));
    acc[v0 + 3] = _mm256_add_epi32(acc[v0 + 3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(c, 1)));
}

/* one tile's integer sums over the pairs s of a Q4_0 block (offset not added) */
static inline void tile_q4(__m256i *acc, const uint8_t *const *ra, const uint8_t *const *rb, const __m256i *wv,
                           int64_t ns, int64_t off, int prefetch) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t s0 = 0; s0 < ns; s0 += PAIRS_16) {
        const int64_t s1 = s0 + PAIRS_16 < ns ? s0 + PAIRS_16 : ns;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t s = s0; s < s1; s++) {
            if (prefetch) { /* one prefetch per 64-byte line */
                _mm_prefetch((const char *)ra[s] + off + PF_BYTES, _MM_HINT_T0);
                _mm_prefetch((const char *)rb[s] + off + PF_BYTES, _MM_HINT_T0);
            }
            const __m256i A = _mm256_loadu_si256((const __m256i *)(ra[s] + off));
            const __m256i B = _mm256_loadu_si256((const __m256i *)(rb[s] + off));
            const __m256i al = _mm256_and_si256(A, m4), ah = _mm256_and_si256(_mm256_srli_epi16(A, 4), m4);
            const __m256i bl = _mm256_and_si256(B, m4), bh = _mm256_and_si256(_mm256_srli_epi16(B, 4), m4);
            a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(al, bl), wv[s])); /* 0-7 | 16-23 */
            a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(al, bl), wv[s])); /* 8-15 | 24-31 */
            a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(ah, bh), wv[s])); /* 32-39 | 48-55 */
            a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(ah, bh), wv[s])); /* 40-47 | 56-63 */
        }
        widen_into(acc, 0, a0, a1);
        widen_into(acc, 4, a2, a3);
    }
}

/* one tile's integer sums over the quads s of a Q8_0 block: units rq[4 s .. 4 s + 3], their qr bytes in wq[s]
 * (every 32-bit lane). The four rows' codes are interleaved into one 32-bit lane per output, so maddubs leaves
 * two 16-bit sums per output (|each| <= 2 * 128 * 127) and madd with ones adds them into 32 bits. With every
 * qr >= 0 (relu outputs) the qr are maddubs's unsigned operand as they are; otherwise |w| is, and qr takes w's
 * sign. acc[4 h + c] collects outputs 32 h + {4 c .. 4 c + 3 | 16 + 4 c .. 16 + 4 c + 3} (see unscramble_q8). */
static inline void tile_q8(__m256i *acc, const uint8_t *const *rq, const __m256i *wq, int64_t nq, int64_t off,
                           int prefetch, int signed_q) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t s = 0; s < nq; s++) {
        const uint8_t *const *r = rq + 4 * s;
        if (prefetch)
            for (int u = 0; u < 4; u++) _mm_prefetch((const char *)r[u] + off + PF_BYTES, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            const int64_t o = off + 32 * h;
            const __m256i A = _mm256_loadu_si256((const __m256i *)(r[0] + o));
            const __m256i B = _mm256_loadu_si256((const __m256i *)(r[1] + o));
            const __m256i C = _mm256_loadu_si256((const __m256i *)(r[2] + o));
            const __m256i D = _mm256_loadu_si256((const __m256i *)(r[3] + o));
            const __m256i ab_lo = _mm256_unpacklo_epi8(A, B), ab_hi = _mm256_unpackhi_epi8(A, B);
            const __m256i cd_lo = _mm256_unpacklo_epi8(C, D), cd_hi = _mm256_unpackhi_epi8(C, D);
            __m256i x[4] = {_mm256_unpacklo_epi16(ab_lo, cd_lo), _mm256_unpackhi_epi16(ab_lo, cd_lo),
                            _mm256_unpacklo_epi16(ab_hi, cd_hi), _mm256_unpackhi_epi16(ab_hi, cd_hi)};
            for (int c = 0; c < 4; c++) {
                const __m256i p = signed_q ? _mm256_maddubs_epi16(_mm256_abs_epi8(x[c]), _mm256_sign_epi8(wq[s], x[c]))
                                           : _mm256_maddubs_epi16(wq[s], x[c]);
                acc[4 * h + c] = _mm256_add_epi32(acc[4 * h + c], _mm256_madd_epi16(p, ones));
            }
        }
    }
}

/* tile_q8's order -> acc[v] = outputs 8 v .. 8 v + 7 */
static inline void unscramble_q8(__m256i *acc) {
    for (int h = 0; h < 2; h++) {
        __m256i *a = acc + 4 * h;
        const __m256i o0 = _mm256_permute2x128_si256(a[0], a[1], 0x20);
        const __m256i o2 = _mm256_permute2x128_si256(a[0], a[1], 0x31);
        const __m256i o1 = _mm256_permute2x128_si256(a[2], a[3], 0x20);
        const __m256i o3 = _mm256_permute2x128_si256(a[2], a[3], 0x31);
        a[0] = o0, a[1] = o1, a[2] = o2, a[3] = o3;
    }
}

/* out[0 .. np) += block b's terms; ks: its n >= 1 non-zero units; next, n_next: the units of the part's next
 * block with any (n_next 0: none), whose rows' starts are prefetched while this block's rows end */
static void block_terms(const logits_job *j, int64_t b, const int32_t *ks, int64_t n, const int32_t *next,
                        int64_t n_next, float *out) {
    const int q4 = j->type == PI_Q4_0;
    const int64_t rowb = j->rowb, n_tiles = j->np / TILE, tile_bytes = q4 ? TILE / 2 : TILE;
    const int64_t pf = PF_BYTES, ns = (n + 1) / 2, nq = (n + 3) / 4;
    const uint8_t *ra[QK / 2], *rb[QK / 2], *rq[QK];
    __m256i wv[QK / 2], wq[QK / 4];
    int signed_q = 0;
    if (q4) {
        for (int64_t s = 0; s < ns; s++) { /* pair s: units ks[2s], ks[2s + 1] (the last alone: weight 0 twice) */
            const int64_t k0 = ks[2 * s], k1 = 2 * s + 1 < n ? ks[2 * s + 1] : k0;
            ra[s] = j->codes + k0 * rowb;
            rb[s] = j->codes + k1 * rowb;
            const uint8_t c0 = (uint8_t)code_of(j->qr, k0), c1 = 2 * s + 1 < n ? (uint8_t)code_of(j->qr, k1) : 0;
            wv[s] = _mm256_set1_epi16((int16_t)(uint16_t)(c0 | (uint16_t)c1 << 8));
        }
    } else {
        for (int64_t s = 0; s < nq; s++) { /* quad s: units ks[4s .. 4s + 3] (missing ones: ks[4s], weight 0) */
            uint32_t pattern = 0;
            for (int u = 0; u < 4; u++) {
                const int have = 4 * s + u < n;
                const int64_t k = ks[have ? 4 * s + u : 4 * s];
                rq[4 * s + u] = j->codes + k * rowb;
                const int8_t c = have ? code_of(j->qr, k) : 0;
                signed_q |= c < 0;
                pattern |= (uint32_t)(uint8_t)c << (8 * u);
            }
            wq[s] = _mm256_set1_epi32((int32_t)pattern);
        }
    }
    const __m256i corr = _mm256_set1_epi32(block_offset(j, b));
    const __m256 dr = _mm256_set1_ps(pi_h2f(j->qr[b].d));
    const uint16_t *drow = j->d + b * j->np;
    for (int64_t t = 0; t < n_tiles; t++) {
        const int64_t off = t * tile_bytes;
        const int line = !q4 || (t & 1) == 0; /* this tile starts a 64-byte line of each row */
        __m256i acc[8];
        for (int v = 0; v < 8; v++) acc[v] = _mm256_setzero_si256();
        if (q4) {
            tile_q4(acc, ra, rb, wv, ns, off, line);
        } else {
            tile_q8(acc, rq, wq, nq, off, line, signed_q);
            unscramble_q8(acc);
        }
        if (line && off + pf >= rowb) /* the next block's rows: their first lines */
            for (int64_t m = 0; m < n_next; m++)
                _mm_prefetch((const char *)(j->codes + next[m] * rowb) + off + pf - rowb, _MM_HINT_T0);
        float *o = out + t * TILE;
        const uint16_t *dt = drow + t * TILE;
        for (int v = 0; v < 8; v++) {
            const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dt + 8 * v))), dr);
            const __m256 is = _mm256_cvtepi32_ps(_mm256_add_epi32(acc[v], corr));
            _mm256_storeu_ps(o + 8 * v, _mm256_fmadd_ps(dd, is, _mm256_loadu_ps(o + 8 * v)));
        }
    }
}
#else
/* the code w (offset removed for Q4_0: added per block) of unit k's row at output i */
static inline int32_t code_at(const logits_job *j, int64_t k, int64_t i) {
    const uint8_t *row = j->codes + k * j->rowb;
    if (j->type == PI_Q8_0) return (int8_t)row[i];
    const uint8_t byte = row[i / TILE * (TILE / 2) + (i % TILE) % (TILE / 2)];
    return (i % TILE) >= TILE / 2 ? byte >> 4 : byte & 15;
}

static void block_terms(const logits_job *j, int64_t b, const int32_t *ks, int64_t n, const int32_t *next,
                        int64_t n_next, float *out) {
    (void)next, (void)n_next;
    const int32_t offset = block_offset(j, b);
    const float dr = pi_h2f(j->qr[b].d);
    const uint16_t *drow = j->d + b * j->np;
    for (int64_t i = 0; i < j->np; i++) {
        int32_t isum = offset;
        for (int64_t m = 0; m < n; m++) isum += code_at(j, ks[m], i) * (int32_t)code_of(j->qr, ks[m]);
        out[i] = fmaf(pi_h2f(drow[i]) * dr, (float)isum, out[i]);
    }
}
#endif

static void logits_part(void *ctx, int64_t p, int thread_id) {
    (void)thread_id;
    const logits_job *j = ctx;
    float *out = j->partial + p * j->np;
    memset(out, 0, (size_t)j->np * sizeof(float));
    const int64_t b1 = j->part_beg[p + 1];
    for (int64_t b = j->part_beg[p]; b < b1; b++) {
        const int64_t n = j->blk_beg[b + 1] - j->blk_beg[b];
        if (n == 0) continue;
        int64_t c = b + 1; /* the next block with non-zero units in this part */
        while (c < b1 && j->blk_beg[c + 1] == j->blk_beg[c]) c++;
        const int64_t n_next = c < b1 ? j->blk_beg[c + 1] - j->blk_beg[c] : 0;
        block_terms(j, b, j->nz + j->blk_beg[b], n, j->nz + (c < b1 ? j->blk_beg[c] : 0), n_next, out);
    }
}

int pi_fc2t_logits(pi_pool *pool, int type, const void *copy, int64_t n_ff, int64_t rank, const float *r,
                   float *logits) {
    if (pi_fc2t_bytes(type, n_ff, rank) < 0) return -1;
    const int64_t np = padded(n_ff), nb = rank / QK;
    int64_t n_parts = pi_pool_n_threads(pool);
    if (n_parts > nb) n_parts = nb;
    /* scratch: partials, r's Q8_0 blocks, the non-zero list and the block / part boundaries */
    const size_t s_part = (size_t)(n_parts * np) * sizeof(float);
    const size_t s_q = ((size_t)nb * sizeof(block_q8_0) + 63) & ~(size_t)63;
    const size_t s_nz = (size_t)rank * sizeof(int32_t), s_blk = (size_t)(nb + 1) * sizeof(int32_t);
    char *s = pi_pool_scratch(pool, s_part + s_q + s_nz + s_blk + (size_t)(n_parts + 1) * sizeof(int32_t));
    if (!s) return -2;
    logits_job j = {type, copy, NULL, np, nb, row_bytes(type, np), NULL, NULL, NULL, NULL, (float *)s};
    j.d = (const uint16_t *)((const uint8_t *)copy + rank * j.rowb);
    block_q8_0 *qr = (block_q8_0 *)(s + s_part);
    int32_t *nz = (int32_t *)(s + s_part + s_q), *blk_beg = nz + rank, *part_beg = blk_beg + nb + 1;
    pi_quantize(PI_Q8_0, r, qr, 1, rank);
    int64_t n_nz = 0;
    for (int64_t b = 0; b < nb; b++) {
        blk_beg[b] = (int32_t)n_nz;
        for (int e = 0; e < QK; e++)
            if (qr[b].qs[e] != 0) nz[n_nz++] = (int32_t)(b * QK + e);
    }
    blk_beg[nb] = (int32_t)n_nz;
    /* part p ends at the first block boundary where the running count reaches p / n_parts of the total */
    part_beg[0] = 0;
    int64_t b = 0;
    for (int64_t p = 1; p < n_parts; p++) {
        const int64_t want = (n_nz * p + n_parts - 1) / n_parts;
        while (b < nb && blk_beg[b] < want) b++;
        if (b < part_beg[p - 1] + 1) b = part_beg[p - 1] + 1; /* every part has a block */
        if (b > nb - (n_parts - p)) b = nb - (n_parts - p);
        part_beg[p] = (int32_t)b;
    }
    part_beg[n_parts] = (int32_t)nb;
    j.qr = qr, j.nz = nz, j.blk_beg = blk_beg, j.part_beg = part_beg;
    pi_pool_run(pool, logits_part, &j, n_parts);
    for (int64_t i = 0; i < n_ff; i++) {
        float acc = j.partial[i];
        for (int64_t p = 1; p < n_parts; p++) acc += j.partial[p * np + i];
        logits[i] = acc;
    }
    return 0;
}
