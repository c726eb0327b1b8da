#!/usr/bin/env bash
# make diff-NN: what stage NN adds over the stage before it: the diff of the
# two trainers' main files, then the files the new stage adds in full
# (the technique, without the shared core).
set -euo pipefail
n=$1
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
cur=$(ls -d "${n}"_* 2>/dev/null | head -1)
[ -n "$cur" ] || { echo "diff-$n: no stage folder ${n}_*; stages: $(ls -d [0-9][0-9]_* | tr '\n' ' ')" >&2; exit 2; }
prev_n=$(printf '%02d' $((10#$n - 1)))
prev=$(ls -d "${prev_n}"_* 2>/dev/null | head -1)
[ -n "$prev" ] || { echo "diff-$n: $cur is the first stage; nothing before it to compare" >&2; exit 2; }
main_of() { grep -l '^int main(' "$1"/*.c | head -1; }
echo "# what $cur adds over $prev"
echo "# 1. the trainer: $(main_of "$prev") -> $(main_of "$cur")"
diff -u --label "$(main_of "$prev")" --label "$(main_of "$cur")" "$(main_of "$prev")" "$(main_of "$cur")" || true
for f in "$cur"/*.c "$cur"/*.h; do
    [ -e "$f" ] && [ "$f" != "$(main_of "$cur")" ] || continue
    echo
    echo "# new in $cur: $f"
    diff -u /dev/null "$f" | tail -n +3 || true
done
