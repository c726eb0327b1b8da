#!/usr/bin/env bash
# longest.sh: memory_math --longest-seq's table measured, row by row, on the
# cpu device: small on 4 ranks (BENCH_LONGEST_RANKS) at micro-batch 1 under
# --hbm-gb 0.1 (BENCH_LONGEST_GB), where the rows differ. For every
# configuration (each stage; 3d_parallel at each cp in each mode) and each
# way of running it (the run's flags; --recompute full; full with
# --tiled-loss 8 --tiled-mlp 8), the trainer runs one step at the T the
# table gives, which must train (the table counts what the budget check
# counts: the bytes, and the region the step's blocks need where the
# device's arena places them, pages and holes included), and at one step of
# T above (T + cp, T + 2·cp for the ring, else T + 1), which its budget
# check must refuse. One JSON object on stdout: each row's T, what the run
# at T did and whether T + step was refused.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source scripts/mpi-env.sh
ranks=${BENCH_LONGEST_RANKS:-4}
gb=${BENCH_LONGEST_GB:-0.1}
nvme=$(mktemp -d "${TMPDIR:-/tmp}/wb-longest-XXXXXX")
trap 'rm -rf "$nvme"' EXIT
python3 - "$ranks" "$gb" "$nvme" <<'EOF'
import json, subprocess, sys
ranks, gb, nvme = int(sys.argv[1]), sys.argv[2], sys.argv[3]
table = json.loads(subprocess.run(["./memory_math", "--model", "small", "--ranks", str(ranks), "--batch", "1",
                                   "--hbm-gb", gb, "--longest-seq", "--json"], capture_output=True, text=True,
                                  check=True).stdout)["longest_seq"]["stages"]
WAYS = {"own": "", "full": "--recompute full", "full_tiled": "--recompute full --tiled-loss 8 --tiled-mlp 8"}
REFUSED = "of device memory per rank"  # the budget check's line
ARENA = "no free block holds"          # an allocation the arena could not place


def run(words, T):
    binary, flags = words[0], words[1:]
    if binary == "infinity":
        flags += ["--nvme-path", nvme]
    cmd = ["mpirun", "-np", str(ranks), "./" + binary, "--model", "small", "--batch", "1", "--seq-len", str(T),
           "--hbm-gb", gb, "--steps", "1", "--eval-every", "0", "--eval-batches", "1", "--quiet"] + flags
    done = subprocess.run(cmd, capture_output=True, text=True)
    said = done.stdout + done.stderr
    if done.returncode == 0:
        return "trained"
    if REFUSED in said:
        return "refused"
    if ARENA in said:
        return "arena"
    return "failed: " + (said.strip().splitlines() or ["exit %d" % done.returncode])[-1][:200]


rows = []
for row in table:
    words = row["stage"].split()
    step = 1
    if words[0] == "3d_parallel":
        cp = int(words[words.index("--cp") + 1])
        step = cp * (2 if "ring" in words else 1)
    for way, extra in WAYS.items():
        T = int(row[way])
        if T < 1:
            continue
        flags = words + extra.split()
        at, above = run(flags, T), run(flags, T + step)
        rows.append({"configuration": row["stage"], "way": way, "seq_len": T, "at_T": at, "above": above,
                     "step": step, "held": at == "trained" and above == "refused"})
        print(f"longest: {row['stage']} ({way}): T {T} {at}, T + {step} {above}", file=sys.stderr, flush=True)
print(json.dumps({"what": f"memory_math --longest-seq on small at {ranks} ranks, batch 1, --hbm-gb {gb}: each row "
                          "run at its T (trains) and "
                          "one step above (refused by the budget check)",
                  "held": sum(r["held"] for r in rows), "rows_run": len(rows), "rows": rows}, indent=1))
EOF
