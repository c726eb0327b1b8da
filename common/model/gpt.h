// gpt.h: the GPT-2 model. One flat bf16 parameter buffer in layer order, cut
// into units: unit 0 = embeddings (wte, wpe), units 1..L = transformer blocks,
// unit L+1 = head (final layernorm; the output projection is tied to wte, so
// the head also reads unit 0). The model computes one unit for one
// micro-batch at a time: gpt_unit_forward takes the unit's parameters,
// gpt_unit_backward returns its gradients. It never walks the layers for a
// stage: each stage writes its own loop over the units, with its gathers,
// buckets and releases where they happen. A pipeline stage computes a
// contiguous range of units for several micro-batches in flight ("slots").
// With tensor parallelism (Shoeybi et al. 2019, Megatron-LM) every rank of a
// tp group holds its part of each block and of wte (gpt_layout_tp).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "bf16.h"
#include "device.h"

struct Comm;

typedef struct GPTConfig {
    int max_seq_len;  // wpe rows
    int vocab_size;
    int num_layers;
    int num_heads;
    int channels;
} GPTConfig;

// Fills *cfg for "tiny", "small", "gpt2-124m", "gpt2-350m", "gpt2-774m",
// "gpt2-1558m"; returns 0 for an unknown name.
int gpt_preset(const char *name, GPTConfig *cfg);
const char *gpt_preset_names(void);  // "tiny, small, gpt2-124m, ..." for messages

typedef struct Range {
    size_t offset, count;  // elements of the flat buffer
} Range;

// Tensors of one block, in storage order.
enum {
    BLK_LN1W, BLK_LN1B, BLK_QKVW, BLK_QKVB, BLK_ATTPROJW, BLK_ATTPROJB,
    BLK_LN2W, BLK_LN2B, BLK_FCW, BLK_FCB, BLK_FCPROJW, BLK_FCPROJB, BLK_NTENSORS
};
enum { EMB_WTE, EMB_WPE, EMB_NTENSORS };
enum { HEAD_LNFW, HEAD_LNFB, HEAD_NTENSORS };

#define GPT_MAX_UNITS 256
// Limits of a shape, so that every byte count of the layout and of
// gpt_activation_bytes stays below 2^62 in size_t arithmetic, and a
// micro-batch's token count in an int: with B <= 2^20, T <= 2^20 (--context),
// B T <= 2^30 tokens, C <= 2^15, NH <= 2^10, V <= 2^20 and L <= 254, a layer
// saves at most 2^30 tokens x (16 C x 4 + 16) bytes < 2^52, the logits
// 2^30 x 2^20 x 4 = 2^52, and L layers < 2^60; the materialized attention's
// B NH T^2 x 4 bytes a layer is held under 2^52 apart (gpt_check_tokens).
#define GPT_MAX_CHANNELS (1 << 15)
#define GPT_MAX_HEADS (1 << 10)
#define GPT_MAX_VOCAB (1 << 20)
#define GPT_MAX_CONTEXT (1 << 20)
#define GPT_MAX_BATCH (1 << 20)
#define GPT_MAX_TOKENS (1 << 30)
#define GPT_MAX_ATTENTION_BYTES ((double)(1ull << 52))
#define GPT_UNIT_EMBED 0

typedef struct GPTLayout {
    GPTConfig cfg;
    // tensor-parallel part this layout describes: rank tp_rank of tp_size
    // (1, 0: the whole model, the layout of stages 01-06)
    int tp_size, tp_rank;
    // wte rows: vocab_padded over the group (gpt_vocab_padded); this rank
    // holds vocab_part of them from row vocab_begin. Rows >= V are padding:
    // zero, never a token or a target, left out of the softmax and the loss,
    // their gradient zero.
    int vocab_padded, vocab_part, vocab_begin;
    // Ψ of this layout, wte's padding rows included (they are stored,
    // updated and sharded like any parameter); tp: this rank's part
    size_t num_params;
    int num_units;           // L + 2
    Range unit[GPT_MAX_UNITS];
    // offsets of each tensor relative to the start of its unit
    size_t blk_off[BLK_NTENSORS + 1], emb_off[EMB_NTENSORS + 1], head_off[HEAD_NTENSORS + 1];
    size_t max_unit_params;
    // tensor offsets within a unit of the whole model (tp_size = 1; the head is whole), for gpt_global_index
    size_t whole_blk_off[BLK_NTENSORS + 1], whole_emb_off[EMB_NTENSORS + 1];
} GPTLayout;

