// test_ds_config.c: --deepspeed-config on the trainers and on memory_math,
// run as programs with configs shaped like DeepSpeed's documentation
// (tests/ds_configs/) and variations written here. Each key's effect shows
// in the --json record (read with jansson): the flag it set, its value and
// source, and a run configured by the file trains exactly like the same
// flags given by hand; the learning rates follow DeepSpeed's schedules
// (written here from DeepSpeed's definitions); the command line overrides
// the file; a config of another stage is refused naming the binary to run;
// a wrong type or an impossible value is refused naming the key. Run from
// the repository root after `make GPU=0`.
#include <jansson.h>
#include <unistd.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048
#define CONFIGS "tests/ds_configs"

typedef RunDir Ctx;

// ---- helpers ----

static json_t *parse(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j) fail_msg("not JSON (%s): %.300s", e.text, text);
    return j;
}

// Runs a trainer with --json and returns the record; *out gets its output.
static json_t *run(Ctx *c, const char *tag, const char *args, char **out) {
    char cmd[CMD_LEN], json[PATH_LEN];
    snprintf(json, sizeof json, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, "%s --json %s", args, json);
    char *text = NULL;
    int rc = test_run(cmd, &text);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, text);
    if (out) *out = text;
    else free(text);
    char *line = last_line(json);
    if (!line) fail_msg("%s: no record", cmd);
    json_t *j = parse(line);
    free(line);
    return j;
}

