// swapper.c: the pipelined sub-group swapper (see swapper.h).
#include "swapper.h"
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "check.h"

static const size_t ELEM_BYTES[SWAP_TENSORS] = {4, 4, 4, 2};  // master, m, v fp32; params bf16

size_t swapper_group_elems(double group_bytes, size_t count) {
    size_t elems = (size_t)(group_bytes / 12.0) / SWAP_GROUP_ALIGN * SWAP_GROUP_ALIGN;
    size_t whole = (count + SWAP_GROUP_ALIGN - 1) / SWAP_GROUP_ALIGN * SWAP_GROUP_ALIGN;
    if (elems < SWAP_GROUP_ALIGN) elems = SWAP_GROUP_ALIGN;
    return elems < whole ? elems : whole;
}

void swapper_init(Swapper *sw, Device *dev, Trace *trace, Aio *aio, Aio *params_aio,
                  const AioFile *file[SWAP_TENSORS], float *const states[3], size_t count, size_t group_elems) {
    CHECK(count > 0 && group_elems > 0 && group_elems % SWAP_GROUP_ALIGN == 0,
          "swapper_init: %zu elements in sub-groups of %zu", count, group_elems);
    memset(sw, 0, sizeof *sw);
    sw->dev = dev;
    sw->trace = trace;
    for (int i = 0; i < SWAP_TENSORS; i++) sw->aio[i] = i == SWAP_PARAMS ? params_aio : aio;
    memcpy(sw->file, file, sizeof sw->file);
    for (int i = SWAP_MASTER; states && i <= SWAP_V; i++) sw->states[i] = states[i];
    sw->count = count;
    sw->group_elems = group_elems;
    sw->groups = (int)((count + group_elems - 1) / group_elems);
    int first = sw->states[SWAP_MASTER] ? SWAP_PARAMS : SWAP_MASTER;  // the tensors the slots hold
    for (int s = 0; s < SWAP_SLOTS; s++) {
        SwapSlot *slot = &sw->slot[s];
        size_t bytes = 0;
        for (int i = first; i < SWAP_TENSORS; i++) bytes += group_elems * ELEM_BYTES[i];  // each 4 KiB-aligned
        slot->buf = buf_alloc(dev, TIER_PINNED, CAT_WORKSPACE, bytes, "optimizer swap slot");
        char *p = slot->buf.ptr;
        for (int i = first; i < SWAP_TENSORS; i++) {
            slot->t[i] = p;
            p += group_elems * ELEM_BYTES[i];
        }
        slot->group = -1;
    }
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) sw->checksum[i] = xcalloc((size_t)sw->groups, sizeof(uint64_t));
    sw->checksummed = xcalloc((size_t)sw->groups, 1);
    sw->asked_ahead = xcalloc((size_t)sw->groups, 1);
}

static size_t group_first(const Swapper *sw, int k) { return (size_t)k * sw->group_elems; }
static size_t group_count(const Swapper *sw, int k) {
    size_t first = group_first(sw, k);
    return sw->count - first < sw->group_elems ? sw->count - first : sw->group_elems;
}
// Sub-group k's slot; with the states in memory its master, m and v are
// k's place there.
static SwapSlot *slot_of(Swapper *sw, int k) {
    SwapSlot *s = &sw->slot[(sw->base + k) % SWAP_SLOTS];
    for (int i = SWAP_MASTER; sw->states[SWAP_MASTER] && i <= SWAP_V; i++) s->t[i] = sw->states[i] + group_first(sw, k);
    return s;
}

// ---- checksums ----

// FNV-1a over 64-bit words (a request is whole 4 KiB blocks): cheap, and
// any changed word changes it.
static uint64_t words_checksum(const void *p, size_t bytes) {
    const uint64_t *w = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes / sizeof(uint64_t); i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h;
}

static size_t request_bytes(const Swapper *sw, int k, int i);

static void take_checksums(Swapper *sw, const SwapSlot *s, int k) {
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) sw->checksum[i][k] = words_checksum(s->t[i], request_bytes(sw, k, i));
    sw->checksummed[k] = 1;
}

// 0, or nonzero with the stop's message: sub-group k as read is not what was written.
static int checksums_hold(Swapper *sw, const SwapSlot *s, int k) {
    if (!sw->checksummed[k]) return 1;
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) {
        size_t bytes = request_bytes(sw, k, i), at = (size_t)k * sw->group_elems * ELEM_BYTES[i];
        if (words_checksum(s->t[i], bytes) == sw->checksum[i][k]) continue;
        sw->error = EIO;
        snprintf(sw->error_msg, sizeof sw->error_msg, "%s: bytes %zu to %zu (sub-group %d) are not what this run "
                 "wrote there (checksum): the file was changed outside the run, or the disk returned bad data",
                 sw->file[i]->path, at, at + bytes, k);
        return 0;
    }
    return 1;
}

// ---- requests ----

// A request moves whole 4 KiB blocks: the group's elements and the zeroed tail.
static size_t request_bytes(const Swapper *sw, int k, int i) { return aio_round_up(group_count(sw, k) * ELEM_BYTES[i]); }

