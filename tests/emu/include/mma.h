// mma.h (cuda emulator): nvcuda::wmma, the tensor cores' warp-level matrix
// multiply-accumulate, in the subset the project's kernels may use: 16x16x16
// tiles, matrix_a and matrix_b fragments of __nv_bfloat16 or __half in
// row_major or col_major, float accumulators; fill_fragment,
// load_matrix_sync, store_matrix_sync, mma_sync, num_elements and x[]. A
// fragment type or call outside the subset does not compile.
//
// The *_sync calls are rendezvous of the whole warp (emu_threads.cpp): all
// 32 lanes must call the same one at the same line, or the run stops with
// file:line as for a shuffle (a lane that exited, lanes at different
// operations, a partial warp); loads and stores also need the same pointer,
// ldm and layout in every lane, the pointer 256-bit aligned and ldm a
// multiple of 16 bytes, as CUDA asks. The last lane to arrive does the
// warp's work for all, so a lane may overwrite its fragments as soon as its
// call returns.
//
// Which lane holds which element in x[] is the emulator's own choice: a
// fixed scramble, another for each fragment type (the __half operands hold
// every element twice, 16 per lane, as on the GPU), so code that assumes a
// layout for x[] computes wrong results here. mma_sync computes in fp32:
// every product of two 16-bit inputs is exact in fp32, and each element is
// summed in a fixed order, C first, then k = 0..15.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };

template <typename T> struct helper_traits {
    typedef T fill_argument_type;
};

template <typename T, int size> struct __frag_base {
    enum { num_elements = size };
    typedef T element_type;
    T x[size];
};

template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8> {};
template <> class fragment<matrix_a, 16, 16, 16, __half, row_major> : public __frag_base<__half, 16> {};
template <> class fragment<matrix_a, 16, 16, 16, __half, col_major> : public __frag_base<__half, 16> {};
template <> class fragment<matrix_b, 16, 16, 16, __half, row_major> : public __frag_base<__half, 16> {};
template <> class fragment<matrix_b, 16, 16, 16, __half, col_major> : public __frag_base<__half, 16> {};
template <> class fragment<accumulator, 16, 16, 16, float> : public __frag_base<float, 8> {};

}  // namespace wmma
}  // namespace nvcuda

namespace emu {
namespace wmma_impl {
using namespace nvcuda::wmma;

// What a lane passes to a load or a store: its fragment, and the arguments
// that must be the same in every lane.
struct MatrixArgs {
    void *frag;
    const void *ptr;
    unsigned ldm;
    int row_major;  // element (r, c) of the tile at ptr[r ldm + c], else ptr[c ldm + r]
};
struct MmaArgs {
    void *d, *a, *b, *c;  // the fragments (a, b and c are read only)
};

// Stops the run unless every lane passed the same pointer, ldm and layout,
// the pointer 32-byte aligned and ldm a multiple of 16 bytes (emu_mma.cpp).
void check_matrix_args(WarpKind op, void *const lanes[32], size_t elem_bytes, const char *file, int line);
// The scramble of a fragment type: slot[e + 256 c] = lane * per_lane + i,
// where copy c of tile element e (row-major index) lives; `key` tells the
// types apart (emu_mma.cpp).
const uint16_t *scramble(unsigned key, int per_lane);

// Tile element e in 16x16 storage at p with leading dimension ldm
template <class T> inline T *element(T *p, unsigned ldm, int row_major, int e) {
    int r = e / 16, c = e % 16;
    return row_major ? p + (size_t)r * ldm + c : p + (size_t)c * ldm + r;
}

inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_float(__half v) { return __half2float(v); }
inline float to_float(float v) { return v; }

template <class Use> struct UseId;
template <> struct UseId<matrix_a> { enum { id = 1 }; };
template <> struct UseId<matrix_b> { enum { id = 2 }; };
template <> struct UseId<accumulator> { enum { id = 3 }; };
template <class T> struct TypeId;
template <> struct TypeId<__nv_bfloat16> { enum { id = 1 }; };
template <> struct TypeId<__half> { enum { id = 2 }; };
template <> struct TypeId<float> { enum { id = 3 }; };
template <class L> struct LayoutId { enum { id = 0, row = 0 }; };
template <> struct LayoutId<row_major> { enum { id = 1, row = 1 }; };
template <> struct LayoutId<col_major> { enum { id = 2, row = 0 }; };

// A fragment type's place in the scramble, and its copies of each element.
template <class F> struct Tile;
template <class Use, class T, class L> struct Tile<fragment<Use, 16, 16, 16, T, L>> {
    typedef fragment<Use, 16, 16, 16, T, L> Frag;
    enum { per_lane = Frag::num_elements, copies = 32 * Frag::num_elements / 256 };
    enum { key = UseId<Use>::id * 16 + TypeId<T>::id * 4 + LayoutId<L>::id, row = LayoutId<L>::row };
    // slot s of the fragment that each lane's arguments name at offset `member`
    static T &at(void *const lanes[32], size_t member, int s) {
        void *const *frag = (void *const *)((const char *)lanes[s / per_lane] + member);
        return ((Frag *)*frag)->x[s % per_lane];
    }
    static const uint16_t *slots() {
        static const uint16_t *table = scramble(key, per_lane);
        return table;
    }
    // copy 0 of element e, as a float
    static float get(void *const lanes[32], size_t member, int e) { return to_float(at(lanes, member, slots()[e])); }
};

template <class F> void run_load(void *const lanes[32], const char *file, int line) {
    typedef Tile<F> Info;
    typedef typename F::element_type T;
    check_matrix_args(WARP_WMMA_LOAD, lanes, sizeof(T), file, line);
    const MatrixArgs *a = (const MatrixArgs *)lanes[0];
    const uint16_t *slot = Info::slots();
    for (int e = 0; e < 256; e++) {
        T v = *element((const T *)a->ptr, a->ldm, a->row_major, e);
        for (int c = 0; c < Info::copies; c++) Info::at(lanes, offsetof(MatrixArgs, frag), slot[e + 256 * c]) = v;
    }
}

template <class F> void run_store(void *const lanes[32], const char *file, int line) {
    typedef Tile<F> Info;
    check_matrix_args(WARP_WMMA_STORE, lanes, sizeof(float), file, line);
    const MatrixArgs *a = (const MatrixArgs *)lanes[0];
    for (int e = 0; e < 256; e++)
        *element((float *)a->ptr, a->ldm, a->row_major, e) = Info::get(lanes, offsetof(MatrixArgs, frag), e);
}

template <class FA, class FB> void run_mma(void *const lanes[32], const char *file, int line) {
    typedef Tile<fragment<accumulator, 16, 16, 16, float>> Acc;
    float a[256], b[256], d[256];
    for (int e = 0; e < 256; e++) {
        a[e] = Tile<FA>::get(lanes, offsetof(MmaArgs, a), e);  // a[m 16 + k]
        b[e] = Tile<FB>::get(lanes, offsetof(MmaArgs, b), e);  // b[k 16 + n]
        d[e] = Acc::get(lanes, offsetof(MmaArgs, c), e);       // c[m 16 + n]; d may be c
    }
    for (int e = 0; e < 256; e++) {
        int m = e / 16, n = e % 16;
        for (int k = 0; k < 16; k++) {
            float product = a[m * 16 + k] * b[k * 16 + n];  // exact: 8 or 11 bits times 8 or 11 bits
            d[e] += product;
        }
    }
    for (int e = 0; e < 256; e++) Acc::at(lanes, offsetof(MmaArgs, d), Acc::slots()[e]) = d[e];
}

}  // namespace wmma_impl
}  // namespace emu