static const char *write_config(Ctx *c, const char *name, const char *text, char *path) {
    snprintf(path, PATH_LEN, "%s/%s", c->root, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

// settings.<flag>: its value as a number (bools 0/1) and where it came from.
static double setting(json_t *rec, const char *flag, const char *from, const char *why) {
    json_t *s = json_object_get(json_object_get(rec, "settings"), flag);
    if (!s) fail_msg("no settings.%s in the record", flag);
    const char *got = json_string_value(json_object_get(s, "from"));
    if (from && (!got || strcmp(got, from) != 0)) fail_msg("settings.%s from %s, expected %s", flag, got, from);
    const char *w = json_string_value(json_object_get(s, "why"));
    if (why && (!w || !strstr(w, why))) fail_msg("settings.%s why '%s', expected '%s' in it", flag, w, why);
    json_t *v = json_object_get(s, "value");
    return json_is_boolean(v) ? json_is_true(v) : json_number_value(v);
}

static const char *setting_text(json_t *rec, const char *flag) {
    return json_string_value(json_object_get(json_object_get(json_object_get(rec, "settings"), flag), "value"));
}

// Every leaf key of the config file has an entry in deepspeed_config.keys.
static void every_key_recorded(json_t *rec, json_t *obj, const char *prefix) {
    json_t *keys = json_object_get(json_object_get(rec, "deepspeed_config"), "keys");
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char key[128];
        snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", name);
        if (json_is_object(v)) every_key_recorded(rec, v, key);
        else if (!json_object_get(keys, key)) fail_msg("config key %s has no entry in the record", key);
    }
}

static void record_lrs(json_t *rec, double *out, int n) {
    json_t *lrs = json_object_get(rec, "lrs");
    assert_int_equal(json_array_size(lrs), n);
    for (int i = 0; i < n; i++) out[i] = json_number_value(json_array_get(lrs, (size_t)i));
}

static void assert_lrs(json_t *rec, const double *want, int n, const char *what) {
    double got[RUN_MAX_STEPS];
    record_lrs(rec, got, n);
    for (int i = 0; i < n; i++)  // the record holds the rate as the fp32 AdamW uses it
        if (!test_close(got[i], want[i], 1e-12, 1e-6)) fail_msg("%s: step %d lr %.9g, expected %.9g", what, i + 1, got[i], want[i]);
}

// DeepSpeed's warm-up (lr_schedules.py): W = max(2, warmup_num_steps);
// gamma = log(s+1)/log(W) ('log') or s/W ('linear') for s < W.
static double ds_gamma(int s, int warmup, int linear) {
    double W = warmup > 2 ? warmup : 2;
    return linear ? s / W : log(s + 1.0) / log(W);
}

// ---- 1. a documentation-shaped ZeRO-2 config: every key's effect ----

static void test_keys_in_record(void **state) {
    Ctx *c = *state;
    char *out;
    json_t *rec = run(c, "zero2-doc", "mpirun -np 2 ./zero2 --model tiny --steps 8 --deepspeed-config "
                      CONFIGS "/zero2_warmup_decay.json", &out);
    // DeepSpeed's batch rule: 16 = 4 x accumulation x 2 ranks
    assert_true(setting(rec, "global-batch", "config", "train_batch_size") == 16);
    assert_true(setting(rec, "batch", "config", "train_micro_batch_size_per_gpu") == 4);
    assert_true(setting(rec, "grad-accum", "derived", "global batch 16") == 2);
    assert_int_equal(json_integer_value(json_object_get(rec, "grad_accum")), 2);
    assert_true(setting(rec, "grad-clip", "config", "gradient_clipping") == 0.5);
    assert_true(setting(rec, "print-every", "config", "steps_per_print") == 3);
    assert_true(setting(rec, "seed", "config", "seed") == 42);
    assert_true(setting(rec, "beta1", "config", "betas[0]") == 0.85);
    assert_true(setting(rec, "beta2", "config", "betas[1]") == 0.98);
    assert_true(setting(rec, "adam-eps", "config", "optimizer.params.eps") == 1e-7);
    assert_true(setting(rec, "weight-decay", "config", "optimizer.params.weight_decay") == 0.01);
    // WarmupDecayLR sets the rate: warmup_max_lr, not the optimizer's lr
    assert_true(setting(rec, "lr", "config", "warmup_max_lr") == 0.004);
    assert_string_equal(setting_text(rec, "lr-schedule"), "WarmupDecayLR");
    assert_true(setting(rec, "warmup", "config", "warmup_num_steps") == 3);
    assert_string_equal(setting_text(rec, "warmup-type"), "linear");
    assert_true(setting(rec, "schedule-steps", "config", "total_num_steps") == 8);
    assert_true(test_close(setting(rec, "warmup-start-frac", "config", "warmup_min_lr"), 0.05, 0, 1e-15));
    // 2.5e5 parameters of bf16 gradients = 0.5 MB
    assert_true(setting(rec, "bucket-mb", "config", "reduce_bucket_size") == 0.5);
    assert_true(setting(rec, "steps", "command line", NULL) == 8);
    assert_true(setting(rec, "eval-batches", "default", NULL) == 4);
    json_t *keys = json_object_get(json_object_get(rec, "deepspeed_config"), "keys");
    assert_non_null(strstr(json_string_value(json_object_get(keys, "zero_optimization.stage")), "checked: zero2"));
    assert_non_null(strstr(json_string_value(json_object_get(keys, "fp16.loss_scale_window")), "ignored"));
    assert_non_null(strstr(json_string_value(json_object_get(keys, "optimizer.params.lr")), "ignored"));
    json_error_t e;
    json_t *file = json_load_file(CONFIGS "/zero2_warmup_decay.json", 0, &e);
    assert_non_null(file);
    every_key_recorded(rec, file, "");
    json_decref(file);
    // WarmupDecayLR from 2e-4 to 4e-3 over W = 3 (linear), down to 2e-4 at step 8
    double want[8];
    for (int s = 0; s < 8; s++) {
        double gamma = s < 3 ? ds_gamma(s, 3, 1) : fmax(0.0, (8.0 - s) / fmax(1.0, 8.0 - 3));
        want[s] = 2e-4 + (4e-3 - 2e-4) * gamma;
    }
    assert_lrs(rec, want, 8, "WarmupDecayLR");
    // the unused keys, once, on one line at start-up; step lines every 3 steps and the last
    const char *ign = strstr(out, "ignored: ");
    assert_non_null(ign);
    assert_null(strstr(ign + 1, "ignored: "));
    assert_non_null(strstr(ign, "fp16.loss_scale_window"));
    assert_non_null(strstr(ign, "fp16.hysteresis"));
    assert_non_null(strstr(out, "step    3/8"));
    assert_non_null(strstr(out, "step    8/8"));
    assert_null(strstr(out, "step    4/8"));
    // the same settings as flags: the same run, loss for loss
    json_t *flags = run(c, "zero2-flags", "mpirun -np 2 ./zero2 --model tiny --steps 8 --global-batch 16 "
                        "--batch 4 --grad-clip 0.5 --seed 42 --beta1 0.85 --beta2 0.98 --adam-eps 1e-7 "
                        "--weight-decay 0.01 --lr 0.004 --lr-schedule WarmupDecayLR --warmup 3 --warmup-type linear "
                        "--warmup-start-frac 0.05 --min-lr-frac 0.05 --schedule-steps 8 --bucket-mb 0.5 --quiet", NULL);
    json_t *la = json_object_get(rec, "losses"), *lb = json_object_get(flags, "losses");
    for (size_t i = 0; i < 8; i++)
        if (json_real_value(json_array_get(la, i)) != json_real_value(json_array_get(lb, i)))
            fail_msg("step %zu: %.9g from the config, %.9g from the flags", i + 1,
                     json_real_value(json_array_get(la, i)), json_real_value(json_array_get(lb, i)));
    free(out);
    json_decref(rec);
    json_decref(flags);
}

// ---- 2. the command line overrides the file ----

static void test_command_line_overrides(void **state) {
    Ctx *c = *state;
    json_t *rec = run(c, "override", "mpirun -np 2 ./zero2 --model tiny --steps 2 --quiet --batch 2 --grad-clip 0.25 "
                      "--seed 5 --deepspeed-config " CONFIGS "/zero2_warmup_decay.json", NULL);
    assert_true(setting(rec, "batch", "command line", NULL) == 2);
    assert_true(setting(rec, "grad-clip", "command line", NULL) == 0.25);
    assert_true(setting(rec, "seed", "command line", NULL) == 5);
    assert_true(setting(rec, "grad-accum", "derived", NULL) == 4);  // 16 / (2 x 2 ranks)
    assert_true(setting(rec, "global-batch", "config", NULL) == 16);
    // issue 28: the key's line showed the config's value the flag had replaced
    json_t *keys = json_object_get(json_object_get(rec, "deepspeed_config"), "keys");
    const char *clip = json_string_value(json_object_get(keys, "gradient_clipping"));
    if (!clip || strcmp(clip, "overridden: --grad-clip on the command line") != 0)
        fail_msg("gradient_clipping's line: %s", clip ? clip : "(none)");
    json_decref(rec);
}

// A config with more keys than the record names (found by fuzz_ds_config: it
// stopped the run with an internal error): the line names the first ones and
// counts the rest; the keys that mean something still apply.
static void test_many_unknown_keys(void **state) {
    Ctx *c = *state;
    char text[8192], path[PATH_LEN], cmd[CMD_LEN];
    size_t len = (size_t)snprintf(text, sizeof text, "{\"train_micro_batch_size_per_gpu\": 3");
    for (int i = 0; i < 150; i++) len += (size_t)snprintf(text + len, sizeof text - len, ", \"unknown_%d\": %d", i, i);
    snprintf(text + len, sizeof text - len, "}\n");
    write_config(c, "many.json", text, path);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --quiet --deepspeed-config %s", path);
    char *out = NULL;
    json_t *rec = run(c, "many-run", cmd, &out);
    assert_true(setting(rec, "batch", "config", NULL) == 3);
    if (!strstr(out, "ignored: unknown_0, unknown_1,") || !strstr(out, " more\n"))
        fail_msg("no ignored line naming the first keys and counting the rest:\n%.600s", out);
    free(out);
    json_decref(rec);
}

// ---- 3. WarmupCosineLR and WarmupLR, and the stages they ask for ----

static void test_cosine_and_offload(void **state) {
    Ctx *c = *state;
    json_t *rec = run(c, "zero3-doc", "mpirun -np 2 ./zero3 --model small --steps 10 --quiet --deepspeed-config "
                      CONFIGS "/zero3_warmup_cosine.json", NULL);
    double want[10];
    for (int s = 0; s < 10; s++) {  // lr x ratio; W = 4 (log), S = 10
        double ratio = s < 4 ? 0.1 + 0.9 * ds_gamma(s, 4, 0)
                             : fmax(0.0, 0.05 + 0.95 * (1 + cos(M_PI * (s - 4 + 1) / 6.0)) / 2);
        want[s] = 0.003 * ratio;
    }
    assert_lrs(rec, want, 10, "WarmupCosineLR");
    assert_true(setting(rec, "lr", "config", "optimizer.params.lr") == 0.003);
    assert_true(setting(rec, "beta2", "deepspeed default", "optimizer.type") == 0.999);  // FusedAdam's default
    assert_true(setting(rec, "grad-accum", "config", NULL) == 2);
    // 4e5 parameters ahead; a block of small holds 198,272: two blocks
    assert_true(setting(rec, "prefetch", "config", "198272 per block = 2 units") == 2);
    json_decref(rec);

    rec = run(c, "offload-doc", "mpirun -np 2 ./cpu_offload --model tiny --steps 7 --quiet --deepspeed-config "
              CONFIGS "/zero_offload_cpu.json", NULL);
    for (int s = 0; s < 7; s++) want[s] = 1e-3 * (s < 5 ? ds_gamma(s, 5, 0) : 1.0);  // WarmupLR 0 -> 1e-3, log
    assert_lrs(rec, want, 7, "WarmupLR");
    assert_true(setting(rec, "batch", "default", NULL) == 4);  // "auto"
    json_t *keys = json_object_get(json_object_get(rec, "deepspeed_config"), "keys");
    assert_non_null(strstr(json_string_value(json_object_get(keys, "train_micro_batch_size_per_gpu")), "auto"));
    assert_non_null(strstr(json_string_value(json_object_get(keys, "zero_optimization.offload_optimizer.device")),
                           "cpu_offload"));
    json_decref(rec);
}

// ---- Hugging Face's precision blocks ----

// Issue 39, item 7: Hugging Face writes "enabled": "auto" in the fp16 block
// (the run's own precision decides); its loss scaling was listed as ignored
// and the run used 2^16 and a hysteresis of 2. The block applies when the
// run is fp16, and a bf16 run lists it as ignored. `bfloat16`, DeepSpeed's
// older name of the bf16 block, was "no use"; it is read as bf16.
static void test_hugging_face_precision_blocks(void **state) {
    Ctx *c = *state;
    char path[PATH_LEN], args[CMD_LEN], *out = NULL;
    write_config(c, "hf-config.json", "{\"fp16\": {\"enabled\": \"auto\", \"initial_scale_power\": 8, "
                 "\"hysteresis\": 1}, \"bfloat16\": {\"enabled\": \"auto\"}}", path);
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 2 --quiet --precision fp16 "
             "--deepspeed-config %s", path);
    json_t *rec = run(c, "hf-fp16", args, &out);
    if (strstr(out, "ignored")) fail_msg("an fp16 run with fp16.enabled auto ignored a key:\n%s", out);
    assert_true(setting(rec, "initial-scale-power", "config", "fp16.initial_scale_power") == 8);
    assert_true(setting(rec, "hysteresis", "config", "fp16.hysteresis") == 1);
    assert_true(json_number_value(json_array_get(json_object_get(rec, "loss_scales"), 0)) == 256);
    json_t *keys = json_object_get(json_object_get(rec, "deepspeed_config"), "keys");
    assert_non_null(strstr(json_string_value(json_object_get(keys, "bfloat16.enabled")), "auto"));
    free(out);
    json_decref(rec);
    // the same file in a bf16 run: the scaling keys are listed, with the reason
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 1 --quiet --deepspeed-config %s", path);
    rec = run(c, "hf-bf16", args, &out);
    if (!strstr(out, "fp16.initial_scale_power (the run is bf16, which needs no loss scaling)"))
        fail_msg("a bf16 run did not list fp16's scaling keys as ignored:\n%s", out);
    assert_string_equal(setting_text(rec, "precision"), "bf16");
    free(out);
    json_decref(rec);
    // bfloat16 sets --precision as bf16 does; false with fp16 auto leaves fp16
    write_config(c, "bfloat16-on.json", "{\"bfloat16\": {\"enabled\": true}}", path);
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 1 --quiet --precision fp16 "
             "--deepspeed-config %s", path);
    rec = run(c, "old-bf16", args, NULL);
    setting(rec, "precision", "command line", NULL);
    json_decref(rec);
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 1 --quiet --deepspeed-config %s", path);
    rec = run(c, "old-bf16-on", args, &out);
    if (strstr(out, "bfloat16")) fail_msg("bfloat16.enabled listed:\n%s", out);
    setting(rec, "precision", "config", "bfloat16.enabled");
    free(out);
    json_decref(rec);
    write_config(c, "bfloat16-off.json", "{\"bfloat16\": {\"enabled\": false}, \"fp16\": {\"enabled\": \"auto\", "
                 "\"loss_scale_window\": 50}}", path);
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 1 --quiet --deepspeed-config %s", path);
    rec = run(c, "old-bf16-off", args, NULL);
    setting(rec, "precision", "config", "bfloat16.enabled");
    assert_string_equal(setting_text(rec, "precision"), "fp16");
    assert_true(setting(rec, "loss-scale-window", "config", "fp16.loss_scale_window") == 50);
    json_decref(rec);
    write_config(c, "bfloat16-fp32.json", "{\"bfloat16\": {\"enabled\": false}}", path);
    snprintf(args, sizeof args, "./zero2 --model tiny --steps 1 --deepspeed-config %s", path);
    free(expect_refusal(args, "bfloat16.enabled: false without fp16.enabled true"));
}

