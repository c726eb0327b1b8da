// device.h: the device interface, chosen at run time (--device auto|cpu|cuda).
// Memory is allocated by tier and category through buf_alloc, so every byte is
// accounted (mem.h). Work is ordered on streams with events, so overlap is
// expressed once: on the cpu device streams execute in issue order on the
// calling thread; on cuda they are real streams.
#pragma once
#include <stddef.h>
#include "bf16.h"
#include "mem.h"
#include "trace.h"

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } DeviceKind;

typedef enum { STREAM_COMPUTE = 0, STREAM_COMM = 1, STREAM_COPY = 2, STREAM_COUNT } StreamId;

// An event marks a point in a stream. On the cpu device it is already complete
// when recorded; `t_us` is the host time of the record.
typedef struct Event {
    void *handle;  // backend object (cudaEvent_t), NULL on cpu
    double t_us;
} Event;

#define BUF_NAME_BYTES 40

typedef struct Buf {
    void *ptr;
    size_t bytes;
    MemTier tier;
    MemCategory cat;
    char what[BUF_NAME_BYTES];  // its name (buf_alloc's), for the memory timeline's release
} Buf;

// A span of queued device work for the trace (forward, backward, a copy).
// On the cpu device work runs as it is issued, so a span is the host's clock
// at its begin and end. On cuda the host only enqueues: a span is a pair of
// timing events on its stream, put on the host's clock after the step's sync
// (dev_spans_settle) from their device time since an anchor event recorded
// while the device was idle. So "compute", "exposed comm" and "overlapped"
// mean device time on both.
typedef struct DevSpan {
    void *start;   // cuda: the timing event recorded at the begin; NULL on cpu
    double t0_us;  // cpu: host time at the begin
    StreamId stream;
} DevSpan;

struct KernelOps;
struct Device;

typedef struct DeviceOps {
    // host and pinned memory (the device tier is the region's, below)
    void *(*alloc)(struct Device *d, MemTier tier, size_t bytes);  // NULL on failure
    void (*free)(struct Device *d, MemTier tier, void *ptr, size_t bytes);
    // The device tier's region: how large it would be (the budget, or what
    // the machine can give), reserved once (NULL when it cannot be had) and
    // given back at the end; reserved() runs once it is there (cuda: the
    // cuBLASLt workspace, the first block).
    size_t (*region_bytes)(struct Device *d);
    void *(*reserve)(struct Device *d, size_t bytes);
    void (*unreserve)(struct Device *d, void *region, size_t bytes);
    void (*reserved)(struct Device *d);
    // A block of the region (`bytes` asked for at ptr) the arena hands out,
    // or takes back: cuda keeps its use in stream order (a block taken back
    // while another stream may still read it is reused only after that
    // stream's work, with no host wait).
    void (*block_out)(struct Device *d, void *ptr, size_t bytes);
    void (*block_back)(struct Device *d, void *ptr, size_t bytes);
    // copies between any two tiers (host, pinned, device), ordered on `stream`
    void (*copy)(struct Device *d, void *dst, const void *src, size_t bytes, StreamId stream);
    // `rows` pieces of `width` bytes, src_pitch apart in src to dst_pitch
    // apart in dst, within one tier, ordered on `stream` (a tensor's columns
    // or its blocks of rows regrouped: Ulysses' all-to-all packing)
    void (*copy_2d)(struct Device *d, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                    size_t rows, StreamId stream);
    void (*memset0)(struct Device *d, void *dst, size_t bytes, StreamId stream);
    void (*event_record)(struct Device *d, Event *e, StreamId stream);
    void (*stream_wait_event)(struct Device *d, StreamId stream, Event *e);
    void (*event_sync)(struct Device *d, Event *e);
    void (*stream_sync)(struct Device *d, StreamId stream);
    void (*event_create)(struct Device *d, Event *e);
    void (*event_destroy)(struct Device *d, Event *e);
    // bytes free and total as the driver sees them; 0,0 where not meaningful
    void (*mem_get_info)(struct Device *d, size_t *free_bytes, size_t *total_bytes);
    void (*span_begin)(struct Device *d, DevSpan *sp);
    void (*span_end)(struct Device *d, DevSpan *sp, int tid, const char *what, double bytes);
    void (*spans_settle)(struct Device *d);
    void (*destroy)(struct Device *d);
    // fn(arg) once `stream` has done the work queued on it before: on cpu at
    // once (that work is done), on cuda on a thread of the CUDA runtime. fn
    // must not call the device or MPI: it hands news to a host thread.
    void (*host_fn)(struct Device *d, StreamId stream, void (*fn)(void *arg), void *arg);
} DeviceOps;

