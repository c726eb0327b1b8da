// memory_math.h: what the sections of memory_math share: the checked inputs
// and one function per section of the output.
#pragma once
#include "gpt.h"
#include "mem_math.h"
#include "printer.h"
#include "settings.h"
#include "zeropp_math.h"

typedef struct Inputs {
    double psi;               // Ψ, parameters (0: none given)
    const char *psi_source;   // where Ψ came from, for the output
    int ranks;                // N
    const char *ranks_source;
    int have_model;           // --model given: layout holds its shapes
    const char *model;
    GPTLayout layout;
    int batch, seq_len, grad_accum;
    double hbm_gb;            // 0: no --hbm-gb
    GPTRecompute recompute;   // --recompute: what the activation and fit sections count
    GPTAttention attention;   // --attention: flash (each row's lse kept) or materialized (the probabilities)
    int offload_activations;  // --offload-activations (with full): the blocks' inputs in pinned host memory
    int tiled_loss;           // --tiled-loss K: the logits in K chunks (GPTPlan.loss_tiles)
    int tiled_mlp;            // --tiled-mlp K: each MLP in K chunks (GPTPlan.mlp_tiles)
    // 3d_parallel's tensor parallelism (pp 1, dp N/T): --tp, and with it
    // --sequence-parallel and --partition-activations; tp_layout is rank 0's part
    int tp, sequence_parallel, partition_activations;
    GPTLayout tp_layout;
    // the planner: a link (Gbit/s each way per host, one-way latency) and the
    // compute rate of one rank (0: no planner)
    double link_gbps, latency_us, gflops;
    // zero3's ZeRO++ (--quantize-weights, --hpz-size, --quantize-grads): the
    // switches given (zeropp_given) or none; the ranks sit on N/P hosts of P
    // (--ranks-per-host), and a host moves intra_gbps inside itself (0: not counted)
    ZeroPPConfig zeropp;
    int zeropp_given, ranks_per_host, hosts;
    double intra_gbps;
    int measure, json;
    int world, rank;          // MPI world
    int local_rank, local_size;
    // --deepspeed-config: the stage it asks for (-1: none), and where every
    // input came from (its keys are the defaults of --batch, --grad-accum, ...)
    int stage;
    char stage_why[160];
    Settings settings;
    // --timeline STAGE: the formula's timeline of its step (timeline_stage: a
    // StageId; timeline_tp3d: 3d_parallel's --tp grid), and --contiguous-buffers
    int timeline, timeline_stage, timeline_tp3d, contiguous_buffers;
    int context_given;        // --context given: the longest sequence is at most it
    int longest_seq;          // --longest-seq: the longest sequence per stage in --hbm-gb (longest.c)
    int pp, schedule_afab, schedule_zb;  // --pp P (1: none) and --schedule afab or zb-h1 (else 1f1b): pipeline.c
    int virtual_stages;                  // --schedule interleaved's chunks per stage (1: not interleaved)
    int cp;                   // --cp C (1: none): 3d_parallel's ranks per sequence
    int cp_ring;              // --cp-mode ring (else Ulysses)
} Inputs;

// sections.c
void section_inputs(Printer *p, const Inputs *in);
void section_model_states(Printer *p, const Inputs *in);
void section_comm(Printer *p, const Inputs *in);
void section_activations(Printer *p, const Inputs *in);
void section_fit(Printer *p, const Inputs *in);
// deepspeed_estimate.c: DeepSpeed's estimators beside the paper's formulas
void section_deepspeed_estimate(Printer *p, const Inputs *in);
// config.c: what a --deepspeed-config costs per rank by tier, and whether it fits
void section_config(Printer *p, const Inputs *in);
// measure.c: returns the number of (stage, tier, category) entries where the
// measured bytes differ from the formula (0: all equal). Collective.
int section_measure(Printer *p, const Inputs *in);
// The stages memory_math measures and fits (measure.c), some with an option
// set (infinity's --offload-params): stage i's closed form.
int measured_stage_count(void);
StageId measured_stage(int i);
// The activation settings as a plan of the whole model for one micro-batch
// (the tp part's with --tp > 1: act_layout says which layout).
GPTPlan act_plan(const Inputs *in, GPTRecompute r, int offload);
const GPTLayout *act_layout(const Inputs *in);
// fit_run.c: with a model, batch and sequence length, what each stage's run
// needs on the device (run_device_bytes, as the trainers' budget check
// counts it) and whether it fits in --hbm-gb.
void section_fit_run(Printer *p, const Inputs *in);
// The device bytes a stage's run needs with these inputs (the same count).
RunDeviceBytes run_stage_bytes(StageId s, const Inputs *in);
// 3d_parallel's (--tp, --cp; pp 1) as its budget check counts it: fit_run.c's row.
RunDeviceBytes run_grid_bytes(const Inputs *in);
// Does the run fit in `budget` bytes per rank, as the trainers' budget
// check decides on the cpu device: its bytes, and its blocks rounded up to
// the arena's pages in the region the cpu device reserves (run_fits).
int run_fits_budget(const RunDeviceBytes *r, double budget);
// longest.c: with --model and --hbm-gb, the longest --seq-len each stage's
// budget check admits, three ways (the run's flags, full recompute, and
// with tiles).
void section_longest(Printer *p, const Inputs *in);
// pipeline.c: with --pp P, each pipeline stage's memory under --schedule.
void section_pipeline(Printer *p, const Inputs *in);
// zero3 with ZeRO++'s switches c: its parts' peaks added up, and the
// switches' buffers (their times in the step are not modelled)
double zeropp_run_total_bytes(const Inputs *in, const ZeroPPConfig *c);
// timeline.c: --timeline STAGE, the formula's timeline of one training step
// (step_memory.c) as a table; and a stage's peak by it, as the trainers'
// budget check counts it (tp3d: 3d_parallel --tp with these inputs).
void section_timeline(Printer *p, const Inputs *in);
// r's total and arena from the timeline's peaks
void step_peaks(StageId formula, int tp3d, const Inputs *in, RunDeviceBytes *r);
// where its peak falls, and each category's bytes there
void step_peak_parts(StageId formula, int tp3d, const Inputs *in, MemPhase *phase, double bytes[CAT_COUNT]);
// step_time.c: with a link and a compute rate, the step time of each stage
// predicted from the ring formulas, and the fastest that fits.
void section_step_time(Printer *p, const Inputs *in);
// zeropp.c: zero3's ZeRO++ modes (the switches given, or each alone and all
// three): bytes per step in the host and across hosts, device bytes.
typedef struct ZeroPPMode {
    char name[48];
    ZeroPPConfig c;
} ZeroPPMode;
int zeropp_modes(const Inputs *in, ZeroPPMode out[4]);
// A mode's cost per rank per step: bytes in the host and across hosts (mean
// over ranks, zeropp_math.c), the collectives whose latency counts (those
// spanning hosts, at their ring or all-to-all steps), and the device bytes
// its buffers add to zero3's (the secondary partition, qgZ's buffers, the
// int8 parts beside the gathered units).
typedef struct ZeroPPCost {
    double intra, cross, latency_terms, collectives, device_extra, secondary;
} ZeroPPCost;
ZeroPPCost zeropp_cost(const Inputs *in, const ZeroPPConfig *c);
void section_zeropp(Printer *p, const Inputs *in);
