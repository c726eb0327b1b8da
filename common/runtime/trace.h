// trace.h: a per-rank timeline of spans (compute, communication, copies, I/O)
// written as Chrome-trace JSON that Perfetto and chrome://tracing open.
// pid = rank, tid = row, so overlap between rows is visible. Every span also
// goes to the always-on Timeline, from which the report measures overlap
// (with or without --trace). Spans are recorded by the main thread only.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "timeline.h"

typedef struct TraceSpan {
    const char *name;  // static string (kernel or collective name)
    int tid;           // TRACE_TID_* below
    double t0_us, t1_us;
    double bytes;      // payload of a collective/copy, 0 for compute
} TraceSpan;

// Rows: compute (forward, backward and optimizer kernels; nothing else),
// communication in flight (issue to completion), copies between tiers, file
// I/O, whole steps, the host optimizer (CPU Adam), waiting (the compute
// stream blocked on communication: exposed communication), and the
// activation checkpoints' copies to and from the host (--offload-activations).
enum {
    TRACE_TID_COMPUTE = 0, TRACE_TID_COMM = 1, TRACE_TID_COPY = 2, TRACE_TID_IO = 3, TRACE_TID_STEP = 4,
    TRACE_TID_HOST = 5, TRACE_TID_WAIT = 6, TRACE_TID_ACT_COPY = 7, TRACE_TIDS
};

typedef struct Trace {
    int enabled;
    TraceSpan *spans;
    size_t count, cap;  // spans past max_spans are dropped and counted
    size_t max_spans, dropped;
    double origin_us;   // wall-clock origin shared by all ranks (set at init via MPI barrier)
    Timeline tl;        // every span, enabled or not, until the report has measured it
    char *extra;        // rank 0: more events for the file (the memory timeline's), comma-separated, or NULL
} Trace;

double now_us(void);  // monotonic wall clock in microseconds
// s as a JSON string, quoted, with quotes, backslashes and control bytes
// escaped, and each byte that is not UTF-8 written as U+FFFD
void json_write_string(FILE *f, const char *s);
void trace_init(Trace *t, int enabled, double origin_us);
void trace_span(Trace *t, int tid, const char *name, double t0_us, double t1_us, double bytes);
// Collective over MPI_COMM_WORLD: gathers every rank's spans to rank 0, which
// writes one JSON file. Call on every rank (no-op when disabled).
// Returns 0, or (rank 0) nonzero after printing one line that the file
// could not be written.
int trace_write(Trace *t, const char *path);
void trace_free(Trace *t);
// Rank 0: events (Chrome-trace objects, comma-separated, malloc'd; the
// trace takes them) that trace_write puts in the file beside the spans.
void trace_add_events(Trace *t, char *events);
