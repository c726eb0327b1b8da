// cpu_offload_ops.c: what stage 05 needs around its technique: its flags
// and their refusals, the rank's threads, checkpoints of the device's
// lagging params under --dpu, and its report rows (see cpu_offload.h).
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <unistd.h>
#include "shard_update.h"
#include "check.h"
#include "cpu_offload.h"

// ---- flags and threads ----

int cpu_offload_flags(void *ctx, FlagSpec *out) {
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
                        .shown_default = "all of the rank's cores; on the cpu device half of them, the rest compute",
                        .given = &z->threads_given, .min = 1, .max = 1024};
    return 5;
}

// The delayed update's own flags need --dpu; the threaded one keeps a
// second gradient shard, which its closed form counts.
Placement cpu_offload_configure(const Trainer *t, TrainConfig *cfg, const GPTConfig *model, Placement p) {
    const Stage *z = t->sctx;
    if (!z->dpu && (z->warmup_given || z->dpu_serial))
        fail_usage("--%s tunes the delayed update: add --dpu", z->dpu_serial ? "dpu-serial" : "dpu-warmup");
    if (z->dpu && !z->dpu_serial) p.formula = STAGE_OFFLOAD_DPU;
    return p;
}

// The cores: on the cpu device the CPU Adam's host thread (the pipelined
// update's, or the delayed one's) and the compute threads share them, so the
// rank's threads are split; on a GPU the host has them all.
void cpu_offload_split_threads(Trainer *t, Stage *z) {
    int cores = t->dev.threads;
    int sharing = t->dev.kind == DEVICE_CPU;
    if (!z->threads_given) z->host_threads = sharing ? (cores + 1) / 2 : cores;
    if (sharing && cores > 1) {
        int compute = cores - z->host_threads > 0 ? cores - z->host_threads : 1;
        t->dev.threads = compute;
        omp_set_num_threads(compute);
    }
}

void cpu_offload_note_settings(const Trainer *t, const Stage *z) {
    if (t->world.rank != 0) return;
    if (z->dpu && t->cfg.steps <= z->dpu_warmup)
        printf("note: --dpu with --steps %d <= --dpu-warmup %d: every step is a warm-up step, so no update is "
               "delayed; give more steps or a smaller --dpu-warmup\n", t->cfg.steps, z->dpu_warmup);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (z->threads_given && cores > 0 && z->host_threads > cores)
        printf("note: --host-threads %d is more than the %ld cores of this machine: the host optimizer's threads "
               "take turns on them, which slows it (leave the flag out for one per core)\n", z->host_threads, cores);
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
void cpu_offload_ckpt_out(Trainer *t, CkptStates *c) {
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
// back); the newest shard holds bf16 of the master, due to go up after the
// next step, exactly where the uninterrupted run stood once its save had
// waited for the update in flight.
void cpu_offload_ckpt_in(Trainer *t, CkptStates *c, int loaded) {
    Stage *z = t->sctx;
    if (!loaded) {
        if (z->dpu)
            ckpt_states_add(c, "device_params", ckpt_params(t, z)->ptr, ckpt_params(t, z)->bytes, t->part.begin,
                            sizeof(bf16));
        return;
    }
    trainer_ckpt_in(t, c, 1);  // master, m, v; the newest shard = bf16(master), up on the device
    if (!z->dpu) return;
    dev_copy(&t->dev, own_param_slice(t), z->ckpt_params.ptr, z->ckpt_params.bytes, STREAM_COPY);
    dev_sync(&t->dev, STREAM_COPY);
    all_gather_params(t);
    z->upload_due = t->step > z->dpu_warmup;
}

// ---- report ----

// How many sub-groups per step the CPU Adam took up during backward, before
// the last bucket left (the others: with it, or after the norm). Counted on
// the last rank, whose shard holds the last units: their gradients come first.
void cpu_offload_report(Trainer *t, FILE *json) {
    Stage *z = t->sctx;
    long mine[2] = {z->steps_eager, z->handed_early}, last[2] = {0, 0};
    int me = t->world.rank, N = t->world.size, groups = 0;
    for (int u = 0; u < t->layout.num_units; u++) groups += z->group_count[u] > 0;
    if (me == N - 1 && me != 0) mpiCheck(MPI_Send(mine, 2, MPI_LONG, 0, 0, t->world.mpi));
    if (me == N - 1 && me != 0) mpiCheck(MPI_Send(&groups, 1, MPI_INT, 0, 1, t->world.mpi));
    if (me != 0) return;
    if (N > 1) mpiCheck(MPI_Recv(last, 2, MPI_LONG, N - 1, 0, t->world.mpi, MPI_STATUS_IGNORE));
    if (N > 1) mpiCheck(MPI_Recv(&groups, 1, MPI_INT, N - 1, 1, t->world.mpi, MPI_STATUS_IGNORE));
    else last[0] = mine[0], last[1] = mine[1];
    if (!last[0]) return;
    double per_step = (double)last[1] / (double)last[0];
    if (!t->cfg.quiet)
        printf("cpu adam             %10.2f of %d sub-groups per step (the last rank) began during backward, "
               "before the last bucket left\n", per_step, groups);
    if (json)
        fprintf(json, ",\"cpu_adam_subgroups\":{\"steps\":%ld,\"before_last_bucket\":%ld,\"per_step\":%d}",
                last[0], last[1], groups);
}
