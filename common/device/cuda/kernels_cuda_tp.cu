// kernels_cuda_tp.cu: the cuda kernels of tensor parallelism (Shoeybi et al.
// 2019, Megatron-LM): the row-parallel bias, the vocabulary-parallel
// embedding and the three steps of the vocabulary-parallel cross-entropy
// (kernels.h). Activations bf16, math fp32; each rank computes on its part
// and the all-reduces between are the caller's. Sums run in a fixed order,
// the embedding's backward by token buckets as encoder_backward's.
#include "kernels_cuda.h"

namespace KERNELS_NS {


static cudaStream_t compute(Device *d) { return cuda_stream(d, STREAM_COMPUTE); }

// ---- row-parallel bias ---------------------------------------------------------------------

__global__ void __launch_bounds__(BLOCK) bias_add_kernel(floatX *out, const floatX *bias, int OC, size_t n) {
    FOR_EACH_ELEMENT(i, n) out[i] = to_floatX(to_f32(out[i]) + to_f32(bias[i % OC]));
}

void bias_add_cuda(Device *d, act *out, const bf16 *bias, int BT, int OC) {
    size_t n = (size_t)BT * OC;
    bias_add_kernel<<<grid_for(n, BLOCK), BLOCK, 0, compute(d)>>>((floatX *)out, (const floatX *)bias, OC, n);
    LAUNCH_CHECK();
}

// ---- vocabulary-parallel embedding ----------------------------------------------------------

// out (B,T,C) = wte_part[token - begin] (0 outside the part) + wpe[t] (when given)
__global__ void __launch_bounds__(BLOCK) embedding_part_forward_kernel(floatX *out, const int32_t *tokens, const floatX *wte_part,
                                              int begin, int rows, const floatX *wpe, int T, int C,
                                              size_t n) {
    FOR_EACH_ELEMENT(i, n) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T), row = tokens[bt] - begin;
        float v = row >= 0 && row < rows ? to_f32(wte_part[(size_t)row * C + c]) : 0.0f;
        if (wpe) v += to_f32(wpe[(size_t)t * C + c]);
        out[i] = to_floatX(v);
    }
}

void embedding_part_forward_cuda(Device *d, act *out, const int32_t *tokens, const bf16 *wte_part,
                                 int vocab_begin, int rows, const bf16 *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    embedding_part_forward_kernel<<<grid_for(n, BLOCK), BLOCK, 0, compute(d)>>>(
        (floatX *)out, tokens, (const floatX *)wte_part, vocab_begin, rows, (const floatX *)wpe, T, C, n);
    LAUNCH_CHECK();
}

void embedding_part_backward_cuda(Device *d, float *dwte_part, float *dwpe, const act *dout, const int32_t *tokens,
                                  const TokenBuckets *tb, int vocab_begin, int rows, int B, int T, int C) {
    encoder_backward_wte_cuda(d, dwte_part, dout, tokens, tb, B * T, C, vocab_begin, rows);
    encoder_backward_wpe_cuda(d, dwpe, dout, B, T, C);
}

// ---- vocabulary-parallel cross-entropy -------------------------------------------------------
// One block per row, as softmax_crossentropy; the group's max and sums come
// between the kernels from the caller's all-reduces.

__global__ void __launch_bounds__(ROW_BLOCK_MAX) crossentropy_part_max_kernel(float *maxv, const floatX *logits, int V, int ld) {
    const floatX *z = logits + (size_t)blockIdx.x * ld;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, to_f32(z[i]));
    m = block_max(m);
    if (threadIdx.x == 0) maxv[blockIdx.x] = m;
}

__global__ void __launch_bounds__(ROW_BLOCK_MAX) crossentropy_part_sums_kernel(float *sums, const floatX *logits, const float *maxv,
                                              const int32_t *targets, int begin, int BT, int V, int ld) {
    int r = blockIdx.x;
    const floatX *z = logits + (size_t)r * ld;
    float m = maxv[r], s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(to_f32(z[i]) - m);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        int t = targets[r] - begin;
        sums[r] = s;
        sums[BT + r] = t >= 0 && t < V ? to_f32(z[t]) : 0.0f;
    }
}

__global__ void __launch_bounds__(ROW_BLOCK_MAX) crossentropy_part_finish_kernel(float *losses, floatX *logits, const float *maxv,
                                                const float *sums, const int32_t *targets, int begin,
                                                int BT, int V, int ld, float dloss_scale) {
    int r = blockIdx.x;
    float m = maxv[r], sum = sums[r];
    if (threadIdx.x == 0) losses[r] = crossentropy_f32(sum, m, sums[BT + r]);
    if (dloss_scale == 0.0f) return;
    floatX *z = logits + (size_t)r * ld;
    float k = dloss_scale / sum;
    int t = targets[r] - begin;
    for (int i = threadIdx.x; i < ld; i += blockDim.x) {
        float g = 0.0f;  // padding rows of wte get no gradient
        if (i < V) g = expf(to_f32(z[i]) - m) * k - (i == t ? dloss_scale : 0.0f);
        z[i] = to_floatX(g);
    }
}


void crossentropy_part_max_cuda(Device *d, float *maxv, const act *logits, int BT, int V, int ld) {
    crossentropy_part_max_kernel<<<BT, row_block(V), 0, compute(d)>>>(maxv, (const floatX *)logits, V, ld);
    LAUNCH_CHECK();
}

void crossentropy_part_sums_cuda(Device *d, float *sums, const act *logits, const float *maxv,
                                 const int32_t *targets, int vocab_begin, int BT, int V, int ld) {
    crossentropy_part_sums_kernel<<<BT, row_block(V), 0, compute(d)>>>(
        sums, (const floatX *)logits, maxv, targets, vocab_begin, BT, V, ld);
    LAUNCH_CHECK();
}

void crossentropy_part_finish_cuda(Device *d, float *losses, act *logits, const float *maxv,
                                   const float *sums, const int32_t *targets, int vocab_begin,
                                   int BT, int V, int ld, float dloss_scale) {
    crossentropy_part_finish_kernel<<<BT, row_block(V), 0, compute(d)>>>(
        losses, (floatX *)logits, maxv, sums, targets, vocab_begin, BT, V, ld, dloss_scale);
    LAUNCH_CHECK();
}

}  // namespace KERNELS_NS
