// test_lab_mistakes.c: issue 38. Plausible wrong versions of every lab's
// functions, as a student writes them (tests/labs/mistakes.py: off by one,
// the wrong group or buffer, a missing wait, a skipped step, a wrong memory
// category, waste that keeps the bits), each graded by make grade-lab-NN's
// script with the checks it names (plant.py): each must lose a check whose
// FAIL line says what went wrong. Before issue 38 the checks compared only
// the bytes after a step, so a unit never released, no prefetch at all or a
// recompute that ran the whole block scored full marks. Runs from the
// repository root after make; an argument (01 to 07) runs that lab alone.
// split: 01 02 03 04 05 06 07
#include "runs.h"

#define CMD_LEN 512
#define MIN_PER_LAB 5

static void test_planted_mistakes_are_caught(void **state) {
    const char *lab = *state;
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "python3 tests/labs/plant.py %s", lab);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    int caught = 0;
    for (const char *p = out; (p = strstr(p, ": caught by ")); p++) caught++;
    // each line says which check caught which mistake: the record of what the labs catch
    fputs(out, stdout);
    if (rc != 0 || caught < MIN_PER_LAB)
        fail_msg("lab %s: %d planted mistakes caught (at least %d expected), exit %d:\n%s", lab, caught, MIN_PER_LAB,
                 rc, out);
    free(out);
}

// With an argument (tests/run.sh's "// split:"), that lab's mistakes alone.
int main(int argc, char **argv) {
    if (need_paths("test_lab_mistakes", (const char *const[]){"./zero2", "./zero3", "./3d_parallel", NULL})) return 1;
    static char *const LABS[] = {"01", "02", "03", "04", "05", "06", "07"};
    static char names[7][32];
    struct CMUnitTest tests[7];
    int n = 0;
    for (int i = 0; i < 7; i++) {
        if (argc > 1 && strcmp(argv[1], LABS[i]) != 0) continue;
        snprintf(names[n], sizeof names[n], "lab %s's mistakes", LABS[i]);
        tests[n] = (struct CMUnitTest){.name = names[n], .test_func = test_planted_mistakes_are_caught,
                                         .initial_state = LABS[i]};
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "test_lab_mistakes: no lab %s; give 01 to 07, or nothing for all\n", argv[1]);
        return 2;
    }
    return _cmocka_run_group_tests("test_lab_mistakes", tests, (size_t)n, NULL, NULL);
}
