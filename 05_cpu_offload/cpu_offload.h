// cpu_offload.h: what the files of stage 05 share: the stage's context
// (cpu_offload.c is the technique; cpu_offload_ops.c its flags, threads,
// checkpoints and report rows).
#pragma once
#include "grad_shard.h"
#include "adam_queue.h"
#include "host_grads.h"
#include "host_worker.h"
#include "param_refresh.h"
#include "trainer.h"

#define DPU_WARMUP_DEFAULT 40  // the paper's: the first steps change the params fastest

// One optimizer step of the CPU Adam over this rank's whole shard (--dpu).
typedef struct AdamJob {
    float *master, *m, *v;
    const bf16 *grads;  // the gradient shard this step applies
    bf16 *params_out;   // the new bf16 shard, on its way up
    size_t n;
    AdamWStep step;
    CpuAdamPath path;
    int threads;
} AdamJob;

struct Stage;
typedef struct GroupHandover {
    struct Stage *z;
    int k;
} GroupHandover;

typedef struct Stage {
    double bucket_mb;                 // --bucket-mb
    int dpu, dpu_warmup, dpu_serial;  // --dpu, --dpu-warmup, --dpu-serial
    int host_threads;                 // --host-threads
    int warmup_given, threads_given;
    GradShard grads;                  // zero2's buckets, delivering to the host
    HostGrads host_grads;             // ... into the pinned gradient shard
    // pinned: the updated bf16 shard on its way up; with --dpu two, the next
    // CPU Adam writing one (fill) while the other (newest) goes up
    Buf params_out[2];
    int fill, newest;
    ParamRefresh refresh;             // the newest shard up and gathered, unit by unit, in the next forward
    // sub-group k: this rank's slice of unit k (shard-relative; the last one
    // runs on through the shard's padding); grad_need of its elements are
    // real parameters, whose gradients arrive
    size_t *group_first, *group_count, *grad_need;
    // the pipelined update (no --dpu): the CPU Adam's host thread
    AdamQueue adam;
    int eager;                        // this step's sub-groups start as their gradients arrive
    AdamWStep eager_step;             // ... with the step's hyper-parameters, known before backward
    size_t *grad_in;                  // [units]: gradient elements arrived this step
    unsigned char *handed;            // [units]: given to the CPU Adam this step
    GroupHandover *handover;          // [units]: the host functions' arguments
    int flushing;                     // the last bucket is leaving: what it completes is no longer early
    long steps_eager, handed_early;   // for the report: steps, and sub-groups taken up before the last bucket
    // --dpu: the whole shard's CPU Adam of step i on a host thread during step i+1
    Buf grads_next;                   // the shard the next step fills while t->st.grads is applied
    Buf ckpt_params;                  // host: the lagging device shard, for a checkpoint
    AdamJob job;                      // the update in flight
    HostWorker worker;
    int pending;                      // a job was started and not collected
    int upload_due;                   // params_out[newest] is newer than the device's params
} Stage;

// cpu_offload_ops.c
int cpu_offload_flags(void *ctx, FlagSpec *out);
// Strategy.configure: the delayed update's flags need --dpu.
Placement cpu_offload_configure(const Trainer *t, TrainConfig *cfg, const GPTConfig *model, Placement p);
// The rank's threads between the CPU Adam and, on the cpu device, the compute.
void cpu_offload_split_threads(Trainer *t, Stage *z);
// Rank 0: one note per setting that runs but does not do what it says.
void cpu_offload_note_settings(const Trainer *t, const Stage *z);
// Checkpoints (Strategy.ckpt_out, ckpt_in): under --dpu also the device's lagging params.
void cpu_offload_ckpt_out(Trainer *t, CkptStates *c);
void cpu_offload_ckpt_in(Trainer *t, CkptStates *c, int loaded);
// Strategy.report: the sub-groups that started during backward.
void cpu_offload_report(Trainer *t, FILE *json);
