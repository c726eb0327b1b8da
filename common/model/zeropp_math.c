// zeropp_math.c: ZeRO++'s bytes per hop and its buffers (see zeropp_math.h),
// from zero3's schedule of gathers (zero_gather_schedule), its buckets and
// the partition, never from the code that moves them.
#include "zeropp_math.h"
#include <string.h>
#include "quant_math.h"

// Gathers of this pass go over the primary partition quantized: qwZ, unless
// hpZ brings backward's from the host-local secondary partition (bf16).
static int quantized_gather(const ZeroPPConfig *o, int backward) { return o->quantize_weights && !(backward && o->hpz > 1); }

const char *zeropp_hop_name(ZeroHop h, const ZeroPPConfig *o) {
    switch (h) {
    case HOP_FWD_GATHER: return o->quantize_weights ? "forward all-gather (int8, qwZ)" : "forward all-gather (bf16)";
    case HOP_BWD_GATHER:
        return o->hpz > 1 ? "backward all-gather (hpZ, in the host)"
               : o->quantize_weights ? "backward all-gather (int8, qwZ)" : "backward all-gather (bf16)";
    case HOP_GRAD_HOST:
        return o->quantize_grads ? "gradients: all-to-all in the host (qgZ)" : "gradients: reduce-scatter (bf16)";
    case HOP_GRAD_ACROSS: return o->quantize_grads ? "gradients: all-to-all across hosts (qgZ)" : "-";
    default: return "?";
    }
}

// Ψ_f, Ψ_b: the elements forward's and backward's gathers move (the head
// stays live from forward into backward; the embeddings' backward reads no
// weights); blocks: the quantization blocks of the ranks' slices;
// Q: every rank's part of every bucket quantized (quant_packed_bytes).
const char *zeropp_hop_formula(ZeroHop h, const ZeroPPConfig *o) {
    switch (h) {
    case HOP_FWD_GATHER:
        return o->quantize_weights ? "(N-1)/N x (Psi_f + 4 blocks) B, H/N of it across hosts"
                                   : "(N-1)/N x 2 Psi_f B, H/N of it across hosts";
    case HOP_BWD_GATHER:
        return o->hpz > 1 ? "(K-1)/K x 2 Psi_b B, none across hosts"
               : o->quantize_weights ? "(N-1)/N x (Psi_b + 4 blocks) B, H/N of it across hosts"
                                     : "(N-1)/N x 2 Psi_b B, H/N of it across hosts";
    case HOP_GRAD_HOST:
        return o->quantize_grads ? "(P-1)/P x Q, Q = Psi x bits/8 + 4 blocks (+ padding) B, none across hosts"
                                 : "(N-1)/N x 2 Psi B, H/N of it across hosts";
    case HOP_GRAD_ACROSS: return o->quantize_grads ? "(H-1)/N x Q, all across hosts" : "0";
    default: return "?";
    }
}

double zeropp_packed_unit_bytes(const GPTLayout *l, const Partition *p, int u, int block) {
    double bytes = 0;
    for (int q = 0; q < p->ranks; q++) bytes += (double)quant_packed_bytes(partition_overlap(p, l->unit[u], q, NULL), 8, block);
    return bytes;
}

// One gather's bytes: a ring over the N ranks (H/N across hosts), or over
// the K ranks of a secondary partition, which sit on one host.
static void add_gather(const GPTLayout *l, const Partition *p, int links, const ZeroGather *g, const ZeroPPConfig *o,
                       HopBytes *out) {
    int N = p->ranks, hop = g->backward ? HOP_BWD_GATHER : HOP_FWD_GATHER;
    double elems = (double)l->unit[g->unit].count;
    out->collectives[hop] += 1;
    if (g->backward && o->hpz > 1) {
        out->intra[hop] += 2 * elems * (o->hpz - 1) / o->hpz;
        return;
    }
    double payload = quantized_gather(o, g->backward) ? zeropp_packed_unit_bytes(l, p, g->unit, o->block) : 2 * elems;
    double ring = payload * (N - 1) / N, cross = ring * links / N;
    out->intra[hop] += ring - cross;
    out->cross[hop] += cross;
}

// The buckets of a micro-batch, as zero2's grad_shard fills them: from the
// end of the flat buffer down, cap elements each, the last one shorter.
// Bucket b's part for each rank in counts[]; returns 0 past the last.
static int bucket_parts(const Partition *p, size_t cap, size_t b, size_t *counts) {
    size_t top = p->num_params;
    if (b * cap >= top) return 0;
    size_t hi = top - b * cap, lo = hi > cap ? hi - cap : 0;
    for (int q = 0; q < p->ranks; q++) counts[q] = partition_overlap(p, (Range){lo, hi - lo}, q, NULL);
    return 1;
}

static double packed(size_t n, const ZeroPPConfig *o) { return (double)quant_packed_bytes(n, o->grad_bits, o->block); }

