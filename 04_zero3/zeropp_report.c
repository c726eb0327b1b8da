// zeropp_report.c: zero3's bytes per hop, in the host and across hosts,
// measured (the comm statistics, tallied per hop in zeropp.c) beside the
// formulas of zeropp_math.h, and the bytes across hosts beside zero3's
// own formula with every switch off.
#include <stdio.h>
#include "zeropp.h"

static const char *const HOP_KEY[HOP_COUNT] = {"forward_gather", "backward_gather", "grads_in_host", "grads_across"};

typedef struct Figures {
    double intra[HOP_COUNT], cross[HOP_COUNT];  // measured per step, mean over ranks
    HopBytes formula;                           // per step, mean over ranks
    double zero3_cross;                         // zero3 with every switch off, across hosts per step, formula
    double secondary, secondary_formula;        // hpZ's partition on the device (max over ranks)
} Figures;

static void switches_text(const ZeroPP *z, char *out, size_t n) {
    const ZeroPPConfig *c = &z->c;
    if (!z->on) {
        snprintf(out, n, "every switch off: zero3 as it is");
        return;
    }
    char hpz[32] = "off", qgz[32] = "off";
    if (c->hpz > 1) snprintf(hpz, sizeof hpz, "K=%d", c->hpz);
    if (c->quantize_grads) snprintf(qgz, sizeof qgz, "int%d", c->grad_bits);
    snprintf(out, n, "qwZ %s, hpZ %s, qgZ %s; blocks of %d", c->quantize_weights ? "int8" : "off", hpz, qgz, c->block);
}

static void scale_hops(HopBytes *h, double k) {
    for (int i = 0; i < HOP_COUNT; i++) h->intra[i] *= k, h->cross[i] *= k;
}

// Collective: the figures, measured and by the formula, on every rank.
static Figures figures(const ZeroPP *z, Trainer *t) {
    Figures f = {0};
    double steps = t->report.n > 0 ? (double)t->report.n : 1, N = t->world.size;
    for (int h = 0; h < HOP_COUNT; h++) {
        f.intra[h] = comm_sum_f64(&t->world, z->hop_intra[h] / steps) / N;
        f.cross[h] = comm_sum_f64(&t->world, z->hop_cross[h] / steps) / N;
    }
    size_t cap = z->grads->cap;
    zeropp_hop_bytes_mean(&t->layout, &t->part, z->hosts, z->prefetch, cap, &z->c, &f.formula);
    scale_hops(&f.formula, t->cfg.grad_accum);
    ZeroPPConfig off = {.hpz = 1, .grad_bits = 8, .block = z->c.block};
    HopBytes zero3;
    zeropp_hop_bytes_mean(&t->layout, &t->part, z->hosts, z->prefetch, cap, &off, &zero3);
    f.zero3_cross = t->cfg.grad_accum * hop_bytes_total(zero3.cross);
    f.secondary = comm_max_f64(&t->world, (double)z->secondary.bytes);
    f.secondary_formula = zeropp_secondary_bytes(t->layout.num_params, z->c.hpz);
    return f;
}

static void print_table(const ZeroPP *z, const Trainer *t, const Figures *f) {
    char what[160];
    switches_text(z, what, sizeof what);
    printf("\nZeRO++ (Wang et al. 2023): %s | %d host%s x %d ranks\n", what, z->hosts, z->hosts == 1 ? "" : "s",
           z->per_host);
    printf("bytes per step per rank by hop (mean over ranks), counted beside the formula (k = %d micro-batch%s)\n",
           t->cfg.grad_accum, t->cfg.grad_accum == 1 ? "" : "es");
    printf("  %-42s %12s %12s %12s %12s\n", "hop", "in host MB", "formula", "across MB", "formula");
    for (int h = 0; h < HOP_COUNT; h++) {
        if (h == HOP_GRAD_ACROSS && (!z->c.quantize_grads || z->hosts == 1)) continue;  // no such collective
        printf("  %-42s %12.6f %12.6f %12.6f %12.6f  %s\n", zeropp_hop_name((ZeroHop)h, &z->c), f->intra[h] / 1e6,
               f->formula.intra[h] / 1e6, f->cross[h] / 1e6, f->formula.cross[h] / 1e6,
               zeropp_hop_formula((ZeroHop)h, &z->c));
    }
    double cross = hop_bytes_total(f->cross), cross_formula = hop_bytes_total(f->formula.cross);
    printf("  %-42s %12.6f %12.6f %12.6f %12.6f\n", "total", hop_bytes_total(f->intra) / 1e6,
           hop_bytes_total(f->formula.intra) / 1e6, cross / 1e6, cross_formula / 1e6);
    if (z->hosts > 1)
        printf("  across hosts: %.6f MB per step, %.3f of zero3's %.6f MB with every switch off (its formula)\n",
               cross / 1e6, cross / f->zero3_cross, f->zero3_cross / 1e6);
    if (z->c.hpz > 1)
        printf("  device params_hpz: %.6f MB, formula 2Psi_pad/K = %.6f MB (K=%d)\n", f->secondary / 1e6,
               f->secondary_formula / 1e6, z->c.hpz);
}

static void write_json(const ZeroPP *z, const Figures *f, FILE *json) {
    const ZeroPPConfig *c = &z->c;
    fprintf(json, ",\"zeropp\":{\"quantize_weights\":%d,\"hpz\":%d,\"quantize_grads\":%d,\"grad_bits\":%d,"
                  "\"block\":%d,\"hosts\":%d,\"ranks_per_host\":%d,\"hops\":{",
            c->quantize_weights, c->hpz, c->quantize_grads, c->grad_bits, c->block, z->hosts, z->per_host);
    for (int h = 0; h < HOP_COUNT; h++)
        fprintf(json, "%s\"%s\":{\"intra\":%.1f,\"cross\":%.1f,\"intra_formula\":%.1f,\"cross_formula\":%.1f}",
                h ? "," : "", HOP_KEY[h], f->intra[h], f->cross[h], f->formula.intra[h], f->formula.cross[h]);
    fprintf(json, "},\"intra_host_bytes_per_step\":%.1f,\"cross_host_bytes_per_step\":%.1f,"
                  "\"cross_host_formula_bytes_per_step\":%.1f,\"zero3_cross_host_formula_bytes_per_step\":%.1f,"
                  "\"secondary_bytes\":%.0f,\"secondary_formula_bytes\":%.0f}",
            hop_bytes_total(f->intra), hop_bytes_total(f->cross), hop_bytes_total(f->formula.cross), f->zero3_cross,
            f->secondary, f->secondary_formula);
}

void zeropp_report(ZeroPP *z, Trainer *t, FILE *json) {
    Figures f = figures(z, t);
    if (t->world.rank != 0) return;
    if (z->on || z->hosts > 1) print_table(z, t, &f);  // zero3 alone on one host prints as it did
    if (json) write_json(z, &f, json);
}
