// shard_update.h: what every sharded stage does at the optimizer step. Rank r
// owns the fp32 master, m and v of its shard [begin, end) of the flat buffer;
// it updates them with its reduced gradient shard and writes bf16(master) to
// its slice of the parameters. ZeRO-1 and ZeRO-2 then all-gather the bf16
// parameters so every rank holds them whole for the next forward. The ranks
// are those of the data-parallel group (t->dp: the world, or the replicas of
// one model part in stage 07).
#pragma once
#include "trainer.h"

// Squared norm of the gradient from each rank's reduced shard, summed over
// the data-parallel group.
double shard_grad_norm_sq(Trainer *t, const bf16 *grad_shard);
// AdamW on this rank's shard; the new bf16 values go to `param_shard`.
void shard_adamw(Trainer *t, const bf16 *grad_shard, bf16 *param_shard, const AdamWStep *s);
// Full (padded) bf16 params: every rank contributes its shard, in place.
void all_gather_params(Trainer *t);
// This rank's slice of the full params buffer.
bf16 *own_param_slice(Trainer *t);
