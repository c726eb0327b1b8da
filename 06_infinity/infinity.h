// infinity.h: what the files of stage 06 share: the stage's context
// (infinity.c is the technique; infinity_ops.c its flags, refusals, I/O
// error agreement, byte accounting and checkpoints).
#pragma once
#include "grad_shard.h"
#include "param_shard.h"
#include "host_grads.h"
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
typedef enum { OPTIM_CPU, OPTIM_NVME } OptimAt;

typedef struct Stage {
    const char *nvme_path, *offload_params;  // --nvme-path, --offload-params
    const char *offload_optimizer;           // --offload-optimizer
    double sub_group_mb, bucket_mb;          // --sub-group-mb, --bucket-mb
    int aio_block_kb, aio_queue_depth;       // --aio-block-kb, --aio-queue-depth
    int prefetch;                            // --prefetch
    ParamsAt params_at;
    OptimAt optim_at;
    int on_nvme;              // some state lives in files on NVMe (then the folder, aio and the swapper's reads)
    GradShard grads;          // zero2's buckets...
    HostGrads host_grads;     // ... delivering to the pinned gradient shard
    ParamShard params;        // zero3's gathers
    ParamFetch fetch;         // ... fed from pinned memory or NVMe (params off the device)
    Aio aio;                  // master, m, v
    Aio params_aio;           // the params on NVMe: reads the compute waits for never queue behind the states
    NvmeFiles files;
    Swapper swap;             // master, m, v through pinned slots
    Event uploaded[SWAP_SLOTS];  // params on the device: a slot's new bf16 sub-group is up
    long update_passes, reads_waited, reads_asked_ahead;  // the updates' passes, for the report
} Stage;

// infinity_ops.c
// Stage-only flags (Strategy.flags), with their defaults.
int infinity_flags(void *ctx, FlagSpec *out);
// Refuses flags that cannot work, one line (exit 2); sets z->params_at,
// z->optim_at and z->on_nvme. With nothing on NVMe a --nvme-path or aio
// flag of the command line is refused; one from a DeepSpeed config (s) is
// ignored, and its key says so.
void infinity_check_flags(Stage *z, Settings *s);
// Rank 0: one line of what lives where (files, sub-groups, aio).
void infinity_say_where(Trainer *t, Stage *z);
// Collective: a read or write that failed on any rank (rc != 0 here) stops
// every rank here, with one line; the swap files go first.
void infinity_stop_on_io_error(Trainer *t, Stage *z, int rc);
// The swapper's reads and writes since the last call counted for this step
// (count) or dropped (set-up, checkpoints: not a step's traffic).
void infinity_take_nvme_bytes(Trainer *t, Stage *z, int count);
// Strategy.report: the update's reads asked for ahead of their use, beside
// the formula: every sub-group of every pass (rank 0 prints; json "swap_reads").
void infinity_report(Trainer *t, FILE *json);
// Checkpoints (Strategy.ckpt_out, ckpt_in): master, m and v between the
// files and the checkpoint's host copies; a resume then rebuilds the params.
void infinity_ckpt_out(Trainer *t, CkptStates *c);
void infinity_ckpt_in(Trainer *t, CkptStates *c, int loaded);
// infinity.c: bf16(master) into the params' tier, through the swapper.
void infinity_params_from_master(Trainer *t);
