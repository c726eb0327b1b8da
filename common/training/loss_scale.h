// loss_scale.h: the loss scaling of fp16 training (Micikevicius et al. 2018,
// "Mixed Precision Training"), as DeepSpeed's fp16 block defines it.
//
// The backward is seeded with the loss times `scale`, so that small
// gradients stay above fp16's smallest subnormal (2^-24); the update divides
// by it again (AdamWStep.grad_scale). A step whose gradients overflowed (any
// element not finite on any rank: the global norm, all-reduced for clipping
// anyway, is then not finite) is skipped: no update, and the optimizer's step
// (the LR schedule's and Adam's bias correction's t) does not advance, as
// DeepSpeed skips it (its engine counts skipped_steps and steps neither the
// optimizer nor the LR scheduler); the data position does advance.
//
// Dynamic scaling (DeepSpeed's DynamicLossScaler with its defaults,
// consecutive_hysteresis off): start at 2^initial_scale_power; an overflow
// uses up one of `hysteresis` tolerated overflows, and when none is left the
// scale is halved (never below min_scale); after `window` steps without an
// overflow since the last one the scale doubles and the tolerance is
// restored. An overflow at min_scale with no tolerance left ends the run
// (DeepSpeed raises "Current loss scale already at minimum").
#pragma once

typedef struct LossScaler {
    int enabled;          // fp16: scale, check, skip; bf16: scale 1, nothing skipped
    int dynamic;          // 0: a static scale (fp16.loss_scale > 0)
    double scale;         // what this step's backward is seeded with (a power of two when dynamic)
    double min_scale;
    int window;           // DeepSpeed's loss_scale_window
    int hysteresis;       // DeepSpeed's hysteresis (delayed_shift)
    int hysteresis_left;  // overflows still tolerated before the scale is halved (cur_hysteresis)
    long last_overflow;   // the 0-based step of the last overflow, -1 for none (last_overflow_iter)
    long skipped;         // steps skipped for an overflow since step 0
} LossScaler;

// fp16 with static_scale > 0: that scale; with 0: dynamic from 2^initial_power.
void loss_scaler_init(LossScaler *s, int fp16, double static_scale, int initial_power, int window, int hysteresis,
                      double min_scale);

// After 0-based step `step`: whether its gradients overflowed. Returns 1 when
// the overflow came at the minimum scale with no tolerance left (the run
// cannot go on), else 0.
int loss_scaler_update(LossScaler *s, long step, int overflow);
