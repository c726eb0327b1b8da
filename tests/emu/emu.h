// emu.h: what the emulator's files share. The emulator runs the project's
// CUDA code on the CPU, on the host thread: device work (kernels, copies,
// GEMMs, collectives) is queued on its stream and runs only when the host
// waits for it, in an order that keeps stream order and event waits but is
// otherwise drawn at random (EMU_SEED), so a missing wait changes results.
//   emu_runtime.cpp  memory (guard pages, canaries), streams, events, the
//                    scheduler of queued work, the runtime API
//   emu_threads.cpp  a kernel's blocks, one at a time, each CUDA thread a
//                    fiber in a drawn order; barriers, shuffles, votes and
//                    wmma's *_sync as checked rendezvous
//   emu_mma.cpp      nvcuda::wmma's (include/mma.h) lane layouts and checks
//   emu_blas.cpp     cuBLASLt's matmul from its column-major definition
//   emu_nccl.cpp     NCCL's collectives on MPI, and the MPI calls that let
//                    queued device work progress while the host blocks
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "cuda_runtime.h"

namespace emu {

// ---- errors ----------------------------------------------------------------------

// Stops the process: "cuda emulator: <what>" on stderr, exit status 70.
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The kernel that runs now, for messages ("kernel k launched at f:l, block (x,y,z) thread (x,y,z)").
std::string running_kernel_text();

// ---- memory ----------------------------------------------------------------------

enum MemKind { MEM_DEVICE, MEM_PINNED };
struct Alloc {
    char *ptr;       // what cudaMalloc returned
    size_t bytes;    // what was asked for
    char *map;       // the mapping: guard page, front fill, data, tail slack, guard page
    size_t map_len;
    MemKind kind;
    bool freed;
    long serial;     // allocation number, for messages
    bool region;     // the workbench's device region (emuReserveRegion): its blocks are opened one by one
};
// the allocation holding address p (freed ones too), or NULL
const Alloc *find_alloc(const void *p);
// checks the canary bytes beside every live allocation (after each device operation)
void check_canaries(const char *after_what);

// ---- queued work ------------------------------------------------------------------

// One operation on a stream. `run` does it (on the host thread, when the
// scheduler picks it). An asynchronous one (a collective) has `start` and
// `test` instead: started when picked, it holds its stream until test says done.
struct Op {
    std::string what;                        // for messages: "kernel k (f:l)", "memcpy 4096 B", ...
    std::function<void()> run;
    std::function<void()> start;
    std::function<bool()> test;
    std::vector<std::shared_ptr<Op>> deps;   // must be done before this starts (event waits, legacy-stream order)
    bool started = false, done = false;
    double enqueue_us = 0, start_us = 0, end_us = 0;  // the device clock (see emu_runtime.cpp)
    double host_start_us = 0;
    long log_index = -1;                     // its line in the op log (EMU_OPLOG), -1 when not logged
};
typedef std::shared_ptr<Op> OpRef;

// Queues op on stream s (NULL: the legacy default stream).
OpRef enqueue(cudaStream_t s, OpRef op);
// Runs queued work until every operation queued so far has at least started
// (collectives may still be in flight): what the GPU would do while the host
// blocks in MPI.
void flush_started();
// One step of the device's queued work (starts an operation that may start,
// or completes a collective in flight); false when nothing could move.
bool progress_once();
// The runtime's lock: every API entry holds it.
struct Lock {
    Lock();
    ~Lock();
};
double now_us();
int world_rank();  // from the launcher's environment (0 without one)

// ---- counters ---------------------------------------------------------------------

// Runtime calls by name, written to $EMU_STATS (a "%r" in it becomes the rank) at exit.
void count_call(const char *name);

// ---- kernels --------------------------------------------------------------------------

// Runs a kernel's grid now (the scheduler calls it): blocks in the drawn order.
void run_grid(const LaunchSite &site, dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body);
// Launch-time checks (limits, dynamic shared memory against the kernel's opt-in)
void check_launch(const LaunchSite &site, dim3 grid, dim3 block, size_t shmem);
// the random source of every shuffled order (EMU_SEED)
uint64_t random_u64();

}  // namespace emu
