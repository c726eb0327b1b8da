// test_aio.c: the aio module (libaio, O_DIRECT) moving data on a real disk:
// round trips at several block sizes and queue depths, sizes that are not a
// multiple of the block, the queue filled to its depth, many requests in
// flight started in FIFO order and waited out of order, two threads on one
// context, a pinned Buf used directly, aio_destroy draining the queue.
// (The refusals are in test_aio_errors.c.)
#include <pthread.h>
#include <sched.h>
#include "aiotest.h"
#include "device.h"

// ---- round trips ---------------------------------------------------------------

static void test_round_trip_blocks_depths_sizes(void **state) {
    Ctx *c = *state;
    const size_t blocks[] = {4 * KIB, 128 * KIB, MIB};
    const int depths[] = {1, 4, 32};
    char path[640];
    path_in(c, "round-trip", path, sizeof path);
    for (int b = 0; b < 3; b++) {
        // 3.5 blocks (4 at 4 KiB blocks), block + 4096, one block, one page,
        // at an offset past the start
        const size_t sizes[] = {aio_round_up(blocks[b] * 7 / 2), blocks[b] + 4096, blocks[b], 4096};
        const size_t offset = 2 * blocks[b];
        for (int d = 0; d < 3; d++) {
            Aio aio;
            AioFile f;
            init_aio(&aio, depths[d], blocks[b]);
            create_file(&f, path, offset + sizes[0]);
            size_t written = 0;
            for (int s = 0; s < 4; s++) {
                unsigned char *src = alloc_aligned(sizes[s]), *dst = alloc_aligned(sizes[s]);
                fill_bytes(src, sizes[s], 100 * b + 10 * d + s);
                memset(dst, 0, sizes[s]);
                AioRequest w, r;
                aio_submit(&aio, &w, AIO_WRITE, &f, offset, src, sizes[s]);
                expect_ok(&aio, &w);
                assert_true(file_holds(path, offset, src, sizes[s]));
                aio_submit(&aio, &r, AIO_READ, &f, offset, dst, sizes[s]);
                expect_ok(&aio, &r);
                assert_memory_equal(dst, src, sizes[s]);
                written += sizes[s];
                free(src);
                free(dst);
            }
            AioStats st = aio_stats(&aio);
            assert_int_equal(st.bytes_written, written);
            assert_int_equal(st.bytes_read, written);
            assert_int_equal(st.writes, 4);
            assert_int_equal(st.reads, 4);
            assert_int_equal(st.failed, 0);
            assert_true(st.max_blocks_in_flight >= 1 && st.max_blocks_in_flight <= depths[d]);
            assert_true(st.busy_us > 0);
            aio_file_close(&f);
            aio_destroy(&aio);
        }
    }
}

// One request of 64 blocks: the thread puts exactly queue_depth in flight.
static void test_queue_filled_to_depth(void **state) {
    Ctx *c = *state;
    char path[640];
    path_in(c, "depth", path, sizeof path);
    const int depths[] = {1, 4, 16};
    for (int d = 0; d < 3; d++) {
        Aio aio;
        AioFile f;
        init_aio(&aio, depths[d], 4 * KIB);
        create_file(&f, path, 64 * 4 * KIB);
        void *buf = alloc_aligned(f.bytes);
        fill_bytes(buf, f.bytes, 7);
        AioRequest w;
        aio_submit(&aio, &w, AIO_WRITE, &f, 0, buf, f.bytes);
        expect_ok(&aio, &w);
        assert_int_equal(aio_stats(&aio).max_blocks_in_flight, depths[d]);
        free(buf);
        aio_file_close(&f);
        aio_destroy(&aio);
    }
}

