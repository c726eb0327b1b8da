// cuda_fp16.h (cuda emulator): the IEEE half type of device code and the
// conversions the kernels use, through the compiler's own _Float16 (round to
// nearest even); every NaN becomes the canonical 0x7fff, as __float2half_rn
// does on the GPU.
#pragma once
#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"

struct __half {
    uint16_t __x;
};
typedef struct __half half;

__host__ __device__ static inline float __half2float(__half h) {
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
