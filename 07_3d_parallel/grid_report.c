// grid_report.c: stage 07's end-of-run figures, per pipeline stage: model
// states and activations measured by the allocator beside the grid's
// formulas (grid_math.c), micro-batches in flight counted by the schedule,
// the bytes of each group counted by the comm layer beside their formulas,
// and the pipeline bubble measured from the timeline beside (P-1)/(m+P-1).
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "parallel3d.h"

// One rank's figures, gathered as doubles on rank 0.
typedef struct RankFigures {
    double stage, tp_rank, replica;
    double params;                        // Ψ_s: what this rank's states hold, from the layout
    double states, states_formula;        // model-state bytes on the device after the last step
    double acts, acts_formula;            // activation bytes on the device: the allocator's peak
    double working, working_formula;      // the recompute's working set
    double acts_host, acts_host_formula;  // checkpoints offloaded to pinned host memory
    double slots, peak_in_flight, in_flight_formula;
    double w_pending, w_pending_formula;  // zb-h1: micro-batches through B and not yet through W, the most
    double device_peak, device_peak_formula;  // the device's peak (all categories), and the formula's timeline's
    double bubble;                        // mean over the steps
    double ring_pairs, ring_pairs_formula;  // ring attention's causal work per layer and micro-batch
    double comm[GROUP_COUNT][OP_COUNT], comm_formula[GROUP_COUNT][OP_COUNT];  // per step
} RankFigures;
#define FIGURE_DOUBLES (int)(sizeof(RankFigures) / sizeof(double))

GridShape grid_shape(const Trainer *t, const Stage *z) {
    return (GridShape){t->layout.cfg, z->grid.tp, z->grid.pp, z->grid.dp, z->grid.cp, t->plan.cp_ring, t->cfg.batch,
                       t->cfg.seq_len,
                       t->cfg.grad_accum, t->dev.act_bytes, t->plan.recompute, t->plan.offload_activations,
                       t->plan.partition_activations, t->plan.sequence_parallel,
                       t->plan.attention == GPT_ATTENTION_FLASH, t->plan.loss_tiles, t->plan.mlp_tiles,
                       gpt_plan_chunks(&t->plan)};
}

void grid_comm_formula(Trainer *t) {
    Stage *z = t->sctx;
    GridShape shape = grid_shape(t, z);
    double by[GROUP_COUNT][OP_COUNT], sum = 0;
    grid_comm_bytes(&shape, z->grid.stage, by);
    for (int k = 0; k < GROUP_COUNT; k++)
        for (int op = 0; op < OP_COUNT; op++) sum += by[k][op];
    t->comm_formula_bytes = sum;
    t->comm_formula_text = "tp + pp + emb + dp + cp of the grid's formulas (by group below)";
}

