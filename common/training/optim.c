// optim.c: the learning-rate schedule and the AdamW step constants. The
// element-wise update itself is adamw_element (elementwise.h), run by the
// device's kernel over the range of master weights a rank owns.
#include <math.h>
#include "trainer.h"

double lr_at(const TrainConfig *c, long step) {
    if (c->warmup > 0 && step < c->warmup) return c->lr * (double)(step + 1) / c->warmup;
    long decay_steps = c->steps - c->warmup;
    if (decay_steps <= 1) return c->lr;
    double progress = (double)(step - c->warmup) / (double)(decay_steps - 1);
    if (progress > 1) progress = 1;
    double min_lr = c->lr * c->min_lr_frac;
    return min_lr + 0.5 * (c->lr - min_lr) * (1.0 + cos(M_PI * progress));
}

AdamWStep adamw_step_params(const TrainConfig *c, long step, float grad_scale) {
    AdamWStep s;
    s.lr = (float)lr_at(c, step);
    s.beta1 = 0.9f;
    s.beta2 = 0.95f;
    s.eps = 1e-8f;
    s.weight_decay = (float)c->weight_decay;
    double t = (double)(step + 1);
    s.bias_corr1 = (float)(1.0 - pow(s.beta1, t));
    s.bias_corr2 = (float)(1.0 - pow(s.beta2, t));
    s.grad_scale = grad_scale;
    return s;
}
