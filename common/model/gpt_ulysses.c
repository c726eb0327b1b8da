// gpt_ulysses.c: DeepSpeed-Ulysses (Jacobs et al. 2023) around a block's
// attention core, over the plan's cp ranks (gpt.h's GPTPlan.cp). Each rank
// holds T positions of every sequence, the part cp_rank·T onwards, and its
// tp part's Cp channels of attention (Nh heads of head size Cp/Nh). The
// core needs every position of a head, so:
//   - forward, one all-to-all takes q, k and v from (B, T, 3, Cp) on the
//     rank's positions to (B, cp·T, 3, Cp/cp): every position of the heads
//     of rank j's Cp/cp channels goes to rank j; flash attention runs there
//     on Nh/cp heads; a second all-to-all returns its output (B, cp·T,
//     Cp/cp) to (B, T, Cp) on the rank's positions, the projection's input;
//   - backward, the output's gradient takes the first way, flash attention's
//     backward runs on the heads, and dq, dk, dv take the second way back.
// Four all-to-alls of B·T·Cp elements a layer forward and four backward
// (q, k and v count as three), each rank keeping 1/cp of what it packs.
// The packing is a strided copy on the device (dev_copy_2d) into the work's
// send buffer; what arrives is unpacked from its receive buffer. Here too:
// the model's sequence group (Ulysses' and ring attention's).
#include "check.h"
#include "gpt_units.h"

// The shapes of one exchange: `groups` tensors of Cp channels per position
// (3 for q, k, v; 1 for the output), rows = B·T·groups rows of Cp.
typedef struct Parts {
    int cp, B, T, groups;
    size_t Cc, Cp, ab, rows;  // Cc = Cp/cp channels go to each rank
} Parts;

static Parts parts_of(const GPT *g, int groups) {
    Parts p = {gpt_plan_cp(&g->plan), g->plan.B, g->plan.T, groups, 0, 0, (size_t)g->dev->act_bytes, 0};
    p.Cp = (size_t)g->L.cfg.channels / (size_t)g->L.tp_size;
    p.Cc = p.Cp / (size_t)p.cp;
    p.rows = (size_t)p.B * p.T * groups;
    return p;
}

// The all-to-all of the packed parts, rank j's part the j-th of cp equal ones.
static void exchange(GPT *g, const Parts *p) {
    size_t counts[GPT_MAX_HEADS];
    for (int j = 0; j < p->cp; j++) counts[j] = p->rows * p->Cc;
    comm_all_to_all(g->cp, g->work->a2a_send, counts, g->work->a2a_recv, counts, gpt_act_dtype(g), NULL);
}

// LAB 07: to_heads -- Ulysses' first all-to-all: from positions to heads
// (B, T, groups, Cp) on this rank's T positions -> (B, cp·T, groups, Cc) of
// this rank's Cc = Cp/cp channels (its heads), every position. Rank j takes
// the j-th Cc channels of every row: pack them, part j after part j - 1,
// into g->work->a2a_send (dev_copy_2d on STREAM_COMPUTE: a part is p.rows
// rows of Cc of the row's Cp); exchange(g, &p) sends part j to rank j and
// leaves rank j's part j-th in g->work->a2a_recv; rank j's part holds
// rank j's positions of each of the B sequences, which go to positions
// j·T onwards of each sequence of `heads`. Sizes in bytes (p.ab an
// element). In place is fine: the input is packed whole before anything
// is written.
static void to_heads(GPT *g, act *heads, const act *local, int groups) {
    Parts p = parts_of(g, groups);
    Device *d = g->dev;
    char *send = g->work->a2a_send, *recv = g->work->a2a_recv;
    size_t part = p.rows * p.Cc * p.ab, span = (size_t)p.T * groups * p.Cc * p.ab;  // span: one sequence's positions
    for (int j = 0; j < p.cp; j++)  // rank j's channels of every row
        dev_copy_2d(d, send + j * part, p.Cc * p.ab, (const char *)local + j * p.Cc * p.ab, p.Cp * p.ab,
                    p.Cc * p.ab, p.rows, STREAM_COMPUTE);
    exchange(g, &p);
    for (int j = 0; j < p.cp; j++)  // rank j's positions of each sequence, in their place
        dev_copy_2d(d, (char *)heads + j * span, (size_t)p.cp * span, recv + j * part, span, span, (size_t)p.B,
                    STREAM_COMPUTE);
}
// LAB END

// The way back: (B, cp·T, groups, Cc) -> (B, T, groups, Cp), rank j's
// channels from rank j.
static void to_positions(GPT *g, act *local, const act *heads, int groups) {
    Parts p = parts_of(g, groups);
    Device *d = g->dev;
    char *send = g->work->a2a_send, *recv = g->work->a2a_recv;
    size_t part = p.rows * p.Cc * p.ab, span = (size_t)p.T * groups * p.Cc * p.ab;
    for (int j = 0; j < p.cp; j++)  // rank j's positions of each sequence
        dev_copy_2d(d, send + j * part, span, (const char *)heads + j * span, (size_t)p.cp * span, span, (size_t)p.B,
                    STREAM_COMPUTE);
    exchange(g, &p);
    for (int j = 0; j < p.cp; j++)  // rank j's channels, in their columns
        dev_copy_2d(d, (char *)local + j * p.Cc * p.ab, p.Cp * p.ab, recv + j * part, p.Cc * p.ab, p.Cc * p.ab,
                    p.rows, STREAM_COMPUTE);
}

void ulysses_attention_forward(GPT *g, LayerActs *la) {
    Parts p = parts_of(g, 1);
    int heads = g->L.cfg.num_heads / g->L.tp_size / p.cp;
    to_heads(g, la->qkv, la->qkv, 3);
    g->dev->k->flash_attention_forward(g->dev, la->atth, la->att, la->qkv, p.B, p.cp * p.T, (int)p.Cc, heads);
    to_positions(g, la->atty, la->atth, 1);
}

void ulysses_attention_backward(GPT *g, const LayerActs *la, act *dout, act *dqkv) {
    Parts p = parts_of(g, 1);
    int heads = g->L.cfg.num_heads / g->L.tp_size / p.cp;
    to_heads(g, dout, dout, 1);
    g->dev->k->flash_attention_backward(g->dev, dqkv, dout, la->qkv, la->atth, la->att, p.B, p.cp * p.T, (int)p.Cc,
                                        heads);
    to_positions(g, dqkv, dqkv, 3);
}

void gpt_set_seq_group(GPT *g, Comm *cp) {
    int n = gpt_plan_cp(&g->plan);
    CHECK(n == 1 || (cp && cp->size == n && cp->rank == g->plan.cp_rank), "gpt_set_seq_group: a plan of %d sequence "
          "parts (this rank's %d) needs its group of as many ranks, ordered by their parts", n, g->plan.cp_rank);
    g->cp = n > 1 ? cp : NULL;
}
