// cuda_fp16.h (cuda emulator): the IEEE half type of device code and the
// conversions the kernels use, through the compiler's own _Float16 (round to
// nearest even). NaNs convert as on the GPU, to a canonical NaN whatever
// their sign and payload: __float2half_rn gives 0x7fff and __half2float
// 0x7fffffff. Source: the CUDA 13.0 toolkit's cuda_fp16.hpp, whose host
// versions of the two (__internal_float2half, __internal_half2float: "discard
// sign of a NaN", every mantissa bit set) give the device's bits for its
// cvt.rn.f16.f32 and cvt.f32.f16; and an H100, where an fp16 round trip of
// four NaNs gave 0x7fffffff for each (issue 39 item 23).
#pragma once
#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"

struct __half {
    uint16_t __x;
};
typedef struct __half half;

__host__ __device__ static inline float __half2float(__half h) {
    if ((h.__x & 0x7c00u) == 0x7c00u && (h.__x & 0x3ffu)) {
        uint32_t canonical = 0x7fffffffu;
        float f;
        memcpy(&f, &canonical, sizeof f);
        return f;
    }
    _Float16 v;
    memcpy(&v, &h.__x, sizeof v);
    return (float)v;
}

__host__ __device__ static inline __half __float2half_rn(float f) {
    __half h;
    if (f != f) {
        h.__x = 0x7fff;
        return h;
    }
    _Float16 v = (_Float16)f;
    memcpy(&h.__x, &v, sizeof h.__x);
    return h;
}

__host__ __device__ static inline __half __float2half(float f) { return __float2half_rn(f); }
__host__ __device__ static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
__host__ __device__ static inline __half __ushort_as_half(unsigned short x) {
    __half h;
    h.__x = x;
    return h;
}
