// test_zeropp.c: ZeRO++ in zero3 (04_zero3/zeropp.c) at 4 ranks on one
// host, run as programs under mpirun (test_cluster runs the same on two
// emulated hosts of 2 ranks):
//   - with every switch off zero3 is what it was: dp_baseline's losses to
//     the bit, the bytes and the device peak of before;
//   - hpZ alone (K 2 and 4, at prefetch 0 to 2, with gradient accumulation)
//     gives zero3's losses to the bit, its backward gathers stay in the host
//     (0 bytes across, from the counters), params_hpz holds 2Ψ_pad/K;
//   - every switch alone and together: each hop's bytes in the host and
//     across hosts, counted, equal the formulas of zeropp_math.c, and the
//     device peak equals what the budget counted before the run;
//   - qwZ, qgZ (int8, int4) and all three change the losses, but step 1's
//     gradient norm lies within 1% of zero3's, and after 60 steps the mean
//     of the last 10 losses and the validation loss within TOL_LOSS of
//     zero3's (make bench's zeropp section runs 200);
//   - an fp16 overflow still skips its step through qgZ's quantized sums;
//   - a resumed run of all three gives the whole run's bits (hpZ's copy is refilled);
//   - ds_config's keys set the switches (the same bits as the flags);
//   - bad combinations are refused in one line, exit 2;
//   - handout 04's ZeRO++ excerpt is what its commands print.
// Run from the repository root after make.
#include "runs.h"

#define CMD_LEN 2048
#define SHORT_STEPS 4
#define LONG_STEPS 60
#define TOL_LOSS 0.05  // |mean of the last 10 losses - zero3's|, |validation - zero3's| after LONG_STEPS

typedef RunDir Ctx;

static int setup(void **state) {
    static const char *const needs[] = {"./zero3", "./dp_baseline", "./zero2", NULL};
    return run_dir_setup(state, "zeropp", needs);
}

// A run at 4 ranks; its record (malloc'd).
static char *run4(const Ctx *c, const char *binary, const char *model, int steps, const char *args) {
    char cmd[CMD_LEN], json[256];
    snprintf(json, sizeof json, "%s/run.json", c->root);
    remove(json);
    snprintf(cmd, sizeof cmd, "mpirun -np 4 ./%s --model %s --batch 2 --steps %d --quiet --json %s %s", binary, model,
             steps, json, args);
    return train(cmd, json);
}

// The number `key` inside the object that starts with `object` ("\"forward_gather\":{").
static double field_in(const char *json, const char *object, const char *key) {
    const char *o = strstr(json, object);
    if (!o) fail_msg("no %s in the record:\n%.400s", object, json);
    return number_of(o, key);
}

static void expect_same_losses(const char *what, const char *a, const char *b, int steps) {
    double la[RUN_MAX_STEPS], lb[RUN_MAX_STEPS];
    losses_of(a, la, steps);
    losses_of(b, lb, steps);
    for (int i = 0; i < steps; i++)
        if (la[i] != lb[i]) fail_msg("%s: step %d's loss %.9g, zero3's %.9g (the same bits expected)", what, i + 1,
                                     la[i], lb[i]);
    if (number_of(a, "val_loss") != number_of(b, "val_loss")) fail_msg("%s: validation losses differ", what);
}

static const char *const HOPS[4] = {"forward_gather", "backward_gather", "grads_in_host", "grads_across"};

// Every hop's counted bytes equal its formula (they are means over 4 ranks
// of whole bytes, written to 0.1), and the run's device peak its count.
static void expect_bytes_as_formula(const char *what, const char *json) {
    for (int h = 0; h < 4; h++) {
        char obj[64];
        snprintf(obj, sizeof obj, "\"%s\":{", HOPS[h]);
        double intra = field_in(json, obj, "intra"), intra_f = field_in(json, obj, "intra_formula");
        double cross = field_in(json, obj, "cross"), cross_f = field_in(json, obj, "cross_formula");
        if (fabs(intra - intra_f) > 0.1 || fabs(cross - cross_f) > 0.1)
            fail_msg("%s, %s: in the host %.1f B (formula %.1f), across hosts %.1f B (formula %.1f)", what, HOPS[h],
                     intra, intra_f, cross, cross_f);
    }
    double bytes = number_of(json, "comm_bytes_per_step"), formula = number_of(json, "comm_formula_bytes_per_step");
    if (fabs(bytes - formula) > 1) fail_msg("%s: %.0f bytes per step counted, formula %.0f", what, bytes, formula);
    double peak = field_in(json, "\"mem\":{\"device\":{", "peak_total"), need = field_in(json, "\"device_need\":{", "total");
    if (peak != need) fail_msg("%s: device peak %.0f B, counted before the run %.0f B", what, peak, need);
}

