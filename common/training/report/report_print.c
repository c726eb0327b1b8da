// report_print.c: the end-of-run text (see report_summary.h): memory per
// rank by tier and category beside the formulas, throughput with MFU (and
// HFU), communication with its exposed and overlapped time, the other work
// of the step, and one summary line per run.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "report_summary.h"

// A stage's formula with handout 07's names for a grid: Ψ -> Ψ_s, N -> D.
static void grid_formula(const char *f, char *out, size_t n) {
    size_t k = 0;
    for (const char *p = f; *p && k + 4 < n; p++) {
        if (!strncmp(p, "Ψ", strlen("Ψ"))) {
            k += (size_t)snprintf(out + k, n - k, "Ψ_s");
            p += strlen("Ψ") - 1;
        } else {
            out[k++] = *p == 'N' ? 'D' : *p;
        }
    }
    out[k] = 0;
}

// Formula figure for a (tier, category) row, or NAN where no formula applies.
static double formula_for(const Summary *s, int tier, int cat) {
    if (cat <= CAT_LAST_STATE) return s->formula.bytes[tier][cat];
    if (tier == TIER_DEVICE && s->buffer_formula[cat] > 0) return s->buffer_formula[cat];
    if (tier == TIER_DEVICE && cat == CAT_ACTIVATIONS) return s->acts.saved;
    if (tier == TIER_DEVICE && cat == CAT_ACT_WORKING) return s->acts.working;
    if (tier == TIER_PINNED && cat == CAT_ACTIVATIONS) return s->acts.offloaded;
    return NAN;
}

// The memory at every phase boundary of every step beside the formula's timeline (step_memory.c).
static void print_timeline_check(const Summary *s) {
    const TimelineCheck *c = &s->timeline;
    if (c->not_modelled) {
        printf("\n  memory timeline: the formula's leaves this run out (%s)", c->not_modelled);
        return;
    }
    char where[128];
    mem_phase_text(c->peak_phase, where, sizeof where);
    if (s->timeline_rank < 0) {
        printf("\n  memory timeline: each step's %d phase boundaries beside the formula's (step_memory.c): equal to "
               "the byte in all %ld steps on every rank; the formula's peak %.3f MB, during %s", c->boundaries,
               c->steps_checked, s->timeline_peak / 1e6, where);
        printf("\n  the arena's blocks at their largest (each rounded up to its pages): %.3f MB measured, %.3f MB by "
               "the formula's timeline (%s on every rank); its high-water mark (holes included) %.3f MB measured, "
               "%.3f MB by the timeline replayed through the arena (%s on every rank); the budget check counts the "
               "formula's", s->arena_peak_allocated / 1e6, s->formula_arena_peak / 1e6,
               s->arena_peak_equal ? "equal" : "NOT equal", s->arena_high_water / 1e6, s->formula_high_water / 1e6,
               s->high_water_equal ? "equal" : "NOT equal");
        return;
    }
    mem_phase_text(c->bad_phase, where, sizeof where);
    if (c->bad_cat >= 0) {
        printf("\n  memory timeline DIFFERS from the formula's (step_memory.c): rank %d, step %ld, boundary %d (%s): "
               "%s %.0f B measured, %.0f B by the formula", s->timeline_rank, c->bad_step, c->bad_boundary, where,
               mem_category_name((MemCategory)c->bad_cat), c->bad_measured, c->bad_formula);
    } else {
        char want[128];
        mem_phase_text(c->bad_formula_phase, want, sizeof want);
        printf("\n  memory timeline DIFFERS from the formula's (step_memory.c): rank %d, step %ld, boundary %d: %s "
               "measured, %s by the formula (%d boundaries measured, %d by the formula)", s->timeline_rank,
               c->bad_step, c->bad_boundary, where, want, c->bad_measured_count, c->boundaries);
    }
}

