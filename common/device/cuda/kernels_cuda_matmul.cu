// kernels_cuda_matmul.cu: the linear layer on the cuda device. Every product
// is one cuBLASLt GEMM with bf16 operands and fp32 accumulation, and what can
// ride on the GEMM does, in its epilogue: the forward adds the bias; the MLP's
// first linear also applies the GELU and writes the pre-GELU values it keeps
// for backward as the epilogue's aux output (GELU_AUX_BIAS); the backward of
// the MLP's projection multiplies its input gradient by gelu'(pre) (DGELU);
// the weight-gradient GEMM sums the bias gradient (BGRADB). The weight
// gradient is written in fp32 with beta = 1, so it accumulates straight into
// the gradient buffer; the bias gradient, which the epilogue writes, goes to
// the scratch and is added from there. Where cuBLASLt's constraints on an
// epilogue fail (alignment, the aux leading dimension) or it has no kernel
// for one, the separate kernels do the work: the GELU kernels, and a
// deterministic column sum (no atomics) for the bias gradient. Either way the
// same input gives the same bits on every run.
#include "kernels_cuda.h"

namespace KERNELS_NS {

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

// What cuBLASLt is told about one GEMM shape, and the algorithm its
// heuristic picked for it: made at the shape's first call, kept for the run
// (a step repeats the same few dozen shapes; the heuristic's search is slow).
typedef struct GemmKey {
    int M, N, K, lda, ldb, ldc, transA, transB, batch, c_f32;
    GemmEpilogue epilogue;
    int bias;  // GEMM_GELU_AUX with a bias is another cuBLASLt epilogue (GELU_AUX_BIAS)
    long long strideA, strideB, strideC;
    uint32_t align[3];  // promised to the heuristic: B, A, C (cuBLASLt's A, B, C/D)
} GemmKey;

typedef struct GemmPlan {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t first, second, c;
    cublasLtMatmulHeuristicResult_t heur;
    int found;  // 0: cuBLASLt has no kernel for this GEMM with its epilogue
} GemmPlan;

typedef struct GemmCache {
    GemmPlan *plan;
    int n, cap;
} GemmCache;

// cuBLASLt is column-major. A row-major (R,S) matrix is a column-major (S,R)
// one, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
// cuBLASLt computes D (N,M) = B' (N,K) x A' (K,M) with B as its first operand.
// A vector of one value per column of C is one per row of D (the bias), and
// the row sums of op(A) are the column sums of cuBLASLt's second operand
// over k: BGRADB, where BGRADA would sum our B.
static cublasLtEpilogue_t cublaslt_epilogue(const GemmArgs *g) {
    switch (g->epilogue) {
    case GEMM_PLAIN: return CUBLASLT_EPILOGUE_DEFAULT;
    case GEMM_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case GEMM_GELU_AUX: return g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case GEMM_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case GEMM_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

// The epilogue's pointers, set on every call. cuBLASLt's heuristic reads
// their alignment from their values, so they are set before it is asked too
// (every caller's are 16-byte aligned: the plan holds for all of them).
static void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const GemmArgs *g) {
    if (g->epilogue == GEMM_BIAS || (g->epilogue == GEMM_GELU_AUX && g->bias))
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
    if (g->epilogue == GEMM_BGRAD_A)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias_grad,
                                                   sizeof g->bias_grad));
    if (g->epilogue == GEMM_GELU_AUX || g->epilogue == GEMM_DGELU)
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                   sizeof g->aux));
}

