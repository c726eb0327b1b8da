#!/usr/bin/env bash
# make bench-cuda (make bench runs it too where a GPU is usable): the cuda
# device against PyTorch, measured in one run on whatever GPU is visible, as
# JSON in build/bench/cuda_results.json and a table on stdout:
#   - dp_baseline, gpt2-124m, micro-batch 16, seq 1024, one rank: flash
#     attention (the default), and with --recompute full;
#   - bench/torch_gpt2.py, the same model and shape in PyTorch, eager and
#     torch.compile, where `python3 -c 'import torch'` works (else one line
#     says why);
#   - a time per kernel of one dp_baseline step, and the flash kernels'
#     shared-memory bank conflicts, from Nsight Compute where ncu is on the
#     PATH (else one line says so).
# tokens/s, MFU by the report's FLOP formula, peak device memory, and the
# ratio of each run to each PyTorch run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
out=build/bench
mkdir -p "$out"
rm -f "$out"/cuda_*.json "$out"/cuda_*.csv
if ! ./dp_baseline --device cuda --model tiny --steps 1 --quiet > /dev/null 2> "$out/cuda_probe.txt"; then
    echo "bench-cuda: no usable GPU: $(grep -m1 error "$out/cuda_probe.txt" || cat "$out/cuda_probe.txt")" >&2
    exit 2
fi
shape=(--model gpt2-124m --batch 16 --seq-len 1024)

for extra in "" "--recompute full"; do
    echo "bench-cuda: dp_baseline gpt2-124m, micro-batch 16, seq 1024, 1 rank ${extra:-(flash attention)}"
    ./dp_baseline --device cuda "${shape[@]}" $extra --steps 20 --warmup 2 --eval-batches 1 --quiet \
        --json "$out/cuda_workbench.json"
done

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    for mode in "" "--compile"; do
        echo "bench-cuda: PyTorch gpt2-124m, micro-batch 16, seq 1024 ${mode:-(eager)}"
        python3 bench/torch_gpt2.py --device cuda --batch 16 --seq-len 1024 --steps 20 --warmup 5 $mode \
            >> "$out/cuda_torch.json"
    done
else
    echo "bench-cuda: PyTorch skipped: python3 -c 'import torch' fails or sees no GPU"
fi

# shared-memory wavefronts (one per 32 banks' worth of a warp's access) and
# those of them that bank conflicts added
smem_metrics=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
smem_metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
smem_metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
# values in base units (ns, plain counts), not scaled per row ("usecond",
# "Kwavefront"?), so that summarize_cuda.py reads every row it knows the unit of
ncu_csv=(ncu --csv --print-units base)
if command -v ncu > /dev/null; then
    echo "bench-cuda: time per kernel of one step (Nsight Compute)"
    "${ncu_csv[@]}" --metrics gpu__time_duration.sum ./dp_baseline --device cuda "${shape[@]}" --steps 1 \
        --eval-batches 1 --quiet > "$out/cuda_kernels.csv" 2> /dev/null || echo "bench-cuda: ncu failed (time per kernel)"
    echo "bench-cuda: shared-memory bank conflicts of the flash kernels in one step (Nsight Compute)"
    "${ncu_csv[@]}" --kernel-name regex:flash --metrics "$smem_metrics" ./dp_baseline --device cuda "${shape[@]}" \
        --steps 1 --eval-batches 1 --quiet > "$out/cuda_flash_smem.csv" 2> /dev/null ||
        echo "bench-cuda: ncu failed (bank conflicts)"
else
    echo "bench-cuda: no time per kernel: ncu (Nsight Compute) is not on the PATH"
fi

python3 bench/summarize_cuda.py "$out" > "$out/cuda_results.json"
python3 bench/summarize_cuda.py "$out" --table
