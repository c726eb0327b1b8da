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
// straight from their (B,T,3C) and (B,T,C) rows, 16 bytes a load; rows past
// T are zeros.
//
// What keeps the tensor cores fed:
// - A warp's own operands stay in registers for the whole kernel: its 16 rows
//   of q (forward), of q and dy (dq), of k and v (dk, dv) are loaded into
//   fragments once, and the backward's sums dq, dk and dv stay in
//   accumulator fragments until the end, when they go out through shared
//   memory in 16-byte stores.
// - Few shared-memory bank conflicts (figures from a model of the lanes'
//   addresses; bench/cuda.sh counts them on a GPU with Nsight Compute).
//   Shared memory has 32 banks of 4 bytes; where a row's length is a
//   multiple of 128 bytes, every row starts in bank 0. So the rows are
//   padded: a 16-bit tile's by 16 bytes (PAD16), which puts the 8 rows a
//   fragment load reads at once in 8 different groups of 4 banks at head
//   sizes 64 and 128 (12 and 20 banks apart at 16 and 32); an fp32 tile's by
//   32 bytes (PAD32), as its fragments move 8 bytes a lane, 4 rows of 32
//   bytes a half-warp, each row 8 banks on. The row-wise loops (two lanes a
//   row, each over half its columns) visit the columns in a rotated order,
//   column (i + lane) mod n/2 of the lane's half at step i, so that the 32
//   lanes' elements lie in 32 different banks over the scores and over O at
//   head sizes 64 and 128; over a 16-bit tile 2-way conflicts remain in half
//   the steps, and over O 2-way at head size 32, 4-way at 16. In column
//   order, as before, all 16 rows' elements lay in one bank: 16- to 32-way
//   conflicts in every step of those loops.
// - The tiles a block needs only before its first key (or query) tile share
//   memory with the score tiles, and the results leave through them, so 3
//   blocks fit an H100's SM at head size 64 (2 an A100's).
// - The causal grid runs its longest blocks first: the tile is the grid's
//   slow dimension (y), so every head's last query tiles (they see the most
//   keys), or first key tiles, start before any head's shorter ones.
#include <mma.h>
#include "flash_math.h"
#include "kernels_cuda.h"

