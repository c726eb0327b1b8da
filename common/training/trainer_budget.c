// trainer_budget.c: the device memory a run will need, counted before
// anything is allocated (mem_math's run_device_bytes: model states,
// activations, workspace, kernel scratch, the stage's own buffers), so that a
// run that cannot fit is one line from rank 0 saying which part is too large,
// rather than an allocation failing on every rank halfway through.
#include <stdio.h>
#include <unistd.h>
#include "check.h"
#include "kernels.h"
#include "trainer.h"

// Each part at its own peak (run_device_bytes); the total is the formula's
// timeline's peak, the largest sum at one moment (step_memory.h), where the
// stage's step is modelled, else the sum of the parts' peaks.
static RunDeviceBytes device_need(Trainer *t) {
    double buffers = t->strategy->device_buffer_bytes
                         ? t->strategy->device_buffer_bytes(t->sctx, &t->layout, &t->part)
                         : 0;
    double held = (double)t->dev.mem.tier_current[TIER_DEVICE];
    RunDeviceBytes r = run_device_bytes(t->formula, &t->layout, &t->plan, t->state_params, t->dp->size,
                                        t->dev.act_bytes, trainer_kernel_scratch(t), buffers, held);
    if (t->cfg.grad_accum_fp32) {  // the fp32 accumulator, where it sits on the device
        StateBytes acc = {0};
        stage_add_grad_accum(t->formula, t->state_params, t->dp->size, &acc);
        r.states += acc.tier_total[TIER_DEVICE];
        r.total += acc.tier_total[TIER_DEVICE];
    }
    trainer_step_memory_init(t, held);
    if (!t->timeline_check.not_modelled) r.total = t->timeline_check.formula_peak;
    r.arena = t->timeline_check.not_modelled ? r.total : t->timeline_check.arena_peak;
    r.high_water = t->timeline_check.not_modelled ? r.total : t->timeline_check.high_water;
    return r;
}

// The ranks of a grid (3d_parallel) hold different parts of the model: the
// count of the rank that needs the most, on every rank, so that all decide
// alike and the report sets it beside the peak over ranks.
static RunDeviceBytes largest_over_ranks(const Trainer *t, RunDeviceBytes mine) {
    struct {
        double total;
        int rank;
    } in = {mine.total, t->world.rank}, out;
    mpiCheck(MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, t->world.mpi));
    mpiCheck(MPI_Bcast(&mine, sizeof mine, MPI_BYTE, out.rank, t->world.mpi));
    return mine;
}

// Without --hbm-gb the cpu device's memory is the host's, shared by the
// ranks on this node.
static double host_bytes_per_rank(int local_size) {
    double bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    return bytes / (local_size > 0 ? local_size : 1);
}

// What does not depend on how the stage keeps its states: activations,
// workspace, kernel scratch and what the device held before.
static double common_bytes(const RunDeviceBytes *r) {
    return r->activations + r->workspace + r->kernel_scratch + r->held;
}

// What to change for a run over `limit`: --batch when the stage-independent
// part alone exceeds it; the stage's own buffers (--bucket-mb, --prefetch)
// when they are what tips it over; else which stages' model states fit in
// what activations, workspace and scratch leave (stage_fit_hint; each
// stage's buffers come on top). The stage refused is never among them: its
// states with its buffers are more than that by definition.
static void hint_for(const Trainer *t, double limit, char *out, size_t n) {
    const RunDeviceBytes *r = &t->device_need;
    char a[32], b[32];
    if (common_bytes(r) >= limit) {
        mem_format_bytes(common_bytes(r), a, sizeof a);
        snprintf(out, n, "lower --batch or --seq-len: activations, workspace and scratch alone need %s", a);
        return;
    }
    double left = limit - common_bytes(r);
    mem_format_bytes(left, b, sizeof b);
    if (r->states <= left) {
        mem_format_bytes(r->stage_buffers, a, sizeof a);
        snprintf(out, n, "%s is left beside activations, workspace and scratch, enough for %s's model states but "
                 "not for its buffers too (%s): lower its --bucket-mb or --prefetch", b, t->strategy->name, a);
        return;
    }
    char fits[1024];
    stage_fit_hint(t->layout.num_params, t->world.size, left, fits, sizeof fits);
    snprintf(out, n, "%s is left for model states beside activations, workspace and scratch (each stage's buffers "
             "come on top): %s", b, fits);
}

// Where the limit comes from, for the message.
static void limit_text(const Trainer *t, double limit, int local_size, char *out, size_t n) {
    char l[32];
    mem_format_bytes(limit, l, sizeof l);
    if (t->cfg.hbm_gb > 0) snprintf(out, n, "--hbm-gb is %g (%s)", t->cfg.hbm_gb, l);
    else if (t->dev.kind == DEVICE_CUDA) snprintf(out, n, "the GPU gives each rank %s (no --hbm-gb)", l);
    else
        snprintf(out, n, "no --hbm-gb budget is set and the cpu device's memory is the host's, %s for each of "
                 "the %d ranks on this node", l, local_size);
}

