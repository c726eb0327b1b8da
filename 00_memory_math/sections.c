// sections.c: the calculator sections of memory_math: inputs, model states
// per stage and tier, communication volume. Every number here is computed
// from a formula in common/model/mem_math.c, and the section titles say so.
#include <math.h>
#include <stdio.h>
#include "memory_math.h"

#define GB 1e9
#define GIB 1073741824.0

void section_inputs(Printer *p, const Inputs *in) {
    printer_section(p, "inputs", "Inputs");
    if (in->psi > 0) printer_num(p, "params", "Ψ (parameters)", in->psi, PRINT_GROUPED, NULL);
    else printer_num(p, "params", "Ψ (parameters)", NAN, PRINT_GROUPED, NULL);
    printer_str(p, "params_from", "Ψ from", in->psi_source);
    if (in->have_model)  // Ψ as the trainers allocate it: wte with V rounded up to 128 rows (llm.c's Vp)
        printer_num(p, "vocab_padding_params", "of Ψ, wte's padding rows ((Vp - V)·C)",
                    (double)gpt_padding_params(&in->layout), PRINT_GROUPED, NULL);
    printer_num(p, "ranks", "N (data-parallel ranks)", in->ranks, "%.0f", NULL);
    printer_str(p, "ranks_from", "N from", in->ranks_source);
    if (in->have_model) {
        printer_str(p, "model", "model", in->model);
        printer_num(p, "batch", "B (micro-batch per rank)", in->batch, "%.0f", NULL);
        printer_num(p, "seq_len", "T (sequence length)", in->seq_len, "%.0f", NULL);
    }
    printer_num(p, "grad_accum", "k (micro-batches per step)", in->grad_accum, "%.0f", NULL);
    if (in->hbm_gb > 0) printer_num(p, "hbm_gb", "device budget", in->hbm_gb, "%g", "GB");
    printer_section_end(p);
}

// One row of the model-state table: a tier of a stage.
typedef struct StateRow {
    StageId stage;
    MemTier tier;
    const char *tier_label;
} StateRow;

static const StateRow state_rows[] = {
    {STAGE_DP, TIER_DEVICE, "device"},
    {STAGE_ZERO1, TIER_DEVICE, "device"},
    {STAGE_ZERO2, TIER_DEVICE, "device"},
    {STAGE_ZERO3, TIER_DEVICE, "device"},
    {STAGE_OFFLOAD, TIER_DEVICE, "device"},
    {STAGE_OFFLOAD, TIER_PINNED, "host"},
    {STAGE_OFFLOAD_DPU, TIER_DEVICE, "device"},
    {STAGE_OFFLOAD_DPU, TIER_PINNED, "host"},
    {STAGE_INFINITY, TIER_DEVICE, "device"},
    {STAGE_INFINITY, TIER_PINNED, "host"},
    {STAGE_INFINITY, TIER_NVME, "nvme"},
    {STAGE_INFINITY_CPU, TIER_DEVICE, "device"},
    {STAGE_INFINITY_CPU, TIER_PINNED, "host"},
    {STAGE_INFINITY_CPU, TIER_NVME, "nvme"},
    {STAGE_INFINITY_NVME, TIER_DEVICE, "device"},
    {STAGE_INFINITY_NVME, TIER_PINNED, "host"},
    {STAGE_INFINITY_NVME, TIER_NVME, "nvme"},
};

static const Col state_cols[] = {
    {"stage", "stage", 30, NULL},
    {"tier", "tier", 6, NULL},
    {"formula", "formula", 10, NULL},
    {"formula_gb", "GB (1e9)", 9, "%.3f"},
    {"formula_gib", "GiB (2^30)", 10, "%.3f"},
    {"formula_bytes", "formula bytes", 17, PRINT_GROUPED},
    {"padded_bytes", "with padding (bytes)", 21, PRINT_GROUPED},
};

static void padding_values(Printer *p, const Inputs *in) {
    Partition part;
    partition_init(&part, (size_t)llround(in->psi), in->ranks, 0);
    printer_num(p, "params_padded", "Ψ_pad (Ψ rounded up to a multiple of N × 64)", (double)part.padded,
                PRINT_GROUPED, NULL);
    printer_num(p, "padding_elements", "padding (Ψ_pad - Ψ)", (double)(part.padded - part.num_params),
                PRINT_GROUPED, "elements");
    printer_num(p, "shard_elements", "shard (Ψ_pad / N)", (double)part.shard, PRINT_GROUPED, "elements per rank");
}

