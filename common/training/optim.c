// optim.c: the learning-rate schedule and the AdamW step constants. The
// element-wise update itself is adamw_element (elementwise.h), run by the
// device's kernel over the range of master weights a rank owns.
#include <math.h>
#include <string.h>
#include "trainer.h"

// DeepSpeed's schedules (deepspeed/runtime/lr_schedules.py), as a fraction of
// --lr at 0-based step s, with W = max(2, warmup) and S = the steps the
// schedule spans. Warm-up from f0 = warmup_start_frac to 1:
//   log: f0 + (1 - f0) ln(s + 1) / ln W      linear: f0 + (1 - f0) s / W
// then WarmupLR stays at 1; WarmupDecayLR goes down linearly to f0,
//   f0 + (1 - f0) max(0, (S - s) / max(1, S - W));
// WarmupCosineLR goes down along a cosine to c = min_lr_frac,
//   max(0, c + (1 - c)(1 + cos(pi (s - W + 1) / (S - W))) / 2).
// (WarmupLR's warmup_min_lr and warmup_max_lr are f0 x lr and lr.)
static double deepspeed_lr_frac(const TrainConfig *c, long step) {
    double W = c->warmup > 2 ? c->warmup : 2, s = (double)step, f0 = c->warmup_start_frac;
    double S = lr_horizon(c);
    if (s < W) {
        double gamma = strcmp(c->warmup_type, "log") == 0 ? log(s + 1) / log(W) : s / W;
        return f0 + (1 - f0) * gamma;
    }
    if (strcmp(c->lr_schedule, "WarmupLR") == 0) return 1.0;
    if (strcmp(c->lr_schedule, "WarmupDecayLR") == 0) return f0 + (1 - f0) * fmax(0.0, (S - s) / fmax(1.0, S - W));
    double cmin = c->min_lr_frac, cosine = (1 + cos(M_PI * (s - W + 1) / (S - W))) / 2;
    return fmax(0.0, cmin + (1 - cmin) * cosine);
}

long lr_horizon(const TrainConfig *c) { return c->schedule_steps > 0 ? c->schedule_steps : c->steps; }

double lr_at(const TrainConfig *c, long step) {
    if (strcmp(c->lr_schedule, "cosine") != 0) return c->lr * deepspeed_lr_frac(c, step);
    if (c->warmup > 0 && step < c->warmup) return c->lr * (double)(step + 1) / c->warmup;
    // the decay runs from the peak, at the first step after warm-up, to the floor at the horizon's last step;
    // past the horizon (a run resumed further) the rate stays at the floor. A decay of one step is the peak's.
    double min_lr = c->lr * c->min_lr_frac;
    long decay_steps = lr_horizon(c) - c->warmup;
    if (step >= lr_horizon(c)) return min_lr;
    if (decay_steps <= 1) return c->lr;
    double progress = (double)(step - c->warmup) / (double)(decay_steps - 1);
    return min_lr + 0.5 * (c->lr - min_lr) * (1.0 + cos(M_PI * progress));
}

AdamWStep adamw_step_params(const TrainConfig *c, long step, float grad_scale) {
    AdamWStep s;
    s.lr = (float)lr_at(c, step);
    s.beta1 = (float)c->beta1;
    s.beta2 = (float)c->beta2;
    s.eps = (float)c->adam_eps;
    s.weight_decay = (float)c->weight_decay;
    double t = (double)(step + 1);
    s.bias_corr1 = (float)(1.0 - pow(s.beta1, t));
    s.bias_corr2 = (float)(1.0 - pow(s.beta2, t));
    s.grad_scale = grad_scale;
    s.half = c->half;
    return s;
}
