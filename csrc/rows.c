/* rows.c: moving whole rows: the KV-cache store (f32 rows -> f16 cache rows), the embedding lookup (rows of
 * any weight type dequantized by id) and the transpose of the copies made at load (fc2, ffn_down). The
 * conversions are quant.c's (pi_f32_to_f16_row, pi_dequantize_row), so the values are pi_quantize's and
 * pi_dequantize's. */
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "quants.h"

void pi_store_kv(const float *x, int64_t n_tok, int64_t n_head_kv, int64_t head_dim, uint16_t *cache,
                 int64_t n_ctx, int64_t p0) {
    for (int64_t h = 0; h < n_head_kv; h++)
        for (int64_t t = 0; t < n_tok; t++)
            pi_f32_to_f16_row(x + (t * n_head_kv + h) * head_dim, cache + (h * n_ctx + p0 + t) * head_dim, head_dim);
}

/* Strips of 8 source rows walked left to right, so that each row is read as one sequential stream (rows a
 * multiple of 2 KB apart, as fc2's are, share two L1 sets: a square tile of 64 of them evicts itself); 2-byte
 * elements move as 8 x 8 blocks through SSE2 unpacks. numpy's strided copy of an F16 7B fc2 (11008 x 1024)
 * took 56-60 ms. */
#if defined(__SSE2__)
static void tr8x8_u16(const uint16_t *s, int64_t ss, uint16_t *d, int64_t ds) {
    __m128i r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128((const __m128i *)(s + i * ss));
    for (int i = 0; i < 4; i++) { /* pairs of rows interleaved by element */
        t[i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        t[i + 4] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) /* then by element pair: columns 4h .. 4h + 3 of rows 0-3 and of rows 4-7 */
        for (int i = 0; i < 2; i++) {
            u[4 * h + i] = _mm_unpacklo_epi32(t[4 * h + 2 * i], t[4 * h + 2 * i + 1]);
            u[4 * h + i + 2] = _mm_unpackhi_epi32(t[4 * h + 2 * i], t[4 * h + 2 * i + 1]);
        }
    for (int h = 0; h < 2; h++) /* rows 0-3 and 4-7 of each column joined */
        for (int i = 0; i < 2; i++) {
            const __m128i a = u[4 * h + 2 * i], b = u[4 * h + 2 * i + 1];
            _mm_storeu_si128((__m128i *)(d + (4 * h + 2 * i) * ds), _mm_unpacklo_epi64(a, b));
            _mm_storeu_si128((__m128i *)(d + (4 * h + 2 * i + 1) * ds), _mm_unpackhi_epi64(a, b));
        }
}
#endif
#define TR_LOOP(T, R0, R1, C0, C1)                                                                           \
    for (int64_t c = (C0); c < (C1); c++)                                                                    \
        for (int64_t r = (R0); r < (R1); r++) ((T *)dst)[c * rows + r] = ((const T *)src)[r * cols + c];
static void tr_block(const void *src, void *dst, int64_t rows, int64_t cols, int64_t esize, int64_t r0, int64_t r1,
                     int64_t c0, int64_t c1) {
    switch (esize) {
    case 1: TR_LOOP(uint8_t, r0, r1, c0, c1) break;
    case 2: TR_LOOP(uint16_t, r0, r1, c0, c1) break;
    case 4: TR_LOOP(uint32_t, r0, r1, c0, c1) break;
    default: TR_LOOP(uint64_t, r0, r1, c0, c1) break;
    }
}
void pi_transpose(const void *src, int64_t rows, int64_t cols, int64_t esize, void *dst) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
        const int64_t r1 = r0 + 8 < rows ? r0 + 8 : rows;
        int64_t c0 = 0;
#if defined(__SSE2__)
        if (esize == 2 && r1 - r0 == 8)
            for (; c0 + 8 <= cols; c0 += 8)
                tr8x8_u16((const uint16_t *)src + r0 * cols + c0, cols, (uint16_t *)dst + c0 * rows + r0, rows);
#endif
        tr_block(src, dst, rows, cols, esize, r0, r1, c0, cols);
    }
}

void pi_get_rows(int type, const void *w, int64_t n_cols, const int32_t *ids, int64_t n_ids, float *out) {
    int64_t rs = pi_row_size(type, n_cols);
    for (int64_t i = 0; i < n_ids; i++)
        pi_dequantize_row(type, (const char *)w + (int64_t)ids[i] * rs, out + i * n_cols, n_cols);
}
