// test_kernels.c: the cpu kernels (kernels_cpu) against references.
//
// Backward kernels are checked against central finite differences of their
// own forward: L = sum(out * R) for a fixed random R, so dL/dout = R, and
// dL/dx[i] ~ (L(x + h e_i) - L(x - h e_i)) / (2h), with L summed in double.
// The forward runs in fp32, so the difference carries about 1e-7 |L| / h of
// rounding besides the O(h^2) truncation; tolerances below are set from that.
// Weights are bf16 and cannot be perturbed by a small h, so weight gradients
// are checked two ways: against a direct double-precision reference, and by
// finite differences with a bf16-exact step: weights lie on the grid k/64
// (|k| <= 48, exact in bf16's 8-bit significand) and the step is 1/64, which
// stays on the grid; the forward is linear in these weights, so the central
// difference is exact up to fp32 rounding.
#include <cblas.h>
#include <omp.h>
#include "testutil.h"
#include "half_rows.h"
#include "kernels.h"

#define GRID_STEP (1.0f / 64.0f)

typedef double (*Objective)(Device *d, void *ctx);

static double weighted_sum(const float *out, const float *R, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * R[i];
    return s;
}

static void fill_grid_bf16(bf16 *w, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++)
        w[i] = f32_to_bf16((float)((int)(test_rng_next(&s) % 97) - 48) / 64.0f);
}

static void report_bad(const char *what, size_t i, double got, double want, int *bad) {
    if ((*bad)++ < 5) print_message("%s[%zu]: kernel %.7g, reference %.7g\n", what, i, got, want);
}

// Compares grad[i] with the central difference of obj over x[i], every i.
static int check_fd(Device *d, float *x, const float *grad, size_t n, float h, Objective obj,
                    void *ctx, double atol, double rtol, const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i], xp = x0 + h, xm = x0 - h;
        x[i] = xp;
        double lp = obj(d, ctx);
        x[i] = xm;
        double lm = obj(d, ctx);
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        if (!test_close(grad[i], fd, atol, rtol)) report_bad(what, i, grad[i], fd, &bad);
    }
    return bad;
}

// The same over bf16 weights on the k/64 grid, with the exact step 1/64.
static int check_fd_bf16(Device *d, bf16 *w, const float *grad, size_t n, Objective obj, void *ctx,
                         double atol, double rtol, const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bf16 w0 = w[i];
        float x0 = bf16_to_f32(w0);
        bf16 wp = f32_to_bf16(x0 + GRID_STEP), wm = f32_to_bf16(x0 - GRID_STEP);
        assert_true(bf16_to_f32(wp) == x0 + GRID_STEP && bf16_to_f32(wm) == x0 - GRID_STEP);
        w[i] = wp;
        double lp = obj(d, ctx);
        w[i] = wm;
        double lm = obj(d, ctx);
        w[i] = w0;
        double fd = (lp - lm) / (2.0 * GRID_STEP);
        if (!test_close(grad[i], fd, atol, rtol)) report_bad(what, i, grad[i], fd, &bad);
    }
    return bad;
}

static int check_close(const float *got, const double *want, size_t n, double atol, double rtol,
                       const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!test_close(got[i], want[i], atol, rtol)) report_bad(what, i, got[i], want[i], &bad);
    return bad;
}

// ---- encoder ----------------------------------------------------------------------

static void test_encoder(void **state) {
    Device *d = *state;
    enum { B = 2, T = 5, C = 70, V = 9, BT = B * T };  // C spans two column chunks
    bf16 wte[V * C], wpe[T * C];
    fill_grid_bf16(wte, V * C, 1);
    fill_grid_bf16(wpe, T * C, 2);
    int32_t tokens[BT] = {3, 1, 3, 8, 0, 3, 3, 2, 1, 1};  // repeats: the scatter must add
    float out[BT * C], R[BT * C], dwte[V * C], dwpe[T * C];
    test_fill(R, BT * C, 3, -1, 1);
    test_fill(dwte, V * C, 4, -1, 1);  // prefilled: the kernel accumulates
    test_fill(dwpe, T * C, 5, -1, 1);
    double want_te[V * C], want_pe[T * C];
    for (int i = 0; i < V * C; i++) want_te[i] = dwte[i];
    for (int i = 0; i < T * C; i++) want_pe[i] = dwpe[i];

    d->k->encoder_forward(d, out, tokens, wte, wpe, B, T, C);
    for (int bt = 0; bt < BT; bt++)
        for (int c = 0; c < C; c++) {
            float ref = bf16_to_f32(wte[tokens[bt] * C + c]) + bf16_to_f32(wpe[(bt % T) * C + c]);
            assert_true(out[bt * C + c] == ref);  // one fp32 add of exact values: bitwise
            want_te[tokens[bt] * C + c] += R[bt * C + c];
            want_pe[(bt % T) * C + c] += R[bt * C + c];
        }
    int32_t order[BT], start[BT];  // the tokens' buckets, in host memory: the cpu device's
    TokenBuckets tb = {order, start, token_buckets_build(tokens, BT, order, start)};
    d->k->encoder_backward(d, dwte, dwpe, R, tokens, &tb, B, T, C);
    // sums of at most 5 values of size 1: fp32 rounding stays below 1e-6
    assert_int_equal(check_close(dwte, want_te, V * C, 1e-6, 1e-6, "dwte"), 0);
    assert_int_equal(check_close(dwpe, want_pe, T * C, 1e-6, 1e-6, "dwpe"), 0);
}