// ---- tests ----

static void test_every_switch_off_is_zero3(void **state) {
    Ctx *c = *state;
    char *dp = run4(c, "dp_baseline", "small", SHORT_STEPS, "");
    const char *off[] = {"", "--hpz-size 1 --prefetch 1"};
    for (int i = 0; i < 2; i++) {
        char *z = run4(c, "zero3", "small", SHORT_STEPS, off[i]);
        expect_same_losses("zero3 with every switch off against dp_baseline", z, dp, SHORT_STEPS);
        // handout 04's figure for this run: 3Ψ(N-1)/N less the head's 384 bytes; zero3's own buffers
        // alone: two buckets of Ψ/8 (2 x 2 x 104288 x 2 B) and two blocks gathered (2 x 198272 x 2 B)
        assert_true(number_of(z, "comm_bytes_per_step") == 3753984);
        assert_true(field_in(z, "\"params_hpz\":{", "peak") == 0);
        assert_true(field_in(z, "\"device_need\":{", "stage_buffers") == 834304 + 793088);
        assert_true(field_in(z, "\"zeropp\":{", "cross_host_bytes_per_step") == 0);
        free(z);
    }
    free(dp);
}

static void test_hpz_same_bits_backward_in_host(void **state) {
    Ctx *c = *state;
    const char *base[] = {"--prefetch 0", "--prefetch 2 --grad-accum 2", ""};
    const char *hpz[] = {"--prefetch 0 --hpz-size 2", "--prefetch 2 --grad-accum 2 --hpz-size 4", "--hpz-size 4"};
    const double secondary[] = {2 * 834304.0 / 2, 2 * 834304.0 / 4, 2 * 834304.0 / 4};  // 2Ψ_pad/K, Ψ_pad = Ψ here
    for (int i = 0; i < 3; i++) {
        char *z = run4(c, "zero3", "small", SHORT_STEPS, base[i]), *h = run4(c, "zero3", "small", SHORT_STEPS, hpz[i]);
        expect_same_losses(hpz[i], h, z, SHORT_STEPS);
        expect_bytes_as_formula(hpz[i], h);
        assert_true(field_in(h, "\"backward_gather\":{", "cross") == 0);
        assert_true(field_in(h, "\"backward_gather\":{", "intra") > 0);
        assert_true(field_in(h, "\"params_hpz\":{", "current") == secondary[i]);
        assert_true(field_in(h, "\"zeropp\":{", "secondary_formula_bytes") == secondary[i]);
        free(z), free(h);
    }
}

static void test_bytes_equal_formulas(void **state) {
    Ctx *c = *state;
    const char *modes[] = {"--quantize-weights",
                           "--quantize-grads",
                           "--quantize-grads --grad-quant-bits 4 --quant-block 64",
                           "--quantize-weights --hpz-size 2 --quantize-grads",
                           "--quantize-weights --hpz-size 2 --quantize-grads --grad-quant-bits 4 --prefetch 2",
                           // 2 micro-batches from the batch rule (16 / (2 x 4 ranks)), resolved after configure
                           "--quantize-weights --quantize-grads --global-batch 16 --bucket-mb 0.01 --quant-block 2048"};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        char *z = run4(c, "zero3", "tiny", SHORT_STEPS, modes[i]);
        expect_bytes_as_formula(modes[i], z);
        assert_true(field_in(z, "\"zeropp\":{", "cross_host_bytes_per_step") == 0);  // one host
        free(z);
    }
}

// Step 1's gradient norm.
static double first_norm(const char *json) {
    double norms[RUN_MAX_STEPS];
    if (json_numbers(json, "grad_norms", norms, RUN_MAX_STEPS) < 1) fail_msg("no grad_norms in the record");
    return norms[0];
}

// The mean of the last 10 of LONG_STEPS losses.
static double late_mean(const char *json) {
    double l[RUN_MAX_STEPS];
    losses_of(json, l, LONG_STEPS);
    double sum = 0;
    for (int i = LONG_STEPS - 10; i < LONG_STEPS; i++) sum += l[i];
    return sum / 10;
}

