// pipeline.c: the schedules of a pipeline stage (see pipeline.h): the
// micro-batches' slots, the transfers between neighbouring stages, AFAB and
// 1F1B, and the bubble measured from the timeline.
#include "pipeline.h"
#include "parallel3d.h"
#include <stdio.h>
#include <stdlib.h>
#include "check.h"

// Activations travel forward, their gradients backward; each direction is
// a stream of its own that MPI keeps in order (NCCL matches in issue order).
enum { TAG_FORWARD = 0, TAG_BACKWARD = 1 };

int pipeline_slots(Schedule s, int stages, int stage, int micro_batches) {  // ZB-H1: 1F1B's
    int in_flight = s == SCHEDULE_AFAB ? micro_batches : stages - stage;
    if (in_flight > micro_batches) in_flight = micro_batches;
    return in_flight > 0 ? in_flight : 1;
}

double pipeline_bubble_formula(int stages, int micro_batches) {
    return (double)(stages - 1) / (micro_batches + stages - 1);
}

void pipeline_init(Pipeline *p, Trainer *t, Comm *pp, int stage, int stages, Schedule s, int slots,
                   const ScheduleTable *table, int max_micro) {
    *p = (Pipeline){.t = t, .pp = pp, .stage = stage, .stages = stages, .schedule = s, .slots = slots,
                    .max_micro = max_micro};
    p->chunks = 1;
    if (s == SCHEDULE_ZB_H1 || s == SCHEDULE_INTERLEAVED) {
        CHECK(table && table->stages == stages && (table->schedule == PIPE_ZB_H1) == (s == SCHEDULE_ZB_H1),
              "pipeline: %s without its table", s == SCHEDULE_ZB_H1 ? "zb-h1" : "interleaved");
        p->table = table;
        p->chunks = table->chunks;
        if (s == SCHEDULE_ZB_H1) p->w_slots = schedule_pending_w(table, stage);
    }
    p->slot_micro = xmalloc((size_t)slots * sizeof(int));
    for (int i = 0; i < slots; i++) p->slot_micro[i] = -1;
    p->sent_fwd = xcalloc((size_t)slots * (size_t)p->chunks, sizeof(CommHandle));
    p->sent_bwd = xcalloc((size_t)slots * (size_t)p->chunks, sizeof(CommHandle));
    int v = p->chunks;
    p->names = xcalloc((v > 1 ? 2 * (size_t)v : 3) * (size_t)max_micro, sizeof *p->names);
    for (int i = 0; i < max_micro; i++) {
        if (v > 1) {
            for (int j = 0; j < v; j++) {
                snprintf(p->names[(size_t)i * v + j], sizeof p->names[i], "F%d.%d", i, j);
                snprintf(p->names[((size_t)max_micro + i) * v + j], sizeof p->names[i], "B%d.%d", i, j);
            }
            continue;
        }
        snprintf(p->names[i], sizeof p->names[i], "F%d", i);
        snprintf(p->names[max_micro + i], sizeof p->names[i], "B%d", i);
        snprintf(p->names[2 * max_micro + i], sizeof p->names[i], "W%d", i);
    }
}

void pipeline_free(Pipeline *p) {
    free(p->slot_micro);
    free(p->sent_fwd);
    free(p->sent_bwd);
    free(p->names);
}

static int is_first(const Pipeline *p) { return p->stage == 0; }
static int is_last(const Pipeline *p) { return p->stage == p->stages - 1; }
static GPT *model(Pipeline *p) { return &p->t->model; }
// the rank's residual stream, (BT,C) or its rows under sequence parallelism:
// what crosses between stages (each tp rank to its own on the next stage), in
// the activations' type
static size_t act_count(Pipeline *p) { return gpt_residual_elems(model(p)); }
static DType act_type(Pipeline *p) { return model(p)->dev->act_bytes == 4 ? DT_F32 : DT_HALF; }

// ---- slots ----

