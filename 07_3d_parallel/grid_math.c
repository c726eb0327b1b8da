// grid_math.c: the closed forms of stage 07 (see grid_math.h).
#include "grid_math.h"
#include <math.h>
#include <string.h>

const char *grid_group_name(GridGroup g) {
    static const char *const names[GROUP_COUNT] = {"tp", "pp", "emb", "dp", "cp"};
    return g >= 0 && g < GROUP_COUNT ? names[g] : "?";
}

double grid_vocab_padded(const GridShape *g) { return gpt_vocab_padded(g->cfg.vocab_size, g->tp); }

// Blocks of stage s: L/P, the first L mod P stages one more.
static double stage_blocks(const GridShape *g, int s) {
    return g->cfg.num_layers / g->pp + (s < g->cfg.num_layers % g->pp ? 1 : 0);
}

double grid_stage_params(const GridShape *g, int s) {
    double C = g->cfg.channels, T = g->tp;
    double block = 12 * C * C / T + 7 * C / T + 2 * C + 4 * C;
    double wte = grid_vocab_padded(g) * C / T, wpe = (double)g->cfg.max_seq_len * C;
    double psi = stage_blocks(g, s) * block;
    if (s == 0) psi += wte + wpe;
    if (s == g->pp - 1) psi += 2 * C + (g->pp > 1 ? wte : 0);
    return psi;
}

void grid_state_bytes(const GridShape *g, int s, StateBytes *out) {
    stage_state_bytes(STAGE_ZERO1, (size_t)grid_stage_params(g, s), g->dp, out);
}

GridActs grid_act_bytes(const GridShape *g, int s, int slots) {
    // S: the rank's positions of a sequence (context parallel: S/C of them)
    double C = g->cfg.channels, T = g->tp, a = g->act_bytes, B = g->batch, S = g->seq_len / g->cp, BS = B * S;
    double heads = g->cfg.num_heads / g->tp, blocks = stage_blocks(g, s), sp = g->sp ? T : 1;
    double ulysses = g->cp > 1 && !g->cp_ring ? 1 : 0;  // the core's output kept on the heads' positions too
    double core = g->flash ? 4 * B * heads * S : 4 * B * heads * S * S, x3 = BS * C * a / sp;
    // a tile of BS tokens over K: ceil(BS/K) rounded up to 16 (the rows the cpu GEMM keeps together), at most BS
    double mlp_chunk = g->mlp_tiles ? fmin(BS, 16 * ceil(ceil(BS / g->mlp_tiles) / 16)) : 0;
    // the tiled MLP keeps neither fc's nor the GELU's output (8·BS·C/T): one chunk of each, shared
    double block = BS * (4 * C / sp + ((g->mlp_tiles ? 4 : 12) + ulysses) * C / T) * a + 16 * BS / sp + core,
           kept = block;
    GridActs r = {0};
    if (g->recompute == GPT_RECOMPUTE_SELECTIVE && !g->flash) kept = block - core, r.working = core;
    if (g->recompute == GPT_RECOMPUTE_FULL) kept = x3, r.working = block - x3;
    if (blocks == 0) r.working = 0;
    double micro = blocks * kept + x3;  // and the stage's input, x_in
    double shared = BS * C * a;         // a projection before its residual add
    if (blocks > 0) shared += 2 * mlp_chunk * 4 * C / T * a;
    if (g->sp) shared += BS * C * a + x3;  // an all-gathered (BS,C) and a reduce-scattered (BS/T,C)
    if ((g->offload || g->partition) && blocks > 1) {  // every block's x3 but the last: stored
        double stored = (blocks - 1) * x3 / (g->partition ? T : 1);
        micro -= (blocks - 1) * x3;
        if (g->offload) r.host = slots * stored;
        else micro += stored;
        shared += 2 * x3;  // the ring of two whole ones
    }
    if (s == 0) micro += 12 * BS;                             // the input token ids and their buckets
    if (s == g->pp - 1) {
        double logits_row = grid_vocab_padded(g) / T;  // this rank's wte rows, padding included
        // lnf and this rank's logits; lnf's mean and rstd, the losses (fp32) and the targets (int32)
        micro += x3 + 8 * BS / sp + 8 * BS;
        // the logits: a micro-batch's in its slot, or under --tiled-loss K one chunk's, shared: ceil(BS/K)
        // tokens rounded up to a multiple of 16 (the rows the cpu GEMM keeps together), at most BS
        if (g->loss_tiles) shared += fmin(BS, 16 * ceil(ceil(BS / g->loss_tiles) / 16)) * logits_row * a;
        else micro += BS * logits_row * a;
        if (g->tp > 1) shared += 12 * BS;  // the vocabulary-parallel cross-entropy's max, sum, target logit
    }
    r.device = slots * micro + shared;
    return r;
}

