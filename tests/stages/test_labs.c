// test_labs.c: the lab kit. For every lab, make_lab.py writes a student copy
// (which also proves the reference passes the lab's checks: it refuses to
// write one otherwise); in the copy the stubbed stage builds and fails every
// check; with the reference's functions put back it passes them all. Runs
// from the repository root after make.
#include <time.h>
#include <unistd.h>
#include "runs.h"

#define CMD_LEN 4096

static const char *const LABS[] = {"01", "02", "03", "04", "05", "06", "07"};

// Counts "  pass " and "  FAIL " lines of check_lab's output.
static void count_checks(const char *out, int *pass, int *fail) {
    *pass = *fail = 0;
    for (const char *p = out; (p = strstr(p, "\n  ")); p++) {
        if (!strncmp(p, "\n  pass ", 8)) (*pass)++;
        if (!strncmp(p, "\n  FAIL ", 8)) (*fail)++;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_lab(const char *lab) {
    char root[64], cmd[CMD_LEN];
    assert_int_equal(test_make_dir(root, sizeof root, "lab"), 0);
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "python3 scripts/make_lab.py %s %s/copy", lab, root);
    int rc = test_run(cmd, &out);
    if (rc != 0 || !strstr(out, "functions to write")) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    free(out);

    // the stubs: it builds, and every check fails
    snprintf(cmd, sizeof cmd, "cd %s/copy && python3 scripts/check_lab.py %s", root, lab);
    rc = test_run(cmd, &out);
    int pass, fail;
    count_checks(out, &pass, &fail);
    if (rc == 0 || pass != 0 || fail < 4 || !strstr(out, "is not written yet") || !strstr(out, "score: 0/"))
        fail_msg("lab %s stubbed: exit %d, %d pass, %d fail\n%s", lab, rc, pass, fail, out);
    free(out);

    // the reference's functions back in place of the stubs: every check passes
    snprintf(cmd, sizeof cmd, "cut -d: -f1 %s/copy/.lab/stubbed.txt | sort -u | while read f; do cp \"$f\" %s/copy/\"$f\"; "
             "touch %s/copy/\"$f\"; done && cd %s/copy && python3 scripts/check_lab.py %s", root, root, root, root, lab);
    double t0 = now_s();
    rc = test_run(cmd, &out);
    // what a finished lab's `make check-lab-NN` costs on this machine (the handouts quote it)
    printf("lab %s: the checks of a finished copy took %.0f s\n", lab, now_s() - t0);
    count_checks(out, &pass, &fail);
    if (rc != 0 || fail != 0 || pass < 5) fail_msg("lab %s with the reference's code: exit %d, %d pass, %d fail\n%s", lab,
                                                   rc, pass, fail, out);
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

static void test_labs(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof LABS / sizeof LABS[0]; i++) check_lab(LABS[i]);
}

// A folder that may hold a student's work is never written over.
static void test_lab_keeps_work(void **state) {
    (void)state;
    char root[64], cmd[CMD_LEN];
    assert_int_equal(test_make_dir(root, sizeof root, "lab-keep"), 0);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/copy && echo mine > %s/copy/notes.txt && "
             "python3 scripts/make_lab.py 03 %s/copy", root, root, root);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc == 0 || !strstr(out, "not empty")) fail_msg("make_lab over a folder with work: exit %d\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "grep -q mine %s/copy/notes.txt", root);
    assert_int_equal(test_run(cmd, NULL), 0);
    assert_int_equal(test_remove_dir(root), 0);
}

int main(void) {
    if (need_paths("test_labs", (const char *const[]){"./zero2", NULL})) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lab_keeps_work),
        cmocka_unit_test(test_labs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
