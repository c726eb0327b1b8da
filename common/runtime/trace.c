// trace.c: per-rank spans, gathered to rank 0 and written as Chrome-trace JSON
// (the "Trace Event Format": complete events "ph":"X" with ts/dur in us).
#include "trace.h"
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "flags.h"
#include "out_file.h"

extern char *program_invocation_short_name;  // glibc's argv[0] without its folder

_Static_assert(TRACE_TIDS <= TIMELINE_ROWS, "every trace row has a timeline row");

#define TRACE_DEFAULT_MAX_SPANS 1000000
#define TRACE_NAME_BYTES 32

double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

void trace_init(Trace *t, int enabled, double origin_us) {
    memset(t, 0, sizeof *t);
    t->enabled = enabled;
    t->max_spans = TRACE_DEFAULT_MAX_SPANS;
    t->origin_us = origin_us;
}

void trace_span(Trace *t, int tid, const char *name, double t0_us, double t1_us, double bytes) {
    if (!t) return;
    timeline_add(&t->tl, tid, t0_us, t1_us);
    if (!t->enabled) return;
    if (t->count >= t->max_spans) {
        t->dropped++;
        return;
    }
    if (t->count == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        if (cap > t->max_spans) cap = t->max_spans;
        TraceSpan *grown = realloc(t->spans, cap * sizeof *grown);
        CHECK(grown, "trace: growing to %zu spans failed; hint: the host is out of memory", cap);
        t->spans = grown;
        t->cap = cap;
    }
    t->spans[t->count++] = (TraceSpan){name, tid, t0_us, t1_us, bytes};
}

void trace_add_events(Trace *t, char *events) {
    if (!events) return;
    if (!t->enabled) {
        free(events);
        return;
    }
    free(t->extra);
    t->extra = events;
}

void trace_free(Trace *t) {
    timeline_free(&t->tl);
    free(t->extra);
    t->extra = NULL;
    free(t->spans);
    t->spans = NULL;
    t->count = t->cap = 0;
}

// A span as it travels between ranks: names are static strings in the
// sender's address space, so they travel as text.
typedef struct PackedSpan {
    char name[TRACE_NAME_BYTES];
    int32_t tid, pad;
    double t0_us, t1_us, bytes;
} PackedSpan;

typedef struct RankHeader {
    unsigned long long count, dropped;
} RankHeader;

static PackedSpan *pack_spans(const Trace *t) {
    PackedSpan *p = xcalloc(t->count, sizeof *p);
    for (size_t i = 0; i < t->count; i++) {
        const TraceSpan *s = &t->spans[i];
        snprintf(p[i].name, sizeof p[i].name, "%s", s->name ? s->name : "?");
        p[i].tid = s->tid;
        p[i].t0_us = s->t0_us;
        p[i].t1_us = s->t1_us;
        p[i].bytes = s->bytes;
    }
    return p;
}

void json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    while (*s) {
        // JSON text is UTF-8 (RFC 8259): a byte that starts no valid sequence
        // is written as U+FFFD, the replacement character
        const char *end = s + flags_utf8_prefix(s);
        for (; s < end; s++) {
            if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
            else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
            else fputc(*s, f);
        }
        if (*s) fprintf(f, "\\ufffd"), s++;
    }
    fputc('"', f);
}

static void write_metadata(FILE *f, int nranks, const RankHeader *hdr) {
    static const char *const tid_names[TRACE_TIDS] = {"compute", "comm", "copy", "io", "step", "host optimizer",
                                                      "waiting on comm", "activation checkpoints"};
    for (int r = 0; r < nranks; r++) {
        fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d", r, r);
        if (hdr[r].dropped) fprintf(f, " (%llu spans dropped past the cap)", hdr[r].dropped);
        fprintf(f, "\"}},\n");
        for (int tid = 0; tid < TRACE_TIDS; tid++)
            fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                       "\"args\":{\"name\":\"%s\"}},\n", r, tid, tid_names[tid]);
    }
}

static void write_events(FILE *f, const PackedSpan *all, const RankHeader *hdr, int nranks,
                         double origin_us) {
    size_t i = 0;
    int first = 1;
    for (int r = 0; r < nranks; r++) {
        for (unsigned long long k = 0; k < hdr[r].count; k++, i++) {
            const PackedSpan *s = &all[i];
            fprintf(f, "%s{\"name\":", first ? "" : ",\n");
            first = 0;
            json_write_string(f, s->name);
            fprintf(f, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", r, s->tid,
                    s->t0_us - origin_us, s->t1_us - s->t0_us);
            if (s->bytes > 0) fprintf(f, ",\"args\":{\"bytes\":%.0f}", s->bytes);
            fputc('}', f);
        }
    }
}

// A file is written beside PATH (out_file_begin) and renamed, so a reader
// never sees half of it; PATH is a regular file or a new name (checked
// before step 1, and again before the rename). A failed write removes the
// temporary file and says so in one line.
static int write_trace_file(const char *path, const PackedSpan *all, const RankHeader *hdr,
                            int nranks, double origin_us, const char *extra) {
    char tmp[4096];
    FILE *f = out_file_begin(path, tmp, sizeof tmp);
    if (f) {
        fprintf(f, "{\"traceEvents\":[\n");
        write_metadata(f, nranks, hdr);
        write_events(f, all, hdr, nranks, origin_us);
        if (extra && extra[0]) fprintf(f, ",\n%s", extra);
        fprintf(f, "\n]}\n");
    }
    return out_file_finish(f, tmp, path, "--trace", "trace");
}

int trace_write(Trace *t, const char *path) {
    if (!t->enabled) return 0;
    int rank = world_rank(), nranks = world_size();
    RankHeader mine = {t->count, t->dropped};
    RankHeader *hdr = xcalloc(nranks, sizeof *hdr);
    PackedSpan *packed = pack_spans(t);
    PackedSpan *all = packed;
    CHECK(t->count <= 0x7fffffff, "trace: %zu spans on one rank; hint: lower max_spans", t->count);
    if (nranks > 1) {
        mpiCheck(MPI_Gather(&mine, 2, MPI_UNSIGNED_LONG_LONG, hdr, 2, MPI_UNSIGNED_LONG_LONG, 0,
                            MPI_COMM_WORLD));
        // counted in whole records (a contiguous type), so displacements stay
        // far below INT_MAX even with many ranks at the span cap
        MPI_Datatype span_type;
        mpiCheck(MPI_Type_contiguous(sizeof(PackedSpan), MPI_BYTE, &span_type));
        mpiCheck(MPI_Type_commit(&span_type));
        int *counts = xcalloc(nranks, sizeof *counts), *displs = xcalloc(nranks, sizeof *displs);
        size_t total = 0;
        for (int r = 0; r < nranks && rank == 0; r++) {
            CHECK(total + hdr[r].count <= 0x7fffffff, "trace: more than 2^31 spans in all; "
                  "hint: lower max_spans or trace fewer steps");
            counts[r] = (int)hdr[r].count;
            displs[r] = (int)total;
            total += hdr[r].count;
        }
        all = rank == 0 ? xcalloc(total, sizeof *all) : NULL;
        mpiCheck(MPI_Gatherv(packed, (int)t->count, span_type, all, counts, displs, span_type, 0,
                             MPI_COMM_WORLD));
        mpiCheck(MPI_Type_free(&span_type));
        free(counts);
        free(displs);
    } else {
        hdr[0] = mine;
    }
    int failed = rank == 0 && write_trace_file(path, all, hdr, nranks, t->origin_us, t->extra);
    if (all != packed) free(all);
    free(packed);
    free(hdr);
    return failed;
}
