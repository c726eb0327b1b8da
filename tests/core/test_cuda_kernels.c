// test_cuda_kernels.c: the model's kernels (encoder, layernorm, matmul, the
// MLP's fused matmul + GELU, attention and ring attention's blocks, GELU, residual, softmax +
// cross-entropy) on the cuda device against the cpu device; tolerances and
// their reasons in conformance.h.
// Where no GPU is visible (or the binary has no CUDA) every test is skipped.
#include "conformance.h"

// ---- encoder ------------------------------------------------------------------------------

static void test_encoder_forward(void **state) {
    Devices *dv = devices_or_skip(state);
    int B = 2, T = 24, C = 64, V = 50;
    size_t n = (size_t)B * T * C;
    float *wte = rand_values((size_t)V * C, 1, -1, 1), *wpe = rand_values((size_t)T * C, 2, -1, 1);
    int32_t *tok = rand_tokens((size_t)B * T, V, 3);
    float *out[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        bf16 *te = put_bf16(&a, wte, (size_t)V * C), *pe = put_bf16(&a, wpe, (size_t)T * C);
        int32_t *tk = put_bytes(&a, tok, (size_t)B * T * sizeof *tok);
        act *o = alloc_act(&a, n);
        d->k->encoder_forward(d, o, tk, te, pe, B, T, C);
        out[k] = get_act(d, o, n);
        bufs_free(&a);
    }
    expect_close("encoder_forward out", out[1], out[0], n, TOL_BF16_ONCE);
    free_pair(out);
    free(wte), free(wpe), free(tok);
}

// dwte from an fp32 start that is not bf16-exact (as the head's dW leaves
// it), so that every add rounds and the order of a row's sum shows in its
// bits: both devices add each token's positions in increasing order, so the
// cuda dwte is the cpu's to the bit, and a second run (on the emulator, in
// other drawn orders of blocks and threads) gives the same bits again.
// A scatter by atomics fails both (issue 34).
static void test_encoder_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    int B = 2, T = 24, C = 200, V = 7;  // few tokens: positions collide in dwte; C spans two blocks of channels
    size_t n = (size_t)B * T * C;
    float *dout = rand_values(n, 4, -1, 1);
    float *dwte0 = xmalloc((size_t)V * C * sizeof(float));
    test_fill(dwte0, (size_t)V * C, 5, -1, 1);
    float *dwpe0 = rand_values((size_t)T * C, 6, -1, 1);
    int32_t *tok = rand_tokens((size_t)B * T, V, 7);
    float *dwte[2], *dwpe[2], *again = NULL;
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *g = put_act(&a, dout, n);
        float *te = put_f32(&a, dwte0, (size_t)V * C), *pe = put_f32(&a, dwpe0, (size_t)T * C);
        int32_t *tk = put_bytes(&a, tok, (size_t)B * T * sizeof *tok);
        TokenBuckets tb = put_buckets(&a, tok, B * T);
        d->k->encoder_backward(d, te, pe, g, tk, &tb, B, T, C);
        dwte[k] = get_f32(d, te, (size_t)V * C);
        dwpe[k] = get_f32(d, pe, (size_t)T * C);
        if (k == 1) {
            dev_copy(d, te, dwte0, (size_t)V * C * sizeof(float), STREAM_COMPUTE);
            d->k->encoder_backward(d, te, pe, g, tk, &tb, B, T, C);
            again = get_f32(d, te, (size_t)V * C);
        }
        bufs_free(&a);
    }
    expect_f32_bits_equal("encoder_backward dwte, cuda against cpu", dwte[1], dwte[0], (size_t)V * C);
    expect_f32_bits_equal("encoder_backward dwte, a second cuda run", again, dwte[1], (size_t)V * C);
    expect_close("encoder_backward dwpe", dwpe[1], dwpe[0], (size_t)T * C, TOL_F32_SUM);
    free_pair(dwte), free_pair(dwpe), free(again);
    free(dout), free(dwte0), free(dwpe0), free(tok);
}

// ---- layernorm ----------------------------------------------------------------------------

static void check_layernorm_forward(Devices *dv, int BT, int C) {
    size_t n = (size_t)BT * C;
    float *x = rand_values(n, 8, -2, 3), *w = rand_values(C, 9, 0.5f, 1.5f);
    float *b = rand_values(C, 10, -0.5f, 0.5f);
    float *out[2], *mean[2], *rstd[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, n), *o = alloc_act(&a, n);
        bf16 *wi = put_bf16(&a, w, C), *bi = put_bf16(&a, b, C);
        float *m = bufs_alloc(&a, BT * sizeof(float)), *r = bufs_alloc(&a, BT * sizeof(float));
        d->k->layernorm_forward(d, o, m, r, xi, wi, bi, BT, C);
        out[k] = get_act(d, o, n);
        mean[k] = get_f32(d, m, BT);
        rstd[k] = get_f32(d, r, BT);
        bufs_free(&a);
    }
    expect_close("layernorm_forward out", out[1], out[0], n, TOL_BF16_ONCE);
    expect_close("layernorm_forward mean", mean[1], mean[0], BT, TOL_F32_SUM);
    expect_close("layernorm_forward rstd", rstd[1], rstd[0], BT, TOL_F32_SUM);
    free_pair(out), free_pair(mean), free_pair(rstd);
    free(x), free(w), free(b);
}

static void test_layernorm_forward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_layernorm_forward(dv, 48, 72);  // C not a multiple of 32: the warp's last lanes idle
    check_layernorm_forward(dv, 200, 768);
}

