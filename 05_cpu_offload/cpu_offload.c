// cpu_offload: ZeRO-Offload (Ren et al., ATC 2021) on top of ZeRO-2. The bf16
// params stay on the device (2Ψ); the fp32 master, m and v of the rank's
// shard (12Ψ/N) and its reduced gradient shard (2Ψ/N) live in pinned host
// memory, where a SIMD CPU Adam updates them. Gradients leave in zero2's
// buckets; as each bucket's reduce-scatter finishes, this rank's part is
// copied down to the host while backward goes on. After the update the new
// bf16 shard goes up and is all-gathered.
//
// --dpu, the paper's one-step delayed parameter update: after --dpu-warmup
// ordinary steps, the CPU Adam of step i runs on a host thread while the
// device computes step i+1 with the parameters of step i-1. Master, m and v
// stay exact; only the device copy lags one step. Step i+1's gradients
// arrive in a second host shard while step i's are being applied.
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <unistd.h>
#include "shard_update.h"
#include "check.h"
#include "cpu_adam.h"
#include "host_grads.h"
#include "host_worker.h"
#include "kernels.h"
#include "trainer.h"

#define DPU_WARMUP_DEFAULT 40  // the paper's: the first steps change the params fastest

// One optimizer step of the CPU Adam over this rank's shard.
typedef struct AdamJob {
    float *master, *m, *v;
    const bf16 *grads;  // the gradient shard this step applies
    bf16 *params_out;   // the new bf16 shard, on its way up
    size_t n;
    AdamWStep step;
    CpuAdamPath path;
    int threads;
} AdamJob;

typedef struct Stage {
    double bucket_mb;                 // --bucket-mb
    int dpu, dpu_warmup, dpu_serial;  // --dpu, --dpu-warmup, --dpu-serial
    int host_threads;                 // --host-threads
    int warmup_given, threads_given;
    GradShard grads;                  // zero2's buckets, delivering to the host
    HostGrads host_grads;             // ... into the pinned gradient shard
    Buf params_out;                   // pinned: the updated bf16 shard, on its way up
    Buf grads_next;                   // --dpu: the shard the next step fills while t->st.grads is applied
    Buf ckpt_params;                  // host: the lagging device shard, for a checkpoint
    Event uploaded;                   // the copy of params_out up has finished
    AdamJob job;                      // the update in flight (--dpu)
    HostWorker worker;
    int pending;                      // a job was started and not collected
    int upload_due;                   // params_out is newer than the device's params
} Stage;

static void run_adam(void *arg) {
    AdamJob *j = arg;
    cpu_adam_step(j->path, j->threads, j->master, j->m, j->v, j->grads, j->params_out, j->n, &j->step);
}

// ---- flags and set-up ----

static int flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    z->dpu_warmup = DPU_WARMUP_DEFAULT;
    z->host_threads = 0;
    out[0] = grad_shard_flag(&z->bucket_mb);
    out[1] = (FlagSpec){.name = "dpu", .type = FLAG_BOOL, .dst = &z->dpu,
                        .help = "one-step delayed parameter update: the CPU Adam of step i runs during step i+1"};
    out[2] = (FlagSpec){.name = "dpu-warmup", .type = FLAG_INT, .dst = &z->dpu_warmup, .meta = "N",
                        .help = "ordinary steps before the update is delayed", .given = &z->warmup_given,
                        .min = 0, .max = INT_MAX};
    out[3] = (FlagSpec){.name = "dpu-serial", .type = FLAG_BOOL, .dst = &z->dpu_serial,
                        .help = "run the delayed update on the main thread (the reference the threaded one equals)"};
    out[4] = (FlagSpec){.name = "host-threads", .type = FLAG_INT, .dst = &z->host_threads, .meta = "N",
                        .help = "OpenMP threads of the CPU Adam",
                        .shown_default = "all of the rank's cores; with --dpu on the cpu device half of them, the rest compute",
                        .given = &z->threads_given, .min = 1, .max = 1024};
    return 5;
}

// The delayed update's own flags need --dpu; the threaded one keeps a
// second gradient shard, which its closed form counts.
static void configure(Trainer *t, const GPTConfig *model) {
    const Stage *z = t->sctx;
    if (!z->dpu && (z->warmup_given || z->dpu_serial))
        fail_usage("--%s tunes the delayed update: add --dpu", z->dpu_serial ? "dpu-serial" : "dpu-warmup");
    if (z->dpu && !z->dpu_serial) t->formula = STAGE_OFFLOAD_DPU;
}

// The cores: on the cpu device the delayed update's host thread and the
// compute threads share them, so --dpu splits the rank's threads; on a GPU
// the host has them all.
static void split_threads(Trainer *t, Stage *z) {
    int cores = t->dev.threads;
    int sharing = z->dpu && t->dev.kind == DEVICE_CPU;
    if (!z->threads_given) z->host_threads = sharing ? (cores + 1) / 2 : cores;
    if (sharing && cores > 1) {
        int compute = cores - z->host_threads > 0 ? cores - z->host_threads : 1;
        t->dev.threads = compute;
        omp_set_num_threads(compute);
    }
}