// ---- 4. refusals ----

static void test_stage_mismatch_names_the_binary(void **state) {
    Ctx *c = *state;
    const struct {
        const char *json, *binary, *says;
    } cases[] = {
        {"{\"zero_optimization\": {\"stage\": 2}}", "zero3", "run ./zero2 (stage 03)"},
        {"{\"zero_optimization\": {\"stage\": 3}}", "zero2", "run ./zero3 (stage 04)"},
        {"{\"zero_optimization\": {\"stage\": 0}}", "zero1", "run ./dp_baseline (stage 01)"},
        {"{\"zero_optimization\": {\"stage\": 1}}", "dp_baseline", "run ./zero1 (stage 02)"},
        {"{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}", "zero2",
         "run ./cpu_offload (stage 05)"},
        {"{\"zero_optimization\": {\"stage\": 2}}", "cpu_offload", "run ./zero2"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}}}", "zero3",
         "run ./infinity (stage 06)"},
        {"{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}}}", "zero1",
         "has no stage here"},
        {"{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}", "zero2",
         "needs zero_optimization.stage 3"},
        {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}", "cpu_offload",
         "needs zero_optimization.stage"},
    };
    char path[PATH_LEN], cmd[CMD_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(c, "stage.json", cases[i].json, path);
        snprintf(cmd, sizeof cmd, "./%s --model tiny --steps 1 --deepspeed-config %s", cases[i].binary, path);
        free(expect_refusal(cmd, cases[i].says));
    }
    // ZeRO-Infinity: stage 06's binary, and whether this build has it
    snprintf(cmd, sizeof cmd, "./zero3 --model tiny --steps 1 --deepspeed-config %s/infinity_nvme.json", CONFIGS);
    free(expect_refusal(cmd, access("./infinity", X_OK) == 0 ? "run ./infinity (stage 06)"
                                                              : "which this build does not have yet"));
}

