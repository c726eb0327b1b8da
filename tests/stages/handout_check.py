#!/usr/bin/env python3
"""handout_check.py NN: holds a stage's handout (NN_*/README.md) to what its
commands print, as test_readme.c holds README.md, under every numerics a
reader's machine can have.

- Every ```sh block followed by excerpts (the plain ``` blocks after it, up
  to the next ```sh block) is run,
  in a folder of its own beside links to the tree (so its runs/ is its own;
  under $WB_AIO_TEST_DIR, else /var/tmp: stage 06's swap files need a disk),
  without its `make` lines (the tree is built). Each excerpt line must be
  found in what the block printed, in order, word by word: "..." stands for
  any words, spacing does not count, and every number must be the same text, but a
  loss, a validation loss or a gradient norm may differ by one unit of its
  last printed digit (rounding), the largest difference of two runs' losses by a
  quarter of itself (its size is the point, and it moves with every
  rounding), and its step may be any. A block
  the test cannot run says so in a comment before it
  (<!-- not rerun by make test: why -->), and the test says it left it out.
- The numerics: the trainers' own sums run in one order on every x86-64
  build (kernels_cpu.h), so what differs between readers' machines is
  OpenBLAS's kernel set, whose sgemm blocks its sums its own way. A block
  whose excerpt quotes a loss, a validation loss, a norm or a difference of
  losses runs once under each kernel set this CPU can run of Haswell (AVX2;
  Zen's are the same), SkylakeX (AVX-512) and Prescott (SSE3), and under the
  one the trainers pick here when it is another (Cooperlake); its excerpt
  must be found in every run. A figure that drifts further than its last
  digit across them is quoted with fewer digits, or from an earlier step.
- Every ./BINARY a handout names, in a block or a command in the text, is
  built by the make line of its "What to run" block.

Prints a line per block run or left out and each excerpt line not found;
exit 1 when one is not found or a binary is not built.
"""
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
STAGE_BINARY = {"00": "memory_math", "01": "dp_baseline", "02": "zero1", "03": "zero2", "04": "zero3",
                "05": "cpu_offload", "06": "infinity", "07": "3d_parallel"}
NOT_RERUN = re.compile(r"<!--\s*not rerun by make test:\s*(.*?)\s*-->", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
LOSS_LIKE = re.compile(r"(?:loss|val|norm)$")


def blocks(text):
    """[(kind, body, start offset)] of the page's fenced blocks."""
    return [(m.group(1), m.group(2), m.start()) for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, re.S | re.M)]


def pairs(text):
    """(sh block, its excerpt, the reason it is not rerun or None) for each sh block that plain blocks follow:
    its excerpt is every plain block after it, up to the next sh block."""
    found = blocks(text)
    out = []
    for i, (kind, body, at) in enumerate(found):
        if kind != "sh":
            continue
        excerpt = []
        for nxt_kind, nxt_body, _ in found[i + 1:]:
            if nxt_kind == "sh":
                break
            if nxt_kind == "":
                excerpt.append(nxt_body)
        if not excerpt:
            continue
        before = text[max(0, text.rfind("\n\n", 0, at - 1)):at]  # the paragraph just before the block
        skip = NOT_RERUN.search(before)
        out.append((body, "".join(excerpt), skip.group(1) if skip else None))
    return out


def tokens(text):
    """The words of a line, each as (skeleton, numbers): "2.503)" is ("#)", ["2.503"])."""
    return [(NUMBER.sub("#", w), NUMBER.findall(w)) for w in text.split()]


def word_matches(want, got, before, loose=False):
    """An excerpt's word against a printed one: the same text around the numbers, and each number the
    same, but a loss-like one (after loss, val, norm, |diff|) within one unit of its last digit, and the
    step of a largest difference any (loose: every number any)."""
    if want[0] != got[0] or len(want[1]) != len(got[1]):
        return False
    how = ("any" if loose or before.endswith("(step") else "quarter" if before.endswith("|diff|") else
           "digit" if LOSS_LIKE.search(before) else "same")
    return all(same(w, g, how) for w, g in zip(want[1], got[1]))


def line_matches(want, line, loose=False):
    """Does the printed line hold the excerpt line: its "..."-separated pieces, in order, word by word
    (loose: whatever its numbers)?"""
    got = tokens(line)
    at = 0
    for piece in [p for p in want.strip().split("...")]:
        words = piece.split()
        if not words:
            continue
        toks = tokens(piece)
        for start in range(at, len(got) - len(toks) + 1):
            if all(word_matches(toks[k], got[start + k], " ".join(words[:k]), loose) for k in range(len(toks))):
                at = start + len(toks)
                break
        else:
            return False
    return True


