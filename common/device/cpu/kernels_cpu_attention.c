// kernels_cpu_attention.c: causal multi-head self-attention on the cpu device
// (Vaswani et al. 2017, GPT-2's masked variant). Per (batch, head):
//   S = Q K^T / sqrt(hs)          (T,T)   sgemm
//   P = softmax(S) with s > t masked       row-wise, saved in att
//   Y = P V                        (T,hs)  sgemm
// q, k, v are column blocks of qkv (B,T,3C): head h of q starts at
// qkv + b*T*3C + h*hs, k at +C, v at +2C, all with row stride 3C, so sgemm's
// leading dimensions read them in place without a permute.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include "kernels_cpu.h"

// P[t,:] = softmax(S[t, 0..t]), zero for s > t (the causal mask). In place.
static void causal_softmax_row(float *row, int t, int T) {
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int s = 0; s <= t; s++) maxv = row[s] > maxv ? row[s] : maxv;
    float sum = 0.0f;
    for (int s = 0; s <= t; s++) {
        row[s] = expf(row[s] - maxv);
        sum += row[s];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int s = 0; s <= t; s++) row[s] *= inv;
    for (int s = t + 1; s < T; s++) row[s] = 0.0f;
}

// One head: q, k, v (T,hs) with row stride 3C; out (T,hs) with row stride C; att (T,T).
static void head_forward(float *out, float *att, const float *q, const float *k, const float *v,
                         int T, int C, int hs) {
    int ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    // att (T,T) = q (T,hs) @ k^T (hs,T) * scale
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, ld, k, ld, 0.0f, att,
                T);
    for (int t = 0; t < T; t++) causal_softmax_row(att + (size_t)t * T, t, T);
    // out (T,hs) = att (T,T) @ v (T,hs)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, att, T, v, ld, 0.0f, out,
                C);
}

void attention_forward_cpu(Device *d, act *out_, float *att, const act *qkv_, int B, int T, int C,
                           int NH) {
    float *out = out_;        // (B,T,C)
    const float *qkv = qkv_;  // (B,T,3C)
    int hs = C / NH;
    // heads are independent: one task per (b,h), its sgemms on the task's thread
#pragma omp parallel for schedule(static) if (blas_single_threaded())
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * 3 * C + h * hs;
        head_forward(out + (size_t)b * T * C + h * hs, att + (size_t)bh * T * T, q, q + C,
                     q + 2 * C, T, C, hs);
    }
}

// Softmax backward, row-wise, in place on dP:
//   dS[t,s] = P[t,s] (dP[t,s] - sum_u P[t,u] dP[t,u]),  zero for s > t.
static void softmax_backward_row(float *dp, const float *p, int t, int T) {
    float dot = lanes_dot(p, dp, t + 1);
#pragma omp simd
    for (int s = 0; s <= t; s++) dp[s] = p[s] * (dp[s] - dot);
    for (int s = t + 1; s < T; s++) dp[s] = 0.0f;
}

// One head. dq, dk, dv (T,hs) with row stride 3C are overwritten; datt (T,T) is scratch.
static void head_backward(float *dq, float *dk, float *dv, float *datt, const float *dout,
                          const float *q, const float *k, const float *v, const float *att, int T,
                          int C, int hs) {
    int ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    // dv (T,hs) = att^T (T,T) @ dout (T,hs)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, att, T, dout, C, 0.0f, dv,
                ld);
    // datt (T,T) = dout (T,hs) @ v^T (hs,T)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dout, C, v, ld, 0.0f, datt,
                T);
    for (int t = 0; t < T; t++)
        softmax_backward_row(datt + (size_t)t * T, att + (size_t)t * T, t, T);
    // dq (T,hs) = dS (T,T) @ k (T,hs) * scale;  dk (T,hs) = dS^T (T,T) @ q (T,hs) * scale
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, datt, T, k, ld, 0.0f,
                dq, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, datt, T, q, ld, 0.0f, dk,
                ld);
}

size_t attention_cpu_scratch_bytes(int threads, int T) { return (size_t)threads * T * T * sizeof(float); }

void attention_backward_cpu(Device *d, act *dqkv_, const act *dout_, const act *qkv_,
                            const float *att, int B, int T, int C, int NH) {
    float *dqkv = dqkv_;        // (B,T,3C)
    const float *dout = dout_;  // (B,T,C)
    const float *qkv = qkv_;    // (B,T,3C)
    int hs = C / NH;
    int nthreads = omp_get_max_threads();
    float *datt_all = device_scratch(d, (size_t)nthreads * T * T * sizeof(float));  // (threads,T,T)
#pragma omp parallel for schedule(static) if (blas_single_threaded())
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t off = (size_t)b * T * 3 * C + h * hs;
        float *datt = datt_all + (size_t)omp_get_thread_num() * T * T;
        head_backward(dqkv + off, dqkv + off + C, dqkv + off + 2 * C, datt,
                      dout + (size_t)b * T * C + h * hs, qkv + off, qkv + off + C,
                      qkv + off + 2 * C, att + (size_t)bh * T * T, T, C, hs);
    }
}
