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
    "dp_baseline", "zero1", "zero2", "zero3", "cpu_offload", "cpu_offload --dpu", "infinity",
    "infinity --offload-params cpu", "infinity --offload-params nvme", "infinity --offload-optimizer cpu",
    "infinity --offload-params cpu --offload-optimizer cpu", "infinity --offload-params nvme --offload-optimizer cpu",
};

const char *stage_name(StageId s) { return s >= 0 && s < STAGE_COUNT ? names[s] : "?"; }

// The closed forms: for each model state, its tier and its bytes per rank as
// a·Ψ + b·Ψ/N (a: the state is whole on every rank; b: it is split in N
// shards). 2 + 2 + 12 = 16 bytes per parameter (ZeRO, section 3.1); ZeRO-1
// splits the 12 optimizer bytes, ZeRO-2 the gradients' 2 too, ZeRO-3 all 16
// (ZeRO, Figure 1). ZeRO-Offload (Ren et al., 2021) moves the fp32 states and
// the update to the host; here its gradient shard lives there too, beside
// the CPU Adam that reads it (the paper counts it on the device: 2Ψ + 2Ψ/N).
// ZeRO-Infinity (Rajbhandari et al., 2021) moves the optimizer states to
// NVMe, and optionally the bf16 params to the host or NVMe; the gradient
// shard waits in pinned host memory for the CPU Adam, as in our offload.
typedef struct StateForm {
    MemTier tier;
    double whole, shard;  // bytes per parameter: a and b of a·Ψ + b·Ψ/N
} StateForm;

static const MemCategory STATE_CATS[5] = {CAT_PARAMS, CAT_GRADS, CAT_MASTER, CAT_ADAM_M, CAT_ADAM_V};

#define DEV(a, b) {TIER_DEVICE, a, b}
#define PIN(a, b) {TIER_PINNED, a, b}
#define NVME(a, b) {TIER_NVME, a, b}
static const StateForm FORMS[STAGE_COUNT][5] = {  // params, grads, master, m, v
    [STAGE_DP] = {DEV(2, 0), DEV(2, 0), DEV(4, 0), DEV(4, 0), DEV(4, 0)},
    [STAGE_ZERO1] = {DEV(2, 0), DEV(2, 0), DEV(0, 4), DEV(0, 4), DEV(0, 4)},
    [STAGE_ZERO2] = {DEV(2, 0), DEV(0, 2), DEV(0, 4), DEV(0, 4), DEV(0, 4)},
    [STAGE_ZERO3] = {DEV(0, 2), DEV(0, 2), DEV(0, 4), DEV(0, 4), DEV(0, 4)},
    [STAGE_OFFLOAD] = {DEV(2, 0), PIN(0, 2), PIN(0, 4), PIN(0, 4), PIN(0, 4)},
    // the delayed update reads step i's gradients while step i+1's arrive
    [STAGE_OFFLOAD_DPU] = {DEV(2, 0), PIN(0, 4), PIN(0, 4), PIN(0, 4), PIN(0, 4)},
    [STAGE_INFINITY] = {DEV(0, 2), PIN(0, 2), NVME(0, 4), NVME(0, 4), NVME(0, 4)},
    [STAGE_INFINITY_CPU] = {PIN(0, 2), PIN(0, 2), NVME(0, 4), NVME(0, 4), NVME(0, 4)},
    [STAGE_INFINITY_NVME] = {NVME(0, 2), PIN(0, 2), NVME(0, 4), NVME(0, 4), NVME(0, 4)},
    [STAGE_INFINITY_OPT_CPU] = {DEV(0, 2), PIN(0, 2), PIN(0, 4), PIN(0, 4), PIN(0, 4)},
    [STAGE_INFINITY_CPU_OPT_CPU] = {PIN(0, 2), PIN(0, 2), PIN(0, 4), PIN(0, 4), PIN(0, 4)},
    [STAGE_INFINITY_NVME_OPT_CPU] = {NVME(0, 2), PIN(0, 2), PIN(0, 4), PIN(0, 4), PIN(0, 4)},
};
#undef DEV
#undef PIN
#undef NVME

static void check_stage(StageId s) { CHECK(s >= 0 && s < STAGE_COUNT, "mem_math: no stage %d", (int)s); }

