// test_precision.c: --precision fp16 with DeepSpeed's loss scaling, on the cpu
// device, 2 ranks, model small:
//   - every stage gives dp_baseline's fp16 losses to the bit (as under bf16),
//     with an overflow injected at step 3 skipped by all of them, and fp16
//     really is what ran (its losses are not bf16's);
//   - the dynamic scaler: the scale each step used, against DeepSpeed's rule
//     worked by hand; a static scale; a skipped step leaves every rank's
//     states as they were; an overflow at the minimum scale ends the run;
//   - resume with the scaler mid-window reproduces the uninterrupted run;
//   - the tutorial zero2 + CPU offload config with an fp16 block runs fp16
//     with its values; flags of fp16's scaling in a bf16 run are refused;
//   - --grad-accum-dtype fp32: in every stage the accumulator's bytes equal
//     the formula (4 bytes per gradient element, on the gradients' tier), at
//     one micro-batch it changes no bit, and over 8 micro-batches it gives
//     the one-micro-batch gradient where bf16 accumulation does not.
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048

typedef struct Ctx {
    char root[64];
    char nvme[PATH_LEN];  // infinity's swap files, on a disk
} Ctx;

static char *run_json(const Ctx *c, const char *name, const char *cmd_fmt, const char *flags) {
    char json[PATH_LEN], cmd[2 * CMD_LEN];
    snprintf(json, sizeof json, "%s/%s.json", c->root, name);
    snprintf(cmd, sizeof cmd, cmd_fmt, flags);
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, " --quiet --json %s", json);
    return train(cmd, json);
}

// The numbers of a record's array `key` (at most RUN_MAX_STEPS); returns how many.
static int numbers(const char *json, const char *key, double *out) { return json_numbers(json, key, out, RUN_MAX_STEPS); }

static void test_stages_equal_under_fp16(void **state) {
    Ctx *c = *state;
    const char *common = "--model small --steps 8 --precision fp16 --inject-overflow 3";
    char flags[PATH_LEN + 128];
    snprintf(flags, sizeof flags, "%s", common);
    char *ref = run_json(c, "dp_baseline", "mpirun -np 2 ./dp_baseline %s", flags);
    double want[RUN_MAX_STEPS] = {0}, got[RUN_MAX_STEPS] = {0}, bf16[RUN_MAX_STEPS] = {0};
    losses_of(ref, want, 8);
    char *plain = run_json(c, "dp_baseline-bf16", "mpirun -np 2 ./dp_baseline %s",
                           "--model small --steps 8");
    losses_of(plain, bf16, 8);
    int differs = 0;
    for (int i = 0; i < 8; i++) differs |= bf16[i] != want[i];
    if (!differs) fail_msg("fp16 and bf16 runs gave the same losses: fp16 did not run");
    const char *stages[][2] = {{"zero1", ""}, {"zero2", ""}, {"zero3", "--prefetch 1"}, {"cpu_offload", ""},
                               {"infinity", "nvme"}, {"3d_parallel", ""}};
    for (size_t s = 0; s < sizeof stages / sizeof stages[0]; s++) {
        if (strcmp(stages[s][1], "nvme") == 0)
            snprintf(flags, sizeof flags, "%s --offload-params nvme --nvme-path %s", common, c->nvme);
        else snprintf(flags, sizeof flags, "%s %s", common, stages[s][1]);
        char fmt[64];
        snprintf(fmt, sizeof fmt, "mpirun -np 2 ./%s %%s", stages[s][0]);
        char *json = run_json(c, stages[s][0], fmt, flags);
        losses_of(json, got, 8);
        for (int i = 0; i < 8; i++)
            if (got[i] != want[i])
                fail_msg("%s fp16 step %d: loss %.9g, dp_baseline's %.9g", stages[s][0], i + 1, got[i], want[i]);
        double skipped[RUN_MAX_STEPS] = {0};
        if (numbers(json, "skipped_steps", skipped) != 1 || skipped[0] != 3)
            fail_msg("%s: the overflow at step 3 is not the one skipped step:\n%.400s", stages[s][0], json);
        free(json);
    }
    free(ref), free(plain);
}

