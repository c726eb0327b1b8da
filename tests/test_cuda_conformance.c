// test_cuda_conformance.c: every kernel of kernels.h on the cuda device
// against the cpu device, from the same inputs. Inputs are drawn in fp32 and
// rounded to bf16 first, so both devices start from identical numbers: the cpu
// computes in fp32 with fp32 activations, the cuda device with bf16
// activations and fp32 accumulation. Tolerances (|cuda - cpu| <= atol + rtol
// |cpu|, atol a fraction of the largest |cpu| value) follow from that:
//   - a result rounded once to bf16 (8 mantissa bits): rtol 2^-7 (two ulps);
//   - sums of many bf16-rounded terms (GEMMs, attention): atol 1-3% of the max,
//     because rounding errors add up where terms cancel;
//   - fp32 results from identical inputs (weight gradients, statistics,
//     losses, AdamW states): only the summation order differs, 1e-5 or less;
//   - conversions and bf16 adds: bit-exact (both round to nearest even).
// Where no GPU is visible (or the binary has no CUDA) every test is skipped.
#include "testutil.h"
#include "bf16.h"
#include "check.h"
#include "device.h"
#include "kernels.h"

typedef struct Devices {
    Device cpu, gpu;
} Devices;

typedef struct Tol {
    double atol_of_max, rtol;
} Tol;

static const Tol TOL_BF16_ONCE = {1e-3, 8e-3};  // fp32 math, one bf16 rounding
static const Tol TOL_GEMM = {1e-2, 8e-3};       // bf16 operands, output rounded to bf16
static const Tol TOL_ATTN_BWD = {3e-2, 2e-2};   // P and dS rounded to bf16 between GEMMs
static const Tol TOL_F32_SUM = {1e-5, 1e-5};    // fp32, summation order only
static const Tol TOL_F32_GEMM = {1e-4, 1e-4};   // fp32 out of tensor-core accumulation

static int group_setup(void **state) {
    *state = NULL;
    if (!device_cuda_available()) return 0;
    Devices *dv = xcalloc(1, sizeof *dv);
    DeviceOptions cpu_opt = {.kind = "cpu", .local_size = 1};
    DeviceOptions gpu_opt = {.kind = "cuda", .local_size = 1};
    device_init(&dv->cpu, &cpu_opt);
    device_init(&dv->gpu, &gpu_opt);
    print_message("comparing %s against %s\n", dv->gpu.name, dv->cpu.name);
    *state = dv;
    return 0;
}

static int group_teardown(void **state) {
    Devices *dv = *state;
    if (dv) {
        device_destroy(&dv->gpu);
        device_destroy(&dv->cpu);
        free(dv);
    }
    return 0;
}

static Devices *devices_or_skip(void **state) {
    if (!*state) {
#ifdef WB_HAVE_CUDA
        print_message("no GPU visible: skipped\n");
#else
        print_message("no GPU visible (built without CUDA): skipped\n");
#endif
        skip();
    }
    return *state;
}

// ---- buffers: one arena per test and device, freed at the end ----------------------

#define ARENA_MAX 32
typedef struct Arena {
    Device *d;
    Buf buf[ARENA_MAX];
    int n;
} Arena;

static void *arena_alloc(Arena *a, size_t bytes) {
    assert_true(a->n < ARENA_MAX);
    a->buf[a->n] = buf_alloc(a->d, TIER_DEVICE, CAT_WORKSPACE, bytes, "conformance test");
    return a->buf[a->n++].ptr;
}

static void arena_free(Arena *a) {
    for (int i = 0; i < a->n; i++) buf_free(a->d, &a->buf[i]);
    a->n = 0;
}

