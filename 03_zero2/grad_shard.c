// grad_shard.c: bucketed, asynchronous reduce-scatter of gradients into
// per-rank shards (see grad_shard.h).
#include "grad_shard.h"
#include <string.h>
#include "check.h"
#include "kernels.h"

FlagSpec grad_shard_flag(double *bucket_mb) {
    *bucket_mb = 0;  // the default below
    return (FlagSpec){.name = "bucket-mb", .type = FLAG_DOUBLE, .dst = bucket_mb, .meta = "MB",
                      .help = "gradient bucket size for the asynchronous reduce-scatter",
                      .shown_default = "an eighth of the bf16 gradients, at most 25 MB",
                      .min = 0, .max = 1e6};
}

void grad_shard_init(GradShard *gs, Trainer *t, double bucket_mb) {
    memset(gs, 0, sizeof *gs);
    // elements per bucket (mem_math.h): by default an eighth of the gradients,
    // so the two buckets stay a quarter of what ZeRO-1 keeps, and at most
    // 25 MB, so large models still send several buckets while backward runs
    size_t cap = zero_bucket_elems(bucket_mb, &t->part);
    gs->cap = cap;
    size_t recv_cap = zero_bucket_recv_elems(cap, &t->part);
    for (int i = 0; i < 2; i++) {
        gs->bucket[i].send = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, cap * sizeof(bf16), "gradient bucket");
        gs->bucket[i].recv = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, recv_cap * sizeof(bf16), "reduced bucket part");
        t->dev.ops->event_create(&t->dev, &gs->bucket[i].drained);
    }
}

void grad_shard_free(GradShard *gs, Trainer *t) {
    for (int i = 0; i < 2; i++) {
        comm_wait(t->dp, &gs->bucket[i].h);
        buf_free(&t->dev, &gs->bucket[i].send);
        buf_free(&t->dev, &gs->bucket[i].recv);
        t->dev.ops->event_destroy(&t->dev, &gs->bucket[i].drained);
    }
}

// Element x of the bucket's range lives at send[cap - (top - x)].
static bf16 *bucket_at(const GradShard *gs, const Bucket *b, size_t x) {
    return (bf16 *)b->send.ptr + (gs->cap - (b->top - x));
}

// LAB 03: buckets -- launch a full bucket's reduce-scatter; finish it into the shard
// Wait for a bucket's reduce-scatter (b->h) and add its part (b->recv,
// b->recv_count elements of flat index b->recv_first) to the shard
// (grads_add_half with the bucket's turn: the first micro-batch of a step
// writes, later ones accumulate, in 16 bits or in the fp32 accumulator). With a sink (cpu_offload) the part goes to
// the sink instead, and the bucket's `drained` event is recorded on the copy stream after it.
static void finish_bucket(GradShard *gs, Trainer *t, Bucket *b) {
    if (!b->h.active) return;
    if (gs->reduce.wait) gs->reduce.wait(t, b, gs->reduce.arg);  // a stage's own reduction (zero3's qgZ)
    else comm_wait(t->dp, &b->h);
    if (b->recv_count == 0) return;
    if (gs->sink) {
        gs->sink(t, b->recv_first, b->recv.ptr, b->recv_count, b->turn, gs->sink_arg);
        t->dev.ops->event_record(&t->dev, &b->drained, STREAM_COPY);
        return;
    }
    grads_add_half(t, t->dev.k, b->recv_first - t->part.begin, b->recv.ptr, b->recv_count, b->turn);
}

