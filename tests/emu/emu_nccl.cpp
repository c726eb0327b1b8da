// emu_nccl.cpp: NCCL on MPI, and the host's MPI calls that let device work move.
//
// A communicator is an MPI communicator (ncclCommInitRank duplicates the
// world, ncclCommSplit splits its parent). A collective is queued on its
// stream like NCCL's kernel; when the scheduler reaches it, it copies its
// input, starts the matching nonblocking MPI call, and holds the stream until
// MPI says done, then writes its output. The operations of one communicator
// run in issue order (each waits for the one before), as NCCL requires the
// ranks to issue them. bf16 sums add in fp32 and round once per addition.
//
// A GPU keeps running queued work while its host blocks in MPI. Here queued
// work runs only when the host waits for it, so every blocking MPI call of
// the program (the PMPI profiling interface names them) runs the device's
// queued work for as long as it blocks: the call is made nonblocking and
// the host, until MPI says done, moves the device's work on, as the GPU
// would: a peer that waits on a collective this rank has queued, even one
// queued behind another still in flight (a pipeline stage's second send),
// is then never stuck behind this rank's host. The calls with no
// nonblocking form (communicator set-up, MPI_Finalize) first start what can
// start. Calls that only poll (MPI_Test, MPI_Iprobe) block nothing and run
// nothing.
//
// EMU_NCCL_DEAD_PEER=N makes this rank's collectives from the N-th on never
// finish, and ncclCommGetAsyncError report ncclRemoteError: a peer that died.
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "emu.h"
#include "nccl.h"

using namespace emu;

struct EmuNcclComm {
    MPI_Comm mpi;
    int rank, size;
    bool destroyed;
    OpRef last;  // the last operation issued on it
    long issued;
    bool dead;   // the injected dead peer was reached
};

// ---- MPI types and reductions ------------------------------------------------------------------------

static float bf16_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint16_t f_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float fp16_f(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}
static uint16_t f_fp16(float f) {
    if (f != f) return 0x7fff;
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, sizeof h);
    return h;
}
static void fp16_sum(void *in, void *inout, int *len, MPI_Datatype *) {
    uint16_t *a = (uint16_t *)in, *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) b[i] = f_fp16(fp16_f(a[i]) + fp16_f(b[i]));
}
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *) {
    uint16_t *a = (uint16_t *)in, *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) b[i] = f_bf16(bf16_f(a[i]) + bf16_f(b[i]));
}
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *) {
    uint16_t *a = (uint16_t *)in, *b = (uint16_t *)inout;
    for (int i = 0; i < *len; i++) b[i] = f_bf16(fmaxf(bf16_f(a[i]), bf16_f(b[i])));
}

static size_t nccl_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    case ncclBfloat16: case ncclFloat16: return MPI_UINT16_T;
    default: die("NCCL data type %d is not emulated", (int)t);
    }
}

static MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
    static MPI_Op sum16 = MPI_OP_NULL, max16 = MPI_OP_NULL, sum_fp16 = MPI_OP_NULL;
    if (t == ncclFloat16) {
        if (op != ncclSum) die("NCCL reduction %d on fp16 is not emulated", (int)op);
        if (sum_fp16 == MPI_OP_NULL) PMPI_Op_create(fp16_sum, 1, &sum_fp16);
        return sum_fp16;
    }
    if (t == ncclBfloat16) {
        if (op == ncclSum) {
            if (sum16 == MPI_OP_NULL) PMPI_Op_create(bf16_sum, 1, &sum16);
            return sum16;
        }
        if (op == ncclMax) {
            if (max16 == MPI_OP_NULL) PMPI_Op_create(bf16_max, 1, &max16);
            return max16;
        }
        die("NCCL reduction %d on bf16 is not emulated", (int)op);
    }
    switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: die("NCCL reduction %d is not emulated", (int)op);
    }
}

// ---- one collective ------------------------------------------------------------------------------------------

enum CollKind { ALL_REDUCE, REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, SEND, RECV };
static const char *coll_name[] = {"ncclAllReduce", "ncclReduce", "ncclReduceScatter", "ncclAllGather",
                                  "ncclBroadcast", "ncclSend", "ncclRecv"};

