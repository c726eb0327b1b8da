// emu_faults.cu: small CUDA programs, each with one mistake (or its
// correction), that tests/emu/test_emu.c runs to prove the cuda emulator
// catches what it claims to. `emu_faults CASE` runs one; a line that the
// emulator must name ends in a comment "// mark: CASE". Prints what the
// program computed ("result N", "stale" or "fresh") when it ends normally.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CHECK(call)                                                                     \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorName(e_));   \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

// ---- barriers and warps -----------------------------------------------------------------

__global__ void divergent_barrier(float *out) {
    if (threadIdx.x < 16) return;
    __syncthreads();  // mark: divergent_barrier
    out[threadIdx.x] = 1.0f;
}

__global__ void full_mask_shuffle(float *out, int leave_lane) {
    float v = (float)threadIdx.x;
    if ((int)threadIdx.x == leave_lane) return;
    v += __shfl_xor_sync(0xffffffffu, v, 1);  // mark: shuffle
    out[threadIdx.x] = v;
}

// half of a warp waits at a barrier, the other half at a shuffle that needs
// the first half: neither can go on
__global__ void split_warp(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) __syncthreads();  // mark: split_barrier
    else v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

// block sum through shared memory; `barrier` 0 leaves out the barrier between writing and reading
__global__ void block_sum(float *out, int barrier) {
    __shared__ float part[256];
    part[threadIdx.x] = (float)(threadIdx.x + 1);
    if (barrier) __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < (int)blockDim.x; i++) s += part[i];
        out[0] = s;
    }
}

// every thread adds 1, 3e7 or -3e7 to one float: an fp32 sum whose value
// depends on the order of the atomics (a 1 added to +-3e7 is lost to rounding)
__global__ void atomic_sum(float *out) {
    int i = (int)threadIdx.x;
    atomicAdd(out, i & 1 ? 1.0f : i & 2 ? -3.0e7f : 3.0e7f);
}

// a NaN with a sign and a payload through device code's 16-bit conversions:
// the GPU gives the canonical NaN (cuda_fp16.h, cuda_bf16.h)
__global__ void nan_conversions(unsigned *out, float nan, unsigned short half_nan) {
    float back = __half2float(__ushort_as_half(half_nan));
    out[0] = __half_as_ushort(__float2half_rn(nan));
    memcpy(&out[1], &back, sizeof back);
    out[2] = __bfloat16_as_ushort(__float2bfloat16_rn(nan));
}

__global__ void __launch_bounds__(128) bounded(float *out) { out[threadIdx.x] = 1.0f; }

__global__ void uses_dynamic_smem(float *out) { out[threadIdx.x] = 2.0f; }

// ---- memory --------------------------------------------------------------------------------

