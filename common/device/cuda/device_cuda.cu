// device_cuda.cu: the cuda device. Memory tiers map to cudaMalloc (device),
// cudaHostAlloc (pinned host: the GPU DMAs from it at full speed) and malloc
// (host); compute, comm and copy are three real CUDA streams, so work issued on
// different streams overlaps on the GPU and events order it where it must.
#include <math.h>
#include <omp.h>
#include <time.h>
#include <unistd.h>
#include "device_cuda.h"
extern "C" {
#include "device_backends.h"
#include "kernels.h"
}

#define HOST_ALIGN_BYTES 64  // a cache line, and the widest SIMD load (the CPU Adam)

// ---- memory -----------------------------------------------------------------

// ---- the device tier: one cudaMalloc, placed by the arena (mem.h) -------------

// What stays outside the region: the CUDA context's own memory, cuBLASLt's,
// NCCL's buffers and channels.
#define CUDA_REGION_MARGIN ((size_t)1 << 30)

// The budget (--hbm-gb, or the card's memory over the ranks sharing it,
// device_share), within what the GPU has free less CUDA_REGION_MARGIN.
static size_t cuda_region_bytes(Device *d) {
    size_t free_bytes = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    size_t room = free_bytes > CUDA_REGION_MARGIN ? free_bytes - CUDA_REGION_MARGIN : 0;
    size_t budget = arena_rounded(d->mem.budget[TIER_DEVICE]);
    return (budget < room ? budget : room) / ARENA_ALIGN * ARENA_ALIGN;
}

static void *cuda_reserve(Device *d, size_t bytes) {
    (void)d;
    void *p = NULL;
#ifdef WB_CUDA_EMU
    // the emulator's: address space whose blocks it opens and closes in
    // stream order (cuda_block_out, cuda_block_back), so a stray use faults
    cudaError_t st = emuReserveRegion(&p, bytes);
#else
    cudaError_t st = cudaMalloc(&p, bytes);
#endif
    if (st != cudaSuccess) {
        cuda_clear_error(st);  // reported by the caller
        return NULL;
    }
    return p;
}

static void cuda_unreserve(Device *d, void *region, size_t bytes) {
    (void)d, (void)bytes;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaFree(region));
}

static void cuda_reserved(Device *d) {
    cuda_impl(d)->lt_workspace = buf_alloc(d, TIER_DEVICE, CAT_WORKSPACE, CUDA_LT_WORKSPACE_BYTES,
                                           "cuBLASLt workspace");
}

// The arena hands a block out after what the compute stream has queued so
// far (the work that used it before was joined there when it was taken
// back); the other streams start using it after this point.
static void cuda_block_out(Device *d, void *ptr, size_t bytes) {
    CudaImpl *impl = cuda_impl(d);
#ifdef WB_CUDA_EMU
    cudaCheck(emuRegionBlock(ptr, bytes, 1, impl->stream[STREAM_COMPUTE]));  // open: fresh memory, 0xff bytes
#else
    (void)ptr, (void)bytes;
#endif
    cudaCheck(cudaEventRecord(impl->ordering, impl->stream[STREAM_COMPUTE]));
    for (int s = 0; s < STREAM_COUNT; s++)
        if (s != STREAM_COMPUTE) cudaCheck(cudaStreamWaitEvent(impl->stream[s], impl->ordering, 0));
}

// A block taken back: the compute stream waits for what the other streams
// have queued so far (a copy, a collective still reading or writing it), so
// the block is reused only after that work, in compute-stream order, with no
// host wait and no device-wide sync (what PyTorch's caching allocator does
// with record_stream). NCCL's communicator streams are ordered before
// compute by the collectives' own events (comm_nccl_wait).
static void cuda_block_back(Device *d, void *ptr, size_t bytes) {
    CudaImpl *impl = cuda_impl(d);
    for (int s = 0; s < STREAM_COUNT; s++) {
        if (s == STREAM_COMPUTE) continue;
        cudaCheck(cudaEventRecord(impl->ordering, impl->stream[s]));
        cudaCheck(cudaStreamWaitEvent(impl->stream[STREAM_COMPUTE], impl->ordering, 0));
    }
#ifdef WB_CUDA_EMU
    cudaCheck(emuRegionBlock(ptr, bytes, 0, impl->stream[STREAM_COMPUTE]));  // closed: a later use faults
#else
    (void)ptr, (void)bytes;
#endif
}

// ---- host and pinned memory -------------------------------------------------------

