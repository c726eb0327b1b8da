// host_worker.h: one host thread that runs one job at a time while the main
// thread goes on. cpu_offload's delayed parameter update runs its CPU Adam
// there while the device computes the next step. The worker notes when the
// job ran, so the main thread can put it on the timeline (the trace is the
// main thread's) when it collects the job.
#pragma once
#include <pthread.h>

typedef void (*HostJobFn)(void *arg);

typedef struct HostWorker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    HostJobFn fn;          // the job given to the thread, NULL when none
    void *arg;
    int running, done, stop;
    double t_start_us, t_end_us;  // of the last job
} HostWorker;

void host_worker_init(HostWorker *w);
// Hands the job to the thread; the previous one must have been collected.
void host_worker_start(HostWorker *w, HostJobFn fn, void *arg);
// A job was started and not yet collected.
int host_worker_busy(HostWorker *w);
// Blocks until the job is done and collects it: [*t0_us, *t1_us) is when it ran.
void host_worker_wait(HostWorker *w, double *t0_us, double *t1_us);
// Waits for a job still running, then ends the thread.
void host_worker_free(HostWorker *w);
