// emu_wmma.cu: the emulator's nvcuda::wmma (include/mma.h) at work, for
// tests/emu/test_emu.c: `emu_wmma CASE` runs one case. "products" multiplies
// 16x16x16 tiles of bf16 and of half in every layout of A, B and the
// accumulator against a reference summed in the emulator's order (fp32, C
// first, then k = 0..15) and prints how many agree to the bit; the other
// cases each hold one mistake, on the line marked "// mark: CASE". The
// normal build compiles this file with nvcc for sm_80 and sm_90 too: the
// emulated subset is CUDA's own.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

using namespace nvcuda;

#define CHECK(call)                                                                     \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorName(e_));   \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define LD16 24  // leading dimension of the 16-bit tiles: rows (or columns) 48 bytes apart
#define LDF 20   // of the fp32 tiles: 80 bytes apart

// ---- the products ---------------------------------------------------------------------------

// One warp: d = a b + c. The accumulator is both c and d, and right after
// mma_sync every lane overwrites its a and b fragments, as code that loads
// the next tiles into them does: the warp's product must be complete by then.
template <class T, class LA, class LB>
__global__ void tile_product(float *d, const T *a, const T *b, const float *c, wmma::layout_t cd) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a, LD16);
    wmma::load_matrix_sync(fb, b, LD16);
    wmma::load_matrix_sync(acc, c, LDF, cd);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::fill_fragment(fa, fa.x[0]);
    wmma::fill_fragment(fb, fb.x[1]);
    wmma::store_matrix_sync(d, acc, LDF, cd);
}

// element (r, c) of a 16x16 tile stored with leading dimension ld
static size_t at(int r, int c, int ld, bool row_major) { return row_major ? (size_t)r * ld + c : (size_t)c * ld + r; }

static float host_float(__nv_bfloat16 v) { return __bfloat162float(v); }
static float host_float(__half v) { return __half2float(v); }
template <class T> static T host_half(float v);
template <> __nv_bfloat16 host_half<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __half host_half<__half>(float v) { return __float2half(v); }

template <class L> static bool is_row() { return false; }
template <> bool is_row<wmma::row_major>() { return true; }

// Runs one product on tiles drawn from `seed`; returns how many of the 256
// elements differ from the reference in their bits.
template <class T, class LA, class LB> static int product(wmma::layout_t cd, unsigned seed) {
    bool ra = is_row<LA>(), rb = is_row<LB>(), rc = cd == wmma::mem_row_major;
    T ha[16 * LD16], hb[16 * LD16];
    float hc[16 * LDF], want[16 * LDF], got[16 * LDF];
    unsigned x = seed;
    for (int i = 0; i < 16 * LD16; i++) {  // 8 significant bits (exact in bf16 and half), 2^-8 to 4
        x = x * 1664525u + 1013904223u;
        ha[i] = host_half<T>(ldexpf((float)((x >> 24) | 128u), (int)(x >> 4 & 7u) - 15) * (x & 8u ? -1 : 1));
        x = x * 1664525u + 1013904223u;
        hb[i] = host_half<T>(ldexpf((float)((x >> 24) | 128u), (int)(x >> 4 & 7u) - 15) * (x & 8u ? -1 : 1));
    }
    for (int i = 0; i < 16 * LDF; i++) {  // every bit of the fp32 significand used: each add rounds
        x = x * 1664525u + 1013904223u;
        hc[i] = (float)(int)(x >> 8) / 8192.0f - 1024.0f;
    }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float s = hc[at(m, n, LDF, rc)];
            for (int k = 0; k < 16; k++) s += host_float(ha[at(m, k, LD16, ra)]) * host_float(hb[at(k, n, LD16, rb)]);
            want[at(m, n, LDF, rc)] = s;
        }
    T *da, *db;
    float *dc, *dd;
    CHECK(cudaMalloc((void **)&da, sizeof ha));
    CHECK(cudaMalloc((void **)&db, sizeof hb));
    CHECK(cudaMalloc((void **)&dc, sizeof hc));
    CHECK(cudaMalloc((void **)&dd, sizeof hc));
    CHECK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dc, hc, sizeof hc, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dd, hc, sizeof hc, cudaMemcpyHostToDevice));
    tile_product<T, LA, LB><<<1, 32>>>(dd, da, db, dc, cd);
    CHECK(cudaMemcpy(got, dd, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(dd));
    int differ = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) differ += memcmp(&got[at(m, n, LDF, rc)], &want[at(m, n, LDF, rc)], 4) != 0;
    return differ;
}

