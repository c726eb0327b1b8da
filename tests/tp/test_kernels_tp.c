// test_kernels_tp.c: the cpu kernels of tensor parallelism against the plain
// kernels of the whole model. A vocabulary is cut into tp parts of
// round_up(V, 64 tp) / tp rows, the last ones padding; each part runs on its
// own and the all-reduces between the steps are done here, in rank order:
//   - embedding: the sum of the parts' outputs (wpe added by part 0) is the
//     plain encoder's output to the bit (each token is one part's, the others
//     add zeros); the parts' wte gradients are the plain rows to the bit, and
//     every part's wpe gradient is the plain one;
//   - cross-entropy: the losses and dlogits equal the plain kernel's up to
//     the order of the sum of exponentials: V values at most 1, so the sums
//     are at most V 2^-24 apart relatively, and so are log(sum) (absolutely)
//     and every dlogit (relatively, plus one rounding); padding columns are
//     left out of the softmax and the max (they hold 1000 here to show it) and
//     get a zero gradient;
//   - the row-parallel bias is one fp32 add per element.
#include "testutil.h"
#include "kernels.h"

static void fill_bf16(bf16 *w, size_t n, uint64_t seed, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    test_fill(x, n, seed, lo, hi);
    for (size_t i = 0; i < n; i++) w[i] = f32_to_bf16(x[i]);
    free(x);
}

static int padded_vocab(int V, int tp) { return (V + 64 * tp - 1) / (64 * tp) * (64 * tp); }
// real vocabulary rows of part r: the rest of its rows are padding
static int part_rows(int V, int part, int r) {
    int n = V - r * part;
    return n < 0 ? 0 : n > part ? part : n;
}

static void test_embedding_parts(void **state) {
    Device *d = *state;
    enum { B = 2, T = 8, C = 40, V = 250, TP = 2, BT = B * T };
    int vp = padded_vocab(V, TP), part = vp / TP;
    bf16 *wte = calloc((size_t)vp * C, sizeof(bf16)), *wpe = malloc(T * C * sizeof(bf16));
    fill_bf16(wte, (size_t)V * C, 1, -1, 1);  // rows V.. stay zero: padding
    fill_bf16(wpe, T * C, 2, -1, 1);
    int32_t tok[BT];
    for (int i = 0; i < BT; i++) tok[i] = i % 5 == 0 ? 249 : (i * 37) % V;  // both parts, repeats
    float want[BT * C], sum[BT * C], got[BT * C];
    d->k->encoder_forward(d, want, tok, wte, wpe, B, T, C);
    memset(sum, 0, sizeof sum);
    for (int r = 0; r < TP; r++) {
        d->k->embedding_part_forward(d, got, tok, wte + (size_t)r * part * C, r * part, part, r == 0 ? wpe : NULL,
                                     B, T, C);
        for (int i = 0; i < BT * C; i++) sum[i] += got[i];
    }
    assert_memory_equal(sum, want, sizeof want);

    float dout[BT * C];
    test_fill(dout, BT * C, 3, -1, 1);
    float *dwte = malloc((size_t)vp * C * sizeof(float)), *dwte0 = malloc((size_t)vp * C * sizeof(float));
    float dwpe[T * C], dwpe0[T * C], pwpe[T * C];
    test_fill(dwte0, (size_t)vp * C, 4, -1, 1);
    test_fill(dwpe0, T * C, 5, -1, 1);
    memcpy(dwte, dwte0, (size_t)vp * C * sizeof(float));
    memcpy(dwpe, dwpe0, sizeof dwpe);
    int32_t order[BT], start[BT];  // the tokens' buckets, in host memory: the cpu device's
    TokenBuckets tb = {order, start, token_buckets_build(tok, BT, order, start)};
    d->k->encoder_backward(d, dwte, dwpe, dout, tok, &tb, B, T, C);
    float *part_grad = malloc((size_t)part * C * sizeof(float));
    for (int r = 0; r < TP; r++) {
        memcpy(part_grad, dwte0 + (size_t)r * part * C, (size_t)part * C * sizeof(float));
        memcpy(pwpe, dwpe0, sizeof pwpe);
        d->k->embedding_part_backward(d, part_grad, pwpe, dout, tok, &tb, r * part, part, B, T, C);
        assert_memory_equal(part_grad, dwte + (size_t)r * part * C, (size_t)part * C * sizeof(float));
        assert_memory_equal(pwpe, dwpe, sizeof pwpe);
    }
    free(wte), free(wpe), free(dwte), free(dwte0), free(part_grad);
}

