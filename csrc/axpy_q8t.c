/* axpy_q8t.c: the AXPY over selected rows of a matrix stored in Q8 tiles (pi_axpy_q8t in pi.h; the
 * specification is axpy_tiles in powerinfer_py/kernels/ref.py).
 *
 * Layout. The model-wide sparse mode stores each projection transposed (rows = inputs) so that a skipped input
 * is a skipped row of bytes. For quantized sources the transpose is held as int8 codes q [n_in, n_cols] with
 * one f32 scale per tile of 32 inputs x 32 outputs, d [ceil(n_in / 32), ceil(n_cols / 32)]. A row is still one
 * input's contiguous bytes, and since 32 consecutive inputs share their scales, the activations can be quantized
 * per token and per tile row (a = max |h|, dx = a / 127, xq = rint(h / dx)) and a tile row's contribution
 * summed in integers:
 *     y[t, c] = sum over tile rows B, ascending, of fma(dx[t, B] * d[B, c / 32], isum[t, B, c], .)
 *     isum[t, B, c] = sum of xq[t, j] * q[rows[j], c] over the selected rows j of B.
 * isum is an exact integer (|isum| <= 32 * 127 * 127 < 2^24, so it is exact in f32 too) whichever order it is
 * summed in, so every path below gives the same bits: the decode's f32 FMAs of exact integers, the batch's
 * int8 dot products, the scalar code, on every ISA. A row whose code is 0 for every token is never read.
 *
 * One token (decode): the live tile rows are cut into parts (PARTS_PER_THREAD per thread, whole tile rows,
 * balanced by live rows); part 0 writes y, part k its own partial, added in order afterwards (as axpy.c does):
 * the same bits run to run for a thread count, one part on one thread. Inside a tile row, for each tile of
 * 64 (AVX-512) or 32 (AVX2) columns the live rows are widened to f32 and multiplied by their codes into
 * register accumulators, which enter y with one fma per vector: y is loaded and stored once per tile row and
 * column tile. The hardware prefetcher cannot guess which row comes next, so while a tile row is summed the
 * next live tile row of the part is prefetched into L2 at the same columns (one prefetch per 64 bytes of each
 * of its rows), as axpy.c does for its row groups. The version before prefetched 1 KB ahead along the current
 * rows into L1: it never fetched a row's first 1 KB, a quarter of a down-projection row of 4096 bytes. Cold
 * calls, 11008 x 4096 (the down transpose), 40-60% of the rows dropped, touched bytes against the probe over as
 * many bytes (`python benchmarks/bench_kernels.py --axpy --types Q8T --shapes 11008x4096,4096x12288
 * --prefill-tok 0 --repeat 7`, two rounds alternating with the old build, Intel AMX host): 1 thread 59-67% ->
 * 80-86%, 2 threads 44-58% -> 63-82%; 4096 x 12288 unchanged (1 thread 79-94% either way).
 *
 * Batches (n_tok > 1): the threads split the columns (chunks of 64), so each y element is one fma chain over the
 * tile rows in order, the bits of the one-token result on one thread, for any thread count. Within a chunk,
 * for SUB_COLS columns at a time and each live tile row, the live rows are repacked once into a panel the
 * integer dot products read directly, reused by every token:
 *   - AVX-512 VNNI: vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes per 32-bit lane, so the panel holds
 *     per group of 4 rows and column c the 4 codes of c (as q + 128, unsigned: q ^ 0x80), and a token's 4 codes
 *     are broadcast; sum (q + 128) xq = isum + 128 sum xq, the second term subtracted per token and tile row.
 *     Register tile: 4 tokens x 4 vectors of 16 columns (16 accumulators; each panel vector feeds 4 dot
 *     products, each broadcast 4).
 *   - AVX2 (and AVX-512 without VNNI): vpmaddwd on int16 pairs (no unsigned-byte saturation to avoid): the
 *     panel holds per pair of rows and column c the two codes as int16, a token's two codes are broadcast as
 *     one 32-bit pair. Register tile: 3 tokens x 4 vectors of 8 columns (12 accumulators + 3 broadcasts + 1).
 *   - scalar: int32 sums, the same order of fmas.
 * Rows are grouped 4 to a panel row (VNNI) or 2 (madd); a tile row's slots are padded to a multiple of 4 with
 * code 0 (their weights: any real row, they add 0).
 */
#include <math.h>
#include <string.h>

#include "pool.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define QT_DEC512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define QT_DEC256 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define QT_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__)
#define QT_MADD 1
#endif
#if defined(QT_DEC512) || defined(QT_DEC256) || defined(QT_VNNI) || defined(QT_MADD)
#include <immintrin.h>
#endif

