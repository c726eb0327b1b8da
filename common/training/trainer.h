// trainer.h: the loop every stage shares around the step: flags, set-up, the
// optimizer steps (gradient accumulation, the LR schedule, clipping),
// evaluation, checkpoints and the report. A stage supplies a Strategy: what it
// keeps of the model states, its micro-batch step (its own loop over the
// units, with its communication written where it happens) and its update;
// its main() is one call to trainer_main.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include "ckpt.h"
#include "comm.h"
#include "data.h"
#include "device.h"
#include "elementwise.h"
#include "flags.h"
#include "gpt.h"
#include "loss_scale.h"
#include "mem_math.h"
#include "report.h"
#include "settings.h"
#include "step_meter.h"
#include "states.h"
#include "trace.h"
#include "mem_timeline.h"
#include "step_memory.h"
#include "train_limits.h"

typedef struct TrainConfig {
    const char *model;
    int layers, d_model, heads, vocab;   // override the preset when > 0
    int context;                         // wpe rows, the longest sequence; 0: the preset's or --seq-len's
    int seq_len, batch, grad_accum, global_batch;
    int steps, warmup, eval_every, eval_batches, seed;
    double lr, min_lr_frac, weight_decay, grad_clip;
    double beta1, beta2, adam_eps;
    // cosine (ours) or DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR (optim.c)
    const char *lr_schedule, *warmup_type;
    double warmup_start_frac;            // DeepSpeed's schedules: lr at the warmup's start, a fraction of lr
    int schedule_steps;                  // steps the decay spans (DeepSpeed's total_num_steps); 0 = steps
    const char *data, *device, *comm;
    const char *data_order;              // permuted | sequential (llm.c's)
    const char *recompute;               // none | selective | full: what a block keeps for backward (gpt.h)
    const char *attention;               // flash | materialized: how the attention core runs (gpt.h)
    // mixed precision: params and grads in 16 bits, master, m and v in fp32
    const char *precision;               // bf16 | fp16 (parsed into `half`)
    HalfFormat half;
    // fp16's loss scaling (loss_scale.h), DeepSpeed's fp16 block: a static
    // scale > 0, or 0 for dynamic from 2^initial_scale_power
    double loss_scale, min_loss_scale;
    int initial_scale_power, loss_scale_window, hysteresis;
    // DeepSpeed's data_types.grad_accum_dtype: the micro-batches' gradients
    // summed in the 16-bit format (NULL: --precision's) or in an fp32 accumulator
    const char *grad_accum_dtype;
    int grad_accum_fp32;
    const char *inject_overflow;         // test hook: 1-based steps whose gradient on the last rank is made infinite
    int offload_activations;             // with full recompute: the blocks' saved inputs in pinned host memory
    double hbm_gb;
    const char *json, *trace, *save, *resume;
    int contiguous_buffers;       // --contiguous-buffers: ZeRO-R's (gpt.h's GPTPlan.contiguous)
    int tiled_loss;               // --tiled-loss K: the loss in K chunks of tokens (GPTPlan.loss_tiles); 0 whole
    int tiled_mlp;                // --tiled-mlp K: each MLP in K chunks of tokens (GPTPlan.mlp_tiles); 0 whole
    const char *memory_timeline;  // --memory-timeline FILE
    int memory_timeline_step;     // the step it records, 1-based; 0: the last
    const char *init_from, *export_llmc;  // llm.c GPT-2 checkpoints (llmc.h)
    const char *deepspeed_config;        // its values are the defaults of the matching flags
    int save_every, quiet, print_every, verbose_config;
    int progress_us;  // > 0: a thread enters MPI's progress engine every progress_us
    Settings settings;  // where each setting came from (settings.h)
} TrainConfig;

struct Trainer;

#define TRAIN_MAX_EVAL_MICRO (1 << 20)  // --eval-batches x --grad-accum

