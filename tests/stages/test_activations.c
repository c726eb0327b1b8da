// test_activations.c: the activation-memory techniques, run as programs
// under mpirun: --recompute selective and full against none,
// --offload-activations, 3d_parallel's --partition-activations and
// --sequence-parallel. Recomputation runs the forward's kernels again on
// the same inputs, so it must change nothing but memory and time: in every
// stage at 1, 2 and 4 ranks with gradient accumulation, and in 3d_parallel's
// grids, the losses, the gradient norms and the final fp32 weights (the
// exported llm.c file, byte for byte) equal those of --recompute none, and
// the activations and the recompute working set measured by the allocator
// equal their closed forms (act_math.c) in every run. With
// --offload-activations the blocks' inputs live in pinned host memory and
// come back for backward: the same bits again, the pinned bytes and the
// bytes each way per step by their formulas. Sequence parallelism splits the
// layernorms and the residual stream over the tp ranks: the losses stay
// those of tensor parallelism without it (within the tolerance stated at
// test_sequence_parallel), every rank's bytes and traffic equal the grid's
// formulas, and recomputation changes no bit of it. FlashAttention against
// the materialized attention: the (T,T) term gone, the losses kept.
#include <sys/stat.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048

static const char *const STAGES[] = {"dp_baseline", "zero1", "zero2", "zero3", "cpu_offload", "infinity"};
enum { NSTAGES = sizeof STAGES / sizeof STAGES[0], STEPS = 3 };
static const char *const MODES[] = {"selective", "full", "full --offload-activations"};
static const char *const MODE_NAMES[] = {"selective", "full", "offload"};  // in file names
enum { NMODES = sizeof MODES / sizeof MODES[0] };

// A run's figures: its record, and the bytes of its exported weights.
typedef struct Run {
    char *json;
    unsigned char *weights;
    long weights_bytes;
} Run;

static unsigned char *read_all(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*n);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

static double device_mem(const char *json, const char *cat, const char *which) {
    const char *device = strstr(json, "\"mem\":{\"device\":{");
    if (!device) fail_msg("no mem.device in the record");
    char obj[64];
    snprintf(obj, sizeof obj, "\"%s\":{", cat);
    const char *p = strstr(device, obj);
    if (!p) fail_msg("no mem.device.%s in the record", cat);
    return number_of(p, which);
}

static double act_formula_of(const char *json, const char *key) {
    const char *p = strstr(json, "\"mem_formula\":{");
    if (!p) fail_msg("no mem_formula in the record");
    p = strstr(p, "\"padding_params\"");  // activations follow the tiers
    if (!p) fail_msg("no padding_params in mem_formula");
    return number_of(p, key);
}

// The run, with its memory checked against the formulas. Its final weights:
// the exported llm.c file, or where the master weights live in files
// (infinity, which does not export) the checkpoint's master shards. One
// held-out batch: its loss is compared, and a forward-only pass keeps less
// than a training step, so more would only take time.
static Run run(const char *root, const char *binary, int ranks, const char *flags, const char *name) {
    char cmd[CMD_LEN], json[PATH_LEN], weights[PATH_LEN];
    int in_files = strcmp(binary, "infinity") == 0;
    snprintf(json, sizeof json, "%s/%s.json", root, name);
    snprintf(weights, sizeof weights, "%s/%s.%s", root, name, in_files ? "ckpt" : "bin");
    snprintf(cmd, sizeof cmd, "mpirun -np %d ./%s --model small --steps %d --eval-batches 1 --quiet %s --json %s %s %s", ranks,
             binary, STEPS, flags, json, in_files ? "--save" : "--export-llmc", weights);
    Run r = {.json = train(cmd, json)};
    if (in_files) {
        char step[PATH_LEN + 32];
        size_t n;
        snprintf(step, sizeof step, "%s/step-%08d", weights, STEPS);
        r.weights = (unsigned char *)ckpt_master(step, ranks, &n);
        r.weights_bytes = (long)(n * sizeof(float));
    } else {
        r.weights = read_all(weights, &r.weights_bytes);
    }
    double acts = device_mem(r.json, "activations", "peak"), working = device_mem(r.json, "act_working", "peak");
    double want_acts = act_formula_of(r.json, "activations"), want_working = act_formula_of(r.json, "act_working");
    if (acts != want_acts || working != want_working)
        fail_msg("%s: activations %.0f B and working set %.0f B measured; the formulas say %.0f and %.0f", cmd, acts,
                 working, want_acts, want_working);
    // offloaded checkpoints: pinned bytes, and what a step moves each way, by the formula
    const char *pinned = strstr(r.json, "\"pinned\":{");
    double host = pinned ? number_of(strstr(pinned, "\"activations\":{"), "peak") : NAN;
    double want_host = act_formula_of(r.json, "act_offloaded");
    const char *moved = strstr(r.json, "\"act_offload_bytes_per_step\":{");
    if (!moved) fail_msg("%s: no act_offload_bytes_per_step in the record", cmd);
    double down = number_of(moved, "to_host"), up = number_of(moved, "to_device"), each = number_of(moved, "formula");
    if (host != want_host || down != each || up != each)
        fail_msg("%s: pinned activations %.0f B (formula %.0f), %.0f B down and %.0f B back per step (formula %.0f "
                 "each way)", cmd, host, want_host, down, up, each);
    // a range of one block keeps its input on the device (3d_parallel --pp 4 on small)
    if (strstr(flags, "--offload-activations") && !strstr(flags, "--pp 4") && !(want_host > 0 && each > 0))
        fail_msg("%s: nothing was offloaded", cmd);
    return r;
}