def same(want, got, how):
    if how == "any" or want == got:
        return True
    if how == "quarter":  # a largest difference of two runs' losses: its size, not its digits
        return abs(float(want) - float(got)) <= 0.25 * abs(float(want))
    if how != "digit":
        return False
    unit = 10.0 ** -len(want.split(".")[1]) if "." in want else 1.0
    return abs(float(want) - float(got)) <= unit * 1.01


def find_in_order(excerpt, output, loose=False):
    """{excerpt line: the printed line that holds it}, in order; None where none does (loose: whatever
    the numbers)."""
    lines, i, found = output.splitlines(), 0, {}
    for want in [l for l in excerpt.splitlines() if l.strip()]:
        found[want] = None
        for j in range(i, len(lines)):
            if line_matches(want, lines[j], loose):
                i = j + 1
                found[want] = lines[j]
                break
    return found


def run_block(body, root, core=None):
    """The block's output, run in `root` without its make lines (a line continued with \\ joined first),
    with OpenBLAS's kernel set `core` (None: the one the trainers pick here)."""
    script = re.sub(r"\\\n\s*", " ", body)
    kept = [l for l in script.splitlines() if not re.match(r"\s*make\b", l)]
    env = dict(os.environ, LC_ALL="C.UTF-8")
    if core:
        env["OPENBLAS_CORETYPE"] = core
    # a reader runs it in the shell where the first block sourced mpi-env.sh
    done = subprocess.run(["bash", "-c", "source scripts/mpi-env.sh\n" + "\n".join(kept)], cwd=root,
                          capture_output=True, text=True, env=env)
    return done.stdout + done.stderr


