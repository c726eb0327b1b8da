// trainer_step_memory.c: the formula's timeline of this run's training step
// (step_memory.h), and every step's measured boundaries held to it. The
// spec is made from the formulas alone, before anything is allocated: the
// model states (mem_math.c), the stage's own buffers (its device_buffer_bytes
// and step_shape), the backward's scratch (act_math.c), the kernels' scratch
// (the device's count, which gpt_alloc's caller then reserves whole: a
// constant-size buffer, as ZeRO-R has it) and what the device held before.
#include <stdio.h>
#include <string.h>
#include "act_math.h"
#include "kernels.h"
#include "trainer.h"

// The kernels' scratch as the device counts it for B x T and the attention.
static double kernel_scratch(const Trainer *t, int B, int T, int flash) {
    const GPTConfig *m = &t->layout.cfg;  // the head's GEMM has this rank's wte rows, padding included
    return (double)t->dev.k->scratch_bytes(t->dev.threads, B, T, m->channels, m->num_heads, t->layout.vocab_part,
                                           t->layout.tp_size, flash);
}

double trainer_kernel_scratch(const Trainer *t) {
    return kernel_scratch(t, t->cfg.batch, t->cfg.seq_len, t->plan.attention == GPT_ATTENTION_FLASH);
}

// The run's spec with the plan p (this run's, or one changed by trainer_what_fits).
static void spec_of_plan(const Trainer *t, const GPTPlan *p, double scratch, double held, StepMemorySpec *s) {
    step_memory_base(s, t->formula, &t->layout, p, t->dev.act_bytes, t->state_params, t->dp->size,
                     t->cfg.grad_accum_fp32, t->cfg.grad_accum, scratch, held);
    // the stage's buffers (its blocks) and the shape of its step (zero3's
    // gathers, a pipeline)
    if (t->strategy->step_shape) t->strategy->step_shape(t->sctx, t, s);
}

void trainer_step_memory_spec(const Trainer *t, StepMemorySpec *s, double held) {
    spec_of_plan(t, &t->plan, trainer_kernel_scratch(t), held, s);
}

void trainer_step_memory_init(Trainer *t, double held) {
    StepMemorySpec spec;
    trainer_step_memory_spec(t, &spec, held);
    TimelineCheck *c = &t->timeline_check;
    memset(c, 0, sizeof *c);
    c->not_modelled = spec.not_modelled;
    c->bad_step = -1;
    // A step the formula does not model keeps ZeRO-R's contiguous buffers:
    // then every part lives through the step, and their peaks add up to
    // the device's, as the budget check counts them (run_device_bytes).
    if (spec.not_modelled) {
        if (t->cfg.contiguous_buffers && t->world.rank == 0)
            printf("note: --contiguous-buffers changes nothing here: a step with %s keeps its buffers contiguous "
                   "anyway, as its timeline is not modelled\n", spec.not_modelled);
        t->plan.contiguous = 1;
        return;
    }
    step_memory(&spec, &t->step_formula);
    c->boundaries = t->step_formula.n;
    c->formula_peak = t->step_formula.peak;
    c->arena_peak = t->step_formula.arena_peak;
    c->high_water = t->step_formula.high_water;
    c->act_peak = t->step_formula.cat_peak[CAT_ACTIVATIONS];
    c->peak_phase = t->step_formula.peak_phase;
}

void trainer_step_memory_begin(Trainer *t) {
    if (!t->timeline_check.not_modelled) mem_bounds_start(&t->dev.mem);
}

