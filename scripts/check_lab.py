#!/usr/bin/env python3
"""check_lab.py NN: the checks of lab NN (make check-lab-NN), run in a
student copy made by make lab-NN. It builds the stage, runs it, and prints
each check as pass or fail with the measured and the expected figure, then a
score. Exit status 0 only when every check passes.

The expected figures come from the reference, run on this machine when the
lab was made (.lab/expected.json): the stage's losses must equal them to the
bit where the math is the same. The other checks hold the stage to its own
formulas (bytes by tier and category, communication, transfers) and to
itself (resume reproduces the uninterrupted run).

--record (used by make_lab.py in the reference tree) runs the reference,
checks it passes, and prints the expected figures as JSON, with the time of
the reference's slowest run.

Each run of a check may take TIME_FACTOR times that (at least MIN_LIMIT_S):
past it, its ranks are ended and the check says "timed out after N s (the
reference took M s)"; the checks after it are not run. A rank killed by a
signal is named by it ("segmentation fault"). Whether the grader ends, is
stopped (SIGTERM, Ctrl-C) or a run times out, it ends every process it
started and removes its temporary folder.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path.cwd()
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_orte_execute_quiet": "1",
    "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
MODEL = "--model small --batch 4 --steps 8"
ACCUM = "--batch 2 --grad-accum 2"  # the same global batch in two micro-batches
STATE_CATS = ["params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v"]
# lab 07 at m = 4 micro-batches over P = 2 stages: 1F1B proper (at m <= P it is AFAB)
MANY_MICRO = "--batch 1 --grad-accum 4"
IN_FLIGHT = "1F1B with m = 4 > P = 2: micro-batches in flight per stage equal min(P - s, m)"
# labs 03 and 06: the overlap a technique promises, in counts the stage reports (timings would be noise)
BUCKETS = ("buckets leave during backward: per micro-batch all B = ceil(Ψ/cap) buckets but the last are left "
           "in flight while units still run backward")
READ_AHEAD = ("sub-group reads asked for ahead of their use: every sub-group of every update pass (the pass asks "
              "for k + 1 before the work on k)")
# lab 07's tensor parallelism apart from the pipeline: tp 2 x dp 2 on its 4 ranks
TP_ALONE = "--tp 2 --pp 1"
F_AND_G = f"{TP_ALONE} (Megatron's f and g): losses equal the reference's to the bit"
SEQ_PAR = "--sequence-parallel (f and g as all-gathers and reduce-scatters): losses equal the plain run's to the bit"

# lab: (stage binary, the reference it must equal, extra flags of the main run, tiers holding states)
LABS = {
    "01": ("dp_baseline", "dp_baseline", "", ["device"]),
    "02": ("zero1", "dp_baseline", "", ["device"]),
    "03": ("zero2", "dp_baseline", "--bucket-mb 0.2", ["device"]),
    "04": ("zero3", "dp_baseline", "--bucket-mb 0.2 --prefetch 2", ["device"]),
    "05": ("cpu_offload", "zero2", "", ["device", "pinned"]),
    # {nvme}: a folder for the swap files under the checks' own temporary
    # folder (in the lab's copy, on the disk the copy is on)
    "06": ("infinity", "zero3", "--nvme-path {nvme} --offload-params nvme --sub-group-mb 0.3",
           ["device", "pinned", "nvme"]),
    # the reference's own losses: tensor parallelism adds partial sums in
    # another order than dp_baseline, so the student's code is held to the
    # reference 3d_parallel's bits (1F1B and the f/g all-reduce)
    "07": ("3d_parallel", "3d_parallel", "--tp 2 --pp 2", ["device"]),
}
RANKS = {"07": 4}  # tp 2 x pp 2; the others run on 2 ranks

# A student's run may be slower than the reference's (a first version, a
# loaded machine) but not TIME_FACTOR times slower: then it is taken to hang.
TIME_FACTOR = 10
MIN_LIMIT_S = 10        # start-up alone takes seconds where the machine is busy
UNTIMED_LIMIT_S = 600   # an expected.json recorded before the reference was timed
GRACE_S = 3             # after SIGTERM, before SIGKILL


def session_pids(sid):
    """Processes of session `sid`: mpirun (started in a session of its own) and every rank it forked."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


