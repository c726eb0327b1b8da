// step_memory.c: the formula's timeline of a step (see step_memory.h). A
// walk over the step in the order the stages run it, adding and taking
// away each piece's closed form where its owner allocates and releases it:
//   - a micro-batch's input (act_units' input) when its tokens arrive, or a
//     pipeline stage's when it is received, until the backward of the
//     range's first unit;
//   - each block's saved tensors from its forward to its backward, the
//     head's likewise; the recompute's working set inside each block's
//     forward, and from its recompute to the end of its backward;
//   - a unit's fp32 gradients (its parameters x 4 B) from its backward to
//     the next backward, the embeddings' (the tied wte) from the head's
//     backward to the backward after the embeddings' (or, on a pipeline's
//     last stage, after the head's);
//   - zero3's gathered units: the window W(e) while entry e computes, what
//     its release keeps after it (buffer_math.c);
//   - zero bubble's W stash of a block from its B to its W, and the block's
//     fp32 gradients at its W instead of its B.
// With ZeRO-R's contiguous buffers (plan.contiguous) the activations, the
// working set and the gradients are in `fixed` and only the gathers move.
// A boundary is taken as each phase begins, as mem.c keeps them. Each piece
// is one block of the device's arena, and the walk places it by the arena's
// own rules (arena.c) in an endless region, in the order the trainers take
// and give them back, the blocks that live through the step first: the
// region's most allocated is the blocks' peak in whole pages, its
// high-water mark the region a run needs, the holes between blocks
// included. The placing is the allocator's own code; what the walk states
// apart from the trainers is which block lives when, and how large it is.
#include "step_memory.h"
#include <stdlib.h>
#include <string.h>
#include "act_math.h"
#include "arena.h"
#include "check.h"
#include "mem_math.h"

typedef struct Walk {
    const StepMemorySpec *s;
    ActUnits acts;
    double cur[CAT_COUNT];
    MemPhase phase;
    StepMemory *out;
    int dynamic;                   // not plan.contiguous
    double unit_grads, embed_grads;  // held now
    int embed_pending;             // the head's backward started the embeddings' gradients
    double gathered_now;           // zero3's units gathered now
    // the blocks alive, placed by the arena's own rules in an endless region
    Arena arena;
    struct Placed {
        long long key;
        size_t offset;
    } *placed;
    int nplaced, capplaced;
    int gathered_live[GPT_MAX_UNITS];  // zero3's units placed now
} Walk;

// What a piece is, for the arena's replay: its kind, micro-batch and index
// (a block, a chunk, a unit); a release names the block it takes back.
typedef enum { PIECE_INPUT, PIECE_CHUNK_INPUT, PIECE_BLOCK, PIECE_HEAD, PIECE_WORKING, PIECE_UNIT_GRADS,
               PIECE_EMBED_GRADS, PIECE_W_STASH, PIECE_GATHERED, PIECE_SHARED, PIECE_FIXED } PieceKind;

static long long key_of(PieceKind kind, int micro, int index) {
    return ((long long)kind << 42) | ((long long)(micro + 1) << 21) | (long long)(index + 1);
}

static void place(Walk *w, long long key, double bytes) {
    if (bytes <= 0) return;
    size_t offset = arena_alloc(&w->arena, (size_t)bytes);
    CHECK(offset != ARENA_NONE, "step_memory: the replay's endless region is full");
    if (w->nplaced == w->capplaced) {
        w->capplaced = w->capplaced ? 2 * w->capplaced : 64;
        w->placed = xrealloc(w->placed, (size_t)w->capplaced * sizeof *w->placed);
    }
    w->placed[w->nplaced++] = (struct Placed){key, offset};
}

static void unplace(Walk *w, long long key) {
    for (int k = w->nplaced - 1; k >= 0; k--)
        if (w->placed[k].key == key) {
            arena_free(&w->arena, w->placed[k].offset);
            w->placed[k] = w->placed[--w->nplaced];
            return;
        }
    CHECK(0, "step_memory: a release of piece %llx that the walk never placed", key);
}

