#!/usr/bin/env python3
"""plot_runs.py RUNS.json OUT_PREFIX: the pictures of a set of runs (one
--json record per line, e.g. make demo's runs/demo.json), drawn by gnuplot:

  OUT_PREFIX_losses.png  the loss curves overlaid (picotron's way of showing
                         that every configuration computes the same math);
  OUT_PREFIX_memory.png  memory per rank by tier and category, stacked, one
                         bar per stage: the stages' real difference;
  OUT_PREFIX_comm.png    bytes per rank per step by collective, one bar per
                         stage.

The loss curves are also drawn in the terminal. Without gnuplot it says so
and draws nothing (make deps installs it).
"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv"]


def label(rec):
    rc = rec.get("recompute", "none")
    return f"{rec['stage']} N={rec['ranks']}" + (f" recompute {rc}" if rc != "none" else "")


def write_losses(recs, tmp):
    data = Path(tmp, "losses.dat")
    with data.open("w") as f:
        for rec in recs:
            first = rec.get("first_step", 0)
            for i, loss in enumerate(rec["losses"]):
                f.write(f"{first + i + 1} {loss}\n")
            f.write("\n\n")
    plots = ", ".join(f"'{data}' index {i} with lines title '{label(r)}'" for i, r in enumerate(recs))
    return plots


def memory_columns(recs):
    """(tier, category) pairs that hold bytes in any run, in the report's order."""
    cols = []
    for rec in recs:
        for tier, cats in rec["mem"].items():
            for cat, v in cats.items():
                if cat != "peak_total" and v["current"] > 0 and (tier, cat) not in cols:
                    cols.append((tier, cat))
    return cols


def write_table(path, recs, columns, value):
    with path.open("w") as f:
        f.write("stage " + " ".join(f"{a}/{b}" if b else a for a, b in columns) + "\n")
        for rec in recs:
            f.write(f"\"{label(rec)}\" " + " ".join(f"{value(rec, c) / 1e6:.6f}" for c in columns) + "\n")


# one colour per category (the same on every tier); the tier is the fill:
# solid on the device, hatched on pinned/host memory, dotted on NVMe
COLOURS = {"params_bf16": "#7b3294", "grads_bf16": "#1b9e77", "master_fp32": "#3288bd", "adam_m": "#e6ab02",
           "adam_v": "#f46d43", "activations": "#66a61e", "act_working": "#b2df8a", "comm_buffers": "#444444",
           "workspace": "#a6761d",
           "all_reduce": "#3288bd", "reduce_scatter": "#1b9e77", "all_gather": "#7b3294", "broadcast": "#e6ab02",
           "send": "#f46d43", "recv": "#a6761d"}
FILLS = {"device": "solid 0.85", "host": "pattern 4", "pinned": "pattern 5", "nvme": "pattern 2"}


def stacked_plot(data, columns, title, ylabel):
    cols = []
    for i, (a, b) in enumerate(columns):
        colour, fill = (COLOURS.get(b, "#999999"), FILLS.get(a, "solid 0.85")) if b else (COLOURS.get(a), "solid 0.85")
        cols.append(f"'{data}' using {i + 2}:xtic(1) title columnheader({i + 2}) lc rgb '{colour}' fs {fill}")
    cols = ", ".join(cols)
    return f"""
set title '{title}'
set ylabel '{ylabel}'
set style data histograms
set style histogram rowstacked
set style fill border -1
set boxwidth 0.6
set key outside right top
set xtics rotate by -20
set grid ytics
plot {cols}
"""


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_runs.py RUNS.json OUT_PREFIX")
    runs, prefix = Path(sys.argv[1]), sys.argv[2]
    recs = [json.loads(line) for line in runs.read_text().splitlines() if line.strip()]
    if not recs:
        sys.exit(f"plot_runs.py: no records in {runs}")
    if not shutil.which("gnuplot"):
        print("plot_runs: gnuplot not found (make deps installs it); no pictures")
        return
    with tempfile.TemporaryDirectory() as tmp:
        loss_plots = write_losses(recs, tmp)
        mem_cols = memory_columns(recs)
        mem = Path(tmp, "memory.dat")
        write_table(mem, recs, mem_cols, lambda r, c: r["mem"][c[0]][c[1]]["current"])
        comm = Path(tmp, "comm.dat")
        comm_cols = [(op, "") for op in OPS if any(r.get("comm_bytes_by_op_per_step", {}).get(op, 0) for r in recs)]
        write_table(comm, recs, comm_cols, lambda r, c: r["comm_bytes_by_op_per_step"][c[0]])
        script = f"""
set termoption noenhanced
set terminal pngcairo size 900,540 noenhanced
set output '{prefix}_losses.png'
set xlabel 'step'
set ylabel 'training loss (nats/token)'
set grid
plot {loss_plots}
set terminal dumb size 100,28 noenhanced
set output
plot {loss_plots}
unset xlabel
set terminal pngcairo size 1000,560 noenhanced
set output '{prefix}_memory.png'
{stacked_plot(mem, mem_cols, 'memory per rank after the last step, measured (tier/category)', 'MB')}
"""
        if comm_cols:
            script += f"""
set output '{prefix}_comm.png'
{stacked_plot(comm, comm_cols, 'bytes per rank per step by collective, counted (ring volume)', 'MB')}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    made = [f"{prefix}_losses.png", f"{prefix}_memory.png"] + ([f"{prefix}_comm.png"] if comm_cols else [])
    print("pictures: " + ", ".join(made))


if __name__ == "__main__":
    main()