static void submit(Swapper *sw, SwapSlot *s, int i, AioOp op, int k) {
    size_t eb = ELEM_BYTES[i];
    aio_submit(sw->aio[i], &s->req[i], op, sw->file[i], group_first(sw, k) * eb, s->t[i], request_bytes(sw, k, i));
    s->active[i] = 1;
}

// Waits for request i of the slot and puts its interval on the I/O row.
static void collect(Swapper *sw, SwapSlot *s, int i) {
    if (!s->active[i]) return;
    AioRequest *r = &s->req[i];
    aio_wait(sw->aio[i], r);
    double t0 = r->start_us > 0 ? r->start_us : r->submit_us;
    const char *name = r->op == AIO_READ ? "nvme read" : i == SWAP_PARAMS ? "nvme write params" : "nvme write";
    trace_span(sw->trace, TRACE_TID_IO, name, t0, r->done_us, (double)r->bytes);
    if (r->status != 0 && !sw->error) {
        sw->error = r->status;
        snprintf(sw->error_msg, sizeof sw->error_msg, "%s", r->error);
    }
    s->active[i] = 0;
}

static void submit_states(Swapper *sw, SwapSlot *s) {
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) submit(sw, s, i, AIO_WRITE, s->group);
    s->held = 0;
}

// Waits for everything the slot has in flight (held writes start first); a
// finished read leaves its sub-group ready.
static void settle(Swapper *sw, SwapSlot *s) {
    if (s->held) submit_states(sw, s);
    for (int i = 0; i < SWAP_TENSORS; i++) collect(sw, s, i);
    if (s->state == SLOT_READING) s->ready = 1;
    s->state = SLOT_FREE;
}

// 1 when nothing of the slot is in flight or held any more (never blocks).
static int finished(Swapper *sw, SwapSlot *s) {
    if (s->held) return 0;
    for (int i = 0; i < SWAP_TENSORS; i++)
        if (s->active[i] && !aio_test(sw->aio[i], &s->req[i])) return 0;
    return 1;
}

// The slot whose write-back of sub-group k is in flight, if any.
static SwapSlot *writing(Swapper *sw, int k) {
    for (int s = 0; s < SWAP_SLOTS; s++)
        if (sw->slot[s].state == SLOT_WRITING && sw->slot[s].group == k) return &sw->slot[s];
    return NULL;
}

// Starts reading sub-group k into its slot, unless it is read already. What
// is in the way (the slot's own write-back, an earlier write of the same
// sub-group from another slot) is waited for when `blocking`; otherwise the
// read is left for later and 0 returned.
static int start_read(Swapper *sw, int k, int blocking) {
    if (sw->states[SWAP_MASTER]) return 1;  // in memory: nothing to read
    if (!blocking) {
        sw->asked_ahead[k] = 1;
    } else {  // the pass needs k now
        sw->reads_waited++;
        sw->reads_asked_ahead += sw->asked_ahead[k];
        sw->asked_ahead[k] = 0;
    }
    SwapSlot *s = slot_of(sw, k);
    if (s->group == k && (s->state == SLOT_READING || s->ready)) return 1;
    SwapSlot *in_way[2] = {s->state != SLOT_FREE ? s : NULL, writing(sw, k)};
    for (int j = 0; j < 2; j++) {
        if (!in_way[j]) continue;
        if (!blocking && !finished(sw, in_way[j])) return 0;
        settle(sw, in_way[j]);
    }
    if (sw->error) return 0;
    s->group = k;
    s->ready = 0;
    s->state = SLOT_READING;
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) submit(sw, s, i, AIO_READ, k);
    return 1;
}

// The elements past the group's count up to the request's 4 KiB end: zeroed,
// so that what lands in a file's slack is not left over from another group.
static void zero_tail(Swapper *sw, SwapSlot *s, int i, size_t n) {
    size_t eb = ELEM_BYTES[i], end = aio_round_up(n * eb);
    memset((char *)s->t[i] + n * eb, 0, end - n * eb);
}

// The states of sub-group k wait for swapper_release_writes when the pass
// holds its last writes and no later sub-group of the pass needs k's slot.
static void write_back(Swapper *sw, SwapSlot *s, int k, unsigned what) {
    int states = (what & SWAP_WRITE) && !sw->states[SWAP_MASTER];
    int params = (what & SWAP_WRITE_PARAMS) && sw->file[SWAP_PARAMS];
    if (!states && !params) return;
    SwapSlot *earlier = writing(sw, k);  // two writes of one region are never in flight together
    if (earlier && earlier != s) settle(sw, earlier);
    size_t n = group_count(sw, k);
    s->group = k;
    s->state = SLOT_WRITING;
    // the params first: the next forward reads them, the states wait for the next step
    if (params) {
        zero_tail(sw, s, SWAP_PARAMS, n);
        submit(sw, s, SWAP_PARAMS, AIO_WRITE, k);
        sw->write_bytes += 2.0 * n;
    }
    if (!states) return;
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) zero_tail(sw, s, i, n);
    take_checksums(sw, s, k);
    sw->write_bytes += 12.0 * n;  // counted for this step, even when they go out during the next
    if ((what & SWAP_HOLD_LAST) && k + SWAP_SLOTS >= sw->groups) s->held = 1;
    else submit_states(sw, s);
}

