// kernels_cpu_matmul.c: the linear layer on the cpu device, one OpenBLAS
// sgemm per product. Weights are stored bf16 (OC,C) and converted to fp32 in
// the kernel scratch right before the GEMM; sgemm's beta = 1 accumulates the
// weight gradient straight into the fp32 gradient buffer.
#include <cblas.h>
#include <omp.h>
#include <string.h>
#include "kernels_cpu.h"

// C (M,N) = alpha op(A) (M,K) @ op(B) (K,N) + beta C with the rows of C split
// over the OpenMP threads, each running a single-threaded sgemm on its block
// (blocks of 16 rows). The split is fixed for a thread count, so results
// repeat run to run; they may change in the last bits with the thread count
// (OpenBLAS's kernel for a block's edge rows rounds differently).
static void sgemm_rows(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *Cm, int ldc) {
#pragma omp parallel if (blas_single_threaded())
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int per = ((M + nt - 1) / nt + 15) / 16 * 16;
        int r0 = t * per, r1 = r0 + per < M ? r0 + per : M;
        // row r of op(A) is row r of A, or column r of A when transposed
        const float *Ar = transA ? A + r0 : A + (size_t)r0 * lda;
        if (r0 < r1)
            cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                        transB ? CblasTrans : CblasNoTrans, r1 - r0, N, K, alpha, Ar, lda, B, ldb,
                        beta, Cm + (size_t)r0 * ldc, ldc);
    }
}

// Columns per OpenMP task in the bias gradient: a chunk's running sums stay in
// registers and each column is summed over rows in row order, so dbias does
// not depend on the thread count.
#define DBIAS_COLS 64

void matmul_forward_cpu(Device *d, act *out_, const act *inp_, const bf16 *w, const bf16 *bias,
                        int BT, int C, int OC, int ldo) {
    float *out = out_;        // (BT,OC), rows ldo apart
    const float *inp = inp_;  // (BT,C)
    size_t wn = (size_t)OC * C;
    float *wf = device_scratch(d, (wn + OC) * sizeof(float));  // w as fp32 (OC,C), then bias (OC)
    float *bf = wf + wn;
    half_to_f32_cpu(d, wf, w, wn);
    float beta = 0.0f;
    if (bias) {
        // out starts as the bias broadcast over rows; the GEMM adds onto it (beta = 1)
        for (int o = 0; o < OC; o++) bf[o] = half_to_f32(d->half, bias[o]);
#pragma omp parallel for schedule(static)
        for (int r = 0; r < BT; r++) memcpy(out + (size_t)r * ldo, bf, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    // out (BT,OC) = inp (BT,C) @ w^T (C,OC) [+ out]
    sgemm_rows(0, 1, BT, OC, C, 1.0f, inp, C, wf, C, beta, out, ldo);
}

size_t matmul_cpu_scratch_bytes(int C, int OC) { return ((size_t)OC * C + (size_t)OC) * sizeof(float); }

// dbias (OC) += sum over rows of dout (BT,OC), rows ldo apart
static void bias_grad(float *dbias, const float *dout, int BT, int OC, int ldo) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < OC; c0 += DBIAS_COLS) {
        int n = OC - c0 < DBIAS_COLS ? OC - c0 : DBIAS_COLS;
        float acc[DBIAS_COLS] = {0};
        for (int r = 0; r < BT; r++) {
            const float *row = dout + (size_t)r * ldo + c0;
            for (int j = 0; j < n; j++) acc[j] += row[j];
        }
        for (int j = 0; j < n; j++) dbias[c0 + j] += acc[j];
    }
}

void matmul_backward_cpu(Device *d, act *dinp_, float *dw, float *dbias, const act *dout_,
                         const act *inp_, const bf16 *w, int BT, int C, int OC, int ldo) {
    float *dinp = dinp_;        // (BT,C)
    const float *dout = dout_;  // (BT,OC), rows ldo apart
    const float *inp = inp_;    // (BT,C)
    if (dinp) {
        size_t wn = (size_t)OC * C;
        float *wf = device_scratch(d, wn * sizeof(float));  // w as fp32 (OC,C)
        half_to_f32_cpu(d, wf, w, wn);
        // dinp (BT,C) = dout (BT,OC) @ w (OC,C)
        sgemm_rows(0, 0, BT, C, OC, 1.0f, dout, ldo, wf, C, 0.0f, dinp, C);
    }
    if (!dw) return;  // zero bubble's B: the weights' gradients are its W's
    // dw (OC,C) += dout^T (OC,BT) @ inp (BT,C)
    sgemm_rows(1, 0, OC, C, BT, 1.0f, dout, ldo, inp, C, 1.0f, dw, C);
    if (dbias) bias_grad(dbias, dout, BT, OC, ldo);
}