// Most flags a stage adds to the shared ones, and tensors to its checkpoints.
#define STRATEGY_MAX_FLAGS 16
#define STRATEGY_MAX_CKPT 4
// Most layout ranges a rank's model states hold, and sub-groups whose bytes
// a step counts beside the world's.
#define TRAINER_MAX_STATE_RANGES (GPT_MAX_CHUNKS + 1)  // a wte copy, and each interleaved chunk's units
#define TRAINER_MAX_GROUPS (STEP_METER_MAX_COMMS - 1)  // beside the world

// A checkpoint's tensors of this rank: host copies of the fp32 master, m and
// v it owns (optim[0..2], `optim_bytes` each; in `t` too where this rank saves
// them), then the stage's own.
typedef struct CkptStates {
    CkptTensor t[3 + STRATEGY_MAX_CKPT];
    int n;
    void *optim[3];
    size_t optim_bytes;
} CkptStates;
// Adds a stage's own tensor (a host buffer of `bytes`) to c: elements of
// elem_bytes from flat_begin on in the parameter layout (as a resharded
// resume reads them).
void ckpt_states_add(CkptStates *c, const char *name, void *host, size_t bytes, size_t flat_begin, size_t elem_bytes);

// Micro-batches that one pass runs: a step's forward and backward, or an
// evaluation's forwards.
typedef struct MicroBatches {
    int split;                  // SPLIT_TRAIN or SPLIT_VAL
    uint64_t first;             // global index of the first (trainer_load_micro_batch)
    int count;
    int backward;               // a training step: forward and backward; 0: forwards only (evaluation)
    float dloss_scale;          // 1 / tokens in the global batch (0 when there is no backward)
    int32_t *inputs, *targets;  // host buffers of batch x seq_len tokens each
} MicroBatches;

// Where a micro-batch's gradients stand in its step's sum, handed down with
// them: the first writes the gradients (or the fp32 accumulator) and the
// others add to them; the last rounds the accumulator into the gradients
// (grad_accum.c). micro_turn gives micro-batch i's of mb.
typedef struct GradTurn {
    int first, last;
} GradTurn;
static inline GradTurn micro_turn(const MicroBatches *mb, int i) { return (GradTurn){i == 0, i == mb->count - 1}; }

// Where this rank sits in the run and what it holds, as a stage's configure
// returns it. The trainer hands configure its default: the stage's declared
// formula and states, the whole model, every unit, data parallel over the
// world; the trainer alone puts the returned one in the Trainer's fields of
// the same names.
typedef struct Placement {
    StageId formula;       // the closed form this rank's states are checked against
    StatesLayout states;   // which states are whole or sharded, on which tier
    GPTLayout layout;      // the part of the model this rank holds (the whole model unless tensor parallel)
    Comm *dp;              // data-parallel group: data rows, the states' partition, the loss mean, tokens/s
    Comm *tp;              // tensor-parallel group of the layout; NULL when the layout is whole
    // Ulysses' sequence group (plan.cp > 1; else NULL): cp consecutive ranks
    // of dp (dp rank = replica·cp + cp rank) that read the same rows, each
    // keeping its part of every sequence; dp's other ranks read rows of their own
    Comm *cp;
    GPTPlan plan;          // the units this rank computes, micro-batches in flight (left zero: the
                           // trainer makes the whole model's from the resolved micro-batch)
    Range state_ranges[TRAINER_MAX_STATE_RANGES];  // layout ranges the states hold, back to back
    int nstate_ranges;
    Comm *groups[TRAINER_MAX_GROUPS];  // sub-groups whose bytes the steps count beside the world's
    int ngroups;
    char grid[48];         // the process grid, as checkpoints record it ("": data parallel over the world)
} Placement;

