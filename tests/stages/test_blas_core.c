// test_blas_core.c: the cpu device's choice of OpenBLAS kernels
// (common/device/cpu/blas_core.c). The decision table alone; then whole
// trainers under a preloaded shim (tests/lib/blas_shim.c) that makes
// OpenBLAS "detect" a core below this CPU, plants a wrong sgemm in one core,
// and logs every process image, so the restarts are counted:
// - a fallback core is replaced by the best this CPU allows (one restart per
//   rank), named in the header line and the JSON, with the same losses as a
//   run told that core;
// - a switched core that fails the self-test is undone (a second restart),
//   and the run trains on the detected kernels, saying why;
// - a core set in the environment is never overridden, and a core that
//   OpenBLAS identified is kept: no restart;
// - the core's name reaches the JSON record escaped, and the restart's
//   markers are believed only from the restart;
// - a core set in the environment that needs more than the CPU has is
//   refused in one line (an AVX2-only CPU simulated by ZW_CPU_ISA=AVX2), and
//   a name OpenBLAS has no kernels for is said to be one;
// - a trainer started through the dynamic loader restarts through it.
// The best core is read from /proc/cpuinfo's flags here, apart from the
// cpuid code under test.
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <unistd.h>
#include "blas_core.h"
#include "runs.h"

#define CMD_LEN 4096
#define PATH_LEN 512

typedef struct Ctx {
    char root[64];
    char preload[2 * PATH_LEN];  // the shim; after ASan's runtime where the trainers link it (make sanitize)
    char best[32];  // the core this CPU's flags allow, "" where none beats SSE3
} Ctx;

// ---- the decision table ----

static void test_upgrade_table(void **state) {
    (void)state;
    assert_string_equal(blas_core_upgrade("Prescott", NULL, ISA_AVX512), "SkylakeX");
    assert_string_equal(blas_core_upgrade("Prescott", "", ISA_AVX2), "Haswell");
    assert_string_equal(blas_core_upgrade("Haswell", NULL, ISA_AVX512), "SkylakeX");
    assert_string_equal(blas_core_upgrade("Nehalem", NULL, ISA_AVX), "Sandybridge");
    // the environment's core stands, even a slow one
    assert_null(blas_core_upgrade("Prescott", "Prescott", ISA_AVX512));
    assert_null(blas_core_upgrade("Prescott", "Haswell", ISA_AVX512));
    // a core at (or above) the CPU's level is kept
    assert_null(blas_core_upgrade("Zen", NULL, ISA_AVX2));
    assert_null(blas_core_upgrade("Cooperlake", NULL, ISA_AVX512));
    assert_null(blas_core_upgrade("SkylakeX", NULL, ISA_AVX2));
    assert_null(blas_core_upgrade("Prescott", NULL, ISA_SSE3));
    // a name this table does not know is left alone
    assert_null(blas_core_upgrade("Armv8", NULL, ISA_AVX512));
    assert_int_equal(blas_core_isa("skylakex"), ISA_AVX512);
    assert_int_equal(blas_core_isa("Bogus"), ISA_NONE);
}

static void test_self_test_passes_on_the_running_core(void **state) {
    (void)state;
    char why[256] = "";
    if (blas_core_self_test(why, sizeof why) != 0)
        fail_msg("the running OpenBLAS core %s fails the self-test: %s", blas_core_running(), why);
}

// ---- whole runs ----

// The command's prefix: no core in the environment unless `core` is given,
// the shim preloaded, its log at `log`.
static void env_prefix(const Ctx *c, char *out, size_t n, const char *core, const char *detect, const char *bad,
                       const char *log) {
    snprintf(out, n, "env -u OPENBLAS_CORETYPE -u ZW_BLAS_CHOSEN -u ZW_BLAS_KEPT %s%s LD_PRELOAD=%s SHIM_LOG=%s "
                     "SHIM_DETECT=%s%s%s",
             core ? "OPENBLAS_CORETYPE=" : "", core ? core : "", c->preload, log, detect, bad ? " SHIM_BAD_CORE=" : "",
             bad ? bad : "");
}