// After step `step` (1-based): its boundaries beside the formula's; the
// first that differs is kept for the report.
void trainer_step_memory_end(Trainer *t, long step) {
    TimelineCheck *c = &t->timeline_check;
    if (c->not_modelled) return;
    MemCtx *m = &t->dev.mem;
    mem_bounds_stop(m);
    c->steps_checked++;
    int cat, k = step_memory_first_difference(&t->step_formula, m->bounds, m->nbounds, &cat);
    if (k < 0) {
        c->steps_equal++;
        return;
    }
    if (c->bad_step >= 0) return;
    c->bad_step = step;
    c->bad_boundary = k;
    c->bad_cat = cat;
    c->bad_measured_count = m->nbounds;
    if (k < m->nbounds) c->bad_phase = m->bounds[k].phase;
    else if (k < t->step_formula.n) c->bad_phase = t->step_formula.b[k].phase;
    c->bad_measured = cat >= 0 ? (double)m->bounds[k].device[cat] : 0;
    c->bad_formula = cat >= 0 ? (double)t->step_formula.b[k].device[cat] : 0;
    if (cat < 0 && k < m->nbounds && k < t->step_formula.n) c->bad_formula_phase = t->step_formula.b[k].phase;
}

// ---- what would fit ----

// The timeline's total at the first boundary of phase `at`, or -1.
static double total_at(const StepMemory *m, MemPhase at) {
    for (int k = 0; k < m->n; k++) {
        const MemPhase *p = &m->b[k].phase;
        if (p->kind != at.kind || p->unit != at.unit || p->micro != at.micro) continue;
        double total = 0;
        for (int c = 0; c < CAT_COUNT; c++) total += (double)m->b[k].device[c];
        return total;
    }
    return -1;
}

// The formula's timeline of this run with one change: its plan (recompute,
// attention, contiguous buffers, micro-batch), or another stage's formula
// at its flags' defaults over dp ranks (formula != t->formula or dp !=
// the run's: zero1 over 2N, the next stage).
static RunDeviceBytes changed_peak(const Trainer *t, GPTPlan plan, StageId formula, int dp, MemPhase at,
                                   double *there) {
    double scratch = kernel_scratch(t, plan.B, plan.T, plan.attention == GPT_ATTENTION_FLASH);
    StepMemorySpec s;
    if (formula == t->formula && dp == t->dp->size) {
        spec_of_plan(t, &plan, scratch, t->device_need.held, &s);
    } else {
        Partition part;
        partition_init(&part, t->layout.num_params, dp, 0);  // shards padded to equal sizes
        step_memory_base(&s, formula, &t->layout, &plan, t->dev.act_bytes, t->layout.num_params, dp,
                         t->cfg.grad_accum_fp32, t->cfg.grad_accum, scratch, t->device_need.held);
        step_memory_stage_defaults(&s, formula, &part);
    }
    StepMemory out;
    step_memory(&s, &out);
    RunDeviceBytes r = {.total = out.peak, .arena = out.arena_peak, .high_water = out.high_water};
    *there = total_at(&out, at);
    step_memory_free(&out);
    return r;
}

static StageId next_stage(StageId s) {
    return s == STAGE_DP ? STAGE_ZERO1 : s == STAGE_ZERO1 ? STAGE_ZERO2 : s == STAGE_ZERO2 ? STAGE_ZERO3 : s;
}

// One change to the run: its plan, or its stage's formula and data-parallel ranks.
typedef struct Change {
    char flag[64];
    GPTPlan plan;
    StageId formula;
    int dp;
} Change;

static int add_change(Change *ch, int k, const Trainer *t, const char *flag) {
    ch[k] = (Change){.plan = t->plan, .formula = t->formula, .dp = t->dp->size};
    snprintf(ch[k].flag, sizeof ch[k].flag, "%s", flag);
    return k;
}

