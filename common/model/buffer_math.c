// buffer_math.c: the device bytes of the ZeRO stages' own buffers, in
// closed form from the layout and the partition (see mem_math.h): zero2's
// two gradient buckets (03_zero2/grad_shard.c sizes them from here) and the
// units zero3 keeps gathered at once and the gathers it issues, counted from
// the schedule's windows (what a unit's reads ask of the prefetch depth). The
// budget check and memory_math count them; test_budget holds them to the
// peak the allocator measures, and lab 04's checks hold zero3 to them.
#include "mem_math.h"

size_t zero_bucket_elems(double bucket_mb, const Partition *p) {
    size_t cap = bucket_mb > 0 ? (size_t)(bucket_mb * 1e6 / sizeof(bf16)) : p->padded / 8;
    if (bucket_mb == 0 && cap > ZERO_BUCKET_MAX_BYTES / sizeof(bf16)) cap = ZERO_BUCKET_MAX_BYTES / sizeof(bf16);
    if (cap > p->padded) cap = p->padded;
    return cap < 1 ? 1 : cap;
}

size_t zero_bucket_recv_elems(size_t cap, const Partition *p) { return cap < p->shard ? cap : p->shard; }

// Two buckets, each sent whole and received in part.
double zero_bucket_bytes(double bucket_mb, const Partition *p) {
    size_t cap = zero_bucket_elems(bucket_mb, p);
    return 2.0 * (double)(cap + zero_bucket_recv_elems(cap, p)) * sizeof(bf16);
}

// The schedule of one micro-batch: entry e < U is unit e's forward, the rest
// the backwards from U-1 down. A forward reads the unit (the head also wte,
// tied); a backward the same, but the embeddings' backward reads nothing.
static int reads_of(const GPTLayout *l, int e, int out[2]) {
    int U = l->num_units, u = e < U ? e : 2 * U - 1 - e;
    if (e >= U && u == GPT_UNIT_EMBED) return 0;
    return gpt_unit_reads(l, u, out);
}

// Is unit u read by one of entries [from, to] (clipped to the schedule)?
static int read_in(const GPTLayout *l, int entries, int from, int to, int u) {
    int reads[2];
    for (int e = from < 0 ? 0 : from; e <= to && e < entries; e++)
        for (int i = 0, n = reads_of(l, e, reads); i < n; i++)
            if (reads[i] == u) return 1;
    return 0;
}

// Unit u, read by entry f, is gathered for f unless one of the max(p, 1)
// entries before f reads it too (then it stayed gathered).
static int gathered_for(const GPTLayout *l, int entries, int prefetch, int f, int u) {
    int window = prefetch > 0 ? prefetch : 1;
    return !read_in(l, entries, f - window, f - 1, u);
}

// The entry whose gather unit u, read by entry f, still is: f, or the
// gather of the latest read before f that kept it.
static int gather_entry(const GPTLayout *l, int entries, int prefetch, int f, int u) {
    int window = prefetch > 0 ? prefetch : 1;
    while (!gathered_for(l, entries, prefetch, f, u)) {
        int g = f - 1;
        while (g >= f - window && !read_in(l, entries, g, g, u)) g--;
        f = g;
    }
    return f;
}

// While entry e computes, the units gathered are those that entry e and the
// next p entries read (the window W(e) = reads of e..e+p); each holds the
// bytes of the pass of the entry it was gathered for.
double zero_live_peak_bytes(const GPTLayout *l, int prefetch, const double bytes[2][GPT_MAX_UNITS]) {
    int entries = 2 * l->num_units;
    double peak = 0;
    for (int e = 0; e < entries; e++) {
        double live = 0;
        for (int u = 0; u < l->num_units; u++) {
            int f = e;
            while (f <= e + prefetch && f < entries && !read_in(l, entries, f, f, u)) f++;
            if (f > e + prefetch || f >= entries) continue;
            live += bytes[gather_entry(l, entries, prefetch, f, u) >= l->num_units][u];
        }
        if (live > peak) peak = live;
    }
    return peak;
}

double zero_live_bytes(const GPTLayout *l, int prefetch, const double bytes[2][GPT_MAX_UNITS], int e, int released) {
    int entries = 2 * l->num_units, keep = prefetch > 0 ? prefetch : 1;
    double live = 0;
    for (int u = 0; u < l->num_units; u++) {
        int f = e;  // the first entry of the window that reads u
        while (f <= e + prefetch && f < entries && !read_in(l, entries, f, f, u)) f++;
        if (f > e + prefetch || f >= entries) continue;
        // its release drops what entry e read that none of the next max(p, 1) entries reads
        if (released && !read_in(l, entries, e + 1, e + keep, u)) continue;
        live += bytes[gather_entry(l, entries, prefetch, f, u) >= l->num_units][u];
    }
    return live;
}