// ---- layernorm ------------------------------------------------------------------

typedef struct LnCtx {
    float *out, *mean, *rstd, *inp, *R;
    bf16 *w, *b;
    int BT, C;
} LnCtx;

static double ln_objective(Device *d, void *p) {
    LnCtx *c = p;
    d->k->layernorm_forward(d, c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->BT, c->C);
    return weighted_sum(c->out, c->R, (size_t)c->BT * c->C);
}

static void test_layernorm(void **state) {
    Device *d = *state;
    enum { BT = 6, C = 80, N = BT * C };
    float inp[N], out[N], R[N], mean[BT], rstd[BT], dinp[N], prefill[N], dw[C], db[C];
    bf16 w[C], b[C];
    test_fill(inp, N, 10, -2, 3);
    test_fill(R, N, 11, -1, 1);
    fill_grid_bf16(w, C, 12);
    fill_grid_bf16(b, C, 13);
    LnCtx ctx = {out, mean, rstd, inp, R, w, b, BT, C};

    // forward vs double reference (two-pass mean/variance, eps 1e-5)
    ln_objective(d, &ctx);
    for (int r = 0; r < BT; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += inp[r * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (inp[r * C + c] - m) * (inp[r * C + c] - m);
        double s = 1.0 / sqrt(v / C + 1e-5);
        assert_true(test_close(mean[r], m, 1e-6, 1e-5) && test_close(rstd[r], s, 1e-6, 1e-5));
        for (int c = 0; c < C; c++) {
            double y = (inp[r * C + c] - m) * s * bf16_to_f32(w[c]) + bf16_to_f32(b[c]);
            assert_true(test_close(out[r * C + c], y, 1e-5, 1e-5));
        }
    }

    // backward: dinp accumulates onto the prefill, dw/db onto theirs
    test_fill(prefill, N, 14, -1, 1);
    memcpy(dinp, prefill, sizeof dinp);
    test_fill(dw, C, 15, -1, 1);
    test_fill(db, C, 16, -1, 1);
    double want_w[C], want_b[C];
    for (int c = 0; c < C; c++) {
        want_w[c] = dw[c];
        want_b[c] = db[c];
        for (int r = 0; r < BT; r++) {
            want_w[c] += (double)R[r * C + c] * (inp[r * C + c] - mean[r]) * rstd[r];
            want_b[c] += R[r * C + c];
        }
    }
    d->k->layernorm_backward(d, dinp, dw, db, R, inp, w, mean, rstd, BT, C);
    assert_int_equal(check_close(dw, want_w, C, 1e-5, 1e-5, "ln dw"), 0);
    assert_int_equal(check_close(db, want_b, C, 1e-5, 1e-5, "ln db"), 0);
    for (int i = 0; i < N; i++) dinp[i] -= prefill[i];
    // |L| ~ 30, h = 1e-2: rounding ~ 30 * 1e-7 / 1e-2 = 3e-4, truncation ~ h^2
    assert_int_equal(check_fd(d, inp, dinp, N, 1e-2f, ln_objective, &ctx, 1e-3, 1e-2, "ln dinp"),
                     0);
    // weight and bias on the bf16 grid: the output is linear in both
    float dw0[C] = {0}, db0[C] = {0};
    ln_objective(d, &ctx);  // mean, rstd of the unperturbed input
    d->k->layernorm_backward(d, dinp, dw0, db0, R, inp, w, mean, rstd, BT, C);
    assert_int_equal(check_fd_bf16(d, w, dw0, C, ln_objective, &ctx, 1e-3, 1e-3, "ln dw fd"), 0);
    assert_int_equal(check_fd_bf16(d, b, db0, C, ln_objective, &ctx, 1e-3, 1e-3, "ln db fd"), 0);
}

// ---- matmul ---------------------------------------------------------------------

typedef struct MmCtx {
    float *out, *inp, *R;
    bf16 *w, *bias;
    int BT, C, OC;
} MmCtx;

static double mm_objective(Device *d, void *p) {
    MmCtx *c = p;
    d->k->matmul_forward(d, c->out, c->inp, c->w, c->bias, c->BT, c->C, c->OC, c->OC);
    return weighted_sum(c->out, c->R, (size_t)c->BT * c->OC);
}

static void check_matmul(Device *d) {
    enum { BT = 40, C = 12, OC = 70 };  // BT splits 32 + 8 over 2 threads; OC: two dbias chunks
    float inp[BT * C], out[BT * OC], R[BT * OC], dinp[BT * C], dw[OC * C], db[OC];
    bf16 w[OC * C], bias[OC];
    test_fill(inp, BT * C, 20, -1, 1);
    test_fill(R, BT * OC, 21, -1, 1);
    fill_grid_bf16(w, OC * C, 22);
    fill_grid_bf16(bias, OC, 23);
    MmCtx ctx = {out, inp, R, w, bias, BT, C, OC};

    for (int with_bias = 0; with_bias < 2; with_bias++) {
        ctx.bias = with_bias ? bias : NULL;
        for (int i = 0; i < BT * OC; i++) out[i] = NAN;  // overwritten, NaN must not leak
        mm_objective(d, &ctx);
        for (int r = 0; r < BT; r++)
            for (int o = 0; o < OC; o++) {
                double y = with_bias ? bf16_to_f32(bias[o]) : 0.0;
                for (int c = 0; c < C; c++) y += (double)inp[r * C + c] * bf16_to_f32(w[o * C + c]);
                assert_true(test_close(out[r * OC + o], y, 1e-5, 1e-5));
            }
    }

    // dinp is overwritten (NaN prefill), dw and dbias accumulate onto their prefill
    for (int i = 0; i < BT * C; i++) dinp[i] = NAN;
    test_fill(dw, OC * C, 24, -1, 1);
    test_fill(db, OC, 25, -1, 1);
    double want_w[OC * C], want_b[OC];
    for (int o = 0; o < OC; o++) {
        want_b[o] = db[o];
        for (int r = 0; r < BT; r++) want_b[o] += R[r * OC + o];
        for (int c = 0; c < C; c++) {
            want_w[o * C + c] = dw[o * C + c];
            for (int r = 0; r < BT; r++)
                want_w[o * C + c] += (double)R[r * OC + o] * inp[r * C + c];
        }
    }
    d->k->matmul_backward(d, dinp, dw, db, R, inp, w, BT, C, OC, OC);
    assert_int_equal(check_close(dw, want_w, OC * C, 1e-5, 1e-5, "mm dw"), 0);
    assert_int_equal(check_close(db, want_b, OC, 1e-5, 1e-5, "mm dbias"), 0);
    // out is linear in inp: the difference is exact but for fp32 rounding (|L| ~ 10, h = 1e-2)
    assert_int_equal(
        check_fd(d, inp, dinp, BT * C, 1e-2f, mm_objective, &ctx, 1e-3, 1e-3, "mm dinp"), 0);
    float dw0[OC * C] = {0}, db0[OC] = {0};
    d->k->matmul_backward(d, NULL, dw0, db0, R, inp, w, BT, C, OC, OC);  // dinp NULL: skipped
    assert_int_equal(check_fd_bf16(d, w, dw0, OC * C, mm_objective, &ctx, 1e-3, 1e-3, "mm dw fd"),
                     0);
    assert_int_equal(check_fd_bf16(d, bias, db0, OC, mm_objective, &ctx, 1e-3, 1e-3, "mm db fd"),
                     0);
    float dw1[OC * C];
    memcpy(dw1, dw0, sizeof dw0);
    d->k->matmul_backward(d, NULL, dw0, NULL, R, inp, w, BT, C, OC, OC);  // dbias NULL: skipped
    for (int i = 0; i < OC * C; i++) assert_true(test_close(dw0[i], 2.0 * dw1[i], 1e-6, 1e-6));
}

// ---- attention --------------------------------------------------------------------

typedef struct AttCtx {
    float *out, *att, *qkv, *R;
    int B, T, C, NH;
} AttCtx;

static double att_objective(Device *d, void *p) {
    AttCtx *c = p;
    d->k->attention_forward(d, c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return weighted_sum(c->out, c->R, (size_t)c->B * c->T * c->C);
}

// out (B,T,C) and att (B,NH,T,T) in double, straight from the definition
static void attention_reference(double *out, double *att, const float *qkv, int B, int T, int C,
                                int NH) {
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double *p = att + (((size_t)b * NH + h) * T + t) * T, maxv = -INFINITY, sum = 0;
                for (int s = 0; s < T; s++) {
                    const float *k = qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int i = 0; i < hs; i++) dot += (double)q[i] * k[i];
                    p[s] = s <= t ? dot / sqrt((double)hs) : -INFINITY;
                    if (p[s] > maxv) maxv = p[s];
                }
                for (int s = 0; s < T; s++) sum += p[s] = exp(p[s] - maxv);
                for (int s = 0; s < T; s++) p[s] /= sum;
                for (int i = 0; i < hs; i++) {
                    double y = 0;
                    for (int s = 0; s < T; s++)
                        y += p[s] * qkv[((size_t)b * T + s) * 3 * C + 2 * C + h * hs + i];
                    out[((size_t)b * T + t) * C + h * hs + i] = y;
                }
            }
}

