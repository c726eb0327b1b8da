// states.c: allocation and initial values of the model states (see states.h).
// The byte counts here are what memory_math's formulas must reproduce.
#include "states.h"
#include <string.h>
#include "check.h"

// Elements written per pass of states_init: bounds the host staging memory
// (4 MiB fp32 + 2 MiB bf16) however large the model is.
#define INIT_CHUNK ((size_t)1 << 20)

void partition_init(Partition *p, size_t num_params, int ranks, int rank) {
    CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "partition_init: rank %d of %d ranks", rank, ranks);
    CHECK(num_params > 0, "partition_init: no parameters");
    size_t unit = (size_t)ranks * SHARD_ALIGN;
    p->num_params = num_params;
    p->padded = (num_params + unit - 1) / unit * unit;
    p->shard = p->padded / (size_t)ranks;
    p->ranks = ranks;
    p->rank = rank;
    p->begin = (size_t)rank * p->shard;
    p->end = p->begin + p->shard;
}

size_t partition_overlap(const Partition *p, Range r, int q, size_t *first) {
    size_t q_begin = (size_t)q * p->shard, q_end = q_begin + p->shard;
    size_t lo = r.offset > q_begin ? r.offset : q_begin;
    size_t hi = r.offset + r.count < q_end ? r.offset + r.count : q_end;
    if (first) *first = lo;
    return hi > lo ? hi - lo : 0;
}

// Elements a state of this extent holds. FULL buffers are padded to Ψ_pad so
// that an in-place all-gather / reduce-scatter over equal shards can use them
// directly; the unpartitioned baseline (optimizer FULL too) has no shards to
// line up with, so it keeps exactly Ψ.
static size_t extent_elems(const StatesLayout *l, const Partition *p, StateExtent e) {
    switch (e) {
    case STATE_FULL: return l->optim == STATE_FULL ? p->num_params : p->padded;
    case STATE_SHARD: return p->shard;
    case STATE_NONE: return 0;
    }
    return 0;
}

// NVMe-tier states are files that the aio module creates and accounts
// (mem_track_alloc) for stage 06; here they get a descriptor only: ptr NULL,
// bytes = the size the stage must place on NVMe.
static Buf alloc_state(Device *d, MemTier tier, MemCategory cat, size_t elems, size_t elem_bytes,
                       const char *what) {
    Buf b = {.ptr = NULL, .bytes = 0, .tier = tier, .cat = cat};
    if (elems == 0) return b;
    if (tier == TIER_NVME) {
        b.bytes = elems * elem_bytes;
        return b;
    }
    return buf_alloc(d, tier, cat, elems * elem_bytes, what);
}

void states_alloc(ModelStates *s, Device *d, const StatesLayout *layout, const Partition *p) {
    memset(s, 0, sizeof *s);
    s->layout = *layout;
    s->part = *p;
    size_t np = extent_elems(layout, p, layout->params);
    size_t ng = extent_elems(layout, p, layout->grads);
    size_t no = extent_elems(layout, p, layout->optim);  // FULL optimizer: exactly Ψ
    s->params = alloc_state(d, layout->params_tier, CAT_PARAMS, np, sizeof(bf16), "params (bf16)");
    s->grads = alloc_state(d, layout->grads_tier, CAT_GRADS, ng, sizeof(bf16), "grads (bf16)");
    s->master = alloc_state(d, layout->optim_tier, CAT_MASTER, no, sizeof(float), "master weights (fp32)");
    s->m = alloc_state(d, layout->optim_tier, CAT_ADAM_M, no, sizeof(float), "Adam m (fp32)");
    s->v = alloc_state(d, layout->optim_tier, CAT_ADAM_V, no, sizeof(float), "Adam v (fp32)");
    if (layout->grads_accum_fp32)
        s->grads_acc = alloc_state(d, layout->grads_tier, CAT_GRAD_ACCUM, ng, sizeof(float),
                                   "gradient accumulator (fp32)");
    // A shard's optimizer range keeps its padding elements (count = shard, not
    // clamped to Ψ): they start at 0 with zero gradient, and AdamW maps
    // (w, m, v, g) = (0, 0, 0, 0) to 0, so they stay zero and every rank runs
    // the same-sized update.
    s->optim_begin = layout->optim == STATE_SHARD ? p->begin : 0;
    s->optim_count = no;
}

// Which layout elements the states hold: ranges of the layout, back to back.
typedef struct StateMap {
    const GPTLayout *l;
    const Range *ranges;
    int nranges;
    uint64_t seed;
} StateMap;

