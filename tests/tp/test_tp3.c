// mpirun: 3
// test_tp3.c: tensor parallelism over 3 ranks, where the vocabulary padding
// takes a whole part: 256 tokens padded to 384, so rank 2 holds only padding
// rows of wte, looks up no token and has no real column in the softmax. The
// model has 3 heads of 16 channels (tiny's shape otherwise). Against the
// whole model as in test_tp.c (same tolerances and reasons), and with 300
// tokens (rank 2 holds 44 real rows and 84 padding rows).
#include "tp_model.h"

enum { B = 2, T = 8 };

static GPTConfig three_heads(int vocab) {
    GPTConfig c;
    assert_true(gpt_preset("tiny", &c));
    c.num_heads = 3;
    c.channels = 48;
    c.vocab_size = vocab;
    return c;
}

static void test_padding_only_part(void **state) {
    TPFixture *f = *state;
    GPTConfig cfg = three_heads(256);
    GPTLayout l;
    gpt_layout_tp(&l, &cfg, 3, f->world.rank);
    assert_int_equal(l.vocab_padded, 384);
    assert_true(tpm_matches_whole(&f->dev, &f->world, &cfg, B, T));
}

static void test_part_with_padding(void **state) {
    TPFixture *f = *state;
    GPTConfig cfg = three_heads(300);
    assert_true(tpm_matches_whole(&f->dev, &f->world, &cfg, B, T));
}

int main(int argc, char **argv) {
    TPFixture f;
    tpm_setup(&f, &argc, &argv, 3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_padding_only_part, &f),
        cmocka_unit_test_prestate(test_part_with_padding, &f),
    };
    int failed = run_mpi_tests(tests);
    tpm_teardown(&f);
    return failed ? 1 : 0;
}
