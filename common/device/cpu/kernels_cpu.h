// kernels_cpu.h: the cpu kernels that live outside kernels_cpu.c (the GEMM
// based ones, those of tensor parallelism and the quantization), so that the table in
// kernels_cpu.c can name them. Internal to
// the cpu kernels; everything else goes through `kernels_cpu` (kernels.h).
//
// Threads: OpenMP owns the cores and OpenBLAS runs single-threaded inside
// OpenMP threads (openblas_set_num_threads(1) at device init): GEMMs are split
// by rows over the threads, attention runs one head per thread. Letting
// OpenBLAS's own pool and OpenMP's take turns on the same cores makes each
// spin while the other works. Where OpenBLAS was left multithreaded, the GEMM
// loops run on one OpenMP thread instead, so the pools never run at once
// (measured on 2 cores, a GPT-2 124M step at B=4, T=256: 170 GFLOP/s with
// OpenBLAS single-threaded, 125-140 GFLOP/s with its 2 threads).
#pragma once
#include <cblas.h>
#include "kernels.h"

static inline int blas_single_threaded(void) { return openblas_get_num_threads() == 1; }

// Row sums in one order whatever vector width the compiler picks: element c
// goes to partial sum c mod SUM_LANES, and the partials fold pairwise. An
// `omp simd reduction` leaves the order to the width, so an AVX2 build (8
// lanes) and an AVX-512 one (16) summed a layernorm's row differently and
// their runs drifted apart; now both give these bits (test_kernels_isa).
#define SUM_LANES 16
static inline float fold_lanes(float *acc) {
    for (int w = SUM_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}
// sum of x[0..n)
static inline float lanes_sum(const float *x, int n) {
    float acc[SUM_LANES] = {0};
    int c = 0;
    for (; c + SUM_LANES <= n; c += SUM_LANES)
#pragma omp simd
        for (int l = 0; l < SUM_LANES; l++) acc[l] += x[c + l];
    for (int l = 0; c + l < n; l++) acc[l] += x[c + l];
    return fold_lanes(acc);
}
// sum of (x - m)^2 over x[0..n)
static inline float lanes_sum_sq_dev(const float *x, float m, int n) {
    float acc[SUM_LANES] = {0};
    int c = 0;
    for (; c + SUM_LANES <= n; c += SUM_LANES)
#pragma omp simd
        for (int l = 0; l < SUM_LANES; l++) acc[l] += (x[c + l] - m) * (x[c + l] - m);
    for (int l = 0; c + l < n; l++) acc[l] += (x[c + l] - m) * (x[c + l] - m);
    return fold_lanes(acc);
}
// sum of a * b over [0..n)
static inline float lanes_dot(const float *a, const float *b, int n) {
    float acc[SUM_LANES] = {0};
    int c = 0;
    for (; c + SUM_LANES <= n; c += SUM_LANES)
#pragma omp simd
        for (int l = 0; l < SUM_LANES; l++) acc[l] += a[c + l] * b[c + l];
    for (int l = 0; c + l < n; l++) acc[l] += a[c + l] * b[c + l];
    return fold_lanes(acc);
}

// kernels_cpu.c: the embedding's backward, shared with the vocabulary-parallel one;
// dout (BT,C) in fp32, wte's rows [begin, begin + rows) (all: 0, INT_MAX)
void wte_backward_by_token_cpu(float *dwte, const float *dout, const int32_t *tokens, const TokenBuckets *tb,
                               int BT, int C, int begin, int rows);
void wpe_backward_cpu(float *dwpe, const float *dout, int B, int T, int C);

// kernels_cpu_matmul.c
void matmul_forward_cpu(Device *d, act *out, const act *inp, const bf16 *w, const bf16 *bias,
                        int BT, int C, int OC, int ldo);
void matmul_backward_cpu(Device *d, act *dinp, float *dw, float *dbias, const act *dout,
                         const act *inp, const bf16 *w, int BT, int C, int OC, int ldo);

// Scratch bytes of matmul_forward_cpu with C inputs and OC outputs (its
// backward asks for less).
size_t matmul_cpu_scratch_bytes(int C, int OC);

// kernels_cpu_attention.c
void attention_forward_cpu(Device *d, act *out, float *att, const act *qkv, int B, int T, int C,
                           int NH);
void attention_backward_cpu(Device *d, act *dqkv, const act *dout, const act *qkv,
                            const float *att, int B, int T, int C, int NH);
// Scratch bytes of attention_backward_cpu: a (T,T) tile per thread.
size_t attention_cpu_scratch_bytes(int threads, int T);

// kernels_cpu_flash.c
void flash_attention_forward_cpu(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH);
void flash_attention_backward_cpu(Device *d, act *dqkv, const act *dout, const act *qkv, const act *out,
                                  const float *lse, int B, int T, int C, int NH);
// Scratch bytes of both: two tiles and a row of T per thread.
size_t flash_cpu_scratch_bytes(int threads, int T);
void flash_block_forward_cpu(Device *d, const FlashBlock *f, float *y, float *lse, int merge);
void flash_block_backward_cpu(Device *d, const FlashBlock *f, const act *y, const act *dy, const float *lse,
                              float *dq, float *dk, float *dv);

// kernels_cpu_tp.c (tensor parallelism)
void bias_add_cpu(Device *d, act *out, const bf16 *bias, int BT, int OC);
void embedding_part_forward_cpu(Device *d, act *out, const int32_t *tokens, const bf16 *wte_part,
                                int vocab_begin, int rows, const bf16 *wpe, int B, int T, int C);
void embedding_part_backward_cpu(Device *d, float *dwte_part, float *dwpe, const act *dout, const int32_t *tokens,
                                 const TokenBuckets *tb, int vocab_begin, int rows, int B, int T, int C);
void crossentropy_part_max_cpu(Device *d, float *maxv, const act *logits, int BT, int V, int ld);
void crossentropy_part_sums_cpu(Device *d, float *sums, const act *logits, const float *maxv,
                                const int32_t *targets, int vocab_begin, int BT, int V, int ld);
void crossentropy_part_finish_cpu(Device *d, float *losses, act *logits, const float *maxv,
                                  const float *sums, const int32_t *targets, int vocab_begin,
                                  int BT, int V, int ld, float dloss_scale);

// kernels_cpu_quant.c (block quantization, quant_math.h)
void quantize_half_cpu(Device *d, void *packed, const bf16 *x, size_t n, int bits, int block);
void quantize_f32_cpu(Device *d, void *packed, const float *x, size_t n, int bits, int block);
void dequantize_half_cpu(Device *d, bf16 *out, const void *packed, size_t n, int bits, int block);
void dequantize_f32_cpu(Device *d, float *acc, const void *packed, size_t n, int bits, int block, int accumulate);

// Converts a bf16 tensor to fp32 (OpenMP over elements); shared by the GEMM
// kernels, which hand fp32 operands to sgemm.
void half_to_f32_cpu(Device *d, float *dst, const bf16 *src, size_t n);