static void check_attention(Device *d) {
    enum { B = 2, T = 7, C = 12, NH = 3, N = B * T * C, NQKV = 3 * N, NATT = B * NH * T * T };
    float qkv[NQKV], out[N], att[NATT], R[N], dqkv[NQKV];
    double ref_out[N], ref_att[NATT];
    test_fill(qkv, NQKV, 30, -2, 2);
    test_fill(R, N, 31, -1, 1);
    AttCtx ctx = {out, att, qkv, R, B, T, C, NH};
    for (int i = 0; i < NATT; i++) att[i] = NAN;
    att_objective(d, &ctx);
    attention_reference(ref_out, ref_att, qkv, B, T, C, NH);
    assert_int_equal(check_close(out, ref_out, N, 1e-5, 1e-5, "att out"), 0);
    assert_int_equal(check_close(att, ref_att, NATT, 1e-6, 1e-5, "att probs"), 0);
    for (int bht = 0; bht < B * NH * T; bht++)
        for (int s = bht % T + 1; s < T; s++) assert_true(att[(size_t)bht * T + s] == 0.0f);

    // causality: changing token t's k and v leaves every output before t bit-identical
    float before[N];
    memcpy(before, out, sizeof out);
    int t_future = 4;
    for (int b = 0; b < B; b++)
        for (int i = C; i < 3 * C; i++) qkv[((size_t)b * T + t_future) * 3 * C + i] += 0.5f;
    att_objective(d, &ctx);
    for (int b = 0; b < B; b++)
        assert_memory_equal(out + (size_t)b * T * C, before + (size_t)b * T * C,
                            t_future * C * sizeof(float));
    test_fill(qkv, NQKV, 30, -2, 2);

    for (int i = 0; i < NQKV; i++) dqkv[i] = NAN;  // overwritten
    att_objective(d, &ctx);
    d->k->attention_backward(d, dqkv, R, qkv, att, B, T, C, NH);
    // |L| ~ 10, h = 1e-2: rounding ~ 1e-4, truncation ~ 1e-4 (softmax curvature)
    assert_int_equal(check_fd(d, qkv, dqkv, NQKV, 1e-2f, att_objective, &ctx, 1e-3, 1e-2, "dqkv"),
                     0);
}