StatesLayout stage_states(StageId s) {
    check_stage(s);
    const StateForm *f = FORMS[s];  // params, grads, master (m and v as master)
    return (StatesLayout){.params = f[0].whole > 0 ? STATE_FULL : STATE_SHARD,
                          .grads = f[1].whole > 0 ? STATE_FULL : STATE_SHARD,
                          .optim = f[2].whole > 0 ? STATE_FULL : STATE_SHARD,
                          .params_tier = f[0].tier, .grads_tier = f[1].tier, .optim_tier = f[2].tier};
}

// "2Ψ + 14Ψ/N", "16Ψ", "16Ψ/N" or "0" from the summed coefficients.
static void form_text(double whole, double shard, char *out, size_t n) {
    if (whole > 0 && shard > 0) snprintf(out, n, "%gΨ + %gΨ/N", whole, shard);
    else if (whole > 0) snprintf(out, n, "%gΨ", whole);
    else if (shard > 0) snprintf(out, n, "%gΨ/N", shard);
    else snprintf(out, n, "0");
}

const char *stage_tier_formula(StageId s, MemTier t) {
    static char text[STAGE_COUNT][TIER_COUNT][64];
    check_stage(s);
    double whole = 0, shard = 0;
    for (int i = 0; i < 5; i++)
        if (FORMS[s][i].tier == t) whole += FORMS[s][i].whole, shard += FORMS[s][i].shard;
    form_text(whole, shard, text[s][t], sizeof text[s][t]);
    return text[s][t];
}

// One tier: its closed form; several: each with its tier, "2Ψ (device) + 14Ψ/N (pinned)".
const char *stage_formula(StageId s) {
    static char text[STAGE_COUNT][96];
    check_stage(s);
    int tiers = 0;
    char *out = text[s];
    out[0] = 0;
    for (int t = 0; t < TIER_COUNT; t++) {
        const char *f = stage_tier_formula(s, (MemTier)t);
        if (strcmp(f, "0") == 0) continue;
        size_t len = strlen(out);
        snprintf(out + len, sizeof text[s] - len, "%s%s (%s)", tiers++ ? " + " : "", f, mem_tier_name((MemTier)t));
    }
    if (tiers == 1) snprintf(out, sizeof text[s], "%s", stage_tier_formula(s, FORMS[s][0].tier));
    return out;
}

// Ψ_pad: Ψ rounded up to a multiple of N x 64 (the padding the sharded
// stages add so that every shard is equal and 64-element aligned).
double padded_params(double psi, int ranks) {
    double unit = 64.0 * ranks;
    return ceil(psi / unit) * unit;
}

static void closed_form(StageId s, double whole_elems, double shard_elems, StateBytes *out) {
    check_stage(s);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 5; i++) {
        const StateForm *f = &FORMS[s][i];
        out->bytes[f->tier][STATE_CATS[i]] = f->whole * whole_elems + f->shard * shard_elems;
    }
    for (int t = 0; t < TIER_COUNT; t++)
        for (int c = 0; c < CAT_COUNT; c++) out->tier_total[t] += out->bytes[t][c];
}

// The sharded stages pad: whole buffers hold Ψ_pad elements and shards
// Ψ_pad/N, so that in-place collectives see equal shards; dp_baseline has no
// shards to line up and keeps exactly Ψ.
void stage_state_bytes(StageId s, size_t psi, int ranks, StateBytes *out) {
    double pad = s == STAGE_DP ? (double)psi : padded_params((double)psi, ranks);
    closed_form(s, pad, pad / ranks, out);
    out->padding_params = pad - (double)psi;
}

// The accumulator follows one copy of the gradients: 4 bytes where they
// hold 2, whole or sharded, on their tier (cpu_offload --dpu's second
// gradient shard is the one being applied: it needs no accumulator).
static void accumulator(StageId s, double whole_elems, double shard_elems, StateBytes *out) {
    check_stage(s);
    const StateForm *g = &FORMS[s][1];
    double bytes = g->whole > 0 ? 4 * whole_elems : 4 * shard_elems;
    out->bytes[g->tier][CAT_GRAD_ACCUM] += bytes;
    out->tier_total[g->tier] += bytes;
}

void stage_add_grad_accum(StageId s, size_t psi, int ranks, StateBytes *out) {
    double pad = s == STAGE_DP ? (double)psi : padded_params((double)psi, ranks);
    accumulator(s, pad, pad / ranks, out);
}