// Settings that run but do not do what they say: one note each (rank 0).
static void note_settings(const Trainer *t, const Stage *z) {
    if (t->world.rank != 0) return;
    if (z->dpu && t->cfg.steps <= z->dpu_warmup)
        printf("note: --dpu with --steps %d <= --dpu-warmup %d: every step is a warm-up step, so no update is "
               "delayed; give more steps or a smaller --dpu-warmup\n", t->cfg.steps, z->dpu_warmup);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (z->threads_given && cores > 0 && z->host_threads > cores)
        printf("note: --host-threads %d is more than the %ld cores of this machine: the host optimizer's threads "
               "take turns on them, which slows it (leave the flag out for one per core)\n", z->host_threads, cores);
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    note_settings(t, z);
    split_threads(t, z);
    grad_shard_init(&z->grads, t, z->bucket_mb);
    host_grads_init(&z->host_grads, &z->grads, t);
    z->params_out = buf_alloc(&t->dev, TIER_PINNED, CAT_COMM, t->part.shard * sizeof(bf16), "updated bf16 shard");
    if (z->dpu && !z->dpu_serial) {
        z->grads_next = buf_alloc(&t->dev, TIER_PINNED, CAT_GRADS, t->part.shard * sizeof(bf16),
                                  "second gradient shard (--dpu)");
        dev_memset0(&t->dev, z->grads_next.ptr, z->grads_next.bytes, STREAM_COPY);
        host_worker_init(&z->worker);
    }
    t->dev.ops->event_create(&t->dev, &z->uploaded);
    dev_sync(&t->dev, STREAM_COPY);
}

// On the device only zero2's buckets: the other buffers are pinned host memory.
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return zero_bucket_bytes(z->bucket_mb, p);
}

// The micro-batch step: zero2's. The buckets' reduced parts go down to the
// host shard as they arrive (host_grads.c), while backward goes on.
static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    GPT *g = &t->model;
    const bf16 *embed = replicated_unit_params(t, GPT_UNIT_EMBED);  // the head reads wte too (tied)
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) gpt_unit_forward(g, u, 0, replicated_unit_params(t, u), embed);
        gpt_slot_loss_queue(g, 0);
        if (!mb->backward) continue;
        t->micro = i;
        for (int u = g->L.num_units - 1; u >= 0; u--) {
            grad_shard_progress(&z->grads, t);  // MPI moves the buckets in flight only inside its calls
            const float *grads = gpt_unit_backward(g, u, 0, replicated_unit_params(t, u), embed);
            grad_shard_add_unit(&z->grads, t, u, grads);  // a bucket that fills up leaves now
        }
        grad_shard_flush(&z->grads, t);
    }
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

// ---- the update on the host, and the new shard up ----

static AdamJob adam_job(Trainer *t, Stage *z, const bf16 *grads, const AdamWStep *s) {
    return (AdamJob){.master = t->st.master.ptr, .m = t->st.m.ptr, .v = t->st.v.ptr, .grads = grads,
                     .params_out = z->params_out.ptr, .n = t->part.shard, .step = *s,
                     .path = cpu_adam_best_path(), .threads = z->host_threads};
}

// The new bf16 shard goes up into this rank's slice of the device params on
// the copy stream; the compute stream waits for it, then all ranks gather.
static void upload_params(Trainer *t, Stage *z) {
    size_t bytes = t->part.shard * sizeof(bf16);
    dev_copy(&t->dev, own_param_slice(t), z->params_out.ptr, bytes, STREAM_COPY);
    t->dev.ops->event_record(&t->dev, &z->uploaded, STREAM_COPY);
    t->dev.ops->stream_wait_event(&t->dev, STREAM_COMPUTE, &z->uploaded);
    count_transfer(t, XFER_H2D, (double)bytes);
    all_gather_params(t);
    z->upload_due = 0;
}

// The job started at the last step (--dpu): wait for it and put it on the
// host optimizer's row of the timeline.
static void collect_job(Trainer *t, Stage *z) {
    if (!z->pending) return;
    double t0, t1;
    host_worker_wait(&z->worker, &t0, &t1);
    trace_span(&t->trace, TRACE_TID_HOST, "cpu adam (delayed)", t0, t1, 0);
    z->pending = 0;
    z->upload_due = 1;
}

// The CPU Adam on this thread, now.
static void run_adam_here(Trainer *t, Stage *z, const AdamWStep *s) {
    z->job = adam_job(t, z, t->st.grads.ptr, s);
    double t0 = now_us();
    run_adam(&z->job);
    trace_span(&t->trace, TRACE_TID_HOST, "cpu adam", t0, now_us(), 0);
}