def end_session(proc):
    """Ends a run: SIGTERM to mpirun (it passes it to the ranks), then SIGKILL to what is left of its session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    for pid in session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def crash_name(status):
    """'segmentation fault (SIGSEGV)' for a run ended by a signal (mpirun exits 128 + its number), else None."""
    number = -status if status < 0 else status - 128 if status > 128 else 0
    try:
        sig = signal.Signals(number)
    except ValueError:
        return None
    return f"{(signal.strsignal(sig) or sig.name).lower()} ({sig.name})"


class Runner:
    def __init__(self, tmp, ranks, reference_s=None):
        """reference_s: the reference's slowest run, which sets the limit of each run (None: the reference itself)."""
        self.tmp, self.n, self.ranks = Path(tmp), 0, ranks
        self.reference_s, self.slowest_s, self.timed_out = reference_s, 0.0, None
        if reference_s is None:
            self.limit_s = UNTIMED_LIMIT_S
        else:
            self.limit_s = max(MIN_LIMIT_S, TIME_FACTOR * reference_s)

    def run(self, binary, flags):
        """Runs a trainer on the lab's ranks; returns its --json record, or the error it died with."""
        ranks = self.ranks
        self.n += 1
        path = self.tmp / f"run{self.n}.json"
        nvme = self.tmp / "nvme"
        nvme.mkdir(exist_ok=True)
        flags = flags.replace("{nvme}", str(nvme))
        argv = ["mpirun", "-np", str(ranks), f"./{binary}"] + flags.split() + ["--quiet", "--json", str(path)]
        if self.timed_out:
            return {"error": f"not run: an earlier run {self.timed_out}"}
        t0 = time.monotonic()
        # a session of its own: every rank it starts can be found and ended
        proc = subprocess.Popen(argv, env=dict(os.environ, **MPI_ENV), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=self.limit_s)
        except subprocess.TimeoutExpired:
            self.timed_out = (f"timed out after {self.limit_s:.0f} s (the reference took "
                              f"{self.reference_s:.1f} s; the limit is {TIME_FACTOR}x that, at least {MIN_LIMIT_S} s)"
                              if self.reference_s is not None else f"timed out after {self.limit_s:.0f} s")
            return {"error": self.timed_out}
        finally:
            if proc.returncode is None:  # a timeout, or the grader stopped (SIGTERM, Ctrl-C)
                end_session(proc)
        self.slowest_s = max(self.slowest_s, time.monotonic() - t0)
        if proc.returncode != 0 or not path.exists():
            lines = output.strip().splitlines()
            # the program's own error line, not what MPI's runtime says after it as the ranks go
            # (its lines start with the binary's name; MPI's warnings may come after them)
            own = [l for l in lines if l.startswith(binary + ":")]
            # its error line ("NAME: error: ...", "NAME: rank R: ..."), not the settings line it printed first
            err = [l for l in own if ": error:" in l or l.startswith(binary + ": rank ")]
            crash = crash_name(proc.returncode)
            if crash:  # a crash prints no error line of its own: the settings line would mislead
                return {"error": f"crashed: {crash}" + (f"; it said: {err[0]}" if err else "")}
            said = err or own or lines
            return {"error": f"exit {proc.returncode}: " + (said[0] if said else "no output")}
        return json.loads(path.read_text().splitlines()[-1])


def figures(rec, tiers):
    """What the checks compare: losses, bytes by tier and category, comm and transfers."""
    if "error" in rec:
        return rec
    mem = {f"{t}/{c}": rec["mem"][t][c]["current"] for t in tiers for c in STATE_CATS}
    formula = {f"{t}/{c}": rec["mem_formula"][t][c] for t in tiers for c in STATE_CATS}
    xfer = rec.get("transfer_bytes_per_step", {})
    return {"losses": rec["losses"], "mem": mem, "mem_formula": formula,
            "comm": rec["comm_bytes_per_step"], "comm_formula": rec["comm_formula_bytes_per_step"],
            "xfer": {k: v for k, v in xfer.items() if v["formula"] > 0},
            "buckets": rec.get("buckets"), "swap_reads": rec.get("swap_reads")}


