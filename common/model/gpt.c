// gpt.c: GPT-2 forward and backward over the units of the flat parameter
// buffer, calling the strategy's hooks around each unit.
#include "gpt.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "kernels.h"

// Saved activations of one transformer block; x_in is the previous block's x3.
typedef struct LayerActs {
    act *ln1, *qkv, *atty, *x2, *ln2, *fch, *fch_gelu, *x3;  // (BT,C) except qkv (BT,3C), fch* (BT,4C)
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;        // (BT)
    float *att;                                               // (B,NH,T,T)
} LayerActs;

typedef struct GPTActs {
    act *x0;                      // (BT,C) encoder output
    LayerActs *layer;             // [L]
    act *lnf;                     // (BT,C)
    float *lnf_mean, *lnf_rstd;   // (BT)
    act *logits;                  // (BT,V), rows Vp apart; holds dlogits after forward with a loss scale
    float *losses;                // (BT)
    act *tmp;                     // (BT,C) projection outputs before the residual add
    // backward temporaries (scratch)
    act *dres;                    // (BT,C) gradient of the residual stream
    act *dc;                      // (BT,C)
    act *d4a, *d4b;               // (BT,4C); d4a also serves as dqkv (BT,3C)
    int32_t *inputs, *targets;    // (BT)
} GPTActs;

// Hands out consecutive pieces of one allocation. A bf16 activation piece
// (cuda) may be 2 mod 4 bytes long (BT*V*2 with BT and V odd), so the fp32 and
// int32 pieces come before any such piece and are checked to be 4-aligned.
typedef struct Carver {
    char *at;
    size_t left;
} Carver;

static void *carve(Carver *c, size_t bytes) {
    CHECK(bytes <= c->left, "activation layout overflow (%zu > %zu); hint: gpt_activation_bytes and gpt_alloc disagree", bytes, c->left);
    void *p = c->at;
    c->at += bytes;
    c->left -= bytes;
    return p;
}

// a piece read as fp32 or int32 by the kernels
static void *carve_words(Carver *c, size_t bytes) {
    void *p = carve(c, bytes);
    CHECK(((uintptr_t)p & 3) == 0, "activation layout: a 4-byte piece at a 2-byte offset; hint: carve odd-sized bf16 pieces last in gpt_alloc");
    return p;
}

