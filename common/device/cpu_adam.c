// cpu_adam.c: choosing a CPU Adam path and splitting the elements over
// OpenMP threads (cpu_adam.h). The loops themselves are in cpu_adam_scalar.c,
// cpu_adam_avx2.c and cpu_adam_avx512.c.
//
// Memory traffic, 28 bytes per element: 2 (grad) + 12 read and 12 written
// (master, m, v) + 2 (param). Every path uses ordinary unaligned loads and
// stores. Non-temporal stores would save little: master, m and v are written
// to the lines just read, which are in cache, so there is no read-for-ownership
// to avoid; only param's 2 bytes (about 7%) are a write to a line not read.
// Streaming stores also want aligned addresses, which a shard's start need
// not have.
#include "cpu_adam.h"
#include "check.h"
#include "cpu_adam_paths.h"

// Elements per OpenMP work item: a multiple of every vector width, so only the
// last tile has a scalar tail, and large enough (4096 x 28 bytes = 112 KiB of
// traffic) that the loop overhead is nothing. schedule(static) hands each
// thread one contiguous run of tiles, so every thread streams through memory.
#define CPU_ADAM_TILE 4096

const char *cpu_adam_path_name(CpuAdamPath p) {
    switch (p) {
    case CPU_ADAM_SCALAR: return "scalar";
    case CPU_ADAM_AVX2: return "avx2+fma";
    case CPU_ADAM_AVX512: return "avx512";
    default: return "unknown";
    }
}

// __builtin_cpu_supports reads CPUID and XGETBV: a feature counts only when
// the OS also saves its registers (the YMM/ZMM state in XCR0).
const char *cpu_adam_path_unsupported_reason(CpuAdamPath p) {
    if (p == CPU_ADAM_SCALAR) return NULL;
    if (p != CPU_ADAM_AVX2 && p != CPU_ADAM_AVX512) return "no such path";
#ifdef CPU_ADAM_HAVE_X86
    __builtin_cpu_init();
    if (p == CPU_ADAM_AVX2) {
        if (!__builtin_cpu_supports("avx2")) return "the CPU reports no avx2";
        if (!__builtin_cpu_supports("fma")) return "the CPU reports no fma";
        if (!__builtin_cpu_supports("f16c")) return "the CPU reports no f16c";
        return NULL;
    }
    if (!__builtin_cpu_supports("avx512f")) return "the CPU reports no avx512f";
    return NULL;
#else
    return "built for a CPU other than x86-64 (the SIMD paths use x86 intrinsics)";
#endif
}

int cpu_adam_path_supported(CpuAdamPath p) { return cpu_adam_path_unsupported_reason(p) == NULL; }

CpuAdamPath cpu_adam_best_path(void) {
    if (cpu_adam_path_supported(CPU_ADAM_AVX512)) return CPU_ADAM_AVX512;
    if (cpu_adam_path_supported(CPU_ADAM_AVX2)) return CPU_ADAM_AVX2;
    return CPU_ADAM_SCALAR;
}

static CpuAdamTileFn tile_fn(CpuAdamPath p) {
#ifdef CPU_ADAM_HAVE_X86
    if (p == CPU_ADAM_AVX512) return cpu_adam_tile_avx512;
    if (p == CPU_ADAM_AVX2) return cpu_adam_tile_avx2;
#endif
    return cpu_adam_tile_scalar;
}

void cpu_adam_step(CpuAdamPath path, int threads, float *master, float *m, float *v,
                   const bf16 *grad, bf16 *param, size_t n, const AdamWStep *s) {
    const char *why_not = cpu_adam_path_unsupported_reason(path);
    CHECK(why_not == NULL,
          "cpu_adam_step: path %d (%s) cannot run here: %s; use cpu_adam_best_path()", (int)path,
          cpu_adam_path_name(path), why_not);
    CHECK(threads >= 1, "cpu_adam_step: threads is %d; pass 1 or more", threads);
    CpuAdamTileFn tile = tile_fn(path);
    AdamWStep st = *s;
    size_t tiles = (n + CPU_ADAM_TILE - 1) / CPU_ADAM_TILE;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tiles > 1)
    for (size_t t = 0; t < tiles; t++) {
        size_t start = t * CPU_ADAM_TILE;
        size_t len = n - start < CPU_ADAM_TILE ? n - start : CPU_ADAM_TILE;
        tile(master + start, m + start, v + start, grad + start, param ? param + start : NULL, len,
             &st);
    }
}
