// test_reshard_grid.c: checkpoints across 3d_parallel grids and the
// data-parallel stages (issue 26, "any 07 grid"). zero2 at 4 ranks trains 8
// steps uninterrupted; checkpoints of step 4 (zero2's, 3d_parallel's at tp
// 2 x pp 2, infinity's, ckpt_tool's universal file) resume steps 5-8 under
// 3d_parallel at other grids and under zero3, dp_baseline, zero1 and
// infinity. Every run has the global batch of 8 rows of the tiny model
// (its vocabulary padded under tp).
// Tolerance: test_3d.c's for a pipeline grid against dp_baseline (|loss
// diff| <= 1e-3 over the steps, the first loss <= 1e-6: the same weights
// through another order of sums), against the run that saved, and 1e-3
// against zero2's. ckpt_tool exports a grid checkpoint as
// the run's own --export-llmc, byte for byte, and consolidates a 124 MB
// grid checkpoint in bounded memory. Run from the repository root after
// make; files go under one mkdtemp folder.
#include <sys/stat.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 4096
#define STEPS 8
#define SAVED 4
// a vocabulary of 300: wte is stored as 384 rows (192 a rank under tp 2),
// the last 84 padding, zero in every stage's checkpoint
#define MODEL "--model tiny --vocab 300"
#define LOSS_TOL 1e-3   // test_3d.c: a pipeline grid against dp_baseline over 8 steps
#define FIRST_TOL 1e-6  // test_3d.c: the first loss

typedef struct Ctx {
    char root[64];
    double full[RUN_MAX_STEPS];       // zero2 at 4 ranks, steps 1-8
    double grid_full[RUN_MAX_STEPS];  // 3d_parallel at tp 2 x pp 2, steps 1-8
    int have_full, have_grid_full, have_dp_ckpt, have_grid_ckpt;
} Ctx;

static const double *uninterrupted(Ctx *c) {
    if (!c->have_full) {
        char cmd[CMD_LEN], json[PATH_LEN];
        snprintf(json, sizeof json, "%s/full.json", c->root);
        snprintf(cmd, sizeof cmd, "mpirun -np 4 ./zero2 %s --batch 2 --steps %d --quiet --json %s", MODEL, STEPS, json);
        char *rec = train(cmd, json);
        losses_of(rec, c->full, STEPS);
        free(rec);
        c->have_full = 1;
    }
    return c->full;
}

// What the grid's checkpoint continues: its own run uninterrupted, whose
// rounding (tp and pp sum in another order) the weights of step 4 carry.
static const double *grid_uninterrupted(Ctx *c) {
    if (!c->have_grid_full) {
        char cmd[CMD_LEN], json[PATH_LEN];
        snprintf(json, sizeof json, "%s/grid-full.json", c->root);
        snprintf(cmd, sizeof cmd, "mpirun -np 4 ./3d_parallel %s --tp 2 --pp 2 --batch 2 --grad-accum 4 --steps %d "
                 "--quiet --json %s", MODEL, STEPS, json);
        char *rec = train(cmd, json);
        losses_of(rec, c->grid_full, STEPS);
        free(rec);
        c->have_grid_full = 1;
    }
    return c->grid_full;
}

// zero2's checkpoint of step 4 at 4 ranks (the schedule spans 8 steps, as the uninterrupted run's)
static const char *dp_ckpt(Ctx *c, char *dir) {
    snprintf(dir, PATH_LEN, "%s/zero2-ck", c->root);
    if (!c->have_dp_ckpt) {
        char cmd[CMD_LEN];
        snprintf(cmd, sizeof cmd, "mpirun -np 4 ./zero2 %s --batch 2 --steps %d --schedule-steps %d --quiet --save %s",
                 MODEL, SAVED, STEPS, dir);
        run_ok(cmd, NULL);
        c->have_dp_ckpt = 1;
    }
    return dir;
}