static RankFigures my_figures(Trainer *t, Stage *z) {
    GridShape shape = grid_shape(t, z);
    const Grid *g = &z->grid;
    RankFigures f;
    memset(&f, 0, sizeof f);
    f.stage = g->stage;
    f.tp_rank = g->tp_rank;
    f.replica = g->replica;
    f.params = (double)t->state_params;
    const MemCtx *steady = &t->report.after_step;
    for (int c = CAT_PARAMS; c <= CAT_LAST_STATE; c++) f.states += (double)steady->current[TIER_DEVICE][c];
    StateBytes sb;
    grid_state_bytes(&shape, g->stage, &sb);
    if (t->cfg.grad_accum_fp32) stage_add_grad_accum(STAGE_ZERO1, (size_t)grid_stage_params(&shape, g->stage), g->dp, &sb);
    f.states_formula = sb.tier_total[TIER_DEVICE];
    f.acts = (double)t->dev.mem.peak[TIER_DEVICE][CAT_ACTIVATIONS];
    f.slots = t->plan.slots;
    f.peak_in_flight = z->pipe.peak_in_flight;
    f.in_flight_formula = z->schedule == SCHEDULE_AFAB ? shape.micro_batches
                        : fmin(g->pp - g->stage, shape.micro_batches);
    if (z->schedule == SCHEDULE_INTERLEAVED)  // chunk micro-batches: Megatron's warm-up and the one in hand
        f.in_flight_formula = fmin(2 * (g->pp - g->stage - 1) + (shape.chunks - 1) * g->pp + 1,
                                   shape.micro_batches * shape.chunks);
    GridActs ga = grid_act_bytes(&shape, g->stage, (int)f.in_flight_formula);
    f.acts_formula = ga.device;
    if (z->schedule == SCHEDULE_ZB_H1 || z->schedule == SCHEDULE_INTERLEAVED)
        // the activations of the micro-batches in flight rise and fall by
        // chunk, the W stashes apart: their peak is the formula's
        // timeline's (act_math.c's closed forms played over the stage's row of the table)
        f.acts_formula = t->step_formula.cat_peak[CAT_ACTIVATIONS];
    if (z->schedule == SCHEDULE_ZB_H1) {
        f.w_pending = z->pipe.peak_pending_w;
        f.w_pending_formula = fmin(g->stage + 1, shape.micro_batches);
    }
    f.working = (double)t->dev.mem.peak[TIER_DEVICE][CAT_ACT_WORKING];
    f.working_formula = ga.working;
    f.acts_host = (double)t->dev.mem.peak[TIER_PINNED][CAT_ACTIVATIONS];
    f.acts_host_formula = ga.host;
    f.device_peak = (double)t->dev.mem.tier_peak[TIER_DEVICE];
    f.device_peak_formula = t->step_formula.peak;
    f.ring_pairs = t->model.ring_pairs;
    f.ring_pairs_formula = grid_ring_pairs(&shape, g->cp_rank, 1);
    pipeline_settle(&z->pipe);  // the last step's bubble
    f.bubble = z->pipe.bubble_steps ? z->pipe.bubble_sum / z->pipe.bubble_steps : NAN;
    grid_comm_bytes(&shape, g->stage, f.comm_formula);
    for (int k = 0; k < GROUP_COUNT; k++)
        // the steps' bytes in group k, measured by the trainer's step meter (its communicators: the world, then these)
        for (int op = 0; op < OP_COUNT; op++)
            f.comm[k][op] = t->report.n ? t->report.comm_op_bytes[1 + k][op] / t->report.n : 0;
    return f;
}

// Over the ranks of stage s: the largest of a figure (measured or formula).
static double stage_max(const Stage *z, int s, size_t offset) {
    double m = -INFINITY;
    for (int r = 0; r < z->grid.tp * z->grid.pp * z->grid.dp; r++) {
        const RankFigures *f = &z->figures[r];
        if ((int)f->stage == s) m = fmax(m, *(const double *)((const char *)f + offset));
    }
    return m;
}
#define STAGE_MAX(z, s, field) stage_max(z, s, offsetof(RankFigures, field))

static double stage_mean_bubble(const Stage *z, int s) {
    double sum = 0;
    int n = 0;
    for (int r = 0; r < z->grid.tp * z->grid.pp * z->grid.dp; r++)
        if ((int)z->figures[r].stage == s && !isnan(z->figures[r].bubble)) sum += z->figures[r].bubble, n++;
    return n ? sum / n : NAN;
}

static double mean_bubble(const Stage *z) {
    double sum = 0;
    int n = 0;
    for (int s = 0; s < z->grid.pp; s++)
        if (!isnan(stage_mean_bubble(z, s))) sum += stage_mean_bubble(z, s), n++;
    return n ? sum / n : NAN;
}

