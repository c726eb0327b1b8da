// param_fetch.c: the rank's param slices from pinned host memory or NVMe to
// zero3's gathers (see param_fetch.h).
#include "param_fetch.h"
#include <string.h>
#include "check.h"

// This rank's slice of unit u, flat [*first, *first + count); 0 when its
// shard misses the unit.
static size_t own_slice(const Trainer *t, int u, size_t *first) {
    return partition_overlap(&t->part, unit_range(t, u), t->dp->rank, first);
}

// The 4 KiB-aligned range of the params file that holds a slice (O_DIRECT
// reads whole blocks; the slice starts `skip` bytes in).
static void file_range(const Trainer *t, size_t first, size_t count, size_t *lo, size_t *hi, size_t *skip) {
    size_t offset = (first - t->part.begin) * sizeof(bf16);
    *lo = offset / AIO_ALIGN_BYTES * AIO_ALIGN_BYTES;
    *hi = aio_round_up(offset + count * sizeof(bf16));
    *skip = offset - *lo;
}

// A free staging buffer whose last copy up is done (a wait only where the
// device is that far behind), or a new one.
static int take_staging(ParamFetch *pf, Trainer *t) {
    if (pf->free_n > 0) {
        int i = pf->staging_free[--pf->free_n];
        t->dev.ops->event_sync(&t->dev, &pf->staging_copied[i]);
        return i;
    }
    int i = pf->staging_n++;  // at most one per unit: the arrays have room
    pf->staging[i] = buf_alloc(&t->dev, TIER_PINNED, CAT_COMM, pf->staging_bytes, "param slice from NVMe");
    t->dev.ops->event_create(&t->dev, &pf->staging_copied[i]);
    return i;
}

static void give_staging(ParamFetch *pf, int i) { pf->staging_free[pf->free_n++] = i; }

// Starts reading unit u's slice, unless it is on its way. The last update's
// write of those params must be out first: when it is not, a read ahead is
// left for later (returns 0) and a read the gather needs now waits.
static int start_read(ParamFetch *pf, Trainer *t, int u, int blocking) {
    SliceRead *r = &pf->reads[u];
    size_t first, count = own_slice(t, u, &first);
    if (r->active || count == 0) return 1;
    size_t in_shard = first - t->part.begin, lo, hi;
    if (swapper_params_pending(pf->swap, in_shard, count)) {
        if (!blocking) return 0;
        swapper_wait_params(pf->swap, in_shard, count);
    }
    file_range(t, first, count, &lo, &hi, &r->skip);
    r->staging = take_staging(pf, t);
    r->first = first;
    r->count = count;
    aio_submit(pf->aio, &r->req, AIO_READ, pf->file, lo, pf->staging[r->staging].ptr, hi - lo);
    r->active = 1;
    return 1;
}

// Waits for unit u's read and puts it on the I/O row. A read that fails
// mid-forward stops the job from this rank: the others wait in a gather.
static void finish_read(ParamFetch *pf, Trainer *t, SliceRead *r, int u) {
    if (aio_wait(pf->aio, &r->req) != 0)
        fail_rank(EXIT_USAGE, "reading unit %d's params back from NVMe: %s", u, r->req.error);
    trace_span(&t->trace, TRACE_TID_IO, "nvme read params", r->req.start_us, r->req.done_us, (double)r->req.bytes);
}

// Up on the copy stream; the gather of the unit waits for `done`, the
// compute stream does not.
static void copy_up(Trainer *t, bf16 *dst, const void *src, size_t bytes, Event *done) {
    dev_copy(&t->dev, dst, src, bytes, STREAM_COPY);
    t->dev.ops->event_record(&t->dev, done, STREAM_COPY);
    comm_after_event(t->dp, done);
}

// ParamShard's source: the slice goes up into the gather's buffer.
static void fetch_slice(Trainer *t, int u, bf16 *dst, size_t first, size_t count, void *arg) {
    ParamFetch *pf = arg;
    size_t bytes = count * sizeof(bf16);
    count_transfer(t, XFER_H2D, (double)bytes);
    if (!pf->from_nvme) {
        copy_up(t, dst, (const bf16 *)t->st.params.ptr + (first - t->part.begin), bytes, &pf->copied[u]);
        return;
    }
    SliceRead *r = &pf->reads[u];
    start_read(pf, t, u, 1);  // not read ahead: the first unit, or one gathered again sooner than the window
    // what waited for the last update's write (the step's first units) can
    // now go to the disk beside this read instead of after it
    if (pf->ahead_from >= 0) param_fetch_ahead(pf, t, pf->ahead_from, pf->ahead_backward);
    CHECK(r->first == first && r->count == count, "unit %d: slice [%zu, +%zu) asked, [%zu, +%zu) read", u, first,
          count, r->first, r->count);
    finish_read(pf, t, r, u);
    count_transfer(t, XFER_NVME_READ, (double)bytes);
    copy_up(t, dst, (const char *)pf->staging[r->staging].ptr + r->skip, bytes, &pf->staging_copied[r->staging]);
    give_staging(pf, r->staging);  // to the next read once this copy is done (take_staging)
    r->active = 0;
}

