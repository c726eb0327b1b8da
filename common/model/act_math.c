// act_math.c: activation bytes and recomputation FLOPs in closed form (see
// act_math.h).
#include "act_math.h"
#include <math.h>

// This trainer, per block, e bytes an activation, fp32 statistics:
//   ln1, x2, ln2, x3: 4 sbh e; qkv 3sbh/t, attention output sbh/t, fc and
//   gelu 4sbh/t each: 12 sbh e/t; layernorm mean and rstd, twice: 16 sb;
//   what the attention core keeps, in fp32: with flash each query row's
//   log-sum-exp, 4 a s b / t; materialized the probabilities, 4 a s^2 b / t.
// Selective saves all but the materialized probabilities (flash has none to
// drop: it saves what none saves); full saves x3 alone (the next block's
// input), sbh e, and recomputes the rest but x3.
// Sequence parallelism (sp) splits the whole tensors and the statistics over
// the t ranks too: ln1, x2, ln2, x3 4sbhe/t, the statistics 16sb/t, and the
// slot's input, lnf and its statistics; it adds an all-gathered (BT,C) and a
// reduce-scattered (BT/t,C) temporary.
// DeepSpeed-Ulysses over c ranks: s is the rank's part of the sequence (the
// sequence is cs long); every term above holds on it, the attention core's
// log-sum-exp too (a/(tc) heads over cs positions: 4asb/t), and a block
// keeps the core's output twice, on the heads' positions and on its own:
// sbhe/t more. The backward scratch adds the all-to-alls' send and receive
// buffers, 3sbhe/t each.

// A tiled chunk's tokens (act_math.h).
double act_tile_tokens(double sb, int K) {
    if (K <= 0) return 0;
    double n = 16 * ceil(ceil(sb / K) / 16);
    return n < sb ? n : sb;
}

ActFormula act_formula(const GPTLayout *l, const GPTPlan *p, int act_bytes) {
    const GPTConfig *c = &l->cfg;
    double s = p->T, b = p->B, h = c->channels, a = c->num_heads, t = l->tp_size, e = act_bytes;
    double sp = p->sequence_parallel ? t : 1;  // what the whole tensors are divided by
    double V = gpt_logits_stride(l);  // this rank's vocabulary, rows padded to a multiple of 64
    int flash = p->attention == GPT_ATTENTION_FLASH;
    // the tiled MLP: no fc or GELU output kept (8sbhe/t), one chunk of each shared
    double ulysses = gpt_plan_ulysses(p) ? 1 : 0;
    double stats = 16 * s * b / sp, act = s * b * h * e * (4 / sp + ((p->mlp_tiles ? 4 : 12) + ulysses) / t);
    double core = flash ? 4 * a * s * b / t : 4 * a * s * s * b / t;  // the lse, or the probabilities
    double all = act + stats + core, input = s * b * h * e / sp;
    ActFormula f = {0};
    switch (p->recompute) {
    case GPT_RECOMPUTE_NONE: f.per_layer = all; break;
    case GPT_RECOMPUTE_SELECTIVE:
        if (flash) f.per_layer = all;
        else f.per_layer = act + stats, f.working = core;
        break;
    case GPT_RECOMPUTE_FULL: f.per_layer = input, f.working = all - input; break;
    }
    int hu = gpt_unit_head(l);
    int first = p->first_unit > 1 ? p->first_unit : 1, last = p->last_unit < hu ? p->last_unit : hu - 1;
    double blocks = last >= first ? last - first + 1 : 0;
    double chunk_inputs = 0;  // interleaved: the stage's chunks of blocks, each chunk but the first its own input
    if (p->chunks > 1) blocks = (double)p->chunks * p->chunk_blocks, chunk_inputs = p->chunks - 1;
    if (blocks == 0) f.working = 0;
    // a slot: its blocks and its input x_in (sbh e); the embeddings' token
    // ids and their buckets, the positions sorted by token and where each
    // token's begin (3 x 4sb); the head's lnf (sbh e), logits (sb V e), lnf
    // mean, rstd and losses (12sb) and target ids (4sb)
    double slot = blocks * f.per_layer + input + chunk_inputs * input;
    if (p->first_unit == GPT_UNIT_EMBED) slot += 12 * s * b;
    // (the tiled loss: no logits in the slot, one chunk of ceil(sb/K) tokens' shared)
    double tile = act_tile_tokens(s * b, p->loss_tiles) * V * e, logits = p->loss_tiles ? 0 : s * b * V * e;
    if (p->last_unit == hu) slot += input + logits + 8 * s * b / sp + 8 * s * b;
    // shared: one projection output before its residual add (sbh e); under
    // tensor parallelism the head's cross-entropy max, sum and target logit
    // (12sb); under sequence parallelism a gathered sbhe and a scattered sbhe/t
    double shared = s * b * h * e + (p->last_unit == hu && t > 1 ? 12 * s * b : 0) + (p->last_unit == hu ? tile : 0);
    if (blocks > 0) shared += 2 * act_tile_tokens(s * b, p->mlp_tiles) * 4 * h / t * e;
    if (p->sequence_parallel) shared += s * b * h * e + input;
    // stored (full recompute): every block's input but the first's, L - 1 of
    // sbhe per slot, goes to the host (offloaded) and/or keeps 1/t of it
    // (partitioned); the device keeps a ring of two whole ones
    if ((p->offload_activations || p->partition_activations) && blocks > 1) {
        double kept = (blocks - 1) * input / (p->partition_activations ? t : 1);
        slot -= (blocks - 1) * input;
        if (p->offload_activations) f.offload_per_micro = kept, f.offloaded = p->slots * kept;
        else slot += kept;
        shared += 2 * input;
    }
    // zero bubble's W stashes (w_slots of them per block): act_w_stash
    f.w_stash = blocks > 0 ? act_w_stash(l, p, act_bytes) : 0;
    f.saved = p->slots * slot + shared + (p->w_slots > 0 ? p->w_slots * blocks * f.w_stash : 0);
    return f;
}

