// host_grads.c: reduced gradient parts down to the pinned host shard (see
// host_grads.h).
#include "host_grads.h"
#include <string.h>
#include "kernels.h"

// zero2's bucket sink: this rank's reduced part of a bucket goes down on the
// copy stream (ordered after the reduce-scatter by comm_wait) straight into
// the host shard; later micro-batches of the step (and every one with the
// fp32 accumulator) land in a staging buffer and are added there by the
// host (grads_add_half: the same sums zero2 does on the device).
static void deliver_grads(Trainer *t, size_t first, const bf16 *part, size_t count, GradTurn turn, void *arg) {
    HostGrads *hg = arg;
    bf16 *dst = (bf16 *)t->st.grads.ptr + (first - t->part.begin);
    size_t bytes = count * sizeof(bf16);
    if (turn.first && !t->st.grads_acc.ptr) {
        dev_copy(&t->dev, dst, part, bytes, STREAM_COPY);
    } else {
        dev_copy(&t->dev, hg->accum.ptr, part, bytes, STREAM_COPY);
        dev_sync(&t->dev, STREAM_COPY);  // the host reads it next
        grads_add_half(t, &kernels_cpu, first - t->part.begin, hg->accum.ptr, count, turn);
    }
    count_transfer(t, XFER_D2H, (double)bytes);
    if (hg->arrived) hg->arrived(t, first, count, hg->arrived_arg);
}

void host_grads_init(HostGrads *hg, GradShard *gs, Trainer *t) {
    memset(hg, 0, sizeof *hg);
    gs->sink = deliver_grads;
    gs->sink_arg = hg;
    size_t part = gs->cap < t->part.shard ? gs->cap : t->part.shard;
    hg->accum = buf_alloc(&t->dev, TIER_PINNED, CAT_COMM, part * sizeof(bf16), "reduced part to accumulate");
}

void host_grads_free(HostGrads *hg, Trainer *t) { buf_free(&t->dev, &hg->accum); }

double host_grads_norm_sq(Trainer *t) {
    dev_sync(&t->dev, STREAM_COPY);  // every reduced part has arrived
    double local = kernels_cpu.sum_squares_bf16(&t->dev, t->st.grads.ptr, t->part.shard);
    return comm_sum_f64(t->dp, local);
}
