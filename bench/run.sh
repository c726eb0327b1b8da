#!/usr/bin/env bash
# make bench: every benchmark section in one run on this machine. Each
# section writes build/bench/NAME.json (and its log, NAME.log); a section
# that fails is marked failed in the results with the end of its log, and
# the others still run. bench/collect.py then writes build/bench/results.json:
# the machine (CPU model, cores, memory, GPU), the commit, the settings and
# every section's figures. `make bench-compare BASE=old.json` sets two
# results side by side.
#
# Sections (BENCH_ONLY="a b" runs some of them; BENCH_ROUNDS sets the
# interleaved rounds of the timed ones, default 5):
#   sgemm     the OpenBLAS sgemm roof, the cpu device's practical peak
#   cpu_adam  the CPU Adam (64M parameters) beside a STREAM triad and the
#             scalar loop (targets: adam/triad >= 0.80, SIMD/scalar >= 5)
#   training  dp_baseline gpt2-124m against the roof; dp scaling; every stage
#             at 4 ranks on small relative to dp_baseline
#   offload   per stage and mode (cpu_offload pipelined, --grad-clip 0,
#             --dpu; infinity with every tier on the host at --prefetch 0
#             and 1): step, compute, transfer, hidden, compute + transfer
#             and max(compute, transfer) (bench/offload.sh; OFFLOAD_DEVICE=cuda
#             for the GPU's shapes)
#   recompute dp_baseline gpt2-124m by --recompute: tokens/s beside the FLOP
#             formula's prediction, the activation bytes each keeps
#   progress  zero2 with and without --progress-thread
#   arena     the device arena's cost: dp_baseline gpt2-124m and zero3 small
#             with each unit's buffers taken as the step goes against
#             --contiguous-buffers (ARENA_BASE=DIR adds an earlier build's)
#   aio       the aio module against fio over block sizes and queue depths
#             on a file in $AIO_DIR (default build/bench/aio-files)
#   infinity  stage 06: the pipelined swapper's step against read, Adam and
#             write alone; infinity on small: the NVMe time hidden
#   3d        3d_parallel on small at 8 ranks (oversubscribed on a small
#             machine): every (tp, pp) grid against dp_baseline at the same
#             ranks and global batch, memory per stage, the pipeline bubble
#             for m = 1, 2, 4, 8 beside (P-1)/(m+P-1), interleaved and zb-h1
#             beside 1f1b at pp 2 and 4, m = 4 and 8 (bubble, each stage's
#             device peak, tokens/s; again with one pipeline, ranks = pp; each
#             round's bubble, the noise, whether each schedule's is below
#             the one before), and Ulysses' --cp 1, 2, 4 at 1024-token sequences:
#             tokens/s, activations, all-to-all bytes beside their formulas
#             (bench/3d.sh)
#   long      3d_parallel on small at 4 ranks, T = 512 to 8192: --cp 1, 2
#             and 4 in each mode, tokens/s, memory and the cp group's bytes
#             beside their formulas, the ring's causal work (bench/long.sh)
#   longest   memory_math --longest-seq's rows run at their T and one step
#             above, on small at 4 ranks in 0.1 GB (bench/longest.sh)
#   net       on the emulated cluster (scripts/cluster.sh: 2 hosts, 2 ranks
#             each, root needed, else skipped saying why) at 10 and 200
#             Mbit/s links (NET_RATES): point-to-point and all-reduce
#             algbw/busbw against the link's rate (bench/net_probe.c,
#             nccl-tests' definitions), and zero2 against zero3 in
#             interleaved rounds (NET_ROUNDS, default 2): their time in
#             communication beside the bytes' ratio 1.5; dp_baseline and
#             zero1 too, each step beside memory_math's prediction
#             (bench/net.sh)
#   zeropp    zero3 against its ZeRO++ modes (qwZ, hpZ, qgZ int8 and int4,
#             all three) on small at 4 ranks: ZPP_STEPS (200) steps each, the
#             final loss difference beside the bytes per step across hosts
#             (on the emulated cluster, else one host and the formula), the
#             curves drawn by scripts/plot_runs.py; on 2 emulated hosts with
#             a link shaped to ZPP_RATE (50mbit), interleaved rounds: the time
#             in communication per step and the step beside memory_math's
#             planner (bench/zeropp.sh)
#   cuda      where a GPU is usable (bench/cuda.sh), and 3d on the GPU
# The machine is shared and noisy: timed figures are medians of interleaved
# rounds and carry their spread (NAME_min, NAME_max).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
out=${BENCH_OUT:-build/bench}  # where the sections and results.json go
mkdir -p "$out"
# the last results stay beside the new ones: make bench-compare BASE=$out/results.prev.json
[ -f "$out/results.json" ] && mv "$out/results.json" "$out/results.prev.json"
find "$out" -maxdepth 1 \( -name '*.json' -o -name '*.log' \) ! -name results.prev.json -delete
rm -f "$out/sections.tsv"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# section NAME COMMAND...: COMMAND writes NAME.json (stdout goes there unless
# the command writes the file itself); status recorded in sections.tsv
section() {
    local name=$1
    shift
    case " ${BENCH_ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac
    echo "bench: $name"
    local t0=$SECONDS
    "$@" > "$out/$name.stdout" 2> "$out/$name.log"
    local rc=$?
    [ -s "$out/$name.json" ] || mv "$out/$name.stdout" "$out/$name.json"
    rm -f "$out/$name.stdout"
    if [ $rc -eq 0 ] && python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$out/$name.json" 2>/dev/null; then
        printf '%s\tok\t%d\n' "$name" $((SECONDS - t0)) >> "$out/sections.tsv"
        echo "bench: $name done ($((SECONDS - t0)) s)"
    else
        printf '%s\tfailed\t%d\t%d\n' "$name" $((SECONDS - t0)) "$rc" >> "$out/sections.tsv"
        echo "bench: $name FAILED (exit $rc); the other sections go on; see $out/$name.log"
    fi
}

