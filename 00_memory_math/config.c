// config.c: memory_math --deepspeed-config, the question DeepSpeed's own
// estimators answer only per stage and from formulas: what does this config
// cost per rank, tier by tier, and does the device part fit in --hbm-gb?
// The config names the stage (zero_optimization.stage and the offload
// devices) and the batch; the figures come from the formulas the sections
// above print: model states from stage_state_bytes (with the padding the
// trainers allocate), activations from gpt_activation_bytes (what our
// trainer saves for one micro-batch, bf16 as on a GPU).
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "memory_math.h"

#define GB 1e9
#define CUDA_ACT_BYTES 2  // bf16 activations on the cuda device

static const Col source_cols[] = {
    {"setting", "setting", 14, NULL},
    {"value", "value", 10, "%.0f"},
    {"from", "from", 60, NULL},
};

static const Col key_cols[] = {
    {"key", "key", 48, NULL},
    {"effect", "what it does here", 60, NULL},
};

static const Col tier_cols[] = {
    {"tier", "tier", 7, NULL},
    {"model_states_gb", "model states GB", 15, "%.3f"},
    {"activations_gb", "activations + workspace GB", 26, "%.3f"},
    {"total_gb", "total GB", 9, "%.3f"},
};

static void sources(Printer *p, const Inputs *in) {
    static const char *const FLAGS[] = {"batch", "grad-accum", "global-batch", "ranks", "seq-len", "hbm-gb"};
    const double values[] = {in->batch, in->grad_accum, (double)in->batch * in->grad_accum * in->ranks, in->ranks,
                             in->seq_len, in->hbm_gb};
    printer_table(p, "settings", source_cols, 3);
    for (int i = 0; i < 6; i++) {
        const Setting *x = settings_find(&in->settings, FLAGS[i]);
        char from[300];
        if (strcmp(FLAGS[i], "global-batch") == 0 && x && x->from == FROM_DEFAULT)
            snprintf(from, sizeof from, "computed: batch x grad-accum x ranks");
        else settings_source(x, from, sizeof from);
        Cell row[3] = {cell_str(FLAGS[i]), cell_num(values[i]), cell_str(from)};
        printer_row(p, row);
    }
    printer_table_end(p);
}

static void keys(Printer *p, const Inputs *in) {
    printer_table(p, "keys", key_cols, 2);
    for (int i = 0; i < in->settings.nkeys; i++) {
        Cell row[2] = {cell_str(in->settings.key[i].key), cell_str(in->settings.key[i].effect)};
        printer_row(p, row);
    }
    printer_table_end(p);
}

// The config's stage per tier; returns the device total in bytes.
static double tiers(Printer *p, const Inputs *in) {
    StateBytes sb;
    stage_state_bytes((StageId)in->stage, (size_t)llround(in->psi), in->ranks, &sb);
    double acts = 0;
    if (in->have_model) {
        GPTPlan plan = gpt_plan_whole(&in->layout, in->batch, in->seq_len);
        plan.recompute = in->recompute;
        plan.attention = in->attention;
        plan.offload_activations = in->offload_activations;
        plan.loss_tiles = in->tiled_loss;
        plan.mlp_tiles = in->tiled_mlp;
        GPTActBytes a = gpt_activation_bytes(&in->layout, &plan, CUDA_ACT_BYTES);
        acts = (double)(a.total_saved + a.working + a.backward_scratch + a.grad_workspace);
    }
    printer_table(p, "per_rank", tier_cols, 4);
    for (int t = 0; t < TIER_COUNT; t++) {
        double extra = t == TIER_DEVICE ? acts : 0;
        if (sb.tier_total[t] == 0 && extra == 0) continue;
        Cell row[4] = {cell_str(mem_tier_name((MemTier)t)), cell_num(sb.tier_total[t] / GB),
                       cell_num(in->have_model ? extra / GB : NAN), cell_num((sb.tier_total[t] + extra) / GB)};
        printer_row(p, row);
    }
    printer_table_end(p);
    return sb.tier_total[TIER_DEVICE] + acts;
}

void section_config(Printer *p, const Inputs *in) {
    char title[PATH_MAX + 128];  // the config's path, whole
    snprintf(title, sizeof title, "What --deepspeed-config %s costs per rank, computed from the formulas",
             in->settings.config_path);
    printer_section(p, "deepspeed_config", title);
    printer_str(p, "stage", "stage", in->stage >= 0 ? stage_name((StageId)in->stage) : "none named");
    printer_str(p, "stage_from", "stage from",
                in->stage >= 0 ? in->stage_why : "no zero_optimization.stage: the tables above give every stage");
    sources(p, in);
    if (in->stage >= 0 && in->psi > 0) {
        double device = tiers(p, in);
        if (in->hbm_gb > 0 && in->have_model) {
            char verdict[200];
            snprintf(verdict, sizeof verdict, "%s: %.3f GB of %g GB on the device", device <= in->hbm_gb * GB ?
                     "fits" : "does not fit", device / GB, in->hbm_gb);
            printer_str(p, "fits", "fits in --hbm-gb", verdict);
        }
        printer_note(p, "model states: %s per rank with the padding states_alloc adds (section model_states); "
                        "activations and workspace: one micro-batch of B = %d, T = %d, bf16 as on a GPU "
                        "(section activations)%s.", stage_formula((StageId)in->stage), in->batch, in->seq_len,
                     in->have_model ? "" : "; give --model for them and for a fit verdict");
        printer_note(p, "communication buffers (zero2's buckets, zero3's gathered units) and the device "
                        "runtime's own memory come on top.");
    }
    keys(p, in);
    printer_section_end(p);
}
