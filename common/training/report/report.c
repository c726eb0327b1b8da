// report.c: the per-step line and the end-of-run figures: what the steps
// measured, reduced over the ranks beside their formulas (summarize), then
// printed (report_print.c) and recorded (report_json.c). Measured figures
// come from the memory accounting (mem.h), the clocks around each step and
// the comm statistics; formula figures from mem_math.h, act_math.h and
// gpt.h, and every row says which it is.
#include "report.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "report_summary.h"

// The run's header: what runs, on what, in which shape, on which data.
static void print_header(const Report *r) {
    const RunFacts *run = &r->run;
    const GPTConfig *m = &run->layout->cfg;
    char replicas[96];  // who reads distinct rows: every rank, or the data-parallel replicas of a grid
    if (!run->grid[0]) snprintf(replicas, sizeof replicas, "%d ranks", run->ranks);
    else snprintf(replicas, sizeof replicas, "%d ranks = %s | dp %d", run->ranks, run->grid, run->dp_ranks);
    // Ψ counts wte as stored: V rounded up to 128 rows, the padding said where there is some
    int vp = gpt_vocab_padded(m->vocab_size, 1);
    char padding[96] = "";
    if (vp > m->vocab_size)
        snprintf(padding, sizeof padding, ", %.0f of them in wte's %d padding rows",
                 (double)(vp - m->vocab_size) * m->channels, vp - m->vocab_size);
    printf("%s: %s | model %s (L=%d C=%d H=%d V=%d context %d, %.2fM params%s) | %s x batch %d x seq %d x accum %d = "
           "%.0f tokens/step\n", run->stage, r->taps.dev->name, run->model, m->num_layers, m->channels, m->num_heads,
           m->vocab_size, m->max_seq_len, run->model_params / 1e6, padding, replicas, run->batch, run->seq_len,
           run->grad_accum, run->tokens_per_step);
    printf("data: %s\n", run->data_desc);
}

void report_init(Report *r, const RunFacts *run, const ReportTaps *taps, long first_step) {
    memset(r, 0, sizeof *r);
    r->run = *run;
    r->taps = *taps;
    r->cap = run->steps;
    r->loss = xcalloc((size_t)r->cap, sizeof(double));
    r->step_ms = xcalloc((size_t)r->cap, sizeof(double));
    r->lr = xcalloc((size_t)r->cap, sizeof(double));
    r->grad_norm = xcalloc((size_t)r->cap, sizeof(double));
    r->loss_scale = xcalloc((size_t)r->cap, sizeof(double));
    r->skipped = xcalloc((size_t)r->cap, 1);
    r->comm_bytes = xcalloc((size_t)r->cap, sizeof(double));
    for (int x = 0; x < XFER_COUNT; x++) r->xfer[x] = xcalloc((size_t)r->cap, sizeof(double));
    r->act_down = xcalloc((size_t)r->cap, sizeof(double));
    r->act_up = xcalloc((size_t)r->cap, sizeof(double));
    r->first_step = first_step;
    r->val_loss = NAN;
    if (taps->world->rank == 0) print_header(r);  // --quiet drops only the per-step lines
}

void report_free(Report *r) {
    free(r->loss_scale); free(r->skipped);
    free(r->loss); free(r->step_ms); free(r->lr); free(r->grad_norm); free(r->comm_bytes);
    for (int x = 0; x < XFER_COUNT; x++) free(r->xfer[x]);
    free(r->act_down);
    free(r->act_up);
}

