// check.c: error reporting and exits that keep an MPI job tidy (see check.h).
// The rule: an error every rank sees alike (a bad flag) is printed once by
// rank 0 and every rank finalizes; an error only one rank sees aborts the job,
// since the other ranks may be blocked in a collective waiting for it.
#include "check.h"
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "stop.h"

// glibc's short program name (argv[0] without its directory)
extern char *program_invocation_short_name;

static int mpi_is_running(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
}

// Before MPI_Init the launcher's variables say which rank this is (Open
// MPI's, then PMIx's and PMI's), so that an error found that early is still
// printed once; a program started without a launcher is rank 0.
static int launcher_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

int world_rank(void) {
    if (!mpi_is_running()) return launcher_rank();
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

int world_size(void) {
    if (!mpi_is_running()) return 1;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

void exit_all(int status) {
    stop_ending();
    stop_remove_files();  // the run's scratch files go on every exit it controls
    fflush(stdout);
    fflush(stderr);
    if (mpi_is_running()) MPI_Finalize();
    exit(status);
}

// Ends the job from one rank. With other ranks alive only MPI_Abort is sure
// to stop them (they may be waiting in a collective that will never finish).
__attribute__((noreturn)) static void abort_job(int status) {
    stop_ending();
    stop_remove_files();  // before MPI_Abort, which the other ranks see as SIGTERM (stop.c)
    fflush(stdout);
    fflush(stderr);
    if (mpi_is_running() && world_size() > 1) MPI_Abort(MPI_COMM_WORLD, status);
    exit(status);
}

void mpi_fail_at(const char *file, int line, int code, const char *call) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", code);
    fail_at(file, line, "MPI call failed (%s): %s; hint: check that every rank calls the same collectives "
            "in the same order, with matching counts", text, call);
}

// One line, written with a single fprintf so ranks' lines do not interleave.
static void print_error_line(const char *prefix, const char *fmt, va_list ap) {
    // whole, however long the paths in it: one write, never cut
    va_list again;
    va_copy(again, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    char *msg = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (msg) vsnprintf(msg, (size_t)len + 1, fmt, again);
    va_end(again);
    fprintf(stderr, "%s%s\n", prefix, msg ? msg : fmt);
    free(msg);
}

void fail_usage(const char *fmt, ...) {
    if (world_rank() == 0) {
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%s: error: ", program_invocation_short_name);
        va_list ap;
        va_start(ap, fmt);
        print_error_line(prefix, fmt, ap);
        va_end(ap);
    }
    exit_all(EXIT_USAGE);
}

void fail_rank(int status, const char *fmt, ...) {
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s: rank %d: error: ", program_invocation_short_name,
             world_rank());
    va_list ap;
    va_start(ap, fmt);
    print_error_line(prefix, fmt, ap);
    va_end(ap);
    abort_job(status);
}

void fail_at(const char *file, int line, const char *fmt, ...) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s: rank %d: %s:%d: ", program_invocation_short_name,
             world_rank(), file, line);
    va_list ap;
    va_start(ap, fmt);
    print_error_line(prefix, fmt, ap);
    va_end(ap);
    abort_job(1);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail_at(__FILE__, __LINE__, "malloc of %zu bytes failed; hint: the host is out of memory", bytes);
    return p;
}

void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fail_at(__FILE__, __LINE__, "realloc to %zu bytes failed; hint: the host is out of memory", bytes);
    return q;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        fail_at(__FILE__, __LINE__, "calloc of %zu x %zu bytes failed; hint: the host is out of memory",
                n, size);
    return p;
}
