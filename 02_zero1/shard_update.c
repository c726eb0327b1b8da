// shard_update.c: the optimizer step on a shard (see shard_update.h).
#include "shard_update.h"
#include "kernels.h"

double shard_grad_norm_sq(Trainer *t, const bf16 *grad_shard) {
    double local = t->dev.k->sum_squares_bf16(&t->dev, grad_shard, t->part.shard);
    return comm_sum_f64(t->dp, local);
}

bf16 *own_param_slice(Trainer *t) { return (bf16 *)t->st.params.ptr + t->part.begin; }

// LAB 02: shard_update -- AdamW on the own shard; the bf16 params gathered whole again
// AdamW (the device's kernel, t->dev.k->adamw) over this rank's shard:
// master, m, v (t->st.*, t->part.shard elements each) with the reduced
// gradient shard, writing bf16(master) to param_shard.
void shard_adamw(Trainer *t, const bf16 *grad_shard, bf16 *param_shard, const AdamWStep *s) {
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    // padding past Ψ has zero gradient and zero master weight, so it stays zero
    t->dev.k->adamw(&t->dev, t->st.master.ptr, t->st.m.ptr, t->st.v.ptr, grad_shard, param_shard,
                    t->part.shard, s);
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, "optimizer", 0);
}

// In place: rank q's slice [q·shard, (q+1)·shard) of the full params buffer
// (t->st.params) goes to every rank of t->dp (comm_all_gather, counts and
// displacements of each rank's slice), which travels once the compute
// stream has written it (comm.h: collectives keep compute-stream order).
void all_gather_params(Trainer *t) {
    int N = t->dp->size;
    size_t counts[N], displs[N];
    for (int q = 0; q < N; q++) {
        counts[q] = t->part.shard;
        displs[q] = (size_t)q * t->part.shard;
    }
    comm_all_gather(t->dp, t->st.params.ptr, counts, displs, DT_HALF, NULL);
}
// LAB END
