#!/usr/bin/env python3
"""layers.py [ROOT]: the folders of common/ stand on each other without an
include running back up (issue 36). Checked, by the quoted includes of
every .c, .cu and .h file (a header found by name on the include path):

- the parts of the training (common/training/ckpt, config, report)
  include nothing of the trainer above them: the parts do not know the
  whole;
- the device's interface (common/device) includes nothing of the backends
  beneath it (device/cpu, device/cuda), which implement it;
- the two backends of a folder (device/cpu and device/cuda; comm_mpi.c and
  comm_nccl.c) include nothing of each other: each sees only the
  interface beneath it;
- no folder of common/ includes a stage's file.

Prints one line per include that breaks a rule and exits 1 when there is
one; else one line of what it checked.
"""
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
COMMON = ROOT / "common"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# a backend file and the backend files it must not include, by name
BACKENDS = {"comm_mpi.c": ("comm_nccl",), "comm_nccl.c": ("comm_mpi",)}


def sources():
    return sorted(p for p in COMMON.rglob("*") if p.suffix in (".c", ".cu", ".h") and p.is_file())


def main():
    files = sources()
    where = {}  # header name -> its folder
    for p in files:
        if p.suffix == ".h":
            where.setdefault(p.name, p.parent)
    broken, checked = [], 0
    for p in files:
        rel = p.relative_to(ROOT)
        for name in INCLUDE.findall(p.read_text(errors="replace")):
            checked += 1
            folder = where.get(Path(name).name)
            if folder is None:
                if name.startswith("..") or re.match(r"\d\d_", name):
                    broken.append(f"{rel}: includes {name}, a stage's file: the core never reaches up into a stage")
                continue
            if p.parent.parent == COMMON / "training" and folder == COMMON / "training":
                broken.append(f"{rel}: includes {name} of {folder.relative_to(ROOT)}, the trainer above its own "
                              f"folder: a part must not know the whole")
            if p.parent == COMMON / "device" and folder.parent == p.parent:
                broken.append(f"{rel}: includes {name} of the backend {folder.relative_to(ROOT)}: the interface "
                              f"knows no backend")
            if p.parent.name in ("cpu", "cuda") and folder.parent == p.parent.parent and folder != p.parent \
                    and folder.name in ("cpu", "cuda"):
                broken.append(f"{rel}: includes {name} of the other backend ({folder.relative_to(ROOT)})")
            for other in BACKENDS.get(p.name, ()):
                if Path(name).stem.startswith(other):
                    broken.append(f"{rel}: includes {name}, the other backend's")
    for line in broken:
        print(line)
    if not broken:
        print(f"layers: {checked} includes of {len(files)} files of common/, none running back up")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
