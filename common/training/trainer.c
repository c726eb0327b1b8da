// trainer.c: the training loop every stage shares: set-up, micro-batches with
// gradient accumulation, clipping by the global norm, the LR schedule, the
// strategy's update, evaluation, checkpoints and the report.
#include "trainer.h"
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "batch_rule.h"
#include "blas_core.h"
#include "check.h"
#include "ds_config.h"
#include "kernels.h"
#include "step_meter.h"
#include "stop.h"

const bf16 *replicated_unit_params(Trainer *t, int u) {
    return (const bf16 *)t->st.params.ptr + unit_range(t, u).offset;
}

void replicated_add_grads(Trainer *t, int u, const float *g, GradTurn turn) {
    Range r = unit_range(t, u);
    grads_add_f32(t, t->dev.k, r.offset, g, r.count, turn);
}

// ---- set-up ----

// Row counters (data position, checkpoints) are 64-bit: the run may read at
// most 2^62 rows, steps x grad-accum x batch x ranks, checked here in double.
#define MAX_ROWS 4611686018427387904.0

// DeepSpeed's rule: global batch = micro-batch x accumulation x data-parallel
// replicas (the ranks, for stages 01-06).
void train_config_resolve_batch(TrainConfig *c, int replicas, const char *what) {
    batch_rule_apply(&c->settings, &c->batch, &c->grad_accum, c->global_batch, replicas, what);
    // a batch or an accumulation derived from --global-batch stays within the flags' own limits
    if (c->grad_accum > TRAIN_MAX_GRAD_ACCUM || c->batch > GPT_MAX_BATCH)
        fail_usage("--global-batch %d means %d micro-batches of %d sequences per step; at most %d of at most %d: "
                   "give --batch or --grad-accum", c->global_batch, c->grad_accum, c->batch, TRAIN_MAX_GRAD_ACCUM,
                   GPT_MAX_BATCH);
    gpt_check_tokens(NULL, c->batch, c->seq_len, GPT_ATTENTION_FLASH);
    if ((double)c->eval_batches * c->grad_accum > TRAIN_MAX_EVAL_MICRO)
        fail_usage("--eval-batches %d x %d micro-batches = %.0f held-out micro-batches per validation; at most %d: "
                   "give fewer --eval-batches", c->eval_batches, c->grad_accum, (double)c->eval_batches * c->grad_accum,
                   TRAIN_MAX_EVAL_MICRO);
    double rows = (double)c->steps * c->grad_accum * c->batch * replicas;
    if (rows > MAX_ROWS)
        fail_usage("--steps %d x %d micro-batches x --batch %d x %d replicas = %.3g rows; at most 2^62: ask for fewer",
                   c->steps, c->grad_accum, c->batch, replicas, rows);
}

// Rank 0: the config's ignored keys (always) and every setting's source (--verbose-config).
static void print_settings(const Trainer *t) {
    if (t->world.rank != 0) return;
    char line[PATH_MAX + 4096];  // the config's path, whole, and its ignored keys
    ds_config_ignored_line(&t->cfg.settings, line, sizeof line);
    if (line[0]) printf("%s: %s\n", t->strategy->name, line);
    if (t->cfg.verbose_config) settings_print(&t->cfg.settings, stdout, t->strategy->name);
}

