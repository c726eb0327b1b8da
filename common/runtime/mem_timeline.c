// mem_timeline.c: the memory timeline (see mem_timeline.h): recorded by
// mem.c, written as Chrome-trace JSON (the "Trace Event Format": counters
// "ph":"C", complete events "ph":"X", instant events "ph":"i"; ts in us).
#include "mem_timeline.h"
#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "out_file.h"
#include "trace.h"

extern char *program_invocation_short_name;

enum { ROW_PHASES = 0, ROW_EVENTS = 1 };  // this file's rows (tid) of each rank

void mem_timeline_begin(MemTimeline *tl, const MemCtx *m, long step) {
    tl->step = step;
    tl->t0_us = now_us();
    memcpy(tl->start, m->current, sizeof tl->start);
    tl->n = tl->nspan = 0;
    tl->span_t0_us = tl->t0_us;
    tl->span_phase = m->phase;
}

void mem_timeline_note(MemTimeline *tl, MemPhase phase, MemTier t, MemCategory c, long long delta, size_t offset,
                       const char *name) {
    if (tl->n == tl->cap) {
        tl->cap = tl->cap ? 2 * tl->cap : 256;
        tl->ev = xrealloc(tl->ev, tl->cap * sizeof *tl->ev);
    }
    MemEvent *e = &tl->ev[tl->n++];
    *e = (MemEvent){now_us(), phase, t, c, delta, offset, ""};
    snprintf(e->name, sizeof e->name, "%s", name ? name : "?");
}

void mem_timeline_phase(MemTimeline *tl, MemPhase now) {
    double t = now_us();
    if (tl->nspan == tl->capspan) {
        tl->capspan = tl->capspan ? 2 * tl->capspan : 128;
        tl->span = xrealloc(tl->span, tl->capspan * sizeof *tl->span);
    }
    tl->span[tl->nspan++] = (MemPhaseSpan){tl->span_t0_us, t, tl->span_phase};
    tl->span_t0_us = t;
    tl->span_phase = now;
}

void mem_timeline_free(MemTimeline *tl) {
    free(tl->ev);
    free(tl->span);
    tl->ev = NULL;
    tl->span = NULL;
    tl->n = tl->cap = tl->nspan = tl->capspan = 0;
}

// ---- Chrome-trace JSON ----

static void phase_json(FILE *out, MemPhase p) {
    fprintf(out, "{\"kind\":\"%s\",\"micro\":%d,\"unit\":%d}", mem_phase_kind_name(p.kind), p.micro, p.unit);
}

// One counter sample per tier that the event changed: every category's bytes.
static void counters(FILE *out, int rank, double ts, MemTier t, const long long bytes[CAT_COUNT], int *first) {
    fprintf(out, "%s{\"name\":\"%s bytes\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.3f,\"args\":{", *first ? "" : ",\n",
            mem_tier_name(t), rank, ts);
    *first = 0;
    for (int c = 0; c < CAT_COUNT; c++) fprintf(out, "%s\"%s\":%lld", c ? "," : "", mem_category_name(c), bytes[c]);
    fprintf(out, "}}");
}

