// test_slurm.c: the trainers launched by Slurm, on the one-node Slurm of
// scripts/slurm-local.sh (Debian's slurm-wlm, its PMIx plugin, Debian's Open
// MPI built with Slurm and PMIx support). srun --mpi=pmix starts zero2 at 2
// ranks and zero3 at 4, and salloc -n 2 runs mpirun with no -np inside the
// allocation (dp_baseline): each record has as many ranks as asked and the
// losses, gradient norms and validation loss of a plain mpirun -np N to the
// bit (the same ranks and collectives; only the launcher differs). A rank's
// exit status passes through srun; a second `up` is refused in one line;
// `down` stops the daemons and leaves no file. Not tested here: several
// nodes. Needs root and slurm-wlm: without them every test skips and says
// why. Run from the repository root after make; records go under one
// mkdtemp folder. (test_run sets scripts/mpi-env.sh's settings, which
// salloc's mpirun needs as root.)
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048
#define STEPS 3
#define SLURM "scripts/slurm-local.sh"
#define IN_SLURM "timeout 60 " SLURM " run -- "  // a job that waits for CPUs must not hang the suite
#define CANNOT_RUN_HERE 3                           // slurm-local.sh's exit status: not root, a package missing

typedef struct Ctx {
    char root[64];
    int up;              // this group brought Slurm up (and takes it down)
    char why_not[1024];  // why it is not up: a reason to skip, or (failed) an error
    int failed;          // `up` failed on a machine that can run it: the tests fail
} Ctx;

// Skips a test where this machine cannot run Slurm, saying why; fails one
// where it could and `up` failed.
#define NEED_SLURM(c)                                                       \
    do {                                                                    \
        if (!(c)->up) {                                                     \
            if ((c)->failed) fail_msg("%s", (c)->why_not);                  \
            fprintf(stderr, "test_slurm: skipped: %s\n", (c)->why_not);    \
            skip();                                                         \
        }                                                                   \
    } while (0)

static int setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", "./zero2", "./zero3", SLURM, NULL};
    if (run_dir_setup(state, "slurm", needs)) return 1;
    RunDir *dir = *state;
    Ctx *c = calloc(1, sizeof *c);
    memcpy(c->root, dir->root, sizeof c->root);
    free(dir);
    *state = c;
    char *out = NULL;
    int rc = test_run(SLURM " status", &out);
    if (rc != 0 || !strstr(out, "no Slurm is up")) {
        // someone else's: leave it be
        snprintf(c->why_not, sizeof c->why_not, "a Slurm of " SLURM " is already up on this machine (" SLURM " status)");
    } else {
        free(out);
        rc = test_run(SLURM " up", &out);
        if (rc == 0) {
            c->up = 1;
        } else {
            c->failed = rc != CANNOT_RUN_HERE;
            snprintf(c->why_not, sizeof c->why_not, "%s" SLURM " up: exit %d", out, rc);
        }
    }
    free(out);
    return 0;
}