// DeepSpeed's rule by hand, window 3 and hysteresis 2, overflows at steps 2
// and 3: step 2's uses up the tolerance, step 3's halves the scale; three
// clean steps (4, 5, 6) later it doubles: steps 1-3 ran at 2^16, 4-6 at 2^15,
// 7-9 at 2^16.
static void test_dynamic_schedule(void **state) {
    Ctx *c = *state;
    char *json = run_json(c, "schedule", "mpirun -np 2 ./zero2 %s",
                          "--model small --steps 9 --precision fp16 --loss-scale-window 3 --hysteresis 2 "
                          "--inject-overflow 2,3");
    double scales[RUN_MAX_STEPS] = {0}, skipped[RUN_MAX_STEPS] = {0};
    assert_int_equal(numbers(json, "loss_scales", scales), 9);
    const double want[9] = {65536, 65536, 65536, 32768, 32768, 32768, 65536, 65536, 65536};
    for (int i = 0; i < 9; i++)
        if (scales[i] != want[i]) fail_msg("step %d ran at scale %g; DeepSpeed's rule gives %g", i + 1, scales[i], want[i]);
    assert_int_equal(numbers(json, "skipped_steps", skipped), 2);
    assert_true(skipped[0] == 2 && skipped[1] == 3);
    assert_int_equal((int)number_of(json, "skipped_total"), 2);
    free(json);
    // a static scale never moves; its overflow is skipped all the same
    json = run_json(c, "static", "mpirun -np 2 ./zero2 %s",
                    "--model small --steps 4 --precision fp16 --loss-scale 1024 --inject-overflow 2");
    assert_int_equal(numbers(json, "loss_scales", scales), 4);
    for (int i = 0; i < 4; i++) assert_true(scales[i] == 1024);
    assert_int_equal(numbers(json, "skipped_steps", skipped), 1);
    assert_true(skipped[0] == 2);
    free(json);
}

// A skipped step changes no state on any rank: zero2's shards after 3 steps
// whose third overflowed equal those after 2 steps (same LR schedule).
static void test_skipped_step_changes_nothing(void **state) {
    Ctx *c = *state;
    char a[PATH_LEN], b[PATH_LEN], flags[CMD_LEN / 2];
    snprintf(a, sizeof a, "%s/skip3.ckpt", c->root);
    snprintf(b, sizeof b, "%s/two.ckpt", c->root);
    const char *common = "--model small --precision fp16 --schedule-steps 20";
    snprintf(flags, sizeof flags, "%s --steps 3 --inject-overflow 3 --save %s", common, a);
    free(run_json(c, "skip3", "mpirun -np 2 ./zero2 %s", flags));
    snprintf(flags, sizeof flags, "%s --steps 2 --save %s", common, b);
    free(run_json(c, "two", "mpirun -np 2 ./zero2 %s", flags));
    char da[PATH_LEN + 32], db[PATH_LEN + 32];
    snprintf(da, sizeof da, "%s/step-00000003", a);
    snprintf(db, sizeof db, "%s/step-00000002", b);
    size_t na, nb;
    float *wa = ckpt_master(da, 2, &na), *wb = ckpt_master(db, 2, &nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++)
        if (memcmp(&wa[i], &wb[i], sizeof(float)) != 0)
            fail_msg("master[%zu] after the skipped step 3 is %.9g, after step 2 %.9g: the skip updated it", i,
                     wa[i], wb[i]);
    free(wa), free(wb);
}

static void test_overflow_at_minimum_scale_stops(void **state) {
    char *out = NULL;
    const char *cmd = "mpirun -np 2 ./zero2 --model small --steps 4 --precision fp16 --initial-scale-power 0 "
                      "--hysteresis 1 --inject-overflow 2";
    int rc = test_run(cmd, &out);
    if (rc != 1 || !strstr(out, "minimum loss scale") || !strstr(out, "step 2"))
        fail_msg("%s: expected exit 1 naming step 2 and the minimum loss scale; got %d:\n%s", cmd, rc, out);
    free(out);
}

