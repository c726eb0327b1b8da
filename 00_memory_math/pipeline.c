// pipeline.c: memory_math --pp P: each pipeline stage's memory, the
// staircase of a pipeline schedule. 3d_parallel's grid of --tp T x --pp P
// x dp D = N/(T·P): stage s computes its contiguous blocks (the embeddings
// on the first, the head on the last, which keeps a copy of wte), and holds
// the micro-batches its schedule keeps in flight: min(P - s, m) under 1F1B
// (the warm-up's forwards and the one in hand), all m under AFAB. Per
// stage, from the formulas: its parameters Ψ_s (tp rank 0's part), ZeRO-1's
// states over the D replicas, the activations (act_math.c: in flight x one
// micro-batch through the stage's units, and what the slots share), and the
// device's peak, the formula's timeline of the stage's step (step_memory.c,
// the one 3d_parallel holds each rank to), on the cpu device.
#include <stdio.h>
#include <string.h>
#include "act_math.h"
#include "device.h"
#include "gpt_grid.h"
#include "kernels.h"
#include "memory_math.h"
#include "pipe_schedule.h"
#include "step_memory.h"

#define CPU_ACT_BYTES 4  // fp32 activations on the cpu device
#define MB 1e6

static const Col stage_cols[] = {
    {"stage", "stage", 5, "%.0f"},
    {"units", "units", 22, NULL},
    {"params", "Ψ_s", 10, PRINT_GROUPED},
    {"in_flight", "in flight", 9, "%.0f"},
    {"states_mb", "states MB", 10, "%.3f"},
    {"activations_mb", "activations MB", 14, "%.3f"},
    {"act_working_mb", "working MB", 10, "%.3f"},
    {"peak_mb", "peak MB", 10, "%.3f"},
    {"w_waiting", "W wait", 6, "%.0f"},  // zb-h1 only
};
#define NCOLS (int)(sizeof stage_cols / sizeof stage_cols[0])

static int pipeline_in_flight(int afab, int stages, int s, int m) {
    int n = afab ? m : stages - s;
    if (n > m) n = m;
    return n > 0 ? n : 1;
}

