// test_protocol.c: the micro-batch protocol held by the trainer. A stage
// is handed its pass (mb->backward: a training step, or an evaluation's
// forwards) and each micro-batch's turn in the step's gradient sum
// (micro_turn); the trainer checks after every pass that the stage ran what
// it was handed. Two stages planted with a mistake about the pass
// (planted_pass.c) are stopped with one line that names it; dp_baseline,
// the same stage without the mistake, runs through.
#include "runs.h"

#define RUN "mpirun -np 2 %s --model tiny --steps 3 --grad-accum 2 --eval-every 2 --quiet"

static void expect_caught(const char *binary, const char *names) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, RUN " 2>&1", binary);
    int rc = test_run(cmd, &out);
    if (rc != 1 || !strstr(out, names) || !strstr(out, "hint: its forward_backward runs backward only where"))
        fail_msg("%s: exit %d, expected 1 with \"%s\"\n%s", cmd, rc, names, out);
    free(out);
}

// Backward in an evaluation (the pass ignored): stopped at the first evaluation (before step 1).
static void test_backward_in_an_evaluation(void **state) {
    (void)state;
    expect_caught("build/tests/stages/planted_pass_1",
                  "planted: an evaluation pass of 8 micro-batches ran 32 unit forwards and 32 backwards, not 32 and 0");
}

// A training step whose first micro-batch skips backward: stopped at step 1.
static void test_a_micro_batch_without_backward(void **state) {
    (void)state;
    expect_caught("build/tests/stages/planted_pass_2",
                  "planted: a training pass of 2 micro-batches ran 8 unit forwards and 4 backwards, not 8 and 8");
}

// The same run of the stage without the mistake goes through.
static void test_the_stage_itself_runs(void **state) {
    (void)state;
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, RUN " 2>&1", "./dp_baseline");
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_in_an_evaluation),
        cmocka_unit_test(test_a_micro_batch_without_backward),
        cmocka_unit_test(test_the_stage_itself_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
