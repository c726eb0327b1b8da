// step_time.c: memory_math's planner. Given a link (bandwidth β each way,
// latency α) and the compute rate of one rank, the step time of each
// data-parallel stage predicted from the formulas:
//   compute  = FLOPs per token (6Ψ_matmul + 12·L·C·T, with recomputation's)
//              × B·T·k tokens per rank / rate
//   comm     = bytes per rank (the ring volume, mem_math.c) / β
//              + α × (N-1) per ring reduce-scatter or all-gather, 2(N-1) per
//              ring all-reduce (Patarasuk & Yuan's bandwidth-optimal ring)
//   serial   = compute + comm: nothing hidden, as on the cpu device, where
//              MPI moves a nonblocking collective only inside MPI calls
//   overlap  = compute + the comm the stage cannot hide even where the
//              collectives run beside compute (a GPU's comm stream): all of
//              dp_baseline's and zero1's (after backward); zero2's all-gather
//              and its last bucket (or what backward, 2/3 of compute, cannot
//              cover); zero3's first gather (or what compute cannot cover).
// With several ranks per host in ring order, each host's NIC carries one
// rank's ring traffic each way, so β is the host's link rate.
// zero3's ZeRO++ modes (--ranks-per-host P below N): the NIC carries the
// bytes its P ranks send across hosts (zeropp_math.c), the host its ranks'
// bytes to each other at --intra-gbps (when given); only the collectives
// that span hosts pay the latency.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "act_math.h"
#include "memory_math.h"

static const StageId planned[] = {STAGE_DP, STAGE_ZERO1, STAGE_ZERO2, STAGE_ZERO3};
#define NPLANNED (int)(sizeof planned / sizeof planned[0])

typedef struct Plan {
    double compute_ms, comm_bytes, collectives, latency_terms, comm_ms, serial_ms, overlap_ms;
} Plan;

static const Col plan_cols[] = {
    {"stage", "stage", 12, NULL},
    {"compute_ms", "compute ms", 11, "%.1f"},
    {"comm_bytes", "comm bytes", 13, PRINT_GROUPED},
    {"collectives", "collectives", 11, "%.0f"},
    {"comm_ms", "comm ms", 9, "%.1f"},
    {"step_serial_ms", "step ms, nothing hidden", 23, "%.1f"},
    {"step_overlap_ms", "step ms, overlapped", 19, "%.1f"},
    {"fits", "fits", 5, NULL},
};

static Plan plan_stage(StageId s, const Inputs *in) {
    const GPTLayout *l = &in->layout;
    int N = in->ranks, k = in->grad_accum;
    double flops = gpt_flops_per_token(l, in->seq_len) + recompute_flops_per_token(l, in->seq_len, in->recompute, in->attention, in->tiled_mlp) +
                   tiled_mlp_flops_per_token(l, in->tiled_mlp) + tiled_loss_flops_per_token(l, in->tiled_loss);
    Plan p = {0};
    p.compute_ms = flops * in->batch * in->seq_len * k / (in->gflops * 1e9) * 1e3;
    p.comm_bytes = 2 * stage_comm_elems(s, in->psi, N, k);  // bf16
    Partition part;
    partition_init(&part, l->num_params, N, 0);
    double buckets = ceil((double)part.padded / (double)zero_bucket_elems(0, &part));
    // ring steps per collective: N-1 for a reduce-scatter or an all-gather
    switch (s) {
    case STAGE_DP: p.collectives = 1, p.latency_terms = 2.0 * (N - 1); break;  // one all-reduce
    case STAGE_ZERO1: p.collectives = 2, p.latency_terms = 2.0 * (N - 1); break;
    case STAGE_ZERO2: p.collectives = k * buckets + 1; break;
    default: p.collectives = k * (buckets + zero_gathers_per_micro_batch(l, ZERO_PREFETCH_DEFAULT)); break;
    }
    if (s == STAGE_ZERO2 || s == STAGE_ZERO3) p.latency_terms = p.collectives * (N - 1);
    if (N == 1) p.comm_bytes = p.latency_terms = 0;
    double bandwidth_ms = p.comm_bytes / (in->link_gbps * 1e9 / 8) * 1e3;
    p.comm_ms = bandwidth_ms + p.latency_terms * in->latency_us * 1e-3;
    p.serial_ms = p.compute_ms + p.comm_ms;
    // a link too slow for a double leaves the comm time unbounded, and nothing hides that
    double exposed = p.comm_ms;
    if (isfinite(p.comm_ms) && s == STAGE_ZERO2) {
        // (k+1)Ψ(N-1)/N: k reduce-scatters and one all-gather of Ψ(N-1)/N each
        double gather_ms = p.comm_ms / (k + 1), scatter_ms = p.comm_ms - gather_ms;
        exposed = gather_ms + fmax(scatter_ms / (k * buckets), scatter_ms - p.compute_ms * 2 / 3);
    } else if (isfinite(p.comm_ms) && s == STAGE_ZERO3) {
        exposed = fmax(p.comm_ms / p.collectives, p.comm_ms - p.compute_ms);
    }
    p.overlap_ms = p.compute_ms + exposed;
    return p;
}