void gpt_alloc(GPT *g, const GPTLayout *l, Device *dev, int B, int T) {
    const GPTConfig *c = &l->cfg;
    if (T > c->max_seq_len)
        fail_usage("--seq-len %d is longer than the model's context (%d)", T, c->max_seq_len);
    memset(g, 0, sizeof *g);
    g->L = *l;
    g->dev = dev;
    g->B = B;
    g->T = T;
    size_t BT = (size_t)B * T, C = c->channels, Vp = (size_t)gpt_logits_stride(c), NH = c->num_heads, NL = c->num_layers;
    size_t ab = dev->act_bytes, fb = sizeof(float);
    GPTActBytes sizes = gpt_activation_bytes(l, B, T, dev->act_bytes);

    g->a = xcalloc(1, sizeof(GPTActs));
    g->a->layer = xcalloc(NL, sizeof(LayerActs));
    g->acts = buf_alloc(dev, TIER_DEVICE, CAT_ACTIVATIONS, sizes.total_saved, "activations");
    Carver ca = {g->acts.ptr, g->acts.bytes};
    GPTActs *a = g->a;
    for (size_t i = 0; i < NL; i++) {  // 32*BT*C bytes of bf16 pieces keep the fp32 ones aligned
        LayerActs *la = &a->layer[i];
        la->ln1 = carve(&ca, BT * C * ab);
        la->qkv = carve(&ca, BT * 3 * C * ab);
        la->atty = carve(&ca, BT * C * ab);
        la->x2 = carve(&ca, BT * C * ab);
        la->ln2 = carve(&ca, BT * C * ab);
        la->fch = carve(&ca, BT * 4 * C * ab);
        la->fch_gelu = carve(&ca, BT * 4 * C * ab);
        la->x3 = carve(&ca, BT * C * ab);
        la->ln1_mean = carve_words(&ca, BT * fb);
        la->ln1_rstd = carve_words(&ca, BT * fb);
        la->ln2_mean = carve_words(&ca, BT * fb);
        la->ln2_rstd = carve_words(&ca, BT * fb);
        la->att = carve_words(&ca, (size_t)B * NH * T * T * fb);
    }
    a->lnf_mean = carve_words(&ca, BT * fb);
    a->lnf_rstd = carve_words(&ca, BT * fb);
    a->losses = carve_words(&ca, BT * fb);
    a->inputs = carve_words(&ca, BT * sizeof(int32_t));
    a->targets = carve_words(&ca, BT * sizeof(int32_t));
    a->x0 = carve(&ca, BT * C * ab);
    a->lnf = carve(&ca, BT * C * ab);
    a->tmp = carve(&ca, BT * C * ab);
    a->logits = carve(&ca, BT * Vp * ab);

    g->scratch = buf_alloc(dev, TIER_DEVICE, CAT_WORKSPACE, sizes.backward_scratch, "backward scratch");
    Carver cs = {g->scratch.ptr, g->scratch.bytes};
    a->dres = carve(&cs, BT * C * ab);
    a->dc = carve(&cs, BT * C * ab);
    a->d4a = carve(&cs, BT * 4 * C * ab);
    a->d4b = carve(&cs, BT * 4 * C * ab);

    size_t block = l->unit[1].count, head = l->unit[gpt_unit_head(l)].count;
    g->unit_grads = buf_alloc(dev, TIER_DEVICE, CAT_WORKSPACE, (block > head ? block : head) * fb, "fp32 unit gradients");
    g->embed_grads = buf_alloc(dev, TIER_DEVICE, CAT_WORKSPACE, l->unit[GPT_UNIT_EMBED].count * fb, "fp32 embedding gradients");
    g->losses_host = xmalloc(BT * fb);
}

void gpt_free(GPT *g) {
    if (!g->a) return;
    buf_free(g->dev, &g->acts);
    buf_free(g->dev, &g->scratch);
    buf_free(g->dev, &g->unit_grads);
    buf_free(g->dev, &g->embed_grads);
    free(g->losses_host);
    free(g->a->layer);
    free(g->a);
    g->a = NULL;
}


// x3 = x + attn(ln1(x)) + mlp(ln2(...)): one GPT-2 block, pre-layernorm.
static void block_forward(GPT *g, const bf16 *p, LayerActs *la, const act *x) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    int B = g->B, T = g->T, C = g->L.cfg.channels, NH = g->L.cfg.num_heads, BT = B * T;
    k->layernorm_forward(d, la->ln1, la->ln1_mean, la->ln1_rstd, x, p + o[BLK_LN1W], p + o[BLK_LN1B], BT, C);
    k->matmul_forward(d, la->qkv, la->ln1, p + o[BLK_QKVW], p + o[BLK_QKVB], BT, C, 3 * C, 3 * C);
    k->attention_forward(d, la->atty, la->att, la->qkv, B, T, C, NH);
    k->matmul_forward(d, g->a->tmp, la->atty, p + o[BLK_ATTPROJW], p + o[BLK_ATTPROJB], BT, C, C, C);
    k->residual_forward(d, la->x2, x, g->a->tmp, (size_t)BT * C);
    k->layernorm_forward(d, la->ln2, la->ln2_mean, la->ln2_rstd, la->x2, p + o[BLK_LN2W], p + o[BLK_LN2B], BT, C);
    k->matmul_forward(d, la->fch, la->ln2, p + o[BLK_FCW], p + o[BLK_FCB], BT, C, 4 * C, 4 * C);
    k->gelu_forward(d, la->fch_gelu, la->fch, (size_t)BT * 4 * C);
    k->matmul_forward(d, g->a->tmp, la->fch_gelu, p + o[BLK_FCPROJW], p + o[BLK_FCPROJB], BT, 4 * C, C, C);
    k->residual_forward(d, la->x3, la->x2, g->a->tmp, (size_t)BT * C);
}

