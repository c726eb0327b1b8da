// divergence.c: stopping a run that has diverged, for every stage, before a
// diverged step updates the states or a diverged model is saved: a
// non-finite gradient norm, or a loss that is non-finite or far above its
// reference. One line from rank 0, exit status 1.
//
// The margin is ln V, the loss of a uniform guess over the V tokens of the
// vocabulary: a loss that has risen ln V above its reference puts, on
// average, 1/V of the probability on the right token that the model put
// there at the reference, which is more than a model that knew nothing (a
// uniform guess starts at ln V) could have lost. Training noise, even an
// unstable step, stays far below that; an explosion (a loss of 1e13 after a
// too large --lr) passes it at once. The reference is the lower of the first
// step's loss and a running mean of the losses (weight 0.9 on the past), so
// a run that blows up after a long descent is caught as early as one that
// blows up from the start.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include "check.h"
#include "trainer.h"

#define LEVEL_DECAY 0.9

void divergence_stop(Trainer *t, const char *fmt, ...) {
    // an update still running on a host thread (cpu_offload --dpu) ends first
    if (t->strategy->finish_update) t->strategy->finish_update(t, 0);
    if (t->world.rank == 0) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fprintf(stderr, "%s: error: %s; training diverged (hint: lower --lr, raise --warmup, or set --grad-clip)%s\n",
                t->strategy->name, msg, t->cfg.save ? "; no checkpoint was written from it" : "");
    }
    exit_all(EXIT_FAILURE);
}

void divergence_check_norm(Trainer *t, double norm) {
    if (!isfinite(norm)) divergence_stop(t, "step %ld: the gradient norm is %g", t->step + 1, norm);
}

void divergence_check_loss(Trainer *t, double loss, int validation) {
    Divergence *d = &t->divergence;
    const char *what = validation ? "the validation loss" : "the loss";
    char when[48];
    if (validation) snprintf(when, sizeof when, "after step %ld", t->step);
    else snprintf(when, sizeof when, "step %ld", t->step + 1);
    if (!isfinite(loss)) divergence_stop(t, "%s: %s is %g", when, what, loss);
    if (!d->have_reference) {  // the first step of this run (the first loss is a training loss)
        d->first = d->level = loss;
        d->have_reference = 1;
        return;
    }
    double margin = log((double)t->layout.cfg.vocab_size), reference = fmin(d->first, d->level);
    if (loss > reference + margin)
        divergence_stop(t, "%s: %s is %.6g, more than ln V = %.2f above its reference %.4f (the lower of the first step's "
             "loss and the running mean)", when, what, loss, margin, reference);
    if (!validation) d->level = LEVEL_DECAY * d->level + (1 - LEVEL_DECAY) * loss;
}

// Where the first non-finite element of x is, or n.
static size_t first_non_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

void divergence_check_states(Trainer *t, const CkptTensor *fp32, int n) {
    char mine[256] = "";
    for (int i = 0; i < n && !mine[0]; i++) {
        size_t count = fp32[i].bytes / sizeof(float), at = first_non_finite(fp32[i].host, count);
        if (at < count)
            snprintf(mine, sizeof mine, "rank %d's %s holds %g at element %zu", t->world.rank, fp32[i].name,
                     ((const float *)fp32[i].host)[at], at);
    }
    if (comm_first_failure(&t->world, mine[0] != 0, mine, sizeof mine) >= 0)
        divergence_stop(t, "after step %ld: %s", t->step, mine);
}
