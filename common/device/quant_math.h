// quant_math.h: block-wise symmetric quantization, as ZeRO++ sends weights
// (qwZ) and gradients (qgZ) (Wang et al. 2023), shared by the cpu loops and
// the cuda kernels (kernels.h: quantize_*, dequantize_*).
//
// A tensor is cut into blocks of `block` elements, each with its own fp32
// scale s = amax / qmax (amax its largest |x|; qmax = 127 for 8 bits, 7 for
// 4). A value is q = round(x / amax · qmax), to nearest even, an integer in
// [-qmax, qmax]; it comes back as x' = q · s. So |x - x'| <= s/2, plus the
// rounding of s and of the product (a few ulps of amax): each block's error
// is set by its own largest value, not the tensor's.
//
// A block holding a NaN or an infinity has no finite scale: its scale is NaN
// (any NaN in it) or +inf, its values 0, and every value of it comes back as
// that scale. A non-finite gradient then stays non-finite through a
// quantized reduction, as an fp16 overflow does through a bf16 one: the
// norm is not finite and the loss scaler skips the step (or, in bf16, the
// run stops as diverged).
//
// A packed piece of n values (what a collective moves): ceil(n/block) fp32
// scales, then the values (an int8 each; at 4 bits two per byte, the even
// element in the low nibble), padded to a multiple of 4 bytes so that the
// next piece's scales stay aligned.
#pragma once
#include <math.h>
#include <stddef.h>
#include "bf16.h"

#define QUANT_BLOCK_DEFAULT 256
#define QUANT_BLOCK_MIN 32
#define QUANT_BLOCK_MAX 65536

// 127 for 8 bits, 7 for 4
WB_HOSTDEV static inline int quant_max(int bits) { return (1 << (bits - 1)) - 1; }

static inline size_t quant_blocks(size_t n, int block) { return (n + (size_t)block - 1) / (size_t)block; }
static inline size_t quant_value_bytes(size_t n, int bits) { return (n * (size_t)bits + 7) / 8; }
// Bytes of a packed piece of n values (see above).
static inline size_t quant_packed_bytes(size_t n, int bits, int block) {
    return 4 * quant_blocks(n, block) + (quant_value_bytes(n, bits) + 3) / 4 * 4;
}

// A block's |x| maximum as it runs: amax over the finite values, and
// whether a NaN (2) or an infinity (1) was seen.
typedef struct QuantRange {
    float amax;
    int bad;
} QuantRange;

WB_HOSTDEV static inline QuantRange quant_range_add(QuantRange r, float x) {
    float a = fabsf(x);
    if (isnan(x)) r.bad = 2;
    else if (isinf(x)) r.bad = r.bad > 1 ? 2 : 1;
    else if (a > r.amax) r.amax = a;
    return r;
}

// The block's scale: amax / qmax, or NaN, or +inf (see above).
WB_HOSTDEV static inline float quant_scale(QuantRange r, int qmax) {
    if (r.bad == 2) return NAN;
    if (r.bad == 1) return INFINITY;
    return r.amax / (float)qmax;
}

// One value: round(x / amax · qmax); 0 in a block of zeros or without a finite scale.
WB_HOSTDEV static inline int quant_value(float x, QuantRange r, int qmax) {
    if (r.bad || r.amax == 0.0f) return 0;
    float q = rintf(x / r.amax * (float)qmax);  // |x / amax| <= 1: no overflow, at most qmax
    return q > (float)qmax ? qmax : q < -(float)qmax ? -qmax : (int)q;
}

// q back to a value with its block's scale (the scale itself where it is not finite).
WB_HOSTDEV static inline float dequant_value(int q, float scale) {
    return isfinite(scale) ? (float)q * scale : scale;
}

// The same, added to acc in one rounding (fmaf on both devices, so no
// compiler contracts it differently on one of them).
WB_HOSTDEV static inline float dequant_add(float acc, int q, float scale) {
    return isfinite(scale) ? fmaf((float)q, scale, acc) : acc + scale;
}

// 4-bit values: two's complement nibbles
WB_HOSTDEV static inline unsigned char quant_nibbles(int lo, int hi) {
    return (unsigned char)((lo & 0xf) | ((hi & 0xf) << 4));
}
WB_HOSTDEV static inline int quant_nibble(unsigned char byte, int high) {
    int v = high ? byte >> 4 : byte & 0xf;
    return v >= 8 ? v - 16 : v;
}

// Value i of a piece's values (bits 8 or 4).
WB_HOSTDEV static inline int quant_load(const unsigned char *values, size_t i, int bits) {
    return bits == 8 ? (int)(signed char)values[i] : quant_nibble(values[i / 2], (int)(i & 1));
}
