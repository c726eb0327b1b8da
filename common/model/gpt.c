// gpt.c: the model's activations (one slot per micro-batch in flight) and the
// forward and backward of one unit for one slot: the embeddings and the head
// in gpt_ends.c, blocks in gpt_block.c, the communication of tensor
// parallelism in gpt_tp.c.
#include "gpt.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "comm.h"
#include "gpt_units.h"

// Hands out consecutive pieces of one allocation. A bf16 activation piece
// (cuda) may be 2 mod 4 bytes long (BT*C*2 with BT and C odd), so the fp32 and
// int32 pieces of every slot come before any such piece and are checked to
// be 4-aligned.
void *carve(Carver *c, size_t bytes) {
    CHECK(bytes <= c->left, "activation layout overflow (%zu > %zu); hint: gpt_activation_bytes and gpt_alloc disagree", bytes, c->left);
    void *p = c->at;
    c->at += bytes;
    c->left -= bytes;
    return p;
}

// a piece read as fp32 or int32 by the kernels
void *carve_words(Carver *c, size_t bytes) {
    void *p = carve(c, bytes);
    CHECK(((uintptr_t)p & 3) == 0, "activation layout: a 4-byte piece at a 2-byte offset; hint: carve odd-sized bf16 pieces last in gpt_alloc");
    return p;
}

void gpt_check_tokens(const GPTConfig *c, int B, int T, GPTAttention a) {
    if ((double)B * T > GPT_MAX_TOKENS)
        fail_usage("--batch %d x --seq-len %d = %.0f tokens a micro-batch, more than this build's %d; lower --batch", B,
                   T, (double)B * T, GPT_MAX_TOKENS);
    double att = c ? (double)B * c->num_heads * T * (double)T * sizeof(float) : 0;
    if (a == GPT_ATTENTION_MATERIALIZED && att > GPT_MAX_ATTENTION_BYTES)
        fail_usage("--attention materialized at --seq-len %d keeps %.3g bytes of (T,T) probabilities a layer, more "
                   "than this build's limit of %.3g; use --attention flash, which keeps none", T, att,
                   GPT_MAX_ATTENTION_BYTES);
}

