// comm_nccl.c: the NCCL backend (see comm_backend.h). NCCL moves device buffers
// GPU to GPU (NVLink, PCIe, InfiniBand) with kernels on a CUDA stream, so a
// collective is asynchronous by nature: issuing it queues work on the comm
// stream, and completion is an event that other streams can wait for.
#include "comm_backend.h"

#ifdef WB_HAVE_NCCL
#include <nccl.h>
#include "device_cuda.h"

#define ncclCheck(call)                                                                     \
    do {                                                                                    \
        ncclResult_t nccl_status_ = (call);                                                 \
        if (nccl_status_ != ncclSuccess)                                                    \
            fail_at(__FILE__, __LINE__, "NCCL error %d (%s) in %s; hint: rerun with "       \
                    "NCCL_DEBUG=WARN to see why, and check that every rank issues the same " \
                    "collectives in the same order", (int)nccl_status_,                     \
                    ncclGetErrorString(nccl_status_), #call);                               \
    } while (0)

static ncclComm_t nccl_of(const Comm *c) { return (ncclComm_t)c->nccl; }

static ncclDataType_t nccl_type(const Comm *c, DType t) {
    switch (t) {
    case DT_HALF: return c->dev && c->dev->half == HALF_FP16 ? ncclFloat16 : ncclBfloat16;  // --precision
    case DT_F32: return ncclFloat32;
    case DT_F64: return ncclFloat64;
    case DT_I32: return ncclInt32;
    case DT_U8: return ncclUint8;
    }
    fail_at(__FILE__, __LINE__, "nccl_type: unknown dtype %d", (int)t);
}

// A waited handle's events, kept until the GPU has passed them: start and
// done on the comm stream, `reached` where the compute stream came to the wait.
typedef struct NcclTiming {
    cudaEvent_t start, done, reached;
    double bytes;
    CommOp op;
} NcclTiming;

typedef struct NcclTimings {
    NcclTiming *item;
    int n, cap;
} NcclTimings;

// ---- groups -------------------------------------------------------------------

// NCCL drives one GPU per rank: a GPU that two ranks share rules it out
// (for every rank, so all agree).
int comm_nccl_supported(Comm *c) {
    if (!c->dev || c->dev->kind != DEVICE_CUDA) return 0;
    int own_gpu = comm_device_sharers(c) == 1, all = 0;
    mpiCheck(MPI_Allreduce(&own_gpu, &all, 1, MPI_INT, MPI_MIN, c->mpi));
    return all;
}

// Every wait of the cuda device polls these: an asynchronous error (a peer
// that died, a network that failed) ends the run with its reason instead of
// leaving the host waiting for a collective that will never complete.
static void check_comms(CudaImpl *impl) {
    for (int i = 0; i < impl->ncomms; i++) {
        ncclComm_t comm = (ncclComm_t)impl->comms[i];
        ncclResult_t async = ncclSuccess;
        ncclCheck(ncclCommGetAsyncError(comm, &async));
        if (async == ncclSuccess || async == ncclInProgress) continue;
        const char *why = ncclGetLastError(comm);
        int n = 0;
        (void)ncclCommCount(comm, &n);
        (void)ncclCommAbort(comm);
        fail_at(__FILE__, __LINE__, "NCCL error on a communicator of %d ranks: %s (%s); hint: a peer rank exited or "
                "the network between the ranks failed; its own output says why", n, ncclGetErrorString(async),
                why && *why ? why : "no detail");
    }
}

static void watch(Comm *c) {
    CudaImpl *impl = cuda_impl(c->dev);
    CHECK(impl->ncomms < CUDA_MAX_COMMS, "more than %d NCCL communicators on one rank", CUDA_MAX_COMMS);
    impl->comms[impl->ncomms++] = c->nccl;
    impl->check_comms = check_comms;
}

static void unwatch(Comm *c) {
    CudaImpl *impl = cuda_impl(c->dev);
    for (int i = 0; i < impl->ncomms; i++)
        if (impl->comms[i] == c->nccl) impl->comms[i] = impl->comms[--impl->ncomms];
}

void comm_nccl_init(Comm *c) {
    if (!c->dev || c->dev->kind != DEVICE_CUDA)
        fail_usage("--comm nccl: NCCL needs the cuda device; use --comm mpi");
    if (!comm_nccl_supported(c))
        fail_usage("--comm nccl: some ranks share a GPU (more ranks than GPUs on a node); NCCL "
                   "needs one GPU per rank: use --comm mpi, or at most one rank per GPU");
    ncclUniqueId id;
    if (c->rank == 0) ncclCheck(ncclGetUniqueId(&id));
    mpiCheck(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi));
    ncclComm_t comm;
    cudaCheck(cudaSetDevice(cuda_impl(c->dev)->ordinal));  // NCCL binds to the current device
    ncclCheck(ncclCommInitRank(&comm, c->size, id, c->rank));
    c->nccl = comm;
    c->nccl_stream = cuda_stream(c->dev, STREAM_COMM);  // the world's: the device's comm stream
    c->backend = COMM_NCCL;
    watch(c);
}

