// test_cpu_adam.c: every CPU Adam path (cpu_adam.h) against the scalar
// reference, adamw_element in a plain loop here, equal to the bit (master, m,
// v and the bf16 param compared with memcmp). Each path this CPU has is forced
// in turn; a path it lacks is skipped with its name and the reason, and the
// output names the paths that ran.
//
// Cases: sizes around the vector widths (8, 16), and one of many tiles on 2
// threads; starts at every offset of 0..15 elements from a 64-byte boundary
// (the big size at 0, 3 and 15); three steps with bias correction, weight
// decay and a clipping scale; inputs with zeros, huge, tiny and denormal
// values, and gradients that are NaN (several payloads, both signs,
// signaling) or infinite, so that NaNs of different bits meet in one
// operation; param NULL; 1 and 2 threads. No byte outside the n elements
// may change. Every case runs in both 16-bit formats: bf16, and fp16 (whose
// vector paths convert with F16C's vcvtph2ps/vcvtps2ph).
#include "testutil.h"
#include "cpu_adam.h"

enum { STEPS = 3, MAX_OFFSET = 15, BIG = 1000003 };
static const size_t SIZES[] = {1, 15, 16, 17, 31, 33, BIG};

typedef struct State {
    float *master, *m, *v;
    bf16 *param;
} State;

// bf16 gradients that are not random: every kind lands in every lane position,
// and a given element sees different kinds at different steps (+inf then -inf
// makes m = inf - inf, a NaN that a later gradient's NaN then meets).
static const bf16 SPECIAL_GRADS[] = {
    0x0000, 0x8000,          // +0, -0
    0x7f80, 0xff80,          // +inf, -inf
    0x7fc0, 0xffc0,          // quiet NaN, both signs
    0x7f81, 0x7fff, 0xffa5,  // signaling NaN, NaNs with payloads
    0x7f7f, 0xff7f,          // largest finite, both signs
    0x0001, 0x8001, 0x007f,  // denormals
    0x0080, 0x3f80,          // smallest normal, 1
};
#define N_SPECIAL_GRADS (sizeof SPECIAL_GRADS / sizeof SPECIAL_GRADS[0])
// the same kinds in fp16
static const bf16 SPECIAL_GRADS_FP16[N_SPECIAL_GRADS] = {
    0x0000, 0x8000,          // +0, -0
    0x7c00, 0xfc00,          // +inf, -inf
    0x7e00, 0xfe00,          // quiet NaN, both signs
    0x7c01, 0x7fff, 0xfd25,  // signaling NaN, NaNs with payloads
    0x7bff, 0xfbff,          // largest finite (65504), both signs
    0x0001, 0x8001, 0x03ff,  // subnormals
    0x0400, 0x3c00,          // smallest normal, 1
};

static HalfFormat g_half;  // the format of the case that runs (test_path sets it)

// fp32 state bits that are not random: zeros, huge, tiny, denormal, and
// NaNs whose low 16 bits are set (rounding them to bf16 without f32_to_bf16's
// NaN branch would carry into the exponent); a run that hits a NaN keeps it
static const uint32_t SPECIAL_STATE[] = {
    0x00000000, 0x80000000,  // +0, -0
    0x7f61b1e6, 0xff7843b0,  // 3.0e38, -3.3e38
    0x0da24260, 0x81545611,  // 1e-30, -3.9e-38
    0x000116c2, 0x80000007,  // denormals: 1e-40, -1e-44
    0x00800000, 0x477fe000,  // smallest normal, 65504
    0x7fc0ffff, 0xff80ffff,  // a quiet NaN and a signaling one, low bits set
};
#define N_SPECIAL_STATE (sizeof SPECIAL_STATE / sizeof SPECIAL_STATE[0])

static float state_value(uint64_t *rng, size_t i, int nonnegative) {
    float x = test_uniform(rng, -1, 1);
    if (i % 7 == 1) memcpy(&x, &SPECIAL_STATE[(i / 7) % N_SPECIAL_STATE], sizeof x);
    return nonnegative ? fabsf(x) : x;
}

static void fill_state(State *st, size_t n, uint64_t seed) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        st->master[i] = state_value(&rng, i, 0);
        st->m[i] = 0.1f * state_value(&rng, i + 2, 0);
        st->v[i] = 0.01f * state_value(&rng, i + 3, 1);  // a second moment is >= 0
        st->param[i] = 0xdead;                            // must be overwritten
    }
}

static void fill_grads(bf16 *grad, size_t n, int step) {
    uint64_t rng = (uint64_t)(step + 1) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        const bf16 *special = g_half == HALF_FP16 ? SPECIAL_GRADS_FP16 : SPECIAL_GRADS;
        if (i % 3 == 0)
            grad[i] = special[(i / 3 + (size_t)step * 5) % N_SPECIAL_GRADS];
        else
            grad[i] = f32_to_half(g_half, test_uniform(&rng, -2, 2) * (i % 3 == 1 ? 1.0f : 1e-3f));
    }
}

