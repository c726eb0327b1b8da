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
UP_WAIT_S=60                           # for the node to show idle after the daemons start (a loaded machine is slow)
STOP_WAIT_S=10                         # for a process sent SIGTERM to end, before SIGKILL
# written by up as it makes the folder: down removes only a folder that holds it
MARKER=.made-by-slurm-local
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

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
down: cancels the jobs, stops the daemons up started (by the pids in the
folder) and every process left of this Slurm's jobs (their slurmstepd and
tasks, found by this SLURM_CONF in their environment), and removes the
folder; only a folder up made (it holds the file .made-by-slurm-local), else
it refuses and touches nothing. PMIx's folders of a step (spmix_appdir_*)
are in the folder too (mpi.conf), so a killed step leaves none in /tmp.
Exit status: 0 done; 1 up failed (what it had started is stopped again);
2 bad use, or a Slurm is already up (up) or none is (run), or the folder is
not one up made; 3 this machine cannot run it (not root, a package missing).
Like the Makefile, it sets scripts/mpi-env.sh's settings (mpirun inside
salloc, as root).
EOF
}

say() { echo "slurm-local: $*"; }
die() { echo "slurm-local: error: $1" >&2; exit "${2:-2}"; }

export SLURM_CONF=$STATE/slurm.conf
# mpirun inside an allocation as root, and more ranks than cores
source "$HERE/scripts/mpi-env.sh"

# Is the folder one that up made? (Anything else named by ZW_SLURM_DIR is
# someone's: never read its pid files, never remove it.)
ours() { [ -f "$STATE/$MARKER" ]; }
not_ours() {
    die "$STATE was not made by slurm-local.sh up (no $MARKER in it), so it is left alone; ZW_SLURM_DIR names this script's folder: unset it, or name one that does not exist yet"
}

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
    local name=$1 pid
    pid=$(pid_written "$name")
    [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ] && ! is_zombie "$pid" && echo "$pid"
    return 0
}

# The pid a daemon wrote in its pid file; nothing while there is no file or
# the daemon has made it and not yet written its number in it.
pid_written() {
    local file=$STATE/$1.pid
    [ "$1" = munged ] && file=$STATE/munge/munged.pid   # written as the user munge
    [ -f "$file" ] || return 0
    tr -dc 0-9 < "$file"
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
    # PMIx's per-step folders (spmix_appdir_UID_JOB.STEP) here rather than in
    # /tmp: a step killed before its slurmstepd cleaned up leaves its folder
    # where down removes it. Sticky and world-writable, as /tmp: a job's user
    # owns its own folder in it.
    mkdir "$STATE/tmp"
    chmod 1777 "$STATE/tmp"
    echo "PMIxCliTmpDirBase=$STATE/tmp" > "$STATE/mpi.conf"
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

# The last error or fatal line of a daemon's log, or where to look when it
# wrote none there (a daemon that stops on its configuration says why on
# its own output, above).
last_error() {
    local line
    line=$(grep -E 'error|fatal' "$STATE/log/$1.log" 2>/dev/null | tail -1 || true)
    if [ -n "$line" ]; then echo "$line"; return 0; fi
    # the folder goes when up fails: its last lines are printed here
    echo "no error in $STATE/log/$1.log; its own lines above say why; the log ended:"
    tail -5 "$STATE/log/$1.log" 2>/dev/null | sed 's/^/    /'
}

# slurm.conf's values end at a space and its comments start at '#': a
# folder whose path holds either cannot be written into it.
check_folder_name() {
    case "$STATE" in
    *[[:space:]]* | *'#'*)
        die "ZW_SLURM_DIR=$STATE holds a space or '#', which slurm.conf cannot hold in a path (its values end at a space, its comments start at '#'): name a folder without them" ;;
    esac
}

