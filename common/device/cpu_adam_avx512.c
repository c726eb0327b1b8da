// cpu_adam_avx512.c: the AVX-512 CPU Adam path, 16 elements per step; the
// same steps as cpu_adam_avx2.c on twice the lanes, with a mask register for
// the NaN select and vpmovdw for the 32 -> 16 bit narrowing (all AVX-512F).
// AVX512-BF16's vcvtneps2bf16 is not used: it flushes denormal inputs to
// zero, where f32_to_bf16 rounds them.
//
// The functions carry target("avx512f"): the file builds whatever -march the
// rest was given, and cpu_adam.c calls it only where the CPU has AVX-512F.
#include "cpu_adam_paths.h"

#ifdef CPU_ADAM_HAVE_X86
#include <immintrin.h>

#define AVX512_FN __attribute__((target("avx512f")))

// bf16 -> fp32 is exact: the 16 bits become the upper half of the float.
static inline AVX512_FN __m512 load_bf16x16(const bf16 *src) {
    __m256i halves = _mm256_loadu_si256((const __m256i *)src);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}

// f32_to_bf16 (bf16.h) on 16 lanes for the values adamw_element stores; as
// in cpu_adam_avx2.c, the NaN branch is not needed for its one NaN.
static inline AVX512_FN void store_bf16x16(bf16 *dst, __m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i kept_lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), kept_lsb));
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// 16 gradients in the run's format (vcvtph2ps on 16 lanes is AVX-512F)
static inline AVX512_FN __m512 load_half16(const bf16 *src, HalfFormat fmt) {
    if (fmt == HALF_FP16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
    return load_bf16x16(src);
}

// 16 params in the run's format, fp16 rounded to nearest even
static inline AVX512_FN void store_half16(bf16 *dst, __m512 x, HalfFormat fmt) {
    if (fmt == HALF_FP16)
        _mm256_storeu_si256((__m256i *)dst, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else store_bf16x16(dst, x);
}

// adamw_nan_canonical on 16 lanes
static inline AVX512_FN __m512 nan_canonical16(__m512 x, __m512 canonical_nan) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, canonical_nan);
}

// LAB 05: cpu_adam_tile_avx512 -- the CPU Adam's inner loop, 16 lanes at a time
// As cpu_adam_tile_avx2 (see its comment), on 16 lanes: the same order of
// operations as adamw_element, so every lane has the scalar bits.
AVX512_FN void cpu_adam_tile_avx512(float *master, float *m, float *v, const bf16 *grad,
                                    bf16 *param, size_t n, const AdamWStep *s) {
    const __m512 grad_scale = _mm512_set1_ps(s->grad_scale);
    const __m512 beta1 = _mm512_set1_ps(s->beta1), one_minus_beta1 = _mm512_set1_ps(1.0f - s->beta1);
    const __m512 beta2 = _mm512_set1_ps(s->beta2), one_minus_beta2 = _mm512_set1_ps(1.0f - s->beta2);
    const __m512 bias_corr1 = _mm512_set1_ps(s->bias_corr1);
    const __m512 bias_corr2 = _mm512_set1_ps(s->bias_corr2);
    const __m512 eps = _mm512_set1_ps(s->eps), weight_decay = _mm512_set1_ps(s->weight_decay);
    const __m512 neg_lr = _mm512_set1_ps(-s->lr);
    const __m512 canonical_nan = _mm512_set1_ps(adamw_nan_canonical(NAN));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_mul_ps(load_half16(grad + i, s->half), grad_scale);
        __m512 mi = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(m + i), _mm512_mul_ps(one_minus_beta1, g));
        __m512 vi = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(v + i),
                                    _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
        __m512 mhat = _mm512_div_ps(mi, bias_corr1);
        __m512 vhat = _mm512_div_ps(vi, bias_corr2);
        __m512 w = _mm512_loadu_ps(master + i);
        __m512 direction = _mm512_div_ps(mhat, _mm512_add_ps(_mm512_sqrt_ps(vhat), eps));
        __m512 update = _mm512_fmadd_ps(weight_decay, w, direction);
        w = nan_canonical16(_mm512_fmadd_ps(neg_lr, update, w), canonical_nan);
        _mm512_storeu_ps(m + i, nan_canonical16(mi, canonical_nan));
        _mm512_storeu_ps(v + i, nan_canonical16(vi, canonical_nan));
        _mm512_storeu_ps(master + i, w);
        if (param) store_half16(param + i, w, s->half);
    }
    cpu_adam_tile_scalar(master + i, m + i, v + i, grad + i, param ? param + i : NULL, n - i, s);
}
// LAB END
#endif
