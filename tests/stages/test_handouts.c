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
// and is listed. Runs from the repository root after make; an argument (00
// to 07) runs that handout alone.
// uses: cluster (the emulated hosts' network namespaces, zw-*: one set at a time)
// split: 00 01 02 03 04 05 06 07
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

static void test_handout(void **state) { check_handout(*state); }

// With an argument (tests/run.sh's "// split:"), that handout alone.
int main(int argc, char **argv) {
    if (need_paths("test_handouts", (const char *const[]){"./memory_math", "./zero3", "./infinity", "./3d_parallel",
                                                           NULL}))
        return 1;
    static char *const STAGES[] = {"00", "01", "02", "03", "04", "05", "06", "07"};
    static char names[8][16];
    struct CMUnitTest tests[8];
    int n = 0;
    for (int i = 0; i < 8; i++) {
        if (argc > 1 && strcmp(argv[1], STAGES[i]) != 0) continue;
        snprintf(names[n], sizeof names[n], "handout %s", STAGES[i]);
        tests[n] = (struct CMUnitTest){.name = names[n], .test_func = test_handout, .initial_state = STAGES[i]};
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "test_handouts: no handout %s; give 00 to 07, or nothing for all\n", argv[1]);
        return 2;
    }
    return _cmocka_run_group_tests("test_handouts", tests, (size_t)n, NULL, NULL);
}
