#!/usr/bin/env bash
# progress.sh: zero2 at 4 ranks on small with small buckets (--bucket-mb
# 0.1), with and without --progress-thread 50, in interleaved rounds: does a
# thread that drives MPI's progress make the overlap real on this machine?
# Step time, exposed communication and time overlapped with compute (both
# wall-clock, from the report). One JSON object on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=build/bench/progress
rm -rf "$out"
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-5}
for r in $(seq "$rounds"); do
    for p in 0 50; do
        mpirun -np 4 ./zero2 --model small --batch 2 --steps 20 --bucket-mb 0.1 --progress-thread "$p" --quiet \
            --json "$out/progress_$p.json" >&2
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
result = {"what": "zero2, 4 ranks, small, --bucket-mb 0.1: without and with --progress-thread 50 (cpu device)"}
for p, name in ((0, "no_thread"), (50, "progress_thread_50us")):
    runs = [json.loads(l) for l in (out / f"progress_{p}.json").read_text().splitlines() if l.strip()]
    fig = {}
    for key, rows in (("step_ms", [r["times_ms_per_step"]["step"] for r in runs]),
                      ("exposed_comm_ms", [r["times_ms_per_step"]["comm_exposed"] for r in runs]),
                      ("overlapped_ms", [r["times_ms_per_step"]["comm_hidden"] for r in runs]),
                      ("tokens_per_s", [r["tokens_per_s"] for r in runs])):
        fig[key], fig[key + "_min"], fig[key + "_max"] = statistics.median(rows), min(rows), max(rows)
    fig["rounds"] = len(runs)
    result[name] = fig
result["speedup_with_thread"] = result["progress_thread_50us"]["tokens_per_s"] / result["no_thread"]["tokens_per_s"]
print(json.dumps(result, indent=1))
PY