// Micro-batch i lives in slot i mod slots from its input to the end of its
// backward. Claiming the slot finds it free (a schedule that keeps more in
// flight than there are slots stops here) and waits for the sends that still
// read it: the forward overwrites the output they carry.
static int claim_slot_at(Pipeline *p, int i, int s) {
    if (p->slot_micro[s] == i) return s;  // claimed when its input was received
    CHECK(p->slot_micro[s] < 0, "pipeline: micro-batch %d needs slot %d, which still holds micro-batch %d; hint: "
          "the schedule keeps more micro-batches in flight than the plan's %d slots", i, s, p->slot_micro[s], p->slots);
    for (int j = 0; j < p->chunks; j++) {  // (each interleaved chunk's)
        comm_wait(p->pp, &p->sent_fwd[s * p->chunks + j]);
        comm_wait(p->pp, &p->sent_bwd[s * p->chunks + j]);
    }
    p->slot_micro[s] = i;
    return s;
}
static int claim_slot(Pipeline *p, int i) { return claim_slot_at(p, i, i % p->slots); }

static int slot_of(Pipeline *p, int i) {
    int s = i % p->slots;
    CHECK(p->slot_micro[s] == i, "pipeline: micro-batch %d is not in slot %d (it holds %d); hint: a backward before "
          "its forward", i, s, p->slot_micro[s]);
    return s;
}

static void release_slot(Pipeline *p, int s) {
    p->slot_micro[s] = -1;
    p->in_flight--;
}

// ---- transfers between neighbours (no-ops at the pipeline's ends) ----

static void recv_forward(Pipeline *p, int i) {
    if (is_first(p)) return;
    int s = claim_slot(p, i);
    comm_recv(p->pp, gpt_slot_input(model(p), s), act_count(p), act_type(p), p->stage - 1, TAG_FORWARD, NULL);
}

static void send_forward(Pipeline *p, int i) {
    if (is_last(p)) return;
    int s = slot_of(p, i);
    comm_send(p->pp, gpt_slot_output(model(p), s), act_count(p), act_type(p), p->stage + 1, TAG_FORWARD,
              &p->sent_fwd[s]);
}

static void recv_backward(Pipeline *p, int j) {
    if (is_last(p)) return;
    int s = slot_of(p, j);
    comm_wait(p->pp, &p->sent_bwd[s]);  // the gradient arrives where the last one left from
    comm_recv(p->pp, gpt_slot_grad(model(p), s), act_count(p), act_type(p), p->stage + 1, TAG_BACKWARD, NULL);
}

static void send_backward(Pipeline *p, int j) {
    if (is_first(p)) return;
    int s = j % p->slots;  // released by its backward; its gradient stays until the send completes
    comm_send(p->pp, gpt_slot_grad(model(p), s), act_count(p), act_type(p), p->stage - 1, TAG_BACKWARD,
              &p->sent_bwd[s]);
}

// Output of i forward and the gradient of j's output back, with the next
// stage, which at the same moment sends j's gradient and receives i.
static void send_forward_recv_backward(Pipeline *p, int i, int j) {
    if (is_last(p)) return;
    int si = slot_of(p, i), sj = slot_of(p, j);
    comm_wait(p->pp, &p->sent_bwd[sj]);
    CommHandle got = {0};
    comm_send_recv(p->pp, gpt_slot_output(model(p), si), TAG_FORWARD, gpt_slot_grad(model(p), sj), TAG_BACKWARD,
                   act_count(p), act_type(p), p->stage + 1, &p->sent_fwd[si], &got);
    comm_wait(p->pp, &got);
}

// Gradient of j's input back and i's input in, with the previous stage.
static void send_backward_recv_forward(Pipeline *p, int j, int i) {
    if (is_first(p)) return;
    int sj = j % p->slots, si = claim_slot(p, i);
    CommHandle got = {0};
    comm_send_recv(p->pp, gpt_slot_grad(model(p), sj), TAG_BACKWARD, gpt_slot_input(model(p), si), TAG_FORWARD,
                   act_count(p), act_type(p), p->stage - 1, &p->sent_bwd[sj], &got);
    comm_wait(p->pp, &got);
}

