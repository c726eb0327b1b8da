// infinity: ZeRO-Infinity (Rajbhandari et al., SC 2021) on top of ZeRO-3.
// Every state is sharded as in zero3. The rank's fp32 master, m and v
// (12Ψ/N) live in files on NVMe (--nvme-path) and its reduced gradient shard
// (2Ψ/N) in pinned host memory, as in ZeRO-Offload. At the optimizer step a
// SIMD CPU Adam updates them sub-group by sub-group (--sub-group-mb) while the
// swapper streams them: sub-group k+1 is read while k is updated and k-1
// written back. The bf16 param shard (2Ψ/N) stays on the device
// (--offload-params none) or moves to pinned host memory (cpu) or NVMe
// (nvme); then each unit's slice comes up for its gather along zero3's
// schedule, read from NVMe ahead of time, and the device holds only the
// units being computed.
#include <string.h>
#include "../05_cpu_offload/host_grads.h"
#include "check.h"
#include "cpu_adam.h"
#include "kernels.h"
#include "nvme_files.h"
#include "param_fetch.h"
#include "swapper.h"
#include "trainer.h"

// Defaults, justified in the handout: a sub-group of 64 MB keeps the three
// pinned slots near 220 MB per rank while every request spans many aio
// blocks; 1 MiB blocks 8 deep (8 MiB in flight) where the aio sweep levels off.
#define SUB_GROUP_MB_DEFAULT 64.0
#define AIO_BLOCK_KB_DEFAULT 1024
#define AIO_QUEUE_DEPTH_DEFAULT 8

typedef enum { PARAMS_DEVICE, PARAMS_CPU, PARAMS_NVME } ParamsAt;

typedef struct Stage {
    const char *nvme_path, *offload_params;  // --nvme-path, --offload-params
    double sub_group_mb, bucket_mb;          // --sub-group-mb, --bucket-mb
    int aio_block_kb, aio_queue_depth;       // --aio-block-kb, --aio-queue-depth
    int prefetch;                            // --prefetch
    ParamsAt params_at;
    GradShard grads;          // zero2's buckets...
    HostGrads host_grads;     // ... delivering to the pinned gradient shard
    ParamShard params;        // zero3's gathers
    ParamFetch fetch;         // ... fed from pinned memory or NVMe (params off the device)
    Aio aio;                  // master, m, v
    Aio params_aio;           // the params on NVMe: reads the compute waits for never queue behind the states
    NvmeFiles files;
    Swapper swap;             // master, m, v through pinned slots
    Event uploaded[SWAP_SLOTS];  // params on the device: a slot's new bf16 sub-group is up
} Stage;

// ---- flags and the layout they pick ----

static int flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    z->offload_params = "none";
    z->sub_group_mb = SUB_GROUP_MB_DEFAULT;
    z->aio_block_kb = AIO_BLOCK_KB_DEFAULT;
    z->aio_queue_depth = AIO_QUEUE_DEPTH_DEFAULT;
    out[0] = (FlagSpec){.name = "nvme-path", .type = FLAG_STRING, .dst = &z->nvme_path, .meta = "DIR",
                        .help = "folder on a disk for the swap files (DIR/rank-R/), removed at the end",
                        .shown_default = "none: required"};
    out[1] = (FlagSpec){.name = "offload-params", .type = FLAG_STRING, .dst = &z->offload_params,
                        .meta = "none|cpu|nvme", .help = "where the bf16 param shard lives: device, pinned host memory, NVMe"};
    out[2] = (FlagSpec){.name = "sub-group-mb", .type = FLAG_DOUBLE, .dst = &z->sub_group_mb, .meta = "MB",
                        .help = "fp32 master, m and v per sub-group of the swapper (three in pinned memory at once)",
                        .min = 0, .min_open = 1, .max = 1e6};
    out[3] = (FlagSpec){.name = "aio-block-kb", .type = FLAG_INT, .dst = &z->aio_block_kb, .meta = "KB",
                        .help = "size of one aio request to the disk (a multiple of 4)", .min = 4, .max = 1 << 20};
    out[4] = (FlagSpec){.name = "aio-queue-depth", .type = FLAG_INT, .dst = &z->aio_queue_depth, .meta = "N",
                        .help = "aio requests kept in the disk's queue", .min = 1, .max = 1024};
    out[5] = grad_shard_flag(&z->bucket_mb);
    out[6] = param_shard_flag(&z->prefetch);
    return 7;
}

