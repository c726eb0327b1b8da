// kernels_cuda_flash_tc.cu: FlashAttention on the tensor cores (nvcuda::wmma,
// 16x16x16 bf16 or fp16 products summed in fp32), for head sizes 16, 32, 64
// and 128; kernels_cuda_flash.cu dispatches here and keeps its warp-per-row
// kernels for the others. The math is flash_math.h's (FlashAttention-2,
// Dao 2023), a tile of FLASH_TILE (64) rows against a tile of 64 keys:
//   forward   a block per (query tile, head), a warp per 16 of its rows:
//             S = q k^T into shared memory, the online softmax row by row (two
//             lanes a row), P rounded to 16 bits, O += P v; O and the rows'
//             running max and sum live in shared memory between key tiles.
//   dq        a block per (query tile, head): S and dP = dy v^T, P from lse,
//             dS = P (dP - D), dq += dS k.
//   dk, dv    a block per (key tile, head), a warp per 16 of its keys, over the
//             query tiles at or below the diagonal: S^T = k q^T, dP^T = v dy^T,
//             dv += P^T dy, dk += dS^T q.
// Every output element is summed by one warp in a fixed order, and written
// once: no atomics, the same bits on every run. q, k, v and dy are read
// straight from their (B,T,3C) and (B,T,C) rows; rows past T are zeros.
#include <mma.h>
#include "flash_math.h"
#include "kernels_cuda.h"

namespace KERNELS_NS {

using namespace nvcuda;

#define FT FLASH_TILE
#define TC_WARPS (FT / 16)            // a warp per 16 rows of a tile
#define TC_THREADS (TC_WARPS * WARP_SIZE)

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, floatX, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::row_major> FragB;   // B stored (k, n)
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::col_major> FragBt;  // B^T stored (n, k)
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// Shared memory of each kernel, for head size HS (every piece a multiple of
// 32 bytes long, so each stays 256-bit aligned for wmma)
template <int HS> struct FwdSmem {
    floatX q[FT][HS], k[FT][HS], v[FT][HS];
    float s[FT][FT];   // scores
    floatX p[FT][FT];  // exp(s - m), 16 bits for the product with v
    float o[FT][HS];   // the rows' output so far
    float m[FT], l[FT];
};
template <int HS> struct DqSmem {
    floatX q[FT][HS], dy[FT][HS], k[FT][HS], v[FT][HS];
    float s[FT][FT], dp[FT][FT];
    floatX ds[FT][FT];
    float dq[FT][HS];
    float lse[FT], D[FT];
};
template <int HS> struct DkvSmem {
    floatX k[FT][HS], v[FT][HS], q[FT][HS], dy[FT][HS];
    float st[FT][FT], dpt[FT][FT];
    floatX pt[FT][FT], dst[FT][FT];
    float dk[FT][HS], dv[FT][HS];
    float lse[FT], D[FT];
};

// Rows [t0, t0 + FT) of a (T, stride ld) tensor's HS columns into a tile; rows past T are zeros.
template <int HS> __device__ inline void load_tile(floatX (*tile)[HS], const floatX *src, int t0, int T, size_t ld) {
    for (int i = threadIdx.x; i < FT * HS; i += blockDim.x) {
        int r = i / HS, e = i % HS;
        tile[r][e] = t0 + r < T ? src[(size_t)(t0 + r) * ld + e] : to_floatX(0.0f);
    }
}

// out (16, 16 n) = a rows (16, K) x b: b's (K, n) tiles read as FragB from
// b[k][n] (ld_b), or as FragBt from b[n][k] (ld_b) when `transposed`
template <int K, bool transposed>
__device__ inline void warp_product(float *out, int ld_out, const floatX *a, int ld_a, const floatX *b, int ld_b,
                                    int n_tiles, bool accumulate) {
    for (int n = 0; n < n_tiles; n++) {
        FragC acc;
        if (accumulate) wmma::load_matrix_sync(acc, out + n * 16, ld_out, wmma::mem_row_major);
        else wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < K / 16; kk++) {
            FragA fa;
            wmma::load_matrix_sync(fa, a + kk * 16, ld_a);
            if (transposed) {
                FragBt fb;
                wmma::load_matrix_sync(fb, b + (size_t)n * 16 * ld_b + kk * 16, ld_b);
                wmma::mma_sync(acc, fa, fb, acc);
            } else {
                FragB fb;
                wmma::load_matrix_sync(fb, b + (size_t)kk * 16 * ld_b + n * 16, ld_b);
                wmma::mma_sync(acc, fa, fb, acc);
            }
        }
        wmma::store_matrix_sync(out + n * 16, acc, ld_out, wmma::mem_row_major);
    }
}

