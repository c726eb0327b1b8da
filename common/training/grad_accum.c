// grad_accum.c: a micro-batch's gradients into the gradient buffer
// (trainer.h, grads_add_f32 and grads_add_half).
//
// In 16 bits (--grad-accum-dtype the same as --precision) the first
// micro-batch of a step writes and each later one is added and rounded to
// 16 bits again, so k micro-batches round k - 1 times. With the fp32
// accumulator (DeepSpeed's data_types.grad_accum_dtype fp32) they are
// added in fp32 and the last micro-batch rounds the sum once into the
// 16-bit gradients that the reduction, the norm and the update read. At
// k = 1 both give the same bits: one rounding of the same fp32 values.
#include "kernels.h"
#include "trainer.h"

void grads_add_f32(Trainer *t, const KernelOps *k, size_t off, const float *g, size_t n, GradTurn turn) {
    bf16 *grads = (bf16 *)t->st.grads.ptr + off;
    if (!t->st.grads_acc.ptr) {
        k->grad_to_bf16(&t->dev, grads, g, n, !turn.first);
        return;
    }
    float *acc = (float *)t->st.grads_acc.ptr + off;
    k->accumulate_f32(&t->dev, acc, g, n, !turn.first);
    if (turn.last) k->f32_to_half(&t->dev, grads, acc, n);
}

void grads_add_half(Trainer *t, const KernelOps *k, size_t off, const bf16 *h, size_t n, GradTurn turn) {
    bf16 *grads = (bf16 *)t->st.grads.ptr + off;
    if (!t->st.grads_acc.ptr) {
        if (turn.first) dev_copy(&t->dev, grads, h, n * sizeof(bf16), STREAM_COMPUTE);
        else k->add_bf16(&t->dev, grads, h, n);
        return;
    }
    float *acc = (float *)t->st.grads_acc.ptr + off;
    k->accumulate_half_f32(&t->dev, acc, h, n, !turn.first);
    if (turn.last) k->f32_to_half(&t->dev, grads, acc, n);
}