static void test_matmul(void **state) { check_matmul(*state); }

// Rows ldo apart: the same numbers as packed rows, and the columns past OC
// neither read by the GEMMs (NaN there must not leak) nor written; the
// softmax leaves them out, and its gradient pass writes zeros there (the
// head's columns of wte's padding rows: their gradient must be zero).
static void test_row_strides(void **state) {
    Device *d = *state;
    enum { BT = 6, C = 8, OC = 37, LD = 64 };
    float inp[BT * C], packed[BT * OC], strided[BT * LD], dinp_p[BT * C], dinp_s[BT * C];
    float dw_p[OC * C] = {0}, dw_s[OC * C] = {0}, db_p[OC] = {0}, db_s[OC] = {0}, losses_p[BT], losses_s[BT];
    bf16 w[OC * C], bias[OC];
    int32_t targets[BT] = {0, 36, 5, 5, 17, 30};
    test_fill(inp, BT * C, 80, -1, 1);
    fill_grid_bf16(w, OC * C, 81);
    fill_grid_bf16(bias, OC, 82);
    for (int i = 0; i < BT * LD; i++) strided[i] = NAN;
    d->k->matmul_forward(d, packed, inp, w, bias, BT, C, OC, OC);
    d->k->matmul_forward(d, strided, inp, w, bias, BT, C, OC, LD);
    for (int r = 0; r < BT; r++) {
        for (int o = 0; o < OC; o++) assert_true(test_close(strided[r * LD + o], packed[r * OC + o], 1e-6, 1e-6));
        for (int o = OC; o < LD; o++) assert_true(isnan(strided[r * LD + o]));
    }
    d->k->softmax_crossentropy(d, losses_s, strided, targets, BT, OC, LD, 0.0f);  // losses only: nothing written
    for (int i = 0; i < BT * LD; i++) assert_true(i % LD < OC ? !isnan(strided[i]) : isnan(strided[i]));
    d->k->softmax_crossentropy(d, losses_p, packed, targets, BT, OC, OC, 1.0f / BT);
    d->k->softmax_crossentropy(d, losses_s, strided, targets, BT, OC, LD, 1.0f / BT);
    for (int r = 0; r < BT; r++) {
        assert_true(test_close(losses_s[r], losses_p[r], 1e-6, 1e-6));
        for (int o = 0; o < OC; o++) assert_true(test_close(strided[r * LD + o], packed[r * OC + o], 1e-6, 1e-6));
        for (int o = OC; o < LD; o++) assert_true(strided[r * LD + o] == 0.0f);
        for (int o = OC; o < LD; o++) strided[r * LD + o] = NAN;  // the backward GEMM must not read them
    }
    d->k->matmul_backward(d, dinp_p, dw_p, db_p, packed, inp, w, BT, C, OC, OC);
    d->k->matmul_backward(d, dinp_s, dw_s, db_s, strided, inp, w, BT, C, OC, LD);
    for (int i = 0; i < BT * C; i++) assert_true(test_close(dinp_s[i], dinp_p[i], 1e-6, 1e-6));
    for (int i = 0; i < OC * C; i++) assert_true(test_close(dw_s[i], dw_p[i], 1e-6, 1e-6));
    for (int i = 0; i < OC; i++) assert_true(test_close(db_s[i], db_p[i], 1e-6, 1e-6));
}
static void test_attention(void **state) { check_attention(*state); }

