// zeropp.c: ZeRO++'s switches in zero3 (see zeropp.h): their flags and
// refusals, qwZ's and hpZ's gathers, qgZ's hierarchical all-to-all.
#include "zeropp.h"
#include <string.h>
#include "check.h"
#include "kernels.h"
#include "quant_math.h"

int zeropp_flags(ZeroPPConfig *c, FlagSpec *out) {
    *c = (ZeroPPConfig){.hpz = 1, .grad_bits = 8, .block = QUANT_BLOCK_DEFAULT};
    out[0] = (FlagSpec){.name = "quantize-weights", .type = FLAG_BOOL, .dst = &c->quantize_weights,
                        .help = "ZeRO++ qwZ: the weight all-gathers in int8, a scale per block"};
    out[1] = (FlagSpec){.name = "hpz-size", .type = FLAG_INT, .dst = &c->hpz, .meta = "K",
                        .help = "ZeRO++ hpZ: a bf16 copy of the weights split over K ranks of a host, which "
                                "backward gathers from (1: none)",
                        .min = 1, .max = 1 << 20};
    out[2] = (FlagSpec){.name = "quantize-grads", .type = FLAG_BOOL, .dst = &c->quantize_grads,
                        .help = "ZeRO++ qgZ: the gradient reduce-scatter as an all-to-all of quantized gradients, "
                                "in the host, then across hosts"};
    out[3] = (FlagSpec){.name = "grad-quant-bits", .type = FLAG_INT, .dst = &c->grad_bits, .meta = "B",
                        .help = "qgZ's bits per gradient value: 8 or 4", .min = 4, .max = 8};
    out[4] = (FlagSpec){.name = "quant-block", .type = FLAG_INT, .dst = &c->block, .meta = "N",
                        .help = "ZeRO++'s elements per quantization block (an fp32 scale each)",
                        .min = QUANT_BLOCK_MIN, .max = QUANT_BLOCK_MAX};
    return 5;
}

// ---- configure: refusals, hosts, groups --------------------------------------

static void refuse_bad_switches(const ZeroPPConfig *c, const Trainer *t) {
    const Settings *s = &t->cfg.settings;
    if (c->grad_bits != 8 && c->grad_bits != 4)
        fail_usage("--grad-quant-bits %d: qgZ sends 8 or 4 bits per gradient value; give 8 or 4", c->grad_bits);
    // 4-bit qgZ packs two values in a byte, both of one block; qwZ's int8 (and 8-bit qgZ) take any size
    if (c->block % 2 && c->quantize_grads && c->grad_bits == 4)
        fail_usage("--quant-block %d with --grad-quant-bits 4: qgZ packs two 4-bit values in a byte, both of one "
                   "block; give an even block size, or --grad-quant-bits 8", c->block);
    const Setting *bits = settings_find(s, "grad-quant-bits"), *block = settings_find(s, "quant-block");
    if (!c->quantize_grads && bits && bits->from != FROM_DEFAULT)
        fail_usage("--grad-quant-bits sets qgZ's bits, but qgZ is off; add --quantize-grads, or leave it out");
    if (!c->quantize_grads && !c->quantize_weights && block && block->from != FROM_DEFAULT)
        fail_usage("--quant-block sizes the blocks of qwZ and qgZ, but both are off; add --quantize-weights or "
                   "--quantize-grads, or leave it out");
}

// The hosts, and the refusals of the switches against them.
static void place_hosts(ZeroPP *z, const Comm *w) {
    z->hosts = w->host_of ? w->hosts : 1;
    z->per_host = w->size / z->hosts;
    if (!z->on) return;
    if (!comm_hosts_regular(w))
        fail_usage("ZeRO++ needs the same number of ranks on every host, each host's ranks consecutive (mpirun "
                   "--map-by slot); this run has %d ranks on %d hosts: leave out --quantize-weights, --hpz-size "
                   "and --quantize-grads, or place the ranks evenly", w->size, z->hosts);
    int K = z->c.hpz;
    if (K > 1 && z->per_host % K)
        fail_usage("--hpz-size %d: a secondary partition is K ranks of one host, and %d does not divide the %d "
                   "ranks per host (%d ranks on %d host%s); give a divisor of %d, or 1 for none", K, K, z->per_host,
                   w->size, z->hosts, z->hosts == 1 ? "" : "s", z->per_host);
}

