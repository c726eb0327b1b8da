// elementwise.h: per-element math that the cpu loops and the cuda kernels share
// (GELU and its derivative, the cross-entropy of one row, one AdamW element update).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "bf16.h"

// e^x in fp32 from operations every device rounds the same way (fma, a
// multiply, a power of two built from its bits), so it gives the same bits on
// every cpu and in every lane, and the cpu's loops vectorize it where libm's
// expf stays a call per element. n = round(x / ln2) by the 1.5 x 2^23 trick,
// r = x - n ln2 in two parts (Cody and Waite), e^r by Cephes' degree-6
// polynomial on |r| <= ln2/2 (about 1 ulp), times 2^n. x is held to
// [-87, 88] so that 2^n stays a normal number: e^x saturates at about 1.7e38
// and 1.6e-38 there; a NaN stays NaN (comparisons with it are false).
WB_HOSTDEV static inline float exp_f32(float x) {
    const float magic = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer kept in the low bits
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    float t = fmaf(x, 1.44269504088896341f, magic);
    float n = t - magic;
    float r = fmaf(n, -0.693359375f, x);  // ln2 = 0.693359375 - 2.12194440e-4, the first part exact in n
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    uint32_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t mb = 0x4B400000u;           // magic's bits: t's bits less these are n (mod 2^32)
    sb = (tb - mb + 127u) << 23;         // 2^n, n in [-126, 127]
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    return p * scale;
}

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// computed as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), the same
// function (1 + tanh u = 2 / (1 + e^-2u)) from one exponential: no libm call,
// no cancellation where tanh u is near -1.
#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBIC 0.044715f
WB_HOSTDEV static inline float gelu_f32(float x) {
    float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    return x / (1.0f + exp_f32(-2.0f * u));
}
// d/dx x s(2u) = s + x s (1 - s) 2 u', u' = sqrt(2/pi) (1 + 3 x 0.044715 x^2),
// with s (1 - s) = e / (1 + e)^2, e = e^-2u: no 1 - s to cancel where s is near 1
WB_HOSTDEV static inline float gelu_grad_f32(float x) {
    float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    float e = exp_f32(-2.0f * u), s = 1.0f / (1.0f + e);
    return s + x * (e * s * s) * 2.0f * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

// Cross-entropy of one row from its softmax statistics: -log p[t] =
// log(sum exp(z - max)) + max - z[t], with max - z[t] taken first, which is
// exact for nearby values: a confident token (z[t] = max) keeps its small loss.
WB_HOSTDEV static inline float crossentropy_f32(float sum_exp, float maxv, float zt) {
    return logf(sum_exp) + (maxv - zt);
}

// AdamW on one element (Loshchilov & Hutter): decoupled weight decay.
// Shared by the cpu kernel (cpu_adam.c: its scalar loop and the tails of its
// SIMD paths, whose vector code repeats these steps lane by lane) and the cuda
// kernel, so every one of them gives the same bits.
typedef struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_corr1, bias_corr2;  // 1 - beta^t
    float grad_scale;              // applied to the gradient first (clipping, 1/loss scale)
    HalfFormat half;               // what the 16-bit grads and params hold
} AdamWStep;

// The one NaN that adamw_element stores: positive and quiet, 0x7fc00000.
// When two NaNs meet in an operation, x86 returns the first one in the
// instruction's operand order, which the compiler picks (vfmadd132, 213 or
// 231); a GPU returns its own NaN. Storing one NaN keeps the bits of m, v and
// master the same on every path and device.
WB_HOSTDEV static inline float adamw_nan_canonical(float x) {
    return isnan(x) ? bf16_to_f32((bf16)0x7fc0) : x;
}

// Every operation's order is pinned: each multiply-add is an explicit fmaf,
// rounded once, and no other multiply is followed by an add, so a compiler
// has nothing to contract (-ffp-contract, -march) and a SIMD path can repeat
// the steps exactly. Divisions are true divisions and sqrtf is correctly
// rounded (IEEE-754, in C and by nvcc's default -prec-div/-prec-sqrt).
//   g = grad * grad_scale
//   m = beta1 m + (1 - beta1) g              (first moment)
//   v = beta2 v + ((1 - beta2) g) g          (second moment)
//   w = w - lr (mhat / (sqrt(vhat) + eps) + weight_decay w),
//       mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t)
WB_HOSTDEV static inline float adamw_element(float *master, float *m, float *v, float grad,
                                              const AdamWStep *s) {
    float g = grad * s->grad_scale;
    float mi = fmaf(s->beta1, *m, (1.0f - s->beta1) * g);
    float vi = fmaf(s->beta2, *v, ((1.0f - s->beta2) * g) * g);
    float mhat = mi / s->bias_corr1;
    float vhat = vi / s->bias_corr2;
    float w = *master;
    float update = fmaf(s->weight_decay, w, mhat / (sqrtf(vhat) + s->eps));
    w = fmaf(-s->lr, update, w);
    *m = adamw_nan_canonical(mi);
    *v = adamw_nan_canonical(vi);
    *master = adamw_nan_canonical(w);
    return *master;
}
