// test_tools.c: the helpers a student runs beside the trainers. make diff-NN
// says what each stage adds (00 the calculator, 01 the first trainer, the
// others a diff of their strategy files) and exits 0; scripts/plot_runs.py
// draws the four pictures of a set of runs, with names shown as written
// (gnuplot's enhanced text once drew "dp_baseline" as "dp" with a subscript
// b), a record's strings never run as gnuplot commands, and the README says
// where the pictures are; scripts/compare.py refuses a comparison without a
// spread.
#include <sys/stat.h>
#include <unistd.h>
#include "runs.h"

#define CMD_LEN 2048

static void test_stage_diffs(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("make --no-print-directory diff-00", &out);
    if (rc != 0 || !strstr(out, "calculator")) fail_msg("make diff-00: exit %d\n%s", rc, out);
    free(out);
    rc = test_run("make --no-print-directory diff-01", &out);
    if (rc != 0 || !strstr(out, "first trainer") || !strstr(out, "const Strategy strategy_dp_baseline"))
        fail_msg("make diff-01: exit %d\n%.500s", rc, out);
    if (strstr(out, "flags_parse")) fail_msg("make diff-01 shows the flag parser, not the trainer:\n%.500s", out);
    free(out);
    // zero2 over zero1: its own strategy, and nothing of memory_math's parser
    rc = test_run("make --no-print-directory diff-03", &out);
    if (rc != 0 || !strstr(out, "+static int flags(void *ctx, FlagSpec *out)") || !strstr(out, "grad_shard.c"))
        fail_msg("make diff-03: exit %d\n%.800s", rc, out);
    free(out);
    // a common/ file every stage runs shows only the stage's lab region:
    // 05's SIMD Adam tile, not the cpu device's Adam around it; 07's f and g
    rc = test_run("make --no-print-directory diff-05", &out);
    if (rc != 0 || !strstr(out, "lab 05's region in common/device/cpu_adam_avx2.c") ||
        !strstr(out, "+// LAB 05: cpu_adam_tile_avx2") || strstr(out, "cpu_adam_scalar.c"))
        fail_msg("make diff-05: exit %d\n%.800s", rc, out);
    free(out);
    rc = test_run("make --no-print-directory diff-07", &out);
    if (rc != 0 || !strstr(out, "+// LAB 07: f_and_g") || !strstr(out, "common/model/gpt_tp.c"))
        fail_msg("make diff-07: exit %d\n%.800s", rc, out);
    free(out);
}

