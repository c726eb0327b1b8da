// test_faults.c: faults around a run, run as programs from the repository
// root: a file-size limit during a checkpoint write (one line, no temporary
// files, the earlier checkpoint still loadable). Each fault must end the run
// with one error line that says what happened.
#include <dirent.h>
#include "runs.h"

#define CMD_LEN 2048

typedef struct Ctx {
    char root[64];
} Ctx;

static int count_of(const char *s, const char *what) {
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

// Output of a command expected to fail with `status`; its error lines are
// exactly one and contain `want`.
static char *expect_one_error(const char *cmd, int status, const char *want) {
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != status || count_of(out, "error") != 1 || !strstr(out, want))
        fail_msg("%s: expected exit %d and one error line with '%s'; got exit %d:\n%s", cmd, status, want, rc, out);
    return out;
}

// Files and folders under dir whose name ends in `suffix`.
static int files_ending(const char *dir, const char *suffix) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "find '%s' -name '*%s' | wc -l", dir, suffix);
    test_run(cmd, &out);
    int n = atoi(out);
    free(out);
    return n;
}

// Issue 15, item 6: past `ulimit -f` the ranks died of SIGXFSZ (status 153,
// no message) and left .tmp files. The limit (8 MB) lets MPI start (its
// shared memory needs a few MB) and stops the 19 MB checkpoint parts.
static void test_file_size_limit(void **state) {
    Ctx *c = *state;
    char ck[128], cmd[CMD_LEN], *out = NULL;
    snprintf(ck, sizeof ck, "%s/fsize", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero2 --model tiny --steps 2 --quiet --save %s", ck);
    assert_int_equal(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 bash -c 'ulimit -f 8192; exec ./zero2 --model small --d-model 256 "
             "--steps 3 --quiet --save %s'", ck);
    out = expect_one_error(cmd, 2, "File too large");
    if (!strstr(out, "(the previous checkpoint in")) fail_msg("%s", out);
    free(out);
    if (files_ending(ck, ".tmp") != 0 || files_ending(ck, "step-00000003") != 0)
        fail_msg("the failed save left files in %s", ck);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero2 --model tiny --steps 4 --quiet --resume %s", ck);
    assert_int_equal(test_run(cmd, &out), 0);
    assert_non_null(strstr(out, "at step 2"));
    free(out);
    // where there was none, the line does not say that one is unchanged
    snprintf(cmd, sizeof cmd, "mpirun -np 2 bash -c 'ulimit -f 8192; exec ./zero2 --model small --d-model 256 "
             "--steps 1 --quiet --save %s/fresh'", c->root);
    free(expect_one_error(cmd, 2, "holds no earlier checkpoint"));
}

static int group_setup(void **state) {
    if (access("./zero2", X_OK) != 0) {
        fprintf(stderr, "test_faults: run from the repository root after make\n");
        return 1;
    }
    Ctx *c = calloc(1, sizeof *c);
    if (test_make_dir(c->root, sizeof c->root, "test-faults")) return 1;
    *state = c;
    return 0;
}

static int group_teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_size_limit),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
