// test_fp16_scaling_runs.c: fp16 runs whose loss scale trains nothing say
// so, contradictory loss-scaling settings are refused before step 1, and
// the report names fp16 where it names the format (issue 39, items 9, 11
// and 15). Run from the repository root after make.
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048

// zero2 on the tiny model, 4 steps in fp16 with `flags`: its output (*out)
// and its --json record (both malloc'd).
static char *run_fp16(const RunDir *c, const char *name, const char *flags, char **out) {
    char json[PATH_LEN], cmd[CMD_LEN];
    snprintf(json, sizeof json, "%s/%s.json", c->root, name);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero2 --model tiny --steps 4 --precision fp16 %s --json %s", flags,
             json);
    return train_output(cmd, json, out);
}

static void expect_in(const char *text, const char *want, const char *what) {
    if (!strstr(text, want)) fail_msg("%s: no \"%s\" in:\n%s", what, want, text);
}

// Item 9: a scale that overflows at every step skipped all 4 steps, and the
// summary showed a loss, tokens/s and a comm figure under the formula with
// no word of it; a scale of 1e-30 flushed every gradient to 0 and the run
// looked normal. The summary, its one-line form and the record say it.
static void test_every_step_skipped_is_said(void **state) {
    const RunDir *c = *state;
    const char *overflowing[][2] = {{"--loss-scale 1e30", "lower --loss-scale"},
                                    {"--initial-scale-power 64", "lower --initial-scale-power"}};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, name[32];
        snprintf(name, sizeof name, "overflow-%d", i);
        char *rec = run_fp16(c, name, overflowing[i][0], &out);
        expect_in(out, "4 of 4 steps skipped: the gradients overflowed at every step, so this run applied no update",
                  overflowing[i][0]);
        expect_in(out, overflowing[i][1], overflowing[i][0]);
        const char *summary = strstr(out, "\nsummary ");
        if (!summary) fail_msg("%s: no summary line:\n%s", overflowing[i][0], out);
        expect_in(summary, "| fp16: 4 of 4 steps skipped (overflow)", overflowing[i][0]);
        // the gathers the formula counts are missing from a skipped step, and the summary says why
        expect_in(out, "with no update applied, the bytes moved lack the updated parameters", overflowing[i][0]);
        assert_int_equal((int)number_of(rec, "applied_steps"), 0);
        double skipped[RUN_MAX_STEPS];
        assert_int_equal(json_numbers(rec, "skipped_steps", skipped, RUN_MAX_STEPS), 4);
        free(rec), free(out);
    }
    char *out = NULL;
    char *rec = run_fp16(c, "underflow", "--loss-scale 1e-30 --min-loss-scale 1e-31", &out);
    expect_in(out, "4 of 4 steps had every gradient 0: the loss scale 1e-30 underflows them", "--loss-scale 1e-30");
    expect_in(out, "raise --loss-scale", "--loss-scale 1e-30");
    expect_in(out, "UNDERFLOW, every gradient 0", "--loss-scale 1e-30's step lines");
    expect_in(strstr(out, "\nsummary "), "| fp16: 4 of 4 steps with every gradient 0 (underflow)", "--loss-scale 1e-30");
    double zero[RUN_MAX_STEPS];
    assert_int_equal(json_numbers(rec, "zero_grad_steps", zero, RUN_MAX_STEPS), 4);
    assert_int_equal((int)number_of(rec, "applied_steps"), 4);
    free(rec), free(out);
    // a healthy fp16 run says nothing of the kind, and one injected overflow is counted as one
    rec = run_fp16(c, "one-overflow", "--inject-overflow 2", &out);
    expect_in(out, "1 of 4 steps skipped: the gradients overflowed, so they applied no update", "--inject-overflow 2");
    if (strstr(out, "every gradient 0") || strstr(out, "at every step")) fail_msg("a healthy run warned:\n%s", out);
    assert_int_equal((int)number_of(rec, "applied_steps"), 3);
    free(rec), free(out);
}

// Item 11: a minimum above the first dynamic scale ran until it died "at the
// minimum loss scale 1e+30"; --inject-overflow took steps past --steps, a
// trailing comma and a step twice; a config's fp16.loss_scale below the
// minimum was refused naming --loss-scale, a flag the user never gave.
static void test_contradictory_scaling_refused(void **state) {
    const RunDir *c = *state;
    const char *base = "mpirun -np 2 ./zero2 --model tiny --steps 4 --precision fp16";
    const char *cases[][2] = {
        {"--min-loss-scale 1e30", "--min-loss-scale 1e+30 is above the first dynamic scale 2^16 = 65536"},
        {"--min-loss-scale 300 --initial-scale-power 8", "set by --initial-scale-power 8"},
        {"--inject-overflow 99", "step 99 is past --steps 4"},
        {"--inject-overflow 3,", "--inject-overflow 3,: give 1-based step numbers"},
        {"--inject-overflow 2,2", "step 2 is named twice"},
        {"--inject-overflow 1,3,4,3", "step 3 is named twice"},
    };
    char cmd[CMD_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s", base, cases[i][0]);
        free(expect_refusal(cmd, cases[i][1]));
    }
    char path[PATH_LEN];
    snprintf(path, sizeof path, "%s/scale.json", c->root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"fp16\": {\"enabled\": true, \"loss_scale\": 1e-30}}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --deepspeed-config %s", path);
    char *out = expect_refusal(cmd, "fp16.loss_scale 1e-30 (in ");
    if (strstr(out, "--loss-scale")) fail_msg("the refusal names a flag the user did not give:\n%s", out);
    free(out);
    // the boundaries still run: a minimum equal to the first scale, the last step injected
    run_ok("mpirun -np 2 ./zero2 --model tiny --steps 2 --precision fp16 --quiet --initial-scale-power 4 "
           "--min-loss-scale 16 --inject-overflow 2", NULL);
}

// Issue 39, item 15: an fp16 run's communication formula said "x 2 B (bf16)".
static void test_comm_formula_names_fp16(void **state) {
    const RunDir *c = *state;
    char *out = NULL;
    free(run_fp16(c, "formula", "", &out));
    expect_in(out, "(k+1)Ψ(N-1)/N x 2 B (fp16)", "an fp16 run's comm formula");
    if (strstr(out, "(bf16)")) fail_msg("an fp16 run names bf16:\n%s", out);
    free(out);
}

static int group_setup(void **state) {
    return run_dir_setup(state, "test_fp16_scaling_runs", (const char *const[]){"./zero2", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_step_skipped_is_said),
        cmocka_unit_test(test_contradictory_scaling_refused),
        cmocka_unit_test(test_comm_formula_names_fp16),
    };
    return cmocka_run_group_tests(tests, group_setup, run_dir_teardown);
}
