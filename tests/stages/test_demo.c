// test_demo.c: make demo's comparison of the stages' speed (issue 39, item
// 18: on a loaded machine it showed zero3 at 2.4x dp_baseline's tokens/s,
// each stage timed once, one after another). scripts/demo_speed.py turns
// interleaved timing rounds into medians with their spread and each stage's
// ratio to dp_baseline round by round, saying where a ratio's range holds 1;
// scripts/demo.sh runs those rounds, every stage once a round in a rotated
// order, and says how long it took; its note on 3d_parallel's accumulation
// is measured, and its own build uses the cores. Run from the repository
// root after make.
#include <jansson.h>
#include "runs.h"

#define CMD_LEN 2048

static void expect_in(const char *out, const char *want) {
    if (!strstr(out, want)) fail_msg("no \"%s\" in:\n%s", want, out);
}

// Three rounds written by hand: dp_baseline 100, 120, 110 tokens/s; zero1
// 90, 130, 105 (ratios 0.90, 1.08, 0.95: not told apart); zero3 240, 130,
// 250 (ratios 2.40, 1.08, 2.27: faster in every round, by 1.08 to 2.40).
static void test_speed_table(void **state) {
    (void)state;
    char root[64], path[128], cmd[CMD_LEN];
    assert_int_equal(test_make_dir(root, sizeof root, "demo-speed"), 0);
    snprintf(path, sizeof path, "%s/rounds.json", root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    const char *stages[3] = {"dp_baseline", "zero1", "zero3"};
    const double tps[3][3] = {{100, 120, 110}, {90, 130, 105}, {240, 130, 250}};
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 3; s++) fprintf(f, "{\"stage\":\"%s\",\"tokens_per_s\":%g}\n", stages[s], tps[s][r]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 scripts/demo_speed.py %s", path);
    char *out = NULL;
    run_ok(cmd, &out);
    expect_in(out, "tokens/s, 3 interleaved rounds");
    expect_in(out, "  dp_baseline        110       100       120     18%\n");
    expect_in(out, "  zero1              105        90       130     38%    0.95 (0.90-1.08)  (not told apart)\n");
    expect_in(out, "  zero3              240       130       250     50%    2.27 (1.08-2.40)\n");
    expect_in(out, "noise: the rounds of zero3 differ by 50% of its median");
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

// The demo itself, as small as it goes (tiny, 2 ranks, 2 rounds of 3
// steps, no set-up): the rounds interleave the stages in a rotated order,
// the table follows the summaries, and the run says how long it took.
static void test_demo_interleaves(void **state) {
    (void)state;
    char dir[256], cmd[CMD_LEN];
    if (make_disk_dir(dir, sizeof dir, "test_demo")) fail_msg("no folder on a disk for infinity's swap files");
    snprintf(cmd, sizeof cmd, "DEMO_SETUP=0 DEMO_MODEL=tiny DEMO_STEPS=2 DEMO_ROUNDS=2 DEMO_SPEED_STEPS=3 "
             "DEMO_OUT=%s bash scripts/demo.sh 2", dir);
    char *out = NULL;
    run_ok(cmd, &out);
    expect_in(out, "tok/s here is each run's alone, one after another");
    expect_in(out, "tokens/s, 2 interleaved rounds");
    const char *table = strstr(out, "tokens/s, 2 interleaved rounds"), *summary = strstr(out, "\nsummary zero3");
    assert_true(summary && summary < table);
    expect_in(table, "x dp_baseline (median, range)");
    expect_in(out, "make demo: ");
    expect_in(out, " s on this machine, set-up included");
    // the rounds' records: every stage once a round, round 2 starting one stage later
    char path[320];
    snprintf(path, sizeof path, "%s/demo_speed.json", dir);
    char *text = read_file(path, NULL);
    assert_non_null(text);
    const char *order[12];
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < 12; line = strtok(NULL, "\n")) {
        json_t *rec = json_loads(line, 0, NULL);
        assert_non_null(rec);
        order[n++] = strdup(json_string_value(json_object_get(rec, "stage")));
        json_decref(rec);
    }
    int stages = n / 2;
    assert_true(n % 2 == 0 && stages >= 4);
    for (int i = 0; i < stages; i++)
        if (strcmp(order[stages + i], order[(i + 1) % stages]) != 0)
            fail_msg("round 2's run %d is %s, expected %s (round 1's order rotated by one)", i + 1, order[stages + i],
                     order[(i + 1) % stages]);
    for (int i = 0; i < n; i++) free((void *)order[i]);
    free(text);
    free(out);
    assert_int_equal(test_remove_dir(dir), 0);
}

// Issue 49, item 12: the note under the table said 3d_parallel and
// dp_baseline with the same accumulation "agree within the test's tolerance
// (1e-3)", where the demo's own runs were 0.13 apart at a loss spike. The
// note is the runs' measured difference: two records written by hand, 1e-7
// apart at step 1 and 0.132 at step 4.
static void test_accum_note_measured(void **state) {
    (void)state;
    char root[64], path[128], cmd[CMD_LEN], *out = NULL;
    assert_int_equal(test_make_dir(root, sizeof root, "demo-note"), 0);
    snprintf(path, sizeof path, "%s/runs.json", root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"stage\":\"3d_parallel\",\"grad_accum\":4,\"first_step\":0,\"losses\":[5.5,4.9,4.1,3.983,3.7]}\n"
               "{\"stage\":\"dp_baseline\",\"grad_accum\":4,\"first_step\":0,"
               "\"losses\":[5.5000001,4.9001,4.1003,3.851,3.69]}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 scripts/demo_accum_note.py %s", path);
    run_ok(cmd, &out);
    expect_in(out, "their losses differ by 1e-07 at step 1 and by at most 0.132, at step 4 (3.9830 against 3.8510)");
    if (strstr(out, "tolerance")) fail_msg("the note claims a tolerance:\n%s", out);
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

// Issue 49, item 13: make demo's own build, started from make's recipe,
// warned "jobserver unavailable: using -j1" and built on one core. Through
// make -j2, with the set-up (its build) and the smallest demo.
static void test_demo_build_uses_the_cores(void **state) {
    (void)state;
    char dir[256], cmd[CMD_LEN], *out = NULL;
    if (make_disk_dir(dir, sizeof dir, "test_demo_make")) fail_msg("no folder on a disk for infinity's swap files");
    snprintf(cmd, sizeof cmd, "DEMO_MODEL=tiny DEMO_STEPS=2 DEMO_ROUNDS=1 DEMO_SPEED_STEPS=2 DEMO_OUT=%s "
             "make -j2 --no-print-directory demo NP=2", dir);
    run_ok(cmd, &out);
    if (strstr(out, "jobserver unavailable")) fail_msg("make demo's build ran on one core:\n%s", out);
    expect_in(out, "make demo: ");
    free(out);
    assert_int_equal(test_remove_dir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_speed_table),
        cmocka_unit_test(test_demo_interleaves),
        cmocka_unit_test(test_accum_note_measured),
        cmocka_unit_test(test_demo_build_uses_the_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
