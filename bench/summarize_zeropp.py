#!/usr/bin/env python3
"""summarize_zeropp.py OUT CLUSTER RATE ROUNDS WHY: bench/zeropp.sh's runs as
one JSON object on stdout, and a table on stderr: per mode, the final loss
beside zero3's and the bytes per step across hosts; on the cluster, the time
in communication and the step, each run beside memory_math's planner."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

BUSBW_SIZES = (65536, 1048576)  # the probe sizes that bracket what zero3 sends on small
TAGS = ["zero3", "qwZ", "hpZ", "qgZ8", "qgZ4", "all"]
SWITCHES = {"zero3": [], "qwZ": ["--quantize-weights"], "hpZ": ["--hpz-size", "2"], "qgZ8": ["--quantize-grads"],
            "qgZ4": ["--quantize-grads", "--grad-quant-bits", "4"],
            "all": ["--quantize-weights", "--hpz-size", "2", "--quantize-grads"]}
# the planner's row of each mode (memory_math names zero3's modes so)
ROW = {"zero3": "zero3", "qwZ": "zero3+qwZ", "hpZ": "zero3+hpZ", "qgZ8": "zero3+qgZ", "qgZ4": "zero3+qgZ",
       "all": "zero3++"}
MM = ["./memory_math", "--model", "small", "--ranks", "4", "--batch", "2", "--ranks-per-host", "2"]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def memory_math(tag, *extra):
    cmd = MM + SWITCHES[tag] + list(extra) + ["--json"]
    return " ".join(cmd[:-1]), json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def cross_formula(tag):
    """Bytes across hosts per step at 2 hosts of 2, by memory_math's formula."""
    _, j = memory_math(tag)
    modes = j["zeropp"]["modes"]
    return modes[0 if tag == "zero3" else 1]["across_bytes"]


def late_mean(losses):
    return sum(losses[-10:]) / len(losses[-10:])


def curves(out, cluster):
    recs = records(out / "curves.json")
    assert len(recs) == len(TAGS), f"{len(recs)} curve runs, expected {len(TAGS)}"
    base = recs[0]
    fig = {"where": "2 emulated hosts of 2 ranks" if cluster else "one host, 4 ranks", "steps": len(base["losses"]),
           "bytes_across_from": "counted (the runs' records)" if cluster else "memory_math's formula at 2 hosts of 2",
           "modes": {}}
    for tag, rec in zip(TAGS, recs):
        zp = rec["zeropp"]
        across = zp["cross_host_bytes_per_step"] if cluster else cross_formula(tag)
        fig["modes"][tag] = {
            "switches": " ".join(SWITCHES[tag]), "final_loss": rec["losses"][-1],
            "final_loss_diff": rec["losses"][-1] - base["losses"][-1],
            "last10_mean_diff": late_mean(rec["losses"]) - late_mean(base["losses"]),
            "val_loss": rec["val_loss"], "val_loss_diff": rec["val_loss"] - base["val_loss"],
            "cross_host_bytes_per_step": across, "intra_host_bytes_per_step": zp["intra_host_bytes_per_step"],
        }
    z = fig["modes"]["zero3"]["cross_host_bytes_per_step"]
    for m in fig["modes"].values():
        m["cross_host_of_zero3"] = m["cross_host_bytes_per_step"] / z if z else None
    return fig


