// gpt_units.h: what the model's compute files share (gpt.c, gpt_ends.c, gpt_block.c,
// gpt_tp.c): the activations one micro-batch keeps (a slot), the temporaries
// the slots share, the forward and backward of one block, and the pieces of
// tensor parallelism. Internal to common/model; everything else goes through
// gpt.h. Under tensor parallelism (tp ranks) a block's tensors hold this
// rank's heads: Cp = C/tp channels of attention, F = 4C/tp of the MLP.
#pragma once
#include "comm.h"
#include "gpt.h"
#include "kernels.h"

// gpt.c: consecutive pieces of one allocation (a slot's, a block's, the
// shared temporaries'); fp32 and int32 pieces (carve_words) are checked to
// be 4-aligned, so they come before any bf16 piece of odd length.
typedef struct Carver {
    char *at;
    size_t left;
} Carver;

// Activations of one transformer block that its backward reads; its input is
// the previous block's x3, or the slot's x_in for the range's first block.
// Under recompute the pieces a block does not save point into the working
// set (GPTWork.live), which its backward fills again first.
typedef struct LayerActs {
    act *ln1, *qkv, *atty, *x2, *ln2, *fch, *fch_gelu, *x3;  // (BT,C) except qkv (BT,3Cp), atty (BT,Cp), fch* (BT,F)
    // Ulysses (plan.cp > 1): qkv holds every position of 1/cp of the heads,
    // (B, cp·T, 3Cp/cp), and atth the attention core's output over them
    // (B, cp·T, Cp/cp), which its backward reads; atty is that output back
    // on this rank's positions, the projection's input. NULL without.
    act *atth;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;        // (BT)
    float *att;  // what the attention core saves: the probabilities (B,NH/tp,T,T), or with flash each row's lse (B,NH/tp,T)
} LayerActs;

// One micro-batch in flight: what its backward needs from its forward.
typedef struct GPTSlot {
    act *x_in;                    // (R,C) residual stream entering the range's first block (R: res_rows)
    act *chunk_in[GPT_MAX_CHUNKS];  // interleaved: [j > 0] chunk j's input (R,C), received for it
    LayerActs *layer;             // the range's blocks, [layer - first layer]
    act *lnf;                     // (BT,C) head only, like the three below
    float *lnf_mean, *lnf_rstd;   // (BT)
    act *logits;                  // (BT,vocab_part), rows gpt_logits_stride apart; dlogits after forward with a loss scale
    float *losses;                // (BT)
    int32_t *inputs, *targets;    // (BT) embeddings / head only
    int32_t *bucket_order, *bucket_start;  // (BT) each, embeddings only: the inputs' token buckets (token_buckets.h)
    int buckets;                  // how many
    act *dres;                    // (R,C) gradient of the residual stream (backward scratch)
    float dloss_scale;
    int micro;                    // the micro-batch of the step it holds (gpt_slot_micro_batch), -1 unknown
} GPTSlot;

// Zero bubble (plan.w_slots > 0): what a block's B leaves for its W (gpt.h's
// GPTPlan.w_slots), one per W slot and block of the range.
typedef struct WStash {
    float *ln;                            // the layernorms' gradients: ln1's w and b, then ln2's (fp32, 4C)
    act *in_qkv, *in_att, *in_fc, *in_proj;  // the linears' inputs: ln1 (BT,C), atty (BT,Cp), ln2 (BT,C), fch_gelu (BT,F)
    act *d_qkv, *d_att, *d_fc, *d_proj;      // their outputs' gradients: (BT,3Cp), (BT,C), (BT,F), (BT,C)
} WStash;
void carve_w_stash_words(struct GPT *g, Carver *c, WStash *w);
void carve_w_stash_acts(struct GPT *g, Carver *c, WStash *w);

