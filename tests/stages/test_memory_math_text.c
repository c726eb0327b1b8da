// test_memory_math_text.c: what memory_math prints stays whole and means
// what it says at the edges of its inputs (issue 39, items 15 and 20): every
// note whole, the planner's figures readable and its "fastest" honest where
// stages tie or no time is bounded, and --global-batch with --tp divided as
// 3d_parallel divides it. Run from the repository root after make.
#include <jansson.h>
#include "runs.h"

static json_t *memory_math_json(const char *args) {
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "./memory_math %s --json", args);
    run_ok(cmd, &out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j) fail_msg("%s: not JSON (%s):\n%.400s", cmd, e.text, out);
    free(out);
    return j;
}

// Every note of every section ends its sentence.
static void notes_end_whole(json_t *o, const char *args) {
    const char *key;
    json_t *v;
    size_t i;
    if (json_is_array(o)) json_array_foreach(o, i, v) notes_end_whole(v, args);
    if (!json_is_object(o)) return;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "notes") != 0) {
            notes_end_whole(v, args);
            continue;
        }
        json_t *note;
        json_array_foreach(v, i, note) {
            const char *s = json_string_value(note);
            size_t len = strlen(s);
            if (len == 0 || s[len - 1] != '.') fail_msg("memory_math %s: a note cut short: \"%s\"", args, s);
        }
    }
}

// Item 20: a 400-byte buffer cut the run-fit note at "A trainer adds ".
static void test_notes_are_whole(void **state) {
    (void)state;
    const char *runs[] = {
        "--model tiny --ranks 4 --hbm-gb 1",
        "--model small --ranks 8 --hbm-gb 1 --tp 2 --recompute full --partition-activations --offload-activations "
        "--link-gbps 1 --gflops 10",
        "--params 7.5B --hbm-gb 32",
        "--model gpt2-124m --ranks 4 --hbm-gb 2 --deepspeed-config tests/ds_configs/infinity_nvme.json",
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        json_t *j = memory_math_json(runs[i]);
        notes_end_whole(j, runs[i]);
        json_decref(j);
    }
    char *out = NULL;
    run_ok("./memory_math --model tiny --ranks 4 --hbm-gb 1", &out);
    if (!strstr(out, "A trainer adds what its device holds before the check (none on the cpu device). total: ") ||
        !strstr(out, "the arena within the budget in whole pages, as the budget check decides.\n"))
        fail_msg("the run-fit note is not whole:\n%s", out);
    free(out);
}

static const char *fastest(json_t *j, const char *which) {
    return json_string_value(json_object_get(json_object_get(j, "step_time"), which));
}

// Item 15: at --link-gbps 1e-300 the planner printed 63-digit step times
// (a buffer's worth of a %.1f's noise) and named zero2 the fastest where
// three stages tie; at a link too slow for a double every time is unbounded
// and it still named one.
static void test_planner_at_extreme_rates(void **state) {
    (void)state;
    char *out = NULL;
    run_ok("./memory_math --model tiny --ranks 4 --link-gbps 1e-300 --gflops 10", &out);
    int run = 0;
    for (const char *c = out; *c; c++) {
        run = *c >= '0' && *c <= '9' ? run + 1 : 0;
        if (run > 16) fail_msg("a figure of more than 16 digits:\n%s", out);
    }
    if (!strstr(out, "8.325e+299")) fail_msg("dp_baseline's comm ms is not 8.325e+299:\n%s", out);
    free(out);
    json_t *j = memory_math_json("--model tiny --ranks 4 --link-gbps 1e-300 --gflops 10");
    assert_string_equal(fastest(j, "fastest_serial"), "dp_baseline, zero1, zero2 (equal)");
    json_decref(j);
    j = memory_math_json("--model tiny --ranks 4 --link-gbps 1e-320 --gflops 10");
    assert_string_equal(fastest(j, "fastest_serial"), "none: every stage's step time is unbounded at these rates");
    assert_string_equal(fastest(j, "fastest_overlap"), "none: every stage's step time is unbounded at these rates");
    json_decref(j);
    // an ordinary link: one stage, the one with the least time
    j = memory_math_json("--model small --ranks 4 --batch 2 --link-gbps 0.2 --gflops 10");
    json_t *rows = json_object_get(json_object_get(j, "step_time"), "stages"), *row;
    const char *least = NULL;
    double least_ms = INFINITY;
    size_t i;
    json_array_foreach(rows, i, row) {
        double ms = json_number_value(json_object_get(row, "step_overlap_ms"));
        if (ms < least_ms) least_ms = ms, least = json_string_value(json_object_get(row, "stage"));
    }
    assert_non_null(least);
    assert_string_equal(fastest(j, "fastest_overlap"), least);
    json_decref(j);
}

// Item 15: with --tp, memory_math divided --global-batch by all the ranks,
// so --ranks 4 --tp 2 --global-batch 4 gave a micro-batch of 1 and refused
// 31 tokens over tp 2, where 3d_parallel (2 data-parallel replicas) runs 2
// sequences of 31.
static void test_global_batch_over_tp_replicas(void **state) {
    (void)state;
    const char *args = "--model tiny --ranks 4 --tp 2 --sequence-parallel --global-batch 4 --grad-accum 1 --seq-len 31";
    json_t *j = memory_math_json(args);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "inputs"), "batch")), 2);
    json_decref(j);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mpirun -np 4 ./3d_parallel --model tiny --tp 2 --sequence-parallel --global-batch 4 "
             "--grad-accum 1 --seq-len 31 --steps 1 --quiet");
    run_ok(cmd, NULL);
    free(expect_refusal("./memory_math --model tiny --ranks 4 --tp 2 --global-batch 3",
                        "2 data-parallel replicas (--ranks / --tp)"));
}

int main(void) {
    if (need_paths("test_memory_math_text", (const char *const[]){"./memory_math", "./3d_parallel", NULL})) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notes_are_whole),
        cmocka_unit_test(test_planner_at_extreme_rates),
        cmocka_unit_test(test_global_batch_over_tp_replicas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
