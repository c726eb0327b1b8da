// test_memory_math_text.c: what memory_math prints stays whole (issue 39,
// item 20): every note whole. Run from the repository root after make.
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
    if (!strstr(out, "A trainer adds what its device holds before the check (none on the cpu device).\n"))
        fail_msg("the run-fit note is not whole:\n%s", out);
    free(out);
}

int main(void) {
    if (need_paths("test_memory_math_text", (const char *const[]){"./memory_math", NULL})) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notes_are_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