// The stage's placement: the default (its declared states, the whole model,
// every unit, data parallel over the world) as its configure changes it,
// then the batch rule over the placement's data-parallel group and the
// flags' plan of the activations; put in the Trainer here alone. The
// default plan is made from the resolved micro-batch, after configure: a
// micro-batch derived from --global-batch depends on the group configure
// picks (a configure that needs it sooner, 3d_parallel's, resolves it and
// returns its own plan).
static void place(Trainer *t, const GPTConfig *mc) {
    const Strategy *s = t->strategy;
    Placement p = {.formula = s->formula, .states = s->states, .layout = t->layout, .dp = &t->world,
                   .state_ranges = {{0, t->layout.num_params}}, .nstate_ranges = 1};
    if (s->configure) p = s->configure(t, &t->cfg, mc, p);
    CHECK(!p.cp || (p.cp->size == gpt_plan_cp(&p.plan) && p.dp->size % p.cp->size == 0 &&
                     p.cp->rank == p.dp->rank % p.cp->size),
          "%s: a sequence group of %d ranks is consecutive ranks of the data-parallel group (of %d), one per part of "
          "the plan's %d", s->name, p.cp ? p.cp->size : 0, p.dp->size, gpt_plan_cp(&p.plan));
    int replicas = p.dp->size / (p.cp ? p.cp->size : 1);
    train_config_resolve_batch(&t->cfg, replicas, p.dp == &t->world ? "ranks" : "data-parallel replicas");
    if (p.plan.slots == 0) p.plan = gpt_plan_whole(&p.layout, t->cfg.batch, t->cfg.seq_len);
    CHECK(p.plan.B == t->cfg.batch, "%s: its plan's micro-batch is %d sequences, the run's %d", s->name, p.plan.B,
          t->cfg.batch);
    p.plan.recompute = (GPTRecompute)gpt_recompute_of(t->cfg.recompute);
    p.plan.attention = (GPTAttention)gpt_attention_of(t->cfg.attention);
    p.plan.offload_activations = t->cfg.offload_activations;
    p.plan.contiguous = t->cfg.contiguous_buffers;
    p.plan.loss_tiles = t->cfg.tiled_loss;
    p.plan.mlp_tiles = t->cfg.tiled_mlp;
    CHECK(p.nstate_ranges >= 1 && p.nstate_ranges <= TRAINER_MAX_STATE_RANGES && p.ngroups >= 0 &&
          p.ngroups <= TRAINER_MAX_GROUPS, "%s: %d state ranges, %d groups", s->name, p.nstate_ranges, p.ngroups);
    t->formula = p.formula;
    t->states = p.states;
    t->layout = p.layout;
    t->dp = p.dp;
    t->tp = p.tp;
    t->cp = p.cp;
    t->plan = p.plan;
    memcpy(t->state_ranges, p.state_ranges, sizeof t->state_ranges);
    t->nstate_ranges = p.nstate_ranges;
    t->state_params = 0;
    for (int k = 0; k < t->nstate_ranges; k++) t->state_params += t->state_ranges[k].count;
    memcpy(t->groups, p.groups, sizeof t->groups);
    t->ngroups = p.ngroups;
    memcpy(t->grid, p.grid, sizeof t->grid);
}

// A validation reads eval_batches global batches of held-out rows from row 0;
// past the split's distinct rows it reads the same ones again, which says
// nothing more about the model.
static void note_eval_repeats(const Trainer *t) {
    const TrainConfig *c = &t->cfg;
    uint64_t per_batch = (uint64_t)c->grad_accum * c->batch * trainer_data_replicas(t);
    uint64_t have = data_rows_per_pass(&t->data, SPLIT_VAL, c->seq_len);
    if (t->world.rank != 0 || (uint64_t)c->eval_batches * per_batch <= have) return;
    uint64_t most = have / per_batch > 0 ? have / per_batch : 1;
    printf("note: --eval-batches %d reads %llu held-out rows per validation, but the held-out split has %llu "
           "distinct rows of %d tokens: the rest repeat them; --eval-batches %llu reads each at most once\n",
           c->eval_batches, (unsigned long long)((uint64_t)c->eval_batches * per_batch), (unsigned long long)have,
           c->seq_len + 1, (unsigned long long)most);
}

// --memory-timeline: the device's and pinned memory's allocations are
// recorded from here on, a step at a time (the set-up's until step 1), so
// that a rank that runs out of memory can write what led up to it.
static void start_memory_timeline(Trainer *t, double origin) {
    t->mem_timeline = xcalloc(1, sizeof *t->mem_timeline);
    t->mem_timeline->origin_us = origin;
    t->mem_timeline->oom_path = t->cfg.memory_timeline;
    t->dev.mem.tl = t->mem_timeline;
    mem_timeline_begin(t->mem_timeline, &t->dev.mem, 0);
}

