// flash_math.h: the per-row math of FlashAttention (Dao et al. 2022;
// FlashAttention-2, Dao 2023) that the cpu loops and the cuda kernels share.
//
// Causal attention of one head, for query row t over keys s <= t, with
// scores z_s = q_t . k_s / sqrt(hs):
//   forward   y_t = sum_s p_s v_s,  p_s = exp(z_s - lse_t),  lse_t = log sum_s exp(z_s)
//   backward  D_t = dy_t . y_t;  for each s <= t: dp_s = dy_t . v_s,
//             dz_s = p_s (dp_s - D_t);  dq_t += dz_s k_s / sqrt(hs),
//             dk_s += dz_s q_t / sqrt(hs),  dv_s += p_s dy_t
// Keys come in tiles of FLASH_TILE. The forward keeps a running maximum m
// and a running sum l = sum exp(z - m) per row (the online softmax of
// Milakov & Gimelshein 2018): a tile whose maximum raises m to m' rescales
// l and the row's partial output by exp(m - m'). Only y and lse are saved;
// the backward recomputes p from q, k and lse, a tile at a time, so no
// (T,T) matrix is ever held.
#pragma once
#include <math.h>
#include "bf16.h"

// Query rows and keys per tile: the cpu's sgemm tiles and the cuda
// kernels' shared-memory tiles.
#define FLASH_TILE 64

// 1/sqrt(hs), the scores' scale
WB_HOSTDEV static inline float flash_scale(int hs) { return 1.0f / sqrtf((float)hs); }

// Keys of a (query tile i0, key tile j0) pair that row r may see: s <= t,
// with t = i0 + r and s = j0 + c; at most `cols`.
WB_HOSTDEV static inline int flash_visible(int i0, int r, int j0, int cols) {
    int n = i0 + r - j0 + 1;
    return n < cols ? n : cols;
}

// The running maximum of a row's scores after a tile whose maximum is tile_max
WB_HOSTDEV static inline float flash_running_max(float m, float tile_max) { return m > tile_max ? m : tile_max; }

// The online softmax's rescale of what a row has summed so far when its
// running maximum moves from m_old to m_new (0 before the first tile).
WB_HOSTDEV static inline float flash_rescale(float m_old, float m_new) {
    return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

// Ring attention (Liu et al. 2023) merges the partial results of key chunks
// through their log-sum-exp: with y_a, lse_a over keys A and y_b, lse_b over
// keys B, lse = log(e^lse_a + e^lse_b) and y = y_a e^(lse_a - lse) +
// y_b e^(lse_b - lse). The online softmax above does exactly that if it
// starts from what A left: a running maximum lse_a with the sum 1 (y_a is
// normalized, so its weights sum to 1 at that maximum), the row's partial
// output y_a. These are the starting maximum and sum of a row, from its
// merged lse so far (or afresh: -inf and 0; lse is not read then, as
// nothing has written it yet).
WB_HOSTDEV static inline float flash_merge_start_max(int merge, const float *lse) { return merge ? *lse : -INFINITY; }
WB_HOSTDEV static inline float flash_merge_start_sum(int merge) { return merge ? 1.0f : 0.0f; }

// log sum exp of a row from its running maximum and sum
WB_HOSTDEV static inline float flash_lse(float m, float l) { return m + logf(l); }

// A probability recomputed in backward from the score and the row's lse
WB_HOSTDEV static inline float flash_prob(float z, float lse) { return expf(z - lse); }

// dz = p (dp - D), the softmax's backward for one element
WB_HOSTDEV static inline float flash_dscore(float p, float dp, float D) { return p * (dp - D); }