// Measures the window of the step before: every row's union and its
// intersection with compute, then forgets what cannot reach a later window.
static void measure_window(Report *r) {
    double w0 = r->window_t0_us, w1 = r->window_t1_us;
    if (w1 <= w0) return;
    const Timeline *tl = &r->taps.trace->tl;
    StepTimes x;
    x.step = (w1 - w0) / 1000.0;
    x.compute = timeline_union_us(tl, TRACE_TID_COMPUTE, w0, w1) / 1000.0;
    x.comm = timeline_union_us(tl, TRACE_TID_COMM, w0, w1) / 1000.0;
    x.exposed = timeline_union_us(tl, TRACE_TID_WAIT, w0, w1) / 1000.0;
    x.comm_hidden = timeline_overlap_us(tl, TRACE_TID_COMM, TRACE_TID_COMPUTE, w0, w1) / 1000.0;
    x.copy = timeline_union_us(tl, TRACE_TID_COPY, w0, w1) / 1000.0;
    x.copy_hidden = timeline_overlap_us(tl, TRACE_TID_COPY, TRACE_TID_COMPUTE, w0, w1) / 1000.0;
    x.host = timeline_union_us(tl, TRACE_TID_HOST, w0, w1) / 1000.0;
    x.host_hidden = timeline_overlap_us(tl, TRACE_TID_HOST, TRACE_TID_COMPUTE, w0, w1) / 1000.0;
    x.io = timeline_union_us(tl, TRACE_TID_IO, w0, w1) / 1000.0;
    x.act_copy = timeline_union_us(tl, TRACE_TID_ACT_COPY, w0, w1) / 1000.0;
    x.act_copy_hidden = timeline_overlap_us(tl, TRACE_TID_ACT_COPY, TRACE_TID_COMPUTE, w0, w1) / 1000.0;
    // file I/O hides behind either kind of computing: the device's, or the
    // host optimizer's that the swapper feeds
    x.io_hidden = timeline_overlap_any_us(tl, TRACE_TID_IO, 1u << TRACE_TID_COMPUTE | 1u << TRACE_TID_HOST, w0, w1) /
                  1000.0;
    double *sum = (double *)&r->times_sum;
    const double *add = (const double *)&x;
    for (size_t i = 0; i < sizeof x / sizeof(double); i++) sum[i] += add[i];
    r->times_n++;
    r->window_t1_us = 0;
}

const char *report_category_name(HalfFormat half, MemCategory c) {
    if (half == HALF_FP16 && c == CAT_PARAMS) return "params_fp16";
    if (half == HALF_FP16 && c == CAT_GRADS) return "grads_fp16";
    return mem_category_name(c);
}

// The step line (rank 0): what the step did, its time and rate, the device's memory.
static void print_step(const Report *r, long step, const StepOutcome *o, double ms) {
    const RunFacts *run = &r->run;
    const MemCtx *m = &r->taps.dev->mem;
    char scaling[96] = "";  // fp16: the scale this step used; an overflow's skip
    if (run->loss_scaling)
        snprintf(scaling, sizeof scaling, " | scale %g%s (skipped %ld)", o->loss_scale,
                 o->skipped ? " OVERFLOW, step skipped" : o->grad_norm == 0 ? " UNDERFLOW, every gradient 0" : "",
                 *r->taps.skipped_steps);
    // an overflow's norm is not a number: "nan" or "inf", never a signed "-nan" that reads as a sign
    char norm[32];
    if (isnan(o->grad_norm)) snprintf(norm, sizeof norm, "%7s", "nan");
    else snprintf(norm, sizeof norm, "%7.4f", o->grad_norm);
    printf("step %4ld/%d | loss %.6f | lr %.2e | norm %s%s | %8.1f ms | %9.0f tok/s | device mem %.1f MB (peak %.1f MB)\n",
           step, run->steps, o->loss, o->lr, norm, scaling, ms, run->tokens_per_step / (ms / 1000.0),
           m->tier_current[TIER_DEVICE] / 1e6, m->tier_peak[TIER_DEVICE] / 1e6);
    fflush(stdout);
}

