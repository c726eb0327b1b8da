// mpirun: 2
// test_tp.c: the model under tensor parallelism of 2 ranks (Megatron-LM's
// split, the f/g all-reduces, vocabulary-parallel embedding and
// cross-entropy) against the whole model on one rank, on the cpu device:
//   - the loss and every parameter's gradient (the parts gathered to whole
//     shape) agree within the tolerances below;
//   - the replicated tensors' gradients and the loss are the same bits on
//     both ranks (so replicated parameters stay identical under an update);
//   - wte's padding rows get no gradient;
//   - the activation bytes of a rank follow its part of the heads and vocabulary;
//   - two micro-batches in flight in slots give the bits of one at a time;
//   - the gradients agree with finite differences of the tp model's loss.
// Tolerances: both models start from the same bf16 weights (GPT-2's initial
// scale) and keep fp32 activations; tp changes only the order of fp32 sums
// (a linear's K split into partial sums added by the all-reduce, the
// softmax's sum of exponentials split by vocabulary part), each moving by a
// few roundings of 2^-24 relative to its largest terms. Measured over tiny
// and small, vocabularies 256 and 250, three token draws: the loss within
// 2e-7 (half an ulp of a loss near 5.5), every gradient within 1.5e-6 of its
// tensor's largest |gradient|. The tests allow 2e-6 on the loss (4 ulps) and
// 2e-5 of the tensor's largest on the gradients; a wrong split or a missing
// all-reduce, or a bias or the positions added on both ranks, is off by
// 1e-3 or more on the loss or by percents of a tensor's largest gradient.
// (Weights scaled up 4x sharpen the softmax and amplify the reordering to
// 4e-5 on small; the finite-difference check uses them, as test_model_grad.)
#include "tp_model.h"

enum { B = 2, T = 8, BT = B * T };

typedef TPFixture Fixture;

static GPTConfig config(const char *preset, int vocab) {
    GPTConfig c;
    assert_true(gpt_preset(preset, &c));
    c.vocab_size = vocab;
    return c;
}

static void check_against_whole(Fixture *f, const GPTConfig *cfg) {
    assert_true(tpm_matches_whole(&f->dev, &f->world, cfg, B, T));
}

static void test_tiny_matches_whole(void **state) {
    GPTConfig cfg = config("tiny", 256);
    check_against_whole(*state, &cfg);
}

// 250 tokens: padded to 256, rank 1 holds 122 of them and 6 padding rows
static void test_small_padded_vocab_matches_whole(void **state) {
    GPTConfig cfg = config("small", 250);
    check_against_whole(*state, &cfg);
}

// Per token a block keeps its heads' part of qkv (3C/2), atty (C/2), fch and
// fch_gelu (2C each) beside ln1, x2, ln2, x3 (C each) and 4 fp32 statistics,
// and what its heads' attention keeps (each row's log-sum-exp with flash, the
// probabilities materialized); the head its vocabulary part of
// the logits (128 of 256) and 3 fp32 cross-entropy statistics. Written out,
// against the accounting and the allocation.
static void test_activation_bytes(void **state) {
    Fixture *f = *state;
    GPTConfig cfg = config("small", 250);  // C 128, 4 heads, 4 layers
    GPTLayout l;
    gpt_layout_tp(&l, &cfg, 2, f->world.rank);
    size_t C = 128, ab = (size_t)f->dev.act_bytes;
    for (int attn = GPT_ATTENTION_FLASH; attn <= GPT_ATTENTION_MATERIALIZED; attn++) {
        size_t core = (size_t)B * 2 * T * (attn == GPT_ATTENTION_FLASH ? 1 : T) * 4;
        size_t layer = BT * ((4 * C + 2 * C + 4 * C) * ab + 16) + core;
        size_t want = 4 * layer + BT * ((3 * C + 128) * ab + 12 + 8 + 8) + BT * 12;  // + 8: the token buckets
        GPTPlan p = gpt_plan_whole(&l, B, T);
        p.attention = (GPTAttention)attn;
        p.contiguous = 1;  // every buffer carved at gpt_alloc, as the totals count them
        GPTActBytes a = gpt_activation_bytes(&l, &p, f->dev.act_bytes);
        assert_int_equal(a.per_layer, layer);
        assert_int_equal(a.total_saved, want);
        assert_int_equal(a.backward_scratch, BT * (2 * C + 2 * 2 * C) * ab);  // dres, dc; d4a, d4b of 4C/2
        GPT g;
        gpt_alloc(&g, &l, &f->dev, &p, &f->world);
        assert_int_equal(g.acts.bytes, a.total_saved);
        assert_int_equal(g.scratch.bytes, a.backward_scratch);
        assert_int_equal(g.unit_grads.bytes + g.embed_grads.bytes, a.grad_workspace);
        gpt_free(&g);
    }
}

