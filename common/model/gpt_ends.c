// gpt_ends.c: the model's two ends for the micro-batch in one slot: the
// embeddings (token and position rows in, their gradients' scatter back)
// and the head (the final layernorm, the tied output projection, the
// softmax and cross-entropy, whole or in tiles), forward and backward.
// gpt.c runs them as units 0 and L + 1 (gpt_unit_forward, gpt_unit_backward).
#include <string.h>
#include "check.h"
#include "gpt_units.h"

void embed_forward(GPT *g, const bf16 *pe, int s) {
    Device *d = g->dev;
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    if (l->tp_size > 1) {
        tp_embed_forward(g, pe, s);
        return;
    }
    d->k->encoder_forward(d, sl->x_in, sl->inputs, pe + l->emb_off[EMB_WTE],
                          embed_positions(g, pe + l->emb_off[EMB_WPE]), g->plan.B, g->plan.T, l->cfg.channels);
}

// The final layernorm's output, whole on every rank: under sequence
// parallelism every rank's rows of it all-gathered (f before the head's
// column-parallel linear).
static const act *lnf_whole(GPT *g, const GPTSlot *sl) {
    if (!g->plan.sequence_parallel) return sl->lnf;
    tp_gather_rows(g, g->work->gathered, sl->lnf);
    return g->work->gathered;
}

// logits = lnf(x_L) @ wte^T (tied), then the loss (and dlogits with a loss
// scale). The GEMM runs over all Vp stored rows of wte (aligned); the
// softmax reads the V real columns, and dlogits is zero in the padding
// columns, so the padding rows' gradient is zero. Under tensor parallelism
// the rank's logits are those of its wte rows (a column-parallel linear: f
// before it, an identity forward).
// Row r of a (BT,C) activation: act is untyped (fp32 or bf16 by the device).
static act *rows_at(const GPT *g, const act *x, int r) {
    return (char *)x + (size_t)r * g->L.cfg.channels * g->dev->act_bytes;
}

// Rows [r0, r0 + rows) of the slot's tokens: their logits into `logits`
// from the head's input `lnf` (whole), then their losses, and their dlogits
// in place with a loss scale.
static void head_logits_loss(GPT *g, int s, const act *lnf, const bf16 *wte, act *logits, int r0, int rows) {
    Device *d = g->dev;
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    int C = l->cfg.channels, ld = gpt_logits_stride(l);
    d->k->matmul_forward(d, logits, rows_at(g, lnf, r0), wte, NULL, rows, C, l->vocab_part, ld);
    if (l->tp_size > 1) tp_head_loss(g, s, logits, r0, rows);
    else d->k->softmax_crossentropy(d, sl->losses + r0, logits, sl->targets + r0, rows, l->cfg.vocab_size, ld,
                                    sl->dloss_scale);
}

// Tokens per chunk of the tiled loss: ceil(B·T / K) rounded up to a
// multiple of GPT_LOSS_TILE_ALIGN, at most B·T; the chunks are as many as
// cover B·T (K, or fewer).
static int tile_rows(const GPTPlan *p, int tiles) {
    long BT = (long)p->B * p->T;
    if (tiles <= 0) return (int)BT;
    long n = (BT + tiles - 1) / tiles;
    n = (n + GPT_LOSS_TILE_ALIGN - 1) / GPT_LOSS_TILE_ALIGN * GPT_LOSS_TILE_ALIGN;
    return (int)(n < BT ? n : BT);
}

int gpt_loss_tile_rows(const GPTPlan *p) { return tile_rows(p, p->loss_tiles); }
int gpt_mlp_tile_rows(const GPTPlan *p) { return tile_rows(p, p->mlp_tiles); }

void head_forward(GPT *g, const bf16 *ph, const bf16 *pe, int s) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    int BT = g->plan.B * g->plan.T, C = l->cfg.channels;
    const bf16 *wte = pe + l->emb_off[EMB_WTE];
    k->layernorm_forward(d, sl->lnf, sl->lnf_mean, sl->lnf_rstd, block_input(g, l->cfg.num_layers, s),
                         ph + l->head_off[HEAD_LNFW], ph + l->head_off[HEAD_LNFB], res_rows(g), C);
    const act *lnf = lnf_whole(g, sl);
    if (!g->plan.loss_tiles) {
        head_logits_loss(g, s, lnf, wte, sl->logits, 0, BT);
        return;
    }
    int n = gpt_loss_tile_rows(&g->plan);
    for (int r0 = 0; r0 < BT; r0 += n) head_logits_loss(g, s, lnf, wte, g->work->logits_tile, r0, BT - r0 < n ? BT - r0 : n);
}