// LAB 05: delayed_update -- the CPU Adam of step i runs during step i+1
// The delayed update of step i (t->step), threaded: step i-1's update has run
// on the host thread during this step; collect it (collect_job) and send its
// params up (upload_params, when z->upload_due), for step i+1. Then start
// step i's update on the host thread (host_worker_start with run_adam on
// z->job, made by adam_job from these gradients, t->st.grads) and swap the
// two gradient shards (t->st.grads and z->grads_next) so step i+1's arrive
// in the other one while this one is read. Mark it pending (z->pending).
// Master, m and v stay exact; the device's params lag one step. The result
// must equal --dpu-serial's to the bit.
static void delayed_update(Trainer *t, Stage *z, const AdamWStep *s) {
    collect_job(t, z);
    if (z->upload_due) upload_params(t, z);  // returns with the copy done: params_out is free
    z->job = adam_job(t, z, t->st.grads.ptr, s);
    Buf applied = t->st.grads;
    t->st.grads = z->grads_next;
    z->grads_next = applied;
    z->pending = 1;
    host_worker_start(&z->worker, run_adam, &z->job);
}
// LAB END

static void update(Trainer *t, const AdamWStep *s) {
    Stage *z = t->sctx;
    dev_sync(&t->dev, STREAM_COPY);  // the whole gradient shard is on the host
    if (!z->dpu || t->step < z->dpu_warmup) {
        run_adam_here(t, z, s);
        upload_params(t, z);
    } else if (z->dpu_serial) {
        // the reference of the delayed update: apply now, show one step later
        if (z->upload_due) upload_params(t, z);
        run_adam_here(t, z, s);
        z->upload_due = 1;
    } else {
        delayed_update(t, z, s);
    }
}

static void finish_update(Trainer *t, int to_device) {
    Stage *z = t->sctx;
    collect_job(t, z);
    if (to_device && z->upload_due) upload_params(t, z);
}

static void params_from_master(Trainer *t) {
    Stage *z = t->sctx;
    kernels_cpu.f32_to_half(&t->dev, z->params_out.ptr, t->st.master.ptr, t->part.shard);
    upload_params(t, z);
}

// ---- checkpoints: under --dpu the device's params lag the master by a step ----

static Buf *ckpt_params(Trainer *t, Stage *z) {
    if (!z->ckpt_params.ptr)
        z->ckpt_params = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, t->part.shard * sizeof(bf16),
                                   "checkpoint staging");
    return &z->ckpt_params;
}

// Master, m and v as every stage saves them, and under --dpu the device's
// own shard of the params, a step behind them.
static void ckpt_out(Trainer *t, CkptStates *c) {
    Stage *z = t->sctx;
    trainer_ckpt_out(t, c);
    if (!z->dpu) return;
    Buf *b = ckpt_params(t, z);
    dev_sync(&t->dev, STREAM_COMPUTE);
    dev_copy(&t->dev, b->ptr, own_param_slice(t), b->bytes, STREAM_COPY);
    dev_sync(&t->dev, STREAM_COPY);
    ckpt_states_add(c, "device_params", b->ptr, b->bytes, t->part.begin, sizeof(bf16));
}

// Resume: the device gets the params it had (bf16 of the master a step
// back); params_out holds bf16 of the master, due to go up after the next
// step, exactly where the uninterrupted run stood once its save had waited
// for the update in flight.
static void ckpt_in(Trainer *t, CkptStates *c, int loaded) {
    Stage *z = t->sctx;
    if (!loaded) {
        if (z->dpu)
            ckpt_states_add(c, "device_params", ckpt_params(t, z)->ptr, ckpt_params(t, z)->bytes, t->part.begin,
                            sizeof(bf16));
        return;
    }
    trainer_ckpt_in(t, c, 1);  // master, m, v; params_out = bf16(master), up on the device
    if (!z->dpu) return;
    dev_copy(&t->dev, own_param_slice(t), z->ckpt_params.ptr, z->ckpt_params.bytes, STREAM_COPY);
    dev_sync(&t->dev, STREAM_COPY);
    all_gather_params(t);
    z->upload_due = t->step > z->dpu_warmup;
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    if (z->dpu && !z->dpu_serial) {
        collect_job(t, z);
        host_worker_free(&z->worker);
        buf_free(&t->dev, &z->grads_next);
    }
    grad_shard_free(&z->grads, t);
    host_grads_free(&z->host_grads, t);
    buf_free(&t->dev, &z->params_out);
    buf_free(&t->dev, &z->ckpt_params);
    t->dev.ops->event_destroy(&t->dev, &z->uploaded);
}

const Strategy strategy_cpu_offload = {
    .name = "cpu_offload",
    .summary = "ZeRO-Offload on top of ZeRO-2: fp32 master, m, v and the gradient shard in pinned host\n"
               "memory, updated by a SIMD CPU Adam; bf16 params on the device. --dpu delays the update by\n"
               "one step so the CPU Adam runs while the device computes the next step.",
    .formula = STAGE_OFFLOAD,
    .configure = configure,
    // the optimizer states and the gradient shard leave the device for pinned host memory
    .states = {.params = STATE_FULL, .grads = STATE_SHARD, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_PINNED, .optim_tier = TIER_PINNED},
    .context_bytes = sizeof(Stage),
    .flags = flags,
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