// Temporaries the slots share: live within one unit's forward or backward.
typedef struct GPTWork {
    act *tmp;                     // (BT,C) projection outputs before the residual add (partial sums under tp)
    act *logits_tile;             // (ceil(BT/loss_tiles),vocab_part): one chunk's logits (plan.loss_tiles > 0)
    act *mlp_pre, *mlp_gelu;      // (gpt_mlp_tile_rows,F): one chunk's fc and GELU outputs (plan.mlp_tiles > 0)
    act *gathered;                // (BT,C) sequence parallel: a column-parallel linear's all-gathered input, or a gradient
    act *part;                    // (R,C) sequence parallel: this rank's rows of a reduce-scattered sum
    float *ce_max, *ce_sums;      // (BT), (2,BT): the vocabulary-parallel cross-entropy's statistics (tp > 1)
    act *dc;                      // (BT,C)
    act *d4a, *d4b;               // (BT,F); d4b the gradient of fc's output (a chunk's rows under the tiled
                                  // MLP); d4a serves as dqkv (BT,3Cp), and holds the gathered output gradient there
    act *a2a_send, *a2a_recv;     // (BT,3Cp) each, Ulysses (plan.cp > 1): the all-to-alls' packed parts
    // ring attention (gpt_ring.c): k and v (BT,2Cp) at hand and coming; their
    // gradients likewise (fp32); y's or dq's fp32 accumulator (BT,Cp); the
    // position rows of the rank's chunks (T,C), bf16 forward, fp32 backward
    act *ring_kv[2];
    float *ring_dkv[2], *ring_acc;
    void *positions;
    int embed_grads_slot;         // slot whose head backward started embed_grads; -1 none
    LayerActs live;               // the recomputation's working set (x3 unused): see gpt_recompute.c
} GPTWork;

// gpt_checkpoints.c: the blocks' saved inputs under full recompute, on the
// host (offload_activations) and/or in 1/tp parts (partition_activations),
// through a ring of two whole ones on the device.
typedef struct RingTag {
    int slot, layer;  // whose x3 the buffer holds (layer: 0-based in the range), -1: none
    int back;         // brought back from the store for a backward (else written by a forward)
} RingTag;

#define GPT_MAX_TP GPT_MAX_HEADS

typedef struct CkptStore {
    act *buf[2];             // the device ring, in the activations buffer
    Buf store;               // [slot][block] this rank's part of x3, per_slot per slot
    int on_host;             // the store is pinned host memory (else device memory)
    size_t bytes;            // one whole (BT,C) tensor
    size_t part_bytes;       // what the store keeps of one: bytes, or bytes / tp partitioned
    size_t part_offset;      // where this rank's part starts in a whole one
    int per_slot;            // stored inputs per slot: the range's blocks - 1
    RingTag holds[2];
    Event written[2];        // compute: the block's x3 is in buf[k]
    Event out[2];            // copy: buf[k]'s part is in the store, buf[k] free to write
    Event in[2];             // copy: buf[k]'s part is back for a backward
    Event free[2];           // compute: everything that read buf[k] has run
    double to_host, to_device;  // bytes moved between device and host since gpt_take_offload_bytes
} CkptStore;

void ckpt_store_init(GPT *g, act *ring0, act *ring1, size_t store_bytes);
void ckpt_store_free(GPT *g);
// Around the forward of block i (0-based in the range) of slot s, and before
// its backward (or the head's, which starts the last block's input ahead).
void ckpt_before_forward(GPT *g, int i, int s);
void ckpt_after_forward(GPT *g, int i, int s);
void ckpt_before_backward(GPT *g, int i, int s);
void ckpt_before_head_backward(GPT *g, int s);

// gpt.c: a Carver's pieces (see above).
void *carve(Carver *c, size_t bytes);
void *carve_words(Carver *c, size_t bytes);
// A block's fp32 pieces (the layernorms' statistics of its R rows, then the
// attention core's unless att is 0), and its activation pieces but x3.
void carve_block_words(Carver *c, LayerActs *la, size_t R, size_t att);
void carve_block_acts(struct GPT *g, Carver *c, LayerActs *la);
// The work's buffers of the sequence split, Ulysses' or the ring's (gpt_ring.c).
void carve_seq_work(struct GPT *g, Carver *c);
// Selective recompute with the materialized attention: the probabilities
// live in the working set, not in the block's saved tensors.
int drops_probabilities(const GPTPlan *p);
// The recomputation's working set (GPTWork.live) out of cw.
void carve_working(struct GPT *g, Carver *cw, size_t att);