static ParamsAt params_at_of(const char *s) {
    if (strcmp(s, "none") == 0) return PARAMS_DEVICE;
    if (strcmp(s, "cpu") == 0) return PARAMS_CPU;
    if (strcmp(s, "nvme") == 0) return PARAMS_NVME;
    fail_usage("--offload-params %s: choose none (the param shard on the device), cpu (pinned host memory) "
               "or nvme", s);
}

// Before anything is allocated: the flags, where the bf16 param shard
// lives (which picks the states' layout and closed form), and the room on
// the disk for the files.
static void configure(Trainer *t, const GPTConfig *model) {
    static const MemTier tier[3] = {TIER_DEVICE, TIER_PINNED, TIER_NVME};
    static const StageId form[3] = {STAGE_INFINITY, STAGE_INFINITY_CPU, STAGE_INFINITY_NVME};
    Stage *z = t->sctx;
    z->params_at = params_at_of(z->offload_params);
    if (!z->nvme_path)
        fail_usage("--nvme-path DIR is missing: give a folder on a disk-backed file system (ext4, xfs) with room "
                   "for the states (memory_math --model NAME --ranks N prints the nvme bytes)");
    if (z->aio_block_kb % 4)  // the flag's range holds the rest
        fail_usage("--aio-block-kb %d: give a multiple of 4 (O_DIRECT moves whole 4 KiB blocks) from 4 to 1048576",
                   z->aio_block_kb);
    t->states.params_tier = tier[z->params_at];
    t->formula = form[z->params_at];
    // the folder and its room for this rank's shard of the whole model (the
    // partition the trainer makes next), before anything is allocated
    Partition part;
    partition_init(&part, t->layout.num_params, t->world.size, t->world.rank);
    nvme_files_check(&z->files, t, part.shard, z->nvme_path);
}

static void say_where(Trainer *t, Stage *z) {
    if (t->world.rank != 0) return;
    static const char *const where[3] = {"on the device", "in pinned host memory", "on NVMe"};
    double file_gb = 0;
    for (int i = 0; i < SWAP_TENSORS; i++) file_gb += aio_round_up(z->files.payload[i]) / 1e9;
    printf("nvme: %.3f GB of files per rank under %s/rank-*/; bf16 params %s; %d sub-group%s of %zu "
           "elements; aio %d KiB x %d deep\n", file_gb, z->nvme_path, where[z->params_at], z->swap.groups,
           z->swap.groups == 1 ? "" : "s", z->swap.group_elems, z->aio_block_kb, z->aio_queue_depth);
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    grad_shard_init(&z->grads, t, z->bucket_mb);
    host_grads_init(&z->host_grads, &z->grads, t);
    param_shard_init(&z->params, t, z->prefetch);
    char err[AIO_ERR_BYTES] = "";
    size_t block_bytes = (size_t)z->aio_block_kb * 1024;
    int rc = aio_init(&z->aio, z->aio_queue_depth, block_bytes, err);
    if (!rc && z->params_at == PARAMS_NVME) rc = aio_init(&z->params_aio, z->aio_queue_depth, block_bytes, err);
    nvme_agree(t, rc != 0, err);
    nvme_files_create(&z->files, t, &z->aio);
    const AioFile *files[SWAP_TENSORS] = {&z->files.file[SWAP_MASTER], &z->files.file[SWAP_M],
                                          &z->files.file[SWAP_V],
                                          z->params_at == PARAMS_NVME ? &z->files.file[SWAP_PARAMS] : NULL};
    size_t group = swapper_group_elems(z->sub_group_mb * 1e6, t->part.shard);
    swapper_init(&z->swap, &t->dev, &t->trace, &z->aio, &z->params_aio, files, t->part.shard, group);
    if (z->params_at != PARAMS_DEVICE)
        param_fetch_init(&z->fetch, t, &z->params, &z->params_aio, files[SWAP_PARAMS], &z->swap);
    for (int i = 0; i < SWAP_SLOTS; i++) t->dev.ops->event_create(&t->dev, &z->uploaded[i]);
    say_where(t, z);
}

// zero3's on the device: the buckets, and the units gathered at once at this
// prefetch depth (the swapper's slots and the param slices are pinned host memory).
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return zero_bucket_bytes(z->bucket_mb, p) + zero_gathered_peak_bytes(l, z->prefetch);
}

