// kernels_cuda_matmul.cu: the linear layer on the cuda device. Every product
// is one cuBLASLt GEMM with bf16 operands and fp32 accumulation; the forward
// adds the bias in the GEMM's epilogue, and the weight gradient is written in
// fp32 with beta = 1, so it accumulates straight into the gradient buffer.
// The bias gradient is a deterministic column sum (no atomics), so the same
// input gives the same bits on every run.
#include "kernels_cuda.h"

// ---- row-major GEMM on cuBLASLt -----------------------------------------------------

// cuBLASLt picks kernels assuming 256-byte aligned buffers unless told
// otherwise; a weight inside the flat parameter buffer may be less aligned,
// and so may the rows after the first when the row stride is odd.
static uint32_t alignment_of(const void *p, long long stride_bytes, long long ld_bytes) {
    uintptr_t x = (uintptr_t)p | (uintptr_t)stride_bytes | (uintptr_t)ld_bytes;
    uint32_t a = 256;
    while (a > 1 && (x & (a - 1))) a >>= 1;
    return a;
}

// Column-major layout (rows, cols, ld) of one operand, with its batch stride.
static cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int rows, int cols, int ld,
                                          int batch, long long stride) {
    cublasLtMatrixLayout_t l;
    cublasCheck(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t b = batch;
        int64_t s = stride;
        cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b,
                                                     sizeof b));
        cublasCheck(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &s, sizeof s));
    }
    return l;
}

static void set_min_alignment(cublasLtMatmulPreference_t pref,
                              cublasLtMatmulPreferenceAttributes_t attr, uint32_t bytes) {
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
}

// cuBLASLt is column-major. A row-major (R,S) matrix is a column-major (S,R)
// one, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
// cuBLASLt computes D (N,M) = B' (N,K) x A' (K,M) with B as its first operand.
void gemm_bf16(Device *d, const GemmArgs *g) {
    CudaImpl *impl = cuda_impl(d);
    CHECK(!g->bias || g->batch == 1, "gemm_bf16: a bias only on a single GEMM");
    int M = g->M, N = g->N, K = g->K;
    cublasOperation_t op_first = g->transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_second = g->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t c_type = g->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    size_t c_bytes = g->c_f32 ? 4 : 2;

    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                               sizeof op_first));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                               sizeof op_second));
    if (g->bias) {
        // bias (N) is one value per row of D (N,M): per column of the row-major C
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                   sizeof epi));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &g->bias, sizeof g->bias));
    }
    // layouts of the stored matrices (before op): B (K,N) row-major is (N,K)
    // column-major with ld N; B stored transposed, (N,K) row-major, is (K,N) with ld K
    int ldb = g->ldb ? g->ldb : (g->transB ? K : N);
    int lda = g->lda ? g->lda : (g->transA ? M : K);
    int ldc = g->ldc ? g->ldc : N;
    cublasLtMatrixLayout_t lay_first =
        g->transB ? make_layout(CUDA_R_16BF, K, N, ldb, g->batch, g->strideB)
                  : make_layout(CUDA_R_16BF, N, K, ldb, g->batch, g->strideB);
    cublasLtMatrixLayout_t lay_second =
        g->transA ? make_layout(CUDA_R_16BF, M, K, lda, g->batch, g->strideA)
                  : make_layout(CUDA_R_16BF, K, M, lda, g->batch, g->strideA);
    cublasLtMatrixLayout_t lay_c = make_layout(c_type, N, M, ldc, g->batch, g->strideC);

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = impl->lt_workspace.bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    long long sB = g->batch > 1 ? g->strideB * 2 : 0, sA = g->batch > 1 ? g->strideA * 2 : 0;
    long long sC = g->batch > 1 ? g->strideC * (long long)c_bytes : 0;
    long long ldb_bytes = 2LL * ldb, lda_bytes = 2LL * lda, ldc_bytes = (long long)c_bytes * ldc;
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(g->B, sB, ldb_bytes));
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(g->A, sA, lda_bytes));
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(g->C, sC, ldc_bytes));
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(g->C, sC, ldc_bytes));

    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(impl->lt, desc, lay_first, lay_second, lay_c, lay_c,
                                               pref, 1, &heur, &found));
    CHECK(found > 0, "cuBLASLt has no GEMM for M=%d N=%d K=%d transA=%d transB=%d batch=%d "
          "out=%s%s; hint: check shapes and pointer alignment", M, N, K, g->transA, g->transB,
          g->batch, g->c_f32 ? "fp32" : "bf16", g->bias ? " with bias" : "");
    cublasCheck(cublasLtMatmul(impl->lt, desc, &g->alpha, g->B, lay_first, g->A, lay_second,
                               &g->beta, g->C, lay_c, g->C, lay_c, &heur.algo,
                               impl->lt_workspace.ptr, ws_bytes, cuda_stream(d, STREAM_COMPUTE)));

    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(lay_c));
    cublasCheck(cublasLtMatrixLayoutDestroy(lay_second));
    cublasCheck(cublasLtMatrixLayoutDestroy(lay_first));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// ---- deterministic column sums -----------------------------------------------------------

// partials (rows,cols) summed down each column in row order
__global__ void column_partials_kernel(float *acc, const float *partials, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++) s += partials[(size_t)r * cols + c];
    acc[c] += s;
}