static void test_plot_runs(void **state) {
    (void)state;
    char root[64], cmd[CMD_LEN], json[256];
    assert_int_equal(test_make_dir(root, sizeof root, "plots"), 0);
    snprintf(json, sizeof json, "%s/runs.json", root);
    const char *stages[2] = {"dp_baseline", "zero3"};
    for (int s = 0; s < 2; s++) {
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./%s --model tiny --steps 3 --quiet --json %s", stages[s], json);
        char *out = NULL;
        int rc = test_run(cmd, &out);
        if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "python3 scripts/plot_runs.py %s %s/demo", json, root);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    // the terminal drawing carries the curves' titles as written; the two
    // runs' losses are equal to the bit, so they share one curve and its title
    if (!strstr(out, "N=2: dp_baseline, zero3 (equal to the bit)")) fail_msg("titles not as written:\n%s", out);
    const char *pics[4] = {"losses", "memory", "comm", "timeline"};  // the last: each run's step, a panel each
    for (int i = 0; i < 4; i++) {
        char png[320];
        snprintf(png, sizeof png, "%s/demo_%s.png", root, pics[i]);
        struct stat st;
        if (stat(png, &st) != 0 || st.st_size < 1000) fail_msg("%s missing or empty\n%s", png, out);
    }
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

// Issue 37: zero3 with ZeRO++ is named by its switches, its loss curve
// apart from zero3's, and its bytes by hop in the host and across hosts
// drawn in a picture of their own (hpZ alone shares zero3's curve: the same bits).
static void test_plot_runs_zeropp(void **state) {
    (void)state;
    char root[64], cmd[CMD_LEN], json[256];
    assert_int_equal(test_make_dir(root, sizeof root, "plots-zeropp"), 0);
    snprintf(json, sizeof json, "%s/runs.json", root);
    const char *modes[3] = {"", "--hpz-size 2", "--quantize-weights --quantize-grads --grad-quant-bits 4"};
    for (int m = 0; m < 3; m++) {
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero3 --model tiny --steps 3 --quiet --json %s %s", json, modes[m]);
        char *out = NULL;
        int rc = test_run(cmd, &out);
        if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "python3 scripts/plot_runs.py %s %s/z", json, root);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    if (!strstr(out, "N=2: zero3, zero3 hpZ2 (equal to the bit)") || !strstr(out, "zero3 N=2 qwZ qgZ4"))
        fail_msg("the curves' titles do not name the switches:\n%s", out);
    char png[320];
    snprintf(png, sizeof png, "%s/z_hosts.png", root);
    struct stat st;
    if (stat(png, &st) != 0 || st.st_size < 1000) fail_msg("%s missing or empty\n%s", png, out);
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

// Issue 49, item 22: a record whose zeropp.hpz was the string "2" ended
// plot_runs.py in a traceback (TypeError), as did a line that is not JSON;
// and a one-rank ZeRO++ run (no byte by hop) in a gnuplot error and a
// traceback. Each bad line is refused in one line naming it, exit 2; the
// one-rank run is drawn without its hosts picture.
static void test_plot_runs_bad_records(void **state) {
    (void)state;
    char root[64], cmd[CMD_LEN], *out = NULL;
    assert_int_equal(test_make_dir(root, sizeof root, "plot-bad"), 0);
    snprintf(cmd, sizeof cmd, "./zero3 --model tiny --steps 2 --quiet --quantize-weights --json %s/one.json && "
             "python3 scripts/plot_runs.py %s/one.json %s/one", root, root, root);
    run_ok(cmd, &out);
    if (!strstr(out, "pictures: ") || strstr(out, "_hosts.png")) fail_msg("the one-rank run is not drawn:\n%s", out);
    free(out);
    const char *edits[][2] = {
        {"r['zeropp']['hpz'] = '2'", "line 1: zeropp.hpz is \"2\", where a trainer's record has a whole number"},
        {"r['losses'][1] = 'x'", "line 1: losses[1] is \"x\", where a trainer's record has a number"},
        {"del r['stage']", "line 1: it has no \"stage\""},
        {"r = 'x'", "line 1: it is \"x\", not a JSON object"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        snprintf(cmd, sizeof cmd, "python3 -c \"import json; r = json.loads(open('%s/one.json').read()); %s; "
                 "open('%s/bad.json', 'w').write(json.dumps(r) + '\\n')\" && python3 scripts/plot_runs.py "
                 "%s/bad.json %s/bad", root, edits[i][0], root, root, root);
        free(expect_refusal(cmd, edits[i][1]));
    }
    snprintf(cmd, sizeof cmd, "echo 'not json' > %s/bad.json && python3 scripts/plot_runs.py %s/bad.json %s/bad",
             root, root, root);
    free(expect_refusal(cmd, "line 1: it is not JSON (Expecting value"));
    assert_int_equal(test_remove_dir(root), 0);
}

// Issue 39 item 4: labels went into gnuplot's title '...' as they were: a
// record whose stage is  zero2' ; system('touch F') ; x='  made gnuplot run
// touch, and a plain apostrophe ended the plot in a gnuplot error. Item 19:
// a title wider than the terminal drawing overran its key ("N=4:
// dp_bas*******zero1, ..."). One record renamed ten ways (the same losses:
// one curve whose title names them all): nothing runs, the four pictures are
// drawn, and the terminal's legend gives every name whole (a name wrapped at
// a space counts whole; a newline in one is a space).
static void test_plot_runs_strings(void **state) {
    (void)state;
    char root[64], cmd[CMD_LEN], *out = NULL;
    assert_int_equal(test_make_dir(root, sizeof root, "plot-strings"), 0);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./dp_baseline --model tiny --steps 2 --quiet --json %s/one.json", root);
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    free(out);
    static const char *const names[] = {
        "zero2' ; system('touch %s/pwned') ; x='", "it's", "say \"hi\"", "new\nline", "back\\slash",
        "stage_with_a_long_name_one", "stage_with_a_long_name_two", "stage_with_a_long_name_three",
        "stage_with_a_long_name_four", "@{x}_^2"};
    const int count = (int)(sizeof names / sizeof names[0]);
    char script[320], name[256];
    snprintf(script, sizeof script, "%s/rename.py", root);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fprintf(f, "import json, sys\nrec = json.loads(open(sys.argv[1]).read().splitlines()[-1])\nnames = [\n");
    for (int i = 0; i < count; i++) {
        snprintf(name, sizeof name, names[i], root);
        fputs("    \"", f);
        for (const char *c = name; *c; c++) fprintf(f, *c == '\n' ? "\\n" : strchr("\"\\", *c) ? "\\%c" : "%c", *c);
        fputs("\",\n", f);
    }
    fprintf(f, "]\nwith open(sys.argv[2], 'w') as out:\n"
               "    for n in names:\n        out.write(json.dumps(dict(rec, stage=n)) + '\\n')\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 %s %s/one.json %s/renamed.json && python3 scripts/plot_runs.py %s/renamed.json %s/p",
             script, root, root, root, root);
    rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    snprintf(cmd, sizeof cmd, "test ! -e %s/pwned", root);
    if (test_run(cmd, NULL) != 0) fail_msg("a stage's name ran a command through gnuplot:\n%s", out);
    const char *pics[4] = {"losses", "memory", "comm", "timeline"};  // the last: each run's step, a panel each
    for (int i = 0; i < 4; i++) {
        char png[320];
        snprintf(png, sizeof png, "%s/p_%s.png", root, pics[i]);
        struct stat st;
        if (stat(png, &st) != 0 || st.st_size < 1000) fail_msg("%s missing or empty\n%s", png, out);
    }
    // the legend's wrapped lines joined again, as it reads
    char *joined = strdup(out);
    for (char *p = joined; (p = strstr(p, "\n      ")); p++) memmove(p, p + 6, strlen(p + 6) + 1), *p = ' ';
    for (int i = 0; i < count; i++) {
        snprintf(name, sizeof name, names[i], root);
        for (char *c = name; *c; c++) if (*c == '\n') *c = ' ';
        if (!strstr(joined, name)) fail_msg("the name \"%s\" is not printed whole:\n%s", name, out);
    }
    free(joined);
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

// Issue 39 item 19: runs/ and scripts/plot_runs.py were not in the README.
// It names the script, the demo's records and each picture it draws.
static void test_readme_names_the_pictures(void **state) {
    (void)state;
    char *readme = read_file("README.md", NULL);
    assert_non_null(readme);
    const char *needed[] = {"python3 scripts/plot_runs.py ", "runs/demo.json", "runs/demo_losses.png",
                            "runs/demo_memory.png", "runs/demo_comm.png", "runs/demo_timeline.png"};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!strstr(readme, needed[i])) fail_msg("README.md does not name %s", needed[i]);
    free(readme);
}

static void test_compare_needs_a_spread(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("python3 scripts/compare.py --repeats 1 './zero2 --model tiny --steps 1'", &out);
    if (rc == 0 || !strstr(out, "--repeats")) fail_msg("compare.py --repeats 1: exit %d\n%s", rc, out);
    free(out);
}

// bench-compare: a drop beyond the measured spread is a regression (exit
// 1), one within it is noise; more peak memory is a regression; a section
// that failed now but ran before is one too.
static void write_results(const char *path, double tps, double lo, double hi, double peak, int aio_failed) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"schema\":1,\"commit\":\"x\",\"machine\":{\"cpu\":\"test cpu\",\"cores\":2},\"sections\":{"
               "\"training\":{\"stages\":{\"zero2\":{\"tokens_per_s\":%g,\"tokens_per_s_min\":%g,"
               "\"tokens_per_s_max\":%g,\"peak_device_bytes_per_rank\":%g}}},\"aio\":%s}}\n",
            tps, lo, hi, peak, aio_failed ? "{\"failed\":true,\"exit\":1}" : "{\"best_gbps\":1.0}");
    fclose(f);
}

static void test_bench_compare(void **state) {
    (void)state;
    char root[64], base[128], noise[128], slow[128], fat[128], broke[128], cmd[512];
    assert_int_equal(test_make_dir(root, sizeof root, "compare"), 0);
    snprintf(base, sizeof base, "%s/base.json", root);
    snprintf(noise, sizeof noise, "%s/noise.json", root);
    snprintf(slow, sizeof slow, "%s/slow.json", root);
    snprintf(fat, sizeof fat, "%s/fat.json", root);
    snprintf(broke, sizeof broke, "%s/broke.json", root);
    write_results(base, 1000, 950, 1060, 5e6, 0);   // spread 11%
    write_results(noise, 930, 900, 980, 5e6, 0);    // -7%: within the spread
    write_results(slow, 800, 780, 820, 5e6, 0);     // -20%: beyond it
    write_results(fat, 1000, 950, 1060, 6e6, 0);    // more memory
    write_results(broke, 1000, 950, 1060, 5e6, 1);  // a section failed
    const char *news[4] = {noise, slow, fat, broke};
    const int want_rc[4] = {0, 1, 1, 1};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "python3 bench/compare.py %s %s", base, news[i]);
        char *out = NULL;
        int rc = test_run(cmd, &out);
        if (rc != want_rc[i] || (want_rc[i] && !strstr(out, "REGRESSION")) || (!want_rc[i] && !strstr(out, "within spread")))
            fail_msg("%s: exit %d (want %d)\n%s", cmd, rc, want_rc[i], out);
        free(out);
    }
    assert_int_equal(test_remove_dir(root), 0);
}