static void check_plan(const GPTLayout *l, const GPTPlan *p, const Comm *tp) {
    CHECK(p->B > 0 && p->T > 0 && p->slots > 0, "gpt_alloc: B %d, T %d and slots %d must be positive", p->B, p->T, p->slots);
    CHECK(p->first_unit >= 0 && p->first_unit <= p->last_unit && p->last_unit < l->num_units,
          "gpt_alloc: units %d..%d are not a range of the model's %d units", p->first_unit, p->last_unit, l->num_units);
    if (p->T > l->cfg.max_seq_len)
        fail_usage("--seq-len %d is longer than the model's context (%d)", p->T, l->cfg.max_seq_len);
    gpt_check_tokens(&l->cfg, p->B, p->T, p->attention);
    if (p->loss_tiles < 0 || (double)p->loss_tiles > (double)p->B * p->T)
        fail_usage("--tiled-loss %d: a micro-batch has %d tokens to split into chunks; give 1 to %d", p->loss_tiles,
                   p->B * p->T, p->B * p->T);
    if (p->mlp_tiles < 0 || (double)p->mlp_tiles > (double)p->B * p->T)
        fail_usage("--tiled-mlp %d: a micro-batch has %d tokens to split into chunks; give 1 to %d", p->mlp_tiles,
                   p->B * p->T, p->B * p->T);
    CHECK(!(p->offload_activations || p->partition_activations) || p->recompute == GPT_RECOMPUTE_FULL,
          "gpt_alloc: offload_activations and partition_activations move the blocks' saved inputs, which only full "
          "recompute keeps alone; hint: --recompute full");
    CHECK(!(p->partition_activations || p->sequence_parallel) ||
          (l->tp_size > 1 && (size_t)p->B * p->T % (size_t)l->tp_size == 0),
          "gpt_alloc: partition_activations and sequence_parallel split the B*T = %d tokens over tp %d ranks; hint: "
          "a tp group, and B*T a multiple of it", p->B * p->T, l->tp_size);
    CHECK(!(p->partition_activations && p->sequence_parallel), "gpt_alloc: sequence_parallel already splits the "
          "blocks' inputs over the tp group; hint: leave out partition_activations");
    int heads = l->cfg.num_heads / l->tp_size, cp = gpt_plan_cp(p);
    CHECK(cp == 1 || (p->attention == GPT_ATTENTION_FLASH && (p->cp_ring || heads % cp == 0) && p->cp_rank >= 0 &&
                      p->cp_rank < cp && (double)p->T * cp <= l->cfg.max_seq_len && (!p->cp_ring || p->T % 2 == 0)),
          "gpt_alloc: %s over %d ranks needs flash attention, (Ulysses) the rank's %d heads a multiple of it, a "
          "rank below it (%d), %d x %d positions in the context (%d) and (ring) two chunks of equal length",
          p->cp_ring ? "ring attention" : "Ulysses", cp, heads, p->cp_rank, cp, p->T, l->cfg.max_seq_len);
    int v = gpt_plan_chunks(p), first = (p->first_unit > 1 ? p->first_unit : 1) - 1;
    int end = p->last_unit < gpt_unit_head(l) ? p->last_unit : gpt_unit_head(l) - 1;
    CHECK(v == 1 || (v <= GPT_MAX_CHUNKS && p->chunk_blocks > 0 && p->chunk_stride > p->chunk_blocks &&
                     first + (v - 1) * p->chunk_stride + p->chunk_blocks == end && !p->w_slots &&
                     !p->offload_activations && !p->partition_activations),
          "gpt_alloc: %d chunks of %d blocks %d apart do not end the range's blocks %d..%d (or come with W slots, "
          "offloaded or partitioned checkpoints)", v, p->chunk_blocks, p->chunk_stride, first, end - 1);
    CHECK(p->w_slots >= 0 && !(p->w_slots && p->mlp_tiles), "gpt_alloc: %d W slots: zero bubble's W reads each "
          "block's GELU output, which the tiled MLP keeps a chunk at a time; hint: no mlp_tiles", p->w_slots);
    CHECK(l->tp_size == 1 || (tp && tp->size == l->tp_size && tp->rank == l->tp_rank),
          "gpt_alloc: a layout of tp rank %d of %d needs its tensor-parallel group (here %s); hint: comm_split "
          "the ranks of one tp group, ordered by tp rank", l->tp_rank, l->tp_size, tp ? "another size or rank" : "none");
}

// A block's fp32 pieces (the layernorms' statistics of its R rows, then
// the attention probabilities unless `att` is 0).
void carve_block_words(Carver *c, LayerActs *la, size_t R, size_t att) {
    la->ln1_mean = carve_words(c, R * sizeof(float));
    la->ln1_rstd = carve_words(c, R * sizeof(float));
    la->ln2_mean = carve_words(c, R * sizeof(float));
    la->ln2_rstd = carve_words(c, R * sizeof(float));
    if (att) la->att = carve_words(c, att);
}

// A block's activation pieces but x3: the layernorms' and x2 on the R rows
// of the residual stream this rank holds, the tensor-parallel region's on BT.
void carve_block_acts(GPT *g, Carver *c, LayerActs *la) {
    size_t BT = (size_t)g->plan.B * g->plan.T, R = (size_t)res_rows(g), ab = g->dev->act_bytes;
    size_t C = g->L.cfg.channels, Cp = C / g->L.tp_size, F = 4 * C / g->L.tp_size;
    la->ln1 = carve(c, R * C * ab);
    la->qkv = carve(c, BT * 3 * Cp * ab);
    la->atty = carve(c, BT * Cp * ab);
    if (gpt_plan_ulysses(&g->plan)) la->atth = carve(c, BT * Cp * ab);
    la->x2 = carve(c, R * C * ab);
    la->ln2 = carve(c, R * C * ab);
    if (g->plan.mlp_tiles) return;  // the MLP's chunk is the shared one (GPTWork.mlp_pre, mlp_gelu)
    la->fch = carve(c, BT * F * ab);
    la->fch_gelu = carve(c, BT * F * ab);
}

// The recomputation's working set: what a block does not save (the
// materialized attention's probabilities under selective, all but x3 under
// full), which every block of every slot points to; the block's forward
// writes it and its backward recomputes it first (block_recompute).
int drops_probabilities(const GPTPlan *p) {
    return p->recompute == GPT_RECOMPUTE_SELECTIVE && p->attention == GPT_ATTENTION_MATERIALIZED;
}

