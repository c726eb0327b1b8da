"""Folds the raw bench runs (one JSON object per line) into one results object:
medians over rounds, ratios to dp_baseline, and each target met or not."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def records(name):
    return [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]


sgemm = json.loads((out / "sgemm.json").read_text())
roof = sgemm["sgemm_gflops"]
gpt2 = records("gpt2_124m.json")[-1]
# the first step carries one-time costs (page faults, thread start): use the median step
gpt2_gflops = gpt2["gflops_per_rank"]
results = {
    "machine_note": "measured in one run of make bench; cpu device, OpenBLAS",
    "sgemm_roof_gflops": roof,
    "gpt2_124m_1rank": {
        "tokens_per_s": gpt2["tokens_per_s"],
        "step_ms_median": gpt2["step_ms_median"],
        "model_gflops": gpt2_gflops,
        "fraction_of_sgemm_roof": gpt2_gflops / roof,
        "target_fraction": 0.5,
        "target_met": gpt2_gflops / roof >= 0.5,
        "peak_device_bytes": gpt2["mem"]["device"]["peak_total"],
    },
    "small_dp_scaling": [
        {"ranks": r["ranks"], "tokens_per_s": r["tokens_per_s"], "gflops_per_rank": r["gflops_per_rank"],
         "comm_bytes_per_step": r["comm_bytes_per_step"]}
        for r in records("small_dp_scaling.json")
    ],
}
targets = {"zero1": 0.95, "zero2": 0.90, "zero3": 0.80}
stages = {}
for s in ["dp_baseline", "zero1", "zero2", "zero3"]:
    runs = records(f"stages_{s}.json")
    # every step of every round, less each run's first two (warm-up), pooled:
    # the median step is robust to the other tenants of a shared machine
    steps_ms = [ms for r in runs for ms in r["step_ms"][2:]]
    stages[s] = {
        "tokens_per_s_median": runs[0]["global_batch_tokens"] / (statistics.median(steps_ms) / 1000.0),
        "rounds": len(runs),
        "steps_pooled": len(steps_ms),
        "peak_device_bytes_per_rank": runs[-1]["mem"]["device"]["peak_total"],
        "model_state_bytes_formula": runs[-1]["mem_formula"]["device"]["total"],
        "comm_bytes_per_step": runs[-1]["comm_bytes_per_step"],
        "comm_formula_bytes_per_step": runs[-1]["comm_formula_bytes_per_step"],
    }
base = stages["dp_baseline"]["tokens_per_s_median"]
for s, v in stages.items():
    v["relative_to_dp"] = v["tokens_per_s_median"] / base
    if s in targets:
        v["target"] = targets[s]
        v["target_met"] = v["relative_to_dp"] >= targets[s]
results["stages_4_ranks_small"] = stages
print(json.dumps(results, indent=2))
