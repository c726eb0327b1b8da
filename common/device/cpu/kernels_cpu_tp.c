// kernels_cpu_tp.c: the cpu kernels of tensor parallelism (Shoeybi et al.
// 2019, Megatron-LM): the row-parallel bias, the vocabulary-parallel
// embedding and the three steps of the vocabulary-parallel cross-entropy.
// Each rank computes on its part; the all-reduces between are the caller's.
// Sums run in a fixed order, as in kernels_cpu.c.
#include <math.h>
#include "kernels_cpu.h"

#define COL_CHUNK 64  // columns per OpenMP task in the column sums

void bias_add_cpu(Device *d, act *out_, const bf16 *bias, int BT, int OC) {
    float *out = out_;  // (BT,OC)
    float *bf = device_scratch(d, (size_t)OC * sizeof(float));
    for (int o = 0; o < OC; o++) bf[o] = half_to_f32(d->half, bias[o]);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float *row = out + (size_t)r * OC;
#pragma omp simd
        for (int o = 0; o < OC; o++) row[o] += bf[o];
    }
}

// ---- vocabulary-parallel embedding ----------------------------------------------------

void embedding_part_forward_cpu(Device *d, act *out_, const int32_t *tokens, const bf16 *wte_part,
                                int vocab_begin, int rows, const bf16 *wpe, int B, int T, int C) {
    float *out = out_;  // (B,T,C)
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int row = tokens[bt] - vocab_begin;
        const bf16 *te = row >= 0 && row < rows ? wte_part + (size_t)row * C : NULL;  // (C) or another rank's
        const bf16 *pe = wpe ? wpe + (size_t)(bt % T) * C : NULL;
        float *o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            float v = te ? half_to_f32(d->half, te[c]) : 0.0f;
            o[c] = pe ? v + half_to_f32(d->half, pe[c]) : v;
        }
    }
}

// As encoder_backward, on the rows of this rank's part
void embedding_part_backward_cpu(Device *d, float *dwte_part, float *dwpe, const act *dout, const int32_t *tokens,
                                 const TokenBuckets *tb, int vocab_begin, int rows, int B, int T, int C) {
    wte_backward_by_token_cpu(dwte_part, dout, tokens, tb, B * T, C, vocab_begin, rows);
    wpe_backward_cpu(dwpe, dout, B, T, C);
}

// ---- vocabulary-parallel cross-entropy --------------------------------------------------
// loss = log(sum over every rank's columns of exp(z - max)) + max - z[target],
// with max and z[target] taken over the group (crossentropy_f32).

void crossentropy_part_max_cpu(Device *d, float *maxv, const act *logits_, int BT, int V, int ld) {
    const float *logits = logits_;  // (BT,V), rows ld apart
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *z = logits + (size_t)r * ld;
        float m = -INFINITY;
        for (int i = 0; i < V; i++) m = z[i] > m ? z[i] : m;
        maxv[r] = m;
    }
}

void crossentropy_part_sums_cpu(Device *d, float *sums, const act *logits_, const float *maxv,
                                const int32_t *targets, int vocab_begin, int BT, int V, int ld) {
    const float *logits = logits_;  // (BT,V), rows ld apart
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *z = logits + (size_t)r * ld;
        float s = 0.0f;
        for (int i = 0; i < V; i++) s += expf(z[i] - maxv[r]);
        int t = targets[r] - vocab_begin;
        sums[r] = s;
        sums[BT + r] = t >= 0 && t < V ? z[t] : 0.0f;
    }
}

void crossentropy_part_finish_cpu(Device *d, float *losses, act *logits_, const float *maxv,
                                  const float *sums, const int32_t *targets, int vocab_begin,
                                  int BT, int V, int ld, float dloss_scale) {
    float *logits = logits_;  // (BT,V), rows ld apart
#pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float m = maxv[r], sum = sums[r];
        losses[r] = crossentropy_f32(sum, m, sums[BT + r]);
        if (dloss_scale == 0.0f) continue;
        float *z = logits + (size_t)r * ld;
        float k = dloss_scale / sum;
        for (int i = 0; i < V; i++) z[i] = expf(z[i] - m) * k;
        for (int i = V; i < ld; i++) z[i] = 0.0f;  // padding rows of wte get no gradient
        int t = targets[r] - vocab_begin;
        if (t >= 0 && t < V) z[t] -= dloss_scale;
    }
}