// Saved at step 5: the scale halved at step 3, two clean steps since, the
// tolerance not yet restored; the resumed run must double it at step 6 as
// the uninterrupted one does, and give its losses to the bit.
static void test_resume_mid_window(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], flags[CMD_LEN / 2];
    snprintf(dir, sizeof dir, "%s/window.ckpt", c->root);
    const char *common = "--model small --steps 9 --precision fp16 --loss-scale-window 3 --hysteresis 2";
    snprintf(flags, sizeof flags, "%s --inject-overflow 2,3 --save %s --save-every 5", common, dir);
    char *whole = run_json(c, "whole", "mpirun -np 2 ./zero2 %s", flags);
    snprintf(flags, sizeof flags, "%s --resume %s/step-00000005", common, dir);
    char *resumed = run_json(c, "resumed", "mpirun -np 2 ./zero2 %s", flags);
    double a[RUN_MAX_STEPS] = {0}, b[RUN_MAX_STEPS] = {0}, sa[RUN_MAX_STEPS] = {0}, sb[RUN_MAX_STEPS] = {0};
    losses_of(whole, a, 9);
    losses_of(resumed, b, 4);
    assert_int_equal(numbers(whole, "loss_scales", sa), 9);
    assert_int_equal(numbers(resumed, "loss_scales", sb), 4);
    for (int i = 0; i < 4; i++) {
        if (b[i] != a[5 + i]) fail_msg("step %d: resumed loss %.9g, uninterrupted %.9g", 6 + i, b[i], a[5 + i]);
        if (sb[i] != sa[5 + i]) fail_msg("step %d: resumed scale %g, uninterrupted %g", 6 + i, sb[i], sa[5 + i]);
    }
    assert_int_equal((int)number_of(resumed, "skipped_total"), 2);
    // the scaler travels through ckpt_tool's one-part checkpoint too
    char cmd[CMD_LEN], *out = NULL;
    snprintf(cmd, sizeof cmd, "./ckpt_tool info %s/step-00000005 && ./ckpt_tool consolidate %s/step-00000005 %s/uni",
             dir, dir, c->root);
    if (test_run(cmd, &out) != 0 || !strstr(out, "precision: fp16; loss scale 32768 at the save, 2 steps skipped"))
        fail_msg("%s:\n%s", cmd, out);
    free(out);
    snprintf(flags, sizeof flags, "%s --resume %s/uni", common, c->root);
    char *uni = run_json(c, "from-universal", "mpirun -np 2 ./zero2 %s", flags);
    assert_int_equal(numbers(uni, "loss_scales", sb), 4);
    losses_of(uni, b, 4);
    for (int i = 0; i < 4; i++)
        if (b[i] != a[5 + i] || sb[i] != sa[5 + i])
            fail_msg("step %d from the consolidated checkpoint: loss %.9g scale %g, uninterrupted %.9g %g", 6 + i, b[i],
                     sb[i], a[5 + i], sa[5 + i]);
    free(whole), free(resumed), free(uni);
}

static void test_tutorial_config(void **state) {
    Ctx *c = *state;
    char json[PATH_LEN], cmd[CMD_LEN], *out = NULL;
    snprintf(json, sizeof json, "%s/tutorial.json", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./cpu_offload --model small --steps 3 --verbose-config --json %s "
             "--deepspeed-config tests/ds_configs/zero2_offload_fp16.json", json);
    char *rec = train_output(cmd, json, &out);
    const char *want[] = {"--precision          fp16           config: fp16.enabled",
                          "--hysteresis         2              config: fp16.hysteresis",
                          "--loss-scale-window  1000           config: fp16.loss_scale_window",
                          "--min-loss-scale     1              config: fp16.min_loss_scale",
                          "| scale 65536 (skipped 0)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("%s: no \"%s\" in the output:\n%s", cmd, want[i], out);
    if (strstr(out, "optimizer.params.betas (") || strstr(out, "warmup_min_lr,") || strstr(out, "fp16.loss_scale ("))
        fail_msg("a key the workbench honours is listed as ignored:\n%s", out);
    assert_non_null(strstr(rec, "\"precision\":\"fp16\""));
    free(rec), free(out);
}

static void test_refusals(void **state) {
    free(expect_refusal("mpirun -np 2 ./zero2 --model small --steps 2 --loss-scale-window 3", "--precision fp16"));
    free(expect_refusal("mpirun -np 2 ./zero2 --model small --steps 2 --precision fp32", "bf16"));
    free(expect_refusal("mpirun -np 2 ./zero2 --model small --steps 2 --precision fp16 --inject-overflow 2,x",
                        "--inject-overflow"));
    free(expect_refusal("mpirun -np 2 ./zero2 --model small --steps 2 --precision fp16 --loss-scale 0.5",
                        "--min-loss-scale"));
}

