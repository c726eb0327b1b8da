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

// ---- ring attention's blocks (kernels.h's FlashBlock) -----------------------------------
// The same warps over one chunk's query rows and another's keys, each
// tensor with its own strides; y and the gradients in fp32, merged (y, lse)
// or accumulated (dq, dk, dv) across the ring's steps.

// Element offsets of row `row` of the (B*NH*n) rows of a block, n rows per head
struct BlockRow {
    size_t bh, q, kv, o;
    int t;
};

__device__ inline BlockRow block_row(const FlashBlock &f, size_t row, int n) {
    BlockRow r;
    r.bh = row / n;
    r.t = (int)(row % n);
    size_t b = r.bh / f.NH, col = r.bh % f.NH * (size_t)f.hs;
    r.q = b * f.q_bs + col, r.kv = b * f.kv_bs + col, r.o = b * f.o_bs + col;
    return r;
}

// the last key a query row t sees, and the first query row a key s is seen by
__device__ inline int block_last_key(const FlashBlock &f, int t) { return f.causal ? t : f.Tk - 1; }
__device__ inline int block_first_query(const FlashBlock &f, int s) { return f.causal ? s : 0; }

__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_block_forward_kernel(FlashBlock f, float *y, float *lse, int merge, size_t rows) {
    __shared__ float q_s[FLASH_WARPS][FLASH_MAX_HS];
    __shared__ float p_s[FLASH_WARPS][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = f.hs;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    bool live = row < rows;
    BlockRow r = block_row(f, live ? row : 0, f.Tq);
    const floatX *q = (const floatX *)f.q + r.q, *k = (const floatX *)f.k + r.kv, *v = (const floatX *)f.v + r.kv;
    float *yr = y + r.o + (size_t)r.t * f.o_ld, *lse_t = lse + r.bh * f.lse_bs + r.t;
    float scale = flash_scale(hs);
    for (int e = lane; e < hs; e += WARP_SIZE) q_s[warp][e] = to_f32(q[(size_t)r.t * f.q_ld + e]) * scale;
    __syncthreads();
    float m = flash_merge_start_max(merge, lse_t), l = flash_merge_start_sum(merge), acc[FLASH_PER_LANE] = {};
    for (int i = 0; i < FLASH_PER_LANE; i++)
        if (merge && lane + WARP_SIZE * i < hs) acc[i] = yr[lane + WARP_SIZE * i];
    int last = block_last_key(f, r.t);
    for (int j0 = 0; j0 <= last; j0 += WARP_SIZE) {
        int s = j0 + lane, n = last - j0 + 1 < WARP_SIZE ? last - j0 + 1 : WARP_SIZE;
        float z = s <= last ? dot_row(q_s[warp], k + (size_t)s * f.kv_ld, hs) : -INFINITY;
        float m_new = flash_running_max(m, warp_max(z)), corr = flash_rescale(m, m_new);
        float p = s <= last ? expf(z - m_new) : 0.0f;
        p_s[warp][lane] = p;
        __syncwarp();
        l = l * corr + warp_sum(p);
        m = m_new;
        for (int i = 0; i < FLASH_PER_LANE; i++) acc[i] *= corr;
        for (int c = 0; c < n; c++) {
            float pc = p_s[warp][c];
            const floatX *vs = v + (size_t)(j0 + c) * f.kv_ld;
            for (int i = 0; i < FLASH_PER_LANE; i++)
                if (lane + WARP_SIZE * i < hs) acc[i] += pc * to_f32(vs[lane + WARP_SIZE * i]);
        }
        __syncwarp();  // every lane has read this chunk's weights
    }
    if (!live) return;
    for (int i = 0; i < FLASH_PER_LANE; i++)
        if (lane + WARP_SIZE * i < hs) yr[lane + WARP_SIZE * i] = acc[i] / l;
    if (lane == 0) *lse_t = flash_lse(m, l);
}

// D (B,NH,Tq): dy_t . y_t per query row
__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_block_d_kernel(float *D, FlashBlock f, const floatX *y, const floatX *dy, size_t rows) {
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    if (row >= rows) return;
    BlockRow r = block_row(f, row, f.Tq);
    size_t at = r.o + (size_t)r.t * f.o_ld;
    float s = 0.0f;
    for (int e = lane; e < f.hs; e += WARP_SIZE) s += to_f32(dy[at + e]) * to_f32(y[at + e]);
    s = warp_sum(s);
    if (lane == 0) D[row] = s;
}

// dq_t += scale sum_s dz_s k_s, a warp per query row
__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_block_dq_kernel(float *dq, FlashBlock f, const floatX *dy, const float *lse, const float *D, size_t rows) {
    __shared__ float q_s[FLASH_WARPS][FLASH_MAX_HS], dy_s[FLASH_WARPS][FLASH_MAX_HS];
    __shared__ float dz_s[FLASH_WARPS][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = f.hs;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    bool live = row < rows;
    size_t at = live ? row : 0;
    BlockRow r = block_row(f, at, f.Tq);
    const floatX *q = (const floatX *)f.q + r.q, *k = (const floatX *)f.k + r.kv, *v = (const floatX *)f.v + r.kv;
    float scale = flash_scale(hs), lse_t = lse[r.bh * f.lse_bs + r.t], D_t = D[at];
    for (int e = lane; e < hs; e += WARP_SIZE) {
        q_s[warp][e] = to_f32(q[(size_t)r.t * f.q_ld + e]) * scale;
        dy_s[warp][e] = to_f32(dy[r.o + (size_t)r.t * f.o_ld + e]);
    }
    __syncthreads();
    float acc[FLASH_PER_LANE] = {};
    int last = block_last_key(f, r.t);
    for (int j0 = 0; j0 <= last; j0 += WARP_SIZE) {
        int s = j0 + lane, n = last - j0 + 1 < WARP_SIZE ? last - j0 + 1 : WARP_SIZE;
        float dz = 0.0f;
        if (s <= last) {
            float p = flash_prob(dot_row(q_s[warp], k + (size_t)s * f.kv_ld, hs), lse_t);
            dz = flash_dscore(p, dot_row(dy_s[warp], v + (size_t)s * f.kv_ld, hs), D_t);
        }
        __syncwarp();
        dz_s[warp][lane] = dz;
        __syncwarp();
        for (int c = 0; c < n; c++) {
            float dzc = dz_s[warp][c];
            const floatX *ks = k + (size_t)(j0 + c) * f.kv_ld;
            for (int i = 0; i < FLASH_PER_LANE; i++)
                if (lane + WARP_SIZE * i < hs) acc[i] += dzc * to_f32(ks[lane + WARP_SIZE * i]);
        }
    }
    if (!live) return;
    float *dqr = dq + r.o + (size_t)r.t * f.o_ld;
    for (int i = 0; i < FLASH_PER_LANE; i++)
        if (lane + WARP_SIZE * i < hs) dqr[lane + WARP_SIZE * i] += scale * acc[i];
}

// dk_s += scale sum_t dz_t q_t and dv_s += sum_t p_t dy_t, a warp per key row
__global__ void __launch_bounds__(FLASH_WARPS *WARP_SIZE)
    flash_block_dkv_kernel(float *dk, float *dv, FlashBlock f, const floatX *dy, const float *lse, const float *D,
                           size_t rows) {
    __shared__ float k_s[FLASH_WARPS][FLASH_MAX_HS], v_s[FLASH_WARPS][FLASH_MAX_HS];
    __shared__ float p_s[FLASH_WARPS][WARP_SIZE], dz_s[FLASH_WARPS][WARP_SIZE];
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, hs = f.hs;
    size_t row = (size_t)blockIdx.x * FLASH_WARPS + warp;
    bool live = row < rows;
    BlockRow r = block_row(f, live ? row : 0, f.Tk);  // r.t is the key's position s
    const floatX *q = (const floatX *)f.q + r.q, *k = (const floatX *)f.k + r.kv, *v = (const floatX *)f.v + r.kv;
    const floatX *dyh = dy + r.o;
    const float *lse_h = lse + r.bh * f.lse_bs, *D_h = D + r.bh * f.Tq;
    float scale = flash_scale(hs);
    for (int e = lane; e < hs; e += WARP_SIZE) {
        k_s[warp][e] = to_f32(k[(size_t)r.t * f.kv_ld + e]) * scale;
        v_s[warp][e] = to_f32(v[(size_t)r.t * f.kv_ld + e]);
    }
    __syncthreads();
    float dk_acc[FLASH_PER_LANE] = {}, dv_acc[FLASH_PER_LANE] = {};
    for (int t0 = block_first_query(f, r.t); t0 < f.Tq; t0 += WARP_SIZE) {
        int t = t0 + lane, n = f.Tq - t0 < WARP_SIZE ? f.Tq - t0 : WARP_SIZE;
        float p = 0.0f, dz = 0.0f;
        if (t < f.Tq) {
            p = flash_prob(dot_row(k_s[warp], q + (size_t)t * f.q_ld, hs), lse_h[t]);
            dz = flash_dscore(p, dot_row(v_s[warp], dyh + (size_t)t * f.o_ld, hs), D_h[t]);
        }
        __syncwarp();
        p_s[warp][lane] = p, dz_s[warp][lane] = dz;
        __syncwarp();
        for (int c = 0; c < n; c++) {
            float pc = p_s[warp][c], dzc = dz_s[warp][c];
            const floatX *qt = q + (size_t)(t0 + c) * f.q_ld, *dyt = dyh + (size_t)(t0 + c) * f.o_ld;
            for (int i = 0; i < FLASH_PER_LANE; i++) {
                int e = lane + WARP_SIZE * i;
                if (e < hs) dv_acc[i] += pc * to_f32(dyt[e]), dk_acc[i] += dzc * to_f32(qt[e]);
            }
        }
    }
    if (!live) return;
    float *dkr = dk + r.kv + (size_t)r.t * f.kv_ld, *dvr = dv + r.kv + (size_t)r.t * f.kv_ld;
    for (int i = 0; i < FLASH_PER_LANE; i++) {
        int e = lane + WARP_SIZE * i;
        if (e < hs) dkr[e] += scale * dk_acc[i], dvr[e] += dv_acc[i];
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

void flash_block_forward_cuda(Device *d, const FlashBlock *f, float *y, float *lse, int merge) {
    CHECK(f->hs <= FLASH_MAX_HS, "ring attention on cuda: head size %d is over %d", f->hs, FLASH_MAX_HS);
    size_t rows = (size_t)f->B * f->NH * f->Tq;
    flash_block_forward_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, cuda_stream(d, STREAM_COMPUTE)>>>(
        *f, y, lse, merge, rows);
    LAUNCH_CHECK();
}

void flash_block_backward_cuda(Device *d, const FlashBlock *f, const act *y, const act *dy, const float *lse,
                               float *dq, float *dk, float *dv) {
    CHECK(f->hs <= FLASH_MAX_HS, "ring attention on cuda: head size %d is over %d", f->hs, FLASH_MAX_HS);
    cudaStream_t st = cuda_stream(d, STREAM_COMPUTE);
    size_t rows = (size_t)f->B * f->NH * f->Tq, keys = (size_t)f->B * f->NH * f->Tk;
    float *D = (float *)device_scratch(d, rows * sizeof(float));  // within flash_cuda_scratch_bytes: Tq <= T
    flash_block_d_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, st>>>(D, *f, (const floatX *)y,
                                                                                (const floatX *)dy, rows);
    LAUNCH_CHECK();
    flash_block_dq_kernel<<<flash_blocks(rows), FLASH_WARPS * WARP_SIZE, 0, st>>>(dq, *f, (const floatX *)dy, lse,
                                                                                 D, rows);
    LAUNCH_CHECK();
    flash_block_dkv_kernel<<<flash_blocks(keys), FLASH_WARPS * WARP_SIZE, 0, st>>>(dk, dv, *f, (const floatX *)dy,
                                                                                  lse, D, keys);
    LAUNCH_CHECK();
}

}  // namespace KERNELS_NS