// A communicator of its own gets a stream of its own: a pipeline send then
// never holds back the data-parallel collectives queued behind it.
void comm_nccl_split(Comm *parent, int color, int key, Comm *out) {
    // MPI_UNDEFINED (no group for this rank) is NCCL_SPLIT_NOCOLOR to NCCL;
    // every rank of the parent still takes part in the split
    int nccl_color = color < 0 ? NCCL_SPLIT_NOCOLOR : color;
    ncclComm_t comm = NULL;
    ncclCheck(ncclCommSplit(nccl_of(parent), nccl_color, key, &comm, NULL));
    out->nccl = comm;
    if (!comm) return;
    int rank = -1;
    ncclCheck(ncclCommUserRank(comm, &rank));
    CHECK(rank == out->rank, "NCCL split gave rank %d where MPI gave %d; hint: both order ranks "
          "by key, then parent rank", rank, out->rank);
    int lowest = 0, highest = 0;
    cudaStream_t s;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    cudaCheck(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, highest));
    out->nccl_stream = s;
    out->owns_nccl_stream = 1;
    watch(out);
}

void comm_nccl_free(Comm *c) {
    if (!c->nccl) return;
    cuda_wait(c->dev, (cudaStream_t)c->nccl_stream, NULL);
    comm_nccl_settle(c);
    if (c->nccl_timing) free(((NcclTimings *)c->nccl_timing)->item);
    free(c->nccl_timing);
    c->nccl_timing = NULL;
    unwatch(c);
    ncclCheck(ncclCommDestroy(nccl_of(c)));
    if (c->owns_nccl_stream) cudaCheck(cudaStreamDestroy((cudaStream_t)c->nccl_stream));
    c->nccl = c->nccl_stream = NULL;
    c->owns_nccl_stream = 0;
}

int comm_nccl_owns(const Comm *c, const void *a, const void *b) {
    if (c->backend != COMM_NCCL || !c->nccl) return 0;
    const void *ptrs[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (i == 1 && !b) break;
        struct cudaPointerAttributes attr;
        if (!ptrs[i]) return 0;
        cudaError_t st = cudaPointerGetAttributes(&attr, ptrs[i]);
        if (st != cudaSuccess) {
            cuda_clear_error(st);  // not a pointer CUDA knows: not device memory
            return 0;
        }
        if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) return 0;
    }
    return 1;
}

// ---- issue and completion ---------------------------------------------------------

// The communicator's stream first waits for everything issued on the compute
// stream so far: the kernels that wrote the buffer, and those still reading a
// buffer the collective is about to overwrite. Then an event marks the
// operation's start. The host never waits here.
static cudaStream_t begin_nccl(Comm *c, CommHandle *k) {
    cudaStream_t comm_stream = (cudaStream_t)c->nccl_stream;
    CudaImpl *impl = cuda_impl(c->dev);
    cudaCheck(cudaEventRecord(impl->ordering, cuda_stream(c->dev, STREAM_COMPUTE)));
    cudaCheck(cudaStreamWaitEvent(comm_stream, impl->ordering, 0));
    cudaEvent_t start;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventRecord(start, comm_stream));
    k->event_start = start;
    return comm_stream;
}

// The event after the operation marks its completion on the comm stream;
// whoever needs the result waits for it (comm_nccl_wait).
static void end_nccl(Comm *c, CommHandle *k) {
    cudaEvent_t done;
    cudaCheck(cudaEventCreate(&done));
    cudaCheck(cudaEventRecord(done, (cudaStream_t)c->nccl_stream));
    k->event = done;
}

void comm_nccl_after_event(Comm *c, Event *e) {
    if (e->handle) cudaCheck(cudaStreamWaitEvent((cudaStream_t)c->nccl_stream, (cudaEvent_t)e->handle, 0));
}

