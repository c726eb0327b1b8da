// zero3: ZeRO stage 3, parameter partitioning on top of ZeRO-2. Every model
// state is sharded: bf16 params, bf16 grads, fp32 master, m and v, 16Ψ/N per
// rank. A unit's params are all-gathered before its forward and again before
// its backward (the next units' gathers prefetched meanwhile) and released
// after use, so only a few units are ever whole. Gradients leave in buckets
// as in ZeRO-2. Traffic: 3Ψ per step (two gathers and a reduce-scatter).
// ZeRO++'s switches (zeropp.h) change how the gathers and the buckets move,
// not this loop.
#include "shard_update.h"
#include "grad_shard.h"
#include "kernels.h"
#include "param_shard.h"
#include "trainer.h"
#include "zeropp.h"

typedef struct Stage {
    double bucket_mb;   // --bucket-mb
    int prefetch;       // --prefetch
    GradShard grads;    // the two buckets
    ParamShard params;  // the units gathered now
    ZeroPP pp;          // ZeRO++: qwZ, hpZ, qgZ
} Stage;

static int flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    out[0] = grad_shard_flag(&z->bucket_mb);
    out[1] = param_shard_flag(&z->prefetch);
    return 2 + zeropp_flags(&z->pp.c, out + 2);
}

static Placement configure(const Trainer *t, TrainConfig *cfg, const GPTConfig *model, Placement p) {
    Stage *z = t->sctx;
    return zeropp_configure(&z->pp, t, z->prefetch, p);
}

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    grad_shard_init(&z->grads, t, z->bucket_mb);
    param_shard_init(&z->params, t, z->prefetch);
    zeropp_setup(&z->pp, t, &z->params, &z->grads);
}

// The buckets, and the units gathered at once at this prefetch depth (with
// ZeRO++ its buffers too).
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return zero_bucket_bytes(z->bucket_mb, p) + zeropp_buffer_bytes(&z->pp, l, p, z->prefetch, z->bucket_mb);
}

// Gathered units, by --prefetch's windows; ZeRO++'s own buffers are not in
// the formula's timeline.
static void step_shape(const void *ctx, const Trainer *t, StepMemorySpec *s) {
    const Stage *z = ctx;
    if (z->pp.on) s->not_modelled = "ZeRO++'s quantized and secondary buffers";
    else param_shard_step_shape(z->prefetch, z->bucket_mb, t, s);
}

// The micro-batch step. No rank holds the params whole: before a unit
// computes, its params are all-gathered (and the next units' gathers
// started: prefetch), and after it they are released unless an upcoming unit
// reads them. Backward gathers them again. The gradients leave in zero2's
// buckets.
static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    GPT *g = &t->model;
    ParamShard *ps = &z->params;
    int head = gpt_unit_head(&g->L);
    param_shard_begin(ps, mb);
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) {
            param_shard_acquire(ps, t, u, PASS_FORWARD);  // gathered (the head's wte too), the next ones started
            const bf16 *wte = u == head ? param_shard_view(ps, GPT_UNIT_EMBED) : NULL;  // tied output projection
            gpt_unit_forward(g, u, 0, param_shard_view(ps, u), wte);
            param_shard_release(ps, t, u, PASS_FORWARD);
        }
        gpt_slot_loss_queue(g, 0);
        if (!mb->backward) continue;
        for (int u = g->L.num_units - 1; u >= 0; u--) {
            param_shard_acquire(ps, t, u, PASS_BACKWARD);
            grad_shard_progress(&z->grads, t);  // MPI moves the buckets in flight only inside its calls
            // the embeddings' backward scatters gradients and reads no params: nothing was gathered for it
            const bf16 *p = u == GPT_UNIT_EMBED ? NULL : param_shard_view(ps, u);
            const bf16 *wte = u == head ? param_shard_view(ps, GPT_UNIT_EMBED) : NULL;
            const float *grads = gpt_unit_backward(g, u, 0, p, wte);
            grad_shard_add_unit(&z->grads, t, u, grads, micro_turn(mb, i));  // a full bucket leaves now
            param_shard_release(ps, t, u, PASS_BACKWARD);
        }
        grad_shard_flush(&z->grads, t);
    }
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

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
    t->dev.k->f32_to_half(&t->dev, t->st.params.ptr, t->st.master.ptr, t->part.shard);
}

static void report(Trainer *t, FILE *json) {
    Stage *z = t->sctx;
    param_shard_report(&z->params, t, json);
    zeropp_report(&z->pp, t, json);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    param_shard_free(&z->params, t);
    grad_shard_free(&z->grads, t);
    zeropp_free(&z->pp, t);
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
    .configure = configure,
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
