// trace.h: a per-rank timeline of spans (compute, communication, copies, I/O)
// written as Chrome-trace JSON that Perfetto and chrome://tracing open.
// pid = rank, tid = stream, so overlap between streams is visible.
#pragma once
#include <stddef.h>

typedef struct TraceSpan {
    const char *name;  // static string (kernel or collective name)
    int tid;           // TRACE_TID_* below
    double t0_us, t1_us;
    double bytes;      // payload of a collective/copy, 0 for compute
} TraceSpan;

enum { TRACE_TID_COMPUTE = 0, TRACE_TID_COMM = 1, TRACE_TID_COPY = 2, TRACE_TID_IO = 3, TRACE_TID_STEP = 4 };

typedef struct Trace {
    int enabled;
    TraceSpan *spans;
    size_t count, cap;  // spans past max_spans are dropped and counted
    size_t max_spans, dropped;
    double origin_us;   // wall-clock origin shared by all ranks (set at init via MPI barrier)
} Trace;

double now_us(void);  // monotonic wall clock in microseconds
void trace_init(Trace *t, int enabled, double origin_us);
void trace_span(Trace *t, int tid, const char *name, double t0_us, double t1_us, double bytes);
// Collective over MPI_COMM_WORLD: gathers every rank's spans to rank 0, which
// writes one JSON file. Call on every rank (no-op when disabled).
void trace_write(Trace *t, const char *path);
void trace_free(Trace *t);