// ---- forward ----------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
    flash_forward_tc_kernel(floatX *out, float *lse, const floatX *qkv, int T, int C, int NH) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    FwdSmem<HS> &sm = *reinterpret_cast<FwdSmem<HS> *>(smem_raw);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, i0 = blockIdx.x * FT;
    size_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * (size_t)C;
    const floatX *q = qkv + b * T * ld + h * HS, *k = q + C, *v = q + 2 * C;
    float scale = flash_scale(HS);
    load_tile<HS>(sm.q, q, i0, T, ld);
    for (int i = threadIdx.x; i < FT * HS; i += blockDim.x) sm.o[i / HS][i % HS] = 0.0f;
    for (int i = threadIdx.x; i < FT; i += blockDim.x) sm.m[i] = -INFINITY, sm.l[i] = 0.0f;
    int r0 = warp * 16, r = r0 + lane / 2, half = lane % 2;  // this lane's row, and which half of it
    for (int j0 = 0; j0 <= i0; j0 += FT) {
        __syncthreads();  // the last tile's k and v are read; q, o, m, l are written
        load_tile<HS>(sm.k, k, j0, T, ld);
        load_tile<HS>(sm.v, v, j0, T, ld);
        __syncthreads();
        warp_product<HS, true>(&sm.s[r0][0], FT, &sm.q[r0][0], HS, &sm.k[0][0], HS, FT / 16, false);
        __syncwarp();
        int n = flash_visible(i0, r, j0, T - j0 < FT ? T - j0 : FT), c0 = half * (FT / 2);
        float tile_max = -INFINITY, sum = 0.0f;
        for (int c = c0; c < c0 + FT / 2; c++)
            if (c < n) tile_max = fmaxf(tile_max, sm.s[r][c] * scale);
        tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 1));
        float m_old = sm.m[r], m_new = flash_running_max(m_old, tile_max), corr = flash_rescale(m_old, m_new);
        for (int c = c0; c < c0 + FT / 2; c++) {
            float p = c < n ? expf(sm.s[r][c] * scale - m_new) : 0.0f;
            sm.p[r][c] = to_floatX(p);
            sum += p;
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        for (int e = half * (HS / 2); e < (half + 1) * (HS / 2); e++) sm.o[r][e] *= corr;
        __syncwarp();  // both halves have read m
        if (half == 0) sm.m[r] = m_new, sm.l[r] = sm.l[r] * corr + sum;
        warp_product<FT, false>(&sm.o[r0][0], HS, &sm.p[r0][0], FT, &sm.v[0][0], HS, HS / 16, true);
    }
    __syncwarp();
    int t = i0 + r;
    if (t >= T) return;
    float inv = 1.0f / sm.l[r];
    floatX *y = out + (b * T + t) * (size_t)C + h * HS;
    for (int e = half * (HS / 2); e < (half + 1) * (HS / 2); e++) y[e] = to_floatX(sm.o[r][e] * inv);
    if (half == 0) lse[bh * T + t] = flash_lse(sm.m[r], sm.l[r]);
}