void stage_formula_add_grad_accum(StageId s, double psi, int ranks, StateBytes *out) {
    accumulator(s, psi, psi / ranks, out);
}

const char *stage_grad_accum_formula(StageId s) {
    check_stage(s);
    return FORMS[s][1].whole > 0 ? "4Ψ" : "4Ψ/N";
}

void stage_formula_state_bytes(StageId s, double psi, int ranks, StateBytes *out) {
    closed_form(s, psi, psi / ranks, out);
}

double stage_formula_bytes(StageId s, double psi, int ranks) {
    StateBytes b;
    stage_formula_state_bytes(s, psi, ranks, &b);
    double total = 0;
    for (int t = 0; t < TIER_COUNT; t++) total += b.tier_total[t];
    return total;
}

const char *transfer_name(Transfer x) {
    static const char *const n[XFER_COUNT] = {"device -> host", "host -> device", "nvme read", "nvme write"};
    return x >= 0 && x < XFER_COUNT ? n[x] : "?";
}

static int is_infinity(StageId s) { return s >= STAGE_INFINITY && s <= STAGE_INFINITY_NVME_OPT_CPU; }
// Where infinity keeps its bf16 params (--offload-params) and whether its
// master, m and v are on NVMe (--offload-optimizer), read off the closed forms.
static MemTier params_tier(StageId s) { return FORMS[s][0].tier; }
static int optim_on_nvme(StageId s) { return FORMS[s][2].tier == TIER_NVME; }

void stage_transfer_bytes(StageId s, double psi, int ranks, int grad_accum, double out[XFER_COUNT]) {
    check_stage(s);
    for (int x = 0; x < XFER_COUNT; x++) out[x] = 0;
    if (s != STAGE_OFFLOAD && s != STAGE_OFFLOAD_DPU && !is_infinity(s)) return;
    double k = grad_accum, shard = padded_params(psi, ranks) / ranks;
    out[XFER_D2H] = 2.0 * k * psi / ranks;  // each micro-batch's reduced gradient part
    out[XFER_H2D] = 2.0 * shard;            // the updated bf16 shard
    if (!is_infinity(s)) return;
    if (optim_on_nvme(s))  // master, m, v: in and out once a step
        out[XFER_NVME_READ] = out[XFER_NVME_WRITE] = 12.0 * shard;
    if (params_tier(s) == TIER_DEVICE) return;
    out[XFER_H2D] = 4.0 * k * psi / ranks;  // params off the device: each unit's slice, forward and backward
    if (params_tier(s) == TIER_NVME) {
        out[XFER_NVME_READ] += 4.0 * k * psi / ranks;  // ... read from NVMe on its way up
        out[XFER_NVME_WRITE] += 2.0 * shard;           // and the new bf16 shard written
    }
}

const char *stage_transfer_formula(StageId s, Transfer x) {
    check_stage(s);
    int inf = is_infinity(s), states = inf && optim_on_nvme(s), params = inf && params_tier(s) == TIER_NVME;
    switch (x) {
    case XFER_D2H: return s == STAGE_OFFLOAD || s == STAGE_OFFLOAD_DPU || inf ? "2kΨ/N" : "0";
    case XFER_H2D:
        if (s == STAGE_OFFLOAD || s == STAGE_OFFLOAD_DPU || (inf && params_tier(s) == TIER_DEVICE)) return "2Ψ_pad/N";
        return inf ? "4kΨ/N" : "0";
    case XFER_NVME_READ: return states && params ? "12Ψ_pad/N + 4kΨ/N" : states ? "12Ψ_pad/N" : params ? "4kΨ/N" : "0";
    case XFER_NVME_WRITE: return states && params ? "14Ψ_pad/N" : states ? "12Ψ_pad/N" : params ? "2Ψ_pad/N" : "0";
    default: return "0";
    }
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
    case STAGE_OFFLOAD_DPU:
        return k * ring + ring;
    case STAGE_ZERO3:  // gather in forward, gather in backward, reduce-scatter: every micro-batch
        return 3.0 * k * ring;
    default:
        return is_infinity(s) ? 3.0 * k * ring : 0;
    }
}

