// gpt_held.c: what the model holds on the device when, without ZeRO-R's
// contiguous buffers (plan.contiguous; see gpt.h). A slot's input (its
// token ids, their buckets and the targets, the residual stream entering
// the range) is allocated when its micro-batch arrives and released after
// the range's first unit's backward; a block's saved tensors when its
// forward runs and after its backward; the head's likewise; the recompute's
// working set around each block's forward and again around its recompute
// and backward; a unit's fp32 gradients at its backward, until the next
// backward (the caller reads them between), the embeddings' (the tied wte)
// from the head's backward to the embeddings'; under zero bubble a block's W
// stash from its B to its W, and its fp32 gradients at its W. So the saved activations rise
// unit by unit in forward and fall in backward, as a framework's allocator
// sees them, interleaved with the short-lived buffers around them (zero3's
// gathered units, the scratch): what fragments a GPU's memory. The pieces
// of each are carved in the order gpt_alloc carves them (fp32 and int32
// first), with the same sizes; act_math.c has the closed forms.
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "gpt_units.h"

static int dynamic(const GPT *g) { return !g->plan.contiguous; }
static int range_blocks(const GPT *g) { return plan_range_blocks(&g->plan, g->L.cfg.num_layers); }
static int has_embed(const GPT *g) { return plan_has_unit(&g->plan, GPT_UNIT_EMBED); }
static int has_head(const GPT *g) { return plan_has_unit(&g->plan, gpt_unit_head(&g->L)); }
static int tiled_loss(const GPT *g) { return g->plan.loss_tiles > 0; }
// blocks whose x3 lives in the checkpoint store's ring (gpt_checkpoints.c): all but the last
static int stored_blocks(const GPT *g) {
    int nl = range_blocks(g);
    return (g->plan.offload_activations || g->plan.partition_activations) && nl > 1 ? nl - 1 : 0;
}

// ---- sizes ----

typedef struct Shapes {
    size_t BT, R, C, Cp, F, Vp, ab, att;
} Shapes;

static Shapes shapes_of(const GPT *g) {
    size_t tp = (size_t)g->L.tp_size, C = (size_t)g->L.cfg.channels;
    return (Shapes){(size_t)g->plan.B * g->plan.T, (size_t)res_rows(g), C, C / tp, 4 * C / tp,
                    (size_t)gpt_logits_stride(&g->L), (size_t)g->dev->act_bytes,
                    gpt_attention_saved_bytes(&g->L, &g->plan)};
}

static size_t input_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    return (has_embed(g) ? 3 * z.BT * sizeof(int32_t) : 0) + (has_head(g) ? z.BT * sizeof(int32_t) : 0) +
           z.R * z.C * z.ab;
}

// ln1, x2, ln2 on the R rows this rank holds; qkv, atty, fch, fch_gelu on B·T
// (under the tiled MLP no fch or fch_gelu: one chunk of them, shared; under
// Ulysses atth too)
static size_t block_act_bytes(const GPT *g, Shapes z) {
    size_t ulysses = gpt_plan_ulysses(&g->plan) ? z.Cp : 0;  // atth: the core's output on the heads' positions
    return 3 * z.R * z.C * z.ab + z.BT * (3 * z.Cp + z.Cp + ulysses + (g->plan.mlp_tiles ? 0 : 2 * z.F)) * z.ab;
}

// the tiled MLP's chunk of fc's and the GELU's outputs
static size_t mlp_tile_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    return range_blocks(g) > 0 && g->plan.mlp_tiles ? 2 * (size_t)gpt_mlp_tile_rows(&g->plan) * z.F * z.ab : 0;
}

static size_t block_bytes(const GPT *g, int i) {
    Shapes z = shapes_of(g);
    size_t b = 0;
    if (g->plan.recompute != GPT_RECOMPUTE_FULL)
        b += 4 * z.R * sizeof(float) + (drops_probabilities(&g->plan) ? 0 : z.att) + block_act_bytes(g, z);
    if (i >= stored_blocks(g)) b += z.R * z.C * z.ab;  // x3
    return b;
}

