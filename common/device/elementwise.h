// elementwise.h: per-element math that the cpu loops and the cuda kernels share
// (GELU and its derivative, the cross-entropy of one row, one AdamW element update).
#pragma once
#include <math.h>
#include "bf16.h"

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#define GELU_SCALE 0.7978845608028654f
WB_HOSTDEV static inline float gelu_f32(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}
WB_HOSTDEV static inline float gelu_grad_f32(float x) {
    float cube = 0.044715f * x * x * x;
    float t = tanhf(GELU_SCALE * (x + cube));
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
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
