// measure.c: memory_math --measure. Every rank allocates each stage's model
// states with states_alloc (the function the trainers use) on the cpu device,
// in the layout mem_math's table gives the stage, reads what the memory
// tracker counted, and frees them again; rank 0 sets the largest count over
// ranks beside the formula, category by category.
#include <math.h>
#include <mpi.h>
#include <string.h>
#include "check.h"
#include "device.h"
#include "memory_math.h"

#define NSLOTS (TIER_COUNT * CAT_COUNT)
// The stages (and options) whose states memory_math allocates: what each
// keeps is mem_math's table (stage_states), which every trainer's report
// holds its own allocation to.
static const StageId measured_stages[] = {
    STAGE_DP, STAGE_ZERO1, STAGE_ZERO2, STAGE_ZERO3, STAGE_OFFLOAD, STAGE_INFINITY, STAGE_INFINITY_CPU,
    STAGE_INFINITY_NVME,
};
static const MemCategory state_cats[] = {CAT_PARAMS, CAT_GRADS, CAT_MASTER, CAT_ADAM_M, CAT_ADAM_V};

int measured_stage_count(void) { return (int)(sizeof measured_stages / sizeof measured_stages[0]); }
StageId measured_stage(int i) { return measured_stages[i]; }

// Bytes by tier x category that states_alloc added on this rank, reduced to
// the maximum and minimum over ranks. On NVMe, where it allocates nothing,
// the sizes of the descriptors it returns: the files stage 06 creates.
static void measure_stage(Device *d, const StatesLayout *layout, const Inputs *in, double *max_bytes,
                          double *min_bytes) {
    Partition part;
    partition_init(&part, (size_t)llround(in->psi), in->world, in->rank);
    size_t before[TIER_COUNT][CAT_COUNT];
    memcpy(before, d->mem.current, sizeof before);
    ModelStates st;
    states_alloc(&st, d, layout, &part);
    double local[NSLOTS];
    for (int t = 0; t < TIER_COUNT; t++)
        for (int c = 0; c < CAT_COUNT; c++)
            local[t * CAT_COUNT + c] = (double)(d->mem.current[t][c] - before[t][c]);
    const Buf *bufs[5] = {&st.params, &st.grads, &st.master, &st.m, &st.v};
    for (int i = 0; i < 5; i++)
        if (bufs[i]->tier == TIER_NVME) local[TIER_NVME * CAT_COUNT + bufs[i]->cat] += (double)bufs[i]->bytes;
    states_free(&st, d);
    mpiCheck(MPI_Allreduce(local, max_bytes, NSLOTS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    mpiCheck(MPI_Allreduce(local, min_bytes, NSLOTS, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
}

static const Col measure_cols[] = {
    {"stage", "stage", 30, NULL},
    {"tier", "tier", 6, NULL},
    {"category", "category", 11, NULL},
    {"paper_bytes", "paper formula", 14, PRINT_GROUPED},
    {"padding_bytes", "+ padding", 9, PRINT_GROUPED},
    {"formula_bytes", "= formula", 14, PRINT_GROUPED},
    {"measured_bytes", "measured (max)", 14, PRINT_GROUPED},
    {"verdict", "verdict", 9, NULL},
};

// Prints the rows of one stage; returns how many differ.
static int stage_rows(Printer *p, const Inputs *in, StageId s, const double *mx, const double *mn) {
    StateBytes paper, formula;
    stage_formula_state_bytes(s, in->psi, in->ranks, &paper);
    stage_state_bytes(s, (size_t)llround(in->psi), in->ranks, &formula);
    int differ = 0;
    double tot_paper = 0, tot_formula = 0, tot_measured = 0;
    for (int t = 0; t < TIER_COUNT; t++) {
        for (size_t i = 0; i < sizeof state_cats / sizeof state_cats[0]; i++) {
            MemCategory c = state_cats[i];
            int k = t * CAT_COUNT + c;
            double f = formula.bytes[t][c];
            if (f == 0 && mx[k] == 0 && mn[k] == 0) continue;
            int equal = mx[k] == f && mn[k] == f;
            differ += !equal;
            tot_paper += paper.bytes[t][c];
            tot_formula += f;
            tot_measured += mx[k];
            Cell row[8] = {cell_str(stage_name(s)), cell_str(mem_tier_name((MemTier)t)),
                           cell_str(mem_category_name(c)), cell_num(paper.bytes[t][c]),
                           cell_num(f - paper.bytes[t][c]), cell_num(f), cell_num(mx[k]),
                           cell_str(equal ? "equal" : "DIFFERENT")};
            printer_row(p, row);
        }
    }
    Cell total[8] = {cell_str(stage_name(s)), cell_str("all"), cell_str("total"), cell_num(tot_paper),
                     cell_num(tot_formula - tot_paper), cell_num(tot_formula), cell_num(tot_measured),
                     cell_str(tot_formula == tot_measured ? "equal" : "DIFFERENT")};
    printer_row(p, total);
    return differ;
}

int section_measure(Printer *p, const Inputs *in) {
    Device d;
    DeviceOptions opt = {.kind = "cpu", .hbm_gb = 0, .threads = 1, .local_rank = in->local_rank,
                         .local_size = in->local_size, .trace = NULL};
    device_init(&d, &opt);
    printer_section(p, "measure",
                    "Model states measured: states_alloc on the cpu device, bytes counted by the memory "
                    "tracker, beside the formula");
    printer_num(p, "ranks", "ranks (MPI world)", in->world, "%.0f", NULL);
    printer_table(p, "rows", measure_cols, 8);
    int differ = 0;
    for (size_t i = 0; i < sizeof measured_stages / sizeof measured_stages[0]; i++) {
        double mx[NSLOTS], mn[NSLOTS];
        StatesLayout layout = stage_states(measured_stages[i]);
        measure_stage(&d, &layout, in, mx, mn);
        differ += stage_rows(p, in, measured_stages[i], mx, mn);
    }
    printer_table_end(p);
    printer_bool(p, "all_equal", "measured equals formula everywhere", differ == 0);
    printer_note(p, "measured: mem.current by tier and category right after states_alloc, the maximum "
                    "over ranks (a row is \"equal\" only when every rank's count equals the formula).");
    printer_note(p, "paper formula: no padding (shards of Ψ/N); + padding: the Ψ_pad - Ψ elements "
                    "states_alloc adds so that shards are equal and 64-element aligned.");
    printer_note(p, "nvme: states_alloc allocates nothing there; the bytes are those of the descriptors it "
                    "returns, the sizes of the files stage 06 creates (and counts the same way).");
    printer_section_end(p);
    device_destroy(&d);
    return differ;
}
