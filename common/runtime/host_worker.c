// host_worker.c: a host thread running one job at a time (see host_worker.h).
#include "host_worker.h"
#include <string.h>
#include "check.h"
#include "trace.h"

static void *worker_main(void *p) {
    HostWorker *w = p;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->fn && !w->stop) pthread_cond_wait(&w->cv, &w->lock);
        if (!w->fn) break;  // stop, and nothing left to run
        HostJobFn fn = w->fn;
        void *arg = w->arg;
        w->running = 1;
        pthread_mutex_unlock(&w->lock);
        double t0 = now_us();
        fn(arg);
        double t1 = now_us();
        pthread_mutex_lock(&w->lock);
        w->t_start_us = t0;
        w->t_end_us = t1;
        w->fn = NULL;
        w->running = 0;
        w->done = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

void host_worker_init(HostWorker *w) {
    memset(w, 0, sizeof *w);
    CHECK(pthread_mutex_init(&w->lock, NULL) == 0, "host worker: mutex");
    CHECK(pthread_cond_init(&w->cv, NULL) == 0, "host worker: condition variable");
    CHECK(pthread_create(&w->thread, NULL, worker_main, w) == 0,
          "host worker: cannot start a thread; hint: the process may be at its thread limit (ulimit -u)");
}

void host_worker_start(HostWorker *w, HostJobFn fn, void *arg) {
    pthread_mutex_lock(&w->lock);
    CHECK(!w->fn && !w->running && !w->done, "host worker: a job is still uncollected; hint: host_worker_wait first");
    w->fn = fn;
    w->arg = arg;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->lock);
}

int host_worker_busy(HostWorker *w) {
    pthread_mutex_lock(&w->lock);
    int busy = w->fn != NULL || w->running || w->done;
    pthread_mutex_unlock(&w->lock);
    return busy;
}

void host_worker_wait(HostWorker *w, double *t0_us, double *t1_us) {
    pthread_mutex_lock(&w->lock);
    CHECK(w->fn || w->running || w->done, "host worker: waiting with no job started");
    while (!w->done) pthread_cond_wait(&w->cv, &w->lock);
    w->done = 0;
    if (t0_us) *t0_us = w->t_start_us;
    if (t1_us) *t1_us = w->t_end_us;
    pthread_mutex_unlock(&w->lock);
}

void host_worker_free(HostWorker *w) {
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cv);
}
