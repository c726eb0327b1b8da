// trainer_ckpt.c: checkpoints of a training run. What a rank saves is the
// optimizer state it owns (fp32 master weights, Adam m and v over its range);
// bf16 parameters are bf16(master) and are rebuilt on resume, so every stage
// saves and restores exactly the numbers its next step depends on.
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "stop.h"
#include "ckpt.h"
#include "trainer.h"

// Replicated optimizer state (the dp baseline) is saved once, by rank 0.
static int saves_optim(const Trainer *t) {
    return t->st.layout.optim == STATE_SHARD || t->world.rank == 0;
}

// The data's identity: its tokens (both splits) and FNV-1a 64 of the first
// DATA_HASHED tokens of each split, the same for the same file or files
// wherever they lie, and cheap for a corpus of any size.
#define DATA_HASHED ((size_t)1 << 20)
static void data_identity(const DataSet *d, uint64_t *tokens, uint64_t *checksum) {
    uint64_t h = 14695981039346656037ull;
    for (int split = 0; split < 2; split++) {
        size_t n = d->count[split] < DATA_HASHED ? d->count[split] : DATA_HASHED;
        h = fnv1a64(&d->count[split], sizeof d->count[split], h);
        h = fnv1a64(d->tokens[split], n * sizeof(uint16_t), h);
    }
    *tokens = (uint64_t)d->count[0] + d->count[1];
    *checksum = h;
}

// A flag's effective value (0 where this binary has no such flag).
static int flag_int(const Settings *s, const char *flag) {
    const Setting *x = settings_find(s, flag);
    return x ? *(const int *)x->flag.dst : 0;
}

// ZeRO++'s quantization as the manifest records it: zero3's flags, off in
// every other stage, which has none.
static void note_quantization(const Settings *s, CkptManifest *m) {
    int weights = flag_int(s, "quantize-weights"), grads = flag_int(s, "quantize-grads");
    snprintf(m->quantize_weights, sizeof m->quantize_weights, "%s", weights ? "on" : "off");
    if (grads) snprintf(m->quantize_grads, sizeof m->quantize_grads, "%d-bit", flag_int(s, "grad-quant-bits"));
    else snprintf(m->quantize_grads, sizeof m->quantize_grads, "off");
    if (weights || grads) snprintf(m->quant_block, sizeof m->quant_block, "%d", flag_int(s, "quant-block"));
    else snprintf(m->quant_block, sizeof m->quant_block, "none");
}

static CkptManifest manifest_of(const Trainer *t, uint64_t data_rows) {
    CkptManifest m;
    memset(&m, 0, sizeof m);
    snprintf(m.stage, sizeof m.stage, "%s", t->strategy->name);
    snprintf(m.grid, sizeof m.grid, "%s", t->grid);
    m.ranks = t->world.size;
    m.step = t->step;
    snprintf(m.precision, sizeof m.precision, "%s", half_format_name(t->cfg.half));
    m.loss_scale = t->scaler.scale;
    m.scale_last_overflow = (int)t->scaler.last_overflow;
    m.scale_hysteresis_left = t->scaler.hysteresis_left;
    m.skipped_steps = t->scaler.skipped;
    m.data_rows = data_rows;
    m.seed = (uint64_t)t->cfg.seed;
    m.rng_state = data_rows;  // initial weights and data order are counter-based: the row counter is the whole RNG state
    m.cfg = t->layout.cfg;
    m.vocab_padded = gpt_vocab_padded(m.cfg.vocab_size, 1);
    m.num_params = t->model_params;
    m.batch = t->cfg.batch;
    m.seq_len = t->cfg.seq_len;
    m.grad_accum = t->cfg.grad_accum;
    m.total_steps = (int)lr_horizon(&t->cfg);
    m.warmup = t->cfg.warmup;
    m.lr = t->cfg.lr;
    const TrainConfig *c = &t->cfg;
    data_identity(&t->data, &m.data_tokens, &m.data_checksum);
    snprintf(m.data, sizeof m.data, "%s", c->data ? c->data : "built-in");
    snprintf(m.data_order, sizeof m.data_order, "%s", c->data_order);
    m.grad_clip = c->grad_clip;
    m.weight_decay = c->weight_decay;
    m.beta1 = c->beta1;
    m.beta2 = c->beta2;
    m.adam_eps = c->adam_eps;
    m.min_lr_frac = c->min_lr_frac;
    m.warmup_start_frac = c->warmup_start_frac;
    m.schedule_steps = c->schedule_steps;
    snprintf(m.lr_schedule, sizeof m.lr_schedule, "%s", c->lr_schedule);
    snprintf(m.warmup_type, sizeof m.warmup_type, "%s", c->warmup_type);
    note_quantization(&c->settings, &m);
    return m;
}

