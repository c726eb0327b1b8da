// mem_math.c: the ZeRO memory and communication formulas (see mem_math.h).
// Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models" (2020): 2 + 2 + 12 = 16 bytes per parameter with mixed
// precision Adam (K = 12 optimizer bytes); Ren et al., "ZeRO-Offload" (2021);
// Rajbhandari et al., "ZeRO-Infinity" (2021); Korthikanti et al., "Reducing
// Activation Recomputation in Large Transformer Models" (2022).
#include "mem_math.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

static const char *const names[STAGE_COUNT] = {
    "dp_baseline", "zero1", "zero2", "zero3", "cpu_offload", "infinity",
};
static const char *const formulas[STAGE_COUNT] = {
    "16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N", "2Ψ (device) + 14Ψ/N (host)", "16Ψ/N (nvme)",
};

const char *stage_name(StageId s) { return s >= 0 && s < STAGE_COUNT ? names[s] : "?"; }
const char *stage_formula(StageId s) { return s >= 0 && s < STAGE_COUNT ? formulas[s] : "?"; }

const char *stage_tier_formula(StageId s, MemTier t) {
    switch (s) {
    case STAGE_OFFLOAD:
        return t == TIER_DEVICE ? "2Ψ" : t == TIER_PINNED ? "14Ψ/N" : "0";
    case STAGE_INFINITY:
        return t == TIER_NVME ? "16Ψ/N" : "0";
    default:
        return t == TIER_DEVICE ? stage_formula(s) : "0";
    }
}

StatesLayout stage_states_layout(StageId s) {
    // extents: params, grads, optim; tiers: params, grads, optim
    static const StatesLayout layouts[STAGE_COUNT] = {
        [STAGE_DP] = {STATE_FULL, STATE_FULL, STATE_FULL, TIER_DEVICE, TIER_DEVICE, TIER_DEVICE},
        [STAGE_ZERO1] = {STATE_FULL, STATE_FULL, STATE_SHARD, TIER_DEVICE, TIER_DEVICE, TIER_DEVICE},
        [STAGE_ZERO2] = {STATE_FULL, STATE_SHARD, STATE_SHARD, TIER_DEVICE, TIER_DEVICE, TIER_DEVICE},
        [STAGE_ZERO3] = {STATE_SHARD, STATE_SHARD, STATE_SHARD, TIER_DEVICE, TIER_DEVICE, TIER_DEVICE},
        // ZeRO-Offload keeps the reduce-scattered gradient shard on the host,
        // where the CPU Adam reads it (Ren et al. keep it in a device buffer
        // on its way out, hence the paper's device 2Ψ + 2Ψ/N; here the
        // device side of that transfer is a comm buffer, not a model state).
        [STAGE_OFFLOAD] = {STATE_FULL, STATE_SHARD, STATE_SHARD, TIER_DEVICE, TIER_PINNED, TIER_PINNED},
        [STAGE_INFINITY] = {STATE_SHARD, STATE_SHARD, STATE_SHARD, TIER_NVME, TIER_NVME, TIER_NVME},
    };
    CHECK(s >= 0 && s < STAGE_COUNT, "stage_states_layout: no stage %d", (int)s);
    return layouts[s];
}

// Bytes of a layout given the element counts of a FULL state (padded or not)
// and of a shard. states_alloc's rule: FULL is padded unless the optimizer is
// FULL too (the unpartitioned baseline), which keeps exactly Ψ.
static void layout_bytes(const StatesLayout *l, double psi, double psi_pad, double shard,
                         StateBytes *out) {
    memset(out, 0, sizeof *out);
    double full = l->optim == STATE_FULL ? psi : psi_pad;
    double elems[3];
    const StateExtent ext[3] = {l->params, l->grads, l->optim};
    for (int i = 0; i < 3; i++)
        elems[i] = ext[i] == STATE_FULL ? full : ext[i] == STATE_SHARD ? shard : 0;
    out->bytes[l->params_tier][CAT_PARAMS] += 2 * elems[0];
    out->bytes[l->grads_tier][CAT_GRADS] += 2 * elems[1];
    out->bytes[l->optim_tier][CAT_MASTER] += 4 * elems[2];
    out->bytes[l->optim_tier][CAT_ADAM_M] += 4 * elems[2];
    out->bytes[l->optim_tier][CAT_ADAM_V] += 4 * elems[2];
    for (int t = 0; t < TIER_COUNT; t++)
        for (int c = 0; c < CAT_COUNT; c++) out->tier_total[t] += out->bytes[t][c];
    out->padding_params = l->optim == STATE_FULL ? 0 : psi_pad - psi;
}

void stage_state_bytes(StageId s, size_t psi, int ranks, StateBytes *out) {
    Partition p;
    partition_init(&p, psi, ranks, 0);  // every rank's shard has the same size
    StatesLayout l = stage_states_layout(s);
    layout_bytes(&l, (double)psi, (double)p.padded, (double)p.shard, out);
}

void stage_formula_state_bytes(StageId s, double psi, int ranks, StateBytes *out) {
    StatesLayout l = stage_states_layout(s);
    layout_bytes(&l, psi, psi, psi / ranks, out);
}