section sgemm bash bench/sgemm.sh
section cpu_adam bash bench/cpu_adam.sh --params 64M
section training bash bench/training.sh "$out/sgemm.json"
section offload bash bench/offload.sh
section recompute bash bench/recompute.sh
section progress bash bench/progress.sh
section arena bash bench/arena.sh
# 3 x 3 points x read, write x ours, fio x 3 rounds of 1 GiB = 108 GiB moved;
# AIO_BLOCKS_KB, AIO_DEPTHS widen it to the full sweep (bench/aio.sh)
section aio env AIO_BLOCKS_KB="${AIO_BLOCKS_KB:-128 1024 8192}" AIO_DEPTHS="${AIO_DEPTHS:-1 8 64}" \
    bash bench/aio.sh "${AIO_DIR:-build/bench/aio-files}"
section infinity bash bench/infinity.sh "${AIO_DIR:-build/bench/aio-files}"
section 3d bash bench/3d.sh "$out/3d" cpu
section long bash bench/long.sh "$out/long"
section longest bash bench/longest.sh
section net env NET_RATES="${NET_RATES:-10mbit 200mbit}" bash bench/net.sh
# the planner's predicted step beside the measured one, with its command
[ -f "$out/net.log" ] && sed -n '/^[0-9.]*[kmgt]*bit: \.\/memory_math/,/^  zero3 /p' "$out/net.log"
section zeropp bash bench/zeropp.sh "$out"
# its table: the losses beside the bytes, the comm time beside the planner
[ -f "$out/zeropp.log" ] && sed -n '/^curves: /,$p' "$out/zeropp.log"
if [[ " ${BENCH_ONLY:-cuda} " == *" cuda "* ]] && ./dp_baseline --device cuda --model tiny --steps 1 --quiet > /dev/null 2>&1; then
    section cuda bash bench/cuda.sh
    section 3d_cuda bash bench/3d.sh "$out/3d" cuda
else
    echo "bench: cuda skipped: no usable GPU (make bench-cuda says why)"
fi

python3 bench/collect.py "$out" "$started" > "$out/results.json"
echo "bench: results in $out/results.json"
python3 bench/compare.py --summary "$out/results.json"