static void test_bad_values_name_the_key(void **state) {
    Ctx *c = *state;
    const struct {
        const char *json, *says;
    } cases[] = {
        {"{\"train_batch_size\": 8,}", "not valid JSON"},
        // found by the fuzzer (tests/fuzz/corpus/fuzz_ds_config/line_break_in_error): the parser's
        // message quoted the line break, and the refusal took two lines
        {"{\"train_batch_size\": 16,\n\"\\\n\n", "not valid JSON"},
        {"[1, 2]", "the top level is a list"},
        {"{\"train_micro_batch_size_per_gpu\": \"4\"}", "train_micro_batch_size_per_gpu: expected a whole number"},
        {"{\"train_micro_batch_size_per_gpu\": 0}", "train_micro_batch_size_per_gpu: 0 is impossible"},
        {"{\"gradient_accumulation_steps\": 2.5}", "gradient_accumulation_steps: expected a whole number"},
        {"{\"gradient_clipping\": -1}", "gradient_clipping: -1 is impossible"},
        {"{\"seed\": 1e12}", "seed: 1000000000000 is more than"},
        // found by the fuzzer (tests/fuzz/corpus/fuzz_ds_config/whole_past_long_long): a whole number past
        // any integer type was cast to one to see whether it was whole (undefined), and called not whole
        {"{\"train_micro_batch_size_per_gpu\": 1.3e127}", "train_micro_batch_size_per_gpu: 1.3000000000000001e+127 is more than"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0}}}", "optimizer.params.lr: 0 is impossible"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9]}}}", "optimizer.params.betas"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, 1.5]}}}", "beta2 1.5 is outside"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"eps\": 0}}}", "optimizer.params.eps"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": true}}}", "optimizer.params.amsgrad"},
        {"{\"optimizer\": {\"type\": \"Lamb\"}}", "optimizer.type: Lamb is not implemented"},
        {"{\"optimizer\": {\"params\": {\"lr\": 1e-3}}}", "optimizer.type: missing"},
        {"{\"scheduler\": {\"type\": \"OneCycle\"}}", "scheduler.type: OneCycle"},
        {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"cos_min_ratio\": 0.1}}}",
         "scheduler.params.cos_min_ratio: is not a parameter of WarmupLR"},
        {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"exp\"}}}",
         "scheduler.params.warmup_type: 'exp'"},
        {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.1, \"warmup_max_lr\": 0.01}}}",
         "scheduler.params.warmup_min_lr"},
        {"{\"bf16\": {\"enabled\": false}}", "bf16.enabled: false"},
        {"{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "fp16.enabled: true with bf16.enabled true"},
        {"{\"fp16\": {\"enabled\": true, \"hysteresis\": 0}}", "fp16.hysteresis: 0 is out of range"},
        {"{\"fp16\": {\"enabled\": true, \"consecutive_hysteresis\": true}}", "fp16.consecutive_hysteresis"},
        {"{\"bf16\": {\"enabled\": \"yes\"}}", "bf16.enabled: expected true or false"},
        {"{\"zero_optimization\": {\"stage\": 5}}", "zero_optimization.stage: 5 is not a ZeRO stage"},
        {"{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": -1}}", "zero_optimization.reduce_bucket_size"},
        {"{\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}", "zero_optimization.cpu_offload"},
        {"{\"aio\": {\"block_size\": 1000}}", "aio.block_size"},
        // issue 28, item 9: a section of the wrong type ran with "ignored"; it is refused naming it
        {"{\"zero_optimization\": 3}", "zero_optimization: expected an object (a section of keys), got a whole number"},
        {"{\"scheduler\": \"WarmupLR\"}", "scheduler: expected an object (a section of keys), got a string"},
        {"{\"optimizer\": {\"type\": \"AdamW\", \"params\": \"lr=0.1\"}}", "optimizer.params: expected an object"},
        {"{\"bf16\": true}", "bf16: expected an object (a section of keys), got true or false"},
        {"{\"zero_optimization\": {\"offload_optimizer\": \"cpu\"}}", "zero_optimization.offload_optimizer: expected an object"},
        {"{\"aio\": [4096]}", "aio: expected an object (a section of keys), got a list"},
        {"{\"activation_checkpointing\": true}", "activation_checkpointing: expected an object"},
        {"{\"train_batch_size\": 6, \"train_micro_batch_size_per_gpu\": 4}", "train_batch_size 6 does not divide"},
        {"{\"train_batch_size\": 12, \"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2}",
         "DeepSpeed's rule"},
    };
    char path[PATH_LEN], cmd[CMD_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(c, "bad.json", cases[i].json, path);
        snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --deepspeed-config %s", path);
        free(expect_refusal(cmd, cases[i].says));
    }
    free(expect_refusal("./zero2 --deepspeed-config /nonexistent.json", "unable to open"));
}

