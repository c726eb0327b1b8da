// mem_math.h: the memory and communication formulas of the ZeRO paper
// (Rajbhandari et al., 2020) and ZeRO-Offload/Infinity, per rank, with the
// padding our partitioning adds (activation memory in closed form: act_math.h). memory_math prints these; the trainers print
// them beside what they measure.
#pragma once
#include <stddef.h>
#include "mem.h"
#include "states.h"

typedef enum {
    STAGE_DP = 0,     // 01_dp_baseline: 16Ψ
    STAGE_ZERO1,      // 02_zero1: 4Ψ + 12Ψ/N
    STAGE_ZERO2,      // 03_zero2: 2Ψ + 14Ψ/N
    STAGE_ZERO3,      // 04_zero3: 16Ψ/N
    STAGE_OFFLOAD,    // 05_cpu_offload: device 2Ψ, pinned host 2Ψ/N + 12Ψ/N
    STAGE_OFFLOAD_DPU,  // 05_cpu_offload --dpu: the gradient shard twice (one being applied)
    // 06_infinity: master, m, v on NVMe (12Ψ/N), the gradient shard in pinned
    // host memory beside the CPU Adam (2Ψ/N), the bf16 param shard (2Ψ/N) by
    // --offload-params: on the device (none), in pinned host memory (cpu), on NVMe (nvme)
    STAGE_INFINITY,
    STAGE_INFINITY_CPU,
    STAGE_INFINITY_NVME,
    // ... and --offload-optimizer cpu: master, m, v in pinned host memory
    // instead (12Ψ/N), beside the params by --offload-params as above; with
    // the params in pinned memory too, every state is on the host
    STAGE_INFINITY_OPT_CPU,
    STAGE_INFINITY_CPU_OPT_CPU,
    STAGE_INFINITY_NVME_OPT_CPU,
    STAGE_COUNT
} StageId;

const char *stage_name(StageId s);     // "dp_baseline", "zero1", ...
// The closed form of a stage's model states per rank: "16Ψ", "4Ψ + 12Ψ/N", ...,
// with the tier named where the stage uses several ("2Ψ (device) + 14Ψ/N (pinned)").
const char *stage_formula(StageId s);
// The closed form of one tier: "2Ψ" for cpu_offload's device, "0" where the stage keeps nothing.
const char *stage_tier_formula(StageId s, MemTier t);

// Model-state bytes per rank by tier and category, evaluated from the
// closed forms (mem_math.c), never from the allocation code: the trainers
// and memory_math --measure set these beside what the allocator counted.
typedef struct StateBytes {
    double bytes[TIER_COUNT][CAT_COUNT];
    double tier_total[TIER_COUNT];
    double padding_params;  // Ψ_pad - Ψ
} StateBytes;
// Ψ rounded up to a multiple of 64·N: the padding the sharded stages state.
double padded_params(double psi, int ranks);
// The closed forms with the stated padding (whole buffers of the sharded
// stages Ψ_pad long, shards Ψ_pad/N; dp_baseline exactly Ψ).
void stage_state_bytes(StageId s, size_t psi, int ranks, StateBytes *out);
// The papers' figures: no padding, shards of Ψ/N (fractional).
void stage_formula_state_bytes(StageId s, double psi, int ranks, StateBytes *out);
// --grad-accum-dtype fp32 (DeepSpeed's data_types.grad_accum_dtype): adds
// the fp32 accumulator of the gradients, 4 bytes per gradient element on the
// gradients' tier: 4Ψ where they are whole (dp_baseline, zero1), 4Ψ/N where
// they are sharded. With padding, as stage_state_bytes; the paper's way, as
// stage_formula_state_bytes; and its closed form.
void stage_add_grad_accum(StageId s, size_t psi, int ranks, StateBytes *out);
void stage_formula_add_grad_accum(StageId s, double psi, int ranks, StateBytes *out);
const char *stage_grad_accum_formula(StageId s);  // "4Ψ" or "4Ψ/N"
// Their total over the tiers.
double stage_formula_bytes(StageId s, double psi, int ranks);

