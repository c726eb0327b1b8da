// test_model_units.c: the model's forward and backward of one unit for one
// micro-batch (gpt_unit_forward/backward) on the cpu device. The same kernels
// on the same inputs give the same bits, so every comparison here is exact
// but one (named below):
//   - micro-batches kept in slots and run in the orders a pipeline uses
//     (F0 F1 B0 B1; all forwards then all backwards; one forward one
//     backward) give the losses and gradients of the whole-model walk run
//     once per micro-batch;
//   - the model cut into three pipeline stages (three GPTs over unit ranges,
//     activations and their gradients copied between them) gives the same
//     losses and gradients; wte's gradient, whose two parts (tied head,
//     embeddings) are added in another order, within fp32 rounding;
//   - the activation bytes of a plan equal the allocation and the formula;
//   - misuse (a unit outside the plan, interleaved backwards, the head
//     without wte, a tied gradient not taken) fails loudly.
#include "testutil.h"
#include "bf16.h"
#include "check.h"
#include "device.h"
#include "act_math.h"
#include "gpt.h"
#include "gpt_units.h"  // the checkpoint store's size (white-box)
#include "model_walk.h"

enum { B = 2, T = 8, BT = B * T, MAX_MB = 4 };

// The whole model's bf16 params and, per micro-batch, its fp32 gradients
// (the walk adds into grads[mb], so a unit handed over in two parts sums).
typedef struct Capture {
    GPTLayout l;
    bf16 *params;
    float *grads[MAX_MB];
} Capture;

static void device_cpu(Device *d) {
    DeviceOptions o = {.kind = "cpu", .local_size = 1};
    device_init(d, &o);
}

// In a forked child: the parent's OpenMP thread pool did not come along,
// and a parallel region waiting for it would hang; one thread needs none.
static void device_cpu_in_child(Device *d) {
    DeviceOptions o = {.kind = "cpu", .local_size = 1, .threads = 1};
    device_init(d, &o);
}

static void capture_init(Capture *c, const char *preset, int vocab) {
    GPTConfig cfg;
    assert_true(gpt_preset(preset, &cfg));
    cfg.vocab_size = vocab;
    memset(c, 0, sizeof *c);
    gpt_layout(&c->l, &cfg);
    size_t n = c->l.num_params;
    float *init = malloc(n * sizeof(float));
    gpt_init_values(&c->l, 11, 0, n, init);
    c->params = malloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) c->params[i] = f32_to_bf16(init[i] * 4.0f);  // larger weights, larger gradients
    for (int m = 0; m < MAX_MB; m++) c->grads[m] = calloc(n, sizeof(float));
    free(init);
}

static void capture_clear(Capture *c) {
    for (int m = 0; m < MAX_MB; m++) memset(c->grads[m], 0, c->l.num_params * sizeof(float));
}

static void capture_free(Capture *c) {
    free(c->params);
    for (int m = 0; m < MAX_MB; m++) free(c->grads[m]);
}

typedef struct Batches {
    int32_t in[MAX_MB][BT], tgt[MAX_MB][BT];
} Batches;

static void batches_fill(Batches *b, int vocab) {
    uint64_t s = 5;
    for (int m = 0; m < MAX_MB; m++)
        for (int i = 0; i < BT; i++) {
            b->in[m][i] = (int32_t)(test_rng_next(&s) % vocab);
            b->tgt[m][i] = (int32_t)(test_rng_next(&s) % vocab);
        }
}

// The reference: the whole-model walk, one micro-batch at a time.
static void reference(Device *d, Capture *c, const Batches *bt, int nmb, double *loss) {
    GPT g;
    GPTPlan plan = gpt_plan_whole(&c->l, B, T);
    gpt_alloc(&g, &c->l, d, &plan, NULL);
    capture_clear(c);
    for (int m = 0; m < nmb; m++) {
        loss[m] = walk_loss(&g, c->params, bt->in[m], bt->tgt[m], 1.0f / (nmb * BT));
        walk_backward(&g, c->params, c->grads[m], 0);
    }
    gpt_free(&g);
}