void column_partials_accumulate(Device *d, float *acc, const float *partials, int rows, int cols) {
    int block = 256;
    column_partials_kernel<<<(unsigned)ceil_div(cols, block), block, 0,
                             cuda_stream(d, STREAM_COMPUTE)>>>(acc, partials, rows, cols);
    LAUNCH_CHECK();
}

// One block per (32 columns, COLSUM_ROWS_PER_PART rows): threadIdx.x picks the
// column (adjacent threads read adjacent bf16, coalesced), threadIdx.y strides
// the rows; the block then sums its rows in a fixed tree order.
__global__ void bias_grad_partials_kernel(float *partials, const floatX *dout, int BT, int OC,
                                          int ldo) {
    __shared__ float tile[COLSUM_BLOCK_ROWS][WARP_SIZE];
    int c = blockIdx.x * WARP_SIZE + threadIdx.x;
    int r0 = blockIdx.y * COLSUM_ROWS_PER_PART;
    int r1 = min(r0 + COLSUM_ROWS_PER_PART, BT);
    float s = 0.0f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += COLSUM_BLOCK_ROWS)
            s += to_f32(dout[(size_t)r * ldo + c]);
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        for (int y = 1; y < COLSUM_BLOCK_ROWS; y++) s += tile[y][threadIdx.x];
        partials[(size_t)blockIdx.y * OC + c] = s;
    }
}

size_t matmul_cuda_scratch_bytes(int BT, int OC) {
    return ceil_div((size_t)BT, COLSUM_ROWS_PER_PART) * (size_t)OC * sizeof(float);
}

// dbias (OC) += column sums of dout (BT,OC), rows ldo apart
static void bias_grad(Device *d, float *dbias, const floatX *dout, int BT, int OC, int ldo) {
    int parts = colsum_parts(BT);
    float *partials = (float *)device_scratch(d, (size_t)parts * OC * sizeof(float));
    dim3 grid((unsigned)ceil_div(OC, WARP_SIZE), (unsigned)parts);
    dim3 block(WARP_SIZE, COLSUM_BLOCK_ROWS);
    bias_grad_partials_kernel<<<grid, block, 0, cuda_stream(d, STREAM_COMPUTE)>>>(partials, dout,
                                                                                BT, OC, ldo);
    LAUNCH_CHECK();
    column_partials_accumulate(d, dbias, partials, parts, OC);
}

// out (BT,OC), rows ldo apart, = bias (OC) in every row, for a bias the GEMM
// epilogue cannot read
__global__ void broadcast_bias_kernel(floatX *out, const floatX *bias, size_t n, int OC, int ldo) {
    FOR_EACH_ELEMENT(i, n) out[i / OC * ldo + i % OC] = bias[i % OC];
}

// ---- the linear layer ---------------------------------------------------------------------

void matmul_forward_cuda(Device *d, act *out, const act *inp, const bf16 *w, const bf16 *bias,
                         int BT, int C, int OC, int ldo) {
    // the epilogue reads the bias with vector loads; at an odd offset in the
    // flat parameter buffer the bias is first copied into every row of out and
    // the GEMM adds onto it (beta = 1): one rounding to bf16 either way
    int epilogue_bias = bias && ((uintptr_t)bias % 16 == 0);
    // out (BT,OC) = inp (BT,C) @ w^T, w stored (OC,C)
    GemmArgs g = {};
    g.M = BT, g.N = OC, g.K = C, g.ldc = ldo;
    g.A = inp, g.transA = 0;
    g.B = w, g.transB = 1;
    g.C = out, g.c_f32 = 0;
    g.alpha = 1.0f, g.beta = 0.0f, g.batch = 1;
    g.bias = epilogue_bias ? bias : NULL;
    if (bias && !epilogue_bias) {
        size_t n = (size_t)BT * OC;
        broadcast_bias_kernel<<<grid_for(n, 256), 256, 0, cuda_stream(d, STREAM_COMPUTE)>>>(
            (floatX *)out, (const floatX *)bias, n, OC, ldo);
        LAUNCH_CHECK();
        g.beta = 1.0f;
    }
    gemm_bf16(d, &g);
}

void matmul_backward_cuda(Device *d, act *dinp, float *dw, float *dbias, const act *dout,
                          const act *inp, const bf16 *w, int BT, int C, int OC, int ldo) {
    if (dinp) {
        // dinp (BT,C) = dout (BT,OC) @ w (OC,C), overwritten
        GemmArgs g = {};
        g.M = BT, g.N = C, g.K = OC, g.lda = ldo;
        g.A = dout, g.transA = 0;
        g.B = w, g.transB = 0;
        g.C = dinp, g.c_f32 = 0;
        g.alpha = 1.0f, g.beta = 0.0f, g.batch = 1;
        gemm_bf16(d, &g);
    }
    // dw (OC,C) += dout^T (OC,BT) @ inp (BT,C): fp32 out, beta = 1 accumulates
    GemmArgs g = {};
    g.M = OC, g.N = C, g.K = BT, g.lda = ldo;  // dout stored (BT,OC): (K,M) with rows ldo apart
    g.A = dout, g.transA = 1;
    g.B = inp, g.transB = 0;
    g.C = dw, g.c_f32 = 1;
    g.alpha = 1.0f, g.beta = 1.0f, g.batch = 1;
    gemm_bf16(d, &g);
    if (dbias) bias_grad(d, dbias, (const floatX *)dout, BT, OC, ldo);
}