void carve_working(GPT *g, Carver *cw, size_t att) {
    LayerActs *live = &g->work->live;
    if (drops_probabilities(&g->plan)) live->att = carve_words(cw, att);
    if (g->plan.recompute != GPT_RECOMPUTE_FULL) return;
    carve_block_words(cw, live, (size_t)res_rows(g), att);
    carve_block_acts(g, cw, live);
}

// Zero bubble's W stash of a block (gpt_units.h's WStash): the layernorms'
// gradients (fp32) apart, before any odd-sized piece; then the linears'
// inputs and output gradients, each on all B·T rows.
void carve_w_stash_words(GPT *g, Carver *c, WStash *w) {
    const size_t *o = g->L.blk_off;
    w->ln = carve_words(c, (o[BLK_LN1B + 1] - o[BLK_LN1W] + o[BLK_LN2B + 1] - o[BLK_LN2W]) * sizeof(float));
}

void carve_w_stash_acts(GPT *g, Carver *c, WStash *w) {
    size_t BT = (size_t)g->plan.B * g->plan.T, ab = g->dev->act_bytes;
    size_t C = g->L.cfg.channels, Cp = C / g->L.tp_size, F = 4 * C / g->L.tp_size;
    w->in_qkv = carve(c, BT * C * ab);
    w->in_att = carve(c, BT * Cp * ab);
    w->in_fc = carve(c, BT * C * ab);
    w->in_proj = carve(c, BT * F * ab);
    w->d_qkv = carve(c, BT * 3 * Cp * ab);
    w->d_att = carve(c, BT * C * ab);
    w->d_fc = carve(c, BT * F * ab);
    w->d_proj = carve(c, BT * C * ab);
}

static int w_stashes(const GPT *g) {
    return g->plan.w_slots > 0 ? g->plan.w_slots * plan_range_blocks(&g->plan, g->L.cfg.num_layers) : 0;
}

