// kernels_cuda.cu: the cuda kernel table (kernels.h) and its element-wise and
// row-wise kernels: encoder, GELU, residual, softmax-cross-entropy, and the
// bf16 gradient/optimizer ops. Activations are bf16, math is fp32 (the shared
// formulas of elementwise.h). The GEMM-based kernels live in
// kernels_cuda_matmul.cu and kernels_cuda_attention.cu, layernorm in
// kernels_cuda_layernorm.cu, those of tensor parallelism in
// kernels_cuda_tp.cu. Everything runs on the device's compute stream.
//
// Determinism: every sum runs in a fixed order, without atomics, so two runs
// give the same bits; the encoder's backward sums each wte row over its
// token's positions in increasing order (the buckets gpt_slot_tokens builds),
// as the cpu kernel does.
#include <limits.h>
#include "kernels_cuda.h"

namespace KERNELS_NS {

#define SUMSQ_BLOCKS 1024  // fixed grid of sum_squares: the sum order does not depend on the GPU

static cudaStream_t compute(Device *d) { return cuda_stream(d, STREAM_COMPUTE); }

// ---- encoder ------------------------------------------------------------------

// out (B,T,C) = wte[tokens] + wpe[t]
__global__ void __launch_bounds__(BLOCK) encoder_forward_kernel(floatX *out, const int32_t *tokens, const floatX *wte,
                                       const floatX *wpe, int T, int C, size_t n) {
    FOR_EACH_ELEMENT(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = to_floatX(to_f32(wte[(size_t)tokens[bt] * C + c]) + to_f32(wpe[(size_t)t * C + c]));
    }
}

// dwte rows [begin, begin + rows) += dout summed by token. Block (k, j) takes
// bucket k (one token) and channels [j WTE_CHANNELS, (j + 1) WTE_CHANNELS):
// a thread per channel adds the bucket's positions in increasing order, so
// no two threads write one element and every sum has the cpu kernel's order.
#define WTE_CHANNELS 128
__global__ void __launch_bounds__(WTE_CHANNELS) encoder_backward_wte_kernel(float *dwte, const floatX *dout,
                                            const int32_t *tokens, const int32_t *order, const int32_t *start,
                                            int buckets, int BT, int C, int begin, int rows) {
    int k = blockIdx.x, c = blockIdx.y * WTE_CHANNELS + threadIdx.x;
    int first = start[k], end = k + 1 < buckets ? start[k + 1] : BT;
    int row = tokens[order[first]] - begin;
    if (c >= C || row < 0 || row >= rows) return;
    float *w = dwte + (size_t)row * C + c;
    float s = *w;
    for (int i = first; i < end; i++) s += to_f32(dout[(size_t)order[i] * C + c]);
    *w = s;
}

// dwpe (T,C) += sum over the batch of dout; one thread per (t,c), b in order
__global__ void __launch_bounds__(BLOCK) encoder_backward_wpe_kernel(float *dwpe, const floatX *dout, int B, int T, int C) {
    size_t TC = (size_t)T * C;
    FOR_EACH_ELEMENT(i, TC) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += to_f32(dout[b * TC + i]);
        dwpe[i] += s;
    }
}

static void encoder_forward(Device *d, act *out, const int32_t *tokens, const bf16 *wte,
                            const bf16 *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<grid_for(n, BLOCK), BLOCK, 0, compute(d)>>>(
        (floatX *)out, tokens, (const floatX *)wte, (const floatX *)wpe, T, C, n);
    LAUNCH_CHECK();
}

void encoder_backward_wpe_cuda(Device *d, float *dwpe, const act *dout, int B, int T, int C) {
    encoder_backward_wpe_kernel<<<grid_for((size_t)T * C, BLOCK), BLOCK, 0, compute(d)>>>(
        dwpe, (const floatX *)dout, B, T, C);
    LAUNCH_CHECK();
}

