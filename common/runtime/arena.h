// arena.h: the device tier's allocator. The device's memory is reserved
// once as one region (--hbm-gb, or what the GPU has free less a margin), and
// every device buffer is a block of it, placed here:
//   - best fit: the smallest free block that holds the request, the lowest
//     address among equals; the free block at the region's end (what was
//     never handed out, or came back to it) is taken only when no other
//     holds the request, as if it were endless, so a region's size never
//     changes where a block goes: a run lands at the same offsets in any
//     region that reaches its high-water mark, and fits there;
//   - the block is split: the request takes its front, the rest stays free;
//   - a released block is coalesced with its free neighbours;
//   - sizes and offsets are multiples of ARENA_ALIGN.
// It deals in offsets only, never pointers, so the cpu device and the cuda
// device place the same sequence of requests at the same offsets: the
// layout, and the fragmentation, a laptop shows is the GPU's. A request
// that no free block holds fails, even when the free bytes add up, as a
// GPU's allocator does: that is fragmentation (ZeRO-R, Rajbhandari et al.
// 2020, section 6).
#pragma once
#include <stddef.h>

// A page: what the emulator can take away from a released block, so that
// work still queued that touches it faults; cudaMalloc's own alignment (256
// bytes) divides it.
#define ARENA_ALIGN ((size_t)4096)
#define ARENA_NONE ((size_t)-1)
// The cuda emulator's build leaves a page after every block, which the
// emulator never opens, so a kernel that runs past a block's end faults
// there as it does past a cudaMalloc's; a GPU's build and the cpu device's
// place blocks back to back, as a GPU's allocator does.
#ifdef WB_CUDA_EMU
#define ARENA_GUARD ARENA_ALIGN
#else
#define ARENA_GUARD ((size_t)0)
#endif

typedef struct ArenaBlock {
    size_t offset, bytes;
    int free;
} ArenaBlock;

// What the arena looks like at one moment.
typedef struct ArenaStats {
    size_t reserved;      // the region
    size_t allocated;     // in blocks handed out (requests rounded up to ARENA_ALIGN)
    size_t free_bytes;    // reserved - allocated
    size_t largest_free;  // the largest request that would succeed now
    int blocks, free_blocks;
    size_t high_water;    // the end of the highest block handed out so far: a region this large holds the run, the same way
    size_t peak_allocated;  // the most `allocated` has been: the blocks' bytes at their largest, holes apart
} ArenaStats;

typedef struct Arena {
    size_t capacity;
    ArenaBlock *block;  // every block, in address order, back to back over [0, capacity)
    int count, cap;
    size_t allocated, high_water, peak_allocated;
} Arena;

void arena_init(Arena *a, size_t capacity);  // capacity rounded down to ARENA_ALIGN
void arena_destroy(Arena *a);
// Bytes a request of `bytes` takes: rounded up to ARENA_ALIGN, and the
// guard page where there is one (0 stays 0).
size_t arena_rounded(size_t bytes);
// The offset of a block of arena_rounded(bytes) bytes, or ARENA_NONE when no
// free block holds it. bytes > 0.
size_t arena_alloc(Arena *a, size_t bytes);
// Releases the block at `offset` (as arena_alloc returned it); returns its size.
size_t arena_free(Arena *a, size_t offset);
ArenaStats arena_stats(const Arena *a);
// 1 - largest free block / free bytes: 0 when the free bytes are one block
// (or none is free), near 1 when they are scattered in small pieces.
double arena_fragmentation(const ArenaStats *s);
