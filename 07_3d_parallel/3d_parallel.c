// 3d_parallel: when one model does not fit even sharded, split the model
// itself (Narayanan et al. 2021, Megatron-LM's "PTD-P"):
//   - tensor parallel (Shoeybi et al. 2019): each block's heads and MLP over
//     T adjacent ranks, with the f and g all-reduces (common/model/gpt_tp.c),
//     the embedding and cross-entropy vocabulary-parallel;
//   - pipeline parallel: P stages of contiguous blocks (grid.c), the
//     embeddings on the first and the head on the last, micro-batches in a
//     1F1B, AFAB or ZB-H1 schedule (pipeline.c); the tied wte's gradient summed
//     between the first stage and the last, which keeps a copy of wte;
//   - data parallel over the D = N/(T·P) replicas of each model part with
//     ZeRO-1: the gradient reduce-scattered, stage 02's sharded AdamW
//     (02_zero1/shard_update.c, linked), the bf16 params all-gathered.
// Per rank: 4Ψ_s + 12Ψ_s/D bytes of model states, Ψ_s ≈ Ψ/(T·P).
#include <string.h>
#include "shard_update.h"
#include "check.h"
#include "kernels.h"
#include "parallel3d.h"
#include "pipe_schedule.h"

// ---- where this rank sits, and what its states hold ----

// --schedule's table (pipe_schedule.h), with its refusals: an unknown
// name, and under the interleaved schedule layers that do not split into
// P·v chunks (the rest: schedule_build's).
static PipeSchedule schedule_table_of(const Stage *z, const GPTConfig *mc) {
    int s = schedule_of(z->schedule_name);
    if (s < 0)
        fail_usage("--schedule %s: choose 1f1b, afab, interleaved (with --virtual-stages V) or zb-h1",
                   z->schedule_name);
    if (s == PIPE_INTERLEAVED && z->virtual_stages > 1 && mc->num_layers % (z->pp * z->virtual_stages))
        fail_usage("--virtual-stages %d with --pp %d cuts the %d layers into %d chunks of equal size: %d does not "
                   "divide them; give a --virtual-stages whose product with --pp divides %d", z->virtual_stages, z->pp,
                   mc->num_layers, z->pp * z->virtual_stages, z->pp * z->virtual_stages, mc->num_layers);
    return (PipeSchedule)s;
}

// --print-schedule: the table of --pp stages, --grad-accum micro-batches
// and --virtual-stages chunks (rank 0 draws it), then the run ends: no
// grid, model or state is made.
static void print_schedule_and_exit(const Trainer *t, const Stage *z, const TrainConfig *cfg, PipeSchedule s) {
    ScheduleTable table;
    schedule_build(&table, s, z->pp, cfg->grad_accum, z->virtual_stages);  // every rank refuses alike
    if (t->world.rank == 0) {
        schedule_print(&table, stdout);
        fflush(stdout);
    }
    schedule_free(&table);
    comm_world_finalize((Comm *)&t->world);
    exit(0);
}