const char *stage_comm_formula(StageId s) {
    switch (s) {
    case STAGE_DP: return "2Ψ(N-1)/N";
    case STAGE_ZERO1: return "2Ψ(N-1)/N";
    case STAGE_ZERO2:
    case STAGE_OFFLOAD:
    case STAGE_OFFLOAD_DPU: return "(k+1)Ψ(N-1)/N";
    case STAGE_ZERO3: return "3kΨ(N-1)/N";
    default: return is_infinity(s) ? "3kΨ(N-1)/N" : "?";
    }
}

RunDeviceBytes run_device_bytes(StageId s, const GPTLayout *l, const GPTPlan *p, size_t state_params, int dp_ranks,
                                int act_bytes, double kernel_scratch, double stage_buffers, double held) {
    StateBytes sb;
    stage_state_bytes(s, state_params, dp_ranks, &sb);
    GPTActBytes ab = gpt_activation_bytes(l, p, act_bytes);
    double store = p->offload_activations ? 0 : (double)ab.stored;  // a partitioned store on the device
    RunDeviceBytes r = {.states = sb.tier_total[TIER_DEVICE],
                        .activations = (double)ab.total_saved + (double)ab.working + store,
                        .workspace = (double)ab.backward_scratch + (double)ab.grad_workspace,
                        .kernel_scratch = kernel_scratch, .stage_buffers = stage_buffers, .held = held};
    r.total = r.states + r.activations + r.workspace + r.kernel_scratch + r.stage_buffers + r.held;
    r.arena = r.high_water = r.total;
    return r;
}

// (the high-water mark holds the blocks in pages at their largest: arena <= high_water)
int run_fits(const RunDeviceBytes *r, double budget, double region) {
    return r->total <= budget && r->high_water <= region;
}

// Model states are linear in Ψ (unpadded), so the device bytes per parameter
// is the device total at Ψ = 1. Device tier only: what offload and infinity
// move to host/NVMe is exactly what stops limiting the model size. Infinity
// with its params off the device keeps no model state there, so no Ψ is too
// large for the device (its limits are host memory, 2Ψ/N, NVMe capacity, and
// the largest layer): HUGE_VAL.
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

#define FIT_MAX_RANKS 65536

// The smallest rank count up to FIT_MAX_RANKS at which the stage's device
// model states fit, or 0. Every count is tried: with padding the bytes are
// not quite monotone in N, and a budget may be met first at N = 14.
static int fits_from_ranks(StageId s, size_t psi, double budget_bytes) {
    for (int r = 1; r <= FIT_MAX_RANKS; r++)
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
    else snprintf(out, n, "no stage's model states fit in %.3g GB at %d ranks on the device", budget_bytes / 1e9,
                  ranks);
    for (int i = 0; i < 4; i++) {
        StageId s = order[i];
        if (device_state_bytes(s, psi, ranks) <= budget_bytes) continue;
        int from = fits_from_ranks(s, psi, budget_bytes);
        double at1 = device_state_bytes(s, psi, 1), at_max = device_state_bytes(s, psi, FIT_MAX_RANKS);
        if (from)
            appendf(out, n, "; %s fits from %d ranks (%.3g GB)", stage_name(s), from,
                    device_state_bytes(s, psi, from) / 1e9);
        else if (at1 <= at_max)
            appendf(out, n, "; %s needs %.3g GB at any rank count", stage_name(s), at1 / 1e9);
        else
            appendf(out, n, "; %s needs %.3g GB even at %d ranks", stage_name(s), at_max / 1e9, FIT_MAX_RANKS);
    }
    // the stages that move the states off the device (05, 06): what they leave there
    const StageId off[3] = {STAGE_OFFLOAD, STAGE_INFINITY, STAGE_INFINITY_NVME};
    for (int i = 0; i < 3; i++) {
        StageId s = off[i];
        double b = device_state_bytes(s, psi, ranks);
        int from = b <= budget_bytes ? ranks : fits_from_ranks(s, psi, budget_bytes);
        if (from == ranks)
            appendf(out, n, "; off the device, %s keeps %.3g GB there", stage_name(s), b / 1e9);
        else if (from)
            appendf(out, n, "; off the device, %s fits from %d ranks (%.3g GB)", stage_name(s), from,
                    device_state_bytes(s, psi, from) / 1e9);
        else
            appendf(out, n, "; off the device, %s needs %.3g GB at any rank count", stage_name(s), b / 1e9);
    }
}
