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
// Shared by the cpu loop, the SIMD tail and the cuda kernel.
typedef struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_corr1, bias_corr2;  // 1 - beta^t
    float grad_scale;              // applied to the gradient first (clipping)
} AdamWStep;

WB_HOSTDEV static inline float adamw_element(float *master, float *m, float *v, float grad,
                                              const AdamWStep *s) {
    float g = grad * s->grad_scale;
    float mi = s->beta1 * *m + (1.0f - s->beta1) * g;
    float vi = s->beta2 * *v + (1.0f - s->beta2) * g * g;
    float mhat = mi / s->bias_corr1;
    float vhat = vi / s->bias_corr2;
    float w = *master;
    w -= s->lr * (mhat / (sqrtf(vhat) + s->eps) + s->weight_decay * w);
    *m = mi;
    *v = vi;
    *master = w;
    return w;
}