static void wait_sends(Pipeline *p) {
    for (int s = 0; s < p->slots * p->chunks; s++) {
        comm_wait(p->pp, &p->sent_fwd[s]);
        comm_wait(p->pp, &p->sent_bwd[s]);
    }
}

// ---- one stage's compute of one micro-batch ----

static void forward(Pipeline *p, int i) {
    Trainer *t = p->t;
    const MicroBatches *mb = p->mb;
    GPT *g = model(p);
    int s = claim_slot(p, i);
    trainer_micro_batch_to_slot(t, mb, i, s);
    const bf16 *wte = is_last(p) ? part_unit_params(t, GPT_UNIT_EMBED) : NULL;  // the head's tied projection
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    for (int u = g->plan.first_unit; u <= g->plan.last_unit; u++)
        gpt_unit_forward(g, u, s, part_unit_params(t, u), wte);
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, p->names[i], 0);
    if (is_last(p)) gpt_slot_loss_queue(g, s);
    if (++p->in_flight > p->peak_in_flight && mb->backward) p->peak_in_flight = p->in_flight;
}

// Micro-batch j's backward; under ZB-H1 its B alone: the blocks' weights'
// gradients wait in W slot j mod w_slots for its W (the head's and the
// embeddings' are whole here).
static void backward(Pipeline *p, int j) {
    Trainer *t = p->t;
    GPT *g = model(p);
    int s = slot_of(p, j), split = p->schedule == SCHEDULE_ZB_H1;
    comm_wait(p->pp, &p->sent_bwd[s]);  // the backward rewrites the gradient an earlier send carries
    comm_wait(p->pp, &p->sent_fwd[s]);  // and lets go of the output that micro-batch's forward sent
    GradTurn turn = micro_turn(p->mb, j);  // the first micro-batch writes the gradients, the others add to them
    const bf16 *wte = is_last(p) ? part_unit_params(t, GPT_UNIT_EMBED) : NULL;
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    for (int u = g->plan.last_unit; u >= g->plan.first_unit; u--) {
        const bf16 *params = part_unit_params(t, u);
        const float *grads = split ? gpt_unit_backward_input(g, u, s, j % p->w_slots, params, wte)
                                   : gpt_unit_backward(g, u, s, params, wte);
        if (grads) part_add_grads(t, u, grads, turn);
        // the last stage keeps a copy of wte: the head's part of its tied gradient goes there
        if (u == gpt_unit_head(&g->L) && !is_first(p))
            part_add_grads(t, GPT_UNIT_EMBED, gpt_tied_wte_grads(g, s), turn);
    }
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, p->names[p->max_micro + j], 0);
    release_slot(p, s);
    if (split && ++p->pending_w > p->peak_pending_w) p->peak_pending_w = p->pending_w;
}

// ZB-H1's W of micro-batch j: the blocks' weights' gradients from its W
// slot, in the order 1F1B's backward adds them.
static void weights(Pipeline *p, int j) {
    Trainer *t = p->t;
    GPT *g = model(p);
    GradTurn turn = micro_turn(p->mb, j);
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    for (int u = g->plan.last_unit; u >= g->plan.first_unit; u--)
        if (u != GPT_UNIT_EMBED && u != gpt_unit_head(&g->L))
            part_add_grads(t, u, gpt_unit_backward_weights(g, u, j % p->w_slots), turn);
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, p->names[2 * p->max_micro + j], 0);
    p->pending_w--;
}

// ---- the schedules ----

// An evaluation: forwards only, each micro-batch's slot free again at once.
static void forwards_only(Pipeline *p, int m) {
    for (int i = 0; i < m; i++) {
        recv_forward(p, i);
        forward(p, i);
        send_forward(p, i);
        release_slot(p, i % p->slots);
    }
}

// GPipe: every forward, then every backward, in micro-batch order.
static void all_forward_all_backward(Pipeline *p, int m) {
    for (int i = 0; i < m; i++) {
        recv_forward(p, i);
        forward(p, i);
        send_forward(p, i);
    }
    for (int j = 0; j < m; j++) {
        recv_backward(p, j);
        backward(p, j);
        send_backward(p, j);
    }
}

