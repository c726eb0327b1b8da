// kernels_cuda_attention.cu: causal multi-head self-attention on the cuda
// device (Vaswani et al. 2017, GPT-2's masked variant), the same math as the
// cpu kernel. Per (batch, head), as batched cuBLASLt GEMMs over all B*NH heads:
//   S = Q K^T / sqrt(hs)       (T,T)  fp32, written straight into att
//   P = softmax(S), s > t masked       row-wise, fp32 in att (saved for backward)
//   Y = P V                    (T,hs) with P rounded to bf16 for the tensor cores
// A batched GEMM needs one stride between heads, but in qkv (B,T,3C) the heads
// of one batch row are hs apart and the batches T*3C apart; so q, k, v are
// first permuted to (B,NH,T,hs) in scratch, and the result permuted back.
// This is the simple, memory-hungry formulation (the full T x T matrix per
// head, as the cpu kernel); FlashAttention would avoid it.
#include "kernels_cuda.h"

namespace KERNELS_NS {

#define ROWS_PER_BLOCK (BLOCK / WARP_SIZE)  // softmax: one warp per row

// ---- permutes ------------------------------------------------------------------------
// index i of a (B,NH,T,hs) tensor <-> its element in qkv (B,T,3,NH,hs) or out (B,T,NH,hs)

__device__ inline size_t head_major_to_token_major(size_t i, int NH, int T, int hs, int width) {
    int dd = (int)(i % hs);
    int t = (int)((i / hs) % T);
    int h = (int)((i / ((size_t)hs * T)) % NH);
    size_t b = i / ((size_t)hs * T * NH);
    return (b * T + t) * (size_t)width + (size_t)h * hs + dd;
}

// q, k, v (B,NH,T,hs) <- qkv (B,T,3C)
__global__ void __launch_bounds__(BLOCK) split_qkv_kernel(floatX *q, floatX *k, floatX *v, const floatX *qkv, int NH, int T,
                                 int hs, size_t n) {
    int C = NH * hs;
    FOR_EACH_ELEMENT(i, n) {
        size_t src = head_major_to_token_major(i, NH, T, hs, 3 * C);
        q[i] = qkv[src];
        k[i] = qkv[src + C];
        v[i] = qkv[src + 2 * C];
    }
}

// dqkv (B,T,3C) <- dq, dk, dv (B,NH,T,hs): every element of dqkv is written (overwrite)
__global__ void __launch_bounds__(BLOCK) merge_dqkv_kernel(floatX *dqkv, const floatX *dq, const floatX *dk,
                                  const floatX *dv, int NH, int T, int hs, size_t n) {
    int C = NH * hs;
    FOR_EACH_ELEMENT(i, n) {
        size_t dst = head_major_to_token_major(i, NH, T, hs, 3 * C);
        dqkv[dst] = dq[i];
        dqkv[dst + C] = dk[i];
        dqkv[dst + 2 * C] = dv[i];
    }
}

// to_token_major: dst (B,T,C) <- src (B,NH,T,hs) (the forward's y);
// otherwise dst (B,NH,T,hs) <- src (B,T,C) (the backward's dout)
__global__ void __launch_bounds__(BLOCK) permute_heads_kernel(floatX *dst, const floatX *src, int NH, int T, int hs,
                                     size_t n, int to_token_major) {
    FOR_EACH_ELEMENT(i, n) {
        size_t j = head_major_to_token_major(i, NH, T, hs, NH * hs);
        if (to_token_major) dst[j] = src[i];
        else dst[i] = src[j];
    }
}

// ---- softmax over causal rows ---------------------------------------------------------------
// Row r of the (B*NH*T, T) matrix is query position t = r % T.

// In place on att: P[t,:] = softmax(S[t, 0..t]), zero for s > t; also a bf16 copy
__global__ void __launch_bounds__(BLOCK) causal_softmax_kernel(float *att, floatX *p_bf16, int T, size_t rows) {
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    int t = (int)(row % T);
    float *x = att + row * T;
    floatX *p = p_bf16 + row * T;
    float maxv = -INFINITY;
    for (int s = lane; s <= t; s += WARP_SIZE) maxv = fmaxf(maxv, x[s]);
    maxv = warp_max(maxv);
    float sum = 0.0f;
    for (int s = lane; s <= t; s += WARP_SIZE) sum += expf(x[s] - maxv);
    float inv = 1.0f / warp_sum(sum);
    for (int s = lane; s < T; s += WARP_SIZE) {
        float v = s <= t ? expf(x[s] - maxv) * inv : 0.0f;
        x[s] = v;
        p[s] = to_floatX(v);
    }
}

// Softmax backward, row-wise, with the 1/sqrt(hs) of the forward folded in:
//   dS[t,s] = scale * P[t,s] (dP[t,s] - sum_u P[t,u] dP[t,u]),  zero for s > t
__global__ void __launch_bounds__(BLOCK) causal_softmax_backward_kernel(floatX *ds, const float *dp, const float *att,
                                               float scale, int T, size_t rows) {
    size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    int t = (int)(row % T);
    const float *p = att + row * T, *g = dp + row * T;
    float dot = 0.0f;
    for (int s = lane; s <= t; s += WARP_SIZE) dot += p[s] * g[s];
    dot = warp_sum(dot);
    for (int s = lane; s < T; s += WARP_SIZE)
        ds[row * T + s] = to_floatX(s <= t ? scale * p[s] * (g[s] - dot) : 0.0f);
}

__global__ void __launch_bounds__(BLOCK) f32_to_half_copy_kernel(floatX *dst, const float *src, size_t n) {
    FOR_EACH_ELEMENT(i, n) dst[i] = to_floatX(src[i]);
}

// ---- batched GEMMs over all heads --------------------------------------------------------------
// X, Y (T,hs) per head; P (T,T) per head; heads packed at strides T*hs and T*T.

// out (T,T) fp32 = alpha * X @ Y^T
static void heads_x_yt(Device *d, float *out, const floatX *x, const floatX *y, float alpha, int T,
                       int hs, int heads) {
    GemmArgs g = {};
    g.M = T, g.N = T, g.K = hs;
    g.A = x, g.transA = 0, g.strideA = (long long)T * hs;
    g.B = y, g.transB = 1, g.strideB = (long long)T * hs;
    g.C = out, g.c_f32 = 1, g.strideC = (long long)T * T;
    g.alpha = alpha, g.beta = 0.0f, g.batch = heads;
    gemm_bf16(d, &g);
}

// out (T,hs) bf16 = op(P) @ Y, op(P) = P or P^T
static void heads_p_y(Device *d, floatX *out, const floatX *p, int transP, const floatX *y, int T,
                      int hs, int heads) {
    GemmArgs g = {};
    g.M = T, g.N = hs, g.K = T;
    g.A = p, g.transA = transP, g.strideA = (long long)T * T;
    g.B = y, g.transB = 0, g.strideB = (long long)T * hs;
    g.C = out, g.c_f32 = 0, g.strideC = (long long)T * hs;
    g.alpha = 1.0f, g.beta = 0.0f, g.batch = heads;
    gemm_bf16(d, &g);
}

// Consecutive pieces of one scratch allocation, each 256-byte aligned (cuBLASLt's preference).
static size_t round_up_256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }
static void *take(char **cursor, size_t bytes) {
    void *p = *cursor;
    *cursor += round_up_256(bytes);
    return p;
}