static void run_free(Run *r) {
    free(r->json);
    free(r->weights);
}

// Losses and gradient norms as the record prints them, and the weights to the byte.
static void expect_same(const Run *got, const Run *want, const char *what) {
    double a[RUN_MAX_STEPS], b[RUN_MAX_STEPS];
    losses_of(got->json, a, STEPS);
    losses_of(want->json, b, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (a[i] != b[i]) fail_msg("%s: loss of step %d is %.9g, --recompute none's %.9g", what, i + 1, a[i], b[i]);
    assert_int_equal(json_numbers(got->json, "grad_norms", a, RUN_MAX_STEPS), STEPS);
    assert_int_equal(json_numbers(want->json, "grad_norms", b, RUN_MAX_STEPS), STEPS);
    for (int i = 0; i < STEPS; i++)
        if (a[i] != b[i]) fail_msg("%s: gradient norm of step %d is %.9g, none's %.9g", what, i + 1, a[i], b[i]);
    if (got->weights_bytes != want->weights_bytes || memcmp(got->weights, want->weights, (size_t)want->weights_bytes))
        fail_msg("%s: the final weights differ from --recompute none's", what);
}

// Every stage at `ranks` ranks, 2 micro-batches a step, against itself
// without recompute.
static void stages_at(void **state, int ranks) {
    RunDir *c = *state;
    char nvme[PATH_LEN], flags[PATH_LEN + 64], name[64], what[128];
    snprintf(nvme, sizeof nvme, "%s/nvme-%d", c->root, ranks);
    assert_int_equal(mkdir(nvme, 0700), 0);
    for (int s = 0; s < NSTAGES; s++) {
        int inf = strcmp(STAGES[s], "infinity") == 0;
        snprintf(flags, sizeof flags, "--batch 2 --grad-accum 2%s%s", inf ? " --nvme-path " : "", inf ? nvme : "");
        snprintf(name, sizeof name, "%s-none-%d", STAGES[s], ranks);
        Run ref = run(c->root, STAGES[s], ranks, flags, name);
        for (int m = 0; m < NMODES; m++) {
            char mode_flags[PATH_LEN + 128];
            snprintf(mode_flags, sizeof mode_flags, "%s --recompute %s", flags, MODES[m]);
            snprintf(name, sizeof name, "%s-%s-%d", STAGES[s], MODE_NAMES[m], ranks);
            Run r = run(c->root, STAGES[s], ranks, mode_flags, name);
            snprintf(what, sizeof what, "%s --recompute %s at %d rank%s", STAGES[s], MODES[m], ranks,
                     ranks == 1 ? "" : "s");
            expect_same(&r, &ref, what);
            run_free(&r);
        }
        run_free(&ref);
    }
}

static void test_stages_one_rank(void **state) { stages_at(state, 1); }
static void test_stages_two_ranks(void **state) { stages_at(state, 2); }
static void test_stages_four_ranks(void **state) { stages_at(state, 4); }

// Every rank's figures in a 3d_parallel record against the grid's formulas
// (grid_math.c, from the shapes): device activations, the working set, the
// checkpoints on the host, and the bytes of each group.
static void expect_grid_formulas(const char *json, int ranks, const char *what) {
    static const char *const PAIRS[][2] = {{"activations", "activations_formula"},
                                           {"act_working", "act_working_formula"},
                                           {"act_host", "act_host_formula"}};
    static const char *const GROUPS[] = {"tp", "pp", "emb", "dp"};
    for (int r = 0; r < ranks; r++) {
        char key[64];
        snprintf(key, sizeof key, "{\"rank\":%d,", r);
        const char *x = strstr(json, key);
        if (!x) fail_msg("%s: no rank %d in the record's grid", what, r);
        for (int i = 0; i < 3; i++)
            if (number_of(x, PAIRS[i][0]) != number_of(x, PAIRS[i][1]))
                fail_msg("%s rank %d: %s %.0f B, formula %.0f B", what, r, PAIRS[i][0], number_of(x, PAIRS[i][0]),
                         number_of(x, PAIRS[i][1]));
        for (int k = 0; k < 4; k++) {
            double v[2] = {0, 0};
            if (json_numbers(x, GROUPS[k], v, 2) != 2) fail_msg("%s rank %d: no comm.%s", what, r, GROUPS[k]);
            if (fabs(v[0] - v[1]) > 1e-3)
                fail_msg("%s rank %d %s: %.3f B counted per step, formula %.3f B", what, r, GROUPS[k], v[0], v[1]);
        }
    }
}

// 3d_parallel's grids at 4 ranks, 4 micro-batches in flight through the
// pipelines, against the same grid without recompute; with tensor
// parallelism also the checkpoints partitioned over the tp ranks (on the
// device and on the host).
static void test_3d_grids(void **state) {
    RunDir *c = *state;
    static const char *const GRIDS[] = {"--tp 2 --pp 2", "--tp 2", "--pp 2 --schedule afab", "--pp 4"};
    static const char *const TP_MODES[] = {"full --partition-activations",
                                           "full --partition-activations --offload-activations"};
    for (size_t k = 0; k < sizeof GRIDS / sizeof GRIDS[0]; k++) {
        char flags[PATH_LEN], name[64];
        snprintf(flags, sizeof flags, "%s --batch 2 --grad-accum 4", GRIDS[k]);
        snprintf(name, sizeof name, "3d-%zu-none", k);
        Run ref = run(c->root, "3d_parallel", 4, flags, name);
        int tp = strstr(GRIDS[k], "--tp") != NULL;
        for (int m = 0; m < NMODES + (tp ? 2 : 0); m++) {
            const char *mode = m < NMODES ? MODES[m] : TP_MODES[m - NMODES];
            snprintf(flags, sizeof flags, "%s --batch 2 --grad-accum 4 --recompute %s", GRIDS[k], mode);
            snprintf(name, sizeof name, "3d-%zu-%d", k, m);
            Run r = run(c->root, "3d_parallel", 4, flags, name);
            char what[160];
            snprintf(what, sizeof what, "3d_parallel %s --recompute %s", GRIDS[k], mode);
            expect_same(&r, &ref, what);
            expect_grid_formulas(r.json, 4, what);
            run_free(&r);
        }
        run_free(&ref);
    }
}

// The largest |a - b| of a record's array (relative to |a| when asked).
static double max_diff(const char *a, const char *b, const char *key, int relative) {
    double x[RUN_MAX_STEPS], y[RUN_MAX_STEPS], worst = 0;
    int n = json_numbers(a, key, x, RUN_MAX_STEPS);
    assert_int_equal(json_numbers(b, key, y, RUN_MAX_STEPS), n);
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(x[i] - y[i]) / (relative ? fabs(x[i]) : 1));
    return worst;
}

