// memory_math: the 2 + 2 + 12 = 16 bytes/param accounting of mixed-precision
// Adam, and what each ZeRO stage keeps per rank (Rajbhandari et al., 2020);
// activation memory (Korthikanti et al., 2022) beside what our trainer keeps;
// communication volume; what fits in a device budget; and --measure, which
// checks the formulas against the allocator the trainers use.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "batch_rule.h"
#include "check.h"
#include "comm.h"
#include "ds_config.h"
#include "flags.h"
#include "memory_math.h"
#include "quant_math.h"

static const char *usage =
    "usage: memory_math [--params 7.5B | --model NAME] [--ranks N] [--batch B --seq-len T]\n"
    "                   [--recompute none|selective|full [--offload-activations]]\n"
    "                   [--attention flash|materialized]\n"
    "                   [--tp T [--sequence-parallel] [--partition-activations]] [--hbm-gb GB]\n"
    "                   [--link-gbps G --gflops F [--latency-us US] [--intra-gbps G]]\n"
    "                   [--ranks-per-host P] [--quantize-weights] [--hpz-size K] [--quantize-grads]\n"
    "                   [--timeline STAGE [--contiguous-buffers]]\n"
    "                   [--context N] [--tiled-loss K] [--tiled-mlp K] [--longest-seq]\n"
    "                   [--pp P [--schedule 1f1b|afab|zb-h1|interleaved [--virtual-stages V]]]\n"
    "                   [--measure] [--json] [--deepspeed-config FILE]\n"
    "\n"
    "Per-rank memory of the ZeRO stages, computed from the formulas: model states\n"
    "(16 bytes per parameter, and how ZeRO-1/2/3, Offload and Infinity split them over\n"
    "N ranks and tiers), communication per step, activations of a --model, and with\n"
    "--hbm-gb the largest model that fits. --measure (under mpirun -np N) allocates the\n"
    "states with the trainers' allocator and compares the bytes with the formula.\n"
    "Without --params or --model: the ZeRO paper's example, Ψ = 7.5B on N = 64.\n"
    "--deepspeed-config FILE takes the stage and batch from DeepSpeed's ds_config.json\n"
    "and answers what it costs per rank, by tier, and whether it fits --hbm-gb.\n"
    "--link-gbps and --gflops (with --model) predict each stage's step time from the\n"
    "ring formulas, and name the fastest stage (that fits --hbm-gb). With --ranks-per-host\n"
    "or zero3's ZeRO++ switches (with --model): its bytes in the host and across hosts, its\n"
    "device bytes, and its step beside zero3's in the planner. --timeline STAGE (with\n"
    "--model) prints the formula's timeline of one training step of STAGE, the device's\n"
    "bytes by category at each phase boundary, which the trainer holds its memory to.\n"
    "--context N sizes the position table past the preset's; --tiled-loss K and --tiled-mlp K\n"
    "count the loss and the MLPs in K chunks of tokens; --longest-seq (with --model and\n"
    "--hbm-gb) gives the longest --seq-len each stage's budget check admits. --pp P (with\n"
    "--model) gives each pipeline stage's units, micro-batches in flight, activations and\n"
    "device peak under --schedule: the staircase down the pipeline (zb-h1: with the\n"
    "micro-batches waiting for their W).";

typedef struct Flags {
    double params, hbm_gb;
    const char *model, *deepspeed_config, *recompute, *attention;
    int ranks, batch, seq_len, context, grad_accum, global_batch, measure, json, offload_activations;
    int tp, sequence_parallel, partition_activations, contiguous_buffers, tiled_loss, tiled_mlp, longest_seq, pp;
    int cp, virtual_stages;
    const char *schedule, *cp_mode;
    const char *timeline;
    double link_gbps, latency_us, gflops, intra_gbps;
    ZeroPPConfig zeropp;
    int ranks_per_host;
} Flags;

enum {
    F_PARAMS, F_MODEL, F_RANKS, F_BATCH, F_SEQ_LEN, F_GRAD_ACCUM, F_GLOBAL_BATCH, F_HBM_GB, F_MEASURE, F_JSON,
    F_DEEPSPEED_CONFIG, F_RECOMPUTE, F_OFFLOAD_ACTIVATIONS, F_TP, F_SEQUENCE_PARALLEL, F_PARTITION_ACTIVATIONS,
    F_LINK_GBPS, F_LATENCY_US, F_GFLOPS, F_ATTENTION, F_QUANTIZE_WEIGHTS, F_HPZ_SIZE, F_QUANTIZE_GRADS,
    F_GRAD_QUANT_BITS, F_QUANT_BLOCK, F_RANKS_PER_HOST, F_INTRA_GBPS, F_TIMELINE, F_CONTIGUOUS_BUFFERS, F_CONTEXT,
    F_TILED_LOSS, F_TILED_MLP, F_LONGEST_SEQ, F_PP, F_SCHEDULE, F_VIRTUAL_STAGES, F_CP, F_CP_MODE,
    F_COUNT
};