static void expect_bits(const char *what, int mb, const float *got, const float *want, size_t n, size_t skip_lo,
                        size_t skip_hi) {
    for (size_t i = 0; i < n; i++) {
        if (i >= skip_lo && i < skip_hi) continue;
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s, micro-batch %d: gradient %zu is %.9g, the whole-model walk's %.9g", what, mb, i, got[i], want[i]);
    }
}

// ---- slots: the orders a pipeline schedule runs micro-batches in ----

// A schedule step: forward (f = 1) or backward (f = 0) of micro-batch mb.
typedef struct Step {
    int f, mb;
} Step;

static void run_schedule(Device *d, Capture *c, const Batches *bt, const Step *steps, int nsteps, int nmb, int slots,
                         GPTRecompute rc, double *loss) {
    GPT g;
    GPTPlan plan = gpt_plan_whole(&c->l, B, T);
    plan.slots = slots;
    plan.recompute = rc;
    gpt_alloc(&g, &c->l, d, &plan, NULL);
    capture_clear(c);
    for (int i = 0; i < nsteps; i++) {
        int m = steps[i].mb, s = m % slots;
        if (steps[i].f) {
            gpt_slot_tokens(&g, s, bt->in[m], bt->tgt[m], 1.0f / (nmb * BT));
            walk_forward(&g, c->params, s);
            loss[m] = gpt_slot_loss(&g, s);
        } else {
            walk_backward(&g, c->params, c->grads[m], s);
        }
    }
    gpt_free(&g);
}

static void check_schedule_recompute(const char *name, const Step *steps, int nsteps, int nmb, int slots,
                                     GPTRecompute rc) {
    Device d;
    device_cpu(&d);
    Capture c;
    capture_init(&c, "tiny", 250);
    Batches bt;
    batches_fill(&bt, 250);
    double want[MAX_MB], got[MAX_MB];
    reference(&d, &c, &bt, nmb, want);
    float *ref[MAX_MB];
    for (int m = 0; m < nmb; m++) {
        ref[m] = malloc(c.l.num_params * sizeof(float));
        memcpy(ref[m], c.grads[m], c.l.num_params * sizeof(float));
    }
    run_schedule(&d, &c, &bt, steps, nsteps, nmb, slots, rc, got);
    for (int m = 0; m < nmb; m++) {
        if (memcmp(&got[m], &want[m], sizeof(double)) != 0)
            fail_msg("%s: loss of micro-batch %d is %.17g, the whole-model walk's %.17g", name, m, got[m], want[m]);
        expect_bits(name, m, c.grads[m], ref[m], c.l.num_params, 0, 0);
        free(ref[m]);
    }
    capture_free(&c);
    device_destroy(&d);
}

static void check_schedule(const char *name, const Step *steps, int nsteps, int nmb, int slots) {
    check_schedule_recompute(name, steps, nsteps, nmb, slots, GPT_RECOMPUTE_NONE);
}

static void test_two_slots_in_flight(void **state) {
    const Step s[] = {{1, 0}, {1, 1}, {0, 0}, {0, 1}};
    check_schedule("F0 F1 B0 B1", s, 4, 2, 2);
}

static void test_all_forwards_then_all_backwards(void **state) {
    const Step s[] = {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {0, 0}, {0, 1}, {0, 2}, {0, 3}};
    check_schedule("AFAB, 4 slots", s, 8, 4, 4);
}

// 1F1B with two micro-batches in flight: micro-batch 2 reuses slot 0 after its backward
static void test_one_forward_one_backward(void **state) {
    const Step s[] = {{1, 0}, {1, 1}, {0, 0}, {1, 2}, {0, 1}, {1, 3}, {0, 2}, {0, 3}};
    check_schedule("1F1B, 2 slots", s, 8, 4, 2);
}

