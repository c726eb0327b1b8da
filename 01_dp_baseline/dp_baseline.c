// dp_baseline: replicated data parallelism, the baseline every ZeRO stage is
// measured against. Every rank holds all model states -- bf16 params (2Ψ),
// bf16 grads (2Ψ), fp32 master weights, Adam m and v (12Ψ) = 16Ψ bytes --
// computes gradients on its rows of the batch, all-reduces them (a sum in
// bf16), and applies the same AdamW update, so the replicas stay identical.
// The trainer's main (common/training/stage_main.c) runs this strategy.
#include "kernels.h"
#include "trainer.h"

// LAB 01: dp_step -- all-reduce the gradients; the same AdamW on every replica
// After the last micro-batch each rank holds its own rows' gradient sum in
// t->st.grads (bf16, Ψ elements): make it the sum over all ranks, in place
// (comm_all_reduce_sum). A collective reads a device buffer after the work
// queued on the compute stream so far (comm.h): the host need not wait.
static void all_reduce_grads(Trainer *t) {
    comm_all_reduce_sum(&t->world, t->st.grads.ptr, t->layout.num_params, DT_HALF, NULL);
}

// Every rank holds the whole reduced gradient, so the norm needs no communication.
static double grad_norm_sq(Trainer *t) {
    return t->dev.k->sum_squares_bf16(&t->dev, t->st.grads.ptr, t->layout.num_params);
}

// AdamW over all Ψ elements (the device's kernel, t->dev.k->adamw): master,
// m, v and the reduced gradient in, bf16(master) out into t->st.params. Every
// rank does the same, so the replicas stay identical.
static void update(Trainer *t, const AdamWStep *s) {
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    t->dev.k->adamw(&t->dev, t->st.master.ptr, t->st.m.ptr, t->st.v.ptr, t->st.grads.ptr, t->st.params.ptr,
                    t->layout.num_params, s);
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, "optimizer", 0);
}
// LAB END

// The micro-batch step. Params and grads are whole on every rank: each unit
// reads its slice of the full params, and its gradients are added into the
// full bf16 gradient buffer over the micro-batches (the replicated helpers,
// common/training/trainer.c). After the last micro-batch, the all-reduce.
static double forward_backward(Trainer *t, const MicroBatches *mb) {
    GPT *g = &t->model;
    const bf16 *embed = replicated_unit_params(t, GPT_UNIT_EMBED);  // the head reads wte too (tied)
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) gpt_unit_forward(g, u, 0, replicated_unit_params(t, u), embed);
        gpt_slot_loss_queue(g, 0);
        if (!mb->backward) continue;
        for (int u = g->L.num_units - 1; u >= 0; u--)
            replicated_add_grads(t, u, gpt_unit_backward(g, u, 0, replicated_unit_params(t, u), embed), micro_turn(mb, i));
    }
    if (mb->backward) all_reduce_grads(t);
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

static void params_from_master(Trainer *t) {
    t->dev.k->f32_to_half(&t->dev, t->st.params.ptr, t->st.master.ptr, t->layout.num_params);
}

const Strategy strategy_dp_baseline = {
    .name = "dp_baseline",
    .summary = "Replicated data parallel: every rank holds all model states (16 bytes/param) and\n"
               "all-reduces the gradients after backward.",
    .formula = STAGE_DP,
    // everything whole, everything on the device
    .states = {.params = STATE_FULL, .grads = STATE_FULL, .optim = STATE_FULL,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .forward_backward = forward_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
};
