#!/usr/bin/env bash
# plot_losses.sh RUNS.json OUT.png: the loss curves of every run in a --json
# file (one record per line) overlaid, as picotron overlays each parallel
# configuration on the single-rank baseline; also drawn in the terminal.
# The curves of stages that compute the same math lie on top of each other.
set -euo pipefail
runs=$1 png=$2
command -v gnuplot >/dev/null || { echo "plot_losses: gnuplot not found (make deps installs it); no plot"; exit 0; }
data=$(mktemp)
trap 'rm -f "$data"' EXIT
# one block per run: "step loss" rows, blocks separated by two blank lines
awk '{
    stage = $0; sub(/.*"stage":"/, "", stage); sub(/".*/, "", stage)
    ranks = $0; sub(/.*"ranks":/, "", ranks); sub(/[,}].*/, "", ranks)
    first = $0; sub(/.*"first_step":/, "", first); sub(/[,}].*/, "", first)
    losses = $0; sub(/.*"losses":\[/, "", losses); sub(/\].*/, "", losses)
    n = split(losses, l, ",")
    printf "# %s N=%s\n", stage, ranks
    for (i = 1; i <= n; i++) printf "%d %s\n", first + i, l[i]
    printf "\n\n"
}' "$runs" > "$data"
titles=$(grep '^# ' "$data" | sed 's/^# //')
count=$(echo "$titles" | wc -l)
plot=""
for i in $(seq 0 $((count - 1))); do
    t=$(echo "$titles" | sed -n "$((i + 1))p")
    plot+="${plot:+, }'$data' index $i with lines title '$t'"
done
gnuplot <<GP
set terminal pngcairo size 900,540
set output '$png'
set xlabel 'step'
set ylabel 'training loss (nats/token)'
set grid
plot $plot
set terminal dumb size 100,28
set output
plot $plot
GP
echo "loss curves: $png"