// Recomputation gives the gradients of the forward it repeats, to the bit,
// with slots sharing the working set in a 1F1B order.
static void test_recompute_matches_none(void **state) {
    const Step s[] = {{1, 0}, {1, 1}, {0, 0}, {1, 2}, {0, 1}, {1, 3}, {0, 2}, {0, 3}};
    check_schedule_recompute("1F1B, 2 slots, --recompute selective", s, 8, 4, 2, GPT_RECOMPUTE_SELECTIVE);
    check_schedule_recompute("1F1B, 2 slots, --recompute full", s, 8, 4, 2, GPT_RECOMPUTE_FULL);
}

// Forwards of three slots interleaved unit by unit: the slots share no activation.
static void test_forwards_interleaved_by_unit(void **state) {
    Device d;
    device_cpu(&d);
    Capture c;
    capture_init(&c, "small", 256);
    Batches bt;
    batches_fill(&bt, 256);
    double want[3], got[3];
    reference(&d, &c, &bt, 3, want);
    GPT g;
    GPTPlan plan = gpt_plan_whole(&c.l, B, T);
    plan.slots = 3;
    gpt_alloc(&g, &c.l, &d, &plan, NULL);
    for (int s = 0; s < 3; s++) gpt_slot_tokens(&g, s, bt.in[s], bt.tgt[s], 1.0f / (3 * BT));
    for (int u = 0; u < c.l.num_units; u++)
        for (int s = 2; s >= 0; s--) gpt_unit_forward(&g, u, s, c.params + c.l.unit[u].offset, c.params);
    for (int s = 0; s < 3; s++) {
        got[s] = gpt_slot_loss(&g, s);
        assert_memory_equal(&got[s], &want[s], sizeof(double));
    }
    gpt_free(&g);
    capture_free(&c);
    device_destroy(&d);
}

// ---- pipeline stages in one process ----

// `small` (4 blocks) cut into [embed, block 0], [blocks 1, 2], [block 3, head],
// two micro-batches in flight on every stage, all forwards then all backwards.
static void test_pipeline_stages_match_whole(void **state) {
    Device d;
    device_cpu(&d);
    Capture c;
    capture_init(&c, "small", 256);
    Batches bt;
    batches_fill(&bt, 256);
    enum { NMB = 2, NSTAGE = 3 };
    double want[NMB], got[NMB];
    reference(&d, &c, &bt, NMB, want);
    float *ref[NMB];
    for (int m = 0; m < NMB; m++) {
        ref[m] = malloc(c.l.num_params * sizeof(float));
        memcpy(ref[m], c.grads[m], c.l.num_params * sizeof(float));
    }
    capture_clear(&c);
    const int range[NSTAGE][2] = {{0, 1}, {2, 3}, {4, 5}};
    GPT st[NSTAGE];
    for (int k = 0; k < NSTAGE; k++) {  // the middle stage recomputes its blocks
        GPTPlan p = {.B = B, .T = T, .slots = NMB, .first_unit = range[k][0], .last_unit = range[k][1],
                     .recompute = k == 1 ? GPT_RECOMPUTE_FULL : GPT_RECOMPUTE_NONE};
        gpt_alloc(&st[k], &c.l, &d, &p, NULL);
    }
    size_t act_bytes = (size_t)BT * c.l.cfg.channels * d.act_bytes;
    for (int m = 0; m < NMB; m++) {
        gpt_slot_tokens(&st[0], m, bt.in[m], NULL, 0.0f);
        gpt_slot_tokens(&st[1], m, NULL, NULL, 0.0f);
        gpt_slot_tokens(&st[2], m, NULL, bt.tgt[m], 1.0f / (NMB * BT));
        for (int k = 0; k < NSTAGE; k++) {
            if (k > 0) dev_copy(&d, gpt_slot_input(&st[k], m), gpt_slot_output(&st[k - 1], m), act_bytes, STREAM_COMPUTE);
            walk_forward(&st[k], c.params, m);
        }
        got[m] = gpt_slot_loss(&st[2], m);
    }
    for (int m = 0; m < NMB; m++) {
        for (int k = NSTAGE - 1; k >= 0; k--) {
            if (k < NSTAGE - 1) dev_copy(&d, gpt_slot_grad(&st[k], m), gpt_slot_grad(&st[k + 1], m), act_bytes, STREAM_COMPUTE);
            walk_backward(&st[k], c.params, c.grads[m], m);  // the last stage adds the head's part of wte's
        }
    }
    size_t wte_lo = c.l.emb_off[EMB_WTE], wte_hi = c.l.emb_off[EMB_WTE + 1];
    for (int m = 0; m < NMB; m++) {
        assert_memory_equal(&got[m], &want[m], sizeof(double));
        expect_bits("pipeline stages", m, c.grads[m], ref[m], c.l.num_params, wte_lo, wte_hi);
        // wte: head part + embedding part here, the embedding's added onto the head's in the whole walk
        double maxabs = 0;
        for (size_t i = wte_lo; i < wte_hi; i++) maxabs = fmax(maxabs, fabs(ref[m][i]));
        for (size_t i = wte_lo; i < wte_hi; i++)
            if (!test_close(c.grads[m][i], ref[m][i], 1e-6 * maxabs, 1e-6))
                fail_msg("wte gradient %zu of micro-batch %d: %.9g, whole walk %.9g", i, m, c.grads[m][i], ref[m][i]);
        free(ref[m]);
    }
    for (int k = 0; k < NSTAGE; k++) gpt_free(&st[k]);
    capture_free(&c);
    device_destroy(&d);
}