// The rows wte is stored with: V rounded up to a multiple of 128 (llm.c's
// Vp), so that every GEMM of the embedding and the tied head is aligned (on
// a GPU, V = 50257 sends cuBLASLt to its slow align-1 kernels). Under tensor
// parallelism each of the tp ranks holds an equal part, a multiple of 64
// rows so that its logits' rows stay aligned too; the rule is one multiple,
// lcm(128, 64 tp): 64 tp for an even tp, 128 tp for an odd one, and 128 for
// tp = 1. So the whole model (tp = 1) is a multiple of 128 at any tp, and a
// tp part never holds fewer rows than the whole model's padding asks for.
int gpt_vocab_padded(int vocab, int tp_size);
// Rows of this layout's wte part below V: its tokens, the logits' columns
// the softmax reads (the rest of vocab_part is padding).
int gpt_real_vocab_rows(const GPTLayout *l);
// Elements of wte's padding rows in this layout (tp: this rank's part): the
// part of num_params that is not the model's, (vocab_padded - V)·C whole.
size_t gpt_padding_params(const GPTLayout *l);

// Fails (usage error) when the shape is invalid (heads must divide channels, ...).
void gpt_layout(GPTLayout *l, const GPTConfig *cfg);
// Rank tp_rank's part under tensor parallelism of tp_size ranks; usage error
// when tp_size does not divide the heads. tp_size = 1 is gpt_layout.
void gpt_layout_tp(GPTLayout *l, const GPTConfig *cfg, int tp_size, int tp_rank);
static inline int gpt_unit_head(const GPTLayout *l) { return l->num_units - 1; }
static inline int gpt_unit_block(int layer) { return 1 + layer; }
// Units whose parameters unit u reads: itself, and for the head also the
// embeddings (tied wte). Returns the count written to out[].
int gpt_unit_reads(const GPTLayout *l, int u, int out[2]);
const char *gpt_unit_name(const GPTLayout *l, int u, char *buf, size_t n);  // "embed", "block 3", "head"

// How tensor parallelism splits tensor t of unit u (Megatron-LM):
//   TP_COLUMN: output rows split (QKV weight and bias, by heads: rank r takes
//              heads [r NH/T, (r+1) NH/T) of each of q, k, v; the MLP's first
//              linear and its bias);
//   TP_ROW: input columns split (attention projection, MLP second linear);
//   TP_VOCAB: wte's rows split over the padded vocabulary;
//   TP_REPLICATED: whole on every tp rank (layernorms, the row-parallel
//              layers' biases, wpe): the same values and the same gradients
//              on every rank, so a global gradient norm counts them once.
// With tp_size = 1 every tensor is whole; the kind still names its role.
typedef enum { TP_REPLICATED, TP_COLUMN, TP_ROW, TP_VOCAB } TPSplit;
TPSplit gpt_tensor_split(const GPTLayout *l, int u, int t);
// Flat ranges of this layout that hold TP_REPLICATED tensors, adjacent ones
// merged, in order. Writes at most max; returns how many there are.
int gpt_replicated_ranges(const GPTLayout *l, Range *out, int max);
// Index in the whole model's layout (tp_size = 1, wte padded to
// gpt_vocab_padded(V, 1) rows) of element i of this layout, or GPT_PADDING
// for a row of wte past the whole model's (a tp part padded further).
#define GPT_PADDING ((size_t)-1)
size_t gpt_global_index(const GPTLayout *l, size_t i);

// Initial values of flat parameters [begin, end) in fp32. Each element depends
// only on (seed, its index in the whole model), so any rank count, stage or
// tensor-parallel split draws the same weights: N(0, 0.02) for weights,
// N(0, 0.02/sqrt(2L)) for the residual projections, 0 for biases, 1 for
// layernorm gains, 0 for wte's padding rows. The index an element draws from
// is its index in the unpadded model (wte of V rows), so the padding rows
// take no draw and every real weight is what it was before wte was padded.