// Issue 28: a FIFO as the config hung, a folder was "not valid JSON", a
// 100 MB file was read whole, and a UTF-8 byte-order mark was refused with an
// invisible character in the line. Only a regular file of at most 1 MB is
// read, and the mark is skipped. (timeout: code that opens the FIFO hangs.)
static void test_config_file_kinds(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "cd %s && rm -f fifo.json && mkfifo fifo.json && mkdir -p folder.json && "
             "head -c 2000000 /dev/zero | tr '\\0' ' ' > big.json && "
             "printf '\\357\\273\\277{\"train_micro_batch_size_per_gpu\": 2}' > bom.json", c->root);
    assert_int_equal(test_run(cmd, NULL), 0);
    const char *cases[][2] = {{"fifo.json", "fifo.json is a FIFO, not a file"},
                              {"folder.json", "folder.json is a folder, not a file"},
                              {"big.json", "big.json is more than 1048576 bytes"}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "timeout 60 ./zero2 --model tiny --steps 1 --deepspeed-config %s/%s", c->root,
                 cases[i][0]);
        free(expect_refusal(cmd, cases[i][1]));
    }
    char args[CMD_LEN], *out = NULL;
    snprintf(args, sizeof args, "./zero2 --model tiny --steps 1 --verbose-config --deepspeed-config %s/bom.json",
             c->root);
    json_t *rec = run(c, "bom-run", args, &out);
    if (!strstr(out, "train_micro_batch_size_per_gpu")) fail_msg("the config with a byte-order mark:\n%s", out);
    free(out);
    json_decref(rec);
}

