// emu_blas.cpp: cuBLASLt's matmul on the CPU, from its documented
// column-major definition:
//   D = epilogue(alpha * op(A) op(B) + beta * C)      op(A) m x k, op(B) k x n, C and D m x n
// with a matrix layout (type, rows, cols, leading dimension, batch count and
// stride) per operand. Every call is checked as cuBLASLt would refuse it
// (shapes that do not chain, a leading dimension below the rows, batches
// that do not agree or outputs that overlap) and beyond: each operand must
// lie inside one live device allocation, and every pointer (each batch's
// too) must have the alignment promised to the heuristic, since the kernel
// it picked may rely on it. The epilogues (bias, GELU with its aux matrix,
// DGELU, bias gradients) are checked as cublasLt.h documents them: the aux
// leading dimension a multiple of 8 and no less than D's rows, every vector
// and the aux matrix inside one live device allocation, each as aligned as
// its pointer was when the heuristic was asked (cuBLASLt reads the alignment
// from the value). The product is OpenBLAS's sgemm on the operands
// widened to fp32 (bf16 and fp16 products are exact in fp32); the result is
// rounded once to D's type.
#include <cblas.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "cublasLt.h"
#include "emu.h"

using namespace emu;

struct EmuLtHandle {
    int alive;
};
struct EmuLtDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t op[2];
    cublasLtEpilogue_t epilogue;
    const void *bias;
    void *aux;
    int64_t aux_ld, aux_stride;
    int bias_type, aux_type;  // -1: D's type
};
struct EmuLtLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct EmuLtPref {
    size_t max_workspace;
    uint32_t align[4];  // A, B, C, D
};

// what the heuristic hands back: the alignments it was promised (A, B, C, D by the
// preference; bias and aux by their pointers), and the problem it was asked about
struct AlgoData {
    uint32_t align[4];
    uint32_t epilogue_align[2];
    uint64_t problem;
};

// An epilogue pointer's alignment as the heuristic reads it from the value,
// up to the 16 bytes of a vector load (NULL, not yet set: all 16)
static uint32_t pointer_alignment(const void *p) {
    uint32_t a = 16;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}

static cublasStatus_t refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static cublasStatus_t refuse(const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda emulator (rank %d): cuBLASLt refuses: %s\n", world_rank(), text);
    return CUBLAS_STATUS_INVALID_VALUE;
}

static size_t type_bytes(int t) { return t == CUDA_R_32F ? 4 : 2; }
static const char *type_name(int t) { return t == CUDA_R_32F ? "fp32" : t == CUDA_R_16BF ? "bf16" : "fp16"; }

