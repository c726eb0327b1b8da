// kernels_cuda_layernorm.cu: layernorm (Ba et al. 2016; GPT-2 puts it before
// each sublayer) on the cuda device, the same formulas as the cpu kernel:
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps),  var biased (1/C)
// One warp per row; statistics in fp32. The parameter gradients are column
// sums over rows, done as fixed partial sums (no atomics): deterministic.
#include "kernels_cuda.h"

namespace KERNELS_NS {

#define LN_EPS 1e-5f
#define LN_ROWS_PER_BLOCK 8  // warps per block, one row each

// out (BT,C); mean, rstd (BT). With res_b: inp = res = inp + res_b first
// (rounded to bf16 as residual_forward rounds it), written back to res; each
// lane reads again only the elements it wrote, so no barrier is needed.
__global__ void __launch_bounds__(LN_ROWS_PER_BLOCK * WARP_SIZE) layernorm_forward_kernel(floatX *out, float *mean, float *rstd, const floatX *inp,
                                         const floatX *w, const floatX *b, int BT, int C,
                                         const floatX *res_b, floatX *res) {
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= BT) return;  // whole warps leave together: the shuffles below stay full
    const floatX *x = inp + (size_t)row * C;
    floatX *y = out + (size_t)row * C;
    float sum = 0.0f;
    if (res_b) {
        const floatX *r = res_b + (size_t)row * C;
        floatX *xr = res + (size_t)row * C;
        for (int c = lane; c < C; c += WARP_SIZE) {
            floatX v = to_floatX(to_f32(x[c]) + to_f32(r[c]));
            xr[c] = v;
            sum += to_f32(v);
        }
        x = xr;
    } else {
        for (int c = lane; c < C; c += WARP_SIZE) sum += to_f32(x[c]);
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;  // two passes: no cancellation in E[x^2] - m^2
    for (int c = lane; c < C; c += WARP_SIZE) {
        float dx = to_f32(x[c]) - m;
        var += dx * dx;
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
    for (int c = lane; c < C; c += WARP_SIZE)
        y[c] = to_floatX((to_f32(x[c]) - m) * s * to_f32(w[c]) + to_f32(b[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// With xhat = (x - mean) * rstd and g = dout * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))      (+= into dinp)
__global__ void __launch_bounds__(LN_ROWS_PER_BLOCK * WARP_SIZE) layernorm_backward_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp,
                                               const floatX *w, const float *mean,
                                               const float *rstd, int BT, int C) {
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= BT) return;
    const floatX *x = inp + (size_t)row * C, *g = dout + (size_t)row * C;
    floatX *dx = dinp + (size_t)row * C;
    float m = mean[row], s = rstd[row], gsum = 0.0f, gxsum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float gw = to_f32(g[c]) * to_f32(w[c]);
        gsum += gw;
        gxsum += gw * (to_f32(x[c]) - m) * s;
    }
    float gmean = warp_sum(gsum) / C, gxmean = warp_sum(gxsum) / C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float xhat = (to_f32(x[c]) - m) * s;
        float gw = to_f32(g[c]) * to_f32(w[c]);
        dx[c] = to_floatX(to_f32(dx[c]) + s * (gw - gmean - xhat * gxmean));
    }
}

// Partial column sums of dout * xhat (for dw) and dout (for db) over
// COLSUM_ROWS_PER_PART rows per block; layout as bias_grad_partials_kernel.
__global__ void __launch_bounds__(WARP_SIZE * COLSUM_BLOCK_ROWS) layernorm_param_partials_kernel(float *part_w, float *part_b, const floatX *dout,
                                                const floatX *inp, const float *mean,
                                                const float *rstd, int BT, int C) {
    __shared__ float tile_w[COLSUM_BLOCK_ROWS][WARP_SIZE];
    __shared__ float tile_b[COLSUM_BLOCK_ROWS][WARP_SIZE];
    int c = blockIdx.x * WARP_SIZE + threadIdx.x;
    int r0 = blockIdx.y * COLSUM_ROWS_PER_PART;
    int r1 = min(r0 + COLSUM_ROWS_PER_PART, BT);
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += COLSUM_BLOCK_ROWS) {
            size_t i = (size_t)r * C + c;
            float g = to_f32(dout[i]);
            sw += g * (to_f32(inp[i]) - mean[r]) * rstd[r];
            sb += g;
        }
    }
    tile_w[threadIdx.y][threadIdx.x] = sw;
    tile_b[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < COLSUM_BLOCK_ROWS; y++) {
            sw += tile_w[y][threadIdx.x];
            sb += tile_b[y][threadIdx.x];
        }
        part_w[(size_t)blockIdx.y * C + c] = sw;
        part_b[(size_t)blockIdx.y * C + c] = sb;
    }
}

