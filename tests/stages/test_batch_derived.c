// test_batch_derived.c: a micro-batch derived by DeepSpeed's batch rule
// (--global-batch, or a config's train_batch_size) trains the run it names:
// every stage gives the same --json record as with the same micro-batch
// given directly (losses, norms, memory by tier and category, the formulas,
// the counted device need, the bytes moved), clocks and the settings'
// sources aside. Issue 49 item 1: stages 01-06 sized their plan from
// --batch before the rule had derived it, so a derived 16 trained with
// activations for 4 (other losses, inflated tokens/s) and a derived 1
// over-read the token buffer (SIGSEGV). Run from the repository root.
#include <jansson.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048

typedef RunFolders Ctx;

static const char *const STAGES[] = {"dp_baseline", "zero1", "zero2", "zero3", "cpu_offload", "infinity",
                                     "3d_parallel"};
#define NSTAGES (int)(sizeof STAGES / sizeof STAGES[0])
static const char *const STAGE_PATHS[] = {"./dp_baseline", "./zero1", "./zero2", "./zero3", "./cpu_offload",
                                          "./infinity", "./3d_parallel", NULL};

// The members that are clocks, or say where a setting came from: the only
// ones a derived micro-batch may change.
static const char *const CLOCKS[] = {"step_ms", "tokens_per_s", "step_ms_median", "gflops_per_rank",
                                     "hw_gflops_per_rank", "mfu", "hfu", "times_ms_per_step", "settings",
                                     "deepspeed_config", "bubble_measured"};

// Deletes the CLOCKS members of j and of every object within it.
static void drop_clocks(json_t *j) {
    if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) drop_clocks(json_array_get(j, i));
        return;
    }
    if (!json_is_object(j)) return;
    for (size_t i = 0; i < sizeof CLOCKS / sizeof CLOCKS[0]; i++) json_object_del(j, CLOCKS[i]);
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) drop_clocks(v);
}

static json_t *record(Ctx *c, const char *tag, const char *cmd_args) {
    char cmd[CMD_LEN], path[PATH_LEN];
    snprintf(path, sizeof path, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, "%s --quiet --json %s", cmd_args, path);
    char *line = train(cmd, path);
    json_error_t e;
    json_t *j = json_loads(line, 0, &e);
    if (!j) fail_msg("%s: not JSON (%s)", cmd, e.text);
    free(line);
    drop_clocks(j);
    return j;
}

// The first member of a and b that differs, for the failure's message.
static void say_first_difference(const char *what, json_t *a, json_t *b) {
    const char *key;
    json_t *v;
    json_object_foreach(a, key, v) {
        json_t *w = json_object_get(b, key);
        if (w && json_equal(v, w)) continue;
        char *x = json_dumps(v, JSON_COMPACT), *y = w ? json_dumps(w, JSON_COMPACT) : strdup("(absent)");
        fail_msg("%s: \"%s\" is %.400s derived, %.400s given", what, key, x, y);
    }
    fail_msg("%s: the records differ in a member the given one alone has", what);
}

// Stage s at 2 ranks, the micro-batch derived (derived_args) and given
// (given_args); infinity with its optimizer states on NVMe, its default.
static void same_record(Ctx *c, int s, const char *derived_args, const char *given_args, const char *tag) {
    char a[CMD_LEN + 512], b[CMD_LEN + 512], ta[PATH_LEN], tb[PATH_LEN], common[CMD_LEN];
    int n = snprintf(common, sizeof common, "--model tiny --steps 2 --eval-every 0");
    if (strcmp(STAGES[s], "infinity") == 0) snprintf(common + n, sizeof common - n, " --nvme-path %s", c->nvme);
    snprintf(a, sizeof a, "mpirun -np 2 ./%s %s %s", STAGES[s], common, derived_args);
    snprintf(b, sizeof b, "mpirun -np 2 ./%s %s %s", STAGES[s], common, given_args);
    snprintf(ta, sizeof ta, "%s-%s-derived", STAGES[s], tag);
    snprintf(tb, sizeof tb, "%s-%s-given", STAGES[s], tag);
    json_t *ra = record(c, ta, a), *rb = record(c, tb, b);
    if (!json_equal(ra, rb)) say_first_difference(a, ra, rb);
    json_decref(ra);
    json_decref(rb);
}

// Above the default micro-batch of 4: 32 / (1 x 2 ranks) = 16.
static void test_derived_above_default(void **state) {
    for (int s = 0; s < NSTAGES; s++)
        same_record(*state, s, "--global-batch 32 --grad-accum 1", "--batch 16 --grad-accum 1", "16");
}

// Below it: 2 / (1 x 2 ranks) = 1 (a heap over-read before).
static void test_derived_below_default(void **state) {
    for (int s = 0; s < NSTAGES; s++)
        same_record(*state, s, "--global-batch 2 --grad-accum 1", "--batch 1 --grad-accum 1", "1");
}

// The config's way: train_batch_size 32 with 2 accumulation steps gives 8.
static void test_derived_by_config(void **state) {
    Ctx *c = *state;
    char path[PATH_LEN], args[CMD_LEN];
    snprintf(path, sizeof path, "%s/batch.json", c->root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 2}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--deepspeed-config %s", path);
    same_record(c, 2, args, "--batch 8 --grad-accum 2", "config");
}

static int group_setup(void **state) { return run_folders_setup(state, "test_batch_derived", STAGE_PATHS); }
static int group_teardown(void **state) { return run_folders_teardown(state); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_derived_above_default),
        cmocka_unit_test(test_derived_below_default),
        cmocka_unit_test(test_derived_by_config),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
