"""Folds bench/3d.sh's runs into one JSON object: per grid the median step
time pooled over rounds (tokens/s = tokens per step / that median) and its
ratio to dp_baseline at the same ranks and global batch, the device peak per
rank, each pipeline stage's model states and activations (measured, with the
formula), the bubble measured beside (P-1)/(m+P-1); the bubble of the m
sweep; interleaved and zb-h1 beside 1f1b at pp 2 and 4, m 4 and 8 (the
bubble beside its formula, each stage's device peak beside the formula's
timeline, tokens/s relative to 1f1b, each round's bubble and their spread,
the noise) and the order of their bubbles at each (pp, m): interleaved's
median against 1f1b's, zb-h1's against interleaved's, the gap beside the
noise; the same for one pipeline alone (ranks = pp); and per context-parallel size and mode (Ulysses, ring) tokens/s
relative to cp 1, activations per rank and the cp group's bytes, each beside
its formula, with the ring's causal work per rank: the query-key pairs of
the causal mask each rank's blocks attended, counted by the trainer (the
zigzag as it runs: its largest over the mean), beside the formula's with
the zigzag and with chunks in order.
Usage: summarize_3d.py OUT_DIR TAG RANKS CORES."""
import json
import statistics
import sys
from pathlib import Path

out, tag, ranks, cores = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


def records(name):
    path = out / f"{tag}_{name}.json"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def key(rec):
    g = rec["grid"]
    return (g["tp"], g["pp"], g["dp"], g["schedule"], g["micro_batches"])


def tokens_per_s(runs):
    steps = [ms for r in runs for ms in r["step_ms"][1:]]  # the first step carries one-time costs
    return runs[0]["global_batch_tokens"] / (statistics.median(steps) / 1000.0)


def per_stage(rec):
    stages = {}
    for x in rec["grid"]["ranks"]:
        s = stages.setdefault(int(x["stage"]), {"stage": int(x["stage"]), "states_bytes": 0, "states_formula": 0,
                                                "activations_bytes": 0, "activations_formula": 0})
        for k, src in (("states_bytes", "states"), ("states_formula", "states_formula"),
                       ("activations_bytes", "activations"), ("activations_formula", "activations_formula")):
            s[k] = max(s[k], x[src])
    return [stages[s] for s in sorted(stages)]


def grouped(recs):
    by = {}
    for r in recs:
        by.setdefault(key(r), []).append(r)
    return by


def bubbles(runs):
    return [r["grid"]["bubble_measured"] for r in runs if r["grid"]["bubble_measured"] is not None]


def spread(runs):
    measured = bubbles(runs)
    return max(measured) - min(measured) if measured else None


def bubble(runs):
    measured = bubbles(runs)
    return statistics.median(measured) if measured else None


result = {
    "what": f"3d_parallel on small at {ranks} ranks, micro-batch 2; tokens/s relative to dp_baseline at the same "
            f"ranks and global batch; the pipeline bubble against (P-1)/(m+P-1)",
    "oversubscribed": ranks > cores,
    "note": (f"{ranks} ranks on {cores} cores: ranks share cores, a rank waiting in MPI yields its core, so these "
             f"are schedules on one machine, not on {ranks} devices" if ranks > cores else "one core per rank or more")
            + "; with mpi_single_copy none a stage's activations leave only at its next MPI call, with cma as soon as "
              "they are sent",
}
base = records("dp_baseline")
grids = records("grids")
if not base or not grids:
    result["error"] = "a run failed; see the bench log"
    print(json.dumps(result, indent=1))
    sys.exit(0)
base_tps = tokens_per_s(base)
result["device"] = base[0]["device"]
result["mpi_single_copy"] = base[0].get("mpi_single_copy")
result["global_batch_sequences"] = base[0]["global_batch_tokens"] / base[0]["seq_len"]
result["dp_baseline"] = {"rounds": len(base), "tokens_per_s": base_tps,
                         "peak_device_bytes_per_rank": max(r["mem"]["device"]["peak_total"] for r in base)}
result["grids"] = []
for (tp, pp, dp, schedule, m), runs in sorted(grouped(grids).items()):
    tps = tokens_per_s(runs)
    result["grids"].append({
        "tp": tp, "pp": pp, "dp": dp, "schedule": schedule, "micro_batches": m, "rounds": len(runs),
        "tokens_per_s": tps, "relative_to_dp_baseline": tps / base_tps,
        "peak_device_bytes_per_rank": max(r["mem"]["device"]["peak_total"] for r in runs),
        "per_stage": per_stage(runs[-1]),
        "bubble_measured": bubble(runs), "bubble_formula": runs[0]["grid"]["bubble_formula"],
    })
result["bubble_sweep"] = [
    {"tp": tp, "pp": pp, "dp": dp, "schedule": schedule, "micro_batches": m, "rounds": len(runs),
     "bubble_measured": bubble(runs), "bubble_formula": runs[0]["grid"]["bubble_formula"],
     "peak_activations_bytes_per_rank": max(x["activations"] for x in runs[-1]["grid"]["ranks"])}
    for (tp, pp, dp, schedule, m), runs in sorted(grouped(records("bubble")).items(), key=lambda kv: (kv[0][4], kv[0][3]))
]

