// test_interleaved.c: 07's --schedule interleaved --virtual-stages V (issue
// 48): each stage holds V chunks of L/(P·V) blocks, chunk j of stage s the
// (j·P + s)-th, and runs Megatron's table. Every micro-batch passes the same
// blocks in the same order and each chunk's backwards come in micro-batch
// order, so every run gives 1F1B's losses, gradient norms and validation
// loss to the bit (P 2 and 4, m 4, and 8 at P 4, V 2 and 4, with tp 2, with
// sequence parallelism, with --recompute full, over 2 replicas, with
// contiguous buffers), and at P 2, m 4 and at P 4, m 8 the weights after
// the first step byte for byte. Each stage's
// chunk micro-batches in flight are min(2(P - s - 1) + (V - 1)P + 1, m·V),
// its activations the formula's, every phase boundary the formula's
// timeline's, and its pipeline bytes V times a stage's (less the ends). A
// checkpoint of an interleaved run resumes under 1F1B to the bit. The
// refusals. Run from the repository root.
#include "runs.h"

#define CMD_LEN 2048
#define STEPS 4

static const char *const PATHS[] = {"./3d_parallel", NULL};

static int setup(void **state) { return run_dir_setup(state, "test_interleaved", PATHS); }
static int teardown(void **state) { return run_dir_teardown(state); }

typedef struct Case {
    int ranks, P, m, v, layers;
    const char *flags;
} Case;

static const char *what_of(const Case *x, char *out, size_t n) {
    snprintf(out, n, "%d ranks, %d layers, --pp %d, m %d, v %d %s", x->ranks, x->layers, x->P, x->m, x->v, x->flags);
    return out;
}

// One run of a case, interleaved (v > 1) or 1F1B (v = 1): its record
// (malloc'd), and the weights it exported after its first step.
static char *run_case(const RunDir *c, int k, const Case *x, int v, char *weights, size_t n) {
    char cmd[CMD_LEN], json[256], sched[64];
    snprintf(sched, sizeof sched, v > 1 ? "interleaved --virtual-stages %d" : "1f1b", v);
    snprintf(json, sizeof json, "%s/%d-%d.json", c->root, k, v);
    if (weights) snprintf(weights, n, "%s/%d-%d.bin", c->root, k, v);
    snprintf(cmd, sizeof cmd, "mpirun -np %d ./3d_parallel --model tiny --layers %d --batch 2 --pp %d --grad-accum %d "
             "--schedule %s %s", x->ranks, x->layers, x->P, x->m, sched, x->flags);
    return train_and_export_step_1(cmd, STEPS, json, weights);
}

// Every stage of an interleaved record on its formulas.
static void check_stages(const char *rec, const Case *x, const char *what) {
    for (int r = 0; r < x->ranks; r++) {
        const char *y = grid_rank_of(rec, r);
        int s = (int)number_of(y, "stage");
        double flight = 2 * (x->P - s - 1) + (x->v - 1) * x->P + 1;
        if (flight > x->m * x->v) flight = x->m * x->v;
        if (number_of(y, "peak_in_flight") != flight || number_of(y, "in_flight_formula") != flight ||
            number_of(y, "activations") != number_of(y, "activations_formula") ||
            number_of(y, "device_peak") != number_of(y, "device_peak_formula"))
            fail_msg("%s rank %d stage %d: chunk micro-batches in flight %.0f (formula %.0f, want %.0f), activations "
                     "%.0f B (formula %.0f B), device peak %.0f B (formula %.0f B)", what, r, s,
                     number_of(y, "peak_in_flight"), number_of(y, "in_flight_formula"), flight,
                     number_of(y, "activations"), number_of(y, "activations_formula"), number_of(y, "device_peak"),
                     number_of(y, "device_peak_formula"));
        double pp[2] = {0, 0};
        if (json_numbers(y, "pp", pp, 2) != 2 || fabs(pp[0] - pp[1]) > 1e-3)
            fail_msg("%s rank %d: pp bytes %.3f counted, formula %.3f", what, r, pp[0], pp[1]);
    }
    if (!strstr(rec, "\"equal_on_every_rank\":true"))
        fail_msg("%s: the memory timeline differs from the formula's:\n%s", what, strstr(rec, "\"memory_timeline\""));
    if (!strstr(rec, "\"schedule\":\"interleaved\"")) fail_msg("%s: the record names another schedule", what);
}

