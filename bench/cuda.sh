#!/usr/bin/env bash
# make bench-cuda (make bench runs it too where a GPU is usable): the cuda
# device, measured in one run, as JSON in build/bench/cuda_results.json.
#   - dp_baseline on gpt2-124m, micro-batch 16, seq 1024, 1 rank: tokens/s
#     and MFU against the GPU's dense bf16 peak (target >= 0.40);
#   - every stage on gpt2-124m (micro-batch 4, seq 1024) at 1 rank (NCCL) and
#     at 2 and 4 ranks sharing the GPU (MPI path, pinned staging): tokens/s,
#     per-rank model-state bytes measured and by formula, peak device bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
out=build/bench
mkdir -p "$out"
rm -f "$out"/cuda_*.json
if ! ./dp_baseline --device cuda --model tiny --steps 1 --quiet > /dev/null 2> "$out/cuda_probe.txt"; then
    echo "bench-cuda: no usable GPU: $(grep -m1 error "$out/cuda_probe.txt" || cat "$out/cuda_probe.txt")" >&2
    exit 2
fi

echo "bench-cuda: dp_baseline gpt2-124m, micro-batch 16, seq 1024, 1 rank"
./dp_baseline --device cuda --model gpt2-124m --batch 16 --seq-len 1024 --steps 20 --warmup 2 \
    --eval-batches 1 --quiet --json "$out/cuda_gpt2_124m.json"

for n in 1 2 4; do
    for s in dp_baseline zero1 zero2 zero3; do
        echo "bench-cuda: $s gpt2-124m, micro-batch 4, seq 1024, $n rank(s) on one GPU"
        mpirun -np "$n" "./$s" --device cuda --model gpt2-124m --batch 4 --seq-len 1024 --steps 10 \
            --warmup 2 --eval-batches 1 --quiet --json "$out/cuda_stages.json"
    done
done

python3 bench/summarize_cuda.py "$out" > "$out/cuda_results.json"
cat "$out/cuda_results.json"