void mem_timeline_events(const MemTimeline *tl, int rank, FILE *out) {
    static const MemTier tiers[2] = {TIER_DEVICE, TIER_PINNED};
    int first = 1;
    fprintf(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n"
                 "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"memory phases "
                 "(step %ld)\"}},\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
                 "\"allocations and releases\"}}",
            rank, rank, rank, ROW_PHASES, tl->step, rank, ROW_EVENTS);
    first = 0;
    long long bytes[TIER_COUNT][CAT_COUNT];
    for (int t = 0; t < TIER_COUNT; t++)
        for (int c = 0; c < CAT_COUNT; c++) bytes[t][c] = (long long)tl->start[t][c];
    for (int k = 0; k < 2; k++) counters(out, rank, tl->t0_us - tl->origin_us, tiers[k], bytes[tiers[k]], &first);
    for (size_t i = 0; i < tl->n; i++) {
        const MemEvent *e = &tl->ev[i];
        double ts = e->t_us - tl->origin_us;
        fprintf(out, ",\n{\"name\":");
        char name[MEM_EVENT_NAME_BYTES + 8];
        snprintf(name, sizeof name, "%s %s", e->delta >= 0 ? "+" : "-", e->name);
        json_write_string(out, name);
        fprintf(out, ",\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"args\":{\"tier\":\"%s\","
                     "\"category\":\"%s\",\"bytes\":%lld,\"offset\":%zu,\"phase\":",
                rank, ROW_EVENTS, ts, mem_tier_name((MemTier)e->tier), mem_category_name((MemCategory)e->cat),
                e->delta, e->offset);
        phase_json(out, e->phase);
        fprintf(out, "}}");
        bytes[e->tier][e->cat] += e->delta;  // then the counter after it
        counters(out, rank, ts, (MemTier)e->tier, bytes[e->tier], &first);
    }
    // the spans closed so far, then the open one up to now
    double now = now_us();
    for (size_t i = 0; i <= tl->nspan; i++) {
        MemPhaseSpan s = i < tl->nspan ? tl->span[i] : (MemPhaseSpan){tl->span_t0_us, now, tl->span_phase};
        if (s.t1_us < tl->t0_us) continue;
        double t0 = s.t0_us < tl->t0_us ? tl->t0_us : s.t0_us;
        char name[96];
        mem_phase_text(s.phase, name, sizeof name);
        fprintf(out, ",\n{\"name\":");
        json_write_string(out, name);
        fprintf(out, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"phase\":", rank,
                ROW_PHASES, t0 - tl->origin_us, s.t1_us - t0);
        phase_json(out, s.phase);
        fprintf(out, "}}");
    }
}

static char *events_text(const MemTimeline *tl, int rank, size_t *len) {
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    CHECK(f, "memory timeline: open_memstream failed; hint: the host is out of memory");
    mem_timeline_events(tl, rank, f);
    CHECK(fclose(f) == 0, "memory timeline: writing to memory failed");
    return text;
}

// The whole file, written beside `path` and renamed (out_file.h).
static int write_file(const char *path, const char *events) {
    char tmp[4096];
    FILE *f = out_file_begin(path, tmp, sizeof tmp);
    if (f) fprintf(f, "{\"traceEvents\":[\n%s\n],\"displayTimeUnit\":\"ms\"}\n", events);
    return out_file_finish(f, tmp, path, "--memory-timeline", "timeline");
}

int mem_timeline_write(const MemTimeline *tl, const char *path, char **all_events) {
    int rank = world_rank(), nranks = world_size();
    size_t len = 0;
    char *mine = events_text(tl, rank, &len);
    CHECK(len < 0x7fffffff, "memory timeline: %zu bytes of events on one rank", len);
    int n = (int)len, *counts = xcalloc((size_t)nranks, sizeof *counts), *at = xcalloc((size_t)nranks, sizeof *at);
    mpiCheck(MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    size_t total = 0;
    for (int r = 0; r < nranks && rank == 0; r++) {
        CHECK(total + (size_t)counts[r] + 2 < 0x7fffffff, "memory timeline: more than 2 GB of events");
        at[r] = (int)total;
        total += (size_t)counts[r];
    }
    char *all = rank == 0 ? xcalloc(total + 1, 1) : NULL;
    mpiCheck(MPI_Gatherv(mine, n, MPI_CHAR, all, counts, at, MPI_CHAR, 0, MPI_COMM_WORLD));
    int failed = 0;
    if (rank == 0) {  // each rank's events, ",\n" between them
        char *joined = xcalloc(total + 2 * (size_t)nranks + 1, 1);
        size_t k = 0;
        for (int r = 0; r < nranks; r++) {
            if (r) memcpy(joined + k, ",\n", 2), k += 2;
            memcpy(joined + k, all + at[r], (size_t)counts[r]);
            k += (size_t)counts[r];
        }
        failed = write_file(path, joined);
        if (all_events) *all_events = joined;
        else free(joined);
    } else if (all_events) {
        *all_events = NULL;
    }
    free(all);
    free(counts);
    free(at);
    free(mine);
    return failed;
}

int mem_timeline_write_local(const MemTimeline *tl, const char *path, int rank) {
    size_t len = 0;
    char *mine = events_text(tl, rank, &len);
    int failed = write_file(path, mine);
    free(mine);
    return failed;
}
