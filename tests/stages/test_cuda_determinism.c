// test_cuda_determinism.c: the cuda device gives the same bits on every run,
// and in every stage with the same math, as the cpu device does (issue 34:
// no float atomics in a kernel whose result is trained on). GPT-2 124M cut
// to 2 layers, so the embedding's backward sums wte's rows of a 50257-token
// vocabulary and the per-parameter kernels run over 54M parameters:
//   - the same command twice gives the same losses, gradient norms and
//     validation loss to the bit: on the emulator under EMU_SEED 1 and 7,
//     which draw other orders of blocks, of a block's threads (and so of
//     atomics) and of streams; on a GPU in whatever order it runs them;
//   - dp_baseline, zero1, zero2 and zero3 agree to the bit at 1 and at 2
//     ranks, each run under a seed of its own.
// The kernel-level check that fails on a scatter by atomics is
// test_cuda_kernels' test_encoder_backward: at this size the emulator's
// orders change fp32 sums in the last bit, which bf16 gradients round away.
// Where no cuda device can run every test is skipped.
#include "device.h"
#include "runs.h"

// One step: its loss reads the forward's bits, its gradient norm the
// backward's, and the validation loss after it the update's (a second step
// took 3 s more of every one of the 9 emulated runs and read nothing else).
#define STEPS 1
#define SHAPE "--model gpt2-124m --layers 2 --batch 1 --seq-len 32 --eval-batches 1"

typedef struct Record {
    double losses[STEPS], norms[STEPS], val_loss;
} Record;

static int setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", "./zero1", "./zero2", "./zero3", NULL};
    return run_dir_setup(state, "cuda_determinism", needs);
}

static int skip_without_cuda(void) {
    if (device_cuda_available()) return 0;
    print_message("no cuda device (no GPU visible, and this is not the emulator's build): skipped\n");
    return 1;
}

// `stage` at `ranks` ranks on cuda, the emulator's orders drawn from `seed`
static Record run_stage(const RunDir *c, const char *stage, int ranks, int seed) {
    char json[128], cmd[512];
    snprintf(json, sizeof json, "%s/%s-%d-%d.json", c->root, stage, ranks, seed);
    snprintf(cmd, sizeof cmd, "EMU_SEED=%d mpirun -np %d ./%s --device cuda " SHAPE " --steps %d --quiet --json %s",
             seed, ranks, stage, STEPS, json);
    char *rec = train(cmd, json);
    Record r;
    losses_of(rec, r.losses, STEPS);
    if (json_numbers(rec, "grad_norms", r.norms, STEPS) != STEPS) fail_msg("%s: no %d grad_norms in:\n%s", cmd, STEPS, rec);
    r.val_loss = number_of(rec, "val_loss");
    free(rec);
    return r;
}

// exact: the records print every number with %.9g, which tells floats apart
static void expect_same_bits(const char *what, const Record *got, const Record *want) {
    for (int i = 0; i < STEPS; i++) {
        if (got->losses[i] != want->losses[i])
            fail_msg("%s, step %d: loss %.9g against %.9g", what, i + 1, got->losses[i], want->losses[i]);
        if (got->norms[i] != want->norms[i])
            fail_msg("%s, step %d: gradient norm %.9g against %.9g", what, i + 1, got->norms[i], want->norms[i]);
    }
    if (got->val_loss != want->val_loss)
        fail_msg("%s: validation loss %.9g against %.9g", what, got->val_loss, want->val_loss);
    print_message("%s: the same %d losses, gradient norms and validation loss\n", what, STEPS);
}

// dp_baseline at 1 rank under EMU_SEED 1: the first test's first run, which
// the second takes as its 1-rank reference too (a run of its own seed)
static Record base_one_rank;
static int have_base_one_rank;

static void test_a_second_run_gives_the_same_bits(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    Record first = run_stage(c, "dp_baseline", 1, 1), second = run_stage(c, "dp_baseline", 1, 7);
    base_one_rank = first, have_base_one_rank = 1;
    expect_same_bits("dp_baseline, EMU_SEED 7 against 1", &second, &first);
}

static void test_stages_agree_to_the_bit(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    const char *stages[] = {"zero1", "zero2", "zero3"};
    for (int ranks = 1; ranks <= 2; ranks++) {
        Record base = ranks == 1 && have_base_one_rank ? base_one_rank : run_stage(c, "dp_baseline", ranks, 11);
        for (int s = 0; s < 3; s++) {
            char what[64];
            snprintf(what, sizeof what, "%s against dp_baseline, %d rank%s", stages[s], ranks, ranks > 1 ? "s" : "");
            Record r = run_stage(c, stages[s], ranks, 12 + s);
            expect_same_bits(what, &r, &base);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_second_run_gives_the_same_bits),
        cmocka_unit_test(test_stages_agree_to_the_bit),
    };
    return cmocka_run_group_tests(tests, setup, run_dir_teardown);
}