// How the activation rows' formulas count: the plan's recompute, attention
// and the activations' place.
static void print_act_formulas(const GPTPlan *p, int act_bytes) {
    GPTRecompute rc = p->recompute;
    int flash = p->attention == GPT_ATTENTION_FLASH;
    printf("\n  formulas: model states from mem_math; activations (--recompute %s, --attention %s) = %d slot%s x "
           "(L_range x per layer + input, embed and head) + shared, per layer %s", gpt_recompute_name(rc),
           gpt_attention_name(p->attention), p->slots, p->slots == 1 ? "" : "s",
           act_formula_layer_text(rc, p->sequence_parallel, flash));
    if (rc != GPT_RECOMPUTE_NONE)
        printf("; act_working = %s", act_formula_working_text(rc, p->sequence_parallel, flash));
    if (p->sequence_parallel) printf("; sequence parallel: the whole tensors / t, + sbhe + sbhe/t shared");
    if (p->offload_activations)
        printf("; --offload-activations: (L_range - 1) sbhe per slot pinned, 2 sbhe on the device");
    if (p->mlp_tiles)
        printf("; --tiled-mlp %d: 8sbhe/t less a layer (fc's and the GELU's outputs; of the working set under full "
               "recompute), and one chunk of each shared: 2 x ceil(sb/%d) tokens rounded up to 16 x 4h/t x e",
               p->mlp_tiles, p->mlp_tiles);
    if (p->loss_tiles)
        printf("; --tiled-loss %d: the head's logits sbVe per slot become one chunk's, shared: ceil(sb/%d) tokens "
               "rounded up to 16, at most sb, x Ve", p->loss_tiles, p->loss_tiles);
    if (gpt_plan_ulysses(p))
        printf("; --cp %d (Ulysses): s is the rank's part of the sequence, T/%d, and a layer keeps the attention "
               "core's output on the heads' positions too, sbhe/t more (of the working set under full recompute); "
               "the all-to-alls' send and receive buffers, 3sbhe/t each, are workspace", p->cp, p->cp);
    if (gpt_plan_ring(p))
        printf("; --cp %d --cp-mode ring: s is the rank's two chunks of the sequence, T/%d, and a layer keeps "
               "what one of s positions keeps; workspace holds the ring's k and v at hand and coming, 4sbhe/t, "
               "their fp32 gradients likewise, 16sbh/t, an fp32 output (or dq) 4sbh/t and the chunks' position "
               "rows 4sh", p->cp, p->cp);
    printf(" (s = %s, b = B, h = C, a = heads, t = tp, e = %d B; act_math.c)\n", gpt_plan_cp(p) > 1 ? "T/cp" : "T",
           act_bytes);
}

void print_memory_table(const Summary *s) {
    const RunFacts *run = s->run;
    printf("\nmemory per rank (measured by the allocator, max over %d ranks; current = after the last step) beside the formula\n", run->ranks);
    printf("  %-7s %-16s %12s %12s %12s\n", "tier", "category", "current MB", "peak MB", "formula MB");
    for (int i = 0; i < TIER_COUNT; i++)
        for (int c = 0; c < CAT_COUNT; c++) {
            double f = formula_for(s, i, c);
            if (s->peak[i][c] == 0 && !(f > 0)) continue;
            char fs[32] = "-";
            if (!isnan(f)) snprintf(fs, sizeof fs, "%.3f", f / 1e6);
            printf("  %-7s %-16s %12.3f %12.3f %12s\n", mem_tier_name(i), report_category_name(run->half, c),
                   s->cur[i][c] / 1e6, s->peak[i][c] / 1e6, fs);
        }
    for (int i = 0; i < TIER_COUNT; i++) {
        double states = 0, states_formula = s->formula.tier_total[i];
        for (int c = 0; c <= CAT_LAST_STATE; c++) states += s->cur[i][c];
        if (states == 0 && states_formula == 0 && i != TIER_DEVICE) continue;
        char f[128];
        snprintf(f, sizeof f, "%s", stage_tier_formula(run->formula, (MemTier)i));
        if (run->grad_accum_fp32 && run->grads_tier == (MemTier)i) {  // --grad-accum-dtype fp32
            size_t len = strlen(f);
            snprintf(f + len, sizeof f - len, " + %s (fp32 gradient accumulator)",
                     stage_grad_accum_formula(run->formula));
        }
        if (run->grid[0]) {  // on a grid: this stage's part Ψ_s over its D replicas, as handout 07 names them
            char g[64];
            grid_formula(f, g, sizeof g);
            printf("  %s model states: %.3f MB measured, %.3f MB by %s (Psi_s=%.0f, this rank's part of the model; "
                   "D=%d replicas of it on the grid %s; padding %.0f params)\n", mem_tier_name((MemTier)i),
                   states / 1e6, states_formula / 1e6, g, s->state_params, run->dp_ranks, run->grid,
                   s->formula.padding_params);
            continue;
        }
        printf("  %s model states: %.3f MB measured, %.3f MB by %s (Psi=%.0f, N=%d, padding %.0f params)\n",
               mem_tier_name((MemTier)i), states / 1e6, states_formula / 1e6, f, s->state_params, run->dp_ranks,
               s->formula.padding_params);
    }
    printf("  device peak: %.3f MB (all categories); counted before the run: %.3f MB (%s)",
           s->tier_peak[TIER_DEVICE] / 1e6, run->device_need.total / 1e6,
           s->timeline.not_modelled ? "run_device_bytes: each part at its own peak"
                                    : "the formula's timeline: its peak, step_memory.c");
    if (s->driver_total > 0)
        printf("; driver reports %.1f of %.1f GB free", s->driver_free / 1e9, s->driver_total / 1e9);
    const ArenaStats *a = &s->arena;
    if (a->reserved) {
        char res[32], big[32];
        mem_format_bytes((double)a->reserved, res, sizeof res);
        mem_format_bytes((double)a->largest_free, big, sizeof big);
        printf("\n  device arena at the peak (rank %d): %.3f MB in %d blocks (each request rounded up to %zu-byte "
               "pages%s) of %s reserved; largest free block %s, fragmentation %.3f (1 - largest free / free); "
               "high-water mark %.3f MB (the end of the highest block: a region that holds the run; all measured)",
               s->arena_rank, a->allocated / 1e6, a->blocks - a->free_blocks, ARENA_ALIGN,
               ARENA_GUARD ? ", and a guard page" : "", res, big, arena_fragmentation(a), s->arena_high_water / 1e6);
    }
    print_timeline_check(s);
    print_act_formulas(&run->plan, s->r->taps.dev->act_bytes);
}

