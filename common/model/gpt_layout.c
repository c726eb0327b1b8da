// gpt_layout.c: GPT-2 shapes, the flat parameter layout (whole, or one rank's
// part under tensor parallelism), and the FLOP and activation counts that
// reports set beside measurements. What each element is and its initial
// value: gpt_params.c.
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "gpt.h"

typedef struct Preset {
    const char *name;
    GPTConfig cfg;  // max_seq_len, vocab_size, num_layers, num_heads, channels
} Preset;

// tiny and small are ours (fast enough for tests on two cores); the gpt2-*
// shapes are GPT-2's (Radford et al., 2019) with its 50257-token vocabulary.
static const Preset PRESETS[] = {
    {"tiny", {32, 256, 2, 2, 32}},
    {"small", {64, 256, 4, 4, 128}},
    {"gpt2-124m", {1024, 50257, 12, 12, 768}},
    {"gpt2-350m", {1024, 50257, 24, 16, 1024}},
    {"gpt2-774m", {1024, 50257, 36, 20, 1280}},
    {"gpt2-1558m", {1024, 50257, 48, 25, 1600}},
};
#define NPRESETS (int)(sizeof PRESETS / sizeof PRESETS[0])

int gpt_preset(const char *name, GPTConfig *cfg) {
    for (int i = 0; i < NPRESETS; i++)
        if (strcmp(PRESETS[i].name, name) == 0) {
            *cfg = PRESETS[i].cfg;
            return 1;
        }
    return 0;
}

const char *gpt_preset_names(void) { return "tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m"; }

// Fills off[0..n] with running offsets of tensors whose sizes are given.
static size_t lay_out(size_t *off, const size_t *sizes, int n) {
    off[0] = 0;
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + sizes[i];
    return off[n];
}

// Tensor sizes of one block and of the embeddings for tensor-parallel
// degree tp (1: the whole model). Column-parallel tensors keep 1/tp of their
// output rows, row-parallel ones 1/tp of their input columns; wte keeps
// vocab_part rows.
static void tensor_sizes(const GPTConfig *c, int tp, int vocab_part, size_t blk[BLK_NTENSORS], size_t emb[EMB_NTENSORS]) {
    size_t C = (size_t)c->channels, Cp = C / tp, F = 4 * C / tp;
    size_t b[BLK_NTENSORS] = {C, C, 3 * Cp * C, 3 * Cp, C * Cp, C, C, C, F * C, F, C * F, C};
    memcpy(blk, b, sizeof b);
    emb[EMB_WTE] = (size_t)vocab_part * C;
    emb[EMB_WPE] = (size_t)c->max_seq_len * C;
}

static void check_shape(const GPTConfig *c, int tp_size, int tp_rank) {
    if (c->channels <= 0 || c->num_layers <= 0 || c->num_heads <= 0 || c->vocab_size <= 0 || c->max_seq_len <= 0)
        fail_usage("model sizes must be positive (layers %d, d-model %d, heads %d, vocab %d, seq %d)",
                   c->num_layers, c->channels, c->num_heads, c->vocab_size, c->max_seq_len);
    if (c->channels % c->num_heads != 0)
        fail_usage("--heads %d does not divide --d-model %d; pick heads that divide it", c->num_heads, c->channels);
    if (c->num_layers + 2 > GPT_MAX_UNITS)
        fail_usage("--layers %d is more than this build supports (%d)", c->num_layers, GPT_MAX_UNITS - 2);
    if (c->channels > GPT_MAX_CHANNELS || c->num_heads > GPT_MAX_HEADS || c->vocab_size > GPT_MAX_VOCAB ||
        c->max_seq_len > GPT_MAX_CONTEXT)
        fail_usage("model sizes beyond this build's limits (d-model %d of %d, heads %d of %d, vocab %d of %d, "
                   "context %d of %d); give smaller ones", c->channels, GPT_MAX_CHANNELS, c->num_heads, GPT_MAX_HEADS,
                   c->vocab_size, GPT_MAX_VOCAB, c->max_seq_len, GPT_MAX_CONTEXT);
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
        fail_usage("tensor-parallel rank %d of %d ranks; --tp must be at least 1", tp_rank, tp_size);
    if (c->num_heads % tp_size != 0)  // then 4C (= 4 heads x head size) divides too
        fail_usage("--tp %d does not divide --heads %d: tensor parallelism splits the heads; pick a --tp that divides them",
                   tp_size, c->num_heads);
}

