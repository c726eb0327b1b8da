// pipe_schedule.h: a pipeline schedule as a table (issue 48's first part): for
// each of P stages the order of its operations, forward F i and backward
// B i of micro-batch i, built by one function per schedule; checked, when it
// is built, by running it on a model of the pipeline (a stage runs its next
// operation once what it needs has arrived: F i on stage s after F i on
// s - 1, B i after F i here and B i on s + 1), so that a table that would
// deadlock or leave a micro-batch unfinished is refused then, not when a
// run hangs; and drawn as text, one row per stage, on a clock where F takes
// one slot and B two (a backward is about twice a forward's FLOPs).
// 07's pipeline.c runs AFAB and 1F1B as the lab's functions write them;
// test_pipe_schedule holds their order to these tables, from a run's trace.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "step_memory.h"  // PipeSchedule

typedef enum { SCHED_F, SCHED_B } SchedKind;

typedef struct SchedOp {
    SchedKind kind;
    int micro;
} SchedOp;

typedef struct ScheduleTable {
    PipeSchedule schedule;
    int stages, micro_batches;  // P, m
    SchedOp *ops;               // stage s's operations at ops[s * 2m], 2m of them
    int *count;                 // per stage: how many it has
} ScheduleTable;

// The table of `schedule` for P stages and m micro-batches; refuses (one
// line, exit 2) P or m below 1, or a table schedule_check rejects.
void schedule_build(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches);
// The same without the check (a caller that makes its own tables: the tests).
void schedule_alloc(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches);
void schedule_free(ScheduleTable *t);
// 0 when every stage runs F i and B i of every micro-batch once, B i after
// F i, and the stages together finish; else 1 and the first fault in err
// ("stage 2 waits for B 3 from stage 3, which waits for ...: a deadlock").
int schedule_check(const ScheduleTable *t, char *err, size_t n);
// The most micro-batches stage s holds at once (forwarded, not yet backward).
int schedule_in_flight(const ScheduleTable *t, int s);
// The chart's bubble: idle slots over all slots, every stage from the first
// start to the last end (F 1 slot, B 2); the table must pass schedule_check.
double schedule_bubble(const ScheduleTable *t);
// The chart: a header line, one row per stage, and a line with each
// stage's micro-batches in flight and the bubble beside its formula.
void schedule_print(const ScheduleTable *t, FILE *f);
