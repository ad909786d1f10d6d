/* vmath.h: internal (not read by cffi). Vector math shared by the kernels that need a fast exp
 * (act.c: silu, gelu; attention.c: softmax).
 *
 * exp(x) = 2^n * e^r with n = round(x / ln2) and |r| <= ln2/2; e^r by its Taylor polynomial to degree 6
 * (relative error < 1.3e-7, below f32 rounding of the result for most inputs); ln2 split in a high and a low
 * part so r is exact. NaN inputs stay NaN; large negative inputs give 0, large positive ones saturate.
 * Variants: AVX-512 (pi_vexp16, scaling by vscalefps) and AVX2+FMA (pi_vexp8, scaling through the exponent
 * bits, with inputs below -87.3 flushed to 0 since 2^n would leave the normal range). */
#ifndef PI_VMATH_H
#define PI_VMATH_H

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define PI_EXP_C2 0.5f
#define PI_EXP_C3 0.16666667f
#define PI_EXP_C4 0.041666668f
#define PI_EXP_C5 0.008333334f
#define PI_EXP_C6 0.0013888889f
#define PI_LN2_HI 0.693145751953125f
#define PI_LN2_LO 1.428606765330187e-06f
#define PI_LOG2E 1.4426950408889634f

#if defined(__AVX512F__)
static inline __m512 pi_vexp16(__m512 x) {
    /* (const, x) operand order keeps a NaN x as NaN; scalef turns a large negative n into 0 */
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(PI_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PI_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(PI_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(PI_EXP_C6), r, _mm512_set1_ps(PI_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PI_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PI_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PI_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 pi_vexp8(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ); /* these come out as 0 */
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(PI_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PI_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(PI_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(PI_EXP_C6), r, _mm256_set1_ps(PI_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PI_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PI_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PI_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

#endif
