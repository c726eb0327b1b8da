// test_memory_timeline.c: --memory-timeline FILE (issue 46, "each step's
// memory timeline, measured"), run as programs:
//   - the file is Chrome-trace JSON that a parser reads: counters of the
//     device's bytes by category, the step's phases as spans, and each
//     allocation and release with its category, bytes, arena offset and
//     phase;
//   - replaying its allocations and releases from the step's starting
//     bytes gives every counter sample, and the largest device total is the
//     report's device peak to the byte, on every stage, at 2 ranks;
//   - zero3 shows its gathers rise and fall unit by unit within the
//     forward and the backward phases;
//   - --memory-timeline-step picks the step; with --trace both files hold
//     the memory events;
//   - a rank that runs out of memory writes its timeline up to the failure;
//   - a device, a link or a folder, a step past --steps, or the step flag
//     alone, is refused in one line.
// Run from the repository root after make.
#include <jansson.h>
#include <sys/stat.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048

typedef RunDir Ctx;

static json_t *load_json(const char *path) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) fail_msg("%s: not JSON (%s, line %d)", path, e.text, e.line);
    return j;
}

static json_t *record_of(const char *json_path) {
    char *line = last_line(json_path);
    if (!line) fail_msg("no record in %s", json_path);
    json_error_t e;
    json_t *j = json_loads(line, 0, &e);
    free(line);
    if (!j) fail_msg("%s: the record is not JSON (%s)", json_path, e.text);
    return j;
}

static double sum_args(json_t *args) {
    double s = 0;
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v) s += json_number_value(v);
    return s;
}

// Checks the file's structure for every rank and returns the largest device
// total over ranks; *phases counts the spans of rank 0 whose kind is `kind`
// (NULL: not counted).
static double check_timeline(json_t *tl, const char *kind, int *phases, int *gathers_in_forward) {
    json_t *ev = json_object_get(tl, "traceEvents");
    if (!json_is_array(ev) || json_array_size(ev) == 0) fail_msg("no traceEvents");
    double largest = 0;
    long long bytes[64][16] = {{0}};  // [rank][category] as the events change them
    int have_start[64] = {0};
    size_t i;
    json_t *e;
    if (phases) *phases = 0;
    if (gathers_in_forward) *gathers_in_forward = 0;
    json_array_foreach(ev, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        int pid = (int)json_integer_value(json_object_get(e, "pid"));
        assert_non_null(ph);
        assert_non_null(name);
        assert_true(pid >= 0 && pid < 64);
        json_t *args = json_object_get(e, "args");
        if (!strcmp(ph, "C") && !strcmp(name, "device bytes")) {
            // a sample is the bytes after the event before it: the replay agrees
            const char *cat;
            json_t *v;
            int k = 0;
            json_object_foreach(args, cat, v) {
                if (have_start[pid] && bytes[pid][k] != (long long)json_number_value(v))
                    fail_msg("rank %d's %s: the sample says %.0f, the events before it %lld", pid, cat,
                             json_number_value(v), bytes[pid][k]);
                bytes[pid][k++] = (long long)json_number_value(v);
            }
            have_start[pid] = 1;
            double total = sum_args(args);
            if (total > largest) largest = total;
        } else if (!strcmp(ph, "i")) {
            const char *tier = json_string_value(json_object_get(args, "tier"));
            const char *cat = json_string_value(json_object_get(args, "category"));
            json_t *phase = json_object_get(args, "phase");
            assert_non_null(tier);
            assert_non_null(cat);
            assert_non_null(json_object_get(args, "offset"));
            assert_non_null(json_object_get(phase, "kind"));
            long long delta = json_integer_value(json_object_get(args, "bytes"));
            assert_true(delta != 0 && (name[0] == '+') == (delta > 0));
            if (!strcmp(tier, "device")) {
                static const char *const CATS[] = {"params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v",
                                                   "grads_accum_fp32", "params_hpz", "activations", "act_working",
                                                   "comm_buffers", "workspace"};
                int k = -1;
                for (int c = 0; c < 11; c++)
                    if (!strcmp(CATS[c], cat)) k = c;
                if (k < 0) fail_msg("unknown category %s", cat);
                bytes[pid][k] += delta;
                assert_true(bytes[pid][k] >= 0);
            }
            if (gathers_in_forward && pid == 0 && strstr(name, "gathered unit params") &&
                !strcmp(json_string_value(json_object_get(phase, "kind")), "forward"))
                (*gathers_in_forward)++;
        } else if (!strcmp(ph, "X") && phases && pid == 0) {
            json_t *p = json_object_get(json_object_get(e, "args"), "phase");
            if (!strcmp(json_string_value(json_object_get(p, "kind")), kind)) (*phases)++;
            assert_true(json_number_value(json_object_get(e, "dur")) >= 0);
        }
    }
    return largest;
}