static void keep_timing(Comm *c, const NcclTiming *t) {
    NcclTimings *l = c->nccl_timing;
    if (!l) l = c->nccl_timing = xcalloc(1, sizeof *l);
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->item = realloc(l->item, (size_t)l->cap * sizeof *l->item);
        CHECK(l->item, "out of host memory for %d NCCL timing events", l->cap);
    }
    l->item[l->n++] = *t;
}

void comm_nccl_wait(Comm *c, CommHandle *k) {
    if (!k->event) return;
    NcclTiming t = {(cudaEvent_t)k->event_start, (cudaEvent_t)k->event, NULL, k->bytes, k->op};
    cudaStream_t compute = cuda_stream(c->dev, STREAM_COMPUTE);
    cudaCheck(cudaEventCreate(&t.reached));
    cudaCheck(cudaEventRecord(t.reached, compute));
    cudaCheck(cudaStreamWaitEvent(compute, t.done, 0));
    // the copy stream too: the offload stages copy reduced gradients to the host on it
    cudaCheck(cudaStreamWaitEvent(cuda_stream(c->dev, STREAM_COPY), t.done, 0));
    keep_timing(c, &t);
    k->event = k->event_start = NULL;
}

static double elapsed_us(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, from, to));
    return 1000.0 * ms;
}

// In flight: start to done on the comm stream. Waiting: the compute stream
// stood at the wait from `reached` until done (nothing when done came first:
// overlap). Both in device time, on the host's clock (device_cuda_spans.cu),
// like the compute spans they are compared with.
void comm_nccl_settle(Comm *c) {
    NcclTimings *l = c->nccl_timing;
    for (int i = 0; l && i < l->n; i++) {
        NcclTiming *t = &l->item[i];
        cuda_wait(c->dev, NULL, t->done);
        cuda_wait(c->dev, NULL, t->reached);
        double start_us = cuda_event_host_us(c->dev, t->start), done_us = cuda_event_host_us(c->dev, t->done);
        trace_span(c->trace, TRACE_TID_COMM, comm_op_name(t->op), start_us, done_us, t->bytes);
        double stall = elapsed_us(t->reached, t->done);
        if (stall > 0) trace_span(c->trace, TRACE_TID_WAIT, "wait", done_us - stall, done_us, 0);
        cudaCheck(cudaEventDestroy(t->start));
        cudaCheck(cudaEventDestroy(t->done));
        cudaCheck(cudaEventDestroy(t->reached));
    }
    if (l) l->n = 0;
}

int comm_nccl_test(Comm *c, CommHandle *k) {
    if (!k->event) return 1;
    cudaError_t st = cudaEventQuery((cudaEvent_t)k->event);
    if (st == cudaErrorNotReady) {
        cuda_clear_error(st);
        cuda_impl(c->dev)->check_comms(cuda_impl(c->dev));  // a poll that never succeeds: is a peer gone?
        return 0;
    }
    cudaCheck(st);
    comm_nccl_wait(c, k);
    return 1;
}

// ---- collectives ---------------------------------------------------------------------

void comm_nccl_all_reduce_sum(Comm *c, void *buf, size_t count, DType t, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclCheck(ncclAllReduce(buf, buf, count, nccl_type(c, t), ncclSum, nccl_of(c), s));
    end_nccl(c, k);
}

void comm_nccl_all_reduce_max(Comm *c, void *buf, size_t count, DType t, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclCheck(ncclAllReduce(buf, buf, count, nccl_type(c, t), ncclMax, nccl_of(c), s));
    end_nccl(c, k);
}

static int counts_equal(const size_t *counts, int n) {
    for (int r = 1; r < n; r++)
        if (counts[r] != counts[0]) return 0;
    return 1;
}

