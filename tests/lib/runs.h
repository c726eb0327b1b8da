// runs.h: what the tests that spawn the trainers share: run one and read its
// --json record, and check that a bad command is refused properly.
#pragma once
#include <unistd.h>
#include "testutil.h"

#define RUN_MAX_STEPS 64

static __attribute__((unused)) int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// Runs a trainer that must succeed and returns the --json record it wrote
// (malloc'd); a failure shows the command and its output.
// train_output also hands back what it printed (*out, malloc'd).
static __attribute__((unused)) char *train_output(const char *cmd, const char *json_path, char **out) {
    int rc = test_run(cmd, out);
    if (rc != 0) fail_msg("%s: exit %d, output:\n%s", cmd, rc, *out);
    char *json = last_line(json_path);
    if (!json) fail_msg("%s: no --json record in %s", cmd, json_path);
    return json;
}

static __attribute__((unused)) char *train(const char *cmd, const char *json_path) {
    char *out = NULL;
    char *json = train_output(cmd, json_path, &out);
    free(out);
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

// The object of rank r in a 3d_parallel record's grid.ranks.
static __attribute__((unused)) const char *grid_rank_of(const char *json, int r) {
    char key[64];
    snprintf(key, sizeof key, "{\"rank\":%d,", r);
    const char *p = strstr(json, key);
    if (!p) fail_msg("no rank %d in the record's grid:\n%.300s", r, json);
    return p;
}

// The largest |a - b| (relative: / |a|) of two records' arrays `key` over
// `steps` steps; fails unless both hold that many.
static __attribute__((unused)) double steps_max_diff(const char *json_a, const char *json_b, const char *key,
                                                     int steps, int relative) {
    double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0}, worst = 0;
    if (json_numbers(json_a, key, a, RUN_MAX_STEPS) != steps || json_numbers(json_b, key, b, RUN_MAX_STEPS) != steps)
        fail_msg("expected %d %s in both records", steps, key);
    for (int i = 0; i < steps; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (relative ? fabs(a[i]) : 1));
    return worst;
}

// Two files hold the same bytes (both readable).
static __attribute__((unused)) int files_equal(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

// `run` (a launcher, a trainer and its flags) for `steps` steps, its record
// written to json and returned (malloc'd); with `weights`, run again for
// its first step alone, the weights exported there (--export-llmc).
static __attribute__((unused)) char *train_and_export_step_1(const char *run, int steps, const char *json,
                                                             const char *weights) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --steps %d --eval-batches 1 --quiet --json %s", run, steps, json);
    char *rec = train(cmd, json);
    if (!weights) return rec;
    snprintf(cmd, sizeof cmd, "%s --steps 1 --eval-every 0 --quiet --export-llmc %s", run, weights);
    char *out = NULL;
    if (test_run(cmd, &out) != 0) fail_msg("%s:\n%s", cmd, out);
    free(out);
    return rec;
}

// Two records' losses, gradient norms (`steps` of each) and validation loss
// are the same bits; else fails naming `what` and the first step's figures.
static __attribute__((unused)) void expect_records_same_bits(const char *a_json, const char *b_json, int steps,
                                                      const char *what) {
    double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0}, na[RUN_MAX_STEPS] = {0}, nb[RUN_MAX_STEPS] = {0};
    losses_of(a_json, a, steps);
    losses_of(b_json, b, steps);
    if (json_numbers(a_json, "grad_norms", na, RUN_MAX_STEPS) != steps ||
        json_numbers(b_json, "grad_norms", nb, RUN_MAX_STEPS) != steps)
        fail_msg("%s: %d gradient norms expected in each record", what, steps);
    double va = number_of(a_json, "val_loss"), vb = number_of(b_json, "val_loss");
    if (memcmp(a, b, sizeof a) || memcmp(na, nb, sizeof na) || va != vb)
        fail_msg("%s: not the same bits (step 1 loss %.9g and %.9g, norm %.9g and %.9g; val %.9g and %.9g)", what,
                 a[0], b[0], na[0], nb[0], va, vb);
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

// Tensor `name` ("master", "adam_m", ...) of every rank's part of a checkpoint step folder, in
// rank order (malloc'd; *count elements). Part layout (common/training/ckpt/ckpt.c):
// a 32-byte header (ntensors at offset 20), a 48-byte entry per tensor
// (name[32], bytes at 32, checksum), then the tensors' data in entry order.
static __attribute__((unused)) float *ckpt_tensor(const char *step_dir, int ranks, const char *name, size_t *count) {
    float *w = NULL;
    *count = 0;
    for (int q = 0; q < ranks; q++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/rank-%05d.bin", step_dir, q);
        FILE *f = fopen(path, "rb");
        if (!f) fail_msg("cannot open %s", path);
        char hdr[32];
        assert_int_equal(fread(hdr, 1, 32, f), 32);
        uint32_t n;
        memcpy(&n, hdr + 20, 4);
        uint64_t off = 32 + 48 * (uint64_t)n, found = 0, bytes = 0;
        for (uint32_t i = 0; i < n; i++) {
            char e[48];
            assert_int_equal(fread(e, 1, 48, f), 48);
            memcpy(&bytes, e + 32, 8);
            if (strcmp(e, name) == 0) { found = 1; break; }
            off += bytes;
        }
        if (!found) fail_msg("%s has no %s tensor", path, name);
        fseek(f, (long)off, SEEK_SET);
        w = realloc(w, (*count + bytes / 4) * sizeof(float));
        assert_int_equal(fread(w + *count, 1, bytes, f), bytes);
        *count += bytes / 4;
        fclose(f);
    }
    return w;
}