typedef struct Device {
    DeviceKind kind;
    char name[256];          // "cpu (OpenBLAS SkylakeX (how it was chosen), 2 OpenMP threads)" or the GPU's name
    int threads;             // host threads this rank uses for kernels
    int act_bytes;           // bytes per activation element: 4 (fp32) on cpu, 2 (bf16) on cuda
    HalfFormat half;         // what the 16-bit params and grads hold (--precision)
    int half_path;           // cpu: the HalfRowsPath of the conversions (half_rows.h)
    double peak_flops;       // bf16/fp32 peak of the device for MFU, 0 = unknown
    const char *peak_source; // where peak_flops comes from ("sgemm roof measured", "H100 SXM datasheet"), or "peak unknown"
    unsigned char uuid[16];  // the GPU's UUID (cuda); all zero on cpu
    int sharers;             // ranks on this node driving this GPU (1 unless they share it)
    MemCtx mem;              // the device tier's arena in it: its blocks' offsets in `region`
    void *region;            // the device tier's memory, reserved at the first device allocation
    size_t region_bytes;
    int local_size;          // ranks on this node (the cpu device's region without a budget)
    Trace *trace;            // may be NULL
    const DeviceOps *ops;
    const struct KernelOps *k;
    void *impl;              // backend state
    Buf scratch;             // kernel scratch (workspace), grown by device_scratch
} Device;

typedef struct DeviceOptions {
    const char *kind;   // "auto", "cpu", "cuda"
    double hbm_gb;      // device budget in GB (1e9 bytes); 0 = no budget on cpu, card size on cuda
    int threads;        // 0 = cores / ranks on this node
    HalfFormat half;    // --precision: bf16 (0) or fp16
    int local_rank;     // rank within the node (picks the GPU)
    int local_size;     // ranks on this node
    Trace *trace;
} DeviceOptions;

// Fills *d or fails with a usage error ("--device cuda: no GPU visible; ...").
void device_init(Device *d, const DeviceOptions *opt);
void device_destroy(Device *d);
// Is a CUDA device usable from this binary on this machine? (built with nvcc and a GPU present)
int device_cuda_available(void);
// The cpu device's OpenMP threads per rank when `local_size` ranks share
// this node's cores (its default without --threads).
int device_cpu_threads(int local_size);
// `sharers` ranks drive this one GPU (the MPI path): each gets 1/sharers of
// its peak for MFU and, unless --hbm-gb was given, of its memory budget.
void device_share(Device *d, int sharers, int budget_given);

// The device tier's region, reserved once (a no-op after): its budget, or
// what the machine has (device_share first, on a GPU several ranks share);
// the first device allocation reserves it where nothing did.
void device_reserve(Device *d);
// Tracked allocation. `what` names it in an out-of-memory error. A device
// buffer is a block of the device's region (the arena, mem.h), reserved at
// the first one.
Buf buf_alloc(Device *d, MemTier tier, MemCategory cat, size_t bytes, const char *what);
void buf_free(Device *d, Buf *b);  // no-op on an empty Buf; leaves it empty
// The address of `count` elements of `elem_bytes` each, from element `first`
// of b, which they must lie inside: a part of a buffer (this rank's slice of
// a gathered unit). `what` names the part in the error.
void *buf_part(const Buf *b, size_t first, size_t count, size_t elem_bytes, const char *what);
// Kernel scratch of at least `bytes` (category workspace, tier device), grown as needed.
void *device_scratch(Device *d, size_t bytes);

static inline void dev_copy(Device *d, void *dst, const void *src, size_t n, StreamId s) { d->ops->copy(d, dst, src, n, s); }
static inline void dev_copy_2d(Device *d, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t width, size_t rows, StreamId s) {
    d->ops->copy_2d(d, dst, dst_pitch, src, src_pitch, width, rows, s);
}
static inline void dev_memset0(Device *d, void *dst, size_t n, StreamId s) { d->ops->memset0(d, dst, n, s); }
static inline void dev_sync(Device *d, StreamId s) { d->ops->stream_sync(d, s); }
static inline void dev_host_fn(Device *d, StreamId s, void (*fn)(void *arg), void *arg) {
    d->ops->host_fn(d, s, fn, arg);
}

// Device work between these two goes on the trace's row `tid` as `what`.
static inline DevSpan dev_span_begin(Device *d, StreamId s) {
    DevSpan sp = {NULL, 0, s};
    d->ops->span_begin(d, &sp);
    return sp;
}
static inline void dev_span_end(Device *d, DevSpan *sp, int tid, const char *what, double bytes) {
    d->ops->span_end(d, sp, tid, what, bytes);
}
// Once the compute stream has synced (a step's end): the spans ended since
// the last call go onto the trace, and the device's clock is anchored to
// the host's again (cuda; nothing to do on cpu).
static inline void dev_spans_settle(Device *d) { d->ops->spans_settle(d); }