// ---- forward and backward -------------------------------------------------------------------

// The backward's request (q, k, v, dy, dq, dk, dv; P; dP) is larger than the
// forward's (q, k, v, y; P).
size_t attention_cuda_scratch_bytes(int B, int T, int C, int NH) {
    size_t n = (size_t)B * T * C, rows = (size_t)B * NH * T;
    return 7 * round_up_256(n * sizeof(floatX)) + round_up_256(rows * T * sizeof(floatX)) +
           round_up_256(rows * T * sizeof(float));
}

void attention_forward_cuda(Device *d, act *out, float *att, const act *qkv, int B, int T, int C,
                            int NH) {
    cudaStream_t st = cuda_stream(d, STREAM_COMPUTE);
    int hs = C / NH, heads = B * NH;
    size_t n = (size_t)B * T * C;            // elements of q (and of k, v, y)
    size_t rows = (size_t)heads * T;         // rows of att
    size_t bytes_act = n * sizeof(floatX), bytes_p = rows * T * sizeof(floatX);
    char *cur = (char *)device_scratch(d, 4 * round_up_256(bytes_act) + round_up_256(bytes_p));
    floatX *q = (floatX *)take(&cur, bytes_act), *k = (floatX *)take(&cur, bytes_act);
    floatX *v = (floatX *)take(&cur, bytes_act), *y = (floatX *)take(&cur, bytes_act);
    floatX *p = (floatX *)take(&cur, bytes_p);

    split_qkv_kernel<<<grid_for(n, BLOCK), BLOCK, 0, st>>>(q, k, v, (const floatX *)qkv, NH, T,
                                                           hs, n);
    LAUNCH_CHECK();
    heads_x_yt(d, att, q, k, 1.0f / sqrtf((float)hs), T, hs, heads);  // att = S (B,NH,T,T)
    unsigned row_blocks = (unsigned)ceil_div(rows, ROWS_PER_BLOCK);
    causal_softmax_kernel<<<row_blocks, BLOCK, 0, st>>>(att, p, T, rows);
    LAUNCH_CHECK();
    heads_p_y(d, y, p, 0, v, T, hs, heads);  // y (B,NH,T,hs) = P V
    permute_heads_kernel<<<grid_for(n, BLOCK), BLOCK, 0, st>>>((floatX *)out, y, NH, T, hs, n, 1);
    LAUNCH_CHECK();
}

