// zero2: ZeRO stage 2, gradient partitioning on top of ZeRO-1. bf16 params
// stay replicated (2Ψ); the gradients are never held whole: as soon as a
// unit's gradients are complete in backward they go into a bucket that is
// reduce-scattered asynchronously while backward goes on, and each rank keeps
// only its shard (2Ψ/N), accumulated over micro-batches. With fp32 master, m
// and v sharded as in ZeRO-1: 2Ψ + 14Ψ/N per rank, plus two buckets.
#include "grad_shard.h"
#include "kernels.h"
#include "../02_zero1/shard_update.h"
#include "trainer.h"

typedef struct Stage {
    double bucket_mb;  // --bucket-mb
    GradShard grads;   // the two buckets
} Stage;

static int flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    out[0] = grad_shard_flag(&z->bucket_mb);
    return 1;
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    grad_shard_init(&z->grads, t, z->bucket_mb);
}

static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return grad_shard_device_bytes(z->bucket_mb, p);
}

static void before_backward(Trainer *t, int u) {
    Stage *z = t->sctx;
    grad_shard_progress(&z->grads, t);
}

static void grads_ready(Trainer *t, int u, const float *g) {
    Stage *z = t->sctx;
    grad_shard_add_unit(&z->grads, t, u, g);
}

// The embeddings finish backward last: the micro-batch's gradients are all bucketed.
static void after_backward(Trainer *t, int u) {
    Stage *z = t->sctx;
    if (u == GPT_UNIT_EMBED) grad_shard_flush(&z->grads, t);
}

// Every micro-batch was reduced as it finished: no reduce_grads step.

static double grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, t->st.grads.ptr); }

static void update(Trainer *t, const AdamWStep *s) {
    shard_adamw(t, t->st.grads.ptr, own_param_slice(t), s);
    all_gather_params(t);
}

static void params_from_master(Trainer *t) {
    t->dev.k->f32_to_bf16(&t->dev, own_param_slice(t), t->st.master.ptr, t->part.shard);
    all_gather_params(t);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    grad_shard_free(&z->grads, t);
}

const Strategy strategy_zero2 = {
    .name = "zero2",
    .summary = "ZeRO-2: optimizer states and gradients sharded; gradients leave in buckets,\n"
               "reduce-scattered asynchronously during backward; bf16 params all-gathered.",
    .formula = STAGE_ZERO2,
    // the gradients are sharded too: 2Ψ/N of them per rank
    .states = {.params = STATE_FULL, .grads = STATE_SHARD, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .context_bytes = sizeof(Stage),
    .flags = flags,
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .unit_params = replicated_unit_params,
    .before_backward = before_backward,
    .grads_ready = grads_ready,
    .after_backward = after_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .teardown = teardown,
};