// Where the formula's timeline peaks and what it holds there, and each
// change alone (trainer_what_fits), for the refusal: ", at its peak ...".
static void peak_and_changes(const Trainer *t, double limit, char *out, size_t n) {
    const StepMemory *m = &t->step_formula;
    if (t->timeline_check.not_modelled || !m->n) return;
    char where[128], fits[1536];
    size_t len = (size_t)snprintf(out, n, ", at its peak (during %s) it holds", mem_phase_text(m->peak_phase, where,
                                                                                             sizeof where));
    for (int c = 0; c < CAT_COUNT && len < n; c++)
        if (m->peak_bytes[c] > 0)
            len += (size_t)snprintf(out + len, n - len, " %s %.3f MB", mem_category_name((MemCategory)c),
                                    m->peak_bytes[c] / 1e6);
    trainer_what_fits(t, m->peak_phase, limit, fits, sizeof fits);
    if (fits[0] && len < n) snprintf(out + len, n - len, "; each change alone, by the formula's peak: %s", fits);
}

// The bytes fit and the arena's blocks do not: rounded up to its pages, or
// where it places them, with the free bytes left in holes between them.
// The refusal says which, and by how much.
static void refuse_arena(const Trainer *t, double limit, double region) {
    const RunDeviceBytes *r = &t->device_need;
    char need[32], pages[32], reg[32], high[32], more[32], when[2048] = "";
    peak_and_changes(t, limit, when, sizeof when);
    mem_format_bytes(r->total, need, sizeof need);
    mem_format_bytes(r->arena - r->total, pages, sizeof pages);
    snprintf(reg, sizeof reg, "%.3f MB", region / 1e6);  // the two differ by pages: MB to 3 decimals
    snprintf(high, sizeof high, "%.3f MB", r->high_water / 1e6);
    mem_format_bytes(r->high_water - region, more, sizeof more);
    if (r->arena > region)
        fail_usage("%s needs %s of device memory per rank, within its budget, but its blocks rounded up to the "
                   "arena's %zu-byte pages take %s more at the step's peak (the formula's timeline, step_memory.c), "
                   "past the device's region of %s%s; hint: give --hbm-gb that much more, or lower --batch or "
                   "--seq-len", t->strategy->name, need, ARENA_ALIGN, pages, reg, when);
    fail_usage("%s needs %s of device memory per rank, within its budget, and %s more in the arena's %zu-byte "
               "pages, within the device's region of %s, but the arena places its blocks up to %s: the buffers "
               "that come and go between longer-lived ones leave the free bytes in holes (fragmentation; the "
               "formula's timeline replayed through the arena, step_memory.c)%s; hint: --contiguous-buffers keeps "
               "the activations and the gradients in regions of their own (ZeRO-R), or give --hbm-gb %s more",
               t->strategy->name, need, pages, ARENA_ALIGN, reg, high, when, more);
}

void trainer_check_budget(Trainer *t, int local_size) {
    t->device_need = largest_over_ranks(t, device_need(t));
    double budget = (double)t->dev.mem.budget[TIER_DEVICE];
    double limit = budget > 0 ? budget : host_bytes_per_rank(local_size);
    double region = (double)t->dev.mem.arena.capacity;
    const RunDeviceBytes *r = &t->device_need;
    if (run_fits(r, limit, region)) return;
    if (r->total <= limit) refuse_arena(t, limit, region);
    char need[32], st[32], act[32], ws[32], sc[32], buf[32], lim[200], hint[1280];
    mem_format_bytes(r->total, need, sizeof need);
    mem_format_bytes(r->states, st, sizeof st);
    mem_format_bytes(r->activations, act, sizeof act);
    mem_format_bytes(r->workspace + r->held, ws, sizeof ws);
    mem_format_bytes(r->kernel_scratch, sc, sizeof sc);
    mem_format_bytes(r->stage_buffers, buf, sizeof buf);
    limit_text(t, limit, local_size, lim, sizeof lim);
    hint_for(t, limit, hint, sizeof hint);
    char when[2048] = "";
    peak_and_changes(t, limit, when, sizeof when);
    fail_usage("%s needs %s of device memory per rank (model states %s by %s, activations %s, workspace %s, "
               "kernel scratch %s, %s's buffers %s) but %s%s; %s", t->strategy->name, need, st,
               stage_formula(t->formula), act, ws, sc, t->strategy->name, buf, lim, when, hint);
}

void trainer_fit_hint(void *arg, char *out, size_t n) {
    const Trainer *t = arg;
    double budget = (double)t->dev.mem.budget[TIER_DEVICE];
    if (budget > 0) hint_for(t, budget, out, n);
    else snprintf(out, n, "hint: no --hbm-gb budget is set");
}
