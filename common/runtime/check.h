// check.h: error reporting. Every check prints file:line and a hint
// (llm.c's xxxCheck pattern); usage errors exit with status 2.
#pragma once
#include <stdio.h>
#include <stdlib.h>

#define EXIT_USAGE 2  // bad input: flags, data, checkpoint, budget

// Bad input detected identically on every rank: rank 0 prints
// "<prog>: error: <msg>" as one line, every rank finalizes MPI and exits 2.
// Safe before MPI_Init and after MPI_Finalize.
__attribute__((noreturn, format(printf, 1, 2))) void fail_usage(const char *fmt, ...);

// Every rank calls it: finalizes MPI if it was initialized, exits with status
// (0 after --help; fail_usage ends here with 2).
__attribute__((noreturn)) void exit_all(int status);

// Bad input or failure seen by one rank only: prints
// "<prog>: rank R: error: <msg>" and aborts the whole job with `status`.
__attribute__((noreturn, format(printf, 2, 3))) void fail_rank(int status, const char *fmt, ...);

// Internal error (a bug or a failing library call): prints file:line, the
// message, and aborts the job with status 1.
__attribute__((noreturn, format(printf, 3, 4))) void fail_at(const char *file, int line,
                                                             const char *fmt, ...);

#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond)) fail_at(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

// MPI errors return to the caller (MPI_ERRORS_RETURN, set by comm_world_init)
// so that this check, not MPI's own abort banner, reports them.
#define mpiCheck(call)                                                  \
    do {                                                                \
        int mpi_status_ = (call);                                       \
        if (mpi_status_ != 0) mpi_fail_at(__FILE__, __LINE__, mpi_status_, #call); \
    } while (0)
__attribute__((noreturn)) void mpi_fail_at(const char *file, int line, int code, const char *call);

// malloc that cannot return NULL (ordinary host memory, not tracked by mem;
// use buf_alloc for anything that counts as model or training memory)
void *xmalloc(size_t bytes);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t bytes);

// This process's rank in MPI_COMM_WORLD and the world's size, or 0 and 1
// before MPI_Init or after MPI_Finalize.
int world_rank(void);
int world_size(void);