// Every slot's fp32 and int32 pieces first, then the shared fp32 pieces,
// then every slot's activation pieces (in bf16 on cuda one may be 2 mod 4
// bytes long), then the shared temporary. A block saves what the plan's
// recompute keeps; the rest of its pointers go to the working set.
static void carve_activations(GPT *g, Carver *ca, Carver *cw) {
    const GPTPlan *p = &g->plan;
    const GPTConfig *c = &g->L.cfg;
    size_t tp = g->L.tp_size, BT = (size_t)p->B * p->T, R = (size_t)res_rows(g), C = c->channels;
    size_t Vp = (size_t)gpt_logits_stride(&g->L);
    size_t ab = g->dev->act_bytes, fb = sizeof(float), att = gpt_attention_saved_bytes(&g->L, p);
    int nl = plan_end_layer(p, c->num_layers) - plan_first_layer(p);
    int embed = plan_has_unit(p, GPT_UNIT_EMBED), head = plan_has_unit(p, gpt_unit_head(&g->L));
    if (nl > 0) carve_working(g, cw, att);
    GPTRecompute rc = p->recompute;
    for (int s = 0; s < p->slots; s++) {
        GPTSlot *sl = &g->slot[s];
        for (int i = 0; i < nl; i++) {
            LayerActs *la = &sl->layer[i];
            if (!plan_owns_block(p, i)) continue;  // another stage's, between two chunks
            if (rc == GPT_RECOMPUTE_FULL) *la = g->work->live;
            else carve_block_words(ca, la, R, drops_probabilities(p) ? 0 : att);
            if (drops_probabilities(p)) la->att = g->work->live.att;
        }
        if (head) {
            sl->lnf_mean = carve_words(ca, R * fb);
            sl->lnf_rstd = carve_words(ca, R * fb);
            sl->losses = carve_words(ca, BT * fb);
        }
        if (embed) {
            sl->inputs = carve_words(ca, BT * sizeof(int32_t));
            sl->bucket_order = carve_words(ca, BT * sizeof(int32_t));
            sl->bucket_start = carve_words(ca, BT * sizeof(int32_t));
        }
        if (head) sl->targets = carve_words(ca, BT * sizeof(int32_t));
    }
    if (head && tp > 1) {
        g->work->ce_max = carve_words(ca, BT * fb);
        g->work->ce_sums = carve_words(ca, 2 * BT * fb);
    }
    for (int k = 0; k < w_stashes(g); k++) carve_w_stash_words(g, ca, &g->wstash[k]);
    // inputs kept in the checkpoint store: x3 of every block but the last is one of the ring's two
    act *ring[2] = {NULL, NULL};
    int stored = (p->offload_activations || p->partition_activations) && nl > 1 ? nl - 1 : 0;
    size_t part = R * C * ab / (p->partition_activations ? tp : 1);
    if (stored)
        for (int k = 0; k < 2; k++) ring[k] = carve(ca, R * C * ab);
    for (int s = 0; s < p->slots; s++) {
        GPTSlot *sl = &g->slot[s];
        for (int i = 0; i < nl; i++) {
            LayerActs *la = &sl->layer[i];
            if (!plan_owns_block(p, i)) continue;
            if (rc != GPT_RECOMPUTE_FULL) carve_block_acts(g, ca, la);
            la->x3 = i < stored ? ring[i % 2] : carve(ca, R * C * ab);
        }
        sl->x_in = carve(ca, R * C * ab);
        for (int j = 1; j < gpt_plan_chunks(p); j++) sl->chunk_in[j] = carve(ca, R * C * ab);
        if (head) {
            sl->lnf = carve(ca, R * C * ab);
            if (!p->loss_tiles) sl->logits = carve(ca, BT * Vp * ab);
        }
    }
    g->work->tmp = carve(ca, BT * C * ab);
    if (head && p->loss_tiles) g->work->logits_tile = carve(ca, (size_t)gpt_loss_tile_rows(p) * Vp * ab);
    if (nl > 0 && p->mlp_tiles) {
        size_t F = 4 * C / tp, n = (size_t)gpt_mlp_tile_rows(p);
        g->work->mlp_pre = carve(ca, n * F * ab);
        g->work->mlp_gelu = carve(ca, n * F * ab);
    }
    if (p->sequence_parallel) {
        g->work->gathered = carve(ca, BT * C * ab);
        g->work->part = carve(ca, R * C * ab);
    }
    for (int k = 0; k < w_stashes(g); k++) carve_w_stash_acts(g, ca, &g->wstash[k]);
    if (stored) ckpt_store_init(g, ring[0], ring[1], (size_t)stored * (size_t)p->slots * part);
}