// The fp32 accumulator of every stage, measured against the formula and
// against the gradients beside it (2 bytes per element there, 4 here).
static void test_accumulator_bytes(void **state) {
    Ctx *c = *state;
    const char *stages[][2] = {{"dp_baseline", "device"}, {"zero1", "device"}, {"zero2", "device"},
                               {"zero3", "device"}, {"cpu_offload", "pinned"}, {"infinity", "pinned"},
                               {"3d_parallel", "device"}};
    for (size_t s = 0; s < sizeof stages / sizeof stages[0]; s++) {
        char flags[PATH_LEN + 128], fmt[64], tier[64], formula[64];
        snprintf(flags, sizeof flags, "--model small --steps 2 --batch 1 --grad-accum 3 --grad-accum-dtype fp32%s%s",
                 strcmp(stages[s][0], "infinity") ? "" : " --nvme-path ", strcmp(stages[s][0], "infinity") ? "" : c->nvme);
        snprintf(fmt, sizeof fmt, "mpirun -np 2 ./%s %%s", stages[s][0]);
        char *json = run_json(c, stages[s][0], fmt, flags);
        snprintf(tier, sizeof tier, "\"mem\":{");
        const char *mem = strstr(json, tier);
        snprintf(formula, sizeof formula, "\"mem_formula\":{");
        const char *form = strstr(json, formula);
        assert_non_null(mem), assert_non_null(form);
        char at[64];
        snprintf(at, sizeof at, "\"%s\":{", stages[s][1]);
        const char *m = strstr(mem, at), *f = strstr(form, at);
        assert_non_null(m), assert_non_null(f);
        double acc = number_of(strstr(m, "\"grads_accum_fp32\":{"), "current");
        double grads = number_of(strstr(m, "\"grads_bf16\":{"), "current");
        double want = number_of(f, "grads_accum_fp32");
        if (!(acc > 0 && acc == want && acc == 2 * grads))
            fail_msg("%s: the %s accumulator holds %.0f bytes; formula %.0f, twice the grads' %.0f", stages[s][0],
                     stages[s][1], acc, want, 2 * grads);
        free(json);
    }
}

static void test_accumulator_at_one_micro_batch_changes_nothing(void **state) {
    Ctx *c = *state;
    char *a = run_json(c, "k1-bf16", "mpirun -np 2 ./zero2 %s", "--model small --steps 5");
    char *b = run_json(c, "k1-fp32", "mpirun -np 2 ./zero2 %s", "--model small --steps 5 --grad-accum-dtype fp32");
    double la[RUN_MAX_STEPS] = {0}, lb[RUN_MAX_STEPS] = {0};
    losses_of(a, la, 5);
    losses_of(b, lb, 5);
    for (int i = 0; i < 5; i++)
        if (la[i] != lb[i]) fail_msg("step %d: %.9g with the fp32 accumulator, %.9g without, at one micro-batch", i + 1,
                                    lb[i], la[i]);
    free(a), free(b);
}

// What fp32 accumulation buys, on one rank (no reduction between): after
// step 1 Adam's m is (1 - beta1) x the gradient, so it shows the gradient's
// bits. 8 micro-batches of 1 row summed in fp32 give the 8-row batch's
// gradient up to the order of fp32 sums (measured: 662 of 834,304 elements
// differ, L1 relative 2.2e-7); summed in bf16, rounded 7 times, they do not
// (every element differs, 2.7e-3).
static void test_fp32_accumulation_keeps_the_batch_gradient(void **state) {
    Ctx *c = *state;
    const char *runs[3] = {"--batch 8", "--batch 1 --grad-accum 8", "--batch 1 --grad-accum 8 --grad-accum-dtype fp32"};
    float *m[3];
    size_t n[3];
    for (int i = 0; i < 3; i++) {
        char dir[PATH_LEN], flags[CMD_LEN / 2], name[32], step[PATH_LEN + 32];
        snprintf(dir, sizeof dir, "%s/accum-%d.ckpt", c->root, i);
        snprintf(name, sizeof name, "accum-%d", i);
        snprintf(flags, sizeof flags, "--model small --steps 1 %s --save %s", runs[i], dir);
        free(run_json(c, name, "mpirun -np 1 ./dp_baseline %s", flags));
        snprintf(step, sizeof step, "%s/step-00000001", dir);
        m[i] = ckpt_tensor(step, 1, "adam_m", &n[i]);
    }
    assert_true(n[1] == n[0] && n[2] == n[0]);
    // the distance to the one-batch gradient, relative, in L1: sum |m_k - m_0| / sum |m_0|
    double dist[3] = {0}, norm = 0;
    for (size_t i = 0; i < n[0]; i++) norm += fabs(m[0][i]);
    for (int k = 1; k < 3; k++)
        for (size_t i = 0; i < n[0]; i++) dist[k] += fabs((double)m[k][i] - m[0][i]) / norm;
    print_message("relative L1 distance to one 8-row micro-batch's gradient: bf16 accumulation %.3g, fp32 %.3g\n",
                  dist[1], dist[2]);
    // fp32 sums the same terms as the one batch's GEMM, in another order: the
    // distance is fp32 rounding, whatever order the BLAS kernels add in
    // (K eps with K = 512 rows, eps = 2^-24: 3e-5 at worst). bf16 rounds
    // each micro-batch's sum to 8 bits of mantissa: about 2^-9 = 2e-3.
    if (!(dist[2] < 3e-5 && dist[1] > 1e-4 && dist[1] > 30 * dist[2]))
        fail_msg("fp32 accumulation should stay within fp32 rounding of the 8-row gradient (relative L1 under 3e-5: "
                 "%.3g) where bf16 does not (over 1e-4 and 30x fp32's: %.3g)", dist[2], dist[1]);
    for (int i = 0; i < 3; i++) free(m[i]);
}

