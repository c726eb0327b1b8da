// gpt_block.c: forward and backward of one GPT-2 block (pre-layernorm) for
// the micro-batch in one slot. Under tensor parallelism (Megatron-LM) the
// rank computes its heads: QKV and the MLP's first linear are column-parallel
// (whole input, its part of the outputs), the attention projection and the
// MLP's second linear row-parallel (its part of the inputs, partial sums of
// the whole output); the layernorms and the residual stream are whole on
// every rank. With one rank the same calls are the plain block.
#include "gpt_units.h"

// out (BT,C) = inp (BT,in) @ w (C,in)^T + bias. Row-parallel: each rank's
// product is a partial sum over its inputs; the g operator all-reduces it and
// the bias is added once, after.
static void row_parallel_forward(GPT *g, act *out, const act *inp, const bf16 *w, const bf16 *bias, int in) {
    Device *d = g->dev;
    int BT = g->plan.B * g->plan.T, C = g->L.cfg.channels;
    if (g->L.tp_size == 1) {
        d->k->matmul_forward(d, out, inp, w, bias, BT, in, C, C);
        return;
    }
    d->k->matmul_forward(d, out, inp, w, NULL, BT, in, C, C);
    tp_sum(g, out);  // g: all-reduce forward
    d->k->bias_add(d, out, bias, BT, C);
}

// What the block's backward reads, computed from its input x into la:
// x2 = x + attproj(attention(qkv(ln1(x)))), then ln2, fc and gelu of the MLP
// up to its projection's input. Block_forward's first part, and all that
// full recompute runs again (the MLP projection and the last residual add
// make x3, which backward does not read).
void block_forward_inner(GPT *g, const bf16 *p, LayerActs *la, const act *x) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    act *tmp = g->work->tmp;
    int tp = g->L.tp_size, B = g->plan.B, T = g->plan.T, BT = B * T;
    int C = g->L.cfg.channels, Cp = C / tp, F = 4 * C / tp, NHp = g->L.cfg.num_heads / tp;
    k->layernorm_forward(d, la->ln1, la->ln1_mean, la->ln1_rstd, x, p + o[BLK_LN1W], p + o[BLK_LN1B], BT, C);
    // f: identity forward, every rank's QKV reads the whole ln1
    k->matmul_forward(d, la->qkv, la->ln1, p + o[BLK_QKVW], p + o[BLK_QKVB], BT, C, 3 * Cp, 3 * Cp);
    k->attention_forward(d, la->atty, la->att, la->qkv, B, T, Cp, NHp);
    row_parallel_forward(g, tmp, la->atty, p + o[BLK_ATTPROJW], p + o[BLK_ATTPROJB], Cp);
    k->residual_forward(d, la->x2, x, tmp, (size_t)BT * C);
    k->layernorm_forward(d, la->ln2, la->ln2_mean, la->ln2_rstd, la->x2, p + o[BLK_LN2W], p + o[BLK_LN2B], BT, C);
    k->matmul_forward(d, la->fch, la->ln2, p + o[BLK_FCW], p + o[BLK_FCB], BT, C, F, F);  // f
    k->gelu_forward(d, la->fch_gelu, la->fch, (size_t)BT * F);
}

// x3 = x + attn(ln1(x)) + mlp(ln2(...)): one GPT-2 block, pre-layernorm.
void block_forward(GPT *g, const bf16 *p, int layer, int s) {
    LayerActs *la = layer_acts(g, layer, s);
    act *tmp = g->work->tmp;
    int BT = g->plan.B * g->plan.T, C = g->L.cfg.channels, F = 4 * C / g->L.tp_size;
    block_forward_inner(g, p, la, block_input(g, layer, s));
    row_parallel_forward(g, tmp, la->fch_gelu, p + g->L.blk_off[BLK_FCPROJW], p + g->L.blk_off[BLK_FCPROJB], F);
    g->dev->k->residual_forward(g->dev, la->x3, la->x2, tmp, (size_t)BT * C);
}

// The g operators' backward is the identity: every rank has the whole
// dL/dx3, and the row-parallel biases' gradients are the same on every rank.
// The f operators' backward all-reduces the column-parallel linears' partial
// input gradients before the layernorms.
void block_backward(GPT *g, const bf16 *p, float *dp, int layer, int s) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    const LayerActs *la = layer_acts(g, layer, s);
    const act *x = block_input(g, layer, s);
    GPTWork *w = g->work;
    act *dres = g->slot[s].dres;
    int tp = g->L.tp_size, B = g->plan.B, T = g->plan.T, BT = B * T;
    int C = g->L.cfg.channels, Cp = C / tp, F = 4 * C / tp, NHp = g->L.cfg.num_heads / tp;
    // x3 = x2 + fcproj(gelu(fc(ln2(x2))))
    k->matmul_backward(d, w->d4a, dp + o[BLK_FCPROJW], dp + o[BLK_FCPROJB], dres, la->fch_gelu, p + o[BLK_FCPROJW], BT, F, C, C);
    k->gelu_backward(d, w->d4b, la->fch, w->d4a, (size_t)BT * F);
    k->matmul_backward(d, w->dc, dp + o[BLK_FCW], dp + o[BLK_FCB], w->d4b, la->ln2, p + o[BLK_FCW], BT, C, F, F);
    tp_sum(g, w->dc);  // f: all-reduce backward
    k->layernorm_backward(d, dres, dp + o[BLK_LN2W], dp + o[BLK_LN2B], w->dc, la->x2, p + o[BLK_LN2W], la->ln2_mean, la->ln2_rstd, BT, C);
    // x2 = x + attproj(attention(qkv(ln1(x))))
    k->matmul_backward(d, w->dc, dp + o[BLK_ATTPROJW], dp + o[BLK_ATTPROJB], dres, la->atty, p + o[BLK_ATTPROJW], BT, Cp, C, C);
    act *dqkv = w->d4a;
    k->attention_backward(d, dqkv, w->dc, la->qkv, la->att, B, T, Cp, NHp);
    k->matmul_backward(d, w->dc, dp + o[BLK_QKVW], dp + o[BLK_QKVB], dqkv, la->ln1, p + o[BLK_QKVW], BT, C, 3 * Cp, 3 * Cp);
    tp_sum(g, w->dc);  // f: all-reduce backward
    k->layernorm_backward(d, dres, dp + o[BLK_LN1W], dp + o[BLK_LN1B], w->dc, x, p + o[BLK_LN1W], la->ln1_mean, la->ln1_rstd, BT, C);
}
