// comm_mpi.c: the collectives over MPI (see comm.h; the world and its groups: comm_world.c).
// Every call is counted twice: the payload handed in, and the bytes a
// bandwidth-optimal ring moves per rank (Patarasuk & Yuan; the ZeRO paper's
// accounting), so a report can set measured time beside the formula.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bf16.h"
#include "check.h"
#include "comm.h"
#include "comm_nccl.h"

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

// 16-bit values travel as raw words; the sum is the user-defined op of comm_world.c
static MPI_Datatype mpi_type(DType t) {
    switch (t) {
    case DT_HALF: return MPI_UINT16_T;
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_I32: return MPI_INT;
    case DT_U8: return MPI_UINT8_T;
    }
    fail_at(__FILE__, __LINE__, "mpi_type: unknown dtype %d", (int)t);
}

// The 16-bit sum in the format of the device's params and grads (--precision)
static MPI_Op sum_op(const Comm *c, DType t) {
    if (t != DT_HALF) return MPI_SUM;
    return c->dev && c->dev->half == HALF_FP16 ? c->half_sum[HALF_FP16] : c->half_sum[HALF_BF16];
}

// MPI counts are int; ours are size_t
static int as_int(size_t n, const char *what) {
    CHECK(n <= INT_MAX, "%s: %zu elements do not fit MPI's int count; hint: split the buffer "
          "into chunks below 2^31 elements (smaller buckets)", what, n);
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

static int other_host(const Comm *c, int peer) { return c->host_of && c->host_of[peer] != c->host_of[c->rank]; }

// ---- staging of device buffers --------------------------------------------

// The MPI path assumes an MPI that is not CUDA-aware: on the cuda device the
// call works on a pinned host copy. The stage gets `in_bytes` of `in` at
// `in_offset`; on completion its first `back_bytes` go to `back`. The data
// must be ready in compute-stream order (we copy and sync on that stream).
// Stages are pinned (CAT_COMM) and come from the group's pool when one fits.
static int needs_staging(const Comm *c) { return c->dev && (c->dev->kind == DEVICE_CUDA || c->stage_always); }

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

static char *stage_buffers(Comm *c, CommHandle *k, size_t stage_bytes, const void *in,
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
static CommHandle *begin_op_moving(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload, double moved,
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
static CommHandle *begin_op(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload) {
    double moved = (double)payload * ring_factor(op, c->size);
    return begin_op_moving(c, h, local, op, payload, moved, moved * c->host_links / c->size);
}

// A send or a receive: its bytes cross hosts when the peer is on another.
static CommHandle *begin_p2p(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload, int peer) {
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
static void finish_blocking(Comm *c, CommHandle *k) {
    double t_done_us = complete_op(c, k, 1);
    wait_span(c, k->t_issue_us, t_done_us);
}

#ifdef WB_HAVE_NCCL
// A blocking call on NCCL: the compute and copy streams wait for it on the
// GPU, the host goes on; its exposed time is read off CUDA events
// (comm_settle_stats), as for a nonblocking call that is waited at once.
static void finish_on_gpu(Comm *c, CommHandle *k) {
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
    mpiCheck(MPI_Wait(&h->req, MPI_STATUS_IGNORE));
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
    mpiCheck(MPI_Test(&h->req, &done, MPI_STATUS_IGNORE));
    if (done) complete_op(c, h, 1);
    return done;
}

// Open MPI moves nonblocking collectives forward only while some MPI call is
// inside its progress engine. MPI_Iprobe is about the cheapest call that
// enters it; it matches nothing we rely on and receives nothing.
void comm_progress(Comm *c) {
    if (c->mpi == MPI_COMM_NULL) return;
    int flag = 0;
    mpiCheck(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->mpi, &flag, MPI_STATUS_IGNORE));
}

// ---- collectives ------------------------------------------------------------

// In-place all-reduce with the sum or the maximum (max != 0).
static void all_reduce(Comm *c, void *buf, size_t count, DType t, int max, CommHandle *h) {
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "all-reduce");
    CommHandle local, *k = begin_op(c, h, &local, OP_ALL_REDUCE, bytes);
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {
        if (max) comm_nccl_all_reduce_max(c, buf, count, t, k);
        else comm_nccl_all_reduce_sum(c, buf, count, t, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    void *p = needs_staging(c) ? stage_buffers(c, k, bytes, buf, 0, bytes, buf, bytes) : buf;
    MPI_Op op = max ? MPI_MAX : sum_op(c, t);
    if (h) {
        mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, p, n, mpi_type(t), op, c->mpi, &k->req));
    } else {
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, p, n, mpi_type(t), op, c->mpi));
        finish_blocking(c, k);
    }
}