// Reduce-scatter the filled range [lo, top) asynchronously (a handle, b->h):
// rank q receives the elements that fall in its shard (partition_overlap),
// possibly none. The ranges are contiguous and in rank order, which is
// exactly the layout MPI_Reduce_scatter's receive counts describe. Note
// where this rank's part starts (b->recv_first) and how long it is
// (b->recv_count); with a sink, the streams wait for `drained` before `recv`
// is written again. Then the bucket is empty (lo = top = 0). A stage that
// brings its own reduction (gs->reduce: zero3's qgZ) starts that instead,
// and finish_bucket waits for it with its own wait.
static void launch_bucket(GradShard *gs, Trainer *t, Bucket *b) {
    if (b->lo == b->top) return;
    int N = t->dp->size;
    size_t counts[N];
    Range r = {b->lo, b->top - b->lo};
    for (int q = 0; q < N; q++) {
        size_t first;
        counts[q] = partition_overlap(&t->part, r, q, &first);
        if (q == t->dp->rank) b->recv_first = first;
    }
    b->recv_count = counts[t->dp->rank];
    if (gs->sink) {  // the sink's copy of the last part out of `recv` comes first
        t->dev.ops->stream_wait_event(&t->dev, STREAM_COMPUTE, &b->drained);
        t->dev.ops->stream_wait_event(&t->dev, STREAM_COMM, &b->drained);
    }
    if (gs->reduce.launch)
        gs->reduce.launch(t, b, bucket_at(gs, b, b->lo), counts, gs->reduce.arg);
    else
        comm_reduce_scatter_sum(t->dp, bucket_at(gs, b, b->lo), b->recv.ptr, counts, DT_HALF, &b->h);
    b->lo = b->top = 0;
}
// LAB END

// Send the current bucket and switch to the other one, first finishing what
// that one still had in flight. in_backward: units still have backward to
// run, which the reduce-scatter can overlap if it is left in flight.
static void swap_buckets(GradShard *gs, Trainer *t, int in_backward) {
    Bucket *b = &gs->bucket[gs->cur];
    launch_bucket(gs, t, b);
    gs->launched++;
    gs->in_flight_in_backward += in_backward && b->h.active;
    gs->cur ^= 1;
    finish_bucket(gs, t, &gs->bucket[gs->cur]);
}

void grad_shard_add_unit(GradShard *gs, Trainer *t, int u, const float *g, GradTurn turn) {
    Range r = unit_range(t, u);
    size_t hi = r.offset + r.count;  // fill downwards: [x_lo, hi) at a time
    while (hi > r.offset) {
        Bucket *b = &gs->bucket[gs->cur];
        if (b->lo == b->top) b->lo = b->top = hi;  // empty: start at this unit's end
        b->turn = turn;  // a bucket holds one micro-batch's gradients (grad_shard_flush after each)
        CHECK(b->lo == hi, "units must finish backward in reverse buffer order (bucket at %zu, unit ends at %zu)", b->lo, hi);
        size_t room = gs->cap - (b->top - b->lo);
        if (room == 0) {
            swap_buckets(gs, t, 1);
            continue;
        }
        size_t take = hi - r.offset < room ? hi - r.offset : room;
        size_t x_lo = hi - take;
        t->dev.k->grad_to_bf16(&t->dev, bucket_at(gs, b, x_lo), g + (x_lo - r.offset), take, 0);
        b->lo = x_lo;
        hi = x_lo;
    }
}

void grad_shard_flush(GradShard *gs, Trainer *t) {
    swap_buckets(gs, t, 0);
    finish_bucket(gs, t, &gs->bucket[gs->cur ^ 1]);
    gs->micro_batches++;
}

void grad_shard_report(const GradShard *gs, Trainer *t, FILE *json) {
    if (t->world.rank != 0 || !gs->micro_batches) return;
    long B = (long)((t->part.num_params + gs->cap - 1) / gs->cap), m = gs->micro_batches;
    if (!t->cfg.quiet)
        printf("buckets per micro-batch: %.2f launched, %.2f of them left in flight during backward "
               "(formula: B = ceil(Ψ/cap) = %ld, all but the last: %ld)\n",
               (double)gs->launched / m, (double)gs->in_flight_in_backward / m, B, B - 1);
    if (json)
        fprintf(json, ",\"buckets\":{\"micro_batches\":%ld,\"launched\":%ld,\"in_flight_in_backward\":%ld,"
                      "\"per_micro_batch_formula\":%ld}", m, gs->launched, gs->in_flight_in_backward, B);
}

void grad_shard_progress(GradShard *gs, Trainer *t) {
    for (int i = 0; i < 2; i++)
        if (gs->bucket[i].h.active) comm_progress(t->dp);
}