void encoder_backward_wte_cuda(Device *d, float *dwte, const act *dout, const int32_t *tokens,
                               const TokenBuckets *tb, int BT, int C, int begin, int rows) {
    if (tb->buckets == 0) return;
    dim3 grid((unsigned)tb->buckets, (unsigned)ceil_div((size_t)C, WTE_CHANNELS));
    encoder_backward_wte_kernel<<<grid, WTE_CHANNELS, 0, compute(d)>>>(
        dwte, (const floatX *)dout, tokens, tb->order, tb->start, tb->buckets, BT, C, begin, rows);
    LAUNCH_CHECK();
}

static void encoder_backward(Device *d, float *dwte, float *dwpe, const act *dout, const int32_t *tokens,
                             const TokenBuckets *tb, int B, int T, int C) {
    encoder_backward_wte_cuda(d, dwte, dout, tokens, tb, B * T, C, 0, INT_MAX);
    encoder_backward_wpe_cuda(d, dwpe, dout, B, T, C);
}

// ---- GELU and residual ------------------------------------------------------------

__global__ void __launch_bounds__(BLOCK) gelu_forward_kernel(floatX *out, const floatX *inp, size_t n, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<floatX> x = load_pack(inp, base, n, wide), y;
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(gelu_f32(to_f32(x.x[k])));
        store_pack(out, base, n, wide, y);
    }
}

__global__ void __launch_bounds__(BLOCK) gelu_backward_kernel(floatX *dinp, const floatX *inp, const floatX *dout,
                                                              size_t n, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<floatX> x = load_pack(inp, base, n, wide), g = load_pack(dout, base, n, wide), y;
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(gelu_grad_f32(to_f32(x.x[k])) * to_f32(g.x[k]));
        store_pack(dinp, base, n, wide, y);
    }
}

__global__ void __launch_bounds__(BLOCK) residual_forward_kernel(floatX *out, const floatX *a, const floatX *b, size_t n,
                                                                 bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<floatX> x = load_pack(a, base, n, wide), r = load_pack(b, base, n, wide), y;
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(to_f32(x.x[k]) + to_f32(r.x[k]));
        store_pack(out, base, n, wide, y);
    }
}

void gelu_forward_cuda(Device *d, act *out, const act *inp, size_t n) {
    bool wide = aligned16(out) && aligned16(inp);
    gelu_forward_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>((floatX *)out, (const floatX *)inp, n, wide);
    LAUNCH_CHECK();
}

void gelu_backward_cuda(Device *d, act *dinp, const act *inp, const act *dout, size_t n) {
    bool wide = aligned16(dinp) && aligned16(inp) && aligned16(dout);
    gelu_backward_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>(
        (floatX *)dinp, (const floatX *)inp, (const floatX *)dout, n, wide);
    LAUNCH_CHECK();
}

static void residual_forward(Device *d, act *out, const act *a, const act *b, size_t n) {
    bool wide = aligned16(out) && aligned16(a) && aligned16(b);
    residual_forward_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>(
        (floatX *)out, (const floatX *)a, (const floatX *)b, n, wide);
    LAUNCH_CHECK();
}

// ---- softmax + cross-entropy ------------------------------------------------------
// loss = logsumexp(z) - z[target];  dloss/dz = (softmax(z) - onehot(target)) * scale
// One block per row. The max and the sum come from one pass over the row
// ("online softmax", Milakov & Gimelshein 2018): each thread keeps a running
// max m and the sum s of exp(z - m), rescaling s when m grows.

__global__ void __launch_bounds__(ROW_BLOCK_MAX) softmax_crossentropy_kernel(float *losses, floatX *logits, const int32_t *targets,
                                            int V, int ld, float dloss_scale) {
    floatX *z = logits + (size_t)blockIdx.x * ld;
    int target = targets[blockIdx.x];
    float zt = to_f32(z[target]);  // read before the gradient pass overwrites the row
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float x = to_f32(z[i]);
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    float maxv = block_max(m);
    float sum = block_sum(m == -INFINITY ? 0.0f : s * expf(m - maxv));
    if (threadIdx.x == 0) losses[blockIdx.x] = crossentropy_f32(sum, maxv, zt);
    if (dloss_scale == 0.0f) return;
    // every read of pass one finished before the barriers inside block_sum
    float k = dloss_scale / sum;
    for (int i = threadIdx.x; i < ld; i += blockDim.x) {
        float g = 0.0f;  // padding rows of wte get no gradient
        if (i < V) g = expf(to_f32(z[i]) - maxv) * k - (i == target ? dloss_scale : 0.0f);
        z[i] = to_floatX(g);
    }
}

