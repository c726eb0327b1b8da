#!/usr/bin/env bash
# zeropp.sh [OUT_DIR]: what zero3's ZeRO++ switches (Wang et al. 2023) cost in
# accuracy beside what they save on the link, zero3 against each mode:
# qwZ, hpZ (K = 2), qgZ (int8 and int4) and all three, 4 ranks.
#   curves: small at batch 2 for ZPP_STEPS steps (default 200) per mode, on
#     the emulated cluster (scripts/cluster.sh: 2 hosts of 2 ranks, a fast
#     link, root needed) where it can be made, else on one host (then the
#     bytes across hosts are memory_math's formula for 2 hosts of 2, which
#     zero3 counts equal on the cluster: test_cluster); the final loss
#     difference beside the bytes per step; scripts/plot_runs.py draws the
#     curves ($out/curves_losses.png, $out/curves_hosts.png);
#   timing (the cluster only): a link shaped to ZPP_RATE (default 50mbit),
#     net_probe's bandwidth and latency, then ZPP_ROUNDS (default 2)
#     interleaved rounds of every mode, ZPP_TIMING_STEPS steps (default 6):
#     the time in communication per step and the step, each run beside
#     memory_math's planner (--ranks-per-host 2 and the mode's switches) with
#     --gflops from a one-host run of the same mode just before it, at the
#     link's rate and at the busbw the probe measured for the nonblocking
#     all-gather and reduce-scatter at the sizes zero3 sends (the median of
#     their busbw from 64 KB to 1 MB).
# One JSON object on stdout (bench/summarize_zeropp.py); the machine is shared,
# so the times carry their spread.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=${1:-build/bench}/zeropp
rm -rf "$out"
mkdir -p "$out"
steps=${ZPP_STEPS:-200}
rate=${ZPP_RATE:-50mbit}
rounds=${ZPP_ROUNDS:-2}
timing_steps=${ZPP_TIMING_STEPS:-6}
tags=(zero3 qwZ hpZ qgZ8 qgZ4 all)
switches=("" "--quantize-weights" "--hpz-size 2" "--quantize-grads" "--quantize-grads --grad-quant-bits 4"
          "--quantize-weights --hpz-size 2 --quantize-grads")
run_flags=(--model small --batch 2 --quiet)
make --no-print-directory build/bench/net_probe >&2

cluster=0 why=""
if ! status=$(scripts/cluster.sh status 2>&1) || [[ $status != *"no cluster is up"* ]]; then
    why="a cluster is already up on this machine (scripts/cluster.sh status); left alone"
elif why=$(scripts/cluster.sh up 2 --link 10gbit --slots 2 2>&1); then
    cluster=1
    trap 'scripts/cluster.sh down >&2' EXIT
fi
if [ $cluster = 1 ]; then echo "zeropp: curves on 2 emulated hosts" >&2; else echo "zeropp: curves on one host ($why)" >&2; fi

# the curves: every mode for $steps steps
for i in "${!tags[@]}"; do
    cmd=(mpirun -np 4 ./zero3 "${run_flags[@]}" --steps "$steps" ${switches[$i]} --json "$out/curves.json")
    [ $cluster = 1 ] && cmd=(scripts/cluster.sh run -- "${cmd[@]}")
    "${cmd[@]}" >&2
done
python3 scripts/plot_runs.py "$out/curves.json" "$out/curves" >&2 || echo "zeropp: no pictures" >&2

# the timing on a shaped link
if [ $cluster = 1 ]; then
    scripts/cluster.sh down >&2
    scripts/cluster.sh up 2 --link "$rate" --slots 2 >&2
    gbit=$(awk -v r="$rate" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1)
        print n * ((u == "kbit") ? 1e-6 : (u == "mbit") ? 1e-3 : (u == "gbit") ? 1 : (u == "tbit") ? 1e3 : 1e-9) }')
    scripts/cluster.sh run -- mpirun -np 4 build/bench/net_probe --max-mb 1.1 --reps 9 --link-gbit "$gbit" \
        > "$out/probe.json"
    for r in $(seq "$rounds"); do
        for i in "${!tags[@]}"; do
            # the compute rate of the moment, from a one-host run of the same mode
            mpirun -np 4 ./zero3 "${run_flags[@]}" --steps "$timing_steps" --eval-batches 1 ${switches[$i]} \
                --json "$out/calibration_${tags[$i]}.json" >&2
            scripts/cluster.sh run -- mpirun -np 4 ./zero3 "${run_flags[@]}" --steps "$timing_steps" --eval-batches 1 \
                ${switches[$i]} --json "$out/timing_${tags[$i]}.json" >&2
        done
    done
    trap - EXIT
    scripts/cluster.sh down >&2
fi
python3 bench/summarize_zeropp.py "$out" "$cluster" "$rate" "$rounds" "$why"