Placement zeropp_configure(ZeroPP *z, const Trainer *t, int prefetch, Placement p) {
    refuse_bad_switches(&z->c, t);
    z->on = z->c.quantize_weights || z->c.hpz > 1 || z->c.quantize_grads;
    z->prefetch = prefetch;
    place_hosts(z, p.dp);
    if (!z->on) return p;  // zero3 as it was: its own formula
    if (z->c.hpz > 1) {  // K consecutive ranks: one host's, since K divides P
        comm_split(p.dp, p.dp->rank / z->c.hpz, p.dp->rank, &z->hpz);
        p.groups[p.ngroups++] = &z->hpz;
    }
    if (z->c.quantize_grads) {
        comm_split_hosts(p.dp, &z->host, &z->across);
        p.groups[p.ngroups++] = &z->host;
        p.groups[p.ngroups++] = &z->across;
    }
    return p;
}

double zeropp_buffer_bytes(const ZeroPP *z, const GPTLayout *l, const Partition *p, int prefetch, double bucket_mb) {
    if (!z->on) return zero_gathered_peak_bytes(l, prefetch);
    return zeropp_gathered_peak_bytes(l, p, prefetch, &z->c) +
           zeropp_device_bytes(p, z->hosts, zero_bucket_elems(bucket_mb, p), &z->c, p->rank);
}

// ---- the bytes of each hop ------------------------------------------------------

typedef struct Tally {
    double ring, cross;
} Tally;

static Tally tally(const Comm *c) { return (Tally){comm_ring_bytes(c), comm_cross_host_bytes(c)}; }

// What group c counted since `before`, added to hop h (training steps only:
// an evaluation's gathers, `training` 0, are not).
static void count_hop(ZeroPP *z, int training, ZeroHop h, const Comm *c, Tally before) {
    if (!training) return;
    Tally now = tally(c);
    z->hop_cross[h] += now.cross - before.cross;
    z->hop_intra[h] += (now.ring - now.cross) - (before.ring - before.cross);
}

// ---- qwZ and hpZ: the gathers ---------------------------------------------------

// Rank q's slice of unit u under partition p: count, and where it starts in the unit.
static size_t slice_of(const Partition *p, Range r, int q, size_t *at) {
    size_t first = r.offset, n = partition_overlap(p, r, q, &first);
    *at = n ? first - r.offset : 0;
    return n;
}

// qwZ: each rank quantizes its slice (an int8 piece with its scales, one
// after the other in rank order in lu->packed) and the pieces are
// all-gathered; zeropp_finish_gather dequantizes them all, this rank's too,
// so every rank computes with the same weights.
static void gather_quantized(ZeroPP *z, Trainer *t, LiveUnit *lu, int u) {
    Range r = unit_range(t, u);
    int N = t->dp->size, me = t->dp->rank;
    size_t pcounts[N], pdispls[N], total = 0, n = 0, mine = 0;
    for (int q = 0; q < N; q++) {
        size_t at, count = slice_of(&t->part, r, q, &at);
        if (q == me) n = count, mine = at;
        pcounts[q] = quant_packed_bytes(count, 8, z->c.block);
        pdispls[q] = total;
        total += pcounts[q];
    }
    lu->buf = buf_alloc(&t->dev, TIER_DEVICE, CAT_PARAMS, r.count * sizeof(bf16), "gathered unit params");
    lu->packed = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, total, "gathered unit, int8 (qwZ)");
    const bf16 *own = (const bf16 *)t->st.params.ptr + (r.offset + mine - t->part.begin);
    if (n) t->dev.k->quantize_half(&t->dev, (char *)lu->packed.ptr + pdispls[me], own, n, 8, z->c.block);
    comm_all_gather(t->dp, lu->packed.ptr, pcounts, pdispls, DT_U8, &lu->h);
}