void section_pipeline(Printer *p, const Inputs *in) {
    const GPTLayout *l = in->tp > 1 ? &in->tp_layout : &in->layout;
    const GPTConfig *c = &l->cfg;
    int P = in->pp, m = in->grad_accum, dp = in->ranks / (in->tp * P);
    char title[320];
    snprintf(title, sizeof title, "Each pipeline stage of 3d_parallel --tp %d --pp %d (dp %d) --schedule %s, m = %d "
             "micro-batches of B = %d, T = %d, --recompute %s: %s, from the formulas, on the cpu device (per tp "
             "rank 0)", in->tp, P, dp,
             in->schedule_afab ? "afab" : in->schedule_zb ? "zb-h1" : in->virtual_stages > 1 ? "interleaved" : "1f1b", m, in->batch, in->seq_len,
             gpt_recompute_name(in->recompute), in->model);
    printer_section(p, "pipeline", title);
    int zb = in->schedule_zb, ncols = zb ? NCOLS : NCOLS - 1;
    printer_table(p, "stages", stage_cols, ncols);
    int v = in->virtual_stages;
    ScheduleTable table = {0};  // zb-h1, interleaved: the stages' operations, which the walk plays
    if (zb) schedule_build(&table, PIPE_ZB_H1, P, m, 1);
    if (v > 1) schedule_build(&table, PIPE_INTERLEAVED, P, m, v);
    double scratch = (double)kernels_cpu.scratch_bytes(device_cpu_threads(in->ranks), in->batch, in->seq_len,
                                                       c->channels, c->num_heads, l->vocab_part, l->tp_size,
                                                       in->attention == GPT_ATTENTION_FLASH);
    for (int s = 0; s < P; s++) {
        int first, last;
        grid_stage_units(c->num_layers, P, s, &first, &last);
        Range r[GPT_MAX_CHUNKS + 1];  // the stage's states: its units (each interleaved chunk's), a wte copy
        int nr = v > 1 ? grid_chunk_state_ranges(l, P, v, s, r) : grid_state_ranges(l, P, s, first, last, r);
        size_t psi = 0;
        for (int k = 0; k < nr; k++) psi += r[k].count;
        int flight = pipeline_in_flight(in->schedule_afab, P, s, m);
        GPTPlan plan = act_plan(in, in->recompute, in->offload_activations);
        plan.first_unit = first, plan.last_unit = last, plan.slots = flight;
        if (v > 1) {  // chunk micro-batches in flight; slots: micro-batches between chunk 0's forward and backward
            grid_plan_chunks(c->num_layers, P, v, s, &plan);
            plan.slots = schedule_slots(&table, s);
            flight = schedule_in_flight(&table, s);
        }
        int waiting = zb ? (s + 1 < m ? s + 1 : m) : 0;  // micro-batches through B, not yet through W
        plan.w_slots = waiting;
        ActFormula a = act_formula(l, &plan, CPU_ACT_BYTES);
        StateBytes sb;
        stage_state_bytes(STAGE_ZERO1, psi, dp, &sb);
        // the stage's step: ZeRO-1 over the replicas, the reduced gradient shard beside it
        Partition part;
        partition_init(&part, psi, dp, 0);
        StepMemorySpec spec;
        step_memory_base(&spec, STAGE_ZERO1, l, &plan, CPU_ACT_BYTES, psi, dp, 0, m, scratch, 0);
        spec.shape = STEP_PIPELINE;
        spec.schedule = in->schedule_afab ? PIPE_AFAB : zb ? PIPE_ZB_H1 : v > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;
        spec.stages = P;
        spec.stage = s;
        if (zb || v > 1) spec.ops = table.ops + (size_t)s * (size_t)table.per_stage, spec.nops = table.count[s];
        step_memory_fixed(&spec, CAT_COMM, (double)part.shard * sizeof(bf16));
        StepMemory mem;
        step_memory(&spec, &mem);
        char units[96];
        if (v > 1) grid_chunk_units_text(c->num_layers, P, v, s, units, sizeof units);
        else grid_units_text(c->num_layers, P, s, units, sizeof units);
        // zb-h1, interleaved: the activations and the W stashes (the chunks) peak apart: the timeline's
        // largest (contiguous: all of them)
        double acts = zb || v > 1 ? mem.cat_peak[CAT_ACTIVATIONS] : a.saved;
        Cell row[NCOLS] = {cell_num(s), cell_str(units), cell_num((double)psi), cell_num(flight),
                           cell_num(sb.tier_total[TIER_DEVICE] / MB), cell_num(acts / MB),
                           cell_num(a.working / MB), cell_num(mem.peak / MB), cell_num(waiting)};
        printer_row(p, row);
        step_memory_free(&mem);
    }
    printer_table_end(p);
    schedule_free(&table);
    if (v > 1)
        printer_note(p, "interleaved: each stage's v chunks, stage s's chunk j the (jP + s)-th of Pv; in flight: chunk "
                        "micro-batches forwarded and not yet backward, min(2(P - s - 1) + (v - 1)P + 1, m·v); "
                        "activations: the largest of the stage's timeline (each chunk's blocks and its input, from "
                        "its arrival to its backward).");
    if (zb)
        printer_note(p, "zb-h1: 1f1b's F and B order, each backward split in B (the input's gradient) and W (the "
                        "weights'), each W in a slot 1f1b leaves idle; W wait: min(s + 1, m) micro-batches through "
                        "B and not yet through W, each block of theirs keeping a W stash, 16h + sbh(4 + 12/t)e "
                        "(the linears' inputs and output gradients, the layernorms' gradients); activations: the "
                        "largest of the stage's timeline, the in-flight micro-batches and the stashes together.");
    printer_note(p, "in flight: min(P - s, m) under 1f1b, m under afab: a staircase down the pipeline, the first "
                    "stage the highest; activations = in flight x one micro-batch through the stage's units + what "
                    "the slots share (act_math.c); states: ZeRO-1 over the dp replicas, 4Ψ_s + 12Ψ_s/D with Ψ_s "
                    "padded (the last stage's Ψ_s counts its copy of wte); peak: the formula's timeline of the "
                    "stage's step, which 3d_parallel holds every rank to (test_memory_math).");
    printer_section_end(p);
}