// ---- activation bytes ----

// The formula written out for the whole model, one micro-batch: per block
// 16C activations, 4 fp32 layernorm statistics and B*NH*T*T fp32 attention
// probabilities; plus x0, lnf, the projection temporary (C each), logits
// (Vp: wte's stored rows, V rounded up to 128), lnf mean/rstd and losses
// (fp32), input and target ids and the inputs' token buckets, order and
// starts (int32). Flash attention keeps each row's log-sum-exp where the
// materialized one keeps its probabilities.
static size_t whole_model_bytes(const GPTConfig *c, int ab, GPTAttention attn) {
    size_t C = c->channels, Vp = (size_t)(c->vocab_size + 127) / 128 * 128;
    size_t layer = BT * (16 * C * ab + 16) + (size_t)B * c->num_heads * T * (attn == GPT_ATTENTION_FLASH ? 1 : T) * 4;
    return c->num_layers * layer + BT * ((3 * C + Vp) * ab + 12 + 8 + 8);
}

// The allocation, gpt_activation_bytes and the closed form of act_math.c
// agree, in every recompute mode, and with full recompute's inputs on the host,
// with either attention. With ZeRO-R's contiguous buffers every slot's
// activations are carved at gpt_alloc, so the buffers' sizes are the totals.
static void expect_alloc_matches(Device *d, const GPTLayout *l, GPTPlan p) {
    p.contiguous = 1;
    for (int k = 0; k < 2 * (GPT_RECOMPUTE_FULL + 2); k++) {
        int rc = k % (GPT_RECOMPUTE_FULL + 2);
        p.attention = k < GPT_RECOMPUTE_FULL + 2 ? GPT_ATTENTION_FLASH : GPT_ATTENTION_MATERIALIZED;
        p.recompute = rc > GPT_RECOMPUTE_FULL ? GPT_RECOMPUTE_FULL : (GPTRecompute)rc;
        p.offload_activations = rc > GPT_RECOMPUTE_FULL;
        GPT g;
        gpt_alloc(&g, l, d, &p, NULL);
        GPTActBytes a = gpt_activation_bytes(l, &p, d->act_bytes);
        ActFormula f = act_formula(l, &p, d->act_bytes);
        assert_int_equal(g.acts.bytes, a.total_saved);
        assert_int_equal(g.working.bytes, a.working);
        assert_int_equal(g.ckpt ? g.ckpt->store.bytes : 0, a.stored);
        assert_true(f.saved == (double)a.total_saved && f.working == (double)a.working);
        assert_true(f.offloaded == (double)a.stored);
        assert_true(f.per_layer == (double)a.per_layer);
        assert_int_equal(a.total_saved, a.per_slot * p.slots + a.shared);
        assert_int_equal(g.scratch.bytes, a.backward_scratch);
        assert_int_equal(g.unit_grads.bytes + g.embed_grads.bytes, a.grad_workspace);
        gpt_free(&g);
    }
}