struct Coll {
    CollKind kind;
    const void *send;
    void *recv;
    size_t count;  // as NCCL counts it (per rank for reduce-scatter and all-gather)
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;      // root, or peer
    EmuNcclComm *comm;
    std::vector<char> in, out;
    MPI_Request req;
};

// the bytes a device buffer must hold, inside one live device allocation
static void check_buffer(const Coll &c, const char *role, const void *p, size_t bytes) {
    if (bytes == 0) return;
    const Alloc *a = find_alloc(p);
    if (!a || a->kind != MEM_DEVICE || a->freed || (const char *)p < a->ptr ||
        (const char *)p + bytes > a->ptr + a->bytes)
        die("%s: the %s buffer (%zu bytes at %p) is not inside one live device allocation%s", coll_name[c.kind], role,
            bytes, p, a && !a->freed ? " (it runs past the end)" : "");
}

static size_t in_bytes(const Coll &c) {
    size_t es = nccl_bytes(c.type);
    switch (c.kind) {
    case REDUCE_SCATTER: return c.count * c.comm->size * es;
    case RECV: return 0;
    case BROADCAST: return c.comm->rank == c.root ? c.count * es : 0;
    default: return c.count * es;
    }
}
static size_t out_bytes(const Coll &c) {
    size_t es = nccl_bytes(c.type);
    switch (c.kind) {
    case ALL_GATHER: return c.count * c.comm->size * es;
    case SEND: return 0;
    case REDUCE: return c.comm->rank == c.root ? c.count * es : 0;
    default: return c.count * es;
    }
}

static void start_coll(Coll &c) {
    c.in.assign((const char *)c.send, (const char *)c.send + in_bytes(c));
    c.out.resize(std::max(out_bytes(c), in_bytes(c)));
    MPI_Comm m = c.comm->mpi;
    MPI_Datatype t = mpi_type(c.type);
    int n = (int)c.count;
    if (c.count > 0x7fffffff) die("%s of %zu elements: past what one MPI call carries", coll_name[c.kind], c.count);
    switch (c.kind) {
    case ALL_REDUCE: PMPI_Iallreduce(c.in.data(), c.out.data(), n, t, mpi_op(c.op, c.type), m, &c.req); break;
    case REDUCE: PMPI_Ireduce(c.in.data(), c.out.data(), n, t, mpi_op(c.op, c.type), c.root, m, &c.req); break;
    case REDUCE_SCATTER:
        PMPI_Ireduce_scatter_block(c.in.data(), c.out.data(), n, t, mpi_op(c.op, c.type), m, &c.req);
        break;
    case ALL_GATHER: PMPI_Iallgather(c.in.data(), n, t, c.out.data(), n, t, m, &c.req); break;
    case BROADCAST:
        if (c.comm->rank == c.root) memcpy(c.out.data(), c.in.data(), c.in.size());
        PMPI_Ibcast(c.out.data(), n, t, c.root, m, &c.req);
        break;
    case SEND: PMPI_Isend(c.in.data(), n, t, c.root, 0, m, &c.req); break;
    case RECV: PMPI_Irecv(c.out.data(), n, t, c.root, 0, m, &c.req); break;
    }
}

static void finish_coll(Coll &c) {
    size_t bytes = out_bytes(c);
    if (bytes) memcpy(c.recv, c.out.data(), bytes);
    std::vector<char>().swap(c.in);
    std::vector<char>().swap(c.out);
}

// ---- groups and the queue ----------------------------------------------------------------------------------

static int group_depth;
static std::vector<Coll> group;
static cudaStream_t group_stream;
static long dead_after = -1;  // EMU_NCCL_DEAD_PEER
static long collectives_started;

