// test_cuda_quant.c: the block quantization (ZeRO++, quant_math.h) on the
// cuda device against the cpu device, in bf16 and in fp16 (the kernels'
// second pass): the packed pieces, 16-bit and fp32 inputs, at 8 and 4 bits,
// and their dequantization, written and accumulated, to the bit: both
// devices run quant_math.h's arithmetic on the same inputs (a true division,
// rintf, an explicit fmaf). Blocks of one value and of a NaN or an infinity
// included. Where no GPU is visible every test is skipped.
#include "conformance.h"
#include "quant_math.h"

static void check_quantization(Devices *dv, size_t n, int bits, int block) {
    float *x = rand_values(n, 61 + n, -2, 2), *acc0 = rand_values(n, 62, -1, 1);
    for (size_t i = 0; i < n; i += 113) x[i] *= 50;
    if (n > 3 * (size_t)block) x[block + 3] = NAN, x[2 * block + 5] = -INFINITY;
    size_t bytes = quant_packed_bytes(n, bits, block);
    unsigned char *packed_h[2], *packed_f[2];
    bf16 *out[2];
    float *set[2], *added[2];
    FOR_BOTH_DEVICES(dv, k, d) {
        TestBufs a = {.d = d};
        bf16 *xh = put_bf16(&a, x, n);
        float *xf = put_f32(&a, x, n), *acc = put_f32(&a, acc0, n), *back = bufs_alloc(&a, n * 4);
        void *ph = bufs_alloc(&a, bytes), *pf = bufs_alloc(&a, bytes);
        bf16 *o = bufs_alloc(&a, n * 2);
        d->k->quantize_half(d, ph, xh, n, bits, block);
        d->k->quantize_f32(d, pf, xf, n, bits, block);
        d->k->dequantize_half(d, o, ph, n, bits, block);
        d->k->dequantize_f32(d, back, pf, n, bits, block, 0);
        d->k->dequantize_f32(d, acc, ph, n, bits, block, 1);
        packed_h[k] = get_bytes(d, ph, bytes);
        packed_f[k] = get_bytes(d, pf, bytes);
        out[k] = get_bf16_raw(d, o, n);
        set[k] = get_f32(d, back, n);
        added[k] = get_f32(d, acc, n);
        bufs_free(&a);
    }
    char what[96];
    snprintf(what, sizeof what, "quantize_half (%d bits, block %d, n %zu)", bits, block, n);
    if (memcmp(packed_h[0], packed_h[1], bytes)) fail_msg("%s: the pieces differ", what);
    snprintf(what, sizeof what, "quantize_f32 (%d bits, block %d, n %zu)", bits, block, n);
    if (memcmp(packed_f[0], packed_f[1], bytes)) fail_msg("%s: the pieces differ", what);
    expect_bits_equal("dequantize_half", out[1], out[0], n);
    if (memcmp(set[0], set[1], n * 4)) fail_msg("dequantize_f32 (written): the values differ");
    if (memcmp(added[0], added[1], n * 4)) fail_msg("dequantize_f32 (accumulated): the values differ");
    for (int k = 0; k < 2; k++) free(packed_h[k]), free(packed_f[k]), free(out[k]), free(set[k]), free(added[k]);
    free(x), free(acc0);
}

static void test_quantize_matches_cpu(void **state) {
    Devices *dv = devices_or_skip(state);
    const size_t lengths[] = {1, 33, 1000, 5003};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int i = 0; i < 4; i++) {
            check_quantization(dv, lengths[i], bits, 32);
            check_quantization(dv, lengths[i], bits, 256);
        }
    check_quantization(dv, 70000, 8, 2048);  // more blocks than a thread block has threads
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_matches_cpu),
    };
    int failed = cmocka_run_group_tests_name("bf16", tests, group_setup, group_teardown);
    failed |= cmocka_run_group_tests_name("fp16", tests, group_setup_fp16, group_teardown);
    return failed;
}
