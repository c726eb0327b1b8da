// zero2: ZeRO stage 2, gradient partitioning on top of ZeRO-1. bf16 params
// stay replicated (2Ψ); the gradients are never held whole: as soon as a
// unit's gradients are complete in backward they go into a bucket that is
// reduce-scattered asynchronously while backward goes on, and each rank keeps
// only its shard (2Ψ/N), accumulated over micro-batches. With fp32 master, m
// and v sharded as in ZeRO-1: 2Ψ + 14Ψ/N per rank, plus two buckets.
#include "grad_shard.h"
#include "kernels.h"
#include "shard_update.h"
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
    return zero_bucket_bytes(z->bucket_mb, p);
}

// The buckets' four blocks, through the step.
static void step_shape(const void *ctx, const Trainer *t, StepMemorySpec *s) {
    const Stage *z = ctx;
    step_memory_buckets(s, z->bucket_mb, &t->part);
}

// The micro-batch step. bf16 params stay whole, as in ZeRO-1; the gradients
// never are: as each unit's come out of backward they go into a bucket, and a
// full bucket is reduce-scattered while backward goes on with the units
// before it. After each micro-batch's last unit (the embeddings) the last
// bucket goes, and the shard holds the sum over ranks (and micro-batches).
static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    GPT *g = &t->model;
    const bf16 *embed = replicated_unit_params(t, GPT_UNIT_EMBED);  // the head reads wte too (tied)
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) gpt_unit_forward(g, u, 0, replicated_unit_params(t, u), embed);
        gpt_slot_loss_queue(g, 0);
        if (!mb->backward) continue;
        for (int u = g->L.num_units - 1; u >= 0; u--) {
            grad_shard_progress(&z->grads, t);  // MPI moves the buckets in flight only inside its calls
            const float *grads = gpt_unit_backward(g, u, 0, replicated_unit_params(t, u), embed);
            grad_shard_add_unit(&z->grads, t, u, grads, micro_turn(mb, i));  // a full bucket leaves now
        }
        grad_shard_flush(&z->grads, t);
    }
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

static double grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, t->st.grads.ptr); }

static void update(Trainer *t, const AdamWStep *s) {
    shard_adamw(t, t->st.grads.ptr, own_param_slice(t), s);
    all_gather_params(t);
}

static void params_from_master(Trainer *t) {
    t->dev.k->f32_to_half(&t->dev, own_param_slice(t), t->st.master.ptr, t->part.shard);
    all_gather_params(t);
}

// How many buckets left while backward ran, beside the formula (grad_shard.h)
static void report(Trainer *t, FILE *json) { grad_shard_report(&((Stage *)t->sctx)->grads, t, json); }

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
    .step_shape = step_shape,
    .forward_backward = forward_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .report = report,
    .teardown = teardown,
};