// 3d_parallel's at tp 2 x pp 2 x dp 1 (4 micro-batches of 2), with its --export-llmc beside it
static const char *grid_ckpt(Ctx *c, char *dir) {
    snprintf(dir, PATH_LEN, "%s/grid-ck", c->root);
    if (!c->have_grid_ckpt) {
        char cmd[CMD_LEN];
        snprintf(cmd, sizeof cmd, "mpirun -np 4 ./3d_parallel %s --tp 2 --pp 2 --batch 2 --grad-accum 4 --steps %d "
                 "--schedule-steps %d --quiet --save %s --export-llmc %s/grid-export.bin", MODEL, SAVED, STEPS, dir,
                 c->root);
        run_ok(cmd, NULL);
        c->have_grid_ckpt = 1;
    }
    return dir;
}

// Steps 5-8 of `binary` at `ranks` with `flags` from `ckpt`: within the
// tolerance of `full`, the run the checkpoint's weights come from
// uninterrupted, and of zero2's; what it printed, when `said` is given,
// holds that line. Returns what it printed and its record's params (*psi).
static char *resumes(Ctx *c, const double *full, const char *tag, int ranks, const char *binary, const char *flags,
                    const char *ckpt, const char *said, double *psi) {
    const double *zero2 = uninterrupted(c);
    char cmd[CMD_LEN], json[PATH_LEN], *out = NULL;
    snprintf(json, sizeof json, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, "mpirun -np %d ./%s %s %s --steps %d --resume %s --quiet --json %s", ranks, binary, MODEL,
             flags, STEPS, ckpt, json);
    char *rec = train_output(cmd, json, &out);
    if (said && !strstr(out, said)) fail_msg("%s: no line \"%s\":\n%s", cmd, said, out);
    double r[RUN_MAX_STEPS];
    losses_of(rec, r, STEPS - SAVED);
    assert_int_equal((int)number_of(rec, "first_step"), SAVED);
    for (int i = 0; i < STEPS - SAVED; i++) {
        double d = fabs(r[i] - full[SAVED + i]), tol = i == 0 ? FIRST_TOL : LOSS_TOL;
        if (!(d <= tol))
            fail_msg("%s, step %d: resumed %.9g, uninterrupted %.9g (|diff| %.3g > %g)", tag, SAVED + 1 + i, r[i],
                     full[SAVED + i], d, tol);
        if (!(fabs(r[i] - zero2[SAVED + i]) <= LOSS_TOL))
            fail_msg("%s, step %d: resumed %.9g, zero2 uninterrupted %.9g (> %g)", tag, SAVED + 1 + i, r[i],
                     zero2[SAVED + i], LOSS_TOL);
    }
    if (psi) *psi = number_of(rec, "params");
    free(rec);
    return out;
}

static void consolidate(const char *ckpt, const char *out) {
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "./ckpt_tool consolidate %s %s", ckpt, out);
    run_ok(cmd, NULL);
}

// 1. A data-parallel stage's checkpoint, and the universal file, at a grid.
static void test_dp_into_grid(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], u[PATH_LEN];
    dp_ckpt(c, ck);
    free(resumes(c, uninterrupted(c), "zero2-to-tp2pp2", 4, "3d_parallel", "--tp 2 --pp 2 --batch 2 --grad-accum 4", ck,
                 "resharded: zero2's checkpoint of 4 ranks into 3d_parallel's layout at 4 (tp 2 x pp 2 x dp 1)", NULL));
    snprintf(u, sizeof u, "%s/zero2-universal", c->root);
    consolidate(ck, u);
    free(resumes(c, uninterrupted(c), "universal-to-tp2pp2dp2", 8, "3d_parallel",
                 "--tp 2 --pp 2 --batch 2 --grad-accum 2", u,
                 "resharded: dp_baseline's checkpoint of 1 ranks into 3d_parallel's layout at 8 (tp 2 x pp 2 x dp 2)",
                 NULL));
}