static void test_losses_near_zero3(void **state) {
    Ctx *c = *state;
    char *z = run4(c, "zero3", "small", LONG_STEPS, "");
    double base = late_mean(z), base_val = number_of(z, "val_loss");
    const char *modes[] = {"--quantize-weights", "--quantize-grads", "--quantize-grads --grad-quant-bits 4",
                           "--quantize-weights --hpz-size 2 --quantize-grads"};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        char *m = run4(c, "zero3", "small", LONG_STEPS, modes[i]);
        double late = late_mean(m), val = number_of(m, "val_loss");
        // step 1's gradient comes from the same weights: quantized, its norm within 1% of zero3's
        double norm = first_norm(m), base_norm = first_norm(z);
        if (fabs(norm - base_norm) > 0.01 * base_norm)
            fail_msg("%s: step 1's gradient norm %.6g, zero3's %.6g", modes[i], norm, base_norm);
        print_message("%-50s last 10 steps %.4f (zero3 %.4f), validation %.4f (zero3 %.4f)\n", modes[i], late, base,
                      val, base_val);
        if (fabs(late - base) > TOL_LOSS || fabs(val - base_val) > TOL_LOSS)
            fail_msg("%s: losses %.4f and validation %.4f, more than %g from zero3's %.4f and %.4f", modes[i], late,
                     val, TOL_LOSS, base, base_val);
        if (val == base_val) fail_msg("%s: the same validation loss as zero3: was anything quantized?", modes[i]);
        free(m);
    }
    free(z);
}

// --inject-overflow makes the last rank's gradients infinite: through qgZ's
// quantized all-to-all the norm is still infinite, and fp16's scaler skips
// the step as it does in zero3.
static void test_fp16_overflow_skips_the_step(void **state) {
    Ctx *c = *state;
    const char *modes[] = {"", "--quantize-grads", "--quantize-weights --hpz-size 2 --quantize-grads --grad-quant-bits 4"};
    for (int i = 0; i < 3; i++) {
        char args[256];
        snprintf(args, sizeof args, "--precision fp16 --inject-overflow 3 %s", modes[i]);
        char *z = run4(c, "zero3", "tiny", 5, args);
        double skipped[4];
        int n = json_numbers(z, "skipped_steps", skipped, 4);
        if (n != 1 || skipped[0] != 3) fail_msg("%s: skipped steps %d (first %g), expected step 3 alone", args, n, skipped[0]);
        free(z);
    }
}

// hpZ's secondary partition is not in a checkpoint: the first forward after
// a resume fills it again, so a resumed run of all three switches gives the
// uninterrupted run's losses to the bit.
static void test_resume_same_bits(void **state) {
    Ctx *c = *state;
    const char *all = "--quantize-weights --hpz-size 2 --quantize-grads";
    char args[512];
    char *whole = run4(c, "zero3", "tiny", 4, all);
    snprintf(args, sizeof args, "%s --save %s/ck --save-every 2", all, c->root);
    free(run4(c, "zero3", "tiny", 4, args));
    snprintf(args, sizeof args, "%s --resume %s/ck/step-00000002", all, c->root);
    char *resumed = run4(c, "zero3", "tiny", 4, args);
    double lw[RUN_MAX_STEPS], lr[RUN_MAX_STEPS];
    losses_of(whole, lw, 4);
    losses_of(resumed, lr, 2);
    for (int i = 0; i < 2; i++)
        if (lr[i] != lw[2 + i]) fail_msg("resumed step %d: loss %.9g, the whole run's %.9g", 3 + i, lr[i], lw[2 + i]);
    assert_true(number_of(resumed, "val_loss") == number_of(whole, "val_loss"));
    free(whole), free(resumed);
}

// Issue 49, item 21: --quant-block 33 --quantize-weights was refused for
// "two 4-bit values" sharing a byte, but qwZ's values are int8; and a qwZ
// checkpoint resumed without qwZ changed the math with no note, as the
// manifest did not record ZeRO++'s quantization. An odd block trains with
// qwZ and 8-bit qgZ (4-bit qgZ alone needs it even); the manifest records
// the switches, and a resume that changes them says so.
static void test_odd_block_and_resumed_quantization(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], *out = NULL;
    snprintf(cmd, sizeof cmd, "./zero3 --model tiny --steps 2 --quiet --quantize-weights --quant-block 33 --save "
             "%s/qwz-ck && mpirun -np 2 ./zero3 --model tiny --steps 2 --quiet --quantize-weights --quantize-grads "
             "--quant-block 33", c->root);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "./zero3 --model tiny --steps 3 --quiet --resume %s/qwz-ck", c->root);
    run_ok(cmd, &out);
    if (!strstr(out, "note: this run changes settings that shape the update (--quantize-weights on -> off, "
                     "--quant-block 33 -> none)"))
        fail_msg("no note that the resume leaves qwZ off:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "./zero3 --model tiny --steps 3 --quiet --quantize-weights --quant-block 33 --resume "
             "%s/qwz-ck", c->root);
    run_ok(cmd, &out);
    if (strstr(out, "note: this run changes")) fail_msg("the same switches are noted as a change:\n%s", out);
    free(out);
}

