// ds_config_activations.c: DeepSpeed's activation_checkpointing block. In
// DeepSpeed a model's code checkpoints layers (deepspeed.checkpointing:
// a layer keeps its input and runs its forward again in backward) and this
// block says how; here every block is such a checkpoint under --recompute
// full, and the block's switches are flags of their own:
//   partition_activations -> 3d_parallel's --partition-activations
//   cpu_checkpointing     -> --offload-activations
//   contiguous_memory_optimization, and zero_optimization's
//   contiguous_gradients  -> --contiguous-buffers (ZeRO-R's defragmentation:
//                            the saved activations and the gradients in
//                            regions allocated once)
// partition_activations or cpu_checkpointing, on, asks for --recompute full
// too (what it moves is what full recompute keeps). The other keys are
// checked or ignored, each with why. Here too, the top level's
// sequence_parallel_size (DeepSpeed-Ulysses): 3d_parallel's --cp with
// --cp-mode ulysses.
#include <stdio.h>
#include "ds_config_keys.h"

#define BLOCK "activation_checkpointing."

// A switch of the block that sets a flag when on; returns whether it set it
// (a binary without the flag lists the key as ignored, saying where it works).
static int apply_switch(DsApply *a, const char *key, const char *flag) {
    json_t *v = ds_lookup(a->ds, key);
    if (!v || ds_is_auto(v)) return 0;
    if (!ds_bool(a->ds, key, v)) {
        settings_key(a->s, key, "checked: off, as without the config (--%s not set)", flag);
        return 0;
    }
    return ds_set_flag(a, key, flag, "on", FROM_CONFIG, key);
}

// The keys without a flag are read all the same, so a value of the wrong
// type is refused as anywhere else: a switch is true or false, a count whole.
enum { SWITCH, COUNT };

static json_t *typed(DsApply *a, const char *key, int type) {
    json_t *v = ds_lookup(a->ds, key);
    if (!v || ds_is_auto(v) || json_is_null(v)) return v;
    if (type == SWITCH) {
        ds_bool(a->ds, key, v);
        return v;
    }
    double n = ds_number(a->ds, key, v, 1);
    if (n < 1) ds_fail(a->ds, key, "%g is not a count of checkpoints: give 1 or more", n);
    return v;
}

static void checked(DsApply *a, const char *key, int type, const char *what) {
    if (typed(a, key, type)) settings_key(a->s, key, "checked: %s", what);
}

static void ignored(DsApply *a, const char *key, int type, const char *why) {
    if (typed(a, key, type)) settings_key(a->s, key, "ignored: %s", why);
}

void ds_apply_activation_checkpointing(DsApply *a) {
    int partition = apply_switch(a, BLOCK "partition_activations", "partition-activations");
    int cpu = apply_switch(a, BLOCK "cpu_checkpointing", "offload-activations");
    if (partition || cpu)
        ds_set_flag(a, NULL, "recompute", "full", FROM_CONFIG,
                    cpu ? BLOCK "cpu_checkpointing: what it moves is each block's input, all that full recompute "
                          "keeps"
                        : BLOCK "partition_activations: what it splits is each block's input, all that full "
                          "recompute keeps");
    // ZeRO-R's contiguous buffers: this key and zero_optimization.contiguous_gradients are one switch here
    apply_switch(a, BLOCK "contiguous_memory_optimization", "contiguous-buffers");
    apply_switch(a, "zero_optimization.contiguous_gradients", "contiguous-buffers");
    ignored(a, BLOCK "number_checkpoints", COUNT,
            "with --recompute full every block is a checkpoint; the number only sizes DeepSpeed's contiguous buffer");
    ignored(a, BLOCK "synchronize_checkpoint_boundary", SWITCH,
            "the checkpoints' copies are ordered by events on the copy stream, never by a device-wide "
            "synchronization");
    checked(a, BLOCK "profile", SWITCH,
            "always measured: hardware FLOPs (HFU) count the recomputation; --trace shows each block's (recompute)");
}

// sequence_parallel_size: 1 splits nothing; more than 1 is DeepSpeed-Ulysses
// over that many ranks, 3d_parallel's --cp N --cp-mode ulysses, and is
// refused by a trainer without --cp (every rank would keep every position,
// a run other than the one the config describes).
void ds_apply_sequence_parallel(DsApply *a) {
    const char *key = "sequence_parallel_size";
    json_t *v = ds_lookup(a->ds, key);
    if (!v || ds_is_auto(v) || json_is_null(v)) return;
    double n = ds_number(a->ds, key, v, 1);
    if (n < 1) ds_fail(a->ds, key, "%g is not a count of ranks: give 1 or more", n);
    if (n == 1) {
        settings_key(a->s, key, "checked: 1, no sequence split, as without the config");
        return;
    }
    char text[32];
    snprintf(text, sizeof text, "%.0f", n);
    if (!ds_set_flag(a, NULL, "cp", text, FROM_CONFIG, key))
        ds_fail(a->ds, key, "%s: DeepSpeed-Ulysses' sequence split over %s ranks is 3d_parallel's --cp %s "
                "--cp-mode ulysses; %s has no sequence split: run 3d_parallel, or give 1", text, text, text,
                a->binary);
    ds_set_flag(a, NULL, "cp-mode", "ulysses", FROM_CONFIG, key);
    settings_key(a->s, key, "--cp %s --cp-mode ulysses", text);
}
