"""Folds make bench-cuda's runs into one results object (or, with --table,
a table): each trainer's tokens/s, MFU by the report's FLOP formula
(6 Psi_matmul + 12 L C T per token, against the GPU's dense bf16 peak), peak
device memory, and its ratio to each PyTorch run; and the kernels' times of
one step where Nsight Compute measured them."""
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
as_table = "--table" in sys.argv[2:]


def records(name):
    path = out / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def median_tokens_per_s(run):
    # the first two steps carry one-time costs (cuBLASLt heuristics, first touches)
    steps = run["step_ms"][2:] or run["step_ms"]
    return run["global_batch_tokens"] / (statistics.median(steps) / 1000.0)


rows = []
for r in records("cuda_workbench.json"):
    peak = r["mfu"] / r["gflops_per_rank"] * 1e-9 if r.get("mfu") else None  # 1 / peak FLOP/s
    rows.append({
        "trainer": "dp_baseline" + (" --recompute " + r["recompute"] if r["recompute"] != "none" else ""),
        "attention": r.get("attention"),
        "tokens_per_s": median_tokens_per_s(r),
        "mfu": r["mfu"],
        "peak_device_bytes": r["mem"]["device"]["peak_total"],
        "final_loss": r["losses"][-1],
        "_inv_peak": peak,
    })
inv_peak = next((r["_inv_peak"] for r in rows if r["_inv_peak"]), None)
for t in records("cuda_torch.json"):
    rows.append({
        "trainer": t["trainer"],
        "attention": "sdpa",
        "tokens_per_s": t["tokens_per_s"],
        "mfu": t["gflops"] * 1e9 * inv_peak if inv_peak else None,
        "peak_device_bytes": t["peak_device_bytes"],
        "final_loss": t["final_loss"],
        "_inv_peak": None,
    })
torch_rows = [r for r in rows if r["trainer"].startswith("pytorch")]
for r in rows:
    del r["_inv_peak"]
    r["tokens_per_s_over"] = {t["trainer"]: r["tokens_per_s"] / t["tokens_per_s"] for t in torch_rows}
    r["memory_over"] = {t["trainer"]: r["peak_device_bytes"] / t["peak_device_bytes"]
                        for t in torch_rows if t["peak_device_bytes"]}

UNITS = {"": 1, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}  # to plain counts, times to ns


def ncu_records(name):
    """(kernel, metric, value) of each row of an `ncu --csv` file in `out`, values in ns where a time"""
    path = out / name
    if not path.exists():
        return
    lines = [l for l in path.read_text().splitlines() if l.startswith('"')]  # past ncu's own lines
    for rec in csv.DictReader(lines):
        unit = UNITS.get(rec.get("Metric Unit", ""))
        if unit is None:  # a scaled count or size: left out rather than misread
            print(f"summarize_cuda: {name}: {rec.get('Metric Name')} in {rec.get('Metric Unit')!r} left out",
                  file=sys.stderr)
            continue
        yield rec["Kernel Name"].split("(")[0], rec.get("Metric Name", ""), float(
            rec["Metric Value"].replace(",", "")) * unit


kernels = defaultdict(lambda: [0, 0.0])  # name -> [launches, ns]
for name, metric, value in ncu_records("cuda_kernels.csv"):
    if metric == "gpu__time_duration.sum":
        kernels[name][0] += 1
        kernels[name][1] += value
total_ns = sum(v[1] for v in kernels.values())
kernel_rows = sorted(({"kernel": n, "launches": v[0], "ms": v[1] / 1e6, "share": v[1] / total_ns}
                      for n, v in kernels.items()), key=lambda r: -r["ms"])

# the flash kernels' shared memory: wavefronts, and those that bank conflicts added
smem = defaultdict(lambda: {"launches": 0, "wavefronts": 0, "conflicts": 0})
for name, metric, value in ncu_records("cuda_flash_smem.csv"):
    if metric == "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum":
        smem[name]["launches"] += 1
        smem[name]["wavefronts"] += value
    elif metric.startswith("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_"):
        smem[name]["conflicts"] += value
smem_rows = [{"kernel": n, **v, "conflict_share": v["conflicts"] / v["wavefronts"] if v["wavefronts"] else None}
             for n, v in sorted(smem.items())]

device = next((r["device"] for r in records("cuda_workbench.json")), None)
if not as_table:
    print(json.dumps({"note": "measured in one run of make bench-cuda, gpt2-124m, micro-batch 16, seq 1024, one GPU",
                      "device": device, "runs": rows, "kernels_one_step": kernel_rows,
                      "flash_shared_memory_one_step": smem_rows}, indent=2))
    sys.exit(0)
print(f"\ngpt2-124m, micro-batch 16, seq 1024, one GPU ({device})")
print(f"{'trainer':32} {'tokens/s':>10} {'MFU':>7} {'peak GB':>8}  ratios to PyTorch (tokens/s, memory)")
for r in rows:
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-"
    ratios = ", ".join(f"{k}: {v:.2f}x / {r['memory_over'].get(k, float('nan')):.2f}x"
                       for k, v in r["tokens_per_s_over"].items())
    print(f"{r['trainer']:32} {r['tokens_per_s']:10.0f} {mfu:>7} {r['peak_device_bytes'] / 1e9:8.2f}  {ratios}")
if kernel_rows:
    print(f"\none step by kernel (Nsight Compute, {total_ns / 1e6:.1f} ms of kernels)")
    for k in kernel_rows[:25]:
        print(f"  {k['ms']:8.2f} ms {100 * k['share']:5.1f}% {k['launches']:5d}x  {k['kernel']}")
if smem_rows:
    print("\nflash kernels' shared memory in one step (Nsight Compute): wavefronts, and those bank conflicts added")
    for k in smem_rows:
        share = f"{100 * k['conflict_share']:5.1f}%" if k["conflict_share"] is not None else "    -"
        print(f"  {k['wavefronts']:14,.0f} {k['conflicts']:14,.0f} {share} {k['launches']:5d}x  {k['kernel']}")
