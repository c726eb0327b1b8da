// test_device.c: the generic device layer and the cpu device: tracked,
// aligned allocations under --hbm-gb, scratch growth, synchronous streams,
// thread count, and the errors of bad --device values (exit 2, one line).
#include <sys/wait.h>
#include <unistd.h>
#include "testutil.h"
#include "device.h"

static void init_cpu(Device *d, double hbm_gb, int threads) {
    DeviceOptions opt = {.kind = "cpu", .hbm_gb = hbm_gb, .threads = threads, .local_size = 1};
    device_init(d, &opt);
}

static void test_cpu_device_describes_itself(void **state) {
    (void)state;
    Device d;
    init_cpu(&d, 0, 3);
    assert_int_equal(d.kind, DEVICE_CPU);
    assert_int_equal(d.threads, 3);
    assert_non_null(strstr(d.name, "3 OpenMP threads"));
    assert_int_equal(d.act_bytes, 4);
    assert_true(d.peak_flops == 0);
    assert_non_null(d.k);
    assert_int_equal(d.mem.budget[TIER_DEVICE], 0);
    device_destroy(&d);

    init_cpu(&d, 1.5, 0);
    assert_true(d.threads >= 1);
    assert_int_equal(d.mem.budget[TIER_DEVICE], 1500000000);  // GB = 1e9 bytes
    device_destroy(&d);

    // a budget below one byte rounds up to one, not down to "no budget"
    init_cpu(&d, 1e-12, 1);
    assert_int_equal(d.mem.budget[TIER_DEVICE], 1);
    device_destroy(&d);
}

static void test_buf_alloc_is_tracked_and_aligned(void **state) {
    (void)state;
    Device d;
    init_cpu(&d, 0.001, 1);
    Buf a = buf_alloc(&d, TIER_DEVICE, CAT_PARAMS, 1000, "params");
    Buf p = buf_alloc(&d, TIER_PINNED, CAT_COMM, 333, "bucket");
    assert_non_null(a.ptr);
    assert_int_equal((uintptr_t)a.ptr % 64, 0);
    assert_int_equal((uintptr_t)p.ptr % 4096, 0);  // pinned: page-aligned, for O_DIRECT
    assert_int_equal(d.mem.current[TIER_DEVICE][CAT_PARAMS], 1000);
    assert_int_equal(d.mem.current[TIER_PINNED][CAT_COMM], 333);
    memset(a.ptr, 0xff, 1000);  // the memory is really there
    buf_free(&d, &a);
    assert_null(a.ptr);
    assert_int_equal(a.bytes, 0);
    assert_int_equal(d.mem.current[TIER_DEVICE][CAT_PARAMS], 0);
    assert_int_equal(d.mem.peak[TIER_DEVICE][CAT_PARAMS], 1000);
    buf_free(&d, &a);  // an empty Buf: no-op
    Buf z = buf_alloc(&d, TIER_DEVICE, CAT_GRADS, 0, "nothing");
    assert_null(z.ptr);
    buf_free(&d, &p);
    device_destroy(&d);
}

static void test_scratch_grows_only(void **state) {
    (void)state;
    Device d;
    init_cpu(&d, 0, 1);
    void *s1 = device_scratch(&d, 4096);
    assert_non_null(s1);
    assert_ptr_equal(device_scratch(&d, 100), s1);
    assert_int_equal(d.mem.current[TIER_DEVICE][CAT_WORKSPACE], 4096);
    device_scratch(&d, 10000);
    assert_int_equal(d.mem.current[TIER_DEVICE][CAT_WORKSPACE], 10000);
    device_destroy(&d);
    assert_int_equal(d.mem.current[TIER_DEVICE][CAT_WORKSPACE], 0);
}

