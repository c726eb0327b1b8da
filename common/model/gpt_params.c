// gpt_params.c: what each element of a layout's flat buffer is: how tensor
// parallelism splits its tensor (Shoeybi et al. 2019, Megatron-LM), which
// element of the whole model (tp_size = 1) it is, and its initial value,
// drawn from that whole-model index so that every split starts from the same
// weights.
#include <math.h>
#include "gpt.h"

TPSplit gpt_tensor_split(const GPTLayout *l, int u, int t) {
    if (u == GPT_UNIT_EMBED) return t == EMB_WTE ? TP_VOCAB : TP_REPLICATED;
    if (u == gpt_unit_head(l)) return TP_REPLICATED;
    switch (t) {
    case BLK_QKVW: case BLK_QKVB: case BLK_FCW: case BLK_FCB: return TP_COLUMN;
    case BLK_ATTPROJW: case BLK_FCPROJW: return TP_ROW;
    default: return TP_REPLICATED;  // layernorms, the row-parallel layers' biases
    }
}

static const size_t *unit_offsets(const GPTLayout *l, int u, int *ntensors) {
    if (u == GPT_UNIT_EMBED) { *ntensors = EMB_NTENSORS; return l->emb_off; }
    if (u == gpt_unit_head(l)) { *ntensors = HEAD_NTENSORS; return l->head_off; }
    *ntensors = BLK_NTENSORS;
    return l->blk_off;
}

// Where tensor t of unit u starts in the whole model's flat buffer.
static size_t whole_tensor_offset(const GPTLayout *l, int u, int t) {
    size_t emb = l->whole_emb_off[EMB_NTENSORS], blk = l->whole_blk_off[BLK_NTENSORS];
    if (u == GPT_UNIT_EMBED) return l->whole_emb_off[t];
    size_t unit = emb + (size_t)(u - 1) * blk;  // the head follows the L blocks
    return unit + (u == gpt_unit_head(l) ? l->head_off[t] : l->whole_blk_off[t]);
}

// This rank's piece of one whole tensor seen as a matrix of `cols` columns:
// a column-parallel tensor keeps `part_rows` rows from row `first` of every
// block of `block_rows` rows (q, k and v are three such blocks of QKV), a
// row-parallel one `part_cols` columns from column `first` of every row,
// wte `part_rows` rows from row `first`, those at `valid_rows` (the whole
// model's padded rows) or beyond being padding of the part alone. A whole
// tensor (tp 1, or replicated) maps element e to e.
typedef struct TensorPiece {
    TPSplit split;
    int whole;
    size_t whole_offset;
    size_t cols, block_rows, part_rows, part_cols, first, valid_rows;
} TensorPiece;

static TensorPiece tensor_piece(const GPTLayout *l, int u, int t) {
    size_t C = (size_t)l->cfg.channels, tp = (size_t)l->tp_size, r = (size_t)l->tp_rank;
    TensorPiece p = {.split = gpt_tensor_split(l, u, t), .whole_offset = whole_tensor_offset(l, u, t), .cols = 1};
    p.whole = tp == 1 || p.split == TP_REPLICATED;
    if (p.split == TP_VOCAB) {
        p.cols = C;
        p.part_rows = (size_t)l->vocab_part;
        p.first = (size_t)l->vocab_begin;
        p.valid_rows = (size_t)gpt_vocab_padded(l->cfg.vocab_size, 1);
    } else if (p.split == TP_COLUMN) {
        p.cols = t == BLK_QKVW || t == BLK_FCW ? C : 1;
        p.block_rows = t == BLK_QKVW || t == BLK_QKVB ? C : 4 * C;
        p.part_rows = p.block_rows / tp;
        p.first = r * p.part_rows;
    } else if (p.split == TP_ROW) {
        p.cols = t == BLK_ATTPROJW ? C : 4 * C;
        p.part_cols = p.cols / tp;
        p.first = r * p.part_cols;
    }
    return p;
}

