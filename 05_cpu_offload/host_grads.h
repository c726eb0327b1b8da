// host_grads.h: the gradient path of the offload stages (ZeRO-Offload, Ren
// et al., 2021): zero2's buckets deliver each reduced part straight to the
// rank's gradient shard in pinned host memory, beside the CPU Adam that reads
// it. cpu_offload and infinity link it.
#pragma once
#include "grad_shard.h"

// Told after each reduced part is on its way (queued on the copy stream, or
// added on the host): flat elements [first, first + count).
typedef void (*GradsArrived)(Trainer *t, size_t first, size_t count, void *arg);

typedef struct HostGrads {
    Buf accum;  // pinned: a reduced part to add (micro-batches after the first)
    GradsArrived arrived;  // NULL, or what the stage does as parts arrive (cpu_offload: start the CPU Adam)
    void *arrived_arg;
} HostGrads;

// Points the buckets' sink at the host shard t->st.grads (pinned).
void host_grads_init(HostGrads *hg, GradShard *gs, Trainer *t);
void host_grads_free(HostGrads *hg, Trainer *t);
// Squared global gradient norm from the host shards: waits for the copies
// down, sums on the host (the cpu kernel sums in fixed blocks, the same bits
// on any thread count), then over ranks.
double host_grads_norm_sq(Trainer *t);