// A stage: what it keeps of the model states, its micro-batch step and its
// update. Every stage's file defines one with the same field (and function)
// names, so that `make diff-NN` shows only the technique.
typedef struct Strategy {
    const char *name;       // binary and checkpoint stage name: "zero2"
    const char *summary;    // one paragraph for --help
    StageId formula;        // the closed form of mem_math that this stage is checked against
    StatesLayout states;    // which states are whole or sharded, and on which tier
    size_t context_bytes;   // the stage's own struct (its options and buffers), zeroed, at t->sctx
    // Once the flags are parsed and the device and the world's comm are set
    // up, before anything is allocated: the stage's refusals of its own
    // flags (exit 2, one line), then the placement p with what the stage
    // changes of it: what its options change of what it keeps (formula and
    // states: cpu_offload --dpu, infinity --offload-params), the sub-groups
    // it makes (zero3's ZeRO++), and under model parallelism this rank's
    // place in the model (3d_parallel: the part of the layout it holds, its
    // data-parallel group, the units it computes, the layout ranges its
    // states hold). It writes its own context and cfg (which is t->cfg: the
    // batch rule resolved, a DeepSpeed key marked ignored), nothing else of
    // the Trainer.
    Placement (*configure)(const struct Trainer *t, TrainConfig *cfg, const GPTConfig *model, Placement p);
    // The micro-batch step: forward (and, for a training step, backward) of
    // every micro-batch in mb, the stage's loop over the units with its
    // gathers, releases and gradient reduction where they happen. A training
    // step returns with the gradients reduced as the update needs them.
    // Returns the sum of the micro-batches' mean losses, the same on every
    // rank of a data-parallel replica.
    double (*forward_backward)(struct Trainer *t, const MicroBatches *mb);
    // The stage's own end-of-run rows, collective: rank 0 prints them after
    // the shared tables and, where json is not NULL (rank 0 with --json),
    // writes them as members (",\"key\":value") of the run's record.
    void (*report)(struct Trainer *t, FILE *json);
    // Stage-only flags: write their defaults into the context and their specs
    // into out[]; returns how many (at most STRATEGY_MAX_FLAGS).
    int (*flags)(void *ctx, FlagSpec *out);
    // After the model states are allocated and initialized: the stage's own
    // buffers (and files: infinity checks the room for them first).
    void (*setup)(struct Trainer *t);
    // The most device bytes its own buffers hold at once (setup's, and what
    // its step allocates and frees), for this model and partition, with the
    // options in ctx; the budget check counts them before anything is allocated.
    double (*device_buffer_bytes)(const void *ctx, const GPTLayout *l, const Partition *p);
    // Its buffers' blocks in the formula's timeline, and where its step
    // allocates otherwise than every unit's at once (the default): zero3's
    // gathered units and their prefetch, a pipeline stage's schedule. Sets
    // the spec's shape and its part of `fixed` (step_memory_fixed,
    // step_memory_buckets; trainer_step_memory.c).
    void (*step_shape)(const void *ctx, const struct Trainer *t, StepMemorySpec *s);
    // Squared global gradient norm over all ranks (for clipping).
    double (*grad_norm_sq)(struct Trainer *t);
    // AdamW on the states this rank owns, then refresh the bf16 params that
    // the next forward reads (e.g. all-gather).
    void (*update)(struct Trainer *t, const AdamWStep *s);
    // After loading master weights from a checkpoint: params = bf16(master) everywhere.
    void (*params_from_master)(struct Trainer *t);
    // An update still running (cpu_offload --dpu, infinity's last writes):
    // finish it before the states are saved or evaluated; `to_device` also
    // brings the device's params up to date (at the end of the run), which a
    // run going on must not do.
    void (*finish_update)(struct Trainer *t, int to_device);
    // Checkpoints hold what this rank's next step depends on: by default the
    // fp32 master, m and v it owns, copied from and back to t->st
    // (trainer_ckpt_out, trainer_ckpt_in; then params_from_master). A stage
    // whose states no pointer reaches (infinity: files), or whose next step
    // depends on more (cpu_offload --dpu: the device's lagging params), does
    // it itself: ckpt_out fills the host copies of master, m and v in c and
    // may add tensors of its own; ckpt_in, before the load (loaded 0), adds
    // the buffers of its own tensors, and after it (loaded 1) puts them all
    // back and rebuilds the bf16 params.
    void (*ckpt_out)(struct Trainer *t, CkptStates *c);
    void (*ckpt_in)(struct Trainer *t, CkptStates *c, int loaded);
    void (*teardown)(struct Trainer *t);
} Strategy;

