// cuda_bf16.h (cuda emulator): the bfloat16 type of device code and the
// conversions the kernels use, with the device's rounding: round to nearest
// even, and every NaN becomes the canonical 0x7fff, as __float2bfloat16_rn
// does on the GPU (the CUDA 13.0 toolkit's cuda_bf16.hpp: its host version,
// __internal_float2bfloat16, returns 0x7fff for every NaN). __bfloat162float
// is a shift, which keeps a NaN's payload, as the toolkit's host version and
// its sm_80 code are (sm_90 has cvt.f32.bf16, whose NaN the header leaves unsaid).
#pragma once
#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"

struct __nv_bfloat16 {
    uint16_t __x;
};
typedef struct __nv_bfloat16 nv_bfloat16;

struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

__host__ __device__ static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__host__ __device__ static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        h.__x = 0x7fff;
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.__x = (uint16_t)(u >> 16);
    return h;
}

__host__ __device__ static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
__host__ __device__ static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
__host__ __device__ static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) {
    __nv_bfloat16 h;
    h.__x = x;
    return h;
}
