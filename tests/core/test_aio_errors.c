// test_aio_errors.c: every refusal of the aio module comes back as a status
// and one line (never an exit): bad knobs; a misaligned buffer, offset or
// length, refused before the kernel sees it; a block the kernel refuses; a
// short file, at submission and in the kernel; a missing directory; a
// file-size limit (RLIMIT_FSIZE, in a child) standing in for a disk that
// fills mid-run; tmpfs; too little space.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include "aiotest.h"

static void expect_error(int rc, int want_rc, const char *msg, const char *part) {
    if (rc != want_rc) fail_msg("status %d, wanted %d (message: %s)", rc, want_rc, msg);
    if (!strstr(msg, part)) fail_msg("'%s' missing from: %s", part, msg);
    assert_null(strchr(msg, '\n'));  // one line
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_bad_knobs_refused(void **state) {
    Aio aio;
    char err[AIO_ERR_BYTES];
    expect_error(aio_init(&aio, 0, 64 * KIB, err), EINVAL, err, "queue depth 0: must be 1 to");
    expect_error(aio_init(&aio, 5000, 64 * KIB, err), EINVAL, err, "queue depth 5000");
    expect_error(aio_init(&aio, 4, 1000, err), EINVAL, err, "block size 1000 bytes");
    expect_error(aio_init(&aio, 4, 0, err), EINVAL, err, "multiple of 4096");
    aio_destroy(&aio);  // after a failed init: nothing to do
    AioFile f;
    char path[640];
    expect_error(aio_file_create(&f, path_in(*state, "odd", path, sizeof path), 5000, err), EINVAL,
                 err, "size 5000");
    assert_false(exists(path));
}

// Each refusal completes at once, names which of the three is wrong, its
// value and the alignment, and never reaches the kernel.
static void test_misaligned_requests_refused(void **state) {
    char path[640];
    path_in(*state, "misaligned", path, sizeof path);
    Aio aio;
    AioFile f;
    init_aio(&aio, 4, 64 * KIB);
    create_file(&f, path, MIB);
    unsigned char *buf = alloc_aligned(MIB + 4096);
    AioRequest r;
    expect_error(aio_submit(&aio, &r, AIO_WRITE, &f, 0, buf + 512, 64 * KIB), EINVAL, r.error,
                 "buffer");
    assert_non_null(strstr(r.error, "is not aligned to 4096 bytes"));
    assert_int_equal(aio_test(&aio, &r), 1);
    assert_int_equal(aio_wait(&aio, &r), EINVAL);
    expect_error(aio_submit(&aio, &r, AIO_READ, &f, 1000, buf, 64 * KIB), EINVAL, r.error,
                 "offset 1000 is not a multiple of 4096 bytes");
    expect_error(aio_submit(&aio, &r, AIO_WRITE, &f, 0, buf, 5000), EINVAL, r.error,
                 "length 5000 is not a multiple of 4096 bytes");
    expect_error(aio_submit(&aio, &r, AIO_WRITE, &f, MIB - 4096, buf, 8192), EINVAL, r.error,
                 "run past the end of the file (1048576 bytes)");
    AioStats st = aio_stats(&aio);
    assert_int_equal(st.max_blocks_in_flight, 0);
    assert_int_equal(st.bytes_written + st.bytes_read, 0);
    free(buf);
    aio_file_close(&f);
    aio_destroy(&aio);
}

// A block the kernel refuses at io_submit (here: a descriptor that is not
// open) fails its request with the kernel's reason; the context goes on.
static void test_kernel_refusal_fails_the_request(void **state) {
    char path[640];
    path_in(*state, "refusal", path, sizeof path);
    Aio aio;
    AioFile good;
    init_aio(&aio, 4, 64 * KIB);
    create_file(&good, path, MIB);
    int stale_fd = dup(good.fd);
    close(stale_fd);
    AioFile stale = {.fd = stale_fd, .bytes = MIB, .path = "stale"};
    unsigned char *buf = alloc_aligned(MIB);
    fill_bytes(buf, MIB, 41);
    AioRequest bad, ok;
    aio_submit(&aio, &bad, AIO_WRITE, &stale, 0, buf, MIB);
    aio_submit(&aio, &ok, AIO_WRITE, &good, 0, buf, MIB);
    expect_error(aio_wait(&aio, &bad), EBADF, bad.error, "aio write of 'stale' failed at byte");
    expect_ok(&aio, &ok);
    assert_true(file_holds(path, 0, buf, MIB));
    AioStats st = aio_stats(&aio);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.writes, 1);
    free(buf);
    aio_file_close(&good);
    aio_destroy(&aio);
}