// ---- the micro-batch step: zero3's, with the disk kept busy ----

// Before unit u computes: while the model computes, the next optimizer
// step's first sub-groups come in (training only: after the last step
// nothing reads them), the param slices of the units ahead are read from
// NVMe (params off the device), then zero3's gather.
static void before_unit(Trainer *t, Stage *z, int u, int pass) {
    if (t->step < t->cfg.steps) swapper_progress(&z->swap);
    if (z->params_at != PARAMS_DEVICE) param_fetch_ahead(&z->fetch, t, u, pass);
    param_shard_acquire(&z->params, t, u, pass);
}

static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    GPT *g = &t->model;
    ParamShard *ps = &z->params;
    int head = gpt_unit_head(&g->L);
    double loss = 0;
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) {
            before_unit(t, z, u, PASS_FORWARD);
            const bf16 *wte = u == head ? param_shard_view(ps, GPT_UNIT_EMBED) : NULL;  // tied output projection
            gpt_unit_forward(g, u, 0, param_shard_view(ps, u), wte);
            param_shard_release(ps, t, u, PASS_FORWARD);
        }
        loss += gpt_slot_loss(g, 0);
        if (!mb->backward) continue;
        t->micro = i;
        for (int u = g->L.num_units - 1; u >= 0; u--) {
            before_unit(t, z, u, PASS_BACKWARD);
            grad_shard_progress(&z->grads, t);
            // the embeddings' backward scatters gradients and reads no params: nothing was gathered for it
            const bf16 *p = u == GPT_UNIT_EMBED ? NULL : param_shard_view(ps, u);
            const bf16 *wte = u == head ? param_shard_view(ps, GPT_UNIT_EMBED) : NULL;
            const float *grads = gpt_unit_backward(g, u, 0, p, wte);
            grad_shard_add_unit(&z->grads, t, u, grads);  // the reduced parts go down to the host shard
            param_shard_release(ps, t, u, PASS_BACKWARD);
        }
        grad_shard_flush(&z->grads, t);
    }
    return loss;
}

// ---- the optimizer step, through the swapper ----

// A read or write that failed on any rank stops every rank here, where all
// of them arrive, with one line (the job may not go on with a state it could
// not save or read back). The swap files are scratch: they go first.
static void stop_on_io_error(Trainer *t, Stage *z, int rc) {
    int any = 0;
    mpiCheck(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, t->world.mpi));
    if (!any) return;
    if (z->params_at != PARAMS_DEVICE) param_fetch_forget(&z->fetch, t);
    swapper_drain(&z->swap);
    nvme_files_remove(&z->files, t);
    char msg[2 * AIO_ERR_BYTES] = "";
    if (rc)
        snprintf(msg, sizeof msg, "step %ld: %s; the run stops here (%s)", t->step + 1, z->swap.error_msg,
                 t->cfg.save ? "the last checkpoint in --save is as it was: it does not need the swap files"
                             : "no --save: there is no checkpoint to resume from");
    nvme_agree(t, rc != 0, msg);
}

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

// The pass's reads and writes counted for the step, or dropped (set-up,
// checkpoints: not a step's traffic).
static void take_nvme_bytes(Trainer *t, Stage *z, int count) {
    double read_bytes, write_bytes;
    swapper_take_bytes(&z->swap, &read_bytes, &write_bytes);
    if (!count) return;
    count_transfer(t, XFER_NVME_READ, read_bytes);
    count_transfer(t, XFER_NVME_WRITE, write_bytes);
}

// Before the params change: no unit stays gathered, no slice read ahead.
static void forget_params(Trainer *t, Stage *z) {
    param_shard_release_all(&z->params, t);
    if (z->params_at != PARAMS_DEVICE) param_fetch_forget(&z->fetch, t);
}

static void update(Trainer *t, const AdamWStep *s) {
    Stage *z = t->sctx;
    forget_params(t, z);
    dev_sync(&t->dev, STREAM_COPY);  // every reduced gradient part is on the host
    AdamWork w = {.t = t, .s = s, .path = cpu_adam_best_path()};
    unsigned what = SWAP_READ | SWAP_WRITE | (z->params_at == PARAMS_NVME ? SWAP_WRITE_PARAMS : 0);
    int rc = swapper_pass(&z->swap, what, adam_group, &w);
    dev_sync(&t->dev, STREAM_COPY);  // the new params are up before the next forward gathers them
    take_nvme_bytes(t, z, 1);
    stop_on_io_error(t, z, rc);
}

