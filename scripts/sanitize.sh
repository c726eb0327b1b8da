#!/usr/bin/env bash
# sanitize.sh DIR: the test suite against the sanitized build in DIR (make
# sanitize builds it). The binaries are in DIR/root; the rest of the tree is
# linked in beside them, so the tests run there as from the repository root.
# The sanitizers write their reports to DIR/logs, and any report fails the
# run, whatever status the program exited with (a test that expects a
# refusal would otherwise take a sanitizer's exit for it).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$here/$1
root=$dir/root logs=$dir/logs
rm -rf "$logs"
mkdir -p "$logs"
for f in "$here"/*; do
    name=$(basename "$f")
    [ -e "$root/$name" ] || [ "$name" = "$(basename "$dir")" ] || ln -s "$f" "$root/$name"
done
# Open MPI's and OpenBLAS's own allocations live until exit: leaks are not checked
export ASAN_OPTIONS=detect_leaks=0:log_path=$logs/asan
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan
start=$(date +%s)
bins=()
for b in "$dir"/tests/*/test_*; do [[ $b == *.d ]] || bins+=("$b"); done
(cd "$root" && bash tests/run.sh "${bins[@]}")
status=$?
echo "sanitize: the suite took $(( $(date +%s) - start )) s"
if compgen -G "$logs/*" >/dev/null; then
    echo "sanitize: reports in $logs:"
    head -n 40 "$logs"/*
    exit 1
fi
exit $status
