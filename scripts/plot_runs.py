#!/usr/bin/env python3
"""plot_runs.py RUNS.json OUT_PREFIX: the pictures of a set of runs (one
--json record per line, e.g. make demo's runs/demo.json), drawn by gnuplot:

  OUT_PREFIX_losses.png  the loss curves overlaid (picotron's way of showing
                         that every configuration computes the same math);
                         runs whose losses are equal to the bit share one
                         curve, its title naming them all;
  OUT_PREFIX_memory.png  the device per rank, one bar per stage: model states
                         by category, activations and buffers apart, the
                         model states' formula as a marker and --hbm-gb as a
                         line; host and NVMe memory in a second panel;
  OUT_PREFIX_comm.png    bytes per rank per step by collective, one bar per
                         stage; 3d_parallel's by process group (tp, pp, the
                         embedding's tie, dp), as stage 07 teaches them;
  OUT_PREFIX_hosts.png   where zero3 runs with ZeRO++ or on several hosts:
                         its bytes per rank per step by hop, in the host and
                         across hosts (zero3's record, "zeropp");
  OUT_PREFIX_timeline.png  the device over the last step of each run, one
                         panel per run (and per pipeline stage of 07): the
                         categories stacked at every phase boundary
                         (measured), the formula's total over them as a
                         dashed line, and its peak marked with the phase it
                         falls in and what it holds there.

The loss curves are also drawn in the terminal, numbered, with the runs of
each number listed below the drawing. Without gnuplot it says so and draws
nothing (make deps installs it).

Every string of a record (a stage's name, a precision) reaches gnuplot as a
quoted string literal, quotes doubled and control characters as spaces, so
a record cannot break gnuplot's script or add commands to it. A line that is
not a record as the trainers write it (not JSON, a member of another type:
an edited "hpz": "2") is refused in one line naming it, exit status 2.
"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "all_to_all"]
HOPS = ["forward_gather", "backward_gather", "grads_in_host", "grads_across"]  # zero3's, as its record names them
HOP_TITLES = {"forward_gather": "forward gathers", "backward_gather": "backward gathers",
              "grads_in_host": "gradients (reduce-scatter, or qgZ in the host)",
              "grads_across": "gradients (qgZ across hosts)"}
TERMINAL_COLUMNS = 100  # the terminal drawing's width


# The members the pictures read, and the type of each in a trainer's record
# (an int is a whole number, never a bool; "number" takes either kind).
RECORD_TYPES = {"stage": str, "ranks": int, "grad_accum": int, "losses": list, "mem": dict, "first_step": int,
                "precision": str, "recompute": str, "grid": dict, "zeropp": dict}
REQUIRED = ["stage", "ranks", "losses", "mem"]
ZEROPP_TYPES = {"quantize_weights": int, "hpz": int, "quantize_grads": int, "grad_bits": int, "hosts": int,
                "hops": dict}  # the switches as 0 or 1
TYPE_WORDS = {str: "a string", int: "a whole number", list: "a list", dict: "an object", "number": "a number"}


def of_type(value, kind):
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def record_fault(rec):
    """Why a parsed line is not a record the pictures can read ("zeropp.hpz is '2', where ..."), or None."""
    if not isinstance(rec, dict):
        return f"it is {json.dumps(rec)[:40]}, not a JSON object"
    for key in REQUIRED:
        if key not in rec:
            return f"it has no \"{key}\""
    checks = [(key, rec[key], kind) for key, kind in RECORD_TYPES.items() if rec.get(key) is not None]
    checks += [(f"losses[{i}]", x, "number") for i, x in enumerate(rec["losses"]) if isinstance(rec["losses"], list)
               and x is not None]
    zp = rec.get("zeropp")
    if isinstance(zp, dict):
        checks += [(f"zeropp.{key}", zp.get(key), kind) for key, kind in ZEROPP_TYPES.items()]
        hops = zp.get("hops") if isinstance(zp.get("hops"), dict) else {}
        checks += [(f"zeropp.hops.{hop}", hops.get(hop), dict) for hop in HOPS]
        checks += [(f"zeropp.hops.{hop}.{where}", hops[hop].get(where), "number") for hop in HOPS
                   if isinstance(hops.get(hop), dict) for where in ("intra", "cross")]
    for name, value, kind in checks:
        if not of_type(value, kind):
            return f"{name} is {json.dumps(value)[:40]}, where a trainer's record has {TYPE_WORDS[kind]}"
    return None


def read_records(runs):
    """The records of RUNS.json, one per non-empty line; a line that is not one ends the program (exit 2)."""
    recs = []
    for n, line in enumerate(runs.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            fault = f"it is not JSON ({e})"
        else:
            fault = record_fault(rec)
        if fault:
            print(f"plot_runs.py: error: {runs} line {n}: {fault}; give the records the trainers wrote (--json), "
                  "unedited, one per line", file=sys.stderr)
            sys.exit(2)
        recs.append(rec)
    return recs


def gp(text):
    """text as a gnuplot string literal: single-quoted (where only a doubled
    quote is special), on one line."""
    return "'" + re.sub(r"[\x00-\x1f\x7f]", " ", str(text)).replace("'", "''") + "'"


def label(rec):
    rc = rec.get("recompute", "none")
    accum = rec.get("grad_accum", 1)
    grid = rec.get("grid")
    text = f"{rec['stage']} N={rec['ranks']}"
    if grid:
        text += f" tp{grid['tp']} pp{grid['pp']}"
    if accum > 1:
        text += f" accum {accum}"
    if rec.get("precision", "bf16") != "bf16":
        text += f" {rec['precision']}"
    if state_bytes(rec["mem"]["device"], "grads_accum_fp32") or state_bytes(rec["mem"].get("pinned", {}), "grads_accum_fp32"):
        text += " fp32-accum"
    text += zeropp_label(rec.get("zeropp"))
    return text + (f" recompute {rc}" if rc != "none" else "")


def zeropp_label(zp):
    """zero3's ZeRO++ switches, where any is on: " qwZ hpZ2 qgZ4"."""
    if not zp:
        return ""
    text = " qwZ" if zp["quantize_weights"] else ""
    text += f" hpZ{zp['hpz']}" if zp["hpz"] > 1 else ""
    text += f" qgZ{zp['grad_bits']}" if zp["quantize_grads"] else ""
    return text + (f" on {zp['hosts']} hosts" if zp["hosts"] > 1 else "")


