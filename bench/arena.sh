#!/usr/bin/env bash
# arena.sh: what the device arena costs (issue 46). Every device buffer is a
# block of one region placed by common/runtime/arena.c, and without
# --contiguous-buffers each unit's activations and gradients are taken and
# given back as the step goes. dp_baseline gpt2-124m (B 4, T 256, 1 rank)
# and zero3 small (2 ranks), each as it allocates by default and with
# --contiguous-buffers (every buffer carved once), in interleaved rounds
# (BENCH_ROUNDS, default 3); with ARENA_BASE=DIR, the same runs of the
# trainers in DIR too (a build of a commit before the arena), the first
# configuration only, as it has no --contiguous-buffers. tokens/s, median
# and range; the ratios to the default. One JSON object on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=build/bench/arena
rm -rf "$out"
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-3}
base=${ARENA_BASE:-}
if [ -n "$base" ] && [ ! -x "$base/dp_baseline" ]; then
    echo "arena.sh: ARENA_BASE=$base holds no dp_baseline; give the folder of an earlier build's trainers" >&2
    exit 2
fi
runs=("dp|1|dp_baseline --model gpt2-124m --batch 4 --seq-len 256 --steps 6"
      "zero3|2|zero3 --model small --steps 40")
for r in $(seq "$rounds"); do
    for run in "${runs[@]}"; do
        IFS='|' read -r name np cmd <<< "$run"
        for mode in default contiguous base; do
            case $mode in
                default) bin=./ ; extra= ;;
                contiguous) bin=./ ; extra=--contiguous-buffers ;;
                base) [ -n "$base" ] || continue; bin="$base/" ; extra= ;;
            esac
            echo "round $r: $name $mode" >&2
            mpirun -np "$np" $bin$cmd $extra --eval-batches 1 --quiet --json "$out/${name}_$mode.json" >&2
        done
    done
done
python3 - "$out" "$rounds" "${base:+yes}" <<'PY'
import json, statistics, sys
from pathlib import Path
out, rounds, has_base = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "yes"
what = {"dp": "dp_baseline gpt2-124m, B 4, T 256, 1 rank", "zero3": "zero3 small, 2 ranks"}
result = {"what": "tokens/s with each unit's buffers allocated as the step goes (default) and with "
                  "--contiguous-buffers, interleaved rounds (cpu device)" +
                  ("; base: the same runs of an earlier build (ARENA_BASE)" if has_base else ""),
          "rounds": rounds}
for name in what:
    fig = {"run": what[name]}
    for mode in ("default", "contiguous", "base"):
        path = out / f"{name}_{mode}.json"
        if not path.exists():
            continue
        tps = [json.loads(l)["tokens_per_s"] for l in path.read_text().splitlines() if l.strip()]
        fig[mode] = {"tokens_per_s": statistics.median(tps), "min": min(tps), "max": max(tps)}
    for mode in ("contiguous", "base"):
        if mode in fig:
            fig[mode + "_over_default"] = fig[mode]["tokens_per_s"] / fig["default"]["tokens_per_s"]
    result[name] = fig
print(json.dumps(result, indent=1))
PY
