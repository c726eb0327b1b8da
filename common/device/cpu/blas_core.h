// blas_core.h: which OpenBLAS kernels the cpu device runs, and a better set
// where OpenBLAS fell back below what this CPU can do.
//
// A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels at load time from the
// CPU's model number. On a virtual machine that hides the model, or on a CPU
// newer than the library, it falls back to a generic set (Prescott's SSE3
// kernels, or Haswell's AVX2 ones on an AVX-512 CPU) and runs 2-5x below its
// own roof, silently. The choice can only be changed before the library is
// loaded, through OPENBLAS_CORETYPE, so the program restarts itself once
// (before MPI_Init) with the best kernel set its CPU features allow, checks
// that set with a self-test GEMM, and goes back to the detected one if the
// test fails. A core set in the environment is never overridden.
#pragma once
#include <stddef.h>

// The instruction sets OpenBLAS's x86 kernel sets are written for, in order.
typedef enum { ISA_NONE = -1, ISA_SSE3 = 0, ISA_AVX, ISA_AVX2, ISA_AVX512 } IsaLevel;

const char *isa_level_name(IsaLevel isa);  // "AVX-512", ...
// This CPU's level from cpuid (and the OS's xgetbv): AVX-512 needs F, BW, DQ
// and VL (what OpenBLAS's SkylakeX kernels use); AVX2 needs FMA too.
// ZW_CPU_ISA=AVX2 (SSE3, AVX, AVX-512) lowers it, never raises it: what an
// older CPU would do, tried on this one (the kernels chosen, a core refused).
IsaLevel cpu_isa_level(void);
// The level an OpenBLAS core name is written for (case-insensitive);
// ISA_NONE for a name this table does not know.
IsaLevel blas_core_isa(const char *core);
// The kernel set to run at a level: SkylakeX, Haswell, Sandybridge; NULL at SSE3.
const char *blas_core_for_isa(IsaLevel isa);

// What to do, from what OpenBLAS detected, OPENBLAS_CORETYPE (NULL or "" when
// unset) and this CPU's level: the core to restart with, or NULL to keep the
// running one.
const char *blas_core_upgrade(const char *detected, const char *env_core, IsaLevel cpu);

// The first thing a program that runs the cpu device does, before MPI_Init
// and before any thread: may replace the process (execv of /proc/self/exe with
// the command line it was started with, a loader's included) once to switch
// cores, and once more to go back when the switched core fails its
// self-test. Returns when the core is settled. An OPENBLAS_CORETYPE
// whose kernels need more than this CPU has is refused (one line, exit 2).
void blas_core_choose(char **argv);

// The running core and how it was chosen, e.g. "SkylakeX (chosen: detected
// Haswell below this CPU's AVX-512)" or "Haswell (detected by OpenBLAS)".
void blas_core_describe(char *buf, size_t bytes);
// The running core's name alone ("SkylakeX").
const char *blas_core_running(void);

// The self-test: C = alpha op(A) op(B) + beta C for the transposes the
// kernels use, against a double-precision reference within fp32's error
// bound. Returns 0, or -1 with `why` saying what differed.
int blas_core_self_test(char *why, size_t why_bytes);
