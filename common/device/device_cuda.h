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

// The backend state behind Device.impl on the cuda device.
typedef struct CudaImpl {
    int ordinal;                      // which GPU (cudaSetDevice)
    int sm_count;                     // streaming multiprocessors, to size grids
    cudaStream_t stream[STREAM_COUNT];
    cublasLtHandle_t lt;
    Buf lt_workspace;                 // (CUDA_LT_WORKSPACE_BYTES) device, workspace category
    Buf host_result;                  // pinned doubles: reductions read back by the host
} CudaImpl;

static inline CudaImpl *cuda_impl(const Device *d) { return (CudaImpl *)d->impl; }
static inline cudaStream_t cuda_stream(const Device *d, StreamId s) {
    return cuda_impl(d)->stream[s];
}