static void print_throughput(const Summary *s) {
    const RunFacts *run = s->run;
    const Device *dev = s->r->taps.dev;
    printf("\nthroughput (measured over %ld steps)\n", s->r->n);
    printf("  step time median     %10.1f ms\n", s->step_ms_median);
    printf("  tokens/s             %10.0f  (%0.f tokens per step / median step time)\n", s->tokens_per_s,
           run->tokens_per_step);
    printf("  achieved GFLOP/s     %10.2f per rank (model FLOPs %.3g per token = 6*Psi_matmul + 12*L*C*T, computed)\n",
           s->gflops_per_rank, s->flops_per_token);
    GPTRecompute rc = run->plan.recompute;
    int flash = run->plan.attention == GPT_ATTENTION_FLASH;
    // what runs again: the materialized attention under selective (flash
    // keeps no probabilities to recompute), the block's forward under full
    // (the tiled MLP's fc runs again in its own backward, the tiled loss's head too)
    int mlp = run->plan.mlp_tiles > 0;
    const char *again = rc == GPT_RECOMPUTE_FULL ? (mlp ? "L*(8*C^2 + 4*C*T): full recompute"
                                                         : "L*(16*C^2 + 4*C*T): full recompute")
                        : rc == GPT_RECOMPUTE_SELECTIVE && !flash ? "L*4*C*T: selective recompute" : NULL;
    char tiles[160];
    snprintf(tiles, sizeof tiles, "%s%s%s%s", again && (mlp || run->plan.loss_tiles) ? " + " : "",
             mlp ? "L*8*C^2: the tiled MLP's fc" : "", mlp && run->plan.loss_tiles ? " + " : "",
             run->plan.loss_tiles ? "2*V*C: the tiled loss's head" : "");
    if (again || tiles[0])
        printf("  hardware GFLOP/s     %10.2f per rank (%.3g per token: the model's + %s%s)\n", s->hw_gflops_per_rank,
               s->hw_flops_per_token, again ? again : "", tiles);
    const RecomputeWork *w = s->r->taps.recompute;
    if (w->blocks) {  // counted from the kernels the recompute asked for (kernel_meter.c)
        printf("  recompute per block  %10.2f kernels, %.4g FLOP (formula %d, %.4g)", (double)w->kernels / w->blocks,
               w->flops / w->blocks, recompute_kernels_per_block(run->layout, &run->plan),
               recompute_flops_per_block(run->layout, &run->plan));
        printf(w->overwrote ? "; it wrote over %s, which the block kept\n" : "; none wrote what the block kept\n",
               w->overwrote);
    }
    if (dev->peak_flops <= 0) {
        printf("  MFU                  %10s (%s)\n", "-", dev->peak_source ? dev->peak_source : "peak unknown");
        return;
    }
    printf("  MFU                  %10.1f %% of %.0f TFLOP/s (%s%s)\n",
           100 * s->gflops_per_rank * 1e9 / dev->peak_flops, dev->peak_flops / 1e12, dev->peak_source,
           dev->sharers > 1 ? ", split among the ranks sharing the GPU" : "");
    if (again)
        printf("  HFU                  %10.1f %% (hardware FLOPs, recomputation counted)\n",
               100 * s->hw_gflops_per_rank * 1e9 / dev->peak_flops);
}

