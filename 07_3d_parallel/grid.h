// grid.h: the process grid of 3D parallelism (Narayanan et al. 2021,
// "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM"). N = T·P·D ranks: the model is cut into P pipeline stages
// of contiguous blocks, each stage's tensors split over T tensor-parallel
// ranks, and the whole replicated over D data-parallel replicas.
//
// Ranks are ordered as Megatron-LM orders them, tensor-parallel fastest:
//   rank = (stage·D + replica)·T + tp_rank
// so the T ranks that all-reduce in every block are adjacent (one node),
// the D replicas of one model part next, and the pipeline stages, which
// exchange only activations, the furthest apart.
//
// A fourth axis, DeepSpeed-Ulysses (--cp C): the C ranks of a sequence
// group hold the same part of the model and split every sequence by its
// positions. They are C consecutive replicas, replica = data replica·C + cp
// rank (Megatron's tp-cp-dp-pp order), so D counts them: the model part's
// replicas are D = C x the data replicas, ZeRO-1 shards over all D (as
// DeepSpeed shards over its sequence-data-parallel group), the gradients are
// summed over all D, and only the data replicas read rows of their own.
#pragma once
#include <stddef.h>
#include "comm.h"
#include "gpt.h"
#include "gpt_grid.h"  // grid_coords, grid_stage_blocks: the grid as pure functions

typedef struct Grid {
    int tp, pp, dp;               // T, P, D (D: cp x the data replicas)
    int cp;                       // C: the ranks each sequence is split over (1: none)
    int tp_rank, stage, replica;  // this rank's coordinates
    int cp_rank;                  // replica mod C: its part of every sequence
    Comm tp_comm;    // T ranks: one stage of one replica (Megatron's f and g all-reduces)
    Comm cp_comm;    // C ranks: consecutive replicas of one stage and tp rank (Ulysses' all-to-alls)
    Comm pp_comm;    // P ranks: one tp rank of one replica, rank = stage (activations, their gradients)
    Comm dp_comm;    // D ranks: one (stage, tp rank) in every replica (ZeRO-1)
    Comm emb_comm;   // first and last stage of one pipeline when P > 1 (the tied wte's gradient); else no group
    int first_unit, last_unit;    // the units this stage computes
} Grid;

// The grid's refusals, each one line and exit 2: N not divisible by T·C·P,
// heads (and so 4C) not divisible by T, nor by T·C under Ulysses, fewer
// layers than stages, a sequence of S tokens that does not split over C.
void grid_check(int ranks, int tp, int cp, int ring, int pp, int seq_len, const GPTConfig *cfg);
// Splits the world into the groups above (collective over the world).
void grid_init(Grid *g, Comm *world, int tp, int cp, int ring, int pp, int seq_len, const GPTConfig *cfg);
void grid_free(Grid *g);
// "tp 2 x pp 2 x dp 2", "tp 2 x cp 2 x pp 1 x dp 2" (dp: the data replicas),
// "tp 1 x pp 2 x vp 2 x dp 1" (interleaved, 2 chunks per stage)
void grid_name(const Grid *g, int chunks, char *out, size_t n);
