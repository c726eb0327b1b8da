// comm.h: process groups and collectives, asynchronous with handles.
// Backends: MPI (every buffer; bf16 sums through a user-defined MPI_Op; device
// buffers staged through pinned host memory when MPI is not CUDA-aware) and
// NCCL (one GPU per rank). Every call counts the bytes a bandwidth-optimal
// (ring) algorithm moves per rank, so reports can set them beside the formula.
//
// Order: a collective on device buffers reads and writes them after the work
// queued on the compute stream before the call (NCCL: its stream waits on an
// event; MPI on the cuda device: the staging copy runs on the compute stream,
// which the host waits for; the cpu device runs everything in order), and
// its completion (the call's return when blocking, comm_wait otherwise)
// makes the compute and copy streams wait for it. So no caller needs a
// dev_sync before a collective, and on NCCL no call makes the host wait.
#pragma once
#include <mpi.h>
#include <stddef.h>
#include "device.h"

// DT_HALF: the 16-bit params and grads, bf16 or fp16 as the device holds them (Device.half)
typedef enum { DT_HALF, DT_F32, DT_F64, DT_I32, DT_U8 } DType;
size_t dtype_bytes(DType t);

typedef enum { COMM_MPI = 0, COMM_NCCL = 1 } CommBackend;

typedef enum {
    OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SEND, OP_RECV, OP_ALL_TO_ALL, OP_COUNT
} CommOp;
const char *comm_op_name(CommOp op);

typedef struct CommStats {
    double ring_bytes[OP_COUNT];  // per-rank bytes moved by a ring algorithm, summed over calls
    double payload_bytes[OP_COUNT];  // bytes of the buffers handed to the calls
    long calls[OP_COUNT];
    // the part of ring_bytes that leaves this rank's host: a ring's bytes
    // times host_links / size (the ring's links that join two hosts, as a
    // share of its links: the mean over the ranks), an all-to-all's or a
    // send's bytes to ranks on other hosts
    double cross_host_bytes[OP_COUNT];
    // times are on the trace's timeline: rows comm (issue to completion) and
    // wait (blocked in comm_wait or a blocking call: exposed communication)
} CommStats;

// Pinned staging buffers kept for reuse on the MPI path of the cuda device:
// pinning memory is slow (it maps every page), so a finished call's stage
// waits here for the next call that fits in it.
#define COMM_STAGE_POOL 4

typedef struct Comm {
    MPI_Comm mpi;
    int rank, size;
    CommBackend backend;
    void *nccl;          // ncclComm_t when backend == COMM_NCCL
    void *nccl_stream;   // its cudaStream_t: the device's comm stream for the world, a stream of its own for a split
    int owns_nccl_stream;
    Device *dev;         // where the buffers live (for staging and streams)
    CommStats stats;
    Trace *trace;
    MPI_Op half_sum[2];  // the 16-bit sums by HalfFormat, created once at comm_world_init; shared by sub-groups
    int owns_op;
    Buf stage_pool[COMM_STAGE_POOL];  // idle pinned stages (empty Buf = free slot)
    int stage_always;    // stage even on the cpu device: lets the cpu tests run the cuda MPI path
    void *nccl_timing;   // NCCL path: events of waited handles, timed at comm_settle_stats (comm_nccl.c)
    void *progress;      // the progress thread, when one runs (comm_progress.c)
    // Where the ranks sit: host_of[r] is the host (node) of rank r, hosts
    // numbered from 0 in the order of their first rank; host_links counts
    // the ring's links r -> r+1 (mod size) that join two hosts. NULL
    // host_of: one host. Set by comm_world_init and comm_split.
    int *host_of;
    int hosts, host_links;
} Comm;

typedef struct CommHandle {
    MPI_Request req;
    int active;
    CommOp op;
    double t_issue_us, bytes;
    // staging for device buffers on the MPI path (unused on the cpu device)
    Buf stage;
    void *dst;
    size_t dst_bytes;
    size_t gather_elem_bytes;  // all-gather: copy back only the ranks' parts (mpi_counts), not the gaps
    // int counts/displacements of a v-collective: MPI reads them until the
    // nonblocking call completes, so they live as long as the handle
    int *mpi_counts;
    // NCCL path: cudaEvent_t recorded on the comm stream before and after the
    // operation (comm_nccl.c); NULL on the MPI path
    void *event_start, *event;
} CommHandle;

// MPI_Init and the world group. Also sets *local_rank, *local_size (ranks on
// this node, via MPI_Comm_split_type). The thread level is FUNNELED (OpenMP
// threads compute, the main thread calls MPI), or MULTIPLE when
// `progress_thread` says a progress thread will call MPI too.
void comm_world_init(Comm *world, int *argc, char ***argv, int *local_rank, int *local_size, int progress_thread);
// Open MPI's single copy on shared memory (btl_vader_single_copy_mechanism):
// unless set already, cma where a process may read a sibling's memory,
// else none (comm_world.c says why). comm_world_init calls it; a program
// that calls MPI_Init itself calls it first. comm_single_copy: the one this
// run uses.
void comm_single_copy_choose(void);
const char *comm_single_copy(void);
// A thread that enters MPI's progress engine every interval_us, so
// nonblocking collectives advance while the main thread computes
// (comm_progress.c); stop it before comm_world_finalize.
void comm_progress_thread_start(Comm *world, long interval_us);
void comm_progress_thread_stop(Comm *world);
// Attach the device and choose the backend ("auto", "mpi", "nccl"): usage error
// when nccl is asked for but unavailable. Collective.
void comm_setup(Comm *c, Device *dev, const char *backend, Trace *trace);
// Ranks on this rank's node whose device is this rank's GPU, by UUID (1 on
// the cpu device). Collective over c.
int comm_device_sharers(Comm *c);
// Sub-group (color/key as MPI_Comm_split). Collective over parent.
void comm_split(Comm *parent, int color, int key, Comm *out);
// The two groups of a hierarchical collective: `host`, the ranks of the
// parent on this rank's host, in the parent's order; `across`, one rank of
// each host, those at the same index within their host as this one (the
// parent's order, that is the hosts' order). Collective over parent.
void comm_split_hosts(Comm *parent, Comm *host, Comm *across);
// Whether the parent's hosts hold the same number of ranks each, as
// consecutive ranks (host h: ranks h·P .. h·P + P-1): what the hierarchical
// collectives of zero3's ZeRO++ assume.
int comm_hosts_regular(const Comm *c);
void comm_free(Comm *c);
void comm_world_finalize(Comm *world);

