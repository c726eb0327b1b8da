#!/usr/bin/env bash
# recompute.sh [OUT_DIR]: what activation recomputation costs, in
# interleaved rounds: dp_baseline on gpt2-124m (1 rank, micro-batch 4,
# seq 256) with --recompute none, selective, full and full with
# --offload-activations: tokens/s beside the FLOP formula's prediction
# (tokens/s x model FLOPs / hardware FLOPs, the time a step takes growing
# with the FLOPs it runs), and the activation bytes each keeps, measured.
# One JSON object on stdout: bench/summarize_recompute.py folds the runs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
out=${1:-build/bench}
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-3}
rm -f "$out"/recompute_*.json
modes=("none" "selective" "full" "full --offload-activations")
tags=("none" "selective" "full" "offload")
for r in $(seq "$rounds"); do
    for i in "${!modes[@]}"; do
        ./dp_baseline --model gpt2-124m --batch 4 --seq-len 256 --steps 3 --warmup 1 --eval-batches 1 \
            --recompute ${modes[$i]} --quiet --json "$out/recompute_${tags[$i]}.json" >/dev/null
    done
done
python3 bench/summarize_recompute.py "$out"
