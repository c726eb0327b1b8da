#!/usr/bin/env python3
"""grade_lab.py NN DIR: grades a student's copy DIR of lab NN with the
reference's checker (make grade-lab-NN SUBMISSION=DIR, run in the reference
tree).

A student's copy is the student's to change, its scripts/check_lab.py and
.lab/expected.json included, so nothing there is trusted: a fresh copy of
the reference is made (as make lab-NN makes one), only the files that hold
lab NN's functions (those with a // LAB NN: marker in the reference) are
taken from DIR, the reference records its expected figures on this machine,
and the reference's check_lab.py grades the result. The output is
check_lab's: pass/FAIL per check and "score: N/M"; exit 0 only when every
check passes, 2 when DIR is not a folder or lacks one of the files.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_lab import HERE, copy_reference, lab_files, record_expected  # noqa: E402


def refuse(lab, message):
    print(f"grade-lab-{lab}: {message}", file=sys.stderr)
    sys.exit(2)


def submitted_files(lab, submission):
    """The lab's files as DIR holds them; refuses a DIR that is not a folder or lacks one."""
    files = lab_files(lab)
    if not files:
        refuse(lab, f"no // LAB {lab}: markers in the reference's sources: no such lab")
    if not submission:
        refuse(lab, f"give the student's copy: make grade-lab-{lab} SUBMISSION=DIR")
    if not submission.is_dir():
        refuse(lab, f"SUBMISSION={submission} is not a folder; give the student's copy (make lab-{lab} made it)")
    for rel in files:
        if not (submission / rel).is_file():
            refuse(lab, f"{submission} lacks {rel}, which holds lab {lab}'s functions; give the student's whole "
                        f"copy (make lab-{lab} made it)")
    return files


def main():
    if len(sys.argv) != 3 or len(sys.argv[1]) != 2 or not sys.argv[1].isdigit():
        print("usage: grade_lab.py NN DIR   (make grade-lab-NN SUBMISSION=DIR)", file=sys.stderr)
        sys.exit(2)
    lab, submission = sys.argv[1], Path(sys.argv[2]) if sys.argv[2] else None
    files = submitted_files(lab, submission)
    expected = record_expected(lab, f"grade-lab-{lab}")
    # SIGTERM unwinds as Ctrl-C does: the copy is removed
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    with tempfile.TemporaryDirectory(prefix=f"grade-lab-{lab}-") as tmp:
        copy = Path(tmp) / "copy"
        copy_reference(copy)
        for rel in files:
            shutil.copyfile(submission / rel, copy / rel)
            os.utime(copy / rel)  # newer than the reference's objects: it recompiles
        (copy / ".lab").mkdir()
        (copy / ".lab/expected.json").write_text(expected)
        print(f"grading {submission} with the reference's checks; taken from it: {', '.join(files)}", flush=True)
        graded = subprocess.run([sys.executable, str(HERE / "scripts/check_lab.py"), lab], cwd=copy)
    sys.exit(graded.returncode)


if __name__ == "__main__":
    main()
