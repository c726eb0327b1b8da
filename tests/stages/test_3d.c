// test_3d.c: stage 07, 3d_parallel, run as a program under mpirun (up to 8
// ranks, oversubscribed): the grids (tp, pp, dp) = (2,1,1), (1,2,1),
// (1,4,1), (2,2,1), (1,2,2), (2,2,2) against dp_baseline at the same global
// batch on tiny (4 layers, so that 4 stages fit) and small; 1F1B and AFAB
// to the bit; per-rank model-state bytes, activation bytes and micro-batches
// in flight, and bytes per group against the formulas; resume on the same
// grid, refusal of another global batch (other grids and stages:
// test_reshard_grid.c); the refusals of bad grids. Run from the repository
// root after `make GPU=0`; files go under one mkdtemp folder.
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048
#define STEPS 8
#define NGRIDS 6
#define NGROUPS 4

static const char *const MODEL[2] = {"--model tiny --layers 4", "--model small"};
static const char *const MODEL_NAME[2] = {"tiny", "small"};
// seq, vocab, layers, heads, channels of the two models (common/model/gpt_layout.c's presets)
static const int SHAPE[2][5] = {{32, 256, 4, 2, 32}, {64, 256, 4, 4, 128}};
static const int GRID[NGRIDS][3] = {{2, 1, 1}, {1, 2, 1}, {1, 4, 1}, {2, 2, 1}, {1, 2, 2}, {2, 2, 2}};
static const char *const GROUP[NGROUPS] = {"tp", "pp", "emb", "dp"};
// Global batch of every run: 8 sequences of B = 2, as m = 4 micro-batches
// on one replica (dp_baseline at 1 rank, dp 1) or 2 on each of 2 replicas.
#define BATCH 2
#define GLOBAL 8

typedef struct Ctx {
    char root[64];
    char *base[2];           // dp_baseline per model
    char *grid[2][NGRIDS];   // 1F1B per model and grid
} Ctx;

static int micro_batches(int dp) { return GLOBAL / (BATCH * dp); }

static char *run(Ctx *c, const char *tag, int ranks, const char *binary, const char *flags) {
    char cmd[CMD_LEN], json[PATH_LEN];
    snprintf(json, sizeof json, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, "mpirun -np %d ./%s %s --steps %d --eval-batches 1 --quiet --json %s", ranks, binary,
             flags, STEPS, json);
    return train(cmd, json);
}

// Model m on grid g with `micro` micro-batches per step (0: the global batch's).
static char *grid_run(Ctx *c, int m, int g, const char *schedule, int micro, const char *extra) {
    char tag[128], flags[512];
    const int *G = GRID[g];
    micro = micro ? micro : micro_batches(G[2]);
    snprintf(tag, sizeof tag, "%s-%d%d%d-%s-m%d%s", MODEL_NAME[m], G[0], G[1], G[2], schedule, micro,
             extra[0] ? "-x" : "");
    snprintf(flags, sizeof flags, "%s --tp %d --pp %d --batch %d --grad-accum %d --schedule %s %s", MODEL[m], G[0],
             G[1], BATCH, micro, schedule, extra);
    return run(c, tag, G[0] * G[1] * G[2], "3d_parallel", flags);
}

static const char *baseline(Ctx *c, int m) {
    if (!c->base[m]) {
        char flags[256];
        snprintf(flags, sizeof flags, "%s --batch %d --grad-accum %d", MODEL[m], BATCH, micro_batches(1));
        c->base[m] = run(c, MODEL_NAME[m], 1, "dp_baseline", flags);
    }
    return c->base[m];
}

static const char *main_run(Ctx *c, int m, int g) {
    if (!c->grid[m][g]) c->grid[m][g] = grid_run(c, m, g, "1f1b", 0, "");
    return c->grid[m][g];
}

// ---- 1. losses ----

