// mem.h: memory accounting by tier x category, current and peak bytes, a
// capacity budget per tier (the device budget is --hbm-gb), and the device
// tier's placement: once the device has reserved its region, every device
// allocation is a block of it (arena.h), so a run whose bytes fit can still
// fail for want of a free block large enough, as on a GPU. Backends map
// offsets to memory; this module counts, places and enforces.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "arena.h"

typedef enum { TIER_DEVICE, TIER_HOST, TIER_PINNED, TIER_NVME, TIER_COUNT } MemTier;

typedef enum {
    CAT_PARAMS,       // bf16 parameters: the kept ones, and zero3's units gathered whole for a while
    CAT_GRADS,        // bf16 gradients
    CAT_MASTER,       // fp32 master weights
    CAT_ADAM_M,       // fp32 Adam first moment
    CAT_ADAM_V,       // fp32 Adam second moment
    CAT_GRAD_ACCUM,   // fp32 gradient accumulator across micro-batches (--grad-accum-dtype fp32)
    CAT_PARAMS_HPZ,   // zero3's ZeRO++ hpZ: a rank's part of the host-local bf16 copy of the weights
    CAT_ACTIVATIONS,  // saved for backward (kept across units)
    CAT_ACT_WORKING,  // one unit's activations that are not kept: recomputed before its backward
    CAT_COMM,         // communication buffers (gradient buckets, a reduced shard, staging)
    CAT_WORKSPACE,    // scratch (fp32 layer gradients, GEMM operands, backward temporaries)
    CAT_COUNT
} MemCategory;
#define CAT_LAST_STATE CAT_GRAD_ACCUM  // the model states are the categories up to this one

const char *mem_tier_name(MemTier t);          // "device", "host", "pinned", "nvme"
const char *mem_category_name(MemCategory c);  // "params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v", "grads_accum_fp32", "params_hpz", "activations", "act_working", "comm_buffers", "workspace"

// Where in the step the run is, for the memory timeline and an
// out-of-memory message: the model's units set forward, backward and
// recompute with the unit, the trainer the micro-batch and the optimizer.
typedef enum {
    PHASE_SETUP,      // before step 1, or between steps
    PHASE_FORWARD,
    PHASE_BACKWARD,
    PHASE_RECOMPUTE,  // a block's forward again before its backward (--recompute)
    PHASE_OPTIMIZER,  // the step's reduction and update
    PHASE_EVAL,       // a validation's forward
    PHASE_WEIGHTS,    // zero bubble's W: a block's weights' gradients, after its B (the backward phase)
    PHASE_COUNT
} MemPhaseKind;

typedef struct MemPhase {
    int kind;   // MemPhaseKind
    int micro;  // the micro-batch of the step (0-based), -1 outside one
    int unit;   // the model's unit, -1 outside one
} MemPhase;

// "forward of unit 3, micro-batch 0", "the optimizer step", ...
const char *mem_phase_text(MemPhase p, char *out, size_t n);
const char *mem_phase_kind_name(int kind);  // "setup", "forward", "backward", "recompute", "optimizer", "eval", "weights"

// The device tier's bytes by category as a phase begins (the memory's
// timeline at its boundaries; step_memory.h computes the formula's).
typedef struct MemBoundary {
    MemPhase phase;
    size_t device[CAT_COUNT];
} MemBoundary;

// Called when an allocation would exceed a tier's budget, to append a line
// that names the stage/rank count that would fit (from the memory math).
typedef void (*MemFitHint)(void *arg, char *out, size_t out_len);
// Called when a device allocation fails (over the budget, or no block holds
// it), to explain it below the breakdown: what the formula says at phase
// `at`, and what would fit in `limit` bytes.
typedef void (*MemExplain)(void *arg, MemPhase at, double limit, FILE *f);

typedef struct MemCtx {
    size_t current[TIER_COUNT][CAT_COUNT];
    size_t peak[TIER_COUNT][CAT_COUNT];
    size_t tier_current[TIER_COUNT];
    size_t tier_peak[TIER_COUNT];
    size_t budget[TIER_COUNT];  // 0 = no budget
    MemFitHint fit_hint;        // may be NULL
    void *fit_hint_arg;
    MemExplain explain;         // may be NULL; called with fit_hint_arg
    Arena arena;                // the device tier's blocks; capacity 0 until mem_reserve_device
    int arena_reserved;
    ArenaStats arena_at_peak;   // the arena when the device tier last reached its peak
    MemPhase phase;             // where in the step
    struct MemTimeline *tl;     // recording the device and pinned tiers (--memory-timeline), else NULL
    MemBoundary *bounds;        // the device tier at each phase change since mem_bounds_begin, while keeping
    int nbounds, capbounds, keeping;
} MemCtx;

void mem_init(MemCtx *m);
void mem_set_budget(MemCtx *m, MemTier t, size_t bytes);
// Record an allocation. Over budget: prints one error line naming the tier,
// the request and the budget (with the fit hint), then the breakdown, and
// exits with status 2 (fail_rank). `what` names the buffer ("layer 3 activations").
void mem_track_alloc(MemCtx *m, MemTier t, MemCategory c, size_t bytes, const char *what);
void mem_track_free(MemCtx *m, MemTier t, MemCategory c, size_t bytes);
// The phase of the step from now on (unit, micro: -1 where none).
void mem_set_phase(MemCtx *m, MemPhaseKind kind, int unit, int micro);
// From now on each phase change keeps the device tier's bytes (the earlier
// ones forgotten), until mem_bounds_stop.
void mem_bounds_start(MemCtx *m);
void mem_bounds_stop(MemCtx *m);

// The device tier's region, `bytes` of it: from now on mem_alloc places
// every device allocation in it.
void mem_reserve_device(MemCtx *m, size_t bytes);
// mem_track_alloc, and on the device tier (once reserved) the block's
// offset in the region: 0 on the other tiers. No free block large enough
// is the same error as going over the budget, with the arena's state.
size_t mem_alloc(MemCtx *m, MemTier t, MemCategory c, size_t bytes, const char *what);
// mem_track_free, and on the device tier the block at `offset` released
// (`what`: its name, for the memory timeline).
void mem_free(MemCtx *m, MemTier t, MemCategory c, size_t bytes, size_t offset, const char *what);
// The arena's own memory (its block list), at the device's end.
void mem_release(MemCtx *m);
// Would `bytes` more on tier t stay within its budget?
int mem_fits(const MemCtx *m, MemTier t, size_t bytes);
// Reset peaks to the current values (e.g. after set-up, to measure a step);
// the arena's state at the peak too.
void mem_reset_peaks(MemCtx *m);
// "1.20 GB", "12.5 MB", "300 B" (GB = 1e9 bytes, as --hbm-gb counts them).
void mem_format_bytes(double bytes, char *out, size_t n);
// Print the breakdown: one row per (tier, category) with any use, current and peak.
void mem_print_breakdown(const MemCtx *m, FILE *out);
