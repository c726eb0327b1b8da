// test_arena.c: the device tier's allocator (common/runtime/arena.c) on
// its own: best fit (the smallest free block, the lowest address among
// equals), split and coalesce, the alignment, the same offsets for the same
// requests, the statistics, and the failure that makes it an allocator
// rather than a byte count: a request larger than every free block fails
// although the free bytes add up to more (fragmentation).
#include "testutil.h"
#include "arena.h"

#define K ARENA_ALIGN

static void expect_blocks_tile_the_region(const Arena *a) {
    size_t at = 0, allocated = 0;
    for (int i = 0; i < a->count; i++) {
        assert_int_equal(a->block[i].offset, at);
        assert_int_equal(a->block[i].offset % ARENA_ALIGN, 0);
        assert_true(a->block[i].bytes > 0);
        if (i > 0) assert_false(a->block[i].free && a->block[i - 1].free);  // coalesced
        if (!a->block[i].free) allocated += a->block[i].bytes;
        at += a->block[i].bytes;
    }
    assert_int_equal(at, a->capacity);
    assert_int_equal(allocated, a->allocated);
}

static void test_split_and_alignment(void **state) {
    (void)state;
    Arena a;
    arena_init(&a, 100 * K + 123);  // rounded down to whole pages
    assert_int_equal(a.capacity, 100 * K);
    assert_int_equal(arena_alloc(&a, 1), 0);            // one page for one byte
    assert_int_equal(arena_alloc(&a, K), K);            // the rest of the front block, split
    assert_int_equal(arena_alloc(&a, K + 1), 2 * K);    // two pages
    assert_int_equal(arena_rounded(K + 1), 2 * K);
    ArenaStats s = arena_stats(&a);
    assert_int_equal(s.allocated, 4 * K);
    assert_int_equal(s.largest_free, 96 * K);
    assert_int_equal(s.high_water, 4 * K);
    assert_int_equal(s.free_blocks, 1);
    expect_blocks_tile_the_region(&a);
    arena_destroy(&a);
}

// Free holes of 3, 1 and 2 pages: a request of 2 takes the 2-page hole (the
// smallest that holds it), not the first that does; one of 1 the 1-page hole.
static void test_best_fit(void **state) {
    (void)state;
    Arena a;
    arena_init(&a, 64 * K);
    size_t h3 = arena_alloc(&a, 3 * K), x = arena_alloc(&a, K), h1 = arena_alloc(&a, K), y = arena_alloc(&a, K),
           h2 = arena_alloc(&a, 2 * K), z = arena_alloc(&a, K);
    (void)x, (void)y, (void)z;
    arena_free(&a, h3);
    arena_free(&a, h1);
    arena_free(&a, h2);
    assert_int_equal(arena_alloc(&a, 2 * K), h2);
    assert_int_equal(arena_alloc(&a, K), h1);
    assert_int_equal(arena_alloc(&a, 3 * K), h3);
    expect_blocks_tile_the_region(&a);
    arena_destroy(&a);
}

// Two free blocks of one size: the lower address is taken.
static void test_ties_go_to_the_lower_address(void **state) {
    (void)state;
    Arena a;
    arena_init(&a, 16 * K);
    size_t p = arena_alloc(&a, K), q = arena_alloc(&a, K), r = arena_alloc(&a, K), s = arena_alloc(&a, K);
    (void)q, (void)s;
    arena_free(&a, r);
    arena_free(&a, p);
    assert_int_equal(arena_alloc(&a, K), p);
    arena_destroy(&a);
}

// Freed neighbours merge, on either side, into one block again.
static void test_coalesce(void **state) {
    (void)state;
    Arena a;
    arena_init(&a, 10 * K);
    size_t p = arena_alloc(&a, 2 * K), q = arena_alloc(&a, 3 * K), r = arena_alloc(&a, K);
    arena_free(&a, p);
    arena_free(&a, r);  // merges with the free tail
    assert_int_equal(arena_stats(&a).free_blocks, 2);
    expect_blocks_tile_the_region(&a);
    assert_int_equal(arena_free(&a, q), 3 * K);  // merges with both
    ArenaStats s = arena_stats(&a);
    assert_int_equal(s.free_blocks, 1);
    assert_int_equal(s.largest_free, 10 * K);
    assert_int_equal(a.count, 1);
    arena_destroy(&a);
}

// The free bytes suffice, no block does: the request fails, and the
// statistics say why.
static void test_fragmentation_fails_a_request(void **state) {
    (void)state;
    Arena a;
    arena_init(&a, 8 * K);
    size_t b[8];
    for (int i = 0; i < 8; i++) b[i] = arena_alloc(&a, K);
    assert_int_equal(arena_alloc(&a, K), ARENA_NONE);  // full
    for (int i = 0; i < 8; i += 2) arena_free(&a, b[i]);
    ArenaStats s = arena_stats(&a);
    assert_int_equal(s.free_bytes, 4 * K);
    assert_int_equal(s.largest_free, K);
    assert_true(fabs(arena_fragmentation(&s) - 0.75) < 1e-12);
    assert_int_equal(arena_alloc(&a, 2 * K), ARENA_NONE);
    arena_free(&a, b[1]);  // 0..2 now one free block of 3 pages
    assert_int_equal(arena_alloc(&a, 2 * K), 0);
    assert_int_equal(arena_stats(&a).high_water, 8 * K);
    arena_destroy(&a);
}

// The same requests, the same offsets: a pseudo-random sequence of
// allocations and releases placed twice.
static void test_same_requests_same_offsets(void **state) {
    (void)state;
    size_t offsets[2][400];
    for (int run = 0; run < 2; run++) {
        Arena a;
        arena_init(&a, 4096 * K);
        uint64_t rng = 7;
        size_t live[32] = {0};
        int have[32] = {0};
        for (int i = 0; i < 400; i++) {
            int slot = (int)(test_rng_next(&rng) % 32);
            if (have[slot]) {
                arena_free(&a, live[slot]);
                have[slot] = 0;
                offsets[run][i] = ARENA_NONE;
            } else {
                live[slot] = arena_alloc(&a, 1 + test_rng_next(&rng) % (40 * K));
                have[slot] = live[slot] != ARENA_NONE;
                offsets[run][i] = live[slot];
            }
            expect_blocks_tile_the_region(&a);
        }
        arena_destroy(&a);
    }
    assert_memory_equal(offsets[0], offsets[1], sizeof offsets[0]);
}

static void free_a_stranger(void) {
    Arena a;
    arena_init(&a, 8 * K);
    arena_alloc(&a, K);
    arena_free(&a, 3 * K);  // inside the free tail: no block starts there handed out
}

static void free_twice(void) {
    Arena a;
    arena_init(&a, 8 * K);
    size_t p = arena_alloc(&a, K);
    arena_alloc(&a, K);
    arena_free(&a, p);
    arena_free(&a, p);
}

static void test_free_of_a_stranger_is_refused(void **state) {
    (void)state;
    char *err = NULL;
    int rc = run_child(free_a_stranger, &err);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err, "no block handed out at offset"));
    free(err);
    rc = run_child(free_twice, &err);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err, "no block handed out at offset"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_and_alignment),
        cmocka_unit_test(test_best_fit),
        cmocka_unit_test(test_ties_go_to_the_lower_address),
        cmocka_unit_test(test_coalesce),
        cmocka_unit_test(test_fragmentation_fails_a_request),
        cmocka_unit_test(test_same_requests_same_offsets),
        cmocka_unit_test(test_free_of_a_stranger_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
