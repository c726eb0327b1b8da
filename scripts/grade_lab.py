#!/usr/bin/env python3
"""grade_lab.py NN [DIR...] [--only KEYS]: grades a student's copy DIR of lab NN with the
reference's checker (make grade-lab-NN SUBMISSION=DIR, run in the reference
tree, which hands DIR over in the environment variable ZW_SUBMISSION, so
that neither make nor a shell reads the path: a $ or a newline in it stays).

A student's copy is the student's to change, its scripts/check_lab.py and
.lab/expected.json included, so nothing there is trusted: a fresh copy of
the reference is made (as make lab-NN makes one), only the files that hold
lab NN's functions (those with a // LAB NN: marker in the reference) are
taken from DIR, the reference records its expected figures on this machine,
and the reference's check_lab.py grades the result. DIR itself may not be a
symbolic link, and a file is taken only when it is a regular file inside
DIR, reached without following a symbolic link (a link could name the
reference's own file or folder, or anyone's), and of at most MAX_FILE_BYTES;
it is read through the one descriptor that checked it.
--only KEYS runs just those of check_lab's checks. Several DIRs are graded
one after the other in the one copy (each from the reference's files with
its own put in), after a line "grading DIR ..." each; the exit status is 1
when one of them fails.
The output is check_lab's: pass/FAIL per check and "score: N/M". The exit
status is check_lab's, one of four:
  0  graded: every check passes;
  1  graded: a check fails (with several DIRs: one of them does);
  2  refused, nothing graded (one line): DIR is not a folder, or one of the
     lab's files is missing or not taken; or a usage error;
  3  not graded: the grader failed (the reference does not pass its own
     checks, an error in the grader): not the submission's doing.
make grade-lab-NN exits 2 for any of 1, 2 and 3 (make's own status for a
failed recipe); its one line "make: *** [...] Error N" carries the
grader's N.
"""
import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_lab import HERE, copy_reference, lab_files, record_expected, shown  # noqa: E402
from check_lab import EXIT_FAILED, EXIT_INTERNAL, EXIT_PASSED, EXIT_REFUSED, internal_error  # noqa: E402


# A lab's source is a C file of some hundred lines (the reference's largest
# is 15 KB): far beyond that it is no source, and copying it would be the
# grader's cost (a sparse file of 5 GB reads as 5 GB).
MAX_FILE_BYTES = 1 << 20


def refuse(lab, message):
    print(f"grade-lab-{lab}: {message}", file=sys.stderr)
    sys.exit(EXIT_REFUSED)


def why_not_taken(lab, st, path, is_file):
    """Why the entry at path (lstat st), a folder on the way or the lab's file, is not taken; None if it is."""
    whole_copy = f"give the student's whole copy (make lab-{lab} made it)"
    if stat.S_ISLNK(st.st_mode):
        return (f"{shown(path)} is a symbolic link; only the submission's own regular files are graded "
                f"(put the file itself in its place)")
    if not is_file:
        return None if stat.S_ISDIR(st.st_mode) else f"{shown(path)} is not a folder; {whole_copy}"
    if stat.S_ISDIR(st.st_mode):
        return f"{shown(path)} is a folder, not the file that holds lab {lab}'s functions; {whole_copy}"
    if not stat.S_ISREG(st.st_mode):
        return f"{shown(path)} is not a regular file; {whole_copy}"
    if st.st_size > MAX_FILE_BYTES:
        return (f"{shown(path)} is {st.st_size} bytes, more than a lab's source can be ({MAX_FILE_BYTES} at most); "
                f"{whole_copy}")
    return None