// One bucket's gradients from rank (h, j) = h·P + j: a reduce-scatter, or
// qgZ's two all-to-alls: inside the host its parts for the ranks at every
// other index j' (on every host), across hosts (H > 1) its sums for the
// ranks at its index j on the other hosts.
static void add_bucket(const Partition *p, int hosts, const size_t *counts, const ZeroPPConfig *o, int rank, HopBytes *out) {
    int N = p->ranks, P = N / hosts, h = rank / P, j = rank % P, links = hosts > 1 ? hosts : 0;
    if (!o->quantize_grads) {
        double payload = 0;
        for (int q = 0; q < N; q++) payload += 2.0 * (double)counts[q];
        double ring = payload * (N - 1) / N, cross = ring * links / N;
        out->intra[HOP_GRAD_HOST] += ring - cross;
        out->cross[HOP_GRAD_HOST] += cross;
        out->collectives[HOP_GRAD_HOST] += 1;
        return;
    }
    for (int q = 0; q < N; q++)
        if (q % P != j) out->intra[HOP_GRAD_HOST] += packed(counts[q], o);
    out->collectives[HOP_GRAD_HOST] += 1;
    if (hosts == 1) return;
    for (int g = 0; g < hosts; g++)
        if (g != h) out->cross[HOP_GRAD_ACROSS] += packed(counts[g * P + j], o);
    out->collectives[HOP_GRAD_ACROSS] += 1;
}

void zeropp_hop_bytes(const GPTLayout *l, const Partition *p, int hosts, int prefetch, size_t bucket_cap,
                      const ZeroPPConfig *o, int rank, HopBytes *out) {
    memset(out, 0, sizeof *out);
    ZeroGather g[4 * GPT_MAX_UNITS];
    int n = zero_gather_schedule(l, prefetch, g), links = hosts > 1 ? hosts : 0;
    for (int i = 0; i < n; i++) add_gather(l, p, links, &g[i], o, out);
    size_t counts[p->ranks];
    for (size_t b = 0; bucket_parts(p, bucket_cap, b, counts); b++) add_bucket(p, hosts, counts, o, rank, out);
}

void zeropp_hop_bytes_mean(const GPTLayout *l, const Partition *p, int hosts, int prefetch, size_t bucket_cap,
                           const ZeroPPConfig *o, HopBytes *out) {
    memset(out, 0, sizeof *out);
    for (int r = 0; r < p->ranks; r++) {
        HopBytes one;
        zeropp_hop_bytes(l, p, hosts, prefetch, bucket_cap, o, r, &one);
        for (int k = 0; k < HOP_COUNT; k++) {
            out->intra[k] += one.intra[k] / p->ranks;
            out->cross[k] += one.cross[k] / p->ranks;
            out->collectives[k] = one.collectives[k];
        }
    }
}

double hop_bytes_total(const double by_hop[HOP_COUNT]) {
    double sum = 0;
    for (int k = 0; k < HOP_COUNT; k++) sum += by_hop[k];
    return sum;
}

double zeropp_secondary_bytes(size_t psi, int K) { return K > 1 ? 2 * padded_params((double)psi, K) / K : 0; }

double zeropp_gathered_peak_bytes(const GPTLayout *l, const Partition *p, int prefetch, const ZeroPPConfig *o) {
    double bytes[2][GPT_MAX_UNITS];
    for (int pass = 0; pass < 2; pass++)
        for (int u = 0; u < l->num_units; u++)
            bytes[pass][u] = 2.0 * (double)l->unit[u].count +
                             (quantized_gather(o, pass) ? zeropp_packed_unit_bytes(l, p, u, o->block) : 0);
    return zero_live_peak_bytes(l, prefetch, bytes);
}

static size_t larger(size_t a, size_t b) { return a > b ? a : b; }

// Every buffer at least one fp32 word, so that each rank hands the
// collectives a buffer even where its parts are empty.
ZeroPPGradBuffers zeropp_grad_buffers(const Partition *p, int hosts, size_t bucket_cap, const ZeroPPConfig *o, int rank) {
    int N = p->ranks, P = N / hosts, j = rank % P;
    ZeroPPGradBuffers z = {4, 4, 4, 4, 4, 4};
    size_t counts[N];
    for (size_t b = 0; bucket_parts(p, bucket_cap, b, counts); b++) {
        size_t all = 0, at_index = 0, at_index_elems = 0;
        for (int q = 0; q < N; q++) all += quant_packed_bytes(counts[q], o->grad_bits, o->block);
        for (int g = 0; g < hosts; g++) {
            at_index += quant_packed_bytes(counts[g * P + j], o->grad_bits, o->block);
            at_index_elems += counts[g * P + j];
        }
        z.send_host = larger(z.send_host, all);
        z.recv_host = larger(z.recv_host, (size_t)P * at_index);
        z.sums = larger(z.sums, 4 * at_index_elems);
        if (hosts == 1) continue;
        z.send_across = larger(z.send_across, at_index);
        z.recv_across = larger(z.recv_across, (size_t)hosts * quant_packed_bytes(counts[rank], o->grad_bits, o->block));
        z.reduced = larger(z.reduced, 4 * counts[rank]);
    }
    return z;
}

double zeropp_device_bytes(const Partition *p, int hosts, size_t bucket_cap, const ZeroPPConfig *o, int rank) {
    double bytes = zeropp_secondary_bytes(p->num_params, o->hpz);
    if (!o->quantize_grads) return bytes;
    ZeroPPGradBuffers z = zeropp_grad_buffers(p, hosts, bucket_cap, o, rank);
    return bytes + 2.0 * (double)(z.send_host + z.recv_host) + (double)(z.sums + z.send_across + z.recv_across + z.reduced);
}