void gpt_init_values(const GPTLayout *l, uint64_t seed, size_t begin, size_t end, float *out);

// Matmul FLOPs per token for forward+backward of the whole model:
// 6*Ψ_matmul + attention 12*L*C*T (Ψ_matmul: weights that enter a GEMM,
// including the tied output projection, of V rows: the padding rows' GEMM
// columns are work the device does, not the model's FLOPs, so MFU does not
// count them).
double gpt_flops_per_token(const GPTLayout *l, int T);

// Row stride of this rank's logits (BT, vocab_part): vocab_part, a multiple
// of 64 (gpt_vocab_padded), so that every row starts 128-byte aligned in bf16
// and the head's GEMMs can use the tensor cores' vector loads. The columns
// of wte's padding rows are computed (zero), left out of the softmax, and
// zero in dlogits.
static inline int gpt_logits_stride(const GPTLayout *l) { return l->vocab_part; }

// What one rank computes: micro-batches of B sequences of T tokens, `slots`
// of them in flight at once (each keeps its own activations), through units
// first_unit..last_unit (a pipeline stage's contiguous range; the first stage
// has the embeddings, the last the head).
// What a block keeps for its backward (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models"; Megatron-LM's
// --recompute-granularity):
//   GPT_RECOMPUTE_NONE: every tensor its backward reads;
//   GPT_RECOMPUTE_SELECTIVE: all but the attention core's (B, heads, T, T)
//     probabilities, recomputed from the saved q, k, v before the block's
//     backward (with flash attention there are none: it keeps what none
//     keeps, and recomputes nothing);
//   GPT_RECOMPUTE_FULL: only the block's input (the residual stream entering
//     it); its backward first runs its forward again from there.
// What is recomputed goes to one working set that every block and slot
// shares (only one unit's backward runs at a time), and it is the same bits:
// the same kernels on the same inputs.
typedef enum { GPT_RECOMPUTE_NONE = 0, GPT_RECOMPUTE_SELECTIVE, GPT_RECOMPUTE_FULL } GPTRecompute;
const char *gpt_recompute_name(GPTRecompute r);  // "none", "selective", "full"
// -1 for a name that is none of those
int gpt_recompute_of(const char *name);

// How a block's attention core runs:
//   GPT_ATTENTION_FLASH: FlashAttention (Dao et al. 2022), by tiles with an
//     online softmax (flash_math.h); it saves its output and each query
//     row's log-sum-exp, (B, heads, T), and its backward recomputes the
//     probabilities a tile at a time. No (T,T) matrix is kept.
//   GPT_ATTENTION_MATERIALIZED: the textbook form, which keeps the
//     (B, heads, T, T) probabilities for backward (what selective recompute
//     drops).
typedef enum { GPT_ATTENTION_FLASH = 0, GPT_ATTENTION_MATERIALIZED } GPTAttention;
const char *gpt_attention_name(GPTAttention a);  // "flash", "materialized"
// -1 for a name that is neither
int gpt_attention_of(const char *name);
// Refuses (exit 2, one line) a micro-batch of more than GPT_MAX_TOKENS
// tokens, and materialized attention whose (T,T) probabilities exceed
// GPT_MAX_ATTENTION_BYTES a layer: the limits above gpt_plan's byte counts
// rely on. c NULL: the token count alone.
void gpt_check_tokens(const GPTConfig *c, int B, int T, GPTAttention a);

