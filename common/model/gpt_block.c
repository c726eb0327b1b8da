// gpt_block.c: forward and backward of one GPT-2 block (pre-layernorm) for
// the micro-batch in one slot. Under tensor parallelism (Megatron-LM) the
// rank computes its heads: QKV and the MLP's first linear are column-parallel
// (whole input, its part of the outputs), the attention projection and the
// MLP's second linear row-parallel (its part of the inputs, partial sums of
// the whole output); the layernorms and the residual stream are whole on
// every rank, or under sequence parallelism split over the ranks by the
// tokens (R = res_rows rows each). With one rank the same calls are the
// plain block.
#include "gpt_units.h"

// ---- Megatron's f and g around the tensor-parallel regions ----

// LAB 07: f_and_g -- Megatron's f before each column-parallel linear, g after each row-parallel one
// f is the identity forward and an all-reduce backward; g an all-reduce
// forward and the identity backward (Shoeybi et al. 2019, section 3). With
// one rank (g->L.tp_size 1) every one of them is the identity: stages 01-06
// run the same block. tp_sum (gpt_tp.c) is the all-reduce; under sequence
// parallelism (g->plan.sequence_parallel) tp_gather_rows and
// tp_scatter_sum_rows take its place, into g->work->gathered and
// g->work->part.

// f before a column-parallel linear: its input, whole on every rank. It is
// the layernorm's output itself (identity forward), or under sequence
// parallelism every rank's rows of it all-gathered.
static const act *column_input(GPT *g, const act *ln) {
    if (!g->plan.sequence_parallel) return ln;
    tp_gather_rows(g, g->work->gathered, ln);
    return g->work->gathered;
}

// f's backward: the column-parallel linear's input gradient dc (BT,C), a
// partial sum on each rank, summed over the group in place (all-reduce), or
// under sequence parallelism this rank's rows of the sum (reduce-scatter).
// Returns the (R,C) gradient of the layernorm's output.
static const act *column_input_grad(GPT *g, act *dc) {
    if (!g->plan.sequence_parallel) {
        tp_sum(g, dc);
        return dc;
    }
    tp_scatter_sum_rows(g, g->work->part, dc);
    return g->work->part;
}

// out = inp (BT,in) @ w (C,in)^T + bias: a row-parallel linear and g after
// it. Each rank's product is a partial sum over its inputs: g all-reduces it
// (or under sequence parallelism reduce-scatters this rank's rows) and the
// bias is added once, after. Returns the (R,C) result.
static const act *row_parallel_forward(GPT *g, const act *inp, const bf16 *w, const bf16 *bias, int in) {
    Device *d = g->dev;
    int BT = g->plan.B * g->plan.T, C = g->L.cfg.channels;
    act *out = g->work->tmp;
    if (g->L.tp_size == 1) {
        d->k->matmul_forward(d, out, inp, w, bias, BT, in, C, C);
        return out;
    }
    d->k->matmul_forward(d, out, inp, w, NULL, BT, in, C, C);
    if (g->plan.sequence_parallel) {
        tp_scatter_sum_rows(g, g->work->part, out);
        out = g->work->part;
    } else {
        tp_sum(g, out);  // g: all-reduce forward
    }
    d->k->bias_add(d, out, bias, res_rows(g), C);
    return out;
}

// g's backward: the gradient of a row-parallel linear's output, whole (BT,C)
// on every rank: the residual stream's gradient itself (identity), or under
// sequence parallelism every rank's rows of it all-gathered.
static const act *row_output_grad(GPT *g, const act *dres) {
    if (!g->plan.sequence_parallel) return dres;
    tp_gather_rows(g, g->work->gathered, dres);
    return g->work->gathered;
}
// LAB END

// ---- the block ----

