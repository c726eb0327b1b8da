// test_cuda_kernels_tp.c: the kernels of tensor parallelism (row-parallel
// bias, vocabulary-parallel embedding and cross-entropy) on the cuda device
// against the cpu device; tolerances and their reasons in conformance.h. A
// row maximum and a looked-up target logit are exact on both devices (the
// inputs are bf16-exact); the embedding's wte gradient is the cpu's to the
// bit (both sum a token's positions in the same order, from a start that is
// not bf16-exact). Where no GPU is visible every test is skipped.
#include "conformance.h"

static void test_bias_add(void **state) {
    Devices *dv = devices_or_skip(state);
    int BT = 37, OC = 96;
    size_t n = (size_t)BT * OC;
    float *x = rand_values(n, 101, -2, 2), *b = rand_values(OC, 102, -1, 1);
    float *out[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *o = put_act(&a, x, n);
        bf16 *bi = put_bf16(&a, b, OC);
        d->k->bias_add(d, o, bi, BT, OC);
        out[k] = get_act(d, o, n);
        bufs_free(&a);
    }
    expect_close("bias_add", out[1], out[0], n, TOL_BF16_ONCE);
    free_pair(out);
    free(x), free(b);
}

// this part holds vocabulary rows [64, 64 + 48); tokens fall inside and outside
static void check_embedding_part(Devices *dv, int with_wpe) {
    int B = 2, T = 24, C = 64, V = 160, begin = 64, rows = 48;
    size_t n = (size_t)B * T * C;
    float *wte = rand_values((size_t)rows * C, 103, -1, 1), *wpe = rand_values((size_t)T * C, 104, -1, 1);
    float *dout = rand_values(n, 105, -1, 1), *dwte0 = xmalloc((size_t)rows * C * sizeof(float));
    test_fill(dwte0, (size_t)rows * C, 106, -1, 1);  // not bf16-exact: every add rounds, the order shows
    float *dwpe0 = rand_values((size_t)T * C, 107, -1, 1);
    int32_t *tok = rand_tokens((size_t)B * T, V, 108);
    for (int i = 0; i < B * T; i += 2) tok[i] = begin + tok[i] % 8;  // half of them on 8 rows: sums of several
    float *out[2], *dwte[2], *dwpe[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        bf16 *te = put_bf16(&a, wte, (size_t)rows * C), *pe = put_bf16(&a, wpe, (size_t)T * C);
        int32_t *tk = put_bytes(&a, tok, (size_t)B * T * sizeof *tok);
        act *o = alloc_act(&a, n), *g = put_act(&a, dout, n);
        float *dte = put_f32(&a, dwte0, (size_t)rows * C), *dpe = put_f32(&a, dwpe0, (size_t)T * C);
        d->k->embedding_part_forward(d, o, tk, te, begin, rows, with_wpe ? pe : NULL, B, T, C);
        TokenBuckets tb = put_buckets(&a, tok, B * T);
        d->k->embedding_part_backward(d, dte, dpe, g, tk, &tb, begin, rows, B, T, C);
        out[k] = get_act(d, o, n);
        dwte[k] = get_f32(d, dte, (size_t)rows * C);
        dwpe[k] = get_f32(d, dpe, (size_t)T * C);
        bufs_free(&a);
    }
    expect_close("embedding_part_forward out", out[1], out[0], n, TOL_BF16_ONCE);
    expect_f32_bits_equal("embedding_part_backward dwte", dwte[1], dwte[0], (size_t)rows * C);
    expect_close("embedding_part_backward dwpe", dwpe[1], dwpe[0], (size_t)T * C, TOL_F32_SUM);
    free_pair(out), free_pair(dwte), free_pair(dwpe);
    free(wte), free(wpe), free(dout), free(dwte0), free(dwpe0), free(tok);
}

static void test_embedding_part(void **state) {
    Devices *dv = devices_or_skip(state);
    check_embedding_part(dv, 1);  // the part that adds the positions
    check_embedding_part(dv, 0);
}