namespace KERNELS_NS {

using namespace nvcuda;

#define FT FLASH_TILE
#define TC_WARPS (FT / 16)            // a warp per 16 rows of a tile
#define TC_THREADS (TC_WARPS * WARP_SIZE)
// Blocks per SM the compiler must leave registers for, up to head size 64:
// as many as their shared memory allows (63.5 to 72.5 KB a block), 3 on an
// H100's 228 KB, 2 on an A100's 164 KB
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define TC_BLOCKS_PER_SM(hs) ((hs) <= 64 ? 2 : 1)
#else
#define TC_BLOCKS_PER_SM(hs) ((hs) <= 64 ? 3 : 1)
#endif
#define PAD16 8                       // 16 bytes of padding per row of a 16-bit tile
#define PAD32 8                       // 32 bytes of an fp32 tile

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, floatX, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::row_major> FragB;   // B stored (k, n)
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::col_major> FragBt;  // B^T stored (n, k)
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// A row of a 16-bit tile of W columns, and of an fp32 one, padded
template <int W> using Row16 = floatX[W + PAD16];
template <int W> using Row32 = float[W + PAD32];

// Shared memory of each kernel, for head size HS. Every array is a multiple
// of 32 bytes long, so each starts 256-bit aligned, as wmma asks.
template <int HS> struct FwdSmem {
    Row16<HS> k[FT], v[FT];
    Row32<FT> s[FT];              // a key tile's scores; q before the first (as_tile16)
    Row16<FT> p[FT];              // exp(s - m), 16 bits for the product with v
    Row32<HS> o[FT];              // the rows' output so far
    float m[FT], l[FT];
};
template <int HS> struct DqSmem {
    Row16<HS> k[FT], v[FT];
    Row32<FT> scores[2][FT];      // S and dP of a key tile; q and dy before the first, dq after the last
    Row16<FT> ds[FT];
    float lse[FT], D[FT];
};
template <int HS> struct DkvSmem {
    Row16<HS> q[FT], dy[FT];
    Row32<FT> scores[2][FT];      // S^T and dP^T of a query tile; k and v before the first, dk and dv after the last
    Row16<FT> pt[FT], dst[FT];
    float lse[FT], D[FT];
};

// A score tile's memory as a 16-bit tile of HS columns (an operand on its
// way into fragments) or as an fp32 one (a result on its way out)
template <int HS> __device__ inline Row16<HS> *as_tile16(Row32<FT> *scores) {
    static_assert(sizeof(Row16<HS>[FT]) <= sizeof(Row32<FT>[FT]), "a 16-bit tile fits a score tile");
    return reinterpret_cast<Row16<HS> *>(scores);
}
template <int HS> __device__ inline Row32<HS> *as_tile32(Row32<FT> (&scores)[2][FT]) {
    static_assert(sizeof(Row32<HS>[FT]) <= sizeof(scores), "an fp32 tile fits the two score tiles");
    return reinterpret_cast<Row32<HS> *>(scores);
}

// The column a lane visits at step i of a loop over its half of a row of n
// columns (n/2 steps; two lanes a row): rotated, so that the lanes of a
// warp spread over the banks (see the top of this file).
__device__ inline int rotated(int i, int lane, int n) { return (lane % 2) * (n / 2) + (i + lane) % (n / 2); }

// Rows [t0, t0 + FT) of a (T, stride ld) tensor's HS columns into a tile,
// 8 elements a 16-byte load; rows past T are zeros.
template <int HS> __device__ inline void load_tile(Row16<HS> *tile, const floatX *src, int t0, int T, size_t ld) {
    for (int i = threadIdx.x; i < FT * HS / PACK; i += blockDim.x) {
        int r = i / (HS / PACK), e = i % (HS / PACK) * PACK;
        Pack<floatX> x = {};
        if (t0 + r < T) x = *reinterpret_cast<const Pack<floatX> *>(src + (size_t)(t0 + r) * ld + e);
        *reinterpret_cast<Pack<floatX> *>(&tile[r][e]) = x;
    }
}

// Rows [t0, t0 + FT) below T of an fp32 tile out to a (T, stride ld)
// tensor's HS columns, 8 elements a 16-byte store: each element times
// `scale`, or over its row's sum l[r] where l is given.
template <int HS> __device__ inline void store_tile(floatX *dst, size_t ld, const Row32<HS> *tile, int t0, int T,
                                                    float scale, const float *l) {
    for (int i = threadIdx.x; i < FT * HS / PACK; i += blockDim.x) {
        int r = i / (HS / PACK), e = i % (HS / PACK) * PACK;
        if (t0 + r >= T) continue;
        float f = l ? 1.0f / l[r] : scale;
        Pack<floatX> y;
        for (int k = 0; k < PACK; k++) y.x[k] = to_floatX(tile[r][e + k] * f);
        *reinterpret_cast<Pack<floatX> *>(dst + (size_t)(t0 + r) * ld + e) = y;
    }
}

// The warp's 16 rows of a 16-bit tile of K columns, as K/16 fragments
template <int K> __device__ inline void load_rows(FragA (&a)[K / 16], const floatX *rows, int ld) {
    for (int kk = 0; kk < K / 16; kk++) wmma::load_matrix_sync(a[kk], rows + kk * 16, ld);
}

// acc (16 x 16) += a (16 x K) x the n-th 16 columns of b (K x 16N): b read
// from b[k][col] (ld), or from b[col][k] (ld) when `transposed`
template <int K, bool transposed>
__device__ inline void mma_columns(FragC &acc, const FragA (&a)[K / 16], const floatX *b, int ld, int n) {
    for (int kk = 0; kk < K / 16; kk++) {
        if (transposed) {
            FragBt fb;
            wmma::load_matrix_sync(fb, b + (size_t)n * 16 * ld + kk * 16, ld);
            wmma::mma_sync(acc, a[kk], fb, acc);
        } else {
            FragB fb;
            wmma::load_matrix_sync(fb, b + (size_t)kk * 16 * ld + n * 16, ld);
            wmma::mma_sync(acc, a[kk], fb, acc);
        }
    }
}

// out (16 x 16N, fp32, ld_out) = a x b, plus what out holds where `accumulate`
template <int K, int N, bool transposed>
__device__ inline void warp_product(float *out, int ld_out, const FragA (&a)[K / 16], const floatX *b, int ld,
                                    bool accumulate) {
    for (int n = 0; n < N; n++) {
        FragC acc;
        if (accumulate) wmma::load_matrix_sync(acc, out + n * 16, ld_out, wmma::mem_row_major);
        else wmma::fill_fragment(acc, 0.0f);
        mma_columns<K, transposed>(acc, a, b, ld, n);
        wmma::store_matrix_sync(out + n * 16, acc, ld_out, wmma::mem_row_major);
    }
}

// ---- forward ----------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS_PER_SM(HS))
    flash_forward_tc_kernel(floatX *out, float *lse, const floatX *qkv, int T, int C, int NH) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    FwdSmem<HS> &sm = *reinterpret_cast<FwdSmem<HS> *>(smem_raw);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int i0 = (gridDim.y - 1 - blockIdx.y) * FT;  // the last query tiles, the longest, first
    size_t bh = blockIdx.x, b = bh / NH, h = bh % NH, ld = 3 * (size_t)C;
    const floatX *q = qkv + b * T * ld + h * HS, *k = q + C, *v = q + 2 * C;
    float scale = flash_scale(HS);
    Row16<HS> *q_in = as_tile16<HS>(sm.s);
    load_tile<HS>(q_in, q, i0, T, ld);
    for (int i = threadIdx.x; i < FT * HS; i += blockDim.x) sm.o[i / HS][i % HS] = 0.0f;
    for (int i = threadIdx.x; i < FT; i += blockDim.x) sm.m[i] = -INFINITY, sm.l[i] = 0.0f;
    __syncthreads();
    int r0 = warp * 16, r = r0 + lane / 2, half = lane % 2;  // this lane's row, and which half of it
    FragA qf[HS / 16];
    load_rows<HS>(qf, &q_in[r0][0], HS + PAD16);
    for (int j0 = 0; j0 <= i0; j0 += FT) {
        __syncthreads();  // every warp holds its q and is done with the last tile's k and v
        load_tile<HS>(sm.k, k, j0, T, ld);
        load_tile<HS>(sm.v, v, j0, T, ld);
        __syncthreads();
        warp_product<HS, FT / 16, true>(&sm.s[r0][0], FT + PAD32, qf, &sm.k[0][0], HS + PAD16, false);
        __syncwarp();
        int n = flash_visible(i0, r, j0, T - j0 < FT ? T - j0 : FT);
        float tile_max = -INFINITY, sum = 0.0f;
        for (int i = 0; i < FT / 2; i++) {
            int c = rotated(i, lane, FT);
            if (c < n) tile_max = fmaxf(tile_max, sm.s[r][c] * scale);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 1));
        float m_old = sm.m[r], m_new = flash_running_max(m_old, tile_max), corr = flash_rescale(m_old, m_new);
        for (int i = 0; i < FT / 2; i++) {
            int c = rotated(i, lane, FT);
            float p = c < n ? expf(sm.s[r][c] * scale - m_new) : 0.0f;
            sm.p[r][c] = to_floatX(p);
            sum += p;
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        if (corr != 1.0f)  // the maximum moved (both lanes of the row agree)
            for (int i = 0; i < HS / 2; i++) sm.o[r][rotated(i, lane, HS)] *= corr;
        __syncwarp();  // both halves have read m; p and o are written
        if (half == 0) sm.m[r] = m_new, sm.l[r] = sm.l[r] * corr + sum;
        FragA pf[FT / 16];
        load_rows<FT>(pf, &sm.p[r0][0], FT + PAD16);
        warp_product<FT, HS / 16, false>(&sm.o[r0][0], HS + PAD32, pf, &sm.v[0][0], HS + PAD16, true);
    }
    __syncthreads();  // every row's o, m and l are final
    store_tile<HS>(out + b * T * (size_t)C + h * HS, C, sm.o, i0, T, 1.0f, sm.l);
    for (int i = threadIdx.x; i < FT; i += blockDim.x)
        if (i0 + i < T) lse[bh * T + i0 + i] = flash_lse(sm.m[i], sm.l[i]);
}

