// emu_threads.cpp: a kernel's grid on the CPU. Blocks run one at a time, in an
// order drawn at random; in a block every CUDA thread is a fiber
// (Boost.Context), run until it meets a barrier, a warp operation, an atomic
// (where it may give way: a coin toss) or its end. The block's threads take
// their turns in an order drawn afresh for every round (EMU_SEED), so the
// order of a warp's or a block's atomics changes with the seed as it changes
// from run to run on a GPU: a float sum by atomics shows its nondeterminism.
// Barriers and warp operations are rendezvous: the last thread to
// arrive releases the others (and does a wmma collective's work for the
// whole warp first, warp_collective). Whatever CUDA leaves undefined and a GPU may
// hang or misbehave on stops the run with file:line: a barrier that some
// threads of the block never reach (they exited, or wait elsewhere), a warp
// operation whose mask names an exited or missing lane, lanes that meet
// different warp operations, a launch outside the hardware's limits.
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <map>
#include <string>
#include <vector>
#include <boost/context/fiber.hpp>
#include "emu.h"

namespace ctx = boost::context;

namespace emu {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

#define MAX_THREADS 1024
#define STACK_BYTES (64 << 10)
#define PAGE 4096

// ---- fiber stacks: one per thread slot, each above a guard page ----------------------

static char *stack_region;
static char *stack_base(int i) { return stack_region + (size_t)i * (STACK_BYTES + PAGE) + PAGE; }

static void make_stacks() {
    if (stack_region) return;
    size_t len = (size_t)MAX_THREADS * (STACK_BYTES + PAGE);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) die("cannot map %zu bytes of fiber stacks", len);
    stack_region = (char *)p;
    for (int i = 0; i < MAX_THREADS; i++) mprotect(stack_base(i) - PAGE, PAGE, PROT_NONE);
}

int stack_guard_hit(const void *addr) {
    if (!stack_region) return -1;
    const char *a = (const char *)addr;
    size_t len = (size_t)MAX_THREADS * (STACK_BYTES + PAGE);
    if (a < stack_region || a >= stack_region + len) return -1;
    size_t off = (size_t)(a - stack_region) % (STACK_BYTES + PAGE);
    return off < PAGE ? (int)((a - stack_region) / (STACK_BYTES + PAGE)) : -1;
}

// a fixed stack handed to Boost.Context (it keeps its record at the top)
struct SlotStack {
    int slot;
    ctx::stack_context allocate() {
        ctx::stack_context sc;
        sc.size = STACK_BYTES;
        sc.sp = stack_base(slot) + STACK_BYTES;
        return sc;
    }
    void deallocate(ctx::stack_context &) {}
};

// ---- the block that runs now --------------------------------------------------------------

enum ThreadState { READY, BLOCKED, DONE };

struct Thread {
    ctx::fiber fiber;   // the thread's own context, while it is not running
    ctx::fiber caller;  // the scheduler's, while it runs
    uint3 idx;
    ThreadState state;
    const char *wait_file;  // where it waits
    int wait_line;
    const char *wait_what;
};

struct WarpRendezvous {
    unsigned arrived;  // lanes arrived
    unsigned mask;
    WarpKind kind;
    const char *file;
    int line;
    uint64_t in[32], out[2][32];
    unsigned gen;
    WarpCollectiveFn run;  // a collective's work (warp_collective), else NULL
    void *args[32];        // and what each lane passed it
};

struct Block {
    int n;  // threads
    int live;
    int exited;
    Thread t[MAX_THREADS];
    WarpRendezvous warp[MAX_THREADS / 32];
    int barrier_arrived;
    const char *barrier_file;
    int barrier_line;
    int current;
    int turn[MAX_THREADS];  // this round's order of the ready threads
    const LaunchSite *site;
    const std::function<void()> *body;
};

static Block *blk;

