// cpu_adam.h: AdamW on the host in one pass over memory (ZeRO-Offload's CPU
// Adam, Ren et al., ATC 2021): fp32 master, m and v read and written in place,
// 16-bit gradients in, 16-bit parameters out (bf16 or fp16, AdamWStep.half). SIMD paths for AVX-512 and AVX2+FMA,
// chosen from what the CPU reports at run time, and a scalar loop; OpenMP
// threads share the elements in tiles.
//
// Every path gives the bits of adamw_element (elementwise.h) run element by
// element, then f32_to_half (bf16.h) for the parameter: the vector code
// repeats adamw_element's pinned operation order lane by lane, and the
// elements after the last full vector run adamw_element itself.
#pragma once
#include <stddef.h>
#include "bf16.h"
#include "elementwise.h"

typedef enum {
    CPU_ADAM_SCALAR,  // one element at a time (compiled without auto-vectorization)
    CPU_ADAM_AVX2,    // 8 lanes: AVX2, FMA and F16C (for fp16 runs)
    CPU_ADAM_AVX512,  // 16 lanes: AVX-512F
    CPU_ADAM_PATHS    // how many paths there are
} CpuAdamPath;

// "scalar", "avx2+fma", "avx512"; "unknown" for anything else
const char *cpu_adam_path_name(CpuAdamPath p);

// 1 when this CPU (and the OS, which must save the wider registers) can run
// path p and this build contains it; 0 otherwise. The scalar path always runs.
int cpu_adam_path_supported(CpuAdamPath p);

// Why path p cannot run here ("the CPU reports no avx512f", ...), or NULL
// when it can.
const char *cpu_adam_path_unsupported_reason(CpuAdamPath p);

// The widest path cpu_adam_path_supported accepts.
CpuAdamPath cpu_adam_best_path(void);

// AdamW over n elements: master, m, v (fp32, in place), grad (16-bit, read),
// param (16-bit, written; NULL to skip), both in s->half's format. threads >= 1 OpenMP threads split the
// elements in tiles. Any n, any start address (no alignment needed); the same
// bits on every path and for every thread count. An unsupported path or
// threads < 1 is a caller's bug: it stops with file:line.
void cpu_adam_step(CpuAdamPath path, int threads, float *master, float *m, float *v,
                   const bf16 *grad, bf16 *param, size_t n, const AdamWStep *s);