// A pass that writes without reading first: what was read ahead is stale.
static void forget_read_ahead(Swapper *sw) {
    for (int s = 0; s < SWAP_SLOTS; s++) {
        if (sw->slot[s].state == SLOT_READING) settle(sw, &sw->slot[s]);
        sw->slot[s].ready = 0;
    }
}

// ---- passes ----

// LAB 06: swapper_pass -- read k+1 while the work runs on k while k-1 is written back
// Sub-group k sits in slot (base + k) % SWAP_SLOTS. Before the work on k:
// its reads started (blocking where it must wait for its slot), the reads
// of the next ones started where their slots are free (never blocking),
// then k's own reads settled. After the work: k's write-back started, not
// waited for. The pass ends with base moved on by the groups it did, so the
// next pass's reads land in the slots this one left first.
int swapper_pass(Swapper *sw, unsigned what, SwapWork work, void *arg) {
    if (!(what & SWAP_READ)) forget_read_ahead(sw);
    for (int k = 0; k < sw->groups && !sw->error; k++) {
        SwapSlot *s = slot_of(sw, k);
        if (what & SWAP_READ) {
            start_read(sw, k, 1);
            // and the next ones, into the slots whose write-back is done
            for (int j = k + 1; j < k + SWAP_SLOTS && j < sw->groups; j++)
                if (!start_read(sw, j, 0)) break;
        }
        settle(sw, s);  // its reads are in; writing only: its last write-back is out
        if (sw->error || ((what & SWAP_READ) && !checksums_hold(sw, s, k))) break;
        size_t n = group_count(sw, k);
        if (what & SWAP_READ) sw->read_bytes += 12.0 * n;
        s->ready = 0;
        SwapGroup g = {.index = k, .slot = (int)(s - sw->slot), .first = group_first(sw, k), .count = n,
                       .master = s->t[SWAP_MASTER], .m = s->t[SWAP_M], .v = s->t[SWAP_V],
                       .params = s->t[SWAP_PARAMS]};
        work(&g, arg);
        write_back(sw, s, k, what);
    }
    sw->base = (sw->base + sw->groups) % SWAP_SLOTS;
    if (sw->error) swapper_drain(sw);
    return sw->error;
}
// LAB END

void swapper_progress(Swapper *sw) {
    for (int s = 0; s < SWAP_SLOTS; s++)
        if (sw->slot[s].state != SLOT_FREE && finished(sw, &sw->slot[s])) settle(sw, &sw->slot[s]);
    for (int k = 0; k < SWAP_SLOTS && k < sw->groups; k++)
        if (!start_read(sw, k, 0)) break;
}

void swapper_release_writes(Swapper *sw) {
    for (int s = 0; s < SWAP_SLOTS; s++)
        if (sw->slot[s].held) submit_states(sw, &sw->slot[s]);
}

int swapper_drain(Swapper *sw) {
    for (int s = 0; s < SWAP_SLOTS; s++) settle(sw, &sw->slot[s]);
    return sw->error;
}

// Does sub-group k overlap shard elements [first, first + count)?
static int overlaps(const Swapper *sw, int k, size_t first, size_t count) {
    size_t lo = group_first(sw, k), hi = lo + group_count(sw, k);
    return lo < first + count && first < hi;
}

int swapper_params_pending(Swapper *sw, size_t first, size_t count) {
    for (int s = 0; s < SWAP_SLOTS; s++) {
        SwapSlot *slot = &sw->slot[s];
        if (slot->active[SWAP_PARAMS] && overlaps(sw, slot->group, first, count) &&
            !aio_test(sw->aio[SWAP_PARAMS], &slot->req[SWAP_PARAMS]))
            return 1;
    }
    return 0;
}

void swapper_wait_params(Swapper *sw, size_t first, size_t count) {
    for (int s = 0; s < SWAP_SLOTS; s++) {
        SwapSlot *slot = &sw->slot[s];
        if (slot->active[SWAP_PARAMS] && overlaps(sw, slot->group, first, count)) collect(sw, slot, SWAP_PARAMS);
    }
}

void swapper_take_reads(Swapper *sw, long *waited, long *asked_ahead) {
    *waited = sw->reads_waited;
    *asked_ahead = sw->reads_asked_ahead;
    sw->reads_waited = sw->reads_asked_ahead = 0;
}

void swapper_take_bytes(Swapper *sw, double *read_bytes, double *write_bytes) {
    *read_bytes = sw->read_bytes;
    *write_bytes = sw->write_bytes;
    sw->read_bytes = sw->write_bytes = 0;
}

void swapper_free(Swapper *sw) {
    swapper_drain(sw);
    for (int s = 0; s < SWAP_SLOTS; s++) buf_free(sw->dev, &sw->slot[s].buf);
    for (int i = SWAP_MASTER; i <= SWAP_V; i++) free(sw->checksum[i]);
    free(sw->checksummed);
    free(sw->asked_ahead);
}