// The grid, this rank's tp part of the layout, its stage's units with
// min(P - s, m) micro-batches in flight (1F1B) or m (AFAB), and its states:
// [wte copy (last stage of a pipeline) | the stage's units].
static Placement configure(const Trainer *t, TrainConfig *cfg, const GPTConfig *mc, Placement p) {
    Stage *z = t->sctx;
    PipeSchedule table = schedule_table_of(z, mc);
    if (z->print_schedule) print_schedule_and_exit(t, z, cfg, table);
    if (table == PIPE_INTERLEAVED || table == PIPE_ZB_H1)  // its own refusals first (zb-h1 at --pp 1)
        schedule_build(&z->table, table, z->pp, cfg->grad_accum, z->virtual_stages);
    if (table == PIPE_INTERLEAVED && z->pp < 2)
        fail_usage("--schedule interleaved passes each micro-batch through the stages v times: it needs --pp 2 or "
                   "more (here --pp %d)", z->pp);
    if (table == PIPE_INTERLEAVED && z->partition_activations)
        fail_usage("--schedule interleaved with --partition-activations: the checkpoints' store keeps one contiguous "
                   "range's blocks; leave it out, or give --schedule 1f1b");
    if (table == PIPE_ZB_H1 && cfg->tiled_mlp)
        fail_usage("--schedule zb-h1 with --tiled-mlp %d: W reads each block's whole GELU output, which the tiled "
                   "MLP keeps a chunk at a time; leave out --tiled-mlp, or give --schedule 1f1b", cfg->tiled_mlp);
    if (z->virtual_stages != 1 && table != PIPE_INTERLEAVED)
        fail_usage("--virtual-stages %d: only --schedule interleaved cuts a stage into chunks", z->virtual_stages);
    z->schedule = grid_schedule_of(z->schedule_name);
    Grid *g = &z->grid;
    grid_check_cp_flags(t, z, cfg);
    // the grid splits the world, the default's data-parallel group
    int ring = strcmp(z->cp_mode, "ring") == 0;
    grid_init(g, p.dp, z->tp, z->cp, ring, z->pp, cfg->seq_len, mc);
    gpt_layout_tp(&p.layout, mc, g->tp, g->tp_rank);
    p.dp = &g->dp_comm;  // every replica of the part, the cp ranks included (ZeRO-1, the gradients' sum)
    p.tp = g->tp > 1 ? &g->tp_comm : NULL;
    p.cp = g->cp > 1 ? &g->cp_comm : NULL;
    // the micro-batches, m, set the slots
    train_config_resolve_batch(cfg, g->dp / g->cp, "data-parallel replicas");
    int slots = table == PIPE_INTERLEAVED ? schedule_slots(&z->table, g->stage)
                                          : pipeline_slots(z->schedule, g->pp, g->stage, cfg->grad_accum);
    p.plan = (GPTPlan){.B = cfg->batch, .T = cfg->seq_len / g->cp, .slots = slots,
                       .w_slots = table == PIPE_ZB_H1 ? schedule_pending_w(&z->table, g->stage) : 0,
                       .first_unit = g->first_unit,
                       .last_unit = g->last_unit, .partition_activations = z->partition_activations,
                       .sequence_parallel = z->sequence_parallel, .cp = g->cp, .cp_rank = g->cp_rank, .cp_ring = ring};
    if (table == PIPE_INTERLEAVED) grid_plan_chunks(mc->num_layers, g->pp, z->virtual_stages, g->stage, &p.plan);
    grid_check_activation_flags(t, z);
    const GPTLayout *l = &p.layout;
    CHECK(l->emb_off[EMB_WTE] == 0, "3d_parallel: wte must open the embeddings' unit (states keep it first)");
    // the states: [wte copy (the last stage of a pipeline) | the stage's units], each interleaved chunk's apart
    if (table == PIPE_INTERLEAVED)
        p.nstate_ranges = grid_chunk_state_ranges(l, g->pp, z->virtual_stages, g->stage, p.state_ranges);
    else
        p.nstate_ranges = grid_state_ranges(l, g->pp, g->stage, g->first_unit, g->last_unit, p.state_ranges);
    if (g->pp > 1 && g->stage == g->pp - 1) z->wte_copy = p.state_ranges[0].count;
    Comm *groups[GROUP_COUNT] = {&g->tp_comm, &g->pp_comm, &g->emb_comm, &g->dp_comm, &g->cp_comm};
    for (int k = 0; k < GROUP_COUNT; k++) p.groups[k] = groups[k];
    p.ngroups = GROUP_COUNT;
    grid_name(g, gpt_plan_chunks(&p.plan), p.grid, sizeof p.grid);
    return p;
}

// The ranges of the states after the wte copy: the stage's units (each
// interleaved chunk's in a range of its own).
static int first_units_range(const Stage *z) { return z->wte_copy ? 1 : 0; }