void ckpt_states_add(CkptStates *c, const char *name, void *host, size_t bytes, size_t flat_begin, size_t elem_bytes) {
    CHECK(c->n < 3 + STRATEGY_MAX_CKPT, "more than %d checkpoint tensors", 3 + STRATEGY_MAX_CKPT);
    c->t[c->n++] = (CkptTensor){.name = name, .host = host, .bytes = bytes, .flat_begin = flat_begin,
                                .elem_bytes = elem_bytes};
}

// Host copies of master, m and v (the device may not be host-addressable):
// in the part where this rank saves them.
static Buf ckpt_states_init(Trainer *t, CkptStates *c) {
    memset(c, 0, sizeof *c);
    c->optim_bytes = t->st.optim_count * sizeof(float);
    Buf host = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, 3 * c->optim_bytes, "checkpoint staging");
    const char *names[3] = {"master", "adam_m", "adam_v"};
    for (int i = 0; i < 3; i++) {
        c->optim[i] = (char *)host.ptr + i * c->optim_bytes;
        if (saves_optim(t)) ckpt_states_add(c, names[i], c->optim[i], c->optim_bytes, t->st.optim_begin, sizeof(float));
    }
    return host;
}

static Buf *optim_buf(Trainer *t, int i) { return i == 0 ? &t->st.master : (i == 1 ? &t->st.m : &t->st.v); }

void trainer_ckpt_out(Trainer *t, CkptStates *c) {
    dev_sync(&t->dev, STREAM_COMPUTE);  // the update wrote the states on the compute stream
    for (int i = 0; i < 3; i++) dev_copy(&t->dev, c->optim[i], optim_buf(t, i)->ptr, c->optim_bytes, STREAM_COPY);
    dev_sync(&t->dev, STREAM_COPY);
}

void trainer_ckpt_in(Trainer *t, CkptStates *c, int loaded) {
    if (!loaded) return;
    for (int i = 0; i < 3; i++) dev_copy(&t->dev, optim_buf(t, i)->ptr, c->optim[i], c->optim_bytes, STREAM_COPY);
    dev_sync(&t->dev, STREAM_COPY);
    t->strategy->params_from_master(t);
}

// The step folder DIR/latest names ("" when there is none or it is unreadable).
static void read_latest(const char *dir, char out[64]) {
    char path[4096];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    out[0] = 0;
    if (f && fscanf(f, "%63s", out) != 1) out[0] = 0;
    if (f) fclose(f);
}

