// test_emu.c: the cuda emulator catches what it claims to. Each case of
// emu_faults.cu is a small CUDA program with one mistake, or the same program
// without it; the mistakes must stop the program (exit 70, or a refusal by
// cuBLASLt) with a message that names what went wrong and the source line
// marked "// mark: CASE", or change what the program computes, and the
// corrected programs must run clean. Runs in the emulator's build only
// (make test, where no GPU is visible), from build-emu/root.
#include "testutil.h"

#define FAULTS "../tests/emu/emu_faults"
#define SOURCE "tests/emu/emu_faults.cu"

// "tests/emu/emu_faults.cu:N" for the line that carries "// mark: <mark>"
static void marked_line(const char *mark, char *out, size_t cap) {
    FILE *f = fopen(SOURCE, "r");
    assert_non_null(f);
    char line[512], want[64];
    snprintf(want, sizeof want, "// mark: %s", mark);
    int n = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        if (strstr(line, want)) {
            found = n;
            break;
        }
    }
    fclose(f);
    if (!found) fail_msg("no line marked \"%s\" in %s", want, SOURCE);
    snprintf(out, cap, "emu_faults.cu:%d", found);
}

// runs a case; returns its exit status, its output in *out
static int run_case(const char *name, const char *env, char **out) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s %s %s", env ? env : "", FAULTS, name);
    int rc = test_run(cmd, out);
    print_message("%s: exit %d: %s", name, rc, *out);
    return rc;
}

// a case that must stop with status `status` and print every one of `needles` (NULL-ended)
static void expect_stop(const char *name, int status, const char *mark, const char *const needles[]) {
    char *out = NULL;
    int rc = run_case(name, NULL, &out);
    assert_int_equal(rc, status);
    for (int i = 0; needles[i]; i++)
        if (!strstr(out, needles[i])) fail_msg("%s: no \"%s\" in:\n%s", name, needles[i], out);
    if (mark) {
        char where[128];
        marked_line(mark, where, sizeof where);
        if (!strstr(out, where)) fail_msg("%s: the message does not name %s:\n%s", name, where, out);
    }
    free(out);
}

// a case that must run clean and print `want`
static void expect_result(const char *name, const char *env, const char *want) {
    char *out = NULL;
    assert_int_equal(run_case(name, env, &out), 0);
    if (!strstr(out, want)) fail_msg("%s: expected \"%s\", got:\n%s", name, want, out);
    free(out);
}

static void test_divergent_barrier(void **state) {
    expect_stop("divergent_barrier", 70, "divergent_barrier",
                (const char *[]){"__syncthreads", "16 of the block's 64 threads have exited", NULL});
}

static void test_partial_warp_shuffle(void **state) {
    expect_stop("partial_warp", 70, "shuffle", (const char *[]){"__shfl_xor_sync", "partial warp", NULL});
}

static void test_shuffle_over_exited_lane(void **state) {
    expect_stop("exited_lane", 70, "shuffle", (const char *[]){"lane 5 exits while lanes of its warp wait", NULL});
    expect_result("full_warps", NULL, "result 1");
}

// without the barrier thread 0 sums before the others have written: the
// emulator runs each thread until it waits, so the race shows every time
static void test_missing_barrier_changes_the_result(void **state) {
    expect_result("no_race", NULL, "result 32896");
    char *out = NULL;
    assert_int_equal(run_case("race", NULL, &out), 0);
    assert_null(strstr(out, "result 32896"));
    free(out);
}

static void test_launch_limits(void **state) {
    expect_stop("block_too_big", 70, NULL, (const char *[]){"emu_faults.cu:", "past (1024, 1024, 64)", NULL});
    expect_stop("launch_bounds", 70, NULL, (const char *[]){"past its __launch_bounds__(128)", NULL});
    expect_stop("smem_no_optin", 70, NULL,
                (const char *[]){"65536 bytes of dynamic shared memory", "without cudaFuncSetAttribute", NULL});
    expect_result("smem_optin", NULL, "result 2");
}

static void test_out_of_bounds(void **state) {
    expect_stop("oob_read", 70, "oob_read",
                (const char *[]){"kernel read_at", "8192 bytes past the end of device allocation", NULL});
    expect_result("in_bounds_read", NULL, "result");
    expect_stop("oob_write_slack", 70, NULL,
                (const char *[]){"kernel write_at", "past its end, into the slack", NULL});
}