static AdamWStep step_params(int step) {
    const float beta1 = 0.9f, beta2 = 0.95f;
    int t = step + 1;
    // a large lr makes the update's own rounding show in master
    const float lr[STEPS] = {1e-3f, 0.25f, 2.0f};
    return (AdamWStep){.lr = lr[step], .beta1 = beta1, .beta2 = beta2, .eps = 1e-8f,
                       .weight_decay = 0.1f, .bias_corr1 = 1.0f - powf(beta1, (float)t),
                       .bias_corr2 = 1.0f - powf(beta2, (float)t),
                       .grad_scale = (step % 2) ? 1.0f : 0.37f,  // 0.37: a clipping factor
                       .half = g_half};
}

// the scalar reference: adamw_element in a plain loop, f32_to_half for param
static void reference_step(State *st, const bf16 *grad, size_t n, const AdamWStep *s) {
    for (size_t i = 0; i < n; i++)
        st->param[i] = f32_to_half(s->half,
            adamw_element(&st->master[i], &st->m[i], &st->v[i], half_to_f32(s->half, grad[i]), s));
}

// Room for n elements after an offset of up to MAX_OFFSET, and a guard after
// them; every array starts on a 64-byte boundary and is filled with GUARD.
enum { GUARD = 0xab };
static size_t state_elems(size_t n) { return (n + MAX_OFFSET + 32 + 31) & ~(size_t)31; }

static State state_alloc(size_t n) {
    size_t elems = state_elems(n);  // a multiple of 32: whole 64-byte blocks of bf16 too
    State st = {aligned_alloc(64, elems * 4), aligned_alloc(64, elems * 4),
                aligned_alloc(64, elems * 4), aligned_alloc(64, elems * 2)};
    assert_non_null(st.master), assert_non_null(st.m), assert_non_null(st.v);
    assert_non_null(st.param);
    memset(st.master, GUARD, elems * 4), memset(st.m, GUARD, elems * 4);
    memset(st.v, GUARD, elems * 4), memset(st.param, GUARD, elems * 2);
    return st;
}

// the bytes of one array before `offset` elements and after offset + n
static void expect_guard_intact(const char *what, const void *base, size_t elem_bytes,
                                size_t n, int offset) {
    const unsigned char *b = base;
    size_t end = (size_t)offset * elem_bytes + n * elem_bytes, total = state_elems(n) * elem_bytes;
    for (size_t i = 0; i < total; i++) {
        if (i == (size_t)offset * elem_bytes) i = end;
        if (i < total && b[i] != GUARD)
            fail_msg("%s: byte %zu outside the %zu elements at offset %d changed", what, i, n,
                     offset);
    }
}

static State state_at(State base, int offset) {
    return (State){base.master + offset, base.m + offset, base.v + offset, base.param + offset};
}

static void state_free(State base) {
    free(base.master), free(base.m), free(base.v), free(base.param);
}

static void expect_same(const char *what, const void *got, const void *want, size_t bytes,
                        size_t elem_bytes, CpuAdamPath path, size_t n, int offset, int threads) {
    if (memcmp(got, want, bytes) == 0) return;
    size_t i = 0;
    while (memcmp((const char *)got + i * elem_bytes, (const char *)want + i * elem_bytes,
                  elem_bytes) == 0)
        i++;
    uint32_t g = 0, w = 0;
    memcpy(&g, (const char *)got + i * elem_bytes, elem_bytes);
    memcpy(&w, (const char *)want + i * elem_bytes, elem_bytes);
    fail_msg("%s path (%s), n %zu, offset %d, %d thread(s): %s[%zu] is 0x%x, the reference 0x%x",
             cpu_adam_path_name(path), half_format_name(g_half), n, offset, threads, what, i, g, w);
}