def overlap_check(lab, main):
    """Labs 03 and 06: what overlaps, counted by the stage against what the technique promises."""
    if lab == "03":
        b = main["buckets"] or {}
        m, B = b.get("micro_batches", 0), b.get("per_micro_batch_formula", 0)
        ok = m > 0 and b["launched"] == m * B and b["in_flight_in_backward"] == m * (B - 1)
        got = (f"{b['in_flight_in_backward'] / m:g} of {b['launched'] / m:g} per micro-batch" if m
               else "no \"buckets\" in the --json record")
        return (BUCKETS, ok, got, f"{B - 1} of {B}")
    r = main["swap_reads"] or {}
    n, G = r.get("passes", 0), r.get("per_pass_formula", 0)
    ok = n > 0 and r["waited"] == n * G and r["asked_ahead"] == n * G
    got = (f"{r['asked_ahead'] / n:g} of {r['waited'] / n:g} per pass (a read asked for only when needed is "
           "serial I/O)" if n else "no \"swap_reads\" in the --json record")
    return (READ_AHEAD, ok, got, f"{G} of {G}")


def reference_figures(lab, r):
    stage, ref, extra, tiers = LABS[lab]
    expected = {"lab": lab, "stage": stage, "reference": ref,
                "losses": figures(r.run(ref, MODEL + " " + (extra if ref == stage else "")), tiers)["losses"]}
    # gradient accumulation: the reference stage itself (its bf16 sums per
    # micro-batch round differently from dp_baseline's single sum)
    expected["accum_losses"] = figures(r.run(stage, f"{MODEL} {extra} {ACCUM}"), tiers)["losses"]
    if lab == "07":
        expected["tp_losses"] = figures(r.run(stage, f"{MODEL} {TP_ALONE}"), tiers)["losses"]
    if lab == "05":
        expected["dpu_losses"] = figures(r.run(stage, MODEL + " --dpu --dpu-warmup 2"), tiers)["losses"]
    expected["reference_s"] = round(r.slowest_s, 2)  # sets the checks' time limits (TIME_FACTOR)
    return expected


