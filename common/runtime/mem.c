// mem.c: memory accounting by tier x category (see mem.h). Pure bookkeeping:
// backends map memory, this module counts, keeps peaks, enforces budgets and
// places the device tier's blocks in its arena.
#include "mem.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "mem_timeline.h"

static const char *const tier_names[TIER_COUNT] = {"device", "host", "pinned", "nvme"};
static const char *const category_names[CAT_COUNT] = {
    "params_bf16", "grads_bf16", "master_fp32", "adam_m",
    "adam_v",      "grads_accum_fp32", "params_hpz", "activations", "act_working", "comm_buffers", "workspace"};

const char *mem_tier_name(MemTier t) {
    return (t >= 0 && t < TIER_COUNT) ? tier_names[t] : "unknown-tier";
}

const char *mem_category_name(MemCategory c) {
    return (c >= 0 && c < CAT_COUNT) ? category_names[c] : "unknown-category";
}

void mem_init(MemCtx *m) {
    memset(m, 0, sizeof *m);
    m->phase = (MemPhase){PHASE_SETUP, -1, -1};
}

static const char *const phase_names[PHASE_COUNT] = {"setup", "forward", "backward", "recompute", "optimizer",
                                                     "eval", "weights"};

const char *mem_phase_kind_name(int kind) { return kind >= 0 && kind < PHASE_COUNT ? phase_names[kind] : "?"; }

const char *mem_phase_text(MemPhase p, char *out, size_t n) {
    int k = 0;
    if (p.kind == PHASE_SETUP) k = snprintf(out, n, "set-up (outside a step)");
    else if (p.kind == PHASE_OPTIMIZER) k = snprintf(out, n, "the optimizer step");
    else if (p.unit >= 0) k = snprintf(out, n, "%s of unit %d", mem_phase_kind_name(p.kind), p.unit);
    else k = snprintf(out, n, "%s", mem_phase_kind_name(p.kind));
    if (p.micro >= 0 && p.kind != PHASE_SETUP && p.kind != PHASE_OPTIMIZER && k >= 0 && (size_t)k < n)
        snprintf(out + k, n - (size_t)k, ", micro-batch %d", p.micro);
    return out;
}

void mem_set_phase(MemCtx *m, MemPhaseKind kind, int unit, int micro) {
    MemPhase now = {kind, micro, unit};
    if (now.kind == m->phase.kind && now.unit == m->phase.unit && now.micro == m->phase.micro) return;
    m->phase = now;
    if (m->tl) mem_timeline_phase(m->tl, now);
    if (!m->keeping) return;
    if (m->nbounds == m->capbounds) {
        m->capbounds = m->capbounds ? 2 * m->capbounds : 256;
        m->bounds = xrealloc(m->bounds, (size_t)m->capbounds * sizeof *m->bounds);
    }
    MemBoundary *b = &m->bounds[m->nbounds++];
    b->phase = now;
    memcpy(b->device, m->current[TIER_DEVICE], sizeof b->device);
}

void mem_bounds_start(MemCtx *m) {
    m->nbounds = 0;
    m->keeping = 1;
}

void mem_bounds_stop(MemCtx *m) { m->keeping = 0; }

void mem_set_budget(MemCtx *m, MemTier t, size_t bytes) {
    CHECK(t >= 0 && t < TIER_COUNT, "mem_set_budget: bad tier %d", (int)t);
    m->budget[t] = bytes;
}

int mem_fits(const MemCtx *m, MemTier t, size_t bytes) {
    if (m->budget[t] == 0) return 1;
    return m->tier_current[t] <= m->budget[t] && bytes <= m->budget[t] - m->tier_current[t];
}

void mem_format_bytes(double bytes, char *out, size_t n) {
    if (bytes >= 1e12) snprintf(out, n, "%.2f TB", bytes / 1e12);
    else if (bytes >= 1e9) snprintf(out, n, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6) snprintf(out, n, "%.1f MB", bytes / 1e6);
    else if (bytes >= 1e3) snprintf(out, n, "%.1f kB", bytes / 1e3);
    else snprintf(out, n, "%.0f B", bytes);
}

