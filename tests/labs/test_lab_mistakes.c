// test_lab_mistakes.c: issue 38. Plausible wrong versions of every lab's
// functions, as a student writes them (tests/labs/mistakes.py: off by one,
// the wrong group or buffer, a missing wait, a skipped step, a wrong memory
// category, waste that keeps the bits), each graded by make grade-lab-NN's
// script with the checks it names (plant.py): each must lose a check whose
// FAIL line says what went wrong. Before issue 38 the checks compared only
// the bytes after a step, so a unit never released, no prefetch at all or a
// recompute that ran the whole block scored full marks. Runs from the
// repository root after make.
#include "runs.h"

#define CMD_LEN 512
#define MIN_PER_LAB 5

static const char *const LABS[] = {"01", "02", "03", "04", "05", "06", "07"};

static void test_planted_mistakes_are_caught(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof LABS / sizeof LABS[0]; i++) {
        char cmd[CMD_LEN];
        snprintf(cmd, sizeof cmd, "python3 tests/labs/plant.py %s", LABS[i]);
        char *out = NULL;
        int rc = test_run(cmd, &out);
        int caught = 0;
        for (const char *p = out; (p = strstr(p, ": caught by ")); p++) caught++;
        // each line says which check caught which mistake: the record of what the labs catch
        fputs(out, stdout);
        if (rc != 0 || caught < MIN_PER_LAB)
            fail_msg("lab %s: %d planted mistakes caught (at least %d expected), exit %d:\n%s", LABS[i], caught,
                     MIN_PER_LAB, rc, out);
        free(out);
    }
}

int main(void) {
    if (need_paths("test_lab_mistakes", (const char *const[]){"./zero2", "./zero3", "./3d_parallel", NULL})) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planted_mistakes_are_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