// ---- backward: dq ------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
    flash_dq_tc_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *D, int T,
                       int C, int NH) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    DqSmem<HS> &sm = *reinterpret_cast<DqSmem<HS> *>(smem_raw);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, i0 = blockIdx.x * FT;
    size_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * (size_t)C;
    const floatX *q = qkv + b * T * ld + h * HS, *k = q + C, *v = q + 2 * C;
    const floatX *dy = dout + b * T * (size_t)C + h * HS;
    float scale = flash_scale(HS);
    load_tile<HS>(sm.q, q, i0, T, ld);
    load_tile<HS>(sm.dy, dy, i0, T, C);
    for (int i = threadIdx.x; i < FT * HS; i += blockDim.x) sm.dq[i / HS][i % HS] = 0.0f;
    for (int i = threadIdx.x; i < FT; i += blockDim.x) {
        sm.lse[i] = i0 + i < T ? lse[bh * T + i0 + i] : 0.0f;
        sm.D[i] = i0 + i < T ? D[bh * T + i0 + i] : 0.0f;
    }
    int r0 = warp * 16, r = r0 + lane / 2, half = lane % 2;
    for (int j0 = 0; j0 <= i0; j0 += FT) {
        __syncthreads();
        load_tile<HS>(sm.k, k, j0, T, ld);
        load_tile<HS>(sm.v, v, j0, T, ld);
        __syncthreads();
        warp_product<HS, true>(&sm.s[r0][0], FT, &sm.q[r0][0], HS, &sm.k[0][0], HS, FT / 16, false);
        warp_product<HS, true>(&sm.dp[r0][0], FT, &sm.dy[r0][0], HS, &sm.v[0][0], HS, FT / 16, false);
        __syncwarp();
        int n = flash_visible(i0, r, j0, T - j0 < FT ? T - j0 : FT);
        for (int c = half * (FT / 2); c < (half + 1) * (FT / 2); c++) {
            float p = c < n ? flash_prob(sm.s[r][c] * scale, sm.lse[r]) : 0.0f;
            sm.ds[r][c] = to_floatX(flash_dscore(p, sm.dp[r][c], sm.D[r]));
        }
        __syncwarp();
        warp_product<FT, false>(&sm.dq[r0][0], HS, &sm.ds[r0][0], FT, &sm.k[0][0], HS, HS / 16, true);
    }
    __syncwarp();
    int t = i0 + r;
    if (t >= T) return;
    floatX *dq = dqkv + b * T * ld + h * HS + (size_t)t * ld;
    for (int e = half * (HS / 2); e < (half + 1) * (HS / 2); e++) dq[e] = to_floatX(scale * sm.dq[r][e]);
}

// ---- backward: dk and dv -------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
    flash_dkv_tc_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *D, int T,
                        int C, int NH) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    DkvSmem<HS> &sm = *reinterpret_cast<DkvSmem<HS> *>(smem_raw);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, j0 = blockIdx.x * FT;
    size_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * (size_t)C;
    const floatX *q = qkv + b * T * ld + h * HS, *k = q + C, *v = q + 2 * C;
    const floatX *dy = dout + b * T * (size_t)C + h * HS;
    float scale = flash_scale(HS);
    load_tile<HS>(sm.k, k, j0, T, ld);
    load_tile<HS>(sm.v, v, j0, T, ld);
    for (int i = threadIdx.x; i < FT * HS; i += blockDim.x) sm.dk[i / HS][i % HS] = sm.dv[i / HS][i % HS] = 0.0f;
    int r0 = warp * 16, r = r0 + lane / 2, half = lane % 2;  // r: the key j0 + r
    for (int i0 = j0; i0 < T; i0 += FT) {
        __syncthreads();
        load_tile<HS>(sm.q, q, i0, T, ld);
        load_tile<HS>(sm.dy, dy, i0, T, C);
        for (int i = threadIdx.x; i < FT; i += blockDim.x) {
            sm.lse[i] = i0 + i < T ? lse[bh * T + i0 + i] : 0.0f;
            sm.D[i] = i0 + i < T ? D[bh * T + i0 + i] : 0.0f;
        }
        __syncthreads();
        warp_product<HS, true>(&sm.st[r0][0], FT, &sm.k[r0][0], HS, &sm.q[0][0], HS, FT / 16, false);
        warp_product<HS, true>(&sm.dpt[r0][0], FT, &sm.v[r0][0], HS, &sm.dy[0][0], HS, FT / 16, false);
        __syncwarp();
        // key j0 + r sees the queries t >= j0 + r below T: columns c >= first
        int first = j0 + r - i0, last = T - i0;
        for (int c = half * (FT / 2); c < (half + 1) * (FT / 2); c++) {
            bool seen = c >= first && c < last;
            float p = seen ? flash_prob(sm.st[r][c] * scale, sm.lse[c]) : 0.0f;
            sm.pt[r][c] = to_floatX(p);
            sm.dst[r][c] = to_floatX(flash_dscore(p, sm.dpt[r][c], sm.D[c]));
        }
        __syncwarp();
        warp_product<FT, false>(&sm.dv[r0][0], HS, &sm.pt[r0][0], FT, &sm.dy[0][0], HS, HS / 16, true);
        warp_product<FT, false>(&sm.dk[r0][0], HS, &sm.dst[r0][0], FT, &sm.q[0][0], HS, HS / 16, true);
    }
    __syncwarp();
    int s = j0 + r;
    if (s >= T) return;
    floatX *dk = dqkv + b * T * ld + h * HS + C + (size_t)s * ld, *dv = dk + C;
    for (int e = half * (HS / 2); e < (half + 1) * (HS / 2); e++) {
        dk[e] = to_floatX(scale * sm.dk[r][e]);
        dv[e] = to_floatX(sm.dv[r][e]);
    }
}