std::string running_kernel_text() {
    if (!blk) return "";
    char text[512];
    const Thread &t = blk->t[blk->current];
    snprintf(text, sizeof text, "kernel %s (launched at %s:%d), block (%u,%u,%u) thread (%u,%u,%u)",
             blk->site->name, blk->site->file, blk->site->line, block_idx.x, block_idx.y, block_idx.z, t.idx.x,
             t.idx.y, t.idx.z);
    return text;
}

static int warp_size_of(int w) { return std::min(32, blk->n - 32 * w); }

// __FILE__ of the same file is one string in practice: compared by pointer
// first, every lane of every warp operation (strcmp was 8% of a run)
static bool same_file(const char *a, const char *b) { return a == b || strcmp(a, b) == 0; }

// back to the scheduler until someone marks this thread READY
static void block_here(const char *what, const char *file, int line) {
    Thread &t = blk->t[blk->current];
    t.state = BLOCKED;
    t.wait_what = what, t.wait_file = file, t.wait_line = line;
    t.caller = std::move(t.caller).resume();
}

// ---- atomics: a thread may give way to the others of its block ------------------------------

void atomic_turn() {
    if (!blk || (random_u64() & 1)) return;
    Thread &t = blk->t[blk->current];
    t.caller = std::move(t.caller).resume();  // still READY: it runs again in a later round
}

// ---- __syncthreads --------------------------------------------------------------------------

static const char SYNCTHREADS[] = "__syncthreads";  // what a thread at the barrier waits in (by pointer)

// A barrier that threads which have exited never reach waits for ever: the
// block stalls, and report_stall names the barrier and how many exited
// (counted then, when every thread has exited or waits, whatever the order).
void syncthreads(const char *file, int line) {
    if (!blk) die("%s:%d: __syncthreads outside a kernel", file, line);
    if (blk->barrier_arrived == 0) {
        blk->barrier_file = file, blk->barrier_line = line;
    } else if (blk->barrier_line != line || !same_file(blk->barrier_file, file)) {
        die("%s:%d: __syncthreads in %s while other threads of the block wait at %s:%d (divergent barriers)", file,
            line, running_kernel_text().c_str(), blk->barrier_file, blk->barrier_line);
    }
    if (++blk->barrier_arrived == blk->n) {
        blk->barrier_arrived = 0;
        for (int i = 0; i < blk->n; i++)
            if (blk->t[i].state == BLOCKED && blk->t[i].wait_what == SYNCTHREADS)
                blk->t[i].state = READY;
        return;
    }
    block_here(SYNCTHREADS, file, line);
}

// ---- warp operations ---------------------------------------------------------------------------

static const char *warp_op_name(WarpKind k) {
    static const char *names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync",
                                  "__ballot_sync", "__all_sync", "__any_sync", "__syncwarp",
                                  "wmma::load_matrix_sync", "wmma::store_matrix_sync", "wmma::mma_sync"};
    return names[k];
}

static int source_lane(WarpKind kind, int lane, int arg, int width) {
    int base = lane & ~(width - 1), src;
    switch (kind) {
    case WARP_SHFL_IDX: return base + (arg & (width - 1));
    case WARP_SHFL_XOR: src = lane ^ arg; break;
    case WARP_SHFL_DOWN: src = lane + arg; break;
    case WARP_SHFL_UP: src = lane - arg; break;
    default: return lane;
    }
    return src >= base && src < base + width ? src : lane;  // outside its segment: its own value
}

unsigned active_mask() {
    if (!blk) return 0;
    int w = (int)(blk->current / 32);
    unsigned m = 0;
    for (int l = 0; l < warp_size_of(w); l++)
        if (blk->t[32 * w + l].state != DONE) m |= 1u << l;
    return m;
}

// A lane of the mask that has exited never arrives: as for a barrier, the
// warp's lanes wait and report_stall names it.
static void check_mask(WarpKind kind, unsigned mask, int w, const char *file, int line) {
    for (int l = warp_size_of(w); l < 32; l++)
        if (mask >> l & 1)
            die("%s:%d: %s in %s: the mask 0x%08x names lane %d, which this block of %d threads does not have "
                "(a partial warp)", file, line, warp_op_name(kind), running_kernel_text().c_str(), mask, l, blk->n);
}

