// timeline.c: memory_math --timeline STAGE, and the peak that the fit
// section counts. The formula's timeline of one training step
// (common/model/step_memory.c), the one every trainer holds its memory to
// at each phase boundary, for the model and shape given, on the cpu device
// (fp32 activations; the kernels' scratch for the threads each rank would
// have): the device's bytes by category as each phase begins, and the
// largest total at any moment, which the trainers' budget check counts.
#include <stdio.h>
#include <string.h>
#include "device.h"
#include "kernels.h"
#include "memory_math.h"
#include "step_memory.h"

#define CPU_ACT_BYTES 4  // fp32 activations on the cpu device

// A stage's spec with these inputs: its states, the plan's activations, its
// buffers and step at its flags' defaults (3d_parallel --tp T: ZeRO-1 over
// the N/T replicas, a pipeline of one stage).
static void stage_spec(StepMemorySpec *s, StageId formula, int tp3d, const Inputs *in, Partition *part) {
    const GPTLayout *l = tp3d && in->tp > 1 ? &in->tp_layout : &in->layout;
    const GPTConfig *c = &l->cfg;
    int dp = tp3d ? in->ranks / in->tp : in->ranks, threads = device_cpu_threads(in->ranks);
    GPTPlan plan = act_plan(in, in->recompute, in->offload_activations);
    if (!tp3d) {  // data parallel: the whole model, every position
        plan.sequence_parallel = plan.partition_activations = plan.cp = 0;
        plan.T = in->seq_len;
    }
    plan.contiguous = in->contiguous_buffers;
    partition_init(part, l->num_params, dp, 0);  // shards are padded to equal sizes
    double scratch = (double)kernels_cpu.scratch_bytes(threads, in->batch, in->seq_len, c->channels, c->num_heads,
                                                       l->vocab_part, l->tp_size, in->attention == GPT_ATTENTION_FLASH);
    step_memory_base(s, formula, l, &plan, CPU_ACT_BYTES, l->num_params, dp, 0, in->grad_accum, scratch, 0);
    step_memory_stage_defaults(s, formula, part);
    if (tp3d) s->shape = STEP_PIPELINE, s->schedule = PIPE_1F1B, s->stages = 1, s->stage = 0;
}

void step_peaks(StageId formula, int tp3d, const Inputs *in, RunDeviceBytes *r) {
    StepMemorySpec s;
    Partition part;
    stage_spec(&s, formula, tp3d, in, &part);
    StepMemory m;
    step_memory(&s, &m);
    r->total = m.peak;
    r->arena = m.arena_peak;
    r->high_water = m.high_water;
    step_memory_free(&m);
}

void step_peak_parts(StageId formula, int tp3d, const Inputs *in, MemPhase *phase, double bytes[CAT_COUNT]) {
    StepMemorySpec s;
    Partition part;
    stage_spec(&s, formula, tp3d, in, &part);
    StepMemory m;
    step_memory(&s, &m);
    *phase = m.peak_phase;
    memcpy(bytes, m.peak_bytes, sizeof m.peak_bytes);
    step_memory_free(&m);
}

static const MemCategory shown[] = {CAT_PARAMS, CAT_GRADS, CAT_MASTER, CAT_ADAM_M, CAT_ADAM_V, CAT_GRAD_ACCUM,
                                    CAT_ACTIVATIONS, CAT_ACT_WORKING, CAT_COMM, CAT_WORKSPACE};
#define NSHOWN (int)(sizeof shown / sizeof shown[0])

void section_timeline(Printer *p, const Inputs *in) {
    StepMemorySpec s;
    Partition part;
    int tp3d = in->timeline_tp3d;
    stage_spec(&s, (StageId)in->timeline_stage, tp3d, in, &part);
    StepMemory m;
    step_memory(&s, &m);
    char title[320];
    snprintf(title, sizeof title, "The formula's timeline of one training step of %s%s at N = %d: %s, B = %d, T = "
             "%d, %d micro-batch%s, --recompute %s%s, on the cpu device (step_memory.c; MB = 1e6 B, as each phase "
             "begins)", stage_name((StageId)in->timeline_stage), tp3d ? " --tp" : "", in->ranks, in->model, in->batch,
             in->seq_len, in->grad_accum, in->grad_accum == 1 ? "" : "es", gpt_recompute_name(in->recompute),
             in->contiguous_buffers ? ", --contiguous-buffers" : "");
    printer_section(p, "timeline", title);
    Col cols[NSHOWN + 3] = {{"boundary", "#", 4, "%.0f"}, {"phase", "phase", 34, NULL}};
    for (int k = 0; k < NSHOWN; k++) {
        const char *name = mem_category_name(shown[k]);
        cols[2 + k] = (Col){name, name, (int)strlen(name) > 9 ? (int)strlen(name) : 9, "%.3f"};
    }
    cols[NSHOWN + 2] = (Col){"total", "total", 9, "%.3f"};
    printer_table(p, "boundaries", cols, NSHOWN + 3);
    for (int b = 0; b < m.n; b++) {
        char phase[96];
        mem_phase_text(m.b[b].phase, phase, sizeof phase);
        Cell row[NSHOWN + 3];
        row[0] = cell_num(b);
        row[1] = cell_str(phase);
        double total = 0;
        for (int c = 0; c < CAT_COUNT; c++) total += (double)m.b[b].device[c];
        for (int k = 0; k < NSHOWN; k++) row[2 + k] = cell_num((double)m.b[b].device[shown[k]] / 1e6);
        row[NSHOWN + 2] = cell_num(total / 1e6);
        printer_row(p, row);
    }
    printer_table_end(p);
    char where[96];
    mem_phase_text(m.peak_phase, where, sizeof where);
    printer_num(p, "peak_mb", "peak MB (the largest total at any moment, inside a phase too)", m.peak / 1e6, "%.3f",
                NULL);
    printer_str(p, "peak_phase", "during", where);
    printer_num(p, "arena_peak_mb", "in the arena's pages MB (each block rounded up to 4096 bytes, at their largest)",
                m.arena_peak / 1e6, "%.3f", NULL);
    printer_num(p, "high_water_mb", "region MB (the end of the highest block where the arena places them, holes "
                "included)", m.high_water / 1e6, "%.3f", NULL);
    printer_note(p, "every allocation in order: the parts that live through the step (states, the stage's buffers, "
                    "the scratch), then each micro-batch's input, each unit's saved tensors from its forward to its "
                    "backward, the recompute's working set, a unit's fp32 gradients from its backward to the next%s. "
                    "A trainer of this stage holds each step's measured bytes to these boundaries and reports the "
                    "first that differs.", s.shape == STEP_GATHERED ? ", zero3's gathered units by --prefetch's "
                    "windows" : "");
    printer_section_end(p);
    step_memory_free(&m);
}