// The message of a device allocation that no free block holds, or of any
// tier's that goes over its budget: one error line, then the breakdown (and
// the arena's state), so that the error line comes first.
static void out_of_memory(const MemCtx *m, MemTier t, MemCategory c, size_t bytes, const char *what, int no_block) {
    char req[32], after[32], budget[32], hint[1280] = "", line[1600];
    mem_format_bytes((double)bytes, req, sizeof req);
    mem_format_bytes((double)m->tier_current[t] + (double)bytes, after, sizeof after);
    mem_format_bytes((double)m->budget[t], budget, sizeof budget);
    if (m->fit_hint) m->fit_hint(m->fit_hint_arg, hint, sizeof hint);
    if (!hint[0])
        snprintf(hint, sizeof hint, "hint: raise %s, or use a stage that shards more state "
                 "(zero1 < zero2 < zero3) or more ranks", t == TIER_DEVICE ? "--hbm-gb" : "the budget");
    if (no_block) {
        ArenaStats s = arena_stats(&m->arena);
        char fr[32], big[32], res[32];
        mem_format_bytes((double)s.free_bytes, fr, sizeof fr);
        mem_format_bytes((double)s.largest_free, big, sizeof big);
        mem_format_bytes((double)s.reserved, res, sizeof res);
        // the bytes fit the budget: the hint is about where they lie, not how many there are
        const char *more = "hint: the region must hold the highest block as well as the bytes: give --hbm-gb a "
                           "block's worth more (a run that fits records its arena's high-water mark in its --json "
                           "record, arena.high_water)";
        if (s.free_bytes >= arena_rounded(bytes))
            snprintf(line, sizeof line, "device memory fragmented: no free block holds %s for '%s' (%s): %s of the "
                     "%s reserved are free in %d blocks, the largest %s (fragmentation %.2f = 1 - largest / free); "
                     "hint: the free bytes lie between blocks that live longer: --contiguous-buffers keeps the "
                     "activations and the gradients in regions of their own (ZeRO-R's defragmentation); %s", req,
                     what ? what : "?", mem_category_name(c), fr, res, s.free_blocks, big, arena_fragmentation(&s),
                     more + strlen("hint: "));
        else
            snprintf(line, sizeof line, "device memory: no free block holds %s for '%s' (%s): the blocks, each "
                     "rounded up to %zu bytes, leave %s of the %s reserved; %s", req, what ? what : "?",
                     mem_category_name(c), ARENA_ALIGN, fr, res, more);
    } else if (t == TIER_DEVICE) {
        snprintf(line, sizeof line, "device memory over --hbm-gb: allocating %s for '%s' would bring device use to "
                 "%s, budget %s; %s", req, what ? what : "?", after, budget, hint);
    } else {
        snprintf(line, sizeof line, "%s memory over its budget: allocating %s for '%s' would bring %s use to %s, "
                 "budget %s; %s", mem_tier_name(t), req, what ? what : "?", mem_tier_name(t), after, budget, hint);
    }
    char *table = NULL;
    size_t table_len = 0;
    FILE *f = open_memstream(&table, &table_len);
    if (f) {
        char where[128];
        fprintf(f, "  during %s\n", mem_phase_text(m->phase, where, sizeof where));
        mem_print_breakdown(m, f);
        if (m->explain && t == TIER_DEVICE)
            m->explain(m->fit_hint_arg, m->phase, no_block ? (double)m->arena.capacity : (double)m->budget[t], f);
        // --memory-timeline: what this rank recorded up to here (the other ranks cannot be asked now)
        if (m->tl && m->tl->oom_path) {
            if (mem_timeline_write_local(m->tl, m->tl->oom_path, world_rank()) == 0)
                fprintf(f, "  the memory timeline up to here (rank %d's, %s): %s\n", world_rank(),
                        m->tl->step ? "this step" : "the set-up", m->tl->oom_path);
        }
        fclose(f);
    }
    fail_rank(EXIT_USAGE, "%s\n%s", line, table ? table : "");
}

void mem_track_alloc(MemCtx *m, MemTier t, MemCategory c, size_t bytes, const char *what) {
    CHECK(t >= 0 && t < TIER_COUNT && c >= 0 && c < CAT_COUNT,
          "mem_track_alloc: bad tier %d or category %d for '%s'", (int)t, (int)c, what ? what : "?");
    if (!mem_fits(m, t, bytes)) out_of_memory(m, t, c, bytes, what, 0);
    m->current[t][c] += bytes;
    m->tier_current[t] += bytes;
    if (m->current[t][c] > m->peak[t][c]) m->peak[t][c] = m->current[t][c];
    if (m->tier_current[t] > m->tier_peak[t]) m->tier_peak[t] = m->tier_current[t];
}

void mem_reserve_device(MemCtx *m, size_t bytes) {
    CHECK(!m->arena_reserved, "mem_reserve_device: the device's region is reserved already");
    arena_init(&m->arena, bytes);
    m->arena_reserved = 1;
    m->arena_at_peak = arena_stats(&m->arena);
}