void gpt_alloc(GPT *g, const GPTLayout *l, Device *dev, const GPTPlan *p, Comm *tp) {
    check_plan(l, p, tp);
    memset(g, 0, sizeof *g);
    g->L = *l;
    g->plan = *p;
    g->dev = dev;
    g->tp = l->tp_size > 1 ? tp : NULL;
    size_t BT = (size_t)p->B * p->T, C = l->cfg.channels, F = 4 * C / l->tp_size;
    size_t ab = dev->act_bytes, fb = sizeof(float), R = (size_t)res_rows(g);
    GPTActBytes sizes = gpt_activation_bytes(l, p, dev->act_bytes);
    int nl = plan_end_layer(p, l->cfg.num_layers) - plan_first_layer(p);

    g->slot = xcalloc((size_t)p->slots, sizeof(GPTSlot));
    for (int s = 0; s < p->slots; s++) {
        g->slot[s].layer = xcalloc(nl > 0 ? (size_t)nl : 1, sizeof(LayerActs));
        g->slot[s].micro = -1;
    }
    g->work = xcalloc(1, sizeof(GPTWork));
    g->work->embed_grads_slot = -1;
    if (w_stashes(g)) {
        g->wstash = xcalloc((size_t)w_stashes(g), sizeof(WStash));
        g->w_micro = xmalloc((size_t)w_stashes(g) * sizeof(int));
        for (int k = 0; k < w_stashes(g); k++) g->w_micro[k] = -1;
    }
    if (p->contiguous) {  // ZeRO-R's contiguous buffers: every slot's, carved once
        g->acts = buf_alloc(dev, TIER_DEVICE, CAT_ACTIVATIONS, sizes.total_saved, "activations");
        if (sizes.working)
            g->working = buf_alloc(dev, TIER_DEVICE, CAT_ACT_WORKING, sizes.working, "recomputed block activations");
        Carver ca = {g->acts.ptr, g->acts.bytes}, cw = {g->working.ptr, g->working.bytes};
        carve_activations(g, &ca, &cw);
        CHECK(ca.left == 0 && cw.left == 0, "activation layout: %zu + %zu bytes left over; hint: "
              "gpt_activation_bytes and gpt_alloc disagree", ca.left, cw.left);
    } else {
        held_alloc(g);  // the shared temporaries; the rest as the units produce it (gpt_held.c)
    }

    g->scratch = buf_alloc(dev, TIER_DEVICE, CAT_WORKSPACE, sizes.backward_scratch, "backward scratch");
    Carver cs = {g->scratch.ptr, g->scratch.bytes};
    for (int s = 0; s < p->slots; s++) g->slot[s].dres = carve(&cs, R * C * ab);
    g->work->dc = carve(&cs, BT * C * ab);
    g->work->d4a = carve(&cs, BT * F * ab);
    g->work->d4b = carve(&cs, (size_t)gpt_mlp_tile_rows(p) * F * ab);  // one chunk's under the tiled MLP
    carve_seq_work(g, &cs);

    size_t unit_max = 0;  // unit_grads: the largest unit of the range but the embeddings (embed_grads)
    for (int u = p->first_unit > 1 ? p->first_unit : 1; u <= p->last_unit; u++)
        if (l->unit[u].count > unit_max) unit_max = l->unit[u].count;
    if (unit_max && p->contiguous)
        g->unit_grads = buf_alloc(dev, TIER_DEVICE, CAT_WORKSPACE, unit_max * fb, "fp32 unit gradients");
    if (p->contiguous && (plan_has_unit(p, GPT_UNIT_EMBED) || plan_has_unit(p, gpt_unit_head(l))))
        g->embed_grads = buf_alloc(dev, TIER_DEVICE, CAT_WORKSPACE, l->unit[GPT_UNIT_EMBED].count * fb, "fp32 embedding gradients");
    g->losses = (Buf){0};
    g->losses_queued = 0;
    g->tokens = buf_alloc(dev, TIER_PINNED, CAT_WORKSPACE, 8 * BT * sizeof(int32_t), "token ids on their way up");
    for (int k = 0; k < 2; k++) dev->ops->event_create(dev, &g->tokens_copied[k]);
}

void gpt_free(GPT *g) {
    if (!g->slot) return;
    ckpt_store_free(g);
    held_free(g);
    buf_free(g->dev, &g->acts);
    buf_free(g->dev, &g->working);
    buf_free(g->dev, &g->scratch);
    if (g->unit_grads.ptr) buf_free(g->dev, &g->unit_grads);
    if (g->embed_grads.ptr) buf_free(g->dev, &g->embed_grads);
    buf_free(g->dev, &g->losses);
    dev_sync(g->dev, STREAM_COMPUTE);  // the last token copies read the staging
    buf_free(g->dev, &g->tokens);
    for (int k = 0; k < 2; k++) g->dev->ops->event_destroy(g->dev, &g->tokens_copied[k]);
    for (int s = 0; s < g->plan.slots; s++) free(g->slot[s].layer);
    free(g->wstash);
    free(g->w_micro);
    free(g->slot);
    free(g->work);
    g->slot = NULL;
}

// ---- slots ----

static GPTSlot *slot_of(GPT *g, int s) {
    CHECK(s >= 0 && s < g->plan.slots, "slot %d: the plan has %d slots", s, g->plan.slots);
    return &g->slot[s];
}

