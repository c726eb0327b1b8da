// test_mem.c: memory accounting (current and peak per tier x category, tier
// totals, peak reset, budgets) and the over-budget error: exit status 2 and a
// first line that says which budget, what was asked and the hint.
#include <sys/wait.h>
#include <unistd.h>
#include "testutil.h"
#include "mem.h"

static void test_current_and_peak_per_pair(void **state) {
    (void)state;
    MemCtx m;
    mem_init(&m);
    mem_track_alloc(&m, TIER_DEVICE, CAT_PARAMS, 1000, "params");
    mem_track_alloc(&m, TIER_DEVICE, CAT_ACTIVATIONS, 500, "acts");
    mem_track_alloc(&m, TIER_HOST, CAT_MASTER, 4000, "master");
    mem_track_free(&m, TIER_DEVICE, CAT_ACTIVATIONS, 500);
    mem_track_alloc(&m, TIER_DEVICE, CAT_ACTIVATIONS, 200, "acts again");

    assert_int_equal(m.current[TIER_DEVICE][CAT_PARAMS], 1000);
    assert_int_equal(m.current[TIER_DEVICE][CAT_ACTIVATIONS], 200);
    assert_int_equal(m.peak[TIER_DEVICE][CAT_ACTIVATIONS], 500);
    assert_int_equal(m.current[TIER_HOST][CAT_MASTER], 4000);
    assert_int_equal(m.current[TIER_HOST][CAT_PARAMS], 0);
    assert_int_equal(m.tier_current[TIER_DEVICE], 1200);
    assert_int_equal(m.tier_peak[TIER_DEVICE], 1500);  // peak of the sum
    assert_int_equal(m.tier_current[TIER_HOST], 4000);
    assert_int_equal(m.tier_current[TIER_PINNED], 0);
}

static void test_reset_peaks(void **state) {
    (void)state;
    MemCtx m;
    mem_init(&m);
    mem_track_alloc(&m, TIER_PINNED, CAT_COMM, 300, "bucket");
    mem_track_free(&m, TIER_PINNED, CAT_COMM, 100);
    assert_int_equal(m.peak[TIER_PINNED][CAT_COMM], 300);
    mem_reset_peaks(&m);
    assert_int_equal(m.peak[TIER_PINNED][CAT_COMM], 200);
    assert_int_equal(m.tier_peak[TIER_PINNED], 200);
    mem_track_alloc(&m, TIER_PINNED, CAT_COMM, 50, "more");
    assert_int_equal(m.peak[TIER_PINNED][CAT_COMM], 250);
    assert_int_equal(m.tier_peak[TIER_PINNED], 250);
}

static void test_fits_against_budget(void **state) {
    (void)state;
    MemCtx m;
    mem_init(&m);
    assert_true(mem_fits(&m, TIER_DEVICE, (size_t)1 << 50));  // no budget: anything fits
    mem_set_budget(&m, TIER_DEVICE, 1000);
    mem_track_alloc(&m, TIER_DEVICE, CAT_GRADS, 600, "grads");
    assert_true(mem_fits(&m, TIER_DEVICE, 400));   // exactly at the budget
    assert_false(mem_fits(&m, TIER_DEVICE, 401));
    assert_true(mem_fits(&m, TIER_HOST, 1000000)); // other tiers have no budget
    mem_track_alloc(&m, TIER_DEVICE, CAT_ADAM_M, 400, "m");  // reaching it exactly is allowed
    assert_int_equal(m.tier_current[TIER_DEVICE], 1000);
}

static void test_names(void **state) {
    (void)state;
    assert_string_equal(mem_tier_name(TIER_PINNED), "pinned");
    assert_string_equal(mem_category_name(CAT_MASTER), "master_fp32");
    assert_string_equal(mem_category_name(CAT_COMM), "comm_buffers");
}

static void test_breakdown_lists_only_used_rows(void **state) {
    (void)state;
    MemCtx m;
    mem_init(&m);
    mem_track_alloc(&m, TIER_DEVICE, CAT_PARAMS, 2500000, "params");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mem_print_breakdown(&m, f);
    fclose(f);
    assert_non_null(strstr(text, "params_bf16"));
    assert_non_null(strstr(text, "2.5"));  // MB
    assert_null(strstr(text, "adam_v"));
    assert_null(strstr(text, "host"));
    free(text);
}

static void fits_hint(void *arg, char *out, size_t n) {
    snprintf(out, n, "fits: %s", (const char *)arg);
}

// An allocation over the budget, in a child process (run_child): it must end it.
static void over_budget_child(void) {
    MemCtx m;
    mem_init(&m);
    mem_set_budget(&m, TIER_DEVICE, 2000000000);  // 2 GB
    m.fit_hint = fits_hint;
    m.fit_hint_arg = "zero3 at 4 ranks";
    mem_track_alloc(&m, TIER_DEVICE, CAT_PARAMS, 1500000000, "params");
    mem_track_alloc(&m, TIER_DEVICE, CAT_MASTER, 1200000000, "master");
    _exit(0);  // not reached when the budget is enforced
}

static void test_over_budget_exits_2_with_clear_first_line(void **state) {
    (void)state;
    char *err = NULL;
    int rc = run_child(over_budget_child, &err);
    assert_int_equal(rc, 2);
    char *newline = strchr(err, '\n');
    assert_non_null(newline);
    *newline = 0;  // first line only
    assert_non_null(strstr(err, "rank 0: error: device memory over --hbm-gb"));
    assert_non_null(strstr(err, "'master'"));
    assert_non_null(strstr(err, "1.20 GB"));
    assert_non_null(strstr(err, "budget 2.00 GB"));
    assert_non_null(strstr(err, "fits: zero3 at 4 ranks"));
    assert_non_null(strstr(newline + 1, "params_bf16"));  // the breakdown follows
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_current_and_peak_per_pair),
        cmocka_unit_test(test_reset_peaks),
        cmocka_unit_test(test_fits_against_budget),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_breakdown_lists_only_used_rows),
        cmocka_unit_test(test_over_budget_exits_2_with_clear_first_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