static size_t head_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    return 2 * z.R * sizeof(float) + z.BT * sizeof(float) + z.R * z.C * z.ab + (tiled_loss(g) ? 0 : z.BT * z.Vp * z.ab);
}

// zero bubble's W stash of a block: the layernorms' gradients (fp32), the
// linears' inputs ln1, atty, ln2, fch_gelu and their outputs' gradients
static size_t w_stash_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    const size_t *o = g->L.blk_off;
    size_t ln = o[BLK_LN1B + 1] - o[BLK_LN1W] + o[BLK_LN2B + 1] - o[BLK_LN2W];
    return ln * sizeof(float) + z.BT * (z.C + z.Cp + z.C + z.F + 3 * z.Cp + z.C + z.F + z.C) * z.ab;
}

// one chunk's logits under the tiled loss (gpt.h's loss_tiles)
static size_t tile_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    return has_head(g) && tiled_loss(g) ? (size_t)gpt_loss_tile_rows(&g->plan) * z.Vp * z.ab : 0;
}

static size_t working_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    if (g->plan.recompute == GPT_RECOMPUTE_FULL) return 4 * z.R * sizeof(float) + z.att + block_act_bytes(g, z);
    return drops_probabilities(&g->plan) ? z.att : 0;
}

// the projection output, the tp cross-entropy's statistics, sequence
// parallelism's gathered and scattered tensors, the checkpoints' ring
static size_t shared_bytes(const GPT *g) {
    Shapes z = shapes_of(g);
    size_t b = z.BT * z.C * z.ab;
    if (has_head(g) && g->L.tp_size > 1) b += 3 * z.BT * sizeof(float);
    if (g->plan.sequence_parallel) b += z.BT * z.C * z.ab + z.R * z.C * z.ab;
    if (stored_blocks(g)) b += 2 * z.R * z.C * z.ab;
    return b + tile_bytes(g) + mlp_tile_bytes(g);
}

static void carved_whole(const Carver *c, const char *what) {
    CHECK(c->left == 0, "%s: %zu bytes left over after carving; hint: gpt_held.c's sizes and carving disagree",
          what, c->left);
}

// ---- set-up ----

// Zero bubble's W stashes: each held from its block's B to its W.
static size_t w_stash_count(const GPT *g) {
    return g->plan.w_slots > 0 ? (size_t)g->plan.w_slots * (size_t)range_blocks(g) : 0;
}

void held_alloc(GPT *g) {
    if (!dynamic(g)) return;
    Shapes z = shapes_of(g);
    int nl = range_blocks(g);
    g->held = xcalloc((size_t)g->plan.slots, sizeof(SlotHeld));
    if (w_stash_count(g)) g->w_held = xcalloc(w_stash_count(g), sizeof(Buf));
    for (int s = 0; s < g->plan.slots; s++) g->held[s].block = xcalloc(nl > 0 ? (size_t)nl : 1, sizeof(Buf));
    g->shared = buf_alloc(g->dev, TIER_DEVICE, CAT_ACTIVATIONS, shared_bytes(g), "activation temporaries");
    Carver c = {g->shared.ptr, g->shared.bytes};
    if (has_head(g) && g->L.tp_size > 1) {
        g->work->ce_max = carve_words(&c, z.BT * sizeof(float));
        g->work->ce_sums = carve_words(&c, 2 * z.BT * sizeof(float));
    }
    g->work->tmp = carve(&c, z.BT * z.C * z.ab);
    if (tile_bytes(g)) g->work->logits_tile = carve(&c, tile_bytes(g));
    if (mlp_tile_bytes(g)) {
        g->work->mlp_pre = carve(&c, mlp_tile_bytes(g) / 2);
        g->work->mlp_gelu = carve(&c, mlp_tile_bytes(g) / 2);
    }
    if (g->plan.sequence_parallel) {
        g->work->gathered = carve(&c, z.BT * z.C * z.ab);
        g->work->part = carve(&c, z.R * z.C * z.ab);
    }
    int stored = stored_blocks(g);
    if (stored) {
        act *ring0 = carve(&c, z.R * z.C * z.ab), *ring1 = carve(&c, z.R * z.C * z.ab);
        size_t part = z.R * z.C * z.ab / (g->plan.partition_activations ? (size_t)g->L.tp_size : 1);
        ckpt_store_init(g, ring0, ring1, (size_t)stored * (size_t)g->plan.slots * part);
    }
    carved_whole(&c, "activation temporaries");
}