void report_step(Report *r, long step, const StepOutcome *o, const StepMeasure *x) {
    CHECK(r->n < r->cap, "more steps than --steps");
    double t0_us = x->t0_us, t1_us = x->t1_us, ms = (t1_us - t0_us) / 1000.0;
    r->loss[r->n] = o->loss; r->step_ms[r->n] = ms; r->lr[r->n] = o->lr;
    r->grad_norm[r->n] = o->grad_norm; r->comm_bytes[r->n] = x->comm_bytes;
    r->loss_scale[r->n] = o->loss_scale; r->skipped[r->n] = (unsigned char)o->skipped;
    for (int k = 0; k < XFER_COUNT; k++) r->xfer[k][r->n] = x->xfer_bytes[k];
    r->act_down[r->n] = x->act_down;
    r->act_up[r->n] = x->act_up;
    for (int op = 0; op < OP_COUNT; op++) {
        r->op_bytes[op] += x->op_bytes[op];
        for (int c = 0; c < STEP_METER_MAX_COMMS; c++) r->comm_op_bytes[c][op] += x->comm_op_bytes[c][op];
    }
    r->n++;
    r->after_step = r->taps.dev->mem;
    measure_window(r);
    timeline_prune(&r->taps.trace->tl, t0_us);  // this step's window needs nothing that ended before it
    r->window_t0_us = t0_us;
    r->window_t1_us = t1_us;
    if (r->taps.world->rank != 0 || r->run.quiet) return;
    if (step % r->run.print_every != 0 && step != r->run.steps) return;
    print_step(r, step, o, ms);
}

void report_eval(Report *r, long step, double val_loss) {
    r->val_loss = val_loss;
    r->val_step = step;
    if (r->taps.world->rank == 0 && !r->run.quiet) {
        printf("step %4ld/%d | val loss %.6f\n", step, r->run.steps, val_loss);
        fflush(stdout);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *x, long n) {
    if (n == 0) return NAN;
    double *s = xmalloc((size_t)n * sizeof(double));
    memcpy(s, x, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}


// The median over the steps that applied an update, which the traffic
// formulas describe (an fp16 step skipped for an overflow gathers no updated
// parameters); over every step when none did.
static double median_applied(const Report *r, const double *x) {
    double *kept = xmalloc((size_t)(r->n ? r->n : 1) * sizeof(double));
    long k = 0;
    for (long i = 0; i < r->n; i++)
        if (!r->skipped[i]) kept[k++] = x[i];
    double m = k ? median(kept, k) : median(x, r->n);
    free(kept);
    return m;
}

// fp16: the steps of this run skipped for an overflow, and those whose
// gradients were all 0 (a norm of exactly 0: the scale underflowed them).
static void count_scaling(const Report *r, Summary *s) {
    for (long i = 0; i < r->n && r->run.loss_scaling; i++) {
        s->skipped_steps += r->skipped[i];
        if (!r->skipped[i] && r->grad_norm[i] == 0) {
            s->zero_grad_steps++;
            s->zero_grad_scale = r->loss_scale[i];
        }
    }
}

// The memory's timeline beside the formula's: the lowest rank where a step
// differed, else rank 0's (every one equal).
static void summarize_timeline(const Report *r, Summary *s) {
    Comm *world = r->taps.world;
    const TimelineCheck *c = r->taps.timeline;
    TimelineCheck none = {.not_modelled = "no check was made", .bad_step = -1};
    if (!c) c = &none;
    int differs = !c->not_modelled && c->steps_equal < c->steps_checked;
    int mine = differs ? world->rank : world->size, lowest;
    mpiCheck(MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, world->mpi));
    s->timeline_rank = lowest < world->size ? lowest : -1;
    s->timeline = *c;
    // the message's text is a program constant, the same on every rank: it travels as a pointer
    mpiCheck(MPI_Bcast(&s->timeline, sizeof s->timeline, MPI_BYTE, lowest < world->size ? lowest : 0, world->mpi));
    s->timeline_peak = comm_max_f64(world, c->not_modelled ? 0 : c->formula_peak);
    const MemCtx *m = &r->taps.dev->mem;
    double allocated = m->arena_reserved ? (double)m->arena.peak_allocated : 0;
    int equal = !c->not_modelled && allocated == c->arena_peak, all;
    mpiCheck(MPI_Allreduce(&equal, &all, 1, MPI_INT, MPI_MIN, world->mpi));
    s->arena_peak_equal = all;
    s->arena_peak_allocated = comm_max_f64(world, allocated);
    s->formula_arena_peak = comm_max_f64(world, c->not_modelled ? 0 : c->arena_peak);
    double high = m->arena_reserved ? (double)arena_stats(&m->arena).high_water : 0;
    equal = !c->not_modelled && high == c->high_water;
    mpiCheck(MPI_Allreduce(&equal, &all, 1, MPI_INT, MPI_MIN, world->mpi));
    s->high_water_equal = all;
    s->formula_high_water = comm_max_f64(world, c->not_modelled ? 0 : c->high_water);
}

// The same phases and bytes at every boundary (field by field: a
// MemBoundary has padding).
static int same_boundaries(const TimelinePanel *a, const TimelinePanel *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++) {
        const MemBoundary *x = &a->measured[i], *y = &b->measured[i];
        if (x->phase.kind != y->phase.kind || x->phase.unit != y->phase.unit || x->phase.micro != y->phase.micro ||
            memcmp(x->device, y->device, sizeof x->device))
            return 0;
    }
    return 1;
}

