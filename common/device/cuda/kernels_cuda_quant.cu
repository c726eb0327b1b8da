// kernels_cuda_quant.cu: block quantization on the cuda device (kernels.h;
// the math and the packed layout in quant_math.h, the same as the cpu's, so
// both give the same bits). A thread block takes a quantization block: it
// reduces the block's |x| maximum (and whether it holds a NaN or an
// infinity), thread 0 writes the scale, and every thread quantizes its
// share; at 4 bits a thread packs two neighbours into one byte. The
// dequantization is element-wise.
#include "kernels_cuda.h"
#include "quant_math.h"

namespace KERNELS_NS {

static cudaStream_t compute(Device *d) { return cuda_stream(d, STREAM_COMPUTE); }

__device__ inline float element(const floatX *x, size_t i) { return to_f32(x[i]); }
__device__ inline float element(const float *x, size_t i) { return x[i]; }

// The blocks of x this thread block takes (grid-stride over blocks).
template <class In>
__device__ inline void quantize_blocks(float *scales, unsigned char *q, const In *x, size_t n, size_t nb, int bits,
                                       int block) {
    int qmax = quant_max(bits);
    for (size_t b = blockIdx.x; b < nb; b += gridDim.x) {
        size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        QuantRange r = {0.0f, 0};
        for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) r = quant_range_add(r, element(x, i));
        r.amax = block_max(r.amax);
        r.bad = (int)block_max((float)r.bad);
        if (threadIdx.x == 0) scales[b] = quant_scale(r, qmax);
        if (bits == 8) {
            for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
                q[i] = (unsigned char)quant_value(element(x, i), r, qmax);
        } else {
            for (size_t i = lo + 2 * threadIdx.x; i < hi; i += 2 * (size_t)blockDim.x) {
                int next = i + 1 < hi ? quant_value(element(x, i + 1), r, qmax) : 0;
                q[i / 2] = quant_nibbles(quant_value(element(x, i), r, qmax), next);
            }
        }
    }
}

__global__ void __launch_bounds__(BLOCK) quantize_half_kernel(float *scales, unsigned char *q, const floatX *x, size_t n,
                                                              size_t nb, int bits, int block) {
    quantize_blocks(scales, q, x, n, nb, bits, block);
}

__global__ void __launch_bounds__(BLOCK) quantize_f32_kernel(float *scales, unsigned char *q, const float *x, size_t n,
                                                             size_t nb, int bits, int block) {
    quantize_blocks(scales, q, x, n, nb, bits, block);
}

// the piece's padding, so that all its bytes are written
__global__ void quantize_padding_kernel(unsigned char *q, size_t from, size_t to) {
    for (size_t i = from + threadIdx.x; i < to; i += blockDim.x) q[i] = 0;
}

// The piece's layout, and the launch's checks: its scales, its values, and a grid of one thread block per block.
typedef struct Piece {
    float *scales;
    unsigned char *q;
    size_t nb, values;
    unsigned grid;
} Piece;

static Piece piece_of(void *packed, size_t n, int bits, int block) {
    CHECK((bits == 8 || bits == 4) && block >= 2 && (bits == 8 || block % 2 == 0),
          "quantization with %d bits in blocks of %d: 8 or 4 bits, at 4 blocks of an even size", bits, block);
    Piece p;
    p.nb = quant_blocks(n, block);
    p.values = quant_value_bytes(n, bits);
    p.scales = (float *)packed;
    p.q = (unsigned char *)packed + 4 * p.nb;
    p.grid = p.nb < 65536 ? (unsigned)p.nb : 65536u;
    return p;
}

static void pad(Device *d, const Piece *p) {
    quantize_padding_kernel<<<1, WARP_SIZE, 0, compute(d)>>>(p->q, p->values, (p->values + 3) / 4 * 4);
    LAUNCH_CHECK();
}

void quantize_half_cuda(Device *d, void *packed, const bf16 *x, size_t n, int bits, int block) {
    Piece p = piece_of(packed, n, bits, block);
    if (n == 0) return;
    quantize_half_kernel<<<p.grid, BLOCK, 0, compute(d)>>>(p.scales, p.q, (const floatX *)x, n, p.nb, bits, block);
    LAUNCH_CHECK();
    pad(d, &p);
}

void quantize_f32_cuda(Device *d, void *packed, const float *x, size_t n, int bits, int block) {
    Piece p = piece_of(packed, n, bits, block);
    if (n == 0) return;
    quantize_f32_kernel<<<p.grid, BLOCK, 0, compute(d)>>>(p.scales, p.q, x, n, p.nb, bits, block);
    LAUNCH_CHECK();
    pad(d, &p);
}

__global__ void __launch_bounds__(BLOCK) dequantize_half_kernel(floatX *out, const float *scales, const unsigned char *q,
                                                                size_t n, int bits, int block) {
    FOR_EACH_ELEMENT(i, n) out[i] = to_floatX(dequant_value(quant_load(q, i, bits), scales[i / block]));
}

__global__ void __launch_bounds__(BLOCK) dequantize_f32_kernel(float *acc, const float *scales, const unsigned char *q,
                                                               size_t n, int bits, int block, int accumulate) {
    FOR_EACH_ELEMENT(i, n) {
        int v = quant_load(q, i, bits);
        float s = scales[i / block];
        acc[i] = accumulate ? dequant_add(acc[i], v, s) : dequant_value(v, s);
    }
}

void dequantize_half_cuda(Device *d, bf16 *out, const void *packed, size_t n, int bits, int block) {
    if (n == 0) return;
    const float *scales = (const float *)packed;
    const unsigned char *q = (const unsigned char *)packed + 4 * quant_blocks(n, block);
    dequantize_half_kernel<<<grid_for(n, BLOCK), BLOCK, 0, compute(d)>>>((floatX *)out, scales, q, n, bits, block);
    LAUNCH_CHECK();
}

void dequantize_f32_cuda(Device *d, float *acc, const void *packed, size_t n, int bits, int block, int accumulate) {
    if (n == 0) return;
    const float *scales = (const float *)packed;
    const unsigned char *q = (const unsigned char *)packed + 4 * quant_blocks(n, block);
    dequantize_f32_kernel<<<grid_for(n, BLOCK), BLOCK, 0, compute(d)>>>(acc, scales, q, n, bits, block, accumulate);
    LAUNCH_CHECK();
}

}  // namespace KERNELS_NS
