// zeropp.c: memory_math's ZeRO++ section (zero3's --quantize-weights,
// --hpz-size, --quantize-grads; Wang et al. 2023): for each mode, the bytes
// per step per rank that stay in a host and that cross to another (the
// formulas of common/model/zeropp_math.c, which zero3 prints beside what it
// counts), and what its buffers add to zero3's device bytes; the planner
// (step_time.c) times the same bytes on the link.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "memory_math.h"

#define MB 1e6

// "zero3+qwZ", ..., "zero3++" for all three (the planner's column is narrow).
static void mode_name(const ZeroPPConfig *c, char *out, size_t n) {
    if (c->quantize_weights && c->hpz > 1 && c->quantize_grads) {
        snprintf(out, n, "zero3++");
        return;
    }
    snprintf(out, n, "zero3%s%s%s", c->quantize_weights ? "+qwZ" : "", c->hpz > 1 ? "+hpZ" : "",
             c->quantize_grads ? "+qgZ" : "");
}

static void switches_text(const ZeroPPConfig *c, char *out, size_t n) {
    char hpz[16] = "-", qgz[16] = "-";
    if (c->hpz > 1) snprintf(hpz, sizeof hpz, "K=%d", c->hpz);
    if (c->quantize_grads) snprintf(qgz, sizeof qgz, "int%d", c->grad_bits);
    snprintf(out, n, "qwZ %s, hpZ %s, qgZ %s", c->quantize_weights ? "int8" : "-", hpz, qgz);
}

// The switches given, or each alone and all three (hpZ over the ranks of a
// host, or --hpz-size; only where a host holds more than one rank).
int zeropp_modes(const Inputs *in, ZeroPPMode out[4]) {
    ZeroPPConfig base = {.hpz = 1, .grad_bits = in->zeropp.grad_bits, .block = in->zeropp.block};
    int K = in->zeropp.hpz > 1 ? in->zeropp.hpz : in->ranks_per_host, n = 0;
    if (in->zeropp_given) {
        out[n++].c = in->zeropp;
    } else {
        out[n] = (ZeroPPMode){.c = base};
        out[n++].c.quantize_weights = 1;
        if (K > 1) {
            out[n] = (ZeroPPMode){.c = base};
            out[n++].c.hpz = K;
        }
        out[n] = (ZeroPPMode){.c = base};
        out[n++].c.quantize_grads = 1;
        if (K > 1) out[n++].c = (ZeroPPConfig){1, K, 1, base.grad_bits, base.block};
    }
    for (int i = 0; i < n; i++) mode_name(&out[i].c, out[i].name, sizeof out[i].name);
    return n;
}

ZeroPPCost zeropp_cost(const Inputs *in, const ZeroPPConfig *c) {
    const GPTLayout *l = &in->layout;
    Partition part;
    partition_init(&part, l->num_params, in->ranks, 0);
    size_t cap = zero_bucket_elems(0, &part);
    HopBytes h;
    zeropp_hop_bytes_mean(l, &part, in->hosts, ZERO_PREFETCH_DEFAULT, cap, c, &h);
    int k = in->grad_accum, N = in->ranks;
    ZeroPPCost cost = {.intra = k * hop_bytes_total(h.intra), .cross = k * hop_bytes_total(h.cross)};
    // latency: each collective over the N ranks N-1 steps, the all-to-all
    // across hosts H-1; those inside a host are not charged the link's latency
    double world = h.collectives[HOP_FWD_GATHER] + (c->hpz > 1 ? 0 : h.collectives[HOP_BWD_GATHER]) +
                   (c->quantize_grads ? 0 : h.collectives[HOP_GRAD_HOST]);
    cost.collectives = k * (world + h.collectives[HOP_GRAD_ACROSS]);
    cost.latency_terms = k * (world * (N - 1) + h.collectives[HOP_GRAD_ACROSS] * (in->hosts - 1));
    cost.secondary = zeropp_secondary_bytes(l->num_params, c->hpz);
    cost.device_extra = zeropp_gathered_peak_bytes(l, &part, ZERO_PREFETCH_DEFAULT, c) -
                        zero_gathered_peak_bytes(l, ZERO_PREFETCH_DEFAULT) +
                        zeropp_device_bytes(&part, in->hosts, cap, c, 0);
    return cost;
}