static void print_stages(const Trainer *t, const Stage *z) {
    const GPTLayout *l = &t->layout;
    int zb = z->schedule == SCHEDULE_ZB_H1;
    printf("  %-5s %-17s %10s %11s %11s %11s %11s %7s %7s", "stage", "units", "Ψ_s", "states MB", "formula MB",
           "acts MB", "formula MB", "flight", "formula");
    if (zb) printf(" %7s %7s", "W wait", "formula");
    printf(" %7s\n", "bubble");
    for (int s = 0; s < z->grid.pp; s++) {
        char units[96];
        if (z->schedule == SCHEDULE_INTERLEAVED)
            grid_chunk_units_text(l->cfg.num_layers, z->grid.pp, gpt_plan_chunks(&t->plan), s, units, sizeof units);
        else
            grid_units_text(l->cfg.num_layers, z->grid.pp, s, units, sizeof units);
        printf("  %-5d %-17s %10.0f %11.3f %11.3f %11.3f %11.3f %7.0f %7.0f", s, units, STAGE_MAX(z, s, params),
               STAGE_MAX(z, s, states) / 1e6, STAGE_MAX(z, s, states_formula) / 1e6, STAGE_MAX(z, s, acts) / 1e6,
               STAGE_MAX(z, s, acts_formula) / 1e6, STAGE_MAX(z, s, peak_in_flight), STAGE_MAX(z, s, in_flight_formula));
        if (zb) printf(" %7.0f %7.0f", STAGE_MAX(z, s, w_pending), STAGE_MAX(z, s, w_pending_formula));
        printf(" %7.3f\n", stage_mean_bubble(z, s));
    }
}

// The bubble's closed form on a clock where F, B and W take a slot each
// (zb-h1), or where a backward takes two (the others: the same fraction).
static double bubble_formula(const Stage *z, int m) {
    double P = z->grid.pp, v = z->table.chunks > 1 ? z->table.chunks : 1;
    if (z->schedule == SCHEDULE_INTERLEAVED) return (P - 1) / (v * m + P - 1);
    return z->schedule == SCHEDULE_ZB_H1 ? (P - 1) / (3 * m + P - 1) : pipeline_bubble_formula(z->grid.pp, m);
}
static const char *bubble_formula_text(const Stage *z) {
    return z->schedule == SCHEDULE_ZB_H1 ? "(P-1)/(3m+P-1)"
         : z->schedule == SCHEDULE_INTERLEAVED ? "(P-1)/(v·m+P-1)" : "(P-1)/(m+P-1)";
}

// The recompute's working set and the checkpoints on the host, per stage.
static void print_act_extra(const Trainer *t, const Stage *z) {
    printf("  %-5s %16s %11s %16s %11s\n", "stage", "act_working MB", "formula MB", "host acts MB", "formula MB");
    for (int s = 0; s < z->grid.pp; s++)
        printf("  %-5d %16.3f %11.3f %16.3f %11.3f\n", s, STAGE_MAX(z, s, working) / 1e6,
               STAGE_MAX(z, s, working_formula) / 1e6, STAGE_MAX(z, s, acts_host) / 1e6,
               STAGE_MAX(z, s, acts_host_formula) / 1e6);
}

static void print_comm(const Stage *z, int act_bytes) {
    printf("communication per step per rank by group (counted from the calls, ring bytes, max over the stage's "
           "ranks) beside the formula\n");
    printf("  %-5s %-5s %-15s %12s %12s\n", "stage", "group", "operation", "counted MB", "formula MB");
    for (int s = 0; s < z->grid.pp; s++)
        for (int k = 0; k < GROUP_COUNT; k++)
            for (int op = 0; op < OP_COUNT; op++) {
                size_t at = offsetof(RankFigures, comm) + ((size_t)k * OP_COUNT + op) * sizeof(double);
                size_t at_f = offsetof(RankFigures, comm_formula) + ((size_t)k * OP_COUNT + op) * sizeof(double);
                double got = stage_max(z, s, at), want = stage_max(z, s, at_f);
                if (got == 0 && want == 0) continue;
                printf("  %-5d %-5s %-15s %12.4f %12.4f\n", s, grid_group_name((GridGroup)k), comm_op_name((CommOp)op),
                       got / 1e6, want / 1e6);
            }
    printf("  tp: 2(T-1)/T x m x (4 per block, 5 with full recompute, + 1 embedding + 1 head) x B·S·C·a, + the "
           "head's fp32 max and sums 3·B·S·4 (twice with --tiled-loss), + partitioned checkpoints' all-gathers "
           "(T-1)/T x m x (blocks - 1) x "
           "B·S·C·a; pp: m x B·S·C·a to and from each neighbour;\n"
           "  emb: V_pad·C/T x 2 B, the tied wte between the first and last stage; dp: ZeRO-1, 2Ψ_pad(D-1)/D each "
           "of reduce-scatter and all-gather (a = %d B per activation)\n", act_bytes);
}