static void test_short_file(void **state) {
    char path[640], err[AIO_ERR_BYTES];
    path_in(*state, "short", path, sizeof path);
    Aio aio;
    AioFile f;
    init_aio(&aio, 4, 128 * KIB);
    create_file(&f, path, 256 * KIB);
    aio_file_close(&f);
    assert_int_equal(aio_file_open(&f, path, err), 0);
    assert_int_equal(f.bytes, 256 * KIB);
    unsigned char *buf = alloc_aligned(512 * KIB);
    AioRequest r;
    // shorter than asked when opened: refused at submission
    expect_error(aio_submit(&aio, &r, AIO_READ, &f, 0, buf, 512 * KIB), EINVAL, r.error,
                 "the file is shorter than the tensor");
    // cut short after opening: the kernel's short read comes back as an error
    assert_int_equal(truncate(path, 64 * KIB), 0);
    aio_submit(&aio, &r, AIO_READ, &f, 0, buf, 256 * KIB);
    expect_error(aio_wait(&aio, &r), ENODATA, r.error, "short read");
    assert_int_equal(aio_stats(&aio).failed, 1);
    aio_file_close(&f);
    assert_int_equal(unlink(path), 0);
    expect_error(aio_file_open(&f, path, err), ENOENT, err, "does not exist");
    free(buf);
    aio_destroy(&aio);
}

static void test_missing_directory(void **state) {
    char missing[640], file[700], rank_dir[760], err[AIO_ERR_BYTES];
    path_in(*state, "no-such-dir", missing, sizeof missing);
    expect_error(aio_rank_dir(missing, 0, 4096, rank_dir, sizeof rank_dir, err), ENOENT, err,
                 "does not exist");
    AioFile f;
    snprintf(file, sizeof file, "%s/master.bin", missing);
    expect_error(aio_file_create(&f, file, 4096, err), ENOENT, err, "its directory does not exist");
    path_in(*state, "plain-file", file, sizeof file);
    create_file(&f, file, 4096);
    aio_file_close(&f);
    expect_error(aio_rank_dir(file, 0, 4096, rank_dir, sizeof rank_dir, err), ENOTDIR, err,
                 "is not a directory");
}

// The child sets the limit, so the parent's later tests are not bound by it.
typedef struct LimitPaths {
    char existing[640], fresh[640];
} LimitPaths;
static LimitPaths limit_paths;  // run_child's function takes no argument

static void write_past_file_size_limit(void) {
    struct rlimit lim = {.rlim_cur = MIB, .rlim_max = MIB};
    char err[AIO_ERR_BYTES];
    Aio aio;
    AioFile f;
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
    signal(SIGXFSZ, SIG_DFL);  // as a fresh process has it: aio_init must ignore it
    if (aio_init(&aio, 4, 256 * KIB, err) || aio_file_open(&f, limit_paths.existing, err)) {
        fprintf(stderr, "%s\n", err);
        _exit(11);
    }
    void *buf = alloc_aligned(4 * MIB);
    fill_bytes(buf, 4 * MIB, 31);
    AioRequest w;
    aio_submit(&aio, &w, AIO_WRITE, &f, 0, buf, 4 * MIB);
    int rc = aio_wait(&aio, &w);
    fprintf(stderr, "%s\n", w.error);
    if (rc != EFBIG) _exit(12);
    AioFile g;
    rc = aio_file_create(&g, limit_paths.fresh, 4 * MIB, err);
    fprintf(stderr, "%s\n", err);
    if (rc != EFBIG) _exit(13);
    aio_file_close(&f);
    aio_destroy(&aio);
    _exit(0);
}

