# Sourced by the Makefile's scripts: lets mpirun start as root and with more
# ranks than cores (a laptop or a CI box), and keeps its banners quiet so a
# failing run shows only the program's own error line.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_orte_execute_quiet=1
# one node, shared memory: keep Open MPI off network interfaces it would probe
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# more ranks than cores: a rank waiting in MPI yields its core to one computing
export OMPI_MCA_mpi_yield_when_idle=1
