// testutil.h: what the cmocka tests share: includes, a seeded random fill,
// relative-error comparison, running a command and capturing its output, and
// the MPI wrapper for multi-rank tests (rank 0 reports, every rank runs).
#pragma once
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

static inline uint64_t test_rng_next(uint64_t *s) {  // xorshift64*
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static inline float test_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((test_rng_next(s) >> 40) * (1.0 / 16777216.0));
}
static inline void test_fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) x[i] = test_uniform(&s, lo, hi);
}
// |a-b| <= atol + rtol*|b|
static inline int test_close(double a, double b, double atol, double rtol) {
    return fabs(a - b) <= atol + rtol * fabs(b);
}

// Runs `cmd` through the shell with the project's mpirun settings; captures
// stdout+stderr into a malloc'd string (*out) and returns the exit status.
static inline int test_run(const char *cmd, char **out) {
    char full[8192];
    snprintf(full, sizeof full,
             "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_orte_execute_quiet=1 "
             "OMPI_MCA_btl=self,vader,tcp "
             "OMPI_MCA_mpi_yield_when_idle=1; %s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 4096) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// A fresh folder /tmp/wb-NAME-XXXXXX for a test's files, in root (>= 64
// bytes); 0 on success. test_remove_dir takes it away again (0 on success).
static inline int test_make_dir(char *root, size_t bytes, const char *name) {
    snprintf(root, bytes, "/tmp/wb-%s-XXXXXX", name);
    return mkdtemp(root) ? 0 : -1;
}
static inline int test_remove_dir(const char *root) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "could not remove %s\n", root);
    return rc;
}

#ifdef TEST_WITH_MPI
#include <mpi.h>
// Every rank runs the group; ranks other than 0 send their output to
// /dev/null, and a test that fails on any rank must fail on rank 0 too
// (assert on values reduced with MPI_Allreduce).
#define run_mpi_tests(tests)                                              \
    ({                                                                    \
        int rank_;                                                        \
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);                            \
        if (rank_ != 0) {                                                 \
            if (!freopen("/dev/null", "w", stdout)) abort();              \
            if (!freopen("/dev/null", "w", stderr)) abort();              \
        }                                                                 \
        int fails_ = cmocka_run_group_tests(tests, NULL, NULL);           \
        int any_ = 0;                                                     \
        MPI_Allreduce(&fails_, &any_, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); \
        any_;                                                             \
    })
#endif

// The value(s) of "key" in a one-line JSON object: a number, or an array of
// numbers. Returns how many numbers were read (0 when the key is absent or
// null). Enough for the trainers' --json records; not a general parser.
static inline int json_numbers(const char *json, const char *key, double *out, int max) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p) return 0;
    p += strlen(pat);
    if (*p != '[') {
        char *end;
        double v = strtod(p, &end);
        if (end == p) return 0;
        if (max > 0) out[0] = v;
        return 1;
    }
    int n = 0;
    p++;
    while (*p && *p != ']') {
        char *end;
        double v = strtod(p, &end);
        if (end == p) break;
        if (n < max) out[n] = v;
        n++;
        p = end;
        if (*p == ',') p++;
    }
    return n;
}

// A whole file, malloc'd and NUL-terminated (*len bytes, len may be NULL); NULL if it cannot be opened.
static inline char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    if (len) *len = got;
    fclose(f);
    return buf;
}

// The last line of a file (a --json record), malloc'd; NULL if none.
static inline char *last_line(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *line = NULL, *last = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        free(last);
        last = strdup(line);
    }
    free(line);
    fclose(f);
    return last;
}

// For error paths that end the process: runs fn in a forked child.
typedef void (*ChildFn)(void);

// Runs fn in a child; returns its exit status, and its stderr in *err (malloc'd).
static inline int run_child(ChildFn fn, char **err) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    ssize_t got;
    while ((got = read(fds[0], buf + len, cap - len - 1)) > 0) len += (size_t)got;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    *err = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// A fresh folder on a disk for O_DIRECT files (the aio tests, infinity's swap
// files): under $WB_AIO_TEST_DIR, else /var/tmp. Returns 0, or 1 after one
// line naming `test` where that folder is missing or in memory (tmpfs
// refuses O_DIRECT).
static inline int make_disk_dir(char *out, size_t n, const char *test) {
    const char *base = getenv("WB_AIO_TEST_DIR") ? getenv("WB_AIO_TEST_DIR") : "/var/tmp";
    struct statfs fs;
    if (statfs(base, &fs) != 0 || fs.f_type == TMPFS_MAGIC) {
        fprintf(stderr, "%s: %s is missing or in memory (tmpfs); O_DIRECT needs a disk: set WB_AIO_TEST_DIR to "
                "a directory on one\n", test, base);
        return 1;
    }
    snprintf(out, n, "%s/wb-%s-XXXXXX", base, test);
    return mkdtemp(out) ? 0 : 1;
}
