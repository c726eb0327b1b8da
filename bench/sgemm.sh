#!/usr/bin/env bash
# sgemm.sh: the OpenBLAS sgemm roof (GFLOP/s over a few GEMM shapes), the
# cpu device's practical peak; one JSON object on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build/bench
blas_inc=$(ls -d /usr/include/*/openblas-pthread /usr/include/openblas 2>/dev/null | head -1 || true)
# with the trainers' choice of OpenBLAS kernels (common/device/cpu/blas_core.c)
# (and its one-line refusals: check.c, with stop.c's clean-up that check.c calls)
mpicc -O3 -march=native -fopenmp ${blas_inc:+-I$blas_inc} -Icommon/device/cpu -Icommon/runtime bench/sgemm_roof.c \
    common/device/cpu/blas_core.c common/runtime/check.c common/runtime/stop.c -o build/bench/sgemm_roof -lopenblas -lm >&2
build/bench/sgemm_roof
