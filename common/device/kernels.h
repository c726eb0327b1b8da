// kernels.h: the kernel API of the GPT-2 model and the optimizer. One table of
// functions per device (kernels_cpu.c, kernels_cuda.cu); all run on the
// compute stream of `d`.
//
// Types: parameters are bf16; parameter gradients are accumulated in fp32
// (`float *d...` arguments, always +=); activations are `act` = void*, whose
// element is fp32 on cpu and bf16 on cuda (d->act_bytes). Saved softmax
// statistics (mean, rstd, attention probabilities, losses) are fp32.
// Shapes: B batch, T sequence, C channels, OC output channels, NH heads,
// V vocabulary, BT = B*T. Row-major throughout.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "bf16.h"
#include "elementwise.h"
#include "device.h"
#include "token_buckets.h"

typedef void act;

// One block of ring attention (gpt_ring.c): the query rows of one chunk of
// each sequence against the key rows of another. Heads are NH columns of hs
// elements (head h at column h*hs) in every tensor below; strides are in
// elements: _ld between rows, _bs between sequences.
//   - q (Tq rows), k and v (Tk rows), act; the key gradients dk, dv (fp32)
//     have k's strides;
//   - the output y and its gradient dy (act), and y's and dq's fp32
//     accumulators, o_ld and o_bs;
//   - lse (B,NH,...) fp32: head h of sequence b at (b*NH + h)*lse_bs.
// causal: the diagonal chunk (Tq == Tk, the same positions): key s is seen
// by query t when s <= t; else every key is seen (a chunk before the query's).
typedef struct FlashBlock {
    int B, NH, hs, Tq, Tk, causal;
    const act *q, *k, *v;
    size_t q_ld, q_bs, kv_ld, kv_bs, o_ld, o_bs, lse_bs;
} FlashBlock;

