#!/usr/bin/env python3
"""loss_diff.py RUNS.json [MORE.json ...]: the per-step losses of every run
(one --json record per line, in the files' order) against the first run's:
the largest |difference| over the steps they share, or "identical" when
every loss is the same in all 9 significant digits the record prints.

    python3 scripts/loss_diff.py runs/stages.json
"""
import json
import sys
from pathlib import Path


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: loss_diff.py RUNS.json [MORE.json ...]")
    recs = []
    for path in sys.argv[1:]:
        try:
            recs += [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
        except (OSError, ValueError) as e:
            sys.exit(f"loss_diff: cannot read {path}: {e}")
    if len(recs) < 2:
        sys.exit("loss_diff: need at least two runs (records) to compare")
    first = recs[0]

    def zeropp(r):  # zero3's ZeRO++ switches, as its flags name them
        z = r.get("zeropp")
        if not z:
            return ""
        return ((" --quantize-weights" if z["quantize_weights"] else "") +
                (f" --hpz-size {z['hpz']}" if z["hpz"] > 1 else "") +
                (" --quantize-grads" if z["quantize_grads"] else "") +
                (f" --grad-quant-bits {z['grad_bits']}" if z["quantize_grads"] and z["grad_bits"] != 8 else ""))

    def name(r):
        rc = r.get("recompute", "none")
        return (f"{r['stage']} N={r['ranks']}" + (f" k={r['grad_accum']}" if r.get("grad_accum", 1) > 1 else "") +
                (f" --recompute {rc}" if rc != "none" else "") +
                (" --offload-activations" if r.get("offload_activations") else "") + zeropp(r))

    print(f"against {name(first)} ({len(first['losses'])} steps):")
    for r in recs[1:]:
        n = min(len(r["losses"]), len(first["losses"]))
        diffs = [abs(a - b) for a, b in zip(r["losses"][:n], first["losses"][:n])]
        worst = max(diffs) if diffs else 0.0
        where = diffs.index(worst) + 1 if worst > 0 else None
        verdict = "identical" if worst == 0 else f"max |diff| {worst:.3g} (step {where})"
        print(f"  {name(r):24s} {verdict}")


if __name__ == "__main__":
    main()