def coinciding(recs):
    """Runs grouped by their losses, equal to the bit (in order of first appearance)."""
    groups = []
    for rec in recs:
        key = (rec.get("first_step", 0), tuple(rec["losses"]))
        for g in groups:
            if g[0] == key:
                g[1].append(rec)
                break
        else:
            groups.append((key, [rec]))
    return [g[1] for g in groups]


def curve_title(group):
    """One curve's title: its run, or the runs whose losses coincide."""
    if len(group) == 1:
        return label(group[0])
    ranks = {r["ranks"] for r in group}
    if len(ranks) == 1:  # "N=4: dp_baseline, zero1, ..."
        n = f"N={ranks.pop()}"
        return n + ": " + ", ".join(label(r).replace(" " + n, "") for r in group) + " (equal to the bit)"
    return ", ".join(label(r) for r in group) + " (equal to the bit)"


def write_losses(recs, tmp):
    """The loss curves' data; returns the plot items with their titles (for
    the pictures), the same numbered (for the terminal, whose key a long
    title overruns) and the titles."""
    data = Path(tmp, "losses.dat")
    groups = coinciding(recs)
    with data.open("w") as f:
        for group in groups:
            rec = group[0]
            first = rec.get("first_step", 0)
            for i, loss in enumerate(rec["losses"]):
                f.write(f"{first + i + 1} {loss}\n")
            f.write("\n\n")
    titles = [curve_title(g) for g in groups]
    curves = [f"{gp(data)} index {i} with lines lw 2 title " for i in range(len(groups))]
    return (", ".join(c + gp(t) for c, t in zip(curves, titles)),
            ", ".join(c + gp(f" {i + 1}") for i, c in enumerate(curves)), titles)