static const act *block_input(const GPT *g, int layer) {
    return layer == 0 ? g->a->x0 : g->a->layer[layer - 1].x3;
}

double gpt_forward(GPT *g, const GPTHooks *h, const int32_t *inputs, const int32_t *targets, float dloss_scale) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    GPTActs *a = g->a;
    const GPTLayout *l = &g->L;
    int B = g->B, T = g->T, C = l->cfg.channels, V = l->cfg.vocab_size, BT = B * T;
    dev_copy(d, a->inputs, inputs, (size_t)BT * sizeof(int32_t), STREAM_COMPUTE);
    dev_copy(d, a->targets, targets, (size_t)BT * sizeof(int32_t), STREAM_COMPUTE);

    h->before_forward(h->ctx, GPT_UNIT_EMBED);
    const bf16 *pe = h->params(h->ctx, GPT_UNIT_EMBED);
    k->encoder_forward(d, a->x0, a->inputs, pe + l->emb_off[EMB_WTE], pe + l->emb_off[EMB_WPE], B, T, C);
    h->after_forward(h->ctx, GPT_UNIT_EMBED);

    for (int i = 0; i < l->cfg.num_layers; i++) {
        int u = gpt_unit_block(i);
        h->before_forward(h->ctx, u);
        block_forward(g, h->params(h->ctx, u), &a->layer[i], block_input(g, i));
        h->after_forward(h->ctx, u);
    }

    int hu = gpt_unit_head(l);
    h->before_forward(h->ctx, hu);
    const bf16 *ph = h->params(h->ctx, hu);
    const bf16 *wte = h->params(h->ctx, GPT_UNIT_EMBED) + l->emb_off[EMB_WTE];
    k->layernorm_forward(d, a->lnf, a->lnf_mean, a->lnf_rstd, block_input(g, l->cfg.num_layers),
                         ph + l->head_off[HEAD_LNFW], ph + l->head_off[HEAD_LNFB], BT, C);
    int Vp = gpt_logits_stride(&l->cfg);
    k->matmul_forward(d, a->logits, a->lnf, wte, NULL, BT, C, V, Vp);  // logits = lnf @ wte^T (tied)
    k->softmax_crossentropy(d, a->losses, a->logits, a->targets, BT, V, Vp, dloss_scale);
    h->after_forward(h->ctx, hu);

    dev_copy(d, g->losses_host, a->losses, (size_t)BT * sizeof(float), STREAM_COMPUTE);
    dev_sync(d, STREAM_COMPUTE);
    double sum = 0;
    for (int i = 0; i < BT; i++) sum += g->losses_host[i];
    return sum / BT;
}

