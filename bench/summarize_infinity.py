"""Folds bench/infinity.sh's runs into one JSON object: the pipelined
optimizer step against its parts (bench/swap_pipeline.c's medians), and per
--offload-params the file I/O time per step of infinity on small, the share
of it hidden behind compute or the CPU Adam (wall-clock intersections the
report measures) and the NVMe GB/s (bytes read and written per step over the
I/O time), each the median over rounds with its spread."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
result = {"what": "stage 06 infinity: the pipelined swapper and the NVMe time hidden (cpu device)"}
pipeline = out / "infinity_pipeline.json"
result["pipeline"] = json.loads(pipeline.read_text()) if pipeline.exists() else {"error": "no run; see the log"}
for params in ("none", "nvme"):
    path = out / f"infinity_small_{params}.json"
    runs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    if not runs:
        result[f"small_{params}"] = {"error": "a run failed; see the bench log"}
        continue
    times = [r["times_ms_per_step"] for r in runs]
    share = [t["io_hidden"] / t["io"] if t["io"] > 0 else 0.0 for t in times]
    gbps = []
    for r, t in zip(runs, times):
        x = r["transfer_bytes_per_step"]
        nvme_bytes = x["nvme_read"]["counted"] + x["nvme_write"]["counted"]
        gbps.append(nvme_bytes / (t["io"] / 1000) / 1e9 if t["io"] > 0 else 0.0)
    result[f"small_{params}"] = {
        "rounds": len(runs),
        "step_ms": statistics.median(r["step_ms_median"] for r in runs),
        "io_ms_per_step": statistics.median(t["io"] for t in times),
        "io_hidden_ms_per_step": statistics.median(t["io_hidden"] for t in times),
        "io_hidden_share": statistics.median(share),
        "io_hidden_share_min": min(share),
        "io_hidden_share_max": max(share),
        "nvme_gbps": statistics.median(gbps),
        "target_hidden_share": 0.8,
        "target_met": statistics.median(share) >= 0.8,
    }
print(json.dumps(result, indent=1))
