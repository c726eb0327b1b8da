// zero1: ZeRO stage 1 (Rajbhandari et al., 2020), optimizer-state
// partitioning. bf16 params and grads stay replicated (4Ψ), but each rank
// keeps fp32 master, m and v only for its 1/N shard (12Ψ/N). After backward
// the gradients are reduce-scattered (each rank receives the sum of its
// shard), each rank updates its shard, and the bf16 params are all-gathered:
// the same 2Ψ of traffic as the all-reduce of dp_baseline.
#include "kernels.h"
#include "shard_update.h"
#include "trainer.h"
#include <stdlib.h>
#include "check.h"

typedef struct Zero1 {
    Buf reduced;  // this rank's shard of the summed gradient (bf16)
} Zero1;

static void zero1_setup(Trainer *t) {
    Zero1 *z = xcalloc(1, sizeof *z);
    z->reduced = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, t->part.shard * sizeof(bf16), "reduced gradient shard");
    t->sctx = z;
}

// bf16 params and grads stay whole, as in dp_baseline (the replicated hooks):
// gradients accumulate over micro-batches in the full buffer.

static void zero1_reduce_grads(Trainer *t) {
    Zero1 *z = t->sctx;
    int N = t->world.size;
    size_t counts[N];
    for (int q = 0; q < N; q++) counts[q] = t->part.shard;
    dev_sync(&t->dev, STREAM_COMPUTE);
    comm_reduce_scatter_sum(&t->world, t->st.grads.ptr, z->reduced.ptr, counts, DT_BF16, NULL);
}

static double zero1_grad_norm_sq(Trainer *t) { return shard_grad_norm_sq(t, ((Zero1 *)t->sctx)->reduced.ptr); }

static void zero1_update(Trainer *t, const AdamWStep *s) {
    shard_adamw(t, ((Zero1 *)t->sctx)->reduced.ptr, own_param_slice(t), s);
    all_gather_params(t);
}

static void zero1_params_from_master(Trainer *t) {
    t->dev.k->f32_to_bf16(&t->dev, own_param_slice(t), t->st.master.ptr, t->part.shard);
    all_gather_params(t);
}

static void zero1_teardown(Trainer *t) {
    Zero1 *z = t->sctx;
    buf_free(&t->dev, &z->reduced);
    free(z);
}

static const Strategy ZERO1 = {
    .name = "zero1",
    .stage = STAGE_ZERO1,
    .summary = "ZeRO-1: optimizer states (fp32 master, m, v) sharded over the ranks; gradients\n"
               "reduce-scattered, each rank updates its shard, bf16 params all-gathered.",
    .setup = zero1_setup,
    .hooks = {NULL, hook_replicated_params, hook_nothing, hook_nothing, hook_nothing, hook_replicated_grads_ready,
              hook_nothing},
    .reduce_grads = zero1_reduce_grads,
    .grad_norm_sq = zero1_grad_norm_sq,
    .update = zero1_update,
    .params_from_master = zero1_params_from_master,
    .teardown = zero1_teardown,
};

int main(int argc, char **argv) { return trainer_main(argc, argv, &ZERO1); }