static void print_comm(const Summary *s) {
    const RunFacts *run = s->run;
    int cpu_device = s->r->taps.dev->kind == DEVICE_CPU;
    printf("communication per step per rank\n");
    printf("  bytes moved          %10.3f MB counted from the collectives issued (ring volume)\n", s->comm_bytes_step / 1e6);
    if (run->comm_formula_text)
        printf("  formula              %10.3f MB = %s\n", s->comm_formula_bytes / 1e6, s->comm_formula_text);
    else
        printf("  formula              %10.3f MB = %s x 2 B (%s)\n", s->comm_formula_bytes / 1e6, s->comm_formula_text,
               half_format_name(run->half));
    // NCCL's nonblocking calls are timed on the GPU (events), the rest on the host clock
    const StepTimes *x = &s->times;
    int nccl = s->r->taps.world->backend == COMM_NCCL;
    const char *clock = nccl ? "CUDA events for nonblocking NCCL calls" : "host clock";
    printf("  exposed comm %.2f ms of step %.2f ms (compute blocked on communication; mean over steps and ranks; %s)\n",
           x->exposed, x->step, clock);
    printf("  in flight            %10.2f ms (wall-clock union of issue-to-completion intervals)\n", x->comm);
    printf("  overlapped           %10.2f ms (in flight while computing: comm intervals ∩ compute intervals;\n"
           "                                  compute %.2f ms)\n", x->comm_hidden, x->compute);
    if (cpu_device && run->ranks > 1 && run->progress_us > 0)
        printf("  note: a progress thread entered MPI every %d us (--progress-thread), so collectives in flight\n"
               "        could advance during compute; it took CPU time from the compute threads\n", run->progress_us);
    else if (cpu_device && run->ranks > 1)
        printf("  note: on the cpu device MPI moves a nonblocking collective only inside MPI calls (no progress\n"
               "        thread; try --progress-thread 50), so \"overlapped\" is time in flight, not time spent\n"
               "        transferring\n");
}

// The step beside the two step times that the transfer (the copies between
// tiers) could give, from the same spans: compute + transfer, where every
// copy is waited for (a synchronous swap), and max(compute, transfer), where
// every copy runs beside compute (a prefetched one). On the cpu device a copy
// runs on the thread that computes, so the step can only follow the sum.
static void print_swap_formulas(const StepTimes *x, int cpu_device) {
    printf("  swap formulas        compute + transfer = %.2f + %.2f = %.2f ms (every copy waited for), "
           "max(compute, transfer) = %.2f ms (every copy beside compute); the step took %.2f ms%s\n", x->compute,
           x->copy, x->compute + x->copy, fmax(x->compute, x->copy), x->step,
           cpu_device ? " (cpu device: a copy runs on the computing thread)" : "");
}

