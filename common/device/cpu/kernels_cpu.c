// kernels_cpu.c: the cpu kernel table (kernels.h) and its element-wise and
// row-wise kernels: encoder, layernorm, GELU, residual, softmax-cross-entropy,
// and the bf16 gradient/optimizer ops. Activations are fp32 here. The GEMM
// kernels live in kernels_cpu_matmul.c and kernels_cpu_attention.c, those of
// tensor parallelism in kernels_cpu_tp.c.
//
// Determinism: every sum runs in a fixed order that depends neither on the
// thread count nor on the vector width of the build (row sums inside one
// row, in SUM_LANES partial sums; column sums per column chunk, rows in
// order; sum_squares over fixed blocks), so the same input gives the same
// bits.
#include <limits.h>
#include <math.h>
#include <string.h>
#include "cpu_adam.h"
#include "half_rows.h"
#include "kernels_cpu.h"

#define COL_CHUNK 64       // columns per OpenMP task in the column-sum kernels
#define SUMSQ_BLOCKS 256   // fixed partition of sum_squares, independent of threads

#define HALF_BLOCK 1024     // elements per OpenMP task in the 16-bit row kernels

// The 16-bit kernels run over HALF_BLOCK blocks, each converted through
// half_rows.h in the run's format (d->half) on the path chosen at init.
void half_to_f32_cpu(Device *d, float *dst, const bf16 *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += HALF_BLOCK)
        half_to_f32_row(d->half_path, d->half, dst + i, src + i, n - i < HALF_BLOCK ? n - i : HALF_BLOCK);
}

static void f32_to_half_cpu(Device *d, bf16 *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += HALF_BLOCK)
        f32_to_half_row(d->half_path, d->half, dst + i, src + i, n - i < HALF_BLOCK ? n - i : HALF_BLOCK);
}

// ---- encoder ----------------------------------------------------------------

static void encoder_forward(Device *d, act *out_, const int32_t *tokens, const bf16 *wte,
                            const bf16 *wpe, int B, int T, int C) {
    float *out = out_;  // (B,T,C)
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const bf16 *te = wte + (size_t)tokens[bt] * C;  // (C)
        const bf16 *pe = wpe + (size_t)(bt % T) * C;    // (C)
        float *o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = half_to_f32(d->half, te[c]) + half_to_f32(d->half, pe[c]);
    }
}

// dwte rows [begin, begin + rows) += dout summed by token: a task per bucket
// and column chunk adds the bucket's positions in increasing order, so no
// two tasks write one element and the bits do not depend on the threads.
void wte_backward_by_token_cpu(float *dwte, const float *dout, const int32_t *tokens, const TokenBuckets *tb,
                               int BT, int C, int begin, int rows) {
    int chunks = (C + COL_CHUNK - 1) / COL_CHUNK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int k = 0; k < tb->buckets; k++)
        for (int chunk = 0; chunk < chunks; chunk++) {
            int first = tb->start[k], end = token_bucket_end(tb->start, tb->buckets, k, BT);
            int row = tokens[tb->order[first]] - begin, c0 = chunk * COL_CHUNK;
            int n = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
            if (row < 0 || row >= rows) continue;
            float *te = dwte + (size_t)row * C + c0;
            for (int i = first; i < end; i++) {
                const float *g = dout + (size_t)tb->order[i] * C + c0;
                for (int j = 0; j < n; j++) te[j] += g[j];
            }
        }
}

// dwpe (T,C) += dout summed over the batch: tasks own column chunks, b in order
void wpe_backward_cpu(float *dwpe, const float *dout, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COL_CHUNK) {
        int n = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
        for (int bt = 0; bt < B * T; bt++) {
            const float *g = dout + (size_t)bt * C + c0;
            float *pe = dwpe + (size_t)(bt % T) * C + c0;
            for (int j = 0; j < n; j++) pe[j] += g[j];
        }
    }
}

static void encoder_backward(Device *d, float *dwte, float *dwpe, const act *dout, const int32_t *tokens,
                             const TokenBuckets *tb, int B, int T, int C) {
    wte_backward_by_token_cpu(dwte, dout, tokens, tb, B * T, C, 0, INT_MAX);
    wpe_backward_cpu(dwpe, dout, B, T, C);
}

// ---- layernorm (Ba et al. 2016; GPT-2 puts it before each sublayer) ------------
// y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps),  var biased (1/C)