def terminal_legend(titles):
    """The terminal drawing's numbers and the runs each stands for, wrapped to its width."""
    lines = []
    for i, title in enumerate(titles):
        head = f"  {i + 1:>2}  "
        lines += textwrap.wrap(title, TERMINAL_COLUMNS, initial_indent=head, subsequent_indent=" " * len(head),
                               break_on_hyphens=False)
    return "\n".join(lines)


STATE_CATS = ["params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v"]
ACCUM_CAT = "grads_accum_fp32"  # --grad-accum-dtype fp32: drawn only where a run has it
HPZ_CAT = "params_hpz"  # zero3's hpZ secondary partition: drawn only where a run has it
BUFFER_CATS = ["workspace", "comm_buffers"]


def state_bytes(dev, cat):
    """A state's bytes on a tier: an fp16 run names its 16-bit params and grads
    params_fp16 and grads_fp16; a run without an fp32 accumulator has none."""
    for name in (cat, cat.replace("bf16", "fp16")):
        if name in dev:
            return dev[name]["current"]
    return 0


def state_cats(recs):
    """The model-state categories to draw: the five, and the fp32 accumulator where a run holds one."""
    has_accum = any(state_bytes(r["mem"]["device"], ACCUM_CAT) > 0 for r in recs)
    has_hpz = any(state_bytes(r["mem"]["device"], HPZ_CAT) > 0 for r in recs)
    return STATE_CATS + ([ACCUM_CAT] if has_accum else []) + ([HPZ_CAT] if has_hpz else [])


def device_columns(rec, cats):
    """The device bar's segments: model states by category, activations, buffers (bytes)."""
    dev = rec["mem"]["device"]
    cols = [state_bytes(dev, c) for c in cats]
    cols.append(dev["activations"]["current"] + dev.get("act_working", {"current": 0})["current"])
    cols.append(sum(dev[c]["current"] for c in BUFFER_CATS if c in dev))
    return cols


def offdevice_columns(recs):
    """(tier, category) pairs off the device that hold bytes in any run."""
    cols = []
    for rec in recs:
        for tier, cats in rec["mem"].items():
            if tier == "device":
                continue
            for cat, v in cats.items():
                if cat != "peak_total" and v["current"] > 0 and (tier, cat) not in cols:
                    cols.append((tier, cat))
    return cols


def write_table(path, recs, columns, value):
    """One row of MB per run, numbers only: the runs' names go to gnuplot as
    the tics of xtics(), quoted there."""
    with path.open("w") as f:
        for rec in recs:
            f.write(" ".join(f"{value(rec, c) / 1e6:.6f}" for c in columns) + "\n")


def xtics(recs):
    """The bars' names, bar i at x = i (as a row-stacked histogram places them)."""
    return "set xtics (" + ", ".join(f"{gp(label(r))} {i}" for i, r in enumerate(recs)) + ")\n"


# one colour per category (the same on every tier); off the device the tier
# is the fill: hatched in pinned/host memory, dotted on NVMe
COLOURS = {"params_bf16": "#7b3294", "grads_bf16": "#1b9e77", "master_fp32": "#3288bd", "adam_m": "#e6ab02",
           "adam_v": "#f46d43", "grads_accum_fp32": "#66c2a5", "params_hpz": "#c2a5cf", "activations": "#66a61e", "act_working": "#b2df8a", "buffers": "#a6761d",
           "comm_buffers": "#444444", "workspace": "#a6761d",
           "all_reduce": "#3288bd", "reduce_scatter": "#1b9e77", "all_gather": "#7b3294", "broadcast": "#e6ab02",
           "send": "#f46d43", "recv": "#a6761d", "all_to_all": "#66a61e", "tp": "#d95f02", "pp": "#7570b3", "emb": "#e7298a",
           "dp": "#1b9e77"}
FILLS = {"device": "solid 0.85", "host": "pattern 4", "pinned": "pattern 5", "nvme": "pattern 2"}
GROUPS = ["tp", "pp", "emb", "dp"]  # 07's process groups, in its report's order


