// test_ckpt_guard.c: a checkpoint folder is never written over by what runs
// near it (issue 39), run as programs from the repository root: a save that
// fails on one rank, or meets another run's step folder, leaves the
// checkpoint there whole and says so truthfully (item 1); a trainer's
// outputs may not lie inside the checkpoint it resumes from (item 2); a
// manifest's optimizer fields edited out of their flags' ranges are refused
// on resume, not trained on (item 10); a run saves only into a folder of
// its own checkpoints (issue 49, item 3).
#include <sys/stat.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 4096

typedef RunDir Ctx;

static int count_of(const char *s, const char *what) {
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

// A run that must end with exit 2 and exactly one error line, containing
// `want` (other lines, a resume's or the settings', may come before it).
static char *expect_error_line(const char *cmd, const char *want) {
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 2 || count_of(out, "error") != 1 || !strstr(out, want))
        fail_msg("%s: expected exit 2 and one error line with '%s'; got exit %d:\n%s", cmd, want, rc, out);
    return out;
}

static int exists(const char *dir, const char *name) {
    char path[PATH_LEN + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return lstat(path, &st) == 0;
}

// `ckpt_tool verify` passes on dir, whose latest step is `ranks` parts.
static void expect_verified(const char *dir, int ranks) {
    char cmd[CMD_LEN], want[64], *out = NULL;
    snprintf(cmd, sizeof cmd, "./ckpt_tool verify %s", dir);
    run_ok(cmd, &out);
    snprintf(want, sizeof want, "verified: %d parts", ranks);
    if (!strstr(out, want)) fail_msg("%s: expected '%s':\n%s", cmd, want, out);
    free(out);
}

// The 0.83M-parameter model's parts at 2 ranks (4.9 MB each) are past a
// 4500 KiB file size limit, which Open MPI's start-up (4100 KiB) is not.
#define RUN "./zero2 --model small --batch 1 --quiet"
#define RANK1_LIMITED(args) "mpirun -np 1 " RUN " " args " : -np 1 bash -c 'ulimit -f 4500; exec " RUN " " args "'"

static void test_save_never_damages_a_checkpoint(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], cmd[CMD_LEN];
    snprintf(ck, sizeof ck, "%s/ck", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 " RUN " --steps 1 --save %s", ck);
    run_ok(cmd, NULL);
    // another run at the same step, rank 1 past its limit: rank 0's new part
    // replaced the old one, and the checkpoint no longer verified
    snprintf(cmd, sizeof cmd, RANK1_LIMITED("--steps 1 --seed 2 --save %s"), ck, ck);
    free(expect_error_line(cmd, "already holds step-00000001"));
    expect_verified(ck, 2);
    // a run of 1 rank at the same step replaced the manifest and left part 1
    snprintf(cmd, sizeof cmd, "./zero2 --model small --batch 2 --quiet --steps 1 --save %s", ck);
    free(expect_error_line(cmd, "already holds step-00000001, a step this run saves"));
    expect_verified(ck, 2);
    // a failed save of a new step: the line names the checkpoint that stays,
    // checked, and nothing of the new step is left
    snprintf(cmd, sizeof cmd, RANK1_LIMITED("--steps 2 --resume %s --save %s"), ck, ck, ck, ck);
    char *out = expect_error_line(cmd, "File too large");
    char want[PATH_LEN + 64];
    snprintf(want, sizeof want, "(the previous checkpoint in %s, step-00000001, is unchanged)", ck);
    if (!strstr(out, want)) fail_msg("%s: expected '%s':\n%s", cmd, want, out);
    free(out);
    assert_false(exists(ck, "step-00000002") || exists(ck, "step-00000002.partial"));
    expect_verified(ck, 2);
}

// --json R/latest appended to `latest`; --export-llmc over a part replaced
// it; --save inside a step folder put a `latest` there, which a later
// --resume of that step folder followed.
static void test_outputs_outside_the_resumed_checkpoint(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], cmd[CMD_LEN], *out = NULL;
    snprintf(ck, sizeof ck, "%s/resumed", c->root);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 2 --quiet --save %s", ck);
    run_ok(cmd, NULL);
    const char *cases[][2] = {
        {"--resume %s --json %s/latest", "--json %s/latest is inside the checkpoint folder this run resumes from"},
        {"--resume %s/step-00000002 --export-llmc %s/step-00000002/rank-00000.bin",
         "--export-llmc %s/step-00000002/rank-00000.bin is inside the checkpoint folder"},
        {"--resume %s --trace %s/step-00000002/manifest.txt", "--trace %s/step-00000002/manifest.txt is inside"},
        {"--resume %s --save %s/step-00000002", "--save %s/step-00000002 is inside the checkpoint folder"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char flags[2 * PATH_LEN + 128], want[PATH_LEN + 128];
        snprintf(flags, sizeof flags, cases[k][0], ck, ck);
        snprintf(want, sizeof want, cases[k][1], ck);
        snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 4 --quiet %s", flags);
        free(expect_error_line(cmd, want));
    }
    expect_verified(ck, 1);
    snprintf(cmd, sizeof cmd, "cat %s/latest", ck);
    run_ok(cmd, &out);
    assert_string_equal(out, "step-00000002\n");
    free(out);
    // the folder itself goes on taking the resumed run's saves
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 4 --quiet --resume %s --save %s", ck, ck);
    run_ok(cmd, NULL);
    expect_verified(ck, 1);
}

// `cat FILE` must print `want`.
static void expect_file_text(const char *path, const char *want) {
    char cmd[CMD_LEN], *out = NULL;
    snprintf(cmd, sizeof cmd, "cat %s", path);
    run_ok(cmd, &out);
    if (strcmp(out, want) != 0) fail_msg("%s holds '%s', expected '%s'", path, out, want);
    free(out);
}

// Issue 49, item 3: --save DIR wrote over a user's DIR/lock and DIR/latest,
// and a second run (another seed and LR) saved step 1 into a folder holding
// another run's steps 2 and 4, its `latest` then naming that step 1, so that
// --resume DIR went on with the wrong run. A run saves only into a new or
// empty folder or one holding checkpoints of the same run, as the manifests
// record it (model, seed, data, global batch, settings of the update).
static void test_save_folder_of_another_run_refused(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], dir[PATH_LEN], path[PATH_LEN + 32];
    const char *theirs[][3] = {{"lock", "its lock file %s/lock is not one a run left"},
                               {"latest", "holds latest, which no save wrote"},
                               {"notes.txt", "holds notes.txt, which no save wrote"}};
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/users-%d", c->root, i);
        snprintf(path, sizeof path, "%s/%s", dir, theirs[i][0]);
        snprintf(cmd, sizeof cmd, "mkdir -p %s && echo mine > %s", dir, path);
        run_ok(cmd, NULL);
        char want[PATH_LEN + 128];
        snprintf(want, sizeof want, theirs[i][1], dir);
        snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --quiet --save %s", dir);
        free(expect_refusal(cmd, want));
        expect_file_text(path, "mine\n");
        assert_false(exists(dir, "step-00000001") || (i != 1 && exists(dir, "latest")));
    }
    char ck[PATH_LEN], latest[PATH_LEN + 32];
    snprintf(ck, sizeof ck, "%s/two-runs", c->root);
    snprintf(latest, sizeof latest, "%s/latest", ck);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 4 --save-every 2 --quiet --save %s", ck);
    run_ok(cmd, NULL);
    const char *others[][2] = {{"--seed 7 --lr 0.002", "(another seed: 1337 there, 7 here)"},
                               {"", "(other settings of the update, there -> here: --steps 4 -> 1)"},
                               {"--batch 2", "(another global batch: 4 rows of 32 tokens there, 2 of 32 here)"}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --quiet %s --save %s", others[i][0], ck);
        free(expect_refusal(cmd, others[i][1]));
    }
    expect_file_text(latest, "step-00000004\n");
    assert_false(exists(ck, "step-00000001"));
    // the same run goes on saving there, at another rank count too
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 6 --save-every 2 --quiet --resume %s --save %s", ck, ck);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero3 --model tiny --batch 2 --steps 8 --quiet --resume %s --save %s",
             ck, ck);
    run_ok(cmd, NULL);
    expect_file_text(latest, "step-00000008\n");
    expect_verified(ck, 2);
}

