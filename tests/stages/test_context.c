// test_context.c: --context N sizes the position table (wpe, N x C params)
// of every stage, past GPT-2's 1024 positions; a --seq-len longer than the
// preset's context derives it; the parameter count and the memory formulas
// follow it (issue 47, its first part). Run from the repository root.
#include <math.h>
#include "stage_record.h"

#define PATH_LEN 512
#define CMD_LEN 4096

typedef RunFolders Ctx;

static const char *const STAGES[] = {"dp_baseline", "zero1", "zero2", "zero3", "cpu_offload", "infinity",
                                     "3d_parallel"};
#define NSTAGES (int)(sizeof STAGES / sizeof STAGES[0])
static const char *const PATHS[] = {"./dp_baseline", "./zero1", "./zero2", "./zero3", "./cpu_offload",
                                    "./infinity", "./3d_parallel", "./memory_math", NULL};

// The tiny preset (L=2, C=32, V=256, 32 positions), counted here from
// GPT-2's tensors, apart from the layout code: wte V x C, wpe N x C, per
// block 12 C^2 + 13 C, the final layernorm 2 C.
static double tiny_params(int context) {
    double C = 32, L = 2, V = 256;
    return V * C + context * C + L * (12 * C * C + 13 * C) + 2 * C;
}

// A stage's record of 2 steps on tiny at 2 ranks, B = 2.
static json_t *record_of(Ctx *c, const char *stage, const char *args, const char *tag) {
    char all[512];
    snprintf(all, sizeof all, "--model tiny --steps 2 --eval-every 0 --batch 2 %s", args);
    return stage_record(c, stage, 2, all, tag);
}

static double num(json_t *j, const char *key) {
    json_t *v = json_object_get(j, key);
    if (!json_is_number(v)) fail_msg("no number \"%s\" in the record", key);
    return json_number_value(v);
}

// A --seq-len of 96, past tiny's 32 positions: every stage trains with a
// context of 96 (it was refused), its Ψ counts 96 wpe rows, and the device's
// bf16 params are 2Ψ by the allocator; the same run with --context 96 given
// gives the same losses and memory; --context 160 at the same --seq-len
// counts 64 x C params more (its losses are another model's: the init draws
// more rows), and dp_baseline's allocator holds 2Ψ bytes of them (run on
// dp_baseline and on 3d_parallel, whose grid sizes its own parts: the other
// stages share the trainer's layout with dp_baseline).
static void test_context_follows_seq_len(void **state) {
    Ctx *c = *state;
    for (int s = 0; s < NSTAGES; s++) {
        json_t *derived = record_of(c, STAGES[s], "--seq-len 96", "derived");
        json_t *given = record_of(c, STAGES[s], "--seq-len 96 --context 96", "given");
        int own_layout = s == 0 || !strcmp(STAGES[s], "3d_parallel");
        json_t *longer = own_layout ? record_of(c, STAGES[s], "--seq-len 96 --context 160", "longer") : NULL;
        const struct { json_t *j; int context; } runs[] = {{derived, 96}, {given, 96}, {longer, 160}};
        for (int r = 0; r < (own_layout ? 3 : 2); r++) {
            if (num(runs[r].j, "context") != runs[r].context)
                fail_msg("%s run %d: context %g, expected %d", STAGES[s], r, num(runs[r].j, "context"),
                         runs[r].context);
            if (num(runs[r].j, "params") != tiny_params(runs[r].context))
                fail_msg("%s: Ψ %g at context %d, the count of GPT-2's tensors %g", STAGES[s], num(runs[r].j, "params"),
                         runs[r].context, tiny_params(runs[r].context));
        }
        json_t *ld = json_object_get(derived, "losses"), *lg = json_object_get(given, "losses");
        if (!json_equal(ld, lg)) fail_msg("%s: --seq-len 96 and --seq-len 96 --context 96 trained differently", STAGES[s]);
        json_t *md = json_object_get(derived, "mem"), *mg = json_object_get(given, "mem");
        if (!json_equal(md, mg)) fail_msg("%s: the derived context's memory differs from the given one's", STAGES[s]);
        // the device's bf16 params of the whole model (dp_baseline: every rank holds 2Ψ)
        if (s == 0) {
            double bytes = json_number_value(json_object_get(
                json_object_get(json_object_get(json_object_get(longer, "mem"), "device"), "params_bf16"), "peak"));
            if (bytes != 2 * tiny_params(160))
                fail_msg("dp_baseline --context 160: %g bytes of bf16 params, 2Ψ = %g", bytes, 2 * tiny_params(160));
        }
        print_message("%s: Ψ %g at context 96, %g at 160; losses and memory of a derived context equal a given one's\n",
                      STAGES[s], num(derived, "params"), longer ? num(longer, "params") : NAN);
        json_decref(derived);
        json_decref(given);
        if (longer) json_decref(longer);
    }
}