// The kernels run GEMMs on OpenMP threads when OpenBLAS is single-threaded
// (kernels_cpu.h), and as one threaded sgemm otherwise: test both ways.
static void test_gemm_kernels_blas_single(void **state) {
    int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    check_matmul(*state);
    check_attention(*state);
    openblas_set_num_threads(blas_threads);
}

// ---- GELU, residual ----------------------------------------------------------------

typedef struct GeluCtx {
    float *out, *inp, *R;
    size_t n;
} GeluCtx;

static double gelu_objective(Device *d, void *p) {
    GeluCtx *c = p;
    d->k->gelu_forward(d, c->out, c->inp, c->n);
    return weighted_sum(c->out, c->R, c->n);
}

static void test_gelu(void **state) {
    Device *d = *state;
    enum { N = 101 };
    float inp[N], out[N], R[N], dinp[N];
    test_fill(inp, N, 40, -5, 5);
    test_fill(R, N, 41, -1, 1);
    GeluCtx ctx = {out, inp, R, N};
    gelu_objective(d, &ctx);
    for (int i = 0; i < N; i++) {
        double x = inp[i];
        double y = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        assert_true(test_close(out[i], y, 1e-6, 1e-5));
    }
    for (int i = 0; i < N; i++) dinp[i] = NAN;  // overwritten
    d->k->gelu_backward(d, dinp, inp, R, N);
    assert_int_equal(check_fd(d, inp, dinp, N, 1e-2f, gelu_objective, &ctx, 1e-3, 1e-2, "gelu"), 0);
}