static void test_use_after_free(void **state) {
    expect_stop("use_after_free", 70, "oob_read", (const char *[]){"touched freed device allocation", NULL});
}

// with no event wait, the copy on stream b may run before the fill on
// stream a: the emulator draws the order (EMU_SEED), so some seeds read stale data
static void test_missing_event_wait(void **state) {
    int stale = 0;
    for (int seed = 1; seed <= 8; seed++) {
        char env[32], *out = NULL;
        snprintf(env, sizeof env, "EMU_SEED=%d", seed);
        assert_int_equal(run_case("missing_wait", env, &out), 0);
        stale += strstr(out, "stale") != NULL;
        free(out);
        expect_result("with_wait", env, "fresh");
    }
    print_message("stale in %d of 8 orders without the event wait\n", stale);
    assert_true(stale > 0);
}

static void test_host_read_before_sync(void **state) {
    expect_result("host_read_no_sync", NULL, "stale");
    expect_result("host_read_sync", NULL, "fresh");
}

// A host function runs when its stream reaches it: after the copy before
// it (it sees the copied value), and not before the host lets the queue run.
static void test_host_function_in_stream_order(void **state) {
    expect_result("host_fn", NULL, "before the wait: not run");
    expect_result("host_fn", NULL, "fresh");
}

// The op log lists the copies in issue order with where they read and
// write, and the host's waits; EMU_STATS counts the copy from pageable memory.
static void test_op_log_and_pageable_copies(void **state) {
    char *out = NULL;
    assert_int_equal(run_case("copies_logged", "EMU_OPLOG=emu_oplog.txt EMU_STATS=emu_stats.txt", &out), 0);
    free(out);
    char *log = read_file("emu_oplog.txt", NULL), *stats = read_file("emu_stats.txt", NULL);
    assert_non_null(log);
    assert_non_null(stats);
    const char *up = strstr(log, "(pinned host -> device)"), *paged = strstr(log, "(pageable host -> device)");
    const char *wait = strstr(log, "host_wait");
    if (!up || !paged || !wait || !(up < paged && paged < wait)) fail_msg("op log out of order:\n%s", log);
    if (!strstr(stats, "copy_pageable_host 1\n")) fail_msg("expected one copy from pageable memory:\n%s", stats);
    free(log);
    free(stats);
    remove("emu_oplog.txt");
    remove("emu_stats.txt");
}

static void test_cublaslt_checks(void **state) {
    expect_result("blas_aligned", NULL, "result 0");
    expect_stop("blas_misaligned", 3, NULL, (const char *[]){"not aligned to the 256 bytes promised", NULL});
    expect_stop("blas_shapes", 3, NULL, (const char *[]){"op(B) is 8 x 32", NULL});
}

// the GELU epilogue's aux matrix as cublasLt.h constrains it: its leading
// dimension a multiple of 8, its pointer as aligned as when the heuristic was asked
static void test_cublaslt_epilogue_checks(void **state) {
    expect_result("blas_gelu_aux", NULL, "result 0");
    expect_stop("blas_aux_ld", 3, NULL, (const char *[]){"aux leading dimension 20 is not a multiple of 8", NULL});
    expect_stop("blas_aux_moved", 3, NULL,
                (const char *[]){"aux matrix", "less aligned than the 16 bytes its pointer had", NULL});
}

int main(void) {
    if (access(FAULTS, X_OK) != 0) {
        fprintf(stderr, "test_emu: %s not found; run from build-emu/root after make emu\n", FAULTS);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divergent_barrier),
        cmocka_unit_test(test_partial_warp_shuffle),
        cmocka_unit_test(test_shuffle_over_exited_lane),
        cmocka_unit_test(test_missing_barrier_changes_the_result),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_out_of_bounds),
        cmocka_unit_test(test_use_after_free),
        cmocka_unit_test(test_missing_event_wait),
        cmocka_unit_test(test_host_read_before_sync),
        cmocka_unit_test(test_host_function_in_stream_order),
        cmocka_unit_test(test_op_log_and_pageable_copies),
        cmocka_unit_test(test_cublaslt_checks),
        cmocka_unit_test(test_cublaslt_epilogue_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
