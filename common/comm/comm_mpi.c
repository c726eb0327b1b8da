// comm_mpi.c: the MPI backend (see comm_backend.h): the calls on host
// buffers that the facade (comm.c) hands over, counted and staged already,
// the 16-bit sums as user-defined MPI_Ops, and the small host-side
// reductions of comm.h.
#include <stdlib.h>
#include "bf16.h"
#include "check.h"
#include "comm_backend.h"
#include "half_rows.h"

// 16-bit values travel as raw words; their sum is the user-defined op below
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

// ---- the 16-bit sums ------------------------------------------------------------

// Each pair is added in fp32 and rounded back (round to nearest even), as a
// bf16 or fp16 all-reduce on a GPU does. An fp16 sum past 65504 is infinite:
// the loss scaler sees the overflow.
static void half_sum(HalfFormat fmt, const bf16 *a, bf16 *b, int len) {
    enum { BLOCK = 1024 };  // through the row conversions: F16C where the CPU has it
    HalfRowsPath path = half_rows_best_path();
    float x[BLOCK], y[BLOCK];
    for (int i = 0; i < len; i += BLOCK) {
        int k = len - i < BLOCK ? len - i : BLOCK;
        half_to_f32_row(path, fmt, x, a + i, (size_t)k);
        half_to_f32_row(path, fmt, y, b + i, (size_t)k);
        for (int j = 0; j < k; j++) y[j] = x[j] + y[j];
        f32_to_half_row(path, fmt, b + i, y, (size_t)k);
    }
}
static void bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    half_sum(HALF_BF16, in, inout, *len);
}
static void fp16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    half_sum(HALF_FP16, in, inout, *len);
}

void mpi_half_sum_ops_create(MPI_Op ops[2]) {
    mpiCheck(MPI_Op_create(bf16_sum_op, 1, &ops[HALF_BF16]));  // 1: commutative
    mpiCheck(MPI_Op_create(fp16_sum_op, 1, &ops[HALF_FP16]));
}

// ---- the calls ----------------------------------------------------------------------

void mpi_all_reduce(Comm *c, void *buf, int count, DType t, int max, CommHandle *k, int blocking) {
    MPI_Op op = max ? MPI_MAX : sum_op(c, t);
    if (blocking) mpiCheck(MPI_Allreduce(MPI_IN_PLACE, buf, count, mpi_type(t), op, c->mpi));
    else mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, buf, count, mpi_type(t), op, c->mpi, &k->req));
}

void mpi_reduce_scatter(Comm *c, const void *send, void *recv, const int *counts, DType t, CommHandle *k,
                        int blocking) {
    // One schedule for every reduce-scatter: a blocking call runs the
    // nonblocking algorithm and waits. Open MPI picks different algorithms
    // for MPI_Reduce_scatter and MPI_Ireduce_scatter, and bf16 sums taken in
    // another order round differently; this way ZeRO-1's one reduce-scatter
    // adds the ranks' contributions in the order ZeRO-2's buckets do.
    mpiCheck(MPI_Ireduce_scatter(send, recv, counts, mpi_type(t), sum_op(c, t), c->mpi, &k->req));
    if (blocking) mpiCheck(MPI_Wait(&k->req, MPI_STATUS_IGNORE));
}

void mpi_all_gather(Comm *c, void *buf, const int *counts_displs, DType t, CommHandle *k, int blocking) {
    const int *counts = counts_displs, *displs = counts_displs + c->size;
    if (blocking)
        mpiCheck(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, mpi_type(t), c->mpi));
    else
        mpiCheck(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, mpi_type(t), c->mpi,
                                 &k->req));
}

void mpi_broadcast(Comm *c, void *buf, int count, DType t, int root, CommHandle *k, int blocking) {
    if (blocking) mpiCheck(MPI_Bcast(buf, count, mpi_type(t), root, c->mpi));
    else mpiCheck(MPI_Ibcast(buf, count, mpi_type(t), root, c->mpi, &k->req));
}

void mpi_all_to_all(Comm *c, const void *send, void *recv, const int *ints, DType t, CommHandle *k, int blocking) {
    int n = c->size;
    MPI_Datatype mt = mpi_type(t);
    if (blocking)
        mpiCheck(MPI_Alltoallv(send, ints, ints + n, mt, recv, ints + 2 * n, ints + 3 * n, mt, c->mpi));
    else
        mpiCheck(MPI_Ialltoallv(send, ints, ints + n, mt, recv, ints + 2 * n, ints + 3 * n, mt, c->mpi, &k->req));
}

void mpi_send(Comm *c, const void *buf, int count, DType t, int peer, int tag, CommHandle *k, int blocking) {
    if (blocking) mpiCheck(MPI_Send(buf, count, mpi_type(t), peer, tag, c->mpi));
    else mpiCheck(MPI_Isend(buf, count, mpi_type(t), peer, tag, c->mpi, &k->req));
}

void mpi_recv(Comm *c, void *buf, int count, DType t, int peer, int tag, CommHandle *k, int blocking) {
    if (blocking) mpiCheck(MPI_Recv(buf, count, mpi_type(t), peer, tag, c->mpi, MPI_STATUS_IGNORE));
    else mpiCheck(MPI_Irecv(buf, count, mpi_type(t), peer, tag, c->mpi, &k->req));
}

void mpi_wait(CommHandle *k) { mpiCheck(MPI_Wait(&k->req, MPI_STATUS_IGNORE)); }

int mpi_test(CommHandle *k) {
    int done = 0;
    mpiCheck(MPI_Test(&k->req, &done, MPI_STATUS_IGNORE));
    return done;
}

// Open MPI moves nonblocking collectives forward only while some MPI call is
// inside its progress engine. MPI_Iprobe is about the cheapest call that
// enters it; it matches nothing we rely on and receives nothing.
void mpi_progress(Comm *c) {
    if (c->mpi == MPI_COMM_NULL) return;
    int flag = 0;
    mpiCheck(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c->mpi, &flag, MPI_STATUS_IGNORE));
}

// ---- host-side values (comm.h) ---------------------------------------------------
// Host bookkeeping (losses, norms, memory maxima): a few doubles, left out of
// the statistics so that they show only the training's communication.

void comm_barrier(Comm *c) { mpiCheck(MPI_Barrier(c->mpi)); }

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

int comm_first_failure(const Comm *c, int failed, char *msg, int msg_bytes) {
    int mine = failed ? c->rank : c->size, first = c->size;
    mpiCheck(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->mpi));
    if (first == c->size) return -1;
    msg[msg_bytes - 1] = 0;
    mpiCheck(MPI_Bcast(msg, msg_bytes, MPI_CHAR, first, c->mpi));
    return first;
}
