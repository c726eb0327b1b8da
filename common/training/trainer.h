// trainer.h: the loop every stage shares. A stage supplies a Strategy (how it
// holds the model states and what it does around each unit and at the
// optimizer step); its main() is one call to trainer_main.
#pragma once
#include <stdint.h>
#include "comm.h"
#include "data.h"
#include "device.h"
#include "elementwise.h"
#include "gpt.h"
#include "mem_math.h"
#include "report.h"
#include "states.h"
#include "trace.h"

typedef struct TrainConfig {
    const char *model;
    int layers, d_model, heads, vocab;   // override the preset when > 0
    int seq_len, batch, grad_accum, global_batch;
    int steps, warmup, eval_every, eval_batches, seed;
    double lr, min_lr_frac, weight_decay, grad_clip;
    const char *data, *device, *comm;
    double hbm_gb;
    const char *json, *trace, *save, *resume;
    int save_every, quiet;
    double bucket_mb;  // zero2, zero3: gradient bucket size
    int prefetch;      // zero3: units gathered ahead
} TrainConfig;

// Flags a strategy opts into beyond the shared ones.
enum { STRATEGY_FLAG_BUCKET = 1, STRATEGY_FLAG_PREFETCH = 2 };

struct Trainer;

typedef struct Strategy {
    const char *name;       // binary and checkpoint stage name: "zero2"
    StageId stage;          // for the formulas
    const char *summary;    // one line for --help
    unsigned flags;         // STRATEGY_FLAG_*
    // After the model states are allocated and initialized: the stage's own buffers.
    void (*setup)(struct Trainer *t);
    // Around each unit; ctx is the Trainer. params/grads_ready as in gpt.h.
    GPTHooks hooks;
    // After the last micro-batch's backward: finish the gradient reduction.
    void (*reduce_grads)(struct Trainer *t);
    // Squared global gradient norm over all ranks (for clipping).
    double (*grad_norm_sq)(struct Trainer *t);
    // AdamW on the states this rank owns, then refresh the bf16 params that
    // the next forward reads (e.g. all-gather).
    void (*update)(struct Trainer *t, const AdamWStep *s);
    // After loading master weights from a checkpoint: params = bf16(master) everywhere.
    void (*params_from_master)(struct Trainer *t);
    void (*teardown)(struct Trainer *t);
} Strategy;

typedef struct Trainer {
    TrainConfig cfg;
    const Strategy *strategy;
    void *sctx;              // the strategy's own state
    Comm world;
    Device dev;
    Trace trace;
    GPTLayout layout;
    GPT model;
    Partition part;
    ModelStates st;
    DataSet data;
    GPTHooks hooks;          // strategy->hooks with ctx = this trainer
    int micro;               // micro-batch index within the step, 0..grad_accum-1
    long step;               // optimizer steps completed
    double unit_t0_us;       // start of the unit being computed (for the trace)
    Report report;
} Trainer;

int trainer_main(int argc, char **argv, const Strategy *s);
// For hooks a strategy does not need.
void hook_nothing(void *ctx, int u);
// Hooks of the stages that keep the bf16 params (and grads) whole on every
// rank: unit u's params are a slice of the full buffer, and its fp32
// gradients are folded into the full bf16 gradient buffer, written by the
// first micro-batch of a step and accumulated by the others.
const bf16 *hook_replicated_params(void *ctx, int u);
void hook_replicated_grads_ready(void *ctx, int u, const float *g);
// Flat parameter buffer offset and length of unit u.
static inline Range unit_range(const struct Trainer *t, int u) { return t->layout.unit[u]; }

// Learning rate at `step` (0-based): linear warm-up to lr over `warmup`
// steps, then cosine decay to lr * min_lr_frac at the last step.
double lr_at(const TrainConfig *c, long step);
// AdamW hyper-parameters for the step (bias corrections for t = step + 1).
AdamWStep adamw_step_params(const TrainConfig *c, long step, float grad_scale);

// Parses the shared flags (plus the strategy's) into *cfg; bad input exits 2.
void train_config_parse(TrainConfig *cfg, int argc, char **argv, const Strategy *s);
// Resolves the model shape from --model and the overrides.
void train_config_model(TrainConfig *cfg, GPTConfig *out);  // also settles --seq-len

// Checkpoint glue: save/resume the optimizer states this rank owns.
void trainer_save(Trainer *t, uint64_t data_rows);
void trainer_resume(Trainer *t);