__global__ void read_at(float *out, const float *in, int i) { out[0] = in[i]; }  // mark: oob_read
__global__ void write_at(float *out, int i) { out[i] = 3.0f; }  // mark: oob_write
__global__ void fill(float *x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}
__global__ void copy_kernel(float *dst, const float *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

static float *device_floats(int n) {
    float *p = NULL;
    CHECK(cudaMalloc((void **)&p, n * sizeof(float)));
    return p;
}

static float read_back(const float *d) {
    float h = 0;
    CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

// ---- streams -------------------------------------------------------------------------------------

// stream a fills x with 7, stream b copies x to y; with `wait`, b waits for a's event first
static void two_streams(int wait) {
    int n = 1024;
    float *x = device_floats(n), *y = device_floats(n);
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t written;
    CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    fill<<<1, 256, 0, b>>>(x, 1.0f, n);
    CHECK(cudaStreamSynchronize(b));
    fill<<<n / 256, 256, 0, a>>>(x, 7.0f, n);
    CHECK(cudaEventRecord(written, a));
    if (wait) CHECK(cudaStreamWaitEvent(b, written, 0));
    copy_kernel<<<n / 256, 256, 0, b>>>(y, x, n);
    CHECK(cudaDeviceSynchronize());
    printf("%s\n", read_back(y) == 7.0f ? "fresh" : "stale");
}

// The workbench's device region (device_cuda.cu's cuda_block_out and
// cuda_block_back): a block lent on stream a, read on stream b, taken back
// on a. With `join`, a first waits for what b queued, as cuda_block_back
// makes the compute stream do; without, the release may pass b's read.
static void region_release(int join) {
    int n = 1024;
    float *x = NULL, *y = device_floats(n);
    CHECK(emuReserveRegion((void **)&x, 1 << 20));
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t e;
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CHECK(emuRegionBlock(x, n * sizeof(float), 1, a));
    fill<<<n / 256, 256, 0, a>>>(x, 3.0f, n);
    CHECK(cudaEventRecord(e, a));
    CHECK(cudaStreamWaitEvent(b, e, 0));
    copy_kernel<<<n / 256, 256, 0, b>>>(y, x, n);
    if (join) {
        CHECK(cudaEventRecord(e, b));
        CHECK(cudaStreamWaitEvent(a, e, 0));
    }
    CHECK(emuRegionBlock(x, n * sizeof(float), 0, a));
    CHECK(cudaDeviceSynchronize());
    printf("%s\n", read_back(y) == 3.0f ? "fresh" : "stale");
}

// a block of the region written one float past its end: the data fills its
// page, so the write lands on the page after it, which the region never opens
static void region_overrun(void) {
    float *x = NULL;
    CHECK(emuReserveRegion((void **)&x, 1 << 20));
    CHECK(emuRegionBlock(x, 1024 * sizeof(float), 1, 0));
    write_at<<<1, 1>>>(x, 1024);
    CHECK(cudaDeviceSynchronize());
}

// a copy into pinned memory read by the host with or without waiting for it
static void host_read(int sync) {
    float *d = device_floats(1), *h = NULL;
    CHECK(cudaHostAlloc((void **)&h, sizeof *h, cudaHostAllocDefault));
    *h = 0.0f;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fill<<<1, 32, 0, s>>>(d, 5.0f, 1);
    CHECK(cudaMemcpyAsync(h, d, sizeof *h, cudaMemcpyDeviceToHost, s));
    if (sync) CHECK(cudaStreamSynchronize(s));
    printf("%s\n", *h == 5.0f ? "fresh" : "stale");
}

// A host function queued after a copy into pinned memory: it runs once the
// copy is done (it sees the copied value), with or without a host wait after it.
static float seen_by_host_fn = -1.0f;
static void read_pinned(void *p) { seen_by_host_fn = *(const float *)p; }

static void host_fn(void) {
    float *d = device_floats(1), *h = NULL;
    CHECK(cudaHostAlloc((void **)&h, sizeof *h, cudaHostAllocDefault));
    *h = 0.0f;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    fill<<<1, 32, 0, s>>>(d, 5.0f, 1);
    CHECK(cudaMemcpyAsync(h, d, sizeof *h, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, read_pinned, h));
    printf("before the wait: %s\n", seen_by_host_fn == 5.0f ? "ran" : "not run");
    CHECK(cudaStreamSynchronize(s));
    printf("%s\n", seen_by_host_fn == 5.0f ? "fresh" : "stale");
}

// Copies up from pinned and from pageable memory, then a wait: what
// EMU_OPLOG and EMU_STATS record of them.
static void copies_logged(void) {
    float *d = device_floats(256), *pinned = NULL, pageable[256] = {0};
    CHECK(cudaHostAlloc((void **)&pinned, sizeof pageable, cudaHostAllocDefault));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemcpyAsync(d, pinned, sizeof pageable, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(d, pageable, sizeof pageable, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    printf("copied\n");
}

// ---- cuBLASLt -------------------------------------------------------------------------------------

// D (m x n) = A (m x k) B (k x n), bf16 in, fp32 out; `offset_a` bytes moved off A's
// 256-byte start while the preference keeps cuBLASLt's default promise of 256
static int blas_matmul(int offset_a, int wrong_b_rows) {
    int m = 16, n = 8, k = 32;
    char *abase = NULL;
    __nv_bfloat16 *b = NULL;
    float *d = NULL;
    CHECK(cudaMalloc((void **)&abase, m * k * 2 + 256));
    CHECK(cudaMalloc((void **)&b, k * n * 2));
    CHECK(cudaMalloc((void **)&d, m * n * 4));
    CHECK(cudaMemset(abase, 0, m * k * 2 + 256));
    CHECK(cudaMemset(b, 0, k * n * 2));
    const void *a = abase + offset_a;
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, wrong_b_rows ? n : k, wrong_b_rows ? k : n, wrong_b_rows ? n : k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
    if (st != CUBLAS_STATUS_SUCCESS || !found) return 3;
    float alpha = 1.0f, beta = 0.0f;
    st = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo, NULL, 0, 0);
    if (st != CUBLAS_STATUS_SUCCESS) return 3;
    CHECK(cudaDeviceSynchronize());
    printf("result %g\n", read_back(d));
    return 0;
}

// D (m x n) = gelu(A B) in bf16, the GEMM result kept as the epilogue's aux
// matrix (GELU_AUX), rows aux_ld apart; the aux pointer moved `aux_shift`
// bytes after the heuristic was asked, which read its alignment from it
static int blas_gelu_aux(int aux_ld, int aux_shift) {
    int m = 16, n = 8, k = 32;
    __nv_bfloat16 *a = NULL, *b = NULL, *d = NULL;
    char *aux = NULL;
    CHECK(cudaMalloc((void **)&a, m * k * 2));
    CHECK(cudaMalloc((void **)&b, k * n * 2));
    CHECK(cudaMalloc((void **)&d, m * n * 2));
    CHECK(cudaMalloc((void **)&aux, aux_ld * n * 2 + 64));
    CHECK(cudaMemset(a, 0, m * k * 2));
    CHECK(cudaMemset(b, 0, k * n * 2));
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_AUX;
    int64_t ld = aux_ld;
    void *aux_at = aux;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_at, sizeof aux_at);
    cublasLtMatrixLayout_t la, lb, ldl;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(&ldl, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ldl, ldl, pref, 1, &heur, &found);
    if (st != CUBLAS_STATUS_SUCCESS || !found) return 3;
    aux_at = aux + aux_shift;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_at, sizeof aux_at);
    float alpha = 1.0f, beta = 0.0f;
    st = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ldl, d, ldl, &heur.algo, NULL, 0, 0);
    if (st != CUBLAS_STATUS_SUCCESS) return 3;
    CHECK(cudaDeviceSynchronize());
    printf("result 0\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: emu_faults CASE\n");
        return 2;
    }
    const char *c = argv[1];
    float *out = device_floats(1024);
    if (!strcmp(c, "divergent_barrier")) divergent_barrier<<<1, 64>>>(out);
    else if (!strcmp(c, "partial_warp")) full_mask_shuffle<<<1, 48>>>(out, -1);
    else if (!strcmp(c, "exited_lane")) full_mask_shuffle<<<1, 64>>>(out, 5);
    else if (!strcmp(c, "full_warps")) full_mask_shuffle<<<2, 64>>>(out, -1);
    else if (!strcmp(c, "deadlock")) split_warp<<<1, 32>>>(out);
    else if (!strcmp(c, "race")) block_sum<<<1, 256>>>(out, 0);
    else if (!strcmp(c, "no_race")) block_sum<<<1, 256>>>(out, 1);
    else if (!strcmp(c, "atomic_order")) {
        CHECK(cudaMemset(out, 0, sizeof(float)));
        atomic_sum<<<1, 64>>>(out);
        CHECK(cudaDeviceSynchronize());
        printf("result %.9g\n", read_back(out));
        return 0;
    } else if (!strcmp(c, "nan_conversions")) {
        unsigned bits = 0xffa12345u, got[3];
        float nan;
        memcpy(&nan, &bits, sizeof nan);
        nan_conversions<<<1, 1>>>((unsigned *)out, nan, 0xfe91);
        CHECK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
        printf("half %04x float %08x bf16 %04x\n", got[0], got[1], got[2]);
        return 0;
    } else if (!strcmp(c, "block_too_big")) fill<<<1, 2048>>>(out, 1.0f, 1);
    else if (!strcmp(c, "launch_bounds")) bounded<<<1, 256>>>(out);
    else if (!strcmp(c, "smem_no_optin")) uses_dynamic_smem<<<1, 32, 64 << 10>>>(out);
    else if (!strcmp(c, "smem_optin")) {
        CHECK(cudaFuncSetAttribute(uses_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
        uses_dynamic_smem<<<1, 32, 64 << 10>>>(out);
    } else if (!strcmp(c, "oob_read")) read_at<<<1, 1>>>(out, out, 1024 + 2048);
    else if (!strcmp(c, "in_bounds_read")) read_at<<<1, 1>>>(out, out, 1023);
    else if (!strcmp(c, "oob_write_slack")) {
        float *odd = device_floats(5);  // 20 bytes: 12 bytes of slack before the guard page
        write_at<<<1, 1>>>(odd, 5);
    } else if (!strcmp(c, "use_after_free")) {
        float *x = device_floats(256);
        read_at<<<1, 1>>>(out, x, 0);
        CHECK(cudaFree(x));  // the kernel above has not run yet
    } else if (!strcmp(c, "region_release_unjoined")) {
        region_release(0);
        return 0;
    } else if (!strcmp(c, "region_release_joined")) {
        region_release(1);
        return 0;
    } else if (!strcmp(c, "region_overrun")) {
        region_overrun();
        return 0;
    } else if (!strcmp(c, "missing_wait")) {
        two_streams(0);
        return 0;
    } else if (!strcmp(c, "with_wait")) {
        two_streams(1);
        return 0;
    } else if (!strcmp(c, "host_read_no_sync")) {
        host_read(0);
        return 0;
    } else if (!strcmp(c, "host_read_sync")) {
        host_read(1);
        return 0;
    } else if (!strcmp(c, "host_fn")) {
        host_fn();
        return 0;
    } else if (!strcmp(c, "copies_logged")) {
        copies_logged();
        return 0;
    } else if (!strcmp(c, "blas_aligned")) return blas_matmul(0, 0);
    else if (!strcmp(c, "blas_misaligned")) return blas_matmul(2, 0);
    else if (!strcmp(c, "blas_shapes")) return blas_matmul(0, 1);
    else if (!strcmp(c, "blas_gelu_aux")) return blas_gelu_aux(24, 0);
    else if (!strcmp(c, "blas_aux_ld")) return blas_gelu_aux(20, 0);
    else if (!strcmp(c, "blas_aux_moved")) return blas_gelu_aux(24, 8);
    else {
        fprintf(stderr, "emu_faults: unknown case %s\n", c);
        return 2;
    }
    CHECK(cudaDeviceSynchronize());
    printf("result %g\n", read_back(out));
    return 0;
}
