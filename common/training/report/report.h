// report.h: what a run prints. A line per step (rank 0), the end-of-run table
// (measured memory per rank by tier and category beside the formula,
// throughput, FLOP/s, communication beside the formula) and one JSON object
// per run appended to --json FILE.
//
// The report reads no Trainer: it is handed the run's facts and taps once,
// before the first step (trainer_report.c fills them from the Trainer), and
// each step's outcome and measure as the step ends.
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "comm.h"
#include "device.h"
#include "gpt.h"
#include "mem.h"
#include "mem_math.h"
#include "settings.h"
#include "step_memory.h"
#include "step_meter.h"
#include "trace.h"

// What ran, on what, in which shape, and by which formulas: this rank's
// facts, fixed before the first step.
typedef struct RunFacts {
    const char *stage, *model;   // the strategy's name ("zero2"), --model
    const char *data_desc;       // one line: what the data is (data.h)
    const char *json;            // --json FILE, or NULL
    const Settings *settings;    // every setting and where it came from, for the record
    const char *grid;            // the process grid ("": data parallel over the world)
    int ranks, dp_ranks;         // the world; its data-parallel replicas (ranks, unless on a grid)
    int batch, seq_len, grad_accum;
    double tokens_per_step;      // dp_ranks x batch x seq_len x grad_accum: the global batch
    int steps, print_every, quiet, progress_us;  // --steps, --print-every, --quiet, --progress-thread
    HalfFormat half;             // --precision
    int loss_scaling, loss_scale_dynamic;  // fp16's loss scaling (loss_scale.h), and whether its scale moves
    int grad_accum_fp32;         // --grad-accum-dtype fp32: the accumulator beside the gradients
    StageId formula;             // the closed form of mem_math the stage is checked against
    MemTier grads_tier;          // where the gradients (and their accumulator) live
    size_t state_params;         // Ψ of this rank's states, which the partition splits over dp_ranks
    size_t model_params;         // Ψ of the whole model
    const GPTLayout *layout;     // of the part this rank holds
    GPTPlan plan;                // the units it computes, its recompute, attention and activations' place
    // The stage's own communication per step and its text, where it has one
    // (comm_formula_text not NULL); else mem_math's closed form of `formula`.
    double comm_formula_bytes;
    const char *comm_formula_text;
    double buffer_formula_bytes[CAT_COUNT];  // the closed form of a stage buffer's own category (zero3's hpZ)
    RunDeviceBytes device_need;  // what the budget check counted before the run
} RunFacts;

// Each step's memory at its phase boundaries beside the formula's
// timeline (step_memory.h): the trainer compares them as every step ends,
// the report says what it found.
typedef struct TimelineCheck {
    const char *not_modelled;  // why the formula's timeline leaves this run out, or NULL
    int boundaries;            // a step's, by the formula
    double formula_peak;       // its largest total, and where
    MemPhase peak_phase;
    double arena_peak;         // its largest with each block rounded up to the arena's pages
    double high_water;         // the region its blocks need where the arena places them
    double act_peak;           // the activations' own largest (the formula's timeline)
    long steps_checked, steps_equal;
    // the first difference: the step, the boundary and its phase, the category (-1: the phases differ)
    long bad_step;
    int bad_boundary, bad_cat, bad_measured_count;
    MemPhase bad_phase, bad_formula_phase;
    double bad_measured, bad_formula;
} TimelineCheck;

// Where the report reads what changes as the run goes: set once, as a
// step's meter has its StepTaps.
typedef struct ReportTaps {
    Comm *world;                     // the reductions over ranks, and its backend
    Device *dev;                     // its memory accounting, name and peak FLOP/s; the driver's free memory
    Trace *trace;                    // its timeline: each step's window by row
    const RecomputeWork *recompute;  // what the recomputation has run (kernel_meter.c)
    const double *loss_scale;        // fp16: the scale of the next step (loss_scale.h)
    const long *skipped_steps;       // fp16: the steps skipped for an overflow since step 0
    const TimelineCheck *timeline;   // the memory's boundaries beside the formula's, as the steps ended
    const StepMemory *step_formula;  // the formula's timeline of a step, whose boundaries the record draws
} ReportTaps;

