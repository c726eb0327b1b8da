// buffer_math.c: the device bytes of the ZeRO stages' own buffers, in
// closed form from the layout and the partition (see mem_math.h): zero2's
// two gradient buckets (03_zero2/grad_shard.c sizes them from here) and the
// units zero3 keeps gathered at once (04_zero3/param_shard.c's acquire and
// release, replayed on sizes). The budget check and memory_math count them;
// test_budget holds them to the peak the allocator measures.
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

// A unit stays gathered while one of the next max(prefetch, 1) entries reads it.
static int kept(const GPTLayout *l, int prefetch, int e, int u) {
    int window = prefetch > 0 ? prefetch : 1, reads[2];
    for (int k = 1; k <= window && e + k < 2 * l->num_units; k++) {
        int n = reads_of(l, e + k, reads);
        for (int i = 0; i < n; i++)
            if (reads[i] == u) return 1;
    }
    return 0;
}

// Before entry e computes, its units and those of the next `prefetch`
// entries are gathered; after it, the ones no entry of the window reads go.
// A unit gathered for an entry of pass p (0 forward, 1 backward) holds
// bytes[p][u] while it is live.
double zero_live_peak_bytes(const GPTLayout *l, int prefetch, const double bytes[2][GPT_MAX_UNITS]) {
    int entries = 2 * l->num_units, reads[2];
    char live[GPT_MAX_UNITS] = {0};
    double held[GPT_MAX_UNITS] = {0}, total = 0, peak = 0;
    for (int e = 0; e < entries; e++) {
        for (int k = 0; k <= prefetch && e + k < entries; k++) {
            int n = reads_of(l, e + k, reads);
            for (int i = 0; i < n; i++) {
                int u = reads[i];
                if (live[u]) continue;
                live[u] = 1;
                held[u] = bytes[e + k >= l->num_units][u];
                total += held[u];
            }
        }
        if (total > peak) peak = total;
        int n = reads_of(l, e, reads);
        for (int i = 0; i < n; i++)
            if (live[reads[i]] && !kept(l, prefetch, e, reads[i])) live[reads[i]] = 0, total -= held[reads[i]];
    }
    return peak;
}

double zero_gathered_peak_bytes(const GPTLayout *l, int prefetch) {
    double bytes[2][GPT_MAX_UNITS];
    for (int u = 0; u < l->num_units; u++) bytes[0][u] = bytes[1][u] = (double)l->unit[u].count * sizeof(bf16);
    return zero_live_peak_bytes(l, prefetch, bytes);
}

// All-gathers of one micro-batch under the same schedule: a unit is
// gathered each time it becomes live, for the first entry of the window
// that reads it.
int zero_gather_schedule(const GPTLayout *l, int prefetch, ZeroGather *out) {
    int entries = 2 * l->num_units, reads[2], gathers = 0;
    char live[GPT_MAX_UNITS] = {0};
    for (int e = 0; e < entries; e++) {
        for (int k = 0; k <= prefetch && e + k < entries; k++) {
            int n = reads_of(l, e + k, reads);
            for (int i = 0; i < n; i++)
                if (!live[reads[i]]) {
                    live[reads[i]] = 1;
                    if (out) out[gathers] = (ZeroGather){reads[i], e + k >= l->num_units};
                    gathers++;
                }
        }
        int n = reads_of(l, e, reads);
        for (int i = 0; i < n; i++)
            if (live[reads[i]] && !kept(l, prefetch, e, reads[i])) live[reads[i]] = 0;
    }
    return gathers;
}

int zero_gathers_per_micro_batch(const GPTLayout *l, int prefetch) { return zero_gather_schedule(l, prefetch, NULL); }

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
    case STAGE_INFINITY_NVME:
    case STAGE_INFINITY_OPT_CPU:
    case STAGE_INFINITY_CPU_OPT_CPU:
    case STAGE_INFINITY_NVME_OPT_CPU:
        return zero_bucket_bytes(0, p) + zero_gathered_peak_bytes(l, ZERO_PREFETCH_DEFAULT);
    default: return 0;
    }
}