// LAB 07: one_forward_one_backward -- the 1F1B schedule of one pipeline stage
// PipeDream-Flush (Narayanan et al. 2021), Megatron-LM's schedule, for this
// stage s = p->stage of P = p->stages over m micro-batches (0..m-1):
//   warm-up: w = min(P - s - 1, m) forwards, each recv_forward(i),
//            forward(i), send_forward(i);
//   steady:  for the other m - w forwards i = w + j, j = 0, 1, ...: first
//            receive micro-batch w (recv_forward) before the loop; then
//            forward(i), send_forward_recv_backward(i, j), backward(j),
//            and send_backward_recv_forward(j, i + 1), except after the
//            last forward, where it is send_backward(j) alone;
//   cool-down: the last w backwards, each recv_backward(j), backward(j),
//            send_backward(j).
// Backwards run in micro-batch order, as AFAB's, so the gradients match to
// the bit; at most w + 1 = min(P - s, m) micro-batches are in flight. The
// paired transfers let two neighbours that both send first go on.
static void one_forward_one_backward(Pipeline *p, int m) {
    int warmup = p->stages - p->stage - 1 < m ? p->stages - p->stage - 1 : m, steady = m - warmup;
    for (int i = 0; i < warmup; i++) {
        recv_forward(p, i);
        forward(p, i);
        send_forward(p, i);
    }
    if (steady > 0) recv_forward(p, warmup);
    for (int j = 0; j < steady; j++) {
        int i = warmup + j;
        forward(p, i);
        send_forward_recv_backward(p, i, j);
        backward(p, j);
        if (j == steady - 1) send_backward(p, j);
        else send_backward_recv_forward(p, j, i + 1);
    }
    for (int j = steady; j < m; j++) {
        recv_backward(p, j);
        backward(p, j);
        send_backward(p, j);
    }
}
// LAB END

// ZB-H1: the table's operations of this stage in order. Its F's and B's
// come in 1F1B's order, and so do the transfers: a send is paired with the
// receive the next F or B needs from the same neighbour (after a forward,
// the gradient for the next backward; after a backward, the input of the
// next forward), as one_forward_one_backward pairs them, so two neighbours
// that both send first go on; the receive is waited for only by the
// operation it feeds, so the Ws the table puts between run meanwhile.
static int next_compute(const ScheduleTable *tb, int stage, int k) {
    while (k < tb->count[stage] && schedule_op(tb, stage, k).kind == SCHED_W) k++;
    return k;
}

static void zero_bubble(Pipeline *p, int m) {
    const ScheduleTable *tb = p->table;
    CHECK(m == tb->micro_batches, "pipeline: a step of %d micro-batches on a zb-h1 table of %d", m, tb->micro_batches);
    int received = -1;  // the micro-batch whose input or gradient `got` brings (ahead of its operation)
    for (int k = 0; k < tb->count[p->stage]; k++) {
        SchedOp op = schedule_op(tb, p->stage, k);
        if (op.kind == SCHED_W) {
            weights(p, op.micro);
            continue;
        }
        if (received == op.micro) comm_wait(p->pp, &p->got), received = -1;
        else if (op.kind == SCHED_F) recv_forward(p, op.micro);
        else recv_backward(p, op.micro);
        if (op.kind == SCHED_F) forward(p, op.micro);
        else backward(p, op.micro);
        int n = next_compute(tb, p->stage, k + 1);
        SchedOp next = n < tb->count[p->stage] ? schedule_op(tb, p->stage, n) : (SchedOp){SCHED_W, -1, 0};
        int paired = next.micro >= 0 && next.kind != op.kind &&
                     (op.kind == SCHED_F ? !is_last(p) : !is_first(p));  // the same neighbour, both ways
        if (!paired) {
            if (op.kind == SCHED_F) send_forward(p, op.micro);
            else send_backward(p, op.micro);
            continue;
        }
        if (op.kind == SCHED_F) {  // i's output forward, the gradient of the next B's back
            int si = slot_of(p, op.micro), sj = slot_of(p, next.micro);
            comm_wait(p->pp, &p->sent_bwd[sj]);
            comm_send_recv(p->pp, gpt_slot_output(model(p), si), TAG_FORWARD, gpt_slot_grad(model(p), sj),
                           TAG_BACKWARD, act_count(p), act_type(p), p->stage + 1, &p->sent_fwd[si], &p->got);
        } else {  // j's input gradient back, the next F's input in
            int sj = op.micro % p->slots, si = claim_slot(p, next.micro);
            comm_send_recv(p->pp, gpt_slot_grad(model(p), sj), TAG_BACKWARD, gpt_slot_input(model(p), si),
                           TAG_FORWARD, act_count(p), act_type(p), p->stage - 1, &p->sent_bwd[sj], &p->got);
        }
        received = next.micro;
    }
    CHECK(received < 0, "pipeline: micro-batch %d's transfer was never waited for", received);
}