static void make_plan(Device *d, GemmPlan *pl, const GemmArgs *g) {
    const GemmKey *k = &pl->key;
    CudaImpl *impl = cuda_impl(d);
    int M = k->M, N = k->N, K = k->K;
    cublasOperation_t op_first = k->transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_second = k->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    cublasCheck(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    cublasLtEpilogue_t epi = cublaslt_epilogue(g);
    cublasCheck(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (k->epilogue == GEMM_GELU_AUX || k->epilogue == GEMM_DGELU) {
        int64_t aux_ld = k->ldc;  // the aux has D's type and layout
        cublasCheck(cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                   sizeof aux_ld));
    }
    set_epilogue_pointers(pl->desc, g);
    // layouts of the stored matrices (before op): B (K,N) row-major is (N,K)
    // column-major with ld N; B stored transposed, (N,K) row-major, is (K,N) with ld K
    pl->first = k->transB ? make_layout(FLOATX_CUDA_TYPE, K, N, k->ldb, k->batch, k->strideB)
                          : make_layout(FLOATX_CUDA_TYPE, N, K, k->ldb, k->batch, k->strideB);
    pl->second = k->transA ? make_layout(FLOATX_CUDA_TYPE, M, K, k->lda, k->batch, k->strideA)
                           : make_layout(FLOATX_CUDA_TYPE, K, M, k->lda, k->batch, k->strideA);
    pl->c = make_layout(k->c_f32 ? CUDA_R_32F : FLOATX_CUDA_TYPE, N, M, k->ldc, k->batch, k->strideC);

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = impl->lt_workspace.bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                     sizeof ws_bytes));
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k->align[0]);
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k->align[1]);
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k->align[2]);
    set_min_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k->align[2]);
    // a GEMM that cuBLASLt cannot run with an optional epilogue (GELU, DGELU,
    // BGRADB) reports no kernel, and its caller runs the unfused kernels
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(impl->lt, pl->desc, pl->first, pl->second, pl->c, pl->c,
                                                       pref, 1, &pl->heur, &pl->found);
    int optional = k->epilogue != GEMM_PLAIN && k->epilogue != GEMM_BIAS;
    if (!optional) {
        cublasCheck(st);
        CHECK(pl->found > 0, "cuBLASLt has no GEMM for M=%d N=%d K=%d transA=%d transB=%d batch=%d "
              "out=%s%s; hint: check shapes and pointer alignment", M, N, K, k->transA, k->transB,
              k->batch, k->c_f32 ? "fp32" : "bf16", k->epilogue == GEMM_BIAS ? " with bias" : "");
    } else if (st != CUBLAS_STATUS_SUCCESS) {
        pl->found = 0;
    }
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
}

static GemmPlan *plan_for(Device *d, const GemmKey *key, const GemmArgs *g) {
    CudaImpl *impl = cuda_impl(d);
    GemmCache *c = (GemmCache *)impl->gemm_cache;
    if (!c) c = (GemmCache *)(impl->gemm_cache = xcalloc(1, sizeof *c));
    for (int i = 0; i < c->n; i++)
        if (!memcmp(&c->plan[i].key, key, sizeof *key)) return &c->plan[i];
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 32;
        c->plan = (GemmPlan *)realloc(c->plan, (size_t)c->cap * sizeof *c->plan);
        CHECK(c->plan, "out of host memory for %d GEMM plans", c->cap);
    }
    GemmPlan *pl = &c->plan[c->n++];
    memset(pl, 0, sizeof *pl);
    pl->key = *key;
    make_plan(d, pl, g);
    return pl;
}

}  // namespace KERNELS_NS

// One cache per device, made by the pass whose table the device uses; the
// plans are the same struct in both passes, so one function frees either.
#ifndef WB_CUDA_FP16
void gemm_cache_free(CudaImpl *impl) {
    using KERNELS_NS::GemmCache;
    GemmCache *c = (GemmCache *)impl->gemm_cache;
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        cublasCheck(cublasLtMatrixLayoutDestroy(c->plan[i].c));
        cublasCheck(cublasLtMatrixLayoutDestroy(c->plan[i].second));
        cublasCheck(cublasLtMatrixLayoutDestroy(c->plan[i].first));
        cublasCheck(cublasLtMatmulDescDestroy(c->plan[i].desc));
    }
    free(c->plan);
    free(c);
    impl->gemm_cache = NULL;
}
#endif