// ncclReduceScatter needs equal parts. Parts of different sizes (a gradient
// bucket that covers some ranks' shards more than others) become one
// ncclReduce per rank with a nonzero part, rooted at that rank, fused by
// ncclGroupStart/End into a single launch: rank r receives the sum of its
// part, and each element still crosses the ring once, as in a reduce-scatter.
void comm_nccl_reduce_scatter_sum(Comm *c, const void *send, void *recv, const size_t *recvcounts,
                                  DType t, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclDataType_t nt = nccl_type(c, t);
    if (counts_equal(recvcounts, c->size)) {
        if (recvcounts[0] > 0)
            ncclCheck(ncclReduceScatter(send, recv, recvcounts[0], nt, ncclSum, nccl_of(c), s));
    } else {
        size_t es = dtype_bytes(t), displ = 0;
        ncclCheck(ncclGroupStart());
        for (int r = 0; r < c->size; r++) {
            if (recvcounts[r] > 0) {
                // recvbuff is read only on the root; the others pass NULL
                ncclCheck(ncclReduce((const char *)send + displ * es, r == c->rank ? recv : NULL,
                                     recvcounts[r], nt, ncclSum, r, nccl_of(c), s));
            }
            displ += recvcounts[r];
        }
        ncclCheck(ncclGroupEnd());
    }
    end_nccl(c, k);
}

static int parts_packed_in_order(const size_t *counts, const size_t *displs, int n) {
    for (int r = 0; r < n; r++)
        if (counts[r] != counts[0] || displs[r] != (size_t)r * counts[0]) return 0;
    return 1;
}

// In place. Equal parts packed in rank order are ncclAllGather's layout;
// anything else is one in-place ncclBroadcast per rank with a nonzero part,
// fused in one group (the same bytes per rank as an all-gather).
void comm_nccl_all_gather(Comm *c, void *buf, const size_t *counts, const size_t *displs, DType t,
                          CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclDataType_t nt = nccl_type(c, t);
    size_t es = dtype_bytes(t);
    if (parts_packed_in_order(counts, displs, c->size)) {
        if (counts[0] > 0) {
            const char *own = (const char *)buf + (size_t)c->rank * counts[0] * es;
            ncclCheck(ncclAllGather(own, buf, counts[0], nt, nccl_of(c), s));
        }
    } else {
        ncclCheck(ncclGroupStart());
        for (int r = 0; r < c->size; r++) {
            if (counts[r] == 0) continue;
            char *part = (char *)buf + displs[r] * es;
            ncclCheck(ncclBroadcast(part, part, counts[r], nt, r, nccl_of(c), s));
        }
        ncclCheck(ncclGroupEnd());
    }
    end_nccl(c, k);
}

void comm_nccl_broadcast(Comm *c, void *buf, size_t count, DType t, int root, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclCheck(ncclBroadcast(buf, buf, count, nccl_type(c, t), root, nccl_of(c), s));
    end_nccl(c, k);
}

// NCCL has no all-to-all: a send and a receive per peer in one group is
// how it is written (the part for this rank itself included: NCCL copies it).
void comm_nccl_all_to_all(Comm *c, const void *send, const size_t *sendcounts, void *recv, const size_t *recvcounts,
                          DType t, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclDataType_t nt = nccl_type(c, t);
    size_t es = dtype_bytes(t), sent = 0, got = 0;
    ncclCheck(ncclGroupStart());
    for (int q = 0; q < c->size; q++) {
        if (sendcounts[q]) ncclCheck(ncclSend((const char *)send + sent * es, sendcounts[q], nt, q, nccl_of(c), s));
        if (recvcounts[q]) ncclCheck(ncclRecv((char *)recv + got * es, recvcounts[q], nt, q, nccl_of(c), s));
        sent += sendcounts[q];
        got += recvcounts[q];
    }
    ncclCheck(ncclGroupEnd());
    end_nccl(c, k);
}

void comm_nccl_send(Comm *c, const void *buf, size_t count, DType t, int peer, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclCheck(ncclSend(buf, count, nccl_type(c, t), peer, nccl_of(c), s));
    end_nccl(c, k);
}

void comm_nccl_recv(Comm *c, void *buf, size_t count, DType t, int peer, CommHandle *k) {
    cudaStream_t s = begin_nccl(c, k);
    ncclCheck(ncclRecv(buf, count, nccl_type(c, t), peer, nccl_of(c), s));
    end_nccl(c, k);
}

void comm_nccl_send_recv(Comm *c, const void *send, int to, void *recv, int from, size_t count, DType t,
                         CommHandle *ks, CommHandle *kr) {
    cudaStream_t s = begin_nccl(c, ks);
    begin_nccl(c, kr);  // its start event at the same point of the comm stream
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclSend(send, count, nccl_type(c, t), to, nccl_of(c), s));
    ncclCheck(ncclRecv(recv, count, nccl_type(c, t), from, nccl_of(c), s));
    ncclCheck(ncclGroupEnd());
    end_nccl(c, ks);
    end_nccl(c, kr);
}
#endif
