"""Folds bench/offload.sh's runs into one JSON object: per model, the median
step time with and without --dpu (median over rounds of each run's median),
their ratio and difference (step_ms_saved_dpu), and the CPU Adam's time per
step and the part of it hidden behind compute under --dpu, in ms
(cpu_adam_hidden_ms_per_step_dpu) and as a fraction (wall-clock
intersections, from the report). The rounds are interleaved; min and max
of the step times show their spread (BENCH_ROUNDS=5 narrows it)."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def records(name):
    path = out / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


result = {"what": "cpu_offload step time with and without --dpu (1 rank, cpu device)"}
for model in ("small", "gpt2_124m"):
    plain, dpu = records(f"offload_{model}_plain.json"), records(f"offload_{model}_dpu.json")
    if not plain or not dpu:
        result[model] = {"error": "a run failed; see the bench log"}
        continue
    med = lambda runs, key: statistics.median(r[key] for r in runs)
    host = [r["times_ms_per_step"]["host_optimizer"] for r in dpu]
    hidden = [r["times_ms_per_step"]["host_optimizer_hidden"] for r in dpu]
    entry = {
        "rounds": len(plain),
        "step_ms_plain": med(plain, "step_ms_median"),
        "step_ms_plain_min": min(r["step_ms_median"] for r in plain),
        "step_ms_plain_max": max(r["step_ms_median"] for r in plain),
        "step_ms_dpu": med(dpu, "step_ms_median"),
        "step_ms_dpu_min": min(r["step_ms_median"] for r in dpu),
        "step_ms_dpu_max": max(r["step_ms_median"] for r in dpu),
        "cpu_adam_ms_per_step_plain": statistics.median(r["times_ms_per_step"]["host_optimizer"] for r in plain),
        "cpu_adam_ms_per_step_dpu": statistics.median(host),
        "hidden_fraction_dpu": statistics.median(h / a if a > 0 else 0.0 for h, a in zip(hidden, host)),
        "cpu_adam_hidden_ms_per_step_dpu": statistics.median(hidden),
        "compute_ms_per_step_dpu": statistics.median(r["times_ms_per_step"]["compute"] for r in dpu),
    }
    entry["speedup_dpu"] = entry["step_ms_plain"] / entry["step_ms_dpu"]
    # what the question compares: the CPU Adam's time hidden per step against
    # how much the step shortened (both medians over the rounds, in ms)
    entry["step_ms_saved_dpu"] = entry["step_ms_plain"] - entry["step_ms_dpu"]
    result[model] = entry
print(json.dumps(result, indent=1))