static void test_file_size_limit(void **state) {
    path_in(*state, "limit-existing", limit_paths.existing, sizeof limit_paths.existing);
    path_in(*state, "limit-fresh", limit_paths.fresh, sizeof limit_paths.fresh);
    AioFile f;
    create_file(&f, limit_paths.existing, 4 * MIB);  // made before the limit
    aio_file_close(&f);
    char *err = NULL;
    int rc = run_child(write_past_file_size_limit, &err);
    if (rc != 0) fail_msg("child exited %d (128: killed, SIGXFSZ not ignored?): %s", rc, err);
    // the write fails at the limit with the reason, the blocks below it landed
    assert_non_null(strstr(err, "aio write of"));
    assert_non_null(strstr(err, "File too large; the file size limit (ulimit -f)"));
    unsigned char *want = alloc_aligned(MIB);
    fill_bytes(want, MIB, 31);  // the child's buffer starts the same way
    assert_true(file_holds(limit_paths.existing, 0, want, MIB));
    // preallocation is refused the same way, and leaves no file behind
    assert_non_null(strstr(err, "preallocating 4194304 bytes"));
    assert_false(exists(limit_paths.fresh));
    free(want);
    free(err);
}

static void test_tmpfs_refused(void **state) {
    (void)state;
    struct statfs fs;
    assert_int_equal(statfs("/dev/shm", &fs), 0);
    if (fs.f_type != TMPFS_MAGIC) fail_msg("/dev/shm is not tmpfs here; this test needs a tmpfs");
    char dir[64] = "/dev/shm/wb-test-aio-XXXXXX", rank_dir[128], path[128], err[AIO_ERR_BYTES];
    assert_non_null(mkdtemp(dir));
    expect_error(aio_rank_dir(dir, 0, 4096, rank_dir, sizeof rank_dir, err), EINVAL, err,
                 "is on tmpfs, which lives in memory");
    assert_non_null(strstr(err, "hint: use a directory on a disk-backed file system"));
    snprintf(path, sizeof path, "%s/rank-0", dir);
    assert_false(exists(path));
    AioFile f;
    snprintf(path, sizeof path, "%s/master.bin", dir);
    expect_error(aio_file_create(&f, path, 4096, err), EINVAL, err, "is on tmpfs");
    assert_false(exists(path));
    FILE *made = fopen(path, "w");  // one made by other means is refused at open
    assert_non_null(made);
    fclose(made);
    expect_error(aio_file_open(&f, path, err), EINVAL, err, "is on tmpfs");
    test_remove_dir(dir);
}

static void test_free_space_check(void **state) {
    Ctx *c = *state;
    char rank_dir[700], want[700], err[AIO_ERR_BYTES], needed[64];
    struct statvfs vfs;
    assert_int_equal(statvfs(c->root, &vfs), 0);
    size_t free_bytes = (size_t)vfs.f_bavail * vfs.f_frsize;
    size_t too_much = free_bytes + ((size_t)1 << 40);
    snprintf(needed, sizeof needed, "need %zu bytes", too_much);
    expect_error(aio_rank_dir(c->root, 3, too_much, rank_dir, sizeof rank_dir, err), ENOSPC, err,
                 needed);
    assert_non_null(strstr(err, "bytes") && strstr(err, "free"));
    snprintf(want, sizeof want, "%s/rank-3", c->root);
    assert_false(exists(want));  // refused before anything is made
    assert_int_equal(aio_rank_dir(c->root, 3, MIB, rank_dir, sizeof rank_dir, err), 0);
    assert_string_equal(rank_dir, want);
    assert_true(exists(want));
    assert_int_equal(aio_rank_dir(c->root, 3, MIB, rank_dir, sizeof rank_dir, err), 0);  // again
    expect_error(aio_rank_dir(c->root, 3, too_much, rank_dir, sizeof rank_dir, err), ENOSPC, err,
                 "files of an earlier run");
    expect_error(aio_rank_dir(c->root, 3, MIB, rank_dir, 8, err), ENAMETOOLONG, err, "longer than");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_knobs_refused),
        cmocka_unit_test(test_misaligned_requests_refused),
        cmocka_unit_test(test_kernel_refusal_fails_the_request),
        cmocka_unit_test(test_short_file),
        cmocka_unit_test(test_missing_directory),
        cmocka_unit_test(test_file_size_limit),
        cmocka_unit_test(test_tmpfs_refused),
        cmocka_unit_test(test_free_space_check),
    };
    return cmocka_run_group_tests(tests, aiotest_setup, aiotest_teardown);
}