// make bench keeps what finished: a failing section is marked failed (with
// its log) and the results still hold the sections that ran, the machine
// and the commit.
static void test_bench_keeps_finished_sections(void **state) {
    (void)state;
    char root[64], cmd[1024];
    assert_int_equal(test_make_dir(root, sizeof root, "bench"), 0);  // the user's build/bench stays untouched
    snprintf(cmd, sizeof cmd, "BENCH_OUT=%s BENCH_ONLY='sgemm aio' AIO_DIR=/dev/null/no-such bash bench/run.sh && "
             "python3 -c \"import json; r = json.load(open('%s/results.json')); "
             "s = r['sections']; print('sgemm', s['sgemm']['sgemm_gflops'] > 0, 'aio', s['aio']['failed'], "
             "'cpu', bool(r['machine']['cpu']), 'commit', len(r['commit']))\"", root, root);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 0 || !strstr(out, "sgemm True aio True cpu True commit 40") || !strstr(out, "aio FAILED"))
        fail_msg("make bench with a failing section: exit %d\n%s", rc, out);
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

// The CPU Adam benchmark starts and prints its JSON (it once stopped at its
// own flags, which declared no range, and make bench lost the section).
static void test_cpu_adam_bench_runs(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("bash bench/cpu_adam.sh --params 1M --rounds 1 2>/dev/null", &out);
    if (rc != 0 || !strstr(out, "\"adam_to_triad\"") || !strstr(out, "\"best_to_scalar\""))
        fail_msg("bench/cpu_adam.sh --params 1M --rounds 1: exit %d\n%.500s", rc, out);
    free(out);
}