// bytes more (or fewer) under c
static void count(Walk *w, MemCategory c, double bytes) {
    w->cur[c] += bytes;
    if (w->cur[c] > w->out->cat_peak[c]) w->out->cat_peak[c] = w->cur[c];
    double total = 0;
    for (int k = 0; k < CAT_COUNT; k++) total += w->cur[k];
    if (total > w->out->peak) {
        w->out->peak = total;
        w->out->peak_phase = w->phase;
        memcpy(w->out->peak_bytes, w->cur, sizeof w->cur);
    }
}

// One block allocated (bytes > 0) or released (bytes < 0), the piece `key`.
static void add(Walk *w, MemCategory c, double bytes, long long key) {
    count(w, c, bytes);
    if (bytes > 0) place(w, key, bytes);
    else if (bytes < 0) unplace(w, key);
}

// The phase begins: a boundary, unless it is the phase already running.
static void enter(Walk *w, MemPhaseKind kind, int unit, int micro) {
    MemPhase p = {kind, micro, unit};
    if (p.kind == w->phase.kind && p.unit == w->phase.unit && p.micro == w->phase.micro) return;
    w->phase = p;
    StepMemory *m = w->out;
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->b = xrealloc(m->b, (size_t)m->cap * sizeof *m->b);
    }
    MemBoundary *b = &m->b[m->n++];
    b->phase = p;
    for (int c = 0; c < CAT_COUNT; c++) b->device[c] = (size_t)w->cur[c];
}

// ---- one unit ----

static int head_unit(const Walk *w) { return gpt_unit_head(w->s->layout); }
static int plan_has(const StepMemorySpec *s, int u) { return u >= s->plan.first_unit && u <= s->plan.last_unit; }
static int block_index(const Walk *w, int u) {
    int first = w->s->plan.first_unit > 1 ? w->s->plan.first_unit : 1;
    return u == GPT_UNIT_EMBED || u == head_unit(w) ? -1 : u - first;
}

static void unit_forward(Walk *w, int u, int micro) {
    enter(w, PHASE_FORWARD, u, micro);
    if (!w->dynamic) return;
    int i = block_index(w, u);
    if (i >= 0) {
        add(w, CAT_ACTIVATIONS, w->acts.block[i], key_of(PIECE_BLOCK, micro, i));
        add(w, CAT_ACT_WORKING, w->acts.working, key_of(PIECE_WORKING, 0, 0));  // what the block does not keep
        add(w, CAT_ACT_WORKING, -w->acts.working, key_of(PIECE_WORKING, 0, 0));
    } else if (u == head_unit(w)) {
        add(w, CAT_ACTIVATIONS, w->acts.head, key_of(PIECE_HEAD, micro, 0));
    }
}

// The last backward's (or W's) gradients, read by now.
static void let_go_grads(Walk *w) {
    add(w, CAT_WORKSPACE, -w->unit_grads, key_of(PIECE_UNIT_GRADS, 0, 0));
    w->unit_grads = 0;
    if (!w->embed_pending) add(w, CAT_WORKSPACE, -w->embed_grads, key_of(PIECE_EMBED_GRADS, 0, 0)), w->embed_grads = 0;
}

// Zero bubble splits a block's backward (gpt.h's GPTPlan.w_slots).
static int split(const Walk *w, int u) { return w->s->plan.w_slots > 0 && block_index(w, u) >= 0; }