void grid_comm_bytes(const GridShape *g, int s, double out[GROUP_COUNT][OP_COUNT]) {
    memset(out, 0, sizeof(double) * GROUP_COUNT * OP_COUNT);
    double C = g->cfg.channels, T = g->tp, D = g->dp, a = g->act_bytes, m = g->micro_batches;
    double BS = (double)g->batch * g->seq_len / g->cp, residual = BS * C * a;
    int first = s == 0, last = s == g->pp - 1;
    double blocks = stage_blocks(g, s), full = g->recompute == GPT_RECOMPUTE_FULL;
    // the head's fp32 max and sums, 3·B·S·4, and again in backward under --tiled-loss (each chunk's loss computed anew)
    double ce_stats = 3 * BS * 4 * (g->loss_tiles ? 2 : 1);
    if (g->sp) {
        // per block: ln1 and ln2 forward, the output gradient twice and ln1, ln2 again backward; full recompute
        // gathers ln1 and ln2 again, or ln1 alone under the tiled MLP (its fc runs in the MLP's backward)
        double gathers = blocks * (6 + (g->mlp_tiles ? 1 : 2) * full) + (first ? 1 : 0) + (last ? 2 : 0);
        double scatters = blocks * (4 + full) + (first ? 1 : 0) + (last ? 1 : 0);
        out[GROUP_TP][OP_ALL_GATHER] = (T - 1) / T * m * gathers * residual;
        out[GROUP_TP][OP_REDUCE_SCATTER] = (T - 1) / T * m * scatters * residual;
        double ln_grads = (blocks * 4 * C + (last ? 2 * C : 0)) * 4;  // fp32, each rank's from its rows
        out[GROUP_TP][OP_ALL_REDUCE] = 2 * (T - 1) / T * m * ((last ? ce_stats : 0) + ln_grads);
    } else {
        double per_micro = blocks * (4 + full) * residual + (first ? residual : 0) + (last ? residual + ce_stats : 0);
        out[GROUP_TP][OP_ALL_REDUCE] = 2 * (T - 1) / T * m * per_micro;
    }
    if (g->partition && blocks > 1) out[GROUP_TP][OP_ALL_GATHER] = (T - 1) / T * m * (blocks - 1) * residual;
    if (g->sp) residual /= T;  // what crosses between stages: each tp rank's rows
    double v = g->chunks > 1 ? g->chunks : 1;  // interleaved: each chunk a virtual stage, c = jP + s of Pv
    double forward_sends = v - (last ? 1 : 0), backward_sends = v - (first ? 1 : 0);
    out[GROUP_PP][OP_SEND] = out[GROUP_PP][OP_RECV] = m * residual * (forward_sends + backward_sends);
    if (g->pp > 1 && (first || last)) out[GROUP_EMB][OP_ALL_REDUCE] = grid_vocab_padded(g) * C / T * 2;
    double kv = BS * 2 * C / T;  // a rank's k and v (elements)
    if (g->cp > 1 && g->cp_ring)  // k, v forward (twice under full) and backward; their fp32 gradients backward
        out[GROUP_CP][OP_SEND] = out[GROUP_CP][OP_RECV] =
            m * blocks * ((2 + full) * (g->cp - 1.0) * kv * a + g->cp * kv * 4);
    else if (g->cp > 1)  // per block q, k, v and the output forward, their gradients backward, again under full
        out[GROUP_CP][OP_ALL_TO_ALL] = m * blocks * (8 + 4 * full) * (g->cp - 1.0) / g->cp * BS * C / T * a;
    double padded = padded_params(grid_stage_params(g, s), g->dp);
    out[GROUP_DP][OP_REDUCE_SCATTER] = out[GROUP_DP][OP_ALL_GATHER] = padded * 2 * (D - 1) / D;
}

double grid_ring_pairs(const GridShape *g, int cp_rank, int zigzag) {
    if (g->cp < 2 || !g->cp_ring) return 0;
    double Tc = (double)g->seq_len / (2.0 * g->cp), before = zigzag ? 2.0 * g->cp - 1 : 4.0 * cp_rank + 1;
    return (double)g->batch * (g->cfg.num_heads / g->tp) * (before * Tc * Tc + Tc * (Tc + 1));
}
