// comm_progress.c: the optional progress thread (--progress-thread). Open MPI
// 4.1 over shared memory has no asynchronous progress: a nonblocking
// collective moves only while some thread of the rank is inside an MPI call.
// Without this thread that happens in comm_progress (called by the stages'
// steps between units) and at the wait, so "in flight" mostly means "waiting for the next
// MPI call". This thread enters MPI's progress engine every interval, so a
// bucket's reduce-scatter can advance while the main thread computes. It
// needs MPI_THREAD_MULTIPLE, asked for at MPI_Init (comm_world_init), and
// it takes CPU time from the compute threads: the report measures both.
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "check.h"
#include "comm.h"

typedef struct ProgressThread {
    pthread_t thread;
    MPI_Comm probe;  // a duplicate of the world: probing it matches nothing of ours
    long interval_us;
    volatile int stop;
} ProgressThread;

static void *progress_main(void *arg) {
    ProgressThread *p = arg;
    struct timespec pause = {0, p->interval_us * 1000};
    while (!p->stop) {
        int flag = 0;
        // MPI_Iprobe enters the progress engine and receives nothing
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, p->probe, &flag, MPI_STATUS_IGNORE);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

void comm_progress_thread_start(Comm *world, long interval_us) {
    int level = 0;
    mpiCheck(MPI_Query_thread(&level));
    CHECK(level >= MPI_THREAD_MULTIPLE, "a progress thread needs MPI_THREAD_MULTIPLE (have %d); hint: "
          "comm_world_init asks for it when told a progress thread is coming", level);
    ProgressThread *p = xcalloc(1, sizeof *p);
    p->interval_us = interval_us > 0 ? interval_us : 1;
    mpiCheck(MPI_Comm_dup(world->mpi, &p->probe));
    CHECK(pthread_create(&p->thread, NULL, progress_main, p) == 0, "cannot start the MPI progress thread");
    world->progress = p;
}

void comm_progress_thread_stop(Comm *world) {
    ProgressThread *p = world->progress;
    if (!p) return;
    p->stop = 1;
    pthread_join(p->thread, NULL);
    mpiCheck(MPI_Comm_free(&p->probe));
    free(p);
    world->progress = NULL;
}
