// test_handouts.c: issue 38. Each stage's handout (NN_*/README.md) shows
// excerpts of what its commands print; handout_check.py runs each block of
// commands that excerpts follow and finds every excerpt line in what it
// printed (losses to one unit of their last digit; never a time), and
// checks that the handout's make line builds every binary it runs. Before
// issue 38, handout 01 showed the loss differences and the refusal of an
// older build, 00 the activations of the materialized attention, and every
// handout ran a binary its make line did not build (04's question 3:
// ./memory_math: No such file or directory). Issue 49 item 10: a block
// whose excerpt quotes losses runs under every OpenBLAS kernel set this CPU
// can run of Haswell, SkylakeX and Prescott (and the trainers' own), since
// an AVX2 machine printed handouts 01's and 07's validation losses 2 units
// of the 4th decimal away from the AVX-512 machine that had recorded them.
// A block a test cannot run (multi-GB swap files) says so in the handout
// and is listed. Runs from the repository root after make.
#include "runs.h"

#define CMD_LEN 256

static void check_handout(const char *stage) {
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "python3 tests/stages/handout_check.py %s", stage);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    fputs(out, stdout);
    if (rc != 0 || !strstr(out, "excerpt lines found"))
        fail_msg("handout %s: its excerpts are not what its commands print (exit %d); regenerate them:\n%s", stage, rc,
                 out);
    free(out);
}

static void test_handout_00(void **state) { (void)state, check_handout("00"); }
static void test_handout_01(void **state) { (void)state, check_handout("01"); }
static void test_handout_02(void **state) { (void)state, check_handout("02"); }
static void test_handout_03(void **state) { (void)state, check_handout("03"); }
static void test_handout_04(void **state) { (void)state, check_handout("04"); }
static void test_handout_05(void **state) { (void)state, check_handout("05"); }
static void test_handout_06(void **state) { (void)state, check_handout("06"); }
static void test_handout_07(void **state) { (void)state, check_handout("07"); }

int main(void) {
    if (need_paths("test_handouts", (const char *const[]){"./memory_math", "./zero3", "./infinity", "./3d_parallel",
                                                           NULL}))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handout_00), cmocka_unit_test(test_handout_01), cmocka_unit_test(test_handout_02),
        cmocka_unit_test(test_handout_03), cmocka_unit_test(test_handout_04), cmocka_unit_test(test_handout_05),
        cmocka_unit_test(test_handout_06), cmocka_unit_test(test_handout_07),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