// ---- 5. memory_math: what the config costs per rank, by tier ----

static double section_number(json_t *mm, const char *section, const char *key) {
    json_t *v = json_object_get(json_object_get(mm, section), key);
    if (!v) fail_msg("no %s.%s in memory_math's JSON", section, key);
    return json_number_value(v);
}

static void test_memory_math(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("./memory_math --json --model gpt2-124m --ranks 8 --seq-len 1024 --hbm-gb 4 "
                      "--deepspeed-config " CONFIGS "/zero3_warmup_cosine.json", &out);
    if (rc != 0) fail_msg("memory_math: exit %d:\n%s", rc, out);
    json_t *mm = parse(out);
    json_t *ds = json_object_get(mm, "deepspeed_config");
    assert_string_equal(json_string_value(json_object_get(ds, "stage")), "zero3");
    assert_true(section_number(mm, "inputs", "batch") == 2);  // train_micro_batch_size_per_gpu
    assert_true(section_number(mm, "inputs", "grad_accum") == 2);
    // ZeRO-3's device model states: 16 bytes x Ψ_pad / N, Ψ_pad = Ψ rounded up to 8 x 64
    double psi = section_number(mm, "inputs", "params"), pad = ceil(psi / 512) * 512;
    json_t *rows = json_object_get(ds, "per_rank");
    json_t *device = json_array_get(rows, 0);
    assert_string_equal(json_string_value(json_object_get(device, "tier")), "device");
    assert_true(test_close(json_number_value(json_object_get(device, "model_states_gb")), 16 * pad / 8 / 1e9, 0, 1e-12));
    double acts = json_number_value(json_object_get(device, "activations_gb"));
    assert_true(acts > 0);
    double total = json_number_value(json_object_get(device, "total_gb"));
    assert_non_null(strstr(json_string_value(json_object_get(ds, "fits")), total <= 4 ? "fits" : "does not fit"));
    json_decref(mm);
    free(out);
    // ZeRO-Offload: its host tier; micro-batch from the command line, accumulation from the file
    rc = test_run("./memory_math --json --model gpt2-124m --ranks 4 --batch 3 --deepspeed-config "
                  CONFIGS "/zero_offload_cpu.json", &out);
    if (rc != 0) fail_msg("memory_math: exit %d:\n%s", rc, out);
    mm = parse(out);
    ds = json_object_get(mm, "deepspeed_config");
    assert_string_equal(json_string_value(json_object_get(ds, "stage")), "cpu_offload");
    assert_true(json_array_size(json_object_get(ds, "per_rank")) == 2);  // device, pinned
    assert_true(section_number(mm, "inputs", "batch") == 3);
    json_decref(mm);
    free(out);
    // ZeRO-Infinity with offload_param nvme: nothing of the model states on
    // the device; 2Ψ/N pinned (the gradient shard), 14Ψ/N on NVMe
    rc = test_run("./memory_math --json --model gpt2-124m --ranks 4 --deepspeed-config " CONFIGS
                  "/infinity_nvme.json", &out);
    if (rc != 0) fail_msg("memory_math: exit %d:\n%s", rc, out);
    mm = parse(out);
    ds = json_object_get(mm, "deepspeed_config");
    assert_string_equal(json_string_value(json_object_get(ds, "stage")), "infinity --offload-params nvme");
    psi = section_number(mm, "inputs", "params");
    pad = ceil(psi / 256) * 256;
    rows = json_object_get(ds, "per_rank");
    const char *tiers[3] = {"device", "pinned", "nvme"};
    const double want[3] = {0, 2 * pad / 4, 14 * pad / 4};
    int seen[3] = {0};
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *row = json_array_get(rows, i);
        const char *tier = json_string_value(json_object_get(row, "tier"));
        double gb = json_number_value(json_object_get(row, "model_states_gb"));
        int w = 0;
        while (w < 3 && strcmp(tier, tiers[w]) != 0) w++;
        if (w == 3) fail_msg("tier %s in the config's per-rank table", tier);
        if (!test_close(gb, want[w] / 1e9, 0, 1e-12)) fail_msg("%s: %.6f GB, want %.6f", tier, gb, want[w] / 1e9);
        seen[w]++;
    }
    for (int w = 0; w < 3; w++)
        if (seen[w] != 1) fail_msg("tier %s appears %d times in the config's per-rank table", tiers[w], seen[w]);
    // and the key that chose the tiers says so
    assert_non_null(strstr(out, "checked: the bf16 param shard on NVMe"));
    json_decref(mm);
    free(out);
    free(expect_refusal("./memory_math --model tiny --deepspeed-config tests/ds_configs/missing.json", "unable to open"));
    free(expect_refusal("./memory_math --model tiny --ranks 4 --global-batch 10 --batch 2", "does not divide"));
}