// ---- launches --------------------------------------------------------------------------------

// A kernel's dynamic shared memory: past 48 KB it must be asked for (cheap:
// asked at every launch rather than remembered).
template <class Kernel> static void opt_in(Kernel kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// The launches go through a local name: the emulator's launch rewrite
// (tests/emu/cu2cpp.sed) reads the kernel's name before <<<, which a
// template's arguments would hide.
template <int HS>
static bool forward_tc(Device *d, floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH) {
    if (sizeof(FwdSmem<HS>) > cuda_impl(d)->smem_optin) return false;
    void (*flash_forward_tc)(floatX *, float *, const floatX *, int, int, int) = flash_forward_tc_kernel<HS>;
    opt_in(flash_forward_tc, sizeof(FwdSmem<HS>));
    dim3 grid((unsigned)ceil_div((size_t)T, FT), (unsigned)(B * NH));
    flash_forward_tc<<<grid, TC_THREADS, sizeof(FwdSmem<HS>), cuda_stream(d, STREAM_COMPUTE)>>>(out, lse, qkv, T, C,
                                                                                               NH);
    LAUNCH_CHECK();
    return true;
}

template <int HS>
static bool backward_tc(Device *d, floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse,
                        const float *D, int B, int T, int C, int NH) {
    size_t optin = cuda_impl(d)->smem_optin;
    if (sizeof(DqSmem<HS>) > optin || sizeof(DkvSmem<HS>) > optin) return false;
    typedef void (*Kernel)(floatX *, const floatX *, const floatX *, const float *, const float *, int, int, int);
    Kernel flash_dq_tc = flash_dq_tc_kernel<HS>, flash_dkv_tc = flash_dkv_tc_kernel<HS>;
    opt_in(flash_dq_tc, sizeof(DqSmem<HS>));
    opt_in(flash_dkv_tc, sizeof(DkvSmem<HS>));
    cudaStream_t st = cuda_stream(d, STREAM_COMPUTE);
    dim3 grid((unsigned)ceil_div((size_t)T, FT), (unsigned)(B * NH));
    flash_dq_tc<<<grid, TC_THREADS, sizeof(DqSmem<HS>), st>>>(dqkv, dout, qkv, lse, D, T, C, NH);
    LAUNCH_CHECK();
    flash_dkv_tc<<<grid, TC_THREADS, sizeof(DkvSmem<HS>), st>>>(dqkv, dout, qkv, lse, D, T, C, NH);
    LAUNCH_CHECK();
    return true;
}

bool flash_tc_forward(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH) {
    floatX *o = (floatX *)out;
    const floatX *x = (const floatX *)qkv;
    switch (C / NH) {
    case 16: return forward_tc<16>(d, o, lse, x, B, T, C, NH);
    case 32: return forward_tc<32>(d, o, lse, x, B, T, C, NH);
    case 64: return forward_tc<64>(d, o, lse, x, B, T, C, NH);
    case 128: return forward_tc<128>(d, o, lse, x, B, T, C, NH);
    default: return false;
    }
}

bool flash_tc_backward(Device *d, act *dqkv, const act *dout, const act *qkv, const float *lse, const float *D,
                       int B, int T, int C, int NH) {
    floatX *dx = (floatX *)dqkv;
    const floatX *dy = (const floatX *)dout, *x = (const floatX *)qkv;
    switch (C / NH) {
    case 16: return backward_tc<16>(d, dx, dy, x, lse, D, B, T, C, NH);
    case 32: return backward_tc<32>(d, dx, dy, x, lse, D, B, T, C, NH);
    case 64: return backward_tc<64>(d, dx, dy, x, lse, D, B, T, C, NH);
    case 128: return backward_tc<128>(d, dx, dy, x, lse, D, B, T, C, NH);
    default: return false;
    }
}

}  // namespace KERNELS_NS