// The residual add fused into the layernorm: against the cpu, and on each
// device to the bit of the two kernels it replaces (the model's losses do
// not move); the sum written in place of a, as the block does.
static void check_residual_layernorm(Devices *dv, int BT, int C) {
    size_t n = (size_t)BT * C;
    float *x = rand_values(n, 17, -2, 3), *y = rand_values(n, 18, -1, 1);
    float *w = rand_values(C, 19, 0.5f, 1.5f), *b = rand_values(C, 20, -0.5f, 0.5f);
    float *res[2], *out[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, n), *yi = put_act(&a, y, n), *o = alloc_act(&a, n);
        act *x2 = put_act(&a, x, n), *o2 = alloc_act(&a, n);
        bf16 *wi = put_bf16(&a, w, C), *bi = put_bf16(&a, b, C);
        float *m = bufs_alloc(&a, 4 * BT * sizeof(float)), *r = m + BT, *m2 = m + 2 * BT, *r2 = m + 3 * BT;
        d->k->residual_layernorm_forward(d, xi, o, m, r, xi, yi, wi, bi, BT, C);
        d->k->residual_forward(d, x2, x2, yi, n);
        d->k->layernorm_forward(d, o2, m2, r2, x2, wi, bi, BT, C);
        size_t bytes = n * d->act_bytes;
        void *h[4] = {get_bytes(d, xi, bytes), get_bytes(d, x2, bytes), get_bytes(d, o, bytes), get_bytes(d, o2, bytes)};
        void *st[2] = {get_bytes(d, m, 2 * BT * sizeof(float)), get_bytes(d, m2, 2 * BT * sizeof(float))};
        if (memcmp(h[0], h[1], bytes) || memcmp(h[2], h[3], bytes) || memcmp(st[0], st[1], 2 * BT * sizeof(float)))
            fail_msg("%s: residual_layernorm_forward differs from residual_forward + layernorm_forward", d->name);
        for (int i = 0; i < 4; i++) free(h[i]);
        free(st[0]), free(st[1]);
        res[k] = get_act(d, xi, n);
        out[k] = get_act(d, o, n);
        bufs_free(&a);
    }
    expect_close("residual_layernorm_forward res", res[1], res[0], n, TOL_BF16_ONCE);
    expect_close("residual_layernorm_forward out", out[1], out[0], n, TOL_BF16_TWICE);
    free_pair(res), free_pair(out);
    free(x), free(y), free(w), free(b);
}

static void test_residual_layernorm(void **state) {
    Devices *dv = devices_or_skip(state);
    check_residual_layernorm(dv, 48, 72);
    check_residual_layernorm(dv, 200, 768);
}

static void check_layernorm_backward(Devices *dv, int BT, int C) {
    size_t n = (size_t)BT * C;
    float *x = rand_values(n, 11, -2, 3), *g = rand_values(n, 12, -1, 1);
    float *w = rand_values(C, 13, 0.5f, 1.5f), *dx0 = rand_values(n, 14, -1, 1);
    float *dw0 = rand_values(C, 15, -1, 1), *db0 = rand_values(C, 16, -1, 1);
    float *mean = xmalloc(BT * sizeof(float)), *rstd = xmalloc(BT * sizeof(float));
    for (int r = 0; r < BT; r++) {  // the saved statistics, the same for both devices
        double s = 0, v = 0;
        for (int c = 0; c < C; c++) s += x[(size_t)r * C + c];
        for (int c = 0; c < C; c++) v += pow(x[(size_t)r * C + c] - s / C, 2);
        mean[r] = (float)(s / C);
        rstd[r] = (float)(1.0 / sqrt(v / C + 1e-5));
    }
    float *dx[2], *dw[2], *db[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, n), *gi = put_act(&a, g, n), *dxi = put_act(&a, dx0, n);
        bf16 *wi = put_bf16(&a, w, C);
        float *m = put_f32(&a, mean, BT), *r = put_f32(&a, rstd, BT);
        float *dwi = put_f32(&a, dw0, C), *dbi = put_f32(&a, db0, C);
        d->k->layernorm_backward(d, dxi, dwi, dbi, gi, xi, wi, m, r, BT, C);
        dx[k] = get_act(d, dxi, n);
        dw[k] = get_f32(d, dwi, C);
        db[k] = get_f32(d, dbi, C);
        bufs_free(&a);
    }
    expect_close("layernorm_backward dinp", dx[1], dx[0], n, TOL_BF16_ONCE);
    expect_close("layernorm_backward dw", dw[1], dw[0], C, TOL_F32_SUM);
    expect_close("layernorm_backward db", db[1], db[0], C, TOL_F32_SUM);
    free_pair(dx), free_pair(dw), free_pair(db);
    free(x), free(g), free(w), free(dx0), free(dw0), free(db0), free(mean), free(rstd);
}

static void test_layernorm_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_layernorm_backward(dv, 48, 72);
    check_layernorm_backward(dv, 200, 768);  // dw, db from four row partials (64 rows each)
}

// ---- matmul -------------------------------------------------------------------------------

typedef struct MatmulCase {
    int BT, C, OC;
    int with_bias;     // forward: bias; backward: dbias
    int odd_bias;      // bias at an odd element offset (2-byte aligned, as in a flat buffer)
    int with_dinp;     // backward: dinp (NULL skips it)
    int ldo;           // row stride of out/dout (0: OC, packed); the padding keeps its values
} MatmulCase;

static int row_stride(MatmulCase mc) { return mc.ldo ? mc.ldo : mc.OC; }