// A request that arrives while another is in the kernel and slots are free
// goes in at once, not when the first one's block comes back: 16 MiB in one
// block takes milliseconds on any disk, the second starts well inside them.
// On a loaded machine the I/O thread may not run again before the first
// block is back, so the pair is tried up to 5 times: a queue that holds the
// late request until the first completes fails every try.
static int late_request_joins(Ctx *c, int attempt, double *late_after_submit_us, double *before_first_done_us) {
    char path[640], name[32];
    snprintf(name, sizeof name, "late-%d", attempt);
    path_in(c, name, path, sizeof path);
    const size_t big = 16 * MIB, small = 64 * KIB;
    Aio aio;
    AioFile f;
    init_aio(&aio, 4, big);
    create_file(&f, path, big + small);
    void *a = alloc_aligned(big), *b = alloc_aligned(small);
    fill_bytes(a, big, 11);
    fill_bytes(b, small, 12);
    AioRequest first, late;
    aio_submit(&aio, &first, AIO_WRITE, &f, 0, a, big);
    for (int taken = 0; !taken; sched_yield()) {  // until the I/O thread has handed its block to the kernel
        pthread_mutex_lock(&aio.lock);
        taken = first.start_us > 0;
        pthread_mutex_unlock(&aio.lock);
    }
    aio_submit(&aio, &late, AIO_WRITE, &f, big, b, small);
    expect_ok(&aio, &late);
    expect_ok(&aio, &first);
    *late_after_submit_us = late.start_us - late.submit_us;
    *before_first_done_us = first.done_us - late.start_us;
    assert_true(file_holds(path, big, b, small));
    free(a);
    free(b);
    aio_file_close(&f);
    aio_destroy(&aio);
    return late.start_us < first.done_us;
}

static void test_late_request_joins_at_once(void **state) {
    double after_submit = 0, before_done = 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        if (late_request_joins(*state, attempt, &after_submit, &before_done)) {
            print_message("late request in the kernel %.0f us after its submission, %.0f us before the first one "
                          "finished (try %d)\n", after_submit, before_done, attempt + 1);
            return;
        }
    }
    fail_msg("in 5 tries the late request started only after the first one finished (the last: %.0f us after): it "
             "waited for its completion", -before_done);
}

#define MANY 24

// Requests of varied sizes to distinct regions, all in flight together and
// waited in an order other than their submission; they start in FIFO order.
static void test_many_requests_out_of_order(void **state) {
    Ctx *c = *state;
    char path[640];
    path_in(c, "many", path, sizeof path);
    size_t offset[MANY], bytes[MANY], total = 0;
    for (int i = 0; i < MANY; i++) {
        offset[i] = total;
        bytes[i] = 4096 * (size_t)(1 + (i * 7) % 50);
        total += bytes[i];
    }
    Aio aio;
    AioFile f;
    init_aio(&aio, 8, 16 * KIB);
    create_file(&f, path, total);
    unsigned char *src[MANY], *dst[MANY];
    AioRequest req[MANY];
    for (int i = 0; i < MANY; i++) {
        src[i] = alloc_aligned(bytes[i]);
        dst[i] = alloc_aligned(bytes[i]);
        fill_bytes(src[i], bytes[i], 1000 + i);
        memset(dst[i], 0, bytes[i]);
        assert_int_equal(aio_submit(&aio, &req[i], AIO_WRITE, &f, offset[i], src[i], bytes[i]), 0);
    }
    for (int i = MANY - 1; i >= 0; i--) expect_ok(&aio, &req[i]);  // newest first
    for (int i = 0; i < MANY; i++) {
        assert_true(req[i].submit_us <= req[i].start_us && req[i].start_us <= req[i].done_us);
        if (i > 0) assert_true(req[i - 1].start_us <= req[i].start_us);  // FIFO
        assert_true(file_holds(path, offset[i], src[i], bytes[i]));
    }
    for (int i = 0; i < MANY; i++)
        aio_submit(&aio, &req[i], AIO_READ, &f, offset[i], dst[i], bytes[i]);
    for (int k = 0; k < MANY; k++) {
        int i = (k * 5 + 3) % MANY;  // 5 and 24 are coprime: every request, shuffled
        expect_ok(&aio, &req[i]);
        assert_int_equal(aio_test(&aio, &req[i]), 1);
        assert_memory_equal(dst[i], src[i], bytes[i]);
    }
    assert_int_equal(aio_stats(&aio).bytes_read, total);
    for (int i = 0; i < MANY; i++) free(src[i]), free(dst[i]);
    aio_file_close(&f);
    aio_destroy(&aio);
}

typedef struct Worker {
    Aio *aio;
    const AioFile *f;
    size_t offset, bytes;
    uint64_t seed;
    int ok;  // every round trip came back equal
} Worker;

