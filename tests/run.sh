#!/usr/bin/env bash
# run.sh TEST_BINARY...: runs each cmocka test binary and adds up the results.
# A test source with a line "// mpirun: N" runs under mpirun with N ranks
# (rank 0 reports). Ends with the line "N passed, N failed". A binary of a
# build with a root/ folder (BUILD/tests/...: the cuda emulator's build-emu,
# make sanitize's build-sanitize) runs there, where that build's trainers sit
# beside links to the rest of the tree, as the others run from the tree.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/mpi-env.sh"
passed=0 failed=0 skipped=0
failed_names=()
# the folder a binary runs in (and its build's root/ made ready)
run_dir() {
    local build=${1%%/tests/*}
    if [ "$build" != "$1" ] && [ -d "$build/root" ]; then
        for f in "$here"/*; do
            local name=${f##*/}
            [ -e "$build/root/$name" ] || [ "$here/$name" -ef "$build" ] || ln -s "$f" "$build/root/$name"
        done
        (cd "$build/root" && pwd)
    else
        echo "$here"
    fi
}
for bin in "$@"; do
    name=$(basename "$bin")
    bin=$(cd "$(dirname "$bin")" && pwd)/$name  # it may run elsewhere
    dir=$(run_dir "$bin")
    where=""
    [ "$dir" = "$here" ] || where=", in ${dir#"$here"/}"
    src=$(ls "$here"/tests/*/"$name.c" 2>/dev/null | head -1)
    np=$([ -n "$src" ] && sed -n 's|^// mpirun: *\([0-9][0-9]*\).*|\1|p' "$src" | head -1)
    log=$(mktemp)
    start=$(date +%s)
    if [ -n "$np" ]; then
        (cd "$dir" && timeout 900 mpirun -np "$np" "$bin") >"$log" 2>&1
    else
        (cd "$dir" && timeout 900 "$bin") >"$log" 2>&1
    fi
    rc=$?
    secs=$(( $(date +%s) - start ))
    # a binary may run several groups: add up every group's counts
    count() { sed -n "s/^\[  $1 \] \([0-9][0-9]*\) test.*/\1/p" "$log" | awk '{n += $1} END {print n + 0}'; }
    p=$(count "PASSED ") f=$(count "FAILED ") s=$(count "SKIPPED")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or exited badly
    cat "$log"
    echo "-- $name: $p passed, $f failed, $s skipped (${secs}s${np:+, $np ranks}$where)"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    [ "$f" -eq 0 ] || failed_names+=("$name")
    rm -f "$log"
done
[ ${#failed_names[@]} -eq 0 ] || echo "failing: ${failed_names[*]}"
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
