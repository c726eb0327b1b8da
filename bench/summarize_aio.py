"""Folds the aio sweep's raw runs (bench/aio.sh, one JSON object per line) into
one object: per point the median GB/s of the aio module and of fio over the
rounds and their ratio, best against best, the issue's targets met or not, and
the block size and queue depth to use by default.

usage: summarize_aio.py RUNS.jsonl FILE FIO_VERSION"""
import json
import statistics
import sys
from pathlib import Path

runs_path, file_path, fio_version = sys.argv[1:4]
runs = [json.loads(line) for line in Path(runs_path).read_text().splitlines() if line.strip()]

POINT_TARGET = 0.9  # "within 10% of fio at every point"
BEST_TARGET = 0.9   # "the best point at least 0.9 of fio's best"
NEAR_BEST = 0.95    # a default must reach this share of our best, reading and writing

gbps = {}  # (tool, op, block_kb, depth) -> GB/s of every round
for r in runs:
    gbps.setdefault((r["tool"], r["op"], r["block_kb"], r["depth"]), []).append(r["gbps"])
grid = sorted({(k[2], k[3]) for k in gbps})
ops = ["read", "write"]


def median(tool, op, block_kb, depth):
    return statistics.median(gbps[(tool, op, block_kb, depth)])


points = []
for block_kb, depth in grid:
    point = {"block_kb": block_kb, "depth": depth, "in_flight_kb": block_kb * depth}
    for op in ops:
        ours, fio = median("ours", op, block_kb, depth), median("fio", op, block_kb, depth)
        point[op] = {"ours_gbps": round(ours, 4), "fio_gbps": round(fio, 4), "ratio": round(ours / fio, 4)}
    points.append(point)

best = {}
for op in ops:
    ours_at = max(points, key=lambda p: p[op]["ours_gbps"])
    fio_at = max(points, key=lambda p: p[op]["fio_gbps"])
    ours_best, fio_best = ours_at[op]["ours_gbps"], fio_at[op]["fio_gbps"]
    best[op] = {
        "ours_gbps": ours_best, "ours_at": {"block_kb": ours_at["block_kb"], "depth": ours_at["depth"]},
        "fio_gbps": fio_best, "fio_at": {"block_kb": fio_at["block_kb"], "depth": fio_at["depth"]},
        "ratio": round(ours_best / fio_best, 4),
    }

below = [{"block_kb": p["block_kb"], "depth": p["depth"], "op": op, "ratio": p[op]["ratio"]}
         for p in points for op in ops if p[op]["ratio"] < POINT_TARGET]

# The least data in flight (block x depth: pinned memory held by the queue,
# and the latency of one request) that still reads and writes at NEAR_BEST of
# our best.
# Where no point reaches that for both (the best read and the best write at
# points far apart on a noisy disk), the point whose worse fraction of our
# best is highest.
def fraction(p):
    return min(p[op]["ours_gbps"] / best[op]["ours_gbps"] for op in ops)


near = [p for p in points if fraction(p) >= NEAR_BEST]
pick = min(near, key=lambda p: (p["in_flight_kb"], p["block_kb"])) if near else max(points, key=fraction)

print(json.dumps({
    "what": "aio module (common/io/aio) against fio --ioengine=libaio --direct=1, same file, "
            "block size and queue depth, interleaved per point; GB/s = 1e9 bytes/s, the "
            "median over rounds",
    "file": file_path,
    "file_bytes": runs[0].get("bytes"),
    "request_mb": next(r["request_mb"] for r in runs if r["tool"] == "ours"),
    "rounds": max(r["round"] for r in runs),
    "fio": fio_version,
    "points": points,
    "best": best,
    "targets": {
        "point_ratio_min": POINT_TARGET,
        "points_below": below,
        "every_point_met": not below,
        "best_ratio_min": BEST_TARGET,
        "best_met": all(best[op]["ratio"] >= BEST_TARGET for op in ops),
    },
    "recommended": {
        "block_kb": pick["block_kb"], "depth": pick["depth"],
        "read_gbps": pick["read"]["ours_gbps"], "write_gbps": pick["write"]["ours_gbps"],
        "rule": f"least block x depth whose read and write both reach {NEAR_BEST} of our best"
                + ("" if near else "; none did: the point whose worse fraction of our best is highest"),
        "fraction_of_best": round(fraction(pick), 4),
    },
}, indent=1))
