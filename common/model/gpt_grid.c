// gpt_grid.c: the states of a 3D grid's ranks (see gpt_grid.h).
#include "gpt_grid.h"
#include <stdio.h>
#include <stdlib.h>
#include "check.h"

void grid_coords(int rank, int tp, int dp, int *tp_rank, int *stage, int *replica) {
    *tp_rank = rank % tp;
    *replica = rank / tp % dp;
    *stage = rank / (tp * dp);
}

void grid_stage_blocks(int layers, int pp, int s, int *first, int *end) {
    int base = layers / pp, extra = layers % pp;
    *first = s * base + (s < extra ? s : extra);
    *end = *first + base + (s < extra);
}

void grid_stage_units(int layers, int pp, int s, int *first_unit, int *last_unit) {
    int first, end;
    grid_stage_blocks(layers, pp, s, &first, &end);
    *first_unit = s == 0 ? GPT_UNIT_EMBED : gpt_unit_block(first);
    *last_unit = s == pp - 1 ? layers + 1 : gpt_unit_block(end - 1);
}

void grid_chunk_units(int layers, int pp, int v, int s, int j, int *first_unit, int *last_unit) {
    int c = j * pp + s, k = layers / (pp * v);
    *first_unit = c == 0 ? GPT_UNIT_EMBED : gpt_unit_block(c * k);
    *last_unit = c == pp * v - 1 ? layers + 1 : gpt_unit_block((c + 1) * k - 1);
}

void grid_plan_chunks(int layers, int pp, int v, int s, GPTPlan *p) {
    int last;
    grid_chunk_units(layers, pp, v, s, 0, &p->first_unit, &last);
    grid_chunk_units(layers, pp, v, s, v - 1, &last, &p->last_unit);
    p->chunks = v;
    p->chunk_blocks = layers / (pp * v);
    p->chunk_stride = pp * p->chunk_blocks;
}

int grid_chunk_state_ranges(const GPTLayout *l, int pp, int v, int stage, Range out[GPT_MAX_CHUNKS + 1]) {
    int n = 0;
    if (pp > 1 && stage == pp - 1)
        out[n++] = (Range){l->unit[GPT_UNIT_EMBED].offset, (size_t)l->vocab_part * l->cfg.channels};
    for (int j = 0; j < v; j++) {
        int first, last;
        grid_chunk_units(l->cfg.num_layers, pp, v, stage, j, &first, &last);
        size_t begin = l->unit[first].offset, end = l->unit[last].offset + l->unit[last].count;
        out[n++] = (Range){begin, end - begin};
    }
    return n;
}

void grid_chunk_units_text(int layers, int pp, int v, int s, char *out, size_t n) {
    int k = layers / (pp * v);
    size_t at = (size_t)snprintf(out, n, "%s%s", s == 0 ? "embed," : "", k == 1 ? "block " : "blocks ");
    for (int j = 0; j < v && at < n; j++) {
        int c = j * pp + s;
        if (k == 1) at += (size_t)snprintf(out + at, n - at, "%s%d", j ? "+" : "", c);
        else at += (size_t)snprintf(out + at, n - at, "%s%d-%d", j ? "+" : "", c * k, (c + 1) * k - 1);
    }
    if (s == pp - 1 && at < n) snprintf(out + at, n - at, ",head");
}

void grid_units_text(int layers, int pp, int s, char *out, size_t n) {
    int first, end;
    grid_stage_blocks(layers, pp, s, &first, &end);
    const char *pre = s == 0 ? "embed," : "", *post = s == pp - 1 ? ",head" : "";
    if (end - first == 1) snprintf(out, n, "%sblock %d%s", pre, first, post);
    else snprintf(out, n, "%sblocks %d-%d%s", pre, first, end - 1, post);
}

int grid_state_ranges(const GPTLayout *l, int pp, int stage, int first_unit, int last_unit, Range out[2]) {
    int n = 0;
    if (pp > 1 && stage == pp - 1)  // wte opens the embeddings' unit
        out[n++] = (Range){l->unit[GPT_UNIT_EMBED].offset, (size_t)l->vocab_part * l->cfg.channels};
    size_t begin = l->unit[first_unit].offset, end = l->unit[last_unit].offset + l->unit[last_unit].count;
    out[n++] = (Range){begin, end - begin};
    return n;
}

size_t grid_whole_index(const GPTLayout *l, const Range *ranges, int n, size_t s) {
    size_t at = 0;
    for (int k = 0; k < n; at += ranges[k].count, k++) {
        if (s >= at + ranges[k].count) continue;
        size_t i = ranges[k].offset + (s - at);
        return l->tp_size == 1 ? i : gpt_global_index(l, i);
    }
    return GPT_PADDING;
}