// infinity's bf16 params follow offload_param.device and its master, m and
// v offload_optimizer.device (flags of infinity's, which memory_math has
// not): the config's stage is the matching row.
static void params_tier_of_config(const DsConfig *ds, Inputs *in) {
    static const StageId rows[2][3] = {
        {STAGE_INFINITY, STAGE_INFINITY_CPU, STAGE_INFINITY_NVME},
        {STAGE_INFINITY_OPT_CPU, STAGE_INFINITY_CPU_OPT_CPU, STAGE_INFINITY_NVME_OPT_CPU}};
    if (in->stage != STAGE_INFINITY) return;
    int params = !strcmp(ds->params_device, "cpu") ? 1 : !strcmp(ds->params_device, "nvme") ? 2 : 0;
    int optim_cpu = strcmp(ds->optimizer_device, "cpu") == 0;
    in->stage = rows[optim_cpu][params];
    if (params)
        settings_key(&in->settings, "zero_optimization.offload_param.device", "checked: the bf16 param shard %s, "
                     "as %s", params == 2 ? "on NVMe" : "in pinned host memory", stage_name((StageId)in->stage));
    settings_key(&in->settings, "zero_optimization.offload_optimizer.device", "checked: master, m and v %s, as %s",
                 optim_cpu ? "in pinned host memory" : "on NVMe", stage_name((StageId)in->stage));
}

// --deepspeed-config: its values become the flags' defaults (ds_config.h),
// and its stage the one the config section answers for.
static void apply_config(int argc, char **argv, FlagSpec *specs, Inputs *in) {
    settings_begin(&in->settings, specs, F_COUNT);
    in->stage = -1;
    DsConfig ds;
    ds_config_load(&ds, flags_value(argc, argv, "deepspeed-config"));
    ds_config_apply(&ds, specs, F_COUNT, &in->settings, "memory_math");
    for (int s = 0; s < STAGE_COUNT && ds.binary[0] && in->stage < 0; s++)
        if (strcmp(stage_name((StageId)s), ds.binary) == 0) in->stage = s;
    if (ds.binary[0] && in->stage < 0)
        fail_usage("--deepspeed-config %s: %s asks for %s, which memory_math has no formula for", ds.path,
                   ds.binary_why, ds.binary);
    snprintf(in->stage_why, sizeof in->stage_why, "%s", ds.binary_why);
    params_tier_of_config(&ds, in);
    ds_config_free(&ds);
}

