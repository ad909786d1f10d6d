/* fc2_q4t.c: a Q4_0 predictor's fc2 repacked by hidden unit ("Q4T"), and fc2 . r reading only the rows of the
 * hidden units that are non-zero.
 *
 *   pi_q4t_bytes    the size of the repacked copy
 *   pi_q4t_pack     Q4_0 fc2 [n_ff, rank] -> the Q4T copy (the same 4-bit codes and f16 scales, moved)
 *   pi_q4t_logits   logits f32 [n_ff] = fc2 . r, from the copy
 *
 * Why. A PowerInfer predictor is logits = fc2 . relu(fc1 . p); about half the hidden units relu(fc1 . p) are
 * zero for a token, so fc2 . r only needs the fc2 columns of the others. In the file fc2 is row-major by
 * output neuron (each row a run of Q4_0 blocks along the rank), so a column is scattered over every row; the
 * copy turns each hidden unit's column into one contiguous row of nibbles, which is then read only when the
 * unit is non-zero. Float fc2 types get a plain transposed copy and the AXPY of sparse.c (ffn.py); a Q4_0
 * column cannot be re-quantized along the other axis without changing the values, so the copy keeps every
 * code and scale of the file and only moves them.
 *
 * Layout, with np = n_ff rounded up to a multiple of 64 (the outputs past n_ff are padding) and nb = rank / 32:
 *   nib  uint8 [rank][np / 2]: row k holds code q[i][k] (0..15) of fc2[i, k] for every output i. Outputs go
 *        in tiles of 64: in the 32 bytes of tile t, byte j has output 64 t + j in its low nibble and
 *        64 t + 32 + j in its high nibble (so a 32-byte load and a shift give two vectors of 32 outputs each).
 *   d    uint16 (f16) [nb][np]: the Q4_0 scale of block b of row i (fc2[i, 32 b .. 32 b + 31]); 0 in padding.
 * fc2[i, k] = d[k / 32][i] * (q[i][k] - 8), as in the file. Same size as the Q4_0 tensor when 64 | n_ff.
 *
 * Arithmetic (what a Q4_0 mat-vec computes, in another order). r is quantized to Q8_0 like every Q4_0 mat-vec's
 * activations (pi_quantize: codes qr[k], an f16-rounded scale dr[b] per block). Per output i and block b
 *   isum[i][b] = sum_{k in b} (q[i][k] - 8) * qr[k]          an exact integer: the mat-vec's block dot
 *   logits[i]  = fma chain over the blocks b with some qr[k] != 0, ascending, of (d[b][i] * dr[b]) * isum
 * within each of P parts (below), then the parts' sums added in part order. Rows k with qr[k] == 0 (r_k = 0,
 * or too small to survive the quantization) are never read: they add nothing to isum.
 *
 * Work split. The blocks are cut into P contiguous parts, P = the thread count (at most nb), balanced by their
 * count of non-zero qr, so each thread streams whole rows (row splits read faster than column slices on this
 * class of machine: sparse.c); part p accumulates into its own partial of np floats, and the partials are
 * summed in part order into logits. Bit-identical from run to run for a given thread count.
 *
 * Kernel (AVX2): the non-zero units of a block are taken two at a time; for a tile of 64 outputs the two rows'
 * 32 bytes are split into nibbles, interleaved byte by byte (unit k, unit k') and multiplied by the byte pair
 * (qr[k], qr[k']) with maddubs, which leaves q[i][k] qr[k] + q[i][k'] qr[k'] in 16 bits (|.| <= 2 * 15 * 128);
 * eight pairs fit in 16 bits, then the sums are widened to 32 bits; the -8 offset is the block's constant
 * -8 * sum(qr) added once. Portable C elsewhere, with the same integers and the same fma chain (same bits).
 */
#include <math.h>
#include <string.h>

#include "matmul_internal.h" /* block_q4_0, block_q8_0, pi_h2f */

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define Q4T_AVX2 1
#include <immintrin.h>
#endif

#define TILE 64          /* outputs per tile */
#define TILE_BYTES 32    /* nibble bytes of one row per tile */
#define PAIRS_16 8       /* pairs of units whose maddubs sums fit in int16: 8 * 2 * 15 * 128 < 32768 */
#define ROW_PF 512       /* software prefetch distance along a row, in bytes (16 tiles; 256-512 measured best) */