# the schedules past 1F1B beside it, at the same (pp, m): the bubble, each stage's device peak (measured and the
# formula's timeline, the largest over the stage's ranks), tokens/s relative to 1f1b
def schedule_rows(recs):
    sched = grouped(recs)
    rows = []
    for (tp, pp, dp, schedule, m), runs in sorted(sched.items(), key=lambda kv: (kv[0][1], kv[0][4], kv[0][3])):
        one = sched.get((tp, pp, dp, "1f1b", m))
        stages = {}
        for x in runs[-1]["grid"]["ranks"]:
            st = stages.setdefault(int(x["stage"]), {"stage": int(x["stage"]), "device_peak": 0,
                                                     "device_peak_formula": 0, "w_pending": 0, "w_pending_formula": 0})
            for k in ("device_peak", "device_peak_formula", "w_pending", "w_pending_formula"):
                st[k] = max(st[k], x[k])
        rows.append({
            "pp": pp, "dp": dp, "micro_batches": m, "schedule": schedule, "rounds": len(runs),
            "bubble_measured": bubble(runs), "bubble_formula": runs[0]["grid"]["bubble_formula"],
            "bubble_rounds": bubbles(runs), "bubble_spread": spread(runs),
            "tokens_per_s": tokens_per_s(runs),
            "relative_to_1f1b": tokens_per_s(runs) / tokens_per_s(one) if one else None,
            "per_stage": [stages[k] for k in sorted(stages)],
        })
    return rows


def order(rows, a, b, pp, m):
    """Schedule a's measured bubble against b's at (pp, m): the medians over rounds, their gap, and the noise
    (the larger of the two spreads over rounds, max - min): "below" when a's median is lower, "by more than
    the noise" when the gap is wider than that."""
    ra = next((x for x in rows if (x["pp"], x["micro_batches"], x["schedule"]) == (pp, m, a)), None)
    rb = next((x for x in rows if (x["pp"], x["micro_batches"], x["schedule"]) == (pp, m, b)), None)
    if not ra or not rb or ra["bubble_measured"] is None or rb["bubble_measured"] is None:
        return None
    gap = rb["bubble_measured"] - ra["bubble_measured"]
    noise = max(ra["bubble_spread"], rb["bubble_spread"])
    return {"pp": pp, "micro_batches": m, "schedule": a, "against": b, "bubble": ra["bubble_measured"],
            "against_bubble": rb["bubble_measured"], "gap": gap, "noise": noise, "below": gap > 0,
            "below_by_more_than_noise": gap > noise}


def orders(rows):
    return [o for pp in (2, 4) for m in (4, 8)
            for o in (order(rows, "interleaved", "1f1b", pp, m), order(rows, "zb-h1", "interleaved", pp, m)) if o]


# at the bench's ranks (dp = ranks / pp), and one pipeline alone (ranks = pp, dp 1: the fewest ranks per core)
result["schedules"] = schedule_rows(records("schedules"))
result["schedule_order"] = orders(result["schedules"])
result["schedules_one_pipeline"] = schedule_rows(records("schedules_one"))
result["schedule_order_one_pipeline"] = orders(result["schedules_one_pipeline"])


def causal_work(cp):
    """Query-key pairs of the causal mask per rank in units of a chunk's Tc^2 (the diagonal half): with
    the zigzag rank r holds chunks r and 2cp-1-r, (r + 1/2) + (2cp-1-r + 1/2) = 2cp on every rank; in order
    (one chunk of 2Tc, rank r) 4(r + 1/2). The largest over the mean."""
    zigzag = [2 * cp for r in range(cp)]
    in_order = [4 * (r + 0.5) for r in range(cp)]
    return {"zigzag_max_over_mean": max(zigzag) / statistics.mean(zigzag),
            "in_order_max_over_mean": max(in_order) / statistics.mean(in_order)}


cp_runs = {}
for r in records("cp"):
    g = r["grid"]
    cp_runs.setdefault((g.get("cp", 1), g.get("cp_mode", "ulysses") if g.get("cp", 1) > 1 else "none"), []).append(r)
if (1, "none") in cp_runs:
    one = tokens_per_s(cp_runs[(1, "none")])
    result["context_parallel"] = []
    for (c, mode), runs in sorted(cp_runs.items()):
        last = runs[-1]["grid"]["ranks"]
        row = {
            "cp": c, "mode": mode, "seq_len": runs[0]["seq_len"], "rounds": len(runs),
            "tokens_per_s": tokens_per_s(runs), "relative_to_cp1": tokens_per_s(runs) / one,
            "activations_bytes_per_rank": max(x["activations"] for x in last),
            "activations_formula": max(x["activations_formula"] for x in last),
            "cp_bytes_per_step": max(x["comm"]["cp"][0] for x in last),
            "cp_bytes_formula": max(x["comm"]["cp"][1] for x in last),
            "peak_device_bytes_per_rank": max(r["mem"]["device"]["peak_total"] for r in runs),
        }
        if mode == "ring":
            row["causal_work_formula"] = causal_work(c)
            # what each rank's blocks attended, counted by the trainer (query-key pairs per layer)
            pairs = [x["ring_pairs"] for x in last]
            row["causal_work_measured"] = {"pairs_per_rank_min": min(pairs), "pairs_per_rank_max": max(pairs),
                                           "zigzag_max_over_mean": max(pairs) / statistics.mean(pairs)}
        result["context_parallel"].append(row)
print(json.dumps(result, indent=1))
