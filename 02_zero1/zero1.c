// zero1: ZeRO stage 1 (Rajbhandari et al., 2020), optimizer-state
// partitioning. bf16 params and grads stay replicated (4Ψ), but each rank
// keeps fp32 master, m and v only for its 1/N shard (12Ψ/N). After backward
// the gradients are reduce-scattered (each rank receives the sum of its
// shard), each rank updates its shard, and the bf16 params are all-gathered:
// the same 2Ψ of traffic as the all-reduce of dp_baseline.
#include "kernels.h"
#include "shard_update.h"
#include "trainer.h"

typedef struct Stage {
    Buf reduced;  // this rank's shard of the summed gradient (bf16)
} Stage;

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    z->reduced = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, t->part.shard * sizeof(bf16), "reduced gradient shard");
}

static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    return (double)p->shard * sizeof(bf16);
}

// That shard, one block through the step.
static void step_shape(const void *ctx, const Trainer *t, StepMemorySpec *s) {
    step_memory_fixed(s, CAT_COMM, device_buffer_bytes(ctx, &t->layout, &t->part));
}

// LAB 02: zero1_step -- reduce-scatter the gradients, update the own shard, all-gather
// After the last micro-batch every rank holds the whole bf16 gradient
// (t->st.grads, Ψ_pad elements). Reduce-scatter it so that rank r receives
// the sum over ranks of its shard [r·shard, (r+1)·shard) in z->reduced
// (comm_reduce_scatter_sum, counts of t->part.shard each): (N-1)/N·2Ψ bytes
// per rank of a ring.
static void reduce_scatter_grads(Trainer *t) {
    Stage *z = t->sctx;
    int N = t->dp->size;
    size_t counts[N];
    for (int q = 0; q < N; q++) counts[q] = t->part.shard;
    comm_reduce_scatter_sum(t->dp, t->st.grads.ptr, z->reduced.ptr, counts, DT_HALF, NULL);
}

// The squared global norm: each rank's reduced shard, summed over ranks.
static double grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, ((Stage *)t->sctx)->reduced.ptr); }

// AdamW on the own shard (shard_adamw: master, m, v and the reduced
// gradient shard in, bf16(master) out into this rank's slice of the
// params), then all ranks gather the slices (all_gather_params).
static void update(Trainer *t, const AdamWStep *s) {
    shard_adamw(t, ((Stage *)t->sctx)->reduced.ptr, own_param_slice(t), s);
    all_gather_params(t);
}
// LAB END

// The micro-batch step. Params and grads are whole on every rank: each unit
// reads its slice of the full params, and its gradients are added into the
// full bf16 gradient buffer over the micro-batches (the replicated helpers,
// common/training/trainer.c). After the last micro-batch, the reduce-scatter.
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
    if (mb->backward) reduce_scatter_grads(t);
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

static void params_from_master(Trainer *t) {
    t->dev.k->f32_to_half(&t->dev, own_param_slice(t), t->st.master.ptr, t->part.shard);
    all_gather_params(t);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    buf_free(&t->dev, &z->reduced);
}

const Strategy strategy_zero1 = {
    .name = "zero1",
    .summary = "ZeRO-1: optimizer states (fp32 master, m, v) sharded over the ranks; gradients\n"
               "reduce-scattered, each rank updates its shard, bf16 params all-gathered.",
    .formula = STAGE_ZERO1,
    // the optimizer states are sharded: each rank keeps 12Ψ/N of them
    .states = {.params = STATE_FULL, .grads = STATE_FULL, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .context_bytes = sizeof(Stage),
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .step_shape = step_shape,
    .forward_backward = forward_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .teardown = teardown,
};
