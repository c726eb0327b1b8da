// pipe_schedule.h: a pipeline schedule as a table (issue 48): for each of P
// stages the order of its operations on micro-batch i: forward F i,
// backward B i, and under zero bubble the backward split in two, B i (the
// input's gradient, which the previous stage waits for) and W i (the
// weights', which nobody waits for); under the interleaved schedule each on
// one of the stage's v chunks. Built by one function per schedule; checked,
// when it is built, by running it on a model of the pipeline (a stage runs
// its next operation once what it needs has arrived), so that a table that
// would deadlock or leave a micro-batch unfinished is refused then, not when
// a run hangs; and drawn as text, one row per stage.
//
// The chart's clock: one slot is a forward through one chunk of a stage's
// layers (the whole stage, v = 1); a backward takes two (about twice a
// forward's FLOPs), and split, B and W one each (ZB-H1's F = B = W costs).
//
// Interleaved (Narayanan et al. 2021, Megatron-LM's virtual pipeline): the
// L layers in P·v chunks, chunk c of stage s the (c·P + s)-th, so a
// micro-batch passes every stage v times; each stage warms up with
// 2(P - s - 1) + (v - 1)P chunk forwards, then runs one forward one
// backward, the chunks in turn by groups of P micro-batches (m a multiple of
// P). Zero bubble H1 (Qi et al. 2024): 1F1B's warm-up and its micro-batches
// in flight (forwarded, not yet through B), each B as soon as it can run,
// each W in a slot that would otherwise be idle; a micro-batch between its
// B and its W keeps what W reads.
//
// 07's pipeline.c runs AFAB and 1F1B as the lab's functions write them,
// interleaved and ZB-H1 from their tables; test_pipe_schedule holds every
// run's order to these tables, from its trace.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "step_memory.h"  // PipeSchedule

// (SchedKind and SchedOp, an operation of the table: step_memory.h)

typedef struct ScheduleTable {
    PipeSchedule schedule;
    int stages, micro_batches;  // P, m
    int chunks;                 // v: chunks per stage (1 unless interleaved)
    int per_stage;              // room for a stage's operations: 3·m·v
    SchedOp *ops;               // stage s's operations at ops[s * per_stage], count[s] of them
    int *count;
} ScheduleTable;

// The name of a schedule ("afab", "1f1b", "interleaved", "zb-h1"), and the
// schedule of a name (-1: none).
const char *schedule_name(PipeSchedule s);
int schedule_of(const char *name);
// The table of `schedule` for P stages, m micro-batches and v chunks per
// stage (1 but for interleaved); refuses (one line, exit 2) P, m or v below
// 1, interleaved with v < 2 or m not a multiple of P, zero bubble at P = 1,
// or a table schedule_check rejects.
void schedule_build(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches, int chunks);
// The same without the schedule's own rules or the check (a caller that
// makes its own tables: the tests).
void schedule_alloc(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches, int chunks);
void schedule_free(ScheduleTable *t);
// Operation k of stage s.
static inline SchedOp schedule_op(const ScheduleTable *t, int s, int k) {
    return t->ops[(size_t)s * (size_t)t->per_stage + (size_t)k];
}
// 0 when every stage runs each of its operations on every micro-batch and
// chunk once, B after F and W after B, and the stages together finish; else
// 1 and the first fault in err ("stage 2 waits at B 3 for stage 3, which
// waits at ...: a deadlock").
int schedule_check(const ScheduleTable *t, char *err, size_t n);
// The most (micro-batch, chunk) pairs stage s holds at once: forwarded and
// not yet through B (1F1B's activations); and under zero bubble, the most
// whose B has run and W not yet (each keeps what its W reads: the linears'
// inputs and output gradients).
int schedule_in_flight(const ScheduleTable *t, int s);
// The most micro-batches stage s holds between a micro-batch's first
// forward and its last backward (its chunk 0's): the slots it needs; under
// interleaving fewer than its chunk micro-batches in flight.
int schedule_slots(const ScheduleTable *t, int s);
int schedule_pending_w(const ScheduleTable *t, int s);
// The chart's bubble: idle slots over all slots, every stage from the first
// start to the last end; the table must pass schedule_check.
double schedule_bubble(const ScheduleTable *t);
// The bubble's closed form on the same clock: (P-1)/(m+P-1) for AFAB and
// 1F1B, (P-1)/(v·m+P-1) interleaved, (P-1)/(3m+P-1) for ZB-H1 (its idle
// time (P-1)(T_F + T_B - T_W), a third of 1F1B's (P-1)(T_F + T_B + T_W)).
double schedule_bubble_formula(const ScheduleTable *t);
// The chart: a header line, one row per stage, and a line with each
// stage's micro-batches in flight and the bubble beside its formula.
void schedule_print(const ScheduleTable *t, FILE *f);