static void test_activation_bytes(void **state) {
    Device d;
    device_cpu(&d);
    GPTConfig cfg;
    gpt_preset("small", &cfg);
    cfg.vocab_size = 300;
    GPTLayout l;
    gpt_layout(&l, &cfg);
    size_t C = cfg.channels, ab = (size_t)d.act_bytes;
    GPTPlan whole = gpt_plan_whole(&l, B, T);
    whole.attention = GPT_ATTENTION_MATERIALIZED;
    assert_int_equal(gpt_activation_bytes(&l, &whole, d.act_bytes).total_saved,
                     whole_model_bytes(&cfg, d.act_bytes, GPT_ATTENTION_MATERIALIZED));
    whole.attention = GPT_ATTENTION_FLASH;
    GPTActBytes w = gpt_activation_bytes(&l, &whole, d.act_bytes);
    assert_int_equal(w.total_saved, whole_model_bytes(&cfg, d.act_bytes, GPT_ATTENTION_FLASH));
    assert_int_equal(w.backward_scratch, BT * 10 * C * ab);
    // cut into stages, each stage but the first keeps its received input
    // (C per token) besides its blocks; the slots multiply what a stage keeps
    const int cuts[3][2] = {{0, 2}, {3, 3}, {4, 5}};
    size_t sum = 0;
    for (int k = 0; k < 3; k++) {
        GPTPlan p = {.B = B, .T = T, .slots = 3, .first_unit = cuts[k][0], .last_unit = cuts[k][1]};
        GPTActBytes a = gpt_activation_bytes(&l, &p, d.act_bytes);
        sum += a.per_slot;
        assert_int_equal(a.total_saved, 3 * a.per_slot + BT * C * ab);
        assert_int_equal(a.backward_scratch, BT * C * ab * 3 + BT * 9 * C * ab);
        expect_alloc_matches(&d, &l, p);
    }
    assert_int_equal(sum, w.per_slot + 2 * BT * C * ab);
    GPTPlan mid = {.B = B, .T = T, .slots = 2, .first_unit = 2, .last_unit = 3};  // two blocks, no embeddings or head: no token ids, no logits
    assert_int_equal(gpt_activation_bytes(&l, &mid, d.act_bytes).per_slot, 2 * w.per_layer + BT * C * ab);
    whole.slots = 4;
    expect_alloc_matches(&d, &l, whole);
    device_destroy(&d);
}

// ---- misuse ----

static void forward_outside_range(void) {
    Device d;
    device_cpu_in_child(&d);
    Capture c;
    capture_init(&c, "tiny", 256);
    GPT g;
    GPTPlan p = {.B = B, .T = T, .slots = 1, .first_unit = 0, .last_unit = 1};
    gpt_alloc(&g, &c.l, &d, &p, NULL);
    gpt_unit_forward(&g, 2, 0, c.params + c.l.unit[2].offset, c.params);
}

static void backwards_interleaved(void) {
    Device d;
    device_cpu_in_child(&d);
    Capture c;
    capture_init(&c, "tiny", 256);
    Batches bt;
    batches_fill(&bt, 256);
    GPT g;
    GPTPlan p = gpt_plan_whole(&c.l, B, T);
    p.slots = 2;
    gpt_alloc(&g, &c.l, &d, &p, NULL);
    for (int s = 0; s < 2; s++) {
        gpt_slot_tokens(&g, s, bt.in[s], bt.tgt[s], 1.0f);
        walk_forward(&g, c.params, s);
    }
    for (int u = c.l.num_units - 1; u >= 1; u--) walk_unit_backward(&g, c.params, c.grads[0], u, 0);
    walk_unit_backward(&g, c.params, c.grads[1], c.l.num_units - 1, 1);  // slot 1's head restarts the embeddings' gradients
    walk_unit_backward(&g, c.params, c.grads[0], GPT_UNIT_EMBED, 0);
}