static void *cuda_alloc(Device *d, MemTier tier, size_t bytes) {
    (void)d;
    void *p = NULL;
    cudaError_t st = cudaSuccess;
    switch (tier) {
    case TIER_PINNED: st = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); break;
    case TIER_HOST:
        if (posix_memalign(&p, HOST_ALIGN_BYTES, bytes) != 0) p = NULL;
        break;
    default:
        fail_at(__FILE__, __LINE__, "cuda_alloc: the %s tier is not allocated here; hint: device buffers are blocks "
                "of the device's region, and the aio module owns files on nvme (and accounts them with "
                "mem_track_alloc)", mem_tier_name(tier));
    }
    if (st != cudaSuccess) {
        cuda_clear_error(st);  // out of memory is reported by buf_alloc
        return NULL;
    }
    return p;
}

static void cuda_free(Device *d, MemTier tier, void *ptr, size_t bytes) {
    (void)d, (void)bytes;
    if (tier == TIER_PINNED) cudaCheck(cudaFreeHost(ptr));
    else free(ptr);
}

// cudaMemcpyDefault reads the direction from the pointers (unified addressing),
// so one call serves every pair of tiers.
static void cuda_copy(Device *d, void *dst, const void *src, size_t bytes, StreamId s) {
    if (bytes == 0) return;
    DevSpan sp = dev_span_begin(d, s);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream(d, s)));
    dev_span_end(d, &sp, TRACE_TID_COPY, "copy", (double)bytes);
}

static void cuda_copy_2d(Device *d, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                         size_t rows, StreamId s) {
    if (!width || !rows) return;
    DevSpan sp = dev_span_begin(d, s);
    cudaCheck(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, cuda_stream(d, s)));
    dev_span_end(d, &sp, TRACE_TID_COPY, "copy", (double)(width * rows));
}

static int is_host_memory(const void *p) {
    cudaPointerAttributes attr;
    cudaError_t st = cudaPointerGetAttributes(&attr, p);
    if (st != cudaSuccess) {
        cuda_clear_error(st);  // unknown to CUDA: plain host memory
        return 1;
    }
    return attr.type == cudaMemoryTypeHost || attr.type == cudaMemoryTypeUnregistered;
}

static void cuda_memset0(Device *d, void *dst, size_t bytes, StreamId s) {
    if (bytes == 0) return;
    if (is_host_memory(dst)) {
        // host memory: wait for what the stream still does with it, then clear it here
        cuda_wait(d, cuda_stream(d, s), NULL);
        memset(dst, 0, bytes);
        return;
    }
    cudaCheck(cudaMemsetAsync(dst, 0, bytes, cuda_stream(d, s)));
}

static void cuda_mem_get_info(Device *d, size_t *free_bytes, size_t *total_bytes) {
    (void)d;
    cudaCheck(cudaMemGetInfo(free_bytes, total_bytes));
}

// ---- streams and events -------------------------------------------------------

static void cuda_event_create(Device *d, Event *e) {
    (void)d;
    cudaEvent_t ev;
    // no timing: timing events cost a little on every record, and t_us below
    // already gives the host-side time the trace needs
    cudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e->handle = (void *)ev;
    e->t_us = 0;
}

static void cuda_event_destroy(Device *d, Event *e) {
    (void)d;
    if (e->handle) cudaCheck(cudaEventDestroy((cudaEvent_t)e->handle));
    e->handle = NULL;
}

static void cuda_event_record(Device *d, Event *e, StreamId s) {
    if (!e->handle) cuda_event_create(d, e);  // an Event zeroed but never created still works
    cudaCheck(cudaEventRecord((cudaEvent_t)e->handle, cuda_stream(d, s)));
    e->t_us = now_us();
}

static void cuda_stream_wait_event(Device *d, StreamId s, Event *e) {
    if (!e->handle) return;  // never recorded: nothing to wait for
    cudaCheck(cudaStreamWaitEvent(cuda_stream(d, s), (cudaEvent_t)e->handle, 0));
}

void cuda_wait(Device *d, cudaStream_t stream, cudaEvent_t event) {
    CudaImpl *impl = cuda_impl(d);
    for (long spins = 0;; spins++) {
        cudaError_t st = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
        if (st == cudaSuccess) return;
        if (st != cudaErrorNotReady) cudaCheck(st);
        cuda_clear_error(st);
        if (impl->check_comms) impl->check_comms(impl);
        if (spins > 1000) {
            struct timespec nap = {0, 20000};  // 20 us: a poll costs the GPU nothing
            nanosleep(&nap, NULL);
        }
    }
}

static void cuda_event_sync(Device *d, Event *e) {
    if (e->handle) cuda_wait(d, NULL, (cudaEvent_t)e->handle);
}

static void cuda_stream_sync(Device *d, StreamId s) { cuda_wait(d, cuda_stream(d, s), NULL); }