// F0 F1 B0 B1 in two slots against two single-slot steps, both at tp 2: the bits
static void test_two_slots_in_flight(void **state) {
    Fixture *f = *state;
    Comm *c = &f->world;
    GPTConfig cfg = config("tiny", 200);
    TPModel m;
    tpm_init(&m, &cfg, c->size, c->rank, 4.0f);
    int32_t in[2][BT], tgt[2][BT];
    tpm_tokens(in[0], tgt[0], BT, 200, 5);
    tpm_tokens(in[1], tgt[1], BT, 200, 6);
    double want[2];
    float *ref = calloc(m.l.num_params, sizeof(float));
    for (int mb = 0; mb < 2; mb++) {
        want[mb] = tpm_step(&f->dev, &m, c, B, T, in[mb], tgt[mb]);
        for (size_t i = 0; i < m.l.num_params; i++) ref[i] += m.grads[i];
    }
    GPT g;
    GPTPlan p = gpt_plan_whole(&m.l, B, T);
    p.slots = 2;
    gpt_alloc(&g, &m.l, &f->dev, &p, c);
    memset(m.grads, 0, m.l.num_params * sizeof(float));
    double got[2];
    for (int s = 0; s < 2; s++) {
        gpt_slot_tokens(&g, s, in[s], tgt[s], 1.0f / BT);
        walk_forward(&g, m.params, s);
        got[s] = gpt_slot_loss(&g, s);
    }
    for (int s = 0; s < 2; s++) walk_backward(&g, m.params, m.grads, s);
    gpt_free(&g);
    int ok = memcmp(got, want, sizeof got) == 0 && memcmp(m.grads, ref, m.l.num_params * sizeof(float)) == 0;
    assert_true(tpm_all(c, ok));
    free(ref);
    tpm_free(&m);
}

// Sets whole-model parameter `g` to v on every rank that holds it.
static void set_param(TPModel *m, size_t g, bf16 v) {
    for (size_t i = 0; i < m->l.num_params; i++)
        if (gpt_global_index(&m->l, i) == g) m->params[i] = v;
}

static bf16 get_param(TPModel *m, Comm *c, size_t g) {
    float v = -INFINITY;  // from the rank that holds it
    for (size_t i = 0; i < m->l.num_params; i++)
        if (gpt_global_index(&m->l, i) == g) v = bf16_to_f32(m->params[i]);
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_FLOAT, MPI_MAX, c->mpi);
    return f32_to_bf16(v);
}

// As test_model_grad.c, at tp 2: for each unit the 4 entries with the largest
// gathered gradients against central differences of the tp loss, the step
// between bf16 values; |fd - analytic| <= 2e-4 + 5% |analytic|.
static void test_gradients_match_finite_differences(void **state) {
    Fixture *f = *state;
    Comm *c = &f->world;
    GPTConfig cfg = config("tiny", 250);
    GPTLayout whole;
    gpt_layout(&whole, &cfg);
    TPModel m;
    tpm_init(&m, &cfg, c->size, c->rank, 4.0f);
    int32_t in[BT], tgt[BT];
    tpm_tokens(in, tgt, BT, 250, 9);
    tpm_step(&f->dev, &m, c, B, T, in, tgt);
    float *full = tpm_gather(&m, c, whole.num_params);
    int bad = 0;
    for (int u = 0; u < whole.num_units; u++) {
        Range r = whole.unit[u];
        size_t pick[4] = {0};
        for (int k = 0; k < 4; k++) {
            double best = -1;
            for (size_t i = r.offset; i < r.offset + r.count; i++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= pick[j] == i;
                if (!taken && fabs(full[i]) > best) best = fabs(full[i]), pick[k] = i;
            }
        }
        for (int k = 0; k < 4; k++) {
            bf16 keep = get_param(&m, c, pick[k]);
            float p = bf16_to_f32(keep), step = fmaxf(0.005f, fabsf(p) * 0.02f);
            bf16 hi = f32_to_bf16(p + step), lo = f32_to_bf16(p - step);
            set_param(&m, pick[k], hi);
            double lhi = tpm_loss(&f->dev, &m, c, B, T, in, tgt);
            set_param(&m, pick[k], lo);
            double llo = tpm_loss(&f->dev, &m, c, B, T, in, tgt);
            set_param(&m, pick[k], keep);
            double fd = (lhi - llo) / ((double)bf16_to_f32(hi) - bf16_to_f32(lo)), an = full[pick[k]];
            if (!test_close(fd, an, 2e-4, 0.05)) {
                bad++;
                print_message("unit %d param %zu: analytic %.6g finite-difference %.6g\n", u, pick[k] - r.offset, an, fd);
            }
        }
    }
    assert_true(tpm_all(c, bad == 0));
    free(full);
    tpm_free(&m);
}

int main(int argc, char **argv) {
    Fixture f;
    tpm_setup(&f, &argc, &argv, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_tiny_matches_whole, &f),
        cmocka_unit_test_prestate(test_small_padded_vocab_matches_whole, &f),
        cmocka_unit_test_prestate(test_activation_bytes, &f),
        cmocka_unit_test_prestate(test_two_slots_in_flight, &f),
        cmocka_unit_test_prestate(test_gradients_match_finite_differences, &f),
    };
    int failed = run_mpi_tests(tests);
    tpm_teardown(&f);
    return failed ? 1 : 0;
}
