// test_quant.c: the cpu device's block quantization (ZeRO++'s qwZ and qgZ,
// quant_math.h) against a scalar reference written here from the
// definition: every scale, every value and every dequantized number to the
// bit, at 8 and 4 bits, block sizes 32 to 2048, lengths that end inside a
// block and odd ones; each block's error within half its scale (plus the
// rounding of the scale and, for 16-bit outputs, of the output); a block of
// zeros; a NaN or an infinity makes its own block (and only it) come back
// non-finite, so a sum and a norm over it are not finite, as after an fp16
// overflow; the same bits at 1 and 2 threads.
#include <omp.h>
#include "testutil.h"
#include "bf16.h"
#include "check.h"
#include "device.h"
#include "kernels.h"
#include "quant_math.h"

typedef struct Ctx {
    Device d;
} Ctx;

static int setup_half(void **state, HalfFormat h) {
    Ctx *c = xcalloc(1, sizeof *c);
    DeviceOptions opt = {.kind = "cpu", .local_size = 1, .half = h};
    device_init(&c->d, &opt);
    *state = c;
    return 0;
}
static int setup_bf16(void **state) { return setup_half(state, HALF_BF16); }
static int setup_fp16(void **state) { return setup_half(state, HALF_FP16); }
static int teardown(void **state) {
    Ctx *c = *state;
    device_destroy(&c->d);
    free(c);
    return 0;
}

// ---- the scalar reference: the definition, written out ----

typedef struct Ref {
    float *scales;  // one per block
    int *q;         // one per value
} Ref;

static Ref reference(const float *x, size_t n, int bits, int block) {
    int qmax = bits == 8 ? 127 : 7;
    size_t nb = (n + block - 1) / block;
    Ref r = {xcalloc(nb, sizeof(float)), xcalloc(n, sizeof(int))};
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float amax = 0;
        int nan = 0, inf = 0;
        for (size_t i = lo; i < hi; i++) {
            nan |= isnan(x[i]);
            inf |= isinf(x[i]);
            if (isfinite(x[i]) && fabsf(x[i]) > amax) amax = fabsf(x[i]);
        }
        r.scales[b] = nan ? NAN : inf ? INFINITY : amax / qmax;
        for (size_t i = lo; i < hi; i++) r.q[i] = nan || inf || amax == 0 ? 0 : (int)nearbyintf(x[i] / amax * qmax);
    }
    return r;
}

static float ref_value(const Ref *r, size_t i, int block) {
    float s = r->scales[i / block];
    return isfinite(s) ? (float)r->q[i] * s : s;
}

// The packed piece's values, read back the way its layout says (not through quant_math.h).
static int packed_value(const unsigned char *values, size_t i, int bits) {
    if (bits == 8) return (signed char)values[i];
    int v = (values[i / 2] >> (i % 2 ? 4 : 0)) & 0xf;
    return v >= 8 ? v - 16 : v;
}

static size_t packed_size(size_t n, int bits, int block) {
    size_t scales = 4 * ((n + block - 1) / block), values = bits == 8 ? n : (n + 1) / 2;
    return scales + (values + 3) / 4 * 4;
}