static void layernorm_forward(Device *d, act *out_, float *mean, float *rstd, const act *inp_,
                              const bf16 *w, const bf16 *b, int BT, int C) {
    float *out = out_;        // (BT,C)
    const float *inp = inp_;  // (BT,C)
    float *wf = device_scratch(d, 2 * (size_t)C * sizeof(float));  // w, b as fp32 (C) each
    float *bf = wf + C;
    half_to_f32_row(d->half_path, d->half, wf, w, C);
    half_to_f32_row(d->half_path, d->half, bf, b, C);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *x = inp + (size_t)r * C;
        float *y = out + (size_t)r * C;
        float m = lanes_sum(x, C) / C;
        float var = lanes_sum_sq_dev(x, m, C);  // two passes: no cancellation in E[x^2] - m^2
        float s = 1.0f / sqrtf(var / C + 1e-5f);
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * wf[c] + bf[c];
        mean[r] = m;
        rstd[r] = s;
    }
}

// With xhat = (x - mean) * rstd and g = dout * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))      (+= into dinp)
//   dw += sum over rows of dout * xhat,   db += sum over rows of dout
static void layernorm_backward(Device *d, act *dinp_, float *dw, float *db, const act *dout_,
                               const act *inp_, const bf16 *w, const float *mean,
                               const float *rstd, int BT, int C) {
    float *dinp = dinp_;        // (BT,C)
    const float *dout = dout_;  // (BT,C)
    const float *inp = inp_;    // (BT,C)
    float *wf = device_scratch(d, (size_t)C * sizeof(float));
    half_to_f32_row(d->half_path, d->half, wf, w, C);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *x = inp + (size_t)r * C, *g = dout + (size_t)r * C;
        float *dx = dinp + (size_t)r * C;
        float m = mean[r], s = rstd[r];
        // sum g w and sum g w xhat, each in SUM_LANES partial sums (kernels_cpu.h)
        float accg[SUM_LANES] = {0}, accgx[SUM_LANES] = {0};
        int c = 0;
        for (; c + SUM_LANES <= C; c += SUM_LANES)
#pragma omp simd
            for (int l = 0; l < SUM_LANES; l++) {
                float gw = g[c + l] * wf[c + l];
                accg[l] += gw;
                accgx[l] += gw * (x[c + l] - m) * s;
            }
        for (int l = 0; c + l < C; l++) {
            float gw = g[c + l] * wf[c + l];
            accg[l] += gw;
            accgx[l] += gw * (x[c + l] - m) * s;
        }
        float gsum = fold_lanes(accg), gxsum = fold_lanes(accgx);
        float gmean = gsum / C, gxmean = gxsum / C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            dx[c] += s * (g[c] * wf[c] - gmean - (x[c] - m) * s * gxmean);
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += COL_CHUNK) {
        int n = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
        float accw[COL_CHUNK] = {0}, accb[COL_CHUNK] = {0};
        for (int r = 0; r < BT; r++) {
            const float *x = inp + (size_t)r * C + c0, *g = dout + (size_t)r * C + c0;
            float m = mean[r], s = rstd[r];
            for (int j = 0; j < n; j++) {
                accw[j] += g[j] * (x[j] - m) * s;
                accb[j] += g[j];
            }
        }
        for (int j = 0; j < n; j++) {
            dw[c0 + j] += accw[j];
            db[c0 + j] += accb[j];
        }
    }
}

// ---- GELU and residual ------------------------------------------------------------

static void gelu_forward(Device *d, act *out_, const act *inp_, size_t n) {
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gelu_f32(inp[i]);
}

static void gelu_backward(Device *d, act *dinp_, const act *inp_, const act *dout_, size_t n) {
    float *dinp = dinp_;
    const float *inp = inp_, *dout = dout_;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = gelu_grad_f32(inp[i]) * dout[i];
}

// The fused ops of kernels.h: on the cpu the two kernels one after the other,
// the same bits as when the model called them itself.
static void matmul_gelu_forward(Device *d, act *out, act *pre, const act *inp, const bf16 *w,
                                const bf16 *bias, int BT, int C, int OC) {
    matmul_forward_cpu(d, pre, inp, w, bias, BT, C, OC, OC);
    gelu_forward(d, out, pre, (size_t)BT * OC);
}

