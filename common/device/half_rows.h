// half_rows.h: 16-bit rows to fp32 and back on the host, in the run's format
// (bf16 or fp16, bf16.h). fp16 has a vector path on CPUs with F16C (the
// vcvtph2ps/vcvtps2ph instructions, 8 lanes) and a scalar one, chosen at run
// time; both give the bits of f16_to_f32/f32_to_f16 (bf16.h). bf16 needs no
// instruction of its own: a shift, which the compiler vectorizes.
#pragma once
#include <stddef.h>
#include "bf16.h"

typedef enum { HALF_ROWS_SCALAR, HALF_ROWS_F16C } HalfRowsPath;

// Why path p cannot run here ("the CPU reports no f16c"), or NULL when it can.
const char *half_rows_unsupported_reason(HalfRowsPath p);
// F16C where the CPU has it, else scalar.
HalfRowsPath half_rows_best_path(void);

// dst[i] = the value of src[i]; n elements, any alignment. Single-threaded:
// callers split rows over their own threads.
void half_to_f32_row(HalfRowsPath p, HalfFormat fmt, float *dst, const bf16 *src, size_t n);
// dst[i] = src[i] rounded to nearest even in fmt
void f32_to_half_row(HalfRowsPath p, HalfFormat fmt, bf16 *dst, const float *src, size_t n);