// Sequence parallelism at 4 ranks on three grids, against the same grid
// without it. The math is tensor parallelism's but for one grouping: each
// rank's layernorm weight gradients come from its rows of the tokens and
// are summed over the group (fp32), where without it every rank sums all
// rows. Measured: losses equal to the record's 9 digits or 1e-8 apart,
// gradient norms 4.2e-9 apart (relative); held to 1e-6 and 1e-5, where a
// layernorm gradient left unsummed moves the norm by 1e-2 at once. On the
// (tp 2, pp 2) grid the recompute modes leave every bit as it was.
static void test_sequence_parallel(void **state) {
    RunDir *c = *state;
    static const char *const GRIDS[] = {"--tp 2 --pp 2", "--tp 2", "--tp 4"};
    for (size_t k = 0; k < sizeof GRIDS / sizeof GRIDS[0]; k++) {
        char flags[PATH_LEN], name[64], what[160];
        snprintf(flags, sizeof flags, "%s --batch 2 --grad-accum 2", GRIDS[k]);
        snprintf(name, sizeof name, "sp-%zu-off", k);
        Run ref = run(c->root, "3d_parallel", 4, flags, name);
        snprintf(flags, sizeof flags, "%s --batch 2 --grad-accum 2 --sequence-parallel", GRIDS[k]);
        snprintf(name, sizeof name, "sp-%zu-on", k);
        Run sp = run(c->root, "3d_parallel", 4, flags, name);
        snprintf(what, sizeof what, "3d_parallel %s --sequence-parallel", GRIDS[k]);
        expect_grid_formulas(sp.json, 4, what);
        double loss = max_diff(ref.json, sp.json, "losses", 0), norm = max_diff(ref.json, sp.json, "grad_norms", 1);
        double val = fabs(number_of(ref.json, "val_loss") - number_of(sp.json, "val_loss"));
        if (loss > 1e-6 || val > 1e-6 || norm > 1e-5)
            fail_msg("%s against tensor parallelism alone: losses %.3g, validation %.3g, norms %.3g (relative) apart",
                     what, loss, val, norm);
        if (!(device_mem(sp.json, "activations", "peak") < device_mem(ref.json, "activations", "peak")))
            fail_msg("%s keeps no fewer activation bytes than without it", what);
        for (int m = 0; k == 0 && m < NMODES; m++) {
            snprintf(flags, sizeof flags, "%s --batch 2 --grad-accum 2 --sequence-parallel --recompute %s",
                     GRIDS[k], MODES[m]);
            snprintf(name, sizeof name, "sp-%zu-%d", k, m);
            Run r = run(c->root, "3d_parallel", 4, flags, name);
            snprintf(what, sizeof what, "3d_parallel %s --sequence-parallel --recompute %s", GRIDS[k], MODES[m]);
            expect_same(&r, &sp, what);
            expect_grid_formulas(r.json, 4, what);
            run_free(&r);
        }
        run_free(&ref);
        run_free(&sp);
    }
}

