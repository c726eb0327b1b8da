#!/usr/bin/env bash
# offload.sh [OUT_DIR]: cpu_offload with and without --dpu, in interleaved
# rounds, on small (1 rank, micro-batch 4) and gpt2-124m (1 rank,
# micro-batch 1, seq 64): step time, the CPU Adam's time and the part of it
# hidden behind compute (the wall-clock intersection the report measures).
# One JSON object on stdout: bench/summarize_offload.py folds the runs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=${1:-build/bench}
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-3}
rm -f "$out"/offload_*.json
# warm-up 1: every step after the first is delayed, so the mean hidden
# fraction is the delayed update's (the first, ordinary step counts as 0)
for r in $(seq "$rounds"); do
    for dpu in "" "--dpu --dpu-warmup 1"; do
        tag=$([ -n "$dpu" ] && echo dpu || echo plain)
        ./cpu_offload --model small --batch 4 --steps 20 $dpu --quiet --json "$out/offload_small_$tag.json" >/dev/null
        ./cpu_offload --model gpt2-124m --batch 1 --seq-len 64 --steps 8 --eval-batches 1 $dpu --quiet \
            --json "$out/offload_gpt2_124m_$tag.json" >/dev/null
    done
done
python3 bench/summarize_offload.py "$out"