// With dY the gradient of Y (per head):
//   dV = P^T dY,  dP = dY V^T,  dS = softmax backward of dP,  dQ = dS K,  dK = dS^T Q
void attention_backward_cuda(Device *d, act *dqkv, const act *dout, const act *qkv,
                             const float *att, int B, int T, int C, int NH) {
    cudaStream_t st = cuda_stream(d, STREAM_COMPUTE);
    int hs = C / NH, heads = B * NH;
    size_t n = (size_t)B * T * C, rows = (size_t)heads * T;
    size_t bytes_act = n * sizeof(floatX);
    size_t bytes_p = rows * T * sizeof(floatX), bytes_dp = rows * T * sizeof(float);
    char *cur = (char *)device_scratch(
        d, 7 * round_up_256(bytes_act) + round_up_256(bytes_p) + round_up_256(bytes_dp));
    floatX *q = (floatX *)take(&cur, bytes_act), *k = (floatX *)take(&cur, bytes_act);
    floatX *v = (floatX *)take(&cur, bytes_act), *dy = (floatX *)take(&cur, bytes_act);
    floatX *dq = (floatX *)take(&cur, bytes_act), *dk = (floatX *)take(&cur, bytes_act);
    floatX *dv = (floatX *)take(&cur, bytes_act);
    floatX *p = (floatX *)take(&cur, bytes_p);  // P in bf16, later dS (same shape)
    float *dp = (float *)take(&cur, bytes_dp);

    split_qkv_kernel<<<grid_for(n, BLOCK), BLOCK, 0, st>>>(q, k, v, (const floatX *)qkv, NH, T,
                                                           hs, n);
    LAUNCH_CHECK();
    permute_heads_kernel<<<grid_for(n, BLOCK), BLOCK, 0, st>>>(dy, (const floatX *)dout, NH, T,
                                                               hs, n, 0);
    LAUNCH_CHECK();
    f32_to_half_copy_kernel<<<grid_for(rows * T, BLOCK), BLOCK, 0, st>>>(p, att, rows * T);
    LAUNCH_CHECK();
    heads_p_y(d, dv, p, 1, dy, T, hs, heads);    // dV = P^T dY
    heads_x_yt(d, dp, dy, v, 1.0f, T, hs, heads);  // dP = dY V^T
    // the stream runs the dV GEMM (which reads P) before this overwrites P with dS
    causal_softmax_backward_kernel<<<(unsigned)ceil_div(rows, ROWS_PER_BLOCK), BLOCK, 0, st>>>(
        p, dp, att, 1.0f / sqrtf((float)hs), T, rows);
    LAUNCH_CHECK();
    heads_p_y(d, dq, p, 0, k, T, hs, heads);  // dQ = dS K
    heads_p_y(d, dk, p, 1, q, T, hs, heads);  // dK = dS^T Q
    merge_dqkv_kernel<<<grid_for(n, BLOCK), BLOCK, 0, st>>>((floatX *)dqkv, dq, dk, dv, NH, T,
                                                            hs, n);
    LAUNCH_CHECK();
}

}  // namespace KERNELS_NS