def gflops_of(r):
    """A rank's compute rate: model FLOPs of its tokens over its compute time (a one-host run)."""
    return r["flops_per_token"] * r["global_batch_tokens"] / r["ranks"] / (r["times_ms_per_step"]["compute"] * 1e-3) / 1e9


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def timing(out, rate, rounds):
    probe = json.loads((out / "probe.json").read_text())
    link_gbps, latency_us = probe["link_GBps"] * 8, probe["latency_us"]
    # what zero3's collectives reach on this link: the busbw of the nonblocking all-gather and reduce-scatter
    # (the calls zero3 issues) at the sizes it sends (small's units and buckets, 80 KB to 400 KB: the probe's
    # 64 KB to 1 MB), the median of those six figures; one size of one collective alone swings from run to
    # run (the all-gather at 256 KB: 0.70 and 0.46 of a 50 Mbit/s link in two runs)
    used = [row for kind in ("iall_gather", "ireduce_scatter") for row in probe[kind]
            if BUSBW_SIZES[0] <= row["bytes"] <= BUSBW_SIZES[1]]
    busbw = statistics.median(row["busbw_GBps"] for row in used)
    fig = {"rate": rate, "rounds": rounds, "link_GBps": probe["link_GBps"], "latency_us": latency_us,
           "busbw_GBps": busbw, "busbw_from": "median of the nonblocking all-gather's and reduce-scatter's busbw at "
           f"{BUSBW_SIZES[0]} to {BUSBW_SIZES[1]} B ({len(used)} figures)", "probe": probe, "modes": {}}
    for tag in TAGS:
        runs, cals = records(out / f"timing_{tag}.json"), records(out / f"calibration_{tag}.json")
        assert len(runs) == len(cals) == rounds, (tag, len(runs), len(cals))
        rows = {"at_rate": [], "at_busbw": []}
        for run, cal in zip(runs, cals):
            g = gflops_of(cal)
            for key, gbps in (("at_rate", link_gbps), ("at_busbw", busbw * 8)):
                cmd, j = memory_math(tag, "--link-gbps", f"{gbps:.4g}", "--latency-us", f"{latency_us:.1f}",
                                     "--gflops", f"{g:.2f}")
                row = next(r for r in j["step_time"]["stages"] if r["stage"] == ROW[tag])
                rows[key].append({"predicted_step_ms": row["step_serial_ms"], "predicted_comm_ms": row["comm_ms"],
                                  "measured_over_predicted": run["step_ms_median"] / row["step_serial_ms"],
                                  "gflops": g, "command": cmd})
        m = {"step_ms": spread([r["step_ms_median"] for r in runs]),
             "comm_ms": spread([r["times_ms_per_step"]["comm"] for r in runs]),
             "cross_host_bytes_per_step": runs[0]["zeropp"]["cross_host_bytes_per_step"]}
        for key in rows:
            m[key] = {"predicted_step_ms": spread([r["predicted_step_ms"] for r in rows[key]]),
                      "measured_over_predicted": spread([r["measured_over_predicted"] for r in rows[key]]),
                      "commands": [r["command"] for r in rows[key]]}
        m["gflops_per_rank"] = spread([r["gflops"] for r in rows["at_rate"]])
        fig["modes"][tag] = m
    z = fig["modes"]["zero3"]
    for m in fig["modes"].values():
        m["comm_time_cut"] = z["comm_ms"]["median"] / m["comm_ms"]["median"]
        m["cross_host_of_zero3"] = m["cross_host_bytes_per_step"] / z["cross_host_bytes_per_step"]
    return fig


def main():
    out, cluster, rate, rounds, why = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], int(sys.argv[4]), sys.argv[5]
    result = {"what": "zero3 against its ZeRO++ modes (qwZ, hpZ K=2, qgZ int8 and int4, all three) at 4 ranks on "
                      "small, batch 2: the losses beside the bytes across hosts, and on 2 emulated hosts with a shaped "
                      "link the time in communication beside memory_math's planner",
              "curves": curves(out, cluster)}
    result["timing"] = timing(out, rate, rounds) if cluster else {"skipped": why}
    c = result["curves"]
    print(f"curves: {c['steps']} steps on {c['where']}; bytes across hosts {c['bytes_across_from']}", file=sys.stderr)
    print(f"  {'mode':6} {'final loss':>10} {'- zero3':>9} {'last 10 - zero3':>16} {'val - zero3':>12} "
          f"{'across hosts B/step':>20} {'of zero3':>9}", file=sys.stderr)
    for tag, m in c["modes"].items():
        print(f"  {tag:6} {m['final_loss']:10.4f} {m['final_loss_diff']:+9.4f} {m['last10_mean_diff']:+16.4f} "
              f"{m['val_loss_diff']:+12.4f} {m['cross_host_bytes_per_step']:20.0f} {m['cross_host_of_zero3']:9.3f}",
              file=sys.stderr)
    t = result["timing"]
    if "skipped" not in t:
        print(f"timing at {rate} ({t['rounds']} interleaved rounds; planner at the link's rate and at the probe's "
              f"busbw {t['busbw_GBps'] * 8e3:.1f} Mbit/s ({t['busbw_from']}), latency {t['latency_us']:.0f} us)",
              file=sys.stderr)
        print(f"  {'mode':6} {'comm ms (min-max)':>22} {'cut':>5} {'step ms':>8} {'predicted':>10} {'meas/pred':>10} "
              f"{'at busbw':>9} {'meas/pred':>10}", file=sys.stderr)
        for tag, m in t["modes"].items():
            print(f"  {tag:6} {m['comm_ms']['median']:8.1f} ({m['comm_ms']['min']:.0f}-{m['comm_ms']['max']:.0f}) "
                  f"{m['comm_time_cut']:5.2f} {m['step_ms']['median']:8.1f} "
                  f"{m['at_rate']['predicted_step_ms']['median']:10.1f} "
                  f"{m['at_rate']['measured_over_predicted']['median']:10.2f} "
                  f"{m['at_busbw']['predicted_step_ms']['median']:9.1f} "
                  f"{m['at_busbw']['measured_over_predicted']['median']:10.2f}", file=sys.stderr)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
