// param_shard.c: gather-before-use, prefetch and release of sharded
// parameters (see param_shard.h).
#include "param_shard.h"
#include <stdlib.h>
#include "check.h"
#include "zeropp.h"

// Schedule entry e: forward of unit e for e < U, backward of unit 2U-1-e after.
// An evaluation runs forward only: nothing is gathered ahead for a backward
// that never comes, and the last units are released at the end of forward.
static int num_entries(const ParamShard *ps) { return (ps->training ? 2 : 1) * ps->t->layout.num_units; }
static int entry_unit(int U, int e) { return e < U ? e : 2 * U - 1 - e; }
static int entry_of(int U, int u, int backward) { return backward ? 2 * U - 1 - u : u; }

// Units entry e reads. The encoder's backward only scatters gradients into
// wte rows: it reads no parameters, so nothing is gathered for it.
static int entry_reads(const GPTLayout *l, int e, int out[2]) {
    int U = l->num_units, u = entry_unit(U, e);
    if (e >= U && u == GPT_UNIT_EMBED) return 0;
    return gpt_unit_reads(l, u, out);
}

FlagSpec param_shard_flag(int *prefetch) {
    *prefetch = ZERO_PREFETCH_DEFAULT;
    return (FlagSpec){.name = "prefetch", .type = FLAG_INT, .dst = prefetch, .meta = "N",
                      .help = "units whose parameters are gathered ahead of use",
                      .min = 0, .max = GPT_MAX_UNITS};
}

void param_shard_init(ParamShard *ps, Trainer *t, int prefetch) {
    if (prefetch < 0 || prefetch > t->layout.num_units)
        fail_usage("--prefetch %d: give 0 (no prefetch) up to %d, the units of this model", prefetch,
                   t->layout.num_units);
    ps->live = xcalloc((size_t)t->layout.num_units, sizeof(LiveUnit));
    ps->prefetch = prefetch;
    ps->t = t;
}

void param_shard_begin(ParamShard *ps, const MicroBatches *mb) { ps->training = mb->backward; }

// LAB 04: start_gather -- this rank's slice of unit u into a fresh buffer, then the in-place all-gather
// Start the all-gather of unit u into a fresh live buffer: this rank copies
// the slice of its shard that falls in the unit, then every rank's slice is
// gathered in place. Slices are contiguous and in rank order; ranks whose
// shard misses the unit contribute nothing.
static void start_gather(ParamShard *ps, Trainer *t, int u) {
    LiveUnit *lu = &ps->live[u];
    if (lu->state != LIVE_NONE) return;
    Range r = unit_range(t, u);
    int N = t->dp->size;
    size_t counts[N], displs[N];
    for (int q = 0; q < N; q++) {
        size_t first = r.offset;
        counts[q] = partition_overlap(&t->part, r, q, &first);
        displs[q] = counts[q] ? first - r.offset : 0;
    }
    lu->buf = buf_alloc(&t->dev, TIER_DEVICE, CAT_PARAMS, r.count * sizeof(bf16), "gathered unit params");
    int me = t->dp->rank;
    bf16 *own = buf_part(&lu->buf, displs[me], counts[me], sizeof(bf16), "this rank's slice of the gathered unit");
    size_t first = r.offset + displs[me];
    if (counts[me] && ps->source)
        ps->source(t, u, own, first, counts[me], ps->source_arg);
    else if (counts[me])
        dev_copy(&t->dev, own, (const bf16 *)t->st.params.ptr + (first - t->part.begin), counts[me] * sizeof(bf16),
                 STREAM_COMPUTE);
    comm_all_gather(t->dp, lu->buf.ptr, counts, displs, DT_HALF, &lu->h);
    lu->state = LIVE_GATHERING;
}
// LAB END

void param_shard_gather_world(ParamShard *ps, Trainer *t, int u) { start_gather(ps, t, u); }

// The gather of unit u for an entry of the forward (backward = 0) or the
// backward pass: ZeRO++'s where zero3 has it (zeropp.c), else start_gather.
static void gather_for(ParamShard *ps, Trainer *t, int u, int backward) {
    if (ps->live[u].state != LIVE_NONE) return;
    ps->live[u].backward = backward;
    if (ps->pp) zeropp_start_gather(ps->pp, ps, t, u, backward);
    else start_gather(ps, t, u);
}

static void finish_gather(ParamShard *ps, Trainer *t, int u) {
    LiveUnit *lu = &ps->live[u];
    if (lu->state != LIVE_GATHERING) return;
    comm_wait(lu->group ? lu->group : t->dp, &lu->h);
    if (ps->pp) zeropp_finish_gather(ps->pp, t, lu, u);
    lu->state = LIVE_READY;
}

static void drop(ParamShard *ps, Trainer *t, int u) {
    LiveUnit *lu = &ps->live[u];
    finish_gather(ps, t, u);
    if (lu->state == LIVE_NONE) return;
    buf_free(&t->dev, &lu->buf);
    buf_free(&t->dev, &lu->packed);
    lu->group = NULL;
    lu->state = LIVE_NONE;
    lu->seen = lu->used = 0;
}

