// param_shard.h: ZeRO-3 parameter partitioning. Each rank keeps only its
// shard of the bf16 params; a unit's params are all-gathered into a live
// buffer just before the unit computes, with the next units' gathers
// prefetched while it does, and released as soon as no upcoming unit reads
// them. The order of use is the model's: forward over units 0..L+1, then
// backward from L+1 down to 0 (gpt_unit_reads says which units each reads).
#pragma once
#include "trainer.h"

typedef enum { LIVE_NONE = 0, LIVE_GATHERING, LIVE_READY } LiveState;

typedef struct LiveUnit {
    LiveState state;
    Buf buf;       // the unit's bf16 params, whole
    CommHandle h;
} LiveUnit;

typedef struct ParamShard {
    LiveUnit *live;  // [num_units]
    int prefetch;    // entries of the schedule gathered ahead
} ParamShard;

// The --prefetch flag (default 1).
FlagSpec param_shard_flag(int *prefetch);
// A bad prefetch depth exits 2.
void param_shard_init(ParamShard *ps, Trainer *t, int prefetch);
void param_shard_free(ParamShard *ps, Trainer *t);
// Before unit u computes (backward = 0 or 1): its params (and those it
// reads) are gathered and complete; the next `prefetch` units' gathers start.
void param_shard_acquire(ParamShard *ps, Trainer *t, int u, int backward);
// After unit u computed: release what the next units do not read.
void param_shard_release(ParamShard *ps, Trainer *t, int u, int backward);
// The most bytes of gathered units live at once, at this prefetch depth.
double param_shard_peak_bytes(const GPTLayout *l, int prefetch);
// Drop every live unit (the params are about to change).
void param_shard_release_all(ParamShard *ps, Trainer *t);
const bf16 *param_shard_view(const ParamShard *ps, int u);