// The ids cross PCIe from pinned memory (from pageable memory a GPU's
// driver would copy through a buffer of its own and make the host wait):
// two staging areas in turn, so the host writes one while the other's copy
// may still be queued.
void gpt_slot_tokens(GPT *g, int s, const int32_t *inputs, const int32_t *targets, float dloss_scale) {
    GPTSlot *sl = slot_of(g, s);
    held_slot_input(g, s);
    size_t BT = (size_t)g->plan.B * g->plan.T, bytes = BT * sizeof(int32_t);
    int k = g->tokens_next;
    g->tokens_next ^= 1;
    g->dev->ops->event_sync(g->dev, &g->tokens_copied[k]);
    int32_t *stage = (int32_t *)g->tokens.ptr + 4 * BT * (size_t)k;  // inputs, targets, bucket order and starts
    if (sl->inputs) {
        CHECK(inputs, "gpt_slot_tokens: the plan has the embeddings, which need the input tokens");
        memcpy(stage, inputs, bytes);
        dev_copy(g->dev, sl->inputs, stage, bytes, STREAM_COMPUTE);
        // the embeddings' backward sums wte's rows by these (no atomics),
        // built beside the ids in the same pinned area
        int32_t *order = stage + 2 * BT, *start = stage + 3 * BT;
        sl->buckets = token_buckets_build(inputs, (int)BT, order, start);
        dev_copy(g->dev, sl->bucket_order, order, bytes, STREAM_COMPUTE);
        dev_copy(g->dev, sl->bucket_start, start, bytes, STREAM_COMPUTE);
    }
    if (sl->targets) {
        CHECK(targets, "gpt_slot_tokens: the plan has the head, which needs the targets");
        memcpy(stage + BT, targets, bytes);
        dev_copy(g->dev, sl->targets, stage + BT, bytes, STREAM_COMPUTE);
    }
    g->dev->ops->event_record(g->dev, &g->tokens_copied[k], STREAM_COMPUTE);
    sl->dloss_scale = dloss_scale;
}

// Room for n micro-batches' losses in pinned memory (a device copies into it
// without stopping the host). Growing keeps what is queued: it waits for the
// copies first. The first step grows it to the step's micro-batches.
static void losses_room(GPT *g, int n) {
    size_t BT = (size_t)g->plan.B * g->plan.T, bytes = (size_t)n * BT * sizeof(float);
    if (bytes <= g->losses.bytes) return;
    Buf grown = buf_alloc(g->dev, TIER_PINNED, CAT_WORKSPACE, 2 * bytes, "losses read back");
    if (g->losses_queued) {
        dev_sync(g->dev, STREAM_COMPUTE);
        memcpy(grown.ptr, g->losses.ptr, (size_t)g->losses_queued * BT * sizeof(float));
    }
    buf_free(g->dev, &g->losses);
    g->losses = grown;
}

void gpt_slot_loss_queue(GPT *g, int s) {
    GPTSlot *sl = slot_of(g, s);
    CHECK(sl->losses, "gpt_slot_loss: the plan has no head; hint: the loss is on the last pipeline stage");
    size_t BT = (size_t)g->plan.B * g->plan.T;
    losses_room(g, g->losses_queued + 1);
    dev_copy(g->dev, (float *)g->losses.ptr + (size_t)g->losses_queued * BT, sl->losses, BT * sizeof(float),
             STREAM_COMPUTE);
    g->losses_queued++;
}

double gpt_losses_take(GPT *g) {
    if (!g->losses_queued) return 0;
    dev_sync(g->dev, STREAM_COMPUTE);
    size_t BT = (size_t)g->plan.B * g->plan.T;
    const float *l = g->losses.ptr;
    double total = 0;
    for (int m = 0; m < g->losses_queued; m++) {
        double sum = 0;
        for (size_t i = 0; i < BT; i++) sum += l[m * BT + i];
        total += sum / BT;
    }
    g->losses_queued = 0;
    return total;
}

double gpt_slot_loss(GPT *g, int s) {
    gpt_slot_loss_queue(g, s);
    return gpt_losses_take(g);
}

size_t gpt_residual_elems(const GPT *g) { return (size_t)res_rows(g) * g->L.cfg.channels; }
void *gpt_slot_input(GPT *g, int s) {
    GPTSlot *sl = slot_of(g, s);
    held_slot_input(g, s);  // a pipeline stage receives its input here, before the micro-batch's tokens
    return sl->x_in;
}

void gpt_pass_end(GPT *g) { held_pass_end(g); }
void *gpt_slot_output(GPT *g, int s) {
    slot_of(g, s);
    return block_input(g, plan_end_layer(&g->plan, g->L.cfg.num_layers), s);
}

void *gpt_slot_chunk_input(GPT *g, int s, int j) {
    CHECK(j >= 0 && j < gpt_plan_chunks(&g->plan), "chunk %d of a plan of %d", j, gpt_plan_chunks(&g->plan));
    if (j == 0) return gpt_slot_input(g, s);
    GPTSlot *sl = slot_of(g, s);
    held_chunk_input(g, s, j);
    return sl->chunk_in[j];
}