// Backward of one block: a->dres holds dL/dx3 on entry and dL/dx_in on exit;
// parameter gradients accumulate into dp (fp32, the unit's layout).
static void block_backward(GPT *g, const bf16 *p, float *dp, const LayerActs *la, const act *x) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    GPTActs *a = g->a;
    int B = g->B, T = g->T, C = g->L.cfg.channels, NH = g->L.cfg.num_heads, BT = B * T;
    // x3 = x2 + fcproj(gelu(fc(ln2(x2))))
    k->matmul_backward(d, a->d4a, dp + o[BLK_FCPROJW], dp + o[BLK_FCPROJB], a->dres, la->fch_gelu, p + o[BLK_FCPROJW], BT, 4 * C, C, C);
    k->gelu_backward(d, a->d4b, la->fch, a->d4a, (size_t)BT * 4 * C);
    k->matmul_backward(d, a->dc, dp + o[BLK_FCW], dp + o[BLK_FCB], a->d4b, la->ln2, p + o[BLK_FCW], BT, C, 4 * C, 4 * C);
    k->layernorm_backward(d, a->dres, dp + o[BLK_LN2W], dp + o[BLK_LN2B], a->dc, la->x2, p + o[BLK_LN2W], la->ln2_mean, la->ln2_rstd, BT, C);
    // x2 = x + attproj(attention(qkv(ln1(x))))
    k->matmul_backward(d, a->dc, dp + o[BLK_ATTPROJW], dp + o[BLK_ATTPROJB], a->dres, la->atty, p + o[BLK_ATTPROJW], BT, C, C, C);
    act *dqkv = a->d4a;
    k->attention_backward(d, dqkv, a->dc, la->qkv, la->att, B, T, C, NH);
    k->matmul_backward(d, a->dc, dp + o[BLK_QKVW], dp + o[BLK_QKVB], dqkv, la->ln1, p + o[BLK_QKVW], BT, C, 3 * C, 3 * C);
    k->layernorm_backward(d, a->dres, dp + o[BLK_LN1W], dp + o[BLK_LN1B], a->dc, x, p + o[BLK_LN1W], la->ln1_mean, la->ln1_rstd, BT, C);
}

void gpt_backward(GPT *g, const GPTHooks *h) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    GPTActs *a = g->a;
    const GPTLayout *l = &g->L;
    int B = g->B, T = g->T, C = l->cfg.channels, V = l->cfg.vocab_size, BT = B * T;
    float *ug = g->unit_grads.ptr, *eg = g->embed_grads.ptr;
    size_t dres_bytes = (size_t)BT * C * d->act_bytes;

    // head: logits = lnf(x_L) @ wte^T. wte's gradient collects here and in the
    // encoder, so the embedding gradients stay live through all of backward.
    int hu = gpt_unit_head(l);
    h->before_backward(h->ctx, hu);
    const bf16 *ph = h->params(h->ctx, hu);
    const bf16 *wte = h->params(h->ctx, GPT_UNIT_EMBED) + l->emb_off[EMB_WTE];
    dev_memset0(d, eg, g->embed_grads.bytes, STREAM_COMPUTE);
    dev_memset0(d, ug, l->unit[hu].count * sizeof(float), STREAM_COMPUTE);
    k->matmul_backward(d, a->dc, eg + l->emb_off[EMB_WTE], NULL, a->logits, a->lnf, wte, BT, C, V,
                       gpt_logits_stride(&l->cfg));
    dev_memset0(d, a->dres, dres_bytes, STREAM_COMPUTE);
    k->layernorm_backward(d, a->dres, ug + l->head_off[HEAD_LNFW], ug + l->head_off[HEAD_LNFB], a->dc,
                          block_input(g, l->cfg.num_layers), ph + l->head_off[HEAD_LNFW], a->lnf_mean, a->lnf_rstd, BT, C);
    h->grads_ready(h->ctx, hu, ug);
    h->after_backward(h->ctx, hu);

    for (int i = l->cfg.num_layers - 1; i >= 0; i--) {
        int u = gpt_unit_block(i);
        h->before_backward(h->ctx, u);
        dev_memset0(d, ug, l->unit[u].count * sizeof(float), STREAM_COMPUTE);
        block_backward(g, h->params(h->ctx, u), ug, &a->layer[i], block_input(g, i));
        h->grads_ready(h->ctx, u, ug);
        h->after_backward(h->ctx, u);
    }

    h->before_backward(h->ctx, GPT_UNIT_EMBED);
    k->encoder_backward(d, eg + l->emb_off[EMB_WTE], eg + l->emb_off[EMB_WPE], a->dres, a->inputs, B, T, C);
    h->grads_ready(h->ctx, GPT_UNIT_EMBED, eg);
    h->after_backward(h->ctx, GPT_UNIT_EMBED);
}