int zero_live_units(const GPTLayout *l, int prefetch, int e, int released, int out[GPT_MAX_UNITS]) {
    int entries = 2 * l->num_units, keep = prefetch > 0 ? prefetch : 1, n = 0, key[GPT_MAX_UNITS];
    for (int u = 0; u < l->num_units; u++) {
        int f = e;  // as zero_live_bytes
        while (f <= e + prefetch && f < entries && !read_in(l, entries, f, f, u)) f++;
        if (f > e + prefetch || f >= entries) continue;
        if (released && !read_in(l, entries, e + 1, e + keep, u)) continue;
        int g = gather_entry(l, entries, prefetch, f, u), reads[2], k = 0, m = reads_of(l, g, reads);
        while (k < m && reads[k] != u) k++;
        // in start order: by the entry gathered for, then the order it reads them in
        int at = n++, order = 2 * g + k;
        while (at > 0 && key[at - 1] > order) out[at] = out[at - 1], key[at] = key[at - 1], at--;
        out[at] = u, key[at] = order;
    }
    return n;
}

double zero_gathered_peak_bytes(const GPTLayout *l, int prefetch) {
    double bytes[2][GPT_MAX_UNITS];
    for (int u = 0; u < l->num_units; u++) bytes[0][u] = bytes[1][u] = (double)l->unit[u].count * sizeof(bf16);
    return zero_live_peak_bytes(l, prefetch, bytes);
}

// The gathers of a schedule of `entries` entries in the order they start
// (by the entry they are for: entry 0 starts those of entries 0..p, every
// later entry those of the entry p ahead); out may be NULL. Returns how many,
// with the elements they gather in *elems.
static int gathers_of(const GPTLayout *l, int prefetch, int entries, ZeroGather *out, double *elems) {
    int reads[2], gathers = 0;
    *elems = 0;
    for (int f = 0; f < entries; f++)
        for (int i = 0, n = reads_of(l, f, reads); i < n; i++)
            if (gathered_for(l, entries, prefetch, f, reads[i])) {
                if (out) out[gathers] = (ZeroGather){reads[i], f >= l->num_units};
                gathers++;
                *elems += (double)l->unit[reads[i]].count;
            }
    return gathers;
}

int zero_gather_schedule(const GPTLayout *l, int prefetch, ZeroGather *out) {
    double elems;
    return gathers_of(l, prefetch, 2 * l->num_units, out, &elems);
}

int zero_gathers_per_micro_batch(const GPTLayout *l, int prefetch) { return zero_gather_schedule(l, prefetch, NULL); }

double zero_gathered_elems(const GPTLayout *l, int prefetch, int forward_only) {
    double elems;
    gathers_of(l, prefetch, (forward_only ? 1 : 2) * l->num_units, NULL, &elems);
    return elems;
}

// With prefetch every gather but those of the schedule's first entry is
// started while an earlier entry computes (entry 0 asks for entries 1..p
// too); without it, none.
int zero_gathers_ahead(const GPTLayout *l, int prefetch, int forward_only) {
    double elems;
    int reads[2], count = gathers_of(l, prefetch, (forward_only ? 1 : 2) * l->num_units, NULL, &elems);
    return prefetch > 0 ? count - reads_of(l, 0, reads) : 0;
}

int stage_gathers_params(StageId s) {
    switch (s) {
    case STAGE_ZERO3:
    case STAGE_INFINITY:
    case STAGE_INFINITY_CPU:
    case STAGE_INFINITY_NVME:
    case STAGE_INFINITY_OPT_CPU:
    case STAGE_INFINITY_CPU_OPT_CPU:
    case STAGE_INFINITY_NVME_OPT_CPU: return 1;
    default: return 0;
    }
}

double stage_buffer_bytes(StageId s, const GPTLayout *l, const Partition *p) {
    if (stage_gathers_params(s)) return zero_bucket_bytes(0, p) + zero_gathered_peak_bytes(l, ZERO_PREFETCH_DEFAULT);
    switch (s) {
    case STAGE_DP: return 0;
    case STAGE_ZERO1: return (double)p->shard * sizeof(bf16);  // the reduced gradient shard
    case STAGE_ZERO2:
    case STAGE_OFFLOAD:
    case STAGE_OFFLOAD_DPU: return zero_bucket_bytes(0, p);
    default: return 0;
    }
}
