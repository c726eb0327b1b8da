// bf16.h: bfloat16 storage type and the element-wise conversions that the cpu
// and cuda code share (both compilers see these static inline functions).
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define WB_HOSTDEV __host__ __device__
#else
#define WB_HOSTDEV
#endif

typedef uint16_t bf16;  // upper 16 bits of an IEEE-754 binary32

WB_HOSTDEV static inline float bf16_to_f32(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// round to nearest, ties to even; NaN stays NaN
WB_HOSTDEV static inline bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