static void cuda_host_fn(Device *d, StreamId s, void (*fn)(void *arg), void *arg) {
    cudaCheck(cudaLaunchHostFunc(cuda_stream(d, s), fn, arg));
}

static void cuda_destroy(Device *d) {
    CudaImpl *impl = cuda_impl(d);
    if (!impl) return;
    for (int s = 0; s < STREAM_COUNT; s++) cuda_wait(d, impl->stream[s], NULL);
    gemm_cache_free(impl);
    cuda_spans_free(d);
    buf_free(d, &impl->lt_workspace);
    buf_free(d, &impl->host_result);
    cudaCheck(cudaDeviceSynchronize());  // the frees above, queued on the compute stream
    cudaCheck(cudaEventDestroy(impl->ordering));
    cublasCheck(cublasLtDestroy(impl->lt));
    for (int s = 0; s < STREAM_COUNT; s++) cudaCheck(cudaStreamDestroy(impl->stream[s]));
    free(impl);
    d->impl = NULL;
}

static const DeviceOps cuda_ops = {
    cuda_alloc,         cuda_free,          cuda_region_bytes, cuda_reserve,
    cuda_unreserve,     cuda_reserved,      cuda_block_out,    cuda_block_back,
    cuda_copy,          cuda_copy_2d,       cuda_memset0,
    cuda_event_record,  cuda_stream_wait_event, cuda_event_sync, cuda_stream_sync,
    cuda_event_create,  cuda_event_destroy, cuda_mem_get_info, cuda_span_begin,
    cuda_span_end,      cuda_spans_settle,  cuda_destroy,       cuda_host_fn,
};

// ---- what the GPU is ---------------------------------------------------------------

// Dense bf16 tensor-core peaks from NVIDIA's datasheets (the sparsity figures
// are twice these). Matched by substring of the device name, first match wins,
// so the more specific names come first.
typedef struct GpuPeak {
    const char *name_part;
    double flops;
    const char *source;
} GpuPeak;

static const GpuPeak gpu_peaks[] = {
    {"GH200", 989.4e12, "GH200 datasheet, dense bf16"},
    {"H100 PCIe", 756e12, "H100 PCIe datasheet, dense bf16"},
    {"H100 NVL", 835e12, "H100 NVL datasheet, dense bf16"},
    {"H100", 989.4e12, "H100 SXM datasheet, dense bf16"},
    {"H200 NVL", 835e12, "H200 NVL datasheet, dense bf16"},
    {"H200", 989.4e12, "H200 SXM datasheet, dense bf16"},
    {"A100", 312e12, "A100 datasheet, dense bf16"},
    {"L40S", 362e12, "L40S datasheet, dense bf16"},
    {"L40", 181e12, "L40 datasheet, dense bf16"},
    {"L4", 121e12, "L4 datasheet, dense bf16"},
    {"A10G", 0, "peak unknown"},  // no NVIDIA datasheet; keeps the A10 row from matching
    {"A10", 125e12, "A10 datasheet, dense bf16"},
};

static void set_peak(Device *d, const char *name) {
    d->peak_flops = 0;
    d->peak_source = "peak unknown";
    for (size_t i = 0; i < sizeof gpu_peaks / sizeof gpu_peaks[0]; i++) {
        if (strstr(name, gpu_peaks[i].name_part)) {
            d->peak_flops = gpu_peaks[i].flops;
            d->peak_source = gpu_peaks[i].source;
            return;
        }
    }
}

// Ranks on one node share its cores (the CPU Adam of the offload stages runs here).
static int host_threads(const DeviceOptions *opt) {
    if (opt->threads > 0) return opt->threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int local_size = opt->local_size > 0 ? opt->local_size : 1;
    int threads = (int)(cores / local_size);
    return threads > 0 ? threads : 1;
}

// ---- entry points (device_backends.h) ------------------------------------------------

