// runs.h: what the tests that spawn the trainers share: run one and read its
// --json record, and check that a bad command is refused properly.
#pragma once
#include "testutil.h"

#define RUN_MAX_STEPS 64

static __attribute__((unused)) int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// Runs a trainer that must succeed and returns the --json record it wrote
// (malloc'd); a failure shows the command and its output.
static __attribute__((unused)) char *train(const char *cmd, const char *json_path) {
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d, output:\n%s", cmd, rc, out);
    free(out);
    char *json = last_line(json_path);
    if (!json) fail_msg("%s: no --json record in %s", cmd, json_path);
    return json;
}

// The "losses" array of a record; fails unless it holds `want` numbers.
static __attribute__((unused)) void losses_of(const char *json, double *out, int want) {
    int n = json_numbers(json, "losses", out, RUN_MAX_STEPS);
    if (n != want) fail_msg("expected %d losses in the record, found %d:\n%s", want, n, json);
}

static __attribute__((unused)) double number_of(const char *json, const char *key) {
    double v = NAN;
    if (json_numbers(json, key, &v, 1) != 1) fail_msg("no number \"%s\" in the record:\n%.300s", key, json);
    return v;
}

// A command that must be refused: exit status 2 and exactly one line of
// output containing "error" (and `also`, when given). Returns the output (malloc'd).
static __attribute__((unused, noinline)) char *expect_refusal(const char *cmd, const char *also) {
    char *out = NULL;
    int rc = test_run(cmd, &out);
    int lines = count_lines(out);
    int ok = rc == 2 && lines == 1 && out[strlen(out) - 1] == '\n' && strstr(out, "error") &&
             (!also || strstr(out, also));
    if (!ok) fail_msg("%s: expected exit 2 and one line with \"error\"%s%s; got exit %d, %d lines:\n%s", cmd,
                      also ? " and " : "", also ? also : "", rc, lines, out);
    return out;
}