static void unit_backward(Walk *w, int u, int micro) {
    const GPTLayout *l = w->s->layout;
    enter(w, PHASE_BACKWARD, u, micro);
    int i = block_index(w, u);
    if (w->dynamic && split(w, u)) {  // B: no weights' gradients, the W stash instead
        let_go_grads(w);
        add(w, CAT_ACTIVATIONS, w->acts.w_stash, key_of(PIECE_W_STASH, micro, i));
    } else if (w->dynamic) {
        let_go_grads(w);
        if (u != GPT_UNIT_EMBED)
            add(w, CAT_WORKSPACE, w->unit_grads = (double)l->unit[u].count * sizeof(float),
                key_of(PIECE_UNIT_GRADS, 0, 0));
        if (u == head_unit(w) || (u == GPT_UNIT_EMBED && w->embed_grads == 0))
            add(w, CAT_WORKSPACE, w->embed_grads = (double)l->unit[GPT_UNIT_EMBED].count * sizeof(float),
                key_of(PIECE_EMBED_GRADS, 0, 0));
    }
    if (u == head_unit(w)) w->embed_pending = plan_has(w->s, GPT_UNIT_EMBED);
    if (u == GPT_UNIT_EMBED) w->embed_pending = 0;
    if (i >= 0 && w->s->plan.recompute != GPT_RECOMPUTE_NONE) {
        enter(w, PHASE_RECOMPUTE, u, micro);
        if (w->dynamic) add(w, CAT_ACT_WORKING, w->acts.working, key_of(PIECE_WORKING, 0, 0));
        enter(w, PHASE_BACKWARD, u, micro);
    }
    if (!w->dynamic) return;
    if (i >= 0) {
        if (w->s->plan.recompute != GPT_RECOMPUTE_NONE)
            add(w, CAT_ACT_WORKING, -w->acts.working, key_of(PIECE_WORKING, 0, 0));
        add(w, CAT_ACTIVATIONS, -w->acts.block[i], key_of(PIECE_BLOCK, micro, i));
    } else if (u == head_unit(w)) {
        add(w, CAT_ACTIVATIONS, -w->acts.head, key_of(PIECE_HEAD, micro, 0));
    }
    if (u == w->s->plan.first_unit)  // the micro-batch is done with
        add(w, CAT_ACTIVATIONS, -w->acts.input, key_of(PIECE_INPUT, micro, 0));
    const GPTPlan *p = &w->s->plan;
    if (p->chunks > 1 && i > 0 && i % p->chunk_stride == 0)  // an interleaved chunk's first block: its input read
        add(w, CAT_ACTIVATIONS, -w->acts.chunk_input, key_of(PIECE_CHUNK_INPUT, micro, i / p->chunk_stride));
}

// ---- the step ----

// zero3's gathered units as the window stands: while entry e computes, or
// once its release has run
static void gathered_to(Walk *w, int e, int released) {
    const StepMemorySpec *s = w->s;
    if (s->shape != STEP_GATHERED) return;
    double live = zero_live_bytes(s->layout, s->prefetch, s->gathered, e, released);
    count(w, CAT_PARAMS, live - w->gathered_now);
    w->gathered_now = live;
    // in the arena: the units dropped, then the new ones in the order their gathers start
    int units[GPT_MAX_UNITS], n = zero_live_units(s->layout, s->prefetch, e, released, units), now[GPT_MAX_UNITS] = {0};
    for (int k = 0; k < n; k++) now[units[k]] = 1;
    for (int u = 0; u < s->layout->num_units; u++)
        if (w->gathered_live[u] && !now[u]) unplace(w, key_of(PIECE_GATHERED, 0, u)), w->gathered_live[u] = 0;
    for (int k = 0; k < n; k++)
        if (!w->gathered_live[units[k]]) {  // (both passes gather a unit whole: step_memory_gathered)
            place(w, key_of(PIECE_GATHERED, 0, units[k]), s->gathered[0][units[k]]);
            w->gathered_live[units[k]] = 1;
        }
}

// Stages 01-06: a micro-batch through every unit, forward then backward.
// Schedule entry e is unit e's forward for e < U, the backward of unit
// 2U-1-e after; a unit's gathers (acquire) come before its phase begins,
// its release after its compute.
static void whole_micro_batch(Walk *w, int i) {
    int U = w->s->layout->num_units;
    enter(w, PHASE_FORWARD, -1, i);  // its tokens arrive
    if (w->dynamic) add(w, CAT_ACTIVATIONS, w->acts.input, key_of(PIECE_INPUT, i, 0));
    for (int u = 0; u < U; u++) {
        gathered_to(w, u, 0);
        unit_forward(w, u, i);
        gathered_to(w, u, 1);
    }
    for (int u = U - 1; u >= 0; u--) {
        gathered_to(w, 2 * U - 1 - u, 0);
        unit_backward(w, u, i);
        gathered_to(w, 2 * U - 1 - u, 1);
    }
}