static void check_matmul_forward(Devices *dv, MatmulCase mc) {
    int ldo = row_stride(mc);
    size_t ni = (size_t)mc.BT * mc.C, no = (size_t)mc.BT * ldo, nw = (size_t)mc.OC * mc.C;
    float *x = rand_values(ni, 21, -1, 1), *w = rand_values(nw, 22, -0.5f, 0.5f);
    float *bias = rand_values((size_t)mc.OC + 1, 23, -1, 1);  // bias[0] is padding
    float *prefill = rand_values(no, 20, -9, 9);  // overwritten but for the padding columns
    float *out[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, ni), *o = put_act(&a, prefill, no);
        bf16 *wi = put_bf16(&a, w, nw), *bi = put_bf16(&a, bias, (size_t)mc.OC + 1);
        const bf16 *b = mc.with_bias ? (mc.odd_bias ? bi + 1 : bi) : NULL;
        d->k->matmul_forward(d, o, xi, wi, b, mc.BT, mc.C, mc.OC, ldo);
        out[k] = get_act(d, o, no);
        bufs_free(&a);
    }
    expect_close("matmul_forward out", out[1], out[0], no, TOL_GEMM);
    free_pair(out);
    free(x), free(w), free(bias), free(prefill);
}

static void check_matmul_backward(Devices *dv, MatmulCase mc) {
    int ldo = row_stride(mc);
    size_t ni = (size_t)mc.BT * mc.C, no = (size_t)mc.BT * ldo, nw = (size_t)mc.OC * mc.C;
    float *x = rand_values(ni, 24, -1, 1), *w = rand_values(nw, 25, -0.5f, 0.5f);
    float *g = rand_values(no, 26, -1, 1), *dw0 = rand_values(nw, 27, -1, 1);
    float *db0 = rand_values(mc.OC, 28, -1, 1), *dx0 = rand_values(ni, 29, -9, 9);
    float *dx[2] = {NULL, NULL}, *dw[2], *db[2] = {NULL, NULL};
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, ni), *gi = put_act(&a, g, no);
        act *dxi = mc.with_dinp ? put_act(&a, dx0, ni) : NULL;  // garbage: dinp is overwritten
        bf16 *wi = put_bf16(&a, w, nw);
        float *dwi = put_f32(&a, dw0, nw);
        float *dbi = mc.with_bias ? put_f32(&a, db0, mc.OC) : NULL;
        d->k->matmul_backward(d, dxi, dwi, dbi, gi, xi, wi, mc.BT, mc.C, mc.OC, ldo);
        if (dxi) dx[k] = get_act(d, dxi, ni);
        dw[k] = get_f32(d, dwi, nw);
        if (dbi) db[k] = get_f32(d, dbi, mc.OC);
        bufs_free(&a);
    }
    if (mc.with_dinp) expect_close("matmul_backward dinp", dx[1], dx[0], ni, TOL_GEMM);
    expect_close("matmul_backward dw", dw[1], dw[0], nw, TOL_F32_GEMM);
    if (mc.with_bias) expect_close("matmul_backward dbias", db[1], db[0], mc.OC, TOL_F32_SUM);
    free_pair(dx), free_pair(dw), free_pair(db);
    free(x), free(w), free(g), free(dw0), free(db0), free(dx0);
}

static void test_matmul_forward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_matmul_forward(dv, (MatmulCase){.BT = 64, .C = 64, .OC = 192, .with_bias = 1});
    check_matmul_forward(dv, (MatmulCase){.BT = 32, .C = 48, .OC = 40});
}

// odd shapes and a bias the GEMM epilogue cannot read (the separate-add path)
static void test_matmul_forward_odd(void **state) {
    Devices *dv = devices_or_skip(state);
    check_matmul_forward(dv, (MatmulCase){.BT = 30, .C = 36, .OC = 20, .with_bias = 1,
                                          .odd_bias = 1});
    check_matmul_forward(dv, (MatmulCase){.BT = 7, .C = 12, .OC = 5, .with_bias = 1});
}

// the head's layout: an odd vocabulary in rows padded to a multiple of 64
static void test_matmul_row_stride(void **state) {
    Devices *dv = devices_or_skip(state);
    check_matmul_forward(dv, (MatmulCase){.BT = 48, .C = 64, .OC = 257, .ldo = 320});
    check_matmul_forward(dv, (MatmulCase){.BT = 48, .C = 64, .OC = 257, .ldo = 320, .with_bias = 1,
                                          .odd_bias = 1});
    check_matmul_backward(dv, (MatmulCase){.BT = 48, .C = 64, .OC = 257, .ldo = 320, .with_dinp = 1,
                                           .with_bias = 1});
}

static void test_matmul_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_matmul_backward(dv, (MatmulCase){.BT = 64, .C = 64, .OC = 192, .with_bias = 1,
                                           .with_dinp = 1});
    check_matmul_backward(dv, (MatmulCase){.BT = 130, .C = 36, .OC = 20, .with_bias = 1,
                                           .with_dinp = 1});  // rows span three partial sums
    check_matmul_backward(dv, (MatmulCase){.BT = 30, .C = 36, .OC = 20});  // no dinp, no dbias
}

// ---- the MLP's linear and GELU fused (cuBLASLt epilogues on cuda) ---------------------------
// Each device runs the fused op and the kernels it replaces on the same
// inputs. On the cpu the fused op is those kernels: the same bits. On cuda
// the epilogue skips a rounding (gelu of the fp32 sum, or the input gradient
// times gelu' before it is rounded): within TOL_BF16_TWICE of the unfused
// kernels, and within the GEMM tolerance of the cpu.

static const Tol TOL_SAME_BITS = {0, 0};

