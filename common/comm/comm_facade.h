// comm_facade.h: the facade's machinery that comm.c keeps and the
// collectives of comm_ops.c call: a call's handle and byte accounting, the
// staging of device buffers for MPI, and completion. Internal to common/comm.
#pragma once
#include "comm_backend.h"

// MPI counts are int; ours are size_t (a usage hint where they do not fit)
int as_int(size_t n, const char *op, int rank, const char *which);
// whether `peer` of c sits on another host than this rank
int other_host(const Comm *c, int peer);
// whether c's device buffers go through pinned host memory on the MPI path
int needs_staging(const Comm *c);
// A stage of stage_bytes for handle k: `in_bytes` of `in` at `in_offset` copied
// in; on completion its first `back_bytes` go to `back`. Returns the stage.
char *stage_buffers(Comm *c, CommHandle *k, size_t stage_bytes, const void *in, size_t in_offset, size_t in_bytes,
                    void *back, size_t back_bytes);
// The handle a call works with (the caller's h, or `local` when blocking),
// counted: `moved` bytes, `cross` of them leaving the host (begin_op_moving);
// a ring collective's (begin_op); a send's or a receive's (begin_p2p).
CommHandle *begin_op_moving(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload, double moved,
                            double cross);
CommHandle *begin_op(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload);
CommHandle *begin_p2p(Comm *c, CommHandle *h, CommHandle *local, CommOp op, size_t payload, int peer);
// A blocking MPI call returned: unstage, time it as exposed communication.
void finish_blocking(Comm *c, CommHandle *k);
#ifdef WB_HAVE_NCCL
// A blocking call on NCCL: the streams wait for it on the GPU, the host goes on.
void finish_on_gpu(Comm *c, CommHandle *k);
#endif