// Communication volume per rank per optimizer step, in elements of the
// gradient/parameter dtype, as the ZeRO paper counts it with a ring:
// DP, ZeRO-1, ZeRO-2: 2Ψ(N-1)/N (reduce-scatter + all-gather, or all-reduce);
// ZeRO-3: 3Ψ(N-1)/N (all-gather forward, all-gather backward, reduce-scatter).
// ZeRO-2/3 reduce-scatter every micro-batch, so grad_accum multiplies that part;
// ZeRO-3 also gathers the parameters every micro-batch: 3kΨ(N-1)/N in all.
double stage_comm_elems(StageId s, double psi, int ranks, int grad_accum);
const char *stage_comm_formula(StageId s);  // "2Ψ(N-1)/N", ...

// Bytes moved between tiers per rank per optimizer step (mean over ranks),
// the closed forms: cpu_offload sends each micro-batch's reduced gradient
// part down (2kΨ/N; the padding is never sent) and the updated bf16 shard up
// (2Ψ_pad/N). infinity does the same with the params on the device; it reads
// and writes master, m and v once a step (12Ψ_pad/N each way; none with
// --offload-optimizer cpu); with the params off the device each unit's slice
// goes up for its forward and its backward gather (4kΨ/N; zero3 gathers the
// head once for the end of forward and the start of backward, so the count
// is 4kC/N below this), read from NVMe first with --offload-params nvme,
// where the new shard is also written (2Ψ_pad/N). Zero for the stages that
// keep everything on the device.
typedef enum { XFER_D2H, XFER_H2D, XFER_NVME_READ, XFER_NVME_WRITE, XFER_COUNT } Transfer;
const char *transfer_name(Transfer x);  // "device -> host", ...
void stage_transfer_bytes(StageId s, double psi, int ranks, int grad_accum, double out[XFER_COUNT]);
const char *stage_transfer_formula(StageId s, Transfer x);  // "2kΨ/N", or "0"


// Device bytes per rank of a training run, by what holds them: the model
// states on the device tier (stage_state_bytes, with padding), activations
// saved for backward and the backward workspace (gpt_activation_bytes), the
// kernels' largest scratch (KernelOps.scratch_bytes), the stage's own
// buffers at their peak (Strategy.device_buffer_bytes: buckets, gathered
// units, a reduced shard); the activations are the saved ones and the
// recomputation's working set (by the plan's recompute), and the checkpoint
// store where it is on the device and what the device held before (cuBLASLt's
// workspace). The states are those this rank keeps (state_params of the
// layout's tensors, sharded over dp_ranks), the activations those of plan p
// (its units, micro-batches in flight). The trainers check it against the
// budget before allocating anything, and memory_math can set the same sum
// beside a budget.
typedef struct RunDeviceBytes {
    double states, activations, workspace, kernel_scratch, stage_buffers, held;
    double total;
    // The total with every block rounded up to the device arena's pages, as
    // the formula's timeline counts them at its own largest (step_memory.h's
    // arena_peak), and the region those blocks need where the arena places
    // them, holes included (its high_water); here, before a caller sets them
    // from the timeline, the total.
    double arena, high_water;
} RunDeviceBytes;
// Does a run of r fit the device budget: its bytes within `budget`, and its
// blocks, placed as the arena places them, within the region the device
// reserves for it, `region` (the cpu device's: the budget rounded up to
// whole pages): each block rounded up to its pages, and the free bytes left
// in holes between blocks (fragmentation, ZeRO-R's, which
// --contiguous-buffers answers) counted.
int run_fits(const RunDeviceBytes *r, double budget, double region);
RunDeviceBytes run_device_bytes(StageId s, const GPTLayout *l, const GPTPlan *p, size_t state_params, int dp_ranks,
                                int act_bytes, double kernel_scratch, double stage_buffers, double held);

