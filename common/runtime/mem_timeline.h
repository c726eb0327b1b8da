// mem_timeline.h: the memory timeline (--memory-timeline FILE): every
// allocation and release on the device and pinned tiers, with the phase of
// the step it happened in, recorded for the current step (before step 1,
// the set-up) and written as Chrome-trace JSON that Perfetto opens:
//   - a counter track per tier ("device bytes", "pinned bytes"), one series
//     per category, which the viewer stacks: the step's memory over time;
//   - the phases as spans on a row of their own ("forward unit 3",
//     "backward unit 2", "optimizer", with the micro-batch);
//   - each allocation and release as an instant event on another row, with
//     its category, bytes, arena offset, name and phase.
// A rank that runs out of memory writes what it recorded up to the failure
// (mem.c), the snapshot PyTorch users take by hand.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "mem.h"

#define MEM_EVENT_NAME_BYTES 48

typedef struct MemEvent {
    double t_us;
    MemPhase phase;
    int tier, cat;
    long long delta;  // + bytes allocated, - bytes released
    size_t offset;    // in the device's arena; 0 on the pinned tier
    char name[MEM_EVENT_NAME_BYTES];
} MemEvent;

typedef struct MemPhaseSpan {
    double t0_us, t1_us;
    MemPhase phase;
} MemPhaseSpan;

typedef struct MemTimeline {
    double origin_us;   // the run's clock origin, shared by the ranks (trace.h)
    long step;          // the step recorded (0: the set-up before step 1)
    double t0_us;       // when the recording began
    size_t start[TIER_COUNT][CAT_COUNT];  // the bytes then
    MemEvent *ev;
    size_t n, cap;
    MemPhaseSpan *span;
    size_t nspan, capspan;
    double span_t0_us;  // the open span: since when, and which phase
    MemPhase span_phase;
    const char *oom_path;  // where a rank that runs out of memory writes its timeline (--memory-timeline)
} MemTimeline;

// Starts recording `step` afresh (what an earlier step recorded goes): the
// bytes of every tier and category now, the phase now.
void mem_timeline_begin(MemTimeline *tl, const MemCtx *m, long step);
// An allocation (+bytes) or release (-bytes) on tier t (mem.c calls it for the device and pinned tiers).
void mem_timeline_note(MemTimeline *tl, MemPhase phase, MemTier t, MemCategory c, long long delta, size_t offset,
                       const char *name);
// The phase changed: the open span closes, another opens.
void mem_timeline_phase(MemTimeline *tl, MemPhase now);
void mem_timeline_free(MemTimeline *tl);
// This rank's events as Chrome-trace event objects, comma-separated, no
// brackets (pid = rank): appended to `out`.
void mem_timeline_events(const MemTimeline *tl, int rank, FILE *out);
// Collective over MPI_COMM_WORLD: rank 0 writes every rank's events to
// `path` (written beside and renamed); also hands rank 0's text of all
// events to *all_events (malloc'd; NULL elsewhere) when all_events is not
// NULL, for the --trace file. 0, or (rank 0) nonzero after one line.
int mem_timeline_write(const MemTimeline *tl, const char *path, char **all_events);
// This rank alone writes what it recorded to `path` (after running out of
// memory, when the other ranks cannot be asked); 0 on success.
int mem_timeline_write_local(const MemTimeline *tl, const char *path, int rank);
