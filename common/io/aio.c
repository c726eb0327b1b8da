// aio.c: the Aio context: one I/O thread that keeps queue_depth blocks of
// the queued requests in the kernel (libaio, O_DIRECT), and the callers'
// submit / wait / test.
#define _GNU_SOURCE  // O_DIRECT, GNU strerror_r
#include "aio.h"
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "check.h"
#include "trace.h"

#define AIO_MAX_QUEUE_DEPTH 1024
#define AIO_MAX_BLOCK_BYTES ((size_t)1 << 30)  // far below the kernel's ~2 GiB per-I/O cap

static void set_error(char err[AIO_ERR_BYTES], const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, AIO_ERR_BYTES, fmt, ap);
    va_end(ap);
}

static const char *op_name(AioOp op) { return op == AIO_READ ? "read" : "write"; }

// What to do about an errno that came back from a block, as a hint.
static const char *errno_hint(int code, AioOp op) {
    switch (code) {
    case ENOSPC: return "the disk is full; hint: free space there or use a bigger disk";
    case EFBIG: return "the file size limit (ulimit -f) was reached; hint: raise it";
    case EIO: return "the device reported an I/O error; hint: check the disk (dmesg)";
    case EINVAL: return "the file system refused the O_DIRECT request; hint: use a disk-backed directory";
    default: return op == AIO_READ ? "hint: check the file and the disk" : "hint: check the disk";
    }
}

// ---- the caller's side -------------------------------------------------------

// The request completes at once with EINVAL; check_request wrote the message.
static int refuse(AioRequest *req) {
    req->status = EINVAL;
    req->done = 1;
    req->done_us = req->submit_us;
    return req->status;
}

// O_DIRECT's rules, checked here so a bad request never reaches the kernel.
static int check_request(const AioRequest *r, char err[AIO_ERR_BYTES]) {
    const char *path = r->file->path;
    if ((uintptr_t)r->buf % AIO_ALIGN_BYTES != 0) {
        set_error(err, "aio %s of '%s': buffer %p is not aligned to %d bytes (O_DIRECT); hint: "
                  "allocate it with buf_alloc(TIER_PINNED) or aligned_alloc(%d, ...)",
                  op_name(r->op), path, r->buf, AIO_ALIGN_BYTES, AIO_ALIGN_BYTES);
        return 1;
    }
    if (r->offset % AIO_ALIGN_BYTES != 0) {
        set_error(err, "aio %s of '%s': offset %zu is not a multiple of %d bytes (O_DIRECT); hint: "
                  "place tensors in the file at aio_round_up boundaries",
                  op_name(r->op), path, r->offset, AIO_ALIGN_BYTES);
        return 1;
    }
    if (r->bytes % AIO_ALIGN_BYTES != 0) {
        set_error(err, "aio %s of '%s': length %zu is not a multiple of %d bytes (O_DIRECT); hint: "
                  "size the request and its buffer with aio_round_up",
                  op_name(r->op), path, r->bytes, AIO_ALIGN_BYTES);
        return 1;
    }
    if (r->file->fd < 0) {
        set_error(err, "aio %s of '%s': the file is not open", op_name(r->op), path);
        return 1;
    }
    if (r->offset > r->file->bytes || r->bytes > r->file->bytes - r->offset) {
        set_error(err, "aio %s of '%s': bytes [%zu, %zu) run past the end of the file (%zu bytes); "
                  "hint: %s", op_name(r->op), path, r->offset, r->offset + r->bytes,
                  r->file->bytes, r->op == AIO_READ ? "the file is shorter than the tensor asked for"
                  : "create the file with room for every tensor it holds");
        return 1;
    }
    return 0;
}