// After step `step` (1-based): the one --memory-timeline asked for is
// written (collective); with --trace its events go into that file too.
static void memory_timeline_step_done(Trainer *t, long step) {
    if (!t->mem_timeline || step != t->cfg.memory_timeline_step) return;
    char *events = NULL;
    t->timeline_failed = mem_timeline_write(t->mem_timeline, t->cfg.memory_timeline, t->cfg.trace ? &events : NULL);
    trace_add_events(&t->trace, events);
}

static void setup(Trainer *t, int argc, char **argv, const Strategy *s) {
    int local_rank, local_size;
    memset(t, 0, sizeof *t);
    // may restart the program with better BLAS kernels: before MPI and any thread
    blas_core_choose(argv);
    // Past a file-size limit (ulimit -f) a write fails with EFBIG, which the
    // checkpoint and report writers turn into one line; SIGXFSZ's default
    // action would kill the rank without a word.
    signal(SIGXFSZ, SIG_IGN);
    t->strategy = s;
    comm_world_init(&t->world, &argc, &argv, &local_rank, &local_size, flags_present(argc, argv, "progress-thread"));
    stop_catch_signals(t->world.rank);  // SIGTERM, SIGINT: scratch files removed, one line (stop.h)
    if (s->context_bytes) t->sctx = xcalloc(1, s->context_bytes);
    train_config_parse(&t->cfg, t->sctx, argc, argv, s);
    trainer_check_same_settings(t);
    GPTConfig mc;
    train_config_model(&t->cfg, &mc);
    gpt_layout(&t->layout, &mc);
    ds_config_after_model(&t->cfg.settings, &t->layout);
    t->model_params = t->layout.num_params;

    double origin = now_us();
    mpiCheck(MPI_Bcast(&origin, 1, MPI_DOUBLE, 0, t->world.mpi));
    trace_init(&t->trace, t->cfg.trace != NULL, origin);
    DeviceOptions dopt = {.kind = t->cfg.device, .hbm_gb = t->cfg.hbm_gb, .local_rank = local_rank,
                          .local_size = local_size, .trace = &t->trace, .half = t->cfg.half};
    device_init(&t->dev, &dopt);
    if (t->cfg.memory_timeline) start_memory_timeline(t, origin);
    t->dev.mem.fit_hint = trainer_fit_hint;
    t->dev.mem.fit_hint_arg = t;
    t->dev.mem.explain = trainer_explain_oom;
    comm_setup(&t->world, &t->dev, t->cfg.comm, &t->trace);
    if (t->cfg.export_llmc) trainer_check_export(t);
    if (t->cfg.progress_us > 0) comm_progress_thread_start(&t->world, t->cfg.progress_us);
    device_share(&t->dev, comm_device_sharers(&t->world), t->cfg.hbm_gb > 0);
    device_reserve(&t->dev);  // the region, and what the device keeps in it of its own (cuBLASLt's workspace)
    place(t, &mc);
    print_settings(t);
    partition_init(&t->part, t->state_params, t->dp->size, t->dp->rank);
    trainer_check_budget(t, local_size);

    char err[512];
    if (data_open(&t->data, t->cfg.data, mc.vocab_size, t->cfg.seq_len, err, sizeof err)) fail_usage("%s", err);
    if (strcmp(t->cfg.data_order, "sequential") == 0 &&
        data_set_sequential(&t->data, t->cfg.seq_len, t->cfg.batch * trainer_data_replicas(t), err, sizeof err))
        fail_usage("%s", err);
    note_eval_repeats(t);
    trainer_check_outputs(t);

    t->states.grads_accum_fp32 = t->cfg.grad_accum_fp32;
    states_alloc(&t->st, &t->dev, &t->states, &t->part);
    states_init_ranges(&t->st, &t->dev, &t->layout, t->state_ranges, t->nstate_ranges, (uint64_t)t->cfg.seed);
    if (s->setup) s->setup(t);
    gpt_alloc(&t->model, &t->layout, &t->dev, &t->plan, t->tp);
    gpt_set_seq_group(&t->model, t->cp);
    // the kernels' scratch at the size counted for it, once: a buffer that
    // grew at its first use would leave a hole where it was (ZeRO-R's
    // constant-size buffers)
    if (trainer_kernel_scratch(t) > 0) device_scratch(&t->dev, (size_t)trainer_kernel_scratch(t));
    if (t->cfg.init_from) trainer_init_from(t);
    const TrainConfig *c = &t->cfg;
    loss_scaler_init(&t->scaler, c->half == HALF_FP16, c->loss_scale, c->initial_scale_power, c->loss_scale_window,
                     c->hysteresis, c->min_loss_scale);
    if (t->cfg.resume) trainer_resume(t);  // the scaler's state too
    if (t->cfg.save) trainer_check_save_folder(t);
    t->taps = (StepTaps){.comms = {&t->world}, .ncomms = 1 + t->ngroups, .dev = &t->dev, .model = &t->model,
                         .xfer_bytes = t->xfer_bytes, .trace = &t->trace};
    for (int k = 0; k < t->ngroups; k++) t->taps.comms[1 + k] = t->groups[k];
    trainer_report_init(t);
}