// A resume from a copy of `ck` with manifest line `key = value` must be
// refused with `want`.
static void expect_resume_refused(Ctx *c, const char *ck, const char *line, const char *want) {
    char bad[PATH_LEN], cmd[CMD_LEN];
    snprintf(bad, sizeof bad, "%s/damaged", c->root);
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && sed -i 's/^%.*s = .*/%s/' %s/step-00000004/manifest.txt",
             bad, ck, bad, (int)strcspn(line, " "), line, line, bad);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --precision fp16 --steps 6 --quiet --resume %s", bad);
    free(expect_error_line(cmd, want));
}

// skipped_steps = 100 at step 4 gave a negative learning rate (the run then
// "diverged"); a loss scale of 1e300 was taken, though the flag caps at 1e30.
static void test_damaged_optimizer_fields_refused(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], cmd[CMD_LEN];
    snprintf(ck, sizeof ck, "%s/fp16", c->root);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --precision fp16 --steps 4 --quiet --save %s", ck);
    run_ok(cmd, NULL);
    expect_resume_refused(c, ck, "skipped_steps = 100", "skipped_steps = 100 is more than the 4 steps it ran");
    expect_resume_refused(c, ck, "loss_scale = 1e300", "loss_scale = 1e+300 is outside (0, 1e+30], the range of "
                          "--loss-scale");
    expect_resume_refused(c, ck, "min_lr_frac = 2", "min_lr_frac = 2 is outside [0, 1], the range of --min-lr-frac");
    expect_resume_refused(c, ck, "warmup_type = cubic", "warmup_type = cubic is none of log|linear");
}

static int setup(void **state) {
    return run_dir_setup(state, "test-ckpt-guard", (const char *const[]){"./zero2", "./ckpt_tool", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_never_damages_a_checkpoint),
        cmocka_unit_test(test_outputs_outside_the_resumed_checkpoint),
        cmocka_unit_test(test_save_folder_of_another_run_refused),
        cmocka_unit_test(test_damaged_optimizer_fields_refused),
    };
    return cmocka_run_group_tests(tests, setup, run_dir_teardown);
}