// Largest Ψ whose model states fit in `bytes` per rank for a stage at N ranks
// (activations and buffers excluded).
double stage_max_params(StageId s, double bytes_per_rank, int ranks);
// One line: which stages/rank counts would fit Ψ in `budget_bytes`, e.g.
// "fits: zero2 at 4 ranks (3.1 GB), zero3 at 2 ranks (...)".
void stage_fit_hint(size_t psi, int ranks, double budget_bytes, char *out, size_t n);

// What each stage keeps: which states are whole or sharded and on which
// tier, as its strategy declares it (with its options: cpu_offload --dpu
// keeps a second gradient shard of its own; infinity --offload-params picks
// the params' tier). From the closed forms above; memory_math --measure
// allocates it with states_alloc.
StatesLayout stage_states(StageId s);

// ---- the stages' own device buffers (buffer_math.c) ----
// ZeRO-2's buckets: --bucket-mb, or by default an eighth of the padded
// gradients and at most 25 MB, at most the whole; elements per bucket.
#define ZERO_BUCKET_MAX_BYTES ((size_t)25 * 1000 * 1000)
#define ZERO_PREFETCH_DEFAULT 1  // zero3's --prefetch
size_t zero_bucket_elems(double bucket_mb, const Partition *p);
// A bucket of cap elements is received in part: at most the rank's shard.
size_t zero_bucket_recv_elems(size_t cap, const Partition *p);
// Two buckets, each bucket_elems sent and its part (at most the shard) received, bf16.
double zero_bucket_bytes(double bucket_mb, const Partition *p);
// ZeRO-3's gathered units at prefetch depth p, over one training
// micro-batch's schedule (2U entries: the forwards, then the backwards; an
// evaluation's `forward_only` has the U forwards). While entry e computes,
// the units read by entries e..e+p are gathered; a unit is gathered again
// for an entry that reads it unless one of the max(p, 1) entries before
// reads it too. The most bytes gathered at once (training's schedule):
double zero_gathered_peak_bytes(const GPTLayout *l, int prefetch);
// What zero3 keeps gathered while schedule entry e computes (the window
// W(e), each unit with the bytes of the pass it was gathered for), or, with
// `released`, once entry e's release has dropped what no entry of the next
// max(p, 1) reads.
double zero_live_bytes(const GPTLayout *l, int prefetch, const double bytes[2][GPT_MAX_UNITS], int e, int released);
// The same units, into out in the order their gathers start (by the entry
// each was gathered for, then the order that entry reads them in); returns
// how many.
int zero_live_units(const GPTLayout *l, int prefetch, int e, int released, int out[GPT_MAX_UNITS]);
// The same replay where a unit gathered for an entry of pass p (0 forward,
// 1 backward) holds bytes[p][u] while live (ZeRO++'s quantized gathers keep
// their int8 parts beside the unit).
double zero_live_peak_bytes(const GPTLayout *l, int prefetch, const double bytes[2][GPT_MAX_UNITS]);
// The all-gathers of one training micro-batch (the planner's latency terms),
// the elements they gather, and those started ahead of the entry that reads
// them (all but entry 0's with p > 0; none at p = 0).
int zero_gathers_per_micro_batch(const GPTLayout *l, int prefetch);
double zero_gathered_elems(const GPTLayout *l, int prefetch, int forward_only);
int zero_gathers_ahead(const GPTLayout *l, int prefetch, int forward_only);
// Those gathers in the order they start: the unit, and the pass of the
// entry it is gathered for. Returns how many; out may be NULL, else it has
// room for 2 x GPT_MAX_UNITS x 2.
typedef struct ZeroGather {
    int unit, backward;
} ZeroGather;
int zero_gather_schedule(const GPTLayout *l, int prefetch, ZeroGather *out);
// A stage's own device buffers at its flags' defaults: ZeRO-1's reduced
// gradient shard, ZeRO-2's and Offload's buckets, ZeRO-3's and Infinity's
// buckets and gathered units.
double stage_buffer_bytes(StageId s, const GPTLayout *l, const Partition *p);
// zero3 and infinity's modes: the stages that gather each unit's parameters before use
int stage_gathers_params(StageId s);