// (BT,OC) from (BT,C); OC % 8 == 0 and an aligned bias take the fused path on cuda
static void check_matmul_gelu_forward(Devices *dv, MatmulCase mc) {
    size_t ni = (size_t)mc.BT * mc.C, no = (size_t)mc.BT * mc.OC, nw = (size_t)mc.OC * mc.C;
    float *x = rand_values(ni, 51, -1, 1), *w = rand_values(nw, 52, -0.5f, 0.5f);
    float *bias = rand_values((size_t)mc.OC + 1, 53, -1, 1);  // bias[0] is padding
    float *out[2], *pre[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, ni), *o = alloc_act(&a, no), *pr = alloc_act(&a, no);
        act *o2 = alloc_act(&a, no), *pr2 = alloc_act(&a, no);
        bf16 *wi = put_bf16(&a, w, nw), *bi = put_bf16(&a, bias, (size_t)mc.OC + 1);
        const bf16 *b = mc.with_bias ? (mc.odd_bias ? bi + 1 : bi) : NULL;
        d->k->matmul_gelu_forward(d, o, pr, xi, wi, b, mc.BT, mc.C, mc.OC);
        d->k->matmul_forward(d, pr2, xi, wi, b, mc.BT, mc.C, mc.OC, mc.OC);
        d->k->gelu_forward(d, o2, pr2, no);
        out[k] = get_act(d, o, no);
        pre[k] = get_act(d, pr, no);
        float *out2 = get_act(d, o2, no), *pre2 = get_act(d, pr2, no);
        expect_close(k ? "cuda matmul_gelu_forward out against the two kernels" : "cpu matmul_gelu_forward out",
                     out[k], out2, no, k ? TOL_BF16_TWICE : TOL_SAME_BITS);
        expect_close(k ? "cuda matmul_gelu_forward pre against matmul_forward" : "cpu matmul_gelu_forward pre",
                     pre[k], pre2, no, k ? TOL_BF16_ONCE : TOL_SAME_BITS);
        free(out2), free(pre2);
        bufs_free(&a);
    }
    expect_close("matmul_gelu_forward pre", pre[1], pre[0], no, TOL_GEMM);
    expect_close("matmul_gelu_forward out", out[1], out[0], no, TOL_GEMM);
    free_pair(out), free_pair(pre);
    free(x), free(w), free(bias);
}

static void test_matmul_gelu_forward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_matmul_gelu_forward(dv, (MatmulCase){.BT = 64, .C = 48, .OC = 128, .with_bias = 1});  // GELU_AUX_BIAS
    check_matmul_gelu_forward(dv, (MatmulCase){.BT = 40, .C = 32, .OC = 64});                   // GELU_AUX
    // the first shape again without a bias: a GEMM plan of its own, not the one that adds a bias
    check_matmul_gelu_forward(dv, (MatmulCase){.BT = 64, .C = 48, .OC = 128});
    // the unfused path: an aux ld (OC) not a multiple of 8; a bias at an odd offset
    check_matmul_gelu_forward(dv, (MatmulCase){.BT = 30, .C = 36, .OC = 20, .with_bias = 1});
    check_matmul_gelu_forward(dv, (MatmulCase){.BT = 32, .C = 24, .OC = 64, .with_bias = 1, .odd_bias = 1});
}

// The backward of out (BT,OC) = gelu(pre) (BT,C) @ w^T + bias, called twice
// on the same gradient as two micro-batches do: dpre overwritten each time,
// dw and dbias accumulating from nonzero starts (cuBLASLt's bias gradient
// epilogue writes, and must still add). C % 8 == 0 takes DGELU on cuda.
static void check_gelu_matmul_backward(Devices *dv, int BT, int C, int OC) {
    size_t ni = (size_t)BT * C, no = (size_t)BT * OC, nw = (size_t)OC * C;
    float *pre = rand_values(ni, 54, -3, 3), *w = rand_values(nw, 55, -0.5f, 0.5f);
    float *g = rand_values(no, 56, -1, 1), *dw0 = rand_values(nw, 57, -1, 1);
    float *db0 = rand_values(OC, 58, -1, 1), *x = xmalloc(ni * sizeof *x);
    for (size_t i = 0; i < ni; i++) x[i] = bf16_to_f32(f32_to_bf16(gelu_f32(pre[i])));  // the layer's input
    float *dpre[2], *dw[2], *db[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *pi = put_act(&a, pre, ni), *xi = put_act(&a, x, ni), *gi = put_act(&a, g, no);
        act *dp = alloc_act(&a, ni), *dx2 = alloc_act(&a, ni), *dp2 = alloc_act(&a, ni);
        bf16 *wi = put_bf16(&a, w, nw);
        float *dwi = put_f32(&a, dw0, nw), *dbi = put_f32(&a, db0, OC);
        float *dw2 = put_f32(&a, dw0, nw), *db2 = put_f32(&a, db0, OC);
        for (int call = 0; call < 2; call++) {
            d->k->gelu_matmul_backward(d, dp, dwi, dbi, gi, xi, pi, wi, BT, C, OC);
            d->k->matmul_backward(d, dx2, dw2, db2, gi, xi, wi, BT, C, OC, OC);
            d->k->gelu_backward(d, dp2, pi, dx2, ni);
        }
        dpre[k] = get_act(d, dp, ni);
        dw[k] = get_f32(d, dwi, nw);
        db[k] = get_f32(d, dbi, OC);
        float *dpre2 = get_act(d, dp2, ni), *dwu = get_f32(d, dw2, nw), *dbu = get_f32(d, db2, OC);
        expect_close(k ? "cuda gelu_matmul_backward dpre against the two kernels" : "cpu gelu_matmul_backward dpre",
                     dpre[k], dpre2, ni, k ? TOL_BF16_TWICE : TOL_SAME_BITS);
        expect_close("gelu_matmul_backward dw against matmul_backward", dw[k], dwu, nw,
                     k ? TOL_F32_GEMM : TOL_SAME_BITS);
        expect_close("gelu_matmul_backward dbias against matmul_backward", db[k], dbu, OC,
                     k ? TOL_F32_SUM : TOL_SAME_BITS);
        free(dpre2), free(dwu), free(dbu);
        bufs_free(&a);
    }
    expect_close("gelu_matmul_backward dpre", dpre[1], dpre[0], ni, TOL_GEMM);
    expect_close("gelu_matmul_backward dw", dw[1], dw[0], nw, TOL_F32_GEMM);
    expect_close("gelu_matmul_backward dbias", db[1], db[0], OC, TOL_F32_SUM);
    free_pair(dpre), free_pair(dw), free_pair(db);
    free(pre), free(w), free(g), free(dw0), free(db0), free(x);
}