// Runs 2 ranks of dp_baseline for 3 steps; returns its output and its JSON
// record (both malloc'd) and how many process images each rank loaded.
static int run_counted(const Ctx *c, const char *name, const char *core, const char *detect, const char *bad,
                       char **out, char **json) {
    char prefix[CMD_LEN / 2], cmd[CMD_LEN], log[PATH_LEN], js[PATH_LEN];
    snprintf(log, sizeof log, "%s/%s.log", c->root, name);
    snprintf(js, sizeof js, "%s/%s.json", c->root, name);
    env_prefix(c, prefix, sizeof prefix, core, detect, bad, log);
    snprintf(cmd, sizeof cmd, "%s mpirun -np 2 ./dp_baseline --model tiny --steps 3 --json %s", prefix, js);
    *json = train_output(cmd, js, out);
    // one line per image; the images of a rank share its pid
    char *text = read_file(log, NULL);
    assert_non_null(text);
    int lines = count_lines(text);
    free(text);
    return lines / 2;
}

// The 3 steps' losses of two records, to the bit.
static void expect_same_losses(const char *json, const char *json_ref) {
    double l[3], r[3];
    losses_of(json, l, 3);
    losses_of(json_ref, r, 3);
    for (int i = 0; i < 3; i++)
        if (memcmp(&l[i], &r[i], sizeof l[i]) != 0) fail_msg("step %d: %.9g against %.9g", i + 1, l[i], r[i]);
}

static void test_fallback_core_is_replaced(void **state) {
    Ctx *c = *state;
    if (!c->best[0]) skip();  // an SSE3-only CPU: no kernel set beats the fallback
    char *out, *json, *out_ref, *json_ref;
    int images = run_counted(c, "switch", NULL, "Prescott", NULL, &out, &json);
    char want[128];
    snprintf(want, sizeof want, "OpenBLAS %s (chosen: detected Prescott below this CPU's", c->best);
    if (images != 2 || !strstr(out, want) || !strstr(json, want))
        fail_msg("expected one restart per rank and \"%s\" in the header and the JSON; %d images per rank:\n%s\n%s",
                 want, images, out, json);
    // the same losses as a run told that core: it is the same kernels
    int ref_images = run_counted(c, "told", c->best, "Prescott", NULL, &out_ref, &json_ref);
    assert_int_equal(ref_images, 1);
    expect_same_losses(json, json_ref);
    free(out), free(json), free(out_ref), free(json_ref);
}

static void test_core_failing_self_test_is_undone(void **state) {
    Ctx *c = *state;
    if (!c->best[0]) skip();
    char *out, *json, *out_ref, *json_ref;
    int images = run_counted(c, "bad", NULL, "Prescott", c->best, &out, &json);
    char want[160];
    snprintf(want, sizeof want, "OpenBLAS Prescott (kept: %s failed the self-test: sgemm", c->best);
    if (images != 3 || !strstr(out, want))
        fail_msg("expected two restarts per rank and \"%s\"; %d images per rank:\n%s", want, images, out);
    // it trained on the detected (here: Prescott's) kernels, untouched by the planted fault
    run_counted(c, "prescott", "Prescott", "Prescott", c->best, &out_ref, &json_ref);
    expect_same_losses(json, json_ref);
    free(out), free(json), free(out_ref), free(json_ref);
}

static void test_environment_core_is_never_overridden(void **state) {
    Ctx *c = *state;
    char *out, *json;
    int images = run_counted(c, "env", "Prescott", "Prescott", NULL, &out, &json);
    if (images != 1 || !strstr(out, "OpenBLAS Prescott (set by OPENBLAS_CORETYPE=Prescott)"))
        fail_msg("expected no restart and the environment's core named; %d images per rank:\n%s", images, out);
    free(out), free(json);
}

static void test_identified_core_is_kept(void **state) {
    Ctx *c = *state;
    if (!c->best[0]) skip();
    char *out, *json;
    // OpenBLAS "identifies" the CPU: it reports the best core itself
    int images = run_counted(c, "identified", NULL, c->best, NULL, &out, &json);
    char want[96];
    snprintf(want, sizeof want, "(detected by OpenBLAS)");
    if (images != 1 || !strstr(out, want))
        fail_msg("expected no restart and \"%s\"; %d images per rank:\n%s", want, images, out);
    free(out), free(json);
}

