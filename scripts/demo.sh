#!/usr/bin/env bash
# make demo: installs what is missing, builds, and runs every stage on the
# same small model, data and ranks, then prints them side by side. Their
# tokens/s are compared in interleaved rounds (every stage once a round, in
# a rotated order), so that a load that comes and goes on the machine falls
# on every stage alike; the table gives each stage's spread over the rounds.
# Settings: DEMO_MODEL (small), DEMO_STEPS (30), DEMO_ROUNDS (3 timing
# rounds of DEMO_SPEED_STEPS = 10 steps), DEMO_OUT (runs: the records, the
# pictures, infinity's swap files; on a disk, for O_DIRECT), DEMO_SETUP=0
# (skip the install and the build).
set -euo pipefail
np=${1:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
if [ "${DEMO_SETUP:-1}" != 0 ]; then
    bash scripts/install-deps.sh
    # a build of its own on every core: started from make's recipe, this
    # script holds make's jobserver flags without its pipe, and a make that
    # reads them warns "jobserver unavailable" and builds on one core
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -j"$(nproc)"
fi
source scripts/mpi-env.sh
model=${DEMO_MODEL:-small}
steps=${DEMO_STEPS:-30}
rounds=${DEMO_ROUNDS:-3}
speed_steps=${DEMO_SPEED_STEPS:-10}
out=${DEMO_OUT:-runs}

echo
echo "== 00 memory_math: what the formulas say for $model on $np ranks"
./memory_math --model "$model" --ranks "$np" --batch 4
echo
echo "== 00 memory_math --measure: the stages' allocator against the formulas"
mpirun -np "$np" ./memory_math --measure --model "$model"

mkdir -p "$out"
json=$out/demo.json
rm -f "$json"
summaries=()
accum_note=""
# infinity's swap files go to $out/nvme (by default on the disk the
# repository is on; O_DIRECT needs one) and are removed when it ends
mkdir -p "$out/nvme"
stages=()
for stage in dp_baseline zero1 zero2 zero3 cpu_offload infinity; do
    [ -x "./$stage" ] || continue
    stages+=("$stage")
    extra=$([ "$stage" = infinity ] && echo "--nvme-path $out/nvme" || true)
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
    # how far apart the two runs' losses are, measured from their records: the
    # same data and math, the bf16 sums in another order (tp, pp), so they
    # part by rounding, and a loss spike amplifies it (no tolerance claimed)
    accum_note=$(python3 scripts/demo_accum_note.py "$json")
fi

# tokens/s in interleaved rounds: the runs above came one after another, so
# a stage that ran while something else loaded the machine looked slower
speed=$out/demo_speed.json
rm -f "$speed"
echo
echo "== tokens/s: $rounds rounds of $speed_steps steps, every stage once a round, the order rotated each round"
for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < ${#stages[@]}; i++)); do
        stage=${stages[(i + r) % ${#stages[@]}]}
        extra=$([ "$stage" = infinity ] && echo "--nvme-path $out/nvme" || true)
        log=$(mktemp)
        if ! mpirun -np "$np" "./$stage" --model "$model" --batch 4 --steps "$speed_steps" --quiet $extra \
            --json "$speed" > "$log" 2>&1; then
            cat "$log"
            rm -f "$log"
            exit 1
        fi
        rm -f "$log"
    done
    echo "round $((r + 1)) of $rounds done"
done

echo
python3 scripts/plot_runs.py "$json" "$out/demo"
echo
echo "== side by side ($np ranks, $model, same seed and data: the losses agree; memory and traffic do not;"
echo "   tok/s here is each run's alone, one after another: compare the stages' speed in the table below)"
printf '%s\n' "${summaries[@]}"
[ -n "${accum_note:-}" ] && echo "$accum_note"
echo
python3 scripts/demo_speed.py "$speed"
echo
echo "make demo: $((SECONDS / 60)) min $((SECONDS % 60)) s on this machine, set-up included"
