#!/usr/bin/env python3
"""plant.py NN [NAME...]: grades each planted mistake of lab NN (mistakes.py)
as an instructor grades students: a submission folder per mistake holding
the lab's files (the reference's, with the mistake's edits), graded by make
grade-lab-NN's script with only the checks the mistake names; the mistakes
that name the same checks are graded as one batch, in one copy of the
reference, against the figures recorded once (build/lab-records). A mistake
is caught when its grading fails and a FAIL line, with what a failed run
said above the checks, carries every phrase the mistake expects (what went
wrong, in the check's words).

Prints a line per mistake: "lab NN: MISTAKE: caught by CHECK: WHY" or what
went wrong; exit 1 when one is not caught or no longer applies (an edit
whose text the reference no longer holds exactly once).
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_lab import lab_files  # noqa: E402
from mistakes import MISTAKES  # noqa: E402


def planted(lab, mistake, folder):
    """The lab's files in `folder` with the mistake's edits; an error line when an edit no longer applies."""
    files = {rel: (HERE / rel).read_text() for rel in lab_files(lab)}
    for rel, old, new in mistake["edits"]:
        if rel not in files:
            return f"{rel} is not one of lab {lab}'s files ({', '.join(files)})"
        if files[rel].count(old) != 1:
            return f"{rel} holds {files[rel].count(old)} times, not once, the text to replace: {old.strip()[:80]}"
        files[rel] = files[rel].replace(old, new)
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return None


def verdict(mistake, output):
    """(caught, what the grading said) for one submission's part of a batch's output."""
    lines = [l.strip() for l in output.splitlines()]
    fails = [l for l in lines if l.startswith("FAIL")]
    # what a failed or crashed run said, once, above the checks (with its lines after)
    first = next((i for i, l in enumerate(lines) if l.startswith(("a run crashed", "a run failed"))), len(lines))
    above = lines[first:next((i for i, l in enumerate(lines) if l.startswith(("FAIL", "pass"))), len(lines))]
    says = mistake["says"]
    for line in fails:
        if all(s in line + " " + " ".join(above) for s in says):
            check = line[len("FAIL"):].split(": measured", 1)[0].strip()
            why = line.split(": measured", 1)[1].strip() if ": measured" in line else ""
            return True, f"caught by \"{check}\": {(' '.join(above) + ' ' + why).strip()[:400]}"
    return False, f"NOT caught (no FAIL line with {says}):\n{output[-3000:]}"


def grade_batch(lab, batch, only):
    """Grades the batch's mistakes with one call of grade_lab.py; [(mistake, caught, said)]."""
    with tempfile.TemporaryDirectory(prefix=f"plant-{lab}-") as tmp:
        folders, out = [], []
        for n, mistake in enumerate(batch):
            folder = Path(tmp) / f"m{n}"
            error = planted(lab, mistake, folder)
            if error:
                out.append((mistake, False, f"does not apply: {error}"))
            else:
                folders.append((mistake, folder))
        if not folders:
            return out
        done = subprocess.run([sys.executable, str(HERE / "scripts/grade_lab.py"), lab] +
                              [str(f) for _, f in folders] + ["--only", only], cwd=HERE, capture_output=True, text=True)
        parts = done.stdout.split("\ngrading ")
        if len(parts) != len(folders):
            return out + [(m, False, f"the batch's grading ended early:\n{(done.stdout + done.stderr)[-3000:]}")
                          for m, _ in folders]
        for (mistake, _), part in zip(folders, parts):
            out.append((mistake,) + verdict(mistake, part))
    return out


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in MISTAKES:
        sys.exit(f"usage: plant.py NN [NAME...]; labs: {', '.join(MISTAKES)}")
    lab, names = sys.argv[1], sys.argv[2:]
    chosen = [m for m in MISTAKES[lab] if not names or m["what"] in names]
    batches = {}
    for mistake in chosen:
        batches.setdefault(mistake["only"], []).append(mistake)
    bad = 0
    for only, batch in batches.items():
        t0 = time.monotonic()
        results = grade_batch(lab, batch, only)
        each = (time.monotonic() - t0) / len(batch)
        for mistake, caught, said in results:
            bad += not caught
            print(f"lab {lab}: {mistake['what']}: {said} [{each:.0f} s]", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