// Rank 0 gets every rank's last measured step and formula timeline, and
// keeps those of a rank whose measured boundaries differ from each kept one.
static void gather_panels(const Report *r, Summary *s) {
    Comm *world = r->taps.world;
    const MemCtx *m = &r->taps.dev->mem;
    const StepMemory *f = r->taps.step_formula;
    int modelled = f && f->n && r->taps.timeline && !r->taps.timeline->not_modelled && r->n > 0;
    TimelinePanel mine = {.rank = world->rank, .n = modelled ? m->nbounds : 0, .nformula = modelled ? f->n : 0};
    if (modelled) {
        mine.peak = f->peak, mine.peak_phase = f->peak_phase;
        memcpy(mine.peak_bytes, f->peak_bytes, sizeof mine.peak_bytes);
    }
    int P = world->size, root = world->rank == 0;
    TimelinePanel *all = root ? xcalloc((size_t)P, sizeof *all) : NULL;
    mpiCheck(MPI_Gather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, 0, world->mpi));
    for (int which = 0; which < 2; which++) {  // the measured boundaries, then the formula's
        int *counts = root ? xcalloc((size_t)P, sizeof(int)) : NULL, *at = root ? xcalloc((size_t)P, sizeof(int)) : NULL;
        size_t total = 0;
        for (int q = 0; root && q < P; q++) {
            counts[q] = (which ? all[q].nformula : all[q].n) * (int)sizeof(MemBoundary);
            at[q] = (int)total;
            total += (size_t)counts[q];
        }
        char *buf = root ? xmalloc(total ? total : 1) : NULL;
        const MemBoundary *send = which ? (modelled ? f->b : NULL) : m->bounds;
        int n = (which ? mine.nformula : mine.n) * (int)sizeof(MemBoundary);
        mpiCheck(MPI_Gatherv(send, n, MPI_BYTE, buf, counts, at, MPI_BYTE, 0, world->mpi));
        for (int q = 0; root && q < P; q++) {
            MemBoundary *copy = xmalloc(counts[q] ? (size_t)counts[q] : 1);
            memcpy(copy, buf + at[q], (size_t)counts[q]);
            if (which) all[q].formula = copy;
            else all[q].measured = copy;
        }
        free(buf), free(counts), free(at);
    }
    if (!root) return;
    s->panels = xcalloc((size_t)P, sizeof *s->panels);
    for (int q = 0; q < P; q++) {
        int seen = !all[q].n;
        for (int k = 0; k < s->npanels && !seen; k++) seen = same_boundaries(&s->panels[k], &all[q]);
        if (seen) {
            free(all[q].measured), free(all[q].formula);
            continue;
        }
        s->panels[s->npanels++] = all[q];
    }
    free(all);
}

void summary_free_panels(Summary *s) {
    for (int k = 0; k < s->npanels; k++) free(s->panels[k].measured), free(s->panels[k].formula);
    free(s->panels);
    s->panels = NULL, s->npanels = 0;
}