static void test_gelu_matmul_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_gelu_matmul_backward(dv, 64, 128, 48);  // DGELU; the bias gradient by BGRADB
    check_gelu_matmul_backward(dv, 130, 36, 20);  // C not a multiple of 8: the GEMM, then gelu_backward
}

// ---- attention --------------------------------------------------------------------------------

typedef struct AttnCase {
    int B, T, C, NH;
} AttnCase;

// Forward on one device; returns out (B,T,C) and att (B,NH,T,T) as host floats.
static void attention_forward_on(Device *d, AttnCase ac, const float *qkv, float **out,
                                 float **att) {
    size_t n = (size_t)ac.B * ac.T * ac.C, na = (size_t)ac.B * ac.NH * ac.T * ac.T;
    TestBufs a = {.d = d};
    act *q = put_act(&a, qkv, 3 * n), *o = alloc_act(&a, n);
    float *p = bufs_alloc(&a, na * sizeof(float));
    d->k->attention_forward(d, o, p, q, ac.B, ac.T, ac.C, ac.NH);
    *out = get_act(d, o, n);
    *att = get_f32(d, p, na);
    bufs_free(&a);
}

static void check_attention(Devices *dv, AttnCase ac) {
    size_t n = (size_t)ac.B * ac.T * ac.C, na = (size_t)ac.B * ac.NH * ac.T * ac.T;
    float *qkv = rand_values(3 * n, 31, -2, 2), *g = rand_values(n, 32, -1, 1);
    float *junk = rand_values(3 * n, 33, -9, 9);
    float *out[2], *att[2], *dqkv[2];
    attention_forward_on(&dv->cpu, ac, qkv, &out[0], &att[0]);
    attention_forward_on(&dv->gpu, ac, qkv, &out[1], &att[1]);
    expect_close("attention_forward att", att[1], att[0], na, (Tol){1e-4, 1e-4});
    expect_close("attention_forward out", out[1], out[0], n, TOL_GEMM);
    FOR_BOTH_DEVICES(dv, k, d) {  // backward from the cpu's probabilities on both
        TestBufs a = {.d = d};
        act *q = put_act(&a, qkv, 3 * n), *gi = put_act(&a, g, n);
        act *dq = put_act(&a, junk, 3 * n);  // dqkv is overwritten
        float *p = put_f32(&a, att[0], na);
        d->k->attention_backward(d, dq, gi, q, p, ac.B, ac.T, ac.C, ac.NH);
        dqkv[k] = get_act(d, dq, 3 * n);
        bufs_free(&a);
    }
    expect_close("attention_backward dqkv", dqkv[1], dqkv[0], 3 * n, TOL_ATTN_BWD);
    free_pair(out), free_pair(att), free_pair(dqkv);
    free(qkv), free(g), free(junk);
}

static void test_attention(void **state) {
    Devices *dv = devices_or_skip(state);
    check_attention(dv, (AttnCase){.B = 2, .T = 24, .C = 64, .NH = 4});
    check_attention(dv, (AttnCase){.B = 1, .T = 37, .C = 48, .NH = 3});  // odd T, hs 16
    check_attention(dv, (AttnCase){.B = 2, .T = 64, .C = 128, .NH = 2}); // hs 64 as GPT-2
}

// ---- FlashAttention ---------------------------------------------------------------------------

// Forward on one device: out (B,T,C) and lse (B,NH,T) as host floats; then the
// backward from that device's own out and lse.
static void flash_on(Device *d, AttnCase ac, const float *qkv, const float *g, const float *junk, float **out,
                     float **lse, float **dqkv) {
    size_t n = (size_t)ac.B * ac.T * ac.C, rows = (size_t)ac.B * ac.NH * ac.T;
    TestBufs a = {.d = d};
    act *q = put_act(&a, qkv, 3 * n), *o = alloc_act(&a, n), *gi = put_act(&a, g, n);
    act *dq = put_act(&a, junk, 3 * n);  // dqkv is overwritten
    float *l = bufs_alloc(&a, rows * sizeof(float));
    d->k->flash_attention_forward(d, o, l, q, ac.B, ac.T, ac.C, ac.NH);
    d->k->flash_attention_backward(d, dq, gi, q, o, l, ac.B, ac.T, ac.C, ac.NH);
    *out = get_act(d, o, n);
    *lse = get_f32(d, l, rows);
    *dqkv = get_act(d, dq, 3 * n);
    bufs_free(&a);
}