int aio_submit(Aio *aio, AioRequest *req, AioOp op, const AioFile *file, size_t offset, void *buf,
               size_t bytes) {
    *req = (AioRequest){.op = op, .file = file, .offset = offset, .buf = buf, .bytes = bytes,
                        .next_offset = offset, .submit_us = now_us()};
    if (check_request(req, req->error)) return refuse(req);
    if (bytes == 0) {
        req->done = 1;
        req->done_us = req->submit_us;
        return 0;
    }
    pthread_mutex_lock(&aio->lock);
    req->queued = 1;
    if (aio->tail) aio->tail->next = req;
    else aio->head = req;
    aio->tail = req;
    pthread_cond_signal(&aio->work);
    int polling = aio->polling;
    pthread_mutex_unlock(&aio->lock);
    if (polling) eventfd_write(aio->wake_fd, 1);  // free slots take it now, not at the next completion
    return 0;
}

int aio_wait(Aio *aio, AioRequest *req) {
    pthread_mutex_lock(&aio->lock);
    while (!req->done) pthread_cond_wait(&aio->done, &aio->lock);
    pthread_mutex_unlock(&aio->lock);
    return req->status;
}

int aio_test(Aio *aio, AioRequest *req) {
    pthread_mutex_lock(&aio->lock);
    int done = req->done;
    pthread_mutex_unlock(&aio->lock);
    return done;
}

AioStats aio_stats(Aio *aio) {
    pthread_mutex_lock(&aio->lock);
    AioStats s = aio->stats;
    pthread_mutex_unlock(&aio->lock);
    return s;
}

// ---- the I/O thread (every function below runs on it) -------------------------

// Called with the lock held once a request has nothing queued or in flight.
static void finish_request(Aio *aio, AioRequest *r) {
    r->done_us = now_us();
    AioStats *s = &aio->stats;
    if (r->status != 0) s->failed++;
    else if (r->op == AIO_READ) s->reads++, s->bytes_read += r->bytes;
    else s->writes++, s->bytes_written += r->bytes;
    r->done = 1;
    pthread_cond_broadcast(&aio->done);
}

static void pop_head(Aio *aio) {
    AioRequest *r = aio->head;
    aio->head = r->next;
    if (!aio->head) aio->tail = NULL;
    r->next = NULL;
    r->queued = 0;
    if (r->blocks_in_flight == 0) finish_request(aio, r);
}

// With the lock held: cuts blocks off the oldest queued requests until
// queue_depth are in flight; returns how many it put in aio->batch.
static int take_blocks(Aio *aio) {
    int n = 0;
    while (aio->free_count > 0 && aio->head) {
        AioRequest *r = aio->head;
        size_t end = r->offset + r->bytes;
        if (r->status != 0 || r->next_offset == end) {  // failed, or all handed out
            pop_head(aio);
            continue;
        }
        size_t len = end - r->next_offset < aio->block_bytes ? end - r->next_offset : aio->block_bytes;
        char *buf = (char *)r->buf + (r->next_offset - r->offset);
        struct iocb *cb = aio->free_iocbs[--aio->free_count];
        if (r->op == AIO_READ) io_prep_pread(cb, r->file->fd, buf, len, (long long)r->next_offset);
        else io_prep_pwrite(cb, r->file->fd, buf, len, (long long)r->next_offset);
        io_set_eventfd(cb, aio->done_fd);
        cb->data = r;
        if (r->next_offset == r->offset) r->start_us = now_us();
        r->next_offset += len;
        r->blocks_in_flight++;
        aio->batch[n++] = cb;
    }
    return n;
}

// With the lock held: one block came back with `res` (bytes moved, or -errno).
static void complete_block(Aio *aio, struct iocb *cb, long res) {
    AioRequest *r = cb->data;
    size_t asked = cb->u.c.nbytes, at = (size_t)cb->u.c.offset;
    aio->free_iocbs[aio->free_count++] = cb;
    r->blocks_in_flight--;
    if (r->status == 0 && res < 0) {
        char reason[128];
        r->status = (int)-res;
        set_error(r->error, "aio %s of '%s' failed at byte %zu (block of %zu bytes): %s; %s",
                  op_name(r->op), r->file->path, at, asked,
                  strerror_r(r->status, reason, sizeof reason), errno_hint(r->status, r->op));
    } else if (r->status == 0 && (size_t)res != asked) {
        r->status = r->op == AIO_READ ? ENODATA : EIO;
        set_error(r->error, "aio %s of '%s': short %s, %ld of %zu bytes at byte %zu; hint: %s",
                  op_name(r->op), r->file->path, op_name(r->op), res, asked, at,
                  r->op == AIO_READ ? "the file ends before the tensor does (truncated, or "
                  "not written by this run?)" : "the disk is full or the file size limit was reached");
    }
    if (!r->queued && r->blocks_in_flight == 0) finish_request(aio, r);
}

