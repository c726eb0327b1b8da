// zeropp.h: ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient
// Collective Communication for Giant Model Training") in zero3: three
// switches that cut what crosses the link between hosts, each alone or with
// the others (the numbers in zeropp_math.h):
//   qwZ (--quantize-weights): the all-gathers of the weight shards move int8
//       with an fp32 scale per block, dequantized to bf16 on arrival: half
//       the bytes of forward's gathers (and backward's, without hpZ);
//   hpZ (--hpz-size K): each rank keeps, from every unit forward gathered,
//       its 1/K of the unit in bf16 (the secondary partition, 2Ψ/K on the
//       device), and backward gathers the unit from there over K ranks of
//       its own host: none of backward's gathers leaves the host;
//   qgZ (--quantize-grads): a gradient bucket, quantized per receiving rank
//       (int8, or int4 with --grad-quant-bits 4), goes through an all-to-all
//       inside the host; each rank sums in fp32 what it got for the ranks at
//       its index on every host, quantizes the sums again, and an all-to-all
//       among the ranks at its index on the other hosts brings it the sums
//       for its own shard, which it adds in fp32: the reduce-scatter, with a
//       quarter to an eighth of its bytes crossing hosts.
// The stage's loop does not change: param_shard.c hands each gather to
// zeropp_start_gather, and the gradient buckets of grad_shard.c reduce
// through the hooks set here. Every hop's bytes are counted, in the host and
// across hosts, beside the formula.
#pragma once
#include "grad_shard.h"
#include "param_shard.h"
#include "zeropp_math.h"

typedef struct ZeroPP {
    ZeroPPConfig c;          // the switches (zeropp_flags)
    int on;                  // any of the three
    int hosts, per_host;     // H hosts of P consecutive ranks each
    int prefetch;            // zero3's --prefetch, for the formulas
    Comm host, across;       // qgZ: the ranks of this host; the ranks at this index on every host
    Comm hpz;                // hpZ: the K consecutive ranks (of one host) of this rank's secondary partition
    Partition secondary_part;  // the flat buffer over those K ranks; this rank's part
    Buf secondary;           // that part in bf16, copied from forward's gathers
    GradShard *grads;        // the buckets qgZ reduces
    ZeroPPGradBuffers sizes;  // qgZ's buffers (zeropp_grad_buffers)
    Buf send_host[2], recv_host[2], sums, send_across, recv_across, reduced;
    size_t *bucket_counts[2];  // each bucket's parts per rank, from its launch to its wait
    double hop_intra[HOP_COUNT], hop_cross[HOP_COUNT];  // bytes counted over the training steps
} ZeroPP;

// --quantize-weights, --hpz-size, --quantize-grads, --grad-quant-bits,
// --quant-block: their defaults into c, their specs into out; returns how many.
int zeropp_flags(ZeroPPConfig *c, FlagSpec *out);
// zero3's configure: the refusals (exit 2, one line), the host layout, and
// placement p with the groups hpZ and qgZ need (counted with the world's bytes).
Placement zeropp_configure(ZeroPP *z, const Trainer *t, int prefetch, Placement p);
// Device bytes of zero3's gathered units and ZeRO++'s own buffers
// (zeropp_math.h) for rank p->rank.
double zeropp_buffer_bytes(const ZeroPP *z, const GPTLayout *l, const Partition *p, int prefetch, double bucket_mb);
// After the states and zero3's buffers: the hooks into ps and gs, and with
// a switch on the step's communication formula (the hops'), the secondary
// partition and qgZ's buffers.
void zeropp_setup(ZeroPP *z, Trainer *t, ParamShard *ps, GradShard *gs);
void zeropp_free(ZeroPP *z, Trainer *t);
// param_shard.c's gather of unit u for an entry of the forward (backward =
// 0) or backward pass, and its completion once lu->h is done.
void zeropp_start_gather(ZeroPP *z, ParamShard *ps, Trainer *t, int u, int backward);
void zeropp_finish_gather(ZeroPP *z, Trainer *t, LiveUnit *lu, int u);
// Collective: rank 0 prints the bytes per hop beside the formulas and
// writes them to json as "zeropp".
void zeropp_report(ZeroPP *z, Trainer *t, FILE *json);