static int64_t padded(int64_t n_ff) { return (n_ff + TILE - 1) / TILE * TILE; }

int64_t pi_q4t_bytes(int64_t n_ff, int64_t rank) {
    if (n_ff <= 0 || rank <= 0 || rank % QK) return -1;
    const int64_t np = padded(n_ff);
    return rank * (np / 2) + rank / QK * np * 2;
}

/* ---- packing ---------------------------------------------------------------------------------------------- */
typedef struct {
    const block_q4_0 *w;
    int64_t n_ff, nb, np;
    uint8_t *nib;
    uint16_t *d;
} pack_job;

/* block column b: rows 32 b .. 32 b + 31 of nib and row b of d */
static void pack_column(void *ctx, int64_t b, int thread_id) {
    (void)thread_id;
    const pack_job *j = ctx;
    const int64_t rowb = j->np / 2;
    uint8_t *nib = j->nib + b * QK * rowb;
    uint16_t *d = j->d + b * j->np;
    memset(nib, 0, (size_t)(QK * rowb));
    memset(d, 0, (size_t)j->np * sizeof(uint16_t));
    for (int64_t i = 0; i < j->n_ff; i++) {
        const block_q4_0 *blk = j->w + i * j->nb + b;
        d[i] = blk->d;
        const int64_t at = i / TILE * TILE_BYTES + (i % TILE) % TILE_BYTES;
        const int shift = (i % TILE) >= TILE_BYTES ? 4 : 0;
        for (int e = 0; e < QK / 2; e++) { /* element e: low nibble of qs[e]; element e + 16: its high nibble */
            nib[e * rowb + at] |= (uint8_t)((blk->qs[e] & 15) << shift);
            nib[(e + QK / 2) * rowb + at] |= (uint8_t)((blk->qs[e] >> 4) << shift);
        }
    }
}

int pi_q4t_pack(pi_pool *pool, const void *fc2, int64_t n_ff, int64_t rank, void *out) {
    if (pi_q4t_bytes(n_ff, rank) < 0) return -1;
    pack_job j = {fc2, n_ff, rank / QK, padded(n_ff), out, NULL};
    j.d = (uint16_t *)((uint8_t *)out + rank * (j.np / 2));
    pi_pool_run(pool, pack_column, &j, j.nb);
    return 0;
}

/* ---- logits ----------------------------------------------------------------------------------------------- */
typedef struct {
    const uint8_t *nib;
    const uint16_t *d;
    int64_t np, nb;
    const block_q8_0 *qr;    /* r as Q8_0 blocks */
    const int32_t *nz;       /* the k with qr[k] != 0, ascending */
    const int32_t *blk_beg;  /* block b's entries are nz[blk_beg[b] .. blk_beg[b + 1]) */
    const int32_t *part_beg; /* part p covers blocks part_beg[p] .. part_beg[p + 1] - 1 */
    float *partial;          /* [n_parts][np] */
} logits_job;

static inline int8_t code_of(const block_q8_0 *qr, int64_t k) { return qr[k / QK].qs[k % QK]; }

#if defined(Q4T_AVX2)
/* out[0 .. np) += block b's terms; ks: its n >= 1 non-zero units; next, n_next: the units of the part's next
 * block with any (n_next 0: none), whose rows' starts are prefetched while this block's rows end */