static void test_cpu_streams_are_synchronous(void **state) {
    (void)state;
    Device d;
    init_cpu(&d, 0, 1);
    float src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8];
    dev_copy(&d, dst, src, sizeof src, STREAM_COPY);
    assert_memory_equal(dst, src, sizeof src);  // done on return, no sync needed
    dev_memset0(&d, dst, 4 * sizeof(float), STREAM_COMPUTE);
    assert_true(dst[0] == 0 && dst[3] == 0 && dst[4] == 5);
    Event e;
    d.ops->event_create(&d, &e);
    double before = now_us();
    d.ops->event_record(&d, &e, STREAM_COMM);
    assert_true(e.t_us >= before && e.t_us <= now_us());
    d.ops->stream_wait_event(&d, STREAM_COMPUTE, &e);
    d.ops->event_sync(&d, &e);
    d.ops->event_destroy(&d, &e);
    size_t free_bytes = 1, total_bytes = 1;
    d.ops->mem_get_info(&d, &free_bytes, &total_bytes);
    assert_true(free_bytes == 0 && total_bytes == 0);
    device_destroy(&d);
}

// ---- error paths, each in a child process -------------------------------

static void over_hbm_budget(void) {
    Device d;
    init_cpu(&d, 0.001, 1);  // 1 MB
    buf_alloc(&d, TIER_DEVICE, CAT_MASTER, 800000, "master");
    buf_alloc(&d, TIER_DEVICE, CAT_ADAM_M, 800000, "adam m");
}

static void unknown_device(void) {
    Device d;
    DeviceOptions opt = {.kind = "tpu"};
    device_init(&d, &opt);
}

static void cuda_device(void) {
    Device d;
    DeviceOptions opt = {.kind = "cuda"};
    device_init(&d, &opt);
}

static void nvme_through_device(void) {
    Device d;
    init_cpu(&d, 0, 1);
    buf_alloc(&d, TIER_NVME, CAT_ADAM_V, 4096, "adam v");
}

static void test_over_hbm_budget_exits_2(void **state) {
    (void)state;
    char *err;
    assert_int_equal(run_child(over_hbm_budget, &err), 2);
    assert_non_null(strstr(err, "error: device memory over --hbm-gb: allocating 800.0 kB for 'adam m'"));
    assert_non_null(strstr(err, "master_fp32"));  // the breakdown
    free(err);
}

static void test_unknown_device_is_usage_error(void **state) {
    (void)state;
    char *err;
    assert_int_equal(run_child(unknown_device, &err), 2);
    assert_non_null(strstr(err, "error: --device tpu: unknown device; use auto, cpu or cuda\n"));
    assert_null(strchr(strchr(err, '\n') + 1, '\n'));  // one line
    free(err);
}

static void test_cuda_without_gpu_is_usage_error(void **state) {
    (void)state;
    if (device_cuda_available()) skip();  // a GPU is here: --device cuda is valid
    char *err;
    assert_int_equal(run_child(cuda_device, &err), 2);
#ifdef WB_HAVE_CUDA
    // the reason depends on the machine: no GPU, no driver, or a driver too old
    const char *msg = strstr(err, "error: --device cuda: ");
    assert_non_null(msg);
    assert_true(strstr(msg, "no GPU visible") || strstr(msg, "no NVIDIA driver") || strstr(msg, "the driver "));
    assert_non_null(strstr(msg, "; use --device cpu\n"));
    assert_null(strchr(strchr(err, '\n') + 1, '\n'));  // one line
#else
    assert_non_null(strstr(err, "--device cuda: this binary was built without CUDA"));
#endif
    free(err);
}

static void test_nvme_is_not_a_device_allocation(void **state) {
    (void)state;
    char *err;
    assert_int_equal(run_child(nvme_through_device, &err), 1);
    assert_non_null(strstr(err, "aio module"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_device_describes_itself),
        cmocka_unit_test(test_buf_alloc_is_tracked_and_aligned),
        cmocka_unit_test(test_scratch_grows_only),
        cmocka_unit_test(test_cpu_streams_are_synchronous),
        cmocka_unit_test(test_over_hbm_budget_exits_2),
        cmocka_unit_test(test_unknown_device_is_usage_error),
        cmocka_unit_test(test_cuda_without_gpu_is_usage_error),
        cmocka_unit_test(test_nvme_is_not_a_device_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