#define QT 32                 /* inputs and outputs per scale tile */
#define INLINE static inline __attribute__((always_inline))
#define PARTS_PER_THREAD 2    /* decode with > 1 thread: parts per thread */
#define MIN_PART_ROWS 16      /* decode: fewer live rows per part than this are not worth a partial */
#define CHUNK_UNIT 64         /* batch: column chunks are multiples of this */
#define SUB_COLS 256          /* batch: columns per panel */
#define SLOT_ALIGN 4          /* slots per tile row: a multiple of this */

typedef struct {
    const int8_t *q;
    const float *d;
    int64_t n_cols, nbc, n_tok;
    int64_t n_grp;         /* live tile rows */
    const int32_t *gtile;  /* [n_grp] the tile row B of live group g */
    const float *gdx;      /* [n_tok, n_grp] the token's dx in group g (0: it adds nothing) */
    /* decode */
    const int64_t *gent;   /* [n_grp + 1] live rows of group g: entries gent[g] .. gent[g + 1] - 1 */
    const int32_t *erow;   /* [n_ent] the row of q of each entry */
    const float *exq;      /* [n_ent] its code, as f32 */
    int64_t n_part;
    const int64_t *pgrp;   /* [n_part + 1] part k = groups pgrp[k] .. pgrp[k + 1] - 1 */
    float *partial;        /* [n_part - 1, n_cols] */
    /* batches */
    const int64_t *gslot;  /* [n_grp + 1] slots of group g (a multiple of SLOT_ALIGN each) */
    const int32_t *srow;   /* [n_slot] the row of q of each slot */
    const int8_t *sxq;     /* [n_tok, n_slot] codes (0 in padding slots) */
    const int16_t *sx16;   /* [n_tok, n_slot] the same as int16 (madd path) */
    const int32_t *gcorr;  /* [n_tok, n_grp] 128 * sum of the token's codes in group g (VNNI path) */
    int64_t n_slot, cols_per_chunk;
    uint8_t *panels;       /* one panel of panel_bytes per thread */
    int64_t panel_bytes;
    float *y;
} q8t_job;

/* ---- decode -------------------------------------------------------------------------------------------- */
/* group g into y; gn: the next group of the same part (its rows are prefetched at the same columns), or -1 */
static void decode_group(const q8t_job *j, int64_t g, int64_t gn, float *y) {
    const int64_t e0 = j->gent[g], m = j->gent[g + 1] - e0, n_cols = j->n_cols;
    const float dx = j->gdx[g];
    const float *dB = j->d + (int64_t)j->gtile[g] * j->nbc;
    const int8_t *p[QT], *pn[QT];
    float xf[QT];
    for (int64_t e = 0; e < m; e++) {
        p[e] = j->q + (int64_t)j->erow[e0 + e] * n_cols;
        xf[e] = j->exq[e0 + e];
    }
    const int64_t mn = gn < 0 ? 0 : j->gent[gn + 1] - j->gent[gn];
    for (int64_t e = 0; e < mn; e++) pn[e] = j->q + (int64_t)j->erow[j->gent[gn] + e] * n_cols;
    (void)pn; /* read only by the vector paths' prefetch */
    int64_t c = 0;
#if defined(QT_DEC512)
#define CVT16(ptr) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(ptr))))
    for (; c + 64 <= n_cols; c += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t e = 0; e < mn; e++) _mm_prefetch((const char *)(pn[e] + c), _MM_HINT_T1);
        for (int64_t e = 0; e < m; e++) {
            const int8_t *pe = p[e] + c;
            const __m512 xv = _mm512_set1_ps(xf[e]);
            a0 = _mm512_fmadd_ps(xv, CVT16(pe), a0);
            a1 = _mm512_fmadd_ps(xv, CVT16(pe + 16), a1);
            a2 = _mm512_fmadd_ps(xv, CVT16(pe + 32), a2);
            a3 = _mm512_fmadd_ps(xv, CVT16(pe + 48), a3);
        }
        const __m512 s0 = _mm512_set1_ps(dx * dB[c / QT]), s1 = _mm512_set1_ps(dx * dB[c / QT + 1]);
        _mm512_storeu_ps(y + c, _mm512_fmadd_ps(s0, a0, _mm512_loadu_ps(y + c)));
        _mm512_storeu_ps(y + c + 16, _mm512_fmadd_ps(s0, a1, _mm512_loadu_ps(y + c + 16)));
        _mm512_storeu_ps(y + c + 32, _mm512_fmadd_ps(s1, a2, _mm512_loadu_ps(y + c + 32)));
        _mm512_storeu_ps(y + c + 48, _mm512_fmadd_ps(s1, a3, _mm512_loadu_ps(y + c + 48)));
    }
    for (; c + 16 <= n_cols; c += 16) {
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t e = 0; e < m; e++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(xf[e]), CVT16(p[e] + c), a0);
        _mm512_storeu_ps(y + c, _mm512_fmadd_ps(_mm512_set1_ps(dx * dB[c / QT]), a0, _mm512_loadu_ps(y + c)));
    }