static void test_grad_accum_dtype_config_and_refusals(void **state) {
    free(expect_refusal("mpirun -np 2 ./zero2 --model small --steps 2 --grad-accum-dtype fp16", "--precision bf16"));
    free(expect_refusal("mpirun -np 2 ./zero2 --model small --steps 2 --grad-accum-dtype fp64", "fp32"));
    Ctx *c = *state;
    char cfg[PATH_LEN];
    snprintf(cfg, sizeof cfg, "%s/accum.json", c->root);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"data_types\": {\"grad_accum_dtype\": \"fp32\"}, \"bf16\": {\"enabled\": true}}\n", f);
    fclose(f);
    char flags[CMD_LEN / 2];
    snprintf(flags, sizeof flags, "--model small --steps 2 --batch 1 --grad-accum 2 --deepspeed-config %s", cfg);
    char *json = run_json(c, "accum-config", "mpirun -np 2 ./zero2 %s", flags);
    const char *m = strstr(json, "\"grads_accum_fp32\":{");
    assert_non_null(m);
    assert_true(number_of(m, "current") > 0);
    free(json);
}

static int group_setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", "./zero1", "./zero2", "./zero3", "./cpu_offload",
                                        "./infinity", "./3d_parallel", "./ckpt_tool", NULL};
    if (need_paths("test_precision", needs)) return 1;
    Ctx *c = calloc(1, sizeof *c);
    if (make_disk_dir(c->nvme, sizeof c->nvme, "test-precision")) return 1;
    if (test_make_dir(c->root, sizeof c->root, "test-precision")) return 1;
    *state = c;
    return 0;
}

static int group_teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root) | test_remove_dir(c->nvme);
    free(c);
    return rc;
}

// Issue 49, item 22: an fp16 overflow's step line printed its norm as
// "-nan"; it prints "nan", unsigned, beside the OVERFLOW it is.
static void test_overflow_norm_unsigned(void **state) {
    (void)state;
    char *out = NULL;
    run_ok("./zero2 --model tiny --steps 3 --precision fp16 --inject-overflow 2", &out);
    if (strstr(out, "-nan") || !strstr(out, "| norm     nan | scale 65536 OVERFLOW, step skipped"))
        fail_msg("step 2's norm is not printed as nan:\n%s", out);
    free(out);
}

// Issue 49, item 22: --lr 1e-320 was accepted and trained with a rate of 0
// in fp32 (the step lines said lr 0.00e+00). A rate below FLT_MIN is
// refused; 1e-12, which the demo uses, still trains.
static void test_lr_below_fp32_refused(void **state) {
    (void)state;
    free(expect_refusal("./zero2 --model tiny --steps 2 --lr 1e-320", "is below 1.17549e-38, the smallest normal "
                        "fp32 number"));
    run_ok("./zero2 --model tiny --steps 1 --quiet --lr 1e-12", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_equal_under_fp16),
        cmocka_unit_test(test_dynamic_schedule),
        cmocka_unit_test(test_skipped_step_changes_nothing),
        cmocka_unit_test(test_overflow_at_minimum_scale_stops),
        cmocka_unit_test(test_resume_mid_window),
        cmocka_unit_test(test_tutorial_config),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_overflow_norm_unsigned),
        cmocka_unit_test(test_lr_below_fp32_refused),
        cmocka_unit_test(test_accumulator_bytes),
        cmocka_unit_test(test_accumulator_at_one_micro_batch_changes_nothing),
        cmocka_unit_test(test_fp32_accumulation_keeps_the_batch_gradient),
        cmocka_unit_test(test_grad_accum_dtype_config_and_refusals),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
