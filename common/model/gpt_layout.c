// gpt_layout.c: GPT-2 shapes, the flat parameter layout, initial values, and
// the FLOP and activation counts that reports set beside measurements.
#include <math.h>
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

void gpt_layout(GPTLayout *l, const GPTConfig *cfg) {
    const GPTConfig c = *cfg;
    if (c.channels <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.vocab_size <= 0 || c.max_seq_len <= 0)
        fail_usage("model sizes must be positive (layers %d, d-model %d, heads %d, vocab %d, seq %d)",
                   c.num_layers, c.channels, c.num_heads, c.vocab_size, c.max_seq_len);
    if (c.channels % c.num_heads != 0)
        fail_usage("--heads %d does not divide --d-model %d; pick heads that divide it", c.num_heads, c.channels);
    if (c.num_layers + 2 > GPT_MAX_UNITS)
        fail_usage("--layers %d is more than this build supports (%d)", c.num_layers, GPT_MAX_UNITS - 2);
    if (c.channels > GPT_MAX_CHANNELS || c.num_heads > GPT_MAX_HEADS || c.vocab_size > GPT_MAX_VOCAB ||
        c.max_seq_len > GPT_MAX_CONTEXT)
        fail_usage("model sizes beyond this build's limits (d-model %d of %d, heads %d of %d, vocab %d of %d, "
                   "context %d of %d); give smaller ones", c.channels, GPT_MAX_CHANNELS, c.num_heads, GPT_MAX_HEADS,
                   c.vocab_size, GPT_MAX_VOCAB, c.max_seq_len, GPT_MAX_CONTEXT);
    memset(l, 0, sizeof *l);
    l->cfg = c;
    size_t C = (size_t)c.channels;
    size_t emb[EMB_NTENSORS] = {(size_t)c.vocab_size * C, (size_t)c.max_seq_len * C};
    size_t blk[BLK_NTENSORS] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    size_t head[HEAD_NTENSORS] = {C, C};
    size_t emb_n = lay_out(l->emb_off, emb, EMB_NTENSORS);
    size_t blk_n = lay_out(l->blk_off, blk, BLK_NTENSORS);
    size_t head_n = lay_out(l->head_off, head, HEAD_NTENSORS);
    l->num_units = c.num_layers + 2;
    size_t at = 0;
    for (int u = 0; u < l->num_units; u++) {
        size_t n = u == 0 ? emb_n : (u == l->num_units - 1 ? head_n : blk_n);
        l->unit[u] = (Range){at, n};
        at += n;
        if (n > l->max_unit_params) l->max_unit_params = n;
    }
    l->num_params = at;
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

// splitmix64: a counter-based generator, so element i's value needs no state
static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// standard normal for element i via Box-Muller on two counter-derived uniforms
static float normal_at(uint64_t seed, size_t i) {
    uint64_t a = splitmix64(seed ^ splitmix64(2 * (uint64_t)i));
    uint64_t b = splitmix64(seed ^ splitmix64(2 * (uint64_t)i + 1));
    double u1 = ((a >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
    double u2 = (b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

typedef enum { INIT_ZERO, INIT_ONE, INIT_NORMAL } InitKind;

// How tensor `t` of unit u starts (GPT-2: weights N(0, 0.02), wpe N(0, 0.01),
// residual projections scaled by 1/sqrt(2L), biases 0, layernorm gains 1).
static InitKind tensor_init(const GPTLayout *l, int u, int t, float *std) {
    *std = 0.02f;
    if (u == GPT_UNIT_EMBED) {
        if (t == EMB_WPE) *std = 0.01f;
        return INIT_NORMAL;
    }
    if (u == gpt_unit_head(l)) return t == HEAD_LNFW ? INIT_ONE : INIT_ZERO;
    switch (t) {
    case BLK_LN1W: case BLK_LN2W: return INIT_ONE;
    case BLK_QKVW: case BLK_FCW: return INIT_NORMAL;
    case BLK_ATTPROJW: case BLK_FCPROJW:
        *std = 0.02f / sqrtf(2.0f * (float)l->cfg.num_layers);
        return INIT_NORMAL;
    default: return INIT_ZERO;
    }
}

static const size_t *unit_offsets(const GPTLayout *l, int u, int *ntensors) {
    if (u == GPT_UNIT_EMBED) { *ntensors = EMB_NTENSORS; return l->emb_off; }
    if (u == gpt_unit_head(l)) { *ntensors = HEAD_NTENSORS; return l->head_off; }
    *ntensors = BLK_NTENSORS;
    return l->blk_off;
}

void gpt_init_values(const GPTLayout *l, uint64_t seed, size_t begin, size_t end, float *out) {
    for (size_t i = begin > l->num_params ? begin : l->num_params; i < end; i++)
        out[i - begin] = 0.0f;  // shard padding past Ψ
    for (int u = 0; u < l->num_units; u++) {
        int nt;
        const size_t *off = unit_offsets(l, u, &nt);
        for (int t = 0; t < nt; t++) {
            size_t lo = l->unit[u].offset + off[t], hi = l->unit[u].offset + off[t + 1];
            if (hi <= begin || lo >= end) continue;
            if (lo < begin) lo = begin;
            if (hi > end) hi = end;
            float std;
            InitKind kind = tensor_init(l, u, t, &std);
            #pragma omp parallel for schedule(static)
            for (size_t i = lo; i < hi; i++)
                out[i - begin] = kind == INIT_NORMAL ? std * normal_at(seed, i) : (kind == INIT_ONE ? 1.0f : 0.0f);
        }
    }
}

double gpt_flops_per_token(const GPTLayout *l, int T) {
    const GPTConfig *c = &l->cfg;
    double C = c->channels, L = c->num_layers;
    double matmul_params = L * 12.0 * C * C + (double)c->vocab_size * C;  // qkv 3C², proj C², fc 4C², fcproj 4C²; tied head V·C
    // 2 FLOPs per multiply-add, forward once and backward twice: 6 per weight;
    // attention scores and weighted sum: 4·T·C forward per layer, 12·T·C with backward
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

GPTActBytes gpt_activation_bytes(const GPTLayout *l, int B, int T, int act_bytes) {
    const GPTConfig *c = &l->cfg;
    size_t BT = (size_t)B * T, C = c->channels, NH = c->num_heads, Vp = (size_t)gpt_logits_stride(c);
    GPTActBytes r;
    // per layer: ln1 C, qkv 3C, atty C, x2 C, ln2 C, fch 4C, fch_gelu 4C, x3 C = 16C
    // activations; fp32 mean and rstd of both layernorms; fp32 attention probabilities NH·T
    r.per_layer = BT * (16 * C * act_bytes + 4 * sizeof(float)) + (size_t)B * NH * T * T * sizeof(float);
    // embedding output x0 C, lnf C, logits Vp (V padded), one (BT,C) temporary;
    // lnf mean/rstd and losses fp32; input and target token ids int32
    r.embed_and_head = BT * ((3 * C + Vp) * act_bytes + 3 * sizeof(float) + 2 * sizeof(int32_t));
    r.total_saved = r.per_layer * c->num_layers + r.embed_and_head;
    // backward: residual gradient C, one C-wide and two 4C-wide temporaries
    r.backward_scratch = BT * 10 * C * act_bytes;
    size_t block = l->unit[1].count, head = l->unit[gpt_unit_head(l)].count;
    r.grad_workspace = (l->unit[GPT_UNIT_EMBED].count + (block > head ? block : head)) * sizeof(float);
    return r;
}