// fp32 ulps between a float and a double reference: |got - want| in units
// of the spacing of floats at want (2^-149 below the normal range).
static double ulps(float got, double want) {
    int e;
    frexp(want, &e);
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    return fabs((double)got - want) / ulp;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_grad_ref(double x) {
    double k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// exp_f32 (elementwise.h), the exponential GELU is computed from on every
// device, against libm's exp in double, and GELU and its derivative from it
// against the tanh formula in double; the cpu kernels' vectorized loops give
// gelu_f32's and gelu_grad_f32's bits in every lane; non-finite inputs stay
// non-finite (an fp16 overflow must reach the norm).
static void test_gelu_from_one_exponential(void **state) {
    Device *d = *state;
    double worst_exp = 0, worst_gelu = 0, worst_grad = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.0f * (float)i / 2000000.0f;
        double u = ulps(exp_f32(x), exp((double)x));
        if (u > worst_exp) worst_exp = u;
    }
    for (int i = 0; i <= 400000; i++) {
        float x = -12.0f + 24.0f * (float)i / 400000.0f;
        // GELU's result falls to ~0 for negative x: its error is measured against |x|'s scale there
        double y = gelu_ref(x), g = gelu_grad_ref(x), scale = fabs(x) > 1.0 ? fabs(x) : 1.0;
        double eg = fabs(gelu_f32(x) - y) / (scale * 0x1p-24), ed = fabs(gelu_grad_f32(x) - g) / 0x1p-24;
        if (eg > worst_gelu) worst_gelu = eg;
        if (ed > worst_grad) worst_grad = ed;
    }
    print_message("exp_f32 %.2f ulp; gelu %.2f, gelu' %.2f half-ulps of max(|x|, 1)\n", worst_exp, worst_gelu,
                  worst_grad);
    assert_true(worst_exp <= 2.0);
    // measured: 0.99 ulp, 1.96 and 3.21 (the tanh formula through libm's tanhf: 1.99 and 9.39)
    assert_true(worst_gelu <= 4.0);
    assert_true(worst_grad <= 8.0);

    assert_true(isnan(exp_f32(NAN)) && isnan(gelu_f32(NAN)) && isnan(gelu_grad_f32(NAN)));
    assert_true(exp_f32(INFINITY) > 1e38f && exp_f32(-INFINITY) > 0.0f && exp_f32(-INFINITY) < 1e-37f);
    assert_true(gelu_f32(INFINITY) == INFINITY && !isfinite(gelu_f32(-INFINITY)));
    assert_true(!isfinite(gelu_grad_f32(INFINITY)));

    enum { N = 1001 };  // odd: the vector loop's tail runs too
    float inp[N], dout[N], out[N], dinp[N];
    test_fill(inp, N, 42, -9, 9);
    test_fill(dout, N, 43, -1, 1);
    d->k->gelu_forward(d, out, inp, N);
    d->k->gelu_backward(d, dinp, inp, dout, N);
    for (int i = 0; i < N; i++) {
        float want = gelu_f32(inp[i]), want_d = gelu_grad_f32(inp[i]) * dout[i];
        if (memcmp(&out[i], &want, 4) != 0 || memcmp(&dinp[i], &want_d, 4) != 0)
            fail_msg("element %d: kernel %.9g %.9g, gelu_f32 %.9g %.9g", i, out[i], dinp[i], want, want_d);
    }
}

// residual_forward has no backward kernel (the gradient passes through unchanged)
static void test_residual(void **state) {
    Device *d = *state;
    enum { N = 77 };
    float a[N], b[N], out[N];
    test_fill(a, N, 50, -3, 3);
    test_fill(b, N, 51, -3, 3);
    d->k->residual_forward(d, out, a, b, N);
    for (int i = 0; i < N; i++) assert_true(out[i] == a[i] + b[i]);
    d->k->residual_forward(d, a, a, b, N);  // out aliases a
    assert_memory_equal(a, out, sizeof out);
}

// ---- softmax + cross-entropy ----------------------------------------------------------

typedef struct CeCtx {
    float *losses, *logits, *work;
    const int32_t *targets;
    int BT, V;
} CeCtx;

// the mean loss; runs on a copy because the kernel is called without a gradient
static double ce_objective(Device *d, void *p) {
    CeCtx *c = p;
    memcpy(c->work, c->logits, (size_t)c->BT * c->V * sizeof(float));
    d->k->softmax_crossentropy(d, c->losses, c->work, c->targets, c->BT, c->V, c->V, 0.0f);
    double s = 0;
    for (int r = 0; r < c->BT; r++) s += c->losses[r];
    return s / c->BT;
}

static void test_softmax_crossentropy(void **state) {
    Device *d = *state;
    enum { BT = 5, V = 37, N = BT * V };
    float logits[N], work[N], grad[N], losses[BT];
    int32_t targets[BT] = {0, 36, 7, 7, 20};
    test_fill(logits, N, 60, -4, 4);
    for (int i = 0; i < V; i++) logits[3 * V + i] += 200.0f;  // exp would overflow without the max
    CeCtx ctx = {losses, logits, work, targets, BT, V};

    memcpy(work, logits, sizeof work);
    d->k->softmax_crossentropy(d, losses, work, targets, BT, V, V, 0.0f);
    assert_memory_equal(work, logits, sizeof work);  // dloss_scale 0: logits untouched
    for (int r = 0; r < BT; r++) {
        double maxv = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) maxv = fmax(maxv, logits[r * V + i]);
        for (int i = 0; i < V; i++) sum += exp(logits[r * V + i] - maxv);
        double logp = logits[r * V + targets[r]] - maxv - log(sum);  // log-softmax
        assert_true(isfinite(losses[r]) && test_close(losses[r], -logp, 1e-5, 1e-5));
    }

    memcpy(grad, logits, sizeof grad);
    d->k->softmax_crossentropy(d, losses, grad, targets, BT, V, V, 1.0f / BT);
    // d(mean loss)/dlogit ~ 1e-2; rounding of the mean ~ 3e-7 / 2h = 2e-5 at h = 1e-2
    assert_int_equal(check_fd(d, logits, grad, N, 1e-2f, ce_objective, &ctx, 5e-5, 1e-2, "dlogits"),
                     0);
}

// ---- conversions and 16-bit gradient ops --------------------------------------------------

