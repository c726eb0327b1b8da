"""collect.py OUT STARTED: build/bench/results.json from the sections of one
make bench: the machine, the commit, the settings, and each section's
figures, or, for a section that failed, its exit status and the end of its
log."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

out, started = Path(sys.argv[1]), sys.argv[2]


def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine():
    cpu = None
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = Path("/proc/cpuinfo").read_text()
    mem_kb = next((int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
                   if l.startswith("MemTotal")), 0)
    gpu = run("nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_kb / 1e6, 1),
            "simd": [f for f in ("avx512f", "avx2", "fma") if f" {f} " in flags],
            "gpu": gpu or None, "os": platform.platform()}


def main():
    sections = {}
    tsv = out / "sections.tsv"
    for line in (tsv.read_text().splitlines() if tsv.exists() else []):
        name, status, secs, *rest = line.split("\t")
        if status == "ok":
            sections[name] = json.loads((out / f"{name}.json").read_text())
            sections[name]["_seconds"] = int(secs)
        else:
            log = (out / f"{name}.log").read_text().splitlines() if (out / f"{name}.log").exists() else []
            sections[name] = {"failed": True, "exit": int(rest[0]) if rest else None, "_seconds": int(secs),
                              "log_tail": log[-15:]}
    settings = {k: v for k, v in os.environ.items() if k.startswith(("BENCH_", "AIO_", "OMP_", "NET_"))}
    result = {
        "schema": 1,
        "started": started,
        "commit": run("git", "rev-parse", "HEAD"),
        "dirty": bool(run("git", "status", "--porcelain", "--untracked-files=no")),
        "machine": machine(),
        "settings": {"BENCH_ROUNDS": os.environ.get("BENCH_ROUNDS", "5"), **settings},
        "sections": sections,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
