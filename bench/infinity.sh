#!/usr/bin/env bash
# infinity.sh [NVME_DIR]: stage 06's two figures of issue 9, in interleaved
# rounds (BENCH_ROUNDS, default 3), with the swap files in NVME_DIR (a folder
# on a disk; default build/bench/aio-files):
#  1. the pipelined optimizer step (bench/swap_pipeline.c): a pass of
#     read + CPU Adam + write over SWAP_STATE_MB (default 1200) of fp32
#     master, m and v in sub-groups of 64 MB (infinity's default) against the
#     three parts alone; target pipelined <= 1.15 x the slowest part.
#  2. infinity on small at its defaults (2 ranks, 20 steps), the param shard
#     on the device and on NVMe: the file I/O time per step, the part of it
#     hidden behind compute or the CPU Adam (wall-clock intersection, from the
#     report) and the GB/s; target hidden >= 0.8 of the I/O time.
# One JSON object on stdout (bench/summarize_infinity.py).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
nvme=${1:-build/bench/aio-files}
out=${BENCH_OUT:-build/bench}
rounds=${BENCH_ROUNDS:-3}
mkdir -p "$out" "$nvme/swap"
make -s build/bench/swap_pipeline infinity >&2
rm -f "$out"/infinity_*.json
threads=$(nproc)
echo "infinity: pipelined optimizer step, ${SWAP_STATE_MB:-1200} MB of states, $rounds rounds" >&2
build/bench/swap_pipeline "$nvme/swap" "${SWAP_STATE_MB:-1200}" 64 1024 8 "$threads" "$rounds" \
    > "$out/infinity_pipeline.json"
for r in $(seq "$rounds"); do
    for params in none nvme; do
        echo "infinity: round $r of $rounds, small, --offload-params $params" >&2
        mpirun -np 2 ./infinity --model small --steps 20 --offload-params "$params" --nvme-path "$nvme" \
            --quiet --json "$out/infinity_small_$params.json.tmp" > /dev/null
        cat "$out/infinity_small_$params.json.tmp" >> "$out/infinity_small_$params.json"
        echo >> "$out/infinity_small_$params.json"
        rm -f "$out/infinity_small_$params.json.tmp"
    done
done
python3 bench/summarize_infinity.py "$out"
