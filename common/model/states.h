// states.h: the model states of a stage (bf16 params, bf16 grads, fp32 master,
// Adam m and v), full or sharded over the data-parallel ranks, on the tier the
// stage chooses. Every stage allocates through states_alloc, and memory_math
// --measure calls the same function, so the formula is checked against the
// allocator that the trainers really use.
#pragma once
#include <stddef.h>
#include "device.h"
#include "gpt.h"

// Shards are contiguous ranges of the flat buffer, padded so the padded length
// divides by ranks * SHARD_ALIGN (elements), which keeps every shard 128-byte
// aligned for bf16 and 256-byte aligned for fp32.
#define SHARD_ALIGN 64

typedef struct Partition {
    size_t num_params;  // Ψ
    size_t padded;      // Ψ rounded up to a multiple of ranks * SHARD_ALIGN
    size_t shard;       // padded / ranks
    int ranks, rank;
    size_t begin, end;  // this rank's shard [begin, end) in flat coordinates
} Partition;

void partition_init(Partition *p, size_t num_params, int ranks, int rank);
// Elements of flat range r that fall in rank q's shard, and where they start.
size_t partition_overlap(const Partition *p, Range r, int q, size_t *first);

typedef enum { STATE_FULL = 0, STATE_SHARD = 1, STATE_NONE = 2 } StateExtent;

typedef struct StatesLayout {
    StateExtent params, grads, optim;       // optim = master, m, v together
    MemTier params_tier, grads_tier, optim_tier;
    int grads_accum_fp32;  // an fp32 accumulator beside the grads (--grad-accum-dtype fp32)
} StatesLayout;

typedef struct ModelStates {
    StatesLayout layout;
    Partition part;
    Buf params;  // bf16: Ψ_pad elements (FULL) or shard (SHARD)
    Buf grads;   // bf16: likewise
    Buf grads_acc;  // fp32, as grads, where the layout asks for it; else empty (grad_accum.h)
    Buf master, m, v;  // fp32: Ψ (FULL, unpadded: no partner to pad for) or shard
    size_t optim_begin, optim_count;  // flat range the optimizer states cover
} ModelStates;

// Allocates (tracked) and zeroes nothing; states_init fills values.
// A state on TIER_NVME is not allocated: its Buf is a descriptor (ptr NULL,
// bytes = its size) for the aio module, which creates and accounts the file.
// FULL params/grads are Ψ_pad long when the optimizer is sharded, exactly Ψ
// when it is FULL too (dp_baseline). optim_count of a shard includes its
// padding elements, which are zero and stay zero under AdamW.
void states_alloc(ModelStates *s, Device *d, const StatesLayout *layout, const Partition *p);
// master = init values (gpt_init_values) over the optimizer range, m = v = 0,
// params = bf16(master) where both are present; FULL params on a sharded
// optimizer are filled from gpt_init_values directly (same values).
void states_init(ModelStates *s, Device *d, const GPTLayout *l, uint64_t seed);
// states_init for states that hold some flat ranges of the layout back to
// back, ranges[0] first (stage 07: a pipeline stage's units, and on the last
// stage a copy of wte): each element starts at the value of the layout's
// element it holds. The counts add up to the partition's Ψ.
void states_init_ranges(ModelStates *s, Device *d, const GPTLayout *l, const Range *ranges, int nranges,
                        uint64_t seed);
// out[i] = initial value of flat element begin + i (gpt_init_values), 0 in
// the padding past Ψ: what states_init writes, for a stage that writes its
// NVMe states itself.
void states_init_values(const GPTLayout *l, uint64_t seed, size_t begin, size_t n, float *out);
void states_free(ModelStates *s, Device *d);