typedef struct GPTPlan {
    int B, T;
    int slots;
    int first_unit, last_unit;
    GPTRecompute recompute;
    GPTAttention attention;
    // With full recompute (gpt_checkpoints.c): the blocks' saved inputs live
    // in pinned host memory (DeepSpeed's cpu_checkpointing), and/or each tp
    // rank keeps 1/tp of them (partition_activations, tp > 1), all-gathered
    // again before the block recomputes. Each goes to its store as its
    // block's forward writes it and comes back one unit ahead of the backward
    // that needs it; the device keeps two whole ones.
    int offload_activations, partition_activations;
    // Sequence parallelism (Korthikanti et al. 2022, tp > 1): the residual
    // stream, the layernorms and their outputs are split over the tp ranks by
    // the B·T tokens (rank r holds rows [r BT/tp, (r+1) BT/tp)); Megatron's f
    // and g become an all-gather before each column-parallel linear and a
    // reduce-scatter after each row-parallel one (gpt_tp.c).
    int sequence_parallel;
    // DeepSpeed-Ulysses (Jacobs et al. 2023; cp > 1, 0 or 1: none): every
    // sequence of the micro-batch is split over cp ranks by its positions,
    // this rank holding positions [cp_rank·T, (cp_rank + 1)·T) of each (T
    // above is its part), and every operator that works token by token runs
    // on that part alone. Around the attention core an all-to-all over the
    // cp group (gpt_set_seq_group) gives each rank every position of 1/cp of
    // its heads, and another returns the output to position parts
    // (gpt_ulysses.c); backward the same in reverse. Flash attention only.
    // cp_ring: ring attention instead (Liu et al. 2023, gpt_ring.c): each
    // sequence in 2·cp chunks, this rank holding chunks cp_rank and
    // 2·cp - 1 - cp_rank (T above is their two lengths, in that order); the
    // keys and values of every rank travel around the cp group.
    int cp, cp_rank, cp_ring;
    // ZeRO-R's contiguous buffers (Rajbhandari et al. 2020, section 6;
    // DeepSpeed's contiguous_gradients and contiguous_memory_optimization):
    // the saved activations of every slot, the recompute's working set and
    // the fp32 unit gradients live in regions allocated once, written in
    // place as they are produced. Without it each is allocated as its unit
    // produces it and released after its backward, as a framework's
    // allocator sees them, between the short-lived buffers (gathered
    // units, buckets, scratch) that fragment the device's arena.
    int contiguous;
    // The loss in tiles (ALST's tiled logits, Rajbhandari et al. 2021's
    // memory-centric tiling; 0: whole): the LM head, the softmax and the
    // cross-entropy run over loss_tiles chunks of ceil(B·T / loss_tiles)
    // tokens, one chunk's logits live at a time in a buffer the slots share;
    // the head's backward computes each chunk's logits again and sends its
    // gradient into dX and the tied wte's gradient before the next chunk. No
    // slot keeps logits from forward to backward.
    int loss_tiles;
    // The MLP in tiles (ALST's tiled MLP; 0: whole): each block's fc, GELU
    // and projection run over mlp_tiles chunks of the B·T tokens (as
    // gpt_mlp_tile_rows), one chunk's 4h intermediates live at a time in a
    // buffer the blocks and slots share; no block keeps fc's or the GELU's
    // output: its backward computes each chunk's again from ln2's output.
    int mlp_tiles;
    // Zero bubble (Qi et al. 2024; 0: off): a block's backward runs in two
    // parts. B (gpt_unit_backward_input) computes the input's gradient, which
    // the previous pipeline stage waits for, and copies into one of w_slots
    // W stashes what the weights' gradients read: its four linears' inputs
    // and output gradients, and its layernorms' gradients (computed in B, as
    // they come with the input's). W (gpt_unit_backward_weights) later forms
    // the linears' gradients from the stash alone, the same products in the
    // same order: the unit's gradients are 1F1B's to the bit. The embeddings
    // and the head run whole in B. Not with mlp_tiles (each chunk's GELU
    // output is gone by W).
    int w_slots;
    // Interleaved pipeline stages (Narayanan et al. 2021; chunks > 1): the
    // plan's blocks are `chunks` runs of chunk_blocks blocks, chunk_stride
    // blocks apart, the first at the range's first block; first_unit and
    // last_unit span them, and the blocks between are other stages', never
    // computed or held here. The first block of chunk j > 0 reads that
    // chunk's own input (gpt_slot_chunk_input), received for it. 0 or 1:
    // one contiguous range.
    int chunks, chunk_blocks, chunk_stride;
} GPTPlan;