static void block_terms(const logits_job *j, int64_t b, const int32_t *ks, int64_t n, const int32_t *next,
                        int64_t n_next, float *out) {
    const int64_t rowb = j->np / 2, n_tiles = j->np / TILE, ns = (n + 1) / 2;
    const uint8_t *ra[QK / 2], *rb[QK / 2];
    __m256i wv[QK / 2];
    int32_t sum = 0;
    for (int e = 0; e < QK; e++) sum += j->qr[b].qs[e];
    for (int64_t s = 0; s < ns; s++) { /* pair s: units ks[2s], ks[2s + 1] (the last alone: weight 0 twice) */
        const int64_t k0 = ks[2 * s], k1 = 2 * s + 1 < n ? ks[2 * s + 1] : k0;
        ra[s] = j->nib + k0 * rowb;
        rb[s] = j->nib + k1 * rowb;
        const uint8_t c0 = (uint8_t)code_of(j->qr, k0), c1 = 2 * s + 1 < n ? (uint8_t)code_of(j->qr, k1) : 0;
        wv[s] = _mm256_set1_epi16((int16_t)(uint16_t)(c0 | (uint16_t)c1 << 8));
    }
    const __m256i m4 = _mm256_set1_epi8(15), corr = _mm256_set1_epi32(-8 * sum);
    const __m256 dr = _mm256_set1_ps(pi_h2f(j->qr[b].d));
    const uint16_t *drow = j->d + b * j->np;
    for (int64_t t = 0; t < n_tiles; t++) {
        const int64_t off = t * TILE_BYTES;
        __m256i acc[8];
        for (int v = 0; v < 8; v++) acc[v] = _mm256_setzero_si256();
        for (int64_t s0 = 0; s0 < ns; s0 += PAIRS_16) {
            const int64_t s1 = s0 + PAIRS_16 < ns ? s0 + PAIRS_16 : ns;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t s = s0; s < s1; s++) {
                if ((t & 1) == 0) { /* one prefetch per 64-byte line */
                    _mm_prefetch((const char *)ra[s] + off + ROW_PF, _MM_HINT_T0);
                    _mm_prefetch((const char *)rb[s] + off + ROW_PF, _MM_HINT_T0);
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
            /* acc[v]: outputs 8 v .. 8 v + 7 of the tile */
            acc[0] = _mm256_add_epi32(acc[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a0)));
            acc[2] = _mm256_add_epi32(acc[2], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a0, 1)));
            acc[1] = _mm256_add_epi32(acc[1], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a1)));
            acc[3] = _mm256_add_epi32(acc[3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a1, 1)));
            acc[4] = _mm256_add_epi32(acc[4], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a2)));
            acc[6] = _mm256_add_epi32(acc[6], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a2, 1)));
            acc[5] = _mm256_add_epi32(acc[5], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a3)));
            acc[7] = _mm256_add_epi32(acc[7], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a3, 1)));
        }
        if ((t & 1) == 0 && off + ROW_PF >= rowb) /* the next block's rows: their first lines */
            for (int64_t m = 0; m < n_next; m++)
                _mm_prefetch((const char *)(j->nib + next[m] * rowb) + off + ROW_PF - rowb, _MM_HINT_T0);
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
static void block_terms(const logits_job *j, int64_t b, const int32_t *ks, int64_t n, const int32_t *next,
                        int64_t n_next, float *out) {
    (void)next, (void)n_next;
    const int64_t rowb = j->np / 2;
    int32_t sum = 0;
    for (int e = 0; e < QK; e++) sum += j->qr[b].qs[e];
    const float dr = pi_h2f(j->qr[b].d);
    const uint16_t *drow = j->d + b * j->np;
    for (int64_t i = 0; i < j->np; i++) {
        const int64_t at = i / TILE * TILE_BYTES + (i % TILE) % TILE_BYTES;
        const int shift = (i % TILE) >= TILE_BYTES ? 4 : 0;
        int32_t isum = -8 * sum;
        for (int64_t m = 0; m < n; m++)
            isum += ((j->nib[ks[m] * rowb + at] >> shift) & 15) * (int32_t)code_of(j->qr, ks[m]);
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

int pi_q4t_logits(pi_pool *pool, const void *q4t, int64_t n_ff, int64_t rank, const float *r, float *logits) {
    if (pi_q4t_bytes(n_ff, rank) < 0) return -1;
    const int64_t np = padded(n_ff), nb = rank / QK;
    int64_t n_parts = pi_pool_n_threads(pool);
    if (n_parts > nb) n_parts = nb;
    /* scratch: partials, r's Q8_0 blocks, the non-zero list and the block / part boundaries */
    const size_t s_part = (size_t)(n_parts * np) * sizeof(float), s_q = ((size_t)nb * sizeof(block_q8_0) + 63) & ~(size_t)63;
    const size_t s_nz = (size_t)rank * sizeof(int32_t), s_blk = (size_t)(nb + 1) * sizeof(int32_t);
    char *s = pi_pool_scratch(pool, s_part + s_q + s_nz + s_blk + (size_t)(n_parts + 1) * sizeof(int32_t));
    if (!s) return -2;
    logits_job j = {q4t, NULL, np, nb, NULL, NULL, NULL, NULL, (float *)s};
    j.d = (const uint16_t *)((const uint8_t *)q4t + rank * (np / 2));
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
    /* part p ends at the first block boundary where the running count reaches (p + 1) / n_parts of the total */
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