static void enqueue_colls(std::vector<Coll> colls, cudaStream_t stream) {
    EmuNcclComm *comm = colls[0].comm;
    std::string what = coll_name[colls[0].kind];
    if (colls.size() > 1) what += " and " + std::to_string(colls.size() - 1) + " more (group)";
    auto state = std::make_shared<std::vector<Coll>>(std::move(colls));
    OpRef op = std::make_shared<Op>();
    op->what = what;
    auto dead = std::make_shared<bool>(false);
    op->start = [state, dead]() {
        if (dead_after >= 0 && collectives_started++ >= dead_after) {
            for (Coll &c : *state) c.comm->dead = true;
            *dead = true;
            return;
        }
        for (Coll &c : *state) start_coll(c);
    };
    op->test = [state, dead]() {
        if (*dead) return false;
        for (Coll &c : *state) {
            int flag = 0;
            if (c.req != MPI_REQUEST_NULL) PMPI_Test(&c.req, &flag, MPI_STATUS_IGNORE);
            if (c.req != MPI_REQUEST_NULL) return false;
        }
        for (Coll &c : *state) finish_coll(c);
        return true;
    };
    for (Coll &c : *state)
        if (c.comm->last && !c.comm->last->done) op->deps.push_back(c.comm->last);
    enqueue(stream, op);
    for (Coll &c : *state) c.comm->last = op, c.comm->issued++;
    (void)comm;
}