#define GPT_MAX_CHUNKS 16
static inline int gpt_plan_chunks(const GPTPlan *p) { return p->chunks > 1 ? p->chunks : 1; }
// Unit ranges of chunk j of a plan (the whole range when it has one chunk):
// the embeddings open chunk 0 where the plan has them, the head closes the last.
static inline int gpt_plan_chunk_first_unit(const GPTPlan *p, int j) {
    if (j == 0) return p->first_unit;
    return (p->first_unit > 1 ? p->first_unit : 1) + j * p->chunk_stride;
}
static inline int gpt_plan_chunk_last_unit(const GPTPlan *p, int j) {
    if (j == gpt_plan_chunks(p) - 1) return p->last_unit;
    return (p->first_unit > 1 ? p->first_unit : 1) + j * p->chunk_stride + p->chunk_blocks - 1;
}
// Units the plan computes (the blocks between chunks left out).
int gpt_plan_units(const GPTPlan *p);

// Tokens in a chunk of the tiled loss: ceil(B·T / loss_tiles) rounded up to
// a multiple of 16, at most B·T; B·T untiled. 16: the cpu device's GEMMs
// split rows in blocks of 16 (kernels_cpu_matmul.c), so a chunk's rows fall
// in the blocks the whole GEMM's do and mostly get the same bits (OpenBLAS
// may round a call's edge rows differently: the tiled losses are held to
// the untiled ones within a tolerance, test_tiling.c).
#define GPT_LOSS_TILE_ALIGN 16
int gpt_loss_tile_rows(const GPTPlan *p);
// Tokens in a chunk of the tiled MLP, the same rule over mlp_tiles.
int gpt_mlp_tile_rows(const GPTPlan *p);

// Stages 01-06: every unit, one micro-batch at a time.
static inline GPTPlan gpt_plan_whole(const GPTLayout *l, int B, int T) {
    return (GPTPlan){.B = B, .T = T, .slots = 1, .first_unit = 0, .last_unit = l->num_units - 1};
}

// Bytes a plan keeps: saved activations per slot (one micro-batch through the
// plan's units) and the temporaries all slots share; the recomputation's
// working set; the backward scratch and the fp32 gradient workspace. Used by
// gpt_alloc, the budget check, the reports and memory_math.
typedef struct GPTActBytes {
    size_t per_layer;         // what one block saves for one micro-batch (by the plan's recompute)
    size_t per_slot;          // one micro-batch through the plan's units
    size_t shared;            // temporaries every slot shares
    size_t total_saved;       // per_slot * slots + shared + w_stashes: the activations buffer
    size_t w_stash;           // zero bubble: one block's W stash (plan.w_slots > 0), else 0
    size_t w_stashes;         // every one: w_stash * w_slots * the range's blocks
    size_t working;           // one block's tensors that are not saved (recomputed): the working set, 0 without recompute
    // the checkpoint store of offload_activations / partition_activations
    // (apart from total_saved): in pinned host memory with offload, else on
    // the device; and what one micro-batch puts there in forward (and takes
    // back in backward)
    size_t stored, stored_per_micro;
    size_t backward_scratch;  // residual-stream gradient per slot + shared backward temporaries
    size_t grad_workspace;    // fp32 gradients of one unit, and of the embeddings
} GPTActBytes;
GPTActBytes gpt_activation_bytes(const GPTLayout *l, const GPTPlan *p, int act_bytes);
// What one block's attention core saves for backward (fp32): the
// probabilities (B, heads, T, T) materialized, each row's lse (B, heads, T)
// with flash; this rank's heads.
size_t gpt_attention_saved_bytes(const GPTLayout *l, const GPTPlan *p);

// What the recomputation ran, as the device's kernels saw it (gpt.c meters
// each block_recompute): blocks recomputed, their kernels and FLOPs, and the
// first tensor written that the block had kept (NULL: none).
typedef struct RecomputeWork {
    long blocks, kernels;
    double flops;
    const char *overwrote;
} RecomputeWork;