static const Col cols[] = {
    {"mode", "mode", 14, NULL},
    {"switches", "switches", 30, NULL},
    {"in_host_bytes", "in host bytes", 15, PRINT_GROUPED},
    {"across_bytes", "across hosts bytes", 19, PRINT_GROUPED},
    {"across_of_zero3", "of zero3's", 10, "%.3f"},
    {"secondary_bytes", "params_hpz bytes", 16, PRINT_GROUPED},
    {"device_extra_bytes", "device + bytes", 15, PRINT_GROUPED},
};

void section_zeropp(Printer *p, const Inputs *in) {
    char title[300];
    snprintf(title, sizeof title,
             "ZeRO++ in zero3 (Wang et al. 2023): bytes per rank per step in the host and across hosts, %s at "
             "N = %d on %d host%s of P = %d, k = %d (zeropp_math.c's formulas, which zero3 prints beside what it "
             "counts)", in->model, in->ranks, in->hosts, in->hosts == 1 ? "" : "s", in->ranks_per_host,
             in->grad_accum);
    printer_section(p, "zeropp", title);
    printer_table(p, "modes", cols, 7);
    ZeroPPConfig off = {.hpz = 1, .grad_bits = in->zeropp.grad_bits, .block = in->zeropp.block};
    ZeroPPCost zero3 = zeropp_cost(in, &off);
    Cell first[7] = {cell_str("zero3"), cell_str("every switch off"), cell_num(zero3.intra), cell_num(zero3.cross),
                     cell_num(in->hosts > 1 ? 1 : NAN), cell_num(0), cell_num(0)};
    printer_row(p, first);
    ZeroPPMode modes[4];
    int n = zeropp_modes(in, modes);
    for (int i = 0; i < n; i++) {
        ZeroPPCost c = zeropp_cost(in, &modes[i].c);
        char what[64];
        switches_text(&modes[i].c, what, sizeof what);
        Cell row[7] = {cell_str(modes[i].name), cell_str(what), cell_num(c.intra), cell_num(c.cross),
                       cell_num(in->hosts > 1 ? c.cross / zero3.cross : NAN), cell_num(c.secondary),
                       cell_num(c.device_extra)};
        printer_row(p, row);
    }
    printer_table_end(p);
    printer_note(p, "per micro-batch: forward's gathers (N-1)/N x 2Psi_f B, int8 with qwZ: (N-1)/N x (Psi_f + "
                    "4 blocks) B; backward's the same, or with hpZ (K-1)/K x 2Psi_b B inside the host; the "
                    "reduce-scatter (N-1)/N x 2Psi B, or qgZ's all-to-alls (P-1)/P x Q in the host and (H-1)/N x Q "
                    "across, Q = every rank's part quantized (Psi x bits/8 + 4 B a block). A ring over the N ranks "
                    "crosses hosts on H of its N links: H/N of its bytes.");
    printer_note(p, "params_hpz: hpZ's secondary partition, 2Psi_pad/K on the device (Psi padded to 64K). device +: "
                    "all ZeRO++ adds to zero3's device bytes (params_hpz, qgZ's buffers for two buckets, qwZ's int8 "
                    "parts kept beside the gathered units).");
    printer_note(p, "blocks of %d elements (--quant-block). zero3 --quantize-weights --hpz-size K --quantize-grads "
                    "prints the same figures beside what it counts (make bench's zeropp section: the losses beside "
                    "the bytes).", in->zeropp.block);
    printer_section_end(p);
}
