// kernels_cuda_flash.cu: FlashAttention on the cuda device, the math of
// flash_math.h (and of kernels_cpu_flash.c). Head sizes 16, 32, 64 and 128
// run on the tensor cores (kernels_cuda_flash_tc.cu, where the GPU's shared
// memory holds their tiles); every other head size up to 128 runs the
// kernels below, on the CUDA cores. They read straight from qkv (B,T,3C):
// head h of q at column h*hs, k at C + h*hs, v at 2C + h*hs, rows 3C apart,
// so no permute runs. A warp owns one row: a query row in the forward and in
// the backward's dq, a key row in the backward's dk and dv. It takes the
// keys (or queries) 32 at a time, one per lane: each lane forms its score
// from the row held in shared memory, the warp's max and sum update the
// online softmax, each lane leaves its weight in shared memory, and after a
// __syncwarp the lanes add the 32 weighted rows into the output elements
// they own (lane + 32k). Each sum runs in a fixed order and
// every output element is written by one lane, once: no atomics, the same
// bits on every run. Saved: y and lse (B,NH,T); scratch: D (B,NH,T). No
// (T,T) matrix anywhere.
#include "flash_math.h"
#include "kernels_cuda.h"

namespace KERNELS_NS {

#define FLASH_WARPS 4                             // rows per block
#define FLASH_MAX_HS 128                          // head sizes up to this
#define FLASH_PER_LANE (FLASH_MAX_HS / WARP_SIZE)  // output elements a lane owns

// Where row `row` of the (B*NH*T) rows lives: its head's q, k, v start at
// `base` (token 0, q), `t` is its position.
struct FlashRow {
    size_t bh;
    int t;
    size_t base;
};

__device__ inline FlashRow flash_row(size_t row, int T, int C, int NH) {
    FlashRow r;
    r.bh = row / T;
    r.t = (int)(row % T);
    size_t b = r.bh / NH, h = r.bh % NH;
    r.base = b * T * 3 * (size_t)C + h * (size_t)(C / NH);
    return r;
}

// x (hs) . row of a (T, stride 3C) tensor, x in shared memory
__device__ inline float dot_row(const float *x, const floatX *row, int hs) {
    float s = 0.0f;
    for (int e = 0; e < hs; e++) s += x[e] * to_f32(row[e]);
    return s;
}

// ---- forward ----------------------------------------------------------------------------

__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_forward_kernel(floatX *out, float *lse, const floatX *qkv, int T, int C, int NH, size_t rows) {
    __shared__ float q_s[FLASH_WARPS][FLASH_MAX_HS];  // the row's q, scaled
    __shared__ float p_s[FLASH_WARPS][WARP_SIZE];     // the chunk's weights, a lane's each
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = C / NH, ld = 3 * C;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    bool live = row < rows;  // a last block's spare warps load row 0 and write nothing
    FlashRow r = flash_row(live ? row : 0, T, C, NH);
    const floatX *q = qkv + r.base, *k = q + C, *v = q + 2 * C;
    float scale = flash_scale(hs);
    for (int e = lane; e < hs; e += WARP_SIZE) q_s[warp][e] = to_f32(q[(size_t)r.t * ld + e]) * scale;
    __syncthreads();
    float m = -INFINITY, l = 0.0f, y[FLASH_PER_LANE] = {};
    for (int j0 = 0; j0 <= r.t; j0 += WARP_SIZE) {
        int s = j0 + lane, n = flash_visible(r.t, 0, j0, WARP_SIZE);
        float z = s <= r.t ? dot_row(q_s[warp], k + (size_t)s * ld, hs) : -INFINITY;
        float m_new = flash_running_max(m, warp_max(z)), corr = flash_rescale(m, m_new);
        // (every lane has read the last chunk's weights: it met the warp_max above)
        float p = s <= r.t ? expf(z - m_new) : 0.0f;
        p_s[warp][lane] = p;
        __syncwarp();
        l = l * corr + warp_sum(p);
        m = m_new;
        for (int i = 0; i < FLASH_PER_LANE; i++) y[i] *= corr;
        for (int c = 0; c < n; c++) {
            float pc = p_s[warp][c];
            const floatX *vs = v + (size_t)(j0 + c) * ld;
            for (int i = 0; i < FLASH_PER_LANE; i++)
                if (lane + WARP_SIZE * i < hs) y[i] += pc * to_f32(vs[lane + WARP_SIZE * i]);
        }
    }
    if (!live) return;
    floatX *yo = out + (r.bh / NH * T + r.t) * (size_t)C + r.bh % NH * (size_t)hs;
    for (int i = 0; i < FLASH_PER_LANE; i++)
        if (lane + WARP_SIZE * i < hs) yo[lane + WARP_SIZE * i] = to_floatX(y[i] / l);
    if (lane == 0) lse[row] = flash_lse(m, l);
}

// ---- backward -----------------------------------------------------------------------------

// D (B,NH,T): dy_t . y_t per row
__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_d_kernel(float *D, const floatX *dout, const floatX *out, int T, int C, int NH, size_t rows) {
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = C / NH;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    if (row >= rows) return;  // no barrier in this kernel: a spare warp may leave
    size_t at = (row / T / NH * T + row % T) * (size_t)C + row / T % NH * (size_t)hs;
    float s = 0.0f;
    for (int e = lane; e < hs; e += WARP_SIZE) s += to_f32(dout[at + e]) * to_f32(out[at + e]);
    s = warp_sum(s);
    if (lane == 0) D[row] = s;
}

// dq_t = scale sum_{s<=t} dz_s k_s, a warp per query row
__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_dq_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *D, int T,
                    int C, int NH, size_t rows) {
    __shared__ float q_s[FLASH_WARPS][FLASH_MAX_HS], dy_s[FLASH_WARPS][FLASH_MAX_HS];
    __shared__ float dz_s[FLASH_WARPS][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = C / NH, ld = 3 * C;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    bool live = row < rows;
    size_t at = live ? row : 0;
    FlashRow r = flash_row(at, T, C, NH);
    const floatX *q = qkv + r.base, *k = q + C, *v = q + 2 * C;
    const floatX *dy = dout + (r.bh / NH * T + r.t) * (size_t)C + r.bh % NH * (size_t)hs;
    float scale = flash_scale(hs), lse_t = lse[at], D_t = D[at];
    for (int e = lane; e < hs; e += WARP_SIZE) {
        q_s[warp][e] = to_f32(q[(size_t)r.t * ld + e]) * scale;
        dy_s[warp][e] = to_f32(dy[e]);
    }
    __syncthreads();
    float dq[FLASH_PER_LANE] = {};
    for (int j0 = 0; j0 <= r.t; j0 += WARP_SIZE) {
        int s = j0 + lane, n = flash_visible(r.t, 0, j0, WARP_SIZE);
        float dz = 0.0f;
        if (s <= r.t) {
            float p = flash_prob(dot_row(q_s[warp], k + (size_t)s * ld, hs), lse_t);
            dz = flash_dscore(p, dot_row(dy_s[warp], v + (size_t)s * ld, hs), D_t);
        }
        __syncwarp();  // every lane has read the last chunk's dz
        dz_s[warp][lane] = dz;
        __syncwarp();
        for (int c = 0; c < n; c++) {
            float dzc = dz_s[warp][c];
            const floatX *ks = k + (size_t)(j0 + c) * ld;
            for (int i = 0; i < FLASH_PER_LANE; i++)
                if (lane + WARP_SIZE * i < hs) dq[i] += dzc * to_f32(ks[lane + WARP_SIZE * i]);
        }
    }
    if (!live) return;
    floatX *dqo = dqkv + (q - qkv) + (size_t)r.t * ld;
    for (int i = 0; i < FLASH_PER_LANE; i++)
        if (lane + WARP_SIZE * i < hs) dqo[lane + WARP_SIZE * i] = to_floatX(scale * dq[i]);
}

// dk_s = scale sum_{t>=s} dz_t q_t and dv_s = sum_{t>=s} p_t dy_t, a warp per key row
__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_dkv_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *D, int T,
                     int C, int NH, size_t rows) {
    __shared__ float k_s[FLASH_WARPS][FLASH_MAX_HS], v_s[FLASH_WARPS][FLASH_MAX_HS];
    __shared__ float p_s[FLASH_WARPS][WARP_SIZE], dz_s[FLASH_WARPS][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = C / NH, ld = 3 * C;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    bool live = row < rows;
    FlashRow r = flash_row(live ? row : 0, T, C, NH);  // r.t is the key's position s
    const floatX *q = qkv + r.base, *k = q + C, *v = q + 2 * C;
    const floatX *dy = dout + r.bh / NH * T * (size_t)C + r.bh % NH * (size_t)hs;  // token 0's
    const float *lse_h = lse + r.bh * T, *D_h = D + r.bh * T;
    float scale = flash_scale(hs);
    for (int e = lane; e < hs; e += WARP_SIZE) {
        k_s[warp][e] = to_f32(k[(size_t)r.t * ld + e]) * scale;
        v_s[warp][e] = to_f32(v[(size_t)r.t * ld + e]);
    }
    __syncthreads();
    float dk[FLASH_PER_LANE] = {}, dv[FLASH_PER_LANE] = {};
    for (int t0 = r.t; t0 < T; t0 += WARP_SIZE) {
        int t = t0 + lane, n = T - t0 < WARP_SIZE ? T - t0 : WARP_SIZE;
        float p = 0.0f, dz = 0.0f;
        if (t < T) {
            p = flash_prob(dot_row(k_s[warp], q + (size_t)t * ld, hs), lse_h[t]);
            dz = flash_dscore(p, dot_row(v_s[warp], dy + (size_t)t * C, hs), D_h[t]);
        }
        __syncwarp();  // every lane has read the last chunk's p and dz
        p_s[warp][lane] = p, dz_s[warp][lane] = dz;
        __syncwarp();
        for (int c = 0; c < n; c++) {
            float pc = p_s[warp][c], dzc = dz_s[warp][c];
            const floatX *qt = q + (size_t)(t0 + c) * ld, *dyt = dy + (size_t)(t0 + c) * C;
            for (int i = 0; i < FLASH_PER_LANE; i++) {
                int e = lane + WARP_SIZE * i;
                if (e < hs) {
                    dv[i] += pc * to_f32(dyt[e]);
                    dk[i] += dzc * to_f32(qt[e]);
                }
            }
        }
    }
    if (!live) return;
    floatX *dko = dqkv + (k - qkv) + (size_t)r.t * ld, *dvo = dqkv + (v - qkv) + (size_t)r.t * ld;
    for (int i = 0; i < FLASH_PER_LANE; i++) {
        int e = lane + WARP_SIZE * i;
        if (e < hs) dko[e] = to_floatX(scale * dk[i]), dvo[e] = to_floatX(dv[i]);
    }
}

// ---- the kernel table's entries ------------------------------------------------------------

size_t flash_cuda_scratch_bytes(int B, int T, int C, int NH) {
    (void)C;
    return (size_t)B * NH * T * sizeof(float);  // D
}

static unsigned flash_blocks(size_t rows) { return (unsigned)ceil_div(rows, FLASH_WARPS); }

static void check_head_size(int C, int NH) {
    CHECK(C / NH <= FLASH_MAX_HS, "flash attention on cuda: head size %d is over %d; hint: more --heads, or "
          "--attention materialized", C / NH, FLASH_MAX_HS);
}

void flash_attention_forward_cuda(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH) {
    if (flash_tc_forward(d, out, lse, qkv, B, T, C, NH)) return;  // head sizes 16, 32, 64, 128
    check_head_size(C, NH);
    size_t rows = (size_t)B * NH * T;
    flash_forward_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, cuda_stream(d, STREAM_COMPUTE)>>>(
        (floatX *)out, lse, (const floatX *)qkv, T, C, NH, rows);
    LAUNCH_CHECK();
}

void flash_attention_backward_cuda(Device *d, act *dqkv, const act *dout, const act *qkv, const act *out,
                                   const float *lse, int B, int T, int C, int NH) {
    check_head_size(C, NH);
    cudaStream_t st = cuda_stream(d, STREAM_COMPUTE);
    size_t rows = (size_t)B * NH * T;
    float *D = (float *)device_scratch(d, flash_cuda_scratch_bytes(B, T, C, NH));
    flash_d_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, st>>>(D, (const floatX *)dout,
                                                                          (const floatX *)out, T, C, NH, rows);
    LAUNCH_CHECK();
    if (flash_tc_backward(d, dqkv, dout, qkv, lse, D, B, T, C, NH)) return;
    flash_dq_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, st>>>(
        (floatX *)dqkv, (const floatX *)dout, (const floatX *)qkv, lse, D, T, C, NH, rows);
    LAUNCH_CHECK();
    flash_dkv_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, st>>>(
        (floatX *)dqkv, (const floatX *)dout, (const floatX *)qkv, lse, D, T, C, NH, rows);
    LAUNCH_CHECK();
}

}  // namespace KERNELS_NS