// The slot's pointers into what it held, cleared: a stale use faults at
// once (a NULL) instead of reading a block that another owns now.
static void let_go_slot(GPT *g, int s) {
    SlotHeld *h = &g->held[s];
    GPTSlot *sl = &g->slot[s];
    int nl = range_blocks(g);
    for (int i = 0; i < nl; i++) {
        buf_free(g->dev, &h->block[i]);
        memset(&sl->layer[i], 0, sizeof sl->layer[i]);
    }
    buf_free(g->dev, &h->head);
    buf_free(g->dev, &h->input);
    for (int j = 1; j < gpt_plan_chunks(&g->plan); j++) {
        buf_free(g->dev, &h->chunk_in[j]);
        sl->chunk_in[j] = NULL;
    }
    sl->x_in = sl->lnf = sl->logits = NULL;
    sl->lnf_mean = sl->lnf_rstd = sl->losses = NULL;
    sl->inputs = sl->targets = sl->bucket_order = sl->bucket_start = NULL;
    h->forwarded = 0;
}

static void let_go_grads(GPT *g) {
    buf_free(g->dev, &g->unit_grads);
    if (g->work->embed_grads_slot < 0) buf_free(g->dev, &g->embed_grads);  // no head backward waits on it
}

void held_free(GPT *g) {
    if (!g->held) return;
    for (size_t k = 0; k < w_stash_count(g); k++) buf_free(g->dev, &g->w_held[k]);
    free(g->w_held);
    g->w_held = NULL;
    for (int s = 0; s < g->plan.slots; s++) {
        let_go_slot(g, s);
        free(g->held[s].block);
    }
    g->work->embed_grads_slot = -1;
    let_go_grads(g);
    buf_free(g->dev, &g->working);
    buf_free(g->dev, &g->shared);
    free(g->held);
    g->held = NULL;
}

// ---- a micro-batch's life ----

void held_slot_input(GPT *g, int s) {
    if (!dynamic(g)) return;
    SlotHeld *h = &g->held[s];
    if (h->forwarded) let_go_slot(g, s);  // a forward-only pass's micro-batch: done with
    if (h->input.ptr) return;             // arrived already (a pipeline stage's received input)
    Shapes z = shapes_of(g);
    GPTSlot *sl = &g->slot[s];
    char what[BUF_NAME_BYTES];
    snprintf(what, sizeof what, "slot %d's input", s);
    h->input = buf_alloc(g->dev, TIER_DEVICE, CAT_ACTIVATIONS, input_bytes(g), what);
    Carver c = {h->input.ptr, h->input.bytes};
    if (has_embed(g)) {
        sl->inputs = carve_words(&c, z.BT * sizeof(int32_t));
        sl->bucket_order = carve_words(&c, z.BT * sizeof(int32_t));
        sl->bucket_start = carve_words(&c, z.BT * sizeof(int32_t));
    }
    if (has_head(g)) sl->targets = carve_words(&c, z.BT * sizeof(int32_t));
    sl->x_in = carve(&c, z.R * z.C * z.ab);
    carved_whole(&c, what);
}