def run_checks(lab, expected, r):
    """[(name, passed, measured, expected)] for lab `lab`."""
    stage, ref, extra, tiers = LABS[lab]
    save = r.tmp / "ck"
    main = figures(r.run(stage, f"{MODEL} {extra} --save {save} --save-every 4"), tiers)
    if "error" in main:  # every check fails with the reason
        names = [f"losses equal {ref}'s to the bit", "model-state bytes equal the formula",
                 "communication per step equals the formula", f"with {ACCUM}: losses equal the reference's",
                 "resume reproduces the run"]
        names += ["--dpu equals the reference's delayed update"] if lab == "05" else []
        names += [f"--recompute {m}: losses equal none's to the bit, activations equal the formula"
                  for m in ("selective", "full")] if lab == "04" else []
        names += [IN_FLIGHT, F_AND_G, SEQ_PAR] if lab == "07" else []
        names += [BUCKETS] if lab == "03" else [READ_AHEAD] if lab == "06" else []
        return [(n, False, main["error"], f"{stage} exits 0") for n in names]
    out = []
    same = main["losses"] == expected["losses"]
    out.append((f"losses equal {ref}'s to the bit (8 steps, {r.ranks} ranks)", same,
                f"{main['losses'][-1]:.9g} at step 8", f"{expected['losses'][-1]:.9g}"))
    bad = [k for k in main["mem"] if main["mem"][k] != main["mem_formula"][k]]
    out.append(("model-state bytes by tier and category equal the formula", not bad,
                ", ".join(f"{k} {main['mem'][k]:.0f}" for k in bad) or "all equal",
                ", ".join(f"{k} {main['mem_formula'][k]:.0f}" for k in bad) or "all equal"))
    # zero3's gathers (labs 04 and 06): the head stays live from the end of
    # forward into backward, so it is gathered (and, off the device, fetched)
    # once where the formula counts two: up to 1% under
    live_head = lab in ("04", "06")
    note = " (-1%..0: the head stays live)" if live_head else ""

    def near(got, want):
        return 0.99 * want <= got <= want + 1 if live_head else abs(got - want) <= 1

    out.append(("communication per step equals the formula" + note, near(main["comm"], main["comm_formula"]),
                f"{main['comm']:.0f} B", f"{main['comm_formula']:.0f} B"))
    for k, v in main["xfer"].items():
        out.append((f"{k} bytes per step equal the formula" + note, near(v["counted"], v["formula"]),
                    f"{v['counted']:.0f} B", f"{v['formula']:.0f} B"))
    if lab in ("03", "06"):
        out.append(overlap_check(lab, main))
    accum = figures(r.run(stage, f"{MODEL} {extra} {ACCUM}"), tiers)
    ok = "error" not in accum and accum["losses"] == expected["accum_losses"]
    out.append((f"with {ACCUM}: losses equal the reference {stage}'s to the bit", ok,
                accum.get("error") or f"{accum['losses'][-1]:.9g} at step 8", f"{expected['accum_losses'][-1]:.9g}"))
    resumed = figures(r.run(stage, f"{MODEL} {extra} --resume {save}/step-00000004"), tiers)
    ok = "error" not in resumed and resumed["losses"] == main["losses"][4:]
    out.append(("resume from step 4 reproduces steps 5-8", ok,
                resumed.get("error") or f"{resumed['losses'][-1]:.9g}", f"{main['losses'][-1]:.9g}"))
    if lab == "04":  # block_recompute: the same bits as the forward it repeats, in the working set the formula counts
        for mode in ("selective", "full"):
            rec = r.run(stage, f"{MODEL} {extra} --recompute {mode}")
            name = f"--recompute {mode}: losses equal none's to the bit, activations equal the formula"
            if "error" in rec:
                out.append((name, False, rec["error"], f"{stage} exits 0"))
                continue
            acts = [rec["mem"]["device"][c]["peak"] for c in ("activations", "act_working")]
            want = [rec["mem_formula"][c] for c in ("activations", "act_working")]
            ok = rec["losses"] == main["losses"] and acts == want
            out.append((name, ok, f"{rec['losses'][-1]:.9g} at step 8; {acts[0]:.0f} + {acts[1]:.0f} B",
                        f"{main['losses'][-1]:.9g}; {want[0]:.0f} + {want[1]:.0f} B"))
    if lab == "07":  # 1F1B's warm-up: at m > P each stage s keeps min(P - s, m) micro-batches in flight
        rec = r.run(stage, f"{MODEL} {extra} {MANY_MICRO}")
        if "error" in rec:
            out.append((IN_FLIGHT, False, rec["error"], f"{stage} exits 0"))
        else:
            ranks = rec["grid"]["ranks"]
            got = "/".join(str(int(x["peak_in_flight"])) for x in ranks if x["tp_rank"] == 0)
            want = "/".join(str(int(x["in_flight_formula"])) for x in ranks if x["tp_rank"] == 0)
            out.append((IN_FLIGHT, got == want, f"stages {got}", f"stages {want}"))
        out.append(f_and_g_check(r.run(stage, f"{MODEL} {TP_ALONE}"), expected.get("tp_losses")))
        sp = r.run(stage, f"{MODEL} {extra} --sequence-parallel")
        out.append((SEQ_PAR, "error" not in sp and sp["losses"] == main["losses"],
                    sp.get("error") or f"{sp['losses'][-1]:.9g} at step 8", f"{main['losses'][-1]:.9g}"))
    if lab == "05":
        dpu = figures(r.run(stage, f"{MODEL} --dpu --dpu-warmup 2"), tiers)
        ok = "error" not in dpu and dpu["losses"] == expected["dpu_losses"]
        out.append(("--dpu equals the reference's delayed update to the bit", ok,
                    dpu.get("error") or f"{dpu['losses'][-1]:.9g}", f"{expected['dpu_losses'][-1]:.9g}"))
    return out