// Quantizes x (n, fp32, or 16-bit when half) on the device and checks the
// piece and its fp32 dequantization against the reference.
static void check_against_reference(Device *d, const float *x, size_t n, int bits, int block, int half) {
    size_t bytes = packed_size(n, bits, block), nb = (n + block - 1) / block;
    assert_int_equal(quant_packed_bytes(n, bits, block), bytes);
    unsigned char *packed = xmalloc(bytes + 8);
    memset(packed, 0xab, bytes + 8);
    float *in = xmalloc(n * sizeof *in), *out = xmalloc(n * sizeof *out);
    bf16 *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = f32_to_half(d->half, x[i]);
        in[i] = half ? half_to_f32(d->half, h[i]) : x[i];  // what the device sees
    }
    if (half) d->k->quantize_half(d, packed, h, n, bits, block);
    else d->k->quantize_f32(d, packed, in, n, bits, block);
    Ref r = reference(in, n, bits, block);
    const float *scales = (const float *)packed;
    const unsigned char *values = packed + 4 * nb;
    for (size_t b = 0; b < nb; b++)
        if (memcmp(&scales[b], &r.scales[b], 4) != 0)
            fail_msg("%d bits, block %d, n %zu: scale %zu is %g, the reference %g", bits, block, n, b, scales[b],
                     r.scales[b]);
    for (size_t i = 0; i < n; i++)
        if (packed_value(values, i, bits) != r.q[i])
            fail_msg("%d bits, block %d, n %zu: value %zu is %d, the reference %d (x %g)", bits, block, n, i,
                     packed_value(values, i, bits), r.q[i], in[i]);
    for (size_t i = 4 * nb + (bits == 8 ? n : (n + 1) / 2); i < bytes; i++) assert_int_equal(packed[i], 0);
    assert_int_equal(packed[bytes], 0xab);  // nothing written past the piece
    d->k->dequantize_f32(d, out, packed, n, bits, block, 0);
    for (size_t i = 0; i < n; i++) {
        float want = ref_value(&r, i, block);
        if (memcmp(&out[i], &want, 4) != 0 && !(isnan(out[i]) && isnan(want)))
            fail_msg("%d bits, block %d: dequantized %zu is %.9g, the reference %.9g", bits, block, i, out[i], want);
    }
    free(r.scales), free(r.q), free(packed), free(in), free(out), free(h);
}

static void test_round_trip_against_reference(void **state) {
    Device *d = &((Ctx *)*state)->d;
    const size_t lengths[] = {1, 31, 32, 33, 255, 1000, 4097};
    const int blocks[] = {32, 256, 2048};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int bi = 0; bi < 3; bi++)
            for (int li = 0; li < 7; li++) {
                size_t n = lengths[li];
                float *x = xmalloc(n * sizeof *x);
                test_fill(x, n, 100 + li, -3, 3);
                for (size_t i = 0; i < n; i += 97) x[i] *= 40;  // blocks whose largest value stands out
                check_against_reference(d, x, n, bits, blocks[bi], 0);
                check_against_reference(d, x, n, bits, blocks[bi], 1);
                free(x);
            }
}

// |x - x'| <= s/2 in every block, beside the rounding of s and of q·s
// (a few ulps of the block's largest value), and of a 16-bit output.
static void test_error_within_half_a_scale(void **state) {
    Device *d = &((Ctx *)*state)->d;
    size_t n = 5000;
    int block = 256;
    float *x = xmalloc(n * sizeof *x), *back = xmalloc(n * sizeof *back);
    test_fill(x, n, 7, -1, 1);
    for (size_t b = 0; b < n / block; b++)  // blocks of very different sizes
        for (size_t i = b * block; i < (b + 1) * block; i++) x[i] *= powf(10.0f, (float)(b % 7) - 3);
    unsigned char *packed = xmalloc(quant_packed_bytes(n, 8, block));
    bf16 *h = xmalloc(n * sizeof *h);
    for (int bits = 8; bits >= 4; bits -= 4) {
        d->k->quantize_f32(d, packed, x, n, bits, block);
        d->k->dequantize_f32(d, back, packed, n, bits, block, 0);
        d->k->dequantize_half(d, h, packed, n, bits, block);
        const float *scales = (const float *)packed;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double s = scales[i / block], amax = s * quant_max(bits);
            double err = fabs((double)x[i] - back[i]), bound = s / 2 + amax * 0x1p-21;
            if (err > bound) fail_msg("%d bits: element %zu off by %g, more than half its block's scale %g", bits, i, err, s);
            worst = fmax(worst, err / s);
            double back16 = half_to_f32(d->half, h[i]), round16 = fabs(back[i]) * (d->half == HALF_BF16 ? 0x1p-8 : 0x1p-11);
            if (fabs(x[i] - back16) > bound + round16 + 6e-8)  // fp16's smallest step near 0
                fail_msg("%d bits, 16-bit output: element %zu off by %g", bits, i, fabs(x[i] - back16));
        }
        print_message("%d bits: largest error %.3f of a block's scale\n", bits, worst);
        assert_true(worst > 0.4);  // the bound is tight: some value lands near half a step
    }
    free(x), free(back), free(packed), free(h);
}