// gpt_held.c: without plan.contiguous, what a slot keeps is allocated as
// its units produce it and released after their backward (a framework's
// allocator sees the same), the recompute's working set around each
// block's forward and recompute, and a unit's fp32 gradients for its
// backward; with it (ZeRO-R's contiguous buffers) all of it lives in
// regions gpt_alloc made once. Each is a no-op where plan.contiguous is set.
typedef struct SlotHeld {
    Buf input;      // token ids and buckets (embeddings), target ids (head), x_in: until the range's first backward
    Buf *block;     // [range blocks] each block's saved tensors, from its forward to its backward
    Buf head;       // the head's: lnf, its statistics, the logits, the losses
    Buf chunk_in[GPT_MAX_CHUNKS];  // interleaved: chunk j's input, from its arrival to its first block's backward
    int forwarded;  // a unit's forward ran since the input came (a forward-only pass leaves it so)
} SlotHeld;
void held_alloc(struct GPT *g);
void held_free(struct GPT *g);
// Slot s takes a micro-batch: its input (what a forward-only pass left
// there is let go first).
void held_slot_input(struct GPT *g, int s);
// Interleaved: chunk j's input of slot s, as it arrives (j > 0).
void held_chunk_input(struct GPT *g, int s, int j);
void held_before_forward(struct GPT *g, int u, int s);
void held_after_forward(struct GPT *g, int u, int s);
// Before unit u's backward: the last backward's gradients let go, this
// unit's allocated (and the tied wte's at the head), or under zero bubble's
// B (w >= 0) none but W slot w's stash of the block; before its recompute:
// the working set again. Around a W: the last gradients let go and the
// unit's allocated, then the stash let go.
void held_before_backward(struct GPT *g, int u, int s, int w);
void held_before_weights(struct GPT *g, int u, int w);
void held_after_weights(struct GPT *g, int u, int w);
void held_before_recompute(struct GPT *g, int u, int s);
void held_after_backward(struct GPT *g, int u, int s);
// The pass is over: the gradients and what a forward-only pass left, let go.
void held_pass_end(struct GPT *g);

// Rows of the residual stream and the layernorms' tensors this rank holds:
// B·T, or B·T/tp under sequence parallelism.
static inline int res_rows(const GPT *g) {
    int BT = g->plan.B * g->plan.T;
    return g->plan.sequence_parallel ? BT / g->L.tp_size : BT;
}

// Blocks of the plan's range: layers [first, end).
static inline int plan_first_layer(const GPTPlan *p) { return (p->first_unit > 1 ? p->first_unit : 1) - 1; }
static inline int plan_end_layer(const GPTPlan *p, int num_layers) {
    return p->last_unit < num_layers ? p->last_unit : num_layers;
}
// Block i of the range (0-based from its first block) is one this plan
// computes: every block of a contiguous range, a chunk's under interleaving.
static inline int plan_owns_block(const GPTPlan *p, int i) {
    return p->chunks <= 1 || (i % p->chunk_stride < p->chunk_blocks && i / p->chunk_stride < p->chunks);
}
static inline int plan_has_unit(const GPTPlan *p, int u) {
    if (u < p->first_unit || u > p->last_unit) return 0;
    return u == GPT_UNIT_EMBED || u == p->last_unit || plan_owns_block(p, u - 1 - plan_first_layer(p));
}

// Input of block `layer` in slot s: the previous block's output, or x_in for
// the range's first block (and under interleaving a chunk's own input for
// its first block). layer = end layer gives the range's output.
static inline act *block_input(const GPT *g, int layer, int s) {
    const GPTSlot *sl = &g->slot[s];
    int first = plan_first_layer(&g->plan), i = layer - first;
    if (layer == first) return sl->x_in;
    if (g->plan.chunks > 1 && i % g->plan.chunk_stride == 0 && i / g->plan.chunk_stride < g->plan.chunks)
        return sl->chunk_in[i / g->plan.chunk_stride];
    return sl->layer[i - 1].x3;
}

static inline LayerActs *layer_acts(const GPT *g, int layer, int s) {
    return &g->slot[s].layer[layer - plan_first_layer(&g->plan)];
}

// Zero bubble: W slot w's stash of the range's block i (0-based).
static inline int plan_range_blocks(const GPTPlan *p, int num_layers) {
    return plan_end_layer(p, num_layers) - plan_first_layer(p);
}
static inline size_t w_index(const GPT *g, int w, int i) {
    return (size_t)w * (size_t)plan_range_blocks(&g->plan, g->L.cfg.num_layers) + (size_t)i;
}
static inline WStash *w_stash(const GPT *g, int w, int i) { return &g->wstash[w_index(g, w, i)]; }

// gpt_ends.c: the embeddings' and the head's forward and backward for slot
// s (pe: the embeddings' parameters, wte opening them; ph: the head's).
void embed_forward(GPT *g, const bf16 *pe, int s);
void embed_backward(GPT *g, int s);
void head_forward(GPT *g, const bf16 *ph, const bf16 *pe, int s);
void head_backward(GPT *g, const bf16 *ph, const bf16 *pe, int s);