void layernorm_forward_cuda(Device *d, act *out, float *mean, float *rstd, const act *inp,
                            const bf16 *w, const bf16 *b, int BT, int C) {
    unsigned grid = (unsigned)ceil_div(BT, LN_ROWS_PER_BLOCK);
    layernorm_forward_kernel<<<grid, LN_ROWS_PER_BLOCK * WARP_SIZE, 0,
                               cuda_stream(d, STREAM_COMPUTE)>>>(
        (floatX *)out, mean, rstd, (const floatX *)inp, (const floatX *)w, (const floatX *)b, BT,
        C, nullptr, nullptr);
    LAUNCH_CHECK();
}

// res (BT,C) = a + b, out = layernorm(res): one kernel, the residual stream read once
void residual_layernorm_forward_cuda(Device *d, act *res, act *out, float *mean, float *rstd, const act *a,
                                     const act *b, const bf16 *w, const bf16 *bias, int BT, int C) {
    unsigned grid = (unsigned)ceil_div(BT, LN_ROWS_PER_BLOCK);
    layernorm_forward_kernel<<<grid, LN_ROWS_PER_BLOCK * WARP_SIZE, 0, cuda_stream(d, STREAM_COMPUTE)>>>(
        (floatX *)out, mean, rstd, (const floatX *)a, (const floatX *)w, (const floatX *)bias, BT, C,
        (const floatX *)b, (floatX *)res);
    LAUNCH_CHECK();
}

size_t layernorm_cuda_scratch_bytes(int BT, int C) {
    return 2 * ceil_div((size_t)BT, COLSUM_ROWS_PER_PART) * (size_t)C * sizeof(float);
}

// dinp (BT,C) += ; dw, db (C) +=
void layernorm_backward_cuda(Device *d, act *dinp, float *dw, float *db, const act *dout,
                             const act *inp, const bf16 *w, const float *mean, const float *rstd,
                             int BT, int C) {
    cudaStream_t st = cuda_stream(d, STREAM_COMPUTE);
    unsigned grid = (unsigned)ceil_div(BT, LN_ROWS_PER_BLOCK);
    layernorm_backward_dinp_kernel<<<grid, LN_ROWS_PER_BLOCK * WARP_SIZE, 0, st>>>(
        (floatX *)dinp, (const floatX *)dout, (const floatX *)inp, (const floatX *)w, mean, rstd,
        BT, C);
    LAUNCH_CHECK();

    int parts = colsum_parts(BT);
    float *part_w = (float *)device_scratch(d, 2 * (size_t)parts * C * sizeof(float));
    float *part_b = part_w + (size_t)parts * C;
    dim3 pgrid((unsigned)ceil_div(C, WARP_SIZE), (unsigned)parts);
    dim3 block(WARP_SIZE, COLSUM_BLOCK_ROWS);
    layernorm_param_partials_kernel<<<pgrid, block, 0, st>>>(
        part_w, part_b, (const floatX *)dout, (const floatX *)inp, mean, rstd, BT, C);
    LAUNCH_CHECK();
    column_partials_accumulate(d, dw, part_w, parts, C);
    column_partials_accumulate(d, db, part_b, parts, C);
}

}  // namespace KERNELS_NS