// scripts/offline-deps.sh lists what apt would add to a machine whose dpkg
// status it is given: here, this machine's status less the cmocka
// packages: exactly those, nothing it has. A file that is not a dpkg status
// is refused in one line.
static void test_offline_deps_list(void **state) {
    (void)state;
    char root[64], cmd[CMD_LEN];
    assert_int_equal(test_make_dir(root, sizeof root, "offline"), 0);
    snprintf(cmd, sizeof cmd, "awk -v RS= -v ORS='\\n\\n' '!/^Package: (lib)?cmocka/' /var/lib/dpkg/status > %s/status",
             root);
    assert_int_equal(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "bash scripts/offline-deps.sh list %s/status", root);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 0 || !strstr(out, "libcmocka-dev\n") || !strstr(out, "libcmocka0\n") || count_lines(out) > 3)
        fail_msg("%s: exit %d, expected the cmocka packages alone:\n%s", cmd, rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "bash scripts/offline-deps.sh list /etc/passwd");
    free(expect_refusal(cmd, "not a dpkg status file"));
    assert_int_equal(test_remove_dir(root), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_diffs),
        cmocka_unit_test(test_offline_deps_list),
        cmocka_unit_test(test_plot_runs),
        cmocka_unit_test(test_plot_runs_strings),
        cmocka_unit_test(test_plot_runs_zeropp),
        cmocka_unit_test(test_plot_runs_bad_records),
        cmocka_unit_test(test_readme_names_the_pictures),
        cmocka_unit_test(test_compare_needs_a_spread),
        cmocka_unit_test(test_bench_compare),
        cmocka_unit_test(test_bench_keeps_finished_sections),
        cmocka_unit_test(test_cpu_adam_bench_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
