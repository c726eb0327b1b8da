// dp_baseline: replicated data parallelism, the baseline every ZeRO stage is
// measured against. Every rank holds all model states -- bf16 params (2Ψ),
// bf16 grads (2Ψ), fp32 master weights, Adam m and v (12Ψ) = 16Ψ bytes --
// computes gradients on its rows of the batch, all-reduces them (a sum in
// bf16), and applies the same AdamW update, so the replicas stay identical.
#include "kernels.h"
#include "trainer.h"

static const bf16 *dp_params(void *ctx, int u) {
    Trainer *t = ctx;
    return (const bf16 *)t->st.params.ptr + unit_range(t, u).offset;
}

// Fold this micro-batch's fp32 unit gradients into the bf16 gradient buffer.
static void dp_grads_ready(void *ctx, int u, const float *g) {
    Trainer *t = ctx;
    Range r = unit_range(t, u);
    t->dev.k->grad_to_bf16(&t->dev, (bf16 *)t->st.grads.ptr + r.offset, g, r.count, t->micro > 0);
}

static void dp_reduce_grads(Trainer *t) {
    dev_sync(&t->dev, STREAM_COMPUTE);  // gradients complete before they travel
    comm_all_reduce_sum(&t->world, t->st.grads.ptr, t->layout.num_params, DT_BF16, NULL);
}

// Every rank holds the whole reduced gradient, so the norm needs no communication.
static double dp_grad_norm_sq(Trainer *t) {
    return t->dev.k->sum_squares_bf16(&t->dev, t->st.grads.ptr, t->layout.num_params);
}

static void dp_update(Trainer *t, const AdamWStep *s) {
    t->dev.k->adamw(&t->dev, t->st.master.ptr, t->st.m.ptr, t->st.v.ptr, t->st.grads.ptr, t->st.params.ptr,
                    t->layout.num_params, s);
}

static void dp_params_from_master(Trainer *t) {
    t->dev.k->f32_to_bf16(&t->dev, t->st.params.ptr, t->st.master.ptr, t->layout.num_params);
}

static void dp_nothing(Trainer *t) {}

static const Strategy DP_BASELINE = {
    .name = "dp_baseline",
    .stage = STAGE_DP,
    .summary = "Replicated data parallel: every rank holds all model states (16 bytes/param) and\n"
               "all-reduces the gradients after backward.",
    .setup = dp_nothing,
    .hooks = {NULL, dp_params, hook_nothing, hook_nothing, hook_nothing, dp_grads_ready, hook_nothing},
    .reduce_grads = dp_reduce_grads,
    .grad_norm_sq = dp_grad_norm_sq,
    .update = dp_update,
    .params_from_master = dp_params_from_master,
    .teardown = dp_nothing,
};

int main(int argc, char **argv) { return trainer_main(argc, argv, &DP_BASELINE); }
