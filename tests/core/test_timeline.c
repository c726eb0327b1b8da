// test_timeline.c: the interval arithmetic every overlap figure is made of.
// Unions merge overlapping intervals of a row (concurrent collectives are not
// counted twice), intersections of two rows' unions are what ran at the same
// time, and both are clipped to the window; so overlap <= each union <= the
// window, however many intervals are in flight at once.
#include "testutil.h"
#include "timeline.h"

enum { A = 0, B = 1 };

static void test_union_merges_concurrent_intervals(void **state) {
    (void)state;
    Timeline tl = {0};
    // three collectives in flight at once over [10, 40), one alone at [50, 60)
    timeline_add(&tl, A, 10, 30);
    timeline_add(&tl, A, 20, 40);
    timeline_add(&tl, A, 15, 25);
    timeline_add(&tl, A, 50, 60);
    assert_true(timeline_union_us(&tl, A, 0, 100) == 40);  // not 20 + 20 + 10 + 10 = 60
    assert_true(timeline_union_us(&tl, A, 35, 55) == 10);  // clipped: [35,40) and [50,55)
    assert_true(timeline_union_us(&tl, A, 60, 100) == 0);
    timeline_add(&tl, A, 5, 5);  // empty: adds nothing
    assert_true(timeline_union_us(&tl, A, 0, 100) == 40);
    timeline_free(&tl);
}

static void test_overlap_is_an_intersection(void **state) {
    (void)state;
    Timeline tl = {0};
    // compute in three pieces; comm as two concurrent calls covering [0, 100)
    timeline_add(&tl, B, 0, 20);
    timeline_add(&tl, B, 30, 50);
    timeline_add(&tl, B, 70, 90);
    timeline_add(&tl, A, 0, 100);
    timeline_add(&tl, A, 10, 60);
    double comm = timeline_union_us(&tl, A, 0, 100), compute = timeline_union_us(&tl, B, 0, 100);
    double both = timeline_overlap_us(&tl, A, B, 0, 100);
    assert_true(comm == 100 && compute == 60 && both == 60);
    assert_true(timeline_overlap_us(&tl, B, A, 0, 100) == both);  // symmetric
    // a window inside: [40, 75) holds compute [40,50) and [70,75)
    assert_true(timeline_overlap_us(&tl, A, B, 40, 75) == 15);
    timeline_free(&tl);
}

// Random rows: the bounds that the report relies on hold every time, and the
// figures match a brute-force count on a 1-unit grid.
static void test_random_rows_obey_the_bounds(void **state) {
    (void)state;
    uint64_t seed = 7;
    for (int round = 0; round < 200; round++) {
        Timeline tl = {0};
        char on[2][200] = {{0}};
        for (int row = 0; row < 2; row++) {
            int n = 1 + (int)(test_rng_next(&seed) % 12);
            for (int i = 0; i < n; i++) {
                int a = (int)(test_rng_next(&seed) % 200), len = (int)(test_rng_next(&seed) % 60);
                int b = a + len > 200 ? 200 : a + len;
                timeline_add(&tl, row, a, b);
                for (int x = a; x < b; x++) on[row][x] = 1;
            }
        }
        int w0 = (int)(test_rng_next(&seed) % 100), w1 = w0 + (int)(test_rng_next(&seed) % 101);
        double ua = 0, ub = 0, both = 0;
        for (int x = w0; x < w1; x++) ua += on[0][x], ub += on[1][x], both += on[0][x] && on[1][x];
        double got_a = timeline_union_us(&tl, A, w0, w1), got_b = timeline_union_us(&tl, B, w0, w1);
        double got_both = timeline_overlap_us(&tl, A, B, w0, w1);
        if (got_a != ua || got_b != ub || got_both != both)
            fail_msg("round %d window [%d,%d): union %g/%g (want %g/%g), overlap %g (want %g)", round, w0, w1, got_a,
                     got_b, ua, ub, got_both, both);
        assert_true(got_both <= got_a && got_both <= got_b && got_a <= w1 - w0);
        timeline_free(&tl);
    }
}

// I/O hidden behind "compute or the host optimizer": the intersection with
// the union of two rows, not the sum of two intersections.
static void test_overlap_with_a_union_of_rows(void **state) {
    (void)state;
    Timeline tl = {0};
    timeline_add(&tl, 0, 0, 100);   // I/O
    timeline_add(&tl, 1, 10, 40);   // compute
    timeline_add(&tl, 2, 30, 60);   // host optimizer, overlapping compute over [30, 40)
    assert_true(timeline_overlap_any_us(&tl, 0, (1u << 1) | (1u << 2), 0, 100) == 50);  // [10, 60)
    assert_true(timeline_overlap_us(&tl, 0, 1, 0, 100) + timeline_overlap_us(&tl, 0, 2, 0, 100) == 60);
    timeline_free(&tl);
}

static void test_prune_keeps_what_can_reach_later(void **state) {
    (void)state;
    Timeline tl = {0};
    timeline_add(&tl, A, 0, 10);
    timeline_add(&tl, A, 5, 25);  // straddles 20: kept
    timeline_add(&tl, B, 30, 40);
    timeline_prune(&tl, 20);
    assert_int_equal(tl.n[A], 1);
    assert_true(timeline_union_us(&tl, A, 20, 50) == 5);
    assert_true(timeline_union_us(&tl, B, 0, 50) == 10);
    timeline_free(&tl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_union_merges_concurrent_intervals),
        cmocka_unit_test(test_overlap_is_an_intersection),
        cmocka_unit_test(test_random_rows_obey_the_bounds),
        cmocka_unit_test(test_overlap_with_a_union_of_rows),
        cmocka_unit_test(test_prune_keeps_what_can_reach_later),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
