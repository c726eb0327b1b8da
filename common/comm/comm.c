// comm.c: the facade of the collectives (see comm.h; the world and its groups:
// comm_world.c; the collectives themselves: comm_ops.c): handles, byte
// accounting, staging and completion. Every call is counted twice: the payload handed in, and the
// bytes a bandwidth-optimal ring moves per rank (Patarasuk & Yuan; the ZeRO
// paper's accounting), so a report can set measured time beside the formula.
// Then it goes to a backend (comm_backend.h): NCCL where the group runs on it
// and the buffers are device memory, else MPI, with device buffers staged
// through pinned host memory (an MPI that is not CUDA-aware).
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "comm_facade.h"

size_t dtype_bytes(DType t) {
    switch (t) {
    case DT_HALF: return 2;
    case DT_F32: return 4;
    case DT_F64: return 8;
    case DT_I32: return 4;
    case DT_U8: return 1;
    }
    fail_at(__FILE__, __LINE__, "dtype_bytes: unknown dtype %d", (int)t);
}

const char *comm_op_name(CommOp op) {
    static const char *const names[OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                "send",       "recv",           "all_to_all"};
    return (op >= 0 && op < OP_COUNT) ? names[op] : "unknown_op";
}

// MPI counts are int; ours are size_t. One past SIZE_MAX/2 is no buffer
// that exists but a negative number wrapped around: a subtraction that went
// below zero (a slice's start taken from the wrong end), said as such.
// `which` names the value ("count", "displacement"), rank its rank (-1: the
// call's own count).
int as_int(size_t n, const char *op, int rank, const char *which) {
    if (n <= INT_MAX) return (int)n;
    char part[64] = "";
    if (rank >= 0) snprintf(part, sizeof part, "rank %d's ", rank);
    CHECK((ptrdiff_t)n >= 0, "%s: %s%s is %td, negative (a size_t subtraction that went below zero); hint: a count "
          "is how many elements a rank's part holds and a displacement where that part starts inside the buffer, "
          "both from 0 up", op, part, which, (ptrdiff_t)n);
    CHECK(n <= INT_MAX, "%s: %s%s of %zu elements does not fit MPI's int count; hint: split the buffer into chunks "
          "below 2^31 elements (smaller buckets)", op, part, which, n);
    return (int)n;
}

// Bytes per rank a ring moves, as a fraction of the payload on N ranks.
static double ring_factor(CommOp op, int n) {
    switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;  // reduce-scatter + all-gather
    case OP_REDUCE_SCATTER:
    case OP_ALL_GATHER:
    case OP_BROADCAST: return (double)(n - 1) / n;  // broadcast as scatter + all-gather, counted as one pass
    default: return 1.0;                            // send, recv, all-to-all (their own bytes)
    }
}

int other_host(const Comm *c, int peer) { return c->host_of && c->host_of[peer] != c->host_of[c->rank]; }

// ---- staging of device buffers --------------------------------------------

// The MPI path assumes an MPI that is not CUDA-aware: on the cuda device the
// call works on a pinned host copy. The stage gets `in_bytes` of `in` at
// `in_offset`; on completion its first `back_bytes` go to `back`. The data
// must be ready in compute-stream order (we copy and sync on that stream).
// Stages are pinned (CAT_COMM) and come from the group's pool when one fits.
int needs_staging(const Comm *c) { return c->dev && (c->dev->kind == DEVICE_CUDA || c->stage_always); }

static Buf take_stage(Comm *c, size_t bytes) {
    int best = -1;
    for (int i = 0; i < COMM_STAGE_POOL; i++) {
        size_t have = c->stage_pool[i].bytes;
        if (c->stage_pool[i].ptr && have >= bytes && (best < 0 || have < c->stage_pool[best].bytes)) best = i;
    }
    if (best < 0) return buf_alloc(c->dev, TIER_PINNED, CAT_COMM, bytes, "MPI staging buffer");
    Buf b = c->stage_pool[best];
    c->stage_pool[best] = (Buf){0};
    return b;
}

// Back to the pool, in place of a free slot or of a smaller stage.
static void return_stage(Comm *c, Buf *b) {
    int slot = 0;
    for (int i = 1; i < COMM_STAGE_POOL; i++)
        if (c->stage_pool[i].bytes < c->stage_pool[slot].bytes) slot = i;
    if (c->stage_pool[slot].bytes < b->bytes) {
        buf_free(c->dev, &c->stage_pool[slot]);
        c->stage_pool[slot] = *b;
        *b = (Buf){0};
    } else {
        buf_free(c->dev, b);
    }
}

char *stage_buffers(Comm *c, CommHandle *k, size_t stage_bytes, const void *in,
                           size_t in_offset, size_t in_bytes, void *back, size_t back_bytes) {
    k->stage = take_stage(c, stage_bytes);
    if (in_bytes) dev_copy(c->dev, (char *)k->stage.ptr + in_offset, in, in_bytes, STREAM_COMPUTE);
    dev_sync(c->dev, STREAM_COMPUTE);  // MPI reads the stage from the host
    k->dst = back;
    k->dst_bytes = back_bytes;
    return k->stage.ptr;
}

