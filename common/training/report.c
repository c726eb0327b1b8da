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

double global_tokens_per_step(const Trainer *t) {
    return (double)t->dp->size * t->cfg.batch * t->cfg.seq_len * t->cfg.grad_accum;
}

void report_init(Trainer *t) {
    Report *r = &t->report;
    memset(r, 0, sizeof *r);
    r->cap = t->cfg.steps;
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
    r->first_step = t->step;
    r->val_loss = NAN;
    if (t->world.rank == 0) {  // --quiet drops only the per-step lines
        const GPTConfig *m = &t->layout.cfg;
        char replicas[96];  // who reads distinct rows: every rank, or the data-parallel replicas of a grid
        if (t->dp == &t->world) snprintf(replicas, sizeof replicas, "%d ranks", t->world.size);
        else snprintf(replicas, sizeof replicas, "%d ranks = %s | dp %d", t->world.size, t->grid, t->dp->size);
        // Ψ counts wte as stored: V rounded up to 128 rows, the padding said where there is some
        int vp = gpt_vocab_padded(m->vocab_size, 1);
        char padding[96] = "";
        if (vp > m->vocab_size)
            snprintf(padding, sizeof padding, ", %.0f of them in wte's %d padding rows",
                     (double)(vp - m->vocab_size) * m->channels, vp - m->vocab_size);
        printf("%s: %s | model %s (L=%d C=%d H=%d V=%d, %.2fM params%s) | %s x batch %d x seq %d x accum %d = %.0f "
               "tokens/step\n", t->strategy->name, t->dev.name, t->cfg.model, m->num_layers, m->channels,
               m->num_heads, m->vocab_size, t->model_params / 1e6, padding, replicas, t->cfg.batch, t->cfg.seq_len,
               t->cfg.grad_accum, global_tokens_per_step(t));
        printf("data: %s\n", t->data.desc);
    }
}

void report_free(Trainer *t) {
    Report *r = &t->report;
    free(r->loss_scale); free(r->skipped);
    free(r->loss); free(r->step_ms); free(r->lr); free(r->grad_norm); free(r->comm_bytes);
    for (int x = 0; x < XFER_COUNT; x++) free(r->xfer[x]);
    free(r->act_down);
    free(r->act_up);
}