void held_chunk_input(GPT *g, int s, int j) {
    if (!dynamic(g) || g->held[s].chunk_in[j].ptr) return;  // arrived already
    Shapes z = shapes_of(g);
    char what[BUF_NAME_BYTES];
    snprintf(what, sizeof what, "slot %d's chunk %d input", s, j);
    g->held[s].chunk_in[j] = buf_alloc(g->dev, TIER_DEVICE, CAT_ACTIVATIONS, z.R * z.C * z.ab, what);
    g->slot[s].chunk_in[j] = g->held[s].chunk_in[j].ptr;
}

// The working set carved, and the pointers of block i of slot s that
// point into it (all but x3 under full recompute; the probabilities under
// selective with the materialized attention).
static void take_working(GPT *g, int i, int s) {
    size_t bytes = working_bytes(g);
    if (!bytes) return;
    g->working = buf_alloc(g->dev, TIER_DEVICE, CAT_ACT_WORKING, bytes, "recomputed block activations");
    Carver c = {g->working.ptr, g->working.bytes};
    carve_working(g, &c, shapes_of(g).att);
    carved_whole(&c, "recomputed block activations");
    LayerActs *la = &g->slot[s].layer[i];
    if (g->plan.recompute == GPT_RECOMPUTE_FULL) {
        act *x3 = la->x3;
        *la = g->work->live;
        la->x3 = x3;
    } else {
        la->att = g->work->live.att;
    }
}

static void take_block(GPT *g, int i, int s) {
    Shapes z = shapes_of(g);
    LayerActs *la = &g->slot[s].layer[i];
    Buf *b = &g->held[s].block[i];
    char what[BUF_NAME_BYTES];
    snprintf(what, sizeof what, "block %d's activations", plan_first_layer(&g->plan) + i);
    *b = buf_alloc(g->dev, TIER_DEVICE, CAT_ACTIVATIONS, block_bytes(g, i), what);
    Carver c = {b->ptr, b->bytes};
    memset(la, 0, sizeof *la);
    if (g->plan.recompute != GPT_RECOMPUTE_FULL) {
        carve_block_words(&c, la, z.R, drops_probabilities(&g->plan) ? 0 : z.att);
        carve_block_acts(g, &c, la);
    }
    la->x3 = i < stored_blocks(g) ? g->ckpt->buf[i % 2] : carve(&c, z.R * z.C * z.ab);
    carved_whole(&c, what);
}

static void take_head(GPT *g, int s) {
    Shapes z = shapes_of(g);
    GPTSlot *sl = &g->slot[s];
    Buf *b = &g->held[s].head;
    *b = buf_alloc(g->dev, TIER_DEVICE, CAT_ACTIVATIONS, head_bytes(g), "the head's activations");
    Carver c = {b->ptr, b->bytes};
    sl->lnf_mean = carve_words(&c, z.R * sizeof(float));
    sl->lnf_rstd = carve_words(&c, z.R * sizeof(float));
    sl->losses = carve_words(&c, z.BT * sizeof(float));
    sl->lnf = carve(&c, z.R * z.C * z.ab);
    sl->logits = tiled_loss(g) ? NULL : carve(&c, z.BT * z.Vp * z.ab);
    carved_whole(&c, "the head's activations");
}

static int block_of(const GPT *g, int u) {
    return u == GPT_UNIT_EMBED || u == gpt_unit_head(&g->L) ? -1 : u - 1 - plan_first_layer(&g->plan);
}

void held_before_forward(GPT *g, int u, int s) {
    if (!dynamic(g)) return;
    CHECK(g->held[s].input.ptr, "forward of unit %d in slot %d before its micro-batch came; hint: gpt_slot_tokens "
          "or gpt_slot_input first", u, s);
    g->held[s].forwarded = 1;
    int i = block_of(g, u);
    if (i >= 0) {
        take_block(g, i, s);
        take_working(g, i, s);  // what the block does not keep lives there while it runs
    } else if (u == gpt_unit_head(&g->L)) {
        take_head(g, s);
    }
}