void gpt_layout_tp(GPTLayout *l, const GPTConfig *cfg, int tp_size, int tp_rank) {
    check_shape(cfg, tp_size, tp_rank);
    memset(l, 0, sizeof *l);
    l->cfg = *cfg;
    l->tp_size = tp_size;
    l->tp_rank = tp_rank;
    l->vocab_padded = gpt_vocab_padded(cfg->vocab_size, tp_size);
    l->vocab_part = l->vocab_padded / tp_size;
    l->vocab_begin = tp_rank * l->vocab_part;
    size_t emb[EMB_NTENSORS], blk[BLK_NTENSORS], head[HEAD_NTENSORS] = {(size_t)cfg->channels, (size_t)cfg->channels};
    tensor_sizes(cfg, 1, gpt_vocab_padded(cfg->vocab_size, 1), blk, emb);
    lay_out(l->whole_emb_off, emb, EMB_NTENSORS);
    lay_out(l->whole_blk_off, blk, BLK_NTENSORS);
    tensor_sizes(cfg, tp_size, l->vocab_part, blk, emb);
    size_t emb_n = lay_out(l->emb_off, emb, EMB_NTENSORS);
    size_t blk_n = lay_out(l->blk_off, blk, BLK_NTENSORS);
    size_t head_n = lay_out(l->head_off, head, HEAD_NTENSORS);
    l->num_units = cfg->num_layers + 2;
    size_t at = 0;
    for (int u = 0; u < l->num_units; u++) {
        size_t n = u == 0 ? emb_n : (u == l->num_units - 1 ? head_n : blk_n);
        l->unit[u] = (Range){at, n};
        at += n;
        if (n > l->max_unit_params) l->max_unit_params = n;
    }
    l->num_params = at;
}

void gpt_layout(GPTLayout *l, const GPTConfig *cfg) { gpt_layout_tp(l, cfg, 1, 0); }

int gpt_vocab_padded(int vocab, int tp_size) {
    int align = tp_size % 2 == 0 ? 64 * tp_size : 128 * tp_size;  // lcm(128, 64 tp)
    return (vocab + align - 1) / align * align;
}

int gpt_real_vocab_rows(const GPTLayout *l) {
    int n = l->cfg.vocab_size - l->vocab_begin;
    return n < 0 ? 0 : n < l->vocab_part ? n : l->vocab_part;
}

size_t gpt_padding_params(const GPTLayout *l) {
    return (size_t)(l->vocab_part - gpt_real_vocab_rows(l)) * (size_t)l->cfg.channels;
}

int gpt_unit_reads(const GPTLayout *l, int u, int out[2]) {
    out[0] = u;
    if (u == gpt_unit_head(l)) {
        out[1] = GPT_UNIT_EMBED;  // the output projection is wte (weight tying)
        return 2;
    }
    return 1;
}

const char *gpt_unit_name(const GPTLayout *l, int u, char *buf, size_t n) {
    if (u == GPT_UNIT_EMBED) snprintf(buf, n, "embed");
    else if (u == gpt_unit_head(l)) snprintf(buf, n, "head");
    else snprintf(buf, n, "block %d", u - 1);
    return buf;
}

