# Sourced by the Makefile's scripts: lets mpirun start as root and with more
# ranks than cores (a laptop or a CI box), and keeps its banners quiet so a
# failing run shows only the program's own error line.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_orte_execute_quiet=1
# shared memory between ranks on one host, TCP between hosts (mpirun
# --hostfile, scripts/cluster.sh); openib and ofi stay off, as they probe
# for RDMA hardware and warn where there is none. On a cluster with
# InfiniBand or RoCE, unset OMPI_MCA_btl: Open MPI then picks UCX.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
# more ranks than cores: a rank waiting in MPI yields its core to one computing
export OMPI_MCA_mpi_yield_when_idle=1

# Quiet mpirun says nothing when a rank dies of a signal (kill -9, a crash):
# in bash, mpirun runs with its reports on, and of the blocks they come in
# (between lines of dashes) the one naming a rank killed by a signal stays,
# as one line; the others go, as the program's own error line says why it
# stopped. The exit status is mpirun's.
if [ -n "$BASH_VERSION" ]; then
    mpirun() {
        local status
        { command mpirun --mca orte_execute_quiet 0 "$@" 2>&1 1>&3 3>&- | awk '
            /^----------------------------------------/ {
                if (in_block && match(block, /process rank [0-9]+ with PID [0-9]+ on node [^ ]+ exited on signal [0-9]+ \([^)]*\)/)) {
                    split(substr(block, RSTART, RLENGTH), w, " ")
                    name = substr(block, RSTART, RLENGTH); sub(/.*signal [0-9]+ /, "", name)
                    printf "mpirun: rank %s died of signal %s %s on node %s; the job was stopped\n", w[3], w[13], name, w[9]
                    fflush()
                }
                in_block = !in_block; block = ""; next
            }
            in_block { block = block " " $0; next }
            { print; fflush() }' >&2; status=${PIPESTATUS[0]}; } 3>&1
        return "$status"
    }
fi