typedef struct GPT {
    GPTLayout L;
    GPTPlan plan;
    Device *dev;
    struct Comm *tp;   // tensor-parallel group (L.tp_size ranks); NULL when tp_size = 1
    struct Comm *cp;   // Ulysses' sequence group (plan.cp ranks, gpt_set_seq_group); NULL when plan.cp <= 1
    Buf acts;          // saved activations of every slot, and shared temporaries (activations)
    Buf working;       // one block's recomputed tensors (act_working); empty without recompute
    struct CkptStore *ckpt;  // the blocks' saved inputs on the host or in parts (gpt_checkpoints.c), else NULL
    Buf scratch;       // backward temporaries (workspace)
    Buf unit_grads;    // fp32 gradients of the unit being differentiated (workspace)
    Buf embed_grads;   // fp32 gradients of the embeddings, live through backward (tied wte)
    Buf losses;        // per-token losses of the micro-batches queued since the last take (pinned)
    int losses_queued;
    RecomputeWork recompute_work;
    double ring_pairs;  // ring attention: query-key pairs its forward's blocks attended, the last layer's pass (gpt_ring.c)
    long units_run;    // units computed, forward or backward: the schedule's clock (zero3 counts its gathers by it)
    long backwards_run;  // of them, backwards (the trainer holds each pass to its micro-batches)
    Buf tokens;        // pinned: two staging areas for token ids (and their buckets) on their way up (gpt_slot_tokens)
    Event tokens_copied[2];  // the copies out of each area
    int tokens_next;
    // pointers into acts/scratch, set by gpt_alloc (gpt_units.h)
    struct GPTSlot *slot;  // [plan.slots]
    struct GPTWork *work;
    // without plan.contiguous: what each slot holds now, and the temporaries
    // the slots share (acts and working stay empty; gpt_held.c)
    struct SlotHeld *held;  // [plan.slots]
    Buf shared;
    // zero bubble (plan.w_slots > 0): each W slot's stash of each block of
    // the range, [w_slots][blocks] (gpt_units.h); without plan.contiguous
    // each held in w_held from its B to its W
    struct WStash *wstash;
    Buf *w_held;
    int *w_micro;  // [w_slots][blocks] the micro-batch whose B filled the stash, -1: none (its W has run)
} GPT;

// Allocates activations and workspaces for the plan on dev. tp is the tensor-
// parallel group of a layout with tp_size > 1 (its size and this rank's place
// in it match the layout's), NULL otherwise.
void gpt_alloc(GPT *g, const GPTLayout *l, Device *dev, const GPTPlan *p, struct Comm *tp);
void gpt_free(GPT *g);
// The plan's Ulysses group (plan.cp > 1): cp ranks ordered by plan.cp_rank,
// before the first unit runs.
void gpt_set_seq_group(GPT *g, struct Comm *cp);
// Ranks a plan splits each sequence over: plan.cp, or 1.
static inline int gpt_plan_cp(const GPTPlan *p) { return p->cp > 1 ? p->cp : 1; }
static inline int gpt_plan_ulysses(const GPTPlan *p) { return p->cp > 1 && !p->cp_ring; }
static inline int gpt_plan_ring(const GPTPlan *p) { return p->cp > 1 && p->cp_ring; }
// The rank's runs of positions in each sequence: 1 (its part; everything
// without cp), or 2 under ring attention (its two chunks); each of T/runs.
static inline int gpt_plan_seq_runs(const GPTPlan *p) { return gpt_plan_ring(p) ? 2 : 1; }
// The first position of the rank's run k in the whole sequence.
static inline int gpt_plan_seq_start(const GPTPlan *p, int k) {
    int n = p->T / gpt_plan_seq_runs(p), cp = gpt_plan_cp(p);
    if (!gpt_plan_ring(p)) return cp > 1 ? p->cp_rank * n : 0;
    return (k == 0 ? p->cp_rank : 2 * cp - 1 - p->cp_rank) * n;
}

