// gpt.h: the GPT-2 model. One flat bf16 parameter buffer in layer order, cut
// into units: unit 0 = embeddings (wte, wpe), units 1..L = transformer blocks,
// unit L+1 = head (final layernorm; the output projection is tied to wte, so
// the head also reads unit 0). Forward and backward walk the units and call
// the strategy's hooks before and after each one: that is where a stage
// gathers, reduces, releases or prefetches.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "bf16.h"
#include "device.h"

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
// gpt_activation_bytes stays below 2^62 in size_t arithmetic: with B <= 2^20,
// T <= 2^10 (the presets' longest context), C <= 2^15, NH <= 2^10,
// V <= 2^20 and L <= 254, a layer saves at most 2^30 tokens x (16 C x 4 + 16)
// bytes + B NH T^2 x 4 bytes < 2^53, and L layers < 2^61.
#define GPT_MAX_CHANNELS (1 << 15)
#define GPT_MAX_HEADS (1 << 10)
#define GPT_MAX_VOCAB (1 << 20)
#define GPT_MAX_CONTEXT (1 << 10)
#define GPT_MAX_BATCH (1 << 20)
#define GPT_UNIT_EMBED 0

typedef struct GPTLayout {
    GPTConfig cfg;
    size_t num_params;       // Ψ (unpadded)
    int num_units;           // L + 2
    Range unit[GPT_MAX_UNITS];
    // offsets of each tensor relative to the start of its unit
    size_t blk_off[BLK_NTENSORS + 1], emb_off[EMB_NTENSORS + 1], head_off[HEAD_NTENSORS + 1];
    size_t max_unit_params;
} GPTLayout;

// Fails (usage error) when the shape is invalid (heads must divide channels, ...).
void gpt_layout(GPTLayout *l, const GPTConfig *cfg);
static inline int gpt_unit_head(const GPTLayout *l) { return l->num_units - 1; }
static inline int gpt_unit_block(int layer) { return 1 + layer; }
// Units whose parameters unit u reads: itself, and for the head also the
// embeddings (tied wte). Returns the count written to out[].
int gpt_unit_reads(const GPTLayout *l, int u, int out[2]);
const char *gpt_unit_name(const GPTLayout *l, int u, char *buf, size_t n);  // "embed", "block 3", "head"

// Initial values of flat parameters [begin, end) in fp32. Each element depends
// only on (seed, index), so any rank count or stage draws the same weights:
// N(0, 0.02) for weights, N(0, 0.02/sqrt(2L)) for the residual projections,
// 0 for biases, 1 for layernorm gains.
void gpt_init_values(const GPTLayout *l, uint64_t seed, size_t begin, size_t end, float *out);

// Matmul FLOPs per token for forward+backward: 6*Ψ_matmul + attention 12*L*C*T
// (Ψ_matmul: weights that enter a GEMM, including the tied output projection).
double gpt_flops_per_token(const GPTLayout *l, int T);

// Row stride of the logits (BT, V): V rounded up to a multiple of 64, so that
// every row starts 128-byte aligned in bf16 and the head's GEMMs can use the
// tensor cores' vector loads (GPT-2's V = 50257 would leave rows 2-byte
// aligned). The padding columns are never read or written.
static inline int gpt_logits_stride(const GPTConfig *c) { return (c->vocab_size + 63) / 64 * 64; }

// Activation bytes this trainer keeps for one micro-batch (per layer and total)
// and the backward scratch; used by the report and memory_math.
typedef struct GPTActBytes {
    size_t per_layer, embed_and_head, total_saved, backward_scratch, grad_workspace;
} GPTActBytes;
GPTActBytes gpt_activation_bytes(const GPTLayout *l, int B, int T, int act_bytes);

// Hooks a strategy supplies. `ctx` is the strategy's context.
typedef struct GPTHooks {
    void *ctx;
    // bf16 parameters of unit u, valid between before_* and after_* of a unit that reads it
    const bf16 *(*params)(void *ctx, int u);
    void (*before_forward)(void *ctx, int u);
    void (*after_forward)(void *ctx, int u);
    void (*before_backward)(void *ctx, int u);
    // all gradients of unit u for this micro-batch are complete in grads (fp32, unit-sized);
    // the strategy folds them into its bf16 gradients (accumulate, bucket, reduce)
    void (*grads_ready)(void *ctx, int u, const float *grads);
    void (*after_backward)(void *ctx, int u);
} GPTHooks;

typedef struct GPT {
    GPTLayout L;
    Device *dev;
    int B, T;
    Buf acts;          // saved activations, all layers (activations)
    Buf scratch;       // backward temporaries (workspace)
    Buf unit_grads;    // fp32 gradients of the unit being differentiated (workspace)
    Buf embed_grads;   // fp32 gradients of the embeddings, live through backward (tied wte)
    float *losses_host;
    // pointers into acts/scratch, set by gpt_alloc
    struct GPTActs *a;
} GPT;

// Allocates activations and workspaces for micro-batch B x T on dev.
void gpt_alloc(GPT *g, const GPTLayout *l, Device *dev, int B, int T);
void gpt_free(GPT *g);
// Copies inputs/targets (host, B*T each) to the device, runs forward through
// all units. dloss_scale != 0 also leaves dloss/dlogits ready for backward.
// Returns the mean loss over the B*T tokens (synchronizes).
double gpt_forward(GPT *g, const GPTHooks *h, const int32_t *inputs, const int32_t *targets,
                   float dloss_scale);
// Backward through all units in reverse, calling grads_ready per unit.
void gpt_backward(GPT *g, const GPTHooks *h);
