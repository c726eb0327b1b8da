// grid.c: the process grid (see grid.h): coordinates, the blocks of each
// pipeline stage, the sub-groups, and the refusals.
#include "grid.h"
#include <stdio.h>
#include "check.h"

// The (tp, cp) pairs whose product divides the heads, at most `n` bytes of text.
static void head_grids(int heads, char *out, size_t n) {
    size_t at = 0;
    out[0] = 0;
    for (int tp = 1; tp <= heads && at < n; tp++)
        for (int cp = 2; tp * cp <= heads && at < n; cp++)
            if (heads % (tp * cp) == 0)
                at += (size_t)snprintf(out + at, n - at, "%s--tp %d --cp %d", at ? ", " : "", tp, cp);
}

void grid_check(int ranks, int tp, int cp, int ring, int pp, int seq_len, const GPTConfig *cfg) {
    if (tp < 1 || pp < 1 || cp < 1) fail_usage("--tp %d --cp %d --pp %d: each must be at least 1", tp, cp, pp);
    if (cfg->num_heads % tp != 0)  // 4C = 4 x heads x head size divides too
        fail_usage("--tp %d does not divide the %d heads: tensor parallelism splits the heads (and the MLP's 4C "
                   "channels with them); pick a --tp that divides %d", tp, cfg->num_heads, cfg->num_heads);
    if (!ring && cfg->num_heads % (tp * cp) != 0) {
        char grids[256];
        head_grids(cfg->num_heads, grids, sizeof grids);
        fail_usage("--tp %d x --cp %d does not divide the %d heads: Ulysses gives each of the tp x cp ranks of a "
                   "stage whole heads over the whole sequence; grids that work: %s (or --cp-mode ring, which splits no "
                   "heads)", tp, cp, cfg->num_heads, grids[0] ? grids : "none (one head)");
    }
    int part = tp * cp * pp;
    char cps[32] = "";
    if (cp > 1) snprintf(cps, sizeof cps, " x --cp %d", cp);
    if (ranks % part != 0)
        fail_usage("%d ranks do not divide into --tp %d%s x --pp %d = %d model parts; run a multiple of %d ranks "
                   "(mpirun -np %d gives dp %d)", ranks, tp, cps, pp, part, part, part * (ranks / part + 1),
                   ranks / part + 1);
    if (ring && cp > 1 && seq_len % (2 * cp) != 0)
        fail_usage("--seq-len %d does not cut into 2 x --cp %d chunks: ring attention gives each rank of a "
                   "sequence group two chunks of S/(2 cp) positions (the zigzag, r and 2cp - 1 - r); give a "
                   "--seq-len that is a multiple of %d", seq_len, cp, 2 * cp);
    if (seq_len % cp != 0)
        fail_usage("--seq-len %d does not split over --cp %d: each rank of a sequence group holds S/cp positions; "
                   "give a --seq-len that is a multiple of %d", seq_len, cp, cp);
    if (cfg->num_layers < pp)
        fail_usage("--pp %d stages for %d layers: every stage needs at least one block; use --pp %d or fewer",
                   pp, cfg->num_layers, cfg->num_layers);
}

void grid_init(Grid *g, Comm *world, int tp, int cp, int ring, int pp, int seq_len, const GPTConfig *cfg) {
    grid_check(world->size, tp, cp, ring, pp, seq_len, cfg);
    g->tp = tp;
    g->pp = pp;
    g->cp = cp;
    g->dp = world->size / (tp * pp);
    grid_coords(world->rank, tp, g->dp, &g->tp_rank, &g->stage, &g->replica);
    g->cp_rank = g->replica % cp;
    grid_stage_units(cfg->num_layers, pp, g->stage, &g->first_unit, &g->last_unit);
    // color: what the members share; key: their order within the group
    comm_split(world, g->stage * g->dp + g->replica, g->tp_rank, &g->tp_comm);
    comm_split(world, g->replica * tp + g->tp_rank, g->stage, &g->pp_comm);
    comm_split(world, g->stage * tp + g->tp_rank, g->replica, &g->dp_comm);
    comm_split(world, (g->stage * g->dp + g->replica / cp) * tp + g->tp_rank, g->cp_rank, &g->cp_comm);
    int ends = pp > 1 && (g->stage == 0 || g->stage == pp - 1);
    comm_split(world, ends ? g->replica * tp + g->tp_rank : MPI_UNDEFINED, g->stage, &g->emb_comm);
}

void grid_free(Grid *g) {
    comm_free(&g->tp_comm);
    comm_free(&g->pp_comm);
    comm_free(&g->dp_comm);
    comm_free(&g->cp_comm);
    comm_free(&g->emb_comm);
}

void grid_name(const Grid *g, int chunks, char *out, size_t n) {
    char cp[32] = "", vp[32] = "";
    if (g->cp > 1) snprintf(cp, sizeof cp, "cp %d x ", g->cp);
    if (chunks > 1) snprintf(vp, sizeof vp, "vp %d x ", chunks);
    snprintf(out, n, "tp %d x %spp %d x %sdp %d", g->tp, cp, g->pp, vp, g->dp / g->cp);
}