// Memory: measured (the steady state after the last step, and the peaks)
// beside the formulas, each the largest over the ranks.
static void summarize_memory(const Report *r, Summary *s) {
    const RunFacts *run = &r->run;
    Comm *world = r->taps.world;
    const MemCtx *m = &r->taps.dev->mem;
    const MemCtx *steady = r->n ? &r->after_step : m;
    for (int i = 0; i < TIER_COUNT; i++)
        for (int c = 0; c < CAT_COUNT; c++) {
            s->cur[i][c] = (double)steady->current[i][c];
            s->peak[i][c] = (double)m->peak[i][c];
        }
    for (int i = 0; i < TIER_COUNT; i++) s->tier_peak[i] = (double)m->tier_peak[i];
    // the arena at the device peak of the rank whose peak is the largest (the lowest such rank)
    struct {
        double peak;
        int rank;
    } mine = {-(double)m->tier_peak[TIER_DEVICE], world->rank}, top;
    mpiCheck(MPI_Allreduce(&mine, &top, 1, MPI_DOUBLE_INT, MPI_MINLOC, world->mpi));
    s->arena = m->arena_at_peak;
    s->arena_rank = top.rank;
    mpiCheck(MPI_Bcast(&s->arena, sizeof s->arena, MPI_BYTE, top.rank, world->mpi));
    s->arena_high_water = comm_max_f64(world, m->arena_reserved ? (double)arena_stats(&m->arena).high_water : 0);
    summarize_timeline(r, s);
    gather_panels(r, s);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, s->cur, TIER_COUNT * CAT_COUNT, MPI_DOUBLE, MPI_MAX, world->mpi));
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, s->peak, TIER_COUNT * CAT_COUNT, MPI_DOUBLE, MPI_MAX, world->mpi));
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, s->tier_peak, TIER_COUNT, MPI_DOUBLE, MPI_MAX, world->mpi));
    // each rank's formula (a pipeline stage's part differs from another's), the maximum beside the measured maximum
    stage_state_bytes(run->formula, run->state_params, run->dp_ranks, &s->formula);
    if (run->grad_accum_fp32) stage_add_grad_accum(run->formula, run->state_params, run->dp_ranks, &s->formula);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &s->formula, sizeof s->formula / sizeof(double), MPI_DOUBLE, MPI_MAX,
                           world->mpi));
    s->state_params = comm_max_f64(world, (double)run->state_params);
    for (int c = 0; c < CAT_COUNT; c++) s->buffer_formula[c] = comm_max_f64(world, run->buffer_formula_bytes[c]);
    s->acts = act_formula(run->layout, &run->plan, r->taps.dev->act_bytes);
    // a pipeline's interleaved chunks or zero bubble's W stashes rise and
    // fall apart: without contiguous buffers, where the stage's step is
    // modelled, its activations' peak is the formula's timeline's, not every slot and stash at once
    const TimelineCheck *tc = r->taps.timeline;  // this rank's
    if ((run->plan.chunks > 1 || run->plan.w_slots > 0) && !run->plan.contiguous && tc && !tc->not_modelled)
        s->acts.saved = tc->act_peak;
    s->acts.saved = comm_max_f64(world, s->acts.saved);
    s->acts.working = comm_max_f64(world, s->acts.working);
    s->acts.offloaded = comm_max_f64(world, s->acts.offloaded);
}

// Throughput and FLOPs: the model's, and the hardware's with the recomputation.
static void summarize_rates(const Report *r, Summary *s) {
    const RunFacts *run = &r->run;
    s->step_ms_median = median(r->step_ms, r->n);
    s->tokens_per_s = run->tokens_per_step / (s->step_ms_median / 1000.0);
    s->flops_per_token = gpt_flops_per_token(run->layout, run->seq_len);  // the whole model's (its cfg)
    s->gflops_per_rank = s->flops_per_token * s->tokens_per_s / run->ranks / 1e9;
    s->hw_flops_per_token = s->flops_per_token +
                            recompute_flops_per_token(run->layout, run->seq_len, run->plan.recompute,
                                                      run->plan.attention, run->plan.mlp_tiles) +
                            tiled_loss_flops_per_token(run->layout, run->plan.loss_tiles) +
                            tiled_mlp_flops_per_token(run->layout, run->plan.mlp_tiles);
    s->hw_gflops_per_rank = s->hw_flops_per_token * s->tokens_per_s / run->ranks / 1e9;
}

