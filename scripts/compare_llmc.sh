#!/usr/bin/env bash
# compare_llmc.sh LLMC_DIR [WORK_DIR]: the first-step loss of llm.c's fp32 CPU
# trainer (train_gpt2.c) beside ours on the cpu device, from the same GPT-2
# checkpoint and the same tokens.
#
# LLMC_DIR is a checkout of llm.c (its train_gpt2.c, llmc/ and Makefile);
# nothing of it enters this repository: it is copied to WORK_DIR (default a
# fresh folder under /tmp) and built there with its own Makefile.
#
#  1. dp_baseline trains a gpt2-124m-shaped model for STEPS steps (default 8,
#     so the weights are not the initial ones) on the built-in corpus and
#     writes it with --export-llmc (llm.c version 3, fp32).
#  2. The token shards: the first B*T+1 bytes of this repository's README as
#     the training shard, the next bytes as the validation shard (llm.c's
#     train_gpt2 fixes B = 4, T = 64 and shuffles its batches; a shard of one
#     batch leaves it nothing to shuffle, so its step 0 reads tokens 0..B*T).
#  3. llm.c's step-0 train loss on the checkpoint (L_llmc), and on a copy
#     whose parameters are rounded to bf16 (L_llmc_bf16).
#  4. Ours: dp_baseline --device cpu --init-from the checkpoint --data-order
#     sequential, same B and T: the loss of step 1 (L_ours).
#
# Tolerance. Our params are bf16(master) and our activations fp32, so ours
# computes llm.c's forward pass on bf16-rounded weights. The rounding's own
# effect, measured with llm.c's arithmetic alone, is d_round = |L_llmc -
# L_llmc_bf16|. Two fp32 implementations of one forward pass on the same
# weights differ only by the order of their sums (OpenBLAS against llm.c's
# loops built with -Ofast): for dot products of up to K = 4C = 3072 terms
# that is about sqrt(K) * 2^-24 = 3.3e-6 relative per product, a few times
# that through the layers; eps = 1e-5 x L_llmc allows for it (and for llm.c
# printing its loss with 6 decimals, a resolution of 5e-7). The checks:
#   |L_ours - L_llmc_bf16| <= eps                (the same weights)
#   |L_ours - L_llmc|      <= d_round + eps      (within the bf16 rounding)
# Prints the figures and one JSON line; exits 1 when a check fails.
set -euo pipefail