// ---- backward: dq ------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS_PER_SM(HS))
    flash_dq_tc_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *D, int T,
                       int C, int NH) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    DqSmem<HS> &sm = *reinterpret_cast<DqSmem<HS> *>(smem_raw);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int i0 = (gridDim.y - 1 - blockIdx.y) * FT;  // the last query tiles, the longest, first
    size_t bh = blockIdx.x, b = bh / NH, h = bh % NH, ld = 3 * (size_t)C;
    const floatX *q = qkv + b * T * ld + h * HS, *k = q + C, *v = q + 2 * C;
    const floatX *dy = dout + b * T * (size_t)C + h * HS;
    float scale = flash_scale(HS);
    Row16<HS> *q_in = as_tile16<HS>(sm.scores[0]), *dy_in = as_tile16<HS>(sm.scores[1]);
    load_tile<HS>(q_in, q, i0, T, ld);
    load_tile<HS>(dy_in, dy, i0, T, C);
    for (int i = threadIdx.x; i < FT; i += blockDim.x) {
        sm.lse[i] = i0 + i < T ? lse[bh * T + i0 + i] : 0.0f;
        sm.D[i] = i0 + i < T ? D[bh * T + i0 + i] : 0.0f;
    }
    __syncthreads();
    int r0 = warp * 16, r = r0 + lane / 2;
    FragA qf[HS / 16], dyf[HS / 16];
    load_rows<HS>(qf, &q_in[r0][0], HS + PAD16);
    load_rows<HS>(dyf, &dy_in[r0][0], HS + PAD16);
    FragC dq[HS / 16];
    for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
    Row32<FT> *s = sm.scores[0], *dp = sm.scores[1];
    for (int j0 = 0; j0 <= i0; j0 += FT) {
        __syncthreads();  // every warp holds its q and dy and is done with the last tile's k
        load_tile<HS>(sm.k, k, j0, T, ld);
        load_tile<HS>(sm.v, v, j0, T, ld);
        __syncthreads();
        warp_product<HS, FT / 16, true>(&s[r0][0], FT + PAD32, qf, &sm.k[0][0], HS + PAD16, false);
        warp_product<HS, FT / 16, true>(&dp[r0][0], FT + PAD32, dyf, &sm.v[0][0], HS + PAD16, false);
        __syncwarp();
        int n = flash_visible(i0, r, j0, T - j0 < FT ? T - j0 : FT);
        for (int i = 0; i < FT / 2; i++) {
            int c = rotated(i, lane, FT);
            float p = c < n ? flash_prob(s[r][c] * scale, sm.lse[r]) : 0.0f;
            sm.ds[r][c] = to_floatX(flash_dscore(p, dp[r][c], sm.D[r]));
        }
        __syncwarp();
        FragA dsf[FT / 16];
        load_rows<FT>(dsf, &sm.ds[r0][0], FT + PAD16);
        for (int n = 0; n < HS / 16; n++) mma_columns<FT, false>(dq[n], dsf, &sm.k[0][0], HS + PAD16, n);
    }
    __syncthreads();  // every warp is done with the scores: dq leaves through them
    Row32<HS> *out = as_tile32<HS>(sm.scores);
    for (int n = 0; n < HS / 16; n++)
        wmma::store_matrix_sync(&out[r0][n * 16], dq[n], HS + PAD32, wmma::mem_row_major);
    __syncthreads();
    store_tile<HS>(dqkv + b * T * ld + h * HS, ld, out, i0, T, scale, nullptr);
}