// out[i] = initial value of state element begin + i; 0 in the padding past
// the ranges' total (Ψ).
static void init_values_padded(const StateMap *m, size_t begin, size_t n, float *out) {
    size_t at = 0, end = begin + n;  // at: state index where the range starts
    memset(out, 0, n * sizeof(float));
    for (int k = 0; k < m->nranges; at += m->ranges[k].count, k++) {
        size_t lo = begin > at ? begin : at, hi = end < at + m->ranges[k].count ? end : at + m->ranges[k].count;
        if (lo >= hi) continue;
        size_t from = m->ranges[k].offset + (lo - at);
        gpt_init_values(m->l, m->seed, from, from + (hi - lo), out + (lo - begin));
    }
}

void states_init_values(const GPTLayout *l, uint64_t seed, size_t begin, size_t n, float *out) {
    Range whole = {.offset = 0, .count = l->num_params};
    StateMap m = {.l = l, .ranges = &whole, .nranges = 1, .seed = seed};
    init_values_padded(&m, begin, n, out);
}

// Writes the initial values of state elements [begin, begin + n) into b, as
// fp32 or 16-bit (the device's format), through a host temporary: dev_copy reaches every tier on
// every device, so one path serves the cpu and the cuda device alike.
static void write_init(Device *d, Buf *b, int as_bf16, const StateMap *m, size_t begin, size_t n, float *tmp,
                       bf16 *tmp16) {
    for (size_t done = 0; done < n; done += INIT_CHUNK) {
        size_t k = n - done < INIT_CHUNK ? n - done : INIT_CHUNK;
        init_values_padded(m, begin + done, k, tmp);
        if (as_bf16) {
            for (size_t i = 0; i < k; i++) tmp16[i] = f32_to_half(d->half, tmp[i]);
            dev_copy(d, (bf16 *)b->ptr + done, tmp16, k * sizeof(bf16), STREAM_COPY);
        } else {
            dev_copy(d, (float *)b->ptr + done, tmp, k * sizeof(float), STREAM_COPY);
        }
        dev_sync(d, STREAM_COPY);  // the temporary is reused by the next chunk
    }
}

static void zero_buf(Device *d, Buf *b) {
    if (b->ptr) dev_memset0(d, b->ptr, b->bytes, STREAM_COPY);
}

void states_init_ranges(ModelStates *s, Device *d, const GPTLayout *l, const Range *ranges, int nranges,
                        uint64_t seed) {
    size_t held = 0;
    for (int k = 0; k < nranges; k++) {
        CHECK(ranges[k].offset + ranges[k].count <= l->num_params, "states_init: range [%zu, +%zu) is past the "
              "layout's %zu params", ranges[k].offset, ranges[k].count, l->num_params);
        held += ranges[k].count;
    }
    CHECK(held == s->part.num_params, "states_init: the ranges hold %zu params, the states %zu", held,
          s->part.num_params);
    StateMap m = {l, ranges, nranges, seed};
    float *tmp = xmalloc(INIT_CHUNK * sizeof(float));
    bf16 *tmp16 = xmalloc(INIT_CHUNK * sizeof(bf16));
    // NVMe descriptors (ptr NULL) are skipped: stage 06 writes its files.
    if (s->master.ptr) write_init(d, &s->master, 0, &m, s->optim_begin, s->optim_count, tmp, tmp16);
    if (s->params.ptr) {
        // FULL: all Ψ_pad (or Ψ) elements; SHARD: this rank's shard. Either way
        // bf16(init value) = bf16(master) at the same flat index.
        size_t begin = s->layout.params == STATE_SHARD ? s->part.begin : 0;
        size_t n = s->params.bytes / sizeof(bf16);
        write_init(d, &s->params, 1, &m, begin, n, tmp, tmp16);
    }
    zero_buf(d, &s->m);
    zero_buf(d, &s->v);
    zero_buf(d, &s->grads);
    dev_sync(d, STREAM_COPY);
    free(tmp);
    free(tmp16);
}

void states_init(ModelStates *s, Device *d, const GPTLayout *l, uint64_t seed) {
    Range whole = {0, l->num_params};
    states_init_ranges(s, d, l, &whole, 1, seed);
}

void states_free(ModelStates *s, Device *d) {
    Buf *bufs[6] = {&s->params, &s->grads, &s->master, &s->m, &s->v, &s->grads_acc};
    for (int i = 0; i < 6; i++) {
        buf_free(d, bufs[i]);
        bufs[i]->bytes = 0;  // NVMe descriptors hold a size but no memory
    }
    s->optim_count = 0;
}