// hpZ: backward's gather of unit u over the K ranks of this rank's host that
// share a secondary partition, each giving its slice of the bf16 copy.
static void gather_secondary(ZeroPP *z, Trainer *t, LiveUnit *lu, int u) {
    Range r = unit_range(t, u);
    int K = z->hpz.size;
    size_t counts[K], displs[K];
    for (int g = 0; g < K; g++) counts[g] = slice_of(&z->secondary_part, r, g, &displs[g]);
    lu->buf = buf_alloc(&t->dev, TIER_DEVICE, CAT_PARAMS, r.count * sizeof(bf16), "gathered unit params");
    int me = z->hpz.rank;
    const bf16 *own = (const bf16 *)z->secondary.ptr + (r.offset + displs[me] - z->secondary_part.begin);
    if (counts[me])
        dev_copy(&t->dev, (bf16 *)lu->buf.ptr + displs[me], own, counts[me] * sizeof(bf16), STREAM_COMPUTE);
    comm_all_gather(&z->hpz, lu->buf.ptr, counts, displs, DT_HALF, &lu->h);
    lu->group = &z->hpz;
}

void zeropp_start_gather(ZeroPP *z, ParamShard *ps, Trainer *t, int u, int backward) {
    LiveUnit *lu = &ps->live[u];
    ZeroHop hop = backward ? HOP_BWD_GATHER : HOP_FWD_GATHER;
    Comm *group = backward && z->c.hpz > 1 ? &z->hpz : t->dp;
    Tally before = tally(group);
    if (backward && z->c.hpz > 1) {
        gather_secondary(z, t, lu, u);
        lu->state = LIVE_GATHERING;
    } else if (z->c.quantize_weights) {
        gather_quantized(z, t, lu, u);
        lu->state = LIVE_GATHERING;
    } else {
        param_shard_gather_world(ps, t, u);
    }
    count_hop(z, ps->training, hop, group, before);
}

// A gathered unit: qwZ's pieces dequantized into it; after a forward
// gather, hpZ keeps this rank's 1/K of it for backward.
void zeropp_finish_gather(ZeroPP *z, Trainer *t, LiveUnit *lu, int u) {
    Range r = unit_range(t, u);
    if (lu->packed.ptr) {
        size_t offset = 0;
        for (int q = 0; q < t->dp->size; q++) {
            size_t at, n = slice_of(&t->part, r, q, &at);
            if (n) t->dev.k->dequantize_half(&t->dev, (bf16 *)lu->buf.ptr + at, (char *)lu->packed.ptr + offset, n, 8,
                                             z->c.block);
            offset += quant_packed_bytes(n, 8, z->c.block);
        }
    }
    if (lu->backward || z->c.hpz <= 1) return;
    size_t at, n = slice_of(&z->secondary_part, r, z->hpz.rank, &at);
    if (n)
        dev_copy(&t->dev, (bf16 *)z->secondary.ptr + (r.offset + at - z->secondary_part.begin),
                 (const bf16 *)lu->buf.ptr + at, n * sizeof(bf16), STREAM_COMPUTE);
}

// ---- qgZ: the gradients' hierarchical all-to-all ------------------------------------

static size_t packed_grads(const ZeroPP *z, size_t n) { return quant_packed_bytes(n, z->c.grad_bits, z->c.block); }

// Start of rank q's part among a bucket's elements.
static size_t part_offset(const size_t *counts, int q) {
    size_t at = 0;
    for (int r = 0; r < q; r++) at += counts[r];
    return at;
}