double stage_formula_bytes(StageId s, double psi, int ranks) {
    StateBytes b;
    stage_formula_state_bytes(s, psi, ranks, &b);
    double total = 0;
    for (int t = 0; t < TIER_COUNT; t++) total += b.tier_total[t];
    return total;
}

double stage_comm_elems(StageId s, double psi, int ranks, int grad_accum) {
    double ring = psi * (ranks - 1) / ranks;  // one reduce-scatter or one all-gather of Ψ
    int k = grad_accum > 0 ? grad_accum : 1;
    switch (s) {
    case STAGE_DP:     // all-reduce (= reduce-scatter + all-gather) once per step
    case STAGE_ZERO1:  // reduce-scatter accumulated grads, all-gather updated params
        return 2 * ring;
    case STAGE_ZERO2:  // grads leave every micro-batch (the non-owned ones are freed)
    case STAGE_OFFLOAD:
        return k * ring + ring;
    case STAGE_ZERO3:  // gather in forward, gather in backward, reduce-scatter: every micro-batch
    case STAGE_INFINITY:
        return 3.0 * k * ring;
    default:
        return 0;
    }
}

const char *stage_comm_formula(StageId s) {
    switch (s) {
    case STAGE_DP: return "2Ψ(N-1)/N";
    case STAGE_ZERO1: return "2Ψ(N-1)/N";
    case STAGE_ZERO2:
    case STAGE_OFFLOAD: return "(k+1)Ψ(N-1)/N";
    case STAGE_ZERO3:
    case STAGE_INFINITY: return "3kΨ(N-1)/N";
    default: return "?";
    }
}

double korthikanti_layer_bytes(double s, double b, double h, double a) {
    return s * b * h * (34 + 5 * a * s / h);
}

// Model states are linear in Ψ (unpadded), so the device bytes per parameter
// is the device total at Ψ = 1. Device tier only: what offload and infinity
// move to host/NVMe is exactly what stops limiting the model size. Infinity
// keeps no model state on the device, so no Ψ is too large for the device
// (its limits are NVMe capacity, 16Ψ/N, and the largest layer): HUGE_VAL.
double stage_max_params(StageId s, double bytes_per_rank, int ranks) {
    StateBytes b;
    stage_formula_state_bytes(s, 1.0, ranks, &b);
    double per_param = b.tier_total[TIER_DEVICE];
    return per_param > 0 ? bytes_per_rank / per_param : HUGE_VAL;
}

static double device_state_bytes(StageId s, size_t psi, int ranks) {
    StateBytes b;
    stage_state_bytes(s, psi, ranks, &b);
    return b.tier_total[TIER_DEVICE];
}

__attribute__((format(printf, 3, 4))) static void appendf(char *out, size_t n, const char *fmt, ...) {
    size_t len = strlen(out);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + len, n - len, fmt, ap);
    va_end(ap);
}

// Smallest power-of-two rank count up to 1024 at which the stage's device
// model states fit, or 0.
static int fits_from_ranks(StageId s, size_t psi, double budget_bytes) {
    for (int r = 1; r <= 1024; r *= 2)
        if (device_state_bytes(s, psi, r) <= budget_bytes) return r;
    return 0;
}

// Device model states only (activations and buffers come on top), with the
// padding states_alloc adds.
void stage_fit_hint(size_t psi, int ranks, double budget_bytes, char *out, size_t n) {
    const StageId order[4] = {STAGE_DP, STAGE_ZERO1, STAGE_ZERO2, STAGE_ZERO3};
    if (n == 0) return;
    out[0] = 0;
    int nfit = 0;
    for (int i = 0; i < 4; i++) {
        double b = device_state_bytes(order[i], psi, ranks);
        if (b > budget_bytes) continue;
        appendf(out, n, "%s%s (%.3g GB)", nfit++ ? ", " : "", stage_name(order[i]), b / 1e9);
    }
    char fits[512];
    snprintf(fits, sizeof fits, "%s", out);
    if (nfit) snprintf(out, n, "fits at %d ranks: %s", ranks, fits);
    else snprintf(out, n, "no stage's model states fit in %.3g GB at %d ranks", budget_bytes / 1e9, ranks);
    for (int i = 0; i < 4; i++) {
        StageId s = order[i];
        if (device_state_bytes(s, psi, ranks) <= budget_bytes) continue;
        int from = fits_from_ranks(s, psi, budget_bytes);
        double at1 = device_state_bytes(s, psi, 1), at1024 = device_state_bytes(s, psi, 1024);
        if (from)
            appendf(out, n, "; %s fits from %d ranks (%.3g GB)", stage_name(s), from,
                    device_state_bytes(s, psi, from) / 1e9);
        else if (at1 == at1024)
            appendf(out, n, "; %s needs %.3g GB at any rank count", stage_name(s), at1 / 1e9);
        else
            appendf(out, n, "; %s needs %.3g GB even at 1024 ranks", stage_name(s), at1024 / 1e9);
    }
}
