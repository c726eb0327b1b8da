#!/usr/bin/env python3
"""check_lab.py NN [--only KEYS]: the checks of lab NN (make check-lab-NN),
run in a student copy made by make lab-NN. It builds the stage, runs it, and
prints each check as pass or fail with the measured and the expected figure
and, where one fails, what that means; then a score. Its exit status says
which of four things happened (grade_lab.py's are the same):
  0  graded: every check passes;
  1  graded: a check fails (the score says how many);
  2  not graded: a usage error, or not run in a lab's copy (one line);
  3  not graded: the checker itself failed (the reference does not build or
     pass, no mpirun, an error in the checker): not the submission's doing.

The expected figures come from the reference, run on this machine when the
lab was made (.lab/expected.json): the stage's losses must equal them to the
bit where the math is the same. The other checks hold the stage to its own
formulas: every category's peak bytes on every tier, the device's peak
against what the run counted before it started, the bytes moved and between
tiers, what its technique promises to overlap (counted, not timed), the
recompute's work, and at a second setting of the lab's own knob; and to
itself (resume reproduces the uninterrupted run). The checks are listed in
lab_checks.py; --only KEYS (comma-separated: losses, states, peaks,
device_peak, comm, xfer, overlap, eval, accum, resume, knob, recompute,
in_flight, f_and_g, seq_par, ring, ulysses, interleaved, zb_h1) runs just
those.

--record (used by make_lab.py in the reference tree) runs the reference,
checks it passes, and prints the expected figures as JSON, with the time of
the reference's slowest run.

Each run of a check may take TIME_FACTOR times that (at least MIN_LIMIT_S):
past it, its ranks are ended and the check says "timed out after N s (the
reference took M s)"; the checks after it are not run. A rank that crashes
is reported once, above the checks: the signal, the lab's function on its
stack where one is, and how to find the line; the checks that needed the run
say so. Every check fails under its own name where its run failed, crashed
or timed out, or the stage does not build: the list of checks is the lab's,
fixed (lab_checks.check_names), so the score's denominator never moves. Whether the grader ends, is stopped (SIGTERM, Ctrl-C) or a run times
out, it ends every process it started and removes its temporary folder.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab_checks import KEYS, LABS, RANKS, reference_figures, run_checks  # noqa: E402

HERE = Path.cwd()
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_orte_execute_quiet": "1",
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}

# A student's run may be slower than the reference's (a first version, a
# loaded machine) but not TIME_FACTOR times slower: then it is taken to hang.
TIME_FACTOR = 10
MIN_LIMIT_S = 10        # start-up alone takes seconds where the machine is busy
UNTIMED_LIMIT_S = 600   # an expected.json recorded before the reference was timed
GRACE_S = 3             # after SIGTERM, before SIGKILL
MARK = re.compile(r"^\s*//\s*LAB\s+(\d\d):\s*(\S+)")
END = re.compile(r"^\s*//\s*LAB END\s*$")
# a frame as backtrace_symbols_fd writes it: binary(function+0xOFF)[0xADDR] or binary(+0xOFF)[0xADDR]
FRAME = re.compile(r"^(\S+)\((\w*)\+0x([0-9a-f]+)\)\s*\[0x[0-9a-f]+\]\s*$")
# exit statuses (the docstring): a grade, a refusal, the grader's own failure
EXIT_PASSED, EXIT_FAILED, EXIT_REFUSED, EXIT_INTERNAL = 0, 1, 2, 3


def give_up(message, status):
    print(message, file=sys.stderr)
    sys.exit(status)


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


def lab_functions(lab):
    """The functions defined inside lab `lab`'s regions of this tree's sources (the student's)."""
    names = set()
    for path in [p for d in HERE.iterdir() if d.is_dir() and d.name[:1].isalnum() for p in d.rglob("*.[ch]")]:
        inside = False
        for line in path.read_text(errors="replace").splitlines():
            m = MARK.match(line)
            if m:
                inside = m.group(1) == lab
            elif END.match(line):
                inside = False
            elif inside and (d := re.match(r"^(?:static\s+)?(?:inline\s+)?[A-Za-z_][\w\s\*]*?\b(\w+)\s*\(", line)):
                names.add(d.group(1))
    return names


def stack_of(binary, output):
    """The crashed rank's frames in `binary`, innermost first, named (addr2line resolves the bare offsets)."""
    names = []
    for line in output.splitlines():
        f = FRAME.match(line.strip())
        if not f or not f.group(1).endswith("/" + binary) and f.group(1) != binary:
            continue
        if f.group(2):
            names.append(f.group(2))
        elif shutil.which("addr2line"):
            out = subprocess.run(["addr2line", "-f", "-e", f"./{binary}", "0x" + f.group(3)], capture_output=True,
                                 text=True).stdout.split("\n")[0]
            names.append(out if out and out != "??" else "0x" + f.group(3))
    # the handler that printed them comes first (common/runtime/stop.c)
    return names[names.index("on_crash_signal") + 1:] if "on_crash_signal" in names else names


class Runner:
    def __init__(self, tmp, lab, reference_s=None):
        """reference_s: the reference's slowest run, which sets the limit of each run (None: the reference itself)."""
        self.tmp, self.n, self.lab, self.ranks = Path(tmp), 0, lab, RANKS.get(lab, 2)
        self.reference_s, self.slowest_s, self.timed_out, self.not_built = reference_s, 0.0, None, False
        self.crashes = []  # what each failed or crashed run said, once: printed above the checks
        self.limit_s = UNTIMED_LIMIT_S if reference_s is None else max(MIN_LIMIT_S, TIME_FACTOR * reference_s)

    def run(self, binary, flags):
        """Runs a trainer on the lab's ranks; returns its --json record, or the error it died with."""
        self.n += 1
        path, nvme = self.tmp / f"run{self.n}.json", self.tmp / "nvme"
        nvme.mkdir(exist_ok=True)
        flags = flags.replace("{nvme}", str(nvme))
        argv = ["mpirun", "-np", str(self.ranks), f"./{binary}"] + flags.split() + ["--quiet", "--json", str(path)]
        if self.timed_out:
            return {"error": f"not run: an earlier run {self.timed_out}"}
        if self.not_built:
            return {"error": "not run: the stage does not build (above)"}
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
            return {"error": self.failure(binary, flags, proc.returncode, output)}
        return json.loads(path.read_text().splitlines()[-1])

    def text(self, binary, flags):
        """Runs a trainer as one process that prints and exits (--print-schedule); returns {"output": what it
        printed}, or {"error": the line it refused or failed with}."""
        argv = [f"./{binary}"] + flags.split()
        if self.not_built:
            return {"error": "not run: the stage does not build (above)"}
        try:
            done = subprocess.run(argv, env=dict(os.environ, **MPI_ENV), capture_output=True, text=True,
                                  timeout=60)
        except subprocess.TimeoutExpired:
            return {"error": "timed out after 60 s"}
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()
            own = [l for l in lines if l.startswith(binary + ":")]
            return {"error": f"exit {done.returncode}: " + ((own or lines or ["no output"])[0])}
        return {"output": done.stdout}

    def failure(self, binary, flags, status, output):
        """What a failed run says: its own error line, or a crash, noted once with its stack."""
        lines = output.strip().splitlines()
        # the program's own lines start with its name (MPI's warnings may come after them)
        own = [l for l in lines if l.startswith(binary + ":")]
        crashed = [l for l in own if ": crashed: " in l]
        err = [l for l in own if (": error:" in l or l.startswith(binary + ": rank ")) and ": crashed: " not in l]
        crash = crash_name(status)
        shown = f"mpirun -np {self.ranks} ./{binary} {flags.replace(str(self.tmp / 'nvme'), 'runs/nvme')}"
        said_by = ranks_first_lines(binary, err)
        if not crash and not crashed:
            said = err or own or lines
            note = f"a run failed: exit {status}: " + (said_by if err else
                                                        re.sub(r": rank \d+: ", ": ", said[0] if said else "no output"))
            if all(not c.startswith(note + "\n") for c in self.crashes):  # said once, whichever runs it ends
                self.crashes.append(note + f"\n    the run: {shown}")
            return f"exit {status} (above)"
        what = crashed[0].split(": crashed: ", 1)[1].split(";")[0] if crashed else crash
        stack = stack_of(binary, output)
        mine = [f for f in stack if f in lab_functions(self.lab)]
        note = f"a run crashed: {what}"
        if mine:
            note += f", in {mine[0]}, one of lab {self.lab}'s functions"
        if stack:
            note += f" (its stack: {' <- '.join(stack[:6])})"
        if err:  # the other ranks' lines often name the cause (a rank that stopped answering, a check that failed)
            note += f"; it said: {said_by}"
        if all(not c.startswith(note + "\n") for c in self.crashes):  # the same crash in another run: said once
            self.crashes.append(note + f"\n    the run: {shown}\n    to see the line: make sanitize builds the stages "
                                "with AddressSanitizer into build-sanitize/root (and runs the tests there); run the "
                                "command in that folder")
        short = re.search(r"\((SIG\w+)\)", what)
        return f"crashed ({short.group(1) if short else what.split(' (')[0]}; above)"


def ranks_first_lines(binary, err):
    """Each rank's first error line, in rank order, the same words said once: 'zero2: error: X (rank 1)'."""
    first = {}
    for line in err:
        m = re.match(re.escape(binary) + r": rank (\d+): ", line)
        first.setdefault(int(m.group(1)) if m else -1, line)
    words = {}
    for rank in sorted(first):
        words.setdefault(re.sub(r": rank \d+: ", ": ", first[rank]), []).append(rank)
    if len(words) == 1:
        return next(iter(words))
    return "; ".join(f"{w} (rank{'s' if len(r) > 1 else ''} {', '.join(str(x) for x in r if x >= 0) or '?'})"
                     for w, r in words.items())


# The graded build keeps every call a frame of its own: at -O3 a call in tail
# position (block_recompute's to block_forward_inner) replaces its caller's
# frame, and a crash's stack would not name the lab's function.
GRADED_OPT = "-O3 -march=native -fno-optimize-sibling-calls"


def build(lab):
    """None when the stage and its reference build (with GRADED_OPT); else the compiler's error lines."""
    stage, ref = LABS[lab][:2]
    jobs = str(os.cpu_count() or 2)
    done = subprocess.run(["make", "--no-print-directory", "-j" + jobs, "OPT=" + GRADED_OPT, stage, ref],
                          capture_output=True, text=True)
    if done.returncode == 0:
        return None
    errors = [l for l in (done.stdout + done.stderr).splitlines() if "error" in l]
    return "\n".join(errors[:20] or [done.stderr[-2000:]])


def parse_args():
    args, only, record = sys.argv[1:], None, False
    if "--record" in args:
        record = True
        args.remove("--record")
    if "--only" in args:
        i = args.index("--only")
        if i + 1 >= len(args):
            give_up("usage: check_lab.py NN [--only KEYS]; --only needs a comma-separated list", EXIT_REFUSED)
        only = set(args[i + 1].split(","))
        del args[i:i + 2]
        if only - set(KEYS):
            give_up(f"check_lab: --only {','.join(sorted(only - set(KEYS)))}: no such check; the checks: "
                    f"{', '.join(KEYS)}", EXIT_REFUSED)
    if len(args) != 1 or args[0] not in LABS:
        give_up(f"usage: check_lab.py NN [--record] [--only KEYS]; labs: {', '.join(LABS)}", EXIT_REFUSED)
    return args[0], record, only


def main():
    lab, record, only = parse_args()
    if not shutil.which("mpirun"):
        give_up("check_lab: mpirun not found; run make deps", EXIT_INTERNAL)
    build_errors = build(lab)
    if build_errors and record:
        give_up(f"check-lab-{lab}: the reference does not build:\n{build_errors}", EXIT_INTERNAL)

    # SIGTERM unwinds as Ctrl-C does: the run in progress is ended and the temporary folder removed
    def stopped(number, frame):
        print(f"check-lab-{lab}: stopped by {signal.Signals(number).name}; the runs it started are ended and its "
              "temporary files removed", file=sys.stderr)
        sys.exit(128 + number)

    signal.signal(signal.SIGTERM, stopped)
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        if record:
            r = Runner(tmp, lab)
            expected = reference_figures(lab, r)
        else:
            path = HERE / ".lab/expected.json"
            if not path.exists():
                give_up(f"check-lab-{lab}: no .lab/expected.json here: run it in the copy make lab-{lab} made",
                        EXIT_REFUSED)
            expected = json.loads(path.read_text())
            r = Runner(tmp, lab, expected.get("reference_s"))
            # a stage that does not build fails every check, each under its name: the score's denominator stays
            r.not_built = build_errors is not None
        results = run_checks(lab, expected, r, only)
    passed = sum(ok for _, ok, _, _ in results)
    if record:
        if passed != len(results) or r.crashes:
            for note in r.crashes:
                print(f"  {note}", file=sys.stderr)
            for name, ok, got, want in results:
                print(f"{'pass' if ok else 'FAIL'}  {name}: measured {got}, expected {want}", file=sys.stderr)
            sys.exit(EXIT_INTERNAL)
        print(json.dumps(expected))
        return
    print(f"lab {lab} ({LABS[lab][0]}): checks")
    if build_errors:
        print(f"  the stage does not build:\n" + "\n".join("    " + l for l in build_errors.splitlines()))
    for note in r.crashes:
        print(f"  {note}")
    for name, ok, got, want in results:
        print(f"  {'pass' if ok else 'FAIL'}  {name}: measured {got}, expected {want}")
    print(f"score: {passed}/{len(results)}")
    sys.exit(EXIT_PASSED if passed == len(results) else EXIT_FAILED)


def internal_error(who):
    """An error in the grader itself: its traceback, then one line that says the submission is not graded, exit 3
    (Python's own status, 1, would read as a failed grade)."""
    traceback.print_exc()
    print(f"{who}: internal error: the grader failed (the traceback above), so nothing is graded; this is not the "
          f"submission's score (exit {EXIT_INTERNAL})", file=sys.stderr)
    sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 (SystemExit and Ctrl-C pass)
        internal_error(f"check-lab-{sys.argv[1] if len(sys.argv) > 1 else 'NN'}")
