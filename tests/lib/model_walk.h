// model_walk.h: the tests' own walk over a model's units (a trainer's stage
// writes its own, with its communication between the units): every unit of
// the plan's range for the micro-batch in one slot, the params read from one
// flat bf16 buffer of the layout (host or device memory: the device's), the
// gradients added into one flat fp32 host buffer. On a range with the head
// but not the embeddings, the head's part of the tied wte gradient is added
// to unit 0 as well, as a pipeline's last stage adds it to its wte copy.
#pragma once
#include <stdlib.h>
#include "device.h"
#include "gpt.h"

static inline int walk_has_unit(const GPT *g, int u) { return u >= g->plan.first_unit && u <= g->plan.last_unit; }

static inline void walk_forward(GPT *g, const bf16 *params, int s) {
    const GPTLayout *l = &g->L;
    for (int u = g->plan.first_unit; u <= g->plan.last_unit; u++)
        gpt_unit_forward(g, u, s, params + l->unit[u].offset, params + l->unit[GPT_UNIT_EMBED].offset);
}

// grads (host, fp32, the layout's Ψ) += the gradients of unit u's fp32 buffer g (device memory)
static inline void walk_add_grads(GPT *g, int u, const float *unit_grads, float *grads) {
    size_t n = g->L.unit[u].count;
    float *host = malloc(n * sizeof(float));
    dev_copy(g->dev, host, unit_grads, n * sizeof(float), STREAM_COMPUTE);
    dev_sync(g->dev, STREAM_COMPUTE);
    float *dst = grads + g->L.unit[u].offset;
    for (size_t i = 0; i < n; i++) dst[i] += host[i];
    free(host);
}

static inline void walk_unit_backward(GPT *g, const bf16 *params, float *grads, int u, int s) {
    const GPTLayout *l = &g->L;
    const float *ug = gpt_unit_backward(g, u, s, params + l->unit[u].offset, params + l->unit[GPT_UNIT_EMBED].offset);
    walk_add_grads(g, u, ug, grads);
    if (u == gpt_unit_head(l) && !walk_has_unit(g, GPT_UNIT_EMBED))
        walk_add_grads(g, GPT_UNIT_EMBED, gpt_tied_wte_grads(g, s), grads);
}

static inline void walk_backward(GPT *g, const bf16 *params, float *grads, int s) {
    for (int u = g->plan.last_unit; u >= g->plan.first_unit; u--) walk_unit_backward(g, params, grads, u, s);
}

// The whole model's forward of one micro-batch in slot 0; returns its mean loss.
static inline double walk_loss(GPT *g, const bf16 *params, const int32_t *in, const int32_t *tgt, float dloss_scale) {
    gpt_slot_tokens(g, 0, in, tgt, dloss_scale);
    walk_forward(g, params, 0);
    return gpt_slot_loss(g, 0);
}
