// conformance.h: what the cuda conformance tests share (test_cuda_kernels.c,
// test_cuda_optim.c): every kernel of kernels.h runs on the cuda device and
// on the cpu device, from the same inputs. Inputs are drawn in fp32 and
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
#pragma once
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
// an intermediate rounded to bf16 (the residual sum), then fp32 math and the
// output rounded: its error, up to |x| 2^-9, is scaled by w * rstd
static const Tol TOL_BF16_TWICE = {4e-3, 1.6e-2};
static const Tol TOL_GEMM = {1e-2, 8e-3};       // bf16 operands, output rounded to bf16
static const Tol TOL_ATTN_BWD = {3e-2, 2e-2};   // P and dS rounded to bf16 between GEMMs
static const Tol TOL_F32_SUM = {1e-5, 1e-5};    // fp32, summation order only
static const Tol TOL_F32_GEMM = {1e-4, 1e-4};   // fp32 out of tensor-core accumulation

// Both devices with their params and grads (and cuda's activations) in format h.
static inline int group_setup_half(void **state, HalfFormat h) {
    *state = NULL;
    if (!device_cuda_available()) return 0;
    Devices *dv = xcalloc(1, sizeof *dv);
    DeviceOptions cpu_opt = {.kind = "cpu", .local_size = 1, .half = h};
    DeviceOptions gpu_opt = {.kind = "cuda", .local_size = 1, .half = h};
    device_init(&dv->cpu, &cpu_opt);
    device_init(&dv->gpu, &gpu_opt);
    print_message("comparing %s against %s, %s\n", dv->gpu.name, dv->cpu.name, half_format_name(h));
    *state = dv;
    return 0;
}

static inline int group_setup(void **state) { return group_setup_half(state, HALF_BF16); }
// fp16 (--precision fp16): the kernels' second pass (kernels_cuda_fp16)
static inline int group_setup_fp16(void **state) { return group_setup_half(state, HALF_FP16); }

static inline int group_teardown(void **state) {
    Devices *dv = *state;
    if (dv) {
        device_destroy(&dv->gpu);
        device_destroy(&dv->cpu);
        free(dv);
    }
    return 0;
}

static inline Devices *devices_or_skip(void **state) {
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

// ---- buffers: one set per test and device, freed at the end ------------------------

#define TEST_BUFS_MAX 32
typedef struct TestBufs {
    Device *d;
    Buf buf[TEST_BUFS_MAX];
    int n;
} TestBufs;

static inline void *bufs_alloc(TestBufs *a, size_t bytes) {
    assert_true(a->n < TEST_BUFS_MAX);
    a->buf[a->n] = buf_alloc(a->d, TIER_DEVICE, CAT_WORKSPACE, bytes, "conformance test");
    return a->buf[a->n++].ptr;
}

static inline void bufs_free(TestBufs *a) {
    for (int i = 0; i < a->n; i++) buf_free(a->d, &a->buf[i]);
    a->n = 0;
}

// Uniform values in [lo, hi) that are exact in bf16.
static inline float *rand_values(size_t n, uint64_t seed, float lo, float hi) {
    float *x = xmalloc(n * sizeof *x);
    test_fill(x, n, seed, lo, hi);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return x;
}

static inline void *put_bytes(TestBufs *a, const void *src, size_t bytes) {
    void *p = bufs_alloc(a, bytes);
    dev_copy(a->d, p, src, bytes, STREAM_COMPUTE);
    dev_sync(a->d, STREAM_COMPUTE);
    return p;
}

static inline float *put_f32(TestBufs *a, const float *x, size_t n) { return put_bytes(a, x, n * 4); }

// 16 bits in the device's format (bf16, or fp16 on the fp16 devices)
static inline bf16 *put_bf16(TestBufs *a, const float *x, size_t n) {
    bf16 *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_half(a->d->half, x[i]);
    bf16 *p = put_bytes(a, h, n * sizeof *h);
    free(h);
    return p;
}

// an activation: fp32 on the cpu device, bf16 on cuda (d->act_bytes)
static inline act *put_act(TestBufs *a, const float *x, size_t n) {
    return a->d->act_bytes == 4 ? (act *)put_f32(a, x, n) : (act *)put_bf16(a, x, n);
}

static inline act *alloc_act(TestBufs *a, size_t n) { return bufs_alloc(a, n * a->d->act_bytes); }

static inline void *get_bytes(Device *d, const void *p, size_t bytes) {
    void *h = xmalloc(bytes);
    dev_copy(d, h, p, bytes, STREAM_COMPUTE);
    dev_sync(d, STREAM_COMPUTE);
    return h;
}

static inline float *get_f32(Device *d, const float *p, size_t n) { return get_bytes(d, p, n * 4); }

static inline float *get_bf16_as_f32(Device *d, const void *p, size_t n) {
    bf16 *h = get_bytes(d, p, n * sizeof(bf16));
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = half_to_f32(d->half, h[i]);
    free(h);
    return x;
}

static inline bf16 *get_bf16_raw(Device *d, const bf16 *p, size_t n) { return get_bytes(d, p, n * 2); }

static inline float *get_act(Device *d, const act *p, size_t n) {
    return d->act_bytes == 4 ? get_f32(d, p, n) : get_bf16_as_f32(d, p, n);
}

// ---- comparisons ------------------------------------------------------------------------

static inline void expect_close(const char *what, const float *cuda, const float *cpu, size_t n, Tol tol) {
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

static inline void expect_f32_bits_equal(const char *what, const float *cuda, const float *cpu, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&cuda[i], &cpu[i], sizeof(float)) && !bad++) first = i;
    if (bad) {
        print_error("%s: %zu of %zu fp32 elements differ in their bits; first [%zu] %.9g against %.9g\n", what, bad,
                    n, first, cuda[first], cpu[first]);
        fail();
    }
}

static inline void expect_bits_equal(const char *what, const bf16 *cuda, const bf16 *cpu, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (cuda[i] != cpu[i]) {
            print_error("%s: [%zu] cuda 0x%04x (%g) cpu 0x%04x (%g)\n", what, i, cuda[i],
                        bf16_to_f32(cuda[i]), cpu[i], bf16_to_f32(cpu[i]));
            fail();
        }
    }
}


// The buckets of n token ids (token_buckets.h) in a's device memory
static inline TokenBuckets put_buckets(TestBufs *a, const int32_t *tokens, int n) {
    int32_t *order = xmalloc((size_t)n * sizeof *order), *start = xmalloc((size_t)n * sizeof *start);
    int buckets = token_buckets_build(tokens, n, order, start);
    TokenBuckets tb = {put_bytes(a, order, (size_t)n * sizeof *order), put_bytes(a, start, (size_t)n * sizeof *start),
                       buckets};
    free(order), free(start);
    return tb;
}

static inline int32_t *rand_tokens(size_t n, int V, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    int32_t *t = xmalloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(test_rng_next(&s) % (uint64_t)V);
    return t;
}

// Each test runs the kernel once per device: index 0 the cpu, 1 the cuda device.
#define FOR_BOTH_DEVICES(dv, k, d) \
    for (int k = 0; k < 2; k++)    \
        for (Device *d = k ? &(dv)->gpu : &(dv)->cpu; d; d = NULL)

static inline void free_pair(float *x[2]) {
    free(x[0]);
    free(x[1]);
}