// Uniform values in [lo, hi) that are exact in bf16.
static float *rand_values(size_t n, uint64_t seed, float lo, float hi) {
    float *x = xmalloc(n * sizeof *x);
    test_fill(x, n, seed, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return x;
}

static void *put_bytes(Arena *a, const void *src, size_t bytes) {
    void *p = arena_alloc(a, bytes);
    dev_copy(a->d, p, src, bytes, STREAM_COMPUTE);
    dev_sync(a->d, STREAM_COMPUTE);
    return p;
}

static float *put_f32(Arena *a, const float *x, size_t n) { return put_bytes(a, x, n * 4); }

static bf16 *put_bf16(Arena *a, const float *x, size_t n) {
    bf16 *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(x[i]);
    bf16 *p = put_bytes(a, h, n * sizeof *h);
    free(h);
    return p;
}

// an activation: fp32 on the cpu device, bf16 on cuda (d->act_bytes)
static act *put_act(Arena *a, const float *x, size_t n) {
    return a->d->act_bytes == 4 ? (act *)put_f32(a, x, n) : (act *)put_bf16(a, x, n);
}

static act *alloc_act(Arena *a, size_t n) { return arena_alloc(a, n * a->d->act_bytes); }

static void *get_bytes(Device *d, const void *p, size_t bytes) {
    void *h = xmalloc(bytes);
    dev_copy(d, h, p, bytes, STREAM_COMPUTE);
    dev_sync(d, STREAM_COMPUTE);
    return h;
}

static float *get_f32(Device *d, const float *p, size_t n) { return get_bytes(d, p, n * 4); }

static float *get_bf16_as_f32(Device *d, const void *p, size_t n) {
    bf16 *h = get_bytes(d, p, n * sizeof(bf16));
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(h[i]);
    free(h);
    return x;
}

static float *get_act(Device *d, const act *p, size_t n) {
    return d->act_bytes == 4 ? get_f32(d, p, n) : get_bf16_as_f32(d, p, n);
}

// ---- comparisons ------------------------------------------------------------------------

static void expect_close(const char *what, const float *cuda, const float *cpu, size_t n, Tol tol) {
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) maxabs = fmax(maxabs, fabs(cpu[i]));
    double atol = tol.atol_of_max * maxabs;
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)cuda[i] - cpu[i]), lim = atol + tol.rtol * fabs(cpu[i]);
        if (err <= lim) continue;  // NaN fails here too
        bad++;
        double excess = isnan(err) ? INFINITY : err - lim;
        if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    if (bad) {
        print_error("%s: %zu of %zu elements off; worst [%zu] cuda %.7g cpu %.7g (atol %.3g, "
                    "rtol %.3g)\n", what, bad, n, worst, cuda[worst], cpu[worst], atol, tol.rtol);
        fail();
    }
}

static void expect_bits_equal(const char *what, const bf16 *cuda, const bf16 *cpu, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (cuda[i] != cpu[i]) {
            print_error("%s: [%zu] cuda 0x%04x (%g) cpu 0x%04x (%g)\n", what, i, cuda[i],
                        bf16_to_f32(cuda[i]), cpu[i], bf16_to_f32(cpu[i]));
            fail();
        }
    }
}


static int32_t *rand_tokens(size_t n, int V, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    int32_t *t = xmalloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(test_rng_next(&s) % (uint64_t)V);
    return t;
}

// Each test runs the kernel once per device: index 0 the cpu, 1 the cuda device.
#define FOR_BOTH_DEVICES(dv, k, d) \
    for (int k = 0; k < 2; k++)    \
        for (Device *d = k ? &(dv)->gpu : &(dv)->cpu; d; d = NULL)

static void free_pair(float *x[2]) {
    free(x[0]);
    free(x[1]);
}

// ---- encoder ------------------------------------------------------------------------------

static void test_encoder_forward(void **state) {
    Devices *dv = devices_or_skip(state);
    int B = 2, T = 24, C = 64, V = 50;
    size_t n = (size_t)B * T * C;
    float *wte = rand_values((size_t)V * C, 1, -1, 1), *wpe = rand_values((size_t)T * C, 2, -1, 1);
    int32_t *tok = rand_tokens((size_t)B * T, V, 3);
    float *out[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        bf16 *te = put_bf16(&a, wte, (size_t)V * C), *pe = put_bf16(&a, wpe, (size_t)T * C);
        int32_t *tk = put_bytes(&a, tok, (size_t)B * T * sizeof *tok);
        act *o = alloc_act(&a, n);
        d->k->encoder_forward(d, o, tk, te, pe, B, T, C);
        out[k] = get_act(d, o, n);
        arena_free(&a);
    }
    expect_close("encoder_forward out", out[1], out[0], n, TOL_BF16_ONCE);
    free_pair(out);
    free(wte), free(wpe), free(tok);
}

