// test_zero_bubble.c: 07's --schedule zb-h1 (issue 48): the backward split
// into B and W (gpt.h's GPTPlan.w_slots) leaves the math unchanged, so every
// run gives 1F1B's losses, gradient norms and validation loss to the bit
// (at P 2 and 4, m 4, and 8 at P 4, with tp 2, with sequence parallelism,
// with --recompute full, over 2 replicas, with contiguous buffers), and at
// P 2, m 4 and at P 4, m 8 the weights after the first step (its gradients
// through one AdamW update) byte for byte. Each stage's staircase is held to its formulas: 1F1B's
// micro-batches in flight min(P - s, m), micro-batches waiting for their W
// min(s + 1, m), the activations' peak (the W stashes with them) to the
// byte, and every phase boundary to the formula's timeline. The
// refusals of what zb-h1 cannot run. Run from the repository root.
#include "runs.h"

#define CMD_LEN 2048
#define STEPS 4

static const char *const PATHS[] = {"./3d_parallel", NULL};

static int setup(void **state) { return run_dir_setup(state, "test_zero_bubble", PATHS); }
static int teardown(void **state) { return run_dir_teardown(state); }

typedef struct Case {
    int ranks, P, m;
    const char *flags;
} Case;

// One run of a case under `schedule`; its record (malloc'd), and (weights
// given) the weights it exported after its first step there.
static char *run_case(const RunDir *c, int k, const Case *x, const char *schedule, char *weights, size_t n) {
    char cmd[CMD_LEN], json[256];
    snprintf(json, sizeof json, "%s/%d-%s.json", c->root, k, schedule);
    if (weights) snprintf(weights, n, "%s/%d-%s.bin", c->root, k, schedule);
    snprintf(cmd, sizeof cmd, "mpirun -np %d ./3d_parallel --model tiny --layers 4 --batch 2 --pp %d --grad-accum %d "
             "--schedule %s %s", x->ranks, x->P, x->m, schedule, x->flags);
    return train_and_export_step_1(cmd, STEPS, json, weights);
}

// Every stage of a zb-h1 record on its formulas: in flight, W waiting,
// activations, and the memory timeline on every rank.
static void check_staircase(const char *rec, const Case *x, const char *what) {
    for (int r = 0; r < x->ranks; r++) {
        const char *y = grid_rank_of(rec, r);
        int s = (int)number_of(y, "stage");
        double flight = x->P - s < x->m ? x->P - s : x->m, wait = s + 1 < x->m ? s + 1 : x->m;
        if (number_of(y, "peak_in_flight") != flight || number_of(y, "in_flight_formula") != flight ||
            number_of(y, "w_pending") != wait || number_of(y, "w_pending_formula") != wait ||
            number_of(y, "activations") != number_of(y, "activations_formula"))
            fail_msg("%s rank %d stage %d: in flight %.0f (formula %.0f, want %.0f), waiting for W %.0f (formula "
                     "%.0f, want %.0f), activations %.0f B (formula %.0f B)", what, r, s,
                     number_of(y, "peak_in_flight"), number_of(y, "in_flight_formula"), flight,
                     number_of(y, "w_pending"), number_of(y, "w_pending_formula"), wait, number_of(y, "activations"),
                     number_of(y, "activations_formula"));
    }
    if (!strstr(rec, "\"equal_on_every_rank\":true"))
        fail_msg("%s: the memory timeline differs from the formula's:\n%s", what, strstr(rec, "\"memory_timeline\""));
}

static void test_same_bits_as_1f1b(void **state) {
    RunDir *c = *state;
    const Case cases[] = {
        {2, 2, 4, ""},
        {4, 4, 4, ""},  // (P 4, m 8: test_staircase_p4_m8)
        {4, 2, 4, "--tp 2"},
        {4, 2, 4, "--tp 2 --sequence-parallel"},
        {2, 2, 4, "--recompute full"},
        {4, 2, 2, ""},  // dp 2
        {2, 2, 4, "--contiguous-buffers"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const Case *x = &cases[k];
        char w1[256], wz[256], what[128];
        snprintf(what, sizeof what, "%d ranks, --pp %d, m %d %s", x->ranks, x->P, x->m, x->flags);
        // step 1's weights: the first case's and the staircase's (the others' losses read them from step 2 on)
        int exported = k == 0;
        char *one = run_case(c, (int)k, x, "1f1b", exported ? w1 : NULL, sizeof w1),
             *zb = run_case(c, (int)k, x, "zb-h1", exported ? wz : NULL, sizeof wz);
        expect_records_same_bits(one, zb, STEPS, what);
        if (exported && !files_equal(w1, wz))
            fail_msg("%s: the weights after step 1 differ between 1f1b and zb-h1", what);
        check_staircase(zb, x, what);
        print_message("%s: losses, norms, val loss%s 1f1b's to the bit; staircase and timeline on their formulas\n",
                      what, exported ? " and step 1's weights" : "");
        free(one);
        free(zb);
    }
}

// Under 1F1B at P 4, m 8 the stages hold 4, 3, 2, 1 micro-batches; zb-h1
// holds the same up to B and 1, 2, 3, 4 waiting for their W: stage 3's
// activations peak higher than 1F1B's, stage 0's by one W stash alone.
static void test_staircase_p4_m8(void **state) {
    RunDir *c = *state;
    const Case x = {4, 4, 8, ""};
    char w1[256], wz[256];
    char *one = run_case(c, 100, &x, "1f1b", w1, sizeof w1), *zb = run_case(c, 100, &x, "zb-h1", wz, sizeof wz);
    expect_records_same_bits(one, zb, STEPS, "--pp 4 m 8");
    if (!files_equal(w1, wz)) fail_msg("--pp 4 m 8: the weights after step 1 differ between 1f1b and zb-h1");
    check_staircase(zb, &x, "--pp 4 m 8");
    double stash = 16.0 * 32 + 2 * 32 * 32 * (4 + 12) * 4.0;  // act_w_stash: 16h + sbh(4 + 12/t)e, tiny at B 2
    double d0 = number_of(grid_rank_of(zb, 0), "activations") - number_of(grid_rank_of(one, 0), "activations");
    if (d0 != stash) fail_msg("stage 0: zb-h1's activations %.0f B above 1f1b's, one W stash is %.0f B", d0, stash);
    for (int s = 0; s < 4; s++)
        print_message("stage %d: 1f1b activations %.0f B, zb-h1 %.0f B (in flight %d, waiting for W %d)\n", s,
                      number_of(grid_rank_of(one, s), "activations"), number_of(grid_rank_of(zb, s), "activations"),
                      4 - s, s + 1);
    free(one);
    free(zb);
}

static void test_refusals(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"mpirun -np 1 ./3d_parallel --model tiny --schedule zb-h1 --steps 1", "it needs --pp 2 or more"},
        {"mpirun -np 2 ./3d_parallel --model tiny --pp 2 --schedule zb-h1 --tiled-mlp 2 --steps 1",
         "W reads each block's whole GELU output"},
        {"mpirun -np 2 ./3d_parallel --model tiny --pp 2 --schedule zb --steps 1", "--schedule zb: choose"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) free(expect_refusal(cases[i][0], cases[i][1]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_as_1f1b),
        cmocka_unit_test(test_staircase_p4_m8),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