// ---- interleaved: v chunks per stage ----

// Virtual stage c = j·P + s runs chunk j of stage s; a micro-batch goes
// through c = 0, 1, ..., P·v - 1: the next of stage s's chunk j is stage
// s + 1's chunk j, or after the last stage the first stage's chunk j + 1.
// Each transfer carries its receiving chunk in its tag (MPI keeps each
// tag's messages in order; every stage runs its chunks in the table's order).
static int virtual_stage(const Pipeline *p, int j) { return j * p->stages + p->stage; }
static int last_virtual(const Pipeline *p) { return p->stages * p->chunks - 1; }
static int tag_of(int direction, int chunk) { return direction + 2 * chunk; }

// The transfer before operation op (F i.j: chunk j's input, but the first
// virtual stage's, whose tokens come with it; B i.j: the gradient of its
// output, but the last virtual stage's): 0 where none, else its buffer,
// peer and tag. Finding F i.0's buffer claims micro-batch i's slot (an
// evaluation's: slot 0, one micro-batch at a time), and B's waits for the
// slot's gradient to have left.
static int recv_of(Pipeline *p, SchedOp op, void **buf, int *from, int *tag) {
    GPT *g = model(p);
    int c = virtual_stage(p, op.chunk), j = op.chunk;
    if (op.kind == SCHED_F) {
        if (c == 0) return 0;
        int s = j > 0 ? (p->mb->backward ? slot_of(p, op.micro) : 0)
                      : (p->mb->backward ? claim_slot(p, op.micro) : claim_slot_at(p, op.micro, 0));
        *buf = j == 0 ? gpt_slot_input(g, s) : gpt_slot_chunk_input(g, s, j);
        *from = (p->stage + p->stages - 1) % p->stages;
        *tag = tag_of(TAG_FORWARD, j);
        return 1;
    }
    if (c == last_virtual(p)) return 0;
    int s = slot_of(p, op.micro);
    for (int k = 0; k < p->chunks; k++) comm_wait(p->pp, &p->sent_bwd[s * p->chunks + k]);
    *buf = gpt_slot_grad(g, s);
    *from = (p->stage + 1) % p->stages;
    *tag = tag_of(TAG_BACKWARD, j);
    return 1;
}

// The transfer after it: F's output on (but the last virtual stage's), B's
// input gradient back (but the first virtual stage's), and its handle.
static int send_of(Pipeline *p, SchedOp op, int s, const void **buf, int *to, int *tag, CommHandle **h) {
    GPT *g = model(p);
    int c = virtual_stage(p, op.chunk), j = op.chunk;
    if (op.kind == SCHED_F) {
        if (c == last_virtual(p)) return 0;
        *buf = gpt_slot_chunk_output(g, s, j);
        *to = (p->stage + 1) % p->stages;
        *tag = tag_of(TAG_FORWARD, is_last(p) ? j + 1 : j);
        *h = &p->sent_fwd[s * p->chunks + j];
        return 1;
    }
    if (c == 0) return 0;
    *buf = gpt_slot_grad(g, s);
    *to = (p->stage + p->stages - 1) % p->stages;
    *tag = tag_of(TAG_BACKWARD, is_first(p) ? j - 1 : j);
    *h = &p->sent_bwd[s * p->chunks + j];
    return 1;
}