static void parse_flags(int argc, char **argv, Flags *f, FlagSpec *specs, Inputs *in) {
    const FlagSpec table[F_COUNT] = {
        [F_PARAMS] = {.name = "params", .type = FLAG_COUNT, .dst = &f->params, .meta = "COUNT",
                      .help = "parameters Ψ: 7.5e9, 7.5B, 350M", .min = 1, .max = 1e15},
        [F_MODEL] = {.name = "model", .type = FLAG_STRING, .dst = &f->model, .meta = "NAME",
                     .help = "take Ψ and shapes from a preset"},
        [F_RANKS] = {.name = "ranks", .type = FLAG_INT, .dst = &f->ranks, .meta = "N",
                     .help = "data-parallel ranks (--measure: the MPI world size)", .min = 1, .max = 1 << 20},
        [F_BATCH] = {.name = "batch", .type = FLAG_INT, .dst = &f->batch, .meta = "B",
                     .help = "micro-batch per rank, for activations", .min = 1, .max = GPT_MAX_BATCH},
        [F_SEQ_LEN] = {.name = "seq-len", .type = FLAG_INT, .dst = &f->seq_len, .meta = "T",
                       .help = "sequence length; 0 = the model's context", .min = 0, .max = GPT_MAX_CONTEXT},
        [F_TILED_LOSS] = {.name = "tiled-loss", .type = FLAG_INT, .dst = &f->tiled_loss, .meta = "K",
                          .help = "the loss over K chunks of tokens: one chunk's logits, ceil(sb/K)·V·e, live at a "
                                  "time instead of sb·V·e per micro-batch (0: whole)", .min = 0, .max = GPT_MAX_TOKENS},
        [F_TILED_MLP] = {.name = "tiled-mlp", .type = FLAG_INT, .dst = &f->tiled_mlp, .meta = "K",
                         .help = "each MLP over K chunks of tokens: no block keeps fc's and the GELU's outputs "
                                 "(8sbhe/t), one chunk of them is shared (0: whole)", .min = 0, .max = GPT_MAX_TOKENS},
        [F_PP] = {.name = "pp", .type = FLAG_INT, .dst = &f->pp, .meta = "P",
                   .help = "3d_parallel's pipeline stages (with --model): each stage's units, micro-batches in flight "
                           "(m = --grad-accum), activations and device peak, the schedule's staircase",
                   .min = 1, .max = GPT_MAX_UNITS - 2},
        [F_SCHEDULE] = {.name = "schedule", .type = FLAG_STRING, .dst = &f->schedule,
                        .meta = "1f1b|afab|zb-h1|interleaved",
                        .help = "with --pp: the pipeline schedule, one forward one backward, all forwards then all "
                                "backwards, zero bubble (1F1B with each backward split into B and W), or "
                                "interleaved (--virtual-stages chunks per stage)"},
        [F_VIRTUAL_STAGES] = {.name = "virtual-stages", .type = FLAG_INT, .dst = &f->virtual_stages, .meta = "V",
                              .help = "with --schedule interleaved: chunks of layers per stage, stage s holding "
                                      "chunks s, s + P, ...", .min = 1, .max = GPT_MAX_CHUNKS},
        [F_LONGEST_SEQ] = {.name = "longest-seq", .type = FLAG_BOOL, .dst = &f->longest_seq,
                           .help = "with --model and --hbm-gb: the longest --seq-len each stage's budget check admits "
                                   "at --batch and --ranks (the context grown to it), with the run's flags, with "
                                   "--recompute full, and with the loss and MLPs in tiles"},
        [F_CONTEXT] = {.name = "context", .type = FLAG_INT, .dst = &f->context, .meta = "N",
                       .help = "the model's context: positions in wpe (N x d-model params), the longest --seq-len",
                       .shown_default = "the preset's, or --seq-len where that is longer", .min = 1,
                       .max = GPT_MAX_CONTEXT},
        [F_GRAD_ACCUM] = {.name = "grad-accum", .type = FLAG_INT, .dst = &f->grad_accum, .meta = "K",
                          .help = "micro-batches per optimizer step", .min = 1, .max = 1 << 20},
        [F_GLOBAL_BATCH] = {.name = "global-batch", .type = FLAG_INT, .dst = &f->global_batch, .meta = "G",
                            .help = "sequences per optimizer step: G = batch x grad-accum x ranks",
                            .shown_default = "batch x grad-accum x ranks", .min = 1, .max = INT_MAX},
        [F_HBM_GB] = {.name = "hbm-gb", .type = FLAG_DOUBLE, .dst = &f->hbm_gb, .meta = "GB",
                      .help = "device memory per rank; 0 = skip what fits", .min = 0, .max = 1e6},
        [F_MEASURE] = {.name = "measure", .type = FLAG_BOOL, .dst = &f->measure,
                       .help = "allocate the states and compare"},
        [F_JSON] = {.name = "json", .type = FLAG_BOOL, .dst = &f->json,
                    .help = "one JSON object on stdout instead of tables"},
        [F_DEEPSPEED_CONFIG] = {.name = "deepspeed-config", .type = FLAG_STRING, .dst = &f->deepspeed_config,
                                .meta = "FILE", .help = "DeepSpeed's ds_config.json: its stage and batch"},
        [F_RECOMPUTE] = {.name = "recompute", .type = FLAG_STRING, .dst = &f->recompute,
                         .meta = "none|selective|full",
                         .help = "what each block keeps for backward (the trainers' flag): in the fit tables"},
        [F_ATTENTION] = {.name = "attention", .type = FLAG_STRING, .dst = &f->attention, .meta = "flash|materialized",
                         .help = "how the attention core runs (the trainers' flag): flash keeps each row's "
                                 "log-sum-exp, materialized the (T,T) probabilities"},
        [F_OFFLOAD_ACTIVATIONS] = {.name = "offload-activations", .type = FLAG_BOOL, .dst = &f->offload_activations,
                                   .help = "with --recompute full: the blocks' inputs in pinned host memory"},
        [F_TP] = {.name = "tp", .type = FLAG_INT, .dst = &f->tp, .meta = "T",
                  .help = "3d_parallel's tensor-parallel ranks (pp 1, dp N/T): its activations and fit row",
                  .min = 1, .max = GPT_MAX_HEADS},
        [F_CP] = {.name = "cp", .type = FLAG_INT, .dst = &f->cp, .meta = "C",
                  .help = "3d_parallel's context-parallel ranks (with --model): each sequence split over C ranks, "
                          "S/C positions each (--cp-mode); its activations, buffers and fit row",
                  .min = 1, .max = GPT_MAX_HEADS},
        [F_CP_MODE] = {.name = "cp-mode", .type = FLAG_STRING, .dst = &f->cp_mode, .meta = "ulysses|ring",
                       .help = "with --cp: how the attention is split (ulysses: all-to-alls of q, k, v and the "
                               "output around each block's attention; ring: two zigzag chunks a rank, k and v "
                               "passed around the cp ranks)"},
        [F_SEQUENCE_PARALLEL] = {.name = "sequence-parallel", .type = FLAG_BOOL, .dst = &f->sequence_parallel,
                                 .help = "with --tp > 1: the residual stream and layernorms split over the tp ranks"},
        [F_PARTITION_ACTIVATIONS] = {.name = "partition-activations", .type = FLAG_BOOL,
                                     .dst = &f->partition_activations,
                                     .help = "with --tp > 1 and --recompute full: 1/T of each saved input per tp rank"},
        [F_LINK_GBPS] = {.name = "link-gbps", .type = FLAG_DOUBLE, .dst = &f->link_gbps, .meta = "G",
                         .help = "the planner: each host's link, Gbit/s each way (0 = no planner)", .min = 0,
                         .max = 1e6},
        [F_LATENCY_US] = {.name = "latency-us", .type = FLAG_DOUBLE, .dst = &f->latency_us, .meta = "US",
                          .help = "the planner: one-way latency of a message between hosts", .min = 0, .max = 1e6},
        [F_GFLOPS] = {.name = "gflops", .type = FLAG_DOUBLE, .dst = &f->gflops, .meta = "F",
                      .help = "the planner: compute rate of one rank, GFLOP/s (measured)", .min = 0, .max = 1e9},
        [F_INTRA_GBPS] = {.name = "intra-gbps", .type = FLAG_DOUBLE, .dst = &f->intra_gbps, .meta = "G",
                          .help = "the planner: Gbit/s a host moves between its own ranks (0 = not counted)",
                          .min = 0, .max = 1e6},
        [F_RANKS_PER_HOST] = {.name = "ranks-per-host", .type = FLAG_INT, .dst = &f->ranks_per_host, .meta = "P",
                              .help = "ranks on each host, consecutive (ZeRO++'s hierarchy; the planner's link is "
                                      "each host's)", .min = 1, .max = 1 << 20},
        [F_TIMELINE] = {.name = "timeline", .type = FLAG_STRING, .dst = &f->timeline, .meta = "STAGE",
                        .help = "the formula's timeline of one training step of STAGE (dp_baseline, zero1, zero2, "
                                "zero3, cpu_offload, infinity, 3d_parallel): the device's bytes by category at each "
                                "phase boundary (with --model)"},
        [F_CONTIGUOUS_BUFFERS] = {.name = "contiguous-buffers", .type = FLAG_BOOL, .dst = &f->contiguous_buffers,
                                  .help = "ZeRO-R's contiguous buffers, as the trainers' flag: the activations and "
                                          "the unit gradients allocated once (the timeline and the fit counts)"},
        [F_QUANTIZE_WEIGHTS] = {.name = "quantize-weights", .type = FLAG_BOOL, .dst = &f->zeropp.quantize_weights,
                                .help = "zero3's ZeRO++ qwZ: weight gathers in int8"},
        [F_HPZ_SIZE] = {.name = "hpz-size", .type = FLAG_INT, .dst = &f->zeropp.hpz, .meta = "K",
                        .help = "zero3's ZeRO++ hpZ: a secondary partition over K ranks of a host (1: none)",
                        .min = 1, .max = 1 << 20},
        [F_QUANTIZE_GRADS] = {.name = "quantize-grads", .type = FLAG_BOOL, .dst = &f->zeropp.quantize_grads,
                              .help = "zero3's ZeRO++ qgZ: the gradients' all-to-all, quantized, in and across hosts"},
        [F_GRAD_QUANT_BITS] = {.name = "grad-quant-bits", .type = FLAG_INT, .dst = &f->zeropp.grad_bits, .meta = "B",
                               .help = "qgZ's bits per gradient value: 8 or 4", .min = 4, .max = 8},
        [F_QUANT_BLOCK] = {.name = "quant-block", .type = FLAG_INT, .dst = &f->zeropp.block, .meta = "N",
                           .help = "ZeRO++'s elements per quantization block", .min = QUANT_BLOCK_MIN,
                           .max = QUANT_BLOCK_MAX},
    };
    memcpy(specs, table, sizeof table);
    apply_config(argc, argv, specs, in);
    flags_parse(argc, argv, specs, F_COUNT, usage);
    settings_after_parse(&in->settings, specs, F_COUNT);
}

