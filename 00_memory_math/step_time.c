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
    double flops = gpt_flops_per_token(l, in->seq_len) + recompute_flops_per_token(l, in->seq_len, in->recompute, in->attention);
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

// The stages that fit with the least step time, every one of them where they
// tie; none where no stage fits or every time is unbounded (a rate too small
// for a double), since then no stage is faster than another.
static const char *fastest(const double *ms, const int *fits, int budget, char *out, size_t n) {
    double least = INFINITY;
    int any_fits = 0;
    for (int i = 0; i < NPLANNED; i++) {
        any_fits |= fits[i];
        if (fits[i] && ms[i] < least) least = ms[i];
    }
    if (!any_fits) return budget ? "none fits" : "none";
    if (isinf(least)) return "none: every stage's step time is unbounded at these rates";
    out[0] = 0;
    for (int i = 0; i < NPLANNED; i++) {
        size_t len = strlen(out);
        if (fits[i] && ms[i] == least) snprintf(out + len, n - len, "%s%s", len ? ", " : "", stage_name(planned[i]));
    }
    if (strchr(out, ',')) snprintf(out + strlen(out), n - strlen(out), " (equal)");
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
    Plan plans[NPLANNED];
    int fits[NPLANNED];
    double serial[NPLANNED], overlap[NPLANNED];
    for (int i = 0; i < NPLANNED; i++) {
        plans[i] = plan_stage(planned[i], in);
        serial[i] = plans[i].serial_ms;
        overlap[i] = plans[i].overlap_ms;
        fits[i] = in->hbm_gb <= 0 || run_total_bytes(planned[i], in) <= in->hbm_gb * 1e9;
        Cell row[8] = {cell_str(stage_name(planned[i])), cell_num(plans[i].compute_ms), cell_num(plans[i].comm_bytes),
                       cell_num(plans[i].collectives), cell_num(plans[i].comm_ms), cell_num(plans[i].serial_ms),
                       cell_num(plans[i].overlap_ms), cell_str(in->hbm_gb <= 0 ? "-" : fits[i] ? "yes" : "no")};
        printer_row(p, row);
    }
    printer_table_end(p);
    char best[160];
    printer_str(p, "fastest_serial", "fastest, nothing hidden", fastest(serial, fits, in->hbm_gb > 0, best, sizeof best));
    printer_str(p, "fastest_overlap", "fastest, overlapped", fastest(overlap, fits, in->hbm_gb > 0, best, sizeof best));
    printer_note(p, "compute = (6Ψ_matmul + 12·L·C·T + recomputation) FLOPs per token x B·T·k tokens / the rate; "
                    "measure the rate with a one-host run (the report's compute ms) or make bench's sgemm roof.");
    printer_note(p, "comm = the ring bytes above / the link + latency x (N-1) per reduce-scatter or all-gather, "
                    "2(N-1) per all-reduce; collectives: dp 1 all-reduce, zero1 a reduce-scatter and an all-gather, "
                    "zero2 k x its default buckets + 1 all-gather, zero3 k x (buckets + unit gathers at prefetch 1).");
    printer_note(p, "nothing hidden: compute + comm, as on the cpu device. overlapped: dp_baseline and zero1 still "
                    "wait for all of it; zero2 for its all-gather and last bucket, zero3 for its first gather, or "
                    "for what compute (backward: 2/3 of it) cannot cover.");
    printer_note(p, "the optimizer step is left out; %s", in->hbm_gb > 0 ? "fits: run_device_bytes <= --hbm-gb."
                                                                          : "--hbm-gb adds which stages fit.");
    printer_section_end(p);
}
