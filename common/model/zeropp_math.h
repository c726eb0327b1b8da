// zeropp_math.h: ZeRO++ (Wang et al. 2023) in numbers, for zero3's switches
// (04_zero3/zeropp.c) and memory_math's planner: the bytes each hop of a
// micro-batch moves per rank, split into those that stay on the rank's host
// and those that leave it, and the device bytes ZeRO++'s buffers hold.
//
// N ranks sit on H hosts, P = N/H consecutive ranks each. A hop of zero3:
//   forward gathers:  every unit all-gathered over the N ranks, 2 bytes an
//                     element; qwZ: each rank's slice quantized to int8 with
//                     an fp32 scale per block (quant_math.h)
//   backward gathers: the same again; hpZ: over the K ranks of a secondary
//                     partition inside the host, from the bf16 copy each
//                     rank kept of its 1/K of the unit when forward gathered it
//   gradients:        each bucket reduce-scattered over the N ranks; qgZ: the
//                     bucket quantized per receiving rank, an all-to-all
//                     inside the host (each rank then sums, in fp32, the
//                     parts of the ranks at its index on every host), the
//                     sums quantized again and an all-to-all across the
//                     hosts among the ranks at the same index, summed in fp32
// A ring over the N ranks (hosts in rank order) joins the hosts on H of its
// N links: H/N of its bytes leave a host (none on one host). An all-to-all's
// part for a rank on another host leaves it. Figures are per rank and micro-
// batch, as the comm statistics count them; a mean is over the ranks.
#pragma once
#include <stddef.h>
#include "mem_math.h"

typedef struct ZeroPPConfig {
    int quantize_weights;  // qwZ: the gathers of the primary partition in int8
    int hpz;               // hpZ: ranks per secondary partition, K (1: none)
    int quantize_grads;    // qgZ: the hierarchical all-to-all of quantized gradients
    int grad_bits;         // qgZ's bits: 8 or 4
    int block;             // elements per quantization block (qwZ and qgZ)
} ZeroPPConfig;

typedef enum { HOP_FWD_GATHER, HOP_BWD_GATHER, HOP_GRAD_HOST, HOP_GRAD_ACROSS, HOP_COUNT } ZeroHop;

typedef struct HopBytes {
    double intra[HOP_COUNT], cross[HOP_COUNT];  // bytes this rank sends that stay on its host, that leave it
    double collectives[HOP_COUNT];              // collectives of the hop a rank takes part in
} HopBytes;

// What a hop is, with these switches: "forward all-gather (int8, qwZ)", ...
const char *zeropp_hop_name(ZeroHop h, const ZeroPPConfig *o);
// Its bytes in closed form, mean over the ranks, with the names above:
// "(N-1)/N x (Ψ_f + 4·blocks) B; H/N of it across hosts"
const char *zeropp_hop_formula(ZeroHop h, const ZeroPPConfig *o);

// Rank `rank`'s bytes per micro-batch by hop: its N-rank primary partition
// p, `hosts` hosts, zero3's --prefetch and its buckets of `bucket_cap`
// elements (zero_bucket_elems), the switches in o.
void zeropp_hop_bytes(const GPTLayout *l, const Partition *p, int hosts, int prefetch, size_t bucket_cap,
                      const ZeroPPConfig *o, int rank, HopBytes *out);
// The mean over the N ranks of zeropp_hop_bytes, in closed form: no loop
// over the ranks, so --ranks 1048576 costs what --ranks 8 does.
void zeropp_hop_bytes_mean(const GPTLayout *l, const Partition *p, int hosts, int prefetch, size_t bucket_cap,
                           const ZeroPPConfig *o, HopBytes *out);
double hop_bytes_total(const double by_hop[HOP_COUNT]);

// hpZ's secondary partition on each rank: 2Ψ_pad/K bytes (Ψ padded to 64K, as a K-rank partition pads it).
double zeropp_secondary_bytes(size_t psi, int K);

// The packed bytes of unit u's quantized gather: every rank's slice, int8
// and its scales (quant_packed_bytes each).
double zeropp_packed_unit_bytes(const GPTLayout *l, const Partition *p, int u, int block);

// qgZ's buffers on a rank: per bucket (two, as zero2's), what it sends and
// receives inside the host; shared by the two, the fp32 sums of the parts
// at its index, what it sends and receives across hosts, the fp32 result.
// Each sized for the largest bucket. Bytes.
typedef struct ZeroPPGradBuffers {
    size_t send_host, recv_host, sums, send_across, recv_across, reduced;
} ZeroPPGradBuffers;
ZeroPPGradBuffers zeropp_grad_buffers(const Partition *p, int hosts, size_t bucket_cap, const ZeroPPConfig *o, int rank);

// The most bytes zero3's gathered units hold at once (zero_live_peak_bytes)
// where a quantized gather keeps its int8 parts beside the unit until the
// unit is released.
double zeropp_gathered_peak_bytes(const GPTLayout *l, const Partition *p, int prefetch, const ZeroPPConfig *o);
// The device bytes ZeRO++ adds to zero3's buffers for good: the secondary
// partition and qgZ's buffers.
double zeropp_device_bytes(const Partition *p, int hosts, size_t bucket_cap, const ZeroPPConfig *o, int rank);