// Rajbhandari et al. (2020), Figure 1: Ψ = 7.5B on N = 64.
static const char paper_example[] = "the ZeRO paper's example (no --params or --model)";

// Ψ from --params, --model or the paper's example; bad input exits 2.
static void choose_params(const Flags *f, const FlagSpec *specs, Inputs *in) {
    if (specs[F_PARAMS].seen && f->model)
        fail_usage("give --params or --model, not both (--model sets Ψ from the preset)");
    if (specs[F_PARAMS].seen) {
        in->psi = floor(f->params + 0.5);
        in->psi_source = "--params";
    } else if (f->model) {
        GPTConfig cfg;
        if (!gpt_preset(f->model, &cfg))
            fail_usage("unknown --model '%s'; choose one of: %s", f->model, gpt_preset_names());
        if (f->context) cfg.max_seq_len = f->context;
        else if (f->seq_len > cfg.max_seq_len) cfg.max_seq_len = f->seq_len;  // as the trainers derive it
        gpt_layout(&in->layout, &cfg);
        in->have_model = 1;
        in->model = f->model;
        in->psi = (double)in->layout.num_params;
        in->psi_source = "--model";
    } else if (f->measure) {
        fail_usage("--measure needs --model NAME (e.g. --model small) or --params COUNT");
    } else if (f->hbm_gb > 0) {
        in->psi = 0;  // what fits in --hbm-gb needs no model
        in->psi_source = "none given (--params or --model)";
    } else {
        in->psi = 7.5e9;
        in->psi_source = paper_example;
    }
}