// zero3 with ZeRO++'s switches c, on the same link and compute rate.
static Plan plan_zeropp(const ZeroPPConfig *c, const Inputs *in, double *device_bytes) {
    Plan p = plan_stage(STAGE_ZERO3, in);  // its compute
    ZeroPPCost cost = zeropp_cost(in, c);
    *device_bytes = zeropp_run_total_bytes(in, c);
    p.comm_bytes = cost.cross * in->ranks_per_host;
    p.collectives = cost.collectives;
    p.latency_terms = cost.latency_terms;
    double host_ms = in->intra_gbps > 0 ? cost.intra * in->ranks_per_host / (in->intra_gbps * 1e9 / 8) * 1e3 : 0;
    p.comm_ms = p.comm_bytes / (in->link_gbps * 1e9 / 8) * 1e3 + host_ms + p.latency_terms * in->latency_us * 1e-3;
    p.serial_ms = p.compute_ms + p.comm_ms;
    double exposed = isfinite(p.comm_ms) ? fmax(p.comm_ms / p.collectives, p.comm_ms - p.compute_ms) : p.comm_ms;
    p.overlap_ms = p.compute_ms + exposed;
    return p;
}

// The rows that fit with the least step time, every one of them where they
// tie; none where no row fits or every time is unbounded (a rate too small
// for a double), since then none is faster than another.
static const char *fastest(int n, const char *const *names, const double *ms, const int *fits, int budget, char *out,
                           size_t len_out) {
    double least = INFINITY;
    int any_fits = 0;
    for (int i = 0; i < n; i++) {
        any_fits |= fits[i];
        if (fits[i] && ms[i] < least) least = ms[i];
    }
    if (!any_fits) return budget ? "none fits" : "none";
    if (isinf(least)) return "none: every stage's step time is unbounded at these rates";
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(out);
        if (fits[i] && ms[i] == least) snprintf(out + len, len_out - len, "%s%s", len ? ", " : "", names[i]);
    }
    if (strchr(out, ',')) snprintf(out + strlen(out), len_out - strlen(out), " (equal)");
    return out;
}

