// gpt_ring.c: ring attention (Liu et al. 2023; Megatron-LM's context
// parallelism) around a block's attention core, over the plan's cp ranks
// (GPTPlan.cp with cp_ring). Each sequence is cut into 2·cp chunks of Tc
// positions, and rank r holds two of them, r and 2·cp - 1 - r: the zigzag,
// under which every rank does the same work of the causal mask (chunk i
// sees i + 1 chunks, and r + 1 + 2·cp - r = 2·cp + 1 for every r). The
// rank's T = 2·Tc positions are chunk r's, then the other's. Per layer:
//   - forward, the rank's k and v (B, T, 2Cp) travel around the ring in
//     cp - 1 shifts, each started before the blocks of the chunk at hand run
//     and waited for after them. Each query chunk attends to every key chunk
//     before it whole, to its own causally, and to none after it; each
//     block's result is merged into the chunk's through their log-sum-exp
//     (flash_math.h), in fp32;
//   - backward, k and v travel again, with their gradients dk and dv
//     (fp32): each rank adds its queries' part to the chunk at hand and
//     passes it on; a last shift brings every rank's own home (cp shifts of
//     dk, dv, cp - 1 of k, v). dq stays.
// The blocks are the kernels' flash_block_forward and flash_block_backward.
// Here too: the position rows of the rank's tokens, whichever the split.
#include "check.h"
#include "gpt_units.h"

enum { TAG_KV = 0x5a00, TAG_DKV = 0x5a01 };

typedef struct Ring {
    int cp, rank, B, T, Tc, NH, hs;
    size_t Cp, ab;
} Ring;

static Ring ring_of(const GPT *g) {
    Ring r = {gpt_plan_cp(&g->plan), g->plan.cp_rank, g->plan.B, g->plan.T, g->plan.T / 2, 0, 0, 0,
              (size_t)g->dev->act_bytes};
    r.NH = g->L.cfg.num_heads / g->L.tp_size;
    r.Cp = (size_t)g->L.cfg.channels / (size_t)g->L.tp_size;
    r.hs = (int)(r.Cp / (size_t)r.NH);
    return r;
}

enum { RING_SKIP, RING_WHOLE, RING_CAUSAL };

// LAB 07: ring_block_kind -- what a query chunk does with a key chunk at hand
// In a ring of r->cp ranks every sequence is cut into 2·cp chunks, and rank
// `rank` holds two of them, the zigzag: its chunk c = 0 is chunk `rank` of
// the sequence, its chunk c = 1 is chunk 2·cp - 1 - rank. At a step of the
// ring the keys at hand are rank `src`'s (its chunk e, 0 or 1). Under the
// causal mask a query sees only keys at or before its own position, so
// rank's query chunk c against src's key chunk e is: RING_SKIP when the key
// chunk comes after the query chunk (masked whole), RING_CAUSAL when it is
// the same chunk (the diagonal: key s seen by query t when s <= t), and
// RING_WHOLE when it comes before (every key seen).
static int ring_block_kind(const Ring *r, int rank, int c, int src, int e) {
    int q = c == 0 ? rank : 2 * r->cp - 1 - rank, k = e == 0 ? src : 2 * r->cp - 1 - src;
    return k > q ? RING_SKIP : k == q ? RING_CAUSAL : RING_WHOLE;
}
// LAB END

static void *at(const void *base, size_t bytes) { return (char *)base + bytes; }

// Query chunk c of qkv (B,T,3Cp) against key chunk e of kv (B,T,2Cp); the
// diagonal causal.
static FlashBlock block_of(const Ring *r, const act *qkv, const act *kv, int c, int e, int causal) {
    size_t q0 = (size_t)c * r->Tc * 3 * r->Cp, k0 = (size_t)e * r->Tc * 2 * r->Cp;
    FlashBlock f = {r->B, r->NH, r->hs, r->Tc, r->Tc, causal, at(qkv, q0 * r->ab), at(kv, k0 * r->ab),
                    at(kv, (k0 + r->Cp) * r->ab), 3 * r->Cp, (size_t)r->T * 3 * r->Cp, 2 * r->Cp,
                    (size_t)r->T * 2 * r->Cp, r->Cp, (size_t)r->T * r->Cp, (size_t)r->T};
    return f;
}

// k and v of qkv's rows, packed (B·T rows of 2Cp) for the ring
static void pack_kv(GPT *g, const Ring *r, act *kv, const act *qkv) {
    dev_copy_2d(g->dev, kv, 2 * r->Cp * r->ab, at(qkv, r->Cp * r->ab), 3 * r->Cp * r->ab, 2 * r->Cp * r->ab,
                (size_t)r->B * r->T, STREAM_COMPUTE);
}