static void choose_ranks(const Flags *f, const FlagSpec *specs, Inputs *in) {
    if (f->measure) {
        if (specs[F_RANKS].seen && f->ranks != in->world)
            fail_usage("--measure runs on the MPI ranks: --ranks %d differs from mpirun -np %d "
                       "(leave --ranks out)", f->ranks, in->world);
        in->ranks = in->world;
        in->ranks_source = "the MPI world size (--measure)";
    } else if (specs[F_RANKS].seen) {
        in->ranks = f->ranks;
        in->ranks_source = "--ranks";
    } else {
        int paper = in->psi_source == paper_example;
        in->ranks = paper ? 64 : 8;
        in->ranks_source = paper ? "the ZeRO paper's example" : "default (set --ranks)";
    }
}

// --tp and what needs it, refused as 3d_parallel refuses them (one line, exit 2).
static void check_tp(Flags *f, Inputs *in) {
    // from a config (activation_checkpointing.partition_activations) without
    // --tp: 3d_parallel's knob, counted once memory_math has a tp group
    const Setting *pa = settings_find(&in->settings, "partition-activations");
    if (f->partition_activations && f->tp == 1 && pa && pa->from == FROM_CONFIG) {
        f->partition_activations = 0;
        settings_key(&in->settings, "activation_checkpointing.partition_activations",
                     "--partition-activations, 3d_parallel's: counted with --tp 2 or more, not at --tp 1");
    }
    in->tp = f->tp;
    in->sequence_parallel = f->sequence_parallel;
    in->partition_activations = f->partition_activations;
    if ((f->sequence_parallel || f->partition_activations) && f->tp == 1)
        fail_usage("--%s splits tensors over the tensor-parallel ranks: give --tp 2 or more",
                   f->sequence_parallel ? "sequence-parallel" : "partition-activations");
    if (f->partition_activations && in->recompute != GPT_RECOMPUTE_FULL)
        fail_usage("--partition-activations splits the blocks' saved inputs, and only --recompute full keeps each "
                   "block's input alone: add --recompute full");
    if (f->partition_activations && f->sequence_parallel)
        fail_usage("--sequence-parallel already keeps 1/T of every block's input on each tp rank: leave out "
                   "--partition-activations");
    if (f->tp == 1) return;
    if (in->ranks % f->tp) fail_usage("--tp %d does not divide --ranks %d: the grid is T x dp", f->tp, in->ranks);
    if (!in->have_model) fail_usage("--tp %d needs --model NAME: tensor parallelism splits the model's heads", f->tp);
    if ((long)f->batch * in->seq_len % f->tp && (f->sequence_parallel || f->partition_activations))
        fail_usage("--batch %d x --seq-len %d tokens do not split over --tp %d", f->batch, in->seq_len, f->tp);
    gpt_layout_tp(&in->tp_layout, &in->layout.cfg, f->tp, 0);  // refuses a T that does not divide the heads
}

// --cp and --cp-mode, refused as 3d_parallel refuses them (after check_tp).
static void check_cp(const Flags *f, Inputs *in) {
    in->cp = f->cp;
    if (strcmp(f->cp_mode, "ulysses") != 0 && strcmp(f->cp_mode, "ring") != 0)
        fail_usage("--cp-mode %s: choose ulysses or ring", f->cp_mode);
    in->cp_ring = strcmp(f->cp_mode, "ring") == 0;
    if (f->cp == 1) return;
    if (!in->have_model) fail_usage("--cp %d splits a model's sequences and heads: add --model NAME", f->cp);
    if (in->attention != GPT_ATTENTION_FLASH)
        fail_usage("--cp %d runs each block's attention core as flash attention over the whole sequence: give "
                   "--attention flash", f->cp);
    const GPTConfig *c = &in->layout.cfg;
    if (!in->cp_ring && c->num_heads % (f->tp * f->cp))
        fail_usage("--tp %d x --cp %d does not divide %s's %d heads: Ulysses gives each of the tp x cp ranks whole "
                   "heads over the whole sequence (or --cp-mode ring, which splits no heads)", f->tp, f->cp,
                   in->model, c->num_heads);
    if (in->cp_ring && in->seq_len % (2 * f->cp))
        fail_usage("--seq-len %d does not cut into 2 x --cp %d chunks (ring attention's zigzag): give a multiple "
                   "of %d", in->seq_len, f->cp, 2 * f->cp);
    if (in->seq_len % f->cp)
        fail_usage("--seq-len %d does not split over --cp %d: give a multiple of %d", in->seq_len, f->cp, f->cp);
    if (in->ranks % (f->tp * f->cp))
        fail_usage("--tp %d x --cp %d does not divide --ranks %d: the grid is T x C x dp", f->tp, f->cp, in->ranks);
    if (f->tp == 1) gpt_layout_tp(&in->tp_layout, c, 1, 0);  // 3d_parallel's layout: the whole model
}

