// fit.c: memory_math's "what fits" section: for a device budget (--hbm-gb)
// at N ranks, the largest model whose model states fit per stage, and which
// presets fit where.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "memory_math.h"

#define GB 1e9

static const Col max_cols[] = {
    {"stage", "stage", 30, NULL},
    {"device_formula", "device bytes", 12, NULL},
    {"max_params", "largest Ψ (params)", 26, PRINT_GROUPED},
    {"max_params_billions", "billions", 10, "%.2f"},
};

static void max_params_table(Printer *p, const Inputs *in, double budget) {
    printer_table(p, "largest_model", max_cols, 4);
    for (int s = 0; s < STAGE_COUNT; s++) {
        double psi = stage_max_params((StageId)s, budget, in->ranks);
        Cell row[4] = {cell_str(stage_name((StageId)s)), cell_str(stage_tier_formula((StageId)s, TIER_DEVICE)),
                       cell_num(isfinite(psi) ? floor(psi) : psi), cell_num(psi / 1e9)};
        printer_row(p, row);
    }
    printer_table_end(p);
}

// Presets are the ones gpt.h names; the stages up to cpu_offload (infinity
// keeps at most its param shard on the device: the largest-Ψ table has it).
#define FIT_STAGES 5
static const Col preset_cols[] = {
    {"preset", "preset", 10, NULL},
    {"params", "Ψ (params)", 13, PRINT_GROUPED},
    {"dp_baseline_gb", "dp_baseline", 11, "%.3f"},
    {"zero1_gb", "zero1", 8, "%.3f"},
    {"zero2_gb", "zero2", 8, "%.3f"},
    {"zero3_gb", "zero3", 8, "%.3f"},
    {"cpu_offload_gb", "cpu_offload", 11, "%.3f"},
    {"fits", "fits (device GB <= budget)", 26, NULL},
};

static void preset_row(Printer *p, const Inputs *in, const char *name, double budget) {
    GPTConfig cfg;
    if (!gpt_preset(name, &cfg)) return;
    GPTLayout l;
    gpt_layout(&l, &cfg);
    Cell row[2 + FIT_STAGES + 1];
    char fits[160] = "";
    row[0] = cell_str(name);
    row[1] = cell_num((double)l.num_params);
    for (int s = 0; s < FIT_STAGES; s++) {
        StateBytes b;
        stage_state_bytes((StageId)s, l.num_params, in->ranks, &b);
        row[2 + s] = cell_num(b.tier_total[TIER_DEVICE] / GB);
        if (b.tier_total[TIER_DEVICE] <= budget) {
            size_t len = strlen(fits);
            snprintf(fits + len, sizeof fits - len, "%s%s", len ? " " : "", stage_name((StageId)s));
        }
    }
    row[2 + FIT_STAGES] = cell_str(fits[0] ? fits : "none");
    printer_row(p, row);
}

static void preset_table(Printer *p, const Inputs *in, double budget) {
    char names[256];
    snprintf(names, sizeof names, "%s", gpt_preset_names());
    printer_table(p, "presets", preset_cols, 2 + FIT_STAGES + 1);
    // gpt_preset_names() is "tiny, small, gpt2-124m, ..."
    for (char *save = NULL, *tok = strtok_r(names, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save))
        preset_row(p, in, tok, budget);
    printer_table_end(p);
}

void section_fit(Printer *p, const Inputs *in) {
    double budget = in->hbm_gb * GB;
    char title[200];
    snprintf(title, sizeof title,
             "What fits in %g GB of device memory per rank at N = %d, model states only, "
             "computed from the formula", in->hbm_gb, in->ranks);
    printer_section(p, "fit", title);
    max_params_table(p, in, budget);
    preset_table(p, in, budget);
    if (in->psi > 0 && !in->have_model) {  // with a model, the next section says what fits with the run
        char hint[1024];
        stage_fit_hint((size_t)llround(in->psi), in->ranks, budget, hint, sizeof hint);
        char label[64], psi[40];
        snprintf(label, sizeof label, "for Ψ = %s", format_grouped(in->psi, psi, sizeof psi));
        printer_str(p, "hint", label, hint);
    }
    printer_note(p, "largest Ψ solves a·Ψ + b·Ψ/N = budget for the device tier (no padding); the preset "
                    "table and the hint include states_alloc's padding.");
    printer_note(p, "cpu_offload keeps only the bf16 parameters (2Ψ) on the device, infinity only their shard "
                    "(2Ψ/N), and none with --offload-params cpu or nvme: then its device limit is the largest "
                    "layer, not Ψ.");
    printer_note(p, "activations and communication buffers come on top; the trainers' --hbm-gb budget counts "
                    "them all, and so does the next section (with --model, --batch, --seq-len).");
    printer_section_end(p);
}