def stacked(data, columns, titles):
    cols = []
    for i, ((a, b), t) in enumerate(zip(columns, titles)):
        colour, fill = (COLOURS.get(b, "#999999"), FILLS.get(a, "solid 0.85")) if b else (COLOURS.get(a), "solid 0.85")
        cols.append(f"{gp(data)} using {i + 1} title {gp(t)} lc rgb {gp(colour)} fs {fill}")
    return ", ".join(cols)


HISTOGRAM = """
set style data histograms
set style histogram rowstacked
set style fill border -1
set boxwidth 0.6
set xtics rotate by -25
set grid ytics
"""


def memory_script(recs, tmp, prefix):
    """The memory picture: the device per rank above, host and NVMe below
    (where any run holds bytes there), bar i the same run in both, each
    panel as wide as the picture less its key, so that the names fit."""
    cats = state_cats(recs)
    dev = Path(tmp, "device.dat")
    with dev.open("w") as f:
        for rec in recs:
            f.write(" ".join(f"{v / 1e6:.6f}" for v in device_columns(rec, cats)) + "\n")
    formula = Path(tmp, "formula.dat")
    with formula.open("w") as f:
        for i, rec in enumerate(recs):
            f.write(f"{i} {rec['mem_formula']['device']['total'] / 1e6:.6f}\n")
    dev_cols = [(c, "") for c in cats] + [("activations", ""), ("buffers", "")]
    dev_titles = cats + ["activations", "buffers (workspace, comm)"]
    budgets = {r["settings"]["hbm-gb"]["value"] for r in recs if r.get("settings", {}).get("hbm-gb", {}).get("value")}
    budget = f", {max(budgets) * 1e3} with lines dt 2 lw 2 lc 'red' title 'device budget (--hbm-gb)'" if budgets else ""
    off_cols = offdevice_columns(recs)
    height = 1100 if off_cols else 600
    script = f"""
set terminal pngcairo size 1400,{height} noenhanced
set output {gp(prefix + "_memory.png")}
set multiplot
set lmargin at screen 0.06
set rmargin at screen 0.76
set key outside right top vertical Left reverse
{HISTOGRAM}
{xtics(recs)}
set origin 0,{0.5 if off_cols else 0}
set size 1,{0.5 if off_cols else 1}
set title 'device, per rank after the last step (measured; dot: model states by formula)'
set ylabel 'MB'
plot {stacked(dev, dev_cols, dev_titles)}, {gp(formula)} using 1:2 with points pt 7 ps 1.6 lc 'black' title 'model states, formula'{budget}
"""
    if off_cols:
        off = Path(tmp, "offdevice.dat")
        write_table(off, recs, off_cols, lambda r, c: r["mem"].get(c[0], {}).get(c[1], {"current": 0})["current"])
        script += f"""
set origin 0,0
set size 1,0.5
set title 'host (hatched) and NVMe (dotted), per rank after the last step (measured)'
plot {stacked(off, off_cols, [f"{a}/{b}" for a, b in off_cols])}
"""
    return script + "unset multiplot\nset lmargin -1\nset rmargin -1\n"


def comm_value(rec, col):
    op = col[0]
    grid = rec.get("grid")
    if grid:  # rank 0's measured bytes by group; its ops are in the groups
        return grid["ranks"][0]["comm"][op][0] if op in GROUPS else 0
    return rec.get("comm_bytes_by_op_per_step", {}).get(op, 0) if op not in GROUPS else 0


