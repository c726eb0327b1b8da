// bf16.h: the 16-bit storage type of parameters and gradients and the
// element-wise conversions that the cpu and cuda code share (both compilers
// see these static inline functions). The type is named for its default
// format, bfloat16; under --precision fp16 the same 16 bits hold an IEEE-754
// binary16 (HalfFormat says which, carried by the Device, the Comm and the
// optimizer step, never a global).
// NaNs: a NaN stays a NaN through every conversion on every device, and
// that is all the project promises. Its sign and payload are not kept
// everywhere: these functions keep them (made quiet), as the cpu's F16C
// does, but the GPU's fp16 -> fp32 (__half2float) gives every NaN 0x7fffffff
// (test_cuda_optim checks the promise on both devices).
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

// What the 16 bits of a parameter or gradient hold in this run.
typedef enum { HALF_BF16 = 0, HALF_FP16 = 1 } HalfFormat;

// binary16 -> fp32 is exact. A NaN keeps its sign and payload and comes out
// quiet, as the F16C instruction gives it.
WB_HOSTDEV static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
    else if (exp != 0) u = sign | ((exp + 112u) << 23) | (mant << 13);  // rebias 15 -> 127
    else {  // zero or subnormal: mant x 2^-24, exact in fp32
        float f = (float)mant * 5.9604644775390625e-08f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// fp32 -> binary16, round to nearest, ties to even (as F16C's vcvtps2ph with
// _MM_FROUND_TO_NEAREST_INT): 65520 and above become infinity, below 2^-14
// subnormals, at most 2^-25 zero; a NaN stays NaN, quiet.
WB_HOSTDEV static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // 65520: the tie above 65504 goes up
    if (a >= 0x38800000u) {                                    // a normal binary16
        uint32_t r = a - 0x38000000u;                          // rebias 127 -> 15
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    int e = (int)(a >> 23);
    if (e < 102) return (uint16_t)sign;  // below 2^-25: rounds to zero
    // subnormal: the 24-bit significand in units of 2^-24, shifted by 126 - e (14..24)
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

WB_HOSTDEV static inline float half_to_f32(HalfFormat fmt, bf16 h) {
    return fmt == HALF_FP16 ? f16_to_f32(h) : bf16_to_f32(h);
}
WB_HOSTDEV static inline bf16 f32_to_half(HalfFormat fmt, float f) {
    return fmt == HALF_FP16 ? f32_to_f16(f) : f32_to_bf16(f);
}

// "bf16" or "fp16"
static inline const char *half_format_name(HalfFormat fmt) { return fmt == HALF_FP16 ? "fp16" : "bf16"; }
