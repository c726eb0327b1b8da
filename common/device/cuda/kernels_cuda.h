// kernels_cuda.h: what the kernels_cuda*.cu files share: the activation type,
// launch helpers, warp/block reductions, the row-major bf16 GEMM on cuBLASLt,
// and the kernels that live outside kernels_cuda.cu so its table can name them.
// Internal to the cuda kernels (C++); everything else uses `kernels_cuda`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "device_cuda.h"
extern "C" {
#include "kernels.h"
}

// The kernels are compiled twice, once per 16-bit format (the Makefile's
// *.fp16.o pass defines WB_CUDA_FP16): floatX is the type of the params,
// grads and activations (d->act_bytes == 2), bf16 or IEEE fp16 (--precision).
// Each pass lives in its own namespace and exports its own table,
// kernels_cuda or kernels_cuda_fp16; device_cuda.cu picks one. kernels.h's
// `bf16` is the same 16 bits as a uint16_t; device code reinterprets it.
#ifdef WB_CUDA_FP16
typedef __half floatX;
#define FLOATX_CUDA_TYPE CUDA_R_16F
#define KERNELS_NS kernels_fp16
#define KERNELS_TABLE kernels_cuda_fp16
#else
typedef __nv_bfloat16 floatX;
#define FLOATX_CUDA_TYPE CUDA_R_16BF
#define KERNELS_NS kernels_bf16
#define KERNELS_TABLE kernels_cuda
#endif
namespace KERNELS_NS {

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
// Threads per block of the element-wise kernels, and of the row kernels
// (one block per row) at their widest. Every kernel declares the most it is
// launched with (__launch_bounds__): the compiler sizes its registers to it.
#define BLOCK 256
#define ROW_BLOCK_MAX 1024
// one block per row: wide rows (a vocabulary) get the widest block
static inline int row_block(int V) { return V >= 4096 ? ROW_BLOCK_MAX : BLOCK; }

static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements: enough to fill the GPU,
// capped so that huge n (a 1.5B-parameter AdamW) still launches.
static inline unsigned grid_for(size_t n, int block) {
    size_t g = ceil_div(n, (size_t)block);
    if (g > 65536) g = 65536;
    return g > 0 ? (unsigned)g : 1u;
}

#define LAUNCH_CHECK() cudaCheck(cudaGetLastError())

// grid-stride loop: `i` visits [0, n) across the whole grid
#define FOR_EACH_ELEMENT(i, n)                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);          \
         i += (size_t)gridDim.x * blockDim.x)

// ---- 128-bit loads and stores ------------------------------------------------------
// The element-wise kernels are memory bound: a thread takes 8 consecutive
// elements (PACK) and moves them with 16-byte loads and stores (one for 8
// bf16, two for 8 floats) instead of one instruction per element. That
// needs every pointer 16-byte aligned, which the host checks (`wide`, by
// aligned16); otherwise, and for the last pack past n, the elements go one
// by one. Each pack reads all its inputs before it writes, so an output may
// alias an input, as kernels.h allows.
#define PACK 8
template <class T> struct alignas(16) Pack {
    T x[PACK];
};

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// grid-stride loop over packs: `base` is the first of a thread's PACK elements
#define FOR_EACH_PACK(base, n)                                                                  \
    for (size_t base = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK; base < (n);     \
         base += (size_t)gridDim.x * blockDim.x * PACK)

// the grid for n elements in packs
static inline unsigned grid_for_packs(size_t n) { return grid_for(ceil_div(n, PACK), BLOCK); }

template <class T> __device__ inline Pack<T> load_pack(const T *p, size_t base, size_t n, bool wide) {
    if (wide && base + PACK <= n) return *reinterpret_cast<const Pack<T> *>(p + base);
    Pack<T> v = {};
    for (int k = 0; k < PACK && base + k < n; k++) v.x[k] = p[base + k];
    return v;
}

template <class T> __device__ inline void store_pack(T *p, size_t base, size_t n, bool wide, const Pack<T> &v) {
    if (wide && base + PACK <= n) {
        *reinterpret_cast<Pack<T> *>(p + base) = v;
        return;
    }
    for (int k = 0; k < PACK && base + k < n; k++) p[base + k] = v.x[k];
}

// Rounding to 16 bits is bf16.h's, as on the cpu: the same bits for every
// number. A NaN stays a NaN, which is all the project promises of it: here
// it keeps its sign and payload (made quiet) going to 16 bits, but coming
// back from fp16 (__half2float) every NaN is the GPU's canonical 0x7fffffff.
#ifdef WB_CUDA_FP16
__device__ inline float to_f32(floatX x) { return __half2float(x); }
__device__ inline floatX to_floatX(float x) { return __ushort_as_half(f32_to_f16(x)); }
#else
__device__ inline float to_f32(floatX x) { return __bfloat162float(x); }
__device__ inline floatX to_floatX(float x) { return __ushort_as_bfloat16(f32_to_bf16(x)); }
#endif