// Ring attention's causal work: the pairs each rank's blocks attended,
// beside the zigzag's formula, and what chunks in order would give.
static void print_ring_work(const Stage *z, const GridShape *shape) {
    int N = z->grid.tp * z->grid.pp * z->grid.dp;
    double lo = INFINITY, hi = 0, in_order_hi = 0, in_order_sum = 0;
    for (int r = 0; r < N; r++) lo = fmin(lo, z->figures[r].ring_pairs), hi = fmax(hi, z->figures[r].ring_pairs);
    for (int r = 0; r < shape->cp; r++) {
        double w = grid_ring_pairs(shape, r, 0);
        in_order_hi = fmax(in_order_hi, w);
        in_order_sum += w;
    }
    printf("ring attention's causal work per layer and micro-batch: %.0f to %.0f query-key pairs per rank (counted "
           "from the blocks run), formula %.0f on every rank = B·heads·((2C-1)·Tc² + Tc(Tc+1)), Tc = S/(2C), the "
           "zigzag; chunks in order would give rank r B·heads·((4r+1)·Tc² + Tc(Tc+1)): the busiest %.2f x the mean "
           "(formula)\n", lo, hi, grid_ring_pairs(shape, 0, 1), in_order_hi / (in_order_sum / shape->cp));
}

static void report_json(Trainer *t, FILE *f);

void grid_report(Trainer *t, FILE *json) {
    Stage *z = t->sctx;
    int N = t->world.size;
    RankFigures mine = my_figures(t, z);
    if (t->world.rank == 0) z->figures = xmalloc((size_t)N * sizeof(RankFigures));
    mpiCheck(MPI_Gather(&mine, FIGURE_DOUBLES, MPI_DOUBLE, z->figures, FIGURE_DOUBLES, MPI_DOUBLE, 0, t->world.mpi));
    if (t->world.rank != 0) return;
    if (json) report_json(t, json);
    const Grid *g = &z->grid;
    GridShape shape = grid_shape(t, z);
    double psi = (double)t->model_params;
    printf("\n3d grid: %s = %d ranks (rank = (stage·D + replica)·T + tp rank), schedule %s, m = %d micro-batches "
           "x batch %d\n", t->grid, N, z->schedule_name, shape.micro_batches, shape.batch);
    printf("per pipeline stage (measured: the allocator and the schedule, max over the stage's %d ranks; "
           "formula: from the shapes)\n", g->tp * g->dp);
    print_stages(t, z);
    printf("  states: ZeRO-1 over dp of the stage's part, 4Ψ_s + 12Ψ_s/D (Ψ_s padded to 64·D); the even split "
           "Ψ/(T·P) = %.0f of Ψ = %.0f\n", psi / (g->tp * g->pp), psi);
    if (z->schedule == SCHEDULE_INTERLEAVED)
        printf("  acts: the largest of the formula's timeline (step_memory.c): the chunk micro-batches in flight, "
               "each through its chunk's blocks, and each chunk's input (device; --recompute %s); in flight: chunk "
               "micro-batches forwarded and not yet backward, min(2(P - stage - 1) + (v - 1)P + 1, m·v) (peak "
               "counted by the schedule)\n", gpt_recompute_name(t->plan.recompute));
    else if (z->schedule == SCHEDULE_ZB_H1)
        printf("  acts: the largest of the formula's timeline (step_memory.c): in flight x one micro-batch through "
               "the stage as 1f1b, and each block's W stash, sbh(4 + 12/t)e + 16h, from its B to its W (device; "
               "--recompute %s); in flight: min(P - stage, m); W wait: micro-batches through B, not yet through "
               "W, formula min(stage + 1, m) (peaks counted by the schedule)\n", gpt_recompute_name(t->plan.recompute));
    else
        printf("  acts: slots x one micro-batch through the stage + shared (device; --recompute %s%s); in flight: "
               "min(P - stage, m) for 1f1b, m for afab (peak counted by the schedule)\n",
               gpt_recompute_name(t->plan.recompute),
               t->plan.partition_activations ? ", checkpoints partitioned over tp" : "");
    if (t->plan.recompute != GPT_RECOMPUTE_NONE || t->plan.offload_activations) print_act_extra(t, z);
    print_comm(z, t->dev.act_bytes);
    if (g->cp > 1 && t->plan.cp_ring) print_ring_work(z, &shape);
    printf("pipeline bubble: %.3f measured (idle share of each rank's compute row in the pipeline's window, mean "
           "over steps and ranks), formula %s = %.3f\n", mean_bubble(z),
           bubble_formula_text(z), bubble_formula(z, shape.micro_batches));
}