// A finished call's stage: its result back to the device buffer (for an
// all-gather only the ranks' parts, so gaps between them stay untouched).
static void unstage(Comm *c, CommHandle *k) {
    if (k->gather_elem_bytes) {
        size_t es = k->gather_elem_bytes;
        const int *counts = k->mpi_counts, *displs = k->mpi_counts + c->size;
        for (int r = 0; r < c->size; r++)
            dev_copy(c->dev, (char *)k->dst + displs[r] * es, (char *)k->stage.ptr + displs[r] * es, counts[r] * es,
                     STREAM_COMPUTE);
    } else if (k->dst_bytes) {
        dev_copy(c->dev, k->dst, k->stage.ptr, k->dst_bytes, STREAM_COMPUTE);
    }
    dev_sync(c->dev, STREAM_COMPUTE);  // the copies read the stage the next call may take
    return_stage(c, &k->stage);
}

// ---- issue and completion -------------------------------------------------

// The handle a call works with: the caller's, or a local one when blocking.
// `moved`: the bytes this rank moves, `cross` those of them that leave its host.
CommHandle *begin_op_moving(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload, double moved,
                                   double cross) {
    CHECK(c->mpi != MPI_COMM_NULL, "%s on a group this rank is not part of", comm_op_name(op));
    CHECK(!h || !h->active, "%s: the handle is still in flight; hint: comm_wait it before reuse",
          comm_op_name(op));
    CommHandle *k = h ? h : local;
    memset(k, 0, sizeof *k);
    k->req = MPI_REQUEST_NULL;
    k->active = 1;
    k->op = op;
    k->bytes = (double)payload;
    k->t_issue_us = now_us();
    c->stats.calls[op]++;
    c->stats.payload_bytes[op] += (double)payload;
    c->stats.ring_bytes[op] += moved;
    c->stats.cross_host_bytes[op] += cross;
    return k;
}

// A collective's ring: each of its `size` links carries the same bytes, and
// host_links of them join two hosts.
CommHandle *begin_op(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload) {
    double moved = (double)payload * ring_factor(op, c->size);
    return begin_op_moving(c, h, local, op, payload, moved, moved * c->host_links / c->size);
}

// A send or a receive: its bytes cross hosts when the peer is on another.
CommHandle *begin_p2p(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload, int peer) {
    return begin_op_moving(c, h, local, op, payload, (double)payload, other_host(c, peer) ? (double)payload : 0);
}

// After MPI is done with the buffers: copy a staged result back, free what
// the call held, account the time and add the span to the timeline. A call
// that completes on the GPU (NCCL, nonblocking) is timed by comm_settle_stats.
// Returns the completion time. A communicator of one rank moves nothing:
// its calls are local copies, and stay off the comm and wait rows (a 1-rank
// run reports no time in flight for 0 bytes).
static double complete_op(Comm *c, CommHandle *k, int host_timed) {
    if (k->stage.ptr) unstage(c, k);
    free(k->mpi_counts);
    k->mpi_counts = NULL;
    double t_done_us = now_us();
    if (host_timed && c->size > 1)
        trace_span(c->trace, TRACE_TID_COMM, comm_op_name(k->op), k->t_issue_us, t_done_us, k->bytes);
    k->active = 0;
    return t_done_us;
}

static void wait_span(Comm *c, double t0_us, double t1_us) {
    if (c->size > 1) trace_span(c->trace, TRACE_TID_WAIT, "wait", t0_us, t1_us, 0);
}

// A blocking call is exposed communication from issue to return.
void finish_blocking(Comm *c, CommHandle *k) {
    double t_done_us = complete_op(c, k, 1);
    wait_span(c, k->t_issue_us, t_done_us);
}

#ifdef WB_HAVE_NCCL
// A blocking call on NCCL: the compute and copy streams wait for it on the
// GPU, the host goes on; its exposed time is read off CUDA events
// (comm_settle_stats), as for a nonblocking call that is waited at once.
void finish_on_gpu(Comm *c, CommHandle *k) {
    comm_nccl_wait(c, k);
    complete_op(c, k, 0);
}
#endif

void comm_after_event(Comm *c, Event *e) {
#ifdef WB_HAVE_NCCL
    if (c->backend == COMM_NCCL && c->nccl) {
        comm_nccl_after_event(c, e);
        return;
    }
#endif
    if (c->dev) c->dev->ops->stream_wait_event(c->dev, STREAM_COMPUTE, e);
}

void comm_wait(Comm *c, CommHandle *h) {
    if (!h || !h->active) return;
#ifdef WB_HAVE_NCCL
    if (h->event) {  // the GPU waits; the host goes on
        comm_nccl_wait(c, h);
        complete_op(c, h, 0);
        return;
    }
#endif
    double t0_us = now_us();
    mpi_wait(h);
    wait_span(c, t0_us, complete_op(c, h, 1));
}

void comm_settle_stats(Comm *c) {
#ifdef WB_HAVE_NCCL
    comm_nccl_settle(c);
#else
    (void)c;
#endif
}

int comm_test(Comm *c, CommHandle *h) {
    if (!h || !h->active) return 1;
    int done = 0;
#ifdef WB_HAVE_NCCL
    if (h->event) {
        done = comm_nccl_test(c, h);
        if (done) complete_op(c, h, 0);
        return done;
    }
#endif
    done = mpi_test(h);
    if (done) complete_op(c, h, 1);
    return done;
}

void comm_progress(Comm *c) { mpi_progress(c); }

void comm_stats_reset(Comm *c) { memset(&c->stats, 0, sizeof c->stats); }

double comm_ring_bytes(const Comm *c) {
    double sum = 0;
    for (int op = 0; op < OP_COUNT; op++) sum += c->stats.ring_bytes[op];
    return sum;
}

double comm_cross_host_bytes(const Comm *c) {
    double sum = 0;
    for (int op = 0; op < OP_COUNT; op++) sum += c->stats.cross_host_bytes[op];
    return sum;
}