static void test_encoder_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    int B = 2, T = 24, C = 64, V = 7;  // few tokens: positions collide in dwte
    size_t n = (size_t)B * T * C;
    float *dout = rand_values(n, 4, -1, 1);
    float *dwte0 = rand_values((size_t)V * C, 5, -1, 1);
    float *dwpe0 = rand_values((size_t)T * C, 6, -1, 1);
    int32_t *tok = rand_tokens((size_t)B * T, V, 7);
    float *dwte[2], *dwpe[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        act *g = put_act(&a, dout, n);
        float *te = put_f32(&a, dwte0, (size_t)V * C), *pe = put_f32(&a, dwpe0, (size_t)T * C);
        int32_t *tk = put_bytes(&a, tok, (size_t)B * T * sizeof *tok);
        d->k->encoder_backward(d, te, pe, g, tk, B, T, C);
        dwte[k] = get_f32(d, te, (size_t)V * C);
        dwpe[k] = get_f32(d, pe, (size_t)T * C);
        arena_free(&a);
    }
    expect_close("encoder_backward dwte", dwte[1], dwte[0], (size_t)V * C, TOL_F32_SUM);
    expect_close("encoder_backward dwpe", dwpe[1], dwpe[0], (size_t)T * C, TOL_F32_SUM);
    free_pair(dwte), free_pair(dwpe);
    free(dout), free(dwte0), free(dwpe0), free(tok);
}

// ---- layernorm ----------------------------------------------------------------------------

static void test_layernorm_forward(void **state) {
    Devices *dv = devices_or_skip(state);
    int BT = 48, C = 72;  // C not a multiple of 32: the warp's last lanes idle
    size_t n = (size_t)BT * C;
    float *x = rand_values(n, 8, -2, 3), *w = rand_values(C, 9, 0.5f, 1.5f);
    float *b = rand_values(C, 10, -0.5f, 0.5f);
    float *out[2], *mean[2], *rstd[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        act *xi = put_act(&a, x, n), *o = alloc_act(&a, n);
        bf16 *wi = put_bf16(&a, w, C), *bi = put_bf16(&a, b, C);
        float *m = arena_alloc(&a, BT * sizeof(float)), *r = arena_alloc(&a, BT * sizeof(float));
        d->k->layernorm_forward(d, o, m, r, xi, wi, bi, BT, C);
        out[k] = get_act(d, o, n);
        mean[k] = get_f32(d, m, BT);
        rstd[k] = get_f32(d, r, BT);
        arena_free(&a);
    }
    expect_close("layernorm_forward out", out[1], out[0], n, TOL_BF16_ONCE);
    expect_close("layernorm_forward mean", mean[1], mean[0], BT, TOL_F32_SUM);
    expect_close("layernorm_forward rstd", rstd[1], rstd[0], BT, TOL_F32_SUM);
    free_pair(out), free_pair(mean), free_pair(rstd);
    free(x), free(w), free(b);
}

static void test_layernorm_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    int BT = 48, C = 72;
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
        Arena a = {.d = d};
        act *xi = put_act(&a, x, n), *gi = put_act(&a, g, n), *dxi = put_act(&a, dx0, n);
        bf16 *wi = put_bf16(&a, w, C);
        float *m = put_f32(&a, mean, BT), *r = put_f32(&a, rstd, BT);
        float *dwi = put_f32(&a, dw0, C), *dbi = put_f32(&a, db0, C);
        d->k->layernorm_backward(d, dxi, dwi, dbi, gi, xi, wi, m, r, BT, C);
        dx[k] = get_act(d, dxi, n);
        dw[k] = get_f32(d, dwi, C);
        db[k] = get_f32(d, dbi, C);
        arena_free(&a);
    }
    expect_close("layernorm_backward dinp", dx[1], dx[0], n, TOL_BF16_ONCE);
    expect_close("layernorm_backward dw", dw[1], dw[0], C, TOL_F32_SUM);
    expect_close("layernorm_backward db", db[1], db[0], C, TOL_F32_SUM);
    free_pair(dx), free_pair(dw), free_pair(db);
    free(x), free(g), free(w), free(dx0), free(dw0), free(db0), free(mean), free(rstd);
}

// ---- matmul -------------------------------------------------------------------------------

typedef struct MatmulCase {
    int BT, C, OC;
    int with_bias;     // forward: bias; backward: dbias
    int odd_bias;      // bias at an odd element offset (2-byte aligned, as in a flat buffer)
    int with_dinp;     // backward: dinp (NULL skips it)
} MatmulCase;

