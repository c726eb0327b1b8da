// device_backends.h: the constructors device_init dispatches to (device.c).
// Each fills the backend part of a Device: name, threads, act_bytes, peak,
// ops, kernels, impl, and the device-tier budget.
#pragma once
#include "device.h"

void device_cpu_init(Device *d, const DeviceOptions *opt);
#ifdef WB_HAVE_CUDA
void device_cuda_init(Device *d, const DeviceOptions *opt);  // device_cuda.cu
int device_cuda_count(void);  // GPUs visible to this process (0 when none or no driver)
#endif