// F i.j's compute: chunk j's units (the slot claimed, the tokens in, for chunk 0).
static int forward_chunk(Pipeline *p, int i, int j) {
    Trainer *t = p->t;
    GPT *g = model(p);
    int s;
    if (j == 0) {
        s = p->mb->backward ? claim_slot(p, i) : claim_slot_at(p, i, 0);
        trainer_micro_batch_to_slot(t, p->mb, i, s);
    } else {
        s = p->mb->backward ? slot_of(p, i) : 0;
    }
    const bf16 *wte = is_last(p) ? part_unit_params(t, GPT_UNIT_EMBED) : NULL;  // the head's tied projection
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    int first = gpt_plan_chunk_first_unit(&g->plan, j), last = gpt_plan_chunk_last_unit(&g->plan, j);
    for (int u = first; u <= last; u++) gpt_unit_forward(g, u, s, part_unit_params(t, u), wte);
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, p->names[(size_t)i * p->chunks + j], 0);
    if (virtual_stage(p, j) == last_virtual(p)) gpt_slot_loss_queue(g, s);
    if (++p->in_flight > p->peak_in_flight && p->mb->backward) p->peak_in_flight = p->in_flight;
    return s;
}

// B i.j's compute: chunk j's units backward, their gradients added; the
// micro-batch's slot free after chunk 0's.
static int backward_chunk(Pipeline *p, int i, int j) {
    Trainer *t = p->t;
    GPT *g = model(p);
    int s = slot_of(p, i);
    comm_wait(p->pp, &p->sent_fwd[s * p->chunks + j]);  // the chunk's output is let go in its backward
    GradTurn turn = micro_turn(p->mb, i);
    const bf16 *wte = is_last(p) ? part_unit_params(t, GPT_UNIT_EMBED) : NULL;
    DevSpan sp = dev_span_begin(&t->dev, STREAM_COMPUTE);
    int first = gpt_plan_chunk_first_unit(&g->plan, j), last = gpt_plan_chunk_last_unit(&g->plan, j);
    for (int u = last; u >= first; u--) {
        part_add_grads(t, u, gpt_unit_backward(g, u, s, part_unit_params(t, u), wte), turn);
        if (u == gpt_unit_head(&g->L) && !is_first(p))
            part_add_grads(t, GPT_UNIT_EMBED, gpt_tied_wte_grads(g, s), turn);
    }
    dev_span_end(&t->dev, &sp, TRACE_TID_COMPUTE, p->names[((size_t)p->max_micro + i) * p->chunks + j], 0);
    p->in_flight--;
    if (j == 0) p->slot_micro[s] = -1;  // the micro-batch is done with
    return s;
}

// A list of operations (the table's row of a step, or an evaluation's
// forwards): each one's receive, its compute, its send. A send goes out
// together with the receive of the operation after it, whichever
// neighbour each is with (Megatron's batched send-and-receive), and that
// receive is waited for by the operation it feeds: on NCCL, where a send
// holds its stream until its peer receives, two stages that both send
// first would otherwise wait on each other (the last stage's chunk and the
// first's are neighbours too).
static void run_ops(Pipeline *p, const SchedOp *ops, int n) {
    int posted = -1;  // the operation whose receive `got` carries
    for (int k = 0; k < n; k++) {
        SchedOp op = ops[k];
        void *rbuf;
        int from, rtag;
        if (posted == k) comm_wait(p->pp, &p->got);
        else if (recv_of(p, op, &rbuf, &from, &rtag))
            comm_recv(p->pp, rbuf, act_count(p), act_type(p), from, rtag, NULL);
        int s = op.kind == SCHED_F ? forward_chunk(p, op.micro, op.chunk) : backward_chunk(p, op.micro, op.chunk);
        const void *sbuf;
        int to, stag;
        CommHandle *h;
        if (!send_of(p, op, s, &sbuf, &to, &stag, &h)) continue;
        if (k + 1 < n && recv_of(p, ops[k + 1], &rbuf, &from, &rtag)) {
            comm_send_recv_peers(p->pp, sbuf, stag, to, rbuf, rtag, from, act_count(p), act_type(p), h, &p->got);
            posted = k + 1;
        } else {
            comm_send(p->pp, sbuf, act_count(p), act_type(p), to, stag, h);
        }
    }
}