def drifts(excerpt):
    """Does the excerpt quote a figure that the numerics move (a loss, a norm, a difference of losses)?"""
    for line in excerpt.splitlines():
        words = line.split()
        for k, (skeleton, numbers) in enumerate(tokens(line)):
            before = " ".join(words[:k])
            if numbers and (LOSS_LIKE.search(before) or before.endswith("|diff|")):
                return True
    return False


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(l for l in f if l.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return set()


def native_core():
    """The kernel set the trainers run here, as their device line names it."""
    done = subprocess.run([str(HERE / "dp_baseline"), "--model", "tiny", "--steps", "1", "--quiet"],
                          capture_output=True, text=True, cwd=HERE)
    m = re.search(r"OpenBLAS (\w+)", done.stdout + done.stderr)
    return m.group(1) if m else None


def numerics():
    """The kernel sets to run the drifting blocks under: the trainers' own here first (None: as they pick
    it), then each of Haswell, SkylakeX and Prescott this CPU can run that is not the same."""
    flags = cpu_flags()
    can = {"Haswell": {"avx2", "fma"} <= flags, "Prescott": True,
           "SkylakeX": {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags}
    native = native_core()
    out = [(None, native or "as picked")]
    for core in ("Haswell", "SkylakeX", "Prescott"):
        if can[core] and (native or "").lower() != core.lower():
            out.append((core, core))
    return out


def built(text):
    """Binaries the handout's make lines build (make alone: all of them)."""
    names = set()
    for line in re.findall(r"^\s*make\b([^\n#]*)", text, re.M):
        words = line.split()
        if not words or all(w.startswith("-") for w in words):
            return set(STAGE_BINARY.values())
        names |= {STAGE_BINARY[w[6:]] for w in words if w.startswith("stage-") and w[6:] in STAGE_BINARY}
    return names


def unbuilt(page, text):
    """1 after a line when the handout names a ./BINARY its "What to run" make line does not build."""
    what_to_run = text.split("## What to run", 1)[1].split("\n## ", 1)[0] if "## What to run" in text else ""
    named = set(re.findall(r"(?<![\w/.])\./(\w+)", text))
    for var, words in re.findall(r"\bfor (\w+) in ([^;\n]+); do", text):  # for s in zero1 zero2; do ... ./$s
        if f"./${var}" in text:
            named |= set(words.split())
    named &= set(STAGE_BINARY.values())
    missing = named - built(what_to_run)
    if missing:
        print(f"{page.relative_to(HERE)}: names ./{', ./'.join(sorted(missing))}, which its \"What to run\" "
              f"make line does not build")
    return 1 if missing else 0


def run_blocks(nn, found, cores):
    """{kernel set's name: {block number: output}} and each block's seconds, over the kernel sets: every
    block in order under the first (the trainers' own), the drifting ones under the others, each set's in
    a folder of its own (a block may read an earlier one's files)."""
    # on a disk: stage 06's swap files are opened with O_DIRECT, which a memory file system refuses
    base = os.environ.get("WB_AIO_TEST_DIR", "/var/tmp")
    outputs, seconds = {}, {}
    for core, name in cores:
        outputs[name] = {}
        with tempfile.TemporaryDirectory(prefix=f"handout-{nn}-", dir=base) as root:
            for entry in HERE.iterdir():
                if entry.name not in ("runs", ".git") and not entry.name.startswith("."):
                    os.symlink(entry, Path(root) / entry.name)
            (Path(root) / "runs").mkdir()
            for n, (body, excerpt, skip) in enumerate(found, 1):
                if skip or (core and not drifts(excerpt)):
                    continue
                t0 = time.monotonic()
                outputs[name][n] = run_block(body, root, core)
                seconds[n] = seconds.get(n, 0) + time.monotonic() - t0
    return outputs, seconds


def report(page, found, outputs, seconds):
    """A line per block, and one per excerpt line a kernel set's run did not print; how many of those."""
    bad = 0
    for n, (body, excerpt, skip) in enumerate(found, 1):
        first = next((l for l in body.splitlines() if l.strip() and not l.startswith(("make", "source"))), "")
        where = f"{page.relative_to(HERE)} block {n} ({first.strip()[:60]})"
        if skip:
            print(f"{where}: not rerun: {skip}")
            continue
        runs = {name: out[n] for name, out in outputs.items() if n in out}
        lost = [(name, want) for name, out in runs.items() for want, line in find_in_order(excerpt, out).items()
                if line is None]
        lines = len(excerpt.splitlines())
        print(f"{where}: {lines - len({w for _, w in lost})} of {lines} excerpt lines found under "
              f"{', '.join(runs)} ({seconds[n]:.0f} s)")
        for name, want in lost:
            bad += 1
            print(f"  not printed under {name}: {want}")
            near = [l.strip() for l in runs[name].splitlines() if line_matches(want, l, loose=True)]
            for line in near:
                print(f"    the same line with other figures: {line}")
            if not near:
                print("    what the block printed:\n" + "\n".join("      " + l for l in runs[name].splitlines()[-80:]))
    return bad


def spread(found, outputs):
    """For a maintainer regenerating excerpts: each drifting excerpt line's figures under every kernel set."""
    for n, (body, excerpt, skip) in enumerate(found, 1):
        if skip or not drifts(excerpt):
            continue
        lines = {name: find_in_order(excerpt, out[n], loose=True) for name, out in outputs.items() if n in out}
        for want in [l for l in excerpt.splitlines() if l.strip()]:
            if not drifts(want):
                continue
            print(f"block {n}: {want.strip()}")
            for name, got in lines.items():
                print(f"  {name:>10}: {got[want].strip() if got[want] else '(no such line)'}")
            printed = [got[want] for got in lines.values() if got[want]]
            if len(printed) == len(lines):
                print(f"  {'quote':>10}: {quotable(want, printed)}")


def quotable(want, printed):
    """The excerpt line with each drifting figure at the most digits that every kernel set's keeps within
    one unit of (their spread at most a unit, the figure their midpoint): half a unit is left for a kernel
    set not measured here."""
    words, out = want.split(), []
    runs = [line.split() for line in printed]
    for k, word in enumerate(words):
        before = " ".join(words[:k])
        if not (NUMBER.fullmatch(word) and (LOSS_LIKE.search(before) or before.endswith("|diff|"))):
            out.append(word)
            continue
        values, shown = [], []
        for got in runs:  # the printed number after the same words (their numbers aside) as in the excerpt
            key = [NUMBER.sub("#", w) for w in words[max(0, k - 2):k]]
            at = next((j for j in range(len(key), len(got)) if NUMBER.fullmatch(got[j]) and
                       [NUMBER.sub("#", w) for w in got[j - len(key):j]] == key), None)
            values.append(float(got[at]) if at is not None else None)
            shown.append(got[at] if at is not None else "")
        if None in values:
            out.append(word)
            continue
        digits = min(len(w.split(".")[1]) if "." in w else 0 for w in shown)
        while digits > 0 and max(values) - min(values) > 10.0 ** -digits * 1.0001:
            digits -= 1
        mid = (max(values) + min(values)) / 2
        out.append(f"{mid:.{digits}f}")
    return " ".join(out)


def main():
    args = sys.argv[1:]
    if args == ["--cores"]:  # for test_readme.c: the kernel sets, one a line ("-": the trainers' own)
        for core, name in numerics():
            print(core or "-", name)
        return
    show_spread = args[:1] == ["--spread"]
    args = args[1:] if show_spread else args
    if len(args) != 1 or args[0] not in STAGE_BINARY:
        sys.exit(f"usage: handout_check.py [--spread] NN | --cores; stages: {', '.join(STAGE_BINARY)}")
    nn = args[0]
    page = next(HERE.glob(f"{nn}_*/README.md"))
    text = page.read_text()
    found = pairs(text)
    outputs, seconds = run_blocks(nn, found, numerics())
    if show_spread:
        spread(found, outputs)
    bad = unbuilt(page, text) + report(page, found, outputs, seconds)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