// Issue 49, item 18: OPENBLAS_CORETYPE went into the record's "device"
// string as it was, so 'Zen","stage":"zero1' changed the record's stage and
// a lone '"' made it invalid JSON. The record parses, its stage is the
// run's, and its device is the header's, to the byte (a byte that is not
// UTF-8 becomes U+FFFD there, as JSON text must be UTF-8).
static void test_core_name_escaped_in_the_record(void **state) {
    Ctx *c = *state;
    const char *cores[] = {"'Zen\",\"stage\":\"zero1'", "'\"'", "'back\\slash'", "$'Zen\\xe9'"};
    for (int i = 0; i < 4; i++) {
        char name[32], *out, *json;
        snprintf(name, sizeof name, "escaped-%d", i);
        run_counted(c, name, cores[i], "Prescott", NULL, &out, &json);
        json_error_t e;
        json_t *j = json_loads(json, 0, &e);
        if (!j) fail_msg("OPENBLAS_CORETYPE=%s: the record is not JSON (%s):\n%s", cores[i], e.text, json);
        const char *stage = json_string_value(json_object_get(j, "stage"));
        const char *device = json_string_value(json_object_get(j, "device"));
        if (!stage || strcmp(stage, "dp_baseline") != 0 || !device)
            fail_msg("OPENBLAS_CORETYPE=%s: the record's stage is %s, its device %s", cores[i], stage, device);
        int latin1 = strstr(cores[i], "xe9") != NULL;
        if (!latin1 && !strstr(out, device))
            fail_msg("OPENBLAS_CORETYPE=%s: the record's device \"%s\" is not the header's:\n%s", cores[i], device,
                     out);
        if (latin1 && strstr(out, "Zen\xe9") && !strstr(device, "Zen\xef\xbf\xbd"))
            fail_msg("OPENBLAS_CORETYPE=%s: expected Zen and U+FFFD in the record's device \"%s\"", cores[i], device);
        json_decref(j);
        free(out), free(json);
    }
}

// Issue 49, item 18: ZW_BLAS_KEPT or ZW_BLAS_CHOSEN set by hand made the
// header say a switch had been undone, or made, that never was (and KEPT
// stopped the switch). Markers that are not the restart's are dropped.
static void test_markers_only_from_the_restart(void **state) {
    Ctx *c = *state;
    char prefix[CMD_LEN / 2], cmd[CMD_LEN], log[PATH_LEN], *out = NULL;
    snprintf(log, sizeof log, "%s/markers.log", c->root);
    env_prefix(c, prefix, sizeof prefix, "Prescott", "Prescott", NULL, log);
    snprintf(cmd, sizeof cmd, "%s ZW_BLAS_CHOSEN='Zen>Prescott' ZW_BLAS_KEPT='Prescott>SkylakeX:made up' "
             "./dp_baseline --model tiny --steps 1", prefix);
    run_ok(cmd, &out);
    if (strstr(out, "made up") || strstr(out, "chosen: detected Zen") || !strstr(out, "OpenBLAS Prescott ("))
        fail_msg("the header believes markers set by hand:\n%s", out);
    free(out);
    if (!c->best[0]) return;
    // a KEPT set by hand no longer stops the switch from the fallback core
    env_prefix(c, prefix, sizeof prefix, NULL, "Prescott", NULL, log);
    snprintf(cmd, sizeof cmd, "%s ZW_BLAS_KEPT='Prescott>%s:made up' ./dp_baseline --model tiny --steps 1", prefix,
             c->best);
    run_ok(cmd, &out);
    char want[128];
    snprintf(want, sizeof want, "OpenBLAS %s (chosen: detected Prescott below this CPU's", c->best);
    if (strstr(out, "made up") || !strstr(out, want)) fail_msg("expected \"%s\":\n%s", want, out);
    free(out);
}

