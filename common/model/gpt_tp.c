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
#include "comm.h"
#include "gpt_units.h"

// LAB 07: tp_sum -- the all-reduce of Megatron-LM's f and g operators
// x (B·T·C elements: the micro-batch's residual stream, g->plan.B x
// g->plan.T x g->L.cfg.channels) summed in place over the tensor-parallel
// group g->tp, blocking (comm_all_reduce_sum with no handle), in the
// activations' type: DT_F32 when g->dev->act_bytes is 4 (cpu), DT_BF16 when
// 2 (cuda). Nothing to do when g->L.tp_size is 1. It is the forward of g
// after each row-parallel linear and the backward of f before each
// column-parallel one (gpt_block.c calls it).
void tp_sum(GPT *g, act *x) {
    if (g->L.tp_size == 1) return;
    size_t n = (size_t)g->plan.B * g->plan.T * g->L.cfg.channels;
    comm_all_reduce_sum(g->tp, x, n, g->dev->act_bytes == 4 ? DT_F32 : DT_BF16, NULL);
}
// LAB END

// Each rank looks up the tokens of its vocabulary rows (zero for the others),
// the first adds the positions, and the sum over the group has every token's
// row and its position once: bit for bit the whole model's embedding, as a
// sum of one row and zeros is exact.
void tp_embed_forward(GPT *g, const bf16 *pe, int s) {
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    const bf16 *wpe = l->tp_rank == 0 ? pe + l->emb_off[EMB_WPE] : NULL;
    g->dev->k->embedding_part_forward(g->dev, sl->x_in, sl->inputs, pe + l->emb_off[EMB_WTE], l->vocab_begin,
                                      l->vocab_part, wpe, g->plan.B, g->plan.T, l->cfg.channels);
    tp_sum(g, sl->x_in);
}

// Rows of this rank's wte part below V: its real vocabulary (the rest is padding).
static int real_rows(const GPTLayout *l) {
    int n = l->cfg.vocab_size - l->vocab_begin;
    return n < 0 ? 0 : n < l->vocab_part ? n : l->vocab_part;
}

// loss = log(sum over the group of exp(z - max)) + max - z[target], with
// max and z[target] taken over the group; padding columns left out.
void tp_head_loss(GPT *g, int s) {
    Device *d = g->dev;
    const KernelOps *k = d->k;
    const GPTLayout *l = &g->L;
    GPTSlot *sl = &g->slot[s];
    GPTWork *w = g->work;
    int BT = g->plan.B * g->plan.T, V = real_rows(l), ld = gpt_logits_stride(l);
    k->crossentropy_part_max(d, w->ce_max, sl->logits, BT, V, ld);
    comm_all_reduce_max(g->tp, w->ce_max, (size_t)BT, DT_F32, NULL);
    k->crossentropy_part_sums(d, w->ce_sums, sl->logits, w->ce_max, sl->targets, l->vocab_begin, BT, V, ld);
    comm_all_reduce_sum(g->tp, w->ce_sums, 2 * (size_t)BT, DT_F32, NULL);
    k->crossentropy_part_finish(d, sl->losses, sl->logits, w->ce_max, w->ce_sums, sl->targets, l->vocab_begin, BT,
                                V, ld, sl->dloss_scale);
}
