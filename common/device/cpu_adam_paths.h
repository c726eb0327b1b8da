// cpu_adam_paths.h: the per-path loops behind cpu_adam_step (cpu_adam.h).
// Internal to cpu_adam*.c. Each runs AdamW over one tile of n elements on one
// thread, with the same arguments as cpu_adam_step; param may be NULL.
#pragma once
#include "cpu_adam.h"

typedef void (*CpuAdamTileFn)(float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                              size_t n, const AdamWStep *s);

// cpu_adam_scalar.c: adamw_element in a plain loop, built without
// auto-vectorization (see the Makefile) so that it is the scalar reference.
void cpu_adam_tile_scalar(float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                          size_t n, const AdamWStep *s);

// The SIMD paths exist on x86-64 only; each file carries its own target
// attribute, so the build needs no -m flags and runs on any x86-64 CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_ADAM_HAVE_X86 1
// cpu_adam_avx2.c: 8 lanes (AVX2 + FMA)
void cpu_adam_tile_avx2(float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                        size_t n, const AdamWStep *s);
// cpu_adam_avx512.c: 16 lanes (AVX-512F)
void cpu_adam_tile_avx512(float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                          size_t n, const AdamWStep *s);
#endif