void trainer_save(Trainer *t, uint64_t data_rows) {
    const Strategy *s = t->strategy;
    // an update still running first completes: the states saved are whole
    if (s->finish_update) s->finish_update(t, 0);
    CkptStates c;
    Buf host = ckpt_states_init(t, &c);
    if (s->ckpt_out) s->ckpt_out(t, &c);
    else trainer_ckpt_out(t, &c);
    CkptTensor optim[3] = {{.name = "master", .host = c.optim[0], .bytes = c.optim_bytes},
                           {.name = "adam_m", .host = c.optim[1], .bytes = c.optim_bytes},
                           {.name = "adam_v", .host = c.optim[2], .bytes = c.optim_bytes}};
    divergence_check_states(t, optim, 3);  // no checkpoint is written from diverged states
    CkptManifest m = manifest_of(t, data_rows);
    char err[512], before[64], after[64];
    double t0 = now_us();
    read_latest(t->cfg.save, before);  // rank 0's view decides the message, which rank 0 prints
    if (ckpt_save(&t->world, t->cfg.save, &m, c.t, c.n, err, sizeof err)) {
        read_latest(t->cfg.save, after);
        if (!before[0]) fail_usage("checkpoint not saved: %s (%s holds no earlier checkpoint)", err, t->cfg.save);
        // a failed save writes no file of an earlier step folder (ckpt.h): `latest` tells whether it was the last
        if (strcmp(before, after) == 0)
            fail_usage("checkpoint not saved: %s (the previous checkpoint in %s, %s, is unchanged)", err, t->cfg.save,
                       before);
        fail_usage("checkpoint not saved: %s (%s/latest changed from %s to %s meanwhile: check it with ckpt_tool "
                   "verify %s)", err, t->cfg.save, before, after[0] ? after : "nothing", t->cfg.save);
    }
    trace_span(&t->trace, TRACE_TID_IO, "checkpoint", t0, now_us(), 0);  // ckpt_save noted it for a signal's line
    if (t->world.rank == 0)
        printf("saved checkpoint: %s, step %ld (%.0f ms)\n", t->cfg.save, t->step, (now_us() - t0) / 1000);
    buf_free(&t->dev, &host);
}

// The steps a run with --save saves at: each --save-every multiple before
// --steps, and --steps (trainer_main).
static int saves_at(const TrainConfig *c, long step) {
    return step == c->steps || (c->save_every > 0 && step % c->save_every == 0 && step < c->steps);
}

// Rank 0: the first step after `from` that this run saves and DIR already
// holds a step folder of (named as ckpt_save names them), or 0.
static long first_taken_step(const char *dir, const TrainConfig *c, long from) {
    DIR *d = opendir(dir);
    long first = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        long step;
        char name[32];
        if (sscanf(e->d_name, "step-%8ld", &step) != 1) continue;
        snprintf(name, sizeof name, "step-%08ld", step);
        if (strcmp(name, e->d_name) == 0 && step > from && saves_at(c, step) && (!first || step < first))
            first = step;
    }
    if (d) closedir(d);
    return first;
}

void trainer_check_save_folder(Trainer *t) {
    const char *dir = t->cfg.save;
    size_t n = 2 * strlen(dir) + 2048;
    char *msg = xcalloc(n, 1);
    int failed = 0;
    if (t->world.rank == 0) {
        long taken = first_taken_step(dir, &t->cfg, t->step);
        CkptManifest mine = manifest_of(t, 0);
        if (taken)
            failed = snprintf(msg, n, "--save %s already holds step-%08ld, a step this run saves, and a save never "
                              "replaces a checkpoint: give --save a new folder, or move %s/step-%08ld away", dir,
                              taken, dir, taken) > 0;
        else
            failed = ckpt_folder_same_run(dir, &mine, msg, n);
    }
    if (comm_first_failure(&t->world, failed, msg, (int)n) >= 0) fail_usage("%s", msg);
    free(msg);
}

// The saved run's skipped steps count on (the schedule's step is the
// applied ones'); its dynamic scale goes on where it was when this run
// scales the same way (fp16, dynamic), else this run's own start stands.
static void resume_scaler(Trainer *t, const CkptManifest *got) {
    LossScaler *s = &t->scaler;
    s->skipped = got->skipped_steps;
    if (!s->dynamic || strcmp(got->precision, "fp16") != 0 || !(got->loss_scale > 0)) return;
    s->scale = got->loss_scale;
    s->last_overflow = got->scale_last_overflow;
    s->hysteresis_left = got->scale_hysteresis_left > 0 ? got->scale_hysteresis_left : s->hysteresis;
}

static size_t whole_of(const void *t, size_t s) { return trainer_whole_index(t, s); }

// Under a grid the states are pieces of the whole model: a resharded load
// reads them as runs of whole-model indices (ckpt_reshard.c); NULL on
// stages 01-06, whose states are the flat layout itself.
static CkptRun *state_runs(Trainer *t, CkptStates *c) {
    if (!t->grid[0]) return NULL;
    size_t n = 0;
    CkptRun *runs = ckpt_runs_of(whole_of, t, t->st.optim_begin, t->st.optim_count, &n);
    for (int i = 0; i < c->n; i++) {
        c->t[i].runs = runs;
        c->t[i].nruns = n;
    }
    return runs;
}

