// test_kernels_isa.c: the cpu kernels give the same bits whatever vector
// width the build has. The Makefile compiles kernels_cpu.c and
// kernels_cpu_attention.c three more times, each copy's entry points
// renamed: without vectorizing (scalar), for AVX2 (-march=x86-64-v3, 8
// float lanes) and for AVX-512 (-march=x86-64-v4 with 512-bit vectors
// preferred, 16 lanes). The layernorm forward and backward and the
// materialized attention's backward, at row lengths that leave a tail
// (133 channels, odd T), must agree to the bit between the copies and with
// the build's own. Issue 49 item 10: their row sums were `omp simd
// reduction`s, whose order follows the width, so an AVX2 machine's runs
// drifted from the AVX-512 machine's that recorded the handouts. The
// AVX-512 copy runs only on a CPU that has it, and the test says so where
// it does not.
#include "testutil.h"
#include "kernels.h"

extern const KernelOps kernels_cpu_scalar, kernels_cpu_v3, kernels_cpu_v4;

#define BT 37
#define C 133
#define B 2
#define T 19
#define NH 3  // attention: C_ATT = 3 heads of 11
#define C_ATT 33

typedef struct Outputs {
    float ln_out[BT * C], mean[BT], rstd[BT], dinp[BT * C], dw[C], db[C];
    float dqkv[B * T * 3 * C_ATT];
} Outputs;

static Device dev;

// The kernels of table k on fixed inputs.
static void run_kernels(const KernelOps *k, Outputs *o) {
    static float inp[BT * C], dout[BT * C], qkv[B * T * 3 * C_ATT], att[B * NH * T * T], out[B * T * C_ATT],
        adout[B * T * C_ATT];
    static bf16 w[C], bias[C];
    test_fill(inp, BT * C, 1, -3, 3);
    test_fill(dout, BT * C, 2, -1, 1);
    test_fill(qkv, B * T * 3 * C_ATT, 3, -2, 2);
    test_fill(adout, B * T * C_ATT, 4, -1, 1);
    float wf[C], bf[C];
    test_fill(wf, C, 5, 0.5f, 1.5f);
    test_fill(bf, C, 6, -0.5f, 0.5f);
    for (int c = 0; c < C; c++) w[c] = f32_to_bf16(wf[c]), bias[c] = f32_to_bf16(bf[c]);
    memset(o, 0, sizeof *o);
    k->layernorm_forward(&dev, o->ln_out, o->mean, o->rstd, inp, w, bias, BT, C);
    k->layernorm_backward(&dev, o->dinp, o->dw, o->db, dout, inp, w, o->mean, o->rstd, BT, C);
    k->attention_forward(&dev, out, att, qkv, B, T, C_ATT, NH);
    k->attention_backward(&dev, o->dqkv, adout, qkv, att, B, T, C_ATT, NH);
}

static void expect_same_bits(const char *what, const Outputs *got, const Outputs *want) {
    static const struct {
        const char *name;
        size_t offset, count;
    } parts[] = {
        {"layernorm out", offsetof(Outputs, ln_out), BT * C}, {"layernorm mean", offsetof(Outputs, mean), BT},
        {"layernorm rstd", offsetof(Outputs, rstd), BT},      {"layernorm dinp", offsetof(Outputs, dinp), BT * C},
        {"layernorm dw", offsetof(Outputs, dw), C},           {"layernorm db", offsetof(Outputs, db), C},
        {"attention dqkv", offsetof(Outputs, dqkv), B * T * 3 * C_ATT},
    };
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
        const float *g = (const float *)((const char *)got + parts[p].offset);
        const float *x = (const float *)((const char *)want + parts[p].offset);
        for (size_t i = 0; i < parts[p].count; i++)
            if (memcmp(&g[i], &x[i], sizeof(float)) != 0)
                fail_msg("%s: %s[%zu] is %.9g, the scalar build's %.9g", what, parts[p].name, i, g[i], x[i]);
    }
}

static void test_avx2_build_as_scalar(void **state) {
    (void)state;
    static Outputs scalar, v3, own;
    run_kernels(&kernels_cpu_scalar, &scalar);
    run_kernels(&kernels_cpu_v3, &v3);
    run_kernels(&kernels_cpu, &own);
    expect_same_bits("the AVX2 build (8 lanes)", &v3, &scalar);
    expect_same_bits("this build (-march=native)", &own, &scalar);
}

static void test_avx512_build_as_scalar(void **state) {
    (void)state;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl")) {
        print_message("the AVX-512 copy is not run: this CPU has no AVX-512 (the AVX2 one and the scalar one are)\n");
        skip();
    }
    static Outputs scalar, v4;
    run_kernels(&kernels_cpu_scalar, &scalar);
    run_kernels(&kernels_cpu_v4, &v4);
    expect_same_bits("the AVX-512 build (16 lanes)", &v4, &scalar);
}

int main(void) {
    DeviceOptions opt = {.kind = "cpu", .threads = 2};
    device_init(&dev, &opt);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx2_build_as_scalar),
        cmocka_unit_test(test_avx512_build_as_scalar),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    device_destroy(&dev);
    return rc;
}
