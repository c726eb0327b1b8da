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

// Two buckets, each sent whole and received in part: at most the rank's shard.
double zero_bucket_bytes(double bucket_mb, const Partition *p) {
    size_t cap = zero_bucket_elems(bucket_mb, p), recv = cap < p->shard ? cap : p->shard;
    return 2.0 * (double)(cap + recv) * sizeof(bf16);
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

// While entry e computes, the units gathered are those that entry e and the
// next p entries read (the window W(e) = reads of e..e+p): the peak is the
// largest window's bytes.
double zero_gathered_peak_bytes(const GPTLayout *l, int prefetch) {
    int entries = 2 * l->num_units;
    double peak = 0;
    for (int e = 0; e < entries; e++) {
        double bytes = 0;
        for (int u = 0; u < l->num_units; u++)
            if (read_in(l, entries, e, e + prefetch, u)) bytes += (double)l->unit[u].count * sizeof(bf16);
        if (bytes > peak) peak = bytes;
    }
    return peak;
}

// A unit is gathered for entry f that reads it unless one of the max(p, 1)
// entries before f reads it too (then it stayed gathered); `forward_only`:
// an evaluation's schedule, the U forwards alone.
static void gathers_of(const GPTLayout *l, int prefetch, int forward_only, int *count, double *elems) {
    int entries = (forward_only ? 1 : 2) * l->num_units, window = prefetch > 0 ? prefetch : 1, reads[2];
    *count = 0;
    *elems = 0;
    for (int f = 0; f < entries; f++)
        for (int i = 0, n = reads_of(l, f, reads); i < n; i++)
            if (!read_in(l, entries, f - window, f - 1, reads[i])) {
                ++*count;
                *elems += (double)l->unit[reads[i]].count;
            }
}

int zero_gathers_per_micro_batch(const GPTLayout *l, int prefetch) {
    int count;
    double elems;
    gathers_of(l, prefetch, 0, &count, &elems);
    return count;
}

double zero_gathered_elems(const GPTLayout *l, int prefetch, int forward_only) {
    int count;
    double elems;
    gathers_of(l, prefetch, forward_only, &count, &elems);
    return elems;
}

// With prefetch every gather but those of the schedule's first entry is
// started while an earlier entry computes (entry 0 asks for entries 1..p
// too); without it, none.
int zero_gathers_ahead(const GPTLayout *l, int prefetch, int forward_only) {
    int count, reads[2];
    double elems;
    gathers_of(l, prefetch, forward_only, &count, &elems);
    return prefetch > 0 ? count - reads_of(l, 0, reads) : 0;
}

double stage_buffer_bytes(StageId s, const GPTLayout *l, const Partition *p) {
    switch (s) {
    case STAGE_DP: return 0;
    case STAGE_ZERO1: return (double)p->shard * sizeof(bf16);  // the reduced gradient shard
    case STAGE_ZERO2:
    case STAGE_OFFLOAD:
    case STAGE_OFFLOAD_DPU: return zero_bucket_bytes(0, p);
    case STAGE_ZERO3:
    case STAGE_INFINITY:
    case STAGE_INFINITY_CPU:
    case STAGE_INFINITY_NVME: return zero_bucket_bytes(0, p) + zero_gathered_peak_bytes(l, ZERO_PREFETCH_DEFAULT);
    default: return 0;
    }
}