if [ $# -lt 1 ] || [ ! -f "$1/train_gpt2.c" ]; then
    echo "usage: $0 LLMC_DIR [WORK_DIR]   (LLMC_DIR: a checkout of llm.c with train_gpt2.c)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
llmc=$(cd "$1" && pwd)
work=${2:-$(mktemp -d /tmp/compare-llmc-XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
steps=${STEPS:-8}
B=4 T=64
grep -q "int B = $B;" "$llmc/train_gpt2.c" && grep -q "int T = $T;" "$llmc/train_gpt2.c" || {
    echo "$0: this train_gpt2.c does not fix B = $B, T = $T as the llm.c this script knows; adjust B and T" >&2
    exit 2
}
[ -x "$here/dp_baseline" ] || { echo "$0: build the workbench first (make GPU=0)" >&2; exit 2; }
source "$here/scripts/mpi-env.sh"
log() { echo "compare_llmc: $*"; }

# ---- 1. llm.c's CPU trainer, built in the work folder ----
log "building llm.c's train_gpt2 in $work/llmc"
mkdir -p "$work/llmc"
tar -C "$llmc" --exclude=.git -cf - . | tar -C "$work/llmc" -xf -
make -C "$work/llmc" train_gpt2 >"$work/llmc-build.log" 2>&1 || {
    echo "$0: llm.c's build failed; see $work/llmc-build.log" >&2
    exit 1
}

# ---- 2. the checkpoint and the shards ----
run_dir() {  # train_gpt2 reads gpt2_124M.bin and dev/data/tinyshakespeare/*.bin from its folder
    mkdir -p "$1/dev/data/tinyshakespeare"
    ln -sf "$work/data/shard_train.bin" "$1/dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
    ln -sf "$work/data/shard_val.bin" "$1/dev/data/tinyshakespeare/tiny_shakespeare_val.bin"
}
mkdir -p "$work/data"
head -c $((B * T + 1)) "$here/README.md" | python3 "$here/scripts/make_shard.py" "$work/data/shard_train.bin" --text -
tail -c +$((B * T + 2)) "$here/README.md" | head -c 4096 |
    python3 "$here/scripts/make_shard.py" "$work/data/shard_val.bin" --text -
run_dir "$work/fp32"
run_dir "$work/bf16"
log "training a gpt2-124m-shaped model for $steps steps, then --export-llmc"
"$here/dp_baseline" --device cpu --model gpt2-124m --batch $B --seq-len $T --steps "$steps" --eval-batches 1 \
    --quiet --export-llmc "$work/fp32/gpt2_124M.bin" >"$work/export.log" 2>&1 || {
    echo "$0: the export run failed; see $work/export.log" >&2
    exit 1
}
log "rounding the checkpoint's parameters to bf16 (round to nearest even)"
python3 - "$work/fp32/gpt2_124M.bin" "$work/bf16/gpt2_124M.bin" <<'EOF'
import array, sys
HEADER = 1024
CHUNK = 1 << 20
with open(sys.argv[1], "rb") as src, open(sys.argv[2], "wb") as dst:
    dst.write(src.read(HEADER))
    while True:
        block = src.read(4 * CHUNK)
        if not block:
            break
        w = array.array("I")
        w.frombytes(block)
        if sys.byteorder != "little":
            w.byteswap()
        # bf16 = the upper 16 bits after rounding to nearest, ties to even
        r = array.array("I", [((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF for u in w])
        if sys.byteorder != "little":
            r.byteswap()
        dst.write(r.tobytes())
EOF

# ---- 3. llm.c's step 0 ----
# train_gpt2 runs 40 steps; its output is read line by line until step 0's
llmc_step0() {
    local dir=$1 out=$1/train_gpt2.log
    (cd "$dir" && exec stdbuf -oL "$work/llmc/train_gpt2" >"$out" 2>&1) &
    local pid=$!
    while kill -0 $pid 2>/dev/null && ! grep -q "^step 0: train loss" "$out"; do sleep 1; done
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    sed -n 's/^step 0: train loss \([0-9.eE+-]*\).*/\1/p' "$out" | head -1
}
log "llm.c on the fp32 checkpoint"
l_llmc=$(llmc_step0 "$work/fp32")
log "llm.c on the bf16-rounded checkpoint"
l_llmc_bf16=$(llmc_step0 "$work/bf16")
[ -n "$l_llmc" ] && [ -n "$l_llmc_bf16" ] || { echo "$0: llm.c printed no step-0 loss; see $work/*/train_gpt2.log" >&2; exit 1; }

# ---- 4. ours ----
ours() {
    "$here/dp_baseline" --device cpu --init-from "$1" --data "$work/data" --data-order sequential --batch $B \
        --seq-len $T --steps 1 --eval-batches 1 --quiet --json "$2" >"$2.log" 2>&1 || {
        echo "$0: our run failed; see $2.log" >&2
        exit 1
    }
    python3 -c 'import json, sys; print(repr(json.loads(open(sys.argv[1]).readlines()[-1])["losses"][0]))' "$2"
}
log "ours on the fp32 checkpoint, and on the bf16-rounded one"
l_ours=$(ours "$work/fp32/gpt2_124M.bin" "$work/ours-fp32.json")
l_ours_bf16=$(ours "$work/bf16/gpt2_124M.bin" "$work/ours-bf16.json")

python3 - "$l_llmc" "$l_llmc_bf16" "$l_ours" "$l_ours_bf16" "$steps" <<'EOF'
import json, sys
l_llmc, l_llmc_bf16, l_ours, l_ours_bf16 = map(float, sys.argv[1:5])
d_round = abs(l_llmc - l_llmc_bf16)
eps = 1e-5 * l_llmc
same = abs(l_ours - l_llmc_bf16)
full = abs(l_ours - l_llmc)
ok = same <= eps and full <= d_round + eps and l_ours == l_ours_bf16
print(f"llm.c step 0 train loss, fp32 checkpoint:       {l_llmc:.6f}")
print(f"llm.c step 0 train loss, bf16-rounded weights:  {l_llmc_bf16:.6f}   d_round = {d_round:.3e}")
print(f"ours, step 1 loss (--init-from, cpu device):    {l_ours:.6f}   (from the bf16-rounded file: {l_ours_bf16:.6f})")
print(f"|ours - llm.c on bf16 weights| = {same:.3e}  <= eps = {eps:.3e}: {same <= eps}")
print(f"|ours - llm.c on fp32 weights| = {full:.3e}  <= d_round + eps = {d_round + eps:.3e}: {full <= d_round + eps}")
print(json.dumps({"llmc_loss": l_llmc, "llmc_bf16_loss": l_llmc_bf16, "ours_loss": l_ours,
                  "ours_bf16_file_loss": l_ours_bf16, "d_round": d_round, "eps": eps,
                  "export_steps": int(sys.argv[5]), "agree": ok}))
sys.exit(0 if ok else 1)
EOF
