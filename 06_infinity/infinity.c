// infinity: ZeRO-Infinity (Rajbhandari et al., SC 2021) on top of ZeRO-3.
// Every state is sharded as in zero3. The rank's fp32 master, m and v
// (12Ψ/N) live in files on NVMe (--offload-optimizer nvme, the default;
// --nvme-path) or in pinned host memory (cpu), and its reduced gradient
// shard (2Ψ/N) in pinned host memory, as in ZeRO-Offload. At the optimizer
// step a SIMD CPU Adam updates them sub-group by sub-group (--sub-group-mb)
// while the swapper streams them from NVMe: sub-group k+1 is read while k is
// updated and k-1 written back. The bf16 param shard (2Ψ/N) stays on the
// device (--offload-params none) or moves to pinned host memory (cpu) or
// NVMe (nvme); then each unit's slice comes up for its gather along zero3's
// schedule (read from NVMe ahead of time), on the copy stream --prefetch
// units ahead of the compute (0: when the unit is needed, the synchronous
// block swap), and the device holds only the units being computed. With
// --offload-params cpu --offload-optimizer cpu every state is on the host
// and no disk is needed: DeepSpeed's ZeRO-3 offload to the CPU.
#include "check.h"
#include "cpu_adam.h"
#include "infinity.h"
#include "kernels.h"

// Before anything is allocated: the flags, where the bf16 param shard
// lives (which picks the states' layout and closed form), and the room on
// the disk for the files.
static Placement configure(const Trainer *t, TrainConfig *cfg, const GPTConfig *model, Placement p) {
    static const MemTier tier[3] = {TIER_DEVICE, TIER_PINNED, TIER_NVME};
    static const StageId form[2][3] = {
        [OPTIM_NVME] = {STAGE_INFINITY, STAGE_INFINITY_CPU, STAGE_INFINITY_NVME},
        [OPTIM_CPU] = {STAGE_INFINITY_OPT_CPU, STAGE_INFINITY_CPU_OPT_CPU, STAGE_INFINITY_NVME_OPT_CPU}};
    Stage *z = t->sctx;
    infinity_check_flags(z, &cfg->settings);
    p.states.params_tier = tier[z->params_at];
    p.states.optim_tier = z->optim_at == OPTIM_NVME ? TIER_NVME : TIER_PINNED;
    p.formula = form[z->optim_at][z->params_at];
    if (!z->on_nvme) return p;
    // the folder and its room for this rank's shard of the whole model (the
    // partition the trainer makes next), before anything is allocated
    Partition part;
    partition_init(&part, p.layout.num_params, p.dp->size, p.dp->rank);
    nvme_files_check(&z->files, t, &p.states, part.shard, z->nvme_path);
    return p;
}

// The files on NVMe and their aio contexts, where something lives there.
static void open_nvme(Trainer *t, Stage *z) {
    char err[AIO_ERR_BYTES] = "";
    size_t block_bytes = (size_t)z->aio_block_kb * 1024;
    int rc = aio_init(&z->aio, z->aio_queue_depth, block_bytes, err);
    if (!rc && z->params_at == PARAMS_NVME) rc = aio_init(&z->params_aio, z->aio_queue_depth, block_bytes, err);
    nvme_agree(t, rc != 0, err);
    nvme_files_create(&z->files, t, &z->aio);
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    grad_shard_init(&z->grads, t, z->bucket_mb);
    host_grads_init(&z->host_grads, &z->grads, t);
    param_shard_init(&z->params, t, z->prefetch);
    if (z->on_nvme) open_nvme(t, z);
    int in_files = z->optim_at == OPTIM_NVME;
    const AioFile *files[SWAP_TENSORS] = {in_files ? &z->files.file[SWAP_MASTER] : NULL,
                                          in_files ? &z->files.file[SWAP_M] : NULL,
                                          in_files ? &z->files.file[SWAP_V] : NULL,
                                          z->params_at == PARAMS_NVME ? &z->files.file[SWAP_PARAMS] : NULL};
    float *const in_memory[3] = {t->st.master.ptr, t->st.m.ptr, t->st.v.ptr};
    size_t group = swapper_group_elems(z->sub_group_mb * 1e6, t->part.shard);
    swapper_init(&z->swap, &t->dev, &t->trace, &z->aio, &z->params_aio, files, in_files ? NULL : in_memory,
                 t->part.shard, group);
    if (z->params_at != PARAMS_DEVICE)
        param_fetch_init(&z->fetch, t, &z->params, &z->params_aio, files[SWAP_PARAMS], &z->swap);
    for (int i = 0; i < SWAP_SLOTS; i++) t->dev.ops->event_create(&t->dev, &z->uploaded[i]);
    infinity_say_where(t, z);
}

