#!/usr/bin/env bash
# fuzz.sh DIR SECONDS NAME...: runs each libFuzzer target DIR/fuzz/NAME for
# SECONDS (make fuzz builds them). It starts from the seed corpus
# tests/fuzz/corpus/NAME (valid inputs, and every input that once found a
# bug: run first, so each is a regression check) and grows a working copy in
# DIR/corpus/NAME; a finding leaves its input in DIR/findings/NAME and fails
# the run. Prints the executions and the time of each target.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$here/$1 seconds=$2
shift 2
export ASAN_OPTIONS=detect_leaks=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for name in "$@"; do
    seeds=$here/tests/fuzz/corpus/$name work=$dir/corpus/$name findings=$dir/findings/$name
    mkdir -p "$work" "$findings"
    log=$dir/$name.log
    start=$(date +%s)
    "$dir/fuzz/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$findings/" "$work" "$seeds" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz: $name: ${runs:-?} executions in $(( $(date +%s) - start )) s, corpus $(ls "$work" | wc -l) inputs"
    if [ "$rc" -ne 0 ] || compgen -G "$findings/*" >/dev/null; then
        echo "fuzz: $name found a bug (exit $rc); its input is in $findings, the report in $log:"
        grep -m 20 -E "ERROR|SUMMARY|runtime error|==[0-9]+==" "$log"
        status=1
    fi
done
exit $status
