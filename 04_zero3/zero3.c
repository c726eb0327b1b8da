// zero3: ZeRO stage 3, parameter partitioning on top of ZeRO-2. Every model
// state is sharded: bf16 params, bf16 grads, fp32 master, m and v, 16Ψ/N per
// rank. A unit's params are all-gathered before its forward and again before
// its backward (the next units' gathers prefetched meanwhile) and released
// after use, so only a few units are ever whole. Gradients leave in buckets
// as in ZeRO-2. Traffic: 3Ψ per step (two gathers and a reduce-scatter).
#include <stdlib.h>
#include "../02_zero1/shard_update.h"
#include "../03_zero2/grad_shard.h"
#include "check.h"
#include "kernels.h"
#include "param_shard.h"
#include "trainer.h"

typedef struct Zero3 {
    ParamShard params;
    GradShard grads;
} Zero3;

static void zero3_setup(Trainer *t) {
    Zero3 *z = xcalloc(1, sizeof *z);
    param_shard_init(&z->params, t);
    grad_shard_init(&z->grads, t);
    t->sctx = z;
}

static const bf16 *zero3_params(void *ctx, int u) {
    Trainer *t = ctx;
    return param_shard_view(&((Zero3 *)t->sctx)->params, u);
}

static void zero3_before_forward(void *ctx, int u) {
    Trainer *t = ctx;
    param_shard_acquire(&((Zero3 *)t->sctx)->params, t, u, 0);
}

static void zero3_after_forward(void *ctx, int u) {
    Trainer *t = ctx;
    param_shard_release(&((Zero3 *)t->sctx)->params, t, u, 0);
}

static void zero3_before_backward(void *ctx, int u) {
    Trainer *t = ctx;
    Zero3 *z = t->sctx;
    param_shard_acquire(&z->params, t, u, 1);
    grad_shard_progress(&z->grads, t);
}

static void zero3_grads_ready(void *ctx, int u, const float *g) {
    Trainer *t = ctx;
    grad_shard_add_unit(&((Zero3 *)t->sctx)->grads, t, u, g);
}

static void zero3_after_backward(void *ctx, int u) {
    Trainer *t = ctx;
    Zero3 *z = t->sctx;
    param_shard_release(&z->params, t, u, 1);
    if (u == GPT_UNIT_EMBED) grad_shard_flush(&z->grads, t);
}

static void zero3_reduce_grads(Trainer *t) {}

static double zero3_grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, t->st.grads.ptr); }

// The shard's new bf16 values are all this rank keeps: nothing to gather
// until the next forward asks for a unit.
static void zero3_update(Trainer *t, const AdamWStep *s) {
    param_shard_release_all(&((Zero3 *)t->sctx)->params, t);
    shard_adamw(t, t->st.grads.ptr, t->st.params.ptr, s);
}

static void zero3_params_from_master(Trainer *t) {
    param_shard_release_all(&((Zero3 *)t->sctx)->params, t);
    t->dev.k->f32_to_bf16(&t->dev, t->st.params.ptr, t->st.master.ptr, t->part.shard);
}

static void zero3_teardown(Trainer *t) {
    Zero3 *z = t->sctx;
    param_shard_free(&z->params, t);
    grad_shard_free(&z->grads, t);
    free(z);
}

static const Strategy ZERO3 = {
    .name = "zero3",
    .stage = STAGE_ZERO3,
    .summary = "ZeRO-3: params, gradients and optimizer states all sharded (16 bytes/param / N);\n"
               "each unit's params all-gathered before use (prefetched) and released after.",
    .flags = STRATEGY_FLAG_BUCKET | STRATEGY_FLAG_PREFETCH,
    .setup = zero3_setup,
    .hooks = {NULL, zero3_params, zero3_before_forward, zero3_after_forward, zero3_before_backward,
              zero3_grads_ready, zero3_after_backward},
    .reduce_grads = zero3_reduce_grads,
    .grad_norm_sq = zero3_grad_norm_sq,
    .update = zero3_update,
    .params_from_master = zero3_params_from_master,
    .teardown = zero3_teardown,
};

int main(int argc, char **argv) { return trainer_main(argc, argv, &ZERO3); }