// Bytes between tiers, the host's and the disk's work, the activation checkpoints' copies.
static void print_other_work(const Summary *s) {
    const StepTimes *x = &s->times;
    int cpu_device = s->r->taps.dev->kind == DEVICE_CPU;
    int xfers = 0;
    for (int k = 0; k < XFER_COUNT; k++) xfers += s->xfer_step[k] > 0 || s->xfer_formula[k] > 0;
    if (xfers) printf("between tiers per step per rank (counted by the stage, mean over ranks) beside the formula\n");
    for (int k = 0; k < XFER_COUNT && xfers; k++)
        if (s->xfer_step[k] > 0 || s->xfer_formula[k] > 0)
            printf("  %-16s %12.3f MB, formula %s = %.3f MB\n", transfer_name((Transfer)k), s->xfer_step[k] / 1e6,
                   stage_transfer_formula(s->run->formula, (Transfer)k), s->xfer_formula[k] / 1e6);
    if (x->copy > 0 || x->host > 0 || x->io > 0) printf("other work per step (mean, wall-clock; hidden = ∩ compute)\n");
    if (x->copy > 0) printf("  copies between tiers %10.2f ms, hidden %.2f ms\n", x->copy, x->copy_hidden);
    if (x->copy > 0) print_swap_formulas(x, cpu_device);
    if (x->host > 0) printf("  host optimizer       %10.2f ms, hidden %.2f ms\n", x->host, x->host_hidden);
    if (x->io > 0) {
        printf("  file I/O             %10.2f ms, hidden %.2f ms (∩ compute or host optimizer)", x->io, x->io_hidden);
        double nvme_bytes = s->xfer_step[XFER_NVME_READ] + s->xfer_step[XFER_NVME_WRITE];
        if (nvme_bytes > 0) printf("; %.3f GB/s (nvme bytes / file I/O time)", nvme_bytes / (x->io / 1000) / 1e9);
        printf("\n");
    }
    if (!s->run->plan.offload_activations) return;
    printf("activation checkpoints per step per rank (--offload-activations; counted by the model, max over ranks)\n");
    printf("  to the host          %10.3f MB, back %.3f MB; formula k(L_range - 1)sbhe = %.3f MB each way\n",
           s->act_down / 1e6, s->act_up / 1e6, s->act_formula / 1e6);
    printf("  their copies         %10.2f ms, hidden %.2f ms (∩ compute)%s\n", x->act_copy, x->act_copy_hidden,
           cpu_device ? "; the cpu device copies on the computing thread, so nothing hides" : "");
}

// fp16's steps that trained nothing: skipped for an overflow, or with every
// gradient flushed to 0 by a scale too small for fp16 (below 2^-24). A few
// skipped steps are dynamic scaling finding its scale; all of them is a
// scale that never comes down within the run.
static void print_scaling(const Summary *s) {
    long n = s->r->n;
    int dynamic = s->run->loss_scale_dynamic;
    if (s->skipped_steps == n)
        printf("fp16 loss scaling    %ld of %ld steps skipped: the gradients overflowed at every step, so this run "
               "applied no update; %s\n", n, n, dynamic ? "lower --initial-scale-power (the dynamic scale halves "
               "only at every --hysteresis-th overflow)" : "lower --loss-scale");
    else if (s->skipped_steps)
        printf("fp16 loss scaling    %ld of %ld steps skipped: the gradients overflowed, so they applied no update\n",
               s->skipped_steps, n);
    if (s->zero_grad_steps)
        printf("fp16 loss scaling    %ld of %ld steps had every gradient 0: the loss scale %g underflows them (fp16 "
               "flushes what is below 2^-24 to 0), so they learned nothing from their data; raise %s\n",
               s->zero_grad_steps, n, s->zero_grad_scale, dynamic ? "--initial-scale-power" : "--loss-scale");
    if (s->skipped_steps == n && s->comm_bytes_step < s->comm_formula_bytes)
        printf("  (with no update applied, the bytes moved lack the updated parameters the formula counts)\n");
}

void print_summary(const Summary *s) {
    const Report *r = s->r;
    print_throughput(s);
    print_comm(s);
    print_other_work(s);
    if (!isnan(r->val_loss)) printf("validation loss      %10.6f at step %ld\n", r->val_loss, r->val_step);
    if (s->eval_comm_bytes > 0)
        printf("evaluation           %10.3f MB communicated per evaluation (counted apart from the steps)\n",
               s->eval_comm_bytes / 1e6);
    print_scaling(s);
}

// One line per run, so runs of different stages line up side by side.
void print_summary_line(const Summary *s) {
    const Report *r = s->r;
    double states = 0;
    for (int c = 0; c <= CAT_LAST_STATE; c++) states += s->cur[TIER_DEVICE][c];
    printf("summary %-12s N=%d | loss %.4f val %.4f | %8.0f tok/s | device model states %8.3f MB (formula %8.3f) | "
           "device peak %8.3f MB | comm %7.3f MB/step (formula %7.3f)",
           s->run->stage, s->run->ranks, r->n ? r->loss[r->n - 1] : NAN, r->val_loss, s->tokens_per_s,
           states / 1e6, s->formula.tier_total[TIER_DEVICE] / 1e6, s->tier_peak[TIER_DEVICE] / 1e6,
           s->comm_bytes_step / 1e6, s->comm_formula_bytes / 1e6);
    if (s->skipped_steps) printf(" | fp16: %ld of %ld steps skipped (overflow)", s->skipped_steps, r->n);
    if (s->zero_grad_steps)
        printf(" | fp16: %ld of %ld steps with every gradient 0 (underflow)", s->zero_grad_steps, r->n);
    printf("\n");
}


