// gpt_recompute.c: activation recomputation (Chen et al. 2016, "Training
// Deep Nets with Sublinear Memory Cost"; Korthikanti et al. 2022 for the
// selective kind). A block that did not save some of its activations
// computes them again right before its backward, from what it saved, into
// the working set that every block shares. The kernels are the forward's, on
// the same inputs, so the recomputed tensors are the same bits and the
// gradients are those of --recompute none. Under ZeRO-3 the block's params
// are gathered for its backward anyway: recomputing moves no extra bytes.
#include <stddef.h>
#include <string.h>
#include "gpt_units.h"
#include "kernel_meter.h"

static const char *const names[] = {"none", "selective", "full"};
static const char *const attention_names[] = {"flash", "materialized"};

const char *gpt_attention_name(GPTAttention a) {
    return a >= GPT_ATTENTION_FLASH && a <= GPT_ATTENTION_MATERIALIZED ? attention_names[a] : "unknown";
}

int gpt_attention_of(const char *name) {
    for (int a = GPT_ATTENTION_FLASH; a <= GPT_ATTENTION_MATERIALIZED; a++)
        if (strcmp(name, attention_names[a]) == 0) return a;
    return -1;
}

const char *gpt_recompute_name(GPTRecompute r) {
    return r >= GPT_RECOMPUTE_NONE && r <= GPT_RECOMPUTE_FULL ? names[r] : "unknown";
}

int gpt_recompute_of(const char *name) {
    for (int r = GPT_RECOMPUTE_NONE; r <= GPT_RECOMPUTE_FULL; r++)
        if (strcmp(name, names[r]) == 0) return r;
    return -1;
}

// LAB 04: block_recompute -- what the block did not keep, computed again before its backward
// Block `layer` of slot s, from its params p, before its backward reads la =
// layer_acts(g, layer, s), by g->plan.recompute:
//   GPT_RECOMPUTE_NONE: everything was saved; nothing to do.
//   GPT_RECOMPUTE_SELECTIVE: with the materialized attention
//     (g->plan.attention), the probabilities la->att (the working set's)
//     were overwritten by later blocks: the attention forward again from
//     the saved q, k, v (la->qkv), its output going to the scratch
//     g->work->tmp (la->atty was saved and must stay as it is). Flash
//     attention keeps no probabilities: nothing to do.
//     Shapes: B = g->plan.B, T = g->plan.T, this rank's Cp = C / tp
//     channels and NH / tp heads (g->L.cfg, g->L.tp_size).
//   GPT_RECOMPUTE_FULL: only the block's input was saved
//     (block_input(g, layer, s)): run the part of the block's forward that
//     backward reads again (block_forward_inner) into la.
void block_recompute(GPT *g, const bf16 *p, int layer, int s) {
    LayerActs *la = layer_acts(g, layer, s);
    int tp = g->L.tp_size, C = g->L.cfg.channels;
    if (g->plan.recompute == GPT_RECOMPUTE_SELECTIVE && g->plan.attention == GPT_ATTENTION_MATERIALIZED)
        g->dev->k->attention_forward(g->dev, g->work->tmp, la->att, la->qkv, g->plan.B, g->plan.T, C / tp,
                                     g->L.cfg.num_heads / tp);
    else if (g->plan.recompute == GPT_RECOMPUTE_FULL)
        block_forward_inner(g, p, la, block_input(g, layer, s));
}
// LAB END

// ---- the recompute's work, counted (gpt.h's RecomputeWork) ----

// A tensor of the block that its recompute may not write: one outside the
// working set (what the plan keeps for backward), by the name the handout uses.
typedef struct Kept {
    const char *name;
    const void *ptr;
} Kept;

static int kept_tensors(const GPT *g, const LayerActs *la, const act *input, Kept out[16]) {
    const Kept all[] = {{"la->ln1", la->ln1}, {"la->qkv", la->qkv}, {"la->atty", la->atty}, {"la->x2", la->x2},
                        {"la->ln2", la->ln2}, {"la->fch", la->fch}, {"la->fch_gelu", la->fch_gelu},
                        {"la->x3 (the next block's input)", la->x3}, {"la->ln1_mean", la->ln1_mean},
                        {"la->ln1_rstd", la->ln1_rstd}, {"la->ln2_mean", la->ln2_mean},
                        {"la->ln2_rstd", la->ln2_rstd}, {"la->att", la->att}, {"the block's input", input}};
    const char *lo = g->working.ptr, *hi = lo + g->working.bytes;
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *p = all[i].ptr;
        if (p && !(p >= lo && p < hi)) out[n++] = all[i];
    }
    return n;
}

void block_recompute_metered(GPT *g, const bf16 *p, int layer, int s) {
    KernelMeter m;
    kernel_meter_begin(&m, g->dev);
    block_recompute(g, p, layer, s);
    kernel_meter_end(&m, g->dev);
    RecomputeWork *w = &g->recompute_work;
    w->blocks++;
    w->kernels += m.kernels;
    w->flops += m.flops;
    Kept kept[16];
    int n = kept_tensors(g, layer_acts(g, layer, s), block_input(g, layer, s), kept);
    for (int i = 0; i < m.num_writes && !w->overwrote; i++)
        for (int k = 0; k < n; k++)
            if (m.writes[i] == kept[k].ptr) w->overwrote = kept[k].name;
}