// (under --cp, a rank's part of the sequence: S/C positions; 3d_parallel's)
GPTPlan act_plan(const Inputs *in, GPTRecompute r, int offload) {
    int cp = in->cp > 1 ? in->cp : 1;
    GPTPlan plan = gpt_plan_whole(act_layout(in), in->batch, in->seq_len / cp);
    plan.cp = cp > 1 ? cp : 0;
    plan.cp_ring = in->cp_ring;
    plan.recompute = r;
    plan.attention = in->attention;
    plan.loss_tiles = in->tiled_loss;
    plan.mlp_tiles = in->tiled_mlp;
    plan.offload_activations = offload;
    plan.sequence_parallel = in->tp > 1 && in->sequence_parallel;
    plan.partition_activations = in->tp > 1 && in->partition_activations && r == GPT_RECOMPUTE_FULL;
    return plan;
}

const GPTLayout *act_layout(const Inputs *in) { return in->tp > 1 ? &in->tp_layout : &in->layout; }

static void check_shapes(Flags *f, Inputs *in) {
    in->batch = f->batch;
    in->grad_accum = f->grad_accum;
    in->hbm_gb = f->hbm_gb;
    in->seq_len = f->seq_len;
    int r = gpt_recompute_of(f->recompute);
    if (r < 0)
        fail_usage("--recompute %s: choose none (keep every activation), selective (recompute the attention "
                   "probabilities) or full (keep each block's input, run its forward again)", f->recompute);
    in->recompute = (GPTRecompute)r;
    if (f->offload_activations && in->recompute != GPT_RECOMPUTE_FULL)
        fail_usage("--offload-activations moves the blocks' saved inputs to the host, and only --recompute full "
                   "keeps each block's input alone (here --recompute %s): add --recompute full", f->recompute);
    in->offload_activations = f->offload_activations;
    in->tiled_loss = f->tiled_loss;
    in->tiled_mlp = f->tiled_mlp;
    if (f->tiled_loss && !in->have_model)
        fail_usage("--tiled-loss %d splits a model's logits: add --model NAME (e.g. --model gpt2-124m)", f->tiled_loss);
    if (f->tiled_mlp && !in->have_model)
        fail_usage("--tiled-mlp %d splits a model's MLPs: add --model NAME (e.g. --model gpt2-124m)", f->tiled_mlp);
    int a = gpt_attention_of(f->attention);
    if (a < 0)
        fail_usage("--attention %s: choose flash (tiles, online softmax: no (T,T) matrix is kept) or materialized "
                   "(the (T,T) probabilities kept for backward)", f->attention);
    in->attention = (GPTAttention)a;
    in->context_given = f->context > 0;
    in->longest_seq = f->longest_seq;
    if (f->longest_seq && (!in->have_model || f->hbm_gb <= 0))
        fail_usage("--longest-seq searches a model's sequence length in a budget: add --model NAME and --hbm-gb GB "
                   "(e.g. --model gpt2-124m --hbm-gb 16)");
    if (f->context && !in->have_model)
        fail_usage("--context %d sizes a model's position table: add --model NAME (e.g. --model gpt2-124m)",
                   f->context);
    if (in->have_model) {
        int context = in->layout.cfg.max_seq_len;
        if (f->seq_len > context)
            fail_usage("--seq-len %d is longer than --context %d; give a --context of at least %d", f->seq_len,
                       context, f->seq_len);
        if (f->seq_len == 0) in->seq_len = context;
        gpt_check_tokens(&in->layout.cfg, in->batch, in->seq_len, in->attention);
        if ((double)f->tiled_loss > (double)in->batch * in->seq_len)
            fail_usage("--tiled-loss %d: a micro-batch has %d tokens to split into chunks; give 1 to %d",
                       f->tiled_loss, in->batch * in->seq_len, in->batch * in->seq_len);
        if ((double)f->tiled_mlp > (double)in->batch * in->seq_len)
            fail_usage("--tiled-mlp %d: a micro-batch has %d tokens to split into chunks; give 1 to %d",
                       f->tiled_mlp, in->batch * in->seq_len, in->batch * in->seq_len);
    }
    check_tp(f, in);
    check_cp(f, in);
    in->link_gbps = f->link_gbps;
    in->latency_us = f->latency_us;
    in->gflops = f->gflops;
    if ((f->link_gbps > 0) != (f->gflops > 0))
        fail_usage("the planner needs both --link-gbps (the link) and --gflops (a rank's compute rate)");
    if (f->link_gbps > 0 && !in->have_model)
        fail_usage("--link-gbps and --gflops predict a step of a model: add --model NAME (e.g. --model small)");
    if (f->link_gbps > 0 && f->measure) fail_usage("--measure and the planner (--link-gbps) are separate runs: drop one");
    in->intra_gbps = f->intra_gbps;
}

