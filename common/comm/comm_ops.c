// comm_ops.c: the collectives of comm.h, each counted and handed to its
// backend by the facade's machinery (comm_facade.h): NCCL where the group
// runs on it and the buffers are device memory, else MPI, device buffers
// staged through pinned host memory.
#include <stdlib.h>
#include "check.h"
#include "comm_facade.h"

// ---- collectives ------------------------------------------------------------

// In-place all-reduce with the sum or the maximum (max != 0).
static void all_reduce(Comm *c, void *buf, size_t count, DType t, int max, CommHandle *h) {
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "all-reduce", -1, "count");
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
    mpi_all_reduce(c, p, n, t, max, k, !h);
    if (!h) finish_blocking(c, k);
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
        counts[r] = as_int(recvcounts[r], "reduce-scatter", r, "count");
        total += recvcounts[r];
    }
    as_int(total, "reduce-scatter", -1, "count of all parts");
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
    mpi_reduce_scatter(c, s, r, counts, t, k, !h);
    if (!h) finish_blocking(c, k);
}

void comm_all_gather(Comm *c, void *buf, const size_t *counts, const size_t *displs, DType t,
                     CommHandle *h) {
    size_t es = dtype_bytes(t), total = 0, extent = 0;
    int *ints = xmalloc(2 * (size_t)c->size * sizeof *ints);  // counts, then displacements
    for (int r = 0; r < c->size; r++) {
        ints[r] = as_int(counts[r], "all-gather", r, "count");
        ints[c->size + r] = as_int(displs[r], "all-gather", r, "displacement");
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
    mpi_all_gather(c, p, ints, t, k, !h);
    if (!h) finish_blocking(c, k);
}

void comm_broadcast(Comm *c, void *buf, size_t count, DType t, int root, CommHandle *h) {
    CHECK(root >= 0 && root < c->size, "broadcast: root %d is not a rank of a group of %d", root,
          c->size);
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "broadcast", -1, "count");
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
    mpi_broadcast(c, p, n, t, root, k, !h);
    if (!h) finish_blocking(c, k);
}

void comm_all_to_all(Comm *c, const void *send, const size_t *sendcounts, void *recv, const size_t *recvcounts,
                     DType t, CommHandle *h) {
    size_t es = dtype_bytes(t), send_total = 0, recv_total = 0;
    double moved = 0, cross = 0;
    int n = c->size;
    // sendcounts, senddispls, recvcounts, recvdispls: MPI reads them until the call completes
    int *ints = xmalloc(4 * (size_t)n * sizeof *ints);
    for (int q = 0; q < n; q++) {
        ints[q] = as_int(sendcounts[q], "all-to-all", q, "send count");
        ints[n + q] = as_int(send_total, "all-to-all", q, "send displacement");
        ints[2 * n + q] = as_int(recvcounts[q], "all-to-all", q, "receive count");
        ints[3 * n + q] = as_int(recv_total, "all-to-all", q, "receive displacement");
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
    mpi_all_to_all(c, s, r, ints, t, k, !h);
    if (!h) finish_blocking(c, k);
}

void comm_send(Comm *c, const void *buf, size_t count, DType t, int peer, int tag, CommHandle *h) {
    CHECK(peer >= 0 && peer < c->size, "send: peer %d is not a rank of a group of %d", peer, c->size);
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "send", -1, "count");
    CommHandle local, *k = begin_p2p(c, h, &local, OP_SEND, bytes, peer);
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {  // NCCL has no tags: pairs match in issue order
        comm_nccl_send(c, buf, count, t, peer, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    const void *p = needs_staging(c) ? stage_buffers(c, k, bytes, buf, 0, bytes, NULL, 0) : buf;
    mpi_send(c, p, n, t, peer, tag, k, !h);
    if (!h) finish_blocking(c, k);
}

void comm_recv(Comm *c, void *buf, size_t count, DType t, int peer, int tag, CommHandle *h) {
    CHECK(peer >= 0 && peer < c->size, "recv: peer %d is not a rank of a group of %d", peer, c->size);
    size_t bytes = count * dtype_bytes(t);
    int n = as_int(count, "recv", -1, "count");
    CommHandle local, *k = begin_p2p(c, h, &local, OP_RECV, bytes, peer);
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, buf, NULL)) {
        comm_nccl_recv(c, buf, count, t, peer, k);
        if (!h) finish_on_gpu(c, k);
        return;
    }
#endif
    void *p = needs_staging(c) ? stage_buffers(c, k, bytes, NULL, 0, 0, buf, bytes) : buf;
    mpi_recv(c, p, n, t, peer, tag, k, !h);
    if (!h) finish_blocking(c, k);
}

// A send to `to` and a receive from `from`, issued together (see comm_send_recv).
static void send_recv(Comm *c, const void *send, int send_tag, int to, void *recv, int recv_tag, int from,
                      size_t count, DType t, CommHandle *hs, CommHandle *hr) {
    CHECK(!hs == !hr, "send_recv: give both handles (nonblocking) or neither (blocking)");
    CommHandle local_s = {0}, local_r = {0}, *ks = hs ? hs : &local_s, *kr = hr ? hr : &local_r;
#ifdef WB_HAVE_NCCL
    if (comm_nccl_owns(c, send, recv)) {
        CHECK(to >= 0 && to < c->size && from >= 0 && from < c->size, "send_recv: peers %d and %d are not both "
              "ranks of a group of %d", to, from, c->size);
        size_t bytes = count * dtype_bytes(t);
        ks = begin_p2p(c, hs, &local_s, OP_SEND, bytes, to);
        kr = begin_p2p(c, hr, &local_r, OP_RECV, bytes, from);
        comm_nccl_send_recv(c, send, to, recv, from, count, t, ks, kr);
        if (!hs) {
            finish_on_gpu(c, ks);
            finish_on_gpu(c, kr);
        }
        return;
    }
#endif
    // MPI: both nonblocking, so neither waits for the other to be posted
    comm_recv(c, recv, count, t, from, recv_tag, kr);
    comm_send(c, send, count, t, to, send_tag, ks);
    if (!hs) {
        comm_wait(c, kr);
        comm_wait(c, ks);
    }
}

void comm_send_recv(Comm *c, const void *send, int send_tag, void *recv, int recv_tag, size_t count, DType t,
                    int peer, CommHandle *hs, CommHandle *hr) {
    send_recv(c, send, send_tag, peer, recv, recv_tag, peer, count, t, hs, hr);
}

void comm_send_recv_peers(Comm *c, const void *send, int send_tag, int to, void *recv, int recv_tag, int from,
                          size_t count, DType t, CommHandle *hs, CommHandle *hr) {
    send_recv(c, send, send_tag, to, recv, recv_tag, from, count, t, hs, hr);
}

void comm_shift(Comm *c, const void *send, void *recv, size_t count, DType t, int tag, CommHandle *hs,
                CommHandle *hr) {
    send_recv(c, send, tag, (c->rank + 1) % c->size, recv, tag, (c->rank + c->size - 1) % c->size, count, t, hs, hr);
}