#undef CVT16
#elif defined(QT_DEC256)
#define CVT8(ptr) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(ptr))))
    for (; c + 32 <= n_cols; c += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        if ((c & 63) == 0)
            for (int64_t e = 0; e < mn; e++) _mm_prefetch((const char *)(pn[e] + c), _MM_HINT_T1);
        for (int64_t e = 0; e < m; e++) {
            const int8_t *pe = p[e] + c;
            const __m256 xv = _mm256_set1_ps(xf[e]);
            a0 = _mm256_fmadd_ps(xv, CVT8(pe), a0);
            a1 = _mm256_fmadd_ps(xv, CVT8(pe + 8), a1);
            a2 = _mm256_fmadd_ps(xv, CVT8(pe + 16), a2);
            a3 = _mm256_fmadd_ps(xv, CVT8(pe + 24), a3);
        }
        const __m256 s = _mm256_set1_ps(dx * dB[c / QT]);
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(s, a0, _mm256_loadu_ps(y + c)));
        _mm256_storeu_ps(y + c + 8, _mm256_fmadd_ps(s, a1, _mm256_loadu_ps(y + c + 8)));
        _mm256_storeu_ps(y + c + 16, _mm256_fmadd_ps(s, a2, _mm256_loadu_ps(y + c + 16)));
        _mm256_storeu_ps(y + c + 24, _mm256_fmadd_ps(s, a3, _mm256_loadu_ps(y + c + 24)));
    }
    for (; c + 8 <= n_cols; c += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t e = 0; e < m; e++) a0 = _mm256_fmadd_ps(_mm256_set1_ps(xf[e]), CVT8(p[e] + c), a0);
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(_mm256_set1_ps(dx * dB[c / QT]), a0, _mm256_loadu_ps(y + c)));
    }
#undef CVT8
#endif
    for (; c < n_cols; c++) {
        int32_t isum = 0;
        for (int64_t e = 0; e < m; e++) isum += (int32_t)xf[e] * (int32_t)p[e][c];
        y[c] = fmaf(dx * dB[c / QT], (float)isum, y[c]);
    }
}

static void decode_part(void *ctx, int64_t part, int thread_id) {
    (void)thread_id;
    const q8t_job *j = ctx;
    float *y = part == 0 ? j->y : j->partial + (part - 1) * j->n_cols;
    memset(y, 0, (size_t)j->n_cols * sizeof(float));
    const int64_t g1 = j->pgrp[part + 1];
    for (int64_t g = j->pgrp[part]; g < g1; g++) decode_group(j, g, g + 1 < g1 ? g + 1 : -1, y);
}

static void reduce_parts(void *ctx, int64_t chunk, int thread_id) {
    (void)thread_id;
    const q8t_job *j = ctx;
    const int64_t c0 = chunk * j->cols_per_chunk;
    const int64_t c1 = c0 + j->cols_per_chunk < j->n_cols ? c0 + j->cols_per_chunk : j->n_cols;
    for (int64_t k = 1; k < j->n_part; k++) {
        const float *pk = j->partial + (k - 1) * j->n_cols;
        for (int64_t c = c0; c < c1; c++) j->y[c] += pk[c];
    }
}

/* ---- batches ------------------------------------------------------------------------------------------- */
/* columns [c0, c1), every token and live tile row, in scalar integers (the vector paths' column tails) */
static void batch_scalar(const q8t_job *j, int64_t c0, int64_t c1) {
    const int64_t n_cols = j->n_cols, n_grp = j->n_grp, n_slot = j->n_slot;
    for (int64_t g = 0; g < n_grp; g++) {
        const float *dB = j->d + (int64_t)j->gtile[g] * j->nbc;
        for (int64_t t = 0; t < j->n_tok; t++) {
            const float dx = j->gdx[t * n_grp + g];
            if (dx == 0.0f) continue;
            const int8_t *xq = j->sxq + t * n_slot;
            float *yt = j->y + t * n_cols;
            for (int64_t c = c0; c < c1; c++) {
                int32_t isum = 0;
                for (int64_t s = j->gslot[g]; s < j->gslot[g + 1]; s++)
                    isum += (int32_t)xq[s] * (int32_t)j->q[(int64_t)j->srow[s] * n_cols + c];
                yt[c] = fmaf(dx * dB[c / QT], (float)isum, yt[c]);
            }
        }
    }
}