template <class T> static int products_of(unsigned seed) {
    int bad = 0;
    for (int cd = 0; cd < 2; cd++) {
        wmma::layout_t l = cd ? wmma::mem_col_major : wmma::mem_row_major;
        bad += product<T, wmma::row_major, wmma::row_major>(l, seed) != 0;
        bad += product<T, wmma::row_major, wmma::col_major>(l, seed + 1) != 0;
        bad += product<T, wmma::col_major, wmma::row_major>(l, seed + 2) != 0;
        bad += product<T, wmma::col_major, wmma::col_major>(l, seed + 3) != 0;
    }
    return bad;
}

// ---- code that assumes a layout, and the warp's mistakes -------------------------------------------

// A = identity written into x[] on the guess that lane l holds elements
// 8l..8l+7 of the row-major tile: D = A B is B only if the guess is right.
__global__ void guessed_identity(float *d, const __nv_bfloat16 *b) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    for (int i = 0; i < fa.num_elements; i++) {
        int e = (int)threadIdx.x * fa.num_elements + i;
        fa.x[i] = __float2bfloat16(e / 16 == e % 16 ? 1.0f : 0.0f);
    }
    wmma::load_matrix_sync(fb, b, 16);
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// `leave`: a lane that returns before the product; `odd`: a lane that stores
// while the others multiply; `offset`: elements each odd lane adds to the
// pointer it loads from, or every lane when `all`
__global__ void warp_mistakes(float *d, const __half *a, int leave, int odd, int offset, int all) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    int lane = (int)threadIdx.x % 32;
    const __half *p = a + (all || lane % 2 ? offset : 0);
    wmma::load_matrix_sync(fa, p, 16);  // mark: load
    wmma::load_matrix_sync(fb, a, 16);
    wmma::fill_fragment(acc, 0.0f);
    if (lane == leave) return;
    if (lane == odd) {
        wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);  // mark: odd_store
        return;
    }
    wmma::mma_sync(acc, fa, fb, acc);  // mark: mma
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: emu_wmma CASE\n");
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "products")) {
        int bad = products_of<__nv_bfloat16>(1) + products_of<__half>(100);
        printf("%d of 16 products differ from the reference\n", bad);
        return 0;
    }
    float *d = NULL;
    __half *a = NULL;
    CHECK(cudaMalloc((void **)&d, 16 * 16 * sizeof(float)));
    CHECK(cudaMalloc((void **)&a, 2 * 16 * 16 * sizeof(__half)));
    CHECK(cudaMemset(a, 0, 2 * 16 * 16 * sizeof(__half)));
    if (!strcmp(c, "guessed_layout")) {
        __nv_bfloat16 hb[256];
        float got[256];
        for (int i = 0; i < 256; i++) hb[i] = __float2bfloat16((float)(i % 7 - 3));
        __nv_bfloat16 *b = NULL;
        CHECK(cudaMalloc((void **)&b, sizeof hb));
        CHECK(cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice));
        guessed_identity<<<1, 32>>>(d, b);
        CHECK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
        int differ = 0;
        for (int i = 0; i < 256; i++) differ += got[i] != __bfloat162float(hb[i]);
        printf("A B differs from B in %d of 256 elements\n", differ);
        return 0;
    }
    if (!strcmp(c, "whole_warp")) warp_mistakes<<<2, 64>>>(d, a, -1, -1, 0, 0);
    else if (!strcmp(c, "missing_lane")) warp_mistakes<<<1, 32>>>(d, a, 5, -1, 0, 0);
    else if (!strcmp(c, "mixed_ops")) warp_mistakes<<<1, 32>>>(d, a, -1, 3, 0, 0);
    else if (!strcmp(c, "partial_warp")) warp_mistakes<<<1, 16>>>(d, a, -1, -1, 0, 0);
    else if (!strcmp(c, "unequal_pointers")) warp_mistakes<<<1, 32>>>(d, a, -1, -1, 16, 0);
    else if (!strcmp(c, "misaligned")) warp_mistakes<<<1, 32>>>(d, a, -1, -1, 8, 1);
    else {
        fprintf(stderr, "emu_wmma: unknown case %s\n", c);
        return 2;
    }
    CHECK(cudaDeviceSynchronize());
    printf("ran clean\n");
    return 0;
}