// The plain kernel on rows of V; the parts on rows of `part`, padding columns
// holding 1000 (were it the max, every real exp(z - max) would be 0 in fp32),
// with the group's max and sums formed here.
static void check_crossentropy(Device *d, int BT, int V, int tp, float scale) {
    int vp = padded_vocab(V, tp), part = vp / tp;
    float *z = malloc((size_t)BT * V * sizeof(float)), *plain = malloc((size_t)BT * V * sizeof(float));
    test_fill(z, (size_t)BT * V, 6, -4, 4);
    int32_t *tgt = malloc(BT * sizeof(int32_t));
    uint64_t s = 7;
    for (int r = 0; r < BT; r++) tgt[r] = (int32_t)(test_rng_next(&s) % V);
    float *want = malloc(BT * sizeof(float));
    memcpy(plain, z, (size_t)BT * V * sizeof(float));
    d->k->softmax_crossentropy(d, want, plain, tgt, BT, V, V, scale);

    float *logits = malloc((size_t)tp * BT * part * sizeof(float));  // part r at r*BT*part
    for (int r = 0; r < tp; r++)
        for (int i = 0; i < BT; i++)
            for (int j = 0; j < part; j++) {
                int v = r * part + j;
                logits[((size_t)r * BT + i) * part + j] = v < V ? z[(size_t)i * V + v] : 1000.0f;
            }
    float *maxv = malloc(BT * sizeof(float)), *part_max = malloc(BT * sizeof(float));
    float *sums = calloc(2 * BT, sizeof(float)), *part_sums = malloc(2 * BT * sizeof(float));
    for (int i = 0; i < BT; i++) maxv[i] = -INFINITY;
    for (int r = 0; r < tp; r++) {
        d->k->crossentropy_part_max(d, part_max, logits + (size_t)r * BT * part, BT, part_rows(V, part, r), part);
        for (int i = 0; i < BT; i++) maxv[i] = fmaxf(maxv[i], part_max[i]);
    }
    for (int r = 0; r < tp; r++) {
        d->k->crossentropy_part_sums(d, part_sums, logits + (size_t)r * BT * part, maxv, tgt, r * part, BT,
                                     part_rows(V, part, r), part);
        for (int i = 0; i < 2 * BT; i++) sums[i] += part_sums[i];
    }
    for (int i = 0; i < BT; i++) assert_true(sums[BT + i] == z[(size_t)i * V + tgt[i]]);  // the target logit, exactly

    double sum_tol = V * ldexp(1.0, -24);
    float *loss = malloc(BT * sizeof(float));
    for (int r = 0; r < tp; r++) {
        float *zr = logits + (size_t)r * BT * part;
        int rows = part_rows(V, part, r);
        d->k->crossentropy_part_finish(d, loss, zr, maxv, sums, tgt, r * part, BT, rows, part, scale);
        for (int i = 0; i < BT; i++)
            if (!test_close(loss[i], want[i], sum_tol + 1e-6, 0))
                fail_msg("V %d tp %d part %d row %d: loss %.9g, plain %.9g", V, tp, r, i, loss[i], want[i]);
        for (int i = 0; i < BT; i++)
            for (int j = 0; j < part; j++) {
                float g = zr[(size_t)i * part + j];
                int v = r * part + j;
                if (v >= V) {
                    if (g != (scale != 0.0f ? 0.0f : 1000.0f)) fail_msg("padding column %d of row %d: %g", v, i, g);
                    continue;
                }
                float ref = plain[(size_t)i * V + v];
                if (!test_close(g, ref, fabs(scale) * sum_tol, sum_tol + ldexp(1.0, -23)))
                    fail_msg("V %d tp %d: dlogit (%d, %d) %.9g, plain %.9g", V, tp, i, v, g, ref);
            }
    }
    free(z), free(plain), free(tgt), free(want), free(logits), free(maxv), free(part_max), free(sums),
        free(part_sums), free(loss);
}

static void test_crossentropy_parts(void **state) {
    Device *d = *state;
    check_crossentropy(d, 24, 256, 3, 1.0f / 24);   // 256 -> 384: part 2 is padding only
    check_crossentropy(d, 24, 250, 2, 1.0f / 24);   // 250 -> 256: 6 padding rows on part 1
    check_crossentropy(d, 16, 1000, 4, 1.0f / 64);  // 1000 -> 1024: 24 on part 3
    check_crossentropy(d, 8, 300, 2, 0.0f);         // loss only: the logits stay
}

static void test_bias_add(void **state) {
    Device *d = *state;
    enum { BT = 9, OC = 70 };
    float out[BT * OC], want[BT * OC];
    bf16 bias[OC];
    test_fill(out, BT * OC, 8, -2, 2);
    fill_bf16(bias, OC, 9, -1, 1);
    for (int i = 0; i < BT * OC; i++) want[i] = out[i] + bf16_to_f32(bias[i % OC]);
    d->k->bias_add(d, out, bias, BT, OC);
    assert_memory_equal(out, want, sizeof want);
}

static int setup(void **state) {
    static Device dev;
    DeviceOptions opt = {.kind = "cpu", .local_size = 1};
    device_init(&dev, &opt);
    *state = &dev;
    return 0;
}

static int teardown(void **state) {
    device_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_parts),
        cmocka_unit_test(test_crossentropy_parts),
        cmocka_unit_test(test_bias_add),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
