#!/usr/bin/env bash
# net.sh: communication that costs something. On the emulated cluster of
# scripts/cluster.sh (2 hosts, 2 ranks each, links shaped with tc) at each
# rate of NET_RATES (default "10mbit 200mbit"):
#   - bench/net_probe: point-to-point and all-reduce algbw/busbw (nccl-tests'
#     definitions) against the link's configured rate;
#   - dp_baseline, zero1, zero2 and zero3 on small (4 ranks, batch 2), in
#     interleaved rounds (NET_ROUNDS, default 2): the step and the time in
#     communication; zero3's over zero2's, which the bytes put at 1.5;
#   - memory_math's planner beside them: each run predicted from a rank's
#     compute rate measured by a one-host dp_baseline run just before it (its
#     compute time; the calibration) and a link: its configured rate (the
#     ring formulas as they stand), and the busbw the probe measured for the
#     collectives the stage calls at about their sizes (the ring formulas on
#     the bandwidth Open MPI's algorithms reach); latency: the probe's 8-byte
#     ping-pong. Each with the command that printed it.
# One JSON object on stdout; where the cluster cannot be made (not root, no
# namespaces, one already up) {"skipped": why}.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=build/bench/net
rm -rf "$out"
mkdir -p "$out"
rates=${NET_RATES:-10mbit 200mbit}
rounds=${NET_ROUNDS:-2}
stages=(dp_baseline zero1 zero2 zero3)
run_flags=(--model small --batch 2 --steps 5 --eval-batches 1 --quiet)
make --no-print-directory build/bench/net_probe >&2

skip() { python3 -c 'import json,sys; print(json.dumps({"skipped": sys.argv[1]}))' "$1"; exit 0; }
if ! status=$(scripts/cluster.sh status) || [[ $status != *"no cluster is up"* ]]; then
    skip "a cluster is already up on this machine (scripts/cluster.sh status); left alone"
fi
trap 'scripts/cluster.sh down >&2' EXIT
for rate in $rates; do
    if ! why=$(scripts/cluster.sh up 2 --link "$rate" --slots 2 2>&1); then
        trap - EXIT
        skip "${why#cluster: error: }"
    fi
    echo "$why" >&2
    gbit=$(awk -v r="$rate" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1)
        print n * ((u == "kbit") ? 1e-6 : (u == "mbit") ? 1e-3 : (u == "gbit") ? 1 : (u == "tbit") ? 1e3 : 1e-9) }')
    scripts/cluster.sh run -- mpirun -np 4 build/bench/net_probe --max-mb 1.1 --reps 5 --link-gbit "$gbit" \
        > "$out/probe_$rate.json"
    for r in $(seq "$rounds"); do
        for s in "${stages[@]}"; do
            # the calibration, a rank's compute rate, from a one-host run just
            # before each measured run: on a shared machine the rate moves
            # (6 to 13 GFLOP/s between runs here), so each run is predicted
            # from the rate of the moment it ran in
            mpirun -np 4 ./dp_baseline "${run_flags[@]}" --json "$out/calibration_${s}_$rate.json" >&2
            scripts/cluster.sh run -- mpirun -np 4 ./$s "${run_flags[@]}" --json "$out/${s}_$rate.json" >&2
        done
    done
    scripts/cluster.sh down >&2