// zero3's ZeRO++ switches and the hosts, refused as zero3 refuses them.
static void check_zeropp(const Flags *f, const FlagSpec *specs, Inputs *in) {
    const ZeroPPConfig *c = &f->zeropp;
    in->zeropp = *c;
    in->zeropp_given = c->quantize_weights || c->hpz > 1 || c->quantize_grads;
    in->ranks_per_host = f->ranks_per_host;
    if (in->ranks % f->ranks_per_host)
        fail_usage("--ranks-per-host %d does not divide --ranks %d: every host holds as many ranks", f->ranks_per_host,
                   in->ranks);
    in->hosts = in->ranks / f->ranks_per_host;
    if (c->grad_bits != 8 && c->grad_bits != 4)
        fail_usage("--grad-quant-bits %d: qgZ sends 8 or 4 bits per gradient value; give 8 or 4", c->grad_bits);
    if (c->block % 2 && c->quantize_grads && c->grad_bits == 4)  // as zero3 refuses it (zeropp.c)
        fail_usage("--quant-block %d with --grad-quant-bits 4: qgZ packs two 4-bit values in a byte, both of one "
                   "block; give an even block size, or --grad-quant-bits 8", c->block);
    if (c->hpz > 1 && f->ranks_per_host % c->hpz)
        fail_usage("--hpz-size %d: a secondary partition is K ranks of one host, and %d does not divide "
                   "--ranks-per-host %d; give a divisor of it, or 1 for none", c->hpz, c->hpz, f->ranks_per_host);
    int any = in->zeropp_given || specs[F_RANKS_PER_HOST].seen;
    if (any && !in->have_model)
        fail_usage("ZeRO++'s bytes follow zero3's gathers of a model's units: add --model NAME (e.g. --model small)");
    if (any && f->measure) fail_usage("--measure allocates the stages' states; ZeRO++'s table is a separate run");
}

// --timeline STAGE: a trainer's name, with --model.
static void check_timeline(const Flags *f, Inputs *in) {
    in->contiguous_buffers = f->contiguous_buffers;
    if (!f->timeline) return;
    if (!in->have_model) fail_usage("--timeline %s follows a model's units: add --model NAME (e.g. --model small)",
                                    f->timeline);
    static const StageId stages[] = {STAGE_DP, STAGE_ZERO1, STAGE_ZERO2, STAGE_ZERO3, STAGE_OFFLOAD, STAGE_INFINITY};
    in->timeline = 1;
    in->timeline_tp3d = strcmp(f->timeline, "3d_parallel") == 0;
    in->timeline_stage = in->timeline_tp3d ? STAGE_ZERO1 : -1;
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++)
        if (strcmp(f->timeline, stage_name(stages[i])) == 0) in->timeline_stage = stages[i];
    if (in->timeline_stage < 0)
        fail_usage("--timeline %s: give a trainer's name: dp_baseline, zero1, zero2, zero3, cpu_offload, infinity "
                   "or 3d_parallel", f->timeline);
    if (!in->timeline_tp3d && in->cp > 1)
        fail_usage("--timeline %s with --cp %d: context parallelism is 3d_parallel's; give --timeline 3d_parallel",
                   f->timeline, in->cp);
    if (!in->timeline_tp3d && in->tp > 1)
        fail_usage("--timeline %s with --tp %d: tensor parallelism is 3d_parallel's; give --timeline 3d_parallel",
                   f->timeline, in->tp);
}

// What --global-batch divides by: the ranks, or with --tp the data-parallel
// replicas of 3d_parallel's grid (N/T), as that trainer's batch rule counts them.
static int batch_replicas(const Flags *f, const Inputs *in) {
    int parts = f->tp * f->pp * f->cp;
    if (parts == 1) return in->ranks;
    if (in->ranks % parts)
        fail_usage("--tp %d x --cp %d x --pp %d = %d does not divide --ranks %d: the grid is T x C x P x dp", f->tp,
                   f->cp, f->pp, parts, in->ranks);
    return in->ranks / parts;
}

// What batch_replicas counts, for the batch rule's messages: "ranks", or
// "data-parallel replicas (--ranks / --tp)", "(--ranks / (--tp x --pp))", ...
static void replicas_text(const Flags *f, char *out, size_t n) {
    const char *names[3] = {"--tp", "--cp", "--pp"};
    int sizes[3] = {f->tp, f->cp, f->pp}, k = 0;
    char parts[48] = "";
    for (int i = 0; i < 3; i++)
        if (sizes[i] > 1) {
            size_t at = strlen(parts);
            snprintf(parts + at, sizeof parts - at, "%s%s", k++ ? " x " : "", names[i]);
        }
    if (k == 0) snprintf(out, n, "ranks");
    else if (k == 1) snprintf(out, n, "data-parallel replicas (--ranks / %s)", parts);
    else snprintf(out, n, "data-parallel replicas (--ranks / (%s))", parts);
}

