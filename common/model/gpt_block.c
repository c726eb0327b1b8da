// gpt_block.c: forward and backward of one GPT-2 block (pre-layernorm) for
// the micro-batch in one slot.
#include "gpt_units.h"

// x3 = x + attn(ln1(x)) + mlp(ln2(...)): one GPT-2 block, pre-layernorm.
void block_forward(GPT *g, const bf16 *p, int layer, int s) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    LayerActs *la = layer_acts(g, layer, s);
    const act *x = block_input(g, layer, s);
    act *tmp = g->work->tmp;
    int B = g->plan.B, T = g->plan.T, C = g->L.cfg.channels, NH = g->L.cfg.num_heads, BT = B * T;
    k->layernorm_forward(d, la->ln1, la->ln1_mean, la->ln1_rstd, x, p + o[BLK_LN1W], p + o[BLK_LN1B], BT, C);
    k->matmul_forward(d, la->qkv, la->ln1, p + o[BLK_QKVW], p + o[BLK_QKVB], BT, C, 3 * C, 3 * C);
    k->attention_forward(d, la->atty, la->att, la->qkv, B, T, C, NH);
    k->matmul_forward(d, tmp, la->atty, p + o[BLK_ATTPROJW], p + o[BLK_ATTPROJB], BT, C, C, C);
    k->residual_forward(d, la->x2, x, tmp, (size_t)BT * C);
    k->layernorm_forward(d, la->ln2, la->ln2_mean, la->ln2_rstd, la->x2, p + o[BLK_LN2W], p + o[BLK_LN2B], BT, C);
    k->matmul_forward(d, la->fch, la->ln2, p + o[BLK_FCW], p + o[BLK_FCB], BT, C, 4 * C, 4 * C);
    k->gelu_forward(d, la->fch_gelu, la->fch, (size_t)BT * 4 * C);
    k->matmul_forward(d, tmp, la->fch_gelu, p + o[BLK_FCPROJW], p + o[BLK_FCPROJB], BT, 4 * C, C, C);
    k->residual_forward(d, la->x3, la->x2, tmp, (size_t)BT * C);
}

void block_backward(GPT *g, const bf16 *p, float *dp, int layer, int s) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    const LayerActs *la = layer_acts(g, layer, s);
    const act *x = block_input(g, layer, s);
    GPTWork *w = g->work;
    act *dres = g->slot[s].dres;
    int B = g->plan.B, T = g->plan.T, C = g->L.cfg.channels, NH = g->L.cfg.num_heads, BT = B * T;
    // x3 = x2 + fcproj(gelu(fc(ln2(x2))))
    k->matmul_backward(d, w->d4a, dp + o[BLK_FCPROJW], dp + o[BLK_FCPROJB], dres, la->fch_gelu, p + o[BLK_FCPROJW], BT, 4 * C, C, C);
    k->gelu_backward(d, w->d4b, la->fch, w->d4a, (size_t)BT * 4 * C);
    k->matmul_backward(d, w->dc, dp + o[BLK_FCW], dp + o[BLK_FCB], w->d4b, la->ln2, p + o[BLK_FCW], BT, C, 4 * C, 4 * C);
    k->layernorm_backward(d, dres, dp + o[BLK_LN2W], dp + o[BLK_LN2B], w->dc, la->x2, p + o[BLK_LN2W], la->ln2_mean, la->ln2_rstd, BT, C);
    // x2 = x + attproj(attention(qkv(ln1(x))))
    k->matmul_backward(d, w->dc, dp + o[BLK_ATTPROJW], dp + o[BLK_ATTPROJB], dres, la->atty, p + o[BLK_ATTPROJW], BT, C, C, C);
    act *dqkv = w->d4a;
    k->attention_backward(d, dqkv, w->dc, la->qkv, la->att, B, T, C, NH);
    k->matmul_backward(d, w->dc, dp + o[BLK_QKVW], dp + o[BLK_QKVB], dqkv, la->ln1, p + o[BLK_QKVW], BT, C, 3 * C, 3 * C);
    k->layernorm_backward(d, dres, dp + o[BLK_LN1W], dp + o[BLK_LN1B], w->dc, x, p + o[BLK_LN1W], la->ln1_mean, la->ln1_rstd, BT, C);
}
