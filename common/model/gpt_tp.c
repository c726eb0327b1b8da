// gpt_tp.c: the communication of tensor parallelism (Shoeybi et al. 2019,
// Megatron-LM) in the model, over the tp group's comm:
//   - per block: the f operator (identity forward, all-reduce backward)
//     before each column-parallel linear, the g operator (all-reduce
//     forward, identity backward) after each row-parallel one: two
//     all-reduces of (BT,C) forward and two backward per micro-batch;
//   - the vocabulary-parallel embedding: one all-reduce of (BT,C) forward;
//   - the vocabulary-parallel cross-entropy: the row maxima (BT) and the sums
//     of exponentials with the target logits (2BT, fp32) all-reduced forward,
//     so the full logits are never gathered; the head's input gradient, an f
//     operator, all-reduced backward (BT,C).
// Under sequence parallelism (Korthikanti et al. 2022) the residual stream
// and the layernorms are split over the group by the tokens: f becomes an
// all-gather of the layernorm's output forward (and again backward, where
// the column-parallel linear's weight gradient needs it whole) and a
// reduce-scatter of its input gradient backward; g a reduce-scatter forward
// and an all-gather of the output gradient backward; the embedding's sum a
// reduce-scatter; and the layernorms' weight gradients, each rank's from
// its tokens, are summed over the group.
#include "check.h"
#include "comm.h"
#include "gpt_units.h"

// LAB 07: tp_sum -- the all-reduce of Megatron-LM's f and g operators
// x (B·T·C elements: the micro-batch's residual stream, g->plan.B x
// g->plan.T x g->L.cfg.channels) summed in place over the tensor-parallel
// group g->tp, blocking (comm_all_reduce_sum with no handle), in the
// activations' type: DT_F32 when g->dev->act_bytes is 4 (cpu), DT_HALF when
// 2 (cuda). Nothing to do when g->L.tp_size is 1. It is the forward of g
// after each row-parallel linear and the backward of f before each
// column-parallel one (gpt_block.c calls it).
void tp_sum(GPT *g, act *x) {
    if (g->L.tp_size == 1) return;
    size_t n = (size_t)g->plan.B * g->plan.T * g->L.cfg.channels;
    comm_all_reduce_sum(g->tp, x, n, g->dev->act_bytes == 4 ? DT_F32 : DT_HALF, NULL);
}
// LAB END

void tp_gather_rows(GPT *g, act *full, const act *part) {
    int n = g->L.tp_size, r = g->L.tp_rank;
    size_t rows = (size_t)res_rows(g), C = g->L.cfg.channels, ab = g->dev->act_bytes;
    size_t counts[GPT_MAX_TP], displs[GPT_MAX_TP];
    for (int q = 0; q < n; q++) counts[q] = rows * C, displs[q] = (size_t)q * rows * C;
    dev_copy(g->dev, (char *)full + displs[r] * ab, part, rows * C * ab, STREAM_COMPUTE);
    comm_all_gather(g->tp, full, counts, displs, gpt_act_dtype(g), NULL);
}

void tp_scatter_sum_rows(GPT *g, act *part, const act *full) {
    size_t counts[GPT_MAX_TP], elems = (size_t)res_rows(g) * g->L.cfg.channels;
    for (int q = 0; q < g->L.tp_size; q++) counts[q] = elems;
    comm_reduce_scatter_sum(g->tp, full, part, counts, gpt_act_dtype(g), NULL);
}

void tp_sum_grads(GPT *g, float *grads, size_t n) {
    if (g->plan.sequence_parallel) comm_all_reduce_sum(g->tp, grads, n, DT_F32, NULL);
}

// Each rank looks up the tokens of its vocabulary rows (zero for the others),
// the first adds the positions, and the sum over the group has every token's
// row and its position once: bit for bit the whole model's embedding, as a
// sum of one row and zeros is exact. Sequence parallel: the sum's rows of
// this rank only (a reduce-scatter).
void tp_embed_forward(GPT *g, const bf16 *pe, int s) {
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    const bf16 *wpe = l->tp_rank == 0 ? embed_positions(g, pe + l->emb_off[EMB_WPE]) : NULL;
    act *out = g->plan.sequence_parallel ? g->work->tmp : sl->x_in;
    g->dev->k->embedding_part_forward(g->dev, out, sl->inputs, pe + l->emb_off[EMB_WTE], l->vocab_begin,
                                      l->vocab_part, wpe, g->plan.B, g->plan.T, l->cfg.channels);
    if (g->plan.sequence_parallel) tp_scatter_sum_rows(g, sl->x_in, out);
    else tp_sum(g, sl->x_in);
}

// loss = log(sum over the group of exp(z - max)) + max - z[target], with
// max and z[target] taken over the group; padding columns left out.
void tp_head_loss(GPT *g, int s, act *logits, int r0, int rows) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    GPTWork *w = g->work;
    int V = gpt_real_vocab_rows(l), ld = gpt_logits_stride(l);
    const int32_t *targets = sl->targets + r0;
    k->crossentropy_part_max(d, w->ce_max, logits, rows, V, ld);
    comm_all_reduce_max(g->tp, w->ce_max, (size_t)rows, DT_F32, NULL);
    k->crossentropy_part_sums(d, w->ce_sums, logits, w->ce_max, targets, l->vocab_begin, rows, V, ld);
    comm_all_reduce_sum(g->tp, w->ce_sums, 2 * (size_t)rows, DT_F32, NULL);
    k->crossentropy_part_finish(d, sl->losses + r0, logits, w->ce_max, w->ce_sums, targets, l->vocab_begin, rows,
                                V, ld, sl->dloss_scale);
}