// The lane joins its warp's rendezvous: the first to arrive sets what the
// others must meet (the same operation, mask and line).
static void meet(WarpRendezvous &r, WarpKind kind, unsigned mask, WarpCollectiveFn run, const char *file, int line) {
    if (r.arrived == 0) {
        r.mask = mask, r.kind = kind, r.run = run, r.file = file, r.line = line;
    } else if (r.mask != mask || r.kind != kind || r.run != run || r.line != line || !same_file(r.file, file)) {
        die("%s:%d: %s (mask 0x%08x) in %s while lanes of the same warp wait in %s (mask 0x%08x) at %s:%d", file, line,
            warp_op_name(kind), mask, running_kernel_text().c_str(), warp_op_name(r.kind), r.mask, r.file, r.line);
    }
}

uint64_t warp_exchange(WarpKind kind, unsigned mask, uint64_t value, int arg, int width, const char *file,
                       int line) {
    if (!blk) die("%s:%d: %s outside a kernel", file, line, warp_op_name(kind));
    if (width <= 0 || width > 32 || (width & (width - 1)))
        die("%s:%d: %s: width %d is not a power of two up to 32", file, line, warp_op_name(kind), width);
    int w = blk->current / 32, lane = blk->current % 32;
    WarpRendezvous &r = blk->warp[w];
    if (!(mask >> lane & 1))
        die("%s:%d: %s in %s: lane %d calls it with mask 0x%08x, which leaves the lane out", file, line,
            warp_op_name(kind), running_kernel_text().c_str(), lane, mask);
    check_mask(kind, mask, w, file, line);
    meet(r, kind, mask, NULL, file, line);
    r.in[lane] = value;
    r.arrived |= 1u << lane;
    unsigned gen = r.gen;
    if (r.arrived == mask) {
        memcpy(r.out[gen & 1], r.in, sizeof r.in);
        r.arrived = 0;
        r.gen++;
        for (int l = 0; l < warp_size_of(w); l++) {
            Thread &t = blk->t[32 * w + l];
            if (l != lane && (mask >> l & 1) && t.state == BLOCKED) t.state = READY;
        }
    } else {
        block_here(warp_op_name(kind), file, line);
    }
    const uint64_t *out = r.out[gen & 1];
    unsigned bits = 0;
    switch (kind) {
    case WARP_SYNC: return 0;
    case WARP_BALLOT:
    case WARP_ALL:
    case WARP_ANY:
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1) && out[l]) bits |= 1u << l;
        return kind == WARP_BALLOT ? bits : kind == WARP_ALL ? bits == mask : bits != 0;
    default: {
        int src = source_lane(kind, lane, arg, width);
        if (!(mask >> src & 1))
            die("%s:%d: %s in %s: lane %d reads lane %d, which is not in the mask 0x%08x", file, line,
                warp_op_name(kind), running_kernel_text().c_str(), lane, src, mask);
        return out[src];
    }
    }
}

void warp_collective(WarpKind kind, void *lane_args, WarpCollectiveFn run, const char *file, int line) {
    if (!blk) die("%s:%d: %s outside a kernel", file, line, warp_op_name(kind));
    int w = blk->current / 32, lane = blk->current % 32;
    WarpRendezvous &r = blk->warp[w];
    check_mask(kind, 0xffffffffu, w, file, line);  // every lane of a whole warp
    meet(r, kind, 0xffffffffu, run, file, line);
    r.args[lane] = lane_args;
    r.arrived |= 1u << lane;
    if (r.arrived != 0xffffffffu) {
        block_here(warp_op_name(kind), file, line);
        return;
    }
    run(r.args, file, line);  // the lanes' fragments are written before any of them goes on
    r.arrived = 0;
    for (int l = 0; l < 32; l++)
        if (l != lane && blk->t[32 * w + l].state == BLOCKED) blk->t[32 * w + l].state = READY;
}