// The calls. Each *_sync names its call site by default arguments that GCC
// evaluates where the call is written (__builtin_FILE, __builtin_LINE).
namespace nvcuda {
namespace wmma {

// per lane, no rendezvous: every element of the fragment set to v
template <typename T, int size>
inline void fill_fragment(__frag_base<T, size> &f, const typename helper_traits<T>::fill_argument_type &v) {
    for (int i = 0; i < size; i++) f.x[i] = v;
}

// matrix_a or matrix_b: the fragment's layout is the memory's
template <typename Use, typename T, typename L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &a, const T *p, unsigned ldm,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(emu::wmma_impl::LayoutId<L>::id != 0,
                  "load_matrix_sync: an accumulator's load takes a layout_t (mem_row_major or mem_col_major)");
    emu::wmma_impl::MatrixArgs args = {&a, p, ldm, emu::wmma_impl::LayoutId<L>::row};
    emu::warp_collective(emu::WARP_WMMA_LOAD, &args, emu::wmma_impl::run_load<fragment<Use, 16, 16, 16, T, L>>,
                         file, line);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &a, const float *p, unsigned ldm,
                             layout_t layout, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::wmma_impl::MatrixArgs args = {&a, p, ldm, layout == mem_row_major};
    emu::warp_collective(emu::WARP_WMMA_LOAD, &args,
                         emu::wmma_impl::run_load<fragment<accumulator, 16, 16, 16, float>>, file, line);
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &a, unsigned ldm,
                              layout_t layout, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::wmma_impl::MatrixArgs args = {(void *)&a, p, ldm, layout == mem_row_major};
    emu::warp_collective(emu::WARP_WMMA_STORE, &args,
                         emu::wmma_impl::run_store<fragment<accumulator, 16, 16, 16, float>>, file, line);
}

// d = a b + c over the warp's tiles; d may be c
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu::wmma_impl::MmaArgs args = {&d, (void *)&a, (void *)&b, (void *)&c};
    emu::warp_collective(emu::WARP_WMMA_MMA, &args,
                         emu::wmma_impl::run_mma<fragment<matrix_a, 16, 16, 16, T, LA>,
                                                 fragment<matrix_b, 16, 16, 16, T, LB>>,
                         file, line);
}

}  // namespace wmma
}  // namespace nvcuda