def hosts_script(recs, tmp, prefix):
    """zero3's bytes by hop, in the host (solid) and across hosts (hatched),
    one bar per zero3 run; "" where no run has ZeRO++ or several hosts, or
    none moved a byte (one rank)."""
    runs = [r for r in recs if r.get("zeropp") and zeropp_label(r["zeropp"])]
    data = Path(tmp, "hosts.dat")
    cols = [(hop, where) for where in ("intra", "cross") for hop in HOPS
            if any(r["zeropp"]["hops"][hop][where] > 0 for r in runs)]
    if not cols:
        return ""
    write_table(data, runs, cols, lambda r, c: r["zeropp"]["hops"][c[0]][c[1]])
    items = []
    for i, (hop, where) in enumerate(cols):
        fill = "solid 0.85" if where == "intra" else "pattern 4"
        colour = ["#7b3294", "#3288bd", "#1b9e77", "#d95f02"][HOPS.index(hop)]
        title = f"{HOP_TITLES[hop]}, {'in the host' if where == 'intra' else 'across hosts'}"
        items.append(f"{gp(data)} using {i + 1} title {gp(title)} lc rgb {gp(colour)} fs {fill}")
    return f"""
set terminal pngcairo size 1200,750 noenhanced
set output {gp(prefix + "_hosts.png")}
set origin 0,0
set size 1,1
set title 'zero3: bytes per rank per step by hop, in the host (solid) and across hosts (hatched), counted'
set ylabel 'MB'
set key below left Left reverse maxrows 4
{HISTOGRAM}
{xtics(runs)}
plot {", ".join(items)}
"""


TIMELINE_MAX_PANELS = 8  # a taller picture than this says which it left out
PHASE_LETTER = {"forward": "F", "backward": "B", "weights": "W", "recompute": "R", "optimizer": "opt", "eval": "eval", "setup": "end"}


def phase_text(p):
    """A phase as the report writes it: "backward of unit 4, micro-batch 0"."""
    if p["unit"] < 0:
        return "the optimizer step" if p["kind"] == "optimizer" else p["kind"]
    return f"{p['kind']} of unit {p['unit']}, micro-batch {p['micro']}"


def timeline_panels(recs):
    """(record, panel) for each panel of each record whose step the formula models."""
    out = []
    for rec in recs:
        tl = rec.get("memory_timeline") or {}
        for panel in tl.get("panels", []):
            if panel.get("measured"):
                out.append((rec, panel))
    return out