static void test_losses_match_baseline(void **state) {
    Ctx *c = *state;
    for (int m = 0; m < 2; m++)
        for (int g = 0; g < NGRIDS; g++) {
            const char *base = baseline(c, m), *json = main_run(c, m, g);
            double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0};
            losses_of(base, a, STEPS);
            losses_of(json, b, STEPS);
            double first = fabs(a[0] - b[0]);
            double loss = steps_max_diff(base, json, "losses", STEPS, 0);
            double norm = steps_max_diff(base, json, "grad_norms", STEPS, 1);
            // The validation covers the same held-out rows whatever the split
            // of the global batch (--eval-batches counts global batches), so
            // it differs from dp_baseline's no more than the last loss does.
            double val = fabs(number_of(base, "val_loss") - number_of(json, "val_loss"));
            // The first loss comes before any update: tensor parallelism adds
            // the row-parallel partial sums (fp32 activations on the cpu
            // device, bf16 on cuda) in another order: measured <= 1e-8 (the
            // record's 9 digits), held to 1e-6. Over 8 steps, tp alone:
            // measured <= 4.2e-7 (losses) and 6.4e-6 (gradient norms,
            // relative), held to 1e-5 and 1e-4. A pipeline rounds the tied
            // wte's gradient to bf16 on two stages and then sums them, where
            // dp_baseline rounds the sum once; dp 2 sums the replicas' bf16
            // gradients in another grouping: measured 3e-5 to 7.5e-5 (losses)
            // and 2.8e-4 to 9.4e-4 (norms), like zero1 at 4 ranks (test_zero
            // holds that to 1e-3). Held to 1e-3 and 3e-3: the tied gradient
            // left unsummed moves the loss by 0.1 within 8 steps, a
            // replicated gradient counted twice in the norm by 0.097.
            int tp_only = GRID[g][1] == 1 && GRID[g][2] == 1;
            double loss_tol = tp_only ? 1e-5 : 1e-3, norm_tol = tp_only ? 1e-4 : 3e-3;
            if (first > 1e-6 || loss > loss_tol || norm > norm_tol || val > loss_tol)
                fail_msg("%s grid (%d,%d,%d) against dp_baseline: first loss |diff| %.3g (> 1e-6?), max |loss diff| "
                         "%.3g (> %g?), max relative norm diff %.3g (> %g?), val loss |diff| %.3g (> %g?)",
                         MODEL_NAME[m], GRID[g][0], GRID[g][1], GRID[g][2], first, loss, loss_tol, norm, norm_tol, val,
                         loss_tol);
            print_message("%s (%d,%d,%d): max |loss - dp_baseline's| %.3g (first %.3g), norm %.3g relative, val %.3g\n",
                          MODEL_NAME[m], GRID[g][0], GRID[g][1], GRID[g][2], loss, first, norm, val);
        }
}

