#!/usr/bin/env bash
# offload.sh [OUT_DIR]: the offload stages' schedules, in interleaved rounds
# (BENCH_ROUNDS, default 3), per stage and mode: the step time, compute, the
# transfer (the copies between tiers) and the part of it hidden behind
# compute, the host optimizer and its hidden part (wall-clock
# intersections, from the report), and the two step times the transfer
# could give: compute + transfer (every copy waited for) and
# max(compute, transfer) (every copy beside compute).
#   cpu_offload          the pipelined CPU Adam, after the global norm
#   cpu_offload_eager    --grad-clip 0: sub-groups as their gradients arrive
#   cpu_offload_dpu      --dpu --dpu-warmup 1: the one-step delayed update
#   infinity_sync        every tier on the host, --prefetch 0: the synchronous block swap
#   infinity_prefetch    every tier on the host, --prefetch 1: the prefetched one
# On the cpu device (OFFLOAD_DEVICE=cpu, the default), 1 rank: small (batch
# 4) and gpt2-124m (batch 1, seq 64). OFFLOAD_DEVICE=cuda runs issue 35's
# shapes on the GPU instead: gpt2-124m B16 T1024 for cpu_offload beside
# dp_baseline (tokens/s), gpt2-350m B1 T1024 for infinity.
# One JSON object on stdout: bench/summarize_offload.py folds the runs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=${1:-build/bench}
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-3}
device=${OFFLOAD_DEVICE:-cpu}
rm -f "$out"/offload_*.json
host="--offload-params cpu --offload-optimizer cpu"
# model tag, its flags for cpu_offload, and for infinity
if [ "$device" = cuda ]; then
    gpt2_124m="--model gpt2-124m --batch 16 --seq-len 1024 --steps 12"
    gpt2_350m="--model gpt2-350m --batch 1 --seq-len 1024 --steps 8"
    models=("gpt2|$gpt2_124m|$gpt2_350m")
else
    small="--model small --batch 4 --steps 20"
    gpt2_124m="--model gpt2-124m --batch 1 --seq-len 64 --steps 8"
    models=("small|$small|$small" "gpt2_124m|$gpt2_124m|$gpt2_124m")
fi
# one run: its record appended to offload_MODEL_MODE.json
run() {
    local model=$1 mode=$2
    shift 2
    "$@" --device "$device" --eval-batches 1 --quiet --json "$out/offload_${model}_${mode}.json" >/dev/null
}
for r in $(seq "$rounds"); do
    for m in "${models[@]}"; do
        IFS='|' read -r model offload infinity <<< "$m"
        echo "offload: round $r of $rounds, $model" >&2
        [ "$device" = cuda ] && run "$model" dp_baseline ./dp_baseline $offload
        run "$model" cpu_offload ./cpu_offload $offload
        run "$model" cpu_offload_eager ./cpu_offload $offload --grad-clip 0
        run "$model" cpu_offload_dpu ./cpu_offload $offload --dpu --dpu-warmup 1
        run "$model" infinity_sync ./infinity $infinity $host --prefetch 0
        run "$model" infinity_prefetch ./infinity $infinity $host --prefetch 1
    done
done
python3 bench/summarize_offload.py "$out" "$device"