static ncclResult_t issue(Coll c, cudaStream_t stream) {
    Lock l;
    count_call(coll_name[c.kind]);
    if (!c.comm || c.comm->destroyed) return ncclInvalidArgument;
    if ((c.kind == REDUCE || c.kind == BROADCAST || c.kind == SEND || c.kind == RECV) &&
        (c.root < 0 || c.root >= c.comm->size))
        return ncclInvalidArgument;
    check_buffer(c, "send", c.send, in_bytes(c));
    check_buffer(c, "receive", c.recv, out_bytes(c));
    c.req = MPI_REQUEST_NULL;
    if (group_depth > 0) {
        if (!group.empty() && stream != group_stream)
            die("a NCCL group over two streams is not emulated (the project issues each group on one stream)");
        group_stream = stream;
        group.push_back(std::move(c));
        return ncclSuccess;
    }
    std::vector<Coll> one;
    one.push_back(std::move(c));
    enqueue_colls(std::move(one), stream);
    return ncclSuccess;
}

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    for (size_t i = 0; i < sizeof id->internal; i++) id->internal[i] = (char)(random_u64() >> 11);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    Lock l;
    count_call("ncclCommInitRank");
    const char *dead = getenv("EMU_NCCL_DEAD_PEER");
    if (dead) dead_after = atol(dead);
    int world = 0, me = 0;
    PMPI_Comm_size(MPI_COMM_WORLD, &world);
    PMPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != world || rank != me)
        die("ncclCommInitRank(%d ranks, rank %d): the emulator builds a first communicator over all %d MPI ranks in "
            "their MPI order (rank %d here); split it for the others", nranks, rank, world, me);
    ncclUniqueId root_id = id;
    PMPI_Bcast(&root_id, sizeof root_id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (memcmp(&root_id, &id, sizeof id) != 0)
        die("ncclCommInitRank: this rank's unique id differs from rank 0's (it must be broadcast before the call)");
    EmuNcclComm *c = new EmuNcclComm{MPI_COMM_NULL, rank, nranks, false, NULL, 0, false};
    PMPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    Lock l;
    count_call("ncclCommSplit");
    if (!comm || comm->destroyed) return ncclInvalidArgument;
    MPI_Comm m;
    PMPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m);
    if (m == MPI_COMM_NULL) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    EmuNcclComm *c = new EmuNcclComm{m, 0, 0, false, NULL, 0, false};
    PMPI_Comm_rank(m, &c->rank);
    PMPI_Comm_size(m, &c->size);
    *newcomm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    Lock l;
    count_call("ncclCommDestroy");
    if (!comm || comm->destroyed) return ncclInvalidArgument;
    if (comm->last && !comm->last->done && !comm->dead)
        die("ncclCommDestroy with its operations still queued; synchronize the stream first");
    comm->destroyed = true;
    PMPI_Comm_free(&comm->mpi);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    Lock l;
    if (!comm) return ncclInvalidArgument;
    comm->destroyed = true;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    *count = comm->size;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    Lock l;
    count_call("ncclCommGetAsyncError");
    *async_error = comm && comm->dead ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unhandled error";
    }
}
const char *ncclGetLastError(ncclComm_t comm) {
    return comm && comm->dead ? "a peer stopped taking part (emulated: EMU_NCCL_DEAD_PEER)" : "";
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(Coll{ALL_REDUCE, s, r, count, t, op, 0, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    return issue(Coll{REDUCE, s, r, count, t, op, root, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    return issue(Coll{REDUCE_SCATTER, s, r, count, t, op, 0, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(Coll{ALL_GATHER, s, r, count, t, ncclSum, 0, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(Coll{BROADCAST, s, r, count, t, ncclSum, root, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    return issue(Coll{SEND, s, NULL, count, t, ncclSum, peer, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    return issue(Coll{RECV, NULL, r, count, t, ncclSum, peer, comm, {}, {}, MPI_REQUEST_NULL}, stream);
}

ncclResult_t ncclGroupStart(void) {
    Lock l;
    group_depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    Lock l;
    if (group_depth == 0) return ncclInvalidUsage;
    if (--group_depth > 0 || group.empty()) return ncclSuccess;
    std::vector<Coll> colls;
    colls.swap(group);
    enqueue_colls(std::move(colls), group_stream);
    return ncclSuccess;
}

// ---- the host's blocking MPI calls -------------------------------------------------------------------------

#define BEFORE_BLOCKING() flush_started()

// Waits for req while the device runs its queued work (see the top).
static int wait_running_device(MPI_Request *req, MPI_Status *st) {
    for (;;) {
        int flag = 0;
        int rc = PMPI_Test(req, &flag, st);
        if (rc != MPI_SUCCESS || flag) return rc;
        if (!progress_once()) sched_yield();
    }
}
#define BLOCKING(start, st)                       \
    do {                                          \
        MPI_Request req;                          \
        int rc = (start);                         \
        if (rc != MPI_SUCCESS) return rc;         \
        return wait_running_device(&req, (st));   \
    } while (0)

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    BLOCKING(PMPI_Iallreduce(s, r, n, t, op, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
    BLOCKING(PMPI_Ireduce(s, r, n, t, op, root, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
    BLOCKING(PMPI_Ibcast(b, n, t, root, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
    BLOCKING(PMPI_Igather(s, sn, st, r, rn, rt, root, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs, MPI_Datatype rt,
                int root, MPI_Comm c) {
    BLOCKING(PMPI_Igatherv(s, sn, st, r, rn, displs, rt, root, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
    BLOCKING(PMPI_Iallgather(s, sn, st, r, rn, rt, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs, MPI_Datatype rt,
                   MPI_Comm c) {
    BLOCKING(PMPI_Iallgatherv(s, sn, st, r, rn, displs, rt, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Alltoallv(const void *s, const int *sn, const int *sd, MPI_Datatype st, void *r, const int *rn, const int *rd,
                  MPI_Datatype rt, MPI_Comm c) {
    BLOCKING(PMPI_Ialltoallv(s, sn, sd, st, r, rn, rd, rt, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Barrier(MPI_Comm c) {
    BLOCKING(PMPI_Ibarrier(c, &req), MPI_STATUS_IGNORE);
}
int MPI_Send(const void *b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c) {
    BLOCKING(PMPI_Isend(b, n, t, dest, tag, c, &req), MPI_STATUS_IGNORE);
}
int MPI_Recv(void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st) {
    BLOCKING(PMPI_Irecv(b, n, t, src, tag, c, &req), st);
}
int MPI_Wait(MPI_Request *r, MPI_Status *st) {
    return wait_running_device(r, st);
}
int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out) {
    BEFORE_BLOCKING();
    return PMPI_Comm_split(c, color, key, out);
}
int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out) {
    BEFORE_BLOCKING();
    return PMPI_Comm_split_type(c, type, key, info, out);
}
int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out) {
    BEFORE_BLOCKING();
    return PMPI_Comm_dup(c, out);
}
int MPI_Finalize(void) {
    BEFORE_BLOCKING();
    return PMPI_Finalize();
}

}  // extern "C"