// The 16-bit ops in each format (bf16, fp16) on each conversion path this
// CPU has (F16C, scalar), against the scalar conversions element by element.
// fp16 values past 65504 become infinite: y holds a few.
static void check_half_ops(Device *d) {
    enum { N = 1003 };
    HalfFormat f = d->half;
    float x[N], y[N], back[N];
    bf16 hx[N], acc[N], hy[N];
    test_fill(x, N, 70, -10, 10);
    test_fill(y, N, 71, -10, 10);
    for (int i = 0; i < N; i += 97) y[i] = 7e4f;
    d->k->f32_to_half(d, hx, x, N);
    d->k->half_to_f32(d, back, hx, N);
    for (int i = 0; i < N; i++)
        assert_true(hx[i] == f32_to_half(f, x[i]) && back[i] == half_to_f32(f, hx[i]));

    memcpy(acc, hx, sizeof acc);
    d->k->grad_to_bf16(d, acc, y, N, 0);  // overwrite
    for (int i = 0; i < N; i++) assert_true(acc[i] == f32_to_half(f, y[i]));
    memcpy(acc, hx, sizeof acc);
    d->k->grad_to_bf16(d, acc, y, N, 1);  // accumulate: half(half + fp32)
    for (int i = 0; i < N; i++) assert_true(acc[i] == f32_to_half(f, half_to_f32(f, hx[i]) + y[i]));
    if (f == HALF_FP16) assert_true(isinf(half_to_f32(f, acc[0])));  // 7e4 overflows fp16

    d->k->f32_to_half(d, hy, y, N);
    memcpy(acc, hx, sizeof acc);
    d->k->add_bf16(d, acc, hy, N);
    for (int i = 0; i < N; i++)
        assert_true(acc[i] == f32_to_half(f, half_to_f32(f, hx[i]) + half_to_f32(f, hy[i])));

    double want = 0;
    for (int i = 0; i < N; i++) want += (double)half_to_f32(f, hx[i]) * half_to_f32(f, hx[i]);
    assert_true(test_close(d->k->sum_squares_bf16(d, hx, N), want, 0, 1e-12));
    assert_true(d->k->sum_squares_bf16(d, hx, 0) == 0.0);
}

// A matmul reads its fp16 weights and bias as fp16 (not as bf16 bits)
static void check_matmul_reads_format(Device *d) {
    enum { BT = 5, C = 12, OC = 7 };
    float inp[BT * C], wf[OC * C], bf[OC], out[BT * OC];
    bf16 w[OC * C], b[OC];
    test_fill(inp, BT * C, 80, -1, 1);
    test_fill(wf, OC * C, 81, -1, 1);
    test_fill(bf, OC, 82, -1, 1);
    d->k->f32_to_half(d, w, wf, OC * C);
    d->k->f32_to_half(d, b, bf, OC);
    d->k->matmul_forward(d, out, inp, w, b, BT, C, OC, OC);
    for (int r = 0; r < BT; r++)
        for (int o = 0; o < OC; o++) {
            double want = half_to_f32(d->half, b[o]);
            for (int c = 0; c < C; c++) want += (double)inp[r * C + c] * half_to_f32(d->half, w[o * C + c]);
            assert_true(test_close(out[r * OC + o], want, 1e-5, 1e-5));
        }
}

static void test_half_ops(void **state) {
    Device *d = *state;
    HalfFormat saved_half = d->half;
    int saved_path = d->half_path;
    for (int f = HALF_BF16; f <= HALF_FP16; f++)
        for (int p = HALF_ROWS_SCALAR; p <= HALF_ROWS_F16C; p++) {
            if (half_rows_unsupported_reason((HalfRowsPath)p)) continue;
            d->half = (HalfFormat)f;
            d->half_path = p;
            check_half_ops(d);
            check_matmul_reads_format(d);
        }
    d->half = saved_half;
    d->half_path = saved_path;
}

// ---- determinism ----------------------------------------------------------------------
// Same input, same bits: every kernel on every run at a fixed thread count.
// The kernels whose sums the cpu code orders itself (row-wise, column chunks,
// fixed blocks; attention heads each on one thread) also give the same bits at
// any thread count; the big GEMMs are split over threads and may not.

enum { DB = 2, DT = 32, DC = 96, DNH = 4, DV = 100, DBT = DB * DT };
typedef struct DetBufs {
    float x[DBT * DC], ln[DBT * DC], mean[DBT], rstd[DBT], qkv[DBT * 3 * DC], y[DBT * DC];
    float att[DB * DNH * DT * DT], logits[DBT * DV], losses[DBT];
    float dx[DBT * DC], dln[DBT * DC], dqkv[DBT * 3 * DC];
    float dwte[DV * DC], dwpe[DT * DC], dlnw[DC], dlnb[DC], dw[3 * DC * DC], db[3 * DC];
    double sumsq;
} DetBufs;

typedef struct DetInputs {
    bf16 *wte, *wpe, *w;  // (DV,DC), (DT,DC), (3DC,DC); w's first rows double as ln weights
    int32_t tokens[DBT];
    int32_t order[DBT], start[DBT];  // the tokens' buckets
    TokenBuckets buckets;
} DetInputs;