static void params_group(const SwapGroup *g, void *arg) {
    Trainer *t = arg;
    Stage *z = t->sctx;
    kernels_cpu.f32_to_bf16(&t->dev, params_out(t, z, g), g->master, g->count);
    upload(t, z, g);
}

static void params_from_master(Trainer *t) {
    Stage *z = t->sctx;
    forget_params(t, z);
    unsigned what = SWAP_READ | (z->params_at == PARAMS_NVME ? SWAP_WRITE_PARAMS : 0);
    int rc = swapper_pass(&z->swap, what, params_group, t);
    dev_sync(&t->dev, STREAM_COPY);
    take_nvme_bytes(t, z, 0);
    stop_on_io_error(t, z, rc);
}

// Writes left in flight by the last step finish before a checkpoint reads
// the files, and before the end.
static void finish_update(Trainer *t, int to_device) {
    Stage *z = t->sctx;
    stop_on_io_error(t, z, swapper_drain(&z->swap));
}

// ---- checkpoints: master, m and v through the swapper ----

typedef struct HostCopy {
    void *const *host;
    int saving;
} HostCopy;

static void copy_group(const SwapGroup *g, void *arg) {
    const HostCopy *c = arg;
    float *slot[3] = {g->master, g->m, g->v};
    for (int i = 0; i < 3; i++) {
        float *host = (float *)c->host[i] + g->first;
        if (c->saving) memcpy(host, slot[i], g->count * sizeof(float));
        else memcpy(slot[i], host, g->count * sizeof(float));
    }
}

// Between the files and the checkpoint's host copies, either way.
static void copy_states(Trainer *t, Stage *z, CkptStates *c, int saving) {
    CHECK(c->optim_bytes == t->part.shard * sizeof(float), "checkpoint tensors of %zu bytes, shard of %zu",
          c->optim_bytes, t->part.shard * sizeof(float));
    HostCopy hc = {.host = c->optim, .saving = saving};
    int rc = swapper_pass(&z->swap, saving ? SWAP_READ : SWAP_WRITE, copy_group, &hc);
    if (!rc) rc = swapper_drain(&z->swap);  // in the files before anything reads them
    take_nvme_bytes(t, z, 0);
    stop_on_io_error(t, z, rc);
}

// The checkpoint holds the states themselves, never the swap files: a run
// resumes into fresh files wherever its --nvme-path points.
static void ckpt_out(Trainer *t, CkptStates *c) { copy_states(t, t->sctx, c, 1); }

static void ckpt_in(Trainer *t, CkptStates *c, int loaded) {
    if (!loaded) return;
    copy_states(t, t->sctx, c, 0);
    params_from_master(t);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    if (z->params_at != PARAMS_DEVICE) param_fetch_free(&z->fetch, t);
    param_shard_free(&z->params, t);
    swapper_free(&z->swap);
    nvme_files_remove(&z->files, t);
    aio_destroy(&z->aio);
    aio_destroy(&z->params_aio);  // no-op where it was not set up
    host_grads_free(&z->host_grads, t);
    grad_shard_free(&z->grads, t);
    for (int i = 0; i < SWAP_SLOTS; i++) t->dev.ops->event_destroy(&t->dev, &z->uploaded[i]);
}

const Strategy strategy_infinity = {
    .name = "infinity",
    .summary = "ZeRO-Infinity on top of ZeRO-3: fp32 master, m and v in files on NVMe, streamed in sub-groups\n"
               "through a pipelined swapper to a SIMD CPU Adam; the gradient shard in pinned host memory;\n"
               "--offload-params moves the bf16 param shard to pinned host memory or NVMe too.",
    .formula = STAGE_INFINITY,
    // zero3's shards; the optimizer states on NVMe, the gradients beside the CPU Adam
    .states = {.params = STATE_SHARD, .grads = STATE_SHARD, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_PINNED, .optim_tier = TIER_NVME},
    .context_bytes = sizeof(Stage),
    .flags = flags,
    .configure = configure,
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .forward_backward = forward_backward,
    .grad_norm_sq = host_grads_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .finish_update = finish_update,
    .ckpt_out = ckpt_out,
    .ckpt_in = ckpt_in,
    .teardown = teardown,
};
