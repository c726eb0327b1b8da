// cpu_adam_avx2.c: the AVX2+FMA CPU Adam path, 8 elements per step.
// adamw_element's operations (elementwise.h) in the same order, lane by lane:
// _mm256_fmadd_ps rounds once like fmaf, and _mm256_div_ps and _mm256_sqrt_ps
// are correctly rounded like / and sqrtf, so each lane has the scalar bits.
// The elements after the last full vector go to the scalar loop.
//
// The functions carry target("avx2,fma,f16c"): the file builds whatever -march
// the rest was given, and cpu_adam.c calls it only where the CPU has both.
#include "cpu_adam_paths.h"

#ifdef CPU_ADAM_HAVE_X86
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

// bf16 -> fp32 is exact: the 16 bits become the upper half of the float.
static inline AVX2_FN __m256 load_bf16x8(const bf16 *src) {
    __m128i halves = _mm_loadu_si128((const __m128i *)src);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

// f32_to_bf16 (bf16.h) on 8 lanes for the values adamw_element stores: add
// 0x7fff plus the lowest kept bit (round to nearest, ties to even) and keep
// the upper 16 bits. f32_to_bf16's NaN branch is left out: the only NaN
// stored is 0x7fc00000 (adamw_nan_canonical), which this rounding takes to
// 0x7fc0, the bits that branch gives it.
static inline AVX2_FN void store_bf16x8(bf16 *dst, __m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i kept_lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), kept_lsb));
    __m256i upper = _mm256_srli_epi32(rounded, 16);
    // packus narrows within each 128-bit half: [u0..u3 u0..u3 | u4..u7 u4..u7];
    // the permute brings qwords 0 and 2 together: u0..u7 in the low 128 bits
    __m256i packed = _mm256_packus_epi32(upper, upper);
    packed = _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(packed));
}

// 8 gradients in the run's format: fp16 through F16C's vcvtph2ps (exact)
static inline AVX2_FN __m256 load_half8(const bf16 *src, HalfFormat fmt) {
    if (fmt == HALF_FP16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
    return load_bf16x8(src);
}

// 8 params in the run's format: fp16 through vcvtps2ph, round to nearest
// even, which gives f32_to_f16's bits (its NaN 0x7fc00000 becomes 0x7e00)
static inline AVX2_FN void store_half8(bf16 *dst, __m256 x, HalfFormat fmt) {
    if (fmt == HALF_FP16)
        _mm_storeu_si128((__m128i *)dst, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else store_bf16x8(dst, x);
}

// adamw_nan_canonical on 8 lanes
static inline AVX2_FN __m256 nan_canonical8(__m256 x, __m256 canonical_nan) {
    return _mm256_blendv_ps(x, canonical_nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// LAB 05: cpu_adam_tile_avx2 -- the CPU Adam's inner loop, 8 lanes at a time
// adamw_element (elementwise.h) on 8 elements per iteration: load 8 16-bit
// gradients (load_half8, in s->half's format) and 8 of master, m, v; the same operations in the
// same order (fmadd where it has fmaf, div, sqrt), so every lane has the
// scalar bits; NaNs made canonical (nan_canonical8) before they are stored;
// 8 16-bit params out (store_half8) when param is not NULL. The last n % 8
// elements go to cpu_adam_tile_scalar.
AVX2_FN void cpu_adam_tile_avx2(float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                                size_t n, const AdamWStep *s) {
    const __m256 grad_scale = _mm256_set1_ps(s->grad_scale);
    const __m256 beta1 = _mm256_set1_ps(s->beta1), one_minus_beta1 = _mm256_set1_ps(1.0f - s->beta1);
    const __m256 beta2 = _mm256_set1_ps(s->beta2), one_minus_beta2 = _mm256_set1_ps(1.0f - s->beta2);
    const __m256 bias_corr1 = _mm256_set1_ps(s->bias_corr1);
    const __m256 bias_corr2 = _mm256_set1_ps(s->bias_corr2);
    const __m256 eps = _mm256_set1_ps(s->eps), weight_decay = _mm256_set1_ps(s->weight_decay);
    const __m256 neg_lr = _mm256_set1_ps(-s->lr);
    const __m256 canonical_nan = _mm256_set1_ps(adamw_nan_canonical(NAN));
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_mul_ps(load_half8(grad + i, s->half), grad_scale);
        __m256 mi = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(m + i), _mm256_mul_ps(one_minus_beta1, g));
        __m256 vi = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(v + i),
                                    _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
        __m256 mhat = _mm256_div_ps(mi, bias_corr1);
        __m256 vhat = _mm256_div_ps(vi, bias_corr2);
        __m256 w = _mm256_loadu_ps(master + i);
        __m256 direction = _mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), eps));
        __m256 update = _mm256_fmadd_ps(weight_decay, w, direction);
        w = nan_canonical8(_mm256_fmadd_ps(neg_lr, update, w), canonical_nan);
        _mm256_storeu_ps(m + i, nan_canonical8(mi, canonical_nan));
        _mm256_storeu_ps(v + i, nan_canonical8(vi, canonical_nan));
        _mm256_storeu_ps(master + i, w);
        if (param) store_half8(param + i, w, s->half);
    }
    cpu_adam_tile_scalar(master + i, m + i, v + i, grad + i, param ? param + i : NULL, n - i, s);
}
// LAB END
#endif
