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

// Rank q's part of flat range r (partition_overlap, without where it starts).
static size_t part_of(const Partition *p, Range r, int q) { return partition_overlap(p, r, q, NULL); }

// The ranks whose shards hold elements of r (r.count > 0): first..last. The
// others' parts are empty, and an empty part packs to 0 bytes.
static void ranks_holding(const Partition *p, Range r, int *first, int *last) {
    *first = (int)(r.offset / p->shard);
    *last = (int)((r.offset + r.count - 1) / p->shard);
}

// Every rank's part of r packed (quant_packed_bytes each), added up.
static size_t every_part_packed(const Partition *p, Range r, int bits, int block) {
    int first, last;
    ranks_holding(p, r, &first, &last);
    size_t bytes = 0;
    for (int q = first; q <= last; q++) bytes += quant_packed_bytes(part_of(p, r, q), bits, block);
    return bytes;
}

double zeropp_packed_unit_bytes(const GPTLayout *l, const Partition *p, int u, int block) {
    return (double)every_part_packed(p, l->unit[u], 8, block);
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

// Every rank's gathers of a micro-batch are the same: zero3's schedule.
static void add_gathers(const GPTLayout *l, const Partition *p, int hosts, int prefetch, const ZeroPPConfig *o,
                        HopBytes *out) {
    ZeroGather g[4 * GPT_MAX_UNITS];
    int n = zero_gather_schedule(l, prefetch, g), links = hosts > 1 ? hosts : 0;
    for (int i = 0; i < n; i++) add_gather(l, p, links, &g[i], o, out);
}

// Bucket b's flat range, as zero2's grad_shard fills the buckets: from the
// end of the flat buffer down, cap elements each, the last one shorter;
// returns 0 past the last.
static int bucket_range(const Partition *p, size_t cap, size_t b, Range *r) {
    size_t top = p->num_params;
    if (b * cap >= top) return 0;
    size_t hi = top - b * cap, lo = hi > cap ? hi - cap : 0;
    *r = (Range){lo, hi - lo};
    return 1;
}

static double packed(size_t n, const ZeroPPConfig *o) { return (double)quant_packed_bytes(n, o->grad_bits, o->block); }

// A bucket's reduce-scatter, the same for every rank: 2 bytes an element
// over a ring of the N ranks.
static void add_reduce_scatter(const Partition *p, int hosts, Range bucket, HopBytes *out) {
    int N = p->ranks, links = hosts > 1 ? hosts : 0;
    double ring = 2.0 * (double)bucket.count * (N - 1) / N, cross = ring * links / N;
    out->intra[HOP_GRAD_HOST] += ring - cross;
    out->cross[HOP_GRAD_HOST] += cross;
    out->collectives[HOP_GRAD_HOST] += 1;
}

// One bucket's gradients from rank (h, j) = h·P + j: a reduce-scatter, or
// qgZ's two all-to-alls: inside the host its parts for the ranks at every
// other index j' (on every host), across hosts (H > 1) its sums for the
// ranks at its index j on the other hosts.
static void add_bucket(const Partition *p, int hosts, Range bucket, const ZeroPPConfig *o, int rank, HopBytes *out) {
    if (!o->quantize_grads) {
        add_reduce_scatter(p, hosts, bucket, out);
        return;
    }
    int N = p->ranks, P = N / hosts, h = rank / P, j = rank % P, first, last;
    ranks_holding(p, bucket, &first, &last);
    for (int q = first; q <= last; q++)
        if (q % P != j) out->intra[HOP_GRAD_HOST] += packed(part_of(p, bucket, q), o);
    out->collectives[HOP_GRAD_HOST] += 1;
    if (hosts == 1) return;
    for (int g = 0; g < hosts; g++)
        if (g != h) out->cross[HOP_GRAD_ACROSS] += packed(part_of(p, bucket, g * P + j), o);
    out->collectives[HOP_GRAD_ACROSS] += 1;
}

// add_bucket's mean over the N ranks in closed form: over all ranks, each
// rank's packed part Q_q goes N - H times inside a host (from every rank at
// another index) and H - 1 times across (from the ranks at its index on
// the other hosts): (P-1)/P x Q and (H-1)/N x Q, Q = the sum of the Q_q.
static void add_bucket_mean(const Partition *p, int hosts, Range bucket, const ZeroPPConfig *o, HopBytes *out) {
    if (!o->quantize_grads) {
        add_reduce_scatter(p, hosts, bucket, out);
        return;
    }
    int N = p->ranks, P = N / hosts;
    double Q = (double)every_part_packed(p, bucket, o->grad_bits, o->block);
    out->intra[HOP_GRAD_HOST] += Q * (P - 1) / P;
    out->collectives[HOP_GRAD_HOST] += 1;
    if (hosts == 1) return;
    out->cross[HOP_GRAD_ACROSS] += Q * (hosts - 1) / N;
    out->collectives[HOP_GRAD_ACROSS] += 1;
}

void zeropp_hop_bytes(const GPTLayout *l, const Partition *p, int hosts, int prefetch, size_t bucket_cap,
                      const ZeroPPConfig *o, int rank, HopBytes *out) {
    memset(out, 0, sizeof *out);
    add_gathers(l, p, hosts, prefetch, o, out);
    Range r;
    for (size_t b = 0; bucket_range(p, bucket_cap, b, &r); b++) add_bucket(p, hosts, r, o, rank, out);
}

void zeropp_hop_bytes_mean(const GPTLayout *l, const Partition *p, int hosts, int prefetch, size_t bucket_cap,
                           const ZeroPPConfig *o, HopBytes *out) {
    memset(out, 0, sizeof *out);
    add_gathers(l, p, hosts, prefetch, o, out);
    Range r;
    for (size_t b = 0; bucket_range(p, bucket_cap, b, &r); b++) add_bucket_mean(p, hosts, r, o, out);
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
    int P = p->ranks / hosts, j = rank % P;
    ZeroPPGradBuffers z = {4, 4, 4, 4, 4, 4};
    Range r;
    for (size_t b = 0; bucket_range(p, bucket_cap, b, &r); b++) {
        size_t all = every_part_packed(p, r, o->grad_bits, o->block), at_index = 0, at_index_elems = 0;
        for (int g = 0; g < hosts; g++) {
            size_t n = part_of(p, r, g * P + j);
            at_index += quant_packed_bytes(n, o->grad_bits, o->block);
            at_index_elems += n;
        }
        z.send_host = larger(z.send_host, all);
        z.recv_host = larger(z.recv_host, (size_t)P * at_index);
        z.sums = larger(z.sums, 4 * at_index_elems);
        if (hosts == 1) continue;
        size_t mine = part_of(p, r, rank);
        z.send_across = larger(z.send_across, at_index);
        z.recv_across = larger(z.recv_across, (size_t)hosts * quant_packed_bytes(mine, o->grad_bits, o->block));
        z.reduced = larger(z.reduced, 4 * mine);
    }
    return z;
}

double zeropp_device_bytes(const Partition *p, int hosts, size_t bucket_cap, const ZeroPPConfig *o, int rank) {
    double bytes = zeropp_secondary_bytes(p->num_params, o->hpz);
    if (!o->quantize_grads) return bytes;
    ZeroPPGradBuffers z = zeropp_grad_buffers(p, hosts, bucket_cap, o, rank);
    return bytes + 2.0 * (double)(z.send_host + z.recv_host) + (double)(z.sums + z.send_across + z.recv_across + z.reduced);
}
