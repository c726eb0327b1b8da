// arena.c: best fit, split, coalesce over one region (see arena.h). The
// blocks are an array in address order; a step hands out and takes back a
// few hundred blocks at most, so a scan of it is nothing beside the work
// they hold.
#include "arena.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"

size_t arena_rounded(size_t bytes) {
    return bytes ? (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN + ARENA_GUARD : 0;
}

void arena_init(Arena *a, size_t capacity) {
    memset(a, 0, sizeof *a);
    a->capacity = capacity / ARENA_ALIGN * ARENA_ALIGN;
    a->cap = 64;
    a->block = xcalloc((size_t)a->cap, sizeof(ArenaBlock));
    if (a->capacity) a->block[a->count++] = (ArenaBlock){0, a->capacity, 1};
}

void arena_destroy(Arena *a) {
    free(a->block);
    memset(a, 0, sizeof *a);
}

// Opens a slot for a block at index i (the blocks from i on move up one).
static void insert_at(Arena *a, int i, ArenaBlock b) {
    if (a->count == a->cap) {
        a->cap *= 2;
        a->block = xrealloc(a->block, (size_t)a->cap * sizeof(ArenaBlock));
    }
    memmove(&a->block[i + 1], &a->block[i], (size_t)(a->count - i) * sizeof(ArenaBlock));
    a->block[i] = b;
    a->count++;
}

static void remove_at(Arena *a, int i) {
    memmove(&a->block[i], &a->block[i + 1], (size_t)(a->count - i - 1) * sizeof(ArenaBlock));
    a->count--;
}

size_t arena_alloc(Arena *a, size_t bytes) {
    CHECK(bytes > 0, "arena_alloc: a request of 0 bytes");
    size_t need = arena_rounded(bytes);
    int best = -1, end = a->count - 1;  // the block at the region's end, free or not
    for (int i = 0; i < end; i++)         // in address order: the first of the smallest wins a tie
        if (a->block[i].free && a->block[i].bytes >= need && (best < 0 || a->block[i].bytes < a->block[best].bytes))
            best = i;
    if (best < 0 && end >= 0 && a->block[end].free && a->block[end].bytes >= need) best = end;
    if (best < 0) return ARENA_NONE;
    ArenaBlock *b = &a->block[best];
    size_t offset = b->offset;
    if (b->bytes > need) insert_at(a, best + 1, (ArenaBlock){offset + need, b->bytes - need, 1});
    a->block[best] = (ArenaBlock){offset, need, 0};
    a->allocated += need;
    if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
    if (offset + need > a->high_water) a->high_water = offset + need;
    return offset;
}

size_t arena_free(Arena *a, size_t offset) {
    int lo = 0, hi = a->count - 1, i = -1;
    while (lo <= hi) {  // the blocks are sorted by offset
        int mid = (lo + hi) / 2;
        if (a->block[mid].offset == offset) {
            i = mid;
            break;
        }
        if (a->block[mid].offset < offset) lo = mid + 1;
        else hi = mid - 1;
    }
    CHECK(i >= 0 && !a->block[i].free, "arena_free: no block handed out at offset %zu; hint: a buffer was released "
          "twice, or is not the device's", offset);
    size_t bytes = a->block[i].bytes;
    a->block[i].free = 1;
    a->allocated -= bytes;
    if (i + 1 < a->count && a->block[i + 1].free) {  // coalesce with the next block
        a->block[i].bytes += a->block[i + 1].bytes;
        remove_at(a, i + 1);
    }
    if (i > 0 && a->block[i - 1].free) {  // and with the one before
        a->block[i - 1].bytes += a->block[i].bytes;
        remove_at(a, i);
    }
    return bytes;
}

ArenaStats arena_stats(const Arena *a) {
    ArenaStats s = {.reserved = a->capacity, .allocated = a->allocated, .free_bytes = a->capacity - a->allocated,
                    .blocks = a->count, .high_water = a->high_water,
                    .peak_allocated = a->peak_allocated};
    for (int i = 0; i < a->count; i++) {
        if (!a->block[i].free) continue;
        s.free_blocks++;
        if (a->block[i].bytes > s.largest_free) s.largest_free = a->block[i].bytes;
    }
    return s;
}

double arena_fragmentation(const ArenaStats *s) {
    return s->free_bytes ? 1.0 - (double)s->largest_free / (double)s->free_bytes : 0.0;
}