// Issue 49, item 7: OPENBLAS_CORETYPE=SkylakeX on an AVX2-only CPU died with
// SIGILL in sgemm_kernel_SKYLAKEX, and a name OpenBLAS ignores ("garbage",
// which runs the detected core) was reported as the core that ran. An
// AVX2-only CPU is simulated here with ZW_CPU_ISA=AVX2.
static void expect_one_line(const char *cmd, int status, const char *want) {
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != status || !strstr(out, want) || strchr(out, '\n') != out + strlen(out) - 1)
        fail_msg("%s: expected exit %d and one line with '%s'; got exit %d:\n%s", cmd, status, want, rc, out);
    free(out);
}

static void test_core_beyond_the_cpu_refused(void **state) {
    Ctx *c = *state;
    char prefix[CMD_LEN / 2], cmd[CMD_LEN], log[PATH_LEN];
    snprintf(log, sizeof log, "%s/beyond.log", c->root);
    env_prefix(c, prefix, sizeof prefix, "SkylakeX", "Prescott", NULL, log);
    snprintf(cmd, sizeof cmd, "%s ZW_CPU_ISA=AVX2 timeout 120 mpirun -np 2 ./dp_baseline --model tiny --steps 1",
             prefix);
    expect_one_line(cmd, 2, "error: OPENBLAS_CORETYPE=SkylakeX runs OpenBLAS's SkylakeX kernels, written for AVX-512, "
                            "which this CPU lacks (it has AVX2); hint: unset OPENBLAS_CORETYPE, or set it to Haswell");
    // the simulated CPU's own choice: a fallback goes up to Haswell, not SkylakeX
    if (c->best[0] && strcmp(c->best, "Sandybridge") != 0) {
        char *out = NULL;
        env_prefix(c, prefix, sizeof prefix, NULL, "Prescott", NULL, log);
        snprintf(cmd, sizeof cmd, "%s ZW_CPU_ISA=AVX2 mpirun -np 2 ./dp_baseline --model tiny --steps 1", prefix);
        const char *want = "OpenBLAS Haswell (chosen: detected Prescott below this CPU's AVX2)";
        if (test_run(cmd, &out) != 0 || !strstr(out, want))
            fail_msg("%s: expected Haswell chosen for an AVX2 CPU:\n%s", cmd, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "env ZW_CPU_ISA=AVX3 ./dp_baseline --model tiny --steps 1");
    expect_one_line(cmd, 2, "error: ZW_CPU_ISA=AVX3 is no instruction set; give SSE3, AVX, AVX2 or AVX-512");
}

static void test_unknown_core_named_as_such(void **state) {
    Ctx *c = *state;
    char prefix[CMD_LEN / 2], cmd[CMD_LEN], log[PATH_LEN], *out = NULL;
    snprintf(log, sizeof log, "%s/garbage.log", c->root);
    env_prefix(c, prefix, sizeof prefix, "garbage", "Prescott", NULL, log);
    snprintf(cmd, sizeof cmd, "%s ./dp_baseline --model tiny --steps 1", prefix);
    assert_int_equal(test_run(cmd, &out), 0);
    if (!strstr(out, "(OPENBLAS_CORETYPE=garbage names no kernel set of this OpenBLAS)") || strstr(out, "set by"))
        fail_msg("%s: expected the core that runs and the name said to be none:\n%s", cmd, out);
    free(out);
}

// Issue 49, item 8: started through the dynamic loader ('ld.so ./zero2
// --model tiny'), the restart ran /proc/self/exe, ld.so itself, with main's
// argv and died with "unrecognized option '--model'". It now restarts as the
// process was started: here ld.so preloads the shim by its own option,
// which only a restart that keeps ld.so's whole command line keeps.
static void test_restart_through_the_loader(void **state) {
    Ctx *c = *state;
    if (!c->best[0]) skip();
    char *ld = NULL;
    test_run("readelf -lW ./dp_baseline | sed -n 's/.*interpreter: \\(.*\\)]/\\1/p'", &ld);
    ld[strcspn(ld, "\n")] = 0;
    if (!ld[0]) {  // a static program: no loader
        free(ld);
        skip();
    }
    const char *bad[] = {NULL, c->best};  // a switch kept, and one undone by the self-test
    for (int i = 0; i < 2; i++) {
        char cmd[CMD_LEN], log[PATH_LEN], want[160], *out = NULL;
        snprintf(log, sizeof log, "%s/loader-%d.log", c->root, i);
        snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE -u ZW_BLAS_CHOSEN -u ZW_BLAS_KEPT SHIM_LOG=%s "
                 "SHIM_DETECT=Prescott%s%s mpirun -np 2 %s --preload %s ./dp_baseline --model tiny --steps 2", log,
                 bad[i] ? " SHIM_BAD_CORE=" : "", bad[i] ? bad[i] : "", ld, c->preload);
        if (bad[i]) snprintf(want, sizeof want, "OpenBLAS Prescott (kept: %s failed the self-test: sgemm", c->best);
        else snprintf(want, sizeof want, "OpenBLAS %s (chosen: detected Prescott below this CPU's", c->best);
        int rc = test_run(cmd, &out);
        char *text = read_file(log, NULL);
        int images = text ? count_lines(text) / 2 : 0;
        if (rc != 0 || !strstr(out, want) || images != 2 + i)
            fail_msg("%s: expected exit 0, \"%s\" and %d images per rank; exit %d, %d images:\n%s", cmd, want, 2 + i,
                     rc, images, out);
        free(text), free(out);
    }
    free(ld);
}