void param_fetch_init(ParamFetch *pf, Trainer *t, ParamShard *ps, Aio *aio, const AioFile *file, Swapper *swap) {
    memset(pf, 0, sizeof *pf);
    pf->from_nvme = file != NULL;
    pf->ps = ps;
    pf->ahead = ps->prefetch + 1;
    pf->ahead_from = -1;
    pf->aio = aio;
    pf->file = file;
    pf->swap = swap;
    int U = t->layout.num_units;
    pf->reads = xcalloc((size_t)U, sizeof(SliceRead));
    pf->staging = xcalloc((size_t)U, sizeof(Buf));
    pf->staging_copied = xcalloc((size_t)U, sizeof(Event));
    pf->staging_free = xcalloc((size_t)U, sizeof(int));
    pf->copied = xcalloc((size_t)U, sizeof(Event));
    for (int u = 0; u < U; u++) t->dev.ops->event_create(&t->dev, &pf->copied[u]);
    for (int u = 0; u < U; u++) {
        size_t first, lo, hi, skip, count = own_slice(t, u, &first);
        if (count == 0) continue;
        file_range(t, first, count, &lo, &hi, &skip);
        if (hi - lo > pf->staging_bytes) pf->staging_bytes = hi - lo;
    }
    ps->source = fetch_slice;
    ps->source_arg = pf;
}

void param_fetch_ahead(ParamFetch *pf, Trainer *t, int u, int backward) {
    if (!pf->from_nvme) return;
    pf->ahead_from = u;
    pf->ahead_backward = backward;
    // At a forward's start nothing computes before the window's params are
    // back (a rank without a slice of the first unit waits in its gather), so
    // these reads wait for the last update's writes of them; later ones that
    // would wait are left for later.
    int blocking = !backward && u == GPT_UNIT_EMBED, done = 1;
    for (int k = 1; k <= pf->ahead; k++) {
        int units[2], n = param_shard_upcoming(pf->ps, t, u, backward, k, units);
        for (int i = 0; i < n; i++) {
            if (pf->ps->live[units[i]].state != LIVE_NONE) continue;
            SliceRead *r = &pf->reads[units[i]];
            if (!start_read(pf, t, units[i], blocking) || (r->active && !aio_test(pf->aio, &r->req))) done = 0;
        }
    }
    pf->window_in = done;
}

int param_fetch_window_in(const ParamFetch *pf) { return pf->from_nvme && pf->window_in; }

// Dropped reads still took the disk's time: they go on the I/O row, but no
// slice came of them, so they are not counted as moved.
void param_fetch_forget(ParamFetch *pf, Trainer *t) {
    for (int u = 0; u < t->layout.num_units && pf->reads; u++) {
        SliceRead *r = &pf->reads[u];
        if (!r->active) continue;
        aio_wait(pf->aio, &r->req);
        trace_span(&t->trace, TRACE_TID_IO, "nvme read params (dropped)", r->req.start_us, r->req.done_us,
                   (double)r->req.bytes);
        give_staging(pf, r->staging);
        r->active = 0;
    }
}

void param_fetch_free(ParamFetch *pf, Trainer *t) {
    param_fetch_forget(pf, t);
    dev_sync(&t->dev, STREAM_COPY);  // the last copies up read the staging buffers
    for (int i = 0; i < pf->staging_n; i++) {
        buf_free(&t->dev, &pf->staging[i]);
        t->dev.ops->event_destroy(&t->dev, &pf->staging_copied[i]);
    }
    for (int u = 0; pf->copied && u < t->layout.num_units; u++) t->dev.ops->event_destroy(&t->dev, &pf->copied[u]);
    free(pf->reads);
    free(pf->staging);
    free(pf->staging_copied);
    free(pf->staging_free);
    free(pf->copied);
    memset(pf, 0, sizeof *pf);
}
