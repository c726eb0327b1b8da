// dp_baseline: replicated data parallelism, the baseline every ZeRO stage is
// measured against. Every rank holds all model states -- bf16 params (2Ψ),
// bf16 grads (2Ψ), fp32 master weights, Adam m and v (12Ψ) = 16Ψ bytes --
// computes gradients on its rows of the batch, all-reduces them (a sum in
// bf16), and applies the same AdamW update, so the replicas stay identical.
// The trainer's main (common/training/stage_main.c) runs this strategy.
#include "kernels.h"
#include "trainer.h"

// Params and grads are whole on every rank: the shared replicated hooks
// (common/training/trainer.c) hand out slices of the full buffers, and each
// unit's gradients are accumulated there over the micro-batches.

// LAB 01: dp_step -- all-reduce the gradients; the same AdamW on every replica
// After the last micro-batch each rank holds its own rows' gradient sum in
// t->st.grads (bf16, Ψ elements): make it the sum over all ranks, in place
// (comm_all_reduce_sum), once the compute stream has finished writing it.
static void reduce_grads(Trainer *t) {
    dev_sync(&t->dev, STREAM_COMPUTE);  // gradients complete before they travel
    comm_all_reduce_sum(&t->world, t->st.grads.ptr, t->layout.num_params, DT_BF16, NULL);
}

// Every rank holds the whole reduced gradient, so the norm needs no communication.
static double grad_norm_sq(Trainer *t) {
    return t->dev.k->sum_squares_bf16(&t->dev, t->st.grads.ptr, t->layout.num_params);
}

// AdamW over all Ψ elements (the device's kernel, t->dev.k->adamw): master,
// m, v and the reduced gradient in, bf16(master) out into t->st.params. Every
// rank does the same, so the replicas stay identical.
static void update(Trainer *t, const AdamWStep *s) {
    double t0 = now_us();
    t->dev.k->adamw(&t->dev, t->st.master.ptr, t->st.m.ptr, t->st.v.ptr, t->st.grads.ptr, t->st.params.ptr,
                    t->layout.num_params, s);
    compute_span(t, "optimizer", t0);
}
// LAB END

static void params_from_master(Trainer *t) {
    t->dev.k->f32_to_bf16(&t->dev, t->st.params.ptr, t->st.master.ptr, t->layout.num_params);
}

const Strategy strategy_dp_baseline = {
    .name = "dp_baseline",
    .summary = "Replicated data parallel: every rank holds all model states (16 bytes/param) and\n"
               "all-reduces the gradients after backward.",
    .formula = STAGE_DP,
    // everything whole, everything on the device
    .states = {.params = STATE_FULL, .grads = STATE_FULL, .optim = STATE_FULL,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .unit_params = replicated_unit_params,
    .grads_ready = replicated_grads_ready,
    .reduce_grads = reduce_grads,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
};
