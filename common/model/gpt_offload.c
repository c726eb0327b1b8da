// gpt_offload.c: activation checkpoints in host memory (ZeRO-R's CPU
// checkpointing, Rajbhandari et al. 2020, section 6; DeepSpeed's
// activation_checkpointing.cpu_checkpointing). Under full recompute a block
// keeps only its input; with offload_activations those inputs (every x3 of
// the range but the last block's) live in pinned host memory. The device
// keeps a ring of two: block i writes its x3 into buf[i % 2], where block
// i+1 reads it while the copy stream takes it down; block i+2 writes there
// once that copy is out. In backward, block i needs x3 of block i-1 back in
// buf[(i-1) % 2]: the copy is started one unit ahead (at the backward of
// block i+1, or of the head), and the compute stream waits for it by an
// event, not a host sync. Every offloaded input comes back once: k (L - 1)
// sbhe bytes down and as many up per step for a range of L blocks.
#include <stdlib.h>
#include "check.h"
#include "gpt_units.h"

void offload_init(GPT *g, act *ring0, act *ring1, size_t host_bytes) {
    ActOffload *o = xcalloc(1, sizeof *o);
    Device *d = g->dev;
    o->buf[0] = ring0;
    o->buf[1] = ring1;
    o->bytes = (size_t)g->plan.B * g->plan.T * g->L.cfg.channels * d->act_bytes;
    o->host = buf_alloc(d, TIER_PINNED, CAT_ACTIVATIONS, host_bytes, "activation checkpoints (offloaded)");
    o->per_slot = plan_end_layer(&g->plan, g->L.cfg.num_layers) - plan_first_layer(&g->plan) - 1;
    for (int k = 0; k < 2; k++) {
        o->holds[k] = (RingTag){-1, -1, 0};
        d->ops->event_create(d, &o->written[k]);
        d->ops->event_create(d, &o->out[k]);
        d->ops->event_create(d, &o->in[k]);
        d->ops->event_create(d, &o->free[k]);
    }
    g->offload = o;
}

void offload_free(GPT *g) {
    ActOffload *o = g->offload;
    if (!o) return;
    Device *d = g->dev;
    dev_sync(d, STREAM_COPY);
    for (int k = 0; k < 2; k++) {
        d->ops->event_destroy(d, &o->written[k]);
        d->ops->event_destroy(d, &o->out[k]);
        d->ops->event_destroy(d, &o->in[k]);
        d->ops->event_destroy(d, &o->free[k]);
    }
    buf_free(d, &o->host);
    free(o);
    g->offload = NULL;
}

// Block i (0-based in the range) of slot s keeps its x3 on the host when it
// is not the range's last block.
static int offloaded(const GPT *g, int i) { return g->offload && i >= 0 && i < g->offload->per_slot; }

static void *host_of(const ActOffload *o, int s, int i) {
    return (char *)o->host.ptr + ((size_t)s * o->per_slot + (size_t)i) * o->bytes;
}

// The copy-stream span of a checkpoint on its own trace row (its bytes too).
static void copy_span(GPT *g, const char *what, double t0, size_t bytes) {
    trace_span(g->dev->trace, TRACE_TID_ACT_COPY, what, t0, now_us(), (double)bytes);
}

void offload_before_forward(GPT *g, int i, int s) {
    if (!offloaded(g, i)) return;
    ActOffload *o = g->offload;
    int k = i % 2;
    // the x3 two blocks back is in this buffer until its copy down is out
    g->dev->ops->stream_wait_event(g->dev, STREAM_COMPUTE, &o->out[k]);
    o->holds[k] = (RingTag){s, i, 0};
}

void offload_after_forward(GPT *g, int i, int s) {
    if (!offloaded(g, i)) return;
    ActOffload *o = g->offload;
    Device *d = g->dev;
    int k = i % 2;
    d->ops->event_record(d, &o->written[k], STREAM_COMPUTE);
    d->ops->stream_wait_event(d, STREAM_COPY, &o->written[k]);
    double t0 = now_us();
    dev_copy(d, host_of(o, s, i), o->buf[k], o->bytes, STREAM_COPY);
    copy_span(g, "checkpoint to host", t0, o->bytes);
    d->ops->event_record(d, &o->out[k], STREAM_COPY);
    o->to_host += (double)o->bytes;
}

// x3 of block i of slot s back into its ring buffer, after everything the
// compute stream has been given so far (the last reader of that buffer).
static void bring_back(GPT *g, int i, int s) {
    ActOffload *o = g->offload;
    Device *d = g->dev;
    int k = i % 2;
    if (o->holds[k].slot == s && o->holds[k].layer == i && o->holds[k].back) return;  // on its way
    d->ops->event_record(d, &o->free[k], STREAM_COMPUTE);
    d->ops->stream_wait_event(d, STREAM_COPY, &o->free[k]);
    double t0 = now_us();
    dev_copy(d, o->buf[k], host_of(o, s, i), o->bytes, STREAM_COPY);
    copy_span(g, "checkpoint back", t0, o->bytes);
    d->ops->event_record(d, &o->in[k], STREAM_COPY);
    o->holds[k] = (RingTag){s, i, 1};
    o->to_device += (double)o->bytes;
}

void offload_before_head_backward(GPT *g, int s) {
    if (g->offload && g->offload->per_slot > 0) bring_back(g, g->offload->per_slot - 1, s);
}

void offload_before_backward(GPT *g, int i, int s) {
    if (!g->offload) return;
    // its input, x3 of block i-1 (started ahead, or now), then the next one's ahead
    if (offloaded(g, i - 1)) {
        bring_back(g, i - 1, s);
        g->dev->ops->stream_wait_event(g->dev, STREAM_COMPUTE, &g->offload->in[(i - 1) % 2]);
    }
    if (offloaded(g, i - 2)) bring_back(g, i - 2, s);
}

void gpt_take_offload_bytes(GPT *g, double *to_host, double *to_device) {
    ActOffload *o = g->offload;
    *to_host = o ? o->to_host : 0;
    *to_device = o ? o->to_device : 0;
    if (o) o->to_host = o->to_device = 0;
}
