// loss_scale.c: DeepSpeed's dynamic loss scaling (loss_scale.h).
#include "loss_scale.h"
#include <math.h>

void loss_scaler_init(LossScaler *s, int fp16, double static_scale, int initial_power, int window, int hysteresis,
                      double min_scale) {
    *s = (LossScaler){.enabled = fp16, .scale = 1.0, .min_scale = min_scale, .window = window,
                      .hysteresis = hysteresis, .hysteresis_left = hysteresis, .last_overflow = -1};
    if (!fp16) return;
    s->dynamic = static_scale <= 0;
    s->scale = s->dynamic ? ldexp(1.0, initial_power) : static_scale;
}

int loss_scaler_update(LossScaler *s, long step, int overflow) {
    if (!s->enabled) return 0;
    if (overflow) s->skipped++;
    if (!s->dynamic) return 0;
    if (overflow) {
        s->last_overflow = step;
        if (s->hysteresis_left > 1) {
            s->hysteresis_left--;
            return 0;
        }
        if (s->scale <= s->min_scale) return 1;
        s->scale = fmax(s->scale / 2, s->min_scale);
        return 0;
    }
    // `window` clean steps since the last overflow (or since the start,
    // counted from step -1 as DeepSpeed's last_overflow_iter)
    if ((step - s->last_overflow) % s->window == 0) {
        s->scale *= 2;
        s->hysteresis_left = s->hysteresis;
    }
    return 0;
}
