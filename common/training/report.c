// report.c: the per-step line, the end-of-run table and the JSON record.
// Measured figures come from the memory accounting (mem.h), the clocks around
// each step and the comm statistics; formula figures from mem_math.h and
// gpt.h, and every row says which it is.
#include "report.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "act_math.h"
#include "check.h"
#include "trainer.h"

static double global_tokens_per_step(const Trainer *t) {
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
        printf("%s: %s | model %s (L=%d C=%d H=%d V=%d, %.2fM params) | %s x batch %d x seq %d x accum %d = %.0f tokens/step\n",
               t->strategy->name, t->dev.name, t->cfg.model, m->num_layers, m->channels, m->num_heads, m->vocab_size,
               t->model_params / 1e6, replicas, t->cfg.batch, t->cfg.seq_len, t->cfg.grad_accum,
               global_tokens_per_step(t));
        printf("data: %s\n", t->data.desc);
    }
}

void report_free(Trainer *t) {
    Report *r = &t->report;
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

void report_transfers(Trainer *t, const double bytes[XFER_COUNT], double act_down, double act_up) {
    Report *r = &t->report;
    CHECK(r->n < r->cap, "more steps than --steps");
    for (int x = 0; x < XFER_COUNT; x++) r->xfer[x][r->n] = bytes[x];
    r->act_down[r->n] = act_down;
    r->act_up[r->n] = act_up;
}

void report_step(Trainer *t, double loss, double t0_us, double t1_us, double lr, double grad_norm,
                 double comm_bytes) {
    Report *r = &t->report;
    CHECK(r->n < r->cap, "more steps than --steps");
    double ms = (t1_us - t0_us) / 1000.0;
    r->loss[r->n] = loss; r->step_ms[r->n] = ms; r->lr[r->n] = lr;
    r->grad_norm[r->n] = grad_norm; r->comm_bytes[r->n] = comm_bytes;
    r->n++;
    r->after_step = t->dev.mem;
    measure_window(t);
    timeline_prune(&t->trace.tl, t0_us);  // this step's window needs nothing that ended before it
    r->window_t0_us = t0_us;
    r->window_t1_us = t1_us;
    if (t->world.rank != 0 || t->cfg.quiet) return;
    if (t->step % t->cfg.print_every != 0 && t->step != t->cfg.steps) return;
    const MemCtx *m = &t->dev.mem;
    printf("step %4ld/%d | loss %.6f | lr %.2e | norm %7.4f | %8.1f ms | %9.0f tok/s | device mem %.1f MB (peak %.1f MB)\n",
           t->step, t->cfg.steps, loss, lr, grad_norm, ms, global_tokens_per_step(t) / (ms / 1000.0),
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

// Figures of the run, reduced over ranks where they differ.
typedef struct Summary {
    double cur[TIER_COUNT][CAT_COUNT], peak[TIER_COUNT][CAT_COUNT];  // max over ranks
    double tier_peak[TIER_COUNT];
    StateBytes formula;       // max over ranks, as the measured figures
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
    double driver_free, driver_total;
} Summary;

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
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &s->formula, sizeof s->formula / sizeof(double), MPI_DOUBLE, MPI_MAX,
                           t->world.mpi));
    s->state_params = comm_max_f64(&t->world, (double)t->state_params);
    s->acts = act_formula(&t->layout, &t->plan, t->dev.act_bytes);
    s->acts.saved = comm_max_f64(&t->world, s->acts.saved);
    s->acts.working = comm_max_f64(&t->world, s->acts.working);
    s->acts.offloaded = comm_max_f64(&t->world, s->acts.offloaded);
    s->step_ms_median = median(r->step_ms, r->n);
    s->tokens_per_s = global_tokens_per_step(t) / (s->step_ms_median / 1000.0);
    s->flops_per_token = gpt_flops_per_token(&t->layout, t->cfg.seq_len);  // the whole model's (its cfg)
    s->gflops_per_rank = s->flops_per_token * s->tokens_per_s / t->world.size / 1e9;
    s->hw_flops_per_token = s->flops_per_token + recompute_flops_per_token(&t->layout, t->cfg.seq_len, t->plan.recompute);
    s->hw_gflops_per_rank = s->hw_flops_per_token * s->tokens_per_s / t->world.size / 1e9;
    s->comm_bytes_step = r->n ? comm_max_f64(&t->world, median(r->comm_bytes, r->n)) : 0;
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
        s->xfer_step[x] = comm_sum_f64(&t->world, r->n ? median(r->xfer[x], r->n) : 0) / t->world.size;
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

// Formula figure for a (tier, category) row, or NAN where no formula applies.
static double formula_for(const Summary *s, int tier, int cat) {
    if (cat <= CAT_ADAM_V) return s->formula.bytes[tier][cat];
    if (tier == TIER_DEVICE && cat == CAT_ACTIVATIONS) return s->acts.saved;
    if (tier == TIER_DEVICE && cat == CAT_ACT_WORKING) return s->acts.working;
    if (tier == TIER_PINNED && cat == CAT_ACTIVATIONS) return s->acts.offloaded;
    return NAN;
}

static void print_memory_table(const Trainer *t, const Summary *s) {
    printf("\nmemory per rank (measured by the allocator, max over %d ranks; current = after the last step) beside the formula\n", t->world.size);
    printf("  %-7s %-13s %12s %12s %12s\n", "tier", "category", "current MB", "peak MB", "formula MB");
    for (int i = 0; i < TIER_COUNT; i++)
        for (int c = 0; c < CAT_COUNT; c++) {
            double f = formula_for(s, i, c);
            if (s->peak[i][c] == 0 && !(f > 0)) continue;
            char fs[32] = "-";
            if (!isnan(f)) snprintf(fs, sizeof fs, "%.3f", f / 1e6);
            printf("  %-7s %-13s %12.3f %12.3f %12s\n", mem_tier_name(i), mem_category_name(c), s->cur[i][c] / 1e6,
                   s->peak[i][c] / 1e6, fs);
        }
    for (int i = 0; i < TIER_COUNT; i++) {
        double states = 0, states_formula = s->formula.tier_total[i];
        for (int c = 0; c <= CAT_ADAM_V; c++) states += s->cur[i][c];
        if (states == 0 && states_formula == 0 && i != TIER_DEVICE) continue;
        printf("  %s model states: %.3f MB measured, %.3f MB by %s (Psi=%.0f, N=%d, padding %.0f params)\n",
               mem_tier_name((MemTier)i), states / 1e6, states_formula / 1e6, stage_tier_formula(t->formula, (MemTier)i),
               s->state_params, t->dp->size, s->formula.padding_params);
    }
    printf("  device peak: %.3f MB (all categories); counted before the run: %.3f MB (run_device_bytes)",
           s->tier_peak[TIER_DEVICE] / 1e6, t->device_need.total / 1e6);
    if (s->driver_total > 0)
        printf("; driver reports %.1f of %.1f GB free", s->driver_free / 1e9, s->driver_total / 1e9);
    GPTRecompute rc = t->plan.recompute;
    printf("\n  formulas: model states from mem_math; activations (--recompute %s) = %d slot%s x (L_range x per "
           "layer + input, embed and head) + shared, per layer %s", gpt_recompute_name(rc), t->plan.slots,
           t->plan.slots == 1 ? "" : "s", act_formula_layer_text(rc, t->plan.sequence_parallel));
    if (rc != GPT_RECOMPUTE_NONE)
        printf("; act_working = %s", act_formula_working_text(rc, t->plan.sequence_parallel));
    if (t->plan.sequence_parallel) printf("; sequence parallel: the whole tensors / t, + sbhe + sbhe/t shared");
    if (t->plan.offload_activations)
        printf("; --offload-activations: (L_range - 1) sbhe per slot pinned, 2 sbhe on the device");
    printf(" (s = T, b = B, h = C, a = heads, t = tp, e = %d B; act_math.c)\n", t->dev.act_bytes);
}

static void print_summary(const Trainer *t, const Summary *s) {
    const Report *r = &t->report;
    printf("\nthroughput (measured over %ld steps)\n", r->n);
    printf("  step time median     %10.1f ms\n", s->step_ms_median);
    printf("  tokens/s             %10.0f  (%0.f tokens per step / median step time)\n", s->tokens_per_s,
           global_tokens_per_step(t));
    printf("  achieved GFLOP/s     %10.2f per rank (model FLOPs %.3g per token = 6*Psi_matmul + 12*L*C*T, computed)\n",
           s->gflops_per_rank, s->flops_per_token);
    if (t->plan.recompute != GPT_RECOMPUTE_NONE)
        printf("  hardware GFLOP/s     %10.2f per rank (%.3g per token: the model's + %s recompute's %s)\n",
               s->hw_gflops_per_rank, s->hw_flops_per_token, gpt_recompute_name(t->plan.recompute),
               t->plan.recompute == GPT_RECOMPUTE_FULL ? "L*(16*C^2 + 4*C*T)" : "L*4*C*T");
    if (t->dev.peak_flops > 0) {
        printf("  MFU                  %10.1f %% of %.0f TFLOP/s (%s%s)\n", 100 * s->gflops_per_rank * 1e9 / t->dev.peak_flops,
               t->dev.peak_flops / 1e12, t->dev.peak_source, t->dev.sharers > 1 ? ", split among the ranks sharing the GPU" : "");
        if (t->plan.recompute != GPT_RECOMPUTE_NONE)
            printf("  HFU                  %10.1f %% (hardware FLOPs, recomputation counted)\n",
                   100 * s->hw_gflops_per_rank * 1e9 / t->dev.peak_flops);
    } else {
        printf("  MFU                  %10s (%s)\n", "-", t->dev.peak_source ? t->dev.peak_source : "peak unknown");
    }
    printf("communication per step per rank\n");
    printf("  bytes moved          %10.3f MB counted from the collectives issued (ring volume)\n", s->comm_bytes_step / 1e6);
    if (t->comm_formula_text)
        printf("  formula              %10.3f MB = %s\n", s->comm_formula_bytes / 1e6, s->comm_formula_text);
    else
        printf("  formula              %10.3f MB = %s x 2 B (bf16)\n", s->comm_formula_bytes / 1e6, s->comm_formula_text);
    // NCCL's nonblocking calls are timed on the GPU (events), the rest on the host clock
    const StepTimes *x = &s->times;
    const char *clock = t->world.backend == COMM_NCCL ? "CUDA events for nonblocking NCCL calls" : "host clock";
    printf("  exposed comm %.2f ms of step %.2f ms (compute blocked on communication; mean over steps and ranks; %s)\n",
           x->exposed, x->step, clock);
    printf("  in flight            %10.2f ms (wall-clock union of issue-to-completion intervals)\n", x->comm);
    printf("  overlapped           %10.2f ms (in flight while computing: comm intervals ∩ compute intervals;\n"
           "                                  compute %.2f ms)\n", x->comm_hidden, x->compute);
    if (t->dev.kind == DEVICE_CPU && t->world.size > 1 && t->cfg.progress_us > 0)
        printf("  note: a progress thread entered MPI every %d us (--progress-thread), so collectives in flight\n"
               "        could advance during compute; it took CPU time from the compute threads\n", t->cfg.progress_us);
    else if (t->dev.kind == DEVICE_CPU && t->world.size > 1)
        printf("  note: on the cpu device MPI moves a nonblocking collective only inside MPI calls (no progress\n"
               "        thread; try --progress-thread 50), so \"overlapped\" is time in flight, not time spent\n"
               "        transferring\n");
    int xfers = 0;
    for (int k = 0; k < XFER_COUNT; k++) xfers += s->xfer_step[k] > 0 || s->xfer_formula[k] > 0;
    if (xfers) printf("between tiers per step per rank (counted by the stage, mean over ranks) beside the formula\n");
    for (int k = 0; k < XFER_COUNT && xfers; k++)
        if (s->xfer_step[k] > 0 || s->xfer_formula[k] > 0)
            printf("  %-16s %12.3f MB, formula %s = %.3f MB\n", transfer_name((Transfer)k), s->xfer_step[k] / 1e6,
                   stage_transfer_formula(t->formula, (Transfer)k), s->xfer_formula[k] / 1e6);
    if (x->copy > 0 || x->host > 0 || x->io > 0) printf("other work per step (mean, wall-clock; hidden = ∩ compute)\n");
    if (x->copy > 0) printf("  copies between tiers %10.2f ms, hidden %.2f ms\n", x->copy, x->copy_hidden);
    if (x->host > 0) printf("  host optimizer       %10.2f ms, hidden %.2f ms\n", x->host, x->host_hidden);
    if (x->io > 0) {
        printf("  file I/O             %10.2f ms, hidden %.2f ms (∩ compute or host optimizer)", x->io, x->io_hidden);
        double nvme_bytes = s->xfer_step[XFER_NVME_READ] + s->xfer_step[XFER_NVME_WRITE];
        if (nvme_bytes > 0) printf("; %.3f GB/s (nvme bytes / file I/O time)", nvme_bytes / (x->io / 1000) / 1e9);
        printf("\n");
    }
    if (t->plan.offload_activations) {
        printf("activation checkpoints per step per rank (--offload-activations; counted by the model, max over ranks)\n");
        printf("  to the host          %10.3f MB, back %.3f MB; formula k(L_range - 1)sbhe = %.3f MB each way\n",
               s->act_down / 1e6, s->act_up / 1e6, s->act_formula / 1e6);
        printf("  their copies         %10.2f ms, hidden %.2f ms (∩ compute)%s\n", x->act_copy, x->act_copy_hidden,
               t->dev.kind == DEVICE_CPU ? "; the cpu device copies on the computing thread, so nothing hides" : "");
    }
    if (!isnan(r->val_loss)) printf("validation loss      %10.6f at step %ld\n", r->val_loss, r->val_step);
    if (s->eval_comm_bytes > 0)
        printf("evaluation           %10.3f MB communicated per evaluation (counted apart from the steps)\n",
               s->eval_comm_bytes / 1e6);
}

static void json_mem(FILE *f, const Summary *s) {
    fprintf(f, "\"mem\":{");
    for (int i = 0; i < TIER_COUNT; i++) {
        fprintf(f, "%s\"%s\":{", i ? "," : "", mem_tier_name(i));
        for (int c = 0; c < CAT_COUNT; c++)
            fprintf(f, "%s\"%s\":{\"current\":%.0f,\"peak\":%.0f}", c ? "," : "", mem_category_name(c), s->cur[i][c],
                    s->peak[i][c]);
        fprintf(f, ",\"peak_total\":%.0f}", s->tier_peak[i]);
    }
    fprintf(f, "},\"mem_formula\":{");
    for (int i = 0; i < TIER_COUNT; i++) {
        fprintf(f, "%s\"%s\":{", i ? "," : "", mem_tier_name(i));
        for (int c = 0; c <= CAT_ADAM_V; c++)
            fprintf(f, "%s\"%s\":%.0f", c ? "," : "", mem_category_name(c), s->formula.bytes[i][c]);
        fprintf(f, ",\"total\":%.0f}", s->formula.tier_total[i]);
    }
    fprintf(f, ",\"padding_params\":%.0f,\"activations\":%.0f,\"act_working\":%.0f,\"act_offloaded\":%.0f}",
            s->formula.padding_params, s->acts.saved, s->acts.working, s->acts.offloaded);
}

// What the budget check counted before the run (trainer_budget.c).
static void json_need(FILE *f, const RunDeviceBytes *r) {
    fprintf(f, ",\"device_need\":{\"states\":%.0f,\"activations\":%.0f,\"workspace\":%.0f,\"kernel_scratch\":%.0f,"
               "\"stage_buffers\":%.0f,\"held\":%.0f,\"total\":%.0f}",
            r->states, r->activations, r->workspace, r->kernel_scratch, r->stage_buffers, r->held, r->total);
}

static void json_array(FILE *f, const char *name, const double *x, long n) {
    fprintf(f, "\"%s\":[", name);
    for (long i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? "," : "", x[i]);
    fprintf(f, "]");
}

static const char *const xfer_key[XFER_COUNT] = {"d2h", "h2d", "nvme_read", "nvme_write"};

// The run's record up to the stage's own members: appended to --json, left
// open (NULL when it cannot be opened: said in one line).
static FILE *json_begin(const Trainer *t, const Summary *s) {
    FILE *f = fopen(t->cfg.json, "a");
    if (!f) {
        fprintf(stderr, "%s: error: --json %s: cannot append (%s); the run's record was not written\n",
                t->strategy->name, t->cfg.json, strerror(errno));
        return NULL;
    }
    const Report *r = &t->report;
    const GPTConfig *m = &t->layout.cfg;
    fprintf(f, "{\"stage\":\"%s\",\"ranks\":%d,\"device\":\"%s\",\"comm\":\"%s\",\"gpu_sharers\":%d,"
               "\"model\":\"%s\",\"layers\":%d,\"d_model\":%d,"
               "\"heads\":%d,\"vocab\":%d,\"params\":%zu,\"batch\":%d,\"seq_len\":%d,\"grad_accum\":%d,"
               "\"global_batch_tokens\":%.0f,\"first_step\":%ld,\"steps\":%ld,",
            t->strategy->name, t->world.size, t->dev.name, t->world.backend == COMM_NCCL ? "nccl" : "mpi",
            t->dev.sharers, t->cfg.model, m->num_layers, m->channels, m->num_heads,
            m->vocab_size, t->model_params, t->cfg.batch, t->cfg.seq_len, t->cfg.grad_accum,
            global_tokens_per_step(t), r->first_step, r->n);
    json_array(f, "losses", r->loss, r->n);
    fprintf(f, ",");
    json_array(f, "step_ms", r->step_ms, r->n);
    fprintf(f, ",");
    json_array(f, "grad_norms", r->grad_norm, r->n);
    fprintf(f, ",");
    json_array(f, "lrs", r->lr, r->n);
    if (isnan(r->val_loss)) fprintf(f, ",\"val_loss\":null");
    else fprintf(f, ",\"val_loss\":%.9g", r->val_loss);
    fprintf(f, ",\"tokens_per_s\":%.3f,\"step_ms_median\":%.3f,\"flops_per_token\":%.6g,\"gflops_per_rank\":%.4f,",
            s->tokens_per_s, s->step_ms_median, s->flops_per_token, s->gflops_per_rank);
    fprintf(f, "\"recompute\":\"%s\",\"hw_flops_per_token\":%.6g,\"hw_gflops_per_rank\":%.4f,",
            gpt_recompute_name(t->plan.recompute), s->hw_flops_per_token, s->hw_gflops_per_rank);
    if (t->dev.peak_flops > 0)
        fprintf(f, "\"mfu\":%.5f,\"hfu\":%.5f,", s->gflops_per_rank * 1e9 / t->dev.peak_flops,
                s->hw_gflops_per_rank * 1e9 / t->dev.peak_flops);
    else fprintf(f, "\"mfu\":null,\"hfu\":null,");
    json_mem(f, s);
    json_need(f, &t->device_need);
    const StepTimes *x = &s->times;
    fprintf(f, ",\"comm_bytes_per_step\":%.0f,\"comm_formula_bytes_per_step\":%.0f,\"eval_comm_bytes\":%.0f,",
            s->comm_bytes_step, s->comm_formula_bytes, s->eval_comm_bytes);
    fprintf(f, "\"comm_bytes_by_op_per_step\":{");
    for (int op = 0; op < OP_COUNT; op++)
        fprintf(f, "%s\"%s\":%.0f", op ? "," : "", comm_op_name((CommOp)op), s->op_bytes_step[op]);
    fprintf(f, "},");
    fprintf(f, "\"transfer_bytes_per_step\":{");
    for (int k = 0; k < XFER_COUNT; k++)
        fprintf(f, "%s\"%s\":{\"counted\":%.0f,\"formula\":%.0f}", k ? "," : "", xfer_key[k], s->xfer_step[k],
                s->xfer_formula[k]);
    fprintf(f, "},");
    fprintf(f, "\"offload_activations\":%s,\"act_offload_bytes_per_step\":{\"to_host\":%.0f,\"to_device\":%.0f,"
               "\"formula\":%.0f},", t->plan.offload_activations ? "true" : "false", s->act_down, s->act_up,
            s->act_formula);
    fprintf(f, "\"times_ms_per_step\":{\"step\":%.4f,\"compute\":%.4f,\"comm\":%.4f,\"comm_exposed\":%.4f,"
               "\"comm_hidden\":%.4f,\"copy\":%.4f,\"copy_hidden\":%.4f,\"host_optimizer\":%.4f,"
               "\"host_optimizer_hidden\":%.4f,\"io\":%.4f,\"io_hidden\":%.4f,\"act_copy\":%.4f,"
               "\"act_copy_hidden\":%.4f}",
            x->step, x->compute, x->comm, x->exposed, x->comm_hidden, x->copy, x->copy_hidden, x->host,
            x->host_hidden, x->io, x->io_hidden, x->act_copy, x->act_copy_hidden);
    settings_json(&t->cfg.settings, f);
    return f;
}

static int json_end(const Trainer *t, FILE *f) {
    fprintf(f, "}\n");
    int bad = ferror(f) != 0;
    bad |= fclose(f) != 0;  // a full disk shows here, when the buffer is written
    if (bad)
        fprintf(stderr, "%s: error: --json %s: writing failed (%s); the run's record was not written whole\n",
                t->strategy->name, t->cfg.json, strerror(errno));
    return bad;
}

// One line per run, so runs of different stages line up side by side.
static void print_summary_line(const Trainer *t, const Summary *s) {
    const Report *r = &t->report;
    double states = 0;
    for (int c = 0; c <= CAT_ADAM_V; c++) states += s->cur[TIER_DEVICE][c];
    printf("summary %-12s N=%d | loss %.4f val %.4f | %8.0f tok/s | device model states %8.3f MB (formula %8.3f) | "
           "device peak %8.3f MB | comm %7.3f MB/step (formula %7.3f)\n",
           t->strategy->name, t->world.size, r->n ? r->loss[r->n - 1] : NAN, r->val_loss, s->tokens_per_s,
           states / 1e6, s->formula.tier_total[TIER_DEVICE] / 1e6, s->tier_peak[TIER_DEVICE] / 1e6,
           s->comm_bytes_step / 1e6, s->comm_formula_bytes / 1e6);
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