// ---- activation_checkpointing: the flags it sets, in a trainer and in memory_math ----

// partition_activations and cpu_checkpointing set 3d_parallel's
// --partition-activations and --offload-activations, and --recompute full
// with them; the other keys are checked or ignored, each saying why; the
// run with the file trains as the same flags by hand. memory_math sets the
// same flags and counts the partition with --tp.
static void test_activation_checkpointing(void **state) {
    Ctx *c = *state;
    const char *file = CONFIGS "/activation_checkpointing.json";
    char args[CMD_LEN];
    snprintf(args, sizeof args, "mpirun -np 2 ./3d_parallel --model small --tp 2 --steps 3 --quiet "
             "--deepspeed-config %s", file);
    json_t *rec = run(c, "ac-config", args, NULL);
    assert_true(setting(rec, "partition-activations", "config", "activation_checkpointing.partition_activations") == 1);
    assert_true(setting(rec, "offload-activations", "config", "activation_checkpointing.cpu_checkpointing") == 1);
    setting(rec, "recompute", "config", "activation_checkpointing.cpu_checkpointing");
    assert_string_equal(setting_text(rec, "recompute"), "full");
    json_t *keys = json_object_get(json_object_get(rec, "deepspeed_config"), "keys");
    const char *block[] = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                           "number_checkpoints", "synchronize_checkpoint_boundary", "profile"};
    for (int i = 0; i < 6; i++) {
        char key[96];
        snprintf(key, sizeof key, "activation_checkpointing.%s", block[i]);
        const char *effect = json_string_value(json_object_get(keys, key));
        if (!effect) fail_msg("no record of %s", key);
        if (strstr(effect, "no use for it") || (!strncmp(effect, "ignored", 7) && !strchr(effect, ':')))
            fail_msg("%s: '%s' gives no reason", key, effect);
    }
    json_t *hand = run(c, "ac-hand", "mpirun -np 2 ./3d_parallel --model small --tp 2 --steps 3 --quiet --batch 2 "
                       "--grad-accum 2 --recompute full --partition-activations --offload-activations", NULL);
    json_t *a = json_object_get(rec, "losses"), *b = json_object_get(hand, "losses");
    for (size_t i = 0; i < 3; i++)
        if (json_number_value(json_array_get(a, i)) != json_number_value(json_array_get(b, i)))
            fail_msg("step %zu: the config's loss differs from the same flags by hand", i + 1);
    json_decref(rec);
    json_decref(hand);
    char *out = NULL;
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "./memory_math --model small --ranks 2 --hbm-gb 1 --tp 2 --json --deepspeed-config %s",
             file);
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
    assert_non_null(strstr(out, "\"activation_checkpointing.partition_activations\",\"effect\":\"--partition-activations on\""));
    assert_non_null(strstr(out, "\"activation_checkpointing.cpu_checkpointing\",\"effect\":\"--offload-activations on\""));
    assert_non_null(strstr(out, "\"stage\":\"3d_parallel --tp 2 --pa\""));
    free(out);
}

