// gpt_checkpoints.c: where the blocks' saved inputs live under full
// recompute, when not every one stays whole on the device (ZeRO-R,
// Rajbhandari et al. 2020, section 6; DeepSpeed's activation_checkpointing):
//   offload_activations (cpu_checkpointing): in pinned host memory;
//   partition_activations (tp > 1): each tp rank keeps its 1/tp of the rows
//     (its contiguous part of the B·T tokens), on the device or the host, and
//     the group all-gathers them again before the block's recomputation.
// Every x3 of the range but the last block's (the head's input, what a
// pipeline stage sends on) is such a checkpoint; the first block's input is
// the slot's x_in. The device keeps a ring of two whole ones: block i writes
// its x3 into buf[i % 2], where block i+1 reads it while the copy stream
// takes it (or the rank's part of it) away; block i+2 writes there once that
// copy is out. In backward, block i needs x3 of block i-1 back in
// buf[(i-1) % 2]: its copy starts one unit ahead (at the backward of block
// i+1, or of the head), the compute stream waits for it by an event, not a
// host sync, and a partitioned one is all-gathered then. Every checkpoint
// comes back once: per micro-batch (L - 1) of them, sbhe each (sbhe/t
// partitioned), down in forward and back in backward.
#include <stdlib.h>
#include "check.h"
#include "comm.h"
#include "gpt_units.h"

void ckpt_store_init(GPT *g, act *ring0, act *ring1, size_t store_bytes) {
    CkptStore *o = xcalloc(1, sizeof *o);
    Device *d = g->dev;
    const GPTPlan *p = &g->plan;
    size_t rows = (size_t)res_rows(g), row_bytes = (size_t)g->L.cfg.channels * d->act_bytes;
    int parts = p->partition_activations ? g->L.tp_size : 1, part = p->partition_activations ? g->L.tp_rank : 0;
    o->buf[0] = ring0;
    o->buf[1] = ring1;
    o->bytes = rows * row_bytes;
    o->part_bytes = rows / parts * row_bytes;
    o->part_offset = (size_t)part * o->part_bytes;
    o->on_host = p->offload_activations;
    o->store = buf_alloc(d, o->on_host ? TIER_PINNED : TIER_DEVICE, CAT_ACTIVATIONS, store_bytes,
                         o->on_host ? "activation checkpoints (offloaded)" : "activation checkpoints (partitioned)");
    o->per_slot = plan_end_layer(p, g->L.cfg.num_layers) - plan_first_layer(p) - 1;
    for (int k = 0; k < 2; k++) {
        o->holds[k] = (RingTag){-1, -1, 0};
        d->ops->event_create(d, &o->written[k]);
        d->ops->event_create(d, &o->out[k]);
        d->ops->event_create(d, &o->in[k]);
        d->ops->event_create(d, &o->free[k]);
    }
    g->ckpt = o;
}

void ckpt_store_free(GPT *g) {
    CkptStore *o = g->ckpt;
    if (!o) return;
    Device *d = g->dev;
    dev_sync(d, STREAM_COPY);
    for (int k = 0; k < 2; k++) {
        d->ops->event_destroy(d, &o->written[k]);
        d->ops->event_destroy(d, &o->out[k]);
        d->ops->event_destroy(d, &o->in[k]);
        d->ops->event_destroy(d, &o->free[k]);
    }
    buf_free(d, &o->store);
    free(o);
    g->ckpt = NULL;
}

// Block i (0-based in the range) keeps its x3 in the store when it is not
// the range's last block.
static int stored(const GPT *g, int i) { return g->ckpt && i >= 0 && i < g->ckpt->per_slot; }

static void *store_of(const CkptStore *o, int s, int i) {
    return (char *)o->store.ptr + ((size_t)s * o->per_slot + (size_t)i) * o->part_bytes;
}

void ckpt_before_forward(GPT *g, int i, int s) {
    if (!stored(g, i)) return;
    CkptStore *o = g->ckpt;
    int k = i % 2;
    // the x3 two blocks back is in this buffer until its copy out is done
    g->dev->ops->stream_wait_event(g->dev, STREAM_COMPUTE, &o->out[k]);
    o->holds[k] = (RingTag){s, i, 0};
}