cmd_up() {
    [ $# -eq 0 ] || die "up takes no options (see slurm-local.sh --help)"
    check_folder_name
    if [ -e "$STATE" ]; then
        ours || not_ours
        die "a Slurm is already up ($STATE; slurm-local.sh down stops it)"
    fi
    check_machine
    mkdir -m 0755 "$STATE" 2>/dev/null || die "cannot make the folder $STATE (ZW_SLURM_DIR): name a new folder inside one that exists"
    echo "made by scripts/slurm-local.sh up; slurm-local.sh down removes this folder" > "$STATE/$MARKER"
    # from here a failure (set -e), or an interruption, stops what was started
    trap 'echo "slurm-local: error: up failed; stopping what it started" >&2; cmd_down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    write_conf
    start_munged
    slurmctld || die "slurmctld did not start: $(last_error slurmctld)" 1
    slurmd || die "slurmd did not start: $(last_error slurmd)" 1
    local node state="" deadline=$((SECONDS + UP_WAIT_S)) name
    node=$(hostname -s)
    while [ "$SECONDS" -lt "$deadline" ]; do
        # a daemon that wrote its pid and is gone failed after forking (a port
        # in use, ...); one whose file is still empty is writing it
        for name in slurmctld slurmd; do
            [ -n "$(pid_written $name)" ] && [ -z "$(live_pid $name)" ] && die "$name stopped: $(last_error $name)" 1
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

# Stops what this Slurm runs and removes its folder: the jobs are cancelled
# (their slurmstepd ends the tasks and cleans up), the daemons the pid files
# name stop, and whatever of the jobs is still left goes too (a job whose
# slurmd was lost keeps its slurmstepd, its tasks and its srun).
cmd_down() {
    [ -e "$STATE" ] || return 0
    ours || not_ours
    local name pid daemons=()
    if [ -n "$(live_pid slurmctld)" ]; then
        for pid in $(squeue -h -o %i 2>/dev/null); do scancel --full "$pid" 2>/dev/null || true; done
        [ -z "$(live_pid slurmd)" ] || wait_until_gone $(job_processes tasks) $(job_processes steps)
    fi
    for name in slurmd slurmctld munged; do
        pid=$(live_pid $name)
        [ -n "$pid" ] && daemons+=("$pid")
    done
    stop_processes "${daemons[@]+"${daemons[@]}"}"
    # a task may still say where it got to and remove its files (SIGTERM);
    # a slurmstepd or srun with no slurmd to answer it would wait for ever
    stop_processes $(job_processes tasks)
    pid=$(job_processes steps)
    [ -z "$pid" ] || kill -KILL $pid 2>/dev/null || true
    rm -rf "$STATE"
}

# The processes of this Slurm's jobs, told apart from another Slurm's by this
# SLURM_CONF in the environment they started with: `tasks` (they have
# SLURM_JOB_ID: the ranks, a batch script, the command salloc runs) or
# `steps` (slurmstepd, and the clients srun and salloc). Never this script or
# a caller of it (down may be run from a shell inside an allocation).
job_processes() {
    local file pid comm callers=" " caller=$BASHPID
    while [ "$caller" -gt 1 ]; do callers+="$caller "; caller=$(parent_of "$caller"); done
    for file in $(grep -lzxF "SLURM_CONF=$SLURM_CONF" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${file#/proc/}
        pid=${pid%/environ}
        [[ $callers == *" $pid "* ]] && continue
        comm=$(cat /proc/"$pid"/comm 2>/dev/null) || continue
        case $1 in
            steps) [[ $comm =~ ^(slurmstepd|srun|salloc)$ ]] && echo "$pid" ;;
            tasks) [[ $comm =~ ^(slurmstepd|srun|salloc)$ ]] || ! grep -qz '^SLURM_JOB_ID=' "$file" 2>/dev/null || echo "$pid" ;;
        esac
    done
    return 0
}

# /proc/PID/stat from the field after the command's name (which may hold
# spaces): the state, the parent, ...; nothing when PID is gone.
stat_of() { local s; s=$(cat /proc/"$1"/stat 2>/dev/null) && echo "${s##*) }"; }
parent_of() { local s; s=($(stat_of "$1")); echo "${s[1]:-0}"; }

# The pids given that are still running (a zombie has ended).
running() {
    local pid state
    for pid in "$@"; do
        state=$(stat_of "$pid")
        [ -n "$state" ] && [ "${state%% *}" != Z ] && echo "$pid"
    done
    return 0
}

# Waits up to STOP_WAIT_S for the pids given to end.
wait_until_gone() {
    local deadline=$((SECONDS + STOP_WAIT_S))
    while [ -n "$(running "$@")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
}

# TERM, then KILL what is still running after STOP_WAIT_S.
stop_processes() {
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    wait_until_gone "$@"
    local left
    left=$(running "$@")
    [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
}

cmd_run() {
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || die "run: give a command, e.g. slurm-local.sh run -- srun -n 2 ./zero2"
    [ ! -e "$STATE" ] || ours || not_ours
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
    [ -n "$(live_pid slurmctld)" ] || return 0   # taken down meanwhile
    for job in $(comm -13 <(echo "$RUN_BEFORE") <(squeue -h -o %i 2>/dev/null | sort)); do
        scancel --full "$job" 2>/dev/null || true
    done
}

cmd_status() {
    if [ ! -e "$STATE" ]; then say "no Slurm is up"; return 0; fi
    if ! ours; then say "no Slurm is up ($STATE was not made by slurm-local.sh up)"; return 0; fi
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