void softmax_crossentropy_cuda(Device *d, float *losses, act *logits, const int32_t *targets,
                               int BT, int V, int ld, float dloss_scale) {
    int block = row_block(V);
    softmax_crossentropy_kernel<<<BT, block, 0, compute(d)>>>(losses, (floatX *)logits, targets, V,
                                                              ld, dloss_scale);
    LAUNCH_CHECK();
}

// ---- bf16 gradients and the optimizer ----------------------------------------------

__global__ void __launch_bounds__(BLOCK) grad_to_bf16_kernel(floatX *dst, const float *src, size_t n, int accumulate,
                                                             bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<float> g = load_pack(src, base, n, wide);
        Pack<floatX> y;
        if (accumulate) y = load_pack((const floatX *)dst, base, n, wide);
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(accumulate ? to_f32(y.x[k]) + g.x[k] : g.x[k]);
        store_pack(dst, base, n, wide, y);
    }
}

__global__ void __launch_bounds__(BLOCK) add_bf16_kernel(floatX *dst, const floatX *src, size_t n, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<floatX> y = load_pack((const floatX *)dst, base, n, wide), x = load_pack(src, base, n, wide);
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(to_f32(y.x[k]) + to_f32(x.x[k]));
        store_pack(dst, base, n, wide, y);
    }
}

// acc = (accumulate ? acc : 0) + g, in fp32 (the fp32 gradient accumulator)
__global__ void __launch_bounds__(BLOCK) accumulate_f32_kernel(float *acc, const float *g, size_t n, int accumulate,
                                                               bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<float> x = load_pack(g, base, n, wide);
        if (accumulate) {
            Pack<float> y = load_pack((const float *)acc, base, n, wide);
            for (int k = 0; k < PACK; k++) x.x[k] = y.x[k] + x.x[k];
        }
        store_pack(acc, base, n, wide, x);
    }
}

// acc = (accumulate ? acc : 0) + h, h 16-bit
__global__ void __launch_bounds__(BLOCK) accumulate_half_f32_kernel(float *acc, const floatX *h, size_t n,
                                                                    int accumulate, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<floatX> hx = load_pack(h, base, n, wide);
        Pack<float> x;
        for (int k = 0; k < PACK; k++) x.x[k] = to_f32(hx.x[k]);
        if (accumulate) {
            Pack<float> y = load_pack((const float *)acc, base, n, wide);
            for (int k = 0; k < PACK; k++) x.x[k] = y.x[k] + x.x[k];
        }
        store_pack(acc, base, n, wide, x);
    }
}

__global__ void __launch_bounds__(BLOCK) f32_to_half_kernel(floatX *dst, const float *src, size_t n, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<float> x = load_pack(src, base, n, wide);
        Pack<floatX> y;
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(x.x[k]);
        store_pack(dst, base, n, wide, y);
    }
}

__global__ void __launch_bounds__(BLOCK) half_to_f32_kernel(float *dst, const floatX *src, size_t n, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<floatX> x = load_pack(src, base, n, wide);
        Pack<float> y;
        for (int k = 0; k < PACK; k++) y.x[k] = to_f32(x.x[k]);
        store_pack(dst, base, n, wide, y);
    }
}

