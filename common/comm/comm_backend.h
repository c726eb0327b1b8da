// comm_backend.h: what the facade (comm.c: handles, byte accounting, staging,
// dispatch; comm_world.c: the world and its groups) asks of the two
// backends, which import only this header and runtime/, never each other.
// The facade has counted a call and made its handle k before it hands the
// call over, and completes it after.
#pragma once
#include "comm.h"

// ---- MPI (comm_mpi.c): every buffer, on the host ------------------------------
// A device buffer reaches these staged in pinned host memory (comm.c). Each
// issues its call for handle k: nonblocking (k->req), or with `blocking`
// complete on return. The int counts (MPI's) are the facade's, checked to
// fit, and live in k->mpi_counts as long as the call.
void mpi_all_reduce(Comm *c, void *buf, int count, DType t, int max, CommHandle *k, int blocking);
// counts[r]: rank r's part of the sum
void mpi_reduce_scatter(Comm *c, const void *send, void *recv, const int *counts, DType t, CommHandle *k,
                        int blocking);
// counts then displacements, size each; in place
void mpi_all_gather(Comm *c, void *buf, const int *counts_displs, DType t, CommHandle *k, int blocking);
void mpi_broadcast(Comm *c, void *buf, int count, DType t, int root, CommHandle *k, int blocking);
// send counts, send displacements, receive counts, receive displacements, size each
void mpi_all_to_all(Comm *c, const void *send, void *recv, const int *ints, DType t, CommHandle *k, int blocking);
void mpi_send(Comm *c, const void *buf, int count, DType t, int peer, int tag, CommHandle *k, int blocking);
void mpi_recv(Comm *c, void *buf, int count, DType t, int peer, int tag, CommHandle *k, int blocking);
// completion of a nonblocking call: wait, or 1 when it is done
void mpi_wait(CommHandle *k);
int mpi_test(CommHandle *k);
// enters MPI's progress engine (it moves nonblocking calls only inside MPI calls)
void mpi_progress(Comm *c);
// The user-defined 16-bit sums by HalfFormat (bf16, fp16), made once for the world.
void mpi_half_sum_ops_create(MPI_Op ops[2]);

// ---- NCCL (comm_nccl.c): one GPU per rank, device buffers ----------------------
// Every operation runs on its communicator's stream (the device's comm
// stream for the world, one of its own for each split), after the work
// already issued on the compute stream (that is what produced the buffer);
// its completion is a cudaEvent in CommHandle.event. No operation makes the
// host wait; every wait of the cuda device polls the communicators'
// asynchronous errors.
#ifdef WB_HAVE_NCCL
// Collective over c->mpi: does every rank of the group have a GPU of its own?
// (NCCL cannot run two ranks on one GPU; the MPI backend can.)
int comm_nccl_supported(Comm *c);
// Collective over c->mpi: rank 0 makes the ncclUniqueId, MPI_Bcast carries it,
// ncclCommInitRank joins. Sets c->nccl and c->backend = COMM_NCCL. Usage error
// when the device is not cuda or ranks share a GPU.
void comm_nccl_init(Comm *c);
// After comm_split made out->mpi: the matching NCCL communicator (ncclCommSplit,
// collective over parent's NCCL communicator; ranks ordered as MPI_Comm_split's).
void comm_nccl_split(Comm *parent, int color, int key, Comm *out);
void comm_nccl_free(Comm *c);

// Should this call go to NCCL? backend is NCCL and `a` (and `b` unless NULL)
// is device memory. Host buffers (losses, small host-side values) stay on MPI.
int comm_nccl_owns(const Comm *c, const void *a, const void *b);

// The collectives of comm.h on NCCL. `k` is the handle the facade set up
// (its own local one for a blocking call, which it then waits on the GPU);
// each returns at once with k->event recorded.
void comm_nccl_all_reduce_sum(Comm *c, void *buf, size_t count, DType t, CommHandle *k);
void comm_nccl_all_reduce_max(Comm *c, void *buf, size_t count, DType t, CommHandle *k);
void comm_nccl_reduce_scatter_sum(Comm *c, const void *send, void *recv, const size_t *recvcounts,
                                  DType t, CommHandle *k);
void comm_nccl_all_gather(Comm *c, void *buf, const size_t *counts, const size_t *displs, DType t,
                          CommHandle *k);
void comm_nccl_broadcast(Comm *c, void *buf, size_t count, DType t, int root, CommHandle *k);
// One send and one receive per rank with a nonzero part, in one group.
void comm_nccl_all_to_all(Comm *c, const void *send, const size_t *sendcounts, void *recv, const size_t *recvcounts,
                          DType t, CommHandle *k);
// NCCL has no tags: sends and receives between two ranks match in issue order.
void comm_nccl_send(Comm *c, const void *buf, size_t count, DType t, int peer, CommHandle *k);
void comm_nccl_recv(Comm *c, void *buf, size_t count, DType t, int peer, CommHandle *k);
// A send and a receive with `peer` in one NCCL group: neither waits for the
// other (ks and kr get their own events).
void comm_nccl_send_recv(Comm *c, const void *send, int to, void *recv, int from, size_t count, DType t,
                         CommHandle *ks, CommHandle *kr);

// The communicator's stream waits for e (comm_after_event).
void comm_nccl_after_event(Comm *c, Event *e);
// Completion of a handle with k->event set: the compute and copy streams wait
// for the event (on the GPU; the host goes on); its events are kept for
// comm_nccl_settle.
void comm_nccl_wait(Comm *c, CommHandle *k);
// Adds the kept events' times to c->stats (GPU has passed them: after a sync).
void comm_nccl_settle(Comm *c);
// 1 when the transfer has finished (then as comm_nccl_wait), 0 otherwise.
int comm_nccl_test(Comm *c, CommHandle *k);
#endif