// A forward and backward chain through every kernel, like one layer and the head.
static void run_chain(Device *d, DetBufs *o, const DetInputs *in) {
    memset(o, 0, sizeof *o);
    const KernelOps *k = d->k;
    k->encoder_forward(d, o->x, in->tokens, in->wte, in->wpe, DB, DT, DC);
    k->layernorm_forward(d, o->ln, o->mean, o->rstd, o->x, in->w, in->w + DC, DBT, DC);
    k->matmul_forward(d, o->qkv, o->ln, in->w, in->w, DBT, DC, 3 * DC, 3 * DC);
    k->attention_forward(d, o->y, o->att, o->qkv, DB, DT, DC, DNH);
    k->matmul_forward(d, o->logits, o->y, in->wte, NULL, DBT, DC, DV, DV);
    k->softmax_crossentropy(d, o->losses, o->logits, in->tokens, DBT, DV, DV, 1.0f / DBT);
    k->matmul_backward(d, o->dx, o->dwte, NULL, o->logits, o->y, in->wte, DBT, DC, DV, DV);
    k->attention_backward(d, o->dqkv, o->dx, o->qkv, o->att, DB, DT, DC, DNH);
    k->matmul_backward(d, o->dln, o->dw, o->db, o->dqkv, o->ln, in->w, DBT, DC, 3 * DC, 3 * DC);
    memset(o->dx, 0, sizeof o->dx);
    k->layernorm_backward(d, o->dx, o->dlnw, o->dlnb, o->dln, o->x, in->w, o->mean, o->rstd, DBT,
                          DC);
    k->encoder_backward(d, o->dwte, o->dwpe, o->dx, in->tokens, &in->buckets, DB, DT, DC);
    o->sumsq = k->sum_squares_bf16(d, in->w, 3 * DC * DC);
}

// The kernels without a thread-split GEMM, each on inputs taken from `c` (a chain's result).
static void run_unsplit(Device *d, DetBufs *o, const DetBufs *c, const DetInputs *in) {
    memset(o, 0, sizeof *o);
    const KernelOps *k = d->k;
    k->layernorm_forward(d, o->ln, o->mean, o->rstd, c->x, in->w, in->w + DC, DBT, DC);
    k->attention_forward(d, o->y, o->att, c->qkv, DB, DT, DC, DNH);
    k->attention_backward(d, o->dqkv, c->y, c->qkv, c->att, DB, DT, DC, DNH);
    memcpy(o->logits, c->logits, sizeof o->logits);
    k->softmax_crossentropy(d, o->losses, o->logits, in->tokens, DBT, DV, DV, 1.0f / DBT);
    k->matmul_backward(d, NULL, o->dw, o->db, c->dqkv, c->ln, in->w, DBT, DC, 3 * DC, 3 * DC);
    memset(o->dw, 0, sizeof o->dw);  // the GEMM part; only dbias is compared
    k->layernorm_backward(d, o->dx, o->dlnw, o->dlnb, c->dln, c->x, in->w, c->mean, c->rstd, DBT,
                          DC);
    k->encoder_backward(d, o->dwte, o->dwpe, c->dx, in->tokens, &in->buckets, DB, DT, DC);
    o->sumsq = k->sum_squares_bf16(d, in->w, 3 * DC * DC);
}

static void test_deterministic(void **state) {
    Device *d = *state;
    DetInputs in = {.wte = malloc(DV * DC * sizeof(bf16)),
                    .wpe = malloc(DT * DC * sizeof(bf16)),
                    .w = malloc(3 * DC * DC * sizeof(bf16))};
    float *tmp = malloc(3 * DC * DC * sizeof(float));
    for (int i = 0; i < DBT; i++) in.tokens[i] = (i * 37 + i / 5) % DV;
    in.buckets = (TokenBuckets){in.order, in.start, token_buckets_build(in.tokens, DBT, in.order, in.start)};
    test_fill(tmp, DV * DC, 80, -0.5f, 0.5f);
    d->k->f32_to_half(d, in.wte, tmp, DV * DC);
    test_fill(tmp, DT * DC, 81, -0.5f, 0.5f);
    d->k->f32_to_half(d, in.wpe, tmp, DT * DC);
    test_fill(tmp, 3 * DC * DC, 82, -0.2f, 0.2f);
    d->k->f32_to_half(d, in.w, tmp, 3 * DC * DC);
    DetBufs *chain = malloc(sizeof *chain), *ref = malloc(sizeof *ref), *got = malloc(sizeof *got);
    run_chain(d, chain, &in);
    for (int run = 0; run < 2; run++) {
        run_chain(d, got, &in);
        assert_memory_equal(chain, got, sizeof *got);
    }
    run_unsplit(d, ref, chain, &in);
    int threads[] = {1, 3, d->threads};
    for (int i = 0; i < 3; i++) {
        omp_set_num_threads(threads[i]);
        run_unsplit(d, got, chain, &in);
        if (memcmp(ref, got, sizeof *ref) != 0)
            print_message("differs with %d threads\n", threads[i]);
        assert_memory_equal(ref, got, sizeof *ref);
    }
    omp_set_num_threads(d->threads);
    free(chain), free(ref), free(got), free(in.wte), free(in.wpe), free(in.w), free(tmp);
}

static int setup(void **state) {
    static Device dev;  // one cpu device for the whole group
    DeviceOptions opt = {.kind = "cpu"};
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
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_row_strides),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gemm_kernels_blas_single),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_gelu_from_one_exponential),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_softmax_crossentropy),
        cmocka_unit_test(test_half_ops),
        cmocka_unit_test(test_deterministic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