// Each block sums its grid-stride share in double, then one block adds the
// SUMSQ_BLOCKS partials in a fixed tree order.
__global__ void __launch_bounds__(BLOCK) sum_squares_partials_kernel(double *part, const floatX *x, size_t n) {
    double s = 0.0;
    FOR_EACH_ELEMENT(i, n) {
        double v = to_f32(x[i]);
        s += v * v;
    }
    s = block_sum_f64(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(SUMSQ_BLOCKS) sum_partials_f64_kernel(double *out, const double *part) {
    double s = block_sum_f64(part[threadIdx.x]);  // blockDim.x == SUMSQ_BLOCKS
    if (threadIdx.x == 0) *out = s;
}

__global__ void __launch_bounds__(BLOCK) adamw_kernel(float *master, float *m, float *v, const floatX *grad, floatX *param,
                                                      size_t n, AdamWStep s, bool wide) {
    FOR_EACH_PACK(base, n) {
        Pack<float> w = load_pack((const float *)master, base, n, wide), mk = load_pack((const float *)m, base, n, wide),
                    vk = load_pack((const float *)v, base, n, wide);
        Pack<floatX> g = load_pack(grad, base, n, wide), p;
        for (int k = 0; k < PACK; k++) {
            w.x[k] = adamw_element(&w.x[k], &mk.x[k], &vk.x[k], to_f32(g.x[k]), &s);
            p.x[k] = to_floatX(w.x[k]);
        }
        store_pack(master, base, n, wide, w);
        store_pack(m, base, n, wide, mk);
        store_pack(v, base, n, wide, vk);
        if (param) store_pack(param, base, n, wide, p);
    }
}

static void grad_to_bf16(Device *d, bf16 *dst, const float *src, size_t n, int accumulate) {
    bool wide = aligned16(dst) && aligned16(src);
    grad_to_bf16_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>((floatX *)dst, src, n, accumulate, wide);
    LAUNCH_CHECK();
}

static void add_bf16(Device *d, bf16 *dst, const bf16 *src, size_t n) {
    bool wide = aligned16(dst) && aligned16(src);
    add_bf16_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>((floatX *)dst, (const floatX *)src, n, wide);
    LAUNCH_CHECK();
}

static void accumulate_f32(Device *d, float *acc, const float *g, size_t n, int accumulate) {
    bool wide = aligned16(acc) && aligned16(g);
    accumulate_f32_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>(acc, g, n, accumulate, wide);
    LAUNCH_CHECK();
}

static void accumulate_half_f32(Device *d, float *acc, const bf16 *h, size_t n, int accumulate) {
    bool wide = aligned16(acc) && aligned16(h);
    accumulate_half_f32_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>(acc, (const floatX *)h, n, accumulate,
                                                                            wide);
    LAUNCH_CHECK();
}

static void f32_to_half_cuda(Device *d, bf16 *dst, const float *src, size_t n) {
    bool wide = aligned16(dst) && aligned16(src);
    f32_to_half_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>((floatX *)dst, src, n, wide);
    LAUNCH_CHECK();
}

static void half_to_f32_cuda(Device *d, float *dst, const bf16 *src, size_t n) {
    bool wide = aligned16(dst) && aligned16(src);
    half_to_f32_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>(dst, (const floatX *)src, n, wide);
    LAUNCH_CHECK();
}

static double sum_squares_bf16(Device *d, const bf16 *x, size_t n) {
    if (n == 0) return 0.0;
    double *part = (double *)device_scratch(d, (SUMSQ_BLOCKS + 1) * sizeof(double));
    double *total = part + SUMSQ_BLOCKS;
    sum_squares_partials_kernel<<<SUMSQ_BLOCKS, BLOCK, 0, compute(d)>>>(part, (const floatX *)x, n);
    LAUNCH_CHECK();
    sum_partials_f64_kernel<<<1, SUMSQ_BLOCKS, 0, compute(d)>>>(total, part);
    LAUNCH_CHECK();
    double *host = (double *)cuda_impl(d)->host_result.ptr;
    cudaCheck(cudaMemcpyAsync(host, total, sizeof(double), cudaMemcpyDeviceToHost, compute(d)));
    cuda_wait(d, compute(d), NULL);  // the host reads the norm
    return *host;
}

static void adamw(Device *d, float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                  size_t n, const AdamWStep *s) {
    // param may be NULL (a sharded optimizer without a local bf16 copy): NULL is aligned
    bool wide = aligned16(master) && aligned16(m) && aligned16(v) && aligned16(grad) && aligned16(param);
    adamw_kernel<<<grid_for_packs(n), BLOCK, 0, compute(d)>>>(master, m, v, (const floatX *)grad, (floatX *)param, n,
                                                               *s, wide);
    LAUNCH_CHECK();
}

// ---- the table ------------------------------------------------------------------------
// C linkage: the C code reads it through kernels.h. Positional initializers
// (C++17 has no designated ones), in the order of KernelOps.

static size_t max_bytes(size_t a, size_t b) { return a > b ? a : b; }

// The requests of a step: the largest bias gradient (fc, 4C outputs; the
// head has no bias) as column partials, where the GEMM's epilogue cannot sum
// it, the layernorm backward, attention, and the norm's partials.
static size_t scratch_bytes(int threads, int B, int T, int C, int NH, int V, int tp, int flash) {
    (void)threads, (void)V;
    int BT = B * T, Cp = C / tp, NHp = NH / tp;  // a tp rank's fc outputs and heads
    size_t s = (SUMSQ_BLOCKS + 1) * sizeof(double);
    s = max_bytes(s, matmul_cuda_scratch_bytes(BT, 4 * Cp));
    s = max_bytes(s, layernorm_cuda_scratch_bytes(BT, C));
    return max_bytes(s, flash ? flash_cuda_scratch_bytes(B, T, Cp, NHp) : attention_cuda_scratch_bytes(B, T, Cp, NHp));
}

}  // namespace KERNELS_NS

using namespace KERNELS_NS;
extern "C" const KernelOps KERNELS_TABLE = {
    encoder_forward,                  // encoder_forward
    encoder_backward,                 // encoder_backward
    layernorm_forward_cuda,           // layernorm_forward
    layernorm_backward_cuda,          // layernorm_backward
    matmul_forward_cuda,              // matmul_forward
    matmul_backward_cuda,             // matmul_backward
    attention_forward_cuda,           // attention_forward
    attention_backward_cuda,          // attention_backward
    flash_attention_forward_cuda,     // flash_attention_forward
    flash_attention_backward_cuda,    // flash_attention_backward
    flash_block_forward_cuda,         // flash_block_forward
    flash_block_backward_cuda,        // flash_block_backward
    matmul_gelu_forward_cuda,         // matmul_gelu_forward
    gelu_matmul_backward_cuda,        // gelu_matmul_backward
    gelu_forward_cuda,                // gelu_forward
    gelu_backward_cuda,               // gelu_backward
    residual_forward,                 // residual_forward
    residual_layernorm_forward_cuda,  // residual_layernorm_forward
    softmax_crossentropy_cuda,        // softmax_crossentropy
    bias_add_cuda,                    // bias_add
    embedding_part_forward_cuda,      // embedding_part_forward
    embedding_part_backward_cuda,     // embedding_part_backward
    crossentropy_part_max_cuda,       // crossentropy_part_max
    crossentropy_part_sums_cuda,      // crossentropy_part_sums
    crossentropy_part_finish_cuda,    // crossentropy_part_finish
    grad_to_bf16,                     // grad_to_bf16
    add_bf16,                         // add_bf16
    accumulate_f32,                   // accumulate_f32
    accumulate_half_f32,              // accumulate_half_f32
    sum_squares_bf16,                 // sum_squares_bf16
    adamw,                            // adamw
    f32_to_half_cuda,                 // f32_to_half (in floatX: bf16 or fp16)
    half_to_f32_cuda,                 // half_to_f32
    quantize_half_cuda,               // quantize_half
    quantize_f32_cuda,                // quantize_f32
    dequantize_half_cuda,             // dequantize_half
    dequantize_f32_cuda,              // dequantize_f32
    scratch_bytes,                    // scratch_bytes
};
