"""Folds bench/offload.sh's runs into one JSON object: per model, per stage
and mode (the median over rounds of each run's figures, the step time with
its spread over the rounds, _min and _max): step time, compute, transfer
(the copies between tiers, wall-clock) and the part of it hidden behind
compute, the host optimizer and its hidden part, and the two step times the
transfer could give, from the same spans: compute + transfer (every copy
waited for: the synchronous swap's formula) and max(compute, transfer)
(every copy beside compute: the prefetched swap's). Then the figures the
earlier sections kept: --dpu against the plain run (speedup_dpu,
step_ms_saved_dpu, the CPU Adam hidden) and, on cuda, tokens/s against
dp_baseline."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
MODES = ["dp_baseline", "cpu_offload", "cpu_offload_eager", "cpu_offload_dpu", "infinity_sync", "infinity_prefetch"]
TIMES = {"compute_ms": "compute", "transfer_ms": "copy", "transfer_hidden_ms": "copy_hidden",
         "host_optimizer_ms": "host_optimizer", "host_optimizer_hidden_ms": "host_optimizer_hidden",
         "compute_plus_transfer_ms": "compute_plus_transfer", "max_compute_transfer_ms": "max_compute_transfer"}


def records(name):
    path = out / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mode_figures(runs):
    med = statistics.median
    steps = [r["step_ms_median"] for r in runs]
    first = runs[0]
    entry = {"shape": "%s B%d T%d" % (first["model"], first["batch"], first["seq_len"]), "rounds": len(runs),
             "step_ms": med(steps), "step_ms_min": min(steps), "step_ms_max": max(steps),
             "tokens_per_s": med(r["tokens_per_s"] for r in runs)}
    for key, field in TIMES.items():
        entry[key] = med(r["times_ms_per_step"][field] for r in runs)
    copy = entry["transfer_ms"]
    entry["transfer_hidden_fraction"] = entry["transfer_hidden_ms"] / copy if copy > 0 else 0.0
    host = entry["host_optimizer_ms"]
    entry["host_optimizer_hidden_fraction"] = entry["host_optimizer_hidden_ms"] / host if host > 0 else 0.0
    return entry


result = {"what": "the offload stages per mode: step, compute, transfer and hidden times, compute + transfer "
                  "and max(compute, transfer) (1 rank, %s device)" % device, "device": device}
models = ("gpt2",) if device == "cuda" else ("small", "gpt2_124m")
for model in models:
    modes = {m: mode_figures(runs) for m in MODES if (runs := records(f"offload_{model}_{m}.json"))}
    missing = [m for m in MODES[1:] if m not in modes]
    if missing:
        result[model] = {"error": "a run failed (%s); see the bench log" % ", ".join(missing)}
        continue
    plain, dpu = modes["cpu_offload"], modes["cpu_offload_dpu"]
    entry = {"modes": modes,
             # --dpu against the plain run: what the delayed update hides and saves
             "speedup_dpu": plain["step_ms"] / dpu["step_ms"],
             "step_ms_saved_dpu": plain["step_ms"] - dpu["step_ms"],
             "hidden_fraction_dpu": dpu["host_optimizer_hidden_fraction"],
             # the block swap: prefetched against synchronous
             "speedup_prefetch": modes["infinity_sync"]["step_ms"] / modes["infinity_prefetch"]["step_ms"]}
    if "dp_baseline" in modes:
        base = modes["dp_baseline"]["tokens_per_s"]
        for m in ("cpu_offload", "cpu_offload_eager", "cpu_offload_dpu"):
            entry[f"tokens_per_s_vs_dp_baseline_{m}"] = modes[m]["tokens_per_s"] / base
    result[model] = entry
print(json.dumps(result, indent=1))
