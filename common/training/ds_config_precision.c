// ds_config_precision.c: DeepSpeed's bf16 and fp16 blocks. The enabled one
// sets --precision; fp16's loss-scaling keys set their flags when fp16 is
// the one enabled (DeepSpeed reads them only then), and are listed as
// ignored otherwise. Both enabled is refused, as DeepSpeed refuses it; bf16
// turned off with no fp16 asks for fp32 training, which the trainers lack.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "ds_config_keys.h"

// fp16.<key> -> --flag, with the values the flag takes
static const struct {
    const char *key, *flag;
    int whole;
    double lo, hi;
    int lo_open;
} SCALING[] = {
    {"fp16.loss_scale", "loss-scale", 0, 0, 1e30, 0},  // 0: dynamic
    {"fp16.initial_scale_power", "initial-scale-power", 1, 0, 64, 0},
    {"fp16.loss_scale_window", "loss-scale-window", 1, 1, INT_MAX, 0},
    {"fp16.hysteresis", "hysteresis", 1, 1, INT_MAX, 0},
    {"fp16.min_loss_scale", "min-loss-scale", 0, 0, 1e30, 1},
};

// A block's `enabled`: 1 or 0, or -1 when absent or "auto".
static int enabled(DsApply *a, const char *key) {
    json_t *v = ds_lookup(a->ds, key);
    if (!v) return -1;
    if (ds_is_auto(v)) {
        settings_key(a->s, key, "auto: --precision keeps the command line's value or its default");
        return -1;
    }
    return ds_bool(a->ds, key, v);
}

static void apply_scaling(DsApply *a, int fp16) {
    for (size_t i = 0; i < sizeof SCALING / sizeof SCALING[0]; i++) {
        json_t *v = ds_lookup(a->ds, SCALING[i].key);
        if (!v) continue;
        if (fp16 != 1) {
            settings_key(a->s, SCALING[i].key, "ignored: fp16.enabled is not true, and bf16 needs no loss scaling");
            continue;
        }
        if (ds_is_auto(v)) {
            settings_key(a->s, SCALING[i].key, "auto: --%s keeps the command line's value or its default",
                         SCALING[i].flag);
            continue;
        }
        double x = ds_number(a->ds, SCALING[i].key, v, SCALING[i].whole);
        if (x < SCALING[i].lo || (SCALING[i].lo_open && x == SCALING[i].lo) || x > SCALING[i].hi)
            ds_fail(a->ds, SCALING[i].key, "%.17g is out of range: give %s %g up to %g", x,
                    SCALING[i].lo_open ? "more than" : "from", SCALING[i].lo, SCALING[i].hi);
        char text[64];
        snprintf(text, sizeof text, SCALING[i].whole ? "%.0f" : "%.17g", x);
        ds_set_flag(a, SCALING[i].key, SCALING[i].flag, text, FROM_CONFIG, SCALING[i].key);
    }
}

void ds_apply_precision(DsApply *a) {
    int bf16 = enabled(a, "bf16.enabled"), fp16 = enabled(a, "fp16.enabled");
    if (bf16 == 1 && fp16 == 1)
        ds_fail(a->ds, "fp16.enabled", "true with bf16.enabled true: enable one of them (DeepSpeed refuses both)");
    if (bf16 == 0 && fp16 != 1)
        ds_fail(a->ds, "bf16.enabled", "false without fp16.enabled true asks for fp32 training, which the trainers "
                "lack: enable bf16 or fp16 (params and grads in 16 bits, fp32 master, m and v)");
    if (fp16 == 1) ds_set_flag(a, "fp16.enabled", "precision", "fp16", FROM_CONFIG, "fp16.enabled");
    else if (bf16 == 1) ds_set_flag(a, "bf16.enabled", "precision", "bf16", FROM_CONFIG, "bf16.enabled");
    if (fp16 == 0 && ds_lookup(a->ds, "fp16.enabled") && bf16 != 1)
        settings_key(a->s, "fp16.enabled", "checked: false (--precision keeps its value)");
    if (fp16 == 0 && bf16 == 1) settings_key(a->s, "fp16.enabled", "checked: false; bf16 is the one enabled");
    apply_scaling(a, fp16);
    json_t *c = ds_lookup(a->ds, "fp16.consecutive_hysteresis");
    if (c && !ds_is_auto(c)) {
        if (ds_bool(a->ds, "fp16.consecutive_hysteresis", c))
            ds_fail(a->ds, "fp16.consecutive_hysteresis", "true is not implemented: the tolerance of overflows is "
                    "restored when the scale rises (DeepSpeed's default, false)");
        settings_key(a->s, "fp16.consecutive_hysteresis", "checked: false, the scaler's rule (loss_scale.h)");
    }
    if (ds_lookup(a->ds, "fp16.auto_cast"))
        settings_key(a->s, "fp16.auto_cast", "ignored: the trainers' kernels take fp16 params and compute in fp32 "
                     "on the cpu; there is no autocast of the inputs");
}

// data_types.grad_accum_dtype: what the micro-batches' gradients are summed in
void ds_apply_grad_accum_dtype(DsApply *a) {
    const char *key = "data_types.grad_accum_dtype";
    json_t *v = ds_lookup(a->ds, key);
    if (!v) return;
    if (ds_is_auto(v)) {
        settings_key(a->s, key, "auto: --grad-accum-dtype keeps the command line's value or its default");
        return;
    }
    const char *s = ds_string(a->ds, key, v);
    if (strcmp(s, "fp32") && strcmp(s, "bf16") && strcmp(s, "fp16"))
        ds_fail(a->ds, key, "'%s': choose fp32, bf16 or fp16", s);
    ds_set_flag(a, key, "grad-accum-dtype", s, FROM_CONFIG, key);
}