// ---- one unit, one micro-batch ----
// Copies the micro-batch's token ids (host, B*T each; through pinned
// staging, reused once the copy out of it two calls ago is done) to slot s: inputs are
// read by the embeddings, targets by the head (either may be NULL where the
// plan lacks that unit). dloss_scale != 0 makes the head's forward also leave
// dloss/dlogits for backward (the scale is 1 / tokens in the global batch).
void gpt_slot_tokens(GPT *g, int s, const int32_t *inputs, const int32_t *targets, float dloss_scale);
// Slot s holds micro-batch `micro` of the step (0-based): the phase its
// units' allocations are recorded in (mem.h's MemPhase).
void gpt_slot_micro_batch(GPT *g, int s, int micro);
// Forward of unit u (in the plan's range) for the micro-batch in slot s,
// from the unit's bf16 parameters p: the first block of the range reads
// gpt_slot_input, the head writes the losses. The head's output projection is
// wte (weight tying), so the head also reads `embed`, the embeddings' unit
// parameters; no other unit reads it (NULL is fine there). Its compute goes
// on the trace's compute row as "forward".
void gpt_unit_forward(GPT *g, int u, int s, const bf16 *p, const bf16 *embed);
// Backward of unit u for slot s, after its forward, in reverse unit order,
// from the same parameters (but the embeddings', whose backward reads none:
// p may be NULL there). Returns the unit's fp32 gradients for this
// micro-batch (unit-sized, valid until the next backward). The head starts
// from its dlogits; any other last unit of the range from gpt_slot_grad.
// The tied wte's gradient has two parts: the head's backward leaves its part
// in the embeddings' gradient buffer, and the embeddings' backward adds its
// own and returns the sum; a range with the head but not the embeddings (a
// pipeline's last stage) takes the head's part with gpt_tied_wte_grads.
// Between a slot's head backward and its embeddings' backward no other
// slot's head backward runs (they share that buffer; checked).
// Under tensor parallelism every rank of the group runs the same units in the
// same order: the all-reduces inside are collective (gpt_tp.c lists them).
const float *gpt_unit_backward(GPT *g, int u, int s, const bf16 *p, const bf16 *embed);
// Zero bubble (plan.w_slots > 0): a block's backward in two parts. B is
// gpt_unit_backward but for the weights' gradients: the input's gradient
// (the slot's gradient, as above) and what W needs kept in W slot w (free:
// its last W has run); it returns NULL for a block (the embeddings and the
// head run whole and return theirs). W, later, from that stash alone:
// returns the block's gradients as gpt_unit_backward would have (the same
// bits), valid until the next backward or W.
const float *gpt_unit_backward_input(GPT *g, int u, int s, int w, const bf16 *p, const bf16 *embed);
const float *gpt_unit_backward_weights(GPT *g, int u, int w);
// After the head's backward of slot s on a range without the embeddings: the
// embeddings' unit gradient from the tied output projection (wte's part; wpe's
// is zero), for the copy of wte this range keeps.
const float *gpt_tied_wte_grads(GPT *g, int s);
// The loss, read back once per step: after the head's forward of slot s,
// gpt_slot_loss_queue copies its per-token losses to the host on the compute
// stream (no wait); gpt_losses_take then waits once and returns the sum over
// the queued micro-batches of each one's mean over its B*T tokens.
// gpt_slot_loss is the two at once (it synchronizes).
void gpt_slot_loss_queue(GPT *g, int s);
double gpt_losses_take(GPT *g);
// A pass (a step's micro-batches, or a validation's) is over: without
// plan.contiguous the last unit gradients and what a forward-only pass left
// in the slots are let go (the trainer calls it after every pass).
void gpt_pass_end(GPT *g);
double gpt_slot_loss(GPT *g, int s);
// Elements of the residual stream this rank holds for one micro-batch:
// B·T·C, or B·T·C/tp under sequence parallelism (what a pipeline stage sends).
size_t gpt_residual_elems(const GPT *g);
// (BT,C) residual stream entering the range's first block: the embeddings'
// output, or where a pipeline stage receives the previous stage's output.
void *gpt_slot_input(GPT *g, int s);
// (BT,C) residual stream leaving the range's last block: what a pipeline stage sends on.
void *gpt_slot_output(GPT *g, int s);
// Interleaved (plan.chunks > 1): chunk j's input (j = 0: gpt_slot_input),
// allocated as it arrives, and its last block's output.
void *gpt_slot_chunk_input(GPT *g, int s, int j);
void *gpt_slot_chunk_output(GPT *g, int s, int j);
// Activation bytes offload_activations moved since the last call (device to
// host in forward, host to device in backward), then zeroes them.
void gpt_take_offload_bytes(GPT *g, double *to_host, double *to_device);
// (BT,C) gradient of the residual stream: before the backward of a range
// without the head, where dL/d(gpt_slot_output) is received; after the
// backward of the range's first block, dL/d(gpt_slot_input), to send back.
void *gpt_slot_grad(GPT *g, int s);