// A block of zeros has scale 0 and comes back as zeros (no 0/0), beside a
// block whose largest value is exact: 16 is 127 steps of 16/127.
static void test_block_of_zeros(void **state) {
    Device *d = &((Ctx *)*state)->d;
    float x[64] = {0}, back[64];
    for (int i = 32; i < 64; i++) x[i] = (float)(i - 48);
    unsigned char packed[4 * 2 + 64];
    d->k->quantize_f32(d, packed, x, 64, 8, 32);
    const float *scales = (const float *)packed;
    assert_true(scales[0] == 0.0f && scales[1] == 16.0f / 127);
    d->k->dequantize_f32(d, back, packed, 64, 8, 32, 0);
    for (int i = 0; i < 32; i++) assert_true(back[i] == 0.0f && !signbit(back[i]));
    assert_true(back[32] == -16.0f);
}

// A NaN or an infinity in block 1 of 3: that block alone comes back as NaN
// or +inf, at 8 and 4 bits, in fp32 and in 16 bits; added to finite sums it
// leaves them non-finite, and the norm over them is not finite.
static void test_nonfinite_block(void **state) {
    Device *d = &((Ctx *)*state)->d;
    enum { N = 96, B = 32 };
    const float bad[2] = {NAN, INFINITY};
    for (int k = 0; k < 2; k++)
        for (int bits = 8; bits >= 4; bits -= 4) {
            float x[N], back[N], acc[N];
            bf16 h[N];
            test_fill(x, N, 9, -1, 1);
            x[40] = k ? -bad[k] : bad[k];  // -inf too: the block is marked +inf either way
            unsigned char packed[4 * 3 + N];
            d->k->quantize_f32(d, packed, x, N, bits, B);
            d->k->dequantize_f32(d, back, packed, N, bits, B, 0);
            d->k->dequantize_half(d, h, packed, N, bits, B);
            for (int i = 0; i < N; i++) acc[i] = 1.0f;
            d->k->dequantize_f32(d, acc, packed, N, bits, B, 1);
            for (int i = 0; i < N; i++) {
                int in_bad_block = i / B == 1;
                float b16 = half_to_f32(d->half, h[i]);
                if (in_bad_block) {
                    assert_true(k ? back[i] == INFINITY && b16 == INFINITY && acc[i] == INFINITY
                                  : isnan(back[i]) && isnan(b16) && isnan(acc[i]));
                } else {
                    assert_true(isfinite(back[i]) && isfinite(b16) && isfinite(acc[i]));
                }
            }
            bf16 sums[N];
            for (int i = 0; i < N; i++) sums[i] = f32_to_half(d->half, acc[i]);
            assert_false(isfinite(d->k->sum_squares_bf16(d, sums, N)));
        }
}

// One block per task: the same bits whatever the thread count.
static void test_same_bits_at_any_thread_count(void **state) {
    Device *d = &((Ctx *)*state)->d;
    size_t n = 100000;
    float *x = xmalloc(n * sizeof *x);
    test_fill(x, n, 11, -2, 2);
    size_t bytes = quant_packed_bytes(n, 4, 256);
    unsigned char *one = xmalloc(bytes), *two = xmalloc(bytes);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    d->k->quantize_f32(d, one, x, n, 4, 256);
    omp_set_num_threads(2);
    d->k->quantize_f32(d, two, x, n, 4, 256);
    omp_set_num_threads(threads);
    assert_memory_equal(one, two, bytes);
    free(x), free(one), free(two);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_against_reference),
        cmocka_unit_test(test_error_within_half_a_scale),
        cmocka_unit_test(test_block_of_zeros),
        cmocka_unit_test(test_nonfinite_block),
        cmocka_unit_test(test_same_bits_at_any_thread_count),
    };
    int failed = cmocka_run_group_tests_name("bf16", tests, setup_bf16, teardown);
    failed |= cmocka_run_group_tests_name("fp16", tests, setup_fp16, teardown);
    return failed;
}
