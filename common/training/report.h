// report.h: what a run prints. A line per step (rank 0), the end-of-run table
// (measured memory per rank by tier and category beside the formula,
// throughput, FLOP/s, communication beside the formula) and one JSON object
// per run appended to --json FILE.
#pragma once
#include <stddef.h>
#include "mem.h"

struct Trainer;

typedef struct Report {
    double *loss, *step_ms, *lr, *grad_norm;  // one per step of this run
    double *comm_bytes;                       // ring bytes per rank counted in each step
    long n, cap;
    long first_step;                          // step number of loss[0] (after a resume)
    double val_loss;                          // last validation loss, NAN if none
    long val_step;
    double comm_wait_us, comm_inflight_us;    // summed over the steps
    MemCtx after_step;                        // memory right after the last optimizer step (steady state)
} Report;

void report_init(struct Trainer *t);
void report_free(struct Trainer *t);
// Record step results (rank 0 prints the step line unless --quiet) and
// snapshot the memory accounting: the table's "current" is this snapshot.
void report_step(struct Trainer *t, double loss, double ms, double lr, double grad_norm,
                 double comm_bytes);
void report_eval(struct Trainer *t, double val_loss);
// Collective: reduces memory over ranks; rank 0 prints the table and appends JSON.
void report_finish(struct Trainer *t);