static void expect_equal(const char *what, const float *cuda, const float *cpu, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(cuda[i] == cpu[i])) fail_msg("%s[%zu]: cuda %.9g cpu %.9g", what, i, cuda[i], cpu[i]);
}

// A part of V real columns in rows of ld, this part's vocabulary from `begin`.
// The steps run from the same statistics on both devices (the cpu's max, and
// sums that stand for the group's: this part's doubled).
static void check_crossentropy_part(Devices *dv, int BT, int V, int ld, int begin, float scale) {
    size_t n = (size_t)BT * ld;
    float *z = rand_values(n, 109, -4, 4);
    int32_t *tgt = rand_tokens(BT, 2 * ld, 110);  // about half the targets inside this part
    float *maxv[2], *sums[2], *loss[2], *dz[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *zi = put_act(&a, z, n);
        int32_t *ti = put_bytes(&a, tgt, BT * sizeof *tgt);
        float *m = bufs_alloc(&a, BT * sizeof(float)), *s = bufs_alloc(&a, 2 * BT * sizeof(float));
        float *l = bufs_alloc(&a, BT * sizeof(float));
        d->k->crossentropy_part_max(d, m, zi, BT, V, ld);
        maxv[k] = get_f32(d, m, BT);
        if (V == 0) for (int r = 0; r < BT; r++) maxv[0][r] = 0.5f;  // another part's maximum
        m = put_f32(&a, maxv[0], BT);
        d->k->crossentropy_part_sums(d, s, zi, m, ti, begin, BT, V, ld);
        sums[k] = get_f32(d, s, 2 * BT);
        float *group = xmalloc(2 * BT * sizeof(float));
        for (int r = 0; r < 2 * BT; r++) group[r] = r < BT ? 2.0f * sums[0][r] + 1.0f : sums[0][r];
        s = put_f32(&a, group, 2 * BT);
        free(group);
        d->k->crossentropy_part_finish(d, l, zi, m, s, ti, begin, BT, V, ld, scale);
        loss[k] = get_f32(d, l, BT);
        dz[k] = get_act(d, zi, n);
        bufs_free(&a);
    }
    if (V > 0) expect_equal("crossentropy_part_max", maxv[1], maxv[0], BT);
    else for (int r = 0; r < BT; r++) assert_true(maxv[1][r] == -INFINITY);
    expect_close("crossentropy_part_sums sum", sums[1], sums[0], BT, TOL_F32_SUM);
    expect_equal("crossentropy_part_sums target logit", sums[1] + BT, sums[0] + BT, BT);
    expect_close("crossentropy_part_finish losses", loss[1], loss[0], BT, TOL_F32_SUM);
    expect_close("crossentropy_part_finish dlogits", dz[1], dz[0], n, scale != 0.0f ? TOL_BF16_ONCE : (Tol){0, 0});
    for (size_t i = 0; scale != 0.0f && i < n; i++)
        if ((int)(i % ld) >= V) assert_true(dz[1][i] == 0.0f);
    free_pair(maxv), free_pair(sums), free_pair(loss), free_pair(dz);
    free(z), free(tgt);
}

static void test_crossentropy_part(void **state) {
    Devices *dv = devices_or_skip(state);
    check_crossentropy_part(dv, 48, 200, 256, 256, 1.0f / 48);     // 56 padding columns
    check_crossentropy_part(dv, 16, 0, 128, 256, 1.0f / 16);       // a part of padding only
    check_crossentropy_part(dv, 16, 5000, 5056, 5056, 1.0f / 64);  // wide rows: 1024-thread blocks
    check_crossentropy_part(dv, 8, 100, 128, 0, 0.0f);             // loss only: the logits stay
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias_add),
        cmocka_unit_test(test_embedding_part),
        cmocka_unit_test(test_crossentropy_part),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