// The cuda flash kernels against the cpu's flash kernels, and against the
// cuda materialized kernel (the same attention, another algorithm).
static void check_flash(Devices *dv, AttnCase ac) {
    size_t n = (size_t)ac.B * ac.T * ac.C, rows = (size_t)ac.B * ac.NH * ac.T;
    float *qkv = rand_values(3 * n, 41, -2, 2), *g = rand_values(n, 42, -1, 1);
    float *junk = rand_values(3 * n, 43, -9, 9);
    float *out[2], *lse[2], *dqkv[2], *mout, *matt;
    flash_on(&dv->cpu, ac, qkv, g, junk, &out[0], &lse[0], &dqkv[0]);
    flash_on(&dv->gpu, ac, qkv, g, junk, &out[1], &lse[1], &dqkv[1]);
    expect_close("flash_attention_forward lse", lse[1], lse[0], rows, (Tol){1e-4, 1e-4});
    expect_close("flash_attention_forward out", out[1], out[0], n, TOL_GEMM);
    expect_close("flash_attention_backward dqkv", dqkv[1], dqkv[0], 3 * n, TOL_ATTN_BWD);
    attention_forward_on(&dv->gpu, ac, qkv, &mout, &matt);
    expect_close("flash against materialized out (cuda)", out[1], mout, n, TOL_GEMM);
    free_pair(out), free_pair(lse), free_pair(dqkv);
    free(mout), free(matt), free(qkv), free(g), free(junk);
}

static void test_flash_attention(void **state) {
    Devices *dv = devices_or_skip(state);
    // the tensor cores' head sizes (kernels_cuda_flash_tc.cu)
    check_flash(dv, (AttnCase){.B = 2, .T = 24, .C = 64, .NH = 4});   // hs 16, within one tile
    check_flash(dv, (AttnCase){.B = 1, .T = 37, .C = 96, .NH = 3});   // odd T, hs 32
    check_flash(dv, (AttnCase){.B = 1, .T = 70, .C = 128, .NH = 2});  // hs 64 as GPT-2, T past a 64 tile
    check_flash(dv, (AttnCase){.B = 1, .T = 130, .C = 64, .NH = 1});  // three tiles, the last of 2 rows
    check_flash(dv, (AttnCase){.B = 1, .T = 33, .C = 256, .NH = 2});  // hs 128, the largest
    // the others run a warp per row (kernels_cuda_flash.cu)
    check_flash(dv, (AttnCase){.B = 3, .T = 5, .C = 24, .NH = 1});    // hs 24: lanes past hs idle
    check_flash(dv, (AttnCase){.B = 1, .T = 70, .C = 96, .NH = 2});   // hs 48, 32-key chunks across T
}

// Ring attention's blocks (FlashBlock) on one device: qkv (B,2Tc,3C) as two
// chunks; chunk 0 against itself (causal), chunk 1 against chunk 0 (whole)
// merged with chunk 1 against itself: the whole attention of 2Tc positions,
// y and lse; then every block's backward summed into dq (B,2Tc,C) and dk,
// dv (in dkv's k and v columns, fp32).
static void ring_on(Device *d, AttnCase ac, const float *qkv, const float *g, float **y, float **lse, float **dq,
                    float **dkv) {
    int Tc = ac.T / 2;
    size_t n = (size_t)ac.B * ac.T * ac.C, rows = (size_t)ac.B * ac.NH * ac.T, ld = 3 * (size_t)ac.C;
    float *zeros = calloc(3 * n, sizeof(float));
    TestBufs a = {.d = d};
    act *q = put_act(&a, qkv, 3 * n), *gi = put_act(&a, g, n), *yo = alloc_act(&a, n);
    float *yf = put_f32(&a, zeros, n), *l = put_f32(&a, zeros, rows), *dqf = put_f32(&a, zeros, n);
    float *dkvf = put_f32(&a, zeros, 3 * n);
    const int blocks[3][2] = {{0, 0}, {1, 0}, {1, 1}};  // (query chunk, key chunk), in the ring's order
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 3; b++) {
            int i = blocks[b][0], j = blocks[b][1];
            size_t q0 = (size_t)i * Tc * ld, k0 = (size_t)j * Tc * ld, o = (size_t)i * Tc * ac.C;
            FlashBlock f = {ac.B, ac.NH, ac.C / ac.NH, Tc, Tc, i == j, (char *)q + q0 * d->act_bytes,
                            (char *)q + (k0 + ac.C) * d->act_bytes, (char *)q + (k0 + 2 * ac.C) * d->act_bytes,
                            ld, ac.T * ld, ld, ac.T * ld, (size_t)ac.C, (size_t)ac.T * ac.C, (size_t)ac.T};
            if (pass == 0) {
                d->k->flash_block_forward(d, &f, yf + o, l + (size_t)i * Tc, b == 2);
                continue;
            }
            if (b == 0) (d->act_bytes == 4 ? (void)memcpy(yo, yf, n * 4) : d->k->f32_to_half(d, yo, yf, n));
            d->k->flash_block_backward(d, &f, (char *)yo + o * d->act_bytes, (char *)gi + o * d->act_bytes,
                                       l + (size_t)i * Tc, dqf + o, dkvf + k0 + ac.C, dkvf + k0 + 2 * ac.C);
        }
    *y = get_f32(d, yf, n), *lse = get_f32(d, l, rows), *dq = get_f32(d, dqf, n), *dkv = get_f32(d, dkvf, 3 * n);
    bufs_free(&a);
    free(zeros);
}