template <class T> static cublasStatus_t get(T *out, const void *buf, size_t bytes, const char *what) {
    if (bytes != sizeof(T)) return refuse("%s: %zu bytes given, the attribute has %zu", what, bytes, sizeof(T));
    memcpy(out, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

// ---- handles, descriptors, layouts, preferences ---------------------------------------------------------

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new EmuLtHandle{1};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h || !h->alive) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->alive = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale) {
    Lock l;
    count_call("cublasLtMatmulDescCreate");
    *desc = new EmuLtDesc{compute, scale, {CUBLAS_OP_N, CUBLAS_OP_N}, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, 0, -1, -1};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t bytes) {
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return get(&d->op[0], buf, bytes, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return get(&d->op[1], buf, bytes, "TRANSB");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get(&d->epilogue, buf, bytes, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return get(&d->bias, buf, bytes, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return get(&d->aux, buf, bytes, "EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return get(&d->aux_ld, buf, bytes, "EPILOGUE_AUX_LD");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return get(&d->aux_stride, buf, bytes, "AUX_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return get(&d->bias_type, buf, bytes, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return get(&d->aux_type, buf, bytes, "AUX_DATA_TYPE");
    }
    return refuse("matmul descriptor attribute %d is not emulated", (int)attr);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (type != CUDA_R_16BF && type != CUDA_R_16F && type != CUDA_R_32F)
        return refuse("layout type %d is not emulated", (int)type);
    if (ld < (int64_t)rows) return refuse("layout of %llu x %llu with leading dimension %lld, below its rows",
                                          (unsigned long long)rows, (unsigned long long)cols, (long long)ld);
    *l = new EmuLtLayout{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t bytes) {
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return get(&l->batch, buf, bytes, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return get(&l->stride, buf, bytes, "STRIDED_BATCH_OFFSET");
    default: return refuse("layout attribute %d is not emulated", (int)attr);
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new EmuLtPref{0, {256, 256, 256, 256}};  // cuBLASLt's default promise: 256-byte alignment
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t bytes) {
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return get(&p->max_workspace, buf, bytes, "MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return get(&p->align[0], buf, bytes, "MIN_ALIGNMENT_A");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return get(&p->align[1], buf, bytes, "MIN_ALIGNMENT_B");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return get(&p->align[2], buf, bytes, "MIN_ALIGNMENT_C");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return get(&p->align[3], buf, bytes, "MIN_ALIGNMENT_D");
    default: return refuse("preference attribute %d is not emulated", (int)attr);
    }
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}

}  // extern "C"

// ---- the problem ------------------------------------------------------------------------------------------

struct Problem {
    uint64_t m, n, k;
    int batch;
};

static bool has(cublasLtEpilogue_t e, int bit) { return ((int)e & bit) != 0; }
#define EPI_BIAS 4
#define EPI_GELU 32
#define EPI_DGELU 64
#define EPI_AUX 128
#define EPI_BGRAD 16

// `pointers`: the matmul itself, which needs the epilogue's pointers (the heuristic does not)
static cublasStatus_t check_problem(const EmuLtDesc *d, const EmuLtLayout *a, const EmuLtLayout *b,
                                    const EmuLtLayout *c, const EmuLtLayout *dl, Problem *p, bool pointers) {
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F)
        return refuse("compute type %d with scale type %d: only fp32 compute with fp32 scale is emulated",
                      (int)d->compute, (int)d->scale);
    if (a->type != b->type || (a->type != CUDA_R_16BF && a->type != CUDA_R_16F))
        return refuse("A is %s and B is %s: the emulated matmul takes bf16 or fp16 A and B, the same",
                      type_name(a->type), type_name(b->type));
    if (c->type != CUDA_R_32F && c->type != a->type)
        return refuse("A and B are %s but C is %s", type_name(a->type), type_name(c->type));
    if (c->type != dl->type) return refuse("C is %s but D is %s", type_name(c->type), type_name(dl->type));
    uint64_t m = dl->rows, n = dl->cols;
    bool ta = d->op[0] == CUBLAS_OP_T, tb = d->op[1] == CUBLAS_OP_T;
    uint64_t a_rows = ta ? a->cols : a->rows, k = ta ? a->rows : a->cols;
    uint64_t b_rows = tb ? b->cols : b->rows, b_cols = tb ? b->rows : b->cols;
    if (a_rows != m)
        return refuse("op(A) has %llu rows (A stored %llu x %llu, %s) but D has %llu", (unsigned long long)a_rows,
                      (unsigned long long)a->rows, (unsigned long long)a->cols, ta ? "transposed" : "as is",
                      (unsigned long long)m);
    if (b_rows != k || b_cols != n)
        return refuse("op(B) is %llu x %llu (B stored %llu x %llu, %s) but must be k x n = %llu x %llu",
                      (unsigned long long)b_rows, (unsigned long long)b_cols, (unsigned long long)b->rows,
                      (unsigned long long)b->cols, tb ? "transposed" : "as is", (unsigned long long)k,
                      (unsigned long long)n);
    if (c->rows != m || c->cols != n) return refuse("C is %llu x %llu but D is %llu x %llu", (unsigned long long)c->rows,
                                                    (unsigned long long)c->cols, (unsigned long long)m, (unsigned long long)n);
    if (a->batch != dl->batch || b->batch != dl->batch || c->batch != dl->batch)
        return refuse("batch counts differ: A %d, B %d, C %d, D %d", a->batch, b->batch, c->batch, dl->batch);
    if (dl->batch > 1 && dl->stride < dl->ld * (int64_t)n)
        return refuse("D's batches overlap: stride %lld below ld x cols = %lld", (long long)dl->stride,
                      (long long)(dl->ld * (int64_t)n));
    int e = (int)d->epilogue;
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_AUX: case CUBLASLT_EPILOGUE_GELU_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU: case CUBLASLT_EPILOGUE_DGELU_BGRAD: case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB: break;
    default: return refuse("epilogue %d is not emulated", e);
    }
    if ((has(d->epilogue, EPI_BIAS) || e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADB ||
         e == CUBLASLT_EPILOGUE_BGRADA) && pointers && !d->bias)
        return refuse("epilogue %d needs the bias pointer", e);
    if (has(d->epilogue, EPI_AUX) && ((pointers && !d->aux) || d->aux_ld < (int64_t)m))
        return refuse("epilogue %d needs an aux pointer and an aux leading dimension of at least %llu", e,
                      (unsigned long long)m);
    if (has(d->epilogue, EPI_AUX) && d->aux_ld % 8 != 0)
        return refuse("epilogue %d: the GELU aux leading dimension %lld is not a multiple of 8", e,
                      (long long)d->aux_ld);
    if ((has(d->epilogue, EPI_BIAS) || has(d->epilogue, EPI_AUX) || has(d->epilogue, EPI_BGRAD)) && dl->batch > 1)
        return refuse("epilogue %d on a batched matmul is not emulated", e);
    *p = Problem{m, n, k, dl->batch};
    return CUBLAS_STATUS_SUCCESS;
}

static uint64_t problem_key(const EmuLtDesc *d, const Problem &p) {
    uint64_t h = 1469598103934665603ull;
    uint64_t parts[] = {p.m, p.n, p.k, (uint64_t)p.batch, (uint64_t)d->op[0], (uint64_t)d->op[1], (uint64_t)d->epilogue};
    for (uint64_t x : parts) h = (h ^ x) * 1099511628211ull;
    return h;
}

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                         cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t *results, int *returned) {
    Lock l;
    count_call("cublasLtMatmulAlgoGetHeuristic");
    *returned = 0;
    if (!h || !h->alive) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested < 1) return refuse("asked for %d algorithms", requested);
    Problem p;
    cublasStatus_t st = check_problem(desc, a, b, c, d, &p, false);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    memset(results, 0, sizeof *results);
    AlgoData data;
    memcpy(data.align, pref->align, sizeof data.align);
    data.epilogue_align[0] = pointer_alignment(desc->bias);
    data.epilogue_align[1] = pointer_alignment(desc->aux);
    data.problem = problem_key(desc, p);
    static_assert(sizeof data <= sizeof results->algo.data, "algorithm record");
    memcpy(results->algo.data, &data, sizeof data);
    results->workspaceSize = 0;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- operands ----------------------------------------------------------------------------------------------

// an operand's elements, batch by batch, inside one live device allocation
static cublasStatus_t check_operand(const char *name, const void *ptr, const EmuLtLayout *l, uint32_t promised) {
    if (!ptr) return refuse("%s is NULL", name);
    size_t es = type_bytes(l->type);
    const char *first = (const char *)ptr;
    size_t last_batch = (size_t)(l->batch - 1) * (size_t)l->stride * es;
    size_t extent = last_batch + ((l->cols - 1) * (size_t)l->ld + l->rows) * es;
    const Alloc *al = find_alloc(first);
    if (!al || al->kind != MEM_DEVICE || al->freed || first < al->ptr || first + extent > al->ptr + al->bytes)
        return refuse("%s (%llu x %llu, ld %lld, %d batches %lld apart, %s at %p) is not inside one live device "
                      "allocation%s", name, (unsigned long long)l->rows, (unsigned long long)l->cols, (long long)l->ld,
                      l->batch, (long long)l->stride, type_name(l->type), ptr,
                      al && !al->freed ? " (it runs past the end)" : "");
    for (int i = 0; i < l->batch; i++) {
        uintptr_t at = (uintptr_t)first + (size_t)i * (size_t)l->stride * es;
        if (at % promised)
            return refuse("%s of batch %d is at %p, not aligned to the %u bytes promised to the heuristic "
                          "(MIN_ALIGNMENT preference): the kernel it picked may fault or misread",
                          name, i, (void *)at, promised);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// The epilogue's vector (bias or bias gradient: D's rows, or for BGRADB its
// columns) and aux matrix (D's shape, rows aux_ld apart): inside one live
// device allocation, and as aligned as their pointers were at the heuristic.
static cublasStatus_t check_epilogue_operands(const EmuLtDesc *desc, const EmuLtLayout *d, const Problem &p,
                                              const uint32_t promised[2]) {
    int e = (int)desc->epilogue;
    const char *names[2] = {"the epilogue's bias vector", "the epilogue's aux matrix"};
    const void *ptrs[2] = {desc->bias, desc->aux};
    bool used[2] = {has(desc->epilogue, EPI_BIAS) || has(desc->epilogue, EPI_BGRAD) ||
                        e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB,
                    has(desc->epilogue, EPI_AUX)};
    int bias_type = desc->bias_type >= 0 ? desc->bias_type : d->type;
    int aux_type = desc->aux_type >= 0 ? desc->aux_type : d->type;
    uint64_t len = e == CUBLASLT_EPILOGUE_BGRADB ? p.n : p.m;
    EmuLtLayout lays[2] = {{(cudaDataType_t)bias_type, len, 1, (int64_t)len, 1, 0},
                           {(cudaDataType_t)aux_type, p.m, p.n, desc->aux_ld, 1, 0}};
    for (int i = 0; i < 2; i++) {
        if (!used[i]) continue;
        cublasStatus_t st = check_operand(names[i], ptrs[i], &lays[i], 1);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
        if ((uintptr_t)ptrs[i] % promised[i])
            return refuse("%s is at %p, less aligned than the %u bytes its pointer had when the heuristic was "
                          "asked (cuBLASLt reads an epilogue pointer's alignment from its value)", names[i],
                          ptrs[i], promised[i]);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static float load(const void *base, int type, size_t i) {
    if (type == CUDA_R_32F) return ((const float *)base)[i];
    if (type == CUDA_R_16F) {
        _Float16 h;
        memcpy(&h, (const uint16_t *)base + i, sizeof h);
        return (float)h;
    }
    uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void store(void *base, int type, size_t i, float v) {
    if (type == CUDA_R_32F) {
        ((float *)base)[i] = v;
        return;
    }
    if (type == CUDA_R_16F) {  // round to nearest even; the device's canonical NaN
        _Float16 h = (_Float16)v;
        uint16_t bits;
        memcpy(&bits, &h, sizeof bits);
        ((uint16_t *)base)[i] = v != v ? (uint16_t)0x7fff : bits;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    uint16_t h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = 0x7fff;  // the device's canonical NaN
    else h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    ((uint16_t *)base)[i] = h;
}

// an operand's batch widened to fp32, packed (leading dimension = rows)
static std::vector<float> widen(const void *ptr, const EmuLtLayout *l, int batch) {
    std::vector<float> out(l->rows * l->cols);
    size_t base = (size_t)batch * (size_t)l->stride;
    for (uint64_t j = 0; j < l->cols; j++)
        for (uint64_t i = 0; i < l->rows; i++) out[i + j * l->rows] = load(ptr, l->type, base + i + j * (size_t)l->ld);
    return out;
}

static float gelu(float x) {
    const float s = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(s * (x + 0.044715f * x * x * x)));
}
static float gelu_grad(float x) {
    const float s = 0.7978845608028654f;
    float t = tanhf(s * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * s * (1.0f + 3.0f * 0.044715f * x * x);
}

struct Matmul {
    EmuLtDesc desc;
    EmuLtLayout a, b, c, d;
    const void *A, *B, *C;
    void *D;
    float alpha, beta;
    Problem p;
};

static void run_matmul(const Matmul &mm) {
    const Problem &p = mm.p;
    int epi = (int)mm.desc.epilogue;
    int bias_type = mm.desc.bias_type >= 0 ? mm.desc.bias_type : mm.d.type;
    int aux_type = mm.desc.aux_type >= 0 ? mm.desc.aux_type : mm.d.type;
    for (int bt = 0; bt < p.batch; bt++) {
        std::vector<float> A = widen(mm.A, &mm.a, bt), B = widen(mm.B, &mm.b, bt), acc(p.m * p.n, 0.0f);
        if (p.k > 0)
            cblas_sgemm(CblasColMajor, mm.desc.op[0] == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                        mm.desc.op[1] == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, (int)p.m, (int)p.n, (int)p.k,
                        mm.alpha, A.data(), (int)mm.a.rows, B.data(), (int)mm.b.rows, 0.0f, acc.data(), (int)p.m);
        size_t cbase = (size_t)bt * mm.c.stride, dbase = (size_t)bt * mm.d.stride;
        std::vector<float> bgrad(epi == CUBLASLT_EPILOGUE_BGRADA ? p.m : epi == CUBLASLT_EPILOGUE_BGRADB ? p.n : p.m, 0.0f);
        for (uint64_t j = 0; j < p.n; j++) {
            for (uint64_t i = 0; i < p.m; i++) {
                float v = acc[i + j * p.m];
                if (mm.beta != 0.0f) v += mm.beta * load(mm.C, mm.c.type, cbase + i + j * (size_t)mm.c.ld);
                if (has(mm.desc.epilogue, EPI_BIAS)) v += load(mm.desc.bias, bias_type, i);
                if (has(mm.desc.epilogue, EPI_GELU)) {
                    if (has(mm.desc.epilogue, EPI_AUX)) store(mm.desc.aux, aux_type, i + j * (size_t)mm.desc.aux_ld, v);
                    v = gelu(v);
                } else if (has(mm.desc.epilogue, EPI_DGELU)) {
                    v *= gelu_grad(load(mm.desc.aux, aux_type, i + j * (size_t)mm.desc.aux_ld));
                }
                store(mm.D, mm.d.type, dbase + i + j * (size_t)mm.d.ld, v);
                if (epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) bgrad[i] += v;
            }
        }
        // bias gradients: sums of an input over the k dimension (BGRADA: A's rows, BGRADB: B's columns)
        if (epi == CUBLASLT_EPILOGUE_BGRADA)
            for (uint64_t i = 0; i < p.m; i++)
                for (uint64_t kk = 0; kk < p.k; kk++)
                    bgrad[i] += mm.desc.op[0] == CUBLAS_OP_T ? A[kk + i * mm.a.rows] : A[i + kk * mm.a.rows];
        if (epi == CUBLASLT_EPILOGUE_BGRADB)
            for (uint64_t j = 0; j < p.n; j++)
                for (uint64_t kk = 0; kk < p.k; kk++)
                    bgrad[j] += mm.desc.op[1] == CUBLAS_OP_T ? B[j + kk * mm.b.rows] : B[kk + j * mm.b.rows];
        if (epi == CUBLASLT_EPILOGUE_DGELU_BGRAD || epi == CUBLASLT_EPILOGUE_BGRADA || epi == CUBLASLT_EPILOGUE_BGRADB)
            for (size_t i = 0; i < bgrad.size(); i++) store((void *)mm.desc.bias, bias_type, i, bgrad[i]);
    }
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t a, const void *B,
                                         cublasLtMatrixLayout_t b, const void *beta, const void *C,
                                         cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
    Lock l;
    count_call("cublasLtMatmul");
    if (!h || !h->alive) return CUBLAS_STATUS_NOT_INITIALIZED;
    Problem p;
    cublasStatus_t st = check_problem(desc, a, b, c, d, &p, true);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    AlgoData data;
    uint32_t align[4] = {256, 256, 256, 256}, epilogue_align[2] = {16, 16};
    if (algo) {
        memcpy(&data, algo->data, sizeof data);
        if (data.problem != problem_key(desc, p))
            return refuse("the algorithm was chosen by the heuristic for another problem (shape, transposes, "
                          "batch or epilogue); ask the heuristic for this one");
        memcpy(align, data.align, sizeof align);
        memcpy(epilogue_align, data.epilogue_align, sizeof epilogue_align);
    }
    const char *names[4] = {"A", "B", "C", "D"};
    const void *ptrs[4] = {A, B, C, D};
    const EmuLtLayout *lays[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) {
        if (i == 2 && *(const float *)beta == 0.0f && !C) continue;
        st = check_operand(names[i], ptrs[i], lays[i], align[i]);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    st = check_epilogue_operands(desc, d, p, epilogue_align);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (workspace_bytes > 0 && !workspace) return refuse("workspace of %zu bytes at NULL", workspace_bytes);
    Matmul mm{*desc, *a, *b, *c, *d, A, B, C, D, *(const float *)alpha, *(const float *)beta, p};
    char what[160];
    snprintf(what, sizeof what, "cuBLASLt matmul m=%llu n=%llu k=%llu batch=%d", (unsigned long long)p.m,
             (unsigned long long)p.n, (unsigned long long)p.k, p.batch);
    OpRef op = std::make_shared<Op>();
    op->what = what;
    op->run = [mm]() { run_matmul(mm); };
    enqueue(stream, op);
    return CUBLAS_STATUS_SUCCESS;
}