static void test_ds_config_keys(void **state) {
    Ctx *c = *state;
    char cfg[256], args[512], cmd[CMD_LEN];
    snprintf(cfg, sizeof cfg, "%s/zeropp.json", c->root);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "{\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true, "
               "\"zero_hpz_partition_size\": 2, \"zero_quantized_gradients\": true}}\n");
    fclose(f);
    snprintf(args, sizeof args, "--deepspeed-config %s", cfg);
    char *by_config = run4(c, "zero3", "tiny", SHORT_STEPS, args);
    char *by_flags = run4(c, "zero3", "tiny", SHORT_STEPS, "--quantize-weights --hpz-size 2 --quantize-grads");
    expect_same_losses("the config's ZeRO++ keys against the flags", by_config, by_flags, SHORT_STEPS);
    assert_true(field_in(by_config, "\"zeropp\":{", "hpz") == 2);
    assert_non_null(strstr(by_config, "zero_optimization.zero_quantized_gradients"));
    free(by_config), free(by_flags);
    // on a stage without ZeRO++ the keys are refused, not ignored
    f = fopen(cfg, "w");
    fprintf(f, "{\"zero_optimization\": {\"zero_quantized_gradients\": true}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --deepspeed-config %s", cfg);
    free(expect_refusal(cmd, "only zero3"));
    f = fopen(cfg, "w");
    fprintf(f, "{\"zero_optimization\": {\"zero_hpz_partition_size\": 0}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "./zero3 --model tiny --steps 1 --deepspeed-config %s", cfg);
    free(expect_refusal(cmd, "zero_hpz_partition_size"));
}

// Handout 04's ZeRO++ excerpt is what its commands print: the first ```sh
// block after "## ZeRO++", run as it stands, and the ``` block after it.
static void test_handout_excerpt(void **state) {
    (void)state;
    char *readme = read_file("04_zero3/README.md", NULL);
    assert_non_null(readme);
    const char *part = strstr(readme, "## ZeRO++");
    if (!part) fail_msg("04_zero3/README.md has no \"## ZeRO++\" section");
    const char *cmd = strstr(part, "```sh\n"), *cmd_end = cmd ? strstr(cmd + 6, "```") : NULL;
    const char *want = cmd_end ? strstr(cmd_end + 3, "```\n") : NULL, *want_end = want ? strstr(want + 4, "```") : NULL;
    if (!want_end) fail_msg("no ```sh block and ``` excerpt after \"## ZeRO++\" in 04_zero3/README.md");
    char *commands = strndup(cmd + 6, (size_t)(cmd_end - cmd - 6)), *expected = strndup(want + 4, (size_t)(want_end - want - 4));
    char *out = NULL;
    int rc = test_run(commands, &out);
    if (rc != 0 || strcmp(out, expected) != 0)
        fail_msg("handout 04's ZeRO++ commands (exit %d) print\n%s\nwhere the handout shows\n%s", rc, out, expected);
    free(out), free(commands), free(expected), free(readme);
}

static void test_bad_combinations_refused(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"mpirun -np 4 ./zero3 --model tiny --steps 1 --hpz-size 3", "does not divide the 4 ranks per host"},
        {"mpirun -np 4 ./zero3 --model tiny --steps 1 --hpz-size 8", "does not divide the 4 ranks per host"},
        {"./zero3 --model tiny --steps 1 --quantize-grads --grad-quant-bits 6", "give 8 or 4"},
        {"./zero3 --model tiny --steps 1 --grad-quant-bits 4", "add --quantize-grads"},
        {"./zero3 --model tiny --steps 1 --quant-block 64", "both are off"},
        {"./zero3 --model tiny --steps 1 --quantize-grads --grad-quant-bits 4 --quant-block 33",
         "--quant-block 33 with --grad-quant-bits 4: qgZ packs two 4-bit values in a byte, both of one block"},
        {"./zero2 --model tiny --steps 1 --quantize-weights", "--quantize-weights"},
        {"./dp_baseline --model tiny --steps 1 --hpz-size 2", "--hpz-size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) free(expect_refusal(cases[i][0], cases[i][1]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_switch_off_is_zero3),
        cmocka_unit_test(test_hpz_same_bits_backward_in_host),
        cmocka_unit_test(test_bytes_equal_formulas),
        cmocka_unit_test(test_losses_near_zero3),
        cmocka_unit_test(test_fp16_overflow_skips_the_step),
        cmocka_unit_test(test_resume_same_bits),
        cmocka_unit_test(test_odd_block_and_resumed_quantization),
        cmocka_unit_test(test_ds_config_keys),
        cmocka_unit_test(test_handout_excerpt),
        cmocka_unit_test(test_bad_combinations_refused),
    };
    return cmocka_run_group_tests(tests, setup, run_dir_teardown);
}
