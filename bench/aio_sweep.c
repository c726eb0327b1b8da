// aio_sweep.c: one point of the aio benchmark (bench/aio.sh runs the sweep):
// GB/s of the aio module reading or writing a whole preallocated file at one
// block size and queue depth: the pattern `fio --ioengine=libaio --direct=1
// --rw=read|write` runs on the same file, so the two can be compared point by
// point. The file is split into requests of REQUEST_MB (a few tensors, as
// stage 06 streams sub-groups), all submitted at once and waited in order,
// so the queue stays full across requests as it must in the stage.
//
// usage: aio_sweep prepare FILE MIB
//            create FILE, preallocate MIB MiB, and write it once (so the
//            measured writes overwrite written blocks, as fio's do)
//        aio_sweep run FILE read|write BLOCK_KB DEPTH [REQUEST_MB (default 256)]
//            prints one JSON line: bytes, seconds, gbps (1e9 bytes/s, from
//            the first submit to the last completion), the deepest queue seen
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "aio.h"
#include "trace.h"

#define MIB ((size_t)1 << 20)

static void usage(const char *msg) {
    fprintf(stderr, "aio_sweep: %s; usage: aio_sweep prepare FILE MIB | aio_sweep run FILE "
            "read|write BLOCK_KB DEPTH [REQUEST_MB]\n", msg);
    exit(2);
}

static long positive(const char *arg, const char *what) {
    char *end;
    long v = strtol(arg, &end, 10);
    if (*arg == 0 || *end != 0 || v <= 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s must be a positive integer, got '%s'", what, arg);
        usage(msg);
    }
    return v;
}

static void *page_aligned(size_t bytes) {
    void *p = aligned_alloc(AIO_ALIGN_BYTES, aio_round_up(bytes));
    if (!p) {
        fprintf(stderr, "aio_sweep: out of host memory for a %zu-byte buffer\n", bytes);
        exit(1);
    }
    memset(p, 0x5a, bytes);  // fault every page in before anything is timed
    return p;
}

static void start_or_exit(Aio *aio, int depth, size_t block_bytes) {
    char err[AIO_ERR_BYTES];
    if (aio_init(aio, depth, block_bytes, err) != 0) {
        fprintf(stderr, "aio_sweep: %s\n", err);
        exit(2);
    }
}

// Moves the whole file through buf as requests of request_bytes; returns
// the seconds from the first submit to the last completion.
static double stream_file(Aio *aio, AioOp op, const AioFile *f, void *buf, size_t request_bytes) {
    size_t n = (f->bytes + request_bytes - 1) / request_bytes;
    AioRequest *req = calloc(n, sizeof *req);
    double t0_us = now_us();
    for (size_t i = 0; i < n; i++) {
        size_t at = i * request_bytes;
        size_t len = f->bytes - at < request_bytes ? f->bytes - at : request_bytes;
        aio_submit(aio, &req[i], op, f, at, (char *)buf + at, len);
    }
    for (size_t i = 0; i < n; i++) {
        if (aio_wait(aio, &req[i]) != 0) {
            fprintf(stderr, "aio_sweep: %s\n", req[i].error);
            exit(1);
        }
    }
    double seconds = (now_us() - t0_us) * 1e-6;
    free(req);
    return seconds;
}

static int prepare(const char *path, size_t bytes) {
    char err[AIO_ERR_BYTES];
    AioFile f;
    if (aio_file_create(&f, path, bytes, err) != 0) {
        fprintf(stderr, "aio_sweep: %s\n", err);
        return 2;
    }
    Aio aio;
    start_or_exit(&aio, 16, MIB);
    void *buf = page_aligned(bytes);
    stream_file(&aio, AIO_WRITE, &f, buf, 256 * MIB);
    aio_destroy(&aio);
    aio_file_close(&f);
    free(buf);
    return 0;
}

static int run(const char *path, AioOp op, size_t block_bytes, int depth, size_t request_bytes) {
    char err[AIO_ERR_BYTES];
    AioFile f;
    if (aio_file_open(&f, path, err) != 0) {
        fprintf(stderr, "aio_sweep: %s; hint: run 'aio_sweep prepare' first\n", err);
        return 2;
    }
    Aio aio;
    start_or_exit(&aio, depth, block_bytes);
    void *buf = page_aligned(f.bytes);
    double seconds = stream_file(&aio, op, &f, buf, request_bytes);
    AioStats st = aio_stats(&aio);
    printf("{\"tool\": \"ours\", \"op\": \"%s\", \"block_kb\": %zu, \"depth\": %d, "
           "\"request_mb\": %zu, \"bytes\": %zu, \"seconds\": %.6f, \"gbps\": %.4f, "
           "\"max_blocks_in_flight\": %d}\n", op == AIO_READ ? "read" : "write",
           block_bytes / 1024, depth, request_bytes / MIB, f.bytes, seconds,
           f.bytes / seconds * 1e-9, st.max_blocks_in_flight);
    aio_destroy(&aio);
    aio_file_close(&f);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "prepare") == 0)
        return prepare(argv[2], (size_t)positive(argv[3], "MIB") * MIB);
    if ((argc == 6 || argc == 7) && strcmp(argv[1], "run") == 0) {
        AioOp op = strcmp(argv[3], "read") == 0 ? AIO_READ : AIO_WRITE;
        if (op == AIO_WRITE && strcmp(argv[3], "write") != 0) usage("the operation is read or write");
        size_t block_bytes = (size_t)positive(argv[4], "BLOCK_KB") * 1024;
        int depth = (int)positive(argv[5], "DEPTH");
        size_t request_bytes = (size_t)(argc == 7 ? positive(argv[6], "REQUEST_MB") : 256) * MIB;
        return run(argv[2], op, block_bytes, depth, request_bytes);
    }
    usage("expected 'prepare' or 'run' and their arguments");
}