// Reductions over a warp and over a block: a sum (float or double) or a max (float).
struct SumOp {
    template <class T> __device__ static T apply(T a, T b) { return a + b; }
};
struct MaxOp {
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};

template <class Op, class T> __device__ inline T warp_reduce(T x) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) x = Op::apply(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

// Over a block of 32..1024 threads (a multiple of 32); every thread gets the
// result. The leading barrier lets a kernel call it more than once.
template <class Op, class T> __device__ inline T block_reduce(T x, T identity) {
    __shared__ T part[WARP_SIZE];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    x = warp_reduce<Op>(x);
    __syncthreads();
    if (lane == 0) part[warp] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x / WARP_SIZE) ? part[lane] : identity;
    return warp_reduce<Op>(x);
}

__device__ inline float warp_sum(float x) { return warp_reduce<SumOp>(x); }
__device__ inline float warp_max(float x) { return warp_reduce<MaxOp>(x); }
__device__ inline float block_sum(float x) { return block_reduce<SumOp>(x, 0.0f); }
__device__ inline double block_sum_f64(double x) { return block_reduce<SumOp>(x, 0.0); }
__device__ inline float block_max(float x) { return block_reduce<MaxOp>(x, -INFINITY); }

// ---- GEMM (kernels_cuda_matmul.cu) ----------------------------------------------

// What the GEMM does to its result before storing it: cuBLASLt's epilogues,
// named here for the row-major product (kernels_cuda_matmul.cu maps them onto
// cuBLASLt's column-major operands).
typedef enum GemmEpilogue {
    GEMM_PLAIN,      // C as computed
    GEMM_BIAS,       // + bias (N) on every row of C
    GEMM_GELU_AUX,   // aux = C [+ bias], then C = gelu(aux)
    GEMM_DGELU,      // C = C * gelu'(aux)
    GEMM_BGRAD_A,    // also bias_grad (M) = row sums of op(A), fp32, written (not added)
} GemmEpilogue;

// One row-major GEMM, or `batch` of them at fixed strides (elements):
//   C (M,N) = epilogue(alpha * op(A) (M,K) @ op(B) (K,N) + beta * C)
// A is stored (M,K), or (K,M) when transA; B is stored (K,N), or (N,K) when
// transB; rows lda, ldb, ldc apart (0 = densely packed). A, B, bias bf16;
// C bf16 or fp32 (c_f32); products accumulate in fp32. An epilogue other
// than GEMM_PLAIN takes batch == 1 and 16-byte aligned vectors (bias, aux,
// bias_grad); aux has C's type and rows ldc apart, ldc a multiple of 8
// (cuBLASLt's constraints, which the callers check before they ask).
typedef struct GemmArgs {
    int M, N, K;
    int lda, ldb, ldc;
    const void *A;
    int transA;
    long long strideA;
    const void *B;
    int transB;
    long long strideB;
    void *C;
    int c_f32;
    long long strideC;
    float alpha, beta;
    int batch;  // 1 for a single GEMM
    GemmEpilogue epilogue;
    const void *bias;  // GEMM_BIAS; GEMM_GELU_AUX, where NULL adds none
    void *aux;         // GEMM_GELU_AUX writes it, GEMM_DGELU reads it
    float *bias_grad;  // GEMM_BGRAD_A
} GemmArgs;

// Runs the GEMM and returns true, or returns false having done nothing when
// cuBLASLt has no kernel for its epilogue: the caller then does without
// (a GEMM_PLAIN or GEMM_BIAS with no kernel stops the program).
bool gemm_bf16(Device *d, const GemmArgs *g);

// acc[c] += sum over r of partials[r*cols + c], r in order (deterministic column sums)
void column_partials_accumulate(Device *d, float *acc, const float *partials, int rows, int cols);
// rows of a column-sum partial: each block sums this many rows of its columns
#define COLSUM_ROWS_PER_PART 64
#define COLSUM_BLOCK_ROWS 8   // threadIdx.y extent of the column-sum kernels
// Partials for `rows` rows: one per COLSUM_ROWS_PER_PART, at most the grid's y limit.
static inline int colsum_parts(int rows) {
    int parts = (int)ceil_div(rows, COLSUM_ROWS_PER_PART);
    CHECK(parts <= 65535, "column sums: %d row parts exceed the grid's y limit of 65535; hint: fewer tokens per micro-batch", parts);
    return parts;
}

// ---- the kernels that live outside kernels_cuda.cu -------------------------------

void matmul_forward_cuda(Device *d, act *out, const act *inp, const bf16 *w, const bf16 *bias,
                         int BT, int C, int OC, int ldo);
void matmul_backward_cuda(Device *d, act *dinp, float *dw, float *dbias, const act *dout,
                          const act *inp, const bf16 *w, int BT, int C, int OC, int ldo);
void attention_forward_cuda(Device *d, act *out, float *att, const act *qkv, int B, int T, int C,
                            int NH);
void attention_backward_cuda(Device *d, act *dqkv, const act *dout, const act *qkv,
                             const float *att, int B, int T, int C, int NH);
