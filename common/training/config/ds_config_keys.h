// ds_config_keys.h: what ds_config.c and ds_config_keys.c share: reading a
// key of the config with its type checked, and the steps that apply the
// config's sections to a binary's flags.
#pragma once
#include <jansson.h>
#include "ds_config.h"

// A stage of the workbench: its number, binary and what it implements.
typedef struct DsStage {
    const char *id, *binary, *what;
} DsStage;
const DsStage *ds_stage_of(const char *binary);  // NULL for a binary that is no stage
int ds_stage_built(const DsStage *st);           // whether this tree has it

// Exits 2 with "--deepspeed-config FILE: KEY: message".
__attribute__((noreturn, format(printf, 3, 4))) void ds_fail(const DsConfig *ds, const char *key,
                                                             const char *fmt, ...);
json_t *ds_lookup(const DsConfig *ds, const char *key);  // "a.b.c"; NULL when absent
const char *ds_kind(const json_t *v);                    // "a string", "a list", ...
int ds_is_auto(const json_t *v);
// The value with its type checked (exit 2 naming the key otherwise).
double ds_number(const DsConfig *ds, const char *key, const json_t *v, int whole);
const char *ds_string(const DsConfig *ds, const char *key, const json_t *v);
int ds_bool(const DsConfig *ds, const char *key, const json_t *v);

typedef struct DsApply {
    const DsConfig *ds;
    FlagSpec *specs;
    int n;
    Settings *s;
    const char *binary;
    const char *scheduler;  // scheduler.type, NULL when none
} DsApply;

void ds_apply_optimizer(DsApply *a);  // optimizer.type and betas; DeepSpeed's AdamW defaults
void ds_apply_scheduler(DsApply *a);  // scheduler.type; its defaults; warmup_min_lr
void ds_apply_rules(DsApply *a);      // the keys that set one flag each
void ds_apply_checks(DsApply *a);     // switches checked, keys known to have no knob here
void ds_apply_activation_checkpointing(DsApply *a);  // ds_config_activations.c
void ds_apply_sequence_parallel(DsApply *a);        // ds_config_activations.c
void ds_apply_precision(DsApply *a);  // bf16 and fp16 blocks (ds_config_precision.c)
void ds_apply_zeropp(DsApply *a);     // ZeRO++'s keys: zero3's --quantize-weights, --hpz-size, --quantize-grads
void ds_apply_grad_accum_dtype(DsApply *a);  // data_types.grad_accum_dtype (ds_config_precision.c)

// Sets --flag to `text` through the command line's parser; `key` (NULL for
// DeepSpeed's defaults, or a flag a key implies) is named if the value is
// refused, and records what the key did. Returns 0 when this binary has no
// such flag (the key's record says where it works).
int ds_set_flag(DsApply *a, const char *key, const char *flag, const char *text, SettingFrom from, const char *why);
