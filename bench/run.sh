#!/usr/bin/env bash
# make bench: measured in one run on this machine, written as JSON to
# build/bench/results.json (one object) with the raw runs beside it.
#   - the OpenBLAS sgemm roof (GFLOP/s), the cpu device's practical peak;
#   - the CPU Adam (64M parameters) beside a STREAM triad and the scalar
#     loop: GB/s, parameters/s, ratios against the targets (adam/triad >= 0.80,
#     SIMD/scalar >= 5), in build/bench/cpu_adam.json;
#   - dp_baseline on gpt2-124m (micro-batch 4, seq 256) at 1 rank: tokens/s,
#     achieved model GFLOP/s and its fraction of the roof (target >= 0.5);
#   - dp_baseline on small at 1, 2, 4 ranks;
#   - every stage at 4 ranks on small: tokens/s relative to dp_baseline
#     (targets zero1 >= 0.95, zero2 >= 0.90, zero3 >= 0.80), peak device
#     memory per rank and bytes communicated per step;
#   - the aio module against fio (bench/aio.sh, its own build/bench/aio.json):
#     read and write GB/s over block sizes 128 KiB..8 MiB and queue depths
#     1..64 on a 1 GiB file in $AIO_DIR (default build/bench/aio-files; point
#     it at the disk stage 06 would use), the defaults it recommends;
#   - 3d_parallel on small at 8 ranks (oversubscribed on a small machine):
#     every (tp, pp) of the tested grids against dp_baseline at the same
#     ranks and global batch, device peak and each stage's states and
#     activations per rank, the pipeline bubble for m = 1, 2, 4, 8 beside
#     (P-1)/(m+P-1), in build/bench/3d.json (bench/3d.sh);
#   - where a GPU is usable, the cuda part (bench/cuda.sh), and the 3d runs
#     again on the GPU, its ranks sharing it through MPI (build/bench/3d_cuda.json).
# Stage runs are interleaved over several rounds and their steps pooled for
# the median, since this machine is shared and noisy.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=build/bench
mkdir -p "$out"
rm -f "$out"/*.json
rounds=${BENCH_ROUNDS:-5}

echo "bench: sgemm roof"
mpicc -O3 -march=native -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-pthread bench/sgemm_roof.c -o "$out/sgemm_roof" -lopenblas -lm
"$out/sgemm_roof" > "$out/sgemm.json"
cat "$out/sgemm.json"

echo "bench: cpu_adam, 64M parameters, beside a STREAM triad and the scalar loop"
bash bench/cpu_adam.sh --params 64M > "$out/cpu_adam.json"
cat "$out/cpu_adam.json"

echo "bench: cpu_offload with and without --dpu (small; gpt2-124m at micro-batch 1, seq 64)"
bash bench/offload.sh "$out" > "$out/offload.json"
cat "$out/offload.json"

echo "bench: dp_baseline gpt2-124m, micro-batch 4, seq 256, 1 rank"
./dp_baseline --model gpt2-124m --batch 4 --seq-len 256 --steps 4 --warmup 1 --eval-batches 1 --quiet \
    --json "$out/gpt2_124m.json"

echo "bench: dp_baseline small at 1, 2, 4 ranks"
for n in 1 2 4; do
    mpirun -np "$n" ./dp_baseline --model small --batch $((16 / n)) --steps 20 --quiet --json "$out/small_dp_scaling.json"
done

echo "bench: stages at 4 ranks on small ($rounds interleaved rounds)"
for r in $(seq "$rounds"); do
    for s in dp_baseline zero1 zero2 zero3; do
        mpirun -np 4 "./$s" --model small --batch 4 --steps 30 --quiet --json "$out/stages_$s.json"
    done
done

echo "bench: 3d_parallel on small at ${BENCH_3D_RANKS:-8} ranks, every grid against dp_baseline, the bubble for m = 1, 2, 4, 8"
bash bench/3d.sh "$out" cpu > "$out/3d.json"
cat "$out/3d.json"

python3 bench/summarize.py "$out" > "$out/results.json"
cat "$out/results.json"

# 49 points x read, write x ours, fio x 3 rounds of 1 GiB = 588 GiB moved:
# about 5 minutes at 2 GB/s, 10 at 1 GB/s (AIO_* in bench/aio.sh narrow it)
echo "bench: aio against fio (a few minutes: 588 GiB through the disk)"
bash bench/aio.sh "${AIO_DIR:-build/bench/aio-files}"

if ./dp_baseline --device cuda --model tiny --steps 1 --quiet > /dev/null 2>&1; then
    bash bench/cuda.sh
    echo "bench: 3d_parallel on the GPU, ${BENCH_3D_RANKS:-8} ranks sharing it through MPI"
    bash bench/3d.sh "$out" cuda > "$out/3d_cuda.json"
    cat "$out/3d_cuda.json"
else
    echo "bench: cuda part skipped: no usable GPU (make bench-cuda says why)"
fi
