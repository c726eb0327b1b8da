// grad_shard.h: ZeRO-2 gradient partitioning with buckets. Backward finishes
// units from the end of the flat buffer towards its start, so their gradients
// fill a bucket downwards as one contiguous range. A full bucket is
// reduce-scattered asynchronously (rank q receives the part that falls in its
// shard, possibly nothing) while backward goes on with earlier units in the
// other bucket; the received part is added to the rank's gradient shard. No
// rank ever holds the whole gradient: only the shard (2Ψ/N) and two buckets.
#pragma once
#include "trainer.h"

typedef struct Bucket {
    Buf send;          // bf16, capacity `cap` elements, filled from its end
    Buf recv;          // bf16, this rank's part of the reduced bucket
    size_t lo, top;    // flat range [lo, top) held; empty when lo == top
    size_t recv_first, recv_count;  // where the received part goes (flat)
    GradTurn turn;     // the micro-batch whose gradients it holds: first of its step, last
    CommHandle h;
    Event drained;     // recorded after the sink read `recv`: the next reduce-scatter into it waits
} Bucket;

// Where a bucket's reduced part goes once it has arrived: `count` elements
// of flat index `first` onwards (all in this rank's shard), written for the
// first micro-batch of a step and added for the others (`turn`). NULL: into
// the rank's gradient shard on the device, t->st.grads (zero2, zero3);
// cpu_offload copies them to the host instead.
typedef void (*GradSink)(Trainer *t, size_t first, const bf16 *part, size_t count, GradTurn turn, void *arg);

// How a launched bucket is reduced where a stage brings its own reduction
// (zero3's qgZ, 04_zero3/zeropp.c): launch starts it (send: the bucket's
// elements, counts[q] of them rank q's part, in rank order) and leaves b->h
// in flight; wait completes it and leaves this rank's part in b->recv, as
// the reduce-scatter does. Unset: the reduce-scatter over the data-parallel
// group.
typedef struct BucketReduce {
    void (*launch)(Trainer *t, Bucket *b, const bf16 *send, const size_t *counts, void *arg);
    void (*wait)(Trainer *t, Bucket *b, void *arg);
    void *arg;
} BucketReduce;

typedef struct GradShard {
    Bucket bucket[2];
    int cur;           // the bucket being filled
    size_t cap;        // elements per bucket
    GradSink sink;     // set after grad_shard_init; NULL for the device shard
    void *sink_arg;
    BucketReduce reduce;  // set after grad_shard_init; zeroed for the reduce-scatter
    // counted for the report: buckets launched; of them, those left in flight
    // while backward still had units to run; micro-batches flushed
    long launched, in_flight_in_backward, micro_batches;
} GradShard;

// The --bucket-mb flag of the stages that bucket their gradients (its
// default, 0, picks the size in grad_shard_init).
FlagSpec grad_shard_flag(double *bucket_mb);
// Allocates two buckets of bucket_mb (0: the default; capped at the padded
// model size); the flag's range keeps bucket_mb in [0, 1e6]. Their device
// bytes are zero_bucket_bytes (mem_math.h).
void grad_shard_init(GradShard *gs, Trainer *t, double bucket_mb);
void grad_shard_free(GradShard *gs, Trainer *t);
// Unit u's fp32 gradients for this micro-batch are complete: bucket them,
// launching reduce-scatters as buckets fill; the received parts land in the
// rank's gradient shard, t->st.grads, written or added by the micro-batch's
// turn (micro_turn).
void grad_shard_add_unit(GradShard *gs, Trainer *t, int u, const float *g, GradTurn turn);
// End of a micro-batch's backward: send the last bucket and wait for all, so
// the shard holds the sum over ranks (and over micro-batches so far).
void grad_shard_flush(GradShard *gs, Trainer *t);
// The buckets' overlap with backward, measured beside the formula: per
// micro-batch B = ceil(Ψ / cap) buckets leave, all but the last (sent by the
// flush) while backward runs. Rank 0 prints it and writes "buckets" to json.
void grad_shard_report(const GradShard *gs, Trainer *t, FILE *json);
// Let MPI move the buckets in flight (the step calls it before each unit's backward).
void grad_shard_progress(GradShard *gs, Trainer *t);