// The stage's run with --memory-timeline and --json: its file and record.
static void run_with_timeline(Ctx *c, const char *tag, const char *args, json_t **tl, json_t **rec) {
    char cmd[CMD_LEN], path[PATH_LEN], json[PATH_LEN];
    snprintf(path, sizeof path, "%s/%s-timeline.json", c->root, tag);
    snprintf(json, sizeof json, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, "%s --quiet --memory-timeline %s --json %s", args, path, json);
    free(train(cmd, json));
    *tl = load_json(path);
    *rec = record_of(json);
}

static double device_peak(json_t *rec) {
    return json_number_value(json_object_get(json_object_get(json_object_get(rec, "mem"), "device"), "peak_total"));
}

// The issue's own command, then every stage at 2 ranks: the largest total
// on the timeline is the device peak.
static void test_largest_total_is_the_peak(void **state) {
    Ctx *c = *state;
    static const char *const RUNS[][2] = {
        {"zero3", "mpirun -np 2 ./zero3 --model small --steps 3"},
        {"dp", "mpirun -np 2 ./dp_baseline --model tiny --steps 2"},
        {"zero1", "mpirun -np 2 ./zero1 --model tiny --steps 2"},
        {"zero2", "mpirun -np 2 ./zero2 --model tiny --steps 2 --grad-accum 2"},
        {"zero3-p0", "mpirun -np 2 ./zero3 --model tiny --steps 2 --prefetch 0 --recompute full"},
        {"offload", "mpirun -np 2 ./cpu_offload --model tiny --steps 2"},
        {"tp2", "mpirun -np 2 ./3d_parallel --model tiny --steps 2 --tp 2"},
        {"pp2", "mpirun -np 2 ./3d_parallel --model tiny --steps 2 --pp 2 --grad-accum 2"},
    };
    for (size_t k = 0; k < sizeof RUNS / sizeof RUNS[0]; k++) {
        json_t *tl, *rec;
        run_with_timeline(c, RUNS[k][0], RUNS[k][1], &tl, &rec);
        double largest = check_timeline(tl, NULL, NULL, NULL), peak = device_peak(rec);
        if (largest != peak) fail_msg("%s: the timeline's largest device total is %.0f B, the report's peak %.0f B",
                                      RUNS[k][1], largest, peak);
        json_decref(tl);
        json_decref(rec);
    }
}

// zero3: a forward span per unit of the micro-batch, and units gathered while
// the forward runs (the prefetch's rise and fall).
static void test_zero3_phases_and_gathers(void **state) {
    Ctx *c = *state;
    json_t *tl, *rec;
    run_with_timeline(c, "zero3-phases", "mpirun -np 2 ./zero3 --model small --steps 2 --grad-accum 2", &tl, &rec);
    int forwards = 0, gathers = 0;
    check_timeline(tl, "forward", &forwards, &gathers);
    // small: 6 units (embeddings, 4 blocks, head), 2 micro-batches, and the
    // span of each micro-batch's forward before its first unit
    if (forwards != 2 * 6 + 2) fail_msg("%d forward spans on rank 0, expected 14", forwards);
    if (gathers < 2 * 4) fail_msg("%d gathers during forward spans, expected at least 8", gathers);
    int steps_named = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(tl, "traceEvents"), i, e) {
        const char *n = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
        if (n && strstr(n, "memory phases (step 2)")) steps_named++;
    }
    assert_int_equal(steps_named, 2);  // the last step by default, on both ranks
    json_decref(tl);
    json_decref(rec);
}