// ---- the loop ----

// Under context parallelism the rank keeps its positions of each row,
// moved to the front (B rows of T/cp): Ulysses' part, [c·T/cp, (c + 1)·T/cp)
// for cp rank c; ring attention's two chunks of T/(2cp), c and 2cp - 1 - c
// (gpt_plan_seq_start). Each run moves to a place at or before its own.
static void keep_sequence_part(const Trainer *t, int32_t *ids) {
    int T = t->cfg.seq_len, part = t->plan.T, runs = gpt_plan_seq_runs(&t->plan), n = part / runs;
    for (int b = 0; b < t->cfg.batch; b++)
        for (int k = 0; k < runs; k++)
            memmove(ids + (size_t)b * part + (size_t)k * n, ids + (size_t)b * T + gpt_plan_seq_start(&t->plan, k),
                    (size_t)n * sizeof *ids);
}

void trainer_load_micro_batch(Trainer *t, int split, uint64_t index, int32_t *in, int32_t *tgt) {
    uint64_t G = (uint64_t)t->cfg.batch * trainer_data_replicas(t);
    data_rows(&t->data, split, index * G + (uint64_t)trainer_data_rank(t) * t->cfg.batch, t->cfg.batch,
              t->cfg.seq_len, in, tgt);
    if (gpt_plan_cp(&t->plan) > 1) keep_sequence_part(t, in), keep_sequence_part(t, tgt);
}

double trainer_ring_bytes(const Trainer *t, double out[OP_COUNT]) {
    double total = 0;
    for (int op = 0; op < OP_COUNT; op++) {
        out[op] = t->world.stats.ring_bytes[op];
        for (int k = 0; k < t->ngroups; k++) out[op] += t->groups[k]->stats.ring_bytes[op];
        total += out[op];
    }
    return total;
}

void trainer_micro_batch_to_slot(Trainer *t, const MicroBatches *mb, int i, int s) {
    // the micro-batch's forward begins here (a gather for its first unit belongs to it)
    mem_set_phase(&t->dev.mem, mb->backward ? PHASE_FORWARD : PHASE_EVAL, -1, i);
    trainer_load_micro_batch(t, mb->split, mb->first + (uint64_t)i, mb->inputs, mb->targets);
    gpt_slot_tokens(&t->model, s, mb->inputs, mb->targets, mb->dloss_scale);
    gpt_slot_micro_batch(&t->model, s, i);
}

// The stage's micro-batch step over mb, held to the pass it was handed:
// every micro-batch through this rank's units forward, and backward too in
// a training step, never in an evaluation. A stage that ran another pass
// than it was given stops the run here, naming what it ran.
static double run_pass(Trainer *t, const MicroBatches *mb) {
    const GPT *g = &t->model;
    long units = (long)gpt_plan_units(&t->plan) * mb->count;
    long runs = g->units_run, backwards = g->backwards_run;
    double loss = t->strategy->forward_backward(t, mb);
    gpt_pass_end(&t->model);  // what the pass left (the last unit's gradients, an evaluation's slots) goes
    long ran_b = g->backwards_run - backwards, ran_f = g->units_run - runs - ran_b;
    CHECK(ran_f == units && ran_b == (mb->backward ? units : 0), "%s: %s pass of %d micro-batches ran %ld unit "
          "forwards and %ld backwards, not %ld and %ld; hint: its forward_backward runs backward only where "
          "mb->backward says so, each micro-batch through every unit it holds", t->strategy->name,
          mb->backward ? "a training" : "an evaluation", mb->count, ran_f, ran_b, units, mb->backward ? units : 0);
    return loss;
}

