// test_readme.c: the figures README.md quotes are what its commands print
// (issue 39, item 17: its sample step line was stale while the text said
// only the times vary). The commands and the figures are read from README.md
// itself, so a figure changed there, or a change to the code that moves it,
// fails here until the page is regenerated. Compared: the step line's loss,
// lr, norm and device memory (loss and norm to one unit of their last
// printed digit, which another CPU's summation order may flip), the
// activation bytes with and without --recompute full and that both runs'
// losses are the same, and the fp16 config's loss scale; never a time.
// Run from the repository root after make.
#include <jansson.h>
#include "runs.h"

#define CMD_LEN 2048

typedef struct Ctx {
    char root[64];
    char *readme;
} Ctx;

// The text after `marker` in README.md; fails naming the marker when absent.
static const char *after(const Ctx *c, const char *marker) {
    const char *p = strstr(c->readme, marker);
    if (!p) fail_msg("README.md no longer has \"%s\": update test_readme.c with the page", marker);
    return p + strlen(marker);
}

// The README line holding `marker`: the command before its '#' (trimmed) in cmd.
static const char *command_of_line(const Ctx *c, const char *marker, char *cmd, size_t n) {
    const char *m = after(c, marker) - strlen(marker);
    const char *start = m;
    while (start > c->readme && start[-1] != '\n') start--;
    const char *hash = memchr(start, '#', (size_t)(m - start) + 1);
    assert_non_null(hash);
    size_t len = (size_t)(hash - start);
    while (len && start[len - 1] == ' ') len--;
    snprintf(cmd, n, "%.*s", (int)len, start);
    return cmd;
}

// Runs `cmd` with --json; the record (and the output in *out when out is not NULL).
static json_t *run_record(const Ctx *c, const char *name, const char *cmd, char **out) {
    char json[256], full[CMD_LEN];
    snprintf(json, sizeof json, "%s/%s.json", c->root, name);
    snprintf(full, sizeof full, "%s --json %s", cmd, json);
    char *o = NULL;
    char *line = train_output(full, json, &o);
    json_error_t e;
    json_t *rec = json_loads(line, 0, &e);
    if (!rec) fail_msg("%s: the record is not JSON (%s)", full, e.text);
    free(line);
    if (out) *out = o;
    else free(o);
    return rec;
}

// A field of a step line ("loss 5.084695 |") as text, up to the next " |".
static void field(const char *line, const char *name, char *out, size_t n) {
    const char *p = strstr(line, name);
    if (!p) fail_msg("no \"%s\" in the step line: %s", name, line);
    p += strlen(name);
    while (*p == ' ') p++;
    size_t len = strcspn(p, "|\n");
    while (len && p[len - 1] == ' ') len--;
    snprintf(out, n, "%.*s", (int)len, p);
}

// The README's step line `quoted` beside step `step` of cmd's run (under kernel set `set`).
static void step_line_as_quoted(const char *cmd, const char *set, int step, const char *quoted) {
    char *out = NULL;
    run_ok(cmd, &out);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "\nstep %4d/", step);
    const char *printed = strstr(out, prefix);
    if (!printed) fail_msg("%s printed no step %d:\n%s", cmd, step, out);
    printed++;
    const struct {
        const char *name;
        double unit;  // 0: the same text
    } fields[] = {{"loss", 1e-6}, {"lr", 0}, {"norm", 1e-4}, {"device mem", 0}, {"step", 0}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char want[128], got[128];
        field(quoted, fields[i].name, want, sizeof want);
        field(printed, fields[i].name, got, sizeof got);
        int same = fields[i].unit == 0 ? strcmp(want, got) == 0
                                       : fabs(atof(want) - atof(got)) <= fields[i].unit * 1.01;
        if (!same)
            fail_msg("README.md's step %d of %s shows %s %s; the command prints %s %s under OpenBLAS's %s kernels:\n"
                     "  README: %s\n  run:    %.*s", step, cmd, fields[i].name, want, fields[i].name, got, set, quoted,
                     (int)strcspn(printed, "\n"), printed);
    }
    free(out);
}

