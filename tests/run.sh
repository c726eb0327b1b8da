#!/usr/bin/env bash
# run.sh TEST_BINARY...: runs the cmocka test binaries, WB_TEST_JOBS of them
# at a time (default: two more than the cores, since a test that waits on a
# file, a launcher or a sleeping rank leaves its core to the others: on 2
# cores 3 at a time took 808 s where 2 took 946 s and one 1450 s, and 4 at
# a time took the whole suite from 983 s to 932 s; at 4 a checkpoint's flush
# on the loaded disk once outlived mpirun's 1 s between SIGTERM and SIGKILL,
# which stop_fsync (stop.h) now keeps from holding up the signal), and adds
# up the results. Ends with the line "N passed, N failed".
#
# A test source may say, in a line of its own:
#   // mpirun: N   it runs under mpirun with N ranks (rank 0 reports);
#   // uses: NAME  no two tests that use NAME run at once (the emulated
#                  cluster's network namespaces, the one GPU, ...);
#   // alone       it runs with no other test beside it (it times
#                  something, or loads every core on its own);
#   // split: A B  it runs once per word, each time with that word as its
#                  argument (a part of its work), as tests of their own
#                  ("test_handouts 04"), so that a long one spreads over
#                  the cores.
# The longest tests start first (tests/durations.txt: seconds per test, as
# a run of this script on a 2-core machine printed them), so that the short
# ones fill in beside them. Each test's output is printed whole when it
# ends, with its time. A binary of a build with a root/ folder
# (BUILD/tests/...: the cuda emulator's build-emu, make sanitize's
# build-sanitize) runs there, where that build's trainers sit beside links to
# the rest of the tree, as the others run from the tree.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/mpi-env.sh"
jobs=${WB_TEST_JOBS:-$(( $(nproc) + 2 ))}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: WB_TEST_JOBS=$jobs: give a whole number of tests at a time, 1 or more"; exit 2; }
passed=0 failed=0 skipped=0
failed_names=()
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started_all=$(date +%s)

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

# ---- what each test is ----
n=0
declare -a bins names parts dirs nps uses alone expect
for arg in "$@"; do
    name=$(basename "$arg")
    bin=$(cd "$(dirname "$arg")" && pwd)/$name  # it may run elsewhere
    src=$(ls "$here"/tests/*/"$name.c" 2>/dev/null | head -1)
    split=$([ -n "$src" ] && sed -n 's|^// split: *||p' "$src" | head -1)
    for part in ${split:-""}; do
        bins[n]=$bin names[n]=$name${part:+ $part} parts[n]=$part dirs[n]=$(run_dir "$bin")
        nps[n]=$([ -n "$src" ] && sed -n 's|^// mpirun: *\([0-9][0-9]*\).*|\1|p' "$src" | head -1)
        uses[n]=$([ -n "$src" ] && sed -n 's|^// uses: *\([a-z0-9_-]*\).*|\1|p' "$src" | tr '\n' ' ')
        alone[n]=$([ -n "$src" ] && grep -qx '// alone' "$src" && echo 1 || echo 0)
        expect[n]=$(awk -v t="${names[n]}" '{k = $1; for (i = 2; i < NF; i++) k = k " " $i} k == t {print $NF}' \
                    "$here/tests/durations.txt" 2>/dev/null | head -1)
        expect[n]=${expect[n]:-10}
        n=$((n + 1))
    done
done
# longest first, the order given among equals
order=$(for ((i = 0; i < n; i++)); do echo "${expect[i]} $i"; done | sort -s -k1,1nr | awk '{print $2}')

# ---- one test ----
run_one() {  # index: runs it, leaves its output, status and seconds in $work
    local i=$1 start rc
    start=$(date +%s)
    if [ -n "${nps[i]}" ]; then
        (cd "${dirs[i]}" && timeout 900 mpirun -np "${nps[i]}" "${bins[i]}" ${parts[i]}) >"$work/$i.log" 2>&1
    else
        (cd "${dirs[i]}" && timeout 900 "${bins[i]}" ${parts[i]}) >"$work/$i.log" 2>&1
    fi
    rc=$?
    echo "$rc $(( $(date +%s) - start ))" >"$work/$i.done"
}

report() {  # index: prints its output and its line, adds it up
    local i=$1 rc secs p f s where=""
    read -r rc secs <"$work/$i.done"
    count() { sed -n "s/^\[  $1 \] \([0-9][0-9]*\) test.*/\1/p" "$work/$i.log" | awk '{n += $1} END {print n + 0}'; }
    p=$(count "PASSED ") f=$(count "FAILED ") s=$(count "SKIPPED")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or exited badly
    [ "${dirs[i]}" = "$here" ] || where=", in ${dirs[i]#"$here"/}"
    cat "$work/$i.log"
    echo "-- ${names[i]}: $p passed, $f failed, $s skipped (${secs}s${nps[i]:+, ${nps[i]} ranks}$where)"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    [ "$f" -eq 0 ] || failed_names+=("${names[i]}")
}

# ---- the schedule: start what may start, longest first; report what ended ----
declare -A running=()   # index -> pid
busy_uses=" "
anyone_alone=0
pending=($order)
may_start() {  # index: no shared use running, and nobody alone (nor this one alone beside others)
    local i=$1 u
    [ "$anyone_alone" -eq 0 ] || return 1
    [ "${alone[i]}" -eq 0 ] || [ ${#running[@]} -eq 0 ] || return 1
    for u in ${uses[i]}; do [[ "$busy_uses" != *" $u "* ]] || return 1; done
    return 0
}
while [ ${#pending[@]} -gt 0 ] || [ ${#running[@]} -gt 0 ]; do
    left=()
    for i in "${pending[@]}"; do
        if [ ${#running[@]} -lt "$jobs" ] && may_start "$i"; then
            run_one "$i" &
            running[$i]=$!
            for u in ${uses[i]}; do busy_uses+="$u "; done
            [ "${alone[i]}" -eq 0 ] || anyone_alone=1
        else
            left+=("$i")
        fi
    done
    pending=("${left[@]}")
    [ ${#running[@]} -gt 0 ] || continue
    wait -n 2>/dev/null || true
    for i in "${!running[@]}"; do
        [ -e "$work/$i.done" ] || continue
        wait "${running[$i]}" 2>/dev/null
        unset "running[$i]"
        for u in ${uses[i]}; do busy_uses=${busy_uses/ $u / }; done
        [ "${alone[i]}" -eq 0 ] || anyone_alone=0
        report "$i"
    done
done

[ ${#failed_names[@]} -eq 0 ] || echo "failing: ${failed_names[*]}"
echo "($n test programs, $jobs at a time, in $(( $(date +%s) - started_all ))s)"
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
