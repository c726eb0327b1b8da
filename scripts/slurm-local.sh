#!/usr/bin/env bash
# slurm-local.sh: a one-node Slurm on this machine, so that the launch paths
# of a Slurm cluster (srun --mpi=pmix, salloc + mpirun, sbatch) can be tried
# and tested. Debian's slurm-wlm: munged, slurmctld and slurmd started here,
# with a configuration, sockets, state and logs of their own in one folder;
# /etc/slurm and a system Slurm's ports are left alone.
#
#   slurm-local.sh up
#   slurm-local.sh run -- srun --mpi=pmix -n 2 ./zero2 --model tiny
#   slurm-local.sh run -- salloc -n 2 mpirun ./dp_baseline --model tiny
#   slurm-local.sh status
#   slurm-local.sh down
#
# Needs root (munged runs as the user munge, the only one that may read its
# key; slurmd runs each job as its user) and the packages slurm-wlm and munge
# (scripts/install-deps.sh installs them).
set -euo pipefail

STATE=${ZW_SLURM_DIR:-/tmp/zw-slurm}   # slurm.conf, pid files, sockets, logs
CTLD_PORT=${ZW_SLURM_PORT:-6917}       # slurmd's is the next (a system Slurm uses 6817-6818)
MUNGE_KEY=/etc/munge/munge.key
UP_WAIT_S=30                           # for the node to show idle after the daemons start

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    cat <<'EOF'
The node is this host under its short name, with max(4, cores) CPUs (slurmd
is told to believe the configuration, so 4 ranks fit on a 2-core machine;
more need srun -O). MpiDefault=pmix; no cgroups (proctrack/linuxproc,
task/none). The folder is $ZW_SLURM_DIR (default /tmp/zw-slurm), the ports
$ZW_SLURM_PORT and the next (default 6917, 6918).
run: runs the command with SLURM_CONF set to this Slurm's configuration;
jobs it leaves queued or running are cancelled when it ends.
down: stops the daemons up started (by the pids in the folder) and removes
the folder.
Exit status: 0 done; 1 up failed (what it had started is stopped again);
2 bad use, or a Slurm is already up (up) or none is (run); 3 this machine
cannot run it (not root, a package missing).
EOF
}

say() { echo "slurm-local: $*"; }
die() { echo "slurm-local: error: $1" >&2; exit "${2:-2}"; }

export SLURM_CONF=$STATE/slurm.conf

# What `up` needs of the machine; the reason why not, exit 3.
check_machine() {
    [ "$(id -u)" -eq 0 ] || die "a Slurm of its own needs root (run as root, or skip the Slurm tests)" 3
    local tool
    for tool in munged munge slurmctld slurmd srun salloc sinfo; do
        command -v $tool >/dev/null || die "$tool not found (scripts/install-deps.sh installs slurm-wlm and munge)" 3
    done
    id munge >/dev/null 2>&1 || die "no user munge (the munge package makes it; reinstall munge)" 3
    [ -r "$MUNGE_KEY" ] || die "no MUNGE key $MUNGE_KEY (the munge package makes it; reinstall munge)" 3
}

# A pid from one of the folder's pid files, if that process is alive and is
# the daemon named (a pid may have been reused since); else nothing.
live_pid() {
    local name=$1 file=$STATE/$1.pid pid
    [ "$name" = munged ] && file=$STATE/munge/munged.pid   # written as the user munge
    [ -f "$file" ] || return 0
    pid=$(tr -dc 0-9 < "$file")
    [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ] && ! is_zombie "$pid" && echo "$pid"
    return 0
}

# A daemon that exited and is not reaped yet (PID 1 may be slow to) still has /proc/PID.
is_zombie() { [ "$(awk '{print $3}' /proc/"$1"/stat 2>/dev/null)" = Z ]; }

