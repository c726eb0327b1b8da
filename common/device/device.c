// device.c: the generic half of the device interface (see device.h): picks a
// backend by --device, and routes every allocation through the memory
// accounting so that no byte escapes the breakdown.
#include "device.h"
#include "half_rows.h"
#include <string.h>
#include "check.h"
#include "device_backends.h"

int device_cuda_available(void) {
#ifdef WB_HAVE_CUDA
    return device_cuda_count(NULL, 0) > 0;
#else
    return 0;
#endif
}

// --device auto: cuda where a GPU is usable, else cpu; a GPU that is there
// but unusable (driver too old) is worth one line, not a silent cpu run.
static int auto_picks_cuda(void) {
#ifdef WB_HAVE_CUDA
    char why[256];
    int count = device_cuda_count(why, sizeof why);
    if (count < 0 && world_rank() == 0)
        fprintf(stderr, "warning: --device auto: %s; running on the cpu device\n", why);
    return count > 0;
#else
    return 0;
#endif
}

static void init_cuda(Device *d, const DeviceOptions *opt) {
#ifdef WB_HAVE_CUDA
    device_cuda_init(d, opt);
#else
    (void)d;
    (void)opt;
    fail_usage("--device cuda: this binary was built without CUDA (nvcc was not found at build "
               "time); use --device cpu or rebuild where nvcc is installed");
#endif
}

void device_share(Device *d, int sharers, int budget_given) {
    if (d->kind != DEVICE_CUDA || sharers <= 1) return;
    d->sharers = sharers;
    d->peak_flops /= sharers;
    if (!budget_given) mem_set_budget(&d->mem, TIER_DEVICE, d->mem.budget[TIER_DEVICE] / (size_t)sharers);
}

void device_init(Device *d, const DeviceOptions *opt) {
    memset(d, 0, sizeof *d);
    d->sharers = 1;
    d->local_size = opt->local_size > 0 ? opt->local_size : 1;
    mem_init(&d->mem);
    d->trace = opt->trace;
    const char *kind = opt->kind ? opt->kind : "auto";
    if (strcmp(kind, "auto") == 0) {
        if (auto_picks_cuda()) init_cuda(d, opt);
        else device_cpu_init(d, opt);
    } else if (strcmp(kind, "cpu") == 0) {
        device_cpu_init(d, opt);
    } else if (strcmp(kind, "cuda") == 0) {
        init_cuda(d, opt);
    } else {
        fail_usage("--device %s: unknown device; use auto, cpu or cuda", kind);
    }
    // the 16-bit format on every device, and the host's conversions of it
    // (the cpu kernels, and the host-side work of cpu_offload and infinity)
    d->half = opt->half;
    d->half_path = half_rows_best_path();
}

void device_destroy(Device *d) {
    buf_free(d, &d->scratch);
    const DeviceOps *ops = d->ops;
    if (ops && ops->destroy) ops->destroy(d);  // cuda gives its blocks back first
    if (d->region) ops->unreserve(d, d->region, d->region_bytes);
    mem_release(&d->mem);
    d->region = NULL;
    d->ops = NULL;
    d->impl = NULL;
}

// The device tier's region, reserved once, at the first device buffer (by
// then a GPU shared by several ranks has its budget divided: device_share):
// from here on every device buffer is a block of it.
void device_reserve(Device *d) {
    if (d->region) return;
    size_t bytes = d->ops->region_bytes(d);
    d->region = bytes ? d->ops->reserve(d, bytes) : NULL;
    if (!d->region) {
        char b[32];
        mem_format_bytes((double)bytes, b, sizeof b);
        fail_rank(EXIT_USAGE, "device memory: the device's region of %s could not be reserved; hint: give a "
                  "smaller --hbm-gb", b);
    }
    d->region_bytes = bytes;
    mem_reserve_device(&d->mem, bytes);
    if (d->ops->reserved) d->ops->reserved(d);
}

// A device buffer: a block the arena places in the region.
static Buf device_block(Device *d, MemCategory cat, size_t bytes, const char *what) {
    device_reserve(d);
    size_t offset = mem_alloc(&d->mem, TIER_DEVICE, cat, bytes, what);  // or the out-of-memory error
    Buf b = {.ptr = (char *)d->region + offset, .bytes = bytes, .tier = TIER_DEVICE, .cat = cat};
    snprintf(b.what, sizeof b.what, "%s", what ? what : "?");
    d->ops->block_out(d, b.ptr, bytes);
    return b;
}

Buf buf_alloc(Device *d, MemTier tier, MemCategory cat, size_t bytes, const char *what) {
    Buf b = {.ptr = NULL, .bytes = 0, .tier = tier, .cat = cat};
    if (bytes == 0) return b;
    if (tier == TIER_DEVICE) return device_block(d, cat, bytes, what);
    // count first: going over the budget is the error a student should see,
    // before the allocator itself runs out
    snprintf(b.what, sizeof b.what, "%s", what ? what : "?");
    mem_alloc(&d->mem, tier, cat, bytes, what);
    b.ptr = d->ops->alloc(d, tier, bytes);
    if (!b.ptr) {
        mem_free(&d->mem, tier, cat, bytes, 0, what);
        const char *why = d->mem.budget[tier]
                              ? "although the budget allows it; hint: set a smaller --hbm-gb than the machine "
                                "really has, or use a stage that shards more state"
                              : "and no budget is set, so the limit is what the machine has; hint: lower --batch, "
                                "or use a stage that shards more state";
        fail_rank(EXIT_USAGE, "%s memory: the allocator refused %.3f GB for '%s' (%s) %s", mem_tier_name(tier),
                  bytes / 1e9, what ? what : "?", mem_category_name(cat), why);
    }
    b.bytes = bytes;
    return b;
}

void buf_free(Device *d, Buf *b) {
    if (!b->ptr) return;
    if (b->tier == TIER_DEVICE) {
        d->ops->block_back(d, b->ptr, b->bytes);
        mem_free(&d->mem, TIER_DEVICE, b->cat, b->bytes, (size_t)((char *)b->ptr - (char *)d->region), b->what);
    } else {
        d->ops->free(d, b->tier, b->ptr, b->bytes);
        mem_free(&d->mem, b->tier, b->cat, b->bytes, 0, b->what);
    }
    b->ptr = NULL;
    b->bytes = 0;
}

// A first element past SIZE_MAX/2 is no place in a buffer but a negative
// number wrapped around, said as such (as the collectives say theirs).
void *buf_part(const Buf *b, size_t first, size_t count, size_t elem_bytes, const char *what) {
    size_t elems = b->bytes / elem_bytes;
    CHECK((ptrdiff_t)first >= 0, "%s: the displacement is %td, negative (a size_t subtraction that went below zero); "
          "hint: a displacement is where the part starts inside its buffer, from 0 up", what, (ptrdiff_t)first);
    CHECK(first <= elems && count <= elems - first, "%s: elements %zu to %zu lie past the buffer's %zu; hint: a "
          "displacement counts from the buffer's first element, not from the whole array's", what, first,
          first + count, elems);
    return (char *)b->ptr + first * elem_bytes;
}

// Grows to exactly what is asked (the peak then shows the largest user);
// contents are not kept across a grow.
void *device_scratch(Device *d, size_t bytes) {
    if (bytes <= d->scratch.bytes) return d->scratch.ptr;
    // kernels queued on the compute stream may still read the old scratch
    dev_sync(d, STREAM_COMPUTE);
    buf_free(d, &d->scratch);
    d->scratch = buf_alloc(d, TIER_DEVICE, CAT_WORKSPACE, bytes, "kernel scratch");
    return d->scratch.ptr;
}