#if defined(QT_VNNI)
#define BVL 16 /* columns per vector */
#define BTT 4  /* tokens per register tile */
#define BCV 4  /* vectors per register tile */
/* the panel of group g over columns [s0, s0 + 16 nv): per quad of slots k, per column c, the 4 codes (xor 0x80) */
static void build_panel(const q8t_job *j, int64_t g, int64_t s0, int64_t nv, uint8_t *panel) {
    const int64_t n_cols = j->n_cols, stride = nv * 64;
    const __m128i flip = _mm_set1_epi8((char)0x80);
    for (int64_t s = j->gslot[g], k = 0; s < j->gslot[g + 1]; s += 4, k++) {
        const int8_t *r0 = j->q + (int64_t)j->srow[s] * n_cols + s0, *r1 = j->q + (int64_t)j->srow[s + 1] * n_cols + s0;
        const int8_t *r2 = j->q + (int64_t)j->srow[s + 2] * n_cols + s0, *r3 = j->q + (int64_t)j->srow[s + 3] * n_cols + s0;
        uint8_t *o = panel + k * stride;
        for (int64_t v = 0; v < nv; v++, o += 64) {
            const __m128i x0 = _mm_loadu_si128((const __m128i *)(r0 + 16 * v)), x1 = _mm_loadu_si128((const __m128i *)(r1 + 16 * v));
            const __m128i x2 = _mm_loadu_si128((const __m128i *)(r2 + 16 * v)), x3 = _mm_loadu_si128((const __m128i *)(r3 + 16 * v));
            const __m128i a = _mm_unpacklo_epi8(x0, x1), b = _mm_unpackhi_epi8(x0, x1);
            const __m128i c = _mm_unpacklo_epi8(x2, x3), e = _mm_unpackhi_epi8(x2, x3);
            _mm_storeu_si128((__m128i *)o, _mm_xor_si128(_mm_unpacklo_epi16(a, c), flip));
            _mm_storeu_si128((__m128i *)(o + 16), _mm_xor_si128(_mm_unpackhi_epi16(a, c), flip));
            _mm_storeu_si128((__m128i *)(o + 32), _mm_xor_si128(_mm_unpacklo_epi16(b, e), flip));
            _mm_storeu_si128((__m128i *)(o + 48), _mm_xor_si128(_mm_unpackhi_epi16(b, e), flip));
        }
    }
}

/* tokens t0 .. t0 + NT - 1, vectors v0 .. v0 + NCV - 1 of the panel (column col0 + 16 v) */
INLINE void tile(const int NT, const int NCV, const q8t_job *j, int64_t g, const uint8_t *panel, int64_t nv,
                 int64_t t0, int64_t v0, int64_t col0) {
    const int64_t nq = (j->gslot[g + 1] - j->gslot[g]) / 4, stride = nv * 64;
    const int8_t *xs = j->sxq + t0 * j->n_slot + j->gslot[g];
    __m512i acc[BTT][BCV];
    for (int tt = 0; tt < NT; tt++)
        for (int v = 0; v < NCV; v++) acc[tt][v] = _mm512_setzero_si512();
    for (int64_t k = 0; k < nq; k++) {
        const uint8_t *pk = panel + k * stride + v0 * 64;
        __m512i w[BCV];
        for (int v = 0; v < NCV; v++) w[v] = _mm512_loadu_si512((const void *)(pk + 64 * v));
        for (int tt = 0; tt < NT; tt++) {
            int32_t x4;
            memcpy(&x4, xs + tt * j->n_slot + 4 * k, 4);
            const __m512i b = _mm512_set1_epi32(x4);
            for (int v = 0; v < NCV; v++) acc[tt][v] = _mm512_dpbusd_epi32(acc[tt][v], w[v], b);
        }
    }
    const float *dB = j->d + (int64_t)j->gtile[g] * j->nbc;
    for (int tt = 0; tt < NT; tt++) {
        const int64_t t = t0 + tt;
        const float dx = j->gdx[t * j->n_grp + g];
        if (dx == 0.0f) continue;
        const __m512i corr = _mm512_set1_epi32(j->gcorr[t * j->n_grp + g]);
        for (int v = 0; v < NCV; v++) {
            const int64_t c = col0 + 16 * (v0 + v);
            float *yp = j->y + t * j->n_cols + c;
            const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[tt][v], corr));
            _mm512_storeu_ps(yp, _mm512_fmadd_ps(_mm512_set1_ps(dx * dB[c / QT]), f, _mm512_loadu_ps(yp)));
        }
    }
}
#elif defined(QT_MADD)
#define BVL 8
#define BTT 3
#define BCV 4
/* the panel of group g over columns [s0, s0 + 8 nv): per pair of slots k, per column c, the 2 codes as int16 */
static void build_panel(const q8t_job *j, int64_t g, int64_t s0, int64_t nv, uint8_t *panel) {
    const int64_t n_cols = j->n_cols, stride = nv * 32;
    for (int64_t s = j->gslot[g], k = 0; s < j->gslot[g + 1]; s += 2, k++) {
        const int8_t *r0 = j->q + (int64_t)j->srow[s] * n_cols + s0, *r1 = j->q + (int64_t)j->srow[s + 1] * n_cols + s0;
        uint8_t *o = panel + k * stride;
        for (int64_t v = 0; v < nv; v++, o += 32) {
            const __m128i a = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(r0 + 8 * v)));
            const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(r1 + 8 * v)));
            _mm256_storeu_si256((__m256i *)o, _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b)));
        }
    }
}