// What a step did, for its line and its record.
typedef struct StepOutcome {
    double loss;        // the mean over the global batch
    double lr, grad_norm;
    double loss_scale;  // what the step's backward was seeded with (1 in bf16)
    int skipped;        // the step overflowed fp16 and made no update
} StepOutcome;

// Wall-clock time of one step's window by timeline row, in ms: each row's
// union, and its intersection with compute ("hidden": it ran while the
// compute stream was busy). exposed = the compute stream blocked on
// communication. So hidden <= the row's time <= step, and hidden <= compute.
typedef struct StepTimes {
    double step, compute, comm, exposed, comm_hidden;
    double copy, copy_hidden, host, host_hidden, io, io_hidden;
    double act_copy, act_copy_hidden;  // the activation checkpoints' copies (--offload-activations)
} StepTimes;

typedef struct Report {
    RunFacts run;                             // what ran, as report_init was handed it
    ReportTaps taps;
    double *loss, *step_ms, *lr, *grad_norm;  // one per step of this run
    double *loss_scale;                       // fp16: the scale each step's backward was seeded with
    unsigned char *skipped;                   // fp16: 1 where the step overflowed and made no update
    double *comm_bytes;                       // ring bytes per rank counted in each step
    double *xfer[XFER_COUNT];                 // bytes between tiers counted in each step (count_transfer)
    double *act_down, *act_up;                // activation checkpoints to the host and back in each step
    long n, cap;
    long first_step;                          // step number of loss[0] (after a resume)
    double val_loss;                          // last validation loss, NAN if none
    long val_step;
    double op_bytes[OP_COUNT];                // ring bytes of the steps by collective, summed over the steps
    double comm_op_bytes[STEP_METER_MAX_COMMS][OP_COUNT];  // ... by communicator (the world, then the stage's groups)
    double eval_comm_bytes;                   // ring bytes of the evaluations, apart from the steps'
    long evals;
    // A step's window is measured one step later (report_step) or at the end
    // (report_finish): by then whatever ran in it (a collective, the host
    // optimizer of a delayed update) has completed and is on the timeline.
    double window_t0_us, window_t1_us;        // the step not yet measured (t1 = 0: none)
    StepTimes times_sum;                      // summed over the measured steps
    long times_n;
    MemCtx after_step;                        // memory right after the last optimizer step (steady state)
} Report;

// Before the first step, at step `first_step` (0, or where a resume starts):
// rank 0 prints the run's header.
void report_init(Report *r, const RunFacts *run, const ReportTaps *taps, long first_step);
// A memory category as a run in `half` names it: mem_category_name's, with
// the 16-bit params and grads named for --precision ("params_fp16" in fp16).
const char *report_category_name(HalfFormat half, MemCategory c);
void report_free(Report *r);
// Records step `step` (the steps completed, this one included), what it did and what
// its meter measured (rank 0 prints the step line unless --quiet), and
// snapshots the memory accounting: the table's "current" is this snapshot.
void report_step(Report *r, long step, const StepOutcome *o, const StepMeasure *x);
void report_eval(Report *r, long step, double val_loss);
// The stage's own end-of-run rows (Strategy.report): rank 0 prints them
// after the shared tables and, where json is not NULL, writes them as
// members of the run's record. Collective.
typedef void (*ReportStageRows)(void *arg, FILE *json);
// Collective: reduces the figures over ranks; rank 0 prints the tables, the
// stage's rows (every rank calls stage_rows) and the summary line, and
// appends the JSON record. Returns 0, or (rank 0) nonzero after one line
// saying the record could not be written.
int report_finish(Report *r, ReportStageRows stage_rows, void *arg);