// The loss a diverging run is measured against (divergence.c).
typedef struct Divergence {
    int have_reference;
    double first, level;  // the first step's loss, and the running mean of the losses
} Divergence;

typedef struct Trainer {
    TrainConfig cfg;
    const Strategy *strategy;
    void *sctx;              // the strategy's own struct (context_bytes), or NULL
    Comm world;
    Device dev;
    Trace trace;
    MemTimeline *mem_timeline;  // --memory-timeline: the device's allocations recorded, step by step
    StepMemory step_formula;    // the formula's timeline of a training step (trainer_step_memory.c)
    TimelineCheck timeline_check;  // each step's boundaries beside it
    int timeline_failed;        // rank 0: writing it failed (one line said so)
    size_t model_params;     // Ψ of the whole model
    // What this rank holds and where it sits, as the stage's Placement says
    // (put here by place, trainer.c, alone): the whole model and data
    // parallel over the world, unless the strategy's configure says otherwise.
    StageId formula;
    StatesLayout states;
    GPTLayout layout;
    Comm *dp, *tp, *cp;
    GPTPlan plan;
    Range state_ranges[TRAINER_MAX_STATE_RANGES];
    int nstate_ranges;
    size_t state_params;     // the state ranges' total: the Ψ that the partition splits over dp
    Comm *groups[TRAINER_MAX_GROUPS];
    int ngroups;
    char grid[48];
    GPT model;               // this rank's part of the model, its activations and work buffers
    // This rank's communication per step by the stage's own formula, and its
    // text, where the stage sets one (3d_parallel's grid; in setup); else
    // the report takes mem_math's closed form of `formula`.
    double comm_formula_bytes;
    const char *comm_formula_text;
    // The closed form of a stage buffer that has a category of its own
    // (zero3's hpZ secondary partition, params_hpz), where the stage sets
    // one in setup: the memory table's formula column for it.
    double buffer_formula_bytes[CAT_COUNT];
    Partition part;
    ModelStates st;
    DataSet data;
    long step;               // optimizer steps completed (skipped overflow steps included: the data position)
    LossScaler scaler;       // fp16's loss scale and skipped steps; scale 1 in bf16
    double xfer_bytes[XFER_COUNT];  // bytes moved between tiers, counted by the stage (count_transfer)
    Divergence divergence;
    RunDeviceBytes device_need;  // what the budget check counted (trainer_budget.c)
    int save_lock;               // rank 0: the --save folder's lock (trainer_outputs.c), or -1
    Report report;
    StepTaps taps;               // what each step's meter reads (step_meter.h): set once at set-up
} Trainer;

// A stage counts what it moves between tiers; the report sets the bytes per
// step beside stage_transfer_bytes (mem_math.h).
static inline void count_transfer(Trainer *t, Transfer x, double bytes) { t->xfer_bytes[x] += bytes; }