// chunk j's last block's output: what the block after it would read
void *gpt_slot_chunk_output(GPT *g, int s, int j) {
    CHECK(j >= 0 && j < gpt_plan_chunks(&g->plan), "chunk %d of a plan of %d", j, gpt_plan_chunks(&g->plan));
    if (j == gpt_plan_chunks(&g->plan) - 1) return gpt_slot_output(g, s);
    slot_of(g, s);
    return g->slot[s].layer[j * g->plan.chunk_stride + g->plan.chunk_blocks - 1].x3;
}

int gpt_plan_units(const GPTPlan *p) {
    int n = 0;
    for (int u = p->first_unit; u <= p->last_unit; u++) n += plan_has_unit(p, u);
    return n;
}
void *gpt_slot_grad(GPT *g, int s) { return slot_of(g, s)->dres; }

// ---- one unit, one slot ----

// The embeddings' backward scatters the gradient into wte and wpe rows: it
// reads no parameters (p may be NULL).
static void check_unit(const GPT *g, int u, int s, const bf16 *p, const bf16 *embed, int backward) {
    const char *what = backward ? "backward" : "forward";
    CHECK(plan_has_unit(&g->plan, u), "%s of unit %d: this rank computes units %d..%d", what, u, g->plan.first_unit,
          g->plan.last_unit);
    CHECK(s >= 0 && s < g->plan.slots, "%s of unit %d: slot %d of %d", what, u, s, g->plan.slots);
    int needs_p = !(backward && u == GPT_UNIT_EMBED);
    CHECK((p || !needs_p) && (embed || u != gpt_unit_head(&g->L)), "%s of unit %d without its parameters%s", what,
          u, p ? " (the head reads the embeddings' too: wte is its output projection)" : "");
}

// The unit's compute goes on the trace's compute row; the checkpoints'
// copies to and from their store (gpt_checkpoints.c) are left out of it, so
// their overlap with compute means what it says.
// The memory timeline's phase (mem.h): this unit of this slot's micro-batch,
// a validation's forward where the trainer said one is running.
static void set_phase(GPT *g, MemPhaseKind kind, int u, int s) {
    MemCtx *m = &g->dev->mem;
    if (kind == PHASE_FORWARD && m->phase.kind == PHASE_EVAL) kind = PHASE_EVAL;
    mem_set_phase(m, kind, u, g->slot[s].micro);
}

void gpt_slot_micro_batch(GPT *g, int s, int micro) { slot_of(g, s)->micro = micro; }

void gpt_unit_forward(GPT *g, int u, int s, const bf16 *p, const bf16 *embed) {
    check_unit(g, u, s, p, embed, 0);
    set_phase(g, PHASE_FORWARD, u, s);
    g->units_run++;
    int i = u - 1 - plan_first_layer(&g->plan);  // a block's place in the range
    int block = u != GPT_UNIT_EMBED && u != gpt_unit_head(&g->L);
    held_before_forward(g, u, s);
    if (block) ckpt_before_forward(g, i, s);
    DevSpan sp = dev_span_begin(g->dev, STREAM_COMPUTE);
    if (u == GPT_UNIT_EMBED) embed_forward(g, p, s);
    else if (!block) head_forward(g, p, embed, s);
    else block_forward(g, p, u - 1, s);
    dev_span_end(g->dev, &sp, TRACE_TID_COMPUTE, "forward", 0);
    if (block) ckpt_after_forward(g, i, s);  // its x3 (or the rank's part) to the store, when it is kept there
    held_after_forward(g, u, s);
}