// What zero bubble's B keeps of a block for its W: the layernorms'
// gradients, 4h in fp32 (16h); the four linears' inputs on all sb tokens
// (ln1 and ln2 sbh, the attention output sbh/t, the GELU output 4sbh/t)
// and their outputs' gradients (qkv's 3sbh/t, the projections' sbh each,
// fc's 4sbh/t): sbh(4 + 12/t)e, gathered whole under sequence parallelism.
double act_w_stash(const GPTLayout *l, const GPTPlan *p, int act_bytes) {
    double s = p->T, b = p->B, h = l->cfg.channels, t = l->tp_size, e = act_bytes;
    return 16 * h + s * b * h * (4 + 12 / t) * e;
}

ActUnits act_units(const GPTLayout *l, const GPTPlan *p, int act_bytes) {
    const GPTConfig *c = &l->cfg;
    double s = p->T, b = p->B, h = c->channels, t = l->tp_size, e = act_bytes;
    double sp = p->sequence_parallel ? t : 1, V = gpt_logits_stride(l), input = s * b * h * e / sp;
    ActFormula f = act_formula(l, p, act_bytes);
    int hu = gpt_unit_head(l);
    int first = p->first_unit > 1 ? p->first_unit : 1, last = p->last_unit < hu ? p->last_unit : hu - 1;
    ActUnits u = {0};
    u.blocks = last >= first ? last - first + 1 : 0;
    // the checkpoints' ring holds every block's x3 but the last one's (gpt_checkpoints.c)
    int stored = (p->offload_activations || p->partition_activations) && u.blocks > 1 ? u.blocks - 1 : 0;
    for (int i = 0; i < u.blocks; i++) u.block[i] = f.per_layer - (i < stored ? input : 0);
    u.input = input + (p->first_unit == GPT_UNIT_EMBED ? 12 * s * b : 0) + (p->last_unit == hu ? 4 * s * b : 0);
    double tile = act_tile_tokens(s * b, p->loss_tiles) * V * e, logits = p->loss_tiles ? 0 : s * b * V * e;
    u.head = p->last_unit == hu ? input + logits + 8 * s * b / sp + 4 * s * b : 0;
    u.shared = s * b * h * e + (p->last_unit == hu && t > 1 ? 12 * s * b : 0) + (p->last_unit == hu ? tile : 0);
    if (u.blocks > 0) u.shared += 2 * act_tile_tokens(s * b, p->mlp_tiles) * 4 * h / t * e;
    if (p->sequence_parallel) u.shared += s * b * h * e + input;
    if (stored) u.shared += 2 * input;
    if (stored && !p->offload_activations) u.store = p->slots * stored * input / t;  // 1/t of each, partitioned
    u.working = f.working;
    u.w_stash = f.w_stash;
    u.chunk_input = p->chunks > 1 ? input : 0;
    return u;
}

double act_backward_scratch(const GPTLayout *l, const GPTPlan *p, int act_bytes) {
    double s = p->T, b = p->B, h = l->cfg.channels, t = l->tp_size, e = act_bytes;
    double sp = p->sequence_parallel ? t : 1;
    // the gradients of fc's output (one chunk's under the tiled MLP) and of qkv (4h/t wide)
    double d4b = (p->mlp_tiles ? act_tile_tokens(s * b, p->mlp_tiles) : s * b) * 4 * h * e / t;
    // Ulysses' all-to-all buffers, q, k, v twice; ring attention's k, v in
    // e and their gradients in fp32, twice each, an fp32 y (or dq), and
    // the positions' rows in fp32
    double all_to_all = gpt_plan_ulysses(p) ? 2 * 3 * s * b * h * e / t : 0;
    double ring = gpt_plan_ring(p) ? s * b * h / t * (4 * e + 20) + 4 * s * h : 0;
    return p->slots * s * b * h * e / sp + s * b * h * e + 4 * s * b * h * e / t + d4b + all_to_all + ring;
}