// The timeline records the device and pinned tiers.
static void note(MemCtx *m, MemTier t, MemCategory c, long long delta, size_t offset, const char *what) {
    if (m->tl && (t == TIER_DEVICE || t == TIER_PINNED)) mem_timeline_note(m->tl, m->phase, t, c, delta, offset, what);
}

size_t mem_alloc(MemCtx *m, MemTier t, MemCategory c, size_t bytes, const char *what) {
    if (t != TIER_DEVICE || !m->arena_reserved) {
        mem_track_alloc(m, t, c, bytes, what);
        note(m, t, c, (long long)bytes, 0, what);
        return 0;
    }
    if (!mem_fits(m, t, bytes)) out_of_memory(m, t, c, bytes, what, 0);
    size_t offset = arena_alloc(&m->arena, bytes);
    if (offset == ARENA_NONE) out_of_memory(m, t, c, bytes, what, 1);
    size_t peak = m->tier_peak[t];
    mem_track_alloc(m, t, c, bytes, what);
    if (m->tier_current[t] > peak) m->arena_at_peak = arena_stats(&m->arena);
    note(m, t, c, (long long)bytes, offset, what);
    return offset;
}

void mem_release(MemCtx *m) {
    if (m->arena_reserved) arena_destroy(&m->arena);
    m->arena_reserved = 0;
    free(m->bounds);
    m->bounds = NULL;
    m->nbounds = m->capbounds = m->keeping = 0;
}

void mem_free(MemCtx *m, MemTier t, MemCategory c, size_t bytes, size_t offset, const char *what) {
    mem_track_free(m, t, c, bytes);
    int placed = t == TIER_DEVICE && m->arena_reserved;
    if (placed) arena_free(&m->arena, offset);
    note(m, t, c, -(long long)bytes, placed ? offset : 0, what);
}

void mem_track_free(MemCtx *m, MemTier t, MemCategory c, size_t bytes) {
    CHECK(t >= 0 && t < TIER_COUNT && c >= 0 && c < CAT_COUNT,
          "mem_track_free: bad tier %d or category %d", (int)t, (int)c);
    CHECK(bytes <= m->current[t][c],
          "mem_track_free: freeing %zu bytes of %s/%s but only %zu are allocated; hint: a buffer "
          "was freed twice or with another tier/category than it was allocated with",
          bytes, mem_tier_name(t), mem_category_name(c), m->current[t][c]);
    m->current[t][c] -= bytes;
    m->tier_current[t] -= bytes;
}

void mem_reset_peaks(MemCtx *m) {
    for (int t = 0; t < TIER_COUNT; t++) {
        for (int c = 0; c < CAT_COUNT; c++) m->peak[t][c] = m->current[t][c];
        m->tier_peak[t] = m->tier_current[t];
    }
    if (m->arena_reserved) m->arena_at_peak = arena_stats(&m->arena);
}

// One table, MB = 1e6 bytes:
//   tier    category       current MB     peak MB
//   device  params_bf16         248.1       248.1
//   device  total               300.0       512.3   (budget 2000.0)
// A tier's peak total is the peak of the sum, not the sum of the peaks.
void mem_print_breakdown(const MemCtx *m, FILE *out) {
    fprintf(out, "  %-7s %-13s %12s %12s\n", "tier", "category", "current MB", "peak MB");
    for (int t = 0; t < TIER_COUNT; t++) {
        if (m->tier_peak[t] == 0 && m->tier_current[t] == 0) continue;
        for (int c = 0; c < CAT_COUNT; c++) {
            if (m->current[t][c] == 0 && m->peak[t][c] == 0) continue;
            fprintf(out, "  %-7s %-13s %12.1f %12.1f\n", tier_names[t], category_names[c],
                    m->current[t][c] / 1e6, m->peak[t][c] / 1e6);
        }
        fprintf(out, "  %-7s %-13s %12.1f %12.1f", tier_names[t], "total",
                m->tier_current[t] / 1e6, m->tier_peak[t] / 1e6);
        if (m->budget[t]) fprintf(out, "   (budget %.1f)", m->budget[t] / 1e6);
        fprintf(out, "\n");
    }
    if (m->arena_reserved) {
        ArenaStats s = arena_stats(&m->arena);
        fprintf(out, "  device arena: %.1f MB reserved, %.1f MB in %d blocks of %zu-byte pages, %.1f MB free in %d "
                "blocks, the largest %.1f MB (fragmentation %.2f)\n", s.reserved / 1e6, s.allocated / 1e6,
                s.blocks - s.free_blocks, ARENA_ALIGN, s.free_bytes / 1e6, s.free_blocks, s.largest_free / 1e6,
                arena_fragmentation(&s));
    }
}