// "3d_parallel's checkpoint of 4 ranks (tp 2 x pp 2 x dp 1) into zero2's layout at 4"
static void say_resharded(const Trainer *t, const CkptManifest *got, const CkptLoadInfo *info) {
    char from[64] = "", into[64] = "";
    if (got->grid[0]) snprintf(from, sizeof from, " (%s)", got->grid);
    if (t->grid[0]) snprintf(into, sizeof into, " (%s)", t->grid);
    printf("resharded: %s's checkpoint of %d ranks%s into %s's layout at %d%s: rank 0 read %llu bytes of its own "
           "range from %d of %d parts (each rank reads only its range%s; part q's checksums are checked whole by "
           "rank q mod %d)\n", got->stage, got->ranks, from, t->strategy->name, t->world.size, into,
           (unsigned long long)info->bytes_read, info->parts_read, got->ranks,
           got->grid[0] || t->grid[0] ? ", mapped through the whole model's layout" : "", t->world.size);
}

void trainer_resume(Trainer *t) {
    const Strategy *s = t->strategy;
    CkptStates c;
    Buf host = ckpt_states_init(t, &c);
    if (s->ckpt_in) s->ckpt_in(t, &c, 0);  // the buffers of the stage's own tensors
    CkptRun *runs = state_runs(t, &c);
    CkptManifest expect = manifest_of(t, 0), got;
    CkptLoadInfo info;
    char err[512];
    int failed = ckpt_load(&t->world, t->cfg.resume, &expect, &got, c.t, c.n, &info, err, sizeof err);
    free(runs);
    // what ckpt_tool verify refuses, a resume refuses (err holds MSG_BYTES)
    if (!failed) failed = ckpt_manifest_consistent(t->cfg.resume, &got, err);
    if (failed) fail_usage("%s", err);
    if (got.step >= t->cfg.steps)
        fail_usage("--resume %s is at step %ld, not before --steps %d: ask for more steps", t->cfg.resume,
                   got.step, t->cfg.steps);
    if (t->st.layout.optim != STATE_SHARD)  // replicated: rank 0 read it, everyone gets it
        for (int i = 0; i < 3; i++) comm_broadcast(&t->world, c.optim[i], t->st.optim_count, DT_F32, 0, NULL);
    t->step = got.step;
    resume_scaler(t, &got);
    stop_note_step(t->step);
    stop_note_checkpoint(t->cfg.resume, got.step);
    if (s->ckpt_in) s->ckpt_in(t, &c, 1);
    else trainer_ckpt_in(t, &c, 1);
    buf_free(&t->dev, &host);
    if (t->world.rank == 0)
        printf("resumed from %s at step %ld (data row %llu)\n", t->cfg.resume, got.step,
               (unsigned long long)got.data_rows);
    if (t->world.rank == 0 && info.resharded) say_resharded(t, &got, &info);
    // Resuming continues the saved run: its LR schedule (over its horizon)
    // stays, and --steps only says where this run stops; only settings given
    // to change it (--schedule-steps, --warmup, --lr, ...) do, with a note.
    int adopted = !settings_given(&t->cfg.settings, "schedule-steps");
    if (adopted) t->cfg.schedule_steps = got.total_steps;
    if (t->world.rank != 0) return;
    if (adopted && got.total_steps != t->cfg.steps)
        printf("LR schedule of the saved run kept: it spans %d steps; --steps %d only sets where this run stops\n",
               got.total_steps, t->cfg.steps);
    CkptManifest now = manifest_of(t, 0);
    if (adopted) now.schedule_steps = got.schedule_steps;  // taken over, not changed
    char changes[1024];
    if (ckpt_math_changes(&got, &now, changes, sizeof changes))
        printf("note: this run changes settings that shape the update (%s), so from step %ld on it is not the "
               "run that saved\n", changes, got.step + 1);
    if (strcmp(got.data, expect.data) != 0)
        printf("note: the checkpoint's run read its data from %s; %s holds the same tokens\n", got.data, expect.data);
}