static int teardown(void **state) {
    Ctx *c = *state;
    if (c->up) test_run(SLURM " down", NULL);
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

// The record of `stage` at `ranks` ranks, launched by `launcher` (its words
// before the trainer); `name` tells the record's file from the others.
static char *run_stage(Ctx *c, const char *launcher, const char *stage, int ranks, const char *name) {
    char cmd[CMD_LEN], json[PATH_LEN];
    snprintf(json, sizeof json, "%s/%s-%s.json", c->root, stage, name);
    snprintf(cmd, sizeof cmd, "%s ./%s --model tiny --steps %d --quiet --json %s", launcher, stage, STEPS, json);
    char *rec = train(cmd, json);
    if (number_of(rec, "ranks") != ranks)
        fail_msg("%s: the record has %.0f ranks, not %d:\n%.300s", cmd, number_of(rec, "ranks"), ranks, rec);
    return rec;
}

// The numbers under `key` of two records, equal to the bit.
static void expect_same_numbers(const char *key, const char *want, const char *got, const char *what) {
    double w[RUN_MAX_STEPS] = {0}, g[RUN_MAX_STEPS] = {0};
    int nw = json_numbers(want, key, w, RUN_MAX_STEPS), ng = json_numbers(got, key, g, RUN_MAX_STEPS);
    if (nw == 0 || nw != ng) fail_msg("%s: %d numbers \"%s\" under mpirun, %d under Slurm", what, nw, key, ng);
    for (int i = 0; i < nw; i++)
        if (w[i] != g[i])
            fail_msg("%s: %s[%d] %.9g under Slurm, %.9g under mpirun (the same ranks and collectives must "
                     "give the same bits)", what, key, i, g[i], w[i]);
}

// `stage` at `ranks` ranks under mpirun -np and under `launcher` in Slurm:
// the same losses, gradient norms and validation loss.
static void expect_same_as_mpirun(Ctx *c, const char *launcher, const char *stage, int ranks) {
    char plain[64];
    snprintf(plain, sizeof plain, "mpirun -np %d", ranks);
    char *want = run_stage(c, plain, stage, ranks, "mpirun");
    char *got = run_stage(c, launcher, stage, ranks, "slurm");
    char what[256];
    snprintf(what, sizeof what, "%s, %d ranks, %s", stage, ranks, launcher);
    expect_same_numbers("losses", want, got, what);
    expect_same_numbers("grad_norms", want, got, what);
    expect_same_numbers("val_loss", want, got, what);
    free(want);
    free(got);
}

// ---- tests ----

static void test_srun_zero2(void **state) {
    Ctx *c = *state;
    NEED_SLURM(c);
    expect_same_as_mpirun(c, IN_SLURM "srun --mpi=pmix -n 2", "zero2", 2);
}

static void test_srun_zero3_four_ranks(void **state) {
    Ctx *c = *state;
    NEED_SLURM(c);
    expect_same_as_mpirun(c, IN_SLURM "srun --mpi=pmix -n 4", "zero3", 4);
}

// mpirun inside an allocation takes its ranks and host from Slurm (no -np)
static void test_salloc_mpirun(void **state) {
    Ctx *c = *state;
    NEED_SLURM(c);
    expect_same_as_mpirun(c, IN_SLURM "salloc -n 2 mpirun", "dp_baseline", 2);
}

static void test_srun_passes_exit_status(void **state) {
    Ctx *c = *state;
    NEED_SLURM(c);
    char *out = NULL;
    int rc = test_run(IN_SLURM "srun --mpi=pmix -n 2 ./zero2 --no-such-flag", &out);
    if (rc != 2 || !strstr(out, "zero2: error: unknown option --no-such-flag"))
        fail_msg("srun of a bad flag: expected exit 2 (the ranks' own) and the trainer's error line; got exit %d:\n%s",
                 rc, out);
    free(out);
}

static void test_second_up_refused(void **state) {
    Ctx *c = *state;
    NEED_SLURM(c);
    free(expect_refusal(SLURM " up", "already up"));
}

// Last: takes Slurm down and finds none of its daemons or files.
static void test_down_leaves_nothing(void **state) {
    Ctx *c = *state;
    NEED_SLURM(c);
    char *out = NULL;
    // its daemons, by the pids it wrote (a daemon PID 1 has not reaped yet counts as gone)
    assert_int_equal(test_run("cd \"${ZW_SLURM_DIR:-/tmp/zw-slurm}\" && cat *.pid munge/munged.pid", &out), 0);
    char pids[256];
    snprintf(pids, sizeof pids, "%s", out);
    free(out);
    assert_int_equal(test_run(SLURM " down", &out), 0);
    free(out);
    c->up = 0;
    snprintf(c->why_not, sizeof c->why_not, "Slurm was taken down");
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "for p in %s; do ps -o pid=,stat=,comm= -p $p | grep -v ' Z'; done; "
             "ls -d \"${ZW_SLURM_DIR:-/tmp/zw-slurm}\" /tmp/spmix_appdir_* 2>/dev/null; true", pids);
    for (char *p = cmd; *p; p++) if (*p == '\n') *p = ' ';
    assert_int_equal(test_run(cmd, &out), 0);
    if (out[0]) fail_msg("after down, still there:\n%s", out);
    free(out);
    assert_int_equal(test_run(SLURM " status", &out), 0);
    assert_non_null(strstr(out, "no Slurm is up"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_srun_zero2),
        cmocka_unit_test(test_srun_zero3_four_ranks),
        cmocka_unit_test(test_salloc_mpirun),
        cmocka_unit_test(test_srun_passes_exit_status),
        cmocka_unit_test(test_second_up_refused),
        cmocka_unit_test(test_down_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