// Without the lock: gives the batch to the kernel. A block the kernel refuses
// at submission completes with that error; returns how many it accepted.
static int submit_batch(Aio *aio, int n) {
    int accepted = 0, i = 0;
    while (i < n) {
        int got = io_submit(aio->ctx, n - i, aio->batch + i);
        if (got <= 0) {  // the kernel refused batch[i]; the rest may still go
            if (got == 0) got = -EAGAIN;  // took none without saying why
            pthread_mutex_lock(&aio->lock);
            complete_block(aio, aio->batch[i], got);
            pthread_mutex_unlock(&aio->lock);
            i++;
            continue;
        }
        accepted += got;
        i += got;
    }
    return accepted;
}

// Without the lock, blocks in the kernel: sleeps until one of them comes
// back or a request comes in, then takes the completions there are (none
// when it woke for a request).
static int await_event(Aio *aio) {
    struct pollfd fds[2] = {{.fd = aio->done_fd, .events = POLLIN}, {.fd = aio->wake_fd, .events = POLLIN}};
    int rc;
    do rc = poll(fds, 2, -1);
    while (rc < 0 && errno == EINTR);
    CHECK(rc > 0, "aio: poll on the completion eventfds: %s; hint: a bug in the aio context's set-up",
          strerror(errno));
    eventfd_t count;
    if (fds[1].revents & POLLIN) eventfd_read(aio->wake_fd, &count);
    if (!(fds[0].revents & POLLIN)) return 0;
    eventfd_read(aio->done_fd, &count);  // reset before reaping: a later completion raises it again
    struct timespec now = {0, 0};
    int got;
    do got = io_getevents(aio->ctx, 0, aio->queue_depth, aio->events, &now);
    while (got == -EINTR);
    CHECK(got >= 0, "io_getevents: %s; hint: a bug in the aio context's set-up", strerror(-got));
    return got;
}

// Keeps the queue full: submit what fits, wait for a completion or a new
// request, reap, and go round again, so a finished block is replaced at once
// (not a batch at a time) and a request that arrives while blocks are in
// flight goes into the free slots at once. Sleeps on the condition variable
// only when nothing is queued and nothing is in flight.
static void *io_thread_main(void *arg) {
    Aio *aio = arg;
    int in_kernel = 0;
    double busy_since_us = 0;
    pthread_mutex_lock(&aio->lock);
    for (;;) {
        int n = take_blocks(aio);
        if (n == 0 && in_kernel == 0) {
            if (aio->stopping && !aio->head) break;
            pthread_cond_wait(&aio->work, &aio->lock);
            continue;
        }
        aio->polling = 1;
        pthread_mutex_unlock(&aio->lock);
        if (in_kernel == 0) busy_since_us = now_us();
        in_kernel += submit_batch(aio, n);
        int got = in_kernel > 0 ? await_event(aio) : 0;
        pthread_mutex_lock(&aio->lock);
        aio->polling = 0;
        if (in_kernel > aio->stats.max_blocks_in_flight) aio->stats.max_blocks_in_flight = in_kernel;
        for (int i = 0; i < got; i++)
            complete_block(aio, aio->events[i].obj, (long)aio->events[i].res);
        if (got > 0) in_kernel -= got;
        if (in_kernel == 0) aio->stats.busy_us += now_us() - busy_since_us;
    }
    pthread_mutex_unlock(&aio->lock);
    return NULL;
}

// ---- set-up ----------------------------------------------------------------------