typedef struct KernelOps {
    // out (B,T,C) = wte[tokens] + wpe[t]; tokens (B,T) int32 in device memory
    void (*encoder_forward)(Device *d, act *out, const int32_t *tokens, const bf16 *wte,
                            const bf16 *wpe, int B, int T, int C);
    // dwte (V,C) += dout summed by token, each row over its positions in
    // increasing order (tb: the tokens' buckets, in device memory; no atomics,
    // so the same bits on every run); dwpe (maxT,C) += sum over batch
    void (*encoder_backward)(Device *d, float *dwte, float *dwpe, const act *dout,
                             const int32_t *tokens, const TokenBuckets *tb, int B, int T, int C);
    // out (BT,C); mean, rstd (BT) saved; eps 1e-5
    void (*layernorm_forward)(Device *d, act *out, float *mean, float *rstd, const act *inp,
                              const bf16 *w, const bf16 *b, int BT, int C);
    // dinp (BT,C) += ; dw, db (C) +=
    void (*layernorm_backward)(Device *d, act *dinp, float *dw, float *db, const act *dout,
                               const act *inp, const bf16 *w, const float *mean,
                               const float *rstd, int BT, int C);
    // out (BT,OC) = inp (BT,C) @ w (OC,C)^T + bias (OC); bias may be NULL.
    // ldo >= OC is the row stride of out (and of dout below); columns
    // OC..ldo-1 are neither read nor written.
    void (*matmul_forward)(Device *d, act *out, const act *inp, const bf16 *w, const bf16 *bias,
                           int BT, int C, int OC, int ldo);
    // dinp (BT,C) = dout @ w (overwritten; skipped when dinp is NULL);
    // dw (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout (skipped when NULL);
    // with dw NULL neither (zero bubble splits the two: B, then W with dinp NULL)
    void (*matmul_backward)(Device *d, act *dinp, float *dw, float *dbias, const act *dout,
                            const act *inp, const bf16 *w, int BT, int C, int OC, int ldo);
    // causal self-attention. qkv (B,T,3C) holds q,k,v each (B,T,NH,hs) with hs = C/NH;
    // out (B,T,C); att (B,NH,T,T) saves the softmax probabilities (zero above the diagonal)
    void (*attention_forward)(Device *d, act *out, float *att, const act *qkv, int B, int T,
                              int C, int NH);
    // dqkv (B,T,3C) overwritten
    void (*attention_backward)(Device *d, act *dqkv, const act *dout, const act *qkv,
                               const float *att, int B, int T, int C, int NH);
    // The same attention as FlashAttention (flash_math.h): out (B,T,C) as above;
    // lse (B,NH,T) fp32, each query row's log-sum-exp of its scaled scores, is
    // all it saves. No (T,T) matrix is written, not even to scratch.
    void (*flash_attention_forward)(Device *d, act *out, float *lse, const act *qkv, int B, int T,
                                    int C, int NH);
    // dqkv (B,T,3C) overwritten, from the forward's out and lse (the
    // probabilities recomputed a tile at a time)
    void (*flash_attention_backward)(Device *d, act *dqkv, const act *dout, const act *qkv,
                                     const act *out, const float *lse, int B, int T, int C, int NH);
    // Ring attention's block (FlashBlock). Forward: y and lse (fp32) are
    // the attention of the rows to the keys of the chunks seen so far, and
    // this block's keys are merged into them through the log-sum-exp
    // (flash_math.h's flash_merge_start); merge 0 starts them afresh.
    void (*flash_block_forward)(Device *d, const FlashBlock *f, float *y, float *lse, int merge);
    // Backward, from the whole attention's y, its gradient dy and its lse:
    // dq (o strides), dk and dv (k's) += this block's part, in fp32.
    void (*flash_block_backward)(Device *d, const FlashBlock *f, const act *y, const act *dy, const float *lse,
                                 float *dq, float *dk, float *dv);
    // The MLP's linear and GELU as one op each way (on cuda, cuBLASLt epilogues):
    // pre (BT,OC) = inp (BT,C) @ w (OC,C)^T + bias (OC), kept for backward; out = gelu(pre).
    // Rows packed (ld = OC); bias may be NULL.
    void (*matmul_gelu_forward)(Device *d, act *out, act *pre, const act *inp, const bf16 *w,
                                const bf16 *bias, int BT, int C, int OC);
    // The backward of a linear whose input is a GELU's output, inp = gelu(pre) (BT,C):
    // dpre (BT,C) = (dout @ w) * gelu'(pre) (overwritten); dw, dbias as matmul_backward
    // (dw NULL: neither; the weights' part is matmul_backward's with dinp NULL, the same bits).
    // The same numbers as matmul_backward and gelu_backward, up to rounding.
    void (*gelu_matmul_backward)(Device *d, act *dpre, float *dw, float *dbias, const act *dout,
                                 const act *inp, const act *pre, const bf16 *w, int BT, int C, int OC);
    void (*gelu_forward)(Device *d, act *out, const act *inp, size_t n);
    // dinp = gelu'(inp) * dout (overwritten; dinp may alias dout)
    void (*gelu_backward)(Device *d, act *dinp, const act *inp, const act *dout, size_t n);
    // out = a + b (out may alias a)
    void (*residual_forward)(Device *d, act *out, const act *a, const act *b, size_t n);
    // res (BT,C) = a + b, then out = layernorm(res) as layernorm_forward
    // (res may alias a): the residual add fused into the layernorm after it,
    // so the residual stream is read once where the two kernels read it twice
    void (*residual_layernorm_forward)(Device *d, act *res, act *out, float *mean, float *rstd, const act *a,
                                       const act *b, const bf16 *w, const bf16 *bias, int BT, int C);
    // Fused softmax + cross-entropy over logits (BT,ld): columns [0,V) are the
    // vocabulary, columns [V,ld) wte's padding rows, left out of the softmax.
    // losses (BT) = -log p[target]. When dloss_scale != 0, logits are
    // overwritten by dloss/dlogits = (softmax - onehot(target)) * dloss_scale
    // (the scale is 1 / tokens in the global batch), 0 in the padding columns.
    void (*softmax_crossentropy)(Device *d, float *losses, act *logits, const int32_t *targets,
                                 int BT, int V, int ld, float dloss_scale);

    // ---- tensor parallelism (Shoeybi et al., Megatron-LM); the all-reduces between are the caller's ----
    // out (BT,OC) += bias (OC) on every row: a row-parallel linear's bias, added once after the all-reduce
    void (*bias_add)(Device *d, act *out, const bf16 *bias, int BT, int OC);
    // Vocabulary-parallel embedding; this rank holds wte rows [vocab_begin, vocab_begin + rows).
    // out (B,T,C) = wte_part[token - vocab_begin] for tokens in that range, 0 for the others,
    // plus wpe[t] unless wpe is NULL (one rank adds the positions, so the sum over ranks has them once)
    void (*embedding_part_forward)(Device *d, act *out, const int32_t *tokens, const bf16 *wte_part,
                                   int vocab_begin, int rows, const bf16 *wpe, int B, int T, int C);
    // dwte_part (rows,C) += dout summed by the tokens in this rank's range, as encoder_backward (tb);
    // dwpe (maxT,C) += sum over the batch
    void (*embedding_part_backward)(Device *d, float *dwte_part, float *dwpe, const act *dout,
                                    const int32_t *tokens, const TokenBuckets *tb, int vocab_begin, int rows,
                                    int B, int T, int C);
    // Vocabulary-parallel cross-entropy on this rank's logits (BT,ld): columns [0,V) are vocabulary
    // entries vocab_begin + column, columns [V,ld) padding rows of wte, left out of the softmax.
    // Three steps, the caller all-reducing after the first (max) and the second (sum):
    // maxv (BT) = row maximum over the V columns (-inf when V = 0)
    void (*crossentropy_part_max)(Device *d, float *maxv, const act *logits, int BT, int V, int ld);
    // sums (2,BT) = [sum over the V columns of exp(z - maxv) | z[target] if the target is one of
    // this rank's columns, else 0]; maxv is the group's maximum
    void (*crossentropy_part_sums)(Device *d, float *sums, const act *logits, const float *maxv,
                                   const int32_t *targets, int vocab_begin, int BT, int V, int ld);
    // losses (BT) = log(sum) + maxv - z[target] from the group's sums; when dloss_scale != 0 the
    // logits become dlogits: (softmax - onehot(target)) * dloss_scale, 0 in the padding columns
    void (*crossentropy_part_finish)(Device *d, float *losses, act *logits, const float *maxv,
                                     const float *sums, const int32_t *targets, int vocab_begin,
                                     int BT, int V, int ld, float dloss_scale);

    // ---- gradients and optimizer (bf16 storage, fp32 math) ----
    // dst = (accumulate ? dst : 0) + src, rounded to bf16
    void (*grad_to_bf16)(Device *d, bf16 *dst, const float *src, size_t n, int accumulate);
    // dst += src (bf16, fp32 sum, rounded)
    void (*add_bf16)(Device *d, bf16 *dst, const bf16 *src, size_t n);
    // the fp32 gradient accumulator (grad_accum.h): acc = (accumulate ? acc : 0) + g,
    // from fp32 unit gradients or from 16-bit reduced parts
    void (*accumulate_f32)(Device *d, float *acc, const float *g, size_t n, int accumulate);
    void (*accumulate_half_f32)(Device *d, float *acc, const bf16 *h, size_t n, int accumulate);
    // sum of squares of a bf16 vector in double, returned to the host (synchronizes)
    double (*sum_squares_bf16)(Device *d, const bf16 *x, size_t n);
    // AdamW over n elements: master/m/v fp32, grad bf16; param = bf16(master) (param may be NULL)
    void (*adamw)(Device *d, float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                  size_t n, const AdamWStep *s);
    // 16-bit rows to fp32 and back in the device's format (d->half: bf16 or fp16)
    void (*f32_to_half)(Device *d, bf16 *dst, const float *src, size_t n);
    void (*half_to_f32)(Device *d, float *dst, const bf16 *src, size_t n);

    // ---- block quantization (ZeRO++'s qwZ and qgZ; quant_math.h) ----
    // x (n) into one packed piece at `packed` (4-byte aligned, quant_packed_bytes):
    // a scale per `block` elements (even), then the values at `bits` (8 or 4)
    void (*quantize_half)(Device *d, void *packed, const bf16 *x, size_t n, int bits, int block);
    void (*quantize_f32)(Device *d, void *packed, const float *x, size_t n, int bits, int block);
    // out (n) = the piece's values, rounded to 16 bits
    void (*dequantize_half)(Device *d, bf16 *out, const void *packed, size_t n, int bits, int block);
    // acc (n) = (accumulate ? acc : 0) + the piece's values, in fp32
    void (*dequantize_f32)(Device *d, float *acc, const void *packed, size_t n, int bits, int block, int accumulate);

    // Bytes of kernel scratch (device_scratch) that the largest request of a
    // GPT-2 step asks for, with B x T tokens, C channels, NH heads, V rows of
    // wte in the head's GEMM (this rank's, padding included), `threads`
    // OpenMP threads and the flash (1) or the materialized (0) attention, on
    // one of tp tensor-parallel ranks (its linears C/tp or 4C/tp wide, NH/tp
    // heads); the scratch keeps its largest size, so this is what it holds
    // from the first step on. Each kernel file states its own request beside
    // the call that makes it.
    size_t (*scratch_bytes)(int threads, int B, int T, int C, int NH, int V, int tp, int flash);
} KernelOps;

extern const KernelOps kernels_cpu;
#ifdef WB_HAVE_CUDA
// the cuda kernels, compiled once per 16-bit format: bf16, and fp16 (--precision fp16)
extern const KernelOps kernels_cuda, kernels_cuda_fp16;
#endif
