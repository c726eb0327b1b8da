#!/usr/bin/env bash
# training.sh SGEMM_JSON: the trainers on the cpu device, in one run:
#   - dp_baseline on gpt2-124m (micro-batch 4, seq 256) at 1 rank: tokens/s,
#     achieved model GFLOP/s and its fraction of the sgemm roof (target 0.5);
#   - dp_baseline on small at 1, 2, 4 ranks;
#   - every stage at 4 ranks on small, BENCH_ROUNDS interleaved rounds:
#     tokens/s relative to dp_baseline (targets zero1 >= 0.95, zero2 >= 0.90,
#     zero3 >= 0.80), peak device memory per rank, bytes per step.
# One JSON object on stdout (bench/summarize.py folds the runs).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=build/bench/training
rm -rf "$out"
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-5}

echo "training: dp_baseline gpt2-124m, micro-batch 4, seq 256, 1 rank" >&2
./dp_baseline --model gpt2-124m --batch 4 --seq-len 256 --steps 4 --warmup 1 --eval-batches 1 --quiet \
    --json "$out/gpt2_124m.json" >&2

echo "training: dp_baseline small at 1, 2, 4 ranks" >&2
for n in 1 2 4; do
    mpirun -np "$n" ./dp_baseline --model small --batch $((16 / n)) --steps 20 --quiet \
        --json "$out/small_dp_scaling.json" >&2
done

stages="dp_baseline zero1 zero2 zero3 cpu_offload"
echo "training: $stages at 4 ranks on small ($rounds interleaved rounds)" >&2
for r in $(seq "$rounds"); do
    for s in $stages; do
        mpirun -np 4 "./$s" --model small --batch 4 --steps 30 --quiet --json "$out/stages_$s.json" >&2
    done
done
python3 bench/summarize.py "$out" "$1"
