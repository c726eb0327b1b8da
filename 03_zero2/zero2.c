// zero2: ZeRO stage 2, gradient partitioning on top of ZeRO-1. bf16 params
// stay replicated (2Ψ); the gradients are never held whole: as soon as a
// unit's gradients are complete in backward they go into a bucket that is
// reduce-scattered asynchronously while backward goes on, and each rank keeps
// only its shard (2Ψ/N), accumulated over micro-batches. With fp32 master, m
// and v sharded as in ZeRO-1: 2Ψ + 14Ψ/N per rank, plus two buckets.
#include <stdlib.h>
#include "../02_zero1/shard_update.h"
#include "check.h"
#include "grad_shard.h"
#include "kernels.h"
#include "trainer.h"

static void zero2_setup(Trainer *t) {
    GradShard *gs = xcalloc(1, sizeof *gs);
    grad_shard_init(gs, t);
    t->sctx = gs;
}

static void zero2_before_backward(void *ctx, int u) {
    Trainer *t = ctx;
    grad_shard_progress(t->sctx, t);
}

static void zero2_grads_ready(void *ctx, int u, const float *g) {
    Trainer *t = ctx;
    grad_shard_add_unit(t->sctx, t, u, g);
}

// The embeddings finish backward last: the micro-batch's gradients are all bucketed.
static void zero2_after_backward(void *ctx, int u) {
    Trainer *t = ctx;
    if (u == GPT_UNIT_EMBED) grad_shard_flush(t->sctx, t);
}

// Every micro-batch was reduced as it finished; nothing is left to send.
static void zero2_reduce_grads(Trainer *t) {}

static double zero2_grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, t->st.grads.ptr); }

static void zero2_update(Trainer *t, const AdamWStep *s) {
    shard_adamw(t, t->st.grads.ptr, own_param_slice(t), s);
    all_gather_params(t);
}

static void zero2_params_from_master(Trainer *t) {
    t->dev.k->f32_to_bf16(&t->dev, own_param_slice(t), t->st.master.ptr, t->part.shard);
    all_gather_params(t);
}

static void zero2_teardown(Trainer *t) {
    grad_shard_free(t->sctx, t);
    free(t->sctx);
}

static const Strategy ZERO2 = {
    .name = "zero2",
    .stage = STAGE_ZERO2,
    .summary = "ZeRO-2: optimizer states and gradients sharded; gradients leave in buckets,\n"
               "reduce-scattered asynchronously during backward; bf16 params all-gathered.",
    .flags = STRATEGY_FLAG_BUCKET,
    .setup = zero2_setup,
    .hooks = {NULL, hook_replicated_params, hook_nothing, hook_nothing, zero2_before_backward, zero2_grads_ready,
              zero2_after_backward},
    .reduce_grads = zero2_reduce_grads,
    .grad_norm_sq = zero2_grad_norm_sq,
    .update = zero2_update,
    .params_from_master = zero2_params_from_master,
    .teardown = zero2_teardown,
};

int main(int argc, char **argv) { return trainer_main(argc, argv, &ZERO2); }
