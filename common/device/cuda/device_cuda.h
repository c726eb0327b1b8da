// device_cuda.h: what the cuda backend's files share (device_cuda.cu, the
// kernels_cuda*.cu files, comm_nccl.c): the backend state behind Device.impl,
// its streams, and the error-check macros. Internal to the cuda parts; the
// rest of the code sees only device.h. Plain C, so comm_nccl.c can include it.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cuda_runtime_api.h>
#include <cublasLt.h>

// The project's headers are C; the .cu files are C++, so their declarations
// (fail_at, buf_alloc, kernels_cuda, ...) must keep C linkage.
#ifdef __cplusplus
extern "C" {
#endif
#include "check.h"
#include "device.h"
#include "mem.h"
#include "trace.h"
#ifdef __cplusplus
}
#endif

// Every CUDA runtime call is checked: file:line, the error, and a hint.
#define cudaCheck(call)                                                                     \
    do {                                                                                    \
        cudaError_t cuda_status_ = (call);                                                  \
        if (cuda_status_ != cudaSuccess)                                                    \
            fail_at(__FILE__, __LINE__, "CUDA error %s (%s) in %s; hint: run under "        \
                    "compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1 to find the kernel", \
                    cudaGetErrorName(cuda_status_), cudaGetErrorString(cuda_status_), #call); \
    } while (0)

#define cublasCheck(call)                                                                   \
    do {                                                                                    \
        cublasStatus_t cublas_status_ = (call);                                             \
        if (cublas_status_ != CUBLAS_STATUS_SUCCESS)                                        \
            fail_at(__FILE__, __LINE__, "cuBLASLt error %d (%s) in %s; hint: check shapes, " \
                    "types and pointer alignment", (int)cublas_status_,                     \
                    cublasGetStatusString(cublas_status_), #call);                          \
    } while (0)

// cuBLASLt may use this much scratch to pick faster GEMM kernels (split-K and
// the like); 32 MiB is what NVIDIA suggests for Hopper.
#define CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)

// Clears the runtime's last error when it is `handled` (the error the caller
// just dealt with), so that a later launch check does not blame its kernel;
// an error of something else stays for the check that will report it.
static inline void cuda_clear_error(cudaError_t handled) {
    if (cudaPeekAtLastError() == handled) (void)cudaGetLastError();
}

#define CUDA_MAX_COMMS 16  // NCCL communicators a rank holds (world, tp, pp, dp, ...)

// The backend state behind Device.impl on the cuda device.
typedef struct CudaImpl {
    int ordinal;                      // which GPU (cudaSetDevice)
    int sm_count;                     // streaming multiprocessors, to size grids
    size_t smem_optin;                // the most dynamic shared memory a kernel may opt in to
    cudaStream_t stream[STREAM_COUNT];
    cublasLtHandle_t lt;
    Buf lt_workspace;                 // (CUDA_LT_WORKSPACE_BYTES) device, workspace category
    Buf host_result;                  // pinned doubles: reductions read back by the host
    cudaEvent_t ordering;             // recorded on one stream for another to wait on (reused)
    void *gemm_cache;                 // cuBLASLt descriptors and algorithms by GEMM shape (kernels_cuda_matmul.cu)
    // the NCCL communicators (ncclComm_t) whose asynchronous errors every
    // wait polls, and the function that polls them (comm_nccl.c)
    void *comms[CUDA_MAX_COMMS];
    int ncomms;
    void (*check_comms)(struct CudaImpl *impl);
    void *spans;                      // the trace's spans in device time (device_cuda_spans.cu)
} CudaImpl;

static inline CudaImpl *cuda_impl(const Device *d) { return (CudaImpl *)d->impl; }

// The host waits for a stream (event NULL) or an event by polling, and ends
// the run when a communicator reports an asynchronous error (a peer that
// died): a blocking wait would hang on a collective that never completes.
// Frees the cuBLASLt plans of gemm_bf16 (at the device's destruction).
#ifdef __cplusplus
extern "C"
#endif
void gemm_cache_free(CudaImpl *impl);
#ifdef __cplusplus
extern "C"
#endif
void cuda_wait(Device *d, cudaStream_t stream, cudaEvent_t event);
static inline cudaStream_t cuda_stream(const Device *d, StreamId s) {
    return cuda_impl(d)->stream[s];
}

// Spans of device work timed by events (device_cuda_spans.cu): DeviceOps'
// span_begin, span_end and spans_settle on cuda; cuda_event_host_us puts a
// completed timing event on the host's clock (the NCCL spans, comm_nccl.c).
#ifdef __cplusplus
extern "C" {
#endif
void cuda_spans_init(Device *d);
void cuda_spans_free(Device *d);
void cuda_span_begin(Device *d, DevSpan *sp);
void cuda_span_end(Device *d, DevSpan *sp, int tid, const char *what, double bytes);
void cuda_spans_settle(Device *d);
double cuda_event_host_us(Device *d, cudaEvent_t ev);
#ifdef __cplusplus
}
#endif
