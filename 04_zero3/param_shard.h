// param_shard.h: ZeRO-3 parameter partitioning. Each rank keeps only its
// shard of the bf16 params; a unit's params are all-gathered into a live
// buffer just before the unit computes, with the next units' gathers
// prefetched while it does, and released as soon as no upcoming unit reads
// them. The order of use is the model's: forward over units 0..L+1, then
// backward from L+1 down to 0 (gpt_unit_reads says which units each reads).
#pragma once
#include "trainer.h"

typedef enum { LIVE_NONE = 0, LIVE_GATHERING, LIVE_READY } LiveState;
// The pass a unit is computed in: its forward, or its backward (gathered again).
enum { PASS_FORWARD = 0, PASS_BACKWARD = 1 };

typedef struct LiveUnit {
    LiveState state;
    Buf buf;       // the unit's bf16 params, whole
    CommHandle h;
    // what the count of gathers sees (param_shard_view): gathered since the
    // last drop, the model's clock (units computed) when first seen so and
    // whether it was waited for by then, and whether an entry has read it since
    int seen, seen_ready, used;
    long seen_at;
    Comm *group;   // the group gathering it: NULL for the world; hpZ's (zeropp.c)
    Buf packed;    // qwZ: every rank's slice in int8 with its scales, as gathered (zeropp.c)
    int backward;  // gathered for a backward entry
} LiveUnit;

struct ZeroPP;

// Where this rank's slice of a unit comes from when the unit is gathered:
// `count` elements of flat index `first` onwards (all in this rank's shard),
// to be written to `dst` (device memory) in order on the compute stream.
// NULL: copied from the device shard t->st.params (zero3); infinity brings
// it from pinned host memory or from NVMe.
typedef void (*ParamSliceSource)(Trainer *t, int u, bf16 *dst, size_t first, size_t count, void *arg);

typedef struct ParamShard {
    LiveUnit *live;  // [num_units]
    int prefetch;    // entries of the schedule gathered ahead
    int training;    // the pass under way (param_shard_begin): a training step's; 0: an evaluation's, forward only
    ParamSliceSource source;  // set after param_shard_init; NULL for the device shard
    void *source_arg;
    const Trainer *t;         // whose model's clock (units computed) the count reads
    // training's all-gathers, those started before the entry that reads them, and of those the ones
    // waited for before that entry too (nothing left to overlap)
    long gathers, gathers_ahead, waited_early;
    struct ZeroPP *pp;        // zero3's ZeRO++ (zeropp.h), which gathers the units; NULL: the gathers below
} ParamShard;

// The --prefetch flag (default 1).
FlagSpec param_shard_flag(int *prefetch);
// A bad prefetch depth exits 2.
void param_shard_init(ParamShard *ps, Trainer *t, int prefetch);
void param_shard_free(ParamShard *ps, Trainer *t);
// The pass the stage's micro-batch step runs, told before its first unit:
// a training step's schedule is every forward then every backward, an
// evaluation's ends after forward (nothing is gathered for a backward).
void param_shard_begin(ParamShard *ps, const MicroBatches *mb);
// Before unit u computes (backward = 0 or 1): its params (and those it
// reads) are gathered and complete; the next `prefetch` units' gathers start.
void param_shard_acquire(ParamShard *ps, Trainer *t, int u, int backward);
// After unit u computed: release what the next units do not read.
void param_shard_release(ParamShard *ps, Trainer *t, int u, int backward);
// Drop every live unit (the params are about to change).
void param_shard_release_all(ParamShard *ps, Trainer *t);
// The step of a stage that gathers (zero3's, infinity's) for the formula's
// timeline: each unit gathered whole (2 B a parameter) by the windows of
// --prefetch, and zero2's two buckets beside them.
void param_shard_step_shape(int prefetch, double bucket_mb, const Trainer *t, StepMemorySpec *s);
// Unit u's gathered params, for the entry about to compute. Counts the
// gathers as it goes: every unit newly gathered since the last use, and
// whether the unit read now was gathered while an earlier entry computed.
const bf16 *param_shard_view(ParamShard *ps, int u);
// The gathers against their formulas (zero_gathers_per_micro_batch and
// _ahead at this prefetch depth): a line, and "gathers" in the --json record.
void param_shard_report(const ParamShard *ps, const Trainer *t, FILE *json);
// zero3's gather of unit u: this rank's slice into a fresh live buffer, then
// the bf16 all-gather over the world (ZeRO++ calls it where its switches
// leave a gather as it was).
void param_shard_gather_world(ParamShard *ps, Trainer *t, int u);
// The units that the schedule entry `ahead` entries after unit u's forward
// (backward = 0) or backward reads, in out[]; returns how many (0 past the
// end of the micro-batch). A stage that brings slices from further away
// starts them this way, before their gathers.
int param_shard_upcoming(const ParamShard *ps, const Trainer *t, int u, int backward, int ahead, int out[2]);