// zero3's on the device: the buckets, and the units gathered at once at this
// prefetch depth (the swapper's slots and the param slices are pinned host memory).
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return zero_bucket_bytes(z->bucket_mb, p) + zero_gathered_peak_bytes(l, z->prefetch);
}

static void step_shape(const void *ctx, const Trainer *t, StepMemorySpec *s) {
    const Stage *z = ctx;
    param_shard_step_shape(z->prefetch, z->bucket_mb, t, s);
}

// ---- the micro-batch step: zero3's, with the disk kept busy ----

// With the params on NVMe the update held back its last master, m and v
// writes (SWAP_HOLD_LAST): the next forward starts by reading the params
// back, and a disk shares itself between the requests it holds rather than
// serving the first first, so reads beside those writes would take as long
// as the writes. Once the first units' param reads are in, the writes go.
static void release_held_writes(Stage *z) {
    if (param_fetch_window_in(&z->fetch)) swapper_release_writes(&z->swap);
}

// Before unit u computes: while the model computes, the next optimizer
// step's first sub-groups come in (training only: after the last step
// nothing reads them), the param slices of the units ahead are read from
// NVMe (params off the device), then zero3's gather.
static void before_unit(Trainer *t, Stage *z, int u, int pass) {
    if (t->step < t->cfg.steps) swapper_progress(&z->swap);
    if (z->params_at != PARAMS_DEVICE) param_fetch_ahead(&z->fetch, t, u, pass);
    release_held_writes(z);
    param_shard_acquire(&z->params, t, u, pass);
    release_held_writes(z);
}

static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    GPT *g = &t->model;
    ParamShard *ps = &z->params;
    int head = gpt_unit_head(&g->L);
    param_shard_begin(ps, mb);
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) {
            before_unit(t, z, u, PASS_FORWARD);
            const bf16 *wte = u == head ? param_shard_view(ps, GPT_UNIT_EMBED) : NULL;  // tied output projection
            gpt_unit_forward(g, u, 0, param_shard_view(ps, u), wte);
            param_shard_release(ps, t, u, PASS_FORWARD);
        }
        gpt_slot_loss_queue(g, 0);
        if (!mb->backward) continue;
        for (int u = g->L.num_units - 1; u >= 0; u--) {
            before_unit(t, z, u, PASS_BACKWARD);
            grad_shard_progress(&z->grads, t);
            // the embeddings' backward scatters gradients and reads no params: nothing was gathered for it
            const bf16 *p = u == GPT_UNIT_EMBED ? NULL : param_shard_view(ps, u);
            const bf16 *wte = u == head ? param_shard_view(ps, GPT_UNIT_EMBED) : NULL;
            const float *grads = gpt_unit_backward(g, u, 0, p, wte);
            grad_shard_add_unit(&z->grads, t, u, grads, micro_turn(mb, i));  // reduced parts go down to the host
            param_shard_release(ps, t, u, PASS_BACKWARD);
        }
        grad_shard_flush(&z->grads, t);
    }
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

// ---- the optimizer step, through the swapper ----

// Where a sub-group's new bf16 params go: straight into the pinned shard
// (cpu), or the slot, from where they go up to the device (none) or out to
// the params file (nvme, by the swapper).
static bf16 *params_out(Trainer *t, Stage *z, const SwapGroup *g) {
    if (z->params_at == PARAMS_CPU) return (bf16 *)t->st.params.ptr + g->first;
    if (z->params_at == PARAMS_DEVICE)  // the slot's last sub-group has gone up
        t->dev.ops->event_sync(&t->dev, &z->uploaded[g->slot]);
    return g->params;
}

static void upload(Trainer *t, Stage *z, const SwapGroup *g) {
    if (z->params_at != PARAMS_DEVICE) return;
    size_t bytes = g->count * sizeof(bf16);
    dev_copy(&t->dev, (bf16 *)t->st.params.ptr + g->first, g->params, bytes, STREAM_COPY);
    t->dev.ops->event_record(&t->dev, &z->uploaded[g->slot], STREAM_COPY);
    count_transfer(t, XFER_H2D, (double)bytes);
}

typedef struct AdamWork {
    Trainer *t;
    const AdamWStep *s;
    CpuAdamPath path;
} AdamWork;