namespace KERNELS_NS {

bool gemm_bf16(Device *d, const GemmArgs *g) {
    CudaImpl *impl = cuda_impl(d);
    CHECK(g->epilogue == GEMM_PLAIN || g->batch == 1, "gemm_bf16: an epilogue only on a single GEMM");
    CHECK(aligned16(g->bias) && aligned16(g->aux) && aligned16(g->bias_grad),
          "gemm_bf16: the epilogue's vectors must be 16-byte aligned");
    int M = g->M, N = g->N, K = g->K;
    size_t c_bytes = g->c_f32 ? 4 : 2;
    GemmKey key;
    memset(&key, 0, sizeof key);  // padding too: keys compare with memcmp
    key.M = M, key.N = N, key.K = K;
    key.ldb = g->ldb ? g->ldb : (g->transB ? K : N);
    key.lda = g->lda ? g->lda : (g->transA ? M : K);
    key.ldc = g->ldc ? g->ldc : N;
    key.transA = g->transA, key.transB = g->transB, key.batch = g->batch, key.c_f32 = g->c_f32;
    key.epilogue = g->epilogue, key.bias = g->bias != NULL;
    CHECK((g->epilogue != GEMM_GELU_AUX && g->epilogue != GEMM_DGELU) || key.ldc % 8 == 0,
          "gemm_bf16: the GELU epilogue's aux needs rows a multiple of 8 elements apart, not %d", key.ldc);
    CHECK(g->epilogue != GEMM_BGRAD_A || g->c_f32, "gemm_bf16: the bias gradient has C's type, fp32 only");
    key.strideA = g->strideA, key.strideB = g->strideB, key.strideC = g->strideC;
    long long sB = g->batch > 1 ? g->strideB * 2 : 0, sA = g->batch > 1 ? g->strideA * 2 : 0;
    long long sC = g->batch > 1 ? g->strideC * (long long)c_bytes : 0;
    key.align[0] = alignment_of(g->B, sB, 2LL * key.ldb);
    key.align[1] = alignment_of(g->A, sA, 2LL * key.lda);
    key.align[2] = alignment_of(g->C, sC, (long long)c_bytes * key.ldc);
    GemmPlan *pl = plan_for(d, &key, g);
    if (!pl->found) return false;
    set_epilogue_pointers(pl->desc, g);
    cublasCheck(cublasLtMatmul(impl->lt, pl->desc, &g->alpha, g->B, pl->first, g->A, pl->second, &g->beta, g->C,
                               pl->c, g->C, pl->c, &pl->heur.algo, impl->lt_workspace.ptr, impl->lt_workspace.bytes,
                               cuda_stream(d, STREAM_COMPUTE)));
    return true;
}

// ---- deterministic column sums -----------------------------------------------------------

// partials (rows,cols) summed down each column in row order
__global__ void __launch_bounds__(BLOCK) column_partials_kernel(float *acc, const float *partials, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++) s += partials[(size_t)r * cols + c];
    acc[c] += s;
}

void column_partials_accumulate(Device *d, float *acc, const float *partials, int rows, int cols) {
    column_partials_kernel<<<(unsigned)ceil_div(cols, BLOCK), BLOCK, 0,
                             cuda_stream(d, STREAM_COMPUTE)>>>(acc, partials, rows, cols);
    LAUNCH_CHECK();
}

