// aiotest.h: what the aio tests share: a fresh folder on a disk for their
// files ($WB_AIO_TEST_DIR, else /var/tmp: O_DIRECT needs a disk, so the
// group fails if that folder is in memory), aligned random buffers, and a
// look at a file's bytes that does not go through the module.
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include "testutil.h"
#include "aio.h"

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)

typedef struct Ctx {
    char root[512];
} Ctx;

static inline char *path_in(const Ctx *c, const char *name, char *out, size_t out_bytes) {
    snprintf(out, out_bytes, "%s/%s", c->root, name);
    return out;
}

static inline void *alloc_aligned(size_t bytes) {
    void *p = aligned_alloc(AIO_ALIGN_BYTES, aio_round_up(bytes ? bytes : 1));
    assert_non_null(p);
    return p;
}

static inline void fill_bytes(void *buf, size_t bytes, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    unsigned char *b = buf;
    for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(test_rng_next(&s) >> 56);
}

// The file's bytes [offset, offset+bytes) read without O_DIRECT, so a test
// sees where the data really landed, not what the module reads back.
static inline int file_holds(const char *path, size_t offset, const void *want, size_t bytes) {
    unsigned char *got = malloc(bytes);
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? pread(fd, got, bytes, (off_t)offset) : -1;
    if (fd >= 0) close(fd);
    int same = n == (ssize_t)bytes && memcmp(got, want, bytes) == 0;
    free(got);
    return same;
}

static inline void init_aio(Aio *aio, int depth, size_t block_bytes) {
    char err[AIO_ERR_BYTES];
    int rc = aio_init(aio, depth, block_bytes, err);
    if (rc) fail_msg("aio_init: %s", err);
}

static inline void create_file(AioFile *f, const char *path, size_t bytes) {
    char err[AIO_ERR_BYTES];
    int rc = aio_file_create(f, path, bytes, err);
    if (rc) fail_msg("aio_file_create: %s", err);
}

static inline void expect_ok(Aio *aio, AioRequest *r) {
    if (aio_wait(aio, r) != 0) fail_msg("request failed: %s", r->error);
}

static inline int aiotest_setup(void **state) {
    Ctx *c = calloc(1, sizeof *c);
    if (make_disk_dir(c->root, sizeof c->root, "test-aio")) return 1;
    *state = c;
    return 0;
}

static inline int aiotest_teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

