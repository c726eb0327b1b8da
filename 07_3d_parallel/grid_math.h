// grid_math.h: the closed forms of stage 07, per rank of a T x P x D grid,
// computed from the model's shapes alone (never from the layout or the
// allocation code they are set beside): parameters of a pipeline stage's
// part, its model states under ZeRO-1 over the replicas, the activations of
// the micro-batches in flight, and the bytes each group moves per step.
#pragma once
#include "comm.h"
#include "gpt.h"
#include "mem_math.h"

// The groups a rank communicates in (grid.h), in the order the report lists them.
typedef enum { GROUP_TP, GROUP_PP, GROUP_EMB, GROUP_DP, GROUP_CP, GROUP_COUNT } GridGroup;
const char *grid_group_name(GridGroup g);  // "tp", "pp", "emb", "dp", "cp"

typedef struct GridShape {
    GPTConfig cfg;
    int tp, pp, dp;         // T, P, D (D: the part's replicas, cp x the data replicas)
    int cp;                 // C: ranks per sequence (1: none)
    int cp_ring;            // --cp-mode ring (else Ulysses)
    int batch, seq_len;     // B, S of a micro-batch (S the whole sequence: a rank holds S/C of it)
    int micro_batches;      // m
    int act_bytes;          // a: 4 (cpu: fp32 activations) or 2 (cuda: bf16)
    GPTRecompute recompute; // --recompute
    int offload, partition; // --offload-activations, --partition-activations (with full)
    int sp;                 // --sequence-parallel
    int flash;              // --attention flash (else materialized)
    int loss_tiles;         // --tiled-loss K (0: the logits whole)
    int mlp_tiles;          // --tiled-mlp K (0: each MLP whole)
    int chunks;             // v: interleaved chunks per stage (1: a contiguous stage)
} GridShape;

// Vocabulary rows of wte over the tp group: V rounded up to a multiple of
// lcm(128, 64·T) (gpt_vocab_padded: 128 at T = 1, llm.c's Vp).
double grid_vocab_padded(const GridShape *g);
// Ψ_s: parameters one tp rank of stage s holds. A block: 12C²/T weights,
// 7C/T + 2C biases (QKV and the MLP's first linear split, the projections'
// whole), 4C of layernorms; stage 0 adds wte's V_pad·C/T rows and wpe's S_max·C;
// the last stage the final layernorm (2C) and, when P > 1, its copy of wte.
double grid_stage_params(const GridShape *g, int stage);
// Model states of one rank of stage s: ZeRO-1 over the D replicas of its
// part, 4Ψ_s + 12Ψ_s/D with Ψ_s padded to a multiple of 64·D (mem_math's).
void grid_state_bytes(const GridShape *g, int stage, StateBytes *out);
// Activation bytes of stage s with `slots` micro-batches in flight, on the
// device (and the recompute's working set, and on the host): slots x (one
// micro-batch through its units) + what the slots share. Per block and
// micro-batch, BS = B·S tokens: BS·(4C + 12C/T)·a (the layernorm outputs, x2
// and x3 whole; QKV, attention output and the MLP's two 4C activations
// split) + 16·BS (fp32 mean and rstd of two layernorms) + what the rank's
// heads' attention keeps in fp32: with flash each row's log-sum-exp,
// 4·B·(NH/T)·S; materialized the probabilities, 4·B·(NH/T)·S². Selective
// recompute keeps all but the materialized probabilities (with flash all),
// full only x3 (BS·C·a); what they do not keep is
// one block's working set. Under Ulysses over C ranks every S above is
// the rank's S/C positions, and a block keeps the attention core's output
// a second time, on the heads' positions: BS·C·a/T more. Under full, the x3 of every block but the
// stage's last go to the host (offload) and/or keep 1/T (partition), with a
// ring of two whole ones on the device. Sequence parallelism divides the
// whole tensors by T (4C/T per block, the statistics, the stage's input,
// lnf) and adds a gathered (BS,C) and a scattered (BS/T,C) temporary.
typedef struct GridActs {
    double device, working, host;
} GridActs;
GridActs grid_act_bytes(const GridShape *g, int stage, int slots);
// Bytes per rank per step, as the comm layer counts them (ring volume):
//   tp:  all-reduces of (BS,C) activations, 2(T-1)/T of each: 4 per block
//        (f and g, forward and backward), 1 for the embedding, the head's 1
//        (BS,C) plus its fp32 statistics (max BS, sums 2BS), x m micro-batches;
//        full recompute runs the attention's g again (1 more per block);
//        partitioned checkpoints are all-gathered before the recompute:
//        (T-1)/T of (BS,C) for every block but the stage's last;
//        sequence parallel: (T-1)/T of (BS,C) per all-gather and
//        reduce-scatter, per block 2 of each forward, 4 all-gathers (the
//        output gradients, the layernorms' outputs again) and 2
//        reduce-scatters backward, full recompute 2 + 1 more, the
//        embedding 1 each way, the head 2 all-gathers and 1 reduce-scatter,
//        and the layernorms' fp32 gradients all-reduced (4C per block, 2C
//        the head's);
//   pp:  m micro-batches' (BS,C) to each neighbour and from it (1 each way;
//        sequence parallel: each tp rank its (BS/T,C)); interleaved, once
//        per chunk boundary a stage's chunks meet: each of its v chunks c =
//        jP + s sends its output on but the last (c = Pv - 1) and its input's
//        gradient back but the first (c = 0), and receives as many;
//   emb: the tied wte gradient between the first and last stage, V_pad·C/T
//        bf16 all-reduced over 2 ranks (2(2-1)/2 = 1 of it);
//   dp:  ZeRO-1's reduce-scatter and all-gather of Ψ_s padded, bf16, (D-1)/D each;
//   cp:  Ulysses' all-to-alls, each rank sending (C-1)/C of B·(S/C)·C/T
//        activations four times per block forward (q, k, v, the output)
//        and four backward, four more with full recompute, x m; ring
//        attention's shifts, each rank sending its k and v, B·(S/C)·2C/T
//        activations, C-1 times per block forward (again under full
//        recompute) and C-1 times backward, and their fp32 gradients C
//        times backward (the last brings each home), x m, received alike.
// Every B·S above (tp, pp) is the rank's B·S/C under context parallelism.
void grid_comm_bytes(const GridShape *g, int stage, double out[GROUP_COUNT][OP_COUNT]);
// Ring attention's causal work on cp rank r, per layer and micro-batch: the
// query-key pairs under the mask of the rank's two chunks of Tc = S/(2C)
// positions, for its B sequences and NH/T heads. A chunk at position i of
// the 2C sees i chunks before it whole (Tc² each) and its own causally
// (Tc(Tc + 1)/2). Zigzag (rank r: chunks r and 2C - 1 - r): (2C - 1)Tc² +
// Tc(Tc + 1), the same on every rank; chunks in order (2r and 2r + 1):
// (4r + 1)Tc² + Tc(Tc + 1), growing with r.
double grid_ring_pairs(const GridShape *g, int cp_rank, int zigzag);
