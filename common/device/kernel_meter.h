// kernel_meter.h: a kernel table that counts what runs through it. Between
// kernel_meter_begin and _end the device's kernels are a copy of its table
// whose entries count each call, the FLOPs of its matmuls and attention, and
// the tensors it writes, then call the real kernel: the work of a piece of
// code measured by what it asked the device to do, not by the clock. The
// model meters its recomputation with it (gpt.c, the lab 04 checks).
#pragma once
#include "kernels.h"

#define KERNEL_METER_WRITES 32

typedef struct KernelMeter {
    KernelOps ops;              // first: the device's k points here while metering
    const KernelOps *inner;     // the real table
    long kernels;               // calls, forward and backward kernels alike
    double flops;               // 2·M·N·K per matmul; 4·B·T²·C per attention forward (act_math.c's count)
    const void *writes[KERNEL_METER_WRITES];  // the tensors the calls wrote, in order (the first ones)
    int num_writes;
} KernelMeter;

// From here on d's kernels go through m (whose counts start at zero).
void kernel_meter_begin(KernelMeter *m, Device *d);
// d's own table again.
void kernel_meter_end(KernelMeter *m, Device *d);
