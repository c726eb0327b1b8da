#!/usr/bin/env bash
# make diff-NN: what stage NN adds over the stage it builds on. Every
# trainer's strategy file uses the same names (Stage, forward_backward,
# update, ...), so the diff of the two strategy files is the technique; the
# files the stage adds follow in full: its own machinery (reused by later
# stages) and the common/ files that only it uses; then its lab's regions
# in the common/ files that every stage runs. The last line counts the changed lines.
# usage: stage-diff.sh NN [BASE] (the Makefile passes BASE_NN, its stage graph's)
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
# the stage it builds on, from the Makefile's stage graph (BASE_NN): 05 is
# ZeRO-Offload on zero2's gradient path; 06 ZeRO-Infinity on zero3's gathers
# (with 05's host gradients and CPU Adam, shown by diff-05); 07 builds on
# zero1 (its data parallelism is ZeRO-1's, tensor and pipeline parallelism
# are new beside it)
prev_n=${2:-}
# the common/ files a stage owns, shown whole: only it uses them
case "$n" in
06) owned="common/io/aio.h common/io/aio.c common/io/aio_file.c" ;;
07) owned="common/model/gpt_tp.c" ;;
*) owned="" ;;
esac
# common/ files every stage runs that hold this stage's lab regions (lab 04's
# recompute, lab 05's SIMD CPU Adam: the cpu device's Adam in every stage,
# lab 07's f and g): the region alone, the part the lab asks the student for
case "$n" in
04) regions="common/model/gpt_recompute.c" ;;
05) regions="common/device/cpu_adam_avx2.c common/device/cpu_adam_avx512.c" ;;
07) regions="common/model/gpt_block.c" ;;
*) regions="" ;;
esac
prev=$([ -n "$prev_n" ] && ls -d "${prev_n}"_* 2>/dev/null | head -1 || true)
theirs=$([ -n "$prev" ] && strategy_of "$prev" || true)
if [ -z "$theirs" ]; then
    echo "# $cur is the first trainer: the shared loop (common/training/trainer.c) plus this strategy,"
    echo "# shown in full; every later stage is a diff against it."
    echo
    cat "$mine"
    exit 0
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
    echo "# what $cur adds over $prev"
    echo "# 1. the strategy: $theirs -> $mine"
    diff -u --label "$theirs" --label "$mine" "$theirs" "$mine" || true
    echo "# (end of the strategy's diff)"
    k=2
    for f in "$cur"/*.c "$cur"/*.h $owned; do
        [ -e "$f" ] && [ "$f" != "$mine" ] || continue
        case "$f" in common/*) why="used by $cur, or its lab" ;; *) why="new in $cur" ;; esac
        echo
        echo "# $k. $why: $f"
        diff -u /dev/null "$f" | tail -n +3 || true
        k=$((k + 1))
    done
    for f in $regions; do
        echo
        echo "# $k. lab $n's region in $f (a file every stage runs)"
        awk -v n="$n" '$0 ~ "^// LAB " n ":" { on = 1 } on { print "+" $0 } on && /^\/\/ LAB END/ { on = 0 }' "$f"
        k=$((k + 1))
    done
} > "$out"
cat "$out"
echo
strategy=$(sed '/^# (end of the strategy/q' "$out" | grep -cE '^[+-]' || true)
all=$(grep -cE '^[+-]' "$out" || true)
echo "# changed lines: $all (added or removed): $strategy in the strategy over $prev's, $((all - strategy)) in the files it adds"