def read_inside(lab, submission, rel):
    """The bytes of the regular file rel inside submission: each folder on the
    way and the file looked at and opened without following a link, and read
    through the descriptor that was checked."""
    parts = rel.split("/")
    try:  # DIR itself not followed either: a link there could name the reference's own tree
        fd = os.open(submission, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:  # changed since it was looked at
        refuse(lab, f"{shown(submission)}: {os.strerror(e.errno)}; grade it again")
    try:
        for i, part in enumerate(parts):
            path, is_file = submission.joinpath(*parts[:i + 1]), i == len(parts) - 1
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                refuse(lab, f"{shown(submission)} lacks {rel}, which holds lab {lab}'s functions; give the "
                            f"student's whole copy (make lab-{lab} made it)")
            why = why_not_taken(lab, st, path, is_file)
            if why:
                refuse(lab, why)
            flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_NONBLOCK if is_file else os.O_DIRECTORY)
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except OSError as e:  # changed since it was looked at
                refuse(lab, f"{shown(path)}: {os.strerror(e.errno)}; grade it again")
            os.close(fd)
            fd = next_fd
        if why_not_taken(lab, os.fstat(fd), path, True):
            refuse(lab, f"{shown(path)} changed while it was read; grade it again")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            refuse(lab, f"{shown(path)} grew past {MAX_FILE_BYTES} bytes while it was read; grade it again")
        return data
    finally:
        if fd >= 0:
            os.close(fd)


def submitted_files(lab, submission):
    """The lab's files as DIR holds them ({rel: bytes}); refuses a DIR that is
    not a folder, or a file that is missing or not taken."""
    files = lab_files(lab)
    if not files:
        refuse(lab, f"no // LAB {lab}: markers in the reference's sources: no such lab")
    if not submission:
        refuse(lab, f"give the student's copy: make grade-lab-{lab} SUBMISSION=DIR")
    if submission.is_symlink():
        refuse(lab, f"SUBMISSION={shown(submission)} is a symbolic link; only the submission's own folder is graded "
                    f"(give the folder it names, if that is the student's copy)")
    if not submission.is_dir():
        refuse(lab, f"SUBMISSION={shown(submission)} is not a folder; give the student's copy (make lab-{lab} made it)")
    return {rel: read_inside(lab, submission, rel) for rel in files}


def main():
    args, only = sys.argv[1:], []
    if "--only" in args[:-1]:  # the checks to run (check_lab.py's keys), e.g. for a quick regrade
        i = args.index("--only")
        only = ["--only", args[i + 1]]
        del args[i:i + 2]
    if not args or len(args[0]) != 2 or not args[0].isdigit():
        print("usage: grade_lab.py NN [DIR...] [--only KEYS]   (make grade-lab-NN SUBMISSION=DIR)", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    lab = args[0]
    paths = args[1:] or [os.environ.get("ZW_SUBMISSION", "")]
    submissions = [Path(p) if p else None for p in paths]
    taken = [submitted_files(lab, s) for s in submissions]  # every one refused before any is graded
    expected = record_expected(lab, f"grade-lab-{lab}")
    # SIGTERM unwinds as Ctrl-C does: the copy is removed
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    statuses = []
    with tempfile.TemporaryDirectory(prefix=f"grade-lab-{lab}-") as tmp:
        copy = Path(tmp) / "copy"
        copy_reference(copy)
        (copy / ".lab").mkdir()
        (copy / ".lab/expected.json").write_text(expected)
        for submission, files in zip(submissions, taken):
            for rel, data in files.items():
                if (copy / rel).read_bytes() != data:  # newer than the objects built before: it recompiles
                    (copy / rel).write_bytes(data)
            print(f"grading {shown(submission)} with the reference's checks; taken from it: {', '.join(files)}",
                  flush=True)
            graded = subprocess.run([sys.executable, str(HERE / "scripts/check_lab.py"), lab] + only, cwd=copy)
            # 0 and 1 are grades; a refusal there (2) is the grader's own doing: it made the copy
            status = graded.returncode
            statuses.append(status if status in (EXIT_PASSED, EXIT_FAILED) or status > 128 else EXIT_INTERNAL)
    sys.exit(max(statuses))


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 (SystemExit and Ctrl-C pass)
        internal_error(f"grade-lab-{sys.argv[1] if len(sys.argv) > 1 else 'NN'}")