// The head reads wte (its tied output projection): called without the
// embeddings' params, it stops before computing.
static void head_without_wte(void) {
    Device d;
    device_cpu_in_child(&d);
    Capture c;
    capture_init(&c, "tiny", 256);
    Batches bt;
    batches_fill(&bt, 256);
    GPT g;
    GPTPlan p = gpt_plan_whole(&c.l, B, T);
    gpt_alloc(&g, &c.l, &d, &p, NULL);
    gpt_slot_tokens(&g, 0, bt.in[0], bt.tgt[0], 0.0f);
    for (int u = 0; u < gpt_unit_head(&c.l); u++) gpt_unit_forward(&g, u, 0, c.params + c.l.unit[u].offset, NULL);
    gpt_unit_forward(&g, gpt_unit_head(&c.l), 0, c.params + c.l.unit[gpt_unit_head(&c.l)].offset, NULL);
}

// A last pipeline stage that never takes the head's part of the tied wte
// gradient would lose it: the next head backward stops instead.
static void tied_wte_grads_not_taken(void) {
    Device d;
    device_cpu_in_child(&d);
    Capture c;
    capture_init(&c, "tiny", 256);
    Batches bt;
    batches_fill(&bt, 256);
    GPT g;
    int hu = gpt_unit_head(&c.l);
    GPTPlan p = {.B = B, .T = T, .slots = 2, .first_unit = hu, .last_unit = hu};
    gpt_alloc(&g, &c.l, &d, &p, NULL);
    const bf16 *ph = c.params + c.l.unit[hu].offset;
    size_t act_bytes = (size_t)BT * c.l.cfg.channels * d.act_bytes;
    for (int s = 0; s < 2; s++) {
        memset(gpt_slot_input(&g, s), 0, act_bytes);
        gpt_slot_tokens(&g, s, NULL, bt.tgt[s], 1.0f);
        gpt_unit_forward(&g, hu, s, ph, c.params);
    }
    gpt_unit_backward(&g, hu, 0, ph, c.params);
    gpt_unit_backward(&g, hu, 1, ph, c.params);
}

// The model's own check stops the child: exit 1, naming `file` (the unit's
// checks are gpt.c's, the two ends' gpt_ends.c's) and `message`.
static void expect_failure(ChildFn fn, const char *file, const char *message) {
    char *err = NULL;
    int status = run_child(fn, &err);
    if (status != 1 || !strstr(err, message) || !strstr(err, file))
        fail_msg("expected exit 1 naming %s and \"%s\"; got %d:\n%s", file, message, status, err);
    free(err);
}

static void test_misuse_fails(void **state) {
    expect_failure(forward_outside_range, "/gpt.c:", "forward of unit 2: this rank computes units 0..1");
    expect_failure(backwards_interleaved, "/gpt_ends.c:", "finish one slot's backward before the next slot's head");
    expect_failure(head_without_wte, "/gpt.c:", "the head reads the embeddings' too");
    expect_failure(tied_wte_grads_not_taken, "/gpt_ends.c:", "slot 0's tied wte gradient was not taken");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_slots_in_flight),
        cmocka_unit_test(test_all_forwards_then_all_backwards),
        cmocka_unit_test(test_one_forward_one_backward),
        cmocka_unit_test(test_recompute_matches_none),
        cmocka_unit_test(test_forwards_interleaved_by_unit),
        cmocka_unit_test(test_pipeline_stages_match_whole),
        cmocka_unit_test(test_activation_bytes),
        cmocka_unit_test(test_misuse_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
