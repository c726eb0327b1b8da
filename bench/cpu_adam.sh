#!/usr/bin/env bash
# cpu_adam.sh [FLAGS]: builds bench/cpu_adam.c against the core library and
# runs it: the CPU Adam beside a STREAM triad and the scalar loop, in one run,
# as one JSON object on stdout (build output goes to stderr). FLAGS go to the
# binary (--params, --threads, --rounds; --help lists them). GPU=0 builds
# into build-nogpu, as make does.
#
# Threads are pinned one per core (OMP_PLACES=cores, OMP_PROC_BIND=close)
# unless the caller set those variables, so that the triad and Adam stream
# from the same cores in every round.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=${GPU:-1}
build=build
[ "$gpu" = 0 ] && build=build-nogpu
make -s GPU="$gpu" "$build/bench/cpu_adam" >&2
export OMP_PLACES=${OMP_PLACES:-cores} OMP_PROC_BIND=${OMP_PROC_BIND:-close}
exec "$build/bench/cpu_adam" "$@"