// The cuda blocks against the cpu's, and their merged output against the
// whole attention on the cpu (the same numbers: test_flash holds the cpu's
// blocks to the whole attention's).
static void check_ring_blocks(Devices *dv, AttnCase ac) {
    size_t n = (size_t)ac.B * ac.T * ac.C, rows = (size_t)ac.B * ac.NH * ac.T;
    float *qkv = rand_values(3 * n, 44, -2, 2), *g = rand_values(n, 45, -1, 1), *junk = rand_values(3 * n, 46, -9, 9);
    float *y[2], *lse[2], *dq[2], *dkv[2], *out, *wlse, *wdqkv;
    ring_on(&dv->cpu, ac, qkv, g, &y[0], &lse[0], &dq[0], &dkv[0]);
    ring_on(&dv->gpu, ac, qkv, g, &y[1], &lse[1], &dq[1], &dkv[1]);
    flash_on(&dv->cpu, ac, qkv, g, junk, &out, &wlse, &wdqkv);
    expect_close("flash_block_forward lse", lse[1], lse[0], rows, (Tol){1e-4, 1e-4});
    expect_close("flash_block_forward y", y[1], y[0], n, TOL_GEMM);
    expect_close("flash_block_forward y against the whole attention", y[1], out, n, TOL_GEMM);
    expect_close("flash_block_backward dq", dq[1], dq[0], n, TOL_ATTN_BWD);
    expect_close("flash_block_backward dk, dv", dkv[1], dkv[0], 3 * n, TOL_ATTN_BWD);
    free_pair(y), free_pair(lse), free_pair(dq), free_pair(dkv);
    free(out), free(wlse), free(wdqkv), free(qkv), free(g), free(junk);
}

static void test_ring_attention_blocks(void **state) {
    Devices *dv = devices_or_skip(state);
    check_ring_blocks(dv, (AttnCase){.B = 2, .T = 48, .C = 64, .NH = 4});  // chunks of 24, hs 16
    check_ring_blocks(dv, (AttnCase){.B = 1, .T = 74, .C = 96, .NH = 2});  // chunks of 37 across 32-key steps, hs 48
}

// ---- element-wise -----------------------------------------------------------------------------

static void test_gelu(void **state) {
    Devices *dv = devices_or_skip(state);
    size_t n = 3001;
    float *x = rand_values(n, 41, -5, 5), *g = rand_values(n, 42, -1, 1);
    float *y[2], *dx[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, n), *gi = put_act(&a, g, n);
        act *yi = alloc_act(&a, n), *dxi = alloc_act(&a, n);
        d->k->gelu_forward(d, yi, xi, n);
        d->k->gelu_backward(d, dxi, xi, gi, n);
        y[k] = get_act(d, yi, n);
        dx[k] = get_act(d, dxi, n);
        bufs_free(&a);
    }
    expect_close("gelu_forward", y[1], y[0], n, TOL_BF16_ONCE);
    expect_close("gelu_backward", dx[1], dx[0], n, TOL_BF16_ONCE);
    free_pair(y), free_pair(dx);
    free(x), free(g);
}

static void test_residual(void **state) {
    Devices *dv = devices_or_skip(state);
    size_t n = 3001;
    float *x = rand_values(n, 43, -1, 1), *r = rand_values(n, 44, -1, 1);
    float *y[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *xi = put_act(&a, x, n), *ri = put_act(&a, r, n);
        d->k->residual_forward(d, xi, xi, ri, n);  // out aliases a, as kernels.h allows
        y[k] = get_act(d, xi, n);
        bufs_free(&a);
    }
    expect_close("residual_forward", y[1], y[0], n, TOL_BF16_ONCE);
    free_pair(y);
    free(x), free(r);
}

// confident: every row's target logit is 512 and the others 500, 502 or 504,
// so the loss, log(1 + (V-1) e^-gap), is 9e-5 to 5e-3 for V = 16: a few ulps
// of 512 (6.1e-5), which keeps its digits only if max - z[t] is taken before
// adding log(sum) (the other order is off by 9e-6 or more here). The devices
// then differ only in how each sums V exponentials near 1.0 in fp32: at most
// V-1 roundings of 2^-24 each, so 2 (V-1) 2^-24 < 2e-6 between them.
static void check_softmax_crossentropy(Devices *dv, int BT, int V, int ld, float scale, int confident) {
    size_t n = (size_t)BT * ld;
    float *z = rand_values(n, 45, -4, 4);
    // padding columns (wte's padding rows): a large logit the softmax must
    // leave out, whose gradient is zero; kept as it is without a loss scale
    for (size_t i = 0; i < n; i++)
        if ((int)(i % ld) >= V) z[i] = 64.0f;
    int32_t *tgt = rand_tokens(BT, V, 46);
    for (size_t i = 0; confident && i < n; i++) z[i] = 504.0f - 2.0f * (float)(i / ld % 3);  // bf16-exact
    for (int r = 0; confident && r < BT; r++) z[(size_t)r * ld + tgt[r]] = 512.0f;
    float *loss[2], *dz[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        act *zi = put_act(&a, z, n);
        int32_t *ti = put_bytes(&a, tgt, BT * sizeof *tgt);
        float *li = bufs_alloc(&a, BT * sizeof(float));
        d->k->softmax_crossentropy(d, li, zi, ti, BT, V, ld, scale);
        loss[k] = get_f32(d, li, BT);
        dz[k] = get_act(d, zi, n);
        bufs_free(&a);
    }
    if (confident) {
        for (int r = 0; r < BT; r++)
            if (!(fabs(loss[1][r] - loss[0][r]) <= 2e-6)) {
                print_error("confident row %d: loss cuda %.7g cpu %.7g\n", r, loss[1][r], loss[0][r]);
                fail();
            }
    } else {
        expect_close("softmax_crossentropy losses", loss[1], loss[0], BT, TOL_F32_SUM);
    }
    if (scale != 0.0f) {
        expect_close("softmax_crossentropy dlogits", dz[1], dz[0], n, TOL_BF16_ONCE);
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < n; i++)
                if ((int)(i % ld) >= V && dz[k][i] != 0.0f) {
                    print_error("%s: dlogits %g in padding column %d of row %zu\n", k ? "cuda" : "cpu", dz[k][i],
                                (int)(i % ld), i / ld);
                    fail();
                }
    } else {
        expect_close("softmax_crossentropy logits kept", dz[1], z, n, (Tol){0, 0});
    }
    free_pair(loss), free_pair(dz);
    free(z), free(tgt);
}