// STEPS steps of one path against the reference, on n elements starting at
// `offset`; with_param 0 passes param NULL (and param must stay untouched).
static void check_case(CpuAdamPath path, int threads, size_t n, int offset, int with_param) {
    State got_base = state_alloc(n), want_base = state_alloc(n);
    State got = state_at(got_base, offset), want = state_at(want_base, offset);
    bf16 *grad_base = aligned_alloc(64, state_elems(n) * 2);
    assert_non_null(grad_base);
    bf16 *grad = grad_base + offset;
    fill_state(&got, n, 1000 + n + (size_t)offset);
    fill_state(&want, n, 1000 + n + (size_t)offset);
    for (int step = 0; step < STEPS; step++) {
        AdamWStep s = step_params(step);
        fill_grads(grad, n, step);
        cpu_adam_step(path, threads, got.master, got.m, got.v, grad, with_param ? got.param : NULL,
                      n, &s);
        reference_step(&want, grad, n, &s);
    }
    expect_same("master", got.master, want.master, n * 4, 4, path, n, offset, threads);
    expect_same("m", got.m, want.m, n * 4, 4, path, n, offset, threads);
    expect_same("v", got.v, want.v, n * 4, 4, path, n, offset, threads);
    if (with_param) {
        expect_same("param", got.param, want.param, n * 2, 2, path, n, offset, threads);
    } else {
        for (size_t i = 0; i < n; i++) assert_int_equal(got.param[i], 0xdead);
    }
    expect_guard_intact("master", got_base.master, 4, n, offset);
    expect_guard_intact("m", got_base.m, 4, n, offset);
    expect_guard_intact("v", got_base.v, 4, n, offset);
    expect_guard_intact("param", got_base.param, 2, n, offset);
    state_free(got_base), state_free(want_base), free(grad_base);
}

static void test_path(void **state) {
    CpuAdamPath path = *(CpuAdamPath *)*state;
    const char *why_not = cpu_adam_path_unsupported_reason(path);
    if (why_not) {
        print_message("cpu_adam: path %s skipped: %s\n", cpu_adam_path_name(path), why_not);
        skip();
    }
    print_message("cpu_adam: path %s runs (bf16 and fp16)\n", cpu_adam_path_name(path));
    for (int fmt = HALF_BF16; fmt <= HALF_FP16; fmt++) {
        for (size_t k = 0; k < sizeof SIZES / sizeof SIZES[0]; k++)
            for (int offset = 0; offset <= MAX_OFFSET; offset++) {
                // the big size is for the tiles and threads: a few offsets do
                if (SIZES[k] == BIG && offset != 0 && offset != 3 && offset != MAX_OFFSET) continue;
                for (int threads = 1; threads <= 2; threads++) {
                    g_half = (HalfFormat)fmt;
                    check_case(path, threads, SIZES[k], offset, 1);
                    check_case(path, threads, SIZES[k], offset, 0);
                }
            }
    }
}

static void test_best_path_is_supported(void **state) {
    CpuAdamPath best = cpu_adam_best_path();
    print_message("cpu_adam: best path here is %s\n", cpu_adam_path_name(best));
    assert_true(cpu_adam_path_supported(best));
    for (int p = best + 1; p < CPU_ADAM_PATHS; p++) assert_false(cpu_adam_path_supported(p));
    assert_true(cpu_adam_path_supported(CPU_ADAM_SCALAR));
    assert_false(cpu_adam_path_supported(CPU_ADAM_PATHS));
    assert_string_equal(cpu_adam_path_name(CPU_ADAM_SCALAR), "scalar");
    assert_string_equal(cpu_adam_path_name(CPU_ADAM_AVX2), "avx2+fma");
    assert_string_equal(cpu_adam_path_name(CPU_ADAM_AVX512), "avx512");
}

// n = 0 touches nothing (every pointer NULL is fine)
static void test_empty(void **state) {
    AdamWStep s = step_params(0);
    for (int p = 0; p < CPU_ADAM_PATHS; p++)
        if (cpu_adam_path_supported(p)) cpu_adam_step(p, 2, NULL, NULL, NULL, NULL, NULL, 0, &s);
}

static void step_on_missing_path(void) {
    float x = 0;
    bf16 g = 0;
    AdamWStep s = step_params(0);
    cpu_adam_step(CPU_ADAM_PATHS, 1, &x, &x, &x, &g, NULL, 1, &s);
}

static void step_with_no_threads(void) {
    float x = 0;
    bf16 g = 0;
    AdamWStep s = step_params(0);
    cpu_adam_step(CPU_ADAM_SCALAR, 0, &x, &x, &x, &g, NULL, 1, &s);
}

static void test_bad_arguments_stop_with_location(void **state) {
    char *err = NULL;
    assert_int_equal(run_child(step_on_missing_path, &err), 1);
    assert_non_null(strstr(err, "cpu_adam.c:"));
    assert_non_null(strstr(err, "cannot run here"));
    free(err);
    assert_int_equal(run_child(step_with_no_threads, &err), 1);
    assert_non_null(strstr(err, "threads is 0"));
    free(err);
}

int main(void) {
    static CpuAdamPath paths[CPU_ADAM_PATHS] = {CPU_ADAM_SCALAR, CPU_ADAM_AVX2, CPU_ADAM_AVX512};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_best_path_is_supported),
        {"test_path_scalar", test_path, NULL, NULL, &paths[CPU_ADAM_SCALAR]},
        {"test_path_avx2", test_path, NULL, NULL, &paths[CPU_ADAM_AVX2]},
        {"test_path_avx512", test_path, NULL, NULL, &paths[CPU_ADAM_AVX512]},
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_bad_arguments_stop_with_location),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