// wte's gradient collects here and in the embeddings' backward, so the
// embedding gradients stay live from the head down to the embeddings.
void head_backward(GPT *g, const bf16 *ph, const bf16 *pe, int s) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    int hu = gpt_unit_head(l), BT = g->plan.B * g->plan.T, C = l->cfg.channels, Vp = l->vocab_part;
    float *ug = g->unit_grads.ptr, *eg = g->embed_grads.ptr;
    const bf16 *wte = pe + l->emb_off[EMB_WTE];
    CHECK(plan_has_unit(&g->plan, GPT_UNIT_EMBED) || g->work->embed_grads_slot < 0,
          "head backward of slot %d while slot %d's tied wte gradient was not taken; hint: gpt_tied_wte_grads "
          "after each head backward on a range without the embeddings", s, g->work->embed_grads_slot);
    dev_memset0(d, eg, g->embed_grads.bytes, STREAM_COMPUTE);
    g->work->embed_grads_slot = s;
    dev_memset0(d, ug, l->unit[hu].count * sizeof(float), STREAM_COMPUTE);
    int R = res_rows(g);
    const act *lnf = lnf_whole(g, sl);
    if (!g->plan.loss_tiles) {
        k->matmul_backward(d, g->work->dc, eg + l->emb_off[EMB_WTE], NULL, sl->logits, lnf, wte, BT, C, Vp,
                           gpt_logits_stride(l));
    } else {  // each chunk's logits again, its dlogits into dX's rows and wte's gradient before the next chunk
        int n = gpt_loss_tile_rows(&g->plan);
        act *tile = g->work->logits_tile;
        for (int r0 = 0; r0 < BT; r0 += n) {
            int rows = BT - r0 < n ? BT - r0 : n;
            head_logits_loss(g, s, lnf, wte, tile, r0, rows);
            k->matmul_backward(d, rows_at(g, g->work->dc, r0), eg + l->emb_off[EMB_WTE], NULL, tile,
                               rows_at(g, lnf, r0), wte, rows, C, Vp, gpt_logits_stride(l));
        }
    }
    // f's backward: the partial input gradients summed (all-reduce), or this rank's rows of the sum
    const act *dlnf = g->work->dc;
    if (g->plan.sequence_parallel) tp_scatter_sum_rows(g, g->work->part, g->work->dc), dlnf = g->work->part;
    else tp_sum(g, g->work->dc);
    dev_memset0(d, sl->dres, (size_t)R * C * d->act_bytes, STREAM_COMPUTE);
    k->layernorm_backward(d, sl->dres, ug + l->head_off[HEAD_LNFW], ug + l->head_off[HEAD_LNFB], dlnf,
                          block_input(g, l->cfg.num_layers, s), ph + l->head_off[HEAD_LNFW], sl->lnf_mean,
                          sl->lnf_rstd, R, C);
    tp_sum_grads(g, ug + l->head_off[HEAD_LNFW], l->head_off[HEAD_LNFB + 1] - l->head_off[HEAD_LNFW]);
}

const float *gpt_tied_wte_grads(GPT *g, int s) {
    CHECK(!plan_has_unit(&g->plan, GPT_UNIT_EMBED), "gpt_tied_wte_grads: this range has the embeddings, whose "
          "backward returns the whole wte gradient");
    CHECK(g->work->embed_grads_slot == s, "gpt_tied_wte_grads of slot %d: the last head backward was slot %d's",
          s, g->work->embed_grads_slot);
    g->work->embed_grads_slot = -1;
    return g->embed_grads.ptr;
}

void embed_backward(GPT *g, int s) {
    Device *d = g->dev;
    const GPTLayout *l = &g->L;
    float *eg = g->embed_grads.ptr;
    if (plan_has_unit(&g->plan, gpt_unit_head(l)))
        CHECK(g->work->embed_grads_slot == s, "embeddings' backward of slot %d after the head's backward of slot %d; "
              "hint: finish one slot's backward before the next slot's head", s, g->work->embed_grads_slot);
    else
        dev_memset0(d, eg, g->embed_grads.bytes, STREAM_COMPUTE);  // a first pipeline stage: no head contribution
    g->work->embed_grads_slot = -1;
    const GPTSlot *sl = &g->slot[s];
    const act *dx = sl->dres;  // sequence parallel: every rank's rows of dL/dx0 gathered
    if (g->plan.sequence_parallel) tp_gather_rows(g, g->work->gathered, sl->dres), dx = g->work->gathered;
    TokenBuckets tb = {sl->bucket_order, sl->bucket_start, sl->buckets};
    float *dwpe = embed_position_grads(g, eg + l->emb_off[EMB_WPE]);
    if (l->tp_size > 1)  // every rank has the whole dL/dx0: its rows' part of dwte, and dwpe
        d->k->embedding_part_backward(d, eg + l->emb_off[EMB_WTE], dwpe, dx, sl->inputs, &tb, l->vocab_begin,
                                      l->vocab_part, g->plan.B, g->plan.T, l->cfg.channels);
    else
        d->k->encoder_backward(d, eg + l->emb_off[EMB_WTE], dwpe, sl->dres, sl->inputs, &tb, g->plan.B, g->plan.T,
                               l->cfg.channels);
    embed_position_grads_done(g, eg + l->emb_off[EMB_WPE]);
}