void trainer_what_fits(const Trainer *t, MemPhase at, double limit, char *out, size_t n) {
    if (n) out[0] = 0;
    if (t->timeline_check.not_modelled || n == 0) return;
    StepMemorySpec own;
    trainer_step_memory_spec(t, &own, t->device_need.held);
    int grid = own.shape == STEP_PIPELINE;  // 3d_parallel: its grid's stages and ranks are its own flags
    const GPTPlan *p = &t->plan;
    Change ch[7];
    int k = 0;
    char flag[64];
    if (p->recompute != GPT_RECOMPUTE_FULL)
        ch[add_change(ch, k++, t, "--recompute full")].plan.recompute = GPT_RECOMPUTE_FULL;
    if (p->attention != GPT_ATTENTION_FLASH)
        ch[add_change(ch, k++, t, "--attention flash")].plan.attention = GPT_ATTENTION_FLASH;
    if (!p->contiguous) ch[add_change(ch, k++, t, "--contiguous-buffers")].plan.contiguous = 1;
    if (!p->loss_tiles && p->last_unit == gpt_unit_head(&t->layout) && (long)p->B * p->T >= 8)
        ch[add_change(ch, k++, t, "--tiled-loss 8")].plan.loss_tiles = 8;
    if (p->B > 1) {
        snprintf(flag, sizeof flag, "--batch %d", p->B / 2);
        ch[add_change(ch, k++, t, flag)].plan.B = p->B / 2;
    }
    if (!grid && next_stage(t->formula) != t->formula) {
        snprintf(flag, sizeof flag, "%s (the next stage)", stage_name(next_stage(t->formula)));
        ch[add_change(ch, k++, t, flag)].formula = next_stage(t->formula);
    }
    if (!grid && t->formula != STAGE_DP) {  // a sharded stage's states shrink with the ranks
        snprintf(flag, sizeof flag, "%d ranks", 2 * t->world.size);
        ch[add_change(ch, k++, t, flag)].dp = 2 * t->dp->size;
    }
    double now = total_at(&t->step_formula, at);
    size_t len = 0;
    for (int i = 0; i < k && len < n; i++) {
        double there;
        RunDeviceBytes r = changed_peak(t, ch[i].plan, ch[i].formula, ch[i].dp, at, &there);
        char pk[32], fr[32] = "";
        snprintf(pk, sizeof pk, "%.3f MB", r.total / 1e6);
        if (there >= 0 && now > there) mem_format_bytes(now - there, fr, sizeof fr);
        len += (size_t)snprintf(out + len, n - len, "%s%s: peak %s%s%s%s, %s", len ? "; " : "", ch[i].flag, pk,
                                fr[0] ? " (frees " : "", fr, fr[0] ? " there)" : "",
                                run_fits(&r, limit, (double)t->dev.mem.arena.capacity) ? "fits" : "does not fit");
    }
}

// The out-of-memory's explanation (mem.h's MemExplain): the formula's
// bytes as the failing phase began beside the measured, and each change
// alone with the formula's peak it gives.
void trainer_explain_oom(void *arg, MemPhase at, double limit, FILE *f) {
    const Trainer *t = arg;
    if (t->timeline_check.not_modelled || !t->step_formula.n) return;
    const MemCtx *m = &t->dev.mem;
    for (int k = 0; k < t->step_formula.n; k++) {
        const MemBoundary *b = &t->step_formula.b[k];
        if (b->phase.kind != at.kind || b->phase.unit != at.unit || b->phase.micro != at.micro) continue;
        const MemBoundary *seen = m->keeping && m->nbounds ? &m->bounds[m->nbounds - 1] : NULL;
        fprintf(f, "  as this phase began (MB, the formula's timeline, step_memory.c%s):", seen ? "; measured" : "");
        for (int c = 0; c < CAT_COUNT; c++) {
            if (!b->device[c] && !(seen && seen->device[c])) continue;
            fprintf(f, " %s %.3f", mem_category_name((MemCategory)c), b->device[c] / 1e6);
            if (seen) fprintf(f, " (%.3f)", seen->device[c] / 1e6);
        }
        fprintf(f, "\n");
        break;
    }
    char fits[1536], lim[32];
    trainer_what_fits(t, at, limit, fits, sizeof fits);
    mem_format_bytes(limit, lim, sizeof lim);
    if (fits[0]) fprintf(f, "  each change alone, by the formula's peak against %s (its blocks placed as the arena "
                         "places them, pages and holes counted): %s\n", lim, fits);
}