void comm_all_reduce_sum(Comm *c, void *buf, size_t count, DType t, CommHandle *h) {
    all_reduce(c, buf, count, t, 0, h);
}

void comm_all_reduce_max(Comm *c, void *buf, size_t count, DType t, CommHandle *h) {
    // bf16 travels as raw 16-bit words, whose integer order is not the order of the values
    CHECK(t == DT_F32 || t == DT_F64 || t == DT_I32, "all-reduce max of %s: only f32, f64 and i32; hint: "
          "convert 16-bit values to f32 first", t == DT_HALF ? "16-bit" : "u8");
    all_reduce(c, buf, count, t, 1, h);
}

void comm_reduce_scatter_sum(Comm *c, const void *send, void *recv, const size_t *recvcounts,
                             DType t, CommHandle *h) {
    size_t es = dtype_bytes(t), total = 0;
    int *counts = xmalloc((size_t)c->size * sizeof *counts);
    for (int r = 0; r < c->size; r++) {
        counts[r] = as_int(recvcounts[r], "reduce-scatter");
        total += recvcounts[r];
    }
    as_int(total, "reduce-scatter (all parts)");
    size_t send_bytes = total * es, recv_bytes = recvcounts[c->rank] * es;
    CommHandle local, *k = begin_op(c, h, &local, OP_REDUCE_SCATTER, send_bytes);
    k->mpi_counts = counts;
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, send, recvcounts[c->rank] ? recv : NULL)) {
        comm_nccl_reduce_scatter_sum(c, send, recv, recvcounts, t, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    const void *s = send;
    void *r = recv;
    if (needs_staging(c)) {  // stage layout: [recv part | send buffer]
        char *st = stage_buffers(c, k, recv_bytes + send_bytes, send, recv_bytes, send_bytes, recv,
                                 recv_bytes);
        r = st;
        s = st + recv_bytes;
    }
    // One schedule for every reduce-scatter: a blocking call runs the
    // nonblocking algorithm and waits. Open MPI picks different algorithms
    // for MPI_Reduce_scatter and MPI_Ireduce_scatter, and bf16 sums taken in
    // another order round differently; this way ZeRO-1's one reduce-scatter
    // adds the ranks' contributions in the order ZeRO-2's buckets do.
    mpiCheck(MPI_Ireduce_scatter(s, r, counts, mpi_type(t), sum_op(c, t), c->mpi, &k->req));
    if (!h) {
        mpiCheck(MPI_Wait(&k->req, MPI_STATUS_IGNORE));
        finish_blocking(c, k);
    }
}

void comm_all_gather(Comm *c, void *buf, const size_t *counts, const size_t *displs, DType t,
                     CommHandle *h) {
    size_t es = dtype_bytes(t), total = 0, extent = 0;
    int *ints = xmalloc(2 * (size_t)c->size * sizeof *ints);  // counts, then displacements
    for (int r = 0; r < c->size; r++) {
        ints[r] = as_int(counts[r], "all-gather");
        ints[c->size + r] = as_int(displs[r], "all-gather (displacement)");
        total += counts[r];
        if (displs[r] + counts[r] > extent) extent = displs[r] + counts[r];
    }
    CommHandle local, *k = begin_op(c, h, &local, OP_ALL_GATHER, total * es);
    k->mpi_counts = ints;
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {
        comm_nccl_all_gather(c, buf, counts, displs, t, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    void *p = buf;
    if (needs_staging(c)) {  // only this rank's part goes in; every rank's part comes back
        size_t own_offset = displs[c->rank] * es;
        p = stage_buffers(c, k, extent * es, (char *)buf + own_offset, own_offset,
                          counts[c->rank] * es, buf, extent * es);
        k->gather_elem_bytes = es;
    }
    if (h) {
        mpiCheck(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, ints, ints + c->size,
                                 mpi_type(t), c->mpi, &k->req));
    } else {
        mpiCheck(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, ints, ints + c->size,
                                mpi_type(t), c->mpi));
        finish_blocking(c, k);
    }
}

void comm_broadcast(Comm *c, void *buf, size_t count, DType t, int root, CommHandle *h) {
    CHECK(root >= 0 && root < c->size, "broadcast: root %d is not a rank of a group of %d", root,
          c->size);
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "broadcast");
    CommHandle local, *k = begin_op(c, h, &local, OP_BROADCAST, bytes);
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {
        comm_nccl_broadcast(c, buf, count, t, root, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    void *p = buf;
    if (needs_staging(c)) {
        int is_root = c->rank == root;
        p = stage_buffers(c, k, bytes, buf, 0, is_root ? bytes : 0, buf, is_root ? 0 : bytes);
    }
    if (h) {
        mpiCheck(MPI_Ibcast(p, n, mpi_type(t), root, c->mpi, &k->req));
    } else {
        mpiCheck(MPI_Bcast(p, n, mpi_type(t), root, c->mpi));
        finish_blocking(c, k);
    }
}

void comm_all_to_all(Comm *c, const void *send, const size_t *sendcounts, void *recv, const size_t *recvcounts,
                     DType t, CommHandle *h) {
    size_t es = dtype_bytes(t), send_total = 0, recv_total = 0;
    double moved = 0, cross = 0;
    int n = c->size;
    // sendcounts, senddispls, recvcounts, recvdispls: MPI reads them until the call completes
    int *ints = xmalloc(4 * (size_t)n * sizeof *ints);
    for (int q = 0; q < n; q++) {
        ints[q] = as_int(sendcounts[q], "all-to-all (send)");
        ints[n + q] = as_int(send_total, "all-to-all (send displacement)");
        ints[2 * n + q] = as_int(recvcounts[q], "all-to-all (receive)");
        ints[3 * n + q] = as_int(recv_total, "all-to-all (receive displacement)");
        send_total += sendcounts[q];
        recv_total += recvcounts[q];
        double bytes = (double)(sendcounts[q] * es);
        if (q != c->rank) moved += bytes;
        if (other_host(c, q)) cross += bytes;
    }
    size_t send_bytes = send_total * es, recv_bytes = recv_total * es;
    CommHandle local, *k = begin_op_moving(c, h, &local, OP_ALL_TO_ALL, send_bytes, moved, cross);
    k->mpi_counts = ints;
#ifdef WB_HAVE_NCCL
    // every rank decides alike: by the buffers given, whatever its counts (a rank may receive nothing)
    if (comm_nccl_owns(c, send ? send : recv, send && recv ? recv : NULL)) {
        comm_nccl_all_to_all(c, send, sendcounts, recv, recvcounts, t, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    const void *s = send;
    void *r = recv;
    if (needs_staging(c)) {  // stage layout: [recv parts | send parts]
        char *st = stage_buffers(c, k, recv_bytes + send_bytes, send, recv_bytes, send_bytes, recv, recv_bytes);
        r = st;
        s = st + recv_bytes;
    }
    MPI_Datatype mt = mpi_type(t);
    if (h) {
        mpiCheck(MPI_Ialltoallv(s, ints, ints + n, mt, r, ints + 2 * n, ints + 3 * n, mt, c->mpi, &k->req));
    } else {
        mpiCheck(MPI_Alltoallv(s, ints, ints + n, mt, r, ints + 2 * n, ints + 3 * n, mt, c->mpi));
        finish_blocking(c, k);
    }
}

void comm_send(Comm *c, const void *buf, size_t count, DType t, int peer, int tag, CommHandle *h) {
    CHECK(peer >= 0 && peer < c->size, "send: peer %d is not a rank of a group of %d", peer, c->size);
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "send");
    CommHandle local, *k = begin_p2p(c, h, &local, OP_SEND, bytes, peer);
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {  // NCCL has no tags: pairs match in issue order
        comm_nccl_send(c, buf, count, t, peer, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    const void *p = needs_staging(c) ? stage_buffers(c, k, bytes, buf, 0, bytes, NULL, 0) : buf;
    if (h) {
        mpiCheck(MPI_Isend(p, n, mpi_type(t), peer, tag, c->mpi, &k->req));
    } else {
        mpiCheck(MPI_Send(p, n, mpi_type(t), peer, tag, c->mpi));
        finish_blocking(c, k);
    }
}

void comm_recv(Comm *c, void *buf, size_t count, DType t, int peer, int tag, CommHandle *h) {
    CHECK(peer >= 0 && peer < c->size, "recv: peer %d is not a rank of a group of %d", peer, c->size);
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "recv");
    CommHandle local, *k = begin_p2p(c, h, &local, OP_RECV, bytes, peer);
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {
        comm_nccl_recv(c, buf, count, t, peer, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    void *p = needs_staging(c) ? stage_buffers(c, k, bytes, NULL, 0, 0, buf, bytes) : buf;
    if (h) {
        mpiCheck(MPI_Irecv(p, n, mpi_type(t), peer, tag, c->mpi, &k->req));
    } else {
        mpiCheck(MPI_Recv(p, n, mpi_type(t), peer, tag, c->mpi, MPI_STATUS_IGNORE));
        finish_blocking(c, k);
    }
}

void comm_send_recv(Comm *c, const void *send, int send_tag, void *recv, int recv_tag, size_t count, DType t,
                    int peer, CommHandle *hs, CommHandle *hr) {
    CHECK(!hs == !hr, "send_recv: give both handles (nonblocking) or neither (blocking)");
    CommHandle local_s = {0}, local_r = {0}, *ks = hs ? hs : &local_s, *kr = hr ? hr : &local_r;
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, send, recv)) {
        CHECK(peer >= 0 && peer < c->size, "send_recv: peer %d is not a rank of a group of %d", peer, c->size);
        size_t bytes = count * dtype_bytes(t);
        ks = begin_p2p(c, hs, &local_s, OP_SEND, bytes, peer);
        kr = begin_p2p(c, hr, &local_r, OP_RECV, bytes, peer);
        comm_nccl_send_recv(c, send, recv, count, t, peer, ks, kr);
        if (!hs) {
            finish_on_gpu(c, ks);
            finish_on_gpu(c, kr);
        }
        return;
    }
#endif
    // MPI: both nonblocking, so neither waits for the other to be posted
    comm_recv(c, recv, count, t, peer, recv_tag, kr);
    comm_send(c, send, count, t, peer, send_tag, ks);
    if (!hs) {
        comm_wait(c, kr);
        comm_wait(c, ks);
    }
}

void comm_barrier(Comm *c) { mpiCheck(MPI_Barrier(c->mpi)); }

// Host bookkeeping (losses, norms, memory maxima): a few doubles, left out of
// the statistics so that they show only the training's communication.
double comm_sum_f64(Comm *c, double x) {
    double sum = 0;
    mpiCheck(MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, c->mpi));
    return sum;
}

double comm_max_f64(Comm *c, double x) {
    double max = 0;
    mpiCheck(MPI_Allreduce(&x, &max, 1, MPI_DOUBLE, MPI_MAX, c->mpi));
    return max;
}

int comm_first_failure(Comm *c, int failed, char *msg, int msg_bytes) {
    int mine = failed ? c->rank : c->size, first = c->size;
    mpiCheck(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->mpi));
    if (first == c->size) return -1;
    msg[msg_bytes - 1] = 0;
    mpiCheck(MPI_Bcast(msg, msg_bytes, MPI_CHAR, first, c->mpi));
    return first;
}

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
