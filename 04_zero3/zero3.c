// zero3: ZeRO stage 3, parameter partitioning on top of ZeRO-2. Every model
// state is sharded: bf16 params, bf16 grads, fp32 master, m and v, 16Ψ/N per
// rank. A unit's params are all-gathered before its forward and again before
// its backward (the next units' gathers prefetched meanwhile) and released
// after use, so only a few units are ever whole. Gradients leave in buckets
// as in ZeRO-2. Traffic: 3Ψ per step (two gathers and a reduce-scatter).
#include "../02_zero1/shard_update.h"
#include "../03_zero2/grad_shard.h"
#include "kernels.h"
#include "param_shard.h"
#include "trainer.h"

typedef struct Stage {
    double bucket_mb;   // --bucket-mb
    int prefetch;       // --prefetch
    GradShard grads;    // the two buckets
    ParamShard params;  // the units gathered now
} Stage;

static int flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    out[0] = grad_shard_flag(&z->bucket_mb);
    out[1] = param_shard_flag(&z->prefetch);
    return 2;
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    grad_shard_init(&z->grads, t, z->bucket_mb);
    param_shard_init(&z->params, t, z->prefetch);
}

// The buckets, and the units gathered at once at this prefetch depth.
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return grad_shard_device_bytes(z->bucket_mb, p) + param_shard_peak_bytes(l, z->prefetch);
}

static const bf16 *unit_params(Trainer *t, int u) {
    Stage *z = t->sctx;
    return param_shard_view(&z->params, u);
}

static void before_forward(Trainer *t, int u) {
    Stage *z = t->sctx;
    param_shard_acquire(&z->params, t, u, 0);
}

static void after_forward(Trainer *t, int u) {
    Stage *z = t->sctx;
    param_shard_release(&z->params, t, u, 0);
}

static void before_backward(Trainer *t, int u) {
    Stage *z = t->sctx;
    param_shard_acquire(&z->params, t, u, 1);
    grad_shard_progress(&z->grads, t);
}

static void grads_ready(Trainer *t, int u, const float *g) {
    Stage *z = t->sctx;
    grad_shard_add_unit(&z->grads, t, u, g);
}

static void after_backward(Trainer *t, int u) {
    Stage *z = t->sctx;
    param_shard_release(&z->params, t, u, 1);
    if (u == GPT_UNIT_EMBED) grad_shard_flush(&z->grads, t);
}

// Every micro-batch was reduced as it finished: no reduce_grads step.

static double grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, t->st.grads.ptr); }

// The shard's new bf16 values are all this rank keeps: nothing to gather
// until the next forward asks for a unit.
static void update(Trainer *t, const AdamWStep *s) {
    Stage *z = t->sctx;
    param_shard_release_all(&z->params, t);
    shard_adamw(t, t->st.grads.ptr, t->st.params.ptr, s);
}

static void params_from_master(Trainer *t) {
    Stage *z = t->sctx;
    param_shard_release_all(&z->params, t);
    t->dev.k->f32_to_bf16(&t->dev, t->st.params.ptr, t->st.master.ptr, t->part.shard);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    param_shard_free(&z->params, t);
    grad_shard_free(&z->grads, t);
}

const Strategy strategy_zero3 = {
    .name = "zero3",
    .summary = "ZeRO-3: params, gradients and optimizer states all sharded (16 bytes/param / N);\n"
               "each unit's params all-gathered before use (prefetched) and released after.",
    .formula = STAGE_ZERO3,
    // the bf16 params are sharded too: every state is 1/N per rank
    .states = {.params = STATE_SHARD, .grads = STATE_SHARD, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .context_bytes = sizeof(Stage),
    .flags = flags,
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .unit_params = unit_params,
    .before_forward = before_forward,
    .after_forward = after_forward,
    .before_backward = before_backward,
    .grads_ready = grads_ready,
    .after_backward = after_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .teardown = teardown,
};