// --pp P and --schedule: a model's pipeline (3d_parallel's grid).
static void check_pp(const Flags *f, const FlagSpec *specs, Inputs *in) {
    in->pp = f->pp;
    if (strcmp(f->schedule, "1f1b") && strcmp(f->schedule, "afab") && strcmp(f->schedule, "zb-h1") &&
        strcmp(f->schedule, "interleaved"))
        fail_usage("--schedule %s: choose 1f1b (one forward one backward), afab (all forwards, then all backwards), "
                   "zb-h1 (zero bubble) or interleaved (with --virtual-stages V)", f->schedule);
    in->schedule_afab = strcmp(f->schedule, "afab") == 0;
    in->schedule_zb = strcmp(f->schedule, "zb-h1") == 0;
    in->virtual_stages = strcmp(f->schedule, "interleaved") == 0 ? f->virtual_stages : 1;
    if (specs[F_VIRTUAL_STAGES].seen && strcmp(f->schedule, "interleaved"))
        fail_usage("--virtual-stages %d: only --schedule interleaved cuts a stage into chunks", f->virtual_stages);
    if (in->virtual_stages > 1 && in->have_model && in->layout.cfg.num_layers % (f->pp * in->virtual_stages))
        fail_usage("--virtual-stages %d with --pp %d cuts %s's %d layers into %d chunks of equal size: give a "
                   "--virtual-stages whose product with --pp divides %d", in->virtual_stages, f->pp, in->model,
                   in->layout.cfg.num_layers, f->pp * in->virtual_stages, in->layout.cfg.num_layers);
    if (in->schedule_zb && f->pp == 1)
        fail_usage("--schedule zb-h1 fills a pipeline's bubble with the weights' gradients: add --pp 2 or more");
    if (in->schedule_zb && in->tiled_mlp)
        fail_usage("--schedule zb-h1 with --tiled-mlp %d: W reads each block's whole GELU output; leave out "
                   "--tiled-mlp", in->tiled_mlp);
    if (specs[F_SCHEDULE].seen && f->pp == 1)
        fail_usage("--schedule %s orders a pipeline's micro-batches: add --pp 2 or more", f->schedule);
    if (f->pp == 1) return;
    if (!in->have_model) fail_usage("--pp %d cuts a model into stages: add --model NAME (e.g. --model small)", f->pp);
    if (in->layout.cfg.num_layers < f->pp)
        fail_usage("--pp %d stages for %s's %d layers: every stage needs a block; give --pp %d or fewer", f->pp,
                   in->model, in->layout.cfg.num_layers, in->layout.cfg.num_layers);
}

int main(int argc, char **argv) {
    Comm world;
    Inputs in;
    memset(&in, 0, sizeof in);
    comm_world_init(&world, &argc, &argv, &in.local_rank, &in.local_size, 0);
    in.world = world.size;
    in.rank = world.rank;

    Flags f = {.params = 0, .hbm_gb = 0, .model = NULL, .ranks = 8, .pp = 1, .schedule = "1f1b", .virtual_stages = 1, .batch = 8, .seq_len = 0,
               .grad_accum = 1, .global_batch = 0, .measure = 0, .json = 0, .recompute = "none", .attention = "flash", .tp = 1, .cp = 1, .cp_mode = "ulysses",
               .zeropp = {.hpz = 1, .grad_bits = 8, .block = QUANT_BLOCK_DEFAULT}, .ranks_per_host = 1};
    FlagSpec specs[F_COUNT];
    parse_flags(argc, argv, &f, specs, &in);
    choose_params(&f, specs, &in);
    choose_ranks(&f, specs, &in);
    char replicas[96];
    replicas_text(&f, replicas, sizeof replicas);
    batch_rule_apply(&in.settings, &f.batch, &f.grad_accum, f.global_batch, batch_replicas(&f, &in), replicas);
    check_shapes(&f, &in);
    check_zeropp(&f, specs, &in);
    check_timeline(&f, &in);
    check_pp(&f, specs, &in);
    in.measure = f.measure;
    in.json = f.json;

    Printer p;
    printer_begin(&p, stdout, in.json, in.rank == 0);
    if (!in.json && in.rank == 0)
        printf("memory_math: per-rank memory of the ZeRO stages (Ψ parameters, N ranks)\n");
    section_inputs(&p, &in);
    int differ = 0;
    if (in.measure) {
        differ = section_measure(&p, &in);
    } else {
        if (in.psi > 0) section_model_states(&p, &in);
        if (in.psi > 0) section_deepspeed_estimate(&p, &in);
        if (in.psi > 0) section_comm(&p, &in);
        if (in.have_model) section_activations(&p, &in);
        if (in.hbm_gb > 0) section_fit(&p, &in);
        if (in.hbm_gb > 0 && in.have_model) section_fit_run(&p, &in);
        if (in.zeropp_given || specs[F_RANKS_PER_HOST].seen) section_zeropp(&p, &in);
        if (in.link_gbps > 0) section_step_time(&p, &in);
        if (in.settings.config_path[0]) section_config(&p, &in);
        if (in.timeline) section_timeline(&p, &in);
        if (in.longest_seq) section_longest(&p, &in);
        if (in.pp > 1) section_pipeline(&p, &in);
    }
    printer_end(&p);
    comm_world_finalize(&world);
    return differ ? 1 : 0;
}