// What the block's backward reads, computed from its input x into la:
// x2 = x + attproj(attention(qkv(ln1(x)))), then ln2, fc and gelu of the MLP
// up to its projection's input. Block_forward's first part, and all that
// full recompute runs again (the MLP projection and the last residual add
// make x3, which backward does not read).
void block_forward_inner(GPT *g, const bf16 *p, LayerActs *la, const act *x) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    int tp = g->L.tp_size, B = g->plan.B, T = g->plan.T, BT = B * T, R = res_rows(g);
    int C = g->L.cfg.channels, Cp = C / tp, F = 4 * C / tp, NHp = g->L.cfg.num_heads / tp;
    k->layernorm_forward(d, la->ln1, la->ln1_mean, la->ln1_rstd, x, p + o[BLK_LN1W], p + o[BLK_LN1B], R, C);
    k->matmul_forward(d, la->qkv, column_input(g, la->ln1), p + o[BLK_QKVW], p + o[BLK_QKVB], BT, C, 3 * Cp, 3 * Cp);
    if (gpt_plan_ring(&g->plan)) ring_attention_forward(g, la);  // every rank's keys around the ring
    else if (gpt_plan_ulysses(&g->plan)) ulysses_attention_forward(g, la);  // every position of 1/cp of the heads
    else if (g->plan.attention == GPT_ATTENTION_FLASH) k->flash_attention_forward(d, la->atty, la->att, la->qkv, B, T, Cp, NHp);
    else k->attention_forward(d, la->atty, la->att, la->qkv, B, T, Cp, NHp);
    const act *y = row_parallel_forward(g, la->atty, p + o[BLK_ATTPROJW], p + o[BLK_ATTPROJB], Cp);
    k->residual_layernorm_forward(d, la->x2, la->ln2, la->ln2_mean, la->ln2_rstd, x, y, p + o[BLK_LN2W],
                                  p + o[BLK_LN2B], R, C);
    if (g->plan.mlp_tiles) return;  // the MLP runs chunk by chunk (mlp_tiled_forward), nothing of it kept
    k->matmul_gelu_forward(d, la->fch_gelu, la->fch, column_input(g, la->ln2), p + o[BLK_FCW], p + o[BLK_FCB], BT,
                           C, F);
}

// ---- the MLP in tiles (GPTPlan.mlp_tiles: ALST's tiled MLP) ----

// Row r of a (rows, width) activation (act is untyped: fp32 or bf16 by the device).
static act *row_of(const GPT *g, const act *x, int r, int width) {
    return (char *)x + (size_t)r * (size_t)width * g->dev->act_bytes;
}

// The MLP over the chunks of gpt_mlp_tile_rows tokens: each chunk's fc and
// GELU into the working chunk (g->work->mlp_pre, mlp_gelu), its projection
// into its rows of g->work->tmp; then, under tensor parallelism, g after the
// projection as row_parallel_forward has it (the partial sums summed, or this
// rank's rows of them, and the bias once). Returns the (R,C) MLP output.
static const act *mlp_tiled_forward(GPT *g, const bf16 *p, const LayerActs *la) {
    Device *d = g->dev;
    const size_t *o = g->L.blk_off;
    GPTWork *w = g->work;
    int tp = g->L.tp_size, BT = g->plan.B * g->plan.T, C = g->L.cfg.channels, F = 4 * C / tp;
    int n = gpt_mlp_tile_rows(&g->plan);
    const act *in = column_input(g, la->ln2);
    for (int r0 = 0; r0 < BT; r0 += n) {
        int rows = BT - r0 < n ? BT - r0 : n;
        d->k->matmul_gelu_forward(d, w->mlp_gelu, w->mlp_pre, row_of(g, in, r0, C), p + o[BLK_FCW], p + o[BLK_FCB],
                                  rows, C, F);
        d->k->matmul_forward(d, row_of(g, w->tmp, r0, C), w->mlp_gelu, p + o[BLK_FCPROJW],
                             tp == 1 ? p + o[BLK_FCPROJB] : NULL, rows, F, C, C);
    }
    if (tp == 1) return w->tmp;
    act *out = w->tmp;
    if (g->plan.sequence_parallel) tp_scatter_sum_rows(g, w->part, out), out = w->part;
    else tp_sum(g, out);
    d->k->bias_add(d, out, p + o[BLK_FCPROJB], res_rows(g), C);
    return out;
}

// Its backward, chunk by chunk: the chunk's fc and GELU computed again from
// ln2, then the projection's and fc's gradients, the chunk's rows of dc (the
// gradient of ln2's output, before f's backward sums it). The output's
// gradient is whole on every rank (under sequence parallelism gathered into
// d4a, which attention's backward takes after it).
static void mlp_tiled_backward(GPT *g, const bf16 *p, float *dp, const LayerActs *la, const act *dres) {
    Device *d = g->dev;
    const size_t *o = g->L.blk_off;
    GPTWork *w = g->work;
    int BT = g->plan.B * g->plan.T, C = g->L.cfg.channels, F = 4 * C / g->L.tp_size;
    int n = gpt_mlp_tile_rows(&g->plan);
    const act *dout = dres;
    if (g->plan.sequence_parallel) tp_gather_rows(g, w->d4a, dres), dout = w->d4a;
    const act *in = column_input(g, la->ln2);
    for (int r0 = 0; r0 < BT; r0 += n) {
        int rows = BT - r0 < n ? BT - r0 : n;
        d->k->matmul_gelu_forward(d, w->mlp_gelu, w->mlp_pre, row_of(g, in, r0, C), p + o[BLK_FCW], p + o[BLK_FCB],
                                  rows, C, F);
        d->k->gelu_matmul_backward(d, w->d4b, dp + o[BLK_FCPROJW], dp + o[BLK_FCPROJB], row_of(g, dout, r0, C),
                                   w->mlp_gelu, w->mlp_pre, p + o[BLK_FCPROJW], rows, F, C);
        d->k->matmul_backward(d, row_of(g, w->dc, r0, C), dp + o[BLK_FCW], dp + o[BLK_FCB], w->d4b,
                              row_of(g, in, r0, C), p + o[BLK_FCW], rows, C, F, F);
    }
}

