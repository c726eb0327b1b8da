// act_math.h: activation memory per rank in closed form, in the notation of
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models": s sequence, b micro-batch, h hidden, a heads, t
// tensor-parallel ranks), for each --recompute mode: the paper's figures
// (16-bit activations and dropout masks) beside this trainer's own (e bytes
// per activation element: 4 on the cpu device, 2 on cuda; fp32 statistics;
// no dropout). This trainer's are written from the tensors a block keeps,
// apart from the allocation code (gpt_activation_bytes), which the reports
// and tests check against them. And what recomputation costs: the FLOPs it
// adds, for hardware FLOP utilization beside model FLOP utilization.
#pragma once
#include "gpt.h"

typedef struct ActFormula {
    double per_layer;  // what one block saves for one micro-batch
    double saved;      // the plan's activations buffer: its slots x (blocks + input, embeddings, head) + shared temporaries
    double working;    // the recomputation's working set: one block's unsaved tensors (0 without recompute)
    double offloaded;  // pinned host: the blocks' saved inputs under offload_activations (out of `saved`;
                       // partitioned, 1/t of each)
    double offload_per_micro;  // what one micro-batch takes down in forward and back in backward
    double w_stash;    // zero bubble (plan.w_slots > 0): one block's W stash (act_w_stash); `saved` holds
                       // w_slots per block of them
} ActFormula;
ActFormula act_formula(const GPTLayout *l, const GPTPlan *p, int act_bytes);

// The same bytes unit by unit, for the memory's timeline (step_memory.c):
// what one micro-batch's slot holds from its input's arrival to the range's
// first backward (its input x_in, sbhe/sp, the embeddings' token ids and
// buckets, 12sb, the head's target ids, 4sb), what each block of the range
// saves from its forward to its backward (per_layer, less x3 where the
// checkpoints' ring holds it), the head's from its forward to its backward
// (lnf sbhe/sp, the logits sbVe, its statistics 8sb/sp and losses 4sb), the
// temporaries the slots share, and the recompute's working set.
typedef struct ActUnits {
    double input, head, shared, working;
    double w_stash;  // zero bubble: what a block's B keeps until its W (act_w_stash), 0 without blocks
    double chunk_input;  // interleaved: a chunk's input (sbhe/sp) from its arrival to its first block's backward
    double store;  // the checkpoints' store where it is on the device (partitioned, not offloaded): every slot's
    double block[GPT_MAX_UNITS];  // by the block's place in the plan's range
    int blocks;
} ActUnits;
ActUnits act_units(const GPTLayout *l, const GPTPlan *p, int act_bytes);
// Zero bubble's W stash of one block (GPTPlan.w_slots): the layernorms'
// gradients (16h) and the four linears' inputs and output gradients,
// sbh(4 + 12/t)e.
double act_w_stash(const GPTLayout *l, const GPTPlan *p, int act_bytes);
// The backward's temporaries, in closed form: the residual stream's
// gradient per slot (sbhe/sp) and three (BT, C or 4C/t) tensors: sbhe + 2 x 4sbhe/t.
// A tiled chunk of sb tokens over K (--tiled-loss, --tiled-mlp):
// 16·ceil(ceil(sb/K)/16), at most sb; 0 for K = 0 (no chunk: whole).
double act_tile_tokens(double sb, int K);
double act_backward_scratch(const GPTLayout *l, const GPTPlan *p, int act_bytes);
// This trainer's per-layer closed forms, saved and working set, as text
// (with sequence parallelism, sp, or without; with flash attention or the
// materialized one).
const char *act_formula_layer_text(GPTRecompute r, int sp, int flash);
const char *act_formula_working_text(GPTRecompute r, int sp, int flash);

// Korthikanti et al.'s bytes per layer (their Table 2; 16-bit activations,
// dropout masks), at tensor parallelism t (1: none), with sequence
// parallelism (sp) or without; full recompute keeps each layer's 16-bit input,
// 2sbh (2sbh/t where it is partitioned over the tp ranks).
double korthikanti_bytes(GPTRecompute r, double s, double b, double h, double a, double t, int sp);
const char *korthikanti_text(GPTRecompute r, int tp, int sp);

// FLOPs per token that recomputation adds to the model FLOPs
// (gpt_flops_per_token), counted as the other matmul and attention FLOPs:
// selective runs the materialized attention forward again (scores and
// weighted sum: 4TC per layer; nothing with flash, which keeps no
// probabilities); full runs the block's forward but its MLP projection (qkv
// 6C², projection 2C², fc 8C² and the attention: 16C² + 4TC per layer).
// The attention terms count whole (T,T) products, as the model FLOPs do
// (PaLM's convention); the flash kernels skip the tiles above the diagonal
// and form q k^T again in backward, which these figures leave out.
// mlp_tiles > 0: the tiled MLP's fc is computed again apart (below), not in
// the full recompute.
double recompute_flops_per_token(const GPTLayout *l, int T, GPTRecompute r, GPTAttention a, int mlp_tiles);
// What the tiled MLP (GPTPlan.mlp_tiles > 0) computes again per token: each
// block's fc forward in its backward, L·2·4C²; 0 untiled.
double tiled_mlp_flops_per_token(const GPTLayout *l, int mlp_tiles);
// What the tiled loss (--tiled-loss, GPTPlan.loss_tiles > 0) computes again
// per token: the LM head's forward in backward, 2·V·C (V·C weights, as
// gpt_flops_per_token counts the head); 0 untiled.
double tiled_loss_flops_per_token(const GPTLayout *l, int loss_tiles);
// What one block's recompute runs for one micro-batch of plan p on one of the
// layout's tp ranks: its kernels (none: 0; selective: the materialized
// attention's forward, 1, and nothing under flash; full: block_forward_inner,
// ln1, QKV, attention, projection, residual add + ln2, fc + GELU: 6, and the
// row-parallel bias added after g's all-reduce under tp) and their FLOPs
// (recompute_flops_per_token's per layer, over B·T tokens, split over tp).
int recompute_kernels_per_block(const GPTLayout *l, const GPTPlan *p);
double recompute_flops_per_block(const GPTLayout *l, const GPTPlan *p);