// Forward only over the held-out batches; its communication (zero3's
// gathers) is counted apart from the training steps'. A held-out batch is a
// global batch (--grad-accum micro-batches of batch x replicas rows), so
// every split of the same global batch evaluates the same rows.
static double evaluate(Trainer *t, int32_t *in, int32_t *tgt) {
    double ops[OP_COUNT], bytes0 = trainer_ring_bytes(t, ops);
    int count = t->cfg.eval_batches * t->cfg.grad_accum;
    MicroBatches mb = {.split = SPLIT_VAL, .first = 0, .count = count, .inputs = in, .targets = tgt};
    mem_set_phase(&t->dev.mem, PHASE_EVAL, -1, -1);
    double sum = run_pass(t, &mb);
    mem_set_phase(&t->dev.mem, PHASE_SETUP, -1, -1);
    t->report.eval_comm_bytes += trainer_ring_bytes(t, ops) - bytes0;
    t->report.evals++;
    return comm_sum_f64(t->dp, sum / count) / t->dp->size;
}

static double checked_eval(Trainer *t, int32_t *in, int32_t *tgt) {
    double val = evaluate(t, in, tgt);
    divergence_check_loss(t, val, 1);
    return val;
}

// --inject-overflow: whether 1-based step `step1` is one of the list's
static int injects_overflow(const char *steps, long step1) {
    for (const char *p = steps; p && *p;) {
        char *end;
        if (strtol(p, &end, 10) == step1) return 1;
        p = *end ? end + 1 : end;
    }
    return 0;
}

// fp16's skipped step: no update. What is still running of the last one
// (cpu_offload --dpu) finishes and reaches the device, so the params the
// next step reads are as old as the update's lag allows and no older.
static void skip_update(Trainer *t) {
    if (t->strategy->finish_update) t->strategy->finish_update(t, 1);
}

// The step's micro-batches. dloss/dlogits carries 1/(tokens in the global
// batch), so summing the ranks' gradients gives the gradient of the global
// mean loss; fp16 seeds the backward with the loss scale too (exact: a power
// of two), or with an infinity where --inject-overflow asks for one.
static MicroBatches step_micro_batches(const Trainer *t, int32_t *in, int32_t *tgt) {
    const TrainConfig *c = &t->cfg;
    float dloss_scale = (float)t->scaler.scale / ((float)c->batch * c->seq_len * c->grad_accum * trainer_data_replicas(t));
    if (injects_overflow(c->inject_overflow, t->step + 1) && t->world.rank == t->world.size - 1)
        dloss_scale = INFINITY;
    return (MicroBatches){SPLIT_TRAIN, (uint64_t)t->step * c->grad_accum, c->grad_accum, 1, dloss_scale, in, tgt};
}