// x3 = x + attn(ln1(x)) + mlp(ln2(...)): one GPT-2 block, pre-layernorm.
void block_forward(GPT *g, const bf16 *p, int layer, int s) {
    LayerActs *la = layer_acts(g, layer, s);
    const size_t *o = g->L.blk_off;
    int C = g->L.cfg.channels, F = 4 * C / g->L.tp_size;
    block_forward_inner(g, p, la, block_input(g, layer, s));
    const act *y = g->plan.mlp_tiles ? mlp_tiled_forward(g, p, la)
                                     : row_parallel_forward(g, la->fch_gelu, p + o[BLK_FCPROJW], p + o[BLK_FCPROJB], F);
    g->dev->k->residual_forward(g->dev, la->x3, la->x2, y, (size_t)res_rows(g) * C);
}

// Zero bubble's B copies what W will read into the stash (nothing without one).
static void keep(GPT *g, const WStash *ws, act *dst, const act *src, size_t elems) {
    if (ws) dev_copy(g->dev, dst, src, elems * g->dev->act_bytes, STREAM_COMPUTE);
}

// Backward through the same operators: g's backward gathers (or passes) the
// output gradient, f's backward sums the column-parallel linears' partial
// input gradients before the layernorms. The weight gradient of a
// column-parallel linear reads its whole input: under sequence parallelism
// the layernorm's rows are all-gathered again (Megatron keeps them split).
// With a W stash (zero bubble's B) each linear forms its input's gradient
// only (dw NULL), and its input and output gradient are copied for W.
void block_backward(GPT *g, const bf16 *p, float *dp, int layer, int s, WStash *ws) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    const LayerActs *la = layer_acts(g, layer, s);
    const act *x = block_input(g, layer, s);
    GPTWork *w = g->work;
    act *dres = g->slot[s].dres;
    int tp = g->L.tp_size, B = g->plan.B, T = g->plan.T, BT = B * T, R = res_rows(g);
    int C = g->L.cfg.channels, Cp = C / tp, F = 4 * C / tp, NHp = g->L.cfg.num_heads / tp;
    size_t ln1 = o[BLK_LN1B + 1] - o[BLK_LN1W];  // ln1's weights and biases, then ln2's: the stash's ln
    float *g_ln1 = ws ? ws->ln : dp + o[BLK_LN1W], *g_ln2 = ws ? ws->ln + ln1 : dp + o[BLK_LN2W];
    size_t n_ln1b = o[BLK_LN1B] - o[BLK_LN1W], n_ln2b = o[BLK_LN2B] - o[BLK_LN2W];
    if (ws) dev_memset0(d, ws->ln, (ln1 + o[BLK_LN2B + 1] - o[BLK_LN2W]) * sizeof(float), STREAM_COMPUTE);
