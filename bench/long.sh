#!/usr/bin/env bash
# long.sh [OUT_DIR]: long sequences on 07, small on 4 ranks (BENCH_LONG_RANKS)
# at T = 512 to 8192 (BENCH_LONG_SEQS), micro-batch 1, 4 sequences a step
# (BENCH_LONG_GLOBAL), in interleaved rounds (BENCH_ROUNDS, default 2): --cp 1
# (every rank a whole sequence), and --cp 2 and 4 with Ulysses and with ring
# attention. Per (T, configuration): tokens/s, and relative to --cp 1 at the
# same T; the device peak per rank and the activations beside their
# formulas; the cp group's bytes per step beside theirs; each moved per
# layer (the bytes over micro-batches x layers); for the ring, the causal
# work per rank per layer (query-key pairs its blocks attended, counted; the
# busiest rank over the mean) beside the formula's with chunks in order.
# One JSON object on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
out=${1:-build/bench}
mkdir -p "$out"
rounds=${BENCH_ROUNDS:-2}
np=${BENCH_LONG_RANKS:-4}
global=${BENCH_LONG_GLOBAL:-4}
seqs=${BENCH_LONG_SEQS:-512 1024 2048 4096 8192}
rm -f "$out"/long_*.json
configs=("--cp 1" "--cp 2 --cp-mode ulysses" "--cp 2 --cp-mode ring" "--cp 4 --cp-mode ulysses"
         "--cp 4 --cp-mode ring")
for r in $(seq "$rounds"); do
    for t in $seqs; do
        for c in "${configs[@]}"; do
            mpirun -np "$np" ./3d_parallel --model small --seq-len "$t" --batch 1 --global-batch "$global" \
                --steps 4 --warmup 1 --eval-batches 1 --quiet $c --json "$out/long_$t.json" >/dev/null
        done
    done
done
python3 - "$out" "$np" "$seqs" <<'EOF'
import json, statistics, sys
from pathlib import Path
out, ranks, seqs = Path(sys.argv[1]), int(sys.argv[2]), [int(t) for t in sys.argv[3].split()]
rows = []
for t in seqs:
    runs = {}
    for line in (out / f"long_{t}.json").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            g = rec["grid"]
            runs.setdefault((g["cp"], g.get("cp_mode", "none")), []).append(rec)
    def tps(rs):  # the first step carries one-time costs
        return rs[0]["global_batch_tokens"] / (statistics.median([ms for r in rs for ms in r["step_ms"][1:]]) / 1e3)
    one = tps(runs[(1, "none")])
    for (cp, mode), rs in sorted(runs.items()):
        last = rs[-1]["grid"]["ranks"]
        layers, m = rs[-1]["layers"], rs[-1]["grid"]["micro_batches"]
        cp_bytes = max(x["comm"]["cp"][0] for x in last)
        rows.append({"seq_len": t, "cp": cp, "mode": mode, "rounds": len(rs), "tokens_per_s": tps(rs),
                     "relative_to_cp1": tps(rs) / one,
                     "peak_device_bytes_per_rank": max(r["mem"]["device"]["peak_total"] for r in rs),
                     "activations_bytes_per_rank": max(x["activations"] for x in last),
                     "activations_formula": max(x["activations_formula"] for x in last),
                     "cp_bytes_per_step": cp_bytes, "cp_bytes_formula": max(x["comm"]["cp"][1] for x in last),
                     "cp_bytes_per_layer": cp_bytes / (m * layers)})
        if mode == "ring":  # the causal work each rank's blocks attended (counted), and chunks in order (formula)
            pairs = [x["ring_pairs"] for x in last]
            tc = t / (2 * cp)
            in_order = [4 * r + 1 + (tc + 1) / tc for r in range(cp)]  # per B·heads·Tc², rank r holding 2r, 2r+1
            rows[-1].update({"causal_pairs_per_layer_counted": [min(pairs), max(pairs)],
                             "causal_pairs_formula": max(x["ring_pairs_formula"] for x in last),
                             "causal_work_max_over_mean_zigzag": max(pairs) / statistics.mean(pairs),
                             "causal_work_max_over_mean_in_order_formula": max(in_order) / statistics.mean(in_order)})
print(json.dumps({"what": f"3d_parallel on small at {ranks} ranks, micro-batch 1: --cp 1, 2, 4 in each mode at "
                          "each T; tokens/s relative to --cp 1 at the same T; bytes measured beside formulas",
                  "rows": rows}, indent=1))
EOF