// infinity's checkpoint (its states on NVMe when it saved) at a grid,
// against infinity's own run uninterrupted.
static void test_infinity_into_grid(void **state) {
    Ctx *c = *state;
    char nvme[PATH_LEN], ck[PATH_LEN], json[PATH_LEN], cmd[CMD_LEN];
    snprintf(nvme, sizeof nvme, "%s/nvme-save", c->root);
    mkdir(nvme, 0755);
    snprintf(ck, sizeof ck, "%s/infinity-ck", c->root);
    snprintf(json, sizeof json, "%s/infinity-full.json", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity %s --batch 4 --steps %d --nvme-path %s --quiet --json %s", MODEL,
             STEPS, nvme, json);
    char *rec = train(cmd, json);
    double full[RUN_MAX_STEPS];
    losses_of(rec, full, STEPS);
    free(rec);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity %s --batch 4 --steps %d --schedule-steps %d --nvme-path %s "
             "--quiet --save %s", MODEL, SAVED, STEPS, nvme, ck);
    run_ok(cmd, NULL);
    free(resumes(c, full, "infinity-to-tp2pp2", 4, "3d_parallel", "--tp 2 --pp 2 --batch 2 --grad-accum 4", ck,
                 "resharded: infinity's checkpoint of 2 ranks into 3d_parallel's layout at 4 (tp 2 x pp 2 x dp 1)",
                 NULL));
}

// 2. A grid's checkpoint under the data-parallel stages, directly and
// through ckpt_tool; its llm.c export is the run's own.
static void test_grid_into_dp(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], u[PATH_LEN], a[PATH_LEN], b[PATH_LEN], cmd[CMD_LEN], nvme[PATH_LEN], flags[CMD_LEN];
    grid_ckpt(c, ck);
    const char *from = "resharded: 3d_parallel's checkpoint of 4 ranks (tp 2 x pp 2 x dp 1) into ";
    char said[256];
    snprintf(said, sizeof said, "%szero3's layout at 2", from);
    free(resumes(c, grid_uninterrupted(c), "grid-to-zero3", 2, "zero3", "--batch 2 --grad-accum 2", ck, said, NULL));
    // the whole model once: a tensor two parts keep (a tp-replicated one, the tied wte) read from one
    double psi = 0, bytes = 0;
    char *out = resumes(c, grid_uninterrupted(c), "grid-to-dp1", 1, "dp_baseline", "--batch 8", ck, NULL, &psi);
    const char *read = strstr(out, "rank 0 read ");
    if (!read || sscanf(read, "rank 0 read %lf bytes", &bytes) != 1 || bytes != 3 * 4 * psi)
        fail_msg("dp_baseline's rank 0 should read master, m and v of all %.0f parameters once:\n%s", psi, out);
    free(out);
    snprintf(nvme, sizeof nvme, "%s/nvme", c->root);
    mkdir(nvme, 0755);  // infinity keeps its states there
    snprintf(flags, sizeof flags, "--batch 4 --nvme-path %s", nvme);
    free(resumes(c, grid_uninterrupted(c), "grid-to-infinity", 2, "infinity", flags, ck, NULL, NULL));
    snprintf(u, sizeof u, "%s/grid-universal", c->root);
    consolidate(ck, u);
    free(resumes(c, grid_uninterrupted(c), "grid-universal-to-zero1", 4, "zero1", "--batch 2", u, NULL, NULL));
    snprintf(a, sizeof a, "%s/grid-export.bin", c->root);
    snprintf(b, sizeof b, "%s/grid-tool.bin", c->root);
    snprintf(cmd, sizeof cmd, "./ckpt_tool export-llmc %s %s >/dev/null && cmp %s %s", ck, b, a, b);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "./ckpt_tool verify %s", ck);
    run_ok(cmd, NULL);
}

