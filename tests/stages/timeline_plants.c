// timeline_plants.c: three mistakes about when memory is held, each planted
// in a zero3 of its own for test_step_memory (the Makefile builds
// gpt_held.c or step_memory.c again with one of the names below standing
// for the call it plants into). The trainer holds each step's measured
// boundaries to the formula's timeline; each must be named there. A fourth,
// a budget check blind to the arena, lets test_budget and test_step_memory
// reach the arena's own out-of-memory.
#include <string.h>
#include "device.h"
#include "mem_math.h"

#if defined(TIMELINE_PLANT_late)
// A block's activations released one unit late: each release of them lets
// the one before go instead, and keeps this one until the next.
static Buf held_back;

void planted_buf_free(Device *d, Buf *b) {
    if (!b->ptr || b->cat != CAT_ACTIVATIONS || !strstr(b->what, "block ")) {
        buf_free(d, b);
        return;
    }
    buf_free(d, &held_back);
    held_back = *b;
    memset(b, 0, sizeof *b);
}
#elif defined(TIMELINE_PLANT_label)
// The head's saved activations counted as the recompute's working set.
Buf planted_buf_alloc(Device *d, MemTier tier, MemCategory cat, size_t bytes, const char *what) {
    if (strcmp(what, "the head's activations") == 0) cat = CAT_ACT_WORKING;
    return buf_alloc(d, tier, cat, bytes, what);
}
#elif defined(TIMELINE_PLANT_window)
// The formula's prefetch window one unit too long.
double planted_zero_live_bytes(const GPTLayout *l, int prefetch, const double bytes[2][GPT_MAX_UNITS], int e,
                               int released) {
    return zero_live_bytes(l, prefetch + 1, bytes, e, released);
}
#elif defined(TIMELINE_PLANT_bytes)
// A budget check that counts bytes alone, as this one did before the
// arena's pages and holes: a run whose blocks the arena cannot place passes
// it, and stops at the allocation that finds no free block.
int planted_run_fits(const RunDeviceBytes *r, double budget, double region) {
    (void)region;
    return r->total <= budget;
}
#else
#error "define one TIMELINE_PLANT_*"
#endif
