"""Folds the cuda bench runs (one JSON object per line) into one results
object: dp_baseline's MFU against its target, and per stage and rank count
the throughput and the per-rank model-state bytes, measured and by formula."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
STATES = ["params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v"]


def records(name):
    return [json.loads(line) for line in (out / name).read_text().splitlines() if line.strip()]


def model_states_measured(run):
    # held at the end of the run on the device tier, as the report's "device
    # model states" line (ZeRO-3's gathered units are released by then)
    return sum(run["mem"]["device"][c]["current"] for c in STATES)


def median_tokens_per_s(run):
    # the first two steps carry one-time costs (cuBLASLt heuristics, first touches)
    steps = run["step_ms"][2:] or run["step_ms"]
    return run["global_batch_tokens"] / (statistics.median(steps) / 1000.0)


gpt2 = records("cuda_gpt2_124m.json")[-1]
results = {
    "machine_note": "measured in one run of make bench-cuda; cuda device",
    "device": gpt2["device"],
    "dp_baseline_gpt2_124m_b16_t1024": {
        "tokens_per_s": median_tokens_per_s(gpt2),
        "step_ms_median": gpt2["step_ms_median"],
        "model_gflops": gpt2["gflops_per_rank"],
        "mfu": gpt2["mfu"],
        "target_mfu": 0.40,
        "target_met": gpt2["mfu"] is not None and gpt2["mfu"] >= 0.40,
        "peak_device_bytes": gpt2["mem"]["device"]["peak_total"],
        "final_loss": gpt2["losses"][-1],
    },
    "stages_gpt2_124m_b4_t1024": [
        {
            "stage": r["stage"],
            "ranks": r["ranks"],
            "comm": r["comm"],
            "gpu_sharers": r["gpu_sharers"],
            "tokens_per_s": median_tokens_per_s(r),
            "mfu_of_share": r["mfu"],
            "model_state_bytes_measured": model_states_measured(r),
            "model_state_bytes_formula": r["mem_formula"]["device"]["total"],
            "peak_device_bytes_per_rank": r["mem"]["device"]["peak_total"],
            "comm_bytes_per_step": r["comm_bytes_per_step"],
            "comm_formula_bytes_per_step": r["comm_formula_bytes_per_step"],
            "final_loss": r["losses"][-1],
        }
        for r in records("cuda_stages.json")
    ],
}
print(json.dumps(results, indent=2))