done
trap - EXIT
python3 - "$out" "$rounds" $rates <<'PY'
import json, statistics, subprocess, sys
from pathlib import Path
out, rounds, rates = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
STAGES = ("dp_baseline", "zero1", "zero2", "zero3")
def records(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
# a rank's compute rate: model FLOPs of its tokens over its compute time, one host
def gflops_of(r):
    return r["flops_per_token"] * r["global_batch_tokens"] / r["ranks"] / (r["times_ms_per_step"]["compute"] * 1e-3) / 1e9
result = {"what": "2 emulated hosts x 2 ranks (scripts/cluster.sh), links shaped with tc tbf; dp_baseline, zero1, "
                  "zero2, zero3 on small, batch 2, interleaved rounds; memory_math's planner beside them, each run "
                  "predicted from the compute rate of a one-host calibration run just before it",
          "rounds": rounds,
          "gflops_from": "one-host dp_baseline runs: flops_per_token x tokens per rank / compute ms", "links": {}}
def planner(gbps, latency_us, gflops):
    cmd = ["./memory_math", "--model", "small", "--ranks", "4", "--batch", "2", "--link-gbps", f"{gbps:.4g}",
           "--latency-us", f"{latency_us:.1f}", "--gflops", f"{gflops:.2f}", "--json"]
    plan = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["step_time"]
    return " ".join(cmd[:-1]), {row["stage"]: row for row in plan["stages"]}
def spread(fig, key, rows):
    fig[key] = statistics.median(rows)
    fig[key + "_min"], fig[key + "_max"] = min(rows), max(rows)
for rate in rates:
    probe = json.loads((out / f"probe_{rate}.json").read_text())
    link_gbps = probe["link_GBps"] * 8
    latency_us = probe["latency_us"]
    fig = {"link_GBps": probe["link_GBps"],
           "p2p_busbw_GBps": probe["p2p"][-1]["busbw_GBps"], "p2p_bytes": probe["p2p"][-1]["bytes"],
           "latency_us": latency_us,
           "allreduce_busbw_GBps": probe["all_reduce"][-1]["busbw_GBps"],
           "allreduce_bytes": probe["all_reduce"][-1]["bytes"], "probe": probe}
    # the busbw (GB/s) of a probed collective at the size nearest the stage's messages
    def busbw(kind, size):
        return min(probe[kind], key=lambda row: abs(row["bytes"] - size))["busbw_GBps"]
    def harmonic(*parts):  # (bytes share, GB/s): the rate of moving them one after the other
        return sum(w for w, _ in parts) / sum(w / b for w, b in parts)
    MB = 1 << 20
    stage_busbw = {
        "dp_baseline": busbw("all_reduce", MB),                                  # one all-reduce of 2Ψ
        "zero1": harmonic((1, busbw("reduce_scatter", MB)), (1, busbw("all_gather", MB))),
        "zero2": harmonic((1, busbw("ireduce_scatter", MB // 4)), (1, busbw("iall_gather", MB))),  # buckets, then all
        "zero3": harmonic((1, busbw("ireduce_scatter", MB // 4)), (2, busbw("iall_gather", MB // 4))),  # units
    }
    for s in STAGES:
        runs = records(out / f"{s}_{rate}.json")
        cals = records(out / f"calibration_{s}_{rate}.json")
        assert len(runs) == len(cals) == rounds, (s, rate, len(runs), len(cals))
        t = [r["times_ms_per_step"] for r in runs]
        spread(fig, f"{s}_step_ms", [r["step_ms_median"] for r in runs])
        spread(fig, f"{s}_comm_ms", [x["comm"] for x in t])
        spread(fig, f"{s}_comm_exposed_ms", [x["comm_exposed"] for x in t])
        spread(fig, f"{s}_comm_hidden_ms", [x["comm_hidden"] for x in t])
        fig[f"{s}_comm_bytes_per_step"] = runs[0]["comm_bytes_per_step"]
        fig[f"{s}_probe_busbw_GBps"] = stage_busbw[s]
        # each run against the prediction from its own calibration
        rows = {"at_rate": [], "probe": []}
        for run, cal in zip(runs, cals):
            gflops = gflops_of(cal)
            for key, gbps in (("at_rate", link_gbps), ("probe", stage_busbw[s] * 8)):
                cmd, plan = planner(gbps, latency_us, gflops)
                rows[key].append((plan[s]["step_serial_ms"], plan[s]["comm_ms"], run["step_ms_median"], cmd, gflops))
        spread(fig, f"{s}_gflops_per_rank", [r[4] for r in rows["at_rate"]])
        spread(fig, f"{s}_predicted_step_ms", [r[0] for r in rows["at_rate"]])
        spread(fig, f"{s}_predicted_comm_ms", [r[1] for r in rows["at_rate"]])
        spread(fig, f"{s}_measured_over_predicted", [r[2] / r[0] for r in rows["at_rate"]])
        spread(fig, f"{s}_predicted_step_ms_probe", [r[0] for r in rows["probe"]])
        spread(fig, f"{s}_measured_over_predicted_probe", [r[2] / r[0] for r in rows["probe"]])
        fig[f"{s}_planner_commands"] = [r[3] for r in rows["at_rate"]]
        fig[f"{s}_planner_commands_probe"] = [r[3] for r in rows["probe"]]
    fig["zero3_over_zero2_comm_time"] = fig["zero3_comm_ms"] / fig["zero2_comm_ms"]
    fig["zero3_over_zero2_bytes"] = fig["zero3_comm_bytes_per_step"] / fig["zero2_comm_bytes_per_step"]
    fig["formula_ratio"] = 1.5
    result["links"][rate] = fig
    print(f"{rate}: {fig['dp_baseline_planner_commands'][0]}  (dp_baseline's first run: at the link's rate; each run "
          f"is planned with its own calibration's --gflops, and with the probe's busbw as --link-gbps 8 x busbw; "
          f"every command in build/bench/net.json)", file=sys.stderr)
    print(f"  {'stage':12} {'measured ms':>12} {'GFLOP/s':>8} {'ring at rate':>13} {'measured/ring':>14} "
          f"{'busbw GB/s':>11} {'ring at busbw':>14} {'measured/that (min-max)':>24}", file=sys.stderr)
    for s in STAGES:
        print(f"  {s:12} {fig[s + '_step_ms']:12.1f} {fig[s + '_gflops_per_rank']:8.2f} "
              f"{fig[s + '_predicted_step_ms']:13.1f} {fig[s + '_measured_over_predicted']:14.2f} "
              f"{fig[s + '_probe_busbw_GBps']:11.5f} {fig[s + '_predicted_step_ms_probe']:14.1f} "
              f"{fig[s + '_measured_over_predicted_probe']:10.2f} ({fig[s + '_measured_over_predicted_probe_min']:.2f}-"
              f"{fig[s + '_measured_over_predicted_probe_max']:.2f})", file=sys.stderr)
print(json.dumps(result, indent=1))
PY
