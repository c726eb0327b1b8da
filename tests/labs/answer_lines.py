#!/usr/bin/env python3
"""answer_lines.py NN COPY: does a lab's copy hold a line of the answer?

The answer is every line that make_lab.py takes out of lab NN's functions
(their bodies, inner comments included) in this tree, the reference. Each is
looked for in every line of every text file of COPY (sources, tests,
scripts, handouts, build files; binaries are left to make_lab, which does not
copy what holds the answer compiled), spacing and backslashes aside (a line
quoted in a test or a sed command escapes some characters): a line of
FRAGMENT characters or more is found where a stretch of SHARE of it is (a
quote of most of it is a trace too; a call's first arguments alone are
not), a shorter one where the whole line is. A piece is no trace where it is plain syntax (a brace,
"return;", a loop over i < n) or where the reference's own code outside lab
NN's regions (tests/ aside) has it too: the copy keeps that code as it is.
Prints each line found with where; exit 1 when there is one.
"""
import difflib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE / "scripts"))
from make_lab import END, MARK, stub_region, tracked_files  # noqa: E402

FRAGMENT = 32
SHARE = 0.7
SYNTAX = re.compile(r"^[{}();,]*(?:else|return|break|continue|do)?[{}();,]*$"
                    r"|^for\(int[a-z]=0;[a-z]<[A-Za-z];[a-z]\+\+\)\{?$")


def bare(line):
    """The line without spacing and backslashes."""
    return "".join(line.replace("\\", "").split())


def pieces(text):
    """The FRAGMENT-long windows of a bare line (the line itself where it is shorter)."""
    if len(text) < FRAGMENT:
        return {text}
    return {text[i:i + FRAGMENT] for i in range(len(text) - FRAGMENT + 1)}


def holds(text, owner):
    """The answer line that the bare line `text` holds, or None: the whole of a short one, or of a longer one
    a stretch of SHARE of it (a quote of its first part is a trace; a call's first arguments alone are not)."""
    if text in owner and len(text) < FRAGMENT:
        return next(iter(owner[text]))
    candidates = {a for p in pieces(text) if len(p) == FRAGMENT for a in owner.get(p, ())}
    for a in sorted(candidates):
        match = difflib.SequenceMatcher(None, text, a, autojunk=False).find_longest_match(0, len(text), 0, len(a))
        if match.size >= SHARE * len(a):
            return a
    return None


def answer_and_rest(lab):
    """The lines stubbing takes out of lab `lab`'s functions (bare), and the bare lines of the reference's own
    code (not tests) outside lab `lab`'s regions."""
    answer, rest = set(), set()
    for rel in tracked_files():
        if not rel.endswith((".c", ".h", ".cu")) or not (HERE / rel).exists():
            continue
        lines = (HERE / rel).read_text().splitlines(keepends=True)
        i = 0
        while i < len(lines):
            m = MARK.match(lines[i])
            if not m or m.group(1) != lab:
                if not rel.startswith("tests/"):
                    rest.add(bare(lines[i]))
                i += 1
                continue
            j = next(k for k in range(i + 1, len(lines)) if END.match(lines[k]))
            region = lines[i + 1:j]
            kept = {bare(l) for l in stub_region(region, lab, m.group(2), rel)}
            answer |= {bare(l) for l in region} - kept
            i = j + 1
    return {a for a in answer if a and not SYNTAX.match(a)}, rest


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: answer_lines.py NN COPY")
    lab, copy = sys.argv[1], Path(sys.argv[2])
    answer, rest = answer_and_rest(lab)
    own = set().union(*(pieces(r) for r in rest))  # what the copy keeps of the reference's own code
    owner = {}  # piece -> the answer lines it is of
    for a in answer:
        for p in pieces(a) - own:
            owner.setdefault(p, set()).add(a)
    looked_for = set().union(*owner.values())
    found = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        if b"\0" in data:
            continue  # a binary: objects and archives of the answer are not copied (make_lab.py)
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            hit = holds(bare(line), owner)
            if hit:
                found.append(f"{path.relative_to(copy)}:{n}: {line.strip()[:120]}  (the answer's {hit[:60]})")
    for f in found:
        print(f"lab {lab}: the copy holds a line of the answer: {f}")
    print(f"lab {lab}: {len(found)} lines of the copy hold one of the answer's {len(looked_for)} lines "
          f"({len(answer) - len(looked_for)} more are the reference's own code elsewhere too)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
