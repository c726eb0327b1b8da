// parallel3d.h: what the files of stage 07 share: the stage's context
// (3d_parallel.c is the strategy, grid_flags.c its flags and refusals,
// grid_report.c its end-of-run figures).
#pragma once
#include "grid.h"
#include "grid_math.h"
#include "pipeline.h"
#include "trainer.h"

typedef struct Stage {
    int tp, pp;                  // --tp, --pp
    int cp;                      // --cp: each sequence split over cp ranks (DeepSpeed-Ulysses)
    const char *cp_mode;         // --cp-mode
    const char *schedule_name;   // --schedule
    int virtual_stages;          // --virtual-stages: chunks per stage of --schedule interleaved
    int partition_activations;   // --partition-activations
    int sequence_parallel;       // --sequence-parallel
    int print_schedule;          // --print-schedule: draw the schedule's table and exit (schedule.c)
    Schedule schedule;
    ScheduleTable table;         // zb-h1: every stage's operations for --grad-accum micro-batches (else empty)
    Grid grid;
    Pipeline pipe;
    Buf reduced;                 // this rank's shard of the gradient summed over the replicas (ZeRO-1)
    // The rank's states hold [wte copy | its stage's units]: the last stage
    // of a pipeline keeps a copy of wte (wte_copy elements) for the tied head.
    size_t wte_copy;
    // Ranges of the states the global gradient norm counts on this rank:
    // replicated tensors on tp rank 0 only, the wte copy never.
    Range *counted;
    int ncounted;
    struct RankFigures *figures;  // every rank's end-of-run figures, gathered on rank 0 (grid_report.c)
} Stage;

// 3d_parallel.c: unit u's bf16 params in this rank's states (unit 0 on the
// last stage: its wte copy), and its fp32 gradients added to its bf16 grads
// (written by the step's first micro-batch).
const bf16 *part_unit_params(Trainer *t, int u);
void part_add_grads(Trainer *t, int u, const float *g, GradTurn turn);

// grid_flags.c: the stage's flags (Strategy.flags), with their defaults;
// --schedule's name; the activation flags that cannot work on this grid
// (exit 2, one line), once the grid is known.
int grid_flags(void *ctx, FlagSpec *out);
Schedule grid_schedule_of(const char *name);
void grid_check_activation_flags(const Trainer *t, const Stage *z);
// --cp and --cp-mode's refusals that need no grid (exit 2, one line).
void grid_check_cp_flags(const Trainer *t, const Stage *z, const TrainConfig *cfg);

// grid_report.c
GridShape grid_shape(const Trainer *t, const Stage *z);
// The rank's bytes per step by the grid's formulas, as the report's
// communication formula (t->comm_formula_*); in setup.
void grid_comm_formula(Trainer *t);
// The stage's rows (Strategy.report): per pipeline stage, states,
// activations, micro-batches in flight, bytes by group beside their
// formulas, the bubble; the record's "grid" member.
void grid_report(Trainer *t, FILE *json);