// A binary built with nvcc must still run where there is no driver or no GPU:
// every error here means "no GPU", not a failure. A driver older than the
// runtime this binary was built with gives the same error as no driver at
// all, so the driver's version tells the two apart.
extern "C" int device_cuda_count(char *why, size_t why_bytes) {
    int n = 0, driver = 0, runtime = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st == cudaSuccess && n > 0) return n;
    cuda_clear_error(st);
    (void)cudaDriverGetVersion(&driver);  // 0 = no driver installed
    (void)cudaRuntimeGetVersion(&runtime);
    char text[256];
    int unusable = 0;
    if (st == cudaSuccess || st == cudaErrorNoDevice) {
        snprintf(text, sizeof text, "no GPU visible to this process (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    } else if (driver == 0) {
        snprintf(text, sizeof text, "no NVIDIA driver is installed");
    } else if (st == cudaErrorInsufficientDriver) {
        snprintf(text, sizeof text, "the driver supports CUDA %d.%d but this binary needs %d.%d (update the driver)",
                 driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        unusable = 1;
    } else {
        snprintf(text, sizeof text, "the driver reports %s (%s)", cudaGetErrorName(st), cudaGetErrorString(st));
        unusable = 1;
    }
    if (why && why_bytes) snprintf(why, why_bytes, "%s", text);
    return unusable ? -1 : 0;
}

// An empty kernel: asking for its attributes tells whether this binary holds
// code the GPU can run (a build for sm_80/sm_90 has none for a newer major).
__global__ void __launch_bounds__(1) probe_kernel(void) {}

static void check_kernel_image(const cudaDeviceProp *prop) {
    cudaFuncAttributes attr;
    cudaError_t st = cudaFuncGetAttributes(&attr, probe_kernel);
    if (st == cudaErrorNoKernelImageForDevice || st == cudaErrorInvalidDeviceFunction) {
        cuda_clear_error(st);
        fail_usage("--device cuda: this binary has no kernels for %s (sm_%d%d); rebuild with "
                   "make CUDA_ARCHS=%d%d, or use --device cpu", prop->name, prop->major,
                   prop->minor, prop->major, prop->minor);
    }
    cudaCheck(st);
}

static void create_streams(CudaImpl *impl) {
    // collectives get the higher priority: their few small kernels then start
    // as soon as a slot frees, instead of queuing behind a long GEMM.
    // Non-blocking: no implicit order with the legacy default stream, only
    // the events the code records.
    int lowest = 0, highest = 0;
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    for (int s = 0; s < STREAM_COUNT; s++) {
        int prio = s == STREAM_COMM ? highest : lowest;
        cudaCheck(cudaStreamCreateWithPriority(&impl->stream[s], cudaStreamNonBlocking, prio));
    }
    cudaCheck(cudaEventCreateWithFlags(&impl->ordering, cudaEventDisableTiming));
}

extern "C" void device_cuda_init(Device *d, const DeviceOptions *opt) {
    if (!(opt->hbm_gb >= 0 && opt->hbm_gb <= 1e9))
        fail_usage("--hbm-gb %g: give 0 (the card's memory) or a number of GB up to 1e9", opt->hbm_gb);
    char why[256];
    int count = device_cuda_count(why, sizeof why);
    if (count <= 0) fail_usage("--device cuda: %s; use --device cpu", why);
    int local_rank = opt->local_rank > 0 ? opt->local_rank : 0;
    int ordinal = local_rank % count;  // ranks beyond the GPU count share GPUs (MPI backend)
    cudaCheck(cudaSetDevice(ordinal));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, ordinal));
    if (prop.major < 8)
        fail_usage("--device cuda: %s has compute capability %d.%d; the cuda kernels need bf16 "
                   "tensor cores (8.0 or newer); use --device cpu", prop.name, prop.major,
                   prop.minor);
    check_kernel_image(&prop);

    CudaImpl *impl = (CudaImpl *)xcalloc(1, sizeof *impl);
    impl->ordinal = ordinal;
    impl->sm_count = prop.multiProcessorCount;
    impl->smem_optin = prop.sharedMemPerBlockOptin;
    create_streams(impl);
    cublasCheck(cublasLtCreate(&impl->lt));

    d->kind = DEVICE_CUDA;
    memcpy(d->uuid, prop.uuid.bytes, sizeof d->uuid);
    snprintf(d->name, sizeof d->name, "%.96s (cuda:%d, sm_%d%d)", prop.name, ordinal, prop.major,
             prop.minor);
    d->threads = host_threads(opt);
    omp_set_num_threads(d->threads);
    d->act_bytes = 2;  // bf16 activations
    set_peak(d, prop.name);
    d->ops = &cuda_ops;
    d->k = opt->half == HALF_FP16 ? &kernels_cuda_fp16 : &kernels_cuda;  // bf16 or fp16 activations too
    d->impl = impl;
    size_t budget = opt->hbm_gb > 0 ? (size_t)ceil(opt->hbm_gb * 1e9) : prop.totalGlobalMem;  // a tiny budget stays one
    mem_set_budget(&d->mem, TIER_DEVICE, budget);

    // the cuBLASLt workspace is the region's first block (cuda_reserved)
    impl->host_result = buf_alloc(d, TIER_PINNED, CAT_WORKSPACE, 64, "reduction read-back");
    cuda_spans_init(d);
}