static void *round_trips(void *arg) {
    Worker *w = arg;
    unsigned char *src = alloc_aligned(w->bytes), *dst = alloc_aligned(w->bytes);
    w->ok = 1;
    for (int round = 0; round < 20; round++) {
        fill_bytes(src, w->bytes, w->seed + (uint64_t)round);
        AioRequest wr, rd;
        aio_submit(w->aio, &wr, AIO_WRITE, w->f, w->offset, src, w->bytes);
        if (aio_wait(w->aio, &wr) != 0) w->ok = 0;
        aio_submit(w->aio, &rd, AIO_READ, w->f, w->offset, dst, w->bytes);
        while (!aio_test(w->aio, &rd)) sched_yield();  // the non-blocking form
        if (rd.status != 0 || memcmp(src, dst, w->bytes) != 0) w->ok = 0;
    }
    free(src);
    free(dst);
    return NULL;
}

// The main thread and one other (the stage's optimizer thread) share a context.
static void test_two_threads_share_a_context(void **state) {
    Ctx *c = *state;
    char path[640];
    path_in(c, "threads", path, sizeof path);
    Aio aio;
    AioFile f;
    init_aio(&aio, 4, 64 * KIB);
    create_file(&f, path, 2 * MIB);
    Worker other = {&aio, &f, 0, 700 * KIB, 1, 0}, mine = {&aio, &f, MIB, 1000 * KIB, 2, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, round_trips, &other), 0);
    round_trips(&mine);
    pthread_join(t, NULL);
    assert_true(other.ok);
    assert_true(mine.ok);
    assert_int_equal(aio_stats(&aio).reads, 40);
    aio_file_close(&f);
    aio_destroy(&aio);
}

// A pinned Buf from the cpu device goes straight to the kernel.
static void test_pinned_buf_is_usable(void **state) {
    Ctx *c = *state;
    char path[640];
    path_in(c, "pinned", path, sizeof path);
    DeviceOptions opt = {.kind = "cpu", .threads = 1, .local_size = 1};
    Device dev;
    device_init(&dev, &opt);
    size_t bytes = aio_round_up(333 * 1000);
    Buf src = buf_alloc(&dev, TIER_PINNED, CAT_MASTER, bytes, "master");
    Buf dst = buf_alloc(&dev, TIER_PINNED, CAT_MASTER, bytes, "master copy");
    fill_bytes(src.ptr, bytes, 11);
    Aio aio;
    AioFile f;
    init_aio(&aio, 4, 128 * KIB);
    create_file(&f, path, bytes);
    AioRequest w, r;
    aio_submit(&aio, &w, AIO_WRITE, &f, 0, src.ptr, bytes);
    expect_ok(&aio, &w);
    aio_submit(&aio, &r, AIO_READ, &f, 0, dst.ptr, bytes);
    expect_ok(&aio, &r);
    assert_memory_equal(dst.ptr, src.ptr, bytes);
    aio_file_close(&f);
    aio_destroy(&aio);
    buf_free(&dev, &src);
    buf_free(&dev, &dst);
    device_destroy(&dev);
}

// aio_destroy finishes what was submitted before it returns.
static void test_destroy_drains_the_queue(void **state) {
    Ctx *c = *state;
    char path[640];
    path_in(c, "drain", path, sizeof path);
    Aio aio;
    AioFile f;
    init_aio(&aio, 2, 4 * KIB);
    create_file(&f, path, 4 * MIB);
    unsigned char *src = alloc_aligned(f.bytes);
    fill_bytes(src, f.bytes, 21);
    AioRequest w[4];
    for (int i = 0; i < 4; i++) aio_submit(&aio, &w[i], AIO_WRITE, &f, i * MIB, src + i * MIB, MIB);
    aio_destroy(&aio);
    for (int i = 0; i < 4; i++) assert_true(w[i].done && w[i].status == 0);
    assert_true(file_holds(path, 0, src, f.bytes));
    free(src);
    aio_file_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_blocks_depths_sizes),
        cmocka_unit_test(test_queue_filled_to_depth),
        cmocka_unit_test(test_late_request_joins_at_once),
        cmocka_unit_test(test_many_requests_out_of_order),
        cmocka_unit_test(test_two_threads_share_a_context),
        cmocka_unit_test(test_pinned_buf_is_usable),
        cmocka_unit_test(test_destroy_drains_the_queue),
    };
    return cmocka_run_group_tests(tests, aiotest_setup, aiotest_teardown);
}