static __attribute__((unused)) float *ckpt_master(const char *step_dir, int ranks, size_t *count) {
    return ckpt_tensor(step_dir, ranks, "master", count);
}

// A command that must succeed; its output in *out (malloc'd) when out is not NULL.
static __attribute__((unused)) void run_ok(const char *cmd, char **out) {
    char *o = NULL;
    int rc = test_run(cmd, &o);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, o);
    if (out) *out = o;
    else free(o);
}

// Peak resident memory (KB) of a shell command, as the kernel counts it
// (its children's largest RSS).
static __attribute__((unused)) double peak_kb(const char *cmd) {
    char py[2048];
    snprintf(py, sizeof py, "python3 -c \"import resource, subprocess, sys; "
             "r = subprocess.run(sys.argv[1], shell=True, stdout=subprocess.DEVNULL); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\" '%s'", cmd);
    char *out = NULL;
    assert_int_equal(test_run(py, &out), 0);
    int rc = -1;
    double kb = NAN;
    if (sscanf(out, "%d %lf", &rc, &kb) != 2 || rc != 0) fail_msg("%s: %s", cmd, out);
    free(out);
    return kb;
}

// ckpt_tool consolidates and exports checkpoint `ck` (more than 100 MB of
// parts) into `out_prefix`-universal and .bin streaming: within 16 MB of the
// tool's own start (its libraries), whatever the parts add up to.
static __attribute__((unused)) void expect_tool_streams(const char *ck, const char *out_prefix) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "du -sk %s", ck);
    char *out = NULL;
    run_ok(cmd, &out);
    double parts_kb = atof(out);
    free(out);
    double base = peak_kb("./ckpt_tool --help");
    snprintf(cmd, sizeof cmd, "./ckpt_tool consolidate %s %s-universal", ck, out_prefix);
    double consolidate = peak_kb(cmd);
    snprintf(cmd, sizeof cmd, "./ckpt_tool export-llmc %s %s.bin", ck, out_prefix);
    double export = peak_kb(cmd);
    print_message("parts %.0f KB; peak resident: --help %.0f KB, consolidate %.0f KB, export-llmc %.0f KB\n",
                  parts_kb, base, consolidate, export);
    assert_true(parts_kb > 100000);
    assert_true(consolidate - base < 16384 && export - base < 16384);
}

// A group's set-up: every path in `needs` (NULL-ended: the binaries it runs,
// folders it reads) is there, as when the test runs from the repository root
// after make; else one line naming the test, and 1.
static __attribute__((unused)) int need_paths(const char *test, const char *const needs[]) {
    for (int i = 0; needs[i]; i++)
        if (access(needs[i], X_OK) != 0) {
            fprintf(stderr, "%s: %s not found; run from the repository root after make\n", test, needs[i]);
            return 1;
        }
    return 0;
}

// The context of a group that needs only a scratch folder for its records.
typedef struct RunDir {
    char root[64];
} RunDir;

// need_paths, then a fresh folder for the group (state: its RunDir).
static __attribute__((unused)) int run_dir_setup(void **state, const char *test, const char *const needs[]) {
    if (need_paths(test, needs)) return 1;
    RunDir *c = calloc(1, sizeof *c);
    if (!c || test_make_dir(c->root, sizeof c->root, test)) return 1;
    *state = c;
    return 0;
}

static __attribute__((unused)) int run_dir_teardown(void **state) {
    RunDir *c = *state;
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

// A test's folders: its own (root) and one on a disk (nvme: infinity's swap
// files need O_DIRECT, which tmpfs refuses). For cmocka's group set-up and
// tear-down: *state is the RunFolders, after the binaries in `paths` are
// found.
typedef struct RunFolders {
    char root[64];
    char nvme[512];
} RunFolders;

static __attribute__((unused)) int run_folders_setup(void **state, const char *test, const char *const *paths) {
    if (need_paths(test, paths)) return 1;
    RunFolders *c = calloc(1, sizeof *c);
    if (!c || test_make_dir(c->root, sizeof c->root, test) || make_disk_dir(c->nvme, sizeof c->nvme, test)) return 1;
    *state = c;
    return 0;
}

static __attribute__((unused)) int run_folders_teardown(void **state) {
    RunFolders *c = *state;
    int rc = test_remove_dir(c->root) | test_remove_dir(c->nvme);
    free(c);
    return rc;
}