// Inside the host: the parts for the ranks at index j on every host, in
// host order, quantized one by one, go to this host's rank j.
static void launch_qgz(Trainer *t, Bucket *b, const bf16 *send, const size_t *counts, void *arg) {
    ZeroPP *z = arg;
    int i = b == &z->grads->bucket[0] ? 0 : 1, N = t->dp->size, P = z->per_host, H = z->hosts, me = z->host.rank;
    memcpy(z->bucket_counts[i], counts, (size_t)N * sizeof *counts);
    size_t sendc[P], recvc[P], at = 0, from_each = 0;
    char *out = z->send_host[i].ptr;
    for (int j = 0; j < P; j++) {
        size_t start = at;
        for (int h = 0; h < H; h++) {
            int q = h * P + j;
            t->dev.k->quantize_half(&t->dev, out + at, send + part_offset(counts, q), counts[q], z->c.grad_bits,
                                    z->c.block);
            at += packed_grads(z, counts[q]);
            if (j == me) from_each += packed_grads(z, counts[q]);
        }
        sendc[j] = at - start;
    }
    for (int j = 0; j < P; j++) recvc[j] = from_each;
    Tally before = tally(&z->host);
    comm_all_to_all(&z->host, out, sendc, z->recv_host[i].ptr, recvc, DT_U8, &b->h);
    count_hop(z, 1, HOP_GRAD_HOST, &z->host, before);
}

// The sums for the ranks at this index, their parts dequantized in fp32 in
// the order of the host's ranks; on one host they are this rank's part.
static void sum_in_host(ZeroPP *z, Trainer *t, int i, const size_t *counts) {
    int P = z->per_host, H = z->hosts, me = z->host.rank;
    const char *in = z->recv_host[i].ptr;
    for (int j = 0; j < P; j++) {
        float *sum = z->sums.ptr;
        for (int h = 0; h < H; h++) {
            size_t n = counts[h * P + me];
            t->dev.k->dequantize_f32(&t->dev, sum, in, n, z->c.grad_bits, z->c.block, j > 0);
            in += packed_grads(z, n);
            sum += n;
        }
    }
}

// Across hosts: the sums for rank (h, j) go to host h; this rank's, from
// every host, are dequantized and added in host order.
static void sum_across(ZeroPP *z, Trainer *t, const size_t *counts) {
    int P = z->per_host, H = z->hosts, j = z->host.rank, me = t->dp->rank;
    size_t sendc[H], recvc[H], at = 0;
    const float *sum = z->sums.ptr;
    for (int h = 0; h < H; h++) {
        size_t n = counts[h * P + j];
        t->dev.k->quantize_f32(&t->dev, (char *)z->send_across.ptr + at, sum, n, z->c.grad_bits, z->c.block);
        sendc[h] = packed_grads(z, n);
        recvc[h] = packed_grads(z, counts[me]);
        at += sendc[h];
        sum += n;
    }
    Tally before = tally(&z->across);
    comm_all_to_all(&z->across, z->send_across.ptr, sendc, z->recv_across.ptr, recvc, DT_U8, NULL);
    count_hop(z, 1, HOP_GRAD_ACROSS, &z->across, before);
    for (int h = 0; h < H; h++)
        t->dev.k->dequantize_f32(&t->dev, z->reduced.ptr, (char *)z->recv_across.ptr + h * recvc[0], counts[me],
                                 z->c.grad_bits, z->c.block, h > 0);
}

// The bucket's in-host all-to-all is done: sum, go across, and leave this
// rank's part, rounded once to 16 bits, in b->recv.
static void wait_qgz(Trainer *t, Bucket *b, void *arg) {
    ZeroPP *z = arg;
    int i = b == &z->grads->bucket[0] ? 0 : 1;
    const size_t *counts = z->bucket_counts[i];
    comm_wait(&z->host, &b->h);
    sum_in_host(z, t, i, counts);
    const float *mine = z->sums.ptr;
    if (z->hosts > 1) {
        sum_across(z, t, counts);
        mine = z->reduced.ptr;
    }
    t->dev.k->f32_to_half(&t->dev, b->recv.ptr, mine, counts[t->dp->rank]);
}

