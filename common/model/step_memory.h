// step_memory.h: the formula's timeline of one training step's device
// memory: each category's bytes at every boundary of the step's phases (the
// forward and the backward of each unit for each micro-batch, a block's
// recompute, the optimizer step), and the step's peak, the largest total at
// any moment, inside a phase too. It is built from the closed forms (what
// each unit saves and its working set: act_math.c; each unit's parameters:
// the layout; the units zero3 keeps gathered: buffer_math.c's windows; the
// stage's buffers that live through the step) and from the order a stage
// allocates and releases them in, restated here apart from the allocation
// code (gpt_held.c, param_shard.c, pipeline.c). The trainer holds every
// step's measured boundaries (mem.h's MemBoundary) to it, byte for byte, and
// counts its peak before step 1; memory_math --timeline prints it.
#pragma once
#include "gpt.h"
#include "mem.h"
#include "mem_math.h"

typedef enum {
    STEP_WHOLE,     // stages 01-03, 05: every unit, one micro-batch at a time, parameters whole
    STEP_GATHERED,  // 04, 06: the same, each unit's parameters gathered before use (--prefetch)
    STEP_PIPELINE,  // 07: the rank's units of a pipeline stage, micro-batches in flight by the schedule
} StepShape;

// (AFAB and 1F1B as pipeline.c's functions run them; interleaved and ZB-H1
// from their tables, common/training/pipe_schedule.h)
typedef enum { PIPE_AFAB, PIPE_1F1B, PIPE_INTERLEAVED, PIPE_ZB_H1 } PipeSchedule;

// An operation of a pipeline stage's schedule (pipe_schedule.h's tables):
// a forward F, a backward B (under zero bubble the input's gradient alone)
// or zero bubble's W (the weights'), of a micro-batch on one of the stage's chunks.
typedef enum { SCHED_F, SCHED_B, SCHED_W } SchedKind;

typedef struct SchedOp {
    SchedKind kind;
    int micro;
    int chunk;  // the stage's chunk (0 unless interleaved)
} SchedOp;

#define STEP_MAX_FIXED 32  // blocks living through a step: the states, the scratch, a stage's buffers

typedef struct StepMemorySpec {
    const GPTLayout *layout;  // the rank's part of the model (tp)
    GPTPlan plan;             // its units, slots, recompute, contiguous buffers
    int act_bytes;            // 4 on the cpu device, 2 on cuda
    int micro_batches;        // the step's (--grad-accum)
    StepShape shape;
    // what lives through the step, block by block: the states, the stage's buffers, the scratch
    struct {
        MemCategory cat;
        double bytes;
    } fixed[STEP_MAX_FIXED];
    int nfixed;
    // STEP_GATHERED: units gathered ahead, and what a unit gathered holds by pass ([1]: for a backward)
    int prefetch;
    double gathered[2][GPT_MAX_UNITS];
    // STEP_PIPELINE: the schedule, the stages and this rank's
    PipeSchedule schedule;
    int stages, stage;
    const SchedOp *ops;  // PIPE_ZB_H1: this stage's row of the table, nops operations (its W slots: plan.w_slots)
    int nops;
    const char *not_modelled;  // why this run's step is not modelled (ZeRO++'s buffers), or NULL
} StepMemorySpec;

typedef struct StepMemory {
    MemBoundary *b;  // the phase, and the device's bytes by category as it begins
    int n, cap;
    double peak;     // the largest total at any moment of the step
    MemPhase peak_phase;
    double peak_bytes[CAT_COUNT];  // by category at that moment
    double cat_peak[CAT_COUNT];    // each category's own largest at any moment (a pipeline stage's activations)
    // The blocks' largest total at any moment, each rounded up as the arena
    // places it (arena.h: ARENA_ALIGN's pages, the emulator's guard page):
    // what the region must hold when no free bytes are left in holes.
    double arena_peak;
    // Those blocks placed as the arena places them (arena.h: best fit,
    // split, coalesce), the step's pieces allocated and released in the
    // order the trainers do, from an empty region with the blocks that live
    // through the step first: the end of the highest block, the region a
    // run needs, holes between blocks included (fragmentation).
    double high_water;
} StepMemory;

// One block of `bytes` under c that lives through the step (none for 0).
void step_memory_fixed(StepMemorySpec *s, MemCategory c, double bytes);

// The parts every stage has, into s (zeroed first): the model states by
// the stage's formula (with --grad-accum-dtype fp32's accumulator), what
// the plan's activations keep that lives through the step (all of them with
// contiguous buffers; else the temporaries and a partitioned checkpoint
// store), the backward's scratch, the fp32 unit gradients where they are
// contiguous, the kernels' scratch and what the device held before.
void step_memory_base(StepMemorySpec *s, StageId formula, const GPTLayout *l, const GPTPlan *p, int act_bytes,
                      size_t state_params, int dp_ranks, int grad_accum_fp32, int micro_batches, double kernel_scratch,
                      double held);
// A stage's own buffers and step at the defaults of its flags (memory_math,
// which runs no stage): zero1's and 3d_parallel's reduced shard, zero2's
// buckets, zero3's gathers at --prefetch's default, a pipeline of one stage.
void step_memory_stage_defaults(StepMemorySpec *s, StageId formula, const Partition *part);
// zero2's two gradient buckets at --bucket-mb (0: the default), each sent
// whole and received in part: four blocks living through the step
// (zero_bucket_bytes in all)
void step_memory_buckets(StepMemorySpec *s, double bucket_mb, const Partition *part);
// zero3's step: each unit's bf16 parameters gathered by --prefetch's
// windows (forward and backward alike), its buckets living through the step
void step_memory_gathered(StepMemorySpec *s, int prefetch, double bucket_mb, const Partition *part);
void step_memory(const StepMemorySpec *s, StepMemory *out);
void step_memory_free(StepMemory *m);
// The first boundary where `measured` (n of them) and the formula's differ
// (in phase or in a category's bytes), or -1 when they are the same; *cat
// gets the category (-1 where the phases differ, or their counts).
int step_memory_first_difference(const StepMemory *f, const MemBoundary *measured, int n, int *cat);
