// report_summary.h: what the files of the report share (report.c sums the
// run up; report_print.c prints it; report_json.c records it).
#pragma once
#include <stdio.h>
#include "act_math.h"
#include "report.h"

// Figures of the run, reduced over ranks where they differ, beside what ran.
typedef struct Summary {
    const Report *r;          // each step's figures, the run's taps
    const RunFacts *run;      // what ran: &r->run
    double cur[TIER_COUNT][CAT_COUNT], peak[TIER_COUNT][CAT_COUNT];  // max over ranks
    double tier_peak[TIER_COUNT];
    StateBytes formula;       // max over ranks, as the measured figures
    double buffer_formula[CAT_COUNT];  // the stage's own buffers' closed forms (RunFacts), max over ranks
    double state_params;      // Ψ of the states' partition, max over ranks
    ActFormula acts;          // activations saved and the recompute working set by the closed form, max over ranks
    double step_ms_median, tokens_per_s, flops_per_token, gflops_per_rank;
    double hw_flops_per_token, hw_gflops_per_rank;  // with the recomputation's FLOPs
    double comm_bytes_step, comm_formula_bytes, eval_comm_bytes;
    const char *comm_formula_text;
    double op_bytes_step[OP_COUNT];  // mean per step, max over ranks
    double xfer_step[XFER_COUNT], xfer_formula[XFER_COUNT];  // mean over ranks of each rank's median step
    double act_down, act_up, act_formula;  // activation checkpoints per step (max over ranks of the median), formula each way
    StepTimes times;  // mean per step, over steps and ranks
    long skipped_steps, zero_grad_steps;  // fp16, this run: overflowed (no update); every gradient 0
    double zero_grad_scale;  // the loss scale of the last step whose gradients were all 0
    double driver_free, driver_total;
    // the device arena when the device tier reached its peak, on the rank
    // with the largest device peak (arena_rank)
    ArenaStats arena;
    int arena_rank;
    double arena_high_water;  // the arena's high-water mark at the run's end, max over ranks
    // the memory's boundaries beside the formula's: the lowest rank whose
    // steps differ (its check), or every rank's equal (timeline_rank -1,
    // and rank 0's check); the formula's peak, the largest over ranks
    TimelineCheck timeline;
    int timeline_rank;
    double timeline_peak;
    // the arena's blocks at their largest (ArenaStats.peak_allocated) beside
    // the formula's (its arena_peak), the largest over ranks of each, and
    // whether the two are equal on every rank
    double arena_peak_allocated, formula_arena_peak;
    int arena_peak_equal;
    // the arena's high-water mark beside the formula's replay of the step's
    // blocks (StepMemory.high_water): the largest over ranks, equal on every rank?
    double formula_high_water;
    int high_water_equal;
    // rank 0: the last step's boundaries, measured and the formula's, of
    // each rank whose measured ones differ from a lower rank's (a pipeline's
    // stages), for the record's pictures (plot_runs.py's timeline)
    struct TimelinePanel *panels;
    int npanels;
} Summary;

typedef struct TimelinePanel {
    int rank, n, nformula;
    MemBoundary *measured, *formula;
    double peak;  // the formula's, inside a phase too
    MemPhase peak_phase;
    double peak_bytes[CAT_COUNT];
} TimelinePanel;

void summary_free_panels(Summary *s);

// report_print.c (rank 0): the memory table, the throughput, communication
// and other work, and the one summary line.
void print_memory_table(const Summary *s);
void print_summary(const Summary *s);
void print_summary_line(const Summary *s);
// report_json.c (rank 0): the run's record, built in memory: json_begin
// writes it up to the stage's own members and returns the stream they go
// on into; json_end closes it and appends it to --json whole or not at all
// (out_file_append_whole), returning nonzero (said in one line) where not.
typedef struct JsonRecord {
    FILE *f;  // open_memstream's, over text
    char *text;
    size_t bytes;
} JsonRecord;
FILE *json_begin(const Summary *s, JsonRecord *rec);
int json_end(const Summary *s, JsonRecord *rec);