void section_step_time(Printer *p, const Inputs *in) {
    char title[300];
    snprintf(title, sizeof title,
             "Step time per stage, predicted: %s at N = %d, B = %d, T = %d, k = %d; link %g Gbit/s each way, "
             "latency %g us; compute %g GFLOP/s per rank (ring formulas, Rajbhandari et al. 2020; "
             "Patarasuk & Yuan 2009)", in->model, in->ranks, in->batch, in->seq_len, in->grad_accum, in->link_gbps,
             in->latency_us, in->gflops);
    printer_section(p, "step_time", title);
    printer_table(p, "stages", plan_cols, 8);
    enum { MAX_ROWS = NPLANNED + 4 };
    ZeroPPMode modes[4];
    // zero3's ZeRO++ modes where they were asked for: --ranks-per-host below N, or a switch
    int nmodes = in->hosts > 1 && (in->ranks_per_host > 1 || in->zeropp_given) ? zeropp_modes(in, modes) : 0;
    const char *names[MAX_ROWS];
    int fits[MAX_ROWS], n = 0;
    double serial[MAX_ROWS], overlap[MAX_ROWS];
    for (int i = 0; i < NPLANNED + nmodes; i++, n++) {
        RunDeviceBytes need = {0};
        Plan plan;
        if (i < NPLANNED) {
            plan = plan_stage(planned[i], in);
            need = run_stage_bytes(planned[i], in);
            names[i] = stage_name(planned[i]);
        } else {
            plan = plan_zeropp(&modes[i - NPLANNED].c, in, &need.total);
            need.arena = need.high_water = need.total;  // not modelled: no blocks to place
            names[i] = modes[i - NPLANNED].name;
        }
        serial[i] = plan.serial_ms;
        overlap[i] = plan.overlap_ms;
        fits[i] = in->hbm_gb <= 0 || run_fits_budget(&need, in->hbm_gb * 1e9);
        Cell row[8] = {cell_str(names[i]), cell_num(plan.compute_ms), cell_num(plan.comm_bytes),
                       cell_num(plan.collectives), cell_num(plan.comm_ms), cell_num(plan.serial_ms),
                       cell_num(plan.overlap_ms), cell_str(in->hbm_gb <= 0 ? "-" : fits[i] ? "yes" : "no")};
        printer_row(p, row);
    }
    printer_table_end(p);
    char best[160];
    int budget = in->hbm_gb > 0;
    printer_str(p, "fastest_serial", "fastest, nothing hidden", fastest(n, names, serial, fits, budget, best, sizeof best));
    printer_str(p, "fastest_overlap", "fastest, overlapped", fastest(n, names, overlap, fits, budget, best, sizeof best));
    printer_note(p, "compute = (6Ψ_matmul + 12·L·C·T + recomputation) FLOPs per token x B·T·k tokens / the rate; "
                    "measure the rate with a one-host run (the report's compute ms) or make bench's sgemm roof.");
    printer_note(p, "comm = the ring bytes above / the link + latency x (N-1) per reduce-scatter or all-gather, "
                    "2(N-1) per all-reduce; collectives: dp 1 all-reduce, zero1 a reduce-scatter and an all-gather, "
                    "zero2 k x its default buckets + 1 all-gather, zero3 k x (buckets + unit gathers at prefetch 1).");
    printer_note(p, "nothing hidden: compute + comm, as on the cpu device. overlapped: dp_baseline and zero1 still "
                    "wait for all of it; zero2 for its all-gather and last bucket, zero3 for its first gather, or "
                    "for what compute (backward: 2/3 of it) cannot cover.");
    if (nmodes)
        printer_note(p, "zero3's ZeRO++ rows (%d hosts of %d ranks): comm bytes = what a host's link carries across "
                        "hosts, its %d ranks' (the ZeRO++ section's across-hosts bytes x P), at the link's rate%s; "
                        "latency for the collectives that span hosts; the quantization's own time left out.",
                     in->hosts, in->ranks_per_host, in->ranks_per_host,
                     in->intra_gbps > 0 ? ", plus the bytes inside the host at --intra-gbps" : "");
    else
        printer_note(p, "zero3's ZeRO++ modes: give --ranks-per-host P (below N) to plan them on this link.");
    printer_note(p, "the optimizer step is left out; %s", in->hbm_gb > 0 ? "fits: run_device_bytes <= --hbm-gb."
                                                                          : "--hbm-gb adds which stages fit.");
    printer_section_end(p);
}