// Whole-model index of element e of this rank's piece, or GPT_PADDING.
static size_t piece_global(const TensorPiece *p, size_t e) {
    if (p->whole) return p->whole_offset + e;
    switch (p->split) {
    case TP_VOCAB: {
        size_t row = p->first + e / p->cols;
        return row < p->valid_rows ? p->whole_offset + row * p->cols + e % p->cols : GPT_PADDING;
    }
    case TP_COLUMN: {
        size_t local_row = e / p->cols, block = local_row / p->part_rows;
        size_t row = block * p->block_rows + p->first + local_row % p->part_rows;
        return p->whole_offset + row * p->cols + e % p->cols;
    }
    case TP_ROW: return p->whole_offset + e / p->part_cols * p->cols + p->first + e % p->part_cols;
    default: return p->whole_offset + e;  // TP_REPLICATED
    }
}

size_t gpt_global_index(const GPTLayout *l, size_t i) {
    int hu = gpt_unit_head(l), u;
    if (i < l->unit[1].offset) u = GPT_UNIT_EMBED;
    else if (i >= l->unit[hu].offset) u = hu;
    else u = 1 + (int)((i - l->unit[1].offset) / l->unit[1].count);
    int nt;
    const size_t *off = unit_offsets(l, u, &nt);
    size_t e = i - l->unit[u].offset;
    int t = 0;
    while (t + 1 < nt && e >= off[t + 1]) t++;
    TensorPiece p = tensor_piece(l, u, t);
    return piece_global(&p, e - off[t]);
}

int gpt_replicated_ranges(const GPTLayout *l, Range *out, int max) {
    int n = 0;
    size_t end = 0;  // end of the last range found
    for (int u = 0; u < l->num_units; u++) {
        int nt;
        const size_t *off = unit_offsets(l, u, &nt);
        for (int t = 0; t < nt; t++) {
            if (gpt_tensor_split(l, u, t) != TP_REPLICATED) continue;
            size_t lo = l->unit[u].offset + off[t], count = off[t + 1] - off[t];
            if (n > 0 && lo == end) {
                if (n <= max) out[n - 1].count += count;
            } else {
                if (n < max) out[n] = (Range){lo, count};
                n++;
            }
            end = lo + count;
        }
    }
    return n;
}

// ---- initial values ----

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

// The index whole-model element g draws its initial value from: its index
// in the unpadded model, whose wte has V rows (wte opens the whole model);
// GPT_PADDING for wte's padding rows, which draw nothing.
static size_t draw_index(const GPTLayout *l, size_t g) {
    size_t real = (size_t)l->cfg.vocab_size * l->cfg.channels, stored = l->whole_emb_off[EMB_WTE + 1];
    if (g < real) return g;
    return g < stored ? GPT_PADDING : g - (stored - real);
}

void gpt_init_values(const GPTLayout *l, uint64_t seed, size_t begin, size_t end, float *out) {
    for (size_t i = begin > l->num_params ? begin : l->num_params; i < end; i++)
        out[i - begin] = 0.0f;  // shard padding past Ψ
    for (int u = 0; u < l->num_units; u++) {
        int nt;
        const size_t *off = unit_offsets(l, u, &nt);
        for (int t = 0; t < nt; t++) {
            size_t base = l->unit[u].offset + off[t], lo = base, hi = l->unit[u].offset + off[t + 1];
            if (hi <= begin || lo >= end) continue;
            if (lo < begin) lo = begin;
            if (hi > end) hi = end;
            float std;
            InitKind kind = tensor_init(l, u, t, &std);
            TensorPiece p = tensor_piece(l, u, t);
            #pragma omp parallel for schedule(static)
            for (size_t i = lo; i < hi; i++) {
                size_t g = piece_global(&p, i - base);
                if (g != GPT_PADDING) g = draw_index(l, g);
                out[i - begin] = g == GPT_PADDING ? 0.0f
                               : kind == INIT_NORMAL ? std * normal_at(seed, g) : (kind == INIT_ONE ? 1.0f : 0.0f);
            }
        }
    }
}
