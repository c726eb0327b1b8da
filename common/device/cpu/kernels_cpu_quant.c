// kernels_cpu_quant.c: block quantization on the cpu (kernels.h; the math
// and the packed layout in quant_math.h). One OpenMP task per block: a
// block's scale comes from its own values only, and at 4 bits an even block
// size keeps the two values of one byte inside one block (an int8 is a
// byte of its own at any size), so no two threads write the same byte and
// the bits do not depend on the thread count.
#include "check.h"
#include "kernels_cpu.h"
#include "quant_math.h"

// A packed piece: its scales first, its values after them.
static float *piece_scales(void *packed) { return packed; }
static unsigned char *piece_values(void *packed, size_t n, int block) {
    return (unsigned char *)packed + 4 * quant_blocks(n, block);
}

static void check_args(int bits, int block) {
    CHECK((bits == 8 || bits == 4) && block >= 2 && (bits == 8 || block % 2 == 0),
          "quantization with %d bits in blocks of %d: 8 or 4 bits, at 4 blocks of an even size", bits, block);
}

// x is 16-bit (xh, in the device's format) or fp32 (xf); the other is NULL.
static inline float element(const Device *d, const bf16 *xh, const float *xf, size_t i) {
    return xf ? xf[i] : half_to_f32(d->half, xh[i]);
}

static void quantize(Device *d, void *packed, const bf16 *xh, const float *xf, size_t n, int bits, int block) {
    check_args(bits, block);
    float *scales = piece_scales(packed);
    unsigned char *q = piece_values(packed, n, block);
    size_t nb = quant_blocks(n, block);
    int qmax = quant_max(bits);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        QuantRange r = {0.0f, 0};
        for (size_t i = lo; i < hi; i++) r = quant_range_add(r, element(d, xh, xf, i));
        scales[b] = quant_scale(r, qmax);
        for (size_t i = lo; i < hi; i += (size_t)(bits == 8 ? 1 : 2)) {
            int v = quant_value(element(d, xh, xf, i), r, qmax);
            if (bits == 8) {
                q[i] = (unsigned char)v;
                continue;
            }
            int next = i + 1 < hi ? quant_value(element(d, xh, xf, i + 1), r, qmax) : 0;
            q[i / 2] = quant_nibbles(v, next);
        }
    }
    // the padding too, so a piece's bytes are all written
    for (size_t i = quant_value_bytes(n, bits); i < (quant_value_bytes(n, bits) + 3) / 4 * 4; i++) q[i] = 0;
}

void quantize_half_cpu(Device *d, void *packed, const bf16 *x, size_t n, int bits, int block) {
    quantize(d, packed, x, NULL, n, bits, block);
}

void quantize_f32_cpu(Device *d, void *packed, const float *x, size_t n, int bits, int block) {
    quantize(d, packed, NULL, x, n, bits, block);
}

void dequantize_half_cpu(Device *d, bf16 *out, const void *packed, size_t n, int bits, int block) {
    check_args(bits, block);
    const float *scales = piece_scales((void *)packed);
    const unsigned char *q = piece_values((void *)packed, n, block);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = f32_to_half(d->half, dequant_value(quant_load(q, i, bits), scales[i / block]));
}

void dequantize_f32_cpu(Device *d, float *acc, const void *packed, size_t n, int bits, int block, int accumulate) {
    (void)d;
    check_args(bits, block);
    const float *scales = piece_scales((void *)packed);
    const unsigned char *q = piece_values((void *)packed, n, block);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        int v = quant_load(q, i, bits);
        float s = scales[i / block];
        acc[i] = accumulate ? dequant_add(acc[i], v, s) : dequant_value(v, s);
    }
}