// Bytes moved per step beside their formulas: between ranks (by operation
// too), between tiers, the activation checkpoints'; and per evaluation.
static void summarize_traffic(const Report *r, Summary *s) {
    const RunFacts *run = &r->run;
    Comm *world = r->taps.world;
    s->comm_bytes_step = r->n ? comm_max_f64(world, median_applied(r, r->comm_bytes)) : 0;
    if (run->comm_formula_text) {  // the stage's own (3d_parallel's grid), each rank's, the largest
        s->comm_formula_bytes = comm_max_f64(world, run->comm_formula_bytes);
        s->comm_formula_text = run->comm_formula_text;
    } else {
        s->comm_formula_bytes = stage_comm_elems(run->formula, (double)run->state_params, run->dp_ranks,
                                                 run->grad_accum) * sizeof(bf16);
        s->comm_formula_text = stage_comm_formula(run->formula);
    }
    stage_transfer_bytes(run->formula, (double)run->state_params, run->dp_ranks, run->grad_accum, s->xfer_formula);
    for (int x = 0; x < XFER_COUNT; x++)
        s->xfer_step[x] = comm_sum_f64(world, r->n ? median_applied(r, r->xfer[x]) : 0) / run->ranks;
    s->act_down = comm_max_f64(world, r->n ? median(r->act_down, r->n) : 0);
    s->act_up = comm_max_f64(world, r->n ? median(r->act_up, r->n) : 0);
    // a micro-batch's offloaded inputs, down in forward and back in backward
    s->act_formula = comm_max_f64(world, s->acts.offload_per_micro * run->grad_accum);
    s->eval_comm_bytes = comm_max_f64(world, r->evals ? r->eval_comm_bytes / r->evals : 0);
    for (int op = 0; op < OP_COUNT; op++) s->op_bytes_step[op] = comm_max_f64(world, r->n ? r->op_bytes[op] / r->n : 0);
}

// Each timeline row's time per step: the mean over the measured steps, then over the ranks.
static void summarize_times(Report *r, Summary *s) {
    measure_window(r);  // the last step
    double *mean = (double *)&s->times;
    const double *sum = (const double *)&r->times_sum;
    for (size_t i = 0; i < sizeof s->times / sizeof(double); i++)
        mean[i] = r->times_n ? sum[i] / r->times_n : 0;
    // the mean over ranks too: a mean keeps every bound the ranks' own figures
    // obey (exposed + compute <= step), where a maximum per row would not
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, mean, (int)(sizeof s->times / sizeof(double)), MPI_DOUBLE, MPI_SUM,
                           r->taps.world->mpi));
    for (size_t i = 0; i < sizeof s->times / sizeof(double); i++) mean[i] /= r->run.ranks;
}

static void summarize(Report *r, Summary *s) {
    s->r = r;
    s->run = &r->run;
    summarize_memory(r, s);
    summarize_rates(r, s);
    summarize_traffic(r, s);
    count_scaling(r, s);
    summarize_times(r, s);
    size_t fr = 0, tot = 0;
    Device *dev = r->taps.dev;
    dev->ops->mem_get_info(dev, &fr, &tot);
    s->driver_free = (double)fr;
    s->driver_total = (double)tot;
}

int report_finish(Report *r, ReportStageRows stage_rows, void *arg) {
    Summary s;
    memset(&s, 0, sizeof s);
    summarize(r, &s);
    int rank0 = r->taps.world->rank == 0;
    if (rank0) {
        print_memory_table(&s);
        print_summary(&s);
    }
    JsonRecord rec;
    FILE *json = rank0 && r->run.json ? json_begin(&s, &rec) : NULL;
    stage_rows(arg, json);  // collective
    if (!rank0) return 0;
    print_summary_line(&s);
    fflush(stdout);
    int rc = json ? json_end(&s, &rec) : 0;
    summary_free_panels(&s);
    return rc;
}