// Where unit u starts in the states, and how much of it they hold: the
// last stage's wte copy is unit 0 without wpe, which only the first stage
// reads; -1 where the stage does not hold it.
static long state_offset_of(const Trainer *t, const Stage *z, int u) {
    if (u == GPT_UNIT_EMBED && z->wte_copy) return 0;
    size_t at = 0, off = t->layout.unit[u].offset;
    for (int k = 0; k < t->nstate_ranges; at += t->state_ranges[k].count, k++) {
        const Range *r = &t->state_ranges[k];
        if (k >= first_units_range(z) && off >= r->offset && off < r->offset + r->count)
            return (long)(at + off - r->offset);
    }
    return -1;
}
static size_t state_count(const Trainer *t, const Stage *z, int u) {
    return u == GPT_UNIT_EMBED && z->wte_copy ? z->wte_copy : t->layout.unit[u].count;
}
static size_t state_offset(const Trainer *t, const Stage *z, int u) {
    long at = state_offset_of(t, z, u);
    CHECK(at >= 0, "3d_parallel: unit %d is not held by stage %d (units %d..%d%s)", u, z->grid.stage,
          t->plan.first_unit, t->plan.last_unit, t->plan.chunks > 1 ? ", in interleaved chunks" : "");
    return (size_t)at;
}

const bf16 *part_unit_params(Trainer *t, int u) {
    Stage *z = t->sctx;
    return (const bf16 *)t->st.params.ptr + state_offset(t, z, u);
}

// The first micro-batch of a step writes a unit's gradients, the others add.
// On the last stage unit 0 is the wte copy (the head's part of the tied gradient).
void part_add_grads(Trainer *t, int u, const float *g, GradTurn turn) {
    Stage *z = t->sctx;
    grads_add_f32(t, t->dev.k, state_offset(t, z, u), g, state_count(t, z, u), turn);
}

// The global norm counts every gradient once: a replicated tensor (the same
// on every tp rank) on tp rank 0 only, and the tied wte on the first stage
// only. The other ranges of the states, in order.
static void count_once(Trainer *t, Stage *z) {
    const GPTLayout *l = &t->layout;
    int n = gpt_replicated_ranges(l, NULL, 0);
    Range *rep = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(Range));
    gpt_replicated_ranges(l, rep, n);
    z->counted = xmalloc((size_t)(t->nstate_ranges * (n + 1) + 1) * sizeof(Range));
    z->ncounted = 0;
    size_t base = 0;  // where state range r starts in the states
    for (int r = 0; r < t->nstate_ranges; base += t->state_ranges[r].count, r++) {
        if (r < first_units_range(z)) continue;  // the wte copy: counted on the first stage
        const Range *s = &t->state_ranges[r];
        size_t at = base, end = base + s->count;
        for (int k = 0; k < n && z->grid.tp_rank > 0; k++) {
            size_t lo = rep[k].offset > s->offset ? rep[k].offset : s->offset;
            size_t hi = rep[k].offset + rep[k].count < s->offset + s->count ? rep[k].offset + rep[k].count
                                                                            : s->offset + s->count;
            if (lo >= hi) continue;
            size_t from = base + lo - s->offset;  // in the states
            if (from > at) z->counted[z->ncounted++] = (Range){at, from - at};
            at = from + (hi - lo);
        }
        if (end > at) z->counted[z->ncounted++] = (Range){at, end - at};
    }
    free(rep);
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    z->reduced = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, t->part.shard * sizeof(bf16), "reduced gradient shard");
    count_once(t, z);
    grid_comm_formula(t);
    int max_micro = t->cfg.grad_accum * t->cfg.eval_batches;  // an evaluation's, the most in one pass
    pipeline_init(&z->pipe, t, &z->grid.pp_comm, z->grid.stage, z->grid.pp, z->schedule, t->plan.slots, &z->table,
                  max_micro);
}

// The reduced gradient shard of ZeRO-1 over the replicas (setup); the
// pipeline's micro-batches live in the activations' slots (t->plan).
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    return (double)p->shard * sizeof(bf16);
}