// A step: the table's operations of this stage in order.
static void interleaved(Pipeline *p, int m) {
    const ScheduleTable *tb = p->table;
    CHECK(m == tb->micro_batches, "pipeline: a step of %d micro-batches on an interleaved table of %d", m,
          tb->micro_batches);
    run_ops(p, tb->ops + (size_t)p->stage * (size_t)tb->per_stage, tb->count[p->stage]);
}

// An evaluation: each micro-batch through the virtual stages in turn, in
// slot 0 (what the last one left there goes when the next arrives).
static void interleaved_forwards_only(Pipeline *p, int m) {
    SchedOp *ops = xmalloc((size_t)m * (size_t)p->chunks * sizeof *ops);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < p->chunks; j++) ops[i * p->chunks + j] = (SchedOp){SCHED_F, i, j};
    for (int i = 0; i < m; i++) {  // one micro-batch at a time: its chunks' forwards, then the slot free
        run_ops(p, ops + (size_t)i * p->chunks, p->chunks);
        p->in_flight -= p->chunks;
        p->slot_micro[0] = -1;
    }
    free(ops);
}

// The pipeline's window: from the first stage's start to the last stage's
// end (a clock every rank shares, as the trace assumes); idle = the window
// less this rank's compute in it, read at pipeline_settle. The stage's
// device work has ended at t1 (the caller waited for it).
static void measure_window(Pipeline *p, double t0_us, double t1_us) {
    p->window_us[0] = -comm_max_f64(p->pp, -t0_us);
    p->window_us[1] = comm_max_f64(p->pp, t1_us);
}

void pipeline_settle(Pipeline *p) {
    double w0 = p->window_us[0], w1 = p->window_us[1];
    p->window_us[0] = p->window_us[1] = 0;
    if (w1 <= w0) return;
    double busy = timeline_union_us(&p->t->trace.tl, TRACE_TID_COMPUTE, w0, w1);
    p->bubble_sum += 1.0 - busy / (w1 - w0);
    p->bubble_steps++;
}

double pipeline_run(Pipeline *p, const MicroBatches *mb) {
    CHECK(mb->count <= p->max_micro, "pipeline: %d micro-batches in a pass, at most %d", mb->count, p->max_micro);
    p->mb = mb;
    int training = mb->backward;
    pipeline_settle(p);  // the step before's, its spans on the trace by now
    double t0 = now_us();
    if (p->schedule == SCHEDULE_INTERLEAVED && training) interleaved(p, mb->count);
    else if (p->schedule == SCHEDULE_INTERLEAVED) interleaved_forwards_only(p, mb->count);
    else if (!training) forwards_only(p, mb->count);
    else if (p->schedule == SCHEDULE_AFAB) all_forward_all_backward(p, mb->count);
    else if (p->schedule == SCHEDULE_ZB_H1) zero_bubble(p, mb->count);
    else one_forward_one_backward(p, mb->count);
    wait_sends(p);
    CHECK(p->in_flight == 0 && p->pending_w == 0, "pipeline: %d micro-batches still in flight and %d waiting for "
          "their W after the schedule", p->in_flight, p->pending_w);
    if (training) {
        dev_sync(&p->t->dev, STREAM_COMPUTE);  // the window ends with this stage's last backward
        measure_window(p, t0, now_us());
    }
    // the losses are the last stage's (read back once per step): every stage returns them
    double loss = gpt_losses_take(model(p));
    return comm_sum_f64(p->pp, loss);
}