static void test_same_bits_as_1f1b(void **state) {
    RunDir *c = *state;
    const Case cases[] = {
        {2, 2, 4, 2, 4, ""},
        {4, 4, 4, 2, 8, ""},  // (P 4, m 8: test_staircase_p4_m8)
        {2, 2, 4, 4, 8, ""},
        {4, 2, 4, 2, 4, "--tp 2"},
        {4, 2, 4, 2, 4, "--tp 2 --sequence-parallel"},
        {2, 2, 4, 2, 4, "--recompute full"},
        {4, 2, 2, 2, 4, ""},  // dp 2
        {2, 2, 4, 2, 4, "--contiguous-buffers"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const Case *x = &cases[k];
        char w1[256], wi[256], what[160];
        what_of(x, what, sizeof what);
        // step 1's weights: the first case's and the staircase's (the others' losses read them from step 2 on)
        int exported = k == 0;
        char *one = run_case(c, (int)k, x, 1, exported ? w1 : NULL, sizeof w1),
             *il = run_case(c, (int)k, x, x->v, exported ? wi : NULL, sizeof wi);
        expect_records_same_bits(one, il, STEPS, what);
        if (exported && !files_equal(w1, wi))
            fail_msg("%s: the weights after step 1 differ between 1f1b and interleaved", what);
        check_stages(il, x, what);
        print_message("%s: losses, norms, val loss%s 1f1b's to the bit; in flight, activations, device peak, "
                      "pipeline bytes and timeline on their formulas\n", what, exported ? " and step 1's weights" : "");
        free(one);
        free(il);
    }
}

// Stage 0 keeps 1 + (P-1)/(P·v) times 1F1B's chunk micro-batches: the
// staircase at P 4, m 8, v 2 (11, 9, 7, 5 chunk micro-batches).
static void test_staircase_p4_m8(void **state) {
    RunDir *c = *state;
    const Case x = {4, 4, 8, 2, 8, ""};
    char w1[256], wi[256];
    char *one = run_case(c, 100, &x, 1, w1, sizeof w1), *il = run_case(c, 100, &x, 2, wi, sizeof wi);
    expect_records_same_bits(one, il, STEPS, "--pp 4 m 8 v 2");
    if (!files_equal(w1, wi))
        fail_msg("--pp 4 m 8 v 2: the weights after step 1 differ between 1f1b and interleaved");
    check_stages(il, &x, "--pp 4 m 8 v 2");
    for (int s = 0; s < 4; s++)
        print_message("stage %d: 1f1b %.0f micro-batches, activations %.0f B; interleaved %.0f chunk micro-batches, "
                      "%.0f B\n", s, number_of(grid_rank_of(one, s), "peak_in_flight"),
                      number_of(grid_rank_of(one, s), "activations"), number_of(grid_rank_of(il, s), "peak_in_flight"),
                      number_of(grid_rank_of(il, s), "activations"));
    double a0 = number_of(grid_rank_of(one, 0), "activations"), b0 = number_of(grid_rank_of(il, 0), "activations");
    if (!(b0 > a0)) fail_msg("stage 0: interleaved keeps %.0f B, 1f1b %.0f B: more expected", b0, a0);
    free(one);
    free(il);
}

// An interleaved run's checkpoint resumes under 1F1B (its parts resharded
// through the grid's name, "vp 2") to the bit of an uninterrupted run.
static void test_resume_under_1f1b(void **state) {
    RunDir *c = *state;
    char cmd[CMD_LEN], dir[256], json[256];
    snprintf(dir, sizeof dir, "%s/ckpt", c->root);
    const char *F = "mpirun -np 2 ./3d_parallel --model tiny --layers 4 --batch 2 --pp 2 --grad-accum 4 --quiet";
    snprintf(json, sizeof json, "%s/whole.json", c->root);
    snprintf(cmd, sizeof cmd, "%s --steps %d --json %s", F, STEPS, json);
    char *whole = train(cmd, json);
    snprintf(json, sizeof json, "%s/saved.json", c->root);
    snprintf(cmd, sizeof cmd, "%s --schedule interleaved --virtual-stages 2 --steps %d --save %s --save-every 2 "
             "--json %s", F, STEPS, dir, json);
    free(train(cmd, json));
    snprintf(json, sizeof json, "%s/resumed.json", c->root);
    snprintf(cmd, sizeof cmd, "%s --steps %d --resume %s/step-00000002 --json %s", F, STEPS, dir, json);
    char *resumed = train(cmd, json);
    double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0};
    losses_of(whole, a, STEPS);
    losses_of(resumed, b, STEPS - 2);
    for (int i = 0; i < STEPS - 2; i++)
        if (a[2 + i] != b[i]) fail_msg("step %d: resumed %.9g, uninterrupted %.9g", 3 + i, b[i], a[2 + i]);
    free(whole);
    free(resumed);
}

static void test_refusals(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"mpirun -np 2 ./3d_parallel --model tiny --layers 4 --pp 2 --grad-accum 4 --schedule interleaved "
         "--virtual-stages 3 --steps 1", "--virtual-stages 3 with --pp 2 cuts the 4 layers into 6 chunks"},
        {"mpirun -np 2 ./3d_parallel --model tiny --layers 4 --pp 2 --grad-accum 3 --schedule interleaved "
         "--virtual-stages 2 --steps 1", "3 micro-batches are not a multiple of it"},
        {"mpirun -np 4 ./3d_parallel --model tiny --layers 4 --tp 2 --pp 2 --grad-accum 4 --schedule interleaved "
         "--virtual-stages 2 --recompute full --partition-activations --steps 1", "--partition-activations"},
        {"mpirun -np 2 ./3d_parallel --model tiny --layers 4 --pp 2 --schedule interleaved --steps 1",
         "give --virtual-stages 2 or more"},
        {"mpirun -np 1 ./3d_parallel --model tiny --layers 4 --grad-accum 2 --schedule interleaved --virtual-stages 2 "
         "--steps 1", "it needs --pp 2 or more"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) free(expect_refusal(cases[i][0], cases[i][1]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_as_1f1b),
        cmocka_unit_test(test_staircase_p4_m8),
        cmocka_unit_test(test_resume_under_1f1b),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