void ckpt_after_forward(GPT *g, int i, int s) {
    if (!stored(g, i)) return;
    CkptStore *o = g->ckpt;
    Device *d = g->dev;
    int k = i % 2;
    d->ops->event_record(d, &o->written[k], STREAM_COMPUTE);
    d->ops->stream_wait_event(d, STREAM_COPY, &o->written[k]);
    // the copy-stream span of a checkpoint goes on its own trace row (its bytes too)
    DevSpan sp = dev_span_begin(d, STREAM_COPY);
    dev_copy(d, store_of(o, s, i), (char *)o->buf[k] + o->part_offset, o->part_bytes, STREAM_COPY);
    dev_span_end(d, &sp, TRACE_TID_ACT_COPY, o->on_host ? "checkpoint to host" : "checkpoint part kept",
                 (double)o->part_bytes);
    d->ops->event_record(d, &o->out[k], STREAM_COPY);
    if (o->on_host) o->to_host += (double)o->part_bytes;
}

// x3 of block i of slot s (this rank's part of it) back into its ring
// buffer, after everything the compute stream has been given so far (the
// last reader of that buffer).
static void bring_back(GPT *g, int i, int s) {
    CkptStore *o = g->ckpt;
    Device *d = g->dev;
    int k = i % 2;
    if (o->holds[k].slot == s && o->holds[k].layer == i && o->holds[k].back) return;  // on its way
    d->ops->event_record(d, &o->free[k], STREAM_COMPUTE);
    d->ops->stream_wait_event(d, STREAM_COPY, &o->free[k]);
    DevSpan sp = dev_span_begin(d, STREAM_COPY);
    dev_copy(d, (char *)o->buf[k] + o->part_offset, store_of(o, s, i), o->part_bytes, STREAM_COPY);
    dev_span_end(d, &sp, TRACE_TID_ACT_COPY, o->on_host ? "checkpoint back" : "checkpoint part back",
                 (double)o->part_bytes);
    d->ops->event_record(d, &o->in[k], STREAM_COPY);
    o->holds[k] = (RingTag){s, i, 1};
    if (o->on_host) o->to_device += (double)o->part_bytes;
}

void ckpt_before_head_backward(GPT *g, int s) {
    if (g->ckpt && g->ckpt->per_slot > 0) bring_back(g, g->ckpt->per_slot - 1, s);
}

// Partitioned: the tp group's parts of the ring buffer, gathered in place.
static void gather_parts(GPT *g, int k) {
    CkptStore *o = g->ckpt;
    int n = g->L.tp_size, ab = g->dev->act_bytes;
    size_t counts[GPT_MAX_TP], displs[GPT_MAX_TP], part = o->part_bytes / (size_t)ab;
    CHECK(n <= GPT_MAX_TP, "partitioned checkpoints over %d tp ranks; at most %d", n, GPT_MAX_TP);
    for (int r = 0; r < n; r++) counts[r] = part, displs[r] = (size_t)r * part;
    comm_all_gather(g->tp, o->buf[k], counts, displs, ab == 4 ? DT_F32 : DT_HALF, NULL);
}

void ckpt_before_backward(GPT *g, int i, int s) {
    if (!g->ckpt) return;
    // its input, x3 of block i-1 (started ahead, or now), then the next one's ahead
    if (stored(g, i - 1)) {
        int k = (i - 1) % 2;
        bring_back(g, i - 1, s);
        g->dev->ops->stream_wait_event(g->dev, STREAM_COMPUTE, &g->ckpt->in[k]);
        if (g->plan.partition_activations) gather_parts(g, k);
    }
    if (stored(g, i - 2)) bring_back(g, i - 2, s);
}

void gpt_take_offload_bytes(GPT *g, double *to_host, double *to_device) {
    CkptStore *o = g->ckpt;
    *to_host = o ? o->to_host : 0;
    *to_device = o ? o->to_device : 0;
    if (o) o->to_host = o->to_device = 0;
}
