// param_refresh.c: the new bf16 shard up and all-gathered a unit at a time
// (see param_refresh.h).
#include "param_refresh.h"
#include <string.h>
#include "check.h"

void param_refresh_init(ParamRefresh *r, Trainer *t, const size_t *first, const size_t *count) {
    memset(r, 0, sizeof *r);
    int U = t->layout.num_units;
    r->first = first;
    r->count = count;
    r->uploaded = xcalloc((size_t)U, sizeof(Event));
    r->gather = xcalloc((size_t)U, sizeof(CommHandle));
    for (int u = 0; u < U; u++) t->dev.ops->event_create(&t->dev, &r->uploaded[u]);
    t->dev.ops->event_create(&t->dev, &r->issued);
}

void param_refresh_start(ParamRefresh *r, Trainer *t, const bf16 *src, SliceReady ready, void *ready_arg) {
    CHECK(!r->active, "param refresh: a new shard sent up while the last one is on its way");
    r->active = 1;
    r->next = 0;
    r->src = src;
    r->ready = ready;
    r->ready_arg = ready_arg;
    // counted for the step whose update made them, though they go up during the next one's forward
    for (int u = 0; u < t->layout.num_units; u++) count_transfer(t, XFER_H2D, (double)(r->count[u] * sizeof(bf16)));
    // the device params are overwritten after every kernel queued so far has read them
    t->dev.ops->event_record(&t->dev, &r->issued, STREAM_COMPUTE);
    t->dev.ops->stream_wait_event(&t->dev, STREAM_COPY, &r->issued);
}

// Unit u's slice up on the copy stream; the gather of the unit waits for
// it (comm_after_event), in place in the full params, each rank's slice of
// the unit from it.
static void send_unit(ParamRefresh *r, Trainer *t, int u) {
    size_t bytes = r->count[u] * sizeof(bf16);
    if (bytes) {
        bf16 *dst = (bf16 *)t->st.params.ptr + t->part.begin + r->first[u];
        dev_copy(&t->dev, dst, r->src + r->first[u], bytes, STREAM_COPY);
        t->dev.ops->event_record(&t->dev, &r->uploaded[u], STREAM_COPY);
        comm_after_event(t->dp, &r->uploaded[u]);
    }
    Range unit = unit_range(t, u);
    int N = t->dp->size;
    size_t counts[N], displs[N];
    for (int q = 0; q < N; q++) {
        size_t first = unit.offset;
        counts[q] = partition_overlap(&t->part, unit, q, &first);
        displs[q] = counts[q] ? first - unit.offset : 0;
    }
    comm_all_gather(t->dp, (bf16 *)t->st.params.ptr + unit.offset, counts, displs, DT_HALF, &r->gather[u]);
}

void param_refresh_unit(ParamRefresh *r, Trainer *t, int u) {
    int U = t->layout.num_units;
    while (r->active && r->next < U) {
        int v = r->next;
        if (!r->ready(r->ready_arg, v, v <= u)) break;  // a later unit's slice is not final yet
        send_unit(r, t, v);
        r->active = ++r->next < U;
    }
    comm_wait(t->dp, &r->gather[u]);  // no-op once waited
}

void param_refresh_finish(ParamRefresh *r, Trainer *t) {
    int U = t->layout.num_units;
    param_refresh_unit(r, t, U - 1);
    for (int u = 0; u < U; u++) comm_wait(t->dp, &r->gather[u]);
}

void param_refresh_free(ParamRefresh *r, Trainer *t) {
    if (!r->uploaded) return;
    param_refresh_finish(r, t);
    for (int u = 0; u < t->layout.num_units; u++) t->dev.ops->event_destroy(&t->dev, &r->uploaded[u]);
    t->dev.ops->event_destroy(&t->dev, &r->issued);
    free(r->uploaded);
    free(r->gather);
    memset(r, 0, sizeof *r);
}