// One optimizer step: grad_accum micro-batches, reduction, clipping, update.
static void train_step(Trainer *t, int32_t *in, int32_t *tgt) {
    const TrainConfig *c = &t->cfg;
    const Strategy *s = t->strategy;
    StepMeter meter = step_meter_begin(&t->taps);
    if (t->mem_timeline) mem_timeline_begin(t->mem_timeline, &t->dev.mem, t->step + 1);
    trainer_step_memory_begin(t);
    MicroBatches mb = step_micro_batches(t, in, tgt);
    double scale = t->scaler.scale;
    double loss = run_pass(t, &mb);
    mem_set_phase(&t->dev.mem, PHASE_OPTIMIZER, -1, -1);
    // the norm of the unscaled gradients; all-reduced over the ranks, so an
    // element that overflowed anywhere makes it infinite (or NaN) everywhere
    double norm = sqrt(s->grad_norm_sq(t)) / scale;
    int overflow = t->scaler.enabled && !isfinite(norm);
    // the norm and the mean loss are the same on every rank: a diverged step
    // stops the run before its update reaches the states
    if (!overflow) divergence_check_norm(t, norm);
    double mean_loss = comm_sum_f64(t->dp, loss / c->grad_accum) / t->dp->size;
    divergence_check_loss(t, mean_loss, 0);
    // Adam's t and the LR schedule count the applied steps only (loss_scale.h)
    AdamWStep hp = adamw_step_params(c, t->step - t->scaler.skipped, 1.0f);
    if (overflow) {
        skip_update(t);
    } else {
        float clip = (c->grad_clip > 0 && norm > c->grad_clip) ? (float)(c->grad_clip / norm) : 1.0f;
        hp.grad_scale = clip / (float)scale;
        s->update(t, &hp);
    }
    if (loss_scaler_update(&t->scaler, t->step, overflow))
        divergence_stop(t, "step %ld: the gradients overflow fp16 at the minimum loss scale %g", t->step + 1,
                        t->scaler.min_scale);
    t->step++;
    stop_note_step(t->step);
    mem_set_phase(&t->dev.mem, PHASE_SETUP, -1, -1);
    trainer_step_memory_end(t, t->step);
    StepMeasure measured = step_meter_end(&meter, &t->taps);
    memory_timeline_step_done(t, t->step);
    report_step(&t->report, t->step, &(StepOutcome){mean_loss, hp.lr, norm, scale, overflow}, &measured);
}

static uint64_t rows_consumed(const Trainer *t) {
    return (uint64_t)t->step * t->cfg.grad_accum * t->cfg.batch * trainer_data_replicas(t);
}

int trainer_main(int argc, char **argv, const Strategy *s) {
    Trainer *t = xcalloc(1, sizeof *t);
    setup(t, argc, argv, s);
    const TrainConfig *c = &t->cfg;
    size_t BT = (size_t)c->batch * c->seq_len;
    int32_t *in = xmalloc(BT * sizeof(int32_t)), *tgt = xmalloc(BT * sizeof(int32_t));
    mem_reset_peaks(&t->dev.mem);
    while (t->step < c->steps) {
        train_step(t, in, tgt);
        if (c->eval_every > 0 && t->step % c->eval_every == 0 && t->step < c->steps)
            report_eval(&t->report, t->step, checked_eval(t, in, tgt));
        if (c->save_every > 0 && t->step % c->save_every == 0 && t->step < c->steps)
            trainer_save(t, rows_consumed(t));
    }
    if (s->finish_update) s->finish_update(t, 1);  // the last update reaches the device params
    // the last update is judged by the validation loss it gives, before it is saved or exported
    report_eval(&t->report, t->step, checked_eval(t, in, tgt));
    if (c->export_llmc) trainer_export_llmc(t);
    if (c->save) trainer_save(t, rows_consumed(t));
    // the outputs were checked before step 1; a write that fails now (a full
    // disk) is one line each, after which the rest is still written
    int failed = trace_write(&t->trace, c->trace) != 0 || t->timeline_failed;
    failed |= trainer_report_finish(t) != 0;
    mpiCheck(MPI_Bcast(&failed, 1, MPI_INT, 0, t->world.mpi));  // rank 0 wrote both
    trainer_release_outputs(t);
    free(in);
    free(tgt);
    if (s->teardown) s->teardown(t);
    free(t->sctx);
    gpt_free(&t->model);
    states_free(&t->st, &t->dev);
    data_free(&t->data);
    report_free(&t->report);
    trace_free(&t->trace);
    if (t->mem_timeline) mem_timeline_free(t->mem_timeline);
    step_memory_free(&t->step_formula);
    free(t->mem_timeline);
    comm_free(&t->world);
    device_destroy(&t->dev);
    comm_world_finalize(&t->world);
    free(t);
    return failed ? EXIT_FAILURE : 0;
}