INLINE void tile(const int NT, const int NCV, const q8t_job *j, int64_t g, const uint8_t *panel, int64_t nv,
                 int64_t t0, int64_t v0, int64_t col0) {
    const int64_t npair = (j->gslot[g + 1] - j->gslot[g]) / 2, stride = nv * 32;
    const int16_t *xs = j->sx16 + t0 * j->n_slot + j->gslot[g];
    __m256i acc[BTT][BCV];
    for (int tt = 0; tt < NT; tt++)
        for (int v = 0; v < NCV; v++) acc[tt][v] = _mm256_setzero_si256();
    for (int64_t k = 0; k < npair; k++) {
        const uint8_t *pk = panel + k * stride + v0 * 32;
        __m256i b[BTT];
        for (int tt = 0; tt < NT; tt++) {
            int32_t x2;
            memcpy(&x2, xs + tt * j->n_slot + 2 * k, 4);
            b[tt] = _mm256_set1_epi32(x2);
        }
        for (int v = 0; v < NCV; v++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(pk + 32 * v));
            for (int tt = 0; tt < NT; tt++) acc[tt][v] = _mm256_add_epi32(acc[tt][v], _mm256_madd_epi16(w, b[tt]));
        }
    }
    const float *dB = j->d + (int64_t)j->gtile[g] * j->nbc;
    for (int tt = 0; tt < NT; tt++) {
        const int64_t t = t0 + tt;
        const float dx = j->gdx[t * j->n_grp + g];
        if (dx == 0.0f) continue;
        for (int v = 0; v < NCV; v++) {
            const int64_t c = col0 + 8 * (v0 + v);
            float *yp = j->y + t * j->n_cols + c;
            const __m256 f = _mm256_cvtepi32_ps(acc[tt][v]);
            _mm256_storeu_ps(yp, _mm256_fmadd_ps(_mm256_set1_ps(dx * dB[c / QT]), f, _mm256_loadu_ps(yp)));
        }
    }
}
#endif

#if defined(QT_VNNI) || defined(QT_MADD)
/* every token over the nv vectors of the panel, in register tiles of up to BTT x BCV (NT, NCV constants) */
#define TILE_CASE(nt)                                                                                          \
    do {                                                                                                       \
        int64_t v0 = 0;                                                                                        \
        for (; v0 + BCV <= nv; v0 += BCV) tile(nt, BCV, j, g, panel, nv, t0, v0, s0);                          \
        for (; v0 < nv; v0++) tile(nt, 1, j, g, panel, nv, t0, v0, s0);                                        \
    } while (0)

static void panel_tokens(const q8t_job *j, int64_t g, const uint8_t *panel, int64_t nv, int64_t s0) {
    int64_t t0 = 0;
    for (; t0 + BTT <= j->n_tok; t0 += BTT) TILE_CASE(BTT);
    switch (j->n_tok - t0) {
    case 3: TILE_CASE(3); break;
    case 2: TILE_CASE(2); break;
    case 1: TILE_CASE(1); break;
    default: break;
    }
}
#endif

static void batch_chunk(void *ctx, int64_t chunk, int thread_id) {
    const q8t_job *j = ctx;
    const int64_t n_cols = j->n_cols;
    const int64_t c0 = chunk * j->cols_per_chunk;
    const int64_t c1 = c0 + j->cols_per_chunk < n_cols ? c0 + j->cols_per_chunk : n_cols;
    for (int64_t t = 0; t < j->n_tok; t++) memset(j->y + t * n_cols + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    int64_t cv = c0;
#if defined(QT_VNNI) || defined(QT_MADD)
    uint8_t *panel = j->panels + (int64_t)thread_id * j->panel_bytes;
    cv = c0 + (c1 - c0) / BVL * BVL;
    for (int64_t s0 = c0; s0 < cv; s0 += SUB_COLS) {
        const int64_t s1 = s0 + SUB_COLS < cv ? s0 + SUB_COLS : cv, nv = (s1 - s0) / BVL;
        for (int64_t g = 0; g < j->n_grp; g++) {
            build_panel(j, g, s0, nv, panel);
            panel_tokens(j, g, panel, nv, s0);
        }
    }
#else
    (void)thread_id;
#endif
    if (cv < c1) batch_scalar(j, cv, c1);
}

/* ---- the call ------------------------------------------------------------------------------------------ */
static inline int8_t code(float v, float id) {
    const float r = nearbyintf(v * id);
    return r > 127.0f ? 127 : r < -127.0f ? -127 : r == r ? (int8_t)r : 0;
}

static inline size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* max |h[i]| over i < n, from 0; a NaN is passed over (as fmaxf would, without its call) */
static inline float abs_max(const float *h, int64_t n) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float v = fabsf(h[i]);
        a = v > a ? v : a;
    }
    return a;
}

