// grid.c: the process grid (see grid.h): coordinates, the blocks of each
// pipeline stage, the sub-groups, and the refusals.
#include "grid.h"
#include <stdio.h>
#include "check.h"

void grid_check(int ranks, int tp, int pp, const GPTConfig *cfg) {
    if (tp < 1 || pp < 1) fail_usage("--tp %d --pp %d: each must be at least 1", tp, pp);
    if (ranks % (tp * pp) != 0)
        fail_usage("%d ranks do not divide into --tp %d x --pp %d = %d model parts; run a multiple of %d ranks "
                   "(mpirun -np %d gives dp %d)", ranks, tp, pp, tp * pp, tp * pp, tp * pp * (ranks / (tp * pp) + 1),
                   ranks / (tp * pp) + 1);
    if (cfg->num_heads % tp != 0)  // 4C = 4 x heads x head size divides too
        fail_usage("--tp %d does not divide the %d heads: tensor parallelism splits the heads (and the MLP's 4C "
                   "channels with them); pick a --tp that divides %d", tp, cfg->num_heads, cfg->num_heads);
    if (cfg->num_layers < pp)
        fail_usage("--pp %d stages for %d layers: every stage needs at least one block; use --pp %d or fewer",
                   pp, cfg->num_layers, cfg->num_layers);
}

void grid_init(Grid *g, Comm *world, int tp, int pp, const GPTConfig *cfg) {
    grid_check(world->size, tp, pp, cfg);
    g->tp = tp;
    g->pp = pp;
    g->dp = world->size / (tp * pp);
    grid_coords(world->rank, tp, g->dp, &g->tp_rank, &g->stage, &g->replica);
    grid_stage_units(cfg->num_layers, pp, g->stage, &g->first_unit, &g->last_unit);
    // color: what the members share; key: their order within the group
    comm_split(world, g->stage * g->dp + g->replica, g->tp_rank, &g->tp_comm);
    comm_split(world, g->replica * tp + g->tp_rank, g->stage, &g->pp_comm);
    comm_split(world, g->stage * tp + g->tp_rank, g->replica, &g->dp_comm);
    int ends = pp > 1 && (g->stage == 0 || g->stage == pp - 1);
    comm_split(world, ends ? g->replica * tp + g->tp_rank : MPI_UNDEFINED, g->stage, &g->emb_comm);
}

void grid_free(Grid *g) {
    comm_free(&g->tp_comm);
    comm_free(&g->pp_comm);
    comm_free(&g->dp_comm);
    comm_free(&g->emb_comm);
}

void grid_name(const Grid *g, char *out, size_t n) { snprintf(out, n, "tp %d x pp %d x dp %d", g->tp, g->pp, g->dp); }
