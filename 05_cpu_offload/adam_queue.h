// adam_queue.h: ZeRO-Offload's CPU Adam as a pipeline stage (Ren et al.,
// 2021, section 4): a host thread runs the SIMD CPU Adam on one sub-group of
// the rank's shard at a time, in the order the sub-groups are handed to it,
// while the main thread goes on issuing device work. A sub-group is handed
// over as soon as its gradients are all on the host (during backward, from a
// function the device runs after their copy: adam_queue_push may be called
// from any thread), or all at once in the order the next forward needs
// them; the main thread waits only for the sub-group it needs next.
#pragma once
#include <pthread.h>
#include "cpu_adam.h"
#include "trace.h"

// What every sub-group of one optimizer step shares: the shard's arrays
// (elements from the shard's start) and the step's hyper-parameters.
typedef struct AdamPass {
    float *master, *m, *v;
    const bf16 *grads;  // the reduced gradient shard, pinned
    bf16 *params_out;   // the new bf16 shard, pinned, on its way up
    AdamWStep step;
    CpuAdamPath path;
    int threads;        // OpenMP threads of the CPU Adam
} AdamPass;

typedef struct AdamQueue {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int groups;
    const size_t *first, *count;  // [groups]: shard elements of each sub-group
    AdamPass pass;
    int active;                   // a pass has begun and not every sub-group is done
    int *order, pushed, taken;    // the sub-groups handed over this pass, in order
    int left;                     // sub-groups of this pass not updated yet
    unsigned char *done;          // [groups]: updated this pass (one of no elements: from the start)
    double *t0_us, *t1_us;        // [groups]: when its update ran
    unsigned char *traced;        // [groups]: its span is on the timeline
    int stop;
} AdamQueue;

// `groups` sub-groups, first[k] and count[k] elements of the shard (kept,
// not copied); one of count 0 has nothing to update: it is done at once and
// never handed over.
void adam_queue_init(AdamQueue *q, int groups, const size_t *first, const size_t *count);
// Main thread: a new optimizer step; the last one must be over (adam_queue_wait_all).
void adam_queue_begin(AdamQueue *q, const AdamPass *pass);
// Any thread: sub-group k's gradients are in; it is updated after those
// handed over before it. Once per pass, and never for one of no elements.
void adam_queue_push(AdamQueue *q, int k);
// Sub-group k of this pass is updated (never blocks).
int adam_queue_done(AdamQueue *q, int k);
// Blocks until sub-group k of this pass is updated; it must have been handed over.
void adam_queue_wait(AdamQueue *q, int k);
// Blocks until every sub-group handed over is updated; the pass ends once
// every sub-group is.
void adam_queue_wait_all(AdamQueue *q);
// Whether a pass has begun and not ended.
int adam_queue_active(AdamQueue *q);
// Main thread (the trace is its own): the sub-groups updated since the last
// call go on the host optimizer's row as `name`.
void adam_queue_trace(AdamQueue *q, Trace *tr, const char *name);
void adam_queue_free(AdamQueue *q);