// --memory-timeline-step 1 records step 1; with --trace the trace file holds
// the memory counters too.
static void test_step_flag_and_trace(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], path[PATH_LEN], trace[PATH_LEN];
    snprintf(path, sizeof path, "%s/step1.json", c->root);
    snprintf(trace, sizeof trace, "%s/trace.json", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero2 --model tiny --steps 3 --quiet --memory-timeline %s "
             "--memory-timeline-step 1 --trace %s", path, trace);
    run_ok(cmd, NULL);
    char *text = read_file(path, NULL);
    assert_non_null(strstr(text, "memory phases (step 1)"));
    free(text);
    json_t *t = load_json(trace);  // still valid JSON with the memory events in it
    text = json_dumps(t, JSON_COMPACT);
    assert_non_null(strstr(text, "\"device bytes\""));
    assert_non_null(strstr(text, "\"ph\":\"X\""));
    free(text);
    json_decref(t);
}

// A run that runs out of memory writes what it recorded up to there and
// says where: test_budget's run at its byte count, whose blocks do not fit
// (its budget check refuses it before step 1 now; a check counting bytes
// alone, planted, lets it start).
static void test_out_of_memory_writes_the_timeline(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], path[PATH_LEN], json[PATH_LEN], *out = NULL;
    snprintf(json, sizeof json, "%s/count.json", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero3 --model small --prefetch 2 --steps 2 --quiet --json %s", json);
    char *rec = train(cmd, json);
    double need = number_of(strstr(rec, "\"device_need\""), "total");
    free(rec);
    snprintf(path, sizeof path, "%s/oom.json", c->root);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 build/tests/stages/planted_timeline_bytes --model small --prefetch 2 "
             "--steps 2 --quiet --hbm-gb %.12g --memory-timeline %s", (need + 1) / 1e9, path);
    int rc = test_run(cmd, &out);
    if (rc != 2 || !strstr(out, "the memory timeline up to here") || !strstr(out, "during "))
        fail_msg("%s: exit %d:\n%s", cmd, rc, out);
    free(out);
    json_t *tl = load_json(path);
    check_timeline(tl, NULL, NULL, NULL);
    json_decref(tl);
}

static void test_bad_input(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], link[PATH_LEN];
    free(expect_refusal("./zero2 --model tiny --steps 2 --memory-timeline /dev/null", "--memory-timeline"));
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 2 --memory-timeline %s", c->root);
    free(expect_refusal(cmd, "--memory-timeline"));
    snprintf(link, sizeof link, "%s/link.json", c->root);
    assert_int_equal(symlink("/tmp/elsewhere.json", link), 0);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 2 --memory-timeline %s", link);
    free(expect_refusal(cmd, "link"));
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 2 --memory-timeline %s/t.json --memory-timeline-step 3",
             c->root);
    free(expect_refusal(cmd, "past --steps 2"));
    free(expect_refusal("./zero2 --model tiny --steps 2 --memory-timeline-step 1", "needs --memory-timeline"));
}

static int group_setup(void **state) {
    return run_dir_setup(state, "test_memory_timeline",
                         (const char *const[]){"./dp_baseline", "./zero1", "./zero2", "./zero3", "./cpu_offload",
                                               "./3d_parallel", "build/tests/stages/planted_timeline_bytes", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_largest_total_is_the_peak),
        cmocka_unit_test(test_zero3_phases_and_gathers),
        cmocka_unit_test(test_step_flag_and_trace),
        cmocka_unit_test(test_out_of_memory_writes_the_timeline),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, group_setup, run_dir_teardown);
}
