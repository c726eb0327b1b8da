// aio.h: asynchronous file I/O with libaio and O_DIRECT, the NVMe tier of
// ZeRO-Infinity (stage 06). A request reads or writes a whole tensor; an Aio
// context splits it into blocks of `block_bytes` and its one I/O thread keeps
// `queue_depth` blocks in the kernel at all times: it reaps completions with
// io_getevents and refills the queue at once, across requests in FIFO order
// (DeepSpeed's aio handle works the same way). The caller submits, goes on
// computing, and waits on the request later.
//
// O_DIRECT moves data between the disk and the caller's buffer by DMA,
// bypassing the page cache, so the buffer, the file offset and the length
// must all be multiples of the device's logical block size. That is 512 or
// 4096 bytes on today's disks; AIO_ALIGN_BYTES = 4096 (the page size, and a
// multiple of both) is right everywhere. buf_alloc(dev, TIER_PINNED, ...)
// returns page-aligned memory; size buffers and file regions with
// aio_round_up.
//
// Errors come back as a nonzero status with a one-line message (never an
// exit), so the stage can name the tensor and step that failed and stop with
// its last checkpoint intact.
//
// Threads: aio_submit, aio_wait, aio_test and aio_stats may be called from
// any number of threads at once (a mutex guards the queue); the stage uses
// its main thread and its optimizer thread. A request belongs to its caller:
// between aio_submit and the end of aio_wait (or aio_test answering 1) the
// caller must not reuse the AioRequest, touch the buffer, or close the file.
// aio_init and aio_destroy run while no other call on the context is in
// progress; aio_file_close only once no request on the file is in flight.
#pragma once
#include <libaio.h>
#include <pthread.h>
#include <stddef.h>

#define AIO_ALIGN_BYTES 4096
#define AIO_ERR_BYTES 512  // room for one error line

typedef struct AioFile {
    int fd;       // opened O_RDWR | O_DIRECT; -1 when closed
    size_t bytes; // the file's size at create/open; requests must stay inside
    char *path;   // for messages (owned); NULL when closed
} AioFile;

typedef enum { AIO_READ = 0, AIO_WRITE = 1 } AioOp;

typedef struct AioRequest {
    // what was asked
    AioOp op;
    const AioFile *file;
    size_t offset, bytes;
    void *buf;
    // the request's interval on the timeline (now_us): handed to aio_submit,
    // first block given to the kernel, last block completed
    double submit_us, start_us, done_us;
    // the outcome: 0, or an errno value with a one-line message
    int status;
    char error[AIO_ERR_BYTES];
    // the I/O thread's bookkeeping (under the context's mutex)
    size_t next_offset;      // first byte not yet given to the kernel
    int blocks_in_flight;
    int queued;              // still has blocks to give to the kernel
    int done;
    struct AioRequest *next; // FIFO of queued requests
} AioRequest;

typedef struct AioStats {
    size_t bytes_read, bytes_written;  // by requests that succeeded
    size_t reads, writes, failed;      // requests completed
    int max_blocks_in_flight;          // never more than queue_depth
    double busy_us;                    // time with at least one block in the kernel
} AioStats;

typedef struct Aio {
    int queue_depth;
    size_t block_bytes;
    io_context_t ctx;
    struct iocb *iocbs;        // queue_depth control blocks...
    struct iocb **free_iocbs;  // ...and a stack of the unused ones
    int free_count;
    struct iocb **batch;       // blocks taken for one io_submit
    struct io_event *events;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;       // the I/O thread waits here for requests while none is in the kernel...
    int done_fd, wake_fd;      // ...and polls these eventfds while some are: a block came back, a request came in
    int polling;               // it is (or is about to be) in that poll: a submit writes wake_fd
    pthread_cond_t done;       // callers wait here for theirs
    AioRequest *head, *tail;   // queued requests, oldest first
    int stopping;
    AioStats stats;
} Aio;

// Sets up the context and starts its I/O thread. queue_depth in 1..1024;
// block_bytes a positive multiple of AIO_ALIGN_BYTES, at most 1 GiB.
// Returns 0, or nonzero with the reason in err. Calls aio_ignore_sigxfsz.
int aio_init(Aio *aio, int queue_depth, size_t block_bytes, char err[AIO_ERR_BYTES]);
// Waits for every submitted request to finish, then stops the thread.
void aio_destroy(Aio *aio);
// SIGXFSZ's default action kills the process when a write crosses
// RLIMIT_FSIZE; ignored, the write fails with EFBIG and the caller hears of
// it. Process-wide; leaves a handler the program installed alone.
void aio_ignore_sigxfsz(void);

// bytes rounded up to a multiple of AIO_ALIGN_BYTES
static inline size_t aio_round_up(size_t bytes) {
    return (bytes + AIO_ALIGN_BYTES - 1) / AIO_ALIGN_BYTES * AIO_ALIGN_BYTES;
}

// Starts reading or writing [offset, offset + bytes) of the file from/into
// buf. Buffer, offset and length must be multiples of AIO_ALIGN_BYTES and the
// range inside the file; otherwise the request is refused here (nothing
// reaches the kernel) and completes at once with the status and message, as
// does a request of 0 bytes (status 0). Returns req->status so far.
int aio_submit(Aio *aio, AioRequest *req, AioOp op, const AioFile *file, size_t offset, void *buf,
               size_t bytes);
// Blocks until the request is done; returns its status (message in req->error).
int aio_wait(Aio *aio, AioRequest *req);
// 1 when the request is done (then req->status is final), 0 while in flight.
int aio_test(Aio *aio, AioRequest *req);
AioStats aio_stats(Aio *aio);

// ---- files (aio_file.c) -------------------------------------------------------

// Checks DIR (exists, is a directory, is on a disk rather than in memory) and
// that its file system has bytes_needed free, then makes DIR/rank-R and puts
// its path in rank_dir. bytes_needed counts every byte the files will take
// on this file system (sum the ranks that share it, and make no file on any
// rank before every rank has passed the check). Nothing is created when a
// check fails. Returns 0, or nonzero with the reason in err.
int aio_rank_dir(const char *dir, int rank, size_t bytes_needed, char *rank_dir,
                 size_t rank_dir_bytes, char err[AIO_ERR_BYTES]);
// Creates (or truncates) `path` for O_DIRECT I/O and preallocates `bytes`
// (a multiple of AIO_ALIGN_BYTES) with fallocate, so a full disk shows here
// and not in the middle of a run.
int aio_file_create(AioFile *f, const char *path, size_t bytes, char err[AIO_ERR_BYTES]);
// Opens an existing file for O_DIRECT I/O; f->bytes is its size.
int aio_file_open(AioFile *f, const char *path, char err[AIO_ERR_BYTES]);
void aio_file_close(AioFile *f);  // no-op on a closed or zeroed AioFile
