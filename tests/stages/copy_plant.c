// copy_plant.c: a container that forbids reading another process's memory,
// planted for test_training: the Makefile builds comm_world.c again with
// this function standing for process_vm_readv, into a dp_baseline of its
// own, which must then choose shared memory without the single copy and
// still train.
#define _GNU_SOURCE
#include <errno.h>
#include <sys/uio.h>

ssize_t planted_process_vm_readv(pid_t pid, const struct iovec *local, unsigned long local_count,
                                 const struct iovec *remote, unsigned long remote_count, unsigned long flags) {
    (void)pid, (void)local, (void)local_count, (void)remote, (void)remote_count, (void)flags;
    errno = EPERM;  // what a seccomp profile or a missing ptrace permission answers
    return -1;
}
