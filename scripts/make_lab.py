#!/usr/bin/env python3
"""make_lab.py NN [DIR]: a student copy of the tree for lab NN (make lab-NN,
which hands LAB_DIR over in the environment variable ZW_LAB_DIR, so that
neither make nor a shell reads the path). DIR is labs/NN by default; it may
not be inside a folder the copy takes whole (build/, build-nogpu/), which
would copy itself into itself.

The reference sources mark each stage's technique:

    // LAB 03: launch_bucket -- reduce-scatter a full bucket
    ...the functions, with the comments that specify them...
    // LAB END

In the copy, every function between the markers of lab NN keeps its
signature and the comments around it (what goes in, what comes out, the
formula), and its body becomes a stub that compiles and stops the program
with file:line when called. Nothing is kept as a second copy: the exercises
are generated from the reference every time.

Before writing the copy, the reference runs the lab's checks once and
records what they must see (DIR/.lab/expected.json): on the student's own
machine the student's code must then reproduce those figures, bit for bit
where the math is the same. The reference's build folders are copied too, so
the first build of the copy recompiles only the stubbed files; not what holds
the answer compiled (the stubbed files' objects, the core's archive where a
stubbed file is the core's, the tests' binaries), nor tests/labs/, the
instructor's planted mistakes. So nothing in a copy holds a line of the
functions it stubs (tests/labs/test_labs.c scans a fresh copy for each).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
BUILD_FOLDERS = ("build", "build-nogpu")  # copied whole, so that a copy recompiles only what changed
MARK = re.compile(r"^\s*//\s*LAB\s+(\d\d):\s*(\S+)\s*(?:--\s*(.*))?$")
END = re.compile(r"^\s*//\s*LAB END\s*$")


def strip_code(line):
    """The line with strings, characters and // comments blanked, for brace counting."""
    out, i, quote = [], 0, None
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "\"'":
            quote = c
        elif line.startswith("//", i):
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


def stub_region(lines, lab, name, where):
    """The region's lines with every function body replaced by a stub."""
    out, depth, i = [], 0, 0
    signature = []
    while i < len(lines):
        line = lines[i]
        code = strip_code(line)
        if depth == 0 and "{" in code and "(" in "".join(signature) + code and "=" not in code.split("(")[0]:
            # a function definition opens: keep the signature, drop the body
            head = line[: line.index("{") + 1] if "{" in line else line
            out.append(head + "\n" if not head.endswith("\n") else head)
            fn = re.findall(r"(\w+)\s*\(", "".join(signature) + code)
            fn = fn[0] if fn else name
            out.append(f"    // LAB {lab} ({name}): yours to write. The comments above say what goes in and\n")
            out.append(f"    // what comes out; the handout's Exercise section has the hints.\n")
            out.append(f"    fail_at(__FILE__, __LINE__, \"lab {lab}: {fn} is not written yet; see the Exercise of "
                       f"the stage's README\");\n")
            depth = code.count("{") - code.count("}")
            i += 1
            while depth > 0 and i < len(lines):
                c = strip_code(lines[i])
                depth += c.count("{") - c.count("}")
                i += 1
            out.append("}\n")
            signature = []
            continue
        out.append(line)
        stripped = line.strip()
        signature = [] if (not stripped or stripped.startswith("//") or stripped.endswith(";")) else signature + [code]
        i += 1
    return out


def stub_file(path, lab, rel):
    """Stubs lab `lab`'s regions in one file; returns the names stubbed."""
    lines = path.read_text().splitlines(keepends=True)
    out, names, i = [], [], 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if not m or m.group(1) != lab:
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not END.match(lines[j]):
            j += 1
        if j == len(lines):
            sys.exit(f"make_lab: {rel}:{i + 1}: LAB {lab} {m.group(2)} has no // LAB END")
        out.append(lines[i])
        out.extend(stub_region(lines[i + 1:j], lab, m.group(2), rel))
        out.append(lines[j])
        names.append(m.group(2))
        i = j + 1
    if names:
        text = "".join(out)
        if '#include "check.h"' not in text:  # fail_at lives there
            text = re.sub(r'(#include [<"][^>"]+[>"]\n)', r'\1#include "check.h"\n', text, count=1)
        path.write_text(text)
    return names


def tracked_files():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=HERE, check=True, capture_output=True).stdout
    return [f for f in files.decode().split("\0") if f]


def record_key(lab):
    """What a recording depends on: the checker's files and every binary it runs (size and time of each),
    so a rebuilt reference or an edited checker records again."""
    checker = [HERE / "scripts" / name for name in ("check_lab.py", "lab_checks.py", "lab_formulas.py")]
    files = checker + sorted(p for p in HERE.iterdir() if p.is_file() and os.access(p, os.X_OK))
    return json.dumps([lab] + [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files])


def record_expected(lab, who):
    """The reference's figures for lab `lab` (check_lab.py --record), as JSON text; exits when it fails them.
    A recording is kept in build/lab-records/ and used again while nothing it depends on changed
    (an instructor making a copy per student records once)."""
    cache = HERE / "build" / "lab-records" / f"{lab}.json"
    key = record_key(lab)
    if cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("key") == key:
            return kept["expected"]
    checks = subprocess.run([sys.executable, str(HERE / "scripts/check_lab.py"), lab, "--record"], cwd=HERE,
                            capture_output=True, text=True)
    if checks.returncode != 0:  # the grader's own failure: exit 3, as check_lab.py's
        print(f"{who}: the reference does not pass lab {lab}'s checks, so there is nothing to aim "
              f"for:\n{checks.stdout}{checks.stderr}", file=sys.stderr)
        sys.exit(3)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "expected": checks.stdout}))
    return checks.stdout