// [flash][sp][recompute]
const char *act_formula_layer_text(GPTRecompute r, int sp, int flash) {
    static const char *const text[2][2][3] = {
        {{"sbh(4 + 12/t)e + 16sb + 4as^2b/t", "sbh(4 + 12/t)e + 16sb", "sbhe"},
         {"sbh(16/t)e + 16sb/t + 4as^2b/t", "sbh(16/t)e + 16sb/t", "sbhe/t"}},
        {{"sbh(4 + 12/t)e + 16sb + 4asb/t", "sbh(4 + 12/t)e + 16sb + 4asb/t", "sbhe"},
         {"sbh(16/t)e + 16sb/t + 4asb/t", "sbh(16/t)e + 16sb/t + 4asb/t", "sbhe/t"}},
    };
    return r >= GPT_RECOMPUTE_NONE && r <= GPT_RECOMPUTE_FULL ? text[flash != 0][sp != 0][r] : "?";
}

const char *act_formula_working_text(GPTRecompute r, int sp, int flash) {
    static const char *const text[2][2][3] = {
        {{"0", "4as^2b/t", "sbh(3 + 12/t)e + 16sb + 4as^2b/t"}, {"0", "4as^2b/t", "sbh(15/t)e + 16sb/t + 4as^2b/t"}},
        {{"0", "0", "sbh(3 + 12/t)e + 16sb + 4asb/t"}, {"0", "0", "sbh(15/t)e + 16sb/t + 4asb/t"}},
    };
    return r >= GPT_RECOMPUTE_NONE && r <= GPT_RECOMPUTE_FULL ? text[flash != 0][sp != 0][r] : "?";
}

// Korthikanti et al., Table 2: tensor parallel without sequence parallelism
// leaves 10 sbh of the 34 whole on every rank (the layernorms, dropouts and
// residual inputs); sequence parallelism splits them too.
double korthikanti_bytes(GPTRecompute r, double s, double b, double h, double a, double t, int sp) {
    double attn = 5 * a * s / h;
    switch (r) {
    case GPT_RECOMPUTE_NONE: return sp ? s * b * h / t * (34 + attn) : s * b * h * (10 + 24 / t + attn / t);
    case GPT_RECOMPUTE_SELECTIVE: return sp ? 34 * s * b * h / t : s * b * h * (10 + 24 / t);
    case GPT_RECOMPUTE_FULL: return sp ? 2 * s * b * h / t : 2 * s * b * h;
    }
    return 0;
}

const char *korthikanti_text(GPTRecompute r, int tp, int sp) {
    switch (r) {
    case GPT_RECOMPUTE_NONE: return sp ? "sbh/t (34 + 5as/h)" : tp > 1 ? "sbh(10 + 24/t + 5as/(ht))" : "sbh(34 + 5as/h)";
    case GPT_RECOMPUTE_SELECTIVE: return sp ? "34sbh/t" : tp > 1 ? "sbh(10 + 24/t)" : "34sbh";
    case GPT_RECOMPUTE_FULL: return sp ? "2sbh/t" : "2sbh";
    }
    return "?";
}

double recompute_flops_per_token(const GPTLayout *l, int T, GPTRecompute r, GPTAttention a, int mlp_tiles) {
    double C = l->cfg.channels, L = l->cfg.num_layers, attention = 4.0 * C * T;
    double weights = mlp_tiles ? 4.0 * C * C : 8.0 * C * C;  // qkv, proj and fc; the tiled MLP's fc is its own
    switch (r) {
    case GPT_RECOMPUTE_NONE: return 0;
    case GPT_RECOMPUTE_SELECTIVE: return a == GPT_ATTENTION_FLASH ? 0 : L * attention;
    case GPT_RECOMPUTE_FULL: return L * (2.0 * weights + attention);
    }
    return 0;
}

double tiled_mlp_flops_per_token(const GPTLayout *l, int mlp_tiles) {
    double C = l->cfg.channels;
    return mlp_tiles > 0 ? l->cfg.num_layers * 2.0 * 4.0 * C * C : 0;
}

double tiled_loss_flops_per_token(const GPTLayout *l, int loss_tiles) {
    return loss_tiles > 0 ? 2.0 * l->cfg.vocab_size * l->cfg.channels : 0;
}

int recompute_kernels_per_block(const GPTLayout *l, const GPTPlan *p) {
    switch (p->recompute) {
    case GPT_RECOMPUTE_NONE: return 0;
    case GPT_RECOMPUTE_SELECTIVE: return p->attention == GPT_ATTENTION_FLASH ? 0 : 1;
    case GPT_RECOMPUTE_FULL: return (p->mlp_tiles ? 5 : 6) + (l->tp_size > 1);
    }
    return 0;
}

double recompute_flops_per_block(const GPTLayout *l, const GPTPlan *p) {
    double per_layer = recompute_flops_per_token(l, p->T, p->recompute, p->attention, p->mlp_tiles) / l->cfg.num_layers;
    return per_layer * p->B * p->T / l->tp_size;
}
