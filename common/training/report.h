// report.h: what a run prints. A line per step (rank 0), the end-of-run table
// (measured memory per rank by tier and category beside the formula,
// throughput, FLOP/s, communication beside the formula) and one JSON object
// per run appended to --json FILE.
#pragma once
#include <stddef.h>
#include "mem.h"
#include "comm.h"
#include "mem_math.h"
#include "step_meter.h"

struct Trainer;

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

void report_init(struct Trainer *t);
// A memory category as this run's report names it: mem_category_name's, with
// the 16-bit params and grads named for --precision ("params_fp16" in fp16).
const char *report_category_name(const struct Trainer *t, MemCategory c);
void report_free(struct Trainer *t);
// Records a step, what it did and what its meter measured (rank 0 prints
// the step line unless --quiet), and snapshots the memory accounting: the
// table's "current" is this snapshot.
void report_step(struct Trainer *t, const StepOutcome *o, const StepMeasure *x);
void report_eval(struct Trainer *t, double val_loss);
// Collective: reduces memory over ranks; rank 0 prints the table and appends
// JSON. Returns 0, or (rank 0) nonzero after one line saying the record
// could not be written.
int report_finish(struct Trainer *t);
