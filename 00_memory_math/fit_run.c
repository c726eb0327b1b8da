// fit_run.c: memory_math's "what fits with this run" section. Model states
// alone do not say whether a run starts: with --model, --batch and --seq-len
// every stage's device bytes are counted as the trainers' budget check
// counts them before they allocate anything: each part at its peak by
// run_device_bytes (model states with padding, activations, workspace, the
// kernels' scratch, the stage's own buffers at its flags' defaults:
// stage_buffer_bytes), and the total as the largest sum at one moment of
// the formula's timeline of a step (timeline.c), on the cpu device.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "device.h"
#include "kernels.h"
#include "memory_math.h"

#define GB 1e9
#define CPU_ACT_BYTES 4  // fp32 activations on the cpu device

static const Col run_cols[] = {
    {"stage", "stage", 30, NULL},
    {"states_gb", "states GB", 10, "%.3f"},
    {"activations_workspace_gb", "activations+workspace GB", 24, "%.3f"},
    {"buffers_scratch_gb", "buffers+scratch GB", 18, "%.3f"},
    {"total_gb", "total GB", 9, "%.3f"},
    {"arena_gb", "arena GB", 9, "%.3f"},
    {"fits", "fits", 5, NULL},
};

// summed: the total as the parts' peaks added up, as zero3 counts its budget
// with ZeRO++'s buffers, whose times in the step the timeline does not model
static RunDeviceBytes stage_run(StageId formula, const Inputs *in, int threads, int summed, const char **name) {
    const GPTLayout *l = &in->layout;
    const GPTConfig *c = &l->cfg;
    Partition part;
    partition_init(&part, l->num_params, in->ranks, 0);  // shards are padded to equal sizes
    double buffers = stage_buffer_bytes(formula, l, &part);
    double scratch = (double)kernels_cpu.scratch_bytes(threads, in->batch, in->seq_len, c->channels, c->num_heads,
                                                       l->vocab_part, l->tp_size, in->attention == GPT_ATTENTION_FLASH);
    GPTPlan plan = act_plan(in, in->recompute, in->offload_activations);
    plan.sequence_parallel = plan.partition_activations = plan.cp = 0;  // data parallel: the whole model
    plan.T = in->seq_len;  // every position
    *name = stage_name(formula);
    RunDeviceBytes r = run_device_bytes(formula, l, &plan, l->num_params, in->ranks, CPU_ACT_BYTES, scratch, buffers, 0);
    if (!summed) step_peaks(formula, 0, in, &r);  // the parts at once, as the step runs (timeline.c)
    return r;
}

// 3d_parallel --tp T --cp C (pp 1): ZeRO-1 over the N/T replicas of each
// rank's tp part (the cp ranks among them), its activations by the plan
// (sequence parallel, partitioned, S/C positions), its buffer the reduced
// gradient shard; as its budget check counts them.
static RunDeviceBytes tp_run(const Inputs *in, int threads) {
    const GPTLayout *l = &in->tp_layout;
    const GPTConfig *c = &l->cfg;
    Partition part;
    partition_init(&part, l->num_params, in->ranks / in->tp, 0);
    double scratch = (double)kernels_cpu.scratch_bytes(threads, in->batch, in->seq_len, c->channels, c->num_heads,
                                                       l->vocab_part, l->tp_size, in->attention == GPT_ATTENTION_FLASH);
    GPTPlan plan = act_plan(in, in->recompute, in->offload_activations);
    RunDeviceBytes r = run_device_bytes(STAGE_ZERO1, l, &plan, l->num_params, in->ranks / in->tp, CPU_ACT_BYTES,
                                        scratch, (double)part.shard * sizeof(bf16), 0);
    step_peaks(STAGE_ZERO1, 1, in, &r);
    return r;
}

RunDeviceBytes run_grid_bytes(const Inputs *in) { return tp_run(in, device_cpu_threads(in->ranks)); }

RunDeviceBytes run_stage_bytes(StageId s, const Inputs *in) {
    const char *name;
    return stage_run(s, in, device_cpu_threads(in->ranks), 0, &name);
}

int run_fits_budget(const RunDeviceBytes *r, double budget) {
    return run_fits(r, budget, (double)arena_rounded((size_t)budget));  // the cpu device's region (device_cpu.c)
}