def timeline_script(recs, tmp, prefix):
    """The step's device memory over its phase boundaries, a panel each;
    "" where no record has a modelled step's boundaries."""
    panels = timeline_panels(recs)
    if not panels:
        return ""
    left_out = panels[TIMELINE_MAX_PANELS:]
    panels = panels[:TIMELINE_MAX_PANELS]
    script = f"""
set terminal pngcairo size 1400,{330 * len(panels) + 40} noenhanced
set output {gp(prefix + "_timeline.png")}
set origin 0,0
set size 1,1
set multiplot layout {len(panels)},1
set lmargin at screen 0.06
set rmargin at screen 0.76
set key outside right top vertical Left reverse
set grid ytics
set style fill solid 0.85 border -1
set ylabel 'MB'
"""
    for k, (rec, panel) in enumerate(panels):
        cats = rec["memory_timeline"]["categories"]
        rows = panel["measured"]
        shown = [i for i, c in enumerate(cats) if any(r["bytes"][i] for r in rows)]
        formula = [sum(b["bytes"]) for b in panel["formula"]]
        data = Path(tmp, f"timeline{k}.dat")
        with data.open("w") as f:
            for x, row in enumerate(rows):
                running, sums = 0, []
                for i in shown:
                    running += row["bytes"][i]
                    sums.append(running / 1e6)
                total = formula[x] / 1e6 if x < len(formula) else float("nan")
                f.write(f"{x} " + " ".join(f"{v:.6f}" for v in sums) + f" {total:.6f}\n")
            # the last boundary's bytes hold until the step ends
            f.write(f"{len(rows)} " + " ".join(f"{v:.6f}" for v in sums) + f" {total:.6f}\n")
        letters = []
        for x, row in enumerate(rows):
            p = row["phase"]
            tag = PHASE_LETTER.get(p["kind"], p["kind"]) + (str(p["unit"]) if p["unit"] >= 0 else "")
            if len(rows) <= 48 or x % 4 == 0:
                letters.append(f"{gp(tag)} {x}")
        peak = panel["formula_peak"] / 1e6
        held = sorted(range(len(cats)), key=lambda i: -panel["formula_peak_bytes"][i])[:3]
        holds = ", ".join(f"{cats[i]} {panel['formula_peak_bytes'][i] / 1e6:.2f}" for i in held
                          if panel["formula_peak_bytes"][i] > 0)
        where = phase_text(panel["formula_peak_phase"])
        items = []
        for j in reversed(range(len(shown))):  # the tallest first: each lower sum paints over it
            name = cats[shown[j]]
            items.append(f"{gp(data)} using 1:{j + 2} with fillsteps lc rgb {gp(COLOURS.get(name, '#999999'))} "
                         f"title {gp(name)}")
        items.append(f"{gp(data)} using 1:{len(shown) + 2} with steps lw 2 dt 2 lc 'black' "
                     "title 'formula total (step_memory.c)'")
        title = f"{label(rec)}, rank {panel['of_rank']}: device over the last step, measured at each phase boundary"
        script += f"""
set title {gp(title)}
set xtics ({", ".join(letters)}) rotate by -60 font ',8'
set xrange [0:{len(rows)}]
set yrange [0:{peak * 1.15:.6f}]
unset arrow
unset label
set arrow from graph 0, first {peak:.6f} to graph 1, first {peak:.6f} nohead dt 3 lw 1.5 lc 'red'
set label {gp(f"formula's peak {peak:.3f} MB, during {where}: {holds} MB")} at graph 0.01, first {peak:.6f} offset 0,0.6 font ',9'
plot {", ".join(items)}
"""
    script += "unset multiplot\nunset arrow\nunset label\nset lmargin -1\nset rmargin -1\nset xrange [*:*]\nset yrange [*:*]\n"
    if left_out:
        names = ", ".join(f"{label(r)} rank {p['of_rank']}" for r, p in left_out)
        print(f"plot_runs: the timeline picture shows the first {TIMELINE_MAX_PANELS} panels; left out: {names}")
    return script


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_runs.py RUNS.json OUT_PREFIX")
    runs, prefix = Path(sys.argv[1]), sys.argv[2]
    recs = read_records(runs)
    if not recs:
        sys.exit(f"plot_runs.py: no records in {runs}")
    if not shutil.which("gnuplot"):
        print("plot_runs: gnuplot not found (make deps installs it); no pictures")
        return
    with tempfile.TemporaryDirectory() as tmp:
        loss_plots, numbered_plots, loss_titles = write_losses(recs, tmp)
        comm = Path(tmp, "comm.dat")
        comm_cols = [(c, "") for c in OPS + GROUPS if any(comm_value(r, (c, "")) for r in recs)]
        write_table(comm, recs, comm_cols, comm_value)
        titles = [c if c not in GROUPS else f"{c} group (3d_parallel)" for c, _ in comm_cols]
        script = f"""
set termoption noenhanced
set terminal pngcairo size 1200,600 noenhanced
set output {gp(prefix + "_losses.png")}
set xlabel 'step'
set ylabel 'training loss (nats/token)'
set grid
set key below left Left reverse
plot {loss_plots}
set terminal dumb size {TERMINAL_COLUMNS},28 noenhanced
set output
plot {numbered_plots}
unset xlabel
{memory_script(recs, tmp, prefix)}
"""
        if comm_cols:
            script += f"""
set terminal pngcairo size 1200,600 noenhanced
set output {gp(prefix + "_comm.png")}
set origin 0,0
set size 1,1
set title 'bytes per rank per step, counted (ring volume): by collective; 3d_parallel by process group (rank 0)'
set ylabel 'MB'
set key outside right top vertical
{HISTOGRAM}
{xtics(recs)}
plot {stacked(comm, comm_cols, titles)}
"""
        hosts = hosts_script(recs, tmp, prefix)
        script += hosts
        timeline = timeline_script(recs, tmp, prefix)
        script += timeline
        sys.stdout.flush()
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(terminal_legend(loss_titles))
    made = [f"{prefix}_losses.png", f"{prefix}_memory.png"] + ([f"{prefix}_comm.png"] if comm_cols else [])
    made += [f"{prefix}_hosts.png"] if hosts else []
    made += [f"{prefix}_timeline.png"] if timeline else []
    print("pictures: " + ", ".join(made))


if __name__ == "__main__":
    main()