// n fp32 values as activations: the same bytes on cpu, rounded on cuda
static const act *as_act(GPT *g, act *out, const float *src, size_t n) {
    if (g->dev->act_bytes == 4) return src;
    g->dev->k->f32_to_half(g->dev, out, src, n);
    return out;
}

// What a pass does with one block: query chunk c against key chunk e of
// the k and v at hand (ring_kv[cur]); `la` and `dout` are the layer's.
typedef struct Pass {
    const LayerActs *la;
    const act *dout;  // backward: the gradient of atty; NULL forward
    int started[2];   // forward: query chunk c holds a merged result already
} Pass;

// LAB 07: forward_block -- one block of ring attention's forward
// Query chunk c (0 or 1) of this rank against the key chunk at hand, f
// (kernels.h's FlashBlock). Its result goes into chunk c's rows of the fp32
// output g->work->ring_acc (r->Tc rows of r->Cp per sequence, chunk c's
// from row c·Tc: element offset c·Tc·Cp) and of the lse p->la->att (from
// c·Tc), merged through their log-sum-exp with what the chunk's earlier
// blocks left there (flash_block_forward's merge = 1), or afresh (merge =
// 0) for the chunk's first block of the pass: p->started[c] says which.
static void forward_block(GPT *g, const Ring *r, Pass *p, const FlashBlock *f, int c, int e, int cur) {
    (void)e, (void)cur;
    g->dev->k->flash_block_forward(g->dev, f, g->work->ring_acc + (size_t)c * r->Tc * r->Cp,
                                   p->la->att + (size_t)c * r->Tc, p->started[c]);
    p->started[c] = 1;
}
// LAB END

static void backward_block(GPT *g, const Ring *r, Pass *p, const FlashBlock *f, int c, int e, int cur) {
    size_t o = (size_t)c * r->Tc * r->Cp, k0 = (size_t)e * r->Tc * 2 * r->Cp;
    float *dk = g->work->ring_dkv[cur] + k0;
    g->dev->k->flash_block_backward(g->dev, f, at(p->la->atty, o * r->ab), at(p->dout, o * r->ab),
                                    p->la->att + (size_t)c * r->Tc, g->work->ring_acc + o, dk, dk + r->Cp);
}

// One pass around the ring: at each of the cp steps the k and v at hand
// go on to the next rank (started before the blocks run, waited for after
// them), and `block` runs every block of the rank's query chunks against
// the key chunks at hand that they see. Backward (p->dout), the gradients
// of those keys follow them after each step, the last shift bringing each
// rank's own home. Forward, the query-key pairs of the blocks run (Tc² a
// whole one, Tc(Tc + 1)/2 the diagonal, per sequence and head) go to
// g->ring_pairs: the causal mask's work on this rank, counted.
static void around_the_ring(GPT *g, const Ring *r, Pass *p,
                            void (*block)(GPT *, const Ring *, Pass *, const FlashBlock *, int, int, int)) {
    GPTWork *w = g->work;
    size_t kv_count = (size_t)r->B * r->T * 2 * r->Cp;
    pack_kv(g, r, w->ring_kv[0], p->la->qkv);
    double pairs = 0, Tc = r->Tc;
    for (int step = 0; step < r->cp; step++) {
        int cur = step % 2, src = (r->rank - step + r->cp) % r->cp;
        CommHandle hs = {0}, hr = {0};
        if (step < r->cp - 1)
            comm_shift(g->cp, w->ring_kv[cur], w->ring_kv[1 - cur], kv_count, gpt_act_dtype(g), TAG_KV, &hs, &hr);
        for (int c = 0; c < 2; c++)
            for (int e = 0; e < 2; e++) {
                int kind = ring_block_kind(r, r->rank, c, src, e);
                if (kind == RING_SKIP) continue;
                FlashBlock f = block_of(r, p->la->qkv, w->ring_kv[cur], c, e, kind == RING_CAUSAL);
                block(g, r, p, &f, c, e, cur);
                pairs += (double)r->B * r->NH * (kind == RING_CAUSAL ? Tc * (Tc + 1) / 2 : Tc * Tc);
            }
        comm_wait(g->cp, &hr);
        comm_wait(g->cp, &hs);
        if (p->dout) comm_shift(g->cp, w->ring_dkv[cur], w->ring_dkv[1 - cur], kv_count, DT_F32, TAG_DKV, NULL, NULL);
    }
    if (!p->dout) g->ring_pairs = pairs;
}