def f_and_g_check(rec, want):
    """Lab 07's tensor parallelism alone, naming the pass that differs: step 1's loss
    reads only the forward (g's all-reduce, f's identity); the later ones also the
    gradients of the backward before them (f's all-reduce, g's identity)."""
    if want is None:
        return (F_AND_G, False, "no tp_losses in .lab/expected.json", "a copy made by this make lab-07")
    if "error" in rec:
        return (F_AND_G, False, rec["error"], "3d_parallel exits 0")
    got = rec["losses"]
    if got == want:
        return (F_AND_G, True, f"{got[-1]:.9g} at step 8", f"{want[-1]:.9g}")
    k = next(i for i in range(len(want)) if i >= len(got) or got[i] != want[i])
    if k == 0:
        where = (f"step 1 differs ({got[0]:.9g}): the forward's sums are wrong (g all-reduces after a "
                 "row-parallel linear; f is the identity)")
    else:
        where = (f"step 1 equal, step {k + 1} differs: the backward's sums are wrong (f all-reduces the "
                 "column-parallel linear's input gradient; g is the identity)")
    return (F_AND_G, False, where, f"{want[min(k, len(want) - 1)]:.9g} at step {k + 1}")


def build(lab):
    stage, ref = LABS[lab][:2]
    jobs = str(os.cpu_count() or 2)
    done = subprocess.run(["make", "--no-print-directory", "-j" + jobs, stage, ref], capture_output=True, text=True)
    if done.returncode != 0:
        errors = [l for l in (done.stdout + done.stderr).splitlines() if "error" in l]
        sys.exit(f"check-lab-{lab}: the build fails:\n" + "\n".join(errors[:20] or [done.stderr[-2000:]]))


def main():
    args = [a for a in sys.argv[1:] if a != "--record"]
    record = "--record" in sys.argv
    if len(args) != 1 or args[0] not in LABS:
        sys.exit(f"usage: check_lab.py NN [--record]; labs: {', '.join(LABS)}")
    lab = args[0]
    if not shutil.which("mpirun"):
        sys.exit("check_lab: mpirun not found; run make deps")
    build(lab)
    # SIGTERM unwinds as Ctrl-C does: the run in progress is ended and the temporary folder removed
    def stopped(number, frame):
        print(f"check-lab-{lab}: stopped by {signal.Signals(number).name}; the runs it started are ended and its "
              "temporary files removed", file=sys.stderr)
        sys.exit(128 + number)

    signal.signal(signal.SIGTERM, stopped)
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        if record:
            r = Runner(tmp, RANKS.get(lab, 2))
            expected = reference_figures(lab, r)
        else:
            path = HERE / ".lab/expected.json"
            if not path.exists():
                sys.exit(f"check-lab-{lab}: no .lab/expected.json here: run it in the copy make lab-{lab} made")
            expected = json.loads(path.read_text())
            r = Runner(tmp, RANKS.get(lab, 2), expected.get("reference_s"))
        results = run_checks(lab, expected, r)
    passed = sum(ok for _, ok, _, _ in results)
    if record:
        if passed != len(results):
            for name, ok, got, want in results:
                print(f"{'pass' if ok else 'FAIL'}  {name}: measured {got}, expected {want}", file=sys.stderr)
            sys.exit(1)
        print(json.dumps(expected))
        return
    print(f"lab {lab} ({LABS[lab][0]}): checks")
    for name, ok, got, want in results:
        print(f"  {'pass' if ok else 'FAIL'}  {name}: measured {got}, expected {want}")
    print(f"score: {passed}/{len(results)}")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