static void check_matmul_forward(Devices *dv, MatmulCase mc) {
    size_t ni = (size_t)mc.BT * mc.C, no = (size_t)mc.BT * mc.OC, nw = (size_t)mc.OC * mc.C;
    float *x = rand_values(ni, 21, -1, 1), *w = rand_values(nw, 22, -0.5f, 0.5f);
    float *bias = rand_values((size_t)mc.OC + 1, 23, -1, 1);  // bias[0] is padding
    float *out[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        act *xi = put_act(&a, x, ni), *o = alloc_act(&a, no);
        bf16 *wi = put_bf16(&a, w, nw), *bi = put_bf16(&a, bias, (size_t)mc.OC + 1);
        const bf16 *b = mc.with_bias ? (mc.odd_bias ? bi + 1 : bi) : NULL;
        d->k->matmul_forward(d, o, xi, wi, b, mc.BT, mc.C, mc.OC);
        out[k] = get_act(d, o, no);
        arena_free(&a);
    }
    expect_close("matmul_forward out", out[1], out[0], no, TOL_GEMM);
    free_pair(out);
    free(x), free(w), free(bias);
}

static void check_matmul_backward(Devices *dv, MatmulCase mc) {
    size_t ni = (size_t)mc.BT * mc.C, no = (size_t)mc.BT * mc.OC, nw = (size_t)mc.OC * mc.C;
    float *x = rand_values(ni, 24, -1, 1), *w = rand_values(nw, 25, -0.5f, 0.5f);
    float *g = rand_values(no, 26, -1, 1), *dw0 = rand_values(nw, 27, -1, 1);
    float *db0 = rand_values(mc.OC, 28, -1, 1), *dx0 = rand_values(ni, 29, -9, 9);
    float *dx[2] = {NULL, NULL}, *dw[2], *db[2] = {NULL, NULL};
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        act *xi = put_act(&a, x, ni), *gi = put_act(&a, g, no);
        act *dxi = mc.with_dinp ? put_act(&a, dx0, ni) : NULL;  // garbage: dinp is overwritten
        bf16 *wi = put_bf16(&a, w, nw);
        float *dwi = put_f32(&a, dw0, nw);
        float *dbi = mc.with_bias ? put_f32(&a, db0, mc.OC) : NULL;
        d->k->matmul_backward(d, dxi, dwi, dbi, gi, xi, wi, mc.BT, mc.C, mc.OC);
        if (dxi) dx[k] = get_act(d, dxi, ni);
        dw[k] = get_f32(d, dwi, nw);
        if (dbi) db[k] = get_f32(d, dbi, mc.OC);
        arena_free(&a);
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

static void test_matmul_backward(void **state) {
    Devices *dv = devices_or_skip(state);
    check_matmul_backward(dv, (MatmulCase){.BT = 64, .C = 64, .OC = 192, .with_bias = 1,
                                           .with_dinp = 1});
    check_matmul_backward(dv, (MatmulCase){.BT = 130, .C = 36, .OC = 20, .with_bias = 1,
                                           .with_dinp = 1});  // rows span three partial sums
    check_matmul_backward(dv, (MatmulCase){.BT = 30, .C = 36, .OC = 20});  // no dinp, no dbias
}

// ---- attention --------------------------------------------------------------------------------

typedef struct AttnCase {
    int B, T, C, NH;
} AttnCase;

// Forward on one device; returns out (B,T,C) and att (B,NH,T,T) as host floats.
static void attention_forward_on(Device *d, AttnCase ac, const float *qkv, float **out,
                                 float **att) {
    size_t n = (size_t)ac.B * ac.T * ac.C, na = (size_t)ac.B * ac.NH * ac.T * ac.T;
    Arena a = {.d = d};
    act *q = put_act(&a, qkv, 3 * n), *o = alloc_act(&a, n);
    float *p = arena_alloc(&a, na * sizeof(float));
    d->k->attention_forward(d, o, p, q, ac.B, ac.T, ac.C, ac.NH);
    *out = get_act(d, o, n);
    *att = get_f32(d, p, na);
    arena_free(&a);
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
        Arena a = {.d = d};
        act *q = put_act(&a, qkv, 3 * n), *gi = put_act(&a, g, n);
        act *dq = put_act(&a, junk, 3 * n);  // dqkv is overwritten
        float *p = put_f32(&a, att[0], na);
        d->k->attention_backward(d, dq, gi, q, p, ac.B, ac.T, ac.C, ac.NH);
        dqkv[k] = get_act(d, dq, 3 * n);
        arena_free(&a);
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

// ---- element-wise -----------------------------------------------------------------------------

static void test_gelu(void **state) {
    Devices *dv = devices_or_skip(state);
    size_t n = 3001;
    float *x = rand_values(n, 41, -5, 5), *g = rand_values(n, 42, -1, 1);
    float *y[2], *dx[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        act *xi = put_act(&a, x, n), *gi = put_act(&a, g, n);
        act *yi = alloc_act(&a, n), *dxi = alloc_act(&a, n);
        d->k->gelu_forward(d, yi, xi, n);
        d->k->gelu_backward(d, dxi, xi, gi, n);
        y[k] = get_act(d, yi, n);
        dx[k] = get_act(d, dxi, n);
        arena_free(&a);
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
        Arena a = {.d = d};
        act *xi = put_act(&a, x, n), *ri = put_act(&a, r, n);
        d->k->residual_forward(d, xi, xi, ri, n);  // out aliases a, as kernels.h allows
        y[k] = get_act(d, xi, n);
        arena_free(&a);
    }
    expect_close("residual_forward", y[1], y[0], n, TOL_BF16_ONCE);
    free_pair(y);
    free(x), free(r);
}

static void check_softmax_crossentropy(Devices *dv, int BT, int V, float scale) {
    size_t n = (size_t)BT * V;
    float *z = rand_values(n, 45, -4, 4);
    int32_t *tgt = rand_tokens(BT, V, 46);
    float *loss[2], *dz[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        act *zi = put_act(&a, z, n);
        int32_t *ti = put_bytes(&a, tgt, BT * sizeof *tgt);
        float *li = arena_alloc(&a, BT * sizeof(float));
        d->k->softmax_crossentropy(d, li, zi, ti, BT, V, scale);
        loss[k] = get_f32(d, li, BT);
        dz[k] = get_act(d, zi, n);
        arena_free(&a);
    }
    expect_close("softmax_crossentropy losses", loss[1], loss[0], BT, TOL_F32_SUM);
    if (scale != 0.0f) {
        expect_close("softmax_crossentropy dlogits", dz[1], dz[0], n, TOL_BF16_ONCE);
    } else {
        expect_close("softmax_crossentropy logits kept", dz[1], z, n, (Tol){0, 0});
    }
    free_pair(loss), free_pair(dz);
    free(z), free(tgt);
}

static void test_softmax_crossentropy(void **state) {
    Devices *dv = devices_or_skip(state);
    check_softmax_crossentropy(dv, 48, 256, 1.0f / 48);   // byte-level vocabulary
    check_softmax_crossentropy(dv, 16, 5003, 1.0f / 64);  // wide rows: the 1024-thread blocks
    check_softmax_crossentropy(dv, 8, 100, 0.0f);         // loss only
}

// ---- gradients, optimizer, conversions ---------------------------------------------------------

static bf16 *get_bf16_raw(Device *d, const bf16 *p, size_t n) { return get_bytes(d, p, n * 2); }

static void test_grad_to_bf16_and_add(void **state) {
    Devices *dv = devices_or_skip(state);
    size_t n = 4099;
    float *src = xmalloc(n * sizeof *src);  // arbitrary fp32: exercises the rounding
    test_fill(src, n, 51, -1, 1);
    float *dst0 = rand_values(n, 52, -1, 1), *other = rand_values(n, 53, -1, 1);
    bf16 *set[2], *acc[2], *sum[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        float *s = put_f32(&a, src, n);
        bf16 *x = put_bf16(&a, dst0, n), *y = put_bf16(&a, dst0, n), *o = put_bf16(&a, other, n);
        d->k->grad_to_bf16(d, x, s, n, 0);
        d->k->grad_to_bf16(d, y, s, n, 1);
        set[k] = get_bf16_raw(d, x, n);
        acc[k] = get_bf16_raw(d, y, n);
        d->k->add_bf16(d, y, o, n);
        sum[k] = get_bf16_raw(d, y, n);
        arena_free(&a);
    }
    expect_bits_equal("grad_to_bf16 (set)", set[1], set[0], n);
    expect_bits_equal("grad_to_bf16 (accumulate)", acc[1], acc[0], n);
    expect_bits_equal("add_bf16", sum[1], sum[0], n);
    for (int k = 0; k < 2; k++) free(set[k]), free(acc[k]), free(sum[k]);
    free(src), free(dst0), free(other);
}

static void test_sum_squares(void **state) {
    Devices *dv = devices_or_skip(state);
    size_t n = 100003;
    float *x = rand_values(n, 54, -3, 3);
    double ss[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        bf16 *xi = put_bf16(&a, x, n);
        ss[k] = d->k->sum_squares_bf16(d, xi, n);
        arena_free(&a);
    }
    if (!test_close(ss[1], ss[0], 0, 1e-10)) {
        print_error("sum_squares_bf16: cuda %.17g cpu %.17g\n", ss[1], ss[0]);
        fail();
    }
    free(x);
}

static void check_adamw(Devices *dv, int with_param) {
    size_t n = 5003;
    float *master = xmalloc(n * sizeof(float));
    test_fill(master, n, 61, -1, 1);
    float *m = rand_values(n, 62, -0.1f, 0.1f), *v = rand_values(n, 63, 0, 0.01f);
    float *g = rand_values(n, 64, -1, 1);
    AdamWStep s = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                   .weight_decay = 0.1f, .grad_scale = 0.5f};
    s.bias_corr1 = 1.0f - powf(s.beta1, 3);
    s.bias_corr2 = 1.0f - powf(s.beta2, 3);
    float *mw[2], *mm[2], *vv[2], *p[2] = {NULL, NULL};
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        float *mi = put_f32(&a, master, n), *m1 = put_f32(&a, m, n), *v1 = put_f32(&a, v, n);
        bf16 *gi = put_bf16(&a, g, n), *pi = with_param ? put_bf16(&a, g, n) : NULL;
        d->k->adamw(d, mi, m1, v1, gi, pi, n, &s);
        mw[k] = get_f32(d, mi, n);
        mm[k] = get_f32(d, m1, n);
        vv[k] = get_f32(d, v1, n);
        if (pi) p[k] = get_bf16_as_f32(d, pi, n);
        arena_free(&a);
    }
    Tol tight = {1e-6, 1e-6};  // same formula (elementwise.h); FMA contraction may differ
    expect_close("adamw master", mw[1], mw[0], n, tight);
    expect_close("adamw m", mm[1], mm[0], n, tight);
    expect_close("adamw v", vv[1], vv[0], n, tight);
    // a master one fp32 ulp apart may round to the neighbouring bf16
    if (with_param) expect_close("adamw param", p[1], p[0], n, (Tol){0, 8e-3});
    free_pair(mw), free_pair(mm), free_pair(vv), free_pair(p);
    free(master), free(m), free(v), free(g);
}