// "Reading the output": "here step S of `CMD`", then the line in the next ```
// block; under every OpenBLAS kernel set a reader can have that this CPU
// runs (handout_check.py --cores: the trainers' own here, Haswell,
// SkylakeX, Prescott).
static void test_sample_step_line(void **state) {
    const Ctx *c = *state;
    const char *p = after(c, "here step ");
    int step = atoi(p);
    const char *tick = strchr(p, '`');
    assert_non_null(tick);
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(tick + 1, "`"), tick + 1);
    const char *block = strstr(tick, "```\n");
    assert_non_null(block);
    char quoted[512];
    snprintf(quoted, sizeof quoted, "%.*s", (int)strcspn(block + 4, "\n"), block + 4);
    char *sets = NULL;
    if (test_run("python3 tests/stages/handout_check.py --cores", &sets) != 0) fail_msg("no kernel sets:\n%s", sets);
    int runs = 0;
    for (char *line = strtok(sets, "\n"); line; line = strtok(NULL, "\n")) {
        char core[64], name[64], run[CMD_LEN + 128];
        if (sscanf(line, "%63s %63s", core, name) != 2) fail_msg("handout_check.py --cores printed '%s'", line);
        if (strcmp(core, "-") == 0) snprintf(run, sizeof run, "%s", cmd);
        else snprintf(run, sizeof run, "OPENBLAS_CORETYPE=%s %s", core, cmd);
        step_line_as_quoted(run, name, step, quoted);
        runs++;
    }
    assert_true(runs >= 2);  // the trainers' own set and Prescott at least
    free(sets);
}

// A category's device peak (MB): what the blocks keep rises and falls
// within each step, so the figure the README quotes is its peak.
static double device_mb(json_t *rec, const char *category) {
    json_t *v = json_object_get(json_object_get(json_object_get(json_object_get(rec, "mem"), "device"), category),
                                "peak");
    if (!v) fail_msg("no mem.device.%s.peak in the record", category);
    return json_number_value(v) / 1e6;
}

// "Activations": "CMD  # the same losses; activations A MB -> B + C MB": A
// without --recompute full, B kept and C the working set with it.
static void test_recompute_figures(void **state) {
    const Ctx *c = *state;
    const char *marker = "# the same losses; activations ";
    char cmd[CMD_LEN], plain[CMD_LEN];
    command_of_line(c, marker, cmd, sizeof cmd);
    double a, b, w;
    if (sscanf(after(c, marker), "%lf MB -> %lf + %lf MB", &a, &b, &w) != 3)
        fail_msg("README.md's \"%s\" line is not \"A MB -> B + C MB\"", marker);
    const char *flag = strstr(cmd, " --recompute full");
    assert_non_null(flag);
    snprintf(plain, sizeof plain, "%.*s%s", (int)(flag - cmd), cmd, flag + strlen(" --recompute full"));
    json_t *full = run_record(c, "recompute-full", cmd, NULL), *none = run_record(c, "recompute-none", plain, NULL);
    char want[64], got[64];
    snprintf(want, sizeof want, "%.1f -> %.1f + %.1f", a, b, w);
    snprintf(got, sizeof got, "%.1f -> %.1f + %.1f", device_mb(none, "activations"), device_mb(full, "activations"),
             device_mb(full, "act_working"));
    if (strcmp(want, got) != 0) fail_msg("README.md says activations %s MB; %s and without the flag print %s MB", want,
                                         cmd, got);
    json_t *la = json_object_get(full, "losses"), *lb = json_object_get(none, "losses");
    assert_true(json_array_size(la) > 0 && json_array_size(la) == json_array_size(lb));
    for (size_t i = 0; i < json_array_size(la); i++)
        if (json_number_value(json_array_get(la, i)) != json_number_value(json_array_get(lb, i)))
            fail_msg("README.md says the same losses; step %zu differs with --recompute full", i + 1);
    json_decref(full);
    json_decref(none);
}

// "Formats you already have": "CMD  # fp16, scale S".
static void test_fp16_config_scale(void **state) {
    const Ctx *c = *state;
    const char *marker = "# fp16, scale ";
    char cmd[CMD_LEN], *out = NULL;
    command_of_line(c, marker, cmd, sizeof cmd);
    long scale = atol(after(c, marker));
    json_t *rec = run_record(c, "fp16-config", cmd, &out);
    assert_string_equal(json_string_value(json_object_get(rec, "precision")), "fp16");
    double first = json_number_value(json_array_get(json_object_get(rec, "loss_scales"), 0));
    if (first != (double)scale) fail_msg("README.md says scale %ld; %s's first step used %g", scale, cmd, first);
    free(out);
    json_decref(rec);
}

static int group_setup(void **state) {
    if (need_paths("test_readme", (const char *const[]){"./zero2", "./zero3", "./cpu_offload", NULL})) return 1;
    Ctx *c = calloc(1, sizeof *c);
    c->readme = read_file("README.md", NULL);
    if (!c->readme || test_make_dir(c->root, sizeof c->root, "test_readme")) return 1;
    *state = c;
    return 0;
}

static int group_teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root);
    free(c->readme);
    free(c);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_step_line),
        cmocka_unit_test(test_recompute_figures),
        cmocka_unit_test(test_fp16_config_scale),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