void grid_part_init(GridPart *g, const GPTConfig *cfg, int tp, int pp, int dp, int v, int rank) {
    grid_coords(rank, tp, dp, &g->tp_rank, &g->stage, &g->replica);
    gpt_layout_tp(&g->layout, cfg, tp, g->tp_rank);
    g->chunks = v > 1 ? v : 1;
    int first_unit, last_unit;
    grid_stage_units(cfg->num_layers, pp, g->stage, &first_unit, &last_unit);
    if (g->chunks > 1) g->nranges = grid_chunk_state_ranges(&g->layout, pp, g->chunks, g->stage, g->ranges);
    else g->nranges = grid_state_ranges(&g->layout, pp, g->stage, first_unit, last_unit, g->ranges);
    g->wte_copy = pp > 1 && g->stage == pp - 1;
    size_t states = 0;
    for (int k = 0; k < g->nranges; k++) states += g->ranges[k].count;
    partition_init(&g->shard, states, dp, g->replica);
    g->nreplicated = gpt_replicated_ranges(&g->layout, NULL, 0);
    g->replicated = xmalloc((size_t)(g->nreplicated > 0 ? g->nreplicated : 1) * sizeof(Range));
    gpt_replicated_ranges(&g->layout, g->replicated, g->nreplicated);
}

void grid_part_free(GridPart *g) { free(g->replicated); }

size_t grid_part_whole(const GridPart *g, size_t i) {
    return grid_whole_index(&g->layout, g->ranges, g->nranges, g->shard.begin + i);
}

// Layout index of state element s (s below the states' count).
static size_t layout_index(const GridPart *g, size_t s) {
    size_t at = 0;
    int k = 0;
    for (; k + 1 < g->nranges && s >= at + g->ranges[k].count; k++) at += g->ranges[k].count;
    return g->ranges[k].offset + (s - at);
}

static int replicated(const GridPart *g, size_t i) {
    int lo = 0, hi = g->nreplicated;  // the first range ending past i
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (g->replicated[mid].offset + g->replicated[mid].count <= i) lo = mid + 1;
        else hi = mid;
    }
    return lo < g->nreplicated && g->replicated[lo].offset <= i;
}

size_t grid_part_whole_once(const GridPart *g, size_t i) {
    size_t s = g->shard.begin + i;
    if (s >= g->shard.num_params) return GPT_PADDING;   // the shard's padding
    if (g->wte_copy && s < g->ranges[0].count) return GPT_PADDING;  // the last stage's wte copy
    if (g->tp_rank > 0 && replicated(g, layout_index(g, s))) return GPT_PADDING;
    return grid_part_whole(g, i);
}

// "tp T x cp C x pp P x dp D" (Ulysses) or "tp T x pp P x dp D" (C = 1),
// each with "vp V x" before "dp" when interleaved (V = 1: none): 1 when it
// is none of them, or a size is past 2^20 (any real grid; keeps T·P·C·D
// well inside a long long), or V chunks past GPT_MAX_CHUNKS.
static int parse_sizes(const char *name, int *tp, int *cp, int *pp, int *vp, int *dp) {
    const int most = 1 << 20;
    *cp = *vp = 1;
    if (sscanf(name, "tp %d x cp %d x pp %d x vp %d x dp %d", tp, cp, pp, vp, dp) != 5 &&
        sscanf(name, "tp %d x pp %d x vp %d x dp %d", tp, pp, vp, dp) != 4 &&
        sscanf(name, "tp %d x cp %d x pp %d x dp %d", tp, cp, pp, dp) != 4 &&
        sscanf(name, "tp %d x pp %d x dp %d", tp, pp, dp) != 3)
        return 1;
    return *tp < 1 || *pp < 1 || *dp < 1 || *cp < 1 || *vp < 1 || *vp > GPT_MAX_CHUNKS || *tp > most || *pp > most ||
           *dp > most || *cp > most || (double)*dp * *cp > most;
}

int grid_seq_parts(const char *name) {
    int tp, cp, pp, vp, dp;
    return parse_sizes(name, &tp, &cp, &pp, &vp, &dp) ? 1 : cp;
}

int grid_chunks(const char *name) {
    int tp, cp, pp, vp, dp;
    return parse_sizes(name, &tp, &cp, &pp, &vp, &dp) ? 1 : vp;
}

// Under Ulysses the model part's replicas are C·D: the C ranks of a
// sequence group hold the same states.
int grid_parse(const char *name, int *tp, int *pp, int *dp) {
    int cp, vp;
    if (parse_sizes(name, tp, &cp, pp, &vp, dp)) return 1;
    *dp *= cp;
    return 0;
}