static void test_softmax_crossentropy(void **state) {
    Devices *dv = devices_or_skip(state);
    check_softmax_crossentropy(dv, 48, 256, 256, 1.0f / 48, 0);   // byte-level vocabulary
    check_softmax_crossentropy(dv, 16, 5003, 5056, 1.0f / 64, 0); // wide rows (1024-thread blocks), padded
    check_softmax_crossentropy(dv, 12, 257, 384, 1.0f / 12, 0);   // the model's padding: 257 rows stored as 384
    check_softmax_crossentropy(dv, 8, 257, 384, 0.0f, 0);         // ... loss only: the padding is not written
    check_softmax_crossentropy(dv, 8, 100, 100, 0.0f, 0);         // loss only
    check_softmax_crossentropy(dv, 48, 16, 16, 1.0f / 48, 1);     // confident: max - z[t] taken first
}

// Issue 46: the arena places the same requests at the same offsets on the
// cuda device as on the cpu device (so the cpu device predicts the GPU's
// layout). The cuda device's first block is its cuBLASLt workspace: the cpu
// device is handed a block of that size first, then both the same
// allocations and releases.
static void test_arena_offsets_as_on_cpu(void **state) {
    (void)state;
    if (!device_cuda_available()) skip();
    Device cpu, gpu;
    DeviceOptions co = {.kind = "cpu", .local_size = 1, .hbm_gb = 1}, go = {.kind = "cuda", .local_size = 1, .hbm_gb = 1};
    device_init(&cpu, &co);
    device_init(&gpu, &go);
    Buf first = buf_alloc(&gpu, TIER_DEVICE, CAT_WORKSPACE, 1000, "first");  // reserves: the workspace, then this
    Buf lt = buf_alloc(&cpu, TIER_DEVICE, CAT_WORKSPACE, gpu.mem.arena.block[0].bytes - ARENA_GUARD, "its workspace");
    Buf cfirst = buf_alloc(&cpu, TIER_DEVICE, CAT_WORKSPACE, 1000, "first");
    assert_int_equal(cpu.mem.arena.capacity, gpu.mem.arena.capacity);
    assert_int_equal((char *)cfirst.ptr - (char *)cpu.region, (char *)first.ptr - (char *)gpu.region);
    Buf b[2][16] = {{{0}}};
    uint64_t rng = 11;
    for (int i = 0; i < 200; i++) {
        int k = (int)(test_rng_next(&rng) % 16);
        size_t bytes = 1 + test_rng_next(&rng) % (3 << 20);
        for (int d = 0; d < 2; d++) {
            Device *dev = d ? &gpu : &cpu;
            if (b[d][k].ptr) buf_free(dev, &b[d][k]);
            else b[d][k] = buf_alloc(dev, TIER_DEVICE, CAT_ACTIVATIONS, bytes, "a block");
        }
        size_t at_cpu = b[0][k].ptr ? (size_t)((char *)b[0][k].ptr - (char *)cpu.region) : 0;
        size_t at_gpu = b[1][k].ptr ? (size_t)((char *)b[1][k].ptr - (char *)gpu.region) : 0;
        if (at_cpu != at_gpu) fail_msg("request %d: offset %zu on the cpu device, %zu on cuda", i, at_cpu, at_gpu);
    }
    for (int k = 0; k < 16; k++) buf_free(&cpu, &b[0][k]), buf_free(&gpu, &b[1][k]);
    buf_free(&cpu, &cfirst), buf_free(&cpu, &lt), buf_free(&gpu, &first);
    device_destroy(&gpu);
    device_destroy(&cpu);
}

int main(void) {
    const struct CMUnitTest alone[] = {cmocka_unit_test(test_arena_offsets_as_on_cpu)};
    int arena_failed = cmocka_run_group_tests_name("arena", alone, NULL, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_forward),
        cmocka_unit_test(test_encoder_backward),
        cmocka_unit_test(test_layernorm_forward),
        cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_matmul_forward),
        cmocka_unit_test(test_matmul_forward_odd),
        cmocka_unit_test(test_matmul_row_stride),
        cmocka_unit_test(test_matmul_backward),
        cmocka_unit_test(test_matmul_gelu_forward),
        cmocka_unit_test(test_gelu_matmul_backward),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_flash_attention),
        cmocka_unit_test(test_ring_attention_blocks),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_residual_layernorm),
        cmocka_unit_test(test_softmax_crossentropy),
    };
    // the kernels' fp16 pass against the cpu device in fp16, within the same
    // tolerances: fp16 keeps 10 mantissa bits where bf16 keeps 7
    int failed = arena_failed + cmocka_run_group_tests_name("bf16", tests, group_setup, group_teardown);
    return failed + cmocka_run_group_tests_name("fp16", tests, group_setup_fp16, group_teardown);
}