static void gelu_matmul_backward(Device *d, act *dpre, float *dw, float *dbias, const act *dout,
                                 const act *inp, const act *pre, const bf16 *w, int BT, int C, int OC) {
    matmul_backward_cpu(d, dpre, dw, dbias, dout, inp, w, BT, C, OC, OC);
    gelu_backward(d, dpre, pre, dpre, (size_t)BT * C);
}

static void residual_forward(Device *d, act *out_, const act *a_, const act *b_, size_t n) {
    float *out = out_;
    const float *a = a_, *b = b_;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// The cpu computes in fp32 from caches: two passes cost it nothing worth fusing.
static void residual_layernorm_forward(Device *d, act *res, act *out, float *mean, float *rstd, const act *a,
                                       const act *b, const bf16 *w, const bf16 *bias, int BT, int C) {
    residual_forward(d, res, a, b, (size_t)BT * C);
    layernorm_forward(d, out, mean, rstd, res, w, bias, BT, C);
}

// ---- softmax + cross-entropy ----------------------------------------------------
// loss = logsumexp(z) - z[target];  dloss/dz = softmax(z) - onehot(target)
// The row maximum is subtracted before exp, so exp never overflows.

static void softmax_crossentropy(Device *d, float *losses, act *logits_, const int32_t *targets,
                                 int BT, int V, int ld, float dloss_scale) {
    float *logits = logits_;  // (BT,ld): V tokens, then wte's padding rows
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float *z = logits + (size_t)r * ld;
        float zt = z[targets[r]];
        float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
        for (int i = 0; i < V; i++) maxv = z[i] > maxv ? z[i] : maxv;
        float sum = 0.0f;
        if (dloss_scale != 0.0f) {
            // keep exp(z - max) in place; the gradient pass only scales it
            for (int i = 0; i < V; i++) {
                z[i] = expf(z[i] - maxv);
                sum += z[i];
            }
            float k = dloss_scale / sum;
#pragma omp simd
            for (int i = 0; i < V; i++) z[i] *= k;
            z[targets[r]] -= dloss_scale;
            for (int i = V; i < ld; i++) z[i] = 0.0f;  // padding rows of wte get no gradient
        } else {
            for (int i = 0; i < V; i++) sum += expf(z[i] - maxv);
        }
        losses[r] = crossentropy_f32(sum, maxv, zt);
    }
}

// ---- 16-bit gradients and the optimizer -------------------------------------------

// dst = half(dst + src), each element added in fp32 and rounded once
static void grad_to_bf16(Device *d, bf16 *dst, const float *src, size_t n, int accumulate) {
    if (!accumulate) {
        f32_to_half_cpu(d, dst, src, n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t k = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        float sum[HALF_BLOCK];
        half_to_f32_row(d->half_path, d->half, sum, dst + i, k);
        for (size_t j = 0; j < k; j++) sum[j] += src[i + j];
        f32_to_half_row(d->half_path, d->half, dst + i, sum, k);
    }
}

static void add_bf16(Device *d, bf16 *dst, const bf16 *src, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t k = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        float sum[HALF_BLOCK], add[HALF_BLOCK];
        half_to_f32_row(d->half_path, d->half, sum, dst + i, k);
        half_to_f32_row(d->half_path, d->half, add, src + i, k);
        for (size_t j = 0; j < k; j++) sum[j] += add[j];
        f32_to_half_row(d->half_path, d->half, dst + i, sum, k);
    }
}

static void accumulate_f32(Device *d, float *acc, const float *g, size_t n, int accumulate) {
    if (!accumulate) {
        memcpy(acc, g, n * sizeof(float));
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] = acc[i] + g[i];
}

static void accumulate_half_f32(Device *d, float *acc, const bf16 *h, size_t n, int accumulate) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t k = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        if (!accumulate) {
            half_to_f32_row(d->half_path, d->half, acc + i, h + i, k);
            continue;
        }
        float x[HALF_BLOCK];
        half_to_f32_row(d->half_path, d->half, x, h + i, k);
        for (size_t j = 0; j < k; j++) acc[i + j] = acc[i + j] + x[j];
    }
}