// LAB 04: param_shard_acquire -- gather what this entry reads, prefetch the next ones, wait for its own
// Prefetch stays inside one micro-batch's forward+backward: across the end
// of backward lies the optimizer step, which changes the params. Each
// gather is started for the pass of the entry that reads it (gather_for:
// ZeRO++'s hpZ gathers backward's from elsewhere).
void param_shard_acquire(ParamShard *ps, Trainer *t, int u, int backward) {
    int U = t->layout.num_units, e = entry_of(U, u, backward), reads[2];
    int n = entry_reads(&t->layout, e, reads);
    for (int i = 0; i < n; i++) gather_for(ps, t, reads[i], backward);
    for (int k = 1; k <= ps->prefetch && e + k < num_entries(ps); k++) {
        int m = entry_reads(&t->layout, e + k, reads);
        for (int i = 0; i < m; i++) gather_for(ps, t, reads[i], e + k >= U);
    }
    n = entry_reads(&t->layout, e, reads);
    for (int i = 0; i < n; i++) finish_gather(ps, t, reads[i]);
    comm_progress(t->dp);
}
// LAB END

// Is unit v read by one of the entries after e within the prefetch window
// (at least the next one)?
static int read_soon(int prefetch, const GPTLayout *l, int entries, int e, int v) {
    int window = prefetch > 0 ? prefetch : 1, reads[2];
    for (int k = 1; k <= window && e + k < entries; k++) {
        int m = entry_reads(l, e + k, reads);
        for (int i = 0; i < m; i++)
            if (reads[i] == v) return 1;
    }
    return 0;
}

// LAB 04: param_shard_release -- drop the units this entry read that no upcoming entry reads
void param_shard_release(ParamShard *ps, Trainer *t, int u, int backward) {
    int e = entry_of(t->layout.num_units, u, backward), reads[2];
    int n = entry_reads(&t->layout, e, reads);
    for (int i = 0; i < n; i++)
        if (!read_soon(ps->prefetch, &t->layout, num_entries(ps), e, reads[i])) drop(ps, t, reads[i]);
}
// LAB END

void param_shard_release_all(ParamShard *ps, Trainer *t) {
    for (int u = 0; u < t->layout.num_units; u++) drop(ps, t, u);
}

void param_shard_step_shape(int prefetch, double bucket_mb, const Trainer *t, StepMemorySpec *s) {
    step_memory_gathered(s, prefetch, bucket_mb, &t->part);
}

int param_shard_upcoming(const ParamShard *ps, const Trainer *t, int u, int backward, int ahead, int out[2]) {
    int e = entry_of(t->layout.num_units, u, backward) + ahead;
    return e >= 0 && e < num_entries(ps) ? entry_reads(&t->layout, e, out) : 0;
}

// Overlap counted, not timed: a view comes after its entry's acquire and
// before its compute, so a unit first seen gathered at an earlier entry's
// view (the model's clock, units computed, was smaller) was gathered ahead;
// if it was complete already then (finish_gather had run), it was waited
// for before the entry that reads it, and hid nothing.
static void count_gathers(ParamShard *ps) {
    long now = ps->t->model.units_run;
    for (int v = 0; v < ps->t->layout.num_units; v++) {
        LiveUnit *lu = &ps->live[v];
        if (lu->state == LIVE_NONE) {
            lu->seen = lu->used = 0;
        } else if (!lu->seen) {
            lu->seen = 1, lu->used = 0, lu->seen_at = now, lu->seen_ready = lu->state == LIVE_READY;
            ps->gathers += ps->training;
        }
    }
}

const bf16 *param_shard_view(ParamShard *ps, int u) {
    CHECK(ps->live[u].state == LIVE_READY, "unit %d's params used before they were gathered", u);
    count_gathers(ps);
    LiveUnit *lu = &ps->live[u];
    int ahead = !lu->used && ps->training && lu->seen_at < ps->t->model.units_run;
    ps->gathers_ahead += ahead;
    ps->waited_early += ahead && lu->seen_ready;  // waited for while an earlier entry ran: nothing overlapped
    lu->used = 1;
    return lu->buf.ptr;
}

void param_shard_report(const ParamShard *ps, const Trainer *t, FILE *json) {
    long m = t->report.n * t->cfg.grad_accum;  // training micro-batches run
    if (t->world.rank != 0 || !m) return;
    const GPTLayout *l = &t->layout;
    int issued = zero_gathers_per_micro_batch(l, ps->prefetch), ahead = zero_gathers_ahead(l, ps->prefetch, 0);
    if (!t->cfg.quiet)
        printf("gathers per micro-batch: %.2f issued, %.2f of them while an earlier unit computed, %.2f of those "
               "waited for before their unit (formula at --prefetch %d: %d, %d and 0)\n", (double)ps->gathers / m,
               (double)ps->gathers_ahead / m, (double)ps->waited_early / m, ps->prefetch, issued, ahead);
    if (json)
        fprintf(json, ",\"gathers\":{\"prefetch\":%d,\"micro_batches\":%ld,\"issued\":%ld,\"ahead\":%ld,"
                      "\"waited_early\":%ld,"
                      "\"per_micro_batch_formula\":%d,\"ahead_per_micro_batch_formula\":%d,"
                      "\"peak_bytes_formula\":%.0f,\"elems_per_micro_batch_formula\":%.0f,"
                      "\"eval_micro_batches\":%d,\"eval_elems_per_micro_batch_formula\":%.0f}",
                ps->prefetch, m, ps->gathers, ps->gathers_ahead, ps->waited_early, issued, ahead,
                zero_gathered_peak_bytes(l, ps->prefetch),
                zero_gathered_elems(l, ps->prefetch, 0), t->cfg.eval_batches * t->cfg.grad_accum,
                zero_gathered_elems(l, ps->prefetch, 1));
}

void param_shard_free(ParamShard *ps, Trainer *t) {
    param_shard_release_all(ps, t);
    free(ps->live);
}