// ---- backward: dk and dv -------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS_PER_SM(HS))
    flash_dkv_tc_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *D, int T,
                        int C, int NH) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    DkvSmem<HS> &sm = *reinterpret_cast<DkvSmem<HS> *>(smem_raw);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int j0 = blockIdx.y * FT;  // the first key tiles, the longest, first
    size_t bh = blockIdx.x, b = bh / NH, h = bh % NH, ld = 3 * (size_t)C;
    const floatX *q = qkv + b * T * ld + h * HS, *k = q + C, *v = q + 2 * C;
    const floatX *dy = dout + b * T * (size_t)C + h * HS;
    float scale = flash_scale(HS);
    Row16<HS> *k_in = as_tile16<HS>(sm.scores[0]), *v_in = as_tile16<HS>(sm.scores[1]);
    load_tile<HS>(k_in, k, j0, T, ld);
    load_tile<HS>(v_in, v, j0, T, ld);
    __syncthreads();
    int r0 = warp * 16, r = r0 + lane / 2;  // r: the key j0 + r
    FragA kf[HS / 16], vf[HS / 16];
    load_rows<HS>(kf, &k_in[r0][0], HS + PAD16);
    load_rows<HS>(vf, &v_in[r0][0], HS + PAD16);
    FragC dk[HS / 16], dv[HS / 16];
    for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
    Row32<FT> *st = sm.scores[0], *dpt = sm.scores[1];
    for (int i0 = j0; i0 < T; i0 += FT) {
        __syncthreads();  // every warp holds its k and v and is done with the last tile's q and dy
        load_tile<HS>(sm.q, q, i0, T, ld);
        load_tile<HS>(sm.dy, dy, i0, T, C);
        for (int i = threadIdx.x; i < FT; i += blockDim.x) {
            sm.lse[i] = i0 + i < T ? lse[bh * T + i0 + i] : 0.0f;
            sm.D[i] = i0 + i < T ? D[bh * T + i0 + i] : 0.0f;
        }
        __syncthreads();
        warp_product<HS, FT / 16, true>(&st[r0][0], FT + PAD32, kf, &sm.q[0][0], HS + PAD16, false);
        warp_product<HS, FT / 16, true>(&dpt[r0][0], FT + PAD32, vf, &sm.dy[0][0], HS + PAD16, false);
        __syncwarp();
        // key j0 + r sees the queries t >= j0 + r below T: columns c >= first
        int first = j0 + r - i0, last = T - i0;
        for (int i = 0; i < FT / 2; i++) {
            int c = rotated(i, lane, FT);
            bool seen = c >= first && c < last;
            float p = seen ? flash_prob(st[r][c] * scale, sm.lse[c]) : 0.0f;
            sm.pt[r][c] = to_floatX(p);
            sm.dst[r][c] = to_floatX(flash_dscore(p, dpt[r][c], sm.D[c]));
        }
        __syncwarp();
        FragA ptf[FT / 16], dstf[FT / 16];
        load_rows<FT>(ptf, &sm.pt[r0][0], FT + PAD16);
        load_rows<FT>(dstf, &sm.dst[r0][0], FT + PAD16);
        for (int n = 0; n < HS / 16; n++) {
            mma_columns<FT, false>(dv[n], ptf, &sm.dy[0][0], HS + PAD16, n);
            mma_columns<FT, false>(dk[n], dstf, &sm.q[0][0], HS + PAD16, n);
        }
    }
    __syncthreads();  // every warp is done with the scores: dk, then dv, leave through them
    Row32<HS> *out = as_tile32<HS>(sm.scores);
    floatX *dk_out = dqkv + b * T * ld + h * HS + C, *dv_out = dk_out + C;
    for (int n = 0; n < HS / 16; n++)
        wmma::store_matrix_sync(&out[r0][n * 16], dk[n], HS + PAD32, wmma::mem_row_major);
    __syncthreads();
    store_tile<HS>(dk_out, ld, out, j0, T, scale, nullptr);
    __syncthreads();
    for (int n = 0; n < HS / 16; n++)
        wmma::store_matrix_sync(&out[r0][n * 16], dv[n], HS + PAD32, wmma::mem_row_major);
    __syncthreads();
    store_tile<HS>(dv_out, ld, out, j0, T, 1.0f, nullptr);
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
    dim3 grid((unsigned)(B * NH), (unsigned)ceil_div((size_t)T, FT));  // the tile the slow dimension
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
    dim3 grid((unsigned)(B * NH), (unsigned)ceil_div((size_t)T, FT));  // the tile the slow dimension
    flash_dq_tc<<<grid, TC_THREADS, sizeof(DqSmem<HS>), st>>>(dqkv, dout, qkv, lse, D, T, C, NH);
    LAUNCH_CHECK();
    flash_dkv_tc<<<grid, TC_THREADS, sizeof(DkvSmem<HS>), st>>>(dqkv, dout, qkv, lse, D, T, C, NH);
    LAUNCH_CHECK();
    return true;
}

// Tiles move in 16-byte loads and stores: the tensors must start 16-byte
// aligned (their rows are, C being a multiple of the head size). The
// warp-per-row kernels take what does not.
bool flash_tc_forward(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH) {
    if (!aligned16(out) || !aligned16(qkv)) return false;
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
    if (!aligned16(dqkv) || !aligned16(dout) || !aligned16(qkv)) return false;
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
