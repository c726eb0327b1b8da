#!/usr/bin/env bash
# net.sh: communication that costs something. On the emulated cluster of
# scripts/cluster.sh (2 hosts, 2 ranks each, links shaped with tc) at each
# rate of NET_RATES (default "10mbit 200mbit"):
#   - bench/net_probe: point-to-point and all-reduce algbw/busbw (nccl-tests'
#     definitions) against the link's configured rate;
#   - zero2 against zero3 on small (4 ranks, batch 2), in interleaved rounds
#     (NET_ROUNDS, default 3): the time in communication per step, whose
#     ratio the formulas put at 3Ψ / 2Ψ = 1.5.
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
rounds=${NET_ROUNDS:-3}
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
    scripts/cluster.sh run -- mpirun -np 4 build/bench/net_probe --max-mb 2 --reps 5 --link-gbit "$gbit" \
        > "$out/probe_$rate.json"
    for r in $(seq "$rounds"); do
        for s in zero2 zero3; do
            scripts/cluster.sh run -- mpirun -np 4 ./$s --model small --batch 2 --steps 6 --eval-batches 1 --quiet \
                --json "$out/${s}_$rate.json" >&2
        done
    done
    scripts/cluster.sh down >&2
done
trap - EXIT
python3 - "$out" "$rounds" $rates <<'PY'
import json, statistics, sys
from pathlib import Path
out, rounds, rates = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
result = {"what": "2 emulated hosts x 2 ranks (scripts/cluster.sh), links shaped with tc tbf; "
                  "zero2 vs zero3 on small, batch 2, interleaved rounds",
          "rounds": rounds, "links": {}}
for rate in rates:
    probe = json.loads((out / f"probe_{rate}.json").read_text())
    fig = {"link_GBps": probe.get("link_GBps"),
           "p2p_busbw_GBps": probe["p2p"][-1]["busbw_GBps"], "p2p_bytes": probe["p2p"][-1]["bytes"],
           "p2p_latency_us": probe["p2p"][0]["time_us"],
           "allreduce_busbw_GBps": probe["all_reduce"][-1]["busbw_GBps"],
           "allreduce_bytes": probe["all_reduce"][-1]["bytes"], "probe": probe}
    for s in ("zero2", "zero3"):
        runs = [json.loads(l) for l in (out / f"{s}_{rate}.json").read_text().splitlines() if l.strip()]
        t = [r["times_ms_per_step"] for r in runs]
        for key, rows in (("step_ms", [x["step"] for x in t]), ("comm_ms", [x["comm"] for x in t]),
                          ("comm_exposed_ms", [x["comm_exposed"] for x in t]),
                          ("comm_hidden_ms", [x["comm_hidden"] for x in t])):
            fig[f"{s}_{key}"] = statistics.median(rows)
            fig[f"{s}_{key}_min"], fig[f"{s}_{key}_max"] = min(rows), max(rows)
        fig[f"{s}_comm_bytes_per_step"] = runs[0]["comm_bytes_per_step"]
    fig["zero3_over_zero2_comm_time"] = fig["zero3_comm_ms"] / fig["zero2_comm_ms"]
    fig["zero3_over_zero2_bytes"] = fig["zero3_comm_bytes_per_step"] / fig["zero2_comm_bytes_per_step"]
    fig["formula_ratio"] = 1.5
    result["links"][rate] = fig
print(json.dumps(result, indent=1))
PY
