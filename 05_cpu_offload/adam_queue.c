// adam_queue.c: the CPU Adam's host thread over a queue of sub-groups (see
// adam_queue.h).
#include "adam_queue.h"
#include <string.h>
#include "check.h"

static void update_group(AdamQueue *q, int k) {
    const AdamPass *p = &q->pass;
    size_t at = q->first[k], n = q->count[k];
    cpu_adam_step(p->path, p->threads, p->master + at, p->m + at, p->v + at, p->grads + at, p->params_out + at, n,
                  &p->step);
}

static void *queue_main(void *arg) {
    AdamQueue *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (q->taken == q->pushed && !q->stop) pthread_cond_wait(&q->cv, &q->lock);
        if (q->taken == q->pushed) break;  // stop, and nothing left
        int k = q->order[q->taken++];
        pthread_mutex_unlock(&q->lock);
        double t0 = now_us();
        update_group(q, k);
        double t1 = now_us();
        pthread_mutex_lock(&q->lock);
        q->t0_us[k] = t0;
        q->t1_us[k] = t1;
        q->done[k] = 1;
        q->active = --q->left > 0;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

void adam_queue_init(AdamQueue *q, int groups, const size_t *first, const size_t *count) {
    memset(q, 0, sizeof *q);
    q->groups = groups;
    q->first = first;
    q->count = count;
    q->order = xcalloc((size_t)groups, sizeof(int));
    q->done = xcalloc((size_t)groups, 1);
    q->t0_us = xcalloc((size_t)groups, sizeof(double));
    q->t1_us = xcalloc((size_t)groups, sizeof(double));
    q->traced = xcalloc((size_t)groups, 1);
    CHECK(pthread_mutex_init(&q->lock, NULL) == 0, "adam queue: mutex");
    CHECK(pthread_cond_init(&q->cv, NULL) == 0, "adam queue: condition variable");
    CHECK(pthread_create(&q->thread, NULL, queue_main, q) == 0,
          "adam queue: cannot start a thread; hint: the process may be at its thread limit (ulimit -u)");
}

void adam_queue_begin(AdamQueue *q, const AdamPass *pass) {
    pthread_mutex_lock(&q->lock);
    CHECK(!q->active, "adam queue: a pass begun while the last one runs; hint: adam_queue_wait_all first");
    q->pass = *pass;
    q->pushed = q->taken = q->left = 0;
    for (int k = 0; k < q->groups; k++) {
        q->done[k] = q->count[k] == 0;
        q->left += !q->done[k];
    }
    memset(q->traced, 0, (size_t)q->groups);
    q->active = q->left > 0;
    pthread_mutex_unlock(&q->lock);
}

void adam_queue_push(AdamQueue *q, int k) {
    pthread_mutex_lock(&q->lock);
    CHECK(q->active && k >= 0 && k < q->groups && !q->done[k] && q->pushed < q->groups,
          "adam queue: sub-group %d handed over outside a pass, twice, or with no elements", k);
    q->order[q->pushed++] = k;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lock);
}

int adam_queue_done(AdamQueue *q, int k) {
    pthread_mutex_lock(&q->lock);
    int done = !q->active || q->done[k];
    pthread_mutex_unlock(&q->lock);
    return done;
}

void adam_queue_wait(AdamQueue *q, int k) {
    pthread_mutex_lock(&q->lock);
    while (q->active && !q->done[k]) {
        int handed = 0;
        for (int i = 0; i < q->pushed && !handed; i++) handed = q->order[i] == k;
        CHECK(handed, "adam queue: waiting for sub-group %d, which was never handed over", k);
        pthread_cond_wait(&q->cv, &q->lock);
    }
    pthread_mutex_unlock(&q->lock);
}

// They are updated in the order handed over: the last one done is all done.
void adam_queue_wait_all(AdamQueue *q) {
    pthread_mutex_lock(&q->lock);
    while (q->pushed > 0 && !q->done[q->order[q->pushed - 1]]) pthread_cond_wait(&q->cv, &q->lock);
    pthread_mutex_unlock(&q->lock);
}

int adam_queue_active(AdamQueue *q) {
    pthread_mutex_lock(&q->lock);
    int active = q->active;
    pthread_mutex_unlock(&q->lock);
    return active;
}

void adam_queue_trace(AdamQueue *q, Trace *tr, const char *name) {
    pthread_mutex_lock(&q->lock);
    for (int k = 0; k < q->groups; k++) {
        if (!q->done[k] || q->traced[k] || q->count[k] == 0) continue;
        trace_span(tr, TRACE_TID_HOST, name, q->t0_us[k], q->t1_us[k], 0);
        q->traced[k] = 1;
    }
    pthread_mutex_unlock(&q->lock);
}

void adam_queue_free(AdamQueue *q) {
    pthread_mutex_lock(&q->lock);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cv);
    free(q->order);
    free(q->done);
    free(q->t0_us);
    free(q->t1_us);
    free(q->traced);
}
