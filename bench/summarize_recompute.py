"""Folds bench/recompute.sh's runs into one JSON object: per --recompute
mode, the median tokens/s over the rounds (each run's median step), its
ratio to none's beside the ratio the FLOP formula predicts (model FLOPs /
hardware FLOPs per token, both from the run's record), and the activation
bytes the allocator measured (saved, the working set, on the host)."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def records(tag):
    path = out / f"recompute_{tag}.json"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peak(run, tier, cat):
    return run["mem"][tier][cat]["peak"]


result = {"what": "dp_baseline gpt2-124m, 1 rank, batch 4, seq 256, by --recompute (cpu device)"}
base = records("none")
if not base:
    print(json.dumps({"error": "the --recompute none runs failed; see the bench log"}))
    sys.exit(1)
base_tps = statistics.median(r["tokens_per_s"] for r in base)
base_acts = peak(base[0], "device", "activations")
for tag in ("none", "selective", "full", "offload"):
    runs = records(tag)
    if not runs:
        result[tag] = {"error": "a run failed; see the bench log"}
        continue
    tps = [r["tokens_per_s"] for r in runs]
    r0 = runs[0]
    entry = {
        "rounds": len(runs),
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_min": min(tps),
        "tokens_per_s_max": max(tps),
        "flops_per_token": r0["flops_per_token"],
        "hw_flops_per_token": r0["hw_flops_per_token"],
        "activations_bytes": peak(r0, "device", "activations"),
        "act_working_bytes": peak(r0, "device", "act_working"),
        "activations_host_bytes": peak(r0, "pinned", "activations"),
    }
    entry["tokens_per_s_vs_none"] = entry["tokens_per_s"] / base_tps
    entry["predicted_vs_none"] = r0["flops_per_token"] / r0["hw_flops_per_token"]
    entry["device_activations_vs_none"] = (entry["activations_bytes"] + entry["act_working_bytes"]) / base_acts
    result[tag] = entry
print(json.dumps(result, indent=1))
