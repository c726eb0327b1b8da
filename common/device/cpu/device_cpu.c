// device_cpu.c: the cpu device. "Device memory" is host memory under a
// capacity budget (--hbm-gb), so a laptop hits the same out-of-memory wall a
// GPU would. Streams run synchronously in issue order on the calling thread,
// so events are complete when recorded and waits have nothing to wait for.
#include <cblas.h>  // OpenBLAS's: declares openblas_set_num_threads
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "blas_core.h"
#include "check.h"
#include "device_backends.h"
#include "kernels.h"

#define CPU_ALIGN_BYTES 64  // a cache line, and the widest SIMD load (AVX-512)

// ---- the device tier: one region, placed by the arena (mem.h) ----

// The budget (--hbm-gb), or without one the host's memory over the ranks
// on this node, rounded up to whole arena pages.
static size_t cpu_region_bytes(Device *d) {
    size_t bytes = d->mem.budget[TIER_DEVICE];
    if (!bytes) bytes = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE) / (size_t)d->local_size;
    return arena_rounded(bytes);
}

// Address space only: a page is host memory once a kernel writes it, as a
// GPU's is once the driver maps it, so a region the size of the host's
// memory costs nothing it does not use.
static void *cpu_reserve(Device *d, size_t bytes) {
    (void)d;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void cpu_unreserve(Device *d, void *region, size_t bytes) {
    (void)d;
    munmap(region, bytes);
}

// Work runs as it is issued: a block taken back is free at once.
static void cpu_block(Device *d, void *ptr, size_t bytes) { (void)d, (void)ptr, (void)bytes; }

// ---- host and pinned memory ----

static void *cpu_alloc(Device *d, MemTier tier, size_t bytes) {
    (void)d;
    // "pinned" host memory exists to let a GPU DMA from it; on the cpu device
    // it is ordinary host memory, kept as its own tier so the accounting
    // matches what the cuda device would show.
    CHECK(tier == TIER_HOST || tier == TIER_PINNED,
          "cpu_alloc: the %s tier is not allocated here; hint: device buffers are blocks of the device's region, "
          "and the aio module owns files on nvme (and accounts them with mem_track_alloc)", mem_tier_name(tier));
    // pinned buffers are page-aligned, as cudaHostAlloc's are: the aio module
    // reads and writes them with O_DIRECT, which needs that alignment
    size_t align_bytes = tier == TIER_PINNED ? (size_t)sysconf(_SC_PAGESIZE) : CPU_ALIGN_BYTES;
    void *p = NULL;
    if (posix_memalign(&p, align_bytes, bytes) != 0) return NULL;
    return p;
}

static void cpu_free(Device *d, MemTier tier, void *ptr, size_t bytes) {
    (void)d, (void)tier, (void)bytes;
    free(ptr);
}

// Copies run on the calling thread; on the trace they sit on the copy row
// (tokens in, losses out, checkpoint staging, shard slices).
static void cpu_copy(Device *d, void *dst, const void *src, size_t bytes, StreamId s) {
    (void)s;
    if (!bytes) return;
    DevSpan sp = dev_span_begin(d, s);
    memcpy(dst, src, bytes);
    dev_span_end(d, &sp, TRACE_TID_COPY, "copy", (double)bytes);
}

static void cpu_copy_2d(Device *d, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                        size_t rows, StreamId s) {
    if (!width || !rows) return;
    DevSpan sp = dev_span_begin(d, s);
#pragma omp parallel for schedule(static) if (rows * width >= (1u << 20))
    for (size_t r = 0; r < rows; r++) memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
    dev_span_end(d, &sp, TRACE_TID_COPY, "copy", (double)(width * rows));
}

static void cpu_memset0(Device *d, void *dst, size_t bytes, StreamId s) {
    (void)d, (void)s;
    if (bytes) memset(dst, 0, bytes);
}

static void cpu_event_record(Device *d, Event *e, StreamId s) {
    (void)d, (void)s;
    e->t_us = now_us();
}

static void cpu_span_begin(Device *d, DevSpan *sp) { sp->t0_us = d->trace ? now_us() : 0; }

static void cpu_span_end(Device *d, DevSpan *sp, int tid, const char *what, double bytes) {
    if (d->trace) trace_span(d->trace, tid, what, sp->t0_us, now_us(), bytes);
}

static void cpu_spans_settle(Device *d) { (void)d; }

static void cpu_stream_wait_event(Device *d, StreamId s, Event *e) { (void)d, (void)s, (void)e; }
static void cpu_event_sync(Device *d, Event *e) { (void)d, (void)e; }
static void cpu_stream_sync(Device *d, StreamId s) { (void)d, (void)s; }

static void cpu_event_create(Device *d, Event *e) {
    (void)d;
    e->handle = NULL;
    e->t_us = 0;
}

static void cpu_event_destroy(Device *d, Event *e) { (void)d, (void)e; }

static void cpu_mem_get_info(Device *d, size_t *free_bytes, size_t *total_bytes) {
    (void)d;
    *free_bytes = 0;  // no driver to ask; the budget is the only limit
    *total_bytes = 0;
}

static void cpu_destroy(Device *d) { (void)d; }

static void cpu_host_fn(Device *d, StreamId s, void (*fn)(void *arg), void *arg) {
    (void)d, (void)s;
    fn(arg);
}

static const DeviceOps cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .region_bytes = cpu_region_bytes,
    .reserve = cpu_reserve,
    .unreserve = cpu_unreserve,
    .block_out = cpu_block,
    .block_back = cpu_block,
    .copy = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .memset0 = cpu_memset0,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .mem_get_info = cpu_mem_get_info,
    .span_begin = cpu_span_begin,
    .span_end = cpu_span_end,
    .spans_settle = cpu_spans_settle,
    .destroy = cpu_destroy,
    .host_fn = cpu_host_fn,
};

// Ranks on one node share its cores: threads = cores / ranks on the node.
int device_cpu_threads(int local_size) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = (int)(cores / (local_size > 0 ? local_size : 1));
    return threads > 0 ? threads : 1;
}

static int cpu_threads(const DeviceOptions *opt) {
    return opt->threads > 0 ? opt->threads : device_cpu_threads(opt->local_size);
}

void device_cpu_init(Device *d, const DeviceOptions *opt) {
    if (!(opt->hbm_gb >= 0 && opt->hbm_gb <= 1e9))
        fail_usage("--hbm-gb %g: give 0 (no budget) or a number of GB up to 1e9", opt->hbm_gb);
    d->kind = DEVICE_CPU;
    d->threads = cpu_threads(opt);
    // OpenMP owns the cores: big GEMMs are split by rows over the OpenMP
    // threads, each calling a single-threaded sgemm; two thread pools
    // spinning on the same cores would slow both (kernels_cpu_matmul.c)
    openblas_set_num_threads(1);
    omp_set_num_threads(d->threads);
    char core[160];
    blas_core_describe(core, sizeof core);
    snprintf(d->name, sizeof d->name, "cpu (OpenBLAS %s, %d OpenMP thread%s)", core, d->threads,
             d->threads == 1 ? "" : "s");
    d->act_bytes = 4;  // fp32 activations: the cpu kernels compute in fp32
    d->peak_flops = 0;
    d->peak_source = "peak unknown on cpu (make bench measures the sgemm roof)";
    d->ops = &cpu_ops;
    d->k = &kernels_cpu;
    d->impl = NULL;
    // GB = 1e9 bytes; rounded up, so that a tiny budget is a budget, not "none"
    mem_set_budget(&d->mem, TIER_DEVICE, (size_t)ceil(opt->hbm_gb * 1e9));
}
