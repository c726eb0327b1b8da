"""Folds bench/training.sh's raw runs (one --json record per line) into one
object: dp_baseline gpt2-124m against the sgemm roof, dp_baseline's scaling
over ranks, and every stage at 4 ranks relative to dp_baseline, with each
target met or not. Timed figures carry their spread over the rounds as
NAME_min and NAME_max (make bench-compare reads them).

usage: summarize.py RUNS_DIR SGEMM_JSON"""
import json
import statistics
import sys
from pathlib import Path

out, sgemm_path = Path(sys.argv[1]), Path(sys.argv[2])


def records(name):
    return [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]


def with_spread(name, values, middle=None):
    """{name: median (or `middle`), name_min, name_max} over the values."""
    return {name: statistics.median(values) if middle is None else middle,
            name + "_min": min(values), name + "_max": max(values)}


roof = json.loads(sgemm_path.read_text())["sgemm_gflops"]
gpt2 = records("gpt2_124m.json")[-1]
# the first step carries one-time costs (page faults, thread start): the median step
steps = gpt2["step_ms"][1:] or gpt2["step_ms"]
tokens = gpt2["global_batch_tokens"]
results = {
    "what": "the trainers on the cpu device (OpenBLAS), in one run of make bench",
    "sgemm_roof_gflops": roof,
    "gpt2_124m_1rank": {
        **with_spread("tokens_per_s", [tokens / (ms / 1000) for ms in steps], gpt2["tokens_per_s"]),
        "step_ms_median": gpt2["step_ms_median"],
        "model_gflops": gpt2["gflops_per_rank"],
        "fraction_of_sgemm_roof": gpt2["gflops_per_rank"] / roof,
        "target_fraction": 0.5,
        "target_met": gpt2["gflops_per_rank"] / roof >= 0.5,
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
for path in sorted(out.glob("stages_*.json")):
    s = path.stem[len("stages_"):]
    runs = records(path.name)
    # every step of every round, less each run's first two (warm-up), pooled:
    # the median step is robust to the other tenants of a shared machine; the
    # spread is that of the rounds' own tokens/s
    steps_ms = [ms for r in runs for ms in r["step_ms"][2:]]
    pooled = runs[0]["global_batch_tokens"] / (statistics.median(steps_ms) / 1000.0)
    stages[s] = {
        **with_spread("tokens_per_s", [r["tokens_per_s"] for r in runs], pooled),
        "rounds": len(runs),
        "steps_pooled": len(steps_ms),
        "peak_device_bytes_per_rank": runs[-1]["mem"]["device"]["peak_total"],
        "model_state_bytes_formula": runs[-1]["mem_formula"]["device"]["total"],
        "comm_bytes_per_step": runs[-1]["comm_bytes_per_step"],
        "comm_formula_bytes_per_step": runs[-1]["comm_formula_bytes_per_step"],
    }
base = stages["dp_baseline"]["tokens_per_s"]
for s, v in stages.items():
    v["relative_to_dp"] = v["tokens_per_s"] / base
    if s in targets:
        v["target"] = targets[s]
        v["target_met"] = v["relative_to_dp"] >= targets[s]
results["stages_4_ranks_small"] = stages
print(json.dumps(results, indent=1))
