// ds_config.h: DeepSpeed's ds_config.json (--deepspeed-config FILE), read
// with jansson. The keys that mean something here take their DeepSpeed
// meaning and become the defaults of the matching flags, set through the
// same parsing as the command line, which then overrides them:
//   train_batch_size -> --global-batch     train_micro_batch_size_per_gpu -> --batch
//   gradient_accumulation_steps -> --grad-accum (DeepSpeed's rule: batch_rule.h)
//   gradient_clipping, optimizer (AdamW: lr, betas, eps, weight_decay),
//   scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR), steps_per_print, seed,
//   zero_optimization: reduce_bucket_size, stage3_prefetch_bucket_size,
//   sub_group_size, offload_optimizer/offload_param (device, nvme_path), aio;
//   with stage 3, offload_optimizer.device -> infinity's --offload-optimizer
//   and offload_param.device -> its --offload-params.
// zero_optimization.stage and the offload devices name the binary that runs
// the config; a trainer refuses a config of another stage, naming the binary
// to run. bf16.enabled, fp16.enabled and a few switches are checked. Keys
// the workbench does not use are listed once at start-up; a key with the
// wrong type or an impossible value exits 2 with one line naming the key.
// "auto" leaves a setting to the command line or the default. A build
// without jansson (ds_config_none.c) refuses --deepspeed-config in one line.
#pragma once
#include "flags.h"
#include "gpt.h"
#include "settings.h"

typedef struct DsConfig {
    struct json_t *root;    // NULL: no config (a jansson document)
    const char *path;
    // The binary the config's stage asks for ("zero2", "cpu_offload"), ""
    // when it names no zero_optimization.stage; why: the keys that chose it.
    char binary[32];
    char binary_why[160];
    char params_device[8];  // zero_optimization.offload_param.device: none, cpu or nvme
    char optimizer_device[8];  // zero_optimization.offload_optimizer.device: none, cpu or nvme
} DsConfig;

// Reads FILE (NULL: no config) and works out its stage. Bad JSON, a stage
// combination no binary runs, or a wrong type in those keys exits 2.
void ds_config_load(DsConfig *ds, const char *path);
// A trainer: the config's stage must be `binary`; else exit 2 naming the one to run.
void ds_config_check_binary(const DsConfig *ds, const char *binary);
// Sets the flags in specs[] (found by name) from the config and records
// where each came from in *s (after settings_begin, before flags_parse).
// `binary` names the program in messages ("zero2", "memory_math").
void ds_config_apply(const DsConfig *ds, FlagSpec *specs, int n, Settings *s, const char *binary);
// The keys that need the model's shape (stage3_prefetch_bucket_size, in
// parameters, to --prefetch, in units): call once the layout is known.
void ds_config_after_model(Settings *s, const GPTLayout *l);
// The start-up line: "FILE: ignored: key, key (why), ..."; "" when nothing is ignored.
void ds_config_ignored_line(const Settings *s, char *out, size_t n);
void ds_config_free(DsConfig *ds);
