#!/usr/bin/env bash
# 3d.sh [OUT_DIR] [cpu|cuda]: stage 07 on small at 8 ranks (BENCH_3D_RANKS),
# in interleaved rounds (BENCH_ROUNDS, default 3):
#   - dp_baseline and 3d_parallel on every (tp, pp) of the tested grids,
#     (2,1) (1,2) (1,4) (2,2), and (1,1) (ZeRO-1 alone), dp = ranks/(tp·pp),
#     all at the same global batch (BENCH_3D_GLOBAL sequences of micro-batch
#     2): tokens/s relative to dp_baseline, device peak per rank, each
#     pipeline stage's model states and activations, the bubble;
#   - the bubble of tp 1 x pp 4 for m = 1, 2, 4, 8 micro-batches, 1F1B and
#     AFAB, measured from the timeline beside (P-1)/(m+P-1);
#   - the schedules past 1F1B: interleaved (v = 2) and zb-h1 beside 1f1b at
#     pp 2 and 4, m = 4 and 8 (dp = ranks/pp), on small with 8 layers (4
#     stages of 2 chunks): the bubble measured beside its formula, each
#     stage's device peak beside the formula's timeline, tokens/s relative
#     to 1f1b, each round's bubble and their spread (the noise), and
#     whether interleaved's is below 1f1b's and zb-h1's below interleaved's;
#     the same again with one pipeline alone (ranks = pp, dp 1), the fewest
#     ranks per core;
#   - context parallelism (--cp 1, 2, 4, Ulysses and ring attention) at
#     sequences of BENCH_3D_CP_SEQ tokens (default 1024), micro-batch 1,
#     the same global batch (BENCH_3D_CP_GLOBAL sequences, default 16):
#     tokens/s relative to cp 1, activations per rank and the cp group's
#     bytes per step (all-to-alls, or the ring's sends and receives), each
#     beside its formula, and the ring's causal work per rank with and
#     without the zigzag (formula).
# On the cpu device the 8 ranks share this machine's cores (oversubscribed):
# a rank waiting for its neighbour yields its core to one that computes, so
# the figures say how the schedules behave there, not on 8 devices. With
# `cuda` the same runs use the one GPU, the ranks sharing it through MPI.
# One JSON object on stdout: bench/summarize_3d.py folds the runs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=${1:-build/bench}
device=${2:-cpu}
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-3}
np=${BENCH_3D_RANKS:-8}
global=${BENCH_3D_GLOBAL:-32}
steps=${BENCH_3D_STEPS:-12}
batch=2
tag="3d_$device"
rm -f "$out/${tag}"_*.json
common="--model small --batch $batch --steps $steps --warmup 1 --eval-batches 1 --device $device --quiet"
cp_seq=${BENCH_3D_CP_SEQ:-1024}
cp_global=${BENCH_3D_CP_GLOBAL:-16}
cp_common="--model small --seq-len $cp_seq --batch 1 --steps $steps --warmup 1 --eval-batches 1 --device $device --quiet"
for r in $(seq "$rounds"); do
    mpirun -np "$np" ./dp_baseline $common --global-batch "$global" --json "$out/${tag}_dp_baseline.json" >/dev/null
    for g in "1 1" "2 1" "1 2" "1 4" "2 2"; do
        set -- $g
        mpirun -np "$np" ./3d_parallel $common --tp "$1" --pp "$2" --global-batch "$global" \
            --json "$out/${tag}_grids.json" >/dev/null
    done
    for m in 1 2 4 8; do
        for schedule in 1f1b afab; do
            mpirun -np "$np" ./3d_parallel $common --pp 4 --grad-accum "$m" --schedule "$schedule" \
                --json "$out/${tag}_bubble.json" >/dev/null
        done
    done
    for P in 2 4; do
        for m in 4 8; do
            for schedule in 1f1b "interleaved --virtual-stages 2" zb-h1; do
                mpirun -np "$np" ./3d_parallel $common --layers 8 --pp "$P" --grad-accum "$m" --schedule $schedule \
                    --json "$out/${tag}_schedules.json" >/dev/null
                mpirun -np "$P" ./3d_parallel $common --layers 8 --pp "$P" --grad-accum "$m" --schedule $schedule \
                    --json "$out/${tag}_schedules_one.json" >/dev/null
            done
        done
    done
    mpirun -np "$np" ./3d_parallel $cp_common --cp 1 --global-batch "$cp_global" --json "$out/${tag}_cp.json" >/dev/null
    for c in 2 4; do
        for mode in ulysses ring; do
            mpirun -np "$np" ./3d_parallel $cp_common --cp "$c" --cp-mode "$mode" --global-batch "$cp_global" \
                --json "$out/${tag}_cp.json" >/dev/null
        done
    done
done
python3 bench/summarize_3d.py "$out" "$tag" "$np" "$(nproc)"
