// cuda_runtime.h (cuda emulator): what CUDA C++ gives device code, for g++.
// The project's .cu files are compiled as C++ after one rewrite
// (tests/emu/cu2cpp.sed turns `k<<<grid, block, shmem, stream>>>(args)` into
// `emu::launcher(__FILE__, __LINE__, "k", k, grid, block, shmem, stream)(args)`).
// threadIdx and the other built-in variables name the emulated thread that
// runs now; __syncthreads, the warp shuffles and votes are rendezvous of the
// emulator's fibers (tests/emu/emu_threads.cpp), checked as they meet.
#pragma once
#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
// one copy per kernel: blocks run one at a time, their threads on one OS thread
#define __shared__ static
// cu2cpp.sed registers each kernel's bound by name (EMU_LAUNCH_BOUNDS); a launch past it stops
#define __launch_bounds__(...)

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

#define __align__(n) __attribute__((aligned(n)))

namespace emu {
// The running block's dynamic shared memory (the launch's third argument;
// cu2cpp.sed turns `extern __shared__ T x[];` into a call), filled with a
// pattern before each block as a GPU leaves it unset; the run stops when
// the launch asked for none.
void *dynamic_shared(const char *file, int line);
// the thread that runs now (set by the block scheduler before every switch)
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

void syncthreads(const char *file, int line);
// Where an atomic runs: the thread may give way to others of its block first
// (drawn from EMU_SEED), so atomics interleave as they do on a GPU.
void atomic_turn();
// a kernel's __launch_bounds__ (cu2cpp.sed calls it before the kernel); returns max_threads
int register_launch_bounds(const char *name, int max_threads);

enum WarpKind {
    WARP_SHFL_IDX, WARP_SHFL_XOR, WARP_SHFL_DOWN, WARP_SHFL_UP, WARP_BALLOT, WARP_ALL, WARP_ANY, WARP_SYNC,
    WARP_WMMA_LOAD, WARP_WMMA_STORE, WARP_WMMA_MMA  // mma.h's collectives (warp_collective)
};
// One warp-wide exchange: every lane of `mask` brings 8 bytes; the result is
// the value this lane reads (a shuffle) or the vote over the mask.
uint64_t warp_exchange(WarpKind kind, unsigned mask, uint64_t value, int arg, int width, const char *file,
                       int line);
unsigned active_mask();
// A warp-wide operation of all 32 lanes that the last lane to arrive carries
// out for the whole warp (nvcuda::wmma's *_sync, mma.h): each lane brings a
// pointer to what it passes, and `run` gets the 32 of them in lane order
// while every lane waits, so it may read and write every lane's fragments.
typedef void (*WarpCollectiveFn)(void *const lanes[32], const char *file, int line);
void warp_collective(WarpKind kind, void *lane_args, WarpCollectiveFn run, const char *file, int line);

template <class T> static inline T shuffle(WarpKind kind, unsigned mask, T v, int arg, int width, const char *file,
                                           int line) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    uint64_t in = 0;
    memcpy(&in, &v, sizeof v);
    uint64_t out = warp_exchange(kind, mask, in, arg, width, file, line);
    T r;
    memcpy(&r, &out, sizeof r);
    return r;
}

// A kernel launch: the arguments are converted to the kernel's parameter
// types now (as the CUDA runtime copies them at the launch) and the kernel
// runs when its stream reaches it.
struct LaunchSite {
    const char *file;
    int line;
    const char *name;
    const void *func;
};
void launch(const LaunchSite &site, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            std::function<void()> body);

template <class... P> struct Launcher {
    void (*kernel)(P...);
    LaunchSite site;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    template <class... A> void operator()(A &&...args) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        void (*k)(P...) = kernel;
        std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
        launch(site, grid, block, shmem, stream, [k, params]() { std::apply(k, params); });
    }
};

template <class... P>
Launcher<P...> launcher(const char *file, int line, const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
                        size_t shmem = 0, cudaStream_t stream = 0) {
    return Launcher<P...>{kernel, {file, line, name, (const void *)kernel}, grid, block, shmem, stream};
}
}  // namespace emu

// the runtime's C++ overloads that take a kernel itself
template <class T> static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *entry) {
    return cudaFuncGetAttributes(attr, (const void *)entry);
}
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
static const int warpSize = 32;

#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
#define __shfl_sync(mask, v, lane, ...) emu::shuffle(emu::WARP_SHFL_IDX, mask, v, lane, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lanemask, ...) emu::shuffle(emu::WARP_SHFL_XOR, mask, v, lanemask, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __shfl_down_sync(mask, v, delta, ...) emu::shuffle(emu::WARP_SHFL_DOWN, mask, v, delta, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __shfl_up_sync(mask, v, delta, ...) emu::shuffle(emu::WARP_SHFL_UP, mask, v, delta, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 32, __FILE__, __LINE__)
#define __ballot_sync(mask, pred) ((unsigned)emu::warp_exchange(emu::WARP_BALLOT, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred) ((int)emu::warp_exchange(emu::WARP_ALL, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred) ((int)emu::warp_exchange(emu::WARP_ANY, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __activemask() emu::active_mask()
// a barrier of the mask's lanes (all 32 without one): each lane's writes before
// it are seen by the others after it, as the lanes' rendezvous orders them here
#define __syncwarp(...) ((void)emu::warp_exchange(emu::WARP_SYNC, (__VA_ARGS__ + 0) ? (__VA_ARGS__ + 0) : 0xffffffffu, 0, 0, 32, __FILE__, __LINE__))

// Atomics: the threads of a block take turns on one OS thread and blocks run
// one at a time, so a read-modify-write is atomic as written; before it the
// thread may give way, and the threads' turns are drawn (emu_threads.cpp).
template <class T> static inline T atomicAdd(T *p, T v) {
    emu::atomic_turn();
    T old = *p;
    *p = old + v;
    return old;
}
template <class T> static inline T atomicMax(T *p, T v) {
    emu::atomic_turn();
    T old = *p;
    *p = old > v ? old : v;
    return old;
}
template <class T> static inline T atomicMin(T *p, T v) {
    emu::atomic_turn();
    T old = *p;
    *p = old < v ? old : v;
    return old;
}
template <class T> static inline T atomicExch(T *p, T v) {
    emu::atomic_turn();
    T old = *p;
    *p = v;
    return old;
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v) {
    emu::atomic_turn();
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}

// device math the CUDA headers give in both host and device code
template <class T> static inline T min(T a, T b) { return b < a ? b : a; }
template <class T> static inline T max(T a, T b) { return a < b ? b : a; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
template <class T> static inline T __ldg(const T *p) { return *p; }
#endif
