// deepspeed_estimate.c: DeepSpeed's own model-state estimators beside the
// paper's formulas that the rest of memory_math prints, and where they part.
// Their closed forms, as DeepSpeed's code states them (deepspeed/runtime/zero/
// stage_1_and_2.py: estimate_zero2_model_states_mem_needs; stage3.py:
// estimate_zero3_model_states_mem_needs, with additional_buffer_factor 1.5):
//   ZeRO-2             GPU 2Ψ + 18Ψ/N                 CPU 4Ψ·g·1.5
//   ZeRO-2, offload    GPU 2Ψ                         CPU Ψ·max(4N, 16)·1.5
//   ZeRO-3             GPU 4L + 18Ψ/N                 CPU 4L·g·1.5 (zero_init)
//   ZeRO-3, offload    GPU 4L                         CPU 18Ψ·1.5 (zero_init; params and optimizer)
// L the largest layer's parameters (one module's own, as model_to_params
// counts them), g the GPUs per node; the CPU figures are per node. The
// workbench's figures are per rank, its closed forms in mem_math.c.
#include <math.h>
#include <stdio.h>
#include "memory_math.h"

#define GB 1e9
#define BUFFER_FACTOR 1.5  // DeepSpeed's additional_buffer_factor default

// The largest module's own parameters in GPT-2 as DeepSpeed walks it: wte
// (Vp x C, as stored: V rounded up to 128 rows), wpe (T_max x C), or a
// block's largest linear, c_fc (C x 4C + 4C).
static double largest_layer_params(const GPTConfig *c) {
    double C = c->channels;
    return fmax(fmax((double)gpt_vocab_padded(c->vocab_size, 1) * C, (double)c->max_seq_len * C), 4 * C * C + 4 * C);
}

typedef struct EstimateRow {
    const char *deepspeed;     // DeepSpeed's configuration
    const char *gpu_formula, *cpu_formula;
    double gpu, cpu;           // DeepSpeed's figures: per GPU, per node
    StageId ours;              // the workbench's stage that does the same
} EstimateRow;

static const Col cols[] = {
    {"deepspeed", "DeepSpeed (its estimator)", 27, NULL},
    {"gpu_formula", "GPU formula", 13, NULL},
    {"gpu_gb", "GPU GB", 8, "%.3f"},
    {"cpu_formula", "CPU formula (node)", 22, NULL},
    {"cpu_gb", "CPU GB", 8, "%.3f"},
    {"stage", "workbench", 30, NULL},
    {"device_gb", "device GB", 9, "%.3f"},
    {"host_gb", "host GB", 8, "%.3f"},
    {"device_gb_fp32_accum", "device GB, fp32 accum", 21, "%.3f"},
};

void section_deepspeed_estimate(Printer *p, const Inputs *in) {
    double psi = in->psi, n = in->ranks, g = in->ranks;  // one node of N GPUs
    double L = in->have_model ? largest_layer_params(&in->layout.cfg) : NAN;
    EstimateRow rows[] = {
        {"ZeRO-2", "2Ψ + 18Ψ/N", "4Ψ·g·1.5", 2 * psi + floor(18 * psi / n), 4 * psi * g * BUFFER_FACTOR,
         STAGE_ZERO2},
        {"ZeRO-2, offload_optimizer", "2Ψ", "Ψ·max(4N,16)·1.5", 2 * psi, psi * fmax(4 * n, 16) * BUFFER_FACTOR,
         STAGE_OFFLOAD},
        {"ZeRO-3", "4L + 18Ψ/N", "4L·g·1.5", 4 * L + floor(18 * psi / n), 4 * L * g * BUFFER_FACTOR, STAGE_ZERO3},
        {"ZeRO-3, offload both", "4L", "18Ψ·1.5", 4 * L, 18 * psi * BUFFER_FACTOR, STAGE_INFINITY_CPU},
    };
    printer_section(p, "deepspeed_estimate",
                    "DeepSpeed's estimator beside the workbench's formulas (model states; DeepSpeed's closed "
                    "forms from its estimate_zero2/zero3_model_states_mem_needs, computed)");
    if (in->have_model) printer_num(p, "largest_layer", "L (largest layer: one module's own params)", L,
                                    PRINT_GROUPED, "params");
    printer_num(p, "gpus_per_node", "g (GPUs per node, taken as N)", g, "%.0f", NULL);
    printer_table(p, "rows", cols, 9);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const EstimateRow *r = &rows[i];
        StateBytes ours;
        stage_formula_state_bytes(r->ours, psi, in->ranks, &ours);
        double host = ours.tier_total[TIER_PINNED] + ours.tier_total[TIER_NVME];
        StateBytes accum = ours;  // with --grad-accum-dtype fp32
        stage_formula_add_grad_accum(r->ours, psi, in->ranks, &accum);
        Cell row[9] = {cell_str(r->deepspeed), cell_str(r->gpu_formula), cell_num(r->gpu / GB),
                       cell_str(r->cpu_formula), cell_num(r->cpu / GB), cell_str(stage_name(r->ours)),
                       cell_num(ours.tier_total[TIER_DEVICE] / GB), cell_num(host / GB),
                       cell_num(accum.tier_total[TIER_DEVICE] / GB)};
        printer_row(p, row);
    }
    printer_table_end(p);
    double fp32_grads = 4 * psi / n;
    printer_note(p, "zero2, bytes per parameter of a partition, category by category: DeepSpeed 18 = 2 (16-bit "
                    "gradients) + 4 (fp32 gradients: its accumulation partition, data_types.grad_accum_dtype) + 4 "
                    "(fp32 master) + 8 (Adam m and v); the workbench by default 14 = 2 (grads_bf16) + 4 "
                    "(master_fp32) + 4 (adam_m) + 4 (adam_v), the micro-batches summed in bf16: 4Ψ/N = %.3f GB "
                    "less per rank.", fp32_grads / GB);
    printer_note(p, "With --grad-accum-dtype fp32 the workbench keeps that fp32 partition too (grads_accum_fp32, "
                    "4Ψ/N beside the 2Ψ/N of grads_bf16): 18 bytes, DeepSpeed's figure (last column).");
    printer_note(p, "zero3: DeepSpeed adds 4L, the largest layer's fp16 parameters and gradients gathered whole, "
                    "and counts 18Ψ/N where the workbench's model states are 16Ψ/N; the workbench counts its "
                    "gathered units apart from model states (stage 04 measures them).");
    printer_note(p, "offload: DeepSpeed's CPU figures are per node with its 1.5 buffer factor (and for ZeRO-2 at "
                    "least 16 bytes per parameter); the workbench's host and NVMe figures are per rank, exact "
                    "(×N ranks per node): infinity --offload-params cpu puts master, m and v on NVMe, where "
                    "DeepSpeed's offload estimate keeps them in CPU memory.");
    if (!in->have_model) printer_note(p, "L needs the model's shapes: give --model for the ZeRO-3 rows.");
    printer_section_end(p);
}
