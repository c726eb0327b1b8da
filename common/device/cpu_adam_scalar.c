// cpu_adam_scalar.c: the scalar CPU Adam path, adamw_element one element at
// a time. The Makefile builds this file with -fno-tree-loop-vectorize and
// -fno-tree-slp-vectorize, so that the benchmark's "scalar reference" runs
// scalar instructions (vfmadd...ss, vdivss, vsqrtss), not a loop the
// compiler vectorized on its own.
#include "cpu_adam_paths.h"

void cpu_adam_tile_scalar(float *master, float *m, float *v, const bf16 *grad, bf16 *param,
                          size_t n, const AdamWStep *s) {
    HalfFormat h = s->half;
    if (param) {
        for (size_t i = 0; i < n; i++)
            param[i] = f32_to_half(h, adamw_element(master + i, m + i, v + i, half_to_f32(h, grad[i]), s));
    } else {
        for (size_t i = 0; i < n; i++)
            adamw_element(master + i, m + i, v + i, half_to_f32(h, grad[i]), s);
    }
}