// A pipeline stage's schedule, the reduced shard beside it.
static void step_shape(const void *ctx, const Trainer *t, StepMemorySpec *s) {
    const Stage *z = ctx;
    s->shape = STEP_PIPELINE;
    s->schedule = z->table.ops ? z->table.schedule : z->schedule == SCHEDULE_AFAB ? PIPE_AFAB : PIPE_1F1B;
    s->stages = z->grid.pp;
    s->stage = z->grid.stage;
    if (z->table.ops) {  // zb-h1, interleaved: the walk plays the stage's row of the table
        s->ops = z->table.ops + (size_t)s->stage * (size_t)z->table.per_stage;
        s->nops = z->table.count[s->stage];
    }
    step_memory_fixed(s, CAT_COMM, device_buffer_bytes(ctx, &t->layout, &t->part));  // one block
}

// ---- the step ----

// The tied wte's two halves of the gradient (the embedding's on the first
// stage, the head's on the last) summed between the two, then ZeRO-1 over
// the replicas: rank r of dp receives the sum of its shard.
static void reduce_grads(Trainer *t) {
    Stage *z = t->sctx;
    if (z->grid.emb_comm.size == 2)     // wte opens the states of both ends
        comm_all_reduce_sum(&z->grid.emb_comm, t->st.grads.ptr, (size_t)t->layout.vocab_part * t->layout.cfg.channels,
                            DT_HALF, NULL);
    int D = t->dp->size;
    size_t counts[D];
    for (int q = 0; q < D; q++) counts[q] = t->part.shard;
    comm_reduce_scatter_sum(t->dp, t->st.grads.ptr, z->reduced.ptr, counts, DT_HALF, NULL);
}

// The micro-batches through the pipeline's schedule (pipeline.c), then the
// gradients reduced.
static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    double loss = pipeline_run(&z->pipe, mb);
    if (mb->backward) reduce_grads(t);
    return loss;
}

static double grad_norm_sq(Trainer *t) {
    Stage *z = t->sctx;
    const Partition *p = &t->part;
    double local = 0;
    for (int k = 0; k < z->ncounted; k++) {
        size_t lo = z->counted[k].offset > p->begin ? z->counted[k].offset : p->begin;
        size_t end = z->counted[k].offset + z->counted[k].count, hi = end < p->end ? end : p->end;
        const bf16 *piece = (const bf16 *)z->reduced.ptr + (lo - p->begin);
        if (hi > lo) local += t->dev.k->sum_squares_bf16(&t->dev, piece, hi - lo);
    }
    return comm_sum_f64(&t->world, local);
}

static void update(Trainer *t, const AdamWStep *s) {
    Stage *z = t->sctx;
    shard_adamw(t, z->reduced.ptr, own_param_slice(t), s);
    all_gather_params(t);  // over the replicas
}

static void params_from_master(Trainer *t) {
    t->dev.k->f32_to_half(&t->dev, own_param_slice(t), t->st.master.ptr, t->part.shard);
    all_gather_params(t);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    buf_free(&t->dev, &z->reduced);
    pipeline_free(&z->pipe);
    schedule_free(&z->table);
    free(z->counted);
    free(z->figures);
    grid_free(&z->grid);
}

const Strategy strategy_3d_parallel = {
    .name = "3d_parallel",
    .summary = "3D parallelism: tensor parallel (Megatron-LM's column/row split, --tp) x pipeline parallel\n"
               "(1F1B, AFAB or ZB-H1 over --grad-accum micro-batches, --pp) x data parallel (ZeRO-1 over the\n"
               "ranks / (tp x pp) replicas). Each rank keeps its stage's part of the model.",
    .formula = STAGE_ZERO1,
    // ZeRO-1 over the replicas of this rank's part: params and grads whole, the optimizer sharded
    .states = {.params = STATE_FULL, .grads = STATE_FULL, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .context_bytes = sizeof(Stage),
    .flags = grid_flags,
    .configure = configure,
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .step_shape = step_shape,
    .forward_backward = forward_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .report = grid_report,
    .teardown = teardown,
};