static void free_arrays(Aio *aio) {
    if (aio->done_fd >= 0) close(aio->done_fd);
    if (aio->wake_fd >= 0) close(aio->wake_fd);
    aio->done_fd = aio->wake_fd = -1;
    free(aio->iocbs);
    free(aio->free_iocbs);
    free(aio->batch);
    free(aio->events);
}

int aio_init(Aio *aio, int queue_depth, size_t block_bytes, char err[AIO_ERR_BYTES]) {
    memset(aio, 0, sizeof *aio);
    aio->done_fd = aio->wake_fd = -1;
    if (queue_depth < 1 || queue_depth > AIO_MAX_QUEUE_DEPTH) {
        set_error(err, "aio queue depth %d: must be 1 to %d", queue_depth, AIO_MAX_QUEUE_DEPTH);
        return EINVAL;
    }
    if (block_bytes == 0 || block_bytes % AIO_ALIGN_BYTES != 0 || block_bytes > AIO_MAX_BLOCK_BYTES) {
        set_error(err, "aio block size %zu bytes: must be a positive multiple of %d bytes "
                  "(O_DIRECT alignment), at most %zu", block_bytes, AIO_ALIGN_BYTES,
                  AIO_MAX_BLOCK_BYTES);
        return EINVAL;
    }
    aio_ignore_sigxfsz();
    aio->queue_depth = queue_depth;
    aio->block_bytes = block_bytes;
    aio->iocbs = calloc((size_t)queue_depth, sizeof *aio->iocbs);
    aio->free_iocbs = calloc((size_t)queue_depth, sizeof *aio->free_iocbs);
    aio->batch = calloc((size_t)queue_depth, sizeof *aio->batch);
    aio->events = calloc((size_t)queue_depth, sizeof *aio->events);
    if (!aio->iocbs || !aio->free_iocbs || !aio->batch || !aio->events) {
        free_arrays(aio);
        set_error(err, "aio: out of host memory for %d control blocks", queue_depth);
        return ENOMEM;
    }
    for (int i = 0; i < queue_depth; i++) aio->free_iocbs[i] = &aio->iocbs[i];
    aio->free_count = queue_depth;
    aio->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    aio->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (aio->done_fd < 0 || aio->wake_fd < 0) {
        int code = errno;
        char reason[128];
        set_error(err, "aio: eventfd failed: %s", strerror_r(code, reason, sizeof reason));
        free_arrays(aio);
        return code;
    }
    int rc = io_setup(queue_depth, &aio->ctx);
    if (rc < 0) {
        char reason[128];
        free_arrays(aio);
        set_error(err, "aio: io_setup(%d) failed: %s; hint: %s", queue_depth,
                  strerror_r(-rc, reason, sizeof reason),
                  -rc == EAGAIN ? "the system-wide limit fs.aio-max-nr is used up; lower "
                  "the queue depth or raise the limit" : "is libaio supported by this kernel?");
        return -rc;
    }
    pthread_mutex_init(&aio->lock, NULL);
    pthread_cond_init(&aio->work, NULL);
    pthread_cond_init(&aio->done, NULL);
    rc = pthread_create(&aio->thread, NULL, io_thread_main, aio);
    if (rc != 0) {
        char reason[128];
        io_destroy(aio->ctx);
        free_arrays(aio);
        set_error(err, "aio: starting the I/O thread failed: %s", strerror_r(rc, reason, sizeof reason));
        return rc;
    }
    return 0;
}

void aio_destroy(Aio *aio) {
    if (!aio->iocbs) return;  // never set up, or destroyed already
    pthread_mutex_lock(&aio->lock);
    aio->stopping = 1;
    pthread_cond_signal(&aio->work);
    pthread_mutex_unlock(&aio->lock);
    pthread_join(aio->thread, NULL);
    io_destroy(aio->ctx);
    pthread_mutex_destroy(&aio->lock);
    pthread_cond_destroy(&aio->work);
    pthread_cond_destroy(&aio->done);
    free_arrays(aio);
    memset(aio, 0, sizeof *aio);
}