double gpt_flops_per_token(const GPTLayout *l, int T) {
    const GPTConfig *c = &l->cfg;
    double C = c->channels, L = c->num_layers;
    double matmul_params = L * 12.0 * C * C + (double)c->vocab_size * C;  // qkv 3C², proj C², fc 4C², fcproj 4C²; tied head V·C
    // 2 FLOPs per multiply-add, forward once and backward twice: 6 per weight;
    // attention scores and weighted sum: 4·T·C forward per layer, 12·T·C with backward
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

size_t gpt_attention_saved_bytes(const GPTLayout *l, const GPTPlan *p) {
    size_t rows = (size_t)p->B * (l->cfg.num_heads / l->tp_size) * p->T;  // query rows of this rank's heads
    return rows * (p->attention == GPT_ATTENTION_FLASH ? 1 : (size_t)p->T) * sizeof(float);
}

GPTActBytes gpt_activation_bytes(const GPTLayout *l, const GPTPlan *p, int act_bytes) {
    const GPTConfig *c = &l->cfg;
    size_t tp = l->tp_size, BT = (size_t)p->B * p->T, C = c->channels, Cp = C / tp, F = 4 * C / tp;
    size_t Vp = (size_t)gpt_logits_stride(l);
    size_t ab = (size_t)act_bytes, fb = sizeof(float), ib = sizeof(int32_t);
    int hu = gpt_unit_head(l);
    int has_embed = p->first_unit == GPT_UNIT_EMBED, has_head = p->last_unit == hu;
    int first_block = p->first_unit > 1 ? p->first_unit : 1, last_block = p->last_unit < hu ? p->last_unit : hu - 1;
    size_t blocks = last_block >= first_block ? (size_t)(last_block - first_block + 1) : 0;
    // interleaved: the range's chunks of blocks alone, each with its own input
    size_t chunk_inputs = 0;
    if (p->chunks > 1) blocks = (size_t)p->chunks * (size_t)p->chunk_blocks, chunk_inputs = (size_t)p->chunks - 1;
    GPTActBytes r;
    // per layer: ln1 C, qkv 3C, atty C, x2 C, ln2 C, fch 4C, fch_gelu 4C, x3 C = 16C
    // activations; fp32 mean and rstd of both layernorms; what the attention
    // core saves (gpt_attention_saved_bytes). Under tensor parallelism qkv,
    // atty, fch, fch_gelu and the attention's are the rank's heads' (1/tp);
    // the rest is whole. Selective recompute keeps all but the materialized
    // attention's probabilities (flash has none), full only x3 (the
    // next block's input; the first block's is the slot's x_in). Sequence
    // parallelism splits the whole ones (ln1, x2, ln2, x3, the statistics,
    // and x_in, lnf below) over the tp ranks: R = BT/tp rows each.
    size_t R = p->sequence_parallel ? BT / tp : BT;
    size_t att = gpt_attention_saved_bytes(l, p), x3 = R * C * ab;
    // (the tiled MLP keeps no fc or GELU output: one chunk of each, shared below)
    size_t mlp_rows = p->mlp_tiles ? (size_t)gpt_mlp_tile_rows(p) : 0;
    // (Ulysses keeps the attention core's output twice: on the heads'
    // positions for its backward, atth, and on the rank's, the projection's input)
    size_t ulysses = gpt_plan_ulysses(p) ? Cp : 0;
    size_t layer = R * (4 * C * ab + 4 * fb) + BT * (3 * Cp + Cp + ulysses + (p->mlp_tiles ? 0 : 2 * F)) * ab + att;
    // what a block saves by the plan's recompute, and the working set that
    // holds what it does not (one block's worth, shared by all)
    int drop_probs = p->recompute == GPT_RECOMPUTE_SELECTIVE && p->attention == GPT_ATTENTION_MATERIALIZED;
    size_t unsaved = p->recompute == GPT_RECOMPUTE_FULL ? layer - x3 : drop_probs ? att : 0;
    r.per_layer = layer - unsaved;
    r.working = blocks ? unsaved : 0;
    // per slot: the range's blocks and its input x_in (C); the embeddings add
    // the input token ids and their buckets (order and starts, token_buckets.h);
    // the head lnf (C), the logits (Vp: this rank's
    // vocabulary, padded), lnf mean/rstd and losses in fp32, and the target ids
    r.per_slot = blocks * r.per_layer + x3 + chunk_inputs * x3;
    // stored: the inputs of the range's blocks but the first (the slot's
    // x_in), that is every block's x3 but the last one's (the head's input,
    // what a pipeline stage sends on), go to pinned host memory (offloaded)
    // and/or 1/tp of each stays (partitioned); the device keeps two whole
    // ones, the one in use and the one coming or going
    r.stored_per_micro = r.stored = 0;
    size_t ring = 0;
    if ((p->offload_activations || p->partition_activations) && blocks > 1) {
        r.stored_per_micro = (blocks - 1) * (p->partition_activations ? x3 / tp : x3);
        r.stored = r.stored_per_micro * (size_t)p->slots;
        r.per_slot -= (blocks - 1) * x3;
        ring = 2 * x3;
    }
    if (has_embed) r.per_slot += 3 * BT * ib;
    // (the logits whole per slot, or under the tiled loss one chunk's shared by all)
    size_t tile_rows = p->loss_tiles ? (size_t)gpt_loss_tile_rows(p) : 0;
    if (has_head) r.per_slot += R * (C * ab + 2 * fb) + BT * ((p->loss_tiles ? 0 : Vp * ab) + fb + ib);
    // one (BT,C) projection output before its residual add; under tensor
    // parallelism the head's cross-entropy statistics (max, sum, target
    // logit); under sequence parallelism an all-gathered (BT,C) and a
    // reduce-scattered (R,C)
    r.shared = BT * C * ab + (has_head && tp > 1 ? BT * 3 * fb : 0) + ring;
    if (has_head) r.shared += tile_rows * Vp * ab;
    if (blocks) r.shared += 2 * mlp_rows * F * ab;
    if (p->sequence_parallel) r.shared += BT * C * ab + R * C * ab;
    // zero bubble's W stash of a block: its layernorms' gradients (4C, fp32),
    // its linears' inputs ln1 (C), atty (Cp), ln2 (C), fch_gelu (F) and
    // output gradients (3Cp, C, F, C) on all B·T rows (gathered under
    // sequence parallelism, as the weights' gradients read them)
    r.w_stash = p->w_slots > 0 && blocks ? 4 * C * fb + BT * (4 * C + 4 * Cp + 2 * F) * ab : 0;
    r.w_stashes = r.w_stash * (size_t)(p->w_slots > 0 ? p->w_slots : 0) * blocks;
    r.total_saved = r.per_slot * (size_t)p->slots + r.shared + r.w_stashes;
    // backward: the residual gradient per slot (R,C); one C-wide and two 4C-wide (F) temporaries
    // (d4b one chunk's rows under the tiled MLP); Ulysses' send and receive buffers, (BT,3Cp) each;
    // ring attention's two k, v (BT,2Cp), two of their fp32 gradients, an fp32 (BT,Cp) and the
    // position rows of the rank's chunks (T,C) in fp32
    r.backward_scratch = R * C * ab * (size_t)p->slots + BT * (C + F) * ab + (size_t)gpt_mlp_tile_rows(p) * F * ab;
    if (gpt_plan_ulysses(p)) r.backward_scratch += 2 * BT * 3 * Cp * ab;
    if (gpt_plan_ring(p)) r.backward_scratch += 2 * BT * 2 * Cp * (ab + fb) + BT * Cp * fb + (size_t)p->T * C * fb;
    size_t unit_max = 0;  // the largest unit of the range but the embeddings
    for (int u = first_block; u <= p->last_unit; u++)
        if (l->unit[u].count > unit_max) unit_max = l->unit[u].count;
    r.grad_workspace = unit_max * fb;
    if (has_embed || has_head) r.grad_workspace += l->unit[GPT_UNIT_EMBED].count * fb;
    return r;
}