// Issue 28, item 3: --init-from with tp or pp above 1 loaded the whole
// model's first elements into each rank's part (first loss 5.54 where
// dp_baseline gives 4.78), and --export-llmc wrote one rank's part as the
// model. A checkpoint trained by dp_baseline (another seed, so it is not the
// runs' own initial weights) is loaded at every grid: the first loss is
// dp_baseline's from the same file, and with a learning rate too small to
// move an fp32 weight (1e-30) the export gathered over tp, pp and dp is the
// loaded file, byte for byte.
static void test_llmc_import_export_every_grid(void **state) {
    Ctx *c = *state;
    char x[PATH_LEN], cmd[CMD_LEN], flags[CMD_LEN], tag[64];
    snprintf(x, sizeof x, "%s/trained.bin", c->root);
    snprintf(cmd, sizeof cmd, "./dp_baseline %s --steps 2 --seed 7 --quiet --export-llmc %s", MODEL[0], x);
    assert_int_equal(test_run(cmd, NULL), 0);
    snprintf(flags, sizeof flags, "--init-from %s --batch %d --grad-accum %d --lr 1e-30", x, BATCH, micro_batches(1));
    char *base = run(c, "llmc-base", 1, "dp_baseline", flags);
    double want[RUN_MAX_STEPS] = {0};
    losses_of(base, want, STEPS);
    for (int g = 0; g < NGRIDS; g++) {
        const int *G = GRID[g];
        char y[PATH_LEN];
        snprintf(y, sizeof y, "%s/export-%d%d%d.bin", c->root, G[0], G[1], G[2]);
        snprintf(flags, sizeof flags, "--init-from %s --tp %d --pp %d --batch %d --grad-accum %d --lr 1e-30 "
                 "--export-llmc %s", x, G[0], G[1], BATCH, micro_batches(G[2]), y);
        snprintf(tag, sizeof tag, "llmc-%d%d%d", G[0], G[1], G[2]);
        char *json = run(c, tag, G[0] * G[1] * G[2], "3d_parallel", flags);
        double got[RUN_MAX_STEPS] = {0};
        losses_of(json, got, STEPS);
        if (fabs(got[0] - want[0]) > 1e-6)  // as test_losses_match_baseline's first loss
            fail_msg("grid (%d,%d,%d) from %s: first loss %.9g, dp_baseline's %.9g", G[0], G[1], G[2], x, got[0],
                     want[0]);
        snprintf(cmd, sizeof cmd, "cmp %s %s", x, y);
        char *out = NULL;
        if (test_run(cmd, &out) != 0) fail_msg("grid (%d,%d,%d): the export is not the loaded model: %s", G[0], G[1],
                                               G[2], out);
        free(out);
        free(json);
    }
    free(base);
}

// 1F1B and AFAB run the same micro-batches through the same units and the
// backwards in the same order: the same bits.
static void test_schedules_same_bits(void **state) {
    Ctx *c = *state;
    const int cases[2][2] = {{1, 5}, {0, 2}};  // small (2,2,2), tiny (1,4,1)
    for (int k = 0; k < 2; k++) {
        int m = cases[k][0], g = cases[k][1];
        double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0};
        char *afab = grid_run(c, m, g, "afab", 0, "");
        losses_of(main_run(c, m, g), a, STEPS);
        losses_of(afab, b, STEPS);
        if (memcmp(a, b, sizeof(double) * STEPS))
            fail_msg("%s (%d,%d,%d): 1f1b and afab losses differ (step 1: %.9g, %.9g)", MODEL_NAME[m], GRID[g][0],
                     GRID[g][1], GRID[g][2], a[0], b[0]);
        free(afab);
    }
}

// ---- 2. memory ----

// Ψ_s of one tp rank of stage s, from the shapes: a block holds 12C²/T
// weights, 7C/T + 2C biases and 4C of layernorms; stage 0 wte (V padded to
// 64·T when T > 1, over T) and wpe; the last stage the final layernorm and,
// in a pipeline, a copy of wte.
static double stage_params(int m, int T, int P, int s) {
    double S = SHAPE[m][0], V = SHAPE[m][1], C = SHAPE[m][4];
    int L = SHAPE[m][2];
    double vpad = T == 1 ? V : ceil(V / (64.0 * T)) * 64 * T, wte = vpad * C / T;
    double psi = (L / P + (s < L % P)) * (12 * C * C / T + 7 * C / T + 6 * C);
    if (s == 0) psi += wte + S * C;
    if (s == P - 1) psi += 2 * C + (P > 1 ? wte : 0);
    return psi;
}

static void test_state_bytes(void **state) {
    Ctx *c = *state;
    for (int m = 0; m < 2; m++)
        for (int g = 0; g < NGRIDS; g++) {
            const char *json = main_run(c, m, g);
            int T = GRID[g][0], P = GRID[g][1], D = GRID[g][2];
            for (int r = 0; r < T * P * D; r++) {
                const char *x = grid_rank_of(json, r);
                int s = (int)number_of(x, "stage");
                double psi = stage_params(m, T, P, s), pad = ceil(psi / (64.0 * D)) * 64 * D;
                double want = 4 * pad + 12 * pad / D;  // ZeRO-1 over the replicas: bf16 params and grads, fp32 shards
                double got = number_of(x, "states"), formula = number_of(x, "states_formula");
                if (number_of(x, "params") != psi || got != want || formula != want)
                    fail_msg("%s (%d,%d,%d) rank %d stage %d: Ψ_s %.0f (want %.0f), states %.0f B, the record's "
                             "formula %.0f B, 4Ψ_pad + 12Ψ_pad/D = %.0f B", MODEL_NAME[m], T, P, D, r, s,
                             number_of(x, "params"), psi, got, formula, want);
            }
        }
}

