// ds_config_precision.c: DeepSpeed's bf16 and fp16 blocks. The enabled one
// sets --precision; fp16's loss-scaling keys set their flags when fp16 is
// the one enabled (DeepSpeed reads them only then), or "auto" (Hugging
// Face's configs: the block applies whenever the run is fp16), and are
// listed as ignored otherwise. Both enabled is refused, as DeepSpeed refuses
// it; bf16 turned off with no fp16 asks for fp32 training, which the
// trainers lack. `bfloat16` is DeepSpeed's older name of the bf16 block,
// read, as DeepSpeed reads it, when there is no `bf16`.
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

enum { ABSENT = -1, OFF = 0, ON = 1, AUTO = 2 };  // a block's `enabled`

static int enabled(DsApply *a, const char *key) {
    json_t *v = ds_lookup(a->ds, key);
    if (!v) return ABSENT;
    if (ds_is_auto(v)) {
        settings_key(a->s, key, "auto: --precision keeps the command line's value or its default");
        return AUTO;
    }
    return ds_bool(a->ds, key, v) ? ON : OFF;
}

// The bf16 block's `enabled` key: bf16's, or bfloat16's when only that block
// is given; with both, bfloat16's is listed as ignored.
static const char *bf16_enabled_key(DsApply *a) {
    int new_name = ds_lookup(a->ds, "bf16") != NULL, old_name = ds_lookup(a->ds, "bfloat16") != NULL;
    if (old_name && !new_name) return "bfloat16.enabled";
    if (old_name && ds_lookup(a->ds, "bfloat16.enabled"))
        settings_key(a->s, "bfloat16.enabled", "ignored: the config has a bf16 block too, which DeepSpeed reads "
                     "first (bfloat16 is its older name)");
    return "bf16.enabled";
}

// With fp16.enabled "auto" a key's flag is set all the same: it matters only
// when the run is fp16, and a bf16 run lists it as ignored (train_config_parse).
static void apply_scaling(DsApply *a, int fp16) {
    for (size_t i = 0; i < sizeof SCALING / sizeof SCALING[0]; i++) {
        json_t *v = ds_lookup(a->ds, SCALING[i].key);
        if (!v) continue;
        if (fp16 != ON && fp16 != AUTO) {
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
        if (ds_set_flag(a, SCALING[i].key, SCALING[i].flag, text, FROM_CONFIG, SCALING[i].key) && fp16 == AUTO)
            settings_key(a->s, SCALING[i].key, "--%s %s when the run is fp16 (fp16.enabled is auto)",
                         SCALING[i].flag, text);
    }
}

void ds_apply_precision(DsApply *a) {
    const char *bf16_key = bf16_enabled_key(a);
    int bf16 = enabled(a, bf16_key), fp16 = enabled(a, "fp16.enabled");
    if (bf16 == ON && fp16 == ON)
        ds_fail(a->ds, "fp16.enabled", "true with %s true: enable one of them (DeepSpeed refuses both)", bf16_key);
    if (bf16 == OFF && fp16 != ON && fp16 != AUTO)
        ds_fail(a->ds, bf16_key, "false without fp16.enabled true asks for fp32 training, which the trainers "
                "lack: enable bf16 or fp16 (params and grads in 16 bits, fp32 master, m and v)");
    if (fp16 == ON) ds_set_flag(a, "fp16.enabled", "precision", "fp16", FROM_CONFIG, "fp16.enabled");
    else if (bf16 == ON) ds_set_flag(a, bf16_key, "precision", "bf16", FROM_CONFIG, bf16_key);
    else if (bf16 == OFF && fp16 == AUTO && ds_set_flag(a, bf16_key, "precision", "fp16", FROM_CONFIG, bf16_key))
        settings_key(a->s, bf16_key, "--precision fp16: false, and fp16.enabled is auto");
    if (fp16 == OFF && ds_lookup(a->ds, "fp16.enabled") && bf16 != ON)
        settings_key(a->s, "fp16.enabled", "checked: false (--precision keeps its value)");
    if (fp16 == OFF && bf16 == ON) settings_key(a->s, "fp16.enabled", "checked: false; bf16 is the one enabled");
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