// ---- set-up ----

// The best core from the kernel's view of the CPU (its first flags line).
static void best_core_from_cpuinfo(char *out, size_t n) {
    static char line[16384];
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    while (fgets(line + 1, sizeof line - 2, f) && strncmp(line + 1, "flags", 5) != 0) {}
    fclose(f);
    // whole words: a space on both sides
    line[0] = ' ';
    char *nl = strchr(line, '\n');
    if (nl) nl[0] = ' ', nl[1] = 0;
#define HAS(flag) (strstr(line, " " flag " ") != NULL)
    if (HAS("avx512f") && HAS("avx512bw") && HAS("avx512dq") && HAS("avx512vl")) snprintf(out, n, "SkylakeX");
    else if (HAS("avx2") && HAS("fma")) snprintf(out, n, "Haswell");
    else if (HAS("avx")) snprintf(out, n, "Sandybridge");
#undef HAS
}

static int group_setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", NULL};
    if (need_paths("test_blas_core", needs)) return 1;
    Ctx *c = calloc(1, sizeof *c);
    if (test_make_dir(c->root, sizeof c->root, "blas-core")) return 1;
    // the shim is built beside this test's folder: BUILD/tests/lib/
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = 0;
    char shim[PATH_LEN];
    snprintf(shim, sizeof shim, "%s/../lib/blas_shim.so", dirname(self));
    if (access(shim, R_OK) != 0) {
        fprintf(stderr, "test_blas_core: %s is missing; make builds it with this test\n", shim);
        return 1;
    }
    // ASan wants its runtime first among the preloaded libraries
    char asan[PATH_LEN] = "";
    FILE *p = popen("ldd ./dp_baseline", "r");
    char line[PATH_LEN];
    while (p && fgets(line, sizeof line, p))
        if (strstr(line, "libasan.so") && strstr(line, "=> ")) sscanf(strstr(line, "=> ") + 3, "%511s", asan);
    if (p) pclose(p);
    snprintf(c->preload, sizeof c->preload, "%s%s%s", asan, asan[0] ? ":" : "", shim);
    best_core_from_cpuinfo(c->best, sizeof c->best);
    *state = c;
    return 0;
}

static int group_teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upgrade_table),
        cmocka_unit_test(test_self_test_passes_on_the_running_core),
        cmocka_unit_test(test_fallback_core_is_replaced),
        cmocka_unit_test(test_core_failing_self_test_is_undone),
        cmocka_unit_test(test_environment_core_is_never_overridden),
        cmocka_unit_test(test_identified_core_is_kept),
        cmocka_unit_test(test_core_name_escaped_in_the_record),
        cmocka_unit_test(test_markers_only_from_the_restart),
        cmocka_unit_test(test_core_beyond_the_cpu_refused),
        cmocka_unit_test(test_unknown_core_named_as_such),
        cmocka_unit_test(test_restart_through_the_loader),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