#define DW(piece) (ws ? NULL : dp + o[piece])
    // x3 = x2 + fcproj(gelu(fc(ln2(x2)))); d4b is the gradient of fc's output, before the GELU
    if (g->plan.mlp_tiles) {
        mlp_tiled_backward(g, p, dp, la, dres);
    } else {
        const act *dproj = row_output_grad(g, dres);  // (gathered under sequence parallelism, as in_fc after it)
        keep(g, ws, ws ? ws->d_proj : NULL, dproj, (size_t)BT * C);
        keep(g, ws, ws ? ws->in_proj : NULL, la->fch_gelu, (size_t)BT * F);
        k->gelu_matmul_backward(d, w->d4b, DW(BLK_FCPROJW), DW(BLK_FCPROJB), dproj, la->fch_gelu, la->fch,
                                p + o[BLK_FCPROJW], BT, F, C);
        const act *in_fc = column_input(g, la->ln2);
        keep(g, ws, ws ? ws->d_fc : NULL, w->d4b, (size_t)BT * F);
        keep(g, ws, ws ? ws->in_fc : NULL, in_fc, (size_t)BT * C);
        k->matmul_backward(d, w->dc, DW(BLK_FCW), DW(BLK_FCB), w->d4b, in_fc, p + o[BLK_FCW], BT, C, F, F);
    }
    k->layernorm_backward(d, dres, g_ln2, g_ln2 + n_ln2b, column_input_grad(g, w->dc), la->x2, p + o[BLK_LN2W],
                          la->ln2_mean, la->ln2_rstd, R, C);
    // x2 = x + attproj(attention(qkv(ln1(x))))
    const act *datt = row_output_grad(g, dres);
    keep(g, ws, ws ? ws->d_att : NULL, datt, (size_t)BT * C);
    keep(g, ws, ws ? ws->in_att : NULL, la->atty, (size_t)BT * Cp);
    k->matmul_backward(d, w->dc, DW(BLK_ATTPROJW), DW(BLK_ATTPROJB), datt, la->atty, p + o[BLK_ATTPROJW], BT, Cp,
                       C, C);
    act *dqkv = w->d4a;
    if (gpt_plan_ring(&g->plan))
        ring_attention_backward(g, la, w->dc, dqkv);
    else if (gpt_plan_ulysses(&g->plan))
        ulysses_attention_backward(g, la, w->dc, dqkv);
    else if (g->plan.attention == GPT_ATTENTION_FLASH)
        k->flash_attention_backward(d, dqkv, w->dc, la->qkv, la->atty, la->att, B, T, Cp, NHp);
    else
        k->attention_backward(d, dqkv, w->dc, la->qkv, la->att, B, T, Cp, NHp);
    const act *in_qkv = column_input(g, la->ln1);
    keep(g, ws, ws ? ws->d_qkv : NULL, dqkv, (size_t)BT * 3 * Cp);
    keep(g, ws, ws ? ws->in_qkv : NULL, in_qkv, (size_t)BT * C);
    k->matmul_backward(d, w->dc, DW(BLK_QKVW), DW(BLK_QKVB), dqkv, in_qkv, p + o[BLK_QKVW], BT, C, 3 * Cp, 3 * Cp);
    k->layernorm_backward(d, dres, g_ln1, g_ln1 + n_ln1b, column_input_grad(g, w->dc), x, p + o[BLK_LN1W],
                          la->ln1_mean, la->ln1_rstd, R, C);
#undef DW
    // the layernorms' gradients, each rank's from its rows: summed over the group
    tp_sum_grads(g, g_ln1, ln1);
    tp_sum_grads(g, g_ln2, o[BLK_LN2B + 1] - o[BLK_LN2W]);
}

// Zero bubble's W: the linears' gradients from what B kept, each the same
// call 1F1B's backward makes for it but with no input gradient (dinp NULL:
// the weights' and bias's GEMMs alone, the same bits), onto dp zeroed, and
// the layernorms' from the stash.
void block_backward_weights(GPT *g, float *dp, const WStash *ws) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const size_t *o = g->L.blk_off;
    int BT = g->plan.B * g->plan.T, C = g->L.cfg.channels, Cp = C / g->L.tp_size, F = 4 * C / g->L.tp_size;
    size_t ln1 = o[BLK_LN1B + 1] - o[BLK_LN1W], ln2 = o[BLK_LN2B + 1] - o[BLK_LN2W];
    dev_copy(d, dp + o[BLK_LN1W], ws->ln, ln1 * sizeof(float), STREAM_COMPUTE);
    dev_copy(d, dp + o[BLK_LN2W], ws->ln + ln1, ln2 * sizeof(float), STREAM_COMPUTE);
    k->matmul_backward(d, NULL, dp + o[BLK_FCPROJW], dp + o[BLK_FCPROJB], ws->d_proj, ws->in_proj, NULL, BT, F, C, C);
    k->matmul_backward(d, NULL, dp + o[BLK_FCW], dp + o[BLK_FCB], ws->d_fc, ws->in_fc, NULL, BT, C, F, F);
    k->matmul_backward(d, NULL, dp + o[BLK_ATTPROJW], dp + o[BLK_ATTPROJB], ws->d_att, ws->in_att, NULL, BT, Cp, C,
                       C);
    k->matmul_backward(d, NULL, dp + o[BLK_QKVW], dp + o[BLK_QKVB], ws->d_qkv, ws->in_qkv, NULL, BT, C, 3 * Cp,
                       3 * Cp);
}