void section_model_states(Printer *p, const Inputs *in) {
    printer_section(p, "model_states",
                    "Model states per rank, computed from the formula "
                    "(2 bf16 params + 2 bf16 grads + 12 fp32 master/m/v = 16 bytes per parameter)");
    padding_values(p, in);
    size_t psi = (size_t)llround(in->psi);
    printer_table(p, "rows", state_cols, 7);
    for (size_t i = 0; i < sizeof state_rows / sizeof state_rows[0]; i++) {
        const StateRow *r = &state_rows[i];
        StateBytes paper, alloc;
        stage_formula_state_bytes(r->stage, in->psi, in->ranks, &paper);
        stage_state_bytes(r->stage, psi, in->ranks, &alloc);
        double b = paper.tier_total[r->tier];
        Cell row[7] = {cell_str(stage_name(r->stage)), cell_str(r->tier_label),
                       cell_str(stage_tier_formula(r->stage, r->tier)), cell_num(b / GB),
                       cell_num(b / GIB), cell_num(b), cell_num(alloc.tier_total[r->tier])};
        printer_row(p, row);
    }
    printer_table_end(p);
    printer_note(p, "formula: Rajbhandari et al., ZeRO (2020); the paper's example Ψ = 7.5B, N = 64 gives "
                    "120, 31.4, 16.6 and 1.9 GB for dp_baseline, zero1, zero2, zero3.");
    printer_note(p, "with padding: the same closed forms with shards of Ψ_pad/N and full bf16 buffers of "
                    "Ψ_pad in the partitioned stages (equal shards for in-place collectives); dp_baseline has no "
                    "shards and no padding. --measure sets what the allocator really allocates beside them.");
    printer_note(p, "cpu_offload keeps its reduce-scattered gradient shard (2Ψ/N) in pinned host memory "
                    "beside the CPU Adam; ZeRO-Offload's device 2Ψ + 2Ψ/N counts it on the device. With "
                    "--dpu it keeps two (the CPU Adam applies step i's while step i+1's arrive).");
    printer_note(p, "infinity keeps master, m and v on NVMe and its gradient shard in pinned host memory "
                    "beside the CPU Adam; --offload-params puts the bf16 param shard on the device (none), "
                    "in pinned host memory (cpu) or on NVMe (nvme). Gathered units, swap and staging "
                    "buffers come on top (not model states; stage 06 measures them).");
    printer_section_end(p);
}

static const Col comm_cols[] = {
    {"stage", "stage", 30, NULL},
    {"formula", "formula (elements)", 18, NULL},
    {"elements", "elements", 17, PRINT_GROUPED},
    {"bytes_bf16", "bytes (bf16)", 17, PRINT_GROUPED},
    {"gb_bf16", "GB (bf16)", 9, "%.3f"},
};

static const Col xfer_cols[] = {
    {"stage", "stage", 30, NULL},
    {"direction", "between tiers", 14, NULL},
    {"formula", "formula (bytes)", 17, NULL},
    {"bytes", "bytes", 17, PRINT_GROUPED},
};

void section_comm(Printer *p, const Inputs *in) {
    printer_section(p, "communication",
                    "Communication per rank per optimizer step, computed from the formula "
                    "(ring collectives, Rajbhandari et al. 2020, section 7)");
    printer_table(p, "rows", comm_cols, 5);
    for (int s = 0; s < STAGE_COUNT; s++) {
        double e = stage_comm_elems((StageId)s, in->psi, in->ranks, in->grad_accum);
        Cell row[5] = {cell_str(stage_name((StageId)s)), cell_str(stage_comm_formula((StageId)s)),
                       cell_num(e), cell_num(2 * e), cell_num(2 * e / GB)};
        printer_row(p, row);
    }
    printer_table_end(p);
    printer_note(p, "k = %d micro-batches per step (--grad-accum). A ring reduce-scatter or all-gather of "
                    "Ψ elements moves Ψ(N-1)/N per rank; an all-reduce is both.", in->grad_accum);
    printer_note(p, "dp_baseline and zero1 reduce once per step; zero2 reduce-scatters every micro-batch "
                    "(it frees the grads it does not own) and all-gathers once; zero3 gathers the "
                    "parameters in forward and in backward and reduce-scatters, every micro-batch.");
    printer_note(p, "cpu_offload and infinity move the same bytes between ranks as zero2 and zero3; "
                    "their traffic between tiers is the next table.");
    printer_table(p, "transfers", xfer_cols, 4);
    for (int s = 0; s < STAGE_COUNT; s++) {
        double b[XFER_COUNT];
        stage_transfer_bytes((StageId)s, in->psi, in->ranks, in->grad_accum, b);
        for (int x = 0; x < XFER_COUNT; x++) {
            if (b[x] == 0) continue;
            Cell row[4] = {cell_str(stage_name((StageId)s)), cell_str(transfer_name((Transfer)x)),
                           cell_str(stage_transfer_formula((StageId)s, (Transfer)x)), cell_num(b[x])};
            printer_row(p, row);
        }
    }
    printer_table_end(p);
    printer_note(p, "transfers: bytes per rank per step between tiers (mean over ranks); Ψ_pad = Ψ rounded up to "
                    "a multiple of 64·N.");
    printer_note(p, "infinity with its params off the device sends each unit's slice up for the unit's forward "
                    "and backward gathers (4kΨ/N); zero3's schedule gathers the head once for both, so a run "
                    "counts 4kC/N less (C channels).");
    printer_section_end(p);
}