// FlashAttention (the default) keeps each attention row's log-sum-exp where
// the materialized attention keeps its (T,T) probabilities: the activations
// measured differ by exactly L x 4aB(T^2 - T) bytes, both equal to their
// formulas (run checks that), and the losses agree within fp32 rounding.
// Selective recompute has nothing to drop under flash: the same bytes as
// none, no working set, the same bits. And the materialized attention still
// gives every stage the same bits (zero3 against dp_baseline at 2 ranks).
static void test_flash_attention(void **state) {
    RunDir *c = *state;
    Run flash = run(c->root, "dp_baseline", 1, "--batch 2", "flash");
    Run mat = run(c->root, "dp_baseline", 1, "--batch 2 --attention materialized", "materialized");
    double L = number_of(flash.json, "layers"), a = number_of(flash.json, "heads");
    double B = number_of(flash.json, "batch"), T = number_of(flash.json, "seq_len");
    double saved = device_mem(mat.json, "activations", "peak") - device_mem(flash.json, "activations", "peak");
    if (saved != L * 4 * a * B * (T * T - T))
        fail_msg("flash keeps %.0f B less than the materialized attention; L 4aB(T^2 - T) = %.0f", saved,
                 L * 4 * a * B * (T * T - T));
    double lf[RUN_MAX_STEPS], lm[RUN_MAX_STEPS];
    losses_of(flash.json, lf, STEPS);
    losses_of(mat.json, lm, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (!test_close(lf[i], lm[i], 0, 1e-5))
            fail_msg("step %d: flash loss %.9g, materialized %.9g", i + 1, lf[i], lm[i]);
    Run sel = run(c->root, "dp_baseline", 1, "--batch 2 --recompute selective", "flash-selective");
    expect_same(&sel, &flash, "--recompute selective with flash attention");
    if (device_mem(sel.json, "activations", "peak") != device_mem(flash.json, "activations", "peak") ||
        device_mem(sel.json, "act_working", "peak") != 0)
        fail_msg("--recompute selective with flash attention should keep what none keeps, with no working set");
    Run z3 = run(c->root, "zero3", 2, "--attention materialized", "z3-materialized");
    Run dp = run(c->root, "dp_baseline", 2, "--attention materialized", "dp-materialized");
    double l3[RUN_MAX_STEPS], l1[RUN_MAX_STEPS];
    losses_of(z3.json, l3, STEPS);
    losses_of(dp.json, l1, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (l3[i] != l1[i]) fail_msg("--attention materialized, step %d: zero3 %.9g, dp_baseline %.9g", i + 1, l3[i], l1[i]);
    run_free(&flash), run_free(&mat), run_free(&sel), run_free(&z3), run_free(&dp);
}

static int setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", "./zero1", "./zero2", "./zero3", "./cpu_offload",
                                        "./infinity", "./3d_parallel", NULL};
    return run_dir_setup(state, "test_activations", needs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_one_rank),
        cmocka_unit_test(test_stages_two_ranks),
        cmocka_unit_test(test_stages_four_ranks),
        cmocka_unit_test(test_3d_grids),
        cmocka_unit_test(test_sequence_parallel),
        cmocka_unit_test(test_flash_attention),
    };
    return cmocka_run_group_tests(tests, setup, run_dir_teardown);
}