// Measures the window of the step before: every row's union and its
// intersection with compute, then forgets what cannot reach a later window.
static void measure_window(Trainer *t) {
    Report *r = &t->report;
    double w0 = r->window_t0_us, w1 = r->window_t1_us;
    if (w1 <= w0) return;
    const Timeline *tl = &t->trace.tl;
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

const char *report_category_name(const Trainer *t, MemCategory c) {
    if (t->cfg.half == HALF_FP16 && c == CAT_PARAMS) return "params_fp16";
    if (t->cfg.half == HALF_FP16 && c == CAT_GRADS) return "grads_fp16";
    return mem_category_name(c);
}

void report_step(Trainer *t, const StepOutcome *o, const StepMeasure *x) {
    Report *r = &t->report;
    CHECK(r->n < r->cap, "more steps than --steps");
    double loss = o->loss, lr = o->lr, grad_norm = o->grad_norm, loss_scale = o->loss_scale;
    int skipped = o->skipped;
    double t0_us = x->t0_us, t1_us = x->t1_us, ms = (t1_us - t0_us) / 1000.0;
    r->loss[r->n] = loss; r->step_ms[r->n] = ms; r->lr[r->n] = lr;
    r->grad_norm[r->n] = grad_norm; r->comm_bytes[r->n] = x->comm_bytes;
    r->loss_scale[r->n] = loss_scale; r->skipped[r->n] = (unsigned char)skipped;
    for (int k = 0; k < XFER_COUNT; k++) r->xfer[k][r->n] = x->xfer_bytes[k];
    r->act_down[r->n] = x->act_down;
    r->act_up[r->n] = x->act_up;
    for (int op = 0; op < OP_COUNT; op++) {
        r->op_bytes[op] += x->op_bytes[op];
        for (int c = 0; c < STEP_METER_MAX_COMMS; c++) r->comm_op_bytes[c][op] += x->comm_op_bytes[c][op];
    }
    r->n++;
    r->after_step = t->dev.mem;
    measure_window(t);
    timeline_prune(&t->trace.tl, t0_us);  // this step's window needs nothing that ended before it
    r->window_t0_us = t0_us;
    r->window_t1_us = t1_us;
    if (t->world.rank != 0 || t->cfg.quiet) return;
    if (t->step % t->cfg.print_every != 0 && t->step != t->cfg.steps) return;
    const MemCtx *m = &t->dev.mem;
    char scaling[96] = "";  // fp16: the scale this step used; an overflow's skip
    if (t->scaler.enabled)
        snprintf(scaling, sizeof scaling, " | scale %g%s (skipped %ld)", loss_scale,
                 skipped ? " OVERFLOW, step skipped" : grad_norm == 0 ? " UNDERFLOW, every gradient 0" : "",
                 t->scaler.skipped);
    printf("step %4ld/%d | loss %.6f | lr %.2e | norm %7.4f%s | %8.1f ms | %9.0f tok/s | device mem %.1f MB (peak %.1f MB)\n",
           t->step, t->cfg.steps, loss, lr, grad_norm, scaling, ms, global_tokens_per_step(t) / (ms / 1000.0),
           m->tier_current[TIER_DEVICE] / 1e6, m->tier_peak[TIER_DEVICE] / 1e6);
    fflush(stdout);
}

void report_eval(Trainer *t, double val_loss) {
    t->report.val_loss = val_loss;
    t->report.val_step = t->step;
    if (t->world.rank == 0 && !t->cfg.quiet) {
        printf("step %4ld/%d | val loss %.6f\n", t->step, t->cfg.steps, val_loss);
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
static void count_scaling(const Trainer *t, Summary *s) {
    const Report *r = &t->report;
    for (long i = 0; i < r->n && t->scaler.enabled; i++) {
        s->skipped_steps += r->skipped[i];
        if (!r->skipped[i] && r->grad_norm[i] == 0) {
            s->zero_grad_steps++;
            s->zero_grad_scale = r->loss_scale[i];
        }
    }
}

static void summarize(Trainer *t, Summary *s) {
    const MemCtx *m = &t->dev.mem;
    const MemCtx *steady = t->report.n ? &t->report.after_step : m;
    Report *r = &t->report;
    for (int i = 0; i < TIER_COUNT; i++)
        for (int c = 0; c < CAT_COUNT; c++) {
            s->cur[i][c] = (double)steady->current[i][c];
            s->peak[i][c] = (double)m->peak[i][c];
        }
    for (int i = 0; i < TIER_COUNT; i++) s->tier_peak[i] = (double)m->tier_peak[i];
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, s->cur, TIER_COUNT * CAT_COUNT, MPI_DOUBLE, MPI_MAX, t->world.mpi));
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, s->peak, TIER_COUNT * CAT_COUNT, MPI_DOUBLE, MPI_MAX, t->world.mpi));
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, s->tier_peak, TIER_COUNT, MPI_DOUBLE, MPI_MAX, t->world.mpi));
    // each rank's formula (a pipeline stage's part differs from another's), the maximum beside the measured maximum
    stage_state_bytes(t->formula, t->state_params, t->dp->size, &s->formula);
    if (t->cfg.grad_accum_fp32) stage_add_grad_accum(t->formula, t->state_params, t->dp->size, &s->formula);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &s->formula, sizeof s->formula / sizeof(double), MPI_DOUBLE, MPI_MAX,
                           t->world.mpi));
    s->state_params = comm_max_f64(&t->world, (double)t->state_params);
    for (int c = 0; c < CAT_COUNT; c++) s->buffer_formula[c] = comm_max_f64(&t->world, t->buffer_formula_bytes[c]);
    s->acts = act_formula(&t->layout, &t->plan, t->dev.act_bytes);
    s->acts.saved = comm_max_f64(&t->world, s->acts.saved);
    s->acts.working = comm_max_f64(&t->world, s->acts.working);
    s->acts.offloaded = comm_max_f64(&t->world, s->acts.offloaded);
    s->step_ms_median = median(r->step_ms, r->n);
    s->tokens_per_s = global_tokens_per_step(t) / (s->step_ms_median / 1000.0);
    s->flops_per_token = gpt_flops_per_token(&t->layout, t->cfg.seq_len);  // the whole model's (its cfg)
    s->gflops_per_rank = s->flops_per_token * s->tokens_per_s / t->world.size / 1e9;
    s->hw_flops_per_token = s->flops_per_token + recompute_flops_per_token(&t->layout, t->cfg.seq_len, t->plan.recompute,
                                                                              t->plan.attention);
    s->hw_gflops_per_rank = s->hw_flops_per_token * s->tokens_per_s / t->world.size / 1e9;
    s->comm_bytes_step = r->n ? comm_max_f64(&t->world, median_applied(r, r->comm_bytes)) : 0;
    count_scaling(t, s);
    if (t->comm_formula_text) {  // the stage's own (3d_parallel's grid), each rank's, the largest
        s->comm_formula_bytes = comm_max_f64(&t->world, t->comm_formula_bytes);
        s->comm_formula_text = t->comm_formula_text;
    } else {
        s->comm_formula_bytes = stage_comm_elems(t->formula, (double)t->state_params, t->dp->size,
                                                 t->cfg.grad_accum) * sizeof(bf16);
        s->comm_formula_text = stage_comm_formula(t->formula);
    }
    stage_transfer_bytes(t->formula, (double)t->state_params, t->dp->size, t->cfg.grad_accum, s->xfer_formula);
    for (int x = 0; x < XFER_COUNT; x++)
        s->xfer_step[x] = comm_sum_f64(&t->world, r->n ? median_applied(r, r->xfer[x]) : 0) / t->world.size;
    s->act_down = comm_max_f64(&t->world, r->n ? median(r->act_down, r->n) : 0);
    s->act_up = comm_max_f64(&t->world, r->n ? median(r->act_up, r->n) : 0);
    // a micro-batch's offloaded inputs, down in forward and back in backward
    s->act_formula = comm_max_f64(&t->world, s->acts.offload_per_micro * t->cfg.grad_accum);
    s->eval_comm_bytes = comm_max_f64(&t->world, r->evals ? r->eval_comm_bytes / r->evals : 0);
    for (int op = 0; op < OP_COUNT; op++) s->op_bytes_step[op] = comm_max_f64(&t->world, r->n ? r->op_bytes[op] / r->n : 0);
    measure_window(t);  // the last step
    double *mean = (double *)&s->times;
    const double *sum = (const double *)&r->times_sum;
    for (size_t i = 0; i < sizeof s->times / sizeof(double); i++)
        mean[i] = r->times_n ? sum[i] / r->times_n : 0;
    // the mean over ranks too: a mean keeps every bound the ranks' own figures
    // obey (exposed + compute <= step), where a maximum per row would not
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, mean, (int)(sizeof s->times / sizeof(double)), MPI_DOUBLE, MPI_SUM,
                           t->world.mpi));
    for (size_t i = 0; i < sizeof s->times / sizeof(double); i++) mean[i] /= t->world.size;
    size_t fr = 0, tot = 0;
    t->dev.ops->mem_get_info(&t->dev, &fr, &tot);
    s->driver_free = (double)fr;
    s->driver_total = (double)tot;
}

int report_finish(Trainer *t) {
    Summary s;
    memset(&s, 0, sizeof s);
    summarize(t, &s);
    if (t->world.rank == 0) {
        print_memory_table(t, &s);
        print_summary(t, &s);
    }
    FILE *json = t->world.rank == 0 && t->cfg.json ? json_begin(t, &s) : NULL;
    if (t->strategy->report) t->strategy->report(t, json);  // collective
    if (t->world.rank != 0) return 0;
    print_summary_line(t, &s);
    fflush(stdout);
    if (t->cfg.json && !json) return 1;  // json_begin said why
    return json ? json_end(t, json) : 0;
}