static void adam_group(const SwapGroup *g, void *arg) {
    AdamWork *w = arg;
    Trainer *t = w->t;
    Stage *z = t->sctx;
    bf16 *out = params_out(t, z, g);
    int threads = t->dev.threads > 0 ? t->dev.threads : 1;
    double t0 = now_us();
    cpu_adam_step(w->path, threads, g->master, g->m, g->v, (const bf16 *)t->st.grads.ptr + g->first, out,
                  g->count, w->s);
    trace_span(&t->trace, TRACE_TID_HOST, "cpu adam", t0, now_us(), 0);
    upload(t, z, g);
}

// Before the params change: no unit stays gathered, no slice read ahead.
static void forget_params(Trainer *t, Stage *z) {
    param_shard_release_all(&z->params, t);
    if (z->params_at != PARAMS_DEVICE) param_fetch_forget(&z->fetch, t);
}

// What a pass moves of master, m and v: in files, read before the work and
// written after it; in pinned memory, nothing.
static unsigned states_io(const Stage *z) { return z->optim_at == OPTIM_NVME ? SWAP_READ | SWAP_WRITE : 0; }

static void update(Trainer *t, const AdamWStep *s) {
    Stage *z = t->sctx;
    forget_params(t, z);
    dev_sync(&t->dev, STREAM_COPY);  // every reduced gradient part is on the host, every param slice read
    AdamWork w = {.t = t, .s = s, .path = cpu_adam_best_path()};
    // with the params on NVMe, the pass writes them too, and holds its last state writes (release_held_writes)
    unsigned what = states_io(z) | (z->params_at == PARAMS_NVME ? SWAP_WRITE_PARAMS | SWAP_HOLD_LAST : 0);
    int rc = swapper_pass(&z->swap, what, adam_group, &w);
    dev_sync(&t->dev, STREAM_COPY);  // the new params are up before the next forward gathers them
    infinity_take_nvme_bytes(t, z, 1);
    infinity_stop_on_io_error(t, z, rc);
}

static void params_group(const SwapGroup *g, void *arg) {
    Trainer *t = arg;
    Stage *z = t->sctx;
    kernels_cpu.f32_to_half(&t->dev, params_out(t, z, g), g->master, g->count);
    upload(t, z, g);
}

void infinity_params_from_master(Trainer *t) {
    Stage *z = t->sctx;
    forget_params(t, z);
    unsigned what = (states_io(z) & SWAP_READ) | (z->params_at == PARAMS_NVME ? SWAP_WRITE_PARAMS : 0);
    int rc = swapper_pass(&z->swap, what, params_group, t);
    dev_sync(&t->dev, STREAM_COPY);
    infinity_take_nvme_bytes(t, z, 0);
    infinity_stop_on_io_error(t, z, rc);
}

// Writes left in flight by the last step finish before a checkpoint reads
// the files, and before the end.
static void finish_update(Trainer *t, int to_device) {
    Stage *z = t->sctx;
    infinity_stop_on_io_error(t, z, swapper_drain(&z->swap));
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    if (z->params_at != PARAMS_DEVICE) param_fetch_free(&z->fetch, t);
    param_shard_free(&z->params, t);
    swapper_free(&z->swap);
    if (z->on_nvme) nvme_files_remove(&z->files, t);
    aio_destroy(&z->aio);         // no-op where it was not set up
    aio_destroy(&z->params_aio);
    host_grads_free(&z->host_grads, t);
    grad_shard_free(&z->grads, t);
    for (int i = 0; i < SWAP_SLOTS; i++) t->dev.ops->event_destroy(&t->dev, &z->uploaded[i]);
}

const Strategy strategy_infinity = {
    .name = "infinity",
    .summary = "ZeRO-Infinity on top of ZeRO-3: fp32 master, m and v in files on NVMe, streamed in sub-groups\n"
               "through a pipelined swapper to a SIMD CPU Adam (--offload-optimizer cpu: in pinned host memory);\n"
               "the gradient shard in pinned host memory; --offload-params moves the bf16 param shard to pinned\n"
               "host memory or NVMe too, its units copied up --prefetch ahead of their compute (0: when needed).",
    .formula = STAGE_INFINITY,
    // zero3's shards; the optimizer states on NVMe, the gradients beside the CPU Adam
    .states = {.params = STATE_SHARD, .grads = STATE_SHARD, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_PINNED, .optim_tier = TIER_NVME},
    .context_bytes = sizeof(Stage),
    .flags = infinity_flags,
    .configure = configure,
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .step_shape = step_shape,
    .forward_backward = forward_backward,
    .grad_norm_sq = host_grads_norm_sq,
    .update = update,
    .params_from_master = infinity_params_from_master,
    .finish_update = finish_update,
    .ckpt_out = infinity_ckpt_out,
    .ckpt_in = infinity_ckpt_in,
    .report = infinity_report,
    .teardown = teardown,
};