// 3. A grid's checkpoint at other grids: another tp, pp and dp.
static void test_grid_into_grid(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN];
    grid_ckpt(c, ck);
    free(resumes(c, grid_uninterrupted(c), "grid-to-tp1pp2dp2", 4, "3d_parallel", "--pp 2 --batch 2 --grad-accum 2", ck,
                 "into 3d_parallel's layout at 4 (tp 1 x pp 2 x dp 2)", NULL));
    free(resumes(c, grid_uninterrupted(c), "grid-to-tp2pp1dp4", 8, "3d_parallel", "--tp 2 --batch 2 --grad-accum 1", ck,
                 "into 3d_parallel's layout at 8 (tp 2 x pp 1 x dp 4)", NULL));
}

// A 10.8M-parameter model's grid checkpoint (124 MB of parts at tp 2 x pp
// 2): ckpt_tool consolidates and exports it streaming, as a data-parallel
// one (test_ckpt_tool.c's bound: within 16 MB of the tool's own start; the
// parts' maps are a few thousand runs each).
static void test_grid_memory_bounded(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], ck[PATH_LEN];
    snprintf(ck, sizeof ck, "%s/big-grid", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 4 ./3d_parallel --model small --d-model 384 --layers 6 --heads 6 --tp 2 "
             "--pp 2 --batch 1 --grad-accum 2 --steps 1 --quiet --save %s", ck);
    run_ok(cmd, NULL);
    char prefix[PATH_LEN + 8];
    snprintf(prefix, sizeof prefix, "%s/big-grid", c->root);
    expect_tool_streams(ck, prefix);
}

// What changes the math or the model is still refused, in one line.
static void test_refusals(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], dp[PATH_LEN], cmd[CMD_LEN];
    grid_ckpt(c, ck);
    dp_ckpt(c, dp);
    snprintf(cmd, sizeof cmd, "mpirun -np 4 ./3d_parallel %s --tp 2 --pp 2 --batch 2 --grad-accum 2 --steps %d "
             "--quiet --resume %s", MODEL, STEPS, dp);
    free(expect_refusal(cmd, "global batch of 8 rows of 32 tokens (batch 2 x 4 ranks x grad_accum 1); "
                        "this run's is 4"));
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero2 %s --batch 2 --steps %d --quiet --resume %s", MODEL, STEPS, ck);
    free(expect_refusal(cmd, "global batch of 8 rows of 32 tokens (batch 2 x 1 replicas x grad_accum 4); "
                        "this run's is 4"));
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./3d_parallel %s --layers 3 --pp 2 --batch 2 --grad-accum 4 --steps %d "
             "--quiet --resume %s", MODEL, STEPS, ck);
    free(expect_refusal(cmd, "model differs: num_layers is 2 there and 3 in this run"));
    // a grid line that does not add up to the parts: which part holds what is unknown
    snprintf(cmd, sizeof cmd, "cp -r %s %s/bad-grid && sed -i 's/^grid = .*/grid = tp 2 x pp 2 x dp 2/' "
             "%s/bad-grid/step-00000004/manifest.txt", ck, c->root, c->root);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero2 %s --batch 4 --steps %d --quiet --resume %s/bad-grid", MODEL,
             STEPS, c->root);
    free(expect_refusal(cmd, "grid line (tp 2 x pp 2 x dp 2) is damaged or does not match its 4 ranks"));
}

static int setup(void **state) {
    const char *const needs[] = {"./zero2", "./zero3", "./zero1", "./dp_baseline", "./infinity", "./3d_parallel",
                                 "./ckpt_tool", NULL};
    if (need_paths("test_reshard_grid", needs)) return -1;
    Ctx *c = calloc(1, sizeof *c);
    if (!c || test_make_dir(c->root, sizeof c->root, "reshard-grid")) return -1;
    *state = c;
    return 0;
}

static int teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dp_into_grid),
        cmocka_unit_test(test_infinity_into_grid),
        cmocka_unit_test(test_grid_into_dp),
        cmocka_unit_test(test_grid_into_grid),
        cmocka_unit_test(test_grid_memory_bounded),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