static void test_adamw(void **state) {
    Devices *dv = devices_or_skip(state);
    check_adamw(dv, 1);
    check_adamw(dv, 0);  // param NULL (sharded optimizer without a local bf16 copy)
}

static void test_conversions(void **state) {
    Devices *dv = devices_or_skip(state);
    size_t n = 4096;
    float *x = xmalloc(n * sizeof *x);
    test_fill(x, n, 71, -100, 100);
    x[0] = 1.0f + 1.0f / 256;  // exactly halfway between two bf16: ties to even (down)
    x[1] = 1.0f + 3.0f / 256;  // halfway, rounds up to the even neighbour
    x[2] = -0.0f, x[3] = 3.0e38f, x[4] = 1e-40f;  // signed zero, near max, subnormal
    bf16 *h[2];
    float *back[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        Arena a = {.d = d};
        float *xi = put_f32(&a, x, n), *yi = arena_alloc(&a, n * sizeof(float));
        bf16 *hi = arena_alloc(&a, n * sizeof(bf16));
        d->k->f32_to_bf16(d, hi, xi, n);
        d->k->bf16_to_f32(d, yi, hi, n);
        h[k] = get_bf16_raw(d, hi, n);
        back[k] = get_f32(d, yi, n);
        arena_free(&a);
    }
    expect_bits_equal("f32_to_bf16", h[1], h[0], n);
    expect_close("bf16_to_f32", back[1], back[0], n, (Tol){0, 0});
    for (int k = 0; k < 2; k++) free(h[k]);
    free_pair(back);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_forward),
        cmocka_unit_test(test_encoder_backward),
        cmocka_unit_test(test_layernorm_forward),
        cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_matmul_forward),
        cmocka_unit_test(test_matmul_forward_odd),
        cmocka_unit_test(test_matmul_backward),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_softmax_crossentropy),
        cmocka_unit_test(test_grad_to_bf16_and_add),
        cmocka_unit_test(test_sum_squares),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_conversions),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
