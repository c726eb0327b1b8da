// kernel_meter.c: the counting kernel table (see kernel_meter.h). Each entry
// below counts its call and what it writes, then calls the real kernel. The
// kernels a GPT block runs are metered, forward and backward; the rest of the
// table passes through uncounted.
#include "kernel_meter.h"
#include <stddef.h>
#include <string.h>

// While metering, d->k is &m->ops, the meter's first member.
static KernelMeter *meter_of(Device *d) { return (KernelMeter *)((const char *)d->k - offsetof(KernelMeter, ops)); }

static const KernelOps *count(Device *d, double flops, const void *w1, const void *w2, const void *w3) {
    KernelMeter *m = meter_of(d);
    m->kernels++;
    m->flops += flops;
    const void *w[3] = {w1, w2, w3};
    for (int i = 0; i < 3; i++)
        if (w[i] && m->num_writes < KERNEL_METER_WRITES) m->writes[m->num_writes++] = w[i];
    return m->inner;
}

static double mm(int M, int K, int N) { return 2.0 * M * K * N; }  // a backward: one per gradient it forms
// act_math.c's attention count: QK^T and PV, 2·T·C each per token
static double attn(int B, int T, int C) { return 4.0 * B * T * (double)T * C; }

static void layernorm_forward(Device *d, act *out, float *mean, float *rstd, const act *inp, const bf16 *w,
                              const bf16 *b, int BT, int C) {
    count(d, 0, out, mean, rstd)->layernorm_forward(d, out, mean, rstd, inp, w, b, BT, C);
}

static void layernorm_backward(Device *d, act *dinp, float *dw, float *db, const act *dout, const act *inp,
                               const bf16 *w, const float *mean, const float *rstd, int BT, int C) {
    count(d, 0, dinp, NULL, NULL)->layernorm_backward(d, dinp, dw, db, dout, inp, w, mean, rstd, BT, C);
}

static void matmul_forward(Device *d, act *out, const act *inp, const bf16 *w, const bf16 *bias, int BT, int C,
                           int OC, int ldo) {
    count(d, mm(BT, C, OC), out, NULL, NULL)->matmul_forward(d, out, inp, w, bias, BT, C, OC, ldo);
}

static void matmul_backward(Device *d, act *dinp, float *dw, float *dbias, const act *dout, const act *inp,
                            const bf16 *w, int BT, int C, int OC, int ldo) {
    count(d, ((dinp != NULL) + (dw != NULL)) * mm(BT, C, OC), dinp, NULL, NULL)->matmul_backward(d, dinp, dw, dbias, dout, inp, w, BT, C, OC, ldo);
}

static void attention_forward(Device *d, act *out, float *att, const act *qkv, int B, int T, int C, int NH) {
    count(d, attn(B, T, C), out, att, NULL)->attention_forward(d, out, att, qkv, B, T, C, NH);
}

static void attention_backward(Device *d, act *dqkv, const act *dout, const act *qkv, const float *att, int B, int T,
                               int C, int NH) {
    count(d, 2 * attn(B, T, C), dqkv, NULL, NULL)->attention_backward(d, dqkv, dout, qkv, att, B, T, C, NH);
}

static void flash_attention_forward(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH) {
    count(d, attn(B, T, C), out, lse, NULL)->flash_attention_forward(d, out, lse, qkv, B, T, C, NH);
}

static void flash_attention_backward(Device *d, act *dqkv, const act *dout, const act *qkv, const act *out,
                                     const float *lse, int B, int T, int C, int NH) {
    count(d, 2 * attn(B, T, C), dqkv, NULL, NULL)->flash_attention_backward(d, dqkv, dout, qkv, out, lse, B, T, C, NH);
}

static void matmul_gelu_forward(Device *d, act *out, act *pre, const act *inp, const bf16 *w, const bf16 *bias,
                                int BT, int C, int OC) {
    count(d, mm(BT, C, OC), out, pre, NULL)->matmul_gelu_forward(d, out, pre, inp, w, bias, BT, C, OC);
}

static void gelu_matmul_backward(Device *d, act *dpre, float *dw, float *dbias, const act *dout, const act *inp,
                                 const act *pre, const bf16 *w, int BT, int C, int OC) {
    count(d, (1 + (dw != NULL)) * mm(BT, C, OC), dpre, NULL, NULL)->gelu_matmul_backward(d, dpre, dw, dbias, dout, inp, pre, w, BT, C,
                                                                         OC);
}

static void gelu_forward(Device *d, act *out, const act *inp, size_t n) {
    count(d, 0, out, NULL, NULL)->gelu_forward(d, out, inp, n);
}

static void gelu_backward(Device *d, act *dinp, const act *inp, const act *dout, size_t n) {
    count(d, 0, dinp, NULL, NULL)->gelu_backward(d, dinp, inp, dout, n);
}

static void residual_forward(Device *d, act *out, const act *a, const act *b, size_t n) {
    count(d, 0, out, NULL, NULL)->residual_forward(d, out, a, b, n);
}

static void residual_layernorm_forward(Device *d, act *res, act *out, float *mean, float *rstd, const act *a,
                                       const act *b, const bf16 *w, const bf16 *bias, int BT, int C) {
    count(d, 0, res, out, mean);
    count(d, 0, rstd, NULL, NULL)->residual_layernorm_forward(d, res, out, mean, rstd, a, b, w, bias, BT, C);
    meter_of(d)->kernels--;  // one kernel, its four outputs noted in two calls
}

static void bias_add(Device *d, act *out, const bf16 *bias, int BT, int OC) {
    count(d, 0, out, NULL, NULL)->bias_add(d, out, bias, BT, OC);
}

void kernel_meter_begin(KernelMeter *m, Device *d) {
    memset(m, 0, sizeof *m);
    m->inner = d->k;
    m->ops = *d->k;
    m->ops.layernorm_forward = layernorm_forward;
    m->ops.layernorm_backward = layernorm_backward;
    m->ops.matmul_forward = matmul_forward;
    m->ops.matmul_backward = matmul_backward;
    m->ops.attention_forward = attention_forward;
    m->ops.attention_backward = attention_backward;
    m->ops.flash_attention_forward = flash_attention_forward;
    m->ops.flash_attention_backward = flash_attention_backward;
    m->ops.matmul_gelu_forward = matmul_gelu_forward;
    m->ops.gelu_matmul_backward = gelu_matmul_backward;
    m->ops.gelu_forward = gelu_forward;
    m->ops.gelu_backward = gelu_backward;
    m->ops.residual_forward = residual_forward;
    m->ops.residual_layernorm_forward = residual_layernorm_forward;
    m->ops.bias_add = bias_add;
    d->k = &m->ops;
}

void kernel_meter_end(KernelMeter *m, Device *d) { d->k = m->inner; }