void held_after_forward(GPT *g, int u, int s) {
    if (dynamic(g)) buf_free(g->dev, &g->working);
}

// W slot w's stash of block i (0-based in the range), as its B begins.
static void take_w_stash(GPT *g, int w, int i) {
    Buf *b = &g->w_held[w_index(g, w, i)];
    char what[BUF_NAME_BYTES];
    snprintf(what, sizeof what, "block %d's W stash", plan_first_layer(&g->plan) + i);
    *b = buf_alloc(g->dev, TIER_DEVICE, CAT_ACTIVATIONS, w_stash_bytes(g), what);
    Carver c = {b->ptr, b->bytes};
    WStash *ws = w_stash(g, w, i);
    carve_w_stash_words(g, &c, ws);
    carve_w_stash_acts(g, &c, ws);
    carved_whole(&c, what);
}

void held_before_backward(GPT *g, int u, int s, int w) {
    if (!dynamic(g)) return;
    let_go_grads(g);  // the last backward's, read by now (in stream order)
    const GPTLayout *l = &g->L;
    int i = block_of(g, u);
    if (i >= 0 && w >= 0) {  // zero bubble's B: no gradients of the block's weights here
        take_w_stash(g, w, i);
        return;
    }
    if (u != GPT_UNIT_EMBED) {
        char what[BUF_NAME_BYTES];
        snprintf(what, sizeof what, "unit %d's fp32 gradients", u);
        g->unit_grads = buf_alloc(g->dev, TIER_DEVICE, CAT_WORKSPACE, l->unit[u].count * sizeof(float), what);
    }
    if (u == gpt_unit_head(l) || (u == GPT_UNIT_EMBED && !g->embed_grads.ptr))
        g->embed_grads = buf_alloc(g->dev, TIER_DEVICE, CAT_WORKSPACE, l->unit[GPT_UNIT_EMBED].count * sizeof(float),
                                   "fp32 embedding gradients");
}

void held_before_weights(GPT *g, int u, int w) {
    if (!dynamic(g)) return;
    let_go_grads(g);
    char what[BUF_NAME_BYTES];
    snprintf(what, sizeof what, "unit %d's fp32 gradients", u);
    g->unit_grads = buf_alloc(g->dev, TIER_DEVICE, CAT_WORKSPACE, g->L.unit[u].count * sizeof(float), what);
}

void held_after_weights(GPT *g, int u, int w) {
    if (dynamic(g)) buf_free(g->dev, &g->w_held[w_index(g, w, block_of(g, u))]);
}

void held_before_recompute(GPT *g, int u, int s) {
    if (dynamic(g)) take_working(g, block_of(g, u), s);
}

void held_after_backward(GPT *g, int u, int s) {
    if (!dynamic(g)) return;
    buf_free(g->dev, &g->working);
    SlotHeld *h = &g->held[s];
    int i = block_of(g, u);
    if (i >= 0) buf_free(g->dev, &h->block[i]);
    else if (u == gpt_unit_head(&g->L)) buf_free(g->dev, &h->head);
    int stride = g->plan.chunk_stride, j = i >= 0 && g->plan.chunks > 1 && i % stride == 0 ? i / stride : 0;
    if (j > 0) {  // an interleaved chunk's first block: its input is read
        buf_free(g->dev, &h->chunk_in[j]);
        g->slot[s].chunk_in[j] = NULL;
    }
    if (u == g->plan.first_unit) let_go_slot(g, s);  // the micro-batch is done with
}

void held_pass_end(GPT *g) {
    if (!dynamic(g)) return;
    for (int s = 0; s < g->plan.slots; s++)
        if (g->held[s].forwarded) let_go_slot(g, s);
    let_go_grads(g);
}
