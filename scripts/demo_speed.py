#!/usr/bin/env python3
"""demo_speed.py ROUNDS.json: make demo's tokens/s table, from its timing
rounds (one --json record per run; every round runs each stage once, the
stages interleaved, so a load that comes and goes on the machine falls on
every stage alike rather than on whichever ran at the time).

Per stage: the median tokens/s over the rounds, the slowest and fastest
round, and the spread (fastest - slowest) / median. Beside it the stage
over dp_baseline: each round's ratio (both measured in the same round),
their median and range. A range that holds 1 says the two are not told
apart on this machine now; the last line names the largest spread.
"""
import json
import statistics
import sys

BASE = "dp_baseline"


def read_rounds(path):
    """{stage: [tokens/s of round 0, 1, ...]} in the order the stages first ran."""
    runs = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                runs.setdefault(rec["stage"], []).append(float(rec["tokens_per_s"]))
    return runs


def spread(values):
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else float("inf")


def table(runs):
    rounds = min(len(v) for v in runs.values())
    lines = [f"tokens/s, {rounds} interleaved rounds (each round runs every stage once; median, slowest-fastest "
             f"round, spread = (fastest - slowest) / median)",
             f"  {'stage':<12} {'tok/s':>9} {'slowest':>9} {'fastest':>9} {'spread':>7}   x {BASE} (median, range)"]
    base = runs.get(BASE)
    for stage, values in runs.items():
        values = values[:rounds]
        row = (f"  {stage:<12} {statistics.median(values):9.0f} {min(values):9.0f} {max(values):9.0f} "
               f"{100 * spread(values):6.0f}%")
        if base and stage != BASE:
            ratios = [v / b for v, b in zip(values, base[:rounds])]
            told = "" if min(ratios) > 1 or max(ratios) < 1 else "  (not told apart)"
            row += f"   {statistics.median(ratios):5.2f} ({min(ratios):.2f}-{max(ratios):.2f}){told}"
        lines.append(row)
    noisiest = max(runs, key=lambda s: spread(runs[s][:rounds]))
    lines.append(f"  noise: the rounds of {noisiest} differ by {100 * spread(runs[noisiest][:rounds]):.0f}% of its "
                 f"median; a difference between stages smaller than that is the machine, not the stage")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: demo_speed.py ROUNDS.json")
    runs = read_rounds(argv[1])
    if not runs:
        sys.exit(f"demo_speed.py: {argv[1]} holds no runs")
    print(table(runs))


if __name__ == "__main__":
    main(sys.argv)