#define ENT_SLACK 32 /* erow / exq: room past the last entry for the vector stores of one_token_groups */

/* One token: the live tile rows and their entries straight from h (the batch path's codes, the same bits:
 * a = max |h| passing NaN over, dx = a / 127, code = rint(h * (1 / dx)) clamped to +-127, NaN -> 0; a row is
 * live when its code is not 0). Fills gent [n_grp + 1], gtile, gdx [n_grp], erow and exq; returns n_grp.
 * AVX-512: a tile row's <= 32 values in two masked vectors, the live entries packed with a register compress
 * and stored whole (ENT_SLACK: a compress to memory is slow on some cores). Elsewhere: scalar. The scalar setup
 * took ~18 ns per selected input (a down transpose of 11008 inputs at 50%: ~100 us per call). */
static int64_t one_token_groups(const float *h, const int32_t *rows, const int64_t *sg, int64_t n_g, int64_t *gent,
                                int32_t *gtile, float *gdx, int32_t *erow, float *exq) {
    int64_t n_grp = 0, n_ent = 0;
    for (int64_t G = 0; G < n_g; G++) {
        const int64_t s0 = sg[G], m = sg[G + 1] - s0, e_start = n_ent;
#if defined(QT_DEC512)
        const __mmask16 m0 = m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1);
        const __mmask16 m1 = m > 16 ? (__mmask16)((1u << (m - 16)) - 1) : 0;
        const __m512 v0 = _mm512_maskz_loadu_ps(m0, h + s0), v1 = _mm512_maskz_loadu_ps(m1, h + s0 + 16);
        const __m512 zero = _mm512_setzero_ps();
        /* max(x, acc) returns acc where x is NaN: NaN is passed over, as in the scalar loop */
        const __m512 amax = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), zero));
        const float a = _mm512_reduce_max_ps(amax);
        const float dx = a / 127.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
        const __m512 idv = _mm512_set1_ps(id), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
        __m512 r0 = _mm512_roundscale_ps(_mm512_mul_ps(v0, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r1 = _mm512_roundscale_ps(_mm512_mul_ps(v1, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 ok0 = _mm512_cmp_ps_mask(r0, r0, _CMP_ORD_Q), ok1 = _mm512_cmp_ps_mask(r1, r1, _CMP_ORD_Q);
        r0 = _mm512_max_ps(_mm512_min_ps(r0, hi), lo);
        r1 = _mm512_max_ps(_mm512_min_ps(r1, hi), lo);
        const __mmask16 l0 = m0 & ok0 & _mm512_cmp_ps_mask(r0, zero, _CMP_NEQ_UQ);
        const __mmask16 l1 = m1 & ok1 & _mm512_cmp_ps_mask(r1, zero, _CMP_NEQ_UQ);
        const __m512i w0 = _mm512_maskz_loadu_epi32(m0, rows + s0), w1 = _mm512_maskz_loadu_epi32(m1, rows + s0 + 16);
        _mm512_storeu_ps(exq + n_ent, _mm512_maskz_compress_ps(l0, r0));
        _mm512_storeu_si512((void *)(erow + n_ent), _mm512_maskz_compress_epi32(l0, w0));
        n_ent += __builtin_popcount((unsigned)l0);
        _mm512_storeu_ps(exq + n_ent, _mm512_maskz_compress_ps(l1, r1));
        _mm512_storeu_si512((void *)(erow + n_ent), _mm512_maskz_compress_epi32(l1, w1));
        n_ent += __builtin_popcount((unsigned)l1);
#else
        const float a = abs_max(h + s0, m);
        const float dx = a / 127.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
        for (int64_t s = s0; s < s0 + m; s++) {
            const int8_t cq = code(h[s], id);
            if (cq != 0) {
                erow[n_ent] = rows[s];
                exq[n_ent] = (float)cq;
                n_ent++;
            }
        }
#endif
        if (n_ent == e_start) continue;
        gent[n_grp] = e_start;
        gtile[n_grp] = rows[s0] / QT;
        gdx[n_grp] = dx;
        n_grp++;
    }
    gent[n_grp] = n_ent;
    return n_grp;
}

void pi_axpy_q8t(pi_pool *pool, const int8_t *q, const float *d, int64_t n_in, int64_t n_cols, const int32_t *rows,
                 const float *h, int64_t n_sel, int64_t n_tok, float *y) {
    (void)n_in;
    if (n_tok <= 0 || n_cols <= 0) return;
    const int n_threads = pi_pool_n_threads(pool);
    /* tile rows of the selection: group G covers selection entries sg[G] .. sg[G + 1] - 1 */
    int64_t n_g = 0;
    for (int64_t s = 0; s < n_sel; s++) n_g += s == 0 || rows[s] / QT != rows[s - 1] / QT;
    const int64_t max_part = n_threads > 1 ? (int64_t)n_threads * PARTS_PER_THREAD : 1;
    const int64_t n_slot_max = n_sel + (SLOT_ALIGN - 1) * n_g;
    /* scratch, in order */
    const size_t o_sg = 0, o_xq = o_sg + al64((size_t)(n_g + 1) * 8);
    const size_t o_dx = o_xq + al64((size_t)(n_tok * n_sel));
    const size_t o_live = o_dx + al64((size_t)(n_tok * n_g) * 4);
    const size_t o_gtile = o_live + al64((size_t)n_sel);
    const size_t o_gdx = o_gtile + al64((size_t)n_g * 4);
    const size_t o_gent = o_gdx + al64((size_t)(n_tok * n_g) * 4);
    const size_t o_erow = o_gent + al64((size_t)(n_g + 1) * 8);
    const size_t o_exq = o_erow + al64((size_t)(n_slot_max + ENT_SLACK) * 4);
    const size_t o_pgrp = o_exq + al64((size_t)(n_sel + ENT_SLACK) * 4);
    const size_t o_part = o_pgrp + al64((size_t)(max_part + 1) * 8);
    const size_t o_sxq = o_part + (n_tok == 1 ? al64((size_t)(max_part - 1) * (size_t)n_cols * 4) : 0);
    const size_t o_sx16 = o_sxq + (n_tok > 1 ? al64((size_t)(n_tok * n_slot_max)) : 0);
    const size_t o_corr = o_sx16 + (n_tok > 1 ? al64((size_t)(n_tok * n_slot_max) * 2) : 0);
    const size_t o_gslot = o_corr + (n_tok > 1 ? al64((size_t)(n_tok * n_g) * 4) : 0);
    const int64_t panel_bytes = (int64_t)al64((size_t)(QT + SLOT_ALIGN) * SUB_COLS * 2);
    const size_t o_panel = o_gslot + al64((size_t)(n_g + 1) * 8);
    const size_t total = o_panel + (n_tok > 1 ? (size_t)n_threads * (size_t)panel_bytes : 0);
    uint8_t *sc = pi_pool_scratch(pool, total);
    int64_t *sg = (int64_t *)(sc + o_sg);
    int8_t *xq = (int8_t *)(sc + o_xq);
    float *dxa = (float *)(sc + o_dx);
    uint8_t *live = sc + o_live;
    int32_t *gtile = (int32_t *)(sc + o_gtile);
    float *gdx = (float *)(sc + o_gdx);
    int64_t *gent = (int64_t *)(sc + o_gent);
    int32_t *erow = (int32_t *)(sc + o_erow);
    float *exq = (float *)(sc + o_exq);

    n_g = 0;
    for (int64_t s = 0; s < n_sel; s++)
        if (s == 0 || rows[s] / QT != rows[s - 1] / QT) sg[n_g++] = s;
    sg[n_g] = n_sel;
    int64_t n_grp = 0, n_ent = 0;
    if (n_tok == 1) {
        n_grp = one_token_groups(h, rows, sg, n_g, gent, gtile, gdx, erow, exq);
        n_ent = gent[n_grp];
    } else {
        /* quantize each token per tile row; a selected row is live when some token's code is not 0 */
        if (n_sel > 0) memset(live, 0, (size_t)n_sel);
        for (int64_t t = 0; t < n_tok; t++) {
            const float *ht = h + t * n_sel;
            int8_t *qt = xq + t * n_sel;
            for (int64_t G = 0; G < n_g; G++) {
                const float a = abs_max(ht + sg[G], sg[G + 1] - sg[G]);
                const float dx = a / 127.0f, id = dx > 0.0f ? 1.0f / dx : 0.0f;
                dxa[t * n_g + G] = dx;
                for (int64_t s = sg[G]; s < sg[G + 1]; s++) {
                    qt[s] = code(ht[s], id);
                    live[s] |= qt[s] != 0;
                }
            }
        }
        /* live groups and their live rows */
        for (int64_t G = 0; G < n_g; G++) {
            const int64_t e_start = n_ent;
            for (int64_t s = sg[G]; s < sg[G + 1]; s++)
                if (live[s]) {
                    erow[n_ent] = rows[s];
                    n_ent++;
                }
            if (n_ent == e_start) continue;
            gent[n_grp] = e_start;
            gtile[n_grp] = rows[sg[G]] / QT;
            for (int64_t t = 0; t < n_tok; t++) gdx[t * n_g + n_grp] = dxa[t * n_g + G]; /* (stride n_g, see below) */
            n_grp++;
        }
        gent[n_grp] = n_ent;
    }
    if (n_grp == 0) {
        memset(y, 0, (size_t)(n_tok * n_cols) * sizeof(float));
        return;
    }
    /* gdx with its real stride n_grp (compacted in place: row t moves to t * n_grp, never past its source) */
    for (int64_t t = 1; t < n_tok; t++) memmove(gdx + t * n_grp, gdx + t * n_g, (size_t)n_grp * sizeof(float));
    const int64_t nbc = (n_cols + QT - 1) / QT;
    q8t_job job = {.q = q, .d = d, .n_cols = n_cols, .nbc = nbc, .n_tok = n_tok, .n_grp = n_grp, .gtile = gtile,
                   .gdx = gdx, .gent = gent, .erow = erow, .exq = exq, .y = y};
    if (n_tok == 1) {
        int64_t n_part = n_ent / MIN_PART_ROWS;
        if (n_part > max_part) n_part = max_part;
        if (n_part > n_grp) n_part = n_grp;
        if (n_part < 1) n_part = 1;
        int64_t *pgrp = (int64_t *)(sc + o_pgrp);
        /* part k starts at the first group whose first live row is at or past k * n_ent / n_part */
        pgrp[0] = 0;
        for (int64_t k = 1, g = 0; k < n_part; k++) {
            const int64_t want = n_ent * k / n_part;
            while (g < n_grp && gent[g] < want) g++;
            pgrp[k] = g;
        }
        pgrp[n_part] = n_grp;
        job.n_part = n_part;
        job.pgrp = pgrp;
        job.partial = (float *)(sc + o_part);
        pi_pool_run(pool, decode_part, &job, n_part);
        if (n_part > 1) {
            job.cols_per_chunk = ((n_cols + n_threads - 1) / n_threads + 15) / 16 * 16;
            pi_pool_run(pool, reduce_parts, &job, (n_cols + job.cols_per_chunk - 1) / job.cols_per_chunk);
        }
        return;
    }
    /* batches: slots (each group's live rows, padded to SLOT_ALIGN with code 0 over a real row) */
    int64_t *gslot = (int64_t *)(sc + o_gslot);
    int32_t *srow = erow; /* rebuilt below in slot order: erow's entries are consumed group by group */
    int8_t *sxq = (int8_t *)(sc + o_sxq);
    int16_t *sx16 = (int16_t *)(sc + o_sx16);
    int32_t *gcorr = (int32_t *)(sc + o_corr);
    int64_t n_slot = 0;
    for (int64_t g = 0; g < n_grp; g++) n_slot += (gent[g + 1] - gent[g] + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    /* the slot positions of group g, back to front so that a slot never overwrites an entry not yet moved */
    gslot[n_grp] = n_slot;
    for (int64_t g = n_grp - 1; g >= 0; g--) {
        const int64_t m = gent[g + 1] - gent[g], ms = (m + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
        gslot[g] = gslot[g + 1] - ms;
        const int32_t last = erow[gent[g] + m - 1];
        for (int64_t i = ms - 1; i >= m; i--) srow[gslot[g] + i] = last;
        for (int64_t i = m - 1; i >= 0; i--) srow[gslot[g] + i] = erow[gent[g] + i];
    }
    /* codes by slot: walk the selection again in the same order */
    for (int64_t t = 0; t < n_tok; t++) {
        const int8_t *qt = xq + t * n_sel;
        int8_t *st = sxq + t * n_slot;
        int16_t *st16 = sx16 + t * n_slot;
        int32_t *ct = gcorr + t * n_grp;
        int64_t g = 0;
        for (int64_t G = 0; G < n_g; G++) {
            int64_t i = 0, sum = 0, base = g < n_grp ? gslot[g] : 0;
            for (int64_t s = sg[G]; s < sg[G + 1]; s++)
                if (live[s]) {
                    st[base + i] = qt[s];
                    st16[base + i] = qt[s];
                    sum += qt[s];
                    i++;
                }
            if (i == 0) continue;
            for (; base + i < gslot[g + 1]; i++) st[base + i] = 0, st16[base + i] = 0;
            ct[g] = (int32_t)(128 * sum);
            g++;
        }
    }
    const int64_t n_units = (n_cols + CHUNK_UNIT - 1) / CHUNK_UNIT;
    int64_t k = n_threads < n_units ? n_threads : n_units;
    if (k < 1) k = 1;
    job.gslot = gslot;
    job.srow = srow;
    job.sxq = sxq;
    job.sx16 = sx16;
    job.gcorr = gcorr;
    job.n_slot = n_slot;
    job.cols_per_chunk = (n_units + k - 1) / k * CHUNK_UNIT;
    job.panels = sc + o_panel;
    job.panel_bytes = panel_bytes;
    pi_pool_run(pool, batch_chunk, &job, (n_cols + job.cols_per_chunk - 1) / job.cols_per_chunk);
}