double zeropp_run_total_bytes(const Inputs *in, const ZeroPPConfig *c) {
    const char *name;
    return stage_run(STAGE_ZERO3, in, device_cpu_threads(in->ranks), 1, &name).total + zeropp_cost(in, c).device_extra;
}

// A row of the table, and the stage named in the list it falls in.
static void add_row(Printer *p, const char *name, const RunDeviceBytes *r, double budget, char *fits, char *refused) {
    int ok = run_fits_budget(r, budget);
    Cell row[7] = {cell_str(name), cell_num(r->states / GB), cell_num((r->activations + r->workspace) / GB),
                   cell_num((r->stage_buffers + r->kernel_scratch) / GB), cell_num(r->total / GB),
                   cell_num(r->high_water / GB), cell_str(ok ? "yes" : "no")};
    printer_row(p, row);
    char *list = ok ? fits : refused;
    size_t len = strlen(list);
    snprintf(list + len, 400 - len, "%s%s (%.3g GB)", len ? ", " : "", name, r->total / GB);
}

void section_fit_run(Printer *p, const Inputs *in) {
    double budget = in->hbm_gb * GB;
    // the attention scratch is per thread: the trainers' default when all N
    // ranks share this machine's cores
    int threads = device_cpu_threads(in->ranks);
    char title[240];
    snprintf(title, sizeof title,
             "What fits in %g GB per rank at N = %d with this run: %s, B = %d, T = %d, --recompute %s, on the "
             "cpu device, counted as the trainers' budget check counts them", in->hbm_gb, in->ranks,
             in->model, in->batch, in->seq_len, gpt_recompute_name(in->recompute));
    if (in->offload_activations) {
        size_t len = strlen(title);
        snprintf(title + len, sizeof title - len, " (its saved inputs offloaded to the host)");
    }
    printer_section(p, "fit_run", title);
    printer_table(p, "stages", run_cols, 7);
    char fits[400] = "", refused[400] = "";
    for (int i = 0; i < measured_stage_count(); i++) {
        const char *name;
        RunDeviceBytes r = stage_run(measured_stage(i), in, threads, 0, &name);
        add_row(p, name, &r, budget, fits, refused);
    }
    if (in->zeropp_given) {  // zero3 with the ZeRO++ switches given: its buffers beside zero3's
        const char *name;
        RunDeviceBytes r = stage_run(STAGE_ZERO3, in, threads, 1, &name);
        double extra = zeropp_cost(in, &in->zeropp).device_extra;
        r.stage_buffers += extra;
        r.total += extra;
        r.arena = r.high_water = r.total;  // not modelled: no blocks to place
        ZeroPPMode modes[4];
        zeropp_modes(in, modes);  // with switches given, theirs alone
        add_row(p, modes[0].name, &r, budget, fits, refused);
    }
    if (in->tp > 1 || in->cp > 1) {
        RunDeviceBytes r = tp_run(in, threads);
        char name[96], cp[40] = "";
        if (in->cp > 1) snprintf(cp, sizeof cp, " --cp %d%s", in->cp, in->cp_ring ? " --cp-mode ring" : "");
        snprintf(name, sizeof name, "3d_parallel --tp %d%s%s%s", in->tp, cp, in->sequence_parallel ? " --sp" : "",
                 in->partition_activations ? " --pa" : "");
        add_row(p, name, &r, budget, fits, refused);
    }
    printer_table_end(p);
    printer_str(p, "fits", "fits with this run", fits[0] ? fits : "none");
    printer_str(p, "refused", "refused by the budget check", refused[0] ? refused : "none");
    printer_note(p, "states: the stage's device tier with padding; activations+workspace: one micro-batch in "
                    "fp32 as the cpu device keeps them (saved by --recompute, and the recomputed block's working "
                    "set), with backward's scratch and the fp32 gradients of one unit; buffers+scratch: the stage's comm buffers at its defaults (buckets, gathered units) "
                    "and the largest kernel scratch for %d thread%s per rank. A trainer adds what its device "
                    "holds before the check (none on the cpu device). total: the largest sum at one moment of the "
                    "step; arena: the region its blocks need where the device's arena places them, each rounded up "
                    "to 4 kB pages, the free bytes left in holes between them included (the step's pieces replayed "
                    "through the arena in the order the trainers allocate them); fits: the total within the budget "
                    "and the arena within the budget in whole pages, as the budget check decides.", threads,
                    threads == 1 ? "" : "s");
    printer_section_end(p);
}
