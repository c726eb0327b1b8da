# Sourced by the Makefile's scripts: lets mpirun start as root and with more
# ranks than cores (a laptop or a CI box), and keeps its banners quiet so a
# failing run shows only the program's own error line.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_orte_execute_quiet=1
# shared memory between ranks on one host, TCP between hosts (mpirun
# --hostfile, scripts/cluster.sh); openib and ofi stay off, as they probe
# for RDMA hardware and warn where there is none. On a cluster with
# InfiniBand or RoCE, unset OMPI_MCA_btl and OMPI_MCA_pml: Open MPI then
# picks UCX. Those transports go through the ob1 layer, named so that MPI_Init
# does not first start UCX to find no use for it (0.32 s to 0.12 s a launch).
# Shared memory's single copy (btl_vader_single_copy_mechanism) is left to
# the programs: each tries it before MPI_Init and takes cma where the
# container lets one process read another's memory, none where it does not
# (comm_world.c says why); set the variable to choose for yourself.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1
# more ranks than cores: a rank waiting in MPI yields its core to one computing
export OMPI_MCA_mpi_yield_when_idle=1

# Quiet mpirun says nothing when a rank dies of a signal (kill -9, a crash)
# or cannot be started: in bash, mpirun runs with its reports on, and of the
# blocks they come in (between lines of dashes) the one naming a rank killed
# by a signal and the one naming a program it could not start stay, as one
# line each; the others go, as the program's own error line says why it
# stopped. The exit status is mpirun's.
#
# `mpirun ... &` gives the pid of the shell that runs the function, not
# mpirun's: SIGTERM or SIGHUP sent to it (what a batch system or a script
# sends) is passed on to mpirun, which stops every rank with it, and once
# mpirun has ended the signal ends that shell too, as it would have ended
# mpirun. Ctrl-C reaches mpirun itself (the same process group); the filter
# ignores it, so mpirun's last words still get through.
if [ -n "$BASH_VERSION" ]; then
    mpirun() {
        # the traps are set in a shell of its own, never the caller's (a
        # command put in the background already runs in one)
        if [ "$BASHPID" = "$$" ]; then (zw_mpirun_reported "$@"); else zw_mpirun_reported "$@"; fi
    }
    zw_mpirun_reported() {
        local launcher="" stop="" status=0 reports filter saved
        saved=$(trap -p TERM HUP INT)
        exec {reports}> >(trap '' INT; awk '
            function one_line(   w, name, exe, node) {
                if (match(block, /process rank [0-9]+ with PID [0-9]+ on node [^ ]+ exited on signal [0-9]+ \([^)]*\)/)) {
                    split(substr(block, RSTART, RLENGTH), w, " ")
                    name = substr(block, RSTART, RLENGTH); sub(/.*signal [0-9]+ /, "", name)
                    printf "mpirun: rank %s died of signal %s %s on node %s; the job was stopped\n", w[3], w[13], name, w[9]
                } else if (block ~ /could not access or execute an executable/) {
                    exe = block; sub(/.*Executable: /, "", exe); sub(/ .*/, "", exe)
                    node = block; sub(/.*Node: /, "", node); sub(/ .*/, "", node)
                    printf "mpirun: cannot start %s on node %s: no such program there, or not executable (a relative path is taken from the folder mpirun runs in: cd to the repository root, or give the path)\n", exe, node
                }
                fflush()
            }
            /^----------------------------------------/ {
                if (in_block) one_line()
                in_block = !in_block; block = ""; next
            }
            in_block { block = block " " $0; next }
            # the count of the blocks that went ("N more processes have sent help
            # message ...", and how to see them), and the rsh launcher racing its
            # own child, which then runs anyway
            /^\[[^]]*\] [0-9]+ more process(es)? ha(s|ve) sent help message / { next }
            /^\[[^]]*\] Set MCA parameter "orte_base_help_aggregate" to 0/ { next }
            /plm:rsh: Warning: setpgid\([0-9]+,[0-9]+\) failed in parent/ { next }
            { print; fflush() }' >&2)
        filter=$!
        trap 'stop=TERM; [ -z "$launcher" ] || kill -TERM "$launcher" 2>/dev/null' TERM
        trap 'stop=HUP; [ -z "$launcher" ] || kill -HUP "$launcher" 2>/dev/null' HUP
        trap : INT
        # (<&0: a command put in the background here would read /dev/null)
        command mpirun --mca orte_execute_quiet 0 "$@" 2>&$reports {reports}>&- <&0 &
        launcher=$!
        exec {reports}>&-
        [ -z "$stop" ] || kill -s "$stop" "$launcher" 2>/dev/null || true
        while :; do
            # a trapped signal ends the wait early, while mpirun still runs
            wait "$launcher" && status=0 || status=$?
            kill -0 "$launcher" 2>/dev/null || break
        done
        wait "$filter" 2>/dev/null || true
        trap - TERM HUP INT
        eval "$saved"
        [ -z "$stop" ] || kill -s "$stop" "$BASHPID"
        return "$status"
    }
fi
