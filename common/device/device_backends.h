// device_backends.h: the constructors device_init dispatches to (device.c).
// Each fills the backend part of a Device: name, threads, act_bytes, peak,
// ops, kernels, impl, and the device-tier budget.
#pragma once
#include "device.h"

void device_cpu_init(Device *d, const DeviceOptions *opt);
#ifdef WB_HAVE_CUDA
void device_cuda_init(Device *d, const DeviceOptions *opt);  // device_cuda.cu
// GPUs visible to this process. When there are none, `why` (may be NULL) says
// why in a few words, and the result is -1 where a GPU driver is installed
// but unusable (too old for this binary, or failing): worth a warning.
int device_cuda_count(char *why, size_t why_bytes);
#endif