// Activation bytes per rank: the slots the schedule keeps, each one
// micro-batch through the stage, allocated once. Stage s of P keeps
// min(P - s, m) under 1F1B and m under AFAB, and the schedule's own count of
// micro-batches in flight reaches exactly that.
static void check_in_flight(const char *json, const char *what, int T, int P, int D, int m, int afab) {
    for (int r = 0; r < T * P * D; r++) {
        const char *x = grid_rank_of(json, r);
        int s = (int)number_of(x, "stage"), want = afab ? m : (P - s < m ? P - s : m);
        if (number_of(x, "slots") != want || number_of(x, "peak_in_flight") != want ||
            number_of(x, "activations") != number_of(x, "activations_formula"))
            fail_msg("%s rank %d stage %d: slots %.0f, peak in flight %.0f (want %d); activations %.0f B, formula "
                     "%.0f B", what, r, s, number_of(x, "slots"), number_of(x, "peak_in_flight"), want,
                     number_of(x, "activations"), number_of(x, "activations_formula"));
    }
}

static void test_activations_in_flight(void **state) {
    Ctx *c = *state;
    for (int m = 0; m < 2; m++)
        for (int g = 0; g < NGRIDS; g++)
            check_in_flight(main_run(c, m, g), "1f1b", GRID[g][0], GRID[g][1], GRID[g][2], micro_batches(GRID[g][2]),
                            0);
    // 4 stages over 8 micro-batches: 1F1B keeps 4, 3, 2, 1, AFAB 8 on every
    // stage. The difference is whole micro-batches: stages 1 and 2 hold one
    // block each, so their bytes per micro-batch are the same.
    char *one = grid_run(c, 0, 2, "1f1b", 8, ""), *all = grid_run(c, 0, 2, "afab", 8, "");
    check_in_flight(one, "tiny (1,4,1) m=8 1f1b", 1, 4, 1, 8, 0);
    check_in_flight(all, "tiny (1,4,1) m=8 afab", 1, 4, 1, 8, 1);
    double per_micro[4];
    for (int s = 0; s < 4; s++)  // rank s is stage s on a 1 x 4 x 1 grid
        per_micro[s] = (number_of(grid_rank_of(all, s), "activations") -
                        number_of(grid_rank_of(one, s), "activations")) /
                       (8 - (4 - s));
    if (!(per_micro[1] > 0 && per_micro[1] == per_micro[2]))
        fail_msg("bytes per micro-batch of stages 1 and 2: %.0f, %.0f", per_micro[1], per_micro[2]);
    free(one);
    free(all);
}

// ---- 3. communication ----

static void test_comm_by_group(void **state) {
    Ctx *c = *state;
    for (int m = 0; m < 2; m++)
        for (int g = 0; g < NGRIDS; g++) {
            const char *json = main_run(c, m, g);
            int T = GRID[g][0], P = GRID[g][1], D = GRID[g][2];
            for (int r = 0; r < T * P * D; r++)
                for (int k = 0; k < NGROUPS; k++) {
                    double v[2] = {0, 0};
                    if (json_numbers(grid_rank_of(json, r), GROUP[k], v, 2) != 2)
                        fail_msg("no comm.%s of rank %d", GROUP[k], r);
                    // counted and formula printed with 3 decimals of a byte
                    if (fabs(v[0] - v[1]) > 1e-3)
                        fail_msg("%s (%d,%d,%d) rank %d %s: %.3f B counted per step, formula %.3f B", MODEL_NAME[m], T,
                                 P, D, r, GROUP[k], v[0], v[1]);
                    if (k == 0 && T == 1 && v[0] != 0) fail_msg("tp bytes without tensor parallelism");
                }
            double got = number_of(json, "comm_bytes_per_step"), want = number_of(json, "comm_formula_bytes_per_step");
            if (fabs(got - want) > 1) fail_msg("%s (%d,%d,%d): %.0f B per step, formula %.0f", MODEL_NAME[m], T, P, D,
                                               got, want);
        }
}