int trainer_main(int argc, char **argv, const Strategy *s);
// --global-batch G: c's grad_accum = G / (batch x `replicas`, the
// replicas that read rows of their own), or a usage error when it does not
// divide (`what` names them: "ranks" over the world). The trainer resolves
// it after the stage's configure, over the placement that returns; a
// configure that needs the micro-batches sooner resolves it on cfg with the
// same count (calling again gives the same values).
void train_config_resolve_batch(TrainConfig *c, int replicas, const char *what);
// This rank's rows of global micro-batch `index` of a split: its data-parallel
// rank's B rows of the D·B that every replica reads together (see data.h).
void trainer_load_micro_batch(struct Trainer *t, int split, uint64_t index, int32_t *inputs, int32_t *targets);
// Micro-batch i of mb: its rows loaded and their tokens put in the model's slot s.
void trainer_micro_batch_to_slot(struct Trainer *t, const MicroBatches *mb, int i, int s);
// Ring bytes counted so far in the world and the stage's sub-groups, by
// operation (out[OP_COUNT]); returns their total.
double trainer_ring_bytes(const struct Trainer *t, double out[OP_COUNT]);
// The stages that keep the bf16 params (and grads) whole on every rank:
// unit u's params are a slice of the full buffer, and its fp32 gradients are
// folded into the full bf16 gradient buffer, written by the first
// micro-batch of a step and added to by the others (its turn).
const bf16 *replicated_unit_params(struct Trainer *t, int u);
void replicated_add_grads(struct Trainer *t, int u, const float *g, GradTurn turn);
// A micro-batch's gradients into t->st.grads at element `off`, through the
// kernels k (the device's, or kernels_cpu for a host shard): fp32 unit
// gradients, or 16-bit reduced parts. The first micro-batch of a step
// (turn.first) writes, the later ones add: in 16 bits, or with
// --grad-accum-dtype fp32 in the fp32 accumulator t->st.grads_acc, whose sum
// the last micro-batch rounds once into the grads (grad_accum.c).
struct KernelOps;
void grads_add_f32(struct Trainer *t, const struct KernelOps *k, size_t off, const float *g, size_t n, GradTurn turn);
void grads_add_half(struct Trainer *t, const struct KernelOps *k, size_t off, const bf16 *h, size_t n,
                    GradTurn turn);
// Flat parameter buffer offset and length of unit u.
static inline Range unit_range(const struct Trainer *t, int u) { return t->layout.unit[u]; }

// Learning rate at `step` (0-based): linear warm-up to lr over `warmup`
// steps, then cosine decay to lr * min_lr_frac at the schedule's last step
// (lr_horizon), and that floor past it.
double lr_at(const TrainConfig *c, long step);
// The steps the LR schedule spans: --schedule-steps, else --steps (a resumed
// run keeps its checkpoint's).
long lr_horizon(const TrainConfig *c);
// AdamW hyper-parameters for the step (bias corrections for t = step + 1).
AdamWStep adamw_step_params(const TrainConfig *c, long step, float grad_scale);

// Parses the shared flags into *cfg and the strategy's into its context
// (stage_ctx, may be NULL when it has none); bad input exits 2.
void train_config_parse(TrainConfig *cfg, void *stage_ctx, int argc, char **argv, const Strategy *s);
// Resolves the model shape from --model and the overrides.
void train_config_model(TrainConfig *cfg, GPTConfig *out);  // also settles --seq-len

// The device bytes the run will need (device_need, from mem_math's
// run_device_bytes), checked before anything is allocated against the budget,
// or without one on the cpu device against the host's memory shared by the
// node's `local_size` ranks: over it, one line from rank 0 and exit 2.
void trainer_check_budget(Trainer *t, int local_size);
// The mem module's hint when an allocation goes over the budget after all.
void trainer_fit_hint(void *arg, char *out, size_t n);
// trainer_step_memory.c: the formula's timeline of a training step from the
// formulas alone (`held`: what the device held before anything of the run),
// made at set-up; each step's measured boundaries held to it.
double trainer_kernel_scratch(const Trainer *t);
void trainer_step_memory_spec(const Trainer *t, StepMemorySpec *s, double held);
void trainer_step_memory_init(Trainer *t, double held);
void trainer_step_memory_begin(Trainer *t);
void trainer_step_memory_end(Trainer *t, long step);
// What would fit in `limit` bytes, each change alone (--recompute full,
// --attention flash, --contiguous-buffers, --tiled-loss 8, half the --batch, the next
// stage, twice the ranks, those that apply): the formula's peak with it,
// what it frees at phase `at`, and whether it fits (run_fits: the bytes
// within the limit, its blocks as the arena places them within the region).
void trainer_what_fits(const Trainer *t, MemPhase at, double limit, char *out, size_t n);
// mem.h's MemExplain for the trainer's device: see trainer_step_memory.c.
void trainer_explain_oom(void *arg, MemPhase at, double limit, FILE *f);