// Without qgZ: zero3's reduce-scatter, its bytes counted as the hop's.
static void launch_reduce_scatter(Trainer *t, Bucket *b, const bf16 *send, const size_t *counts, void *arg) {
    Tally before = tally(t->dp);
    comm_reduce_scatter_sum(t->dp, send, b->recv.ptr, counts, DT_HALF, &b->h);
    count_hop(arg, 1, HOP_GRAD_HOST, t->dp, before);
}

static void wait_reduce_scatter(Trainer *t, Bucket *b, void *arg) {
    (void)arg;
    comm_wait(t->dp, &b->h);
}

// ---- set-up and teardown ---------------------------------------------------------

static Buf device_buf(Trainer *t, size_t bytes, const char *what) {
    return buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, bytes, what);
}

// Every zero3 run counts its hops (the gathers through ps->pp, the buckets
// through gs->reduce); with every switch off they are zero3's own calls.
void zeropp_setup(ZeroPP *z, Trainer *t, ParamShard *ps, GradShard *gs) {
    ps->pp = z;
    z->grads = gs;
    gs->reduce = (BucketReduce){launch_reduce_scatter, wait_reduce_scatter, z};
    if (!z->on) return;  // zero3 as it was: its own formula
    // this rank's bytes per step by the hops' formulas, for the summary line
    HopBytes f;
    zeropp_hop_bytes(&t->layout, &t->part, z->hosts, z->prefetch, gs->cap, &z->c, t->dp->rank, &f);
    t->comm_formula_bytes = t->cfg.grad_accum * (hop_bytes_total(f.intra) + hop_bytes_total(f.cross));
    t->comm_formula_text = "the sum of ZeRO++'s hops, each by its formula (the ZeRO++ table below), x k micro-batches";
    if (z->c.hpz > 1) {
        partition_init(&z->secondary_part, t->layout.num_params, z->hpz.size, z->hpz.rank);
        z->secondary = buf_alloc(&t->dev, TIER_DEVICE, CAT_PARAMS_HPZ, z->secondary_part.shard * sizeof(bf16),
                                 "hpZ secondary partition");
        t->buffer_formula_bytes[CAT_PARAMS_HPZ] = zeropp_secondary_bytes(t->layout.num_params, z->c.hpz);
    }
    if (!z->c.quantize_grads) return;
    z->sizes = zeropp_grad_buffers(&t->part, z->hosts, gs->cap, &z->c, t->dp->rank);
    for (int i = 0; i < 2; i++) {
        z->send_host[i] = device_buf(t, z->sizes.send_host, "qgZ bucket, quantized");
        z->recv_host[i] = device_buf(t, z->sizes.recv_host, "qgZ parts from the host");
        z->bucket_counts[i] = xcalloc((size_t)t->dp->size, sizeof(size_t));
    }
    z->sums = device_buf(t, z->sizes.sums, "qgZ sums in the host, fp32");
    z->send_across = device_buf(t, z->sizes.send_across, "qgZ sums, quantized");
    z->recv_across = device_buf(t, z->sizes.recv_across, "qgZ sums from the hosts");
    z->reduced = device_buf(t, z->sizes.reduced, "qgZ reduced part, fp32");
    gs->reduce = (BucketReduce){launch_qgz, wait_qgz, z};
}

void zeropp_free(ZeroPP *z, Trainer *t) {
    buf_free(&t->dev, &z->secondary);
    Buf *bufs[] = {&z->send_host[0], &z->send_host[1], &z->recv_host[0], &z->recv_host[1],
                   &z->sums,         &z->send_across,  &z->recv_across,  &z->reduced};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) buf_free(&t->dev, bufs[i]);
    for (int i = 0; i < 2; i++) free(z->bucket_counts[i]);
    Comm *groups[] = {&z->hpz, &z->host, &z->across};
    for (int i = 0; i < 3; i++)
        if (groups[i]->size) comm_free(groups[i]);  // made in configure
}
