#!/usr/bin/env bash
# sanitize_cuda.sh (make sanitize-cuda): NVIDIA's compute-sanitizer over the
# cuda code on a real GPU: each of its four tools (memcheck: out-of-bounds
# and misaligned accesses, leaks and API errors; initcheck: reads of device
# memory nobody wrote; racecheck: shared-memory hazards; synccheck: barriers
# in divergent code) runs the cuda tests and a 2-step run of every stage at
# one rank, tiny model, with each attention. Any report fails it (a tool's
# own exit status, --error-exitcode, and its summary line both count); the
# reports are kept in build/sanitize-cuda/. Without a GPU it says so in one
# line and exits 0: the emulator (make test) is the check there.
set -u
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
out=build/sanitize-cuda
if ! ./dp_baseline --device cuda --model tiny --steps 1 --quiet > /dev/null 2>&1; then
    echo "sanitize-cuda: no usable GPU here (./dp_baseline --device cuda fails): nothing to run; make test runs the cuda code on the emulator"
    exit 0
fi
if ! command -v compute-sanitizer > /dev/null; then
    echo "sanitize-cuda: error: compute-sanitizer is not on the PATH; hint: it ships with the CUDA toolkit (bin/)" >&2
    exit 2
fi
rm -rf "$out"
mkdir -p "$out"
runs=()
for t in build/tests/core/test_cuda_kernels build/tests/core/test_cuda_optim build/tests/core/test_cuda_model \
         build/tests/tp/test_cuda_kernels_tp; do
    [ -x "$t" ] && runs+=("$t")
done
for s in dp_baseline zero1 zero2 zero3 cpu_offload 3d_parallel; do
    for a in flash materialized; do
        runs+=("./$s --device cuda --model tiny --steps 2 --eval-batches 1 --quiet --attention $a")
    done
done
failed=0
for tool in memcheck initcheck racecheck synccheck; do
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    for r in "${runs[@]}"; do
        name=$(echo "$tool ${r%% *} ${r##*--attention }" | tr ' /.' '___')
        log="$out/$name.txt"
        compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 $r > "$log" 2>&1
        rc=$?
        if [ "$rc" -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" "$log"; then
            echo "sanitize-cuda: $tool: $r: $(grep -m1 'ERROR SUMMARY' "$log" || echo "exit $rc") ($log)"
            failed=1
        fi
    done
    echo "sanitize-cuda: $tool done"
done
[ "$failed" -eq 0 ] && echo "sanitize-cuda: every tool clean over ${#runs[@]} runs"
exit "$failed"