// ---- 4. checkpoints ----

static void test_resume_same_grid(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], flags[1024], cmd[CMD_LEN];
    snprintf(dir, sizeof dir, "%s/ckpt", c->root);
    snprintf(flags, sizeof flags, "--save %s --save-every 4", dir);
    char *full = grid_run(c, 0, 5, "1f1b", 0, flags);
    snprintf(flags, sizeof flags, "--resume %s/step-00000004", dir);
    char *resumed = grid_run(c, 0, 5, "afab", 0, flags);  // the schedule may change: the math is the same
    double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0};
    losses_of(full, a, STEPS);
    assert_int_equal((int)number_of(resumed, "first_step"), 4);
    losses_of(resumed, b, STEPS - 4);
    for (int i = 0; i < STEPS - 4; i++)
        if (a[4 + i] != b[i]) fail_msg("step %d: resumed %.9g, uninterrupted %.9g", 5 + i, b[i], a[4 + i]);
    // Another grid or stage reshards it (test_reshard_grid.c) at the same
    // global batch only: 2 rows x 2 replicas x 2 micro-batches here
    snprintf(cmd, sizeof cmd, "mpirun -np 8 ./3d_parallel %s --pp 2 --batch 1 --grad-accum 1 --steps %d --quiet "
             "--resume %s", MODEL[0], STEPS, dir);
    free(expect_refusal(cmd, "global batch of 8 rows of 32 tokens (batch 2 x 2 replicas x grad_accum 2); this run's "
                        "is 4 of 32"));
    snprintf(cmd, sizeof cmd, "mpirun -np 8 ./zero1 %s --batch 2 --steps %d --quiet --resume %s", MODEL[0], STEPS, dir);
    free(expect_refusal(cmd, "this run's is 16 of 32"));
    free(full);
    free(resumed);
}

// ---- 5. refusals ----

static void test_refusals(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"mpirun -np 6 ./3d_parallel --model tiny --tp 2 --pp 2 --steps 1",
         "6 ranks do not divide into --tp 2 x --pp 2"},
        {"mpirun -np 3 ./3d_parallel --model tiny --tp 3 --steps 1", "--tp 3 does not divide the 2 heads"},
        {"mpirun -np 4 ./3d_parallel --model tiny --pp 4 --steps 1", "--pp 4 stages for 2 layers"},
        {"mpirun -np 2 ./3d_parallel --model tiny --tp 0 --steps 1", "--tp 0 is out of range: give 1 <= T <= "},
        {"mpirun -np 2 ./3d_parallel --model tiny --pp 2 --schedule gpipe --steps 1", "--schedule gpipe: choose"},
        {"mpirun -np 4 ./3d_parallel --model tiny --pp 2 --global-batch 6 --steps 1", "data-parallel replicas"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) free(expect_refusal(cases[i][0], cases[i][1]));
}

static int setup(void **state) {
    Ctx *c = calloc(1, sizeof *c);
    if (test_make_dir(c->root, sizeof c->root, "3d")) return -1;
    *state = c;
    return 0;
}

static int teardown(void **state) {
    Ctx *c = *state;
    for (int m = 0; m < 2; m++) {
        free(c->base[m]);
        for (int g = 0; g < NGRIDS; g++) free(c->grid[m][g]);
    }
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_losses_match_baseline),
        cmocka_unit_test(test_schedules_same_bits),
        cmocka_unit_test(test_state_bytes),
        cmocka_unit_test(test_activations_in_flight),
        cmocka_unit_test(test_comm_by_group),
        cmocka_unit_test(test_resume_same_grid),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_llmc_import_export_every_grid),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