// gpt_block.c. Forward: block `layer` of slot s from params p. Backward:
// the slot's dres holds dL/dx3 on entry and dL/dx_in on exit; parameter
// gradients accumulate into dp (fp32, the unit's layout). With a W stash
// ws (zero bubble's B) dp is unused: the layernorms' gradients go to the
// stash with what block_backward_weights reads, which then forms the
// linears' into dp (ws's layernorms' copied there first).
void block_forward(GPT *g, const bf16 *p, int layer, int s);
void block_backward(GPT *g, const bf16 *p, float *dp, int layer, int s, WStash *ws);
void block_backward_weights(GPT *g, float *dp, const WStash *ws);
// gpt_block.c: everything of block_forward that its backward reads, from the
// block's input x into la (all but the MLP projection and x3): what full
// recompute runs again.
void block_forward_inner(GPT *g, const bf16 *p, LayerActs *la, const act *x);
// gpt_recompute.c: before block `layer`'s backward of slot s, what the plan's
// recompute did not save, computed again from what it did (the same bits).
void block_recompute(GPT *g, const bf16 *p, int layer, int s);
// block_recompute, its work counted into g->recompute_work: kernels, FLOPs,
// and the first tensor written that the block had kept (gpt_recompute.c).
void block_recompute_metered(GPT *g, const bf16 *p, int layer, int s);

// ---- DeepSpeed-Ulysses (gpt_ulysses.c; plan.cp > 1) ----
// The attention core of a block over the cp group: la->qkv (this rank's
// positions, written by the QKV linear) to every position of 1/cp of the
// heads, in place; flash attention over them into la->atth and la->att;
// the output back to this rank's positions in la->atty.
void ulysses_attention_forward(GPT *g, LayerActs *la);
// Its backward: dout (BT,Cp), the gradient of atty, is overwritten; the
// gradient of the QKV linear's output on this rank's positions into dqkv
// (BT,3Cp).
void ulysses_attention_backward(GPT *g, const LayerActs *la, act *dout, act *dqkv);

// ---- ring attention (gpt_ring.c; plan.cp > 1, cp_ring) ----
// The attention core of a block over the cp group, from la->qkv (this
// rank's two chunks) into la->atty and la->att (the lse).
void ring_attention_forward(GPT *g, LayerActs *la);
// Its backward: dout (BT,Cp), the gradient of atty; the gradient of qkv into dqkv (BT,3Cp).
void ring_attention_backward(GPT *g, const LayerActs *la, const act *dout, act *dqkv);

// The position rows (wpe) of this rank's tokens: wpe itself, its part's
// rows under Ulysses, or under ring attention its two chunks' rows copied
// into the work's table (gpt_ring.c).
const bf16 *embed_positions(GPT *g, const bf16 *wpe);
// Where the embeddings' backward adds the positions' gradient, and after it,
// that gradient into dwpe's rows (the table's, under ring attention).
float *embed_position_grads(GPT *g, float *dwpe);
void embed_position_grads_done(GPT *g, float *dwpe);
// The activations' element type for collectives: fp32 on cpu, the 16-bit one on cuda.
static inline DType gpt_act_dtype(const GPT *g) { return g->dev->act_bytes == 4 ? DT_F32 : DT_HALF; }

// ---- tensor parallelism (gpt_tp.c) ----
// x (BT,C) summed in place over the tp group (nothing to do with tp_size 1),
// in the activations' type (fp32 on cpu, bf16 on cuda):
// Megatron-LM's g operator forward and f operator backward.
void tp_sum(GPT *g, act *x);
// Sequence parallelism: full (BT,C) = every rank's rows part (R,C) gathered
// (f before a column-parallel linear; g's backward), and part (R,C) = this
// rank's rows of full (BT,C) summed over the group (g after a row-parallel
// linear; f's backward).
void tp_gather_rows(GPT *g, act *full, const act *part);
void tp_scatter_sum_rows(GPT *g, act *part, const act *full);
// Sequence parallelism: a unit's layernorm gradients (fp32, n from `grads`)
// came from this rank's rows only; summed over the group they are the
// whole micro-batch's, the same on every rank.
void tp_sum_grads(GPT *g, float *grads, size_t n);
// x_in of slot s = the vocabulary-parallel embedding of its input tokens.
void tp_embed_forward(GPT *g, const bf16 *embed_params, int s);
// The slot's losses (and dlogits) of `rows` tokens from row r0, from this
// rank's logits of them (`logits`, the slot's or a chunk's), with the
// vocabulary-parallel cross-entropy's statistics all-reduced.
void tp_head_loss(GPT *g, int s, act *logits, int r0, int rows);