// A pipeline stage's micro-batch i forward: its input received first (not
// on the first stage, whose tokens arrive as the forward begins).
static void pipe_forward(Walk *w, int i) {
    const GPTPlan *p = &w->s->plan;
    enter(w, PHASE_FORWARD, -1, i);
    if (w->dynamic && w->s->stage == 0) add(w, CAT_ACTIVATIONS, w->acts.input, key_of(PIECE_INPUT, i, 0));
    for (int u = p->first_unit; u <= p->last_unit; u++) unit_forward(w, u, i);
}

// micro-batch i's input arrives
static void pipe_receive(Walk *w, int i) {
    if (w->dynamic && w->s->stage > 0) add(w, CAT_ACTIVATIONS, w->acts.input, key_of(PIECE_INPUT, i, 0));
}

static void pipe_backward(Walk *w, int j) {
    const GPTPlan *p = &w->s->plan;
    for (int u = p->last_unit; u >= p->first_unit; u--) unit_backward(w, u, j);
}

// Zero bubble's W of micro-batch j: each block's gradients from its stash,
// in the order of the backward, the stash let go after.
static void pipe_weights(Walk *w, int j) {
    const GPTPlan *p = &w->s->plan;
    for (int u = p->last_unit; u >= p->first_unit; u--) {
        if (!split(w, u)) continue;
        enter(w, PHASE_WEIGHTS, u, j);
        if (!w->dynamic) continue;
        let_go_grads(w);
        add(w, CAT_WORKSPACE, w->unit_grads = (double)w->s->layout->unit[u].count * sizeof(float),
            key_of(PIECE_UNIT_GRADS, 0, 0));
        add(w, CAT_ACTIVATIONS, -w->acts.w_stash, key_of(PIECE_W_STASH, j, block_index(w, u)));
    }
}

// Interleaved from the stage's row of the table: F i.j receives chunk j's
// input as it begins (the range's input for chunk 0, but on the first
// stage, whose tokens arrive with the forward), then runs chunk j's units;
// B i.j runs them backward.
static void interleaved_step(Walk *w) {
    const StepMemorySpec *s = w->s;
    const GPTPlan *p = &s->plan;
    for (int k = 0; k < s->nops; k++) {
        SchedOp op = s->ops[k];
        int first = gpt_plan_chunk_first_unit(p, op.chunk), last = gpt_plan_chunk_last_unit(p, op.chunk);
        if (op.kind == SCHED_B) {
            for (int u = last; u >= first; u--) unit_backward(w, u, op.micro);
            continue;
        }
        if (op.chunk > 0) {
            if (w->dynamic) add(w, CAT_ACTIVATIONS, w->acts.chunk_input, key_of(PIECE_CHUNK_INPUT, op.micro, op.chunk));
        } else {
            pipe_receive(w, op.micro);
            enter(w, PHASE_FORWARD, -1, op.micro);
            if (w->dynamic && s->stage == 0) add(w, CAT_ACTIVATIONS, w->acts.input, key_of(PIECE_INPUT, op.micro, 0));
        }
        for (int u = first; u <= last; u++) unit_forward(w, u, op.micro);
    }
}

// ZB-H1 from the stage's row of the table, with pipeline.c's transfers: a
// forward's input arrives as it begins, or right after the backward before
// it when the two are paired (a B whose next F or B is an F, not on the
// first stage).
static void zero_bubble_step(Walk *w) {
    const StepMemorySpec *s = w->s;
    int received = -1;
    for (int k = 0; k < s->nops; k++) {
        SchedOp op = s->ops[k];
        if (op.kind == SCHED_W) {
            pipe_weights(w, op.micro);
            continue;
        }
        if (op.kind == SCHED_F) {
            if (received != op.micro) pipe_receive(w, op.micro);
            pipe_forward(w, op.micro);
            continue;
        }
        pipe_backward(w, op.micro);
        int n = k + 1;
        while (n < s->nops && s->ops[n].kind == SCHED_W) n++;
        if (n < s->nops && s->ops[n].kind == SCHED_F && s->stage > 0)
            pipe_receive(w, s->ops[n].micro), received = s->ops[n].micro;
    }
}