void flash_attention_forward_cuda(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH);
void flash_attention_backward_cuda(Device *d, act *dqkv, const act *dout, const act *qkv, const act *out,
                                   const float *lse, int B, int T, int C, int NH);
void flash_block_forward_cuda(Device *d, const FlashBlock *f, float *y, float *lse, int merge);
void flash_block_backward_cuda(Device *d, const FlashBlock *f, const act *y, const act *dy, const float *lse,
                               float *dq, float *dk, float *dv);
void layernorm_forward_cuda(Device *d, act *out, float *mean, float *rstd, const act *inp,
                            const bf16 *w, const bf16 *b, int BT, int C);
void residual_layernorm_forward_cuda(Device *d, act *res, act *out, float *mean, float *rstd, const act *a,
                                     const act *b, const bf16 *w, const bf16 *bias, int BT, int C);
void layernorm_backward_cuda(Device *d, act *dinp, float *dw, float *db, const act *dout,
                             const act *inp, const bf16 *w, const float *mean, const float *rstd,
                             int BT, int C);
// Scratch bytes each asks for (device_scratch), beside the call that makes
// the request: the bias gradient's column partials for OC outputs, the
// layernorm backward's partials of w and b, attention's per-head operands
// (materialized) or its rows' D (flash).
// Row parts are ceil(BT / COLSUM_ROWS_PER_PART), counted without colsum_parts'
// check, which belongs to the launch.
size_t matmul_cuda_scratch_bytes(int BT, int OC);
size_t layernorm_cuda_scratch_bytes(int BT, int C);
size_t attention_cuda_scratch_bytes(int B, int T, int C, int NH);
size_t flash_cuda_scratch_bytes(int B, int T, int C, int NH);
// kernels_cuda_flash_tc.cu: the tensor-core FlashAttention for head sizes 16,
// 32, 64, 128; false (nothing launched) for another head size, or where the
// GPU's shared memory cannot hold the tiles. The backward takes D (B,NH,T).
bool flash_tc_forward(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH);
bool flash_tc_backward(Device *d, act *dqkv, const act *dout, const act *qkv, const float *lse, const float *D,
                       int B, int T, int C, int NH);
void softmax_crossentropy_cuda(Device *d, float *losses, act *logits, const int32_t *targets,
                               int BT, int V, int ld, float dloss_scale);
void matmul_gelu_forward_cuda(Device *d, act *out, act *pre, const act *inp, const bf16 *w,
                              const bf16 *bias, int BT, int C, int OC);
void gelu_matmul_backward_cuda(Device *d, act *dpre, float *dw, float *dbias, const act *dout,
                               const act *inp, const act *pre, const bf16 *w, int BT, int C, int OC);
// kernels_cuda.cu's GELU, for the fused ops' unfused path
void gelu_forward_cuda(Device *d, act *out, const act *inp, size_t n);
void gelu_backward_cuda(Device *d, act *dinp, const act *inp, const act *dout, size_t n);
// dwpe (T,C) += sum over the batch of dout (B,T,C): the position half of encoder_backward
void encoder_backward_wpe_cuda(Device *d, float *dwpe, const act *dout, int B, int T, int C);
// dwte rows [begin, begin + rows) += dout (BT,C) summed by token (tb): the token
// half of encoder_backward (all rows: 0, INT_MAX) and of embedding_part_backward
void encoder_backward_wte_cuda(Device *d, float *dwte, const act *dout, const int32_t *tokens,
                               const TokenBuckets *tb, int BT, int C, int begin, int rows);
// kernels_cuda_tp.cu (tensor parallelism)
void bias_add_cuda(Device *d, act *out, const bf16 *bias, int BT, int OC);
void embedding_part_forward_cuda(Device *d, act *out, const int32_t *tokens, const bf16 *wte_part,
                                 int vocab_begin, int rows, const bf16 *wpe, int B, int T, int C);
void embedding_part_backward_cuda(Device *d, float *dwte_part, float *dwpe, const act *dout, const int32_t *tokens,
                                  const TokenBuckets *tb, int vocab_begin, int rows, int B, int T, int C);
void crossentropy_part_max_cuda(Device *d, float *maxv, const act *logits, int BT, int V, int ld);
void crossentropy_part_sums_cuda(Device *d, float *sums, const act *logits, const float *maxv,
                                 const int32_t *targets, int vocab_begin, int BT, int V, int ld);
void crossentropy_part_finish_cuda(Device *d, float *losses, act *logits, const float *maxv,
                                   const float *sums, const int32_t *targets, int vocab_begin,
                                   int BT, int V, int ld, float dloss_scale);

// kernels_cuda_quant.cu (block quantization, quant_math.h)
void quantize_half_cuda(Device *d, void *packed, const bf16 *x, size_t n, int bits, int block);
void quantize_f32_cuda(Device *d, void *packed, const float *x, size_t n, int bits, int block);
void dequantize_half_cuda(Device *d, bf16 *out, const void *packed, size_t n, int bits, int block);
void dequantize_f32_cuda(Device *d, float *acc, const void *packed, size_t n, int bits, int block, int accumulate);

}  // namespace KERNELS_NS