void ring_attention_forward(GPT *g, LayerActs *la) {
    Ring r = ring_of(g);
    Pass p = {la, NULL, {0, 0}};
    around_the_ring(g, &r, &p, forward_block);
    size_t n = (size_t)r.B * r.T * r.Cp;
    const act *y = as_act(g, la->atty, g->work->ring_acc, n);
    if (y != la->atty) dev_copy_2d(g->dev, la->atty, n * r.ab, y, n * r.ab, n * r.ab, 1, STREAM_COMPUTE);
}

void ring_attention_backward(GPT *g, const LayerActs *la, const act *dout, act *dqkv) {
    Ring r = ring_of(g);
    GPTWork *w = g->work;
    Device *d = g->dev;
    size_t rows = (size_t)r.B * r.T, ab = r.ab;
    dev_memset0(d, w->ring_dkv[0], rows * 2 * r.Cp * sizeof(float), STREAM_COMPUTE);
    dev_memset0(d, w->ring_acc, rows * r.Cp * sizeof(float), STREAM_COMPUTE);
    Pass p = {la, dout, {0, 0}};
    around_the_ring(g, &r, &p, backward_block);
    // dqkv's columns: dq, then dk and dv (each rank's own, home after cp shifts)
    const act *dq = as_act(g, w->ring_kv[0], w->ring_acc, rows * r.Cp);
    const act *dkv = as_act(g, w->ring_kv[1], w->ring_dkv[r.cp % 2], rows * 2 * r.Cp);
    dev_copy_2d(d, dqkv, 3 * r.Cp * ab, dq, r.Cp * ab, r.Cp * ab, rows, STREAM_COMPUTE);
    dev_copy_2d(d, at(dqkv, r.Cp * ab), 3 * r.Cp * ab, dkv, 2 * r.Cp * ab, 2 * r.Cp * ab, rows, STREAM_COMPUTE);
}

// Ulysses' send and receive buffers (BT,3Cp); the ring's k and v (BT,2Cp)
// at hand and coming, their fp32 gradients likewise, the fp32 y or dq
// (BT,Cp) and the position rows of the rank's chunks (T,C) in fp32
// (gpt_layout.c's backward_scratch counts them).
void carve_seq_work(GPT *g, Carver *c) {
    const GPTPlan *p = &g->plan;
    size_t BT = (size_t)p->B * p->T, C = (size_t)g->L.cfg.channels, Cp = C / (size_t)g->L.tp_size;
    size_t ab = (size_t)g->dev->act_bytes, fb = sizeof(float);
    if (gpt_plan_ulysses(p)) {
        g->work->a2a_send = carve(c, BT * 3 * Cp * ab);
        g->work->a2a_recv = carve(c, BT * 3 * Cp * ab);
    }
    if (!gpt_plan_ring(p)) return;
    for (int k = 0; k < 2; k++) g->work->ring_kv[k] = carve(c, BT * 2 * Cp * ab);
    for (int k = 0; k < 2; k++) g->work->ring_dkv[k] = carve(c, BT * 2 * Cp * fb);
    g->work->ring_acc = carve(c, BT * Cp * fb);
    g->work->positions = carve(c, (size_t)p->T * C * fb);
}

// ---- the position rows of the rank's tokens ----

const bf16 *embed_positions(GPT *g, const bf16 *wpe) {
    const GPTPlan *p = &g->plan;
    size_t C = (size_t)g->L.cfg.channels;
    if (!gpt_plan_ring(p)) return wpe + (size_t)gpt_plan_seq_start(p, 0) * C;
    size_t n = (size_t)p->T / 2 * C * sizeof(bf16);
    for (int k = 0; k < 2; k++)
        dev_copy_2d(g->dev, at(g->work->positions, k * n), n, wpe + (size_t)gpt_plan_seq_start(p, k) * C, n, n, 1,
                    STREAM_COMPUTE);
    return g->work->positions;
}

float *embed_position_grads(GPT *g, float *dwpe) {
    const GPTPlan *p = &g->plan;
    size_t C = (size_t)g->L.cfg.channels;
    if (!gpt_plan_ring(p)) return dwpe + (size_t)gpt_plan_seq_start(p, 0) * C;
    dev_memset0(g->dev, g->work->positions, (size_t)p->T * C * sizeof(float), STREAM_COMPUTE);
    return g->work->positions;
}

void embed_position_grads_done(GPT *g, float *dwpe) {
    const GPTPlan *p = &g->plan;
    if (!gpt_plan_ring(p)) return;
    size_t C = (size_t)g->L.cfg.channels, n = (size_t)p->T / 2 * C;
    const float *table = g->work->positions;
    for (int k = 0; k < 2; k++)
        g->dev->k->accumulate_f32(g->dev, dwpe + (size_t)gpt_plan_seq_start(p, k) * C, table + k * n, n, 1);
}