// The schedules as pipeline.c's comments state them (PipeDream-Flush for
// 1F1B: w = min(P - s - 1, m) warm-up forwards, the rest paired with a
// backward, each next input received after that backward; GPipe's AFAB:
// every forward, then every backward), with each input's arrival.
static void pipeline_step(Walk *w) {
    const StepMemorySpec *s = w->s;
    int m = s->micro_batches;
    CHECK(s->schedule == PIPE_AFAB || s->schedule == PIPE_1F1B || s->ops,
          "step_memory: schedule %d without its table", (int)s->schedule);
    if (s->schedule == PIPE_ZB_H1) {
        zero_bubble_step(w);
        return;
    }
    if (s->schedule == PIPE_INTERLEAVED) {
        interleaved_step(w);
        return;
    }
    if (s->schedule == PIPE_AFAB) {
        for (int i = 0; i < m; i++) pipe_receive(w, i), pipe_forward(w, i);
        for (int j = 0; j < m; j++) pipe_backward(w, j);
        return;
    }
    int warmup = s->stages - s->stage - 1 < m ? s->stages - s->stage - 1 : m, steady = m - warmup;
    for (int i = 0; i < warmup; i++) pipe_receive(w, i), pipe_forward(w, i);
    if (steady > 0) pipe_receive(w, warmup);
    for (int j = 0; j < steady; j++) {
        pipe_forward(w, warmup + j);
        pipe_backward(w, j);
        if (j < steady - 1) pipe_receive(w, warmup + j + 1);
    }
    for (int j = steady; j < m; j++) pipe_backward(w, j);
}

void step_memory(const StepMemorySpec *s, StepMemory *out) {
    memset(out, 0, sizeof *out);
    Walk w = {.s = s, .acts = act_units(s->layout, &s->plan, s->act_bytes), .out = out,
              .dynamic = !s->plan.contiguous, .phase = {PHASE_SETUP, -1, -1}};
    arena_init(&w.arena, (size_t)1 << 52);  // endless: its high-water mark is the region a run needs
    for (int k = 0; k < s->nfixed; k++) add(&w, s->fixed[k].cat, s->fixed[k].bytes, key_of(PIECE_FIXED, 0, k));
    if (w.dynamic) add(&w, CAT_ACTIVATIONS, w.acts.shared, key_of(PIECE_SHARED, 0, 0));
    if (s->shape == STEP_PIPELINE) pipeline_step(&w);
    else
        for (int i = 0; i < s->micro_batches; i++) whole_micro_batch(&w, i);
    // the pass is over: its last gradients go (gpt_pass_end), then the update, then the step's end
    if (w.dynamic) {
        add(&w, CAT_WORKSPACE, -w.unit_grads, key_of(PIECE_UNIT_GRADS, 0, 0));
        add(&w, CAT_WORKSPACE, -(w.embed_pending ? 0 : w.embed_grads), key_of(PIECE_EMBED_GRADS, 0, 0));
    }
    enter(&w, PHASE_OPTIMIZER, -1, -1);
    enter(&w, PHASE_SETUP, -1, -1);
    ArenaStats placed = arena_stats(&w.arena);
    out->arena_peak = (double)placed.peak_allocated;
    out->high_water = (double)placed.high_water;
    arena_destroy(&w.arena);
    free(w.placed);
}

void step_memory_free(StepMemory *m) {
    free(m->b);
    memset(m, 0, sizeof *m);
}

int step_memory_first_difference(const StepMemory *f, const MemBoundary *measured, int n, int *cat) {
    *cat = -1;
    for (int k = 0; k < n || k < f->n; k++) {
        if (k >= n || k >= f->n) return k;
        const MemPhase *a = &f->b[k].phase, *b = &measured[k].phase;
        if (a->kind != b->kind || a->unit != b->unit || a->micro != b->micro) return k;
        for (int c = 0; c < CAT_COUNT; c++)
            if (f->b[k].device[c] != measured[k].device[c]) return *cat = c, k;
    }
    return -1;
}