// memory_math --context: the same Ψ as the trainers count, and its fit
// section follows the longer sequence.
static void test_memory_math_context(void **state) {
    (void)state;
    char *out = NULL;
    run_ok("./memory_math --model tiny --context 160 --seq-len 96 --batch 2 --json", &out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j) fail_msg("memory_math --json: not JSON (%s):\n%.400s", e.text, out);
    json_t *in = json_object_get(j, "inputs"), *acts = json_object_get(j, "activations");
    if (num(in, "params") != tiny_params(160) || num(acts, "context") != 160 || num(in, "seq_len") != 96)
        fail_msg("memory_math --context 160 --seq-len 96: Ψ %g (expected %g), context %g, seq_len %g",
                 num(in, "params"), tiny_params(160), num(acts, "context"), num(in, "seq_len"));
    json_decref(j);
    free(out);
    run_ok("./memory_math --model tiny --seq-len 2048 --batch 1 --json", &out);
    j = json_loads(out, 0, &e);
    if (!j) fail_msg("memory_math --json: not JSON (%s)", e.text);
    if (num(json_object_get(j, "inputs"), "params") != tiny_params(2048))
        fail_msg("memory_math --seq-len 2048 on tiny: Ψ %g, the context of 2048 gives %g",
                 num(json_object_get(j, "inputs"), "params"), tiny_params(2048));
    json_decref(j);
    free(out);
}

// An llm.c checkpoint keeps its own context: exported at 96, read back with
// its 96 positions (the header says so), a --context that differs or a
// --seq-len past it refused in one line.
static void test_llmc_keeps_context(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], file[PATH_LEN], json[PATH_LEN];
    snprintf(file, sizeof file, "%s/ctx96.bin", c->root);
    snprintf(json, sizeof json, "%s/back.json", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 1 ./dp_baseline --model tiny --context 96 --steps 1 --quiet "
             "--export-llmc %s", file);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "mpirun -np 1 ./dp_baseline --init-from %s --seq-len 96 --steps 1 --quiet --json %s",
             file, json);
    char *rec = train(cmd, json);
    if (number_of(rec, "context") != 96) fail_msg("%s: context %g, the checkpoint's is 96", cmd,
                                                  number_of(rec, "context"));
    free(rec);
    snprintf(cmd, sizeof cmd, "mpirun -np 1 ./dp_baseline --init-from %s --context 128 --steps 1", file);
    free(expect_refusal(cmd, "trained with a context of 96 positions"));
    snprintf(cmd, sizeof cmd, "mpirun -np 1 ./dp_baseline --init-from %s --seq-len 128 --steps 1", file);
    free(expect_refusal(cmd, "longer than"));
}