write_conf() {
    local node cpus
    node=$(hostname -s)
    cpus=$(nproc)
    [ "$cpus" -ge 4 ] || cpus=4
    mkdir -p "$STATE/state" "$STATE/spool" "$STATE/log"
    # a file of its own, or slurmctld would read /etc/slurm's (beside slurm.conf)
    : > "$STATE/plugstack.conf"
    cat > "$SLURM_CONF" <<EOF
# written by scripts/slurm-local.sh: a one-node Slurm for trying the launch paths
ClusterName=zw-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
PlugStackConfig=$STATE/plugstack.conf
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
ReturnToService=2
# CPUs as written here, not as slurmd counts them
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

# munged as the user munge (the key is that user's, mode 0600), with its
# socket, pid, seed and log in a folder that user owns and no one else may write.
start_munged() {
    local dir=$STATE/munge
    mkdir -p "$dir"
    chown munge:munge "$dir"
    chmod 0711 "$dir"
    runuser -u munge -- munged --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
        --seed-file="$dir/munged.seed" --log-file="$dir/munged.log" --key-file="$MUNGE_KEY" ||
        die "munged did not start: $(tail -1 "$dir/munged.log" 2>/dev/null)" 1
    munge -n -S "$dir/munge.socket" | unmunge -S "$dir/munge.socket" >/dev/null ||
        die "munged runs but a credential does not decode (munge -n | unmunge)" 1
}

# The last error or fatal line of a daemon's log.
last_error() { grep -E 'error|fatal' "$STATE/log/$1.log" 2>/dev/null | tail -1 || true; }

cmd_up() {
    [ $# -eq 0 ] || die "up takes no options (see slurm-local.sh --help)"
    if [ -e "$STATE" ]; then
        die "a Slurm is already up ($STATE; slurm-local.sh down stops it)"
    fi
    check_machine
    # from here a failure (set -e), or an interruption, stops what was started
    trap 'echo "slurm-local: error: up failed; stopping what it started" >&2; cmd_down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mkdir -m 0755 "$STATE"
    write_conf
    start_munged
    slurmctld || die "slurmctld did not start: $(last_error slurmctld)" 1
    slurmd || die "slurmd did not start: $(last_error slurmd)" 1
    local node state="" deadline=$((SECONDS + UP_WAIT_S)) name
    node=$(hostname -s)
    while [ "$SECONDS" -lt "$deadline" ]; do
        # a daemon that wrote its pid and is gone failed after forking (a port in use, ...)
        for name in slurmctld slurmd; do
            [ -f "$STATE/$name.pid" ] && [ -z "$(live_pid $name)" ] && die "$name stopped: $(last_error $name)" 1
        done
        # a client waits for an absent slurmctld far longer than this
        state=$(timeout 3 sinfo -h -n "$node" -o %t 2>/dev/null || true)
        [ "$state" = idle ] && break
        sleep 0.2
    done
    [ "$state" = idle ] || die "node $node not idle after ${UP_WAIT_S}s (sinfo says '${state:-nothing}'; logs in $STATE/log)" 1
    trap - EXIT INT TERM
    say "up: node $node ($(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' "$SLURM_CONF") CPUs), partition local; SLURM_CONF=$SLURM_CONF"
}

# Stops the daemons the folder's pid files name: TERM, then KILL after 10 s.
cmd_down() {
    local name pid pids=() waited=0
    # a job still running would keep its slurmstepd; cancel it while slurmctld can
    if [ -n "$(live_pid slurmctld)" ]; then
        for pid in $(squeue -h -o %i 2>/dev/null); do scancel --full "$pid" 2>/dev/null || true; done
    fi
    for name in slurmd slurmctld munged; do
        pid=$(live_pid $name)
        [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    done
    while [ ${#pids[@]} -gt 0 ] && [ "$waited" -lt 50 ]; do
        local alive=()
        for pid in "${pids[@]}"; do [ -d /proc/"$pid" ] && ! is_zombie "$pid" && alive+=("$pid"); done
        pids=("${alive[@]+"${alive[@]}"}")
        [ ${#pids[@]} -gt 0 ] && sleep 0.2
        waited=$((waited + 1))
    done
    for pid in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$pid" 2>/dev/null || true; done
    rm -rf "$STATE"
}

cmd_run() {
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || die "run: give a command, e.g. slurm-local.sh run -- srun -n 2 ./zero2"
    [ -n "$(live_pid slurmctld)" ] || die "no Slurm is up (slurm-local.sh up starts one)"
    RUN_BEFORE=$(squeue -h -o %i | sort)
    # however the run ends (failed, timed out, interrupted), its jobs go
    trap cancel_run_jobs EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    "$@"
}

cancel_run_jobs() {
    local job
    for job in $(comm -13 <(echo "$RUN_BEFORE") <(squeue -h -o %i 2>/dev/null | sort)); do
        scancel --full "$job" 2>/dev/null || true
    done
}

cmd_status() {
    if [ ! -e "$STATE" ]; then say "no Slurm is up"; return 0; fi
    local name pid
    for name in munged slurmctld slurmd; do
        pid=$(live_pid $name)
        if [ -n "$pid" ]; then echo "  $name: pid $pid"; else echo "  $name: not running"; fi
    done
    echo "  SLURM_CONF=$SLURM_CONF, logs in $STATE/log"
    sinfo 2>&1 | sed 's/^/  /'
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    down) cmd_down; say "down" ;;
    run) shift; cmd_run "$@" ;;
    status) cmd_status ;;
    -h|--help|help) usage ;;
    "") usage >&2; exit 2 ;;
    *) die "unknown command $1 (up, run, status, down, --help)" ;;
esac
