#!/usr/bin/env python3
"""handout_check.py NN: holds a stage's handout (NN_*/README.md) to what its
commands print, as test_readme.c holds README.md.

- Every ```sh block followed by excerpts (the plain ``` blocks after it, up
  to the next ```sh block) is run,
  in a folder of its own beside links to the tree (so its runs/ is its own;
  under $WB_AIO_TEST_DIR, else /var/tmp: stage 06's swap files need a disk),
  without its `make` lines (the tree is built). Each excerpt line must be
  found in what the block printed, in order, word by word: "..." stands for
  any words, spacing does not count, and every number must be the same text, but a
  loss, a validation loss or a gradient norm may differ by one unit of its
  last printed digit (another CPU's summation order can flip it, as
  test_readme.c allows), the largest difference of two runs' losses by a
  quarter of itself (its size is the point, and it moves with every
  rounding), and its step may be any. A block
  the test cannot run says so in a comment before it
  (<!-- not rerun by make test: why -->), and the test says it left it out.
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


def word_matches(want, got, before):
    """An excerpt's word against a printed one: the same text around the numbers, and each number the
    same, but a loss-like one (after loss, val, norm, |diff|) within one unit of its last digit, and the
    step of a largest difference any."""
    if want[0] != got[0] or len(want[1]) != len(got[1]):
        return False
    how = ("any" if before.endswith("(step") else "quarter" if before.endswith("|diff|") else
           "digit" if LOSS_LIKE.search(before) else "same")
    return all(same(w, g, how) for w, g in zip(want[1], got[1]))


def line_matches(want, line):
    """Does the printed line hold the excerpt line: its "..."-separated pieces, in order, word by word?"""
    got = tokens(line)
    at = 0
    for piece in [p for p in want.strip().split("...")]:
        words = piece.split()
        if not words:
            continue
        toks = tokens(piece)
        for start in range(at, len(got) - len(toks) + 1):
            if all(word_matches(toks[k], got[start + k], " ".join(words[:k])) for k in range(len(toks))):
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


def find_in_order(excerpt, output):
    """The excerpt lines not found, in order, in the output's lines."""
    lines, i, missing = output.splitlines(), 0, []
    for want in [l for l in excerpt.splitlines() if l.strip()]:
        for j in range(i, len(lines)):
            if line_matches(want, lines[j]):
                i = j + 1
                break
        else:
            missing.append(want)
    return missing


def run_block(body, root):
    """The block's output, run in `root` without its make lines (a line continued with \\ joined first)."""
    script = re.sub(r"\\\n\s*", " ", body)
    kept = [l for l in script.splitlines() if not re.match(r"\s*make\b", l)]
    # a reader runs it in the shell where the first block sourced mpi-env.sh
    done = subprocess.run(["bash", "-c", "source scripts/mpi-env.sh\n" + "\n".join(kept)], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, LC_ALL="C.UTF-8"))
    return done.stdout + done.stderr


def built(text):
    """Binaries the handout's make lines build (make alone: all of them)."""
    names = set()
    for line in re.findall(r"^\s*make\b([^\n#]*)", text, re.M):
        words = line.split()
        if not words or all(w.startswith("-") for w in words):
            return set(STAGE_BINARY.values())
        names |= {STAGE_BINARY[w[6:]] for w in words if w.startswith("stage-") and w[6:] in STAGE_BINARY}
    return names


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in STAGE_BINARY:
        sys.exit(f"usage: handout_check.py NN; stages: {', '.join(STAGE_BINARY)}")
    nn = sys.argv[1]
    page = next(HERE.glob(f"{nn}_*/README.md"))
    text = page.read_text()
    bad = 0
    what_to_run = text.split("## What to run", 1)[1].split("\n## ", 1)[0] if "## What to run" in text else ""
    named = set(re.findall(r"(?<![\w/.])\./(\w+)", text))
    for var, words in re.findall(r"\bfor (\w+) in ([^;\n]+); do", text):  # for s in zero1 zero2; do ... ./$s
        if f"./${var}" in text:
            named |= set(words.split())
    named &= set(STAGE_BINARY.values())
    missing = named - built(what_to_run)
    if missing:
        bad += 1
        print(f"{page.relative_to(HERE)}: names ./{', ./'.join(sorted(missing))}, which its \"What to run\" "
              f"make line does not build")
    # on a disk: stage 06's swap files are opened with O_DIRECT, which a memory file system refuses
    base = os.environ.get("WB_AIO_TEST_DIR", "/var/tmp")
    with tempfile.TemporaryDirectory(prefix=f"handout-{nn}-", dir=base) as root:
        for entry in HERE.iterdir():
            if entry.name not in ("runs", ".git") and not entry.name.startswith("."):
                os.symlink(entry, Path(root) / entry.name)
        (Path(root) / "runs").mkdir()
        for n, (body, excerpt, skip) in enumerate(pairs(text), 1):
            first = next((l for l in body.splitlines() if l.strip() and not l.startswith(("make", "source"))), "")
            if skip:
                print(f"{page.relative_to(HERE)} block {n} ({first.strip()[:60]}): not rerun: {skip}")
                continue
            t0 = time.monotonic()
            output = run_block(body, root)
            lost = find_in_order(excerpt, output)
            print(f"{page.relative_to(HERE)} block {n} ({first.strip()[:60]}): {len(excerpt.splitlines()) - len(lost)}"
                  f" of {len(excerpt.splitlines())} excerpt lines found ({time.monotonic() - t0:.0f} s)")
            for want in lost:
                bad += 1
                print(f"  not printed: {want}")
            if lost:
                print("  what the block printed:\n" + "\n".join("    " + l for l in output.splitlines()[-80:]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
