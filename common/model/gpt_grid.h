// gpt_grid.h: where the model's states lie on a 3D grid (Narayanan et al.
// 2021; stage 07's layout, Megatron-LM's rank order), as pure functions of
// the shape and the rank. 07_3d_parallel lays its states out with them, and
// the checkpoint code reads a grid's parts with them, with no MPI job of
// that grid running (ckpt_reshard.c, ckpt_tool).
#pragma once
#include <stddef.h>
#include "gpt.h"
#include "states.h"

// Coordinates of `rank` on a T x P x D grid: tensor parallel fastest,
//   rank = (stage·D + replica)·T + tp_rank
void grid_coords(int rank, int tp, int dp, int *tp_rank, int *stage, int *replica);
// Blocks [*first, *end) of stage s: contiguous, L/P each, the first L mod P
// stages one more; the embeddings go to stage 0, the head to stage P-1.
void grid_stage_blocks(int layers, int pp, int s, int *first, int *end);
// The units stage s computes, [*first_unit, *last_unit].
void grid_stage_units(int layers, int pp, int s, int *first_unit, int *last_unit);
// Interleaved stages (Megatron's virtual pipeline, v chunks per stage): the
// layers in P·v chunks of L/(P·v) blocks, stage s holding chunks s, s + P,
// ..., s + (v-1)·P; the units of its chunk j, [*first_unit, *last_unit]
// (the embeddings open chunk 0 of stage 0, the head closes the last
// chunk of stage P-1), and its plan's chunks (gpt.h's GPTPlan.chunks).
void grid_chunk_units(int layers, int pp, int v, int s, int j, int *first_unit, int *last_unit);
void grid_plan_chunks(int layers, int pp, int v, int s, GPTPlan *p);
// The layout ranges of an interleaved stage's states: the last stage's wte
// copy (pp > 1), then each chunk's units. Returns how many (v or v + 1).
int grid_chunk_state_ranges(const GPTLayout *l, int pp, int v, int stage, Range out[GPT_MAX_CHUNKS + 1]);
// The ranges of layout l a stage's states hold, back to back: the last
// stage of a pipeline (pp > 1) first keeps a copy of its wte part (the tied
// head's weights), then the stage's units. Returns how many (1 or 2).
int grid_state_ranges(const GPTLayout *l, int pp, int stage, int first_unit, int last_unit, Range out[2]);
// Index in the whole model's layout (tp 1, stages 01-06's flat buffer) of
// element s of states that hold `ranges` of l back to back, or GPT_PADDING
// (a padding row of wte under tp, or past the states: a shard's padding).
size_t grid_whole_index(const GPTLayout *l, const Range *ranges, int n, size_t s);

// What rank `rank` of a grid keeps in its optimizer (and so in its part of
// a checkpoint): its ZeRO-1 shard, over the D replicas, of its states.
typedef struct GridPart {
    GPTLayout layout;  // its tp part of the model
    int tp_rank, stage, replica;
    int chunks;        // interleaved chunks per stage (1: a contiguous stage)
    int wte_copy;      // the last stage of a pipeline: its states open with a copy of wte
    Range ranges[GPT_MAX_CHUNKS + 1];
    int nranges;
    Partition shard;   // of the states' elements over the replicas
    Range *replicated; // layout ranges of the tensors whole on every tp rank (gpt_replicated_ranges)
    int nreplicated;
} GridPart;
// v: the interleaved chunks per stage (grid_chunks of the grid's name; 1: none).
void grid_part_init(GridPart *g, const GPTConfig *cfg, int tp, int pp, int dp, int v, int rank);
void grid_part_free(GridPart *g);
// Whole-model index of element i of the part's shard, or GPT_PADDING.
size_t grid_part_whole(const GridPart *g, size_t i);
// The same, but GPT_PADDING where another part holds the copy a reader
// takes: a tensor whole on every tp rank is taken from tp rank 0's part,
// wte from the first stage's (the last stage's copy holds the same values:
// its gradient is summed between the two), so a reader of the whole model
// reads each element once.
size_t grid_part_whole_once(const GridPart *g, size_t i);
// "tp 2 x pp 2 x dp 2" -> 2, 2, 2; "tp 2 x cp 2 x pp 1 x dp 2" -> 2, 1, 4
// (Ulysses' cp ranks hold the same states: replicas of the part); "tp 1 x
// pp 2 x vp 2 x dp 1": interleaved, 2 chunks per stage; 1 when the text is
// not a grid (or a size is past 2^20).
int grid_parse(const char *name, int *tp, int *pp, int *dp);
// The ranks a grid splits each sequence over: C of "tp T x cp C x ...", else 1.
int grid_seq_parts(const char *name);
// The interleaved chunks per stage: V of "... x pp P x vp V x ...", else 1.
int grid_chunks(const char *name);
// "embed,blocks 0-3,head": the units of stage s of a pipeline of pp stages
// (grid_chunk_units_text: of its v interleaved chunks, "embed,block 0+4").
void grid_units_text(int layers, int pp, int s, char *out, size_t n);
void grid_chunk_units_text(int layers, int pp, int v, int s, char *out, size_t n);