// memory_math --longest-seq at a budget: the T it gives a stage, each way,
// is where that stage's trainer, given --seq-len T and the budget, trains,
// and at T + 1 it is refused by its budget check: the count is the
// check's, bytes and the region the arena's blocks need, pages and holes
// included. zero2 with its own flags and zero3 with full recompute and both
// tilings, at 2 ranks, tiny, B = 2, 40 MB. (When the count was of bytes
// alone, the run at T could stop at an allocation.) Each row says what
// fills the memory at its first T.
static void test_longest_sequence(void **state) {
    Ctx *c = *state;
    char *out = NULL;
    run_ok("./memory_math --model tiny --ranks 2 --batch 2 --hbm-gb 0.04 --longest-seq --json", &out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j) fail_msg("memory_math --longest-seq: not JSON (%s)", e.text);
    json_t *rows = json_object_get(json_object_get(j, "longest_seq"), "stages");
    if (!json_is_array(rows)) fail_msg("memory_math --longest-seq: no longest_seq.stages:\n%.500s", out);
    const char *ways[][2] = {{"own", ""}, {"full_tiled", "--recompute full --tiled-loss 8 --tiled-mlp 8"}};
    const char *stages[] = {"zero2", "zero3"};
    int checked = 0;
    for (size_t r = 0; r < json_array_size(rows); r++) {
        json_t *row = json_array_get(rows, r);
        const char *stage = json_string_value(json_object_get(row, "stage"));
        const char *fill = json_string_value(json_object_get(row, "filled_by"));
        if (!fill || !strstr(fill, "activations") || !strstr(fill, " MB, "))
            fail_msg("memory_math --longest-seq: %s: what fills it: %s", stage, fill ? fill : "(none)");
        for (int s = 0; s < 2; s++) {
            if (!stage || strcmp(stage, stages[s])) continue;
            for (int w = s; w <= s; w++) {  // zero2 its own way, zero3 tiled
                int T = (int)json_number_value(json_object_get(row, ways[w][0]));
                if (T < 64) fail_msg("%s %s: the longest sequence is %d tokens; the budget should allow more", stage,
                                     ways[w][0], T);
                char cmd[CMD_LEN], json[PATH_LEN];
                snprintf(json, sizeof json, "%s/longest.json", c->root);
                snprintf(cmd, sizeof cmd, "mpirun -np 2 ./%s --model tiny --batch 2 --seq-len %d --hbm-gb 0.04 "
                         "--steps 1 --eval-every 0 --quiet --json %s %s", stage, T, json, ways[w][1]);
                free(train(cmd, json));
                snprintf(cmd, sizeof cmd, "mpirun -np 2 ./%s --model tiny --batch 2 --seq-len %d --hbm-gb 0.04 "
                         "--steps 1 %s", stage, T + 1, ways[w][1]);
                free(expect_refusal(cmd, "of device memory per rank"));
                print_message("%s %s: %d tokens train in 40 MB, %d are refused\n", stage,
                              ways[w][1][0] ? ways[w][1] : "(own flags)", T, T + 1);
                checked++;
            }
        }
    }
    if (checked != 2) fail_msg("memory_math --longest-seq: %d of zero2's and zero3's figures found", checked);
    json_decref(j);
    free(out);
    free(expect_refusal("./memory_math --model tiny --longest-seq", "--hbm-gb"));
}

static void test_context_refusals(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN];
    free(expect_refusal("mpirun -np 1 ./zero2 --model tiny --seq-len 64 --context 32 --steps 1",
                        "--seq-len 64 is longer than --context 32"));
    free(expect_refusal("mpirun -np 1 ./zero2 --model tiny --context 0 --steps 1", "--context"));
    free(expect_refusal("mpirun -np 1 ./zero2 --model tiny --context 2097152 --steps 1", "--context"));
    free(expect_refusal("mpirun -np 1 ./zero2 --model tiny --seq-len 2048 --batch 1048576 --steps 1",
                        "tokens a micro-batch, more than this build's"));
    free(expect_refusal("./memory_math --context 4096", "add --model"));
    free(expect_refusal("./memory_math --model tiny --seq-len 2048 --batch 1048576",
                        "tokens a micro-batch, more than this build's"));
    // a checkpoint of another context: the resume names the flag that matches it
    snprintf(cmd, sizeof cmd, "mpirun -np 1 ./zero2 --model tiny --context 64 --steps 1 --quiet --save %s/ck",
             c->root);
    run_ok(cmd, NULL);
    snprintf(cmd, sizeof cmd, "mpirun -np 1 ./zero2 --model tiny --steps 2 --resume %s/ck", c->root);
    free(expect_refusal(cmd, "resume with the same model (--context 64)"));
}

static int group_setup(void **state) { return run_folders_setup(state, "test_context", PATHS); }
static int group_teardown(void **state) { return run_folders_teardown(state); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_refusals),
        cmocka_unit_test(test_memory_math_context),
        cmocka_unit_test(test_llmc_keeps_context),
        cmocka_unit_test(test_context_follows_seq_len),
        cmocka_unit_test(test_longest_sequence),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
