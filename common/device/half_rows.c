// half_rows.c: the row conversions of half_rows.h.
#include "half_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HALF_HAVE_X86 1
#define F16C_FN __attribute__((target("avx,f16c")))

static F16C_FN void f16_to_f32_f16c(float *dst, const bf16 *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

static F16C_FN void f32_to_f16_f16c(bf16 *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = f32_to_f16(src[i]);
}
#endif

const char *half_rows_unsupported_reason(HalfRowsPath p) {
    if (p == HALF_ROWS_SCALAR) return NULL;
#ifdef HALF_HAVE_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx")) return "the CPU reports no avx";
    if (!__builtin_cpu_supports("f16c")) return "the CPU reports no f16c";
    return NULL;
#else
    return "built for a CPU other than x86-64 (F16C is an x86 instruction set)";
#endif
}

HalfRowsPath half_rows_best_path(void) {
    return half_rows_unsupported_reason(HALF_ROWS_F16C) ? HALF_ROWS_SCALAR : HALF_ROWS_F16C;
}

void half_to_f32_row(HalfRowsPath p, HalfFormat fmt, float *dst, const bf16 *src, size_t n) {
    if (fmt == HALF_BF16) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
        return;
    }
#ifdef HALF_HAVE_X86
    if (p == HALF_ROWS_F16C) {
        f16_to_f32_f16c(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

void f32_to_half_row(HalfRowsPath p, HalfFormat fmt, bf16 *dst, const float *src, size_t n) {
    if (fmt == HALF_BF16) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
        return;
    }
#ifdef HALF_HAVE_X86
    if (p == HALF_ROWS_F16C) {
        f32_to_f16_f16c(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}