// ---- a thread's life --------------------------------------------------------------------------------

static void on_exit(int i) {
    blk->t[i].state = DONE;
    blk->live--;
    blk->exited++;
}

static void set_current(int i) {
    blk->current = i;
    thread_idx = blk->t[i].idx;
}

// No thread can go on. Threads that exited while others wait for them at a
// barrier or a warp operation are named first (code that CUDA leaves
// undefined); otherwise, where every live thread waits.
[[noreturn]] static void report_stall() {
    char block[384];
    snprintf(block, sizeof block, "kernel %s (launched at %s:%d), block (%u,%u,%u)", blk->site->name,
             blk->site->file, blk->site->line, block_idx.x, block_idx.y, block_idx.z);
    if (blk->barrier_arrived > 0 && blk->exited > 0)
        die("%s:%d: __syncthreads in %s: %d of the block's %d threads have exited and never reach it "
            "(a barrier in divergent code)", blk->barrier_file, blk->barrier_line, block, blk->exited, blk->n);
    for (int w = 0; w < (blk->n + 31) / 32; w++) {
        const WarpRendezvous &r = blk->warp[w];
        if (!r.arrived) continue;
        for (int l = 0; l < warp_size_of(w); l++)
            if ((r.mask >> l & 1) && blk->t[32 * w + l].state == DONE)
                die("%s:%d: %s (mask 0x%08x) in %s, warp %d: lane %d exited while lanes of its warp wait for it",
                    r.file, r.line, warp_op_name(r.kind), r.mask, block, w, l);
    }
    std::string text;
    std::map<std::string, int> where;
    for (int i = 0; i < blk->n; i++) {
        const Thread &t = blk->t[i];
        if (t.state != BLOCKED) continue;
        char key[256];
        snprintf(key, sizeof key, "%s at %s:%d", t.wait_what, t.wait_file, t.wait_line);
        where[key]++;
    }
    for (auto &w : where) text += "; " + std::to_string(w.second) + " in " + w.first;
    die("kernel %s (launched at %s:%d), block (%u,%u,%u): every live thread waits and none can go on%s",
        blk->site->name, blk->site->file, blk->site->line, block_idx.x, block_idx.y, block_idx.z, text.c_str());
}

static void run_block() {
    int n = blk->n;
    blk->live = n, blk->exited = 0, blk->barrier_arrived = 0;
    memset(blk->warp, 0, sizeof blk->warp);
    for (int i = 0; i < n; i++) {
        Thread &t = blk->t[i];
        t.idx.x = i % block_dim.x;
        t.idx.y = i / block_dim.x % block_dim.y;
        t.idx.z = i / (block_dim.x * block_dim.y);
        t.state = READY;
        t.wait_what = NULL;
        t.fiber = ctx::fiber(std::allocator_arg, SlotStack{i}, [i](ctx::fiber &&caller) {
            blk->t[i].caller = std::move(caller);
            (*blk->body)();
            on_exit(i);
            return std::move(blk->t[i].caller);
        });
    }
    while (blk->live > 0) {
        int ready = 0;
        for (int i = 0; i < n; i++)
            if (blk->t[i].state == READY) blk->turn[ready++] = i;
        if (!ready) report_stall();
        for (int k = ready; k > 1; k--) std::swap(blk->turn[k - 1], blk->turn[random_u64() % k]);
        for (int k = 0; k < ready; k++) {  // a ready thread stays ready until its turn
            int i = blk->turn[k];
            set_current(i);
            blk->t[i].fiber = std::move(blk->t[i].fiber).resume();
        }
    }
}

// ---- the grid -------------------------------------------------------------------------------------------

// (made on first use: kernels register their bounds before main, in any file's order)
static std::map<const void *, int> &dynamic_smem_optin() {
    static std::map<const void *, int> m;
    return m;
}
static std::map<std::string, int> &launch_bounds() {
    static std::map<std::string, int> m;
    return m;
}

