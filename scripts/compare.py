#!/usr/bin/env python3
"""compare.py: is a timing difference real, or noise? Runs each command
several times, interleaved (A B A B ...), so that a change in the machine's
load hits every variant alike, and prints each variant's median, its spread
over the repeats, and whether the medians differ by more than that spread.

    python3 scripts/compare.py --np 4 --repeats 5 \\
        "./zero2 --model small --batch 2 --steps 10 --bucket-mb 0.05" \\
        "./zero2 --model small --batch 2 --steps 10 --bucket-mb 5"

Each command is a trainer's command line without mpirun; compare.py adds
mpirun (with scripts/mpi-env.sh's settings), --quiet and --json, and reads
the record: tokens/s (from the median step), the mean step time and the
exposed communication, both per step as the report measures them.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_orte_execute_quiet": "1",
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}


def run_once(cmd, ranks, json_path):
    argv = ["mpirun", "-np", str(ranks)] + shlex.split(cmd) + ["--quiet", "--json", json_path]
    env = dict(os.environ, **MPI_ENV)
    done = subprocess.run(argv, cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"compare.py: '{cmd}' failed (exit {done.returncode}): {done.stderr.strip()}")
    lines = Path(json_path).read_text().splitlines()
    rec = json.loads(lines[-1])
    times = rec["times_ms_per_step"]
    return {"tokens_per_s": rec["tokens_per_s"], "step_ms": times["step"], "exposed_ms": times["comm_exposed"]}


def spread(values):
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commands", nargs="+", help="trainer command lines (without mpirun), one per variant")
    ap.add_argument("--np", type=int, default=4, help="ranks (mpirun -np), default 4")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each variant, interleaved; default 5")
    args = ap.parse_args()
    if args.repeats < 2 or args.np < 1:
        sys.exit("compare.py: --repeats must be at least 2 and --np at least 1 (a spread needs two runs)")
    runs = {c: [] for c in args.commands}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for i, c in enumerate(args.commands):
                print(f"round {r + 1}/{args.repeats}: variant {chr(65 + i)}", file=sys.stderr, flush=True)
                runs[c].append(run_once(c, args.np, f"{tmp}/{r}-{i}.json"))
    print(f"{args.repeats} interleaved runs per variant on {args.np} ranks; medians [min .. max]")
    base = None
    for i, c in enumerate(args.commands):
        tps = [x["tokens_per_s"] for x in runs[c]]
        step = statistics.median(x["step_ms"] for x in runs[c])
        exposed = statistics.median(x["exposed_ms"] for x in runs[c])
        med = statistics.median(tps)
        print(f"  {chr(65 + i)}: {med:9.0f} tok/s [{min(tps):.0f} .. {max(tps):.0f}], spread {100 * spread(tps):4.1f}%,"
              f" step {step:.1f} ms, exposed comm {exposed:.1f} ms   {c}")
        if base is None:
            base = tps
            continue
        ratio = med / statistics.median(base)
        noise = max(spread(base), spread(tps))
        verdict = "larger than the spread: a real difference" if abs(ratio - 1) > noise else \
            "within the spread: noise, not a difference"
        print(f"     {chr(65 + i)}/A tokens/s {ratio:.3f}: {verdict} ({100 * noise:.1f}%)")


if __name__ == "__main__":
    main()
