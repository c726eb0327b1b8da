#!/usr/bin/env bash
# make demo: installs what is missing, builds, and runs every stage on the
# same small model, data and ranks, then prints them side by side.
set -euo pipefail
np=${1:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh
make --no-print-directory
source scripts/mpi-env.sh
model=${DEMO_MODEL:-small}
steps=${DEMO_STEPS:-30}

echo
echo "== 00 memory_math: what the formulas say for $model on $np ranks"
./memory_math --model "$model" --ranks "$np" --batch 4
echo
echo "== 00 memory_math --measure: the stages' allocator against the formulas"
mpirun -np "$np" ./memory_math --measure --model "$model"

mkdir -p runs
json=runs/demo.json
rm -f "$json"
summaries=()
accum_note=""
# infinity's swap files go to runs/nvme (on the disk the repository is on;
# O_DIRECT needs one) and are removed when it ends
mkdir -p runs/nvme
for stage in dp_baseline zero1 zero2 zero3 cpu_offload infinity; do
    [ -x "./$stage" ] || continue
    extra=$([ "$stage" = infinity ] && echo "--nvme-path runs/nvme" || true)
    echo
    echo "== $stage: mpirun -np $np ./$stage --model $model --batch 4 --steps $steps${extra:+ $extra}"
    log=$(mktemp)
    mpirun -np "$np" "./$stage" --model "$model" --batch 4 --steps "$steps" --eval-every 10 $extra --json "$json" | tee "$log"
    summaries+=("$(grep '^summary ' "$log")")
    rm -f "$log"
done

# the activations: zero3 again, each block keeping only its input and running
# its forward again in backward; the same losses, a fraction of the bytes
if [ -x ./zero3 ]; then
    echo
    echo "== zero3 --recompute full: mpirun -np $np ./zero3 --model $model --batch 4 --steps $steps --recompute full"
    log=$(mktemp)
    mpirun -np "$np" ./zero3 --model "$model" --batch 4 --steps "$steps" --eval-every 10 --recompute full \
        --json "$json" | tee "$log"
    summaries+=("$(grep '^summary ' "$log") (--recompute full)")
    rm -f "$log"
fi

# 3d_parallel on the same global batch: tp 2 x pp 2 x dp np/4, each replica
# 4 micro-batches of 4 sequences (np x 4 sequences per step, as above)
if [ -x ./3d_parallel ] && [ $((np % 4)) -eq 0 ]; then
    echo
    echo "== 3d_parallel: mpirun -np $np ./3d_parallel --tp 2 --pp 2 --model $model --batch 4 --grad-accum 4 --steps $steps"
    log=$(mktemp)
    mpirun -np "$np" ./3d_parallel --tp 2 --pp 2 --model "$model" --batch 4 --grad-accum 4 --steps "$steps" \
        --eval-every 10 --json "$json" | tee "$log"
    summaries+=("$(grep '^summary ' "$log")")
    # each replica sums its 4 micro-batches' gradients in bf16, which the runs
    # above (one micro-batch per rank) never do: the reference for that is
    # dp_baseline with the same accumulation
    echo
    echo "== dp_baseline with 3d_parallel's accumulation: mpirun -np $((np / 4)) ./dp_baseline --model $model --batch 4 --grad-accum 4 --steps $steps"
    mpirun -np $((np / 4)) ./dp_baseline --model "$model" --batch 4 --grad-accum 4 --steps "$steps" --eval-every 10 --json "$json" | tee "$log"
    summaries+=("$(grep '^summary ' "$log")")
    rm -f "$log"
    accum_note="3d_parallel sums 4 micro-batches' gradients per step in bf16, as the last line's dp_baseline does: it agrees with that run within the test's tolerance (1e-3), not to the bit with the others"
fi

echo
python3 scripts/plot_runs.py "$json" runs/demo
echo
echo "== side by side ($np ranks, $model, same seed and data: the losses agree; memory and traffic do not)"
printf '%s\n' "${summaries[@]}"
[ -n "${accum_note:-}" ] && echo "$accum_note"
true
