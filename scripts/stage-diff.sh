#!/usr/bin/env bash
# make diff-NN: what stage NN adds over the stage before it. Every trainer's
# strategy file uses the same names (Stage, setup, the hooks, reduce_grads,
# update, ...), so the diff of the two strategy files is the technique; the
# files a stage adds (its machinery, reused by later stages) follow in full.
set -euo pipefail
n=$1
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
cur=$(ls -d "${n}"_* 2>/dev/null | head -1)
if [ -z "$cur" ]; then
    echo "diff-$n: no stage folder ${n}_*; stages: $(ls -d [0-9][0-9]_* | tr '\n' ' ')" >&2
    exit 2
fi
# the file that defines the stage's strategy (const Strategy strategy_<name>)
strategy_of() { grep -l '^const Strategy strategy_' "$1"/*.c 2>/dev/null | head -1 || true; }
if [ "$n" = "00" ]; then
    echo "# $cur is the calculator, not a trainer: it adds no technique, so there is nothing to diff."
    echo "# It prints the formulas every later stage is checked against; run ./memory_math --help."
    exit 0
fi
mine=$(strategy_of "$cur")
# the stage before; 07 builds on zero1 (its data parallelism is ZeRO-1's,
# tensor and pipeline parallelism are new beside it)
case "$n" in
07) prev_n=02 ;;
*) prev_n=$(printf '%02d' $((10#$n - 1))) ;;
esac
prev=$(ls -d "${prev_n}"_* 2>/dev/null | head -1)
theirs=$([ -n "$prev" ] && strategy_of "$prev" || true)
if [ -z "$theirs" ]; then
    echo "# $cur is the first trainer: the shared loop (common/training/trainer.c) plus this strategy,"
    echo "# shown in full; every later stage is a diff against it."
    echo
    cat "$mine"
    exit 0
fi
echo "# what $cur adds over $prev"
echo "# 1. the strategy: $theirs -> $mine"
diff -u --label "$theirs" --label "$mine" "$theirs" "$mine" || true
for f in "$cur"/*.c "$cur"/*.h; do
    [ -e "$f" ] && [ "$f" != "$mine" ] || continue
    echo
    echo "# new in $cur: $f"
    diff -u /dev/null "$f" | tail -n +3 || true
done