// A unit's backward; w >= 0: zero bubble's B of a block, into W slot w.
static const float *unit_backward(GPT *g, int u, int s, const bf16 *p, const bf16 *embed, int w) {
    check_unit(g, u, s, p, embed, 1);
    int block = u != GPT_UNIT_EMBED && u != gpt_unit_head(&g->L), i = u - 1 - plan_first_layer(&g->plan);
    WStash *ws = NULL;
    if (block && w >= 0) {
        int *held = &g->w_micro[w_index(g, w, i)];
        CHECK(*held < 0, "B of unit %d, micro-batch %d, into W slot %d, which still holds micro-batch %d's: its W has "
              "not run", u, g->slot[s].micro, w, *held);
        *held = g->slot[s].micro;
        ws = w_stash(g, w, i);
    }
    set_phase(g, PHASE_BACKWARD, u, s);
    g->units_run++;
    g->backwards_run++;
    held_before_backward(g, u, s, ws ? w : -1);
    if (u == gpt_unit_head(&g->L)) ckpt_before_head_backward(g, s);  // the last block's input starts back
    else if (u != GPT_UNIT_EMBED) ckpt_before_backward(g, i, s);    // and ahead
    DevSpan sp = dev_span_begin(g->dev, STREAM_COMPUTE);
    const float *grads;
    if (u == gpt_unit_head(&g->L)) {
        head_backward(g, p, embed, s);
        grads = g->unit_grads.ptr;
    } else if (u == GPT_UNIT_EMBED) {
        embed_backward(g, s);
        grads = g->embed_grads.ptr;
    } else {
        float *ug = ws ? NULL : g->unit_grads.ptr;  // B leaves the unit's gradients to W
        if (ug) dev_memset0(g->dev, ug, g->L.unit[u].count * sizeof(float), STREAM_COMPUTE);
        if (g->plan.recompute != GPT_RECOMPUTE_NONE) {
            // the recompute on its own span, then the backward's after it
            dev_span_end(g->dev, &sp, TRACE_TID_COMPUTE, "backward", 0);
            sp = dev_span_begin(g->dev, STREAM_COMPUTE);
            set_phase(g, PHASE_RECOMPUTE, u, s);
            held_before_recompute(g, u, s);
            block_recompute_metered(g, p, u - 1, s);  // what the plan's recompute did not keep, again
            dev_span_end(g->dev, &sp, TRACE_TID_COMPUTE, "recompute", 0);
            set_phase(g, PHASE_BACKWARD, u, s);
            sp = dev_span_begin(g->dev, STREAM_COMPUTE);
        }
        block_backward(g, p, ug, u - 1, s, ws);
        grads = ug;
    }
    dev_span_end(g->dev, &sp, TRACE_TID_COMPUTE, "backward", 0);
    held_after_backward(g, u, s);
    return grads;
}

const float *gpt_unit_backward(GPT *g, int u, int s, const bf16 *p, const bf16 *embed) {
    return unit_backward(g, u, s, p, embed, -1);
}

const float *gpt_unit_backward_input(GPT *g, int u, int s, int w, const bf16 *p, const bf16 *embed) {
    CHECK(w >= 0 && w < g->plan.w_slots, "B of unit %d into W slot %d: the plan has %d (zero bubble's w_slots)", u, w,
          g->plan.w_slots);
    return unit_backward(g, u, s, p, embed, w);
}

const float *gpt_unit_backward_weights(GPT *g, int u, int w) {
    int i = u - 1 - plan_first_layer(&g->plan);
    CHECK(plan_has_unit(&g->plan, u) && u != GPT_UNIT_EMBED && u != gpt_unit_head(&g->L) && w >= 0 &&
          w < g->plan.w_slots, "W of unit %d from W slot %d: zero bubble splits the blocks %d..%d, over %d W slots", u,
          w, plan_first_layer(&g->plan) + 1, plan_end_layer(&g->plan, g->L.cfg.num_layers), g->plan.w_slots);
    int *held = &g->w_micro[w_index(g, w, i)];
    CHECK(*held >= 0, "W of unit %d from W slot %d before a B left it anything; hint: each W after its B", u, w);
    mem_set_phase(&g->dev->mem, PHASE_WEIGHTS, u, *held);
    held_before_weights(g, u, w);
    float *ug = g->unit_grads.ptr;
    DevSpan sp = dev_span_begin(g->dev, STREAM_COMPUTE);
    dev_memset0(g->dev, ug, g->L.unit[u].count * sizeof(float), STREAM_COMPUTE);
    block_backward_weights(g, ug, w_stash(g, w, i));
    dev_span_end(g->dev, &sp, TRACE_TID_COMPUTE, "weights", 0);
    held_after_weights(g, u, w);
    *held = -1;
    return ug;
}