// All functions: h == NULL means blocking. With a handle, the call returns at
// once and the buffers must not be touched until comm_wait(h).
// In-place sum over the group.
void comm_all_reduce_sum(Comm *c, void *buf, size_t count, DType t, CommHandle *h);
// In-place maximum over the group (f32, f64, i32); counted as an all-reduce.
void comm_all_reduce_max(Comm *c, void *buf, size_t count, DType t, CommHandle *h);
// Sum over the group; rank r receives elements [displ_r, displ_r + recvcounts[r])
// of the summed `send` (displ_r = sum of earlier counts) into `recv`.
// Counts may differ and may be zero (a bucket spanning some ranks' shards).
void comm_reduce_scatter_sum(Comm *c, const void *send, void *recv, const size_t *recvcounts,
                             DType t, CommHandle *h);
// In-place gather: rank r's part is buf[displs[r] .. + counts[r]) on entry;
// on exit every rank holds all parts. Counts may differ and may be zero.
void comm_all_gather(Comm *c, void *buf, const size_t *counts, const size_t *displs, DType t,
                     CommHandle *h);
void comm_broadcast(Comm *c, void *buf, size_t count, DType t, int root, CommHandle *h);
// All-to-all: this rank's part for rank q, sendcounts[q] elements, lies in
// `send` after those for ranks 0..q-1, and rank q's part for this one,
// recvcounts[q], lands in `recv` after those of ranks 0..q-1. Counts may
// differ and may be zero; a rank's part for itself is copied. Counted as the
// bytes this rank sends to the others (what each rank moves: no ring).
void comm_all_to_all(Comm *c, const void *send, const size_t *sendcounts, void *recv, const size_t *recvcounts,
                     DType t, CommHandle *h);
void comm_send(Comm *c, const void *buf, size_t count, DType t, int peer, int tag, CommHandle *h);
void comm_recv(Comm *c, void *buf, size_t count, DType t, int peer, int tag, CommHandle *h);
// A send to `peer` and a receive of as many elements from it, issued together
// (MPI: Isend and Irecv; NCCL: one group), so that two ranks that each send
// before they receive never wait on each other: a pipeline stage's "send
// forward, receive backward" (Megatron-LM's batched p2p). Counted as a send
// and a recv. hs and hr both NULL: blocking; both given: nonblocking.
void comm_send_recv(Comm *c, const void *send, int send_tag, void *recv, int recv_tag, size_t count, DType t,
                    int peer, CommHandle *hs, CommHandle *hr);
// The same with the send to `to` and the receive from `from` (an interleaved
// pipeline's "send this chunk's output on, receive the next chunk's input").
void comm_send_recv_peers(Comm *c, const void *send, int send_tag, int to, void *recv, int recv_tag, int from,
                          size_t count, DType t, CommHandle *hs, CommHandle *hr);
// The ring's step (ring attention): `send` goes to the next rank (rank + 1
// mod size) and `recv` takes as many elements from the previous, issued
// together as above. Counted as a send and a recv.
void comm_shift(Comm *c, const void *send, void *recv, size_t count, DType t, int tag, CommHandle *hs,
                CommHandle *hr);
// The collectives issued on c after this call read their device buffers
// only after event e, recorded where another stream than compute wrote them
// (a copy up on the copy stream), and the compute stream does not wait for
// it: NCCL's stream waits for e; MPI's staging copy runs on the compute
// stream, which then waits; on the cpu device e is complete.
void comm_after_event(Comm *c, Event *e);
void comm_wait(Comm *c, CommHandle *h);   // no-op on an inactive handle
int comm_test(Comm *c, CommHandle *h);    // 1 when complete (then as comm_wait)
// Lets MPI progress outstanding nonblocking collectives (MPI progresses them
// only inside MPI calls); the stages' steps call it between units so buckets move during backward.
void comm_progress(Comm *c);
void comm_barrier(Comm *c);
// Small host-side reductions used by the trainer (losses, norms, max memory).
double comm_sum_f64(Comm *c, double x);
double comm_max_f64(Comm *c, double x);
// Every rank says whether it failed; returns the lowest rank that did (-1:
// none), whose msg (msg_bytes on every rank) is then in every rank's msg:
// one line for the whole job instead of one per rank.
int comm_first_failure(const Comm *c, int failed, char *msg, int msg_bytes);
// On NCCL a nonblocking call completes on the GPU, not on the host: its time
// in flight and the compute stream's wait for it are read off CUDA events once
// the GPU has passed them. Call after a device sync, before reading stats.
void comm_settle_stats(Comm *c);
void comm_stats_reset(Comm *c);
// Ring bytes of every operation so far (the sum of stats.ring_bytes).
double comm_ring_bytes(const Comm *c);
// Of those, the bytes that left this rank's host (the sum of stats.cross_host_bytes).
double comm_cross_host_bytes(const Comm *c);