static void report_json(Trainer *t, FILE *f) {
    Stage *z = t->sctx;
    const Grid *g = &z->grid;
    GridShape shape = grid_shape(t, z);
    // dp: the part's replicas (the cp ranks among them), cp: the ranks a sequence is split over, and how
    fprintf(f, ",\"grid\":{\"tp\":%d,\"pp\":%d,\"dp\":%d,\"cp\":%d,\"cp_mode\":\"%s\",\"schedule\":\"%s\","
               "\"micro_batches\":%d,\"bubble_formula\":%.6f,", g->tp, g->pp, g->dp, g->cp,
            g->cp > 1 ? (t->plan.cp_ring ? "ring" : "ulysses") : "none", z->schedule_name, shape.micro_batches,
            bubble_formula(z, shape.micro_batches));
    double b = mean_bubble(z);
    if (isnan(b)) fprintf(f, "\"bubble_measured\":null,\"ranks\":[");
    else fprintf(f, "\"bubble_measured\":%.6f,\"ranks\":[", b);
    for (int r = 0; r < t->world.size; r++) {
        const RankFigures *x = &z->figures[r];
        fprintf(f, "%s{\"rank\":%d,\"stage\":%.0f,\"tp_rank\":%.0f,\"replica\":%.0f,\"params\":%.0f,"
                   "\"states\":%.0f,\"states_formula\":%.0f,\"activations\":%.0f,\"activations_formula\":%.0f,"
                   "\"act_working\":%.0f,\"act_working_formula\":%.0f,\"act_host\":%.0f,\"act_host_formula\":%.0f,"
                   "\"slots\":%.0f,\"peak_in_flight\":%.0f,\"in_flight_formula\":%.0f,\"ring_pairs\":%.0f,"
                   "\"ring_pairs_formula\":%.0f,\"w_pending\":%.0f,\"w_pending_formula\":%.0f,"
                   "\"device_peak\":%.0f,\"device_peak_formula\":%.0f,\"comm\":{",
                r ? "," : "", r, x->stage, x->tp_rank, x->replica, x->params, x->states, x->states_formula, x->acts,
                x->acts_formula, x->working, x->working_formula, x->acts_host, x->acts_host_formula, x->slots,
                x->peak_in_flight, x->in_flight_formula, x->ring_pairs, x->ring_pairs_formula, x->w_pending,
                x->w_pending_formula, x->device_peak, x->device_peak_formula);
        for (int k = 0; k < GROUP_COUNT; k++) {
            double got = 0, want = 0;
            for (int op = 0; op < OP_COUNT; op++) got += x->comm[k][op], want += x->comm_formula[k][op];
            fprintf(f, "%s\"%s\":[%.3f,%.3f]", k ? "," : "", grid_group_name((GridGroup)k), got, want);
        }
        fprintf(f, "}}");
    }
    fprintf(f, "]}");
}