void set_dynamic_smem_optin(const void *func, int bytes) { dynamic_smem_optin()[func] = bytes; }
int register_launch_bounds(const char *name, int max_threads) {
    launch_bounds()[name] = max_threads;
    return max_threads;
}

#define SMEM_DEFAULT_LIMIT (48 << 10)
#define SMEM_OPTIN_LIMIT (227 << 10)

void check_launch(const LaunchSite &site, dim3 grid, dim3 block, size_t shmem) {
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const char *why = NULL;
    char text[160];
    if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
        why = "an empty grid or block";
    else if (block.x > 1024 || block.y > 1024 || block.z > 64)
        why = "a block dimension past (1024, 1024, 64)";
    else if (threads > 1024)
        snprintf(text, sizeof text, "a block of %llu threads, past 1024", threads), why = text;
    else if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        why = "a grid dimension past (2^31-1, 65535, 65535)";
    if (!why && shmem > 0) {
        auto o = dynamic_smem_optin().find(site.func);
        size_t limit = o != dynamic_smem_optin().end() ? (size_t)o->second : SMEM_DEFAULT_LIMIT;
        if (shmem > SMEM_OPTIN_LIMIT || shmem > limit)
            snprintf(text, sizeof text, "%zu bytes of dynamic shared memory, past the %zu bytes %s", shmem, limit,
                     o != dynamic_smem_optin().end() ? "opted in to" : "allowed without cudaFuncSetAttribute"),
                why = text;
    }
    auto b = launch_bounds().find(std::string(site.name).substr(0, strcspn(site.name, "<")));  // a template's too
    if (!why && b != launch_bounds().end() && threads > (unsigned long long)b->second)
        snprintf(text, sizeof text, "a block of %llu threads, past its __launch_bounds__(%d)", threads, b->second),
            why = text;
    if (why)
        die("%s:%d: launch of %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>> with %s", site.file, site.line, site.name, grid.x,
            grid.y, grid.z, block.x, block.y, block.z, shmem, why);
}

// the launch's dynamic shared memory, 128-byte aligned as the GPU's is
static unsigned char *dynamic_smem;
static size_t dynamic_smem_bytes;

void *dynamic_shared(const char *file, int line) {
    if (!blk) die("%s:%d: dynamic shared memory outside a kernel", file, line);
    if (!dynamic_smem_bytes)
        die("%s:%d: %s reads dynamic shared memory (extern __shared__) that its launch did not ask for (the "
            "third launch argument is 0)", file, line, running_kernel_text().c_str());
    return dynamic_smem;
}

void run_grid(const LaunchSite &site, dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body) {
    make_stacks();
    if (shmem > dynamic_smem_bytes) {
        free(dynamic_smem);
        dynamic_smem = (unsigned char *)aligned_alloc(128, (shmem + 127) / 128 * 128);
        if (!dynamic_smem) die("cannot allocate %zu bytes of dynamic shared memory", shmem);
    }
    dynamic_smem_bytes = shmem;
    static Block *the_block;
    if (!the_block) the_block = new Block();
    size_t blocks = (size_t)grid.x * grid.y * grid.z;
    std::vector<uint32_t> order(blocks);
    for (size_t i = 0; i < blocks; i++) order[i] = (uint32_t)i;
    for (size_t i = blocks; i > 1; i--) std::swap(order[i - 1], order[random_u64() % i]);
    grid_dim = grid;
    block_dim = block;
    blk = the_block;
    blk->n = (int)(block.x * block.y * block.z);
    blk->site = &site;
    blk->body = &body;
    for (size_t k = 0; k < blocks; k++) {
        size_t b = order[k];
        block_idx.x = (unsigned)(b % grid.x);
        block_idx.y = (unsigned)(b / grid.x % grid.y);
        block_idx.z = (unsigned)(b / ((size_t)grid.x * grid.y));
        if (shmem) memset(dynamic_smem, 0xa5, shmem);  // what an earlier block left is not this block's
        run_block();
    }
    blk = NULL;
}

}  // namespace emu