// Sum over SUMSQ_BLOCKS fixed index blocks, each in double and in index order,
// then the block sums in block order: the result does not depend on threads.
static double sum_squares_bf16(Device *d, const bf16 *x, size_t n) {
    double part[SUMSQ_BLOCKS];
    size_t per = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < SUMSQ_BLOCKS; blk++) {
        size_t lo = blk * per, hi = lo + per < n ? lo + per : n;
        double s = 0.0;
        float v[HALF_BLOCK];
        for (size_t i = lo; i < hi; i += HALF_BLOCK) {
            size_t k = hi - i < HALF_BLOCK ? hi - i : HALF_BLOCK;
            half_to_f32_row(d->half_path, d->half, v, x + i, k);
            for (size_t j = 0; j < k; j++) s += (double)v[j] * v[j];
        }
        part[blk] = s;
    }
    double total = 0.0;
    for (int blk = 0; blk < SUMSQ_BLOCKS; blk++) total += part[blk];
    return total;
}

// AdamW is the CPU Adam (cpu_adam.h) on the widest SIMD path this CPU has:
// the bits of adamw_element (elementwise.h), the formula the cuda kernel uses,
// on every path and thread count.
static void adamw(Device *d, float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                  size_t n, const AdamWStep *s) {
    cpu_adam_step(cpu_adam_best_path(), d->threads, master, m, v, grad, param, n, s);
}

static size_t max_bytes(size_t a, size_t b) { return a > b ? a : b; }

// The requests of a step: layernorm's w and b in fp32 (2C), each GEMM's
// weights and bias in fp32 (qkv, proj, fc, fcproj, the tied head; a tp
// rank's column- and row-parallel parts), and the attention backward's
// per-thread tile.
static size_t scratch_bytes(int threads, int B, int T, int C, int NH, int V, int tp, int flash) {
    (void)B, (void)NH;
    size_t s = 2 * (size_t)C * sizeof(float);
    int Cp = C / tp, F = 4 * C / tp;
    const int gemm[5][2] = {{C, 3 * Cp}, {Cp, C}, {C, F}, {F, C}, {C, V}};  // (C in, OC out)
    for (int i = 0; i < 5; i++) s = max_bytes(s, matmul_cpu_scratch_bytes(gemm[i][0], gemm[i][1]));
    return max_bytes(s, flash ? flash_cpu_scratch_bytes(threads, T) : attention_cpu_scratch_bytes(threads, T));
}

const KernelOps kernels_cpu = {
    .encoder_forward = encoder_forward,
    .encoder_backward = encoder_backward,
    .layernorm_forward = layernorm_forward,
    .layernorm_backward = layernorm_backward,
    .matmul_forward = matmul_forward_cpu,
    .matmul_backward = matmul_backward_cpu,
    .attention_forward = attention_forward_cpu,
    .attention_backward = attention_backward_cpu,
    .flash_attention_forward = flash_attention_forward_cpu,
    .flash_attention_backward = flash_attention_backward_cpu,
    .flash_block_forward = flash_block_forward_cpu,
    .flash_block_backward = flash_block_backward_cpu,
    .matmul_gelu_forward = matmul_gelu_forward,
    .gelu_matmul_backward = gelu_matmul_backward,
    .gelu_forward = gelu_forward,
    .gelu_backward = gelu_backward,
    .residual_forward = residual_forward,
    .residual_layernorm_forward = residual_layernorm_forward,
    .softmax_crossentropy = softmax_crossentropy,
    .bias_add = bias_add_cpu,
    .embedding_part_forward = embedding_part_forward_cpu,
    .embedding_part_backward = embedding_part_backward_cpu,
    .crossentropy_part_max = crossentropy_part_max_cpu,
    .crossentropy_part_sums = crossentropy_part_sums_cpu,
    .crossentropy_part_finish = crossentropy_part_finish_cpu,
    .grad_to_bf16 = grad_to_bf16,
    .add_bf16 = add_bf16,
    .accumulate_f32 = accumulate_f32,
    .accumulate_half_f32 = accumulate_half_f32,
    .sum_squares_bf16 = sum_squares_bf16,
    .adamw = adamw,
    .f32_to_half = f32_to_half_cpu,
    .half_to_f32 = half_to_f32_cpu,
    .quantize_half = quantize_half_cpu,
    .quantize_f32 = quantize_f32_cpu,
    .dequantize_half = dequantize_half_cpu,
    .dequantize_f32 = dequantize_f32_cpu,
    .scratch_bytes = scratch_bytes,
};