# The lab kit's own tests: the planted mistakes are edits of the reference's
# functions, so they stay with the reference and never reach a copy. Nor do
# the builds that link the reference's functions whole (the tests' and the
# benchmarks' binaries) or its recordings.
INSTRUCTOR_ONLY = ("tests/labs/",)
BUILD_NOT_COPIED = ("tests", "bench", "lab-records")


def copy_reference(dest):
    """The reference's tracked files into dest, with its build folders (only changed files recompile); not
    the instructor's own (INSTRUCTOR_ONLY), nor their builds."""
    for rel in tracked_files():
        src, dst = HERE / rel, dest / rel
        if not src.exists() or rel.startswith(INSTRUCTOR_ONLY):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for build in BUILD_FOLDERS:
        if (HERE / build).is_dir():
            skip = [HERE / build / d for d in BUILD_NOT_COPIED]
            shutil.copytree(HERE / build, dest / build, symlinks=True, dirs_exist_ok=True,
                            ignore=lambda folder, names: [n for n in names if Path(folder, n) in skip])


def drop_compiled_answers(dest, stubbed_files):
    """The objects the reference compiled from the files a copy stubs, and the core's archive where one of
    them is the core's: they hold the answer, compiled; the copy's first build makes them again."""
    for build in BUILD_FOLDERS:
        for rel in stubbed_files:
            stem = dest / build / Path(rel).with_suffix("")
            for obj in stem.parent.glob(stem.name + ".*"):  # .o, .d, .fp16.o (a .cu's two builds)
                obj.unlink()
            if rel.startswith("common/"):
                (dest / build / "libcommon.a").unlink(missing_ok=True)


def lab_files(lab):
    """The reference's files that hold lab `lab`'s functions (a // LAB NN: marker)."""
    out = []
    for rel in tracked_files():
        if rel.endswith((".c", ".h", ".cu")) and (HERE / rel).exists():
            if any((m := MARK.match(line)) and m.group(1) == lab for line in (HERE / rel).read_text().splitlines()):
                out.append(rel)
    return out


def refuse(message):
    print(f"make_lab: {message}", file=sys.stderr)
    sys.exit(2)


def shown(path):
    """A path on one line: control characters (a newline) as \\xNN."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", str(path))


def destination(lab):
    """The folder to write the copy to (DIR, ZW_LAB_DIR, or labs/NN); refuses one that would be wrong."""
    given = sys.argv[2] if len(sys.argv) == 3 else os.environ.get("ZW_LAB_DIR") or f"labs/{lab}"
    dest = Path(given)
    dest = dest if dest.is_absolute() else HERE / dest
    for build in BUILD_FOLDERS:
        if dest.resolve() == (HERE / build).resolve() or (HERE / build).resolve() in dest.resolve().parents:
            refuse(f"{shown(dest)} is inside {build}/, which the copy takes whole: it would copy itself into "
                   f"itself. Name a folder outside it: make lab-{lab} LAB_DIR=... (labs/{lab} by default)")
    if dest.exists() and not dest.is_dir():
        refuse(f"{shown(dest)} is a file, not a folder. Name a folder: make lab-{lab} LAB_DIR=...")
    if dest.exists() and any(dest.iterdir()):
        refuse(f"{shown(dest)} exists and is not empty; it may hold your work. "
               f"Name another folder: make lab-{lab} LAB_DIR=...")
    return dest


def main():
    if len(sys.argv) not in (2, 3) or not re.fullmatch(r"\d\d", sys.argv[1]):
        refuse("usage: make_lab.py NN [DIR]   (e.g. make_lab.py 03 labs/03)")
    lab = sys.argv[1]
    dest = destination(lab)
    expected = record_expected(lab, "make_lab")
    copy_reference(dest)
    stubbed = []
    for rel in tracked_files():
        if rel.endswith((".c", ".h", ".cu")) and (dest / rel).exists():
            names = stub_file(dest / rel, lab, rel)
            if names:
                os.utime(dest / rel)  # newer than the copied objects
                stubbed += [f"{rel}: {n}" for n in names]
    if not stubbed:
        sys.exit(f"make_lab: no // LAB {lab}: markers in the sources; labs: "
                 + ", ".join(sorted({m for m in marked_labs()})))
    drop_compiled_answers(dest, sorted({s.split(":")[0] for s in stubbed}))
    (dest / ".lab").mkdir(exist_ok=True)
    (dest / ".lab/expected.json").write_text(expected)
    (dest / ".lab/stubbed.txt").write_text("\n".join(stubbed) + "\n")
    print(f"lab {lab}: a copy of the tree in {shown(dest)}, with these functions to write:")
    for s in stubbed:
        print(f"  {s}")
    inside = Path.cwd() in dest.parents
    print(f"build and check it there: cd {shlex.quote(str(os.path.relpath(dest) if inside else dest))} "
          f"&& make check-lab-{lab}")


def marked_labs():
    for rel in tracked_files():
        if rel.endswith((".c", ".h", ".cu")) and (HERE / rel).exists():
            for line in (HERE / rel).read_text().splitlines():
                m = MARK.match(line)
                if m:
                    yield m.group(1)


if __name__ == "__main__":
    main()