// Issue 39, item 14: partition_activations given to zero2 was listed as "a
// knob of 3d_parallel (stage ?), which this build does not have yet" and
// switched the run to --recompute full all the same; the block's keys
// without a flag took any type. The key names 3d_parallel as built, the
// recompute stays, and a wrong type is refused naming the key.
static void test_activation_block_elsewhere(void **state) {
    Ctx *c = *state;
    char path[PATH_LEN], args[CMD_LEN], *out = NULL;
    write_config(c, "ac-zero2-config.json", "{\"activation_checkpointing\": {\"partition_activations\": true, "
                 "\"profile\": false}}", path);
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 1 --quiet --deepspeed-config %s", path);
    json_t *rec = run(c, "ac-zero2", args, &out);
    if (!strstr(out, "activation_checkpointing.partition_activations (sets --partition-activations, a knob of "
                "3d_parallel)"))
        fail_msg("zero2 does not list partition_activations as 3d_parallel's knob:\n%s", out);
    setting(rec, "recompute", "default", NULL);
    assert_string_equal(setting_text(rec, "recompute"), "none");
    free(out);
    json_decref(rec);
    const char *cases[][2] = {
        {"{\"activation_checkpointing\": {\"profile\": \"yes\"}}",
         "activation_checkpointing.profile: expected true or false, got a string"},
        {"{\"activation_checkpointing\": {\"contiguous_memory_optimization\": [1, 2]}}",
         "activation_checkpointing.contiguous_memory_optimization: expected true or false, got a list"},
        {"{\"activation_checkpointing\": {\"synchronize_checkpoint_boundary\": 1}}",
         "activation_checkpointing.synchronize_checkpoint_boundary: expected true or false"},
        {"{\"activation_checkpointing\": {\"number_checkpoints\": 0}}",
         "activation_checkpointing.number_checkpoints: 0 is not a count"},
        {"{\"activation_checkpointing\": {\"number_checkpoints\": \"4\"}}",
         "activation_checkpointing.number_checkpoints: expected a whole number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(c, "ac-bad.json", cases[i][0], path);
        snprintf(args, sizeof args, "./zero2 --model tiny --steps 1 --deepspeed-config %s", path);
        free(expect_refusal(args, cases[i][1]));
    }
}

// Issue 47: DeepSpeed-Ulysses' sequence_parallel_size sets 3d_parallel's
// --cp with --cp-mode ulysses (the grid's cp in the record, the same losses
// as the flags by hand); 1 is checked and splits nothing; more than 1 is
// refused by a stage without --cp, naming 3d_parallel; a count below 1 is
// refused naming the key.
static void test_sequence_parallel_size(void **state) {
    Ctx *c = *state;
    char path[PATH_LEN], args[CMD_LEN];
    write_config(c, "sp2-config.json", "{\"sequence_parallel_size\": 2}", path);
    snprintf(args, sizeof args, "mpirun -np 2 ./3d_parallel --model tiny --steps 2 --quiet --deepspeed-config %s", path);
    json_t *rec = run(c, "sp2", args, NULL);
    assert_true(setting(rec, "cp", "config", "sequence_parallel_size") == 2);
    assert_string_equal(setting_text(rec, "cp-mode"), "ulysses");
    json_t *hand = run(c, "sp2-hand", "mpirun -np 2 ./3d_parallel --model tiny --steps 2 --quiet --cp 2", NULL);
    assert_true(json_equal(json_object_get(rec, "losses"), json_object_get(hand, "losses")));
    json_decref(rec), json_decref(hand);
    snprintf(args, sizeof args, "mpirun -np 2 ./zero2 --model tiny --steps 1 --deepspeed-config %s", path);
    free(expect_refusal(args, "sequence_parallel_size: 2: DeepSpeed-Ulysses' sequence split over 2 ranks is "
                              "3d_parallel's --cp 2 --cp-mode ulysses; zero2 has no sequence split"));
    write_config(c, "sp0-config.json", "{\"sequence_parallel_size\": 0}", path);
    snprintf(args, sizeof args, "./zero2 --model tiny --steps 1 --deepspeed-config %s", path);
    free(expect_refusal(args, "sequence_parallel_size: 0 is not a count of ranks"));
    write_config(c, "sp1-config.json", "{\"sequence_parallel_size\": 1}", path);
    snprintf(args, sizeof args, "./zero2 --model tiny --steps 1 --quiet --deepspeed-config %s", path);
    rec = run(c, "sp1", args, NULL);
    const char *effect = json_string_value(
        json_object_get(json_object_get(json_object_get(rec, "deepspeed_config"), "keys"), "sequence_parallel_size"));
    if (!effect || !strstr(effect, "no sequence split")) fail_msg("sequence_parallel_size 1: effect '%s'", effect);
    json_decref(rec);
}

static int group_setup(void **state) {
    return run_dir_setup(state, "test_ds_config", (const char *const[]){"./zero2", CONFIGS, NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_in_record),
        cmocka_unit_test(test_sequence_parallel_size),
        cmocka_unit_test(test_command_line_overrides),
        cmocka_unit_test(test_many_unknown_keys),
        cmocka_unit_test(test_cosine_and_offload),
        cmocka_unit_test(test_hugging_face_precision_blocks),
        cmocka_unit_test(test_stage_mismatch_names_the_binary),
        cmocka_unit_test(test_bad_values_name_the_key),
        cmocka_unit_test(test_config_file_kinds),
        cmocka_unit_test(test_memory_math),
        cmocka_unit_test(test_activation_checkpointing),
        cmocka_unit_test(test_activation_block_elsewhere),
    };
    return cmocka_run_group_tests(tests, group_setup, run_dir_teardown);
}