// One block per (32 columns, COLSUM_ROWS_PER_PART rows): threadIdx.x picks the
// column (adjacent threads read adjacent bf16, coalesced), threadIdx.y strides
// the rows; the block then sums its rows in a fixed tree order.
__global__ void __launch_bounds__(WARP_SIZE * COLSUM_BLOCK_ROWS) bias_grad_partials_kernel(float *partials, const floatX *dout, int BT, int OC,
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
__global__ void __launch_bounds__(BLOCK) broadcast_bias_kernel(floatX *out, const floatX *bias, size_t n, int OC, int ldo) {
    FOR_EACH_ELEMENT(i, n) out[i / OC * ldo + i % OC] = bias[i % OC];
}

// ---- the linear layer ---------------------------------------------------------------------

// out (BT,OC), rows ldo apart, = inp (BT,C) @ w^T, w stored (OC,C)
static GemmArgs forward_gemm(act *out, const act *inp, const bf16 *w, int BT, int C, int OC, int ldo) {
    GemmArgs g = {};
    g.M = BT, g.N = OC, g.K = C, g.ldc = ldo;
    g.A = inp, g.transA = 0;
    g.B = w, g.transB = 1;
    g.C = out, g.c_f32 = 0;
    g.alpha = 1.0f, g.beta = 0.0f, g.batch = 1;
    return g;
}

// dinp (BT,C) = dout (BT,OC), rows ldo apart, @ w (OC,C), overwritten
static GemmArgs input_grad_gemm(act *dinp, const act *dout, const bf16 *w, int BT, int C, int OC, int ldo) {
    GemmArgs g = {};
    g.M = BT, g.N = C, g.K = OC, g.lda = ldo;
    g.A = dout, g.transA = 0;
    g.B = w, g.transB = 0;
    g.C = dinp, g.c_f32 = 0;
    g.alpha = 1.0f, g.beta = 0.0f, g.batch = 1;
    return g;
}

// dw (OC,C) += dout^T (OC,BT) @ inp (BT,C): fp32 out, beta = 1 accumulates;
// dbias (OC) += column sums of dout, unless NULL
static void weight_and_bias_grad(Device *d, float *dw, float *dbias, const act *dout, const act *inp, int BT,
                                 int C, int OC, int ldo) {
    if (!dw) return;  // zero bubble's B: the weights' gradients are its W's
    GemmArgs g = {};
    g.M = OC, g.N = C, g.K = BT, g.lda = ldo;  // dout stored (BT,OC): (K,M) with rows ldo apart
    g.A = dout, g.transA = 1;
    g.B = inp, g.transB = 0;
    g.C = dw, g.c_f32 = 1;
    g.alpha = 1.0f, g.beta = 1.0f, g.batch = 1;
    if (dbias) {
        // the row sums of op(A) = dout^T in the GEMM's epilogue; cuBLASLt writes
        // them, so into the scratch (cudaMalloc'd: aligned), then added to dbias
        float *sums = (float *)device_scratch(d, (size_t)OC * sizeof(float));
        g.epilogue = GEMM_BGRAD_A, g.bias_grad = sums;
        if (gemm_bf16(d, &g)) {
            column_partials_accumulate(d, dbias, sums, 1, OC);
            return;
        }
        g.epilogue = GEMM_PLAIN, g.bias_grad = NULL;  // no kernel with BGRADB here: the column sum
    }
    gemm_bf16(d, &g);
    if (dbias) bias_grad(d, dbias, (const floatX *)dout, BT, OC, ldo);
}

void matmul_forward_cuda(Device *d, act *out, const act *inp, const bf16 *w, const bf16 *bias,
                         int BT, int C, int OC, int ldo) {
    // the epilogue reads the bias with vector loads; at an odd offset in the
    // flat parameter buffer the bias is first copied into every row of out and
    // the GEMM adds onto it (beta = 1): one rounding to bf16 either way
    int epilogue_bias = bias && aligned16(bias);
    GemmArgs g = forward_gemm(out, inp, w, BT, C, OC, ldo);
    if (epilogue_bias) g.epilogue = GEMM_BIAS, g.bias = bias;
    if (bias && !epilogue_bias) {
        size_t n = (size_t)BT * OC;
        broadcast_bias_kernel<<<grid_for(n, BLOCK), BLOCK, 0, cuda_stream(d, STREAM_COMPUTE)>>>(
            (floatX *)out, (const floatX *)bias, n, OC, ldo);
        LAUNCH_CHECK();
        g.beta = 1.0f;
    }
    gemm_bf16(d, &g);
}

// cuBLASLt's GELU epilogues keep the pre-GELU matrix as their aux, of D's
// type and layout: rows a multiple of 8 elements apart, and like the bias
// 16-byte aligned (cublasLt.h). Otherwise the unfused kernels run.
static bool gelu_aux_fits(const void *aux, int ld) { return ld % 8 == 0 && aligned16(aux); }

void matmul_gelu_forward_cuda(Device *d, act *out, act *pre, const act *inp, const bf16 *w,
                              const bf16 *bias, int BT, int C, int OC) {
    // pre = inp @ w^T + bias, out = gelu(pre) in one GEMM: out is gelu of the
    // fp32 sum (pre rounded to bf16 on its own), where the two kernels take
    // gelu of pre rounded
    if (gelu_aux_fits(pre, OC) && aligned16(bias)) {
        GemmArgs g = forward_gemm(out, inp, w, BT, C, OC, OC);
        g.epilogue = GEMM_GELU_AUX, g.bias = bias, g.aux = pre;
        if (gemm_bf16(d, &g)) return;
    }
    matmul_forward_cuda(d, pre, inp, w, bias, BT, C, OC, OC);
    gelu_forward_cuda(d, out, pre, (size_t)BT * OC);
}

void gelu_matmul_backward_cuda(Device *d, act *dpre, float *dw, float *dbias, const act *dout,
                               const act *inp, const act *pre, const bf16 *w, int BT, int C, int OC) {
    // dpre (BT,C) = (dout @ w) * gelu'(pre): the input gradient multiplied in
    // the epilogue, rounded once to bf16 where the two kernels round twice
    GemmArgs g = input_grad_gemm(dpre, dout, w, BT, C, OC, OC);
    bool fused = false;
    if (gelu_aux_fits(pre, C)) {
        g.epilogue = GEMM_DGELU, g.aux = (void *)pre;
        fused = gemm_bf16(d, &g);
    }
    if (!fused) {
        g.epilogue = GEMM_PLAIN, g.aux = NULL;
        gemm_bf16(d, &g);
        gelu_backward_cuda(d, dpre, pre, dpre, (size_t)BT * C);
    }
    weight_and_bias_grad(d, dw, dbias, dout, inp, BT, C, OC, OC);
}

void matmul_backward_cuda(Device *d, act *dinp, float *dw, float *dbias, const act *dout,
                          const act *inp, const bf16 *w, int BT, int C, int OC, int ldo) {
    if (dinp) {
        GemmArgs g = input_grad_gemm(dinp, dout, w, BT, C, OC, ldo);
        gemm_bf16(d, &g);
    }
    weight_and_bias_grad(d, dw, dbias, dout, inp, BT, C, OC, ldo);
}

}  // namespace KERNELS_NS