// Collective, right after the flags are parsed: every rank has the same
// effective settings (a hash of them compared across ranks), or one line
// naming the first that differs and exit 2 (trainer_agree.c).
void trainer_check_same_settings(Trainer *t);

// Collective, before step 1: --json and --trace can be written, and the
// --save folder exists, is locked for this run and takes every rank's part;
// otherwise one line and exit 2. trainer_release_outputs drops the lock.
void trainer_check_outputs(Trainer *t);
void trainer_release_outputs(Trainer *t);

// Divergence (divergence.c): a non-finite gradient norm, or a loss (training,
// or validation when `validation`) that is non-finite or more than ln V above
// the lower of the first step's loss and its running mean, stops the run
// with one line and exit status 1. Every rank calls them with the same values.
void divergence_check_norm(Trainer *t, double norm);
// Stops the run as diverged: rank 0 prints "error: <what>; training
// diverged (hint: ...)", every rank exits 1. Collective.
__attribute__((noreturn, format(printf, 2, 3))) void divergence_stop(Trainer *t, const char *fmt, ...);
void divergence_check_loss(Trainer *t, double loss, int validation);
// Collective: the fp32 states this rank is about to save; a non-finite value
// on any rank stops the run, naming the first such rank, tensor and element.
void divergence_check_states(Trainer *t, const CkptTensor *fp32, int n);

// The report glue (trainer_report.c): before step 1, the run's facts and
// taps handed to report_init; at the end, report_finish with the stage's own
// rows (Strategy.report) among its tables, collective, nonzero (rank 0) when
// the --json record could not be written.
void trainer_report_init(Trainer *t);
int trainer_report_finish(Trainer *t);

// Checkpoint glue: save/resume the optimizer states this rank owns.
void trainer_save(Trainer *t, uint64_t data_rows);
void trainer_resume(Trainer *t);
// Collective, before step 1 (after a resume): the --save folder holds no step
// folder at a step this run saves, since ckpt_save would refuse it only at
// that step, and no checkpoint of another run (ckpt_folder_same_run), whose
// `latest` this run would move; else one line and exit 2.
void trainer_check_save_folder(Trainer *t);
// What ckpt_out and ckpt_in do by default: master, m and v between t->st and
// c's host copies; trainer_ckpt_in then rebuilds the bf16 params.
void trainer_ckpt_out(Trainer *t, CkptStates *c);
void trainer_ckpt_in(Trainer *t, CkptStates *c, int loaded);
// llm.c checkpoints (trainer_llmc.c): --init-from fills the master weights
// of this rank's range (m = v = 0 from states_init) and the stage rebuilds
// its bf16 params; --export-llmc gathers every rank's master weights to
// rank 0, which writes the file. Both collective.
void trainer_init_from(Trainer *t);
// Index in the whole model's layout (tp 1, llm.c's tensors, stages 01-06's
// flat buffer) of element s of this rank's states, or GPT_PADDING. The
// states hold t->state_ranges of the rank's layout back to back, then a
// shard's padding: all of the model on stages 01-06; on 3d_parallel the
// units of its pipeline stage (the last stage's copy of wte first), each
// tensor's tp part (gpt_grid.h).
size_t trainer_whole_index(const Trainer *t, size_t s);
void trainer_export_llmc(Trainer *t);
// Before step 1: whether --export-llmc's file can be written (exit 2 if not). Collective.
void trainer_check_export(Trainer *t);

// The replicas that read rows of their own (dp's ranks, or under Ulysses
// dp's ranks / cp), and this rank's among them.
static inline int trainer_data_replicas(const Trainer *t) { return t->dp->size / (t->cp ? t->cp->size : 1); }
static inline int trainer_data_rank(const Trainer *t) { return t->dp->rank / (t->cp ? t->cp->size : 1); }
