// emu_runtime.cpp: the CUDA runtime API on the CPU.
//
// Memory. Every cudaMalloc (and cudaHostAlloc) is its own mapping: 64 KiB
// without access on each side, the data ending at the upper guard (16-byte aligned, so
// at most 15 bytes of slack), and canary bytes in the slack and before the
// data. A read or write past either end faults on a guard page, and the
// fault handler names the allocation, the kernel, its block and thread, and
// the source line of the access; a write into the slack is found by the
// canary check after every device operation. Freed memory is never reused:
// it stays mapped without access, so work still queued that touches it
// faults the same way. New device memory is filled with 0xff bytes (a NaN in
// fp32 and bf16), as a GPU gives no zeroed memory either.
//
// Streams. Work on a stream is queued and runs only when the host waits for
// something (a stream, an event, the device, a blocking copy; cudaEventQuery
// runs one operation per call; an MPI call of the host runs what can start,
// see emu_nccl.cpp). The scheduler then picks at random (EMU_SEED) among the
// streams whose next operation may start: stream order and event waits are
// kept, nothing else is. The legacy default stream orders against the
// blocking streams as CUDA's does; non-blocking streams do not.
//
// Host functions (cudaLaunchHostFunc) are operations of their stream: the
// function runs on the thread that runs the queue, when the stream reaches it.
//
// The op log (EMU_OPLOG=FILE, a "%r" in it becomes the rank), written at
// exit: every operation in issue order, one line each, "op STREAM START END
// WHAT" (its stream's number, 0 for the legacy stream, and its span on the
// device clock below, "-" for work that never ran), with a line "host_wait"
// where the host waited for unfinished work (counted as in EMU_STATS). Tests
// read from it the order of a step's copies and what they waited for.
//
// Device time. Each operation gets a start and an end on a device clock, as
// if every stream had the GPU to itself: it starts at the latest of its
// host issue time, its stream's previous end and its dependencies' ends, and
// lasts as long as the emulator took to run it. Events take their time from
// it, so cudaEventElapsedTime measures device spans and concurrent streams
// overlap on this clock as they would on a GPU with room for both.
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include "emu.h"

namespace emu {
int stack_guard_hit(const void *addr);
void set_dynamic_smem_optin(const void *func, int bytes);
}

using namespace emu;

// ---- basics ----------------------------------------------------------------------------------

static std::recursive_mutex lock_;
Lock::Lock() { lock_.lock(); }
Lock::~Lock() { lock_.unlock(); }

double emu::now_us() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int emu::world_rank() {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (const char *n : names)
        if (getenv(n)) return atoi(getenv(n));
    return 0;
}

void emu::die(const char *fmt, ...) {
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda emulator (rank %d): %s\n", world_rank(), text);
    fflush(stderr);
    _exit(70);
}

// splitmix64: the orders of blocks, threads and streams are drawn often (a
// shuffle of a block's threads every round), where the Mersenne twister's
// refills were 7% of a run; any fair draw serves, EMU_SEED picks the stream
uint64_t emu::random_u64() {
    static uint64_t state = [] {
        const char *s = getenv("EMU_SEED");
        return s ? strtoull(s, NULL, 0) : 1ull;
    }();
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static cudaError_t last_error = cudaSuccess;
static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

// ---- counters --------------------------------------------------------------------------------

static std::map<std::string, long> calls;
static void write_stats() {
    const char *path = getenv("EMU_STATS");
    if (!path || !*path) return;
    std::string p = path;
    size_t at = p.find("%r");
    if (at != std::string::npos) p.replace(at, 2, std::to_string(world_rank()));
    FILE *f = fopen(p.c_str(), "w");
    if (!f) return;
    for (auto &c : calls) fprintf(f, "%s %ld\n", c.first.c_str(), c.second);
    fclose(f);
}
void emu::count_call(const char *name) {
    static bool registered = false;
    if (!registered) registered = true, atexit(write_stats);
    calls[name]++;
}
#define COUNT() count_call(__func__)

// ---- the op log ------------------------------------------------------------------------------------

struct LogLine {
    int stream;         // -1: a host wait
    std::string what;
    double start_us, end_us;
    bool ran;
};
static std::vector<LogLine> oplog;

static bool oplog_wanted() {
    static int wanted = -1;
    if (wanted < 0) {
        const char *p = getenv("EMU_OPLOG");
        wanted = p && *p;
    }
    return wanted;
}

static void write_oplog() {
    std::string p = getenv("EMU_OPLOG");
    size_t at = p.find("%r");
    if (at != std::string::npos) p.replace(at, 2, std::to_string(world_rank()));
    FILE *f = fopen(p.c_str(), "w");
    if (!f) return;
    for (const LogLine &l : oplog) {
        if (l.stream < 0) fprintf(f, "host_wait\n");
        else if (l.ran) fprintf(f, "op %d %.3f %.3f %s\n", l.stream, l.start_us, l.end_us, l.what.c_str());
        else fprintf(f, "op %d - - %s\n", l.stream, l.what.c_str());
    }
    fclose(f);
}

static long log_line(int stream, const std::string &what) {
    static bool registered = false;
    if (!registered) registered = true, atexit(write_oplog);
    oplog.push_back(LogLine{stream, what, 0, 0, false});
    return (long)oplog.size() - 1;
}

// ---- memory ------------------------------------------------------------------------------------

#define PAGE 4096
#define GUARD (16 * PAGE)  // no access on either side of every allocation
#define ALIGN 16
#define CANARY 0xa5
#define FRONT_CHECK 64  // canary bytes checked before the data
#define DEVICE_BYTES (80ull << 30)

static std::map<uintptr_t, Alloc> allocs;  // by map start: live and freed
static std::vector<Alloc *> live_allocs;
static long alloc_serial;
static size_t device_in_use;

const Alloc *emu::find_alloc(const void *p) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return NULL;
    --it;
    const Alloc &x = it->second;
    return a < (uintptr_t)x.map + x.map_len ? &x : NULL;
}

static Alloc *new_mapping(size_t bytes, MemKind kind) {
    size_t data = (std::max(bytes, (size_t)1) + ALIGN - 1) / ALIGN * ALIGN;
    size_t pages = (data + PAGE - 1) / PAGE;
    size_t len = pages * PAGE + 2 * GUARD;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *map = (char *)m;
    mprotect(map + GUARD, pages * PAGE, PROT_READ | PROT_WRITE);
    char *ptr = map + GUARD + pages * PAGE - data;
    size_t front = std::min((size_t)(ptr - (map + GUARD)), (size_t)FRONT_CHECK);
    memset(ptr - front, CANARY, front);
    memset(ptr, kind == MEM_DEVICE ? 0xff : 0, bytes);
    memset(ptr + bytes, CANARY, data - bytes);
    Alloc &a = allocs[(uintptr_t)map];
    a = Alloc{ptr, bytes, map, len, kind, false, ++alloc_serial, false};
    live_allocs.push_back(&a);
    return &a;
}

static const char *kind_name(MemKind k) { return k == MEM_DEVICE ? "device" : "pinned host"; }

static bool canaries_intact(const Alloc *a, size_t *where) {
    size_t front = std::min((size_t)(a->ptr - (a->map + GUARD)), (size_t)FRONT_CHECK);
    for (size_t i = 0; i < front; i++)
        if ((unsigned char)a->ptr[-(ptrdiff_t)front + (ptrdiff_t)i] != CANARY) return *where = i, false;
    size_t data = (std::max(a->bytes, (size_t)1) + ALIGN - 1) / ALIGN * ALIGN;
    for (size_t i = a->bytes; i < data; i++)
        if ((unsigned char)a->ptr[i] != CANARY) return *where = i, false;
    return true;
}

// ---- the workbench's device region (the emulator's own API, not CUDA's) -------------------
//
// The workbench reserves the device's memory once and places its buffers in
// it itself (common/runtime/arena.h). Here the region is address space with
// no access, between guard areas; emuRegionBlock opens a block when the
// arena hands it out and closes it when the arena takes it back, each in
// the order of the stream's work. So a kernel, a copy or a collective that
// touches a block after it was taken back (work on another stream that the
// release did not wait for), or before it was handed out, faults naming the
// block, as one that touches a freed cudaMalloc does. This build's arena
// leaves a closed page after every block (ARENA_GUARD), so running past a
// block's end faults too, and the slack between its data and that page is
// canary-checked. A block opens full of 0xff bytes, as fresh memory does.

struct RegionBlock {
    char *ptr;
    size_t bytes;
    bool live;
    long serial;
};
static std::map<uintptr_t, RegionBlock> region_blocks;  // by start: the last block lent at each place

static size_t pages_of(size_t bytes) { return (std::max(bytes, (size_t)1) + PAGE - 1) / PAGE * PAGE; }

// The block record of the region holding address p: the one that starts
// last at or before it, if p is within its pages or the guard page after.
static const RegionBlock *region_block_at(const char *p) {
    auto it = region_blocks.upper_bound((uintptr_t)p);
    if (it == region_blocks.begin()) return NULL;
    --it;
    const RegionBlock &b = it->second;
    return p < b.ptr + pages_of(b.bytes) + PAGE ? &b : NULL;
}

static void region_block_canaries(const RegionBlock &b, const char *after_what) {
    for (size_t i = b.bytes; i < pages_of(b.bytes); i++)
        if ((unsigned char)b.ptr[i] != CANARY)
            die("%s wrote past the end of block #%ld of the device's region (%zu bytes at %p), into the slack "
                "before its guard page", after_what, b.serial, b.bytes, (void *)b.ptr);
}

void emu::check_canaries(const char *after_what) {
    for (const auto &kv : region_blocks)
        if (kv.second.live) region_block_canaries(kv.second, after_what);
    for (const Alloc *a : live_allocs) {
        size_t where = 0;
        if (!canaries_intact(a, &where))
            die("%s wrote outside %s allocation #%ld (%zu bytes at %p): %s", after_what, kind_name(a->kind), a->serial,
                a->bytes, (void *)a->ptr,
                where < a->bytes ? "before its start" : "past its end, into the slack before the guard page");
    }
}

static void free_mapping(Alloc *a) {
    a->freed = true;
    madvise(a->map, a->map_len, MADV_DONTNEED);
    mprotect(a->map, a->map_len, PROT_NONE);
    auto it = std::find(live_allocs.begin(), live_allocs.end(), a);
    if (it != live_allocs.end()) live_allocs.erase(it);  // a region is not among them: its blocks are
}

static Alloc *live_alloc_at(void *ptr, MemKind kind) {
    const Alloc *c = find_alloc(ptr);
    if (!c || c->freed || c->ptr != ptr || c->kind != kind) return NULL;
    return const_cast<Alloc *>(c);
}

// ---- faults ------------------------------------------------------------------------------------------

// addr2line of the faulting instruction (the emulator's binaries keep -g)
static void print_source_of(void *pc) {
    Dl_info info;
    if (!dladdr(pc, &info) || !info.dli_fname) return;
    char cmd[1024];
    uintptr_t off = (uintptr_t)pc - (uintptr_t)info.dli_fbase;
    snprintf(cmd, sizeof cmd, "addr2line -C -f -i -e '%s' 0x%lx 1>&2", info.dli_fname, (unsigned long)off);
    fprintf(stderr, "cuda emulator: the access is at:\n");
    fflush(stderr);
    if (system(cmd) != 0) fprintf(stderr, "  (addr2line failed: pc %p in %s)\n", pc, info.dli_fname);
}

static void on_fault(int sig, siginfo_t *si, void *uc_) {
    ucontext_t *uc = (ucontext_t *)uc_;
    void *pc = (void *)uc->uc_mcontext.gregs[REG_RIP];
    const char *addr = (const char *)si->si_addr;
    std::string who = running_kernel_text();
    if (who.empty()) who = "host code";
    const Alloc *a = find_alloc(addr);
    int slot = stack_guard_hit(addr);
    char text[1024];
    const RegionBlock *rb = a && a->region && !a->freed ? region_block_at(addr) : NULL;
    if (rb && !rb->live)
        snprintf(text, sizeof text, "%s touched block #%ld of the device's region (%zu bytes at %p) after the arena "
                 "took it back, at %p: work the release did not wait for (another stream's?) still used it",
                 who.c_str(), rb->serial, rb->bytes, (void *)rb->ptr, (const void *)addr);
    else if (rb)
        snprintf(text, sizeof text, "%s read or wrote %zu bytes past the end of block #%ld of the device's region "
                 "(%zu bytes at %p), into its guard page", who.c_str(), (size_t)(addr - (rb->ptr + rb->bytes)),
                 rb->serial, rb->bytes, (void *)rb->ptr);
    else if (a && a->region && addr >= a->ptr && addr < a->ptr + a->bytes)
        snprintf(text, sizeof text, "%s touched the device's region at offset %zu, where no block is lent", who.c_str(),
                 (size_t)(addr - a->ptr));
    else if (a && a->freed)
        snprintf(text, sizeof text, "%s touched freed %s allocation #%ld (%zu bytes at %p), at %p", who.c_str(),
                 kind_name(a->kind), a->serial, a->bytes, (void *)a->ptr, (const void *)addr);
    else if (a && addr >= a->ptr + a->bytes)
        snprintf(text, sizeof text, "%s read or wrote %zu bytes past the end of %s allocation #%ld (%zu bytes at %p)",
                 who.c_str(), (size_t)(addr - (a->ptr + a->bytes)), kind_name(a->kind), a->serial, a->bytes,
                 (void *)a->ptr);
    else if (a)
        snprintf(text, sizeof text, "%s read or wrote %zu bytes before the start of %s allocation #%ld (%zu bytes at %p)",
                 who.c_str(), (size_t)(a->ptr - addr), kind_name(a->kind), a->serial, a->bytes, (void *)a->ptr);
    else if (slot >= 0)
        snprintf(text, sizeof text, "%s overflowed its fiber stack (%d KiB)", who.c_str(), 64);
    else if (sig == SIGSEGV && si->si_code == SI_KERNEL && !addr)
        // x86 reports no address for a general-protection fault, which is
        // what an aligned 16-byte access (a Pack, int4, float4) makes at an
        // address that is not 16-byte aligned: on a GPU, a misaligned address error
        snprintf(text, sizeof text, "%s made a general-protection fault: most likely a 16-byte (vector) load or "
                 "store at an address not 16-byte aligned (on a GPU: misaligned address)", who.c_str());
    else
        snprintf(text, sizeof text, "%s: %s at %p, outside every device allocation", who.c_str(),
                 sig == SIGSEGV ? "segmentation fault" : "bus error", (const void *)addr);
    fprintf(stderr, "cuda emulator (rank %d): %s\n", world_rank(), text);
    print_source_of(pc);
    fflush(stderr);
    _exit(70);
}

// Installed again whenever someone else took the signals over since (a
// test framework that turns a crash into a failed test would leave the
// stream's work half done, and the next wait would spin for ever).
static void install_fault_handler() {
    struct sigaction now = {};
    sigaction(SIGSEGV, NULL, &now);
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault) return;
    static char alt[1 << 16];
    stack_t ss = {};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    sigaltstack(&ss, NULL);
    struct sigaction sa = {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}

// ---- streams and the scheduler -----------------------------------------------------------------------

struct EmuStream {
    unsigned flags;
    int priority;
    bool legacy, destroyed;
    std::deque<OpRef> queue;   // not yet done, in order; the head may be in flight
    OpRef tail;                // the last operation queued
    double clock_us;           // device time at which the stream is free
    int id;
};

struct EmuEvent {
    unsigned flags;
    OpRef record;  // the last record; NULL until recorded
    bool destroyed;
};

static EmuStream legacy_stream = {0, 0, true, false, {}, NULL, 0, 0};
static std::vector<EmuStream *> streams = {&legacy_stream};
static int streams_made;

static EmuStream *stream_of(cudaStream_t s) { return s ? (EmuStream *)s : &legacy_stream; }

static bool blocking(const EmuStream *s) { return !s->legacy && !(s->flags & cudaStreamNonBlocking); }

OpRef emu::enqueue(cudaStream_t handle, OpRef op) {
    EmuStream *s = stream_of(handle);
    if (s->destroyed) die("%s queued on a destroyed stream", op->what.c_str());
    op->enqueue_us = now_us();
    // CUDA's legacy default stream waits for the blocking streams and they for it
    if (s->legacy) {
        for (EmuStream *o : streams)
            if (blocking(o) && o->tail && !o->tail->done) op->deps.push_back(o->tail);
    } else if (blocking(s) && legacy_stream.tail && !legacy_stream.tail->done) {
        op->deps.push_back(legacy_stream.tail);
    }
    s->queue.push_back(op);
    s->tail = op;
    if (oplog_wanted()) op->log_index = log_line(s->id, op->what);
    return op;
}

static bool may_start(const OpRef &op) {
    if (op->started) return false;
    for (const OpRef &d : op->deps)
        if (!d->done) return false;
    return true;
}

static void finish(EmuStream *s, const OpRef &op) {
    op->done = true;
    op->end_us = op->start_us + (now_us() - op->host_start_us);
    s->clock_us = op->end_us;
    if (op->log_index >= 0) {
        LogLine &l = oplog[(size_t)op->log_index];
        l.start_us = op->start_us, l.end_us = op->end_us, l.ran = true;
    }
    s->queue.pop_front();
    check_canaries(op->what.c_str());
}

static void begin(EmuStream *s, const OpRef &op) {
    double t = std::max(op->enqueue_us, s->clock_us);
    for (const OpRef &d : op->deps) t = std::max(t, d->end_us);
    op->start_us = t;
    op->host_start_us = now_us();
    op->started = true;
}

// One step: starts one operation that may start (drawn at random), or
// completes a collective in flight. Returns false when nothing moved.
static bool step() {
    std::vector<EmuStream *> ready;
    bool moved = false;
    for (EmuStream *s : streams) {
        if (s->queue.empty()) continue;
        const OpRef &head = s->queue.front();
        if (head->started && head->test && head->test()) {
            finish(s, head);
            moved = true;
        } else if (may_start(head)) {
            ready.push_back(s);
        }
    }
    if (ready.empty()) return moved;
    EmuStream *s = ready[random_u64() % ready.size()];
    OpRef op = s->queue.front();
    begin(s, op);
    if (op->start) {
        op->start();
    } else {
        if (op->run) op->run();
        finish(s, op);
    }
    return true;
}

static bool anything_queued() {
    for (EmuStream *s : streams)
        if (!s->queue.empty()) return true;
    return false;
}

// Runs queued work until done() holds. Nothing can move only while a
// collective waits for its peers: then it polls.
static void progress_until(const std::function<bool()> &done) {
    while (!done()) {
        if (step()) continue;
        if (!anything_queued()) die("waiting for work that was never queued");
        sched_yield();
    }
}

void emu::flush_started() {
    Lock l;
    for (;;) {
        bool any = false;
        for (EmuStream *s : streams)
            if (!s->queue.empty() && may_start(s->queue.front())) any = true;
        if (!any) return;
        step();
    }
}

bool emu::progress_once() {
    Lock l;
    return step();
}

// "host_wait" counts the times the host waited for unfinished device work:
// a blocking sync that found work queued, or a first poll (cudaStreamQuery,
// cudaEventQuery) that found its target unfinished (the polls after it, on
// the same target, are the same wait).
static const void *polled;
static void count_wait(bool done, const void *target, bool poll) {
    if (done) {
        if (poll && polled == target) polled = NULL;
        return;
    }
    if (!poll || polled != target) {
        count_call("host_wait");
        if (oplog_wanted()) log_line(-1, "host_wait");
    }
    if (poll) polled = target;
}

static OpRef make_op(std::string what, std::function<void()> run) {
    OpRef op = std::make_shared<Op>();
    op->what = std::move(what);
    op->run = std::move(run);
    return op;
}

static void sync_op(const OpRef &op) {
    progress_until([&] { return op->done; });
}

// ---- kernels --------------------------------------------------------------------------------------

void emu::launch(const LaunchSite &site, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                 std::function<void()> body) {
    Lock l;
    count_call("kernel launch");
    install_fault_handler();
    check_launch(site, grid, block, shmem);
    char what[512];
    snprintf(what, sizeof what, "kernel %s (launched at %s:%d)", site.name, site.file, site.line);
    LaunchSite copy = site;
    enqueue(stream, make_op(what, [copy, grid, block, shmem, body]() { run_grid(copy, grid, block, shmem, body); }));
}

// ---- the API --------------------------------------------------------------------------------------

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    COUNT();
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    COUNT();
    return ret(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    COUNT();
    if (device != 0) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuda emulator");
    // one emulated GPU per process: ranks never share one
    uint64_t id = ((uint64_t)getpid() << 20) ^ (uint64_t)gethostid();
    memcpy(p->uuid.bytes, &id, sizeof id);
    memcpy(p->uuid.bytes + 8, "emulator", 8);
    p->totalGlobalMem = DEVICE_BYTES;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;  // an H100's, as the launch check allows (emu_threads.cpp)
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    *least = 0, *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    return func ? cudaSuccess : ret(cudaErrorInvalidDeviceFunction);
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    Lock l;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0) return ret(cudaErrorInvalidValue);
    set_dynamic_smem_optin(func, value);
    return cudaSuccess;
}

// Device memory within DEVICE_BYTES, between guard pages (the lock held).
static cudaError_t device_alloc(void **ptr, size_t bytes) {
    install_fault_handler();
    *ptr = NULL;
    if (bytes > DEVICE_BYTES - device_in_use) return ret(cudaErrorMemoryAllocation);
    Alloc *a = new_mapping(bytes, MEM_DEVICE);
    if (!a) return ret(cudaErrorMemoryAllocation);
    device_in_use += bytes;
    *ptr = a->ptr;
    return cudaSuccess;
}

static void device_free(Alloc *a) {
    device_in_use -= a->bytes;
    free_mapping(a);
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    Lock l;
    COUNT();
    return device_alloc(ptr, bytes);
}

cudaError_t cudaFree(void *ptr) {
    Lock l;
    COUNT();
    if (!ptr) return cudaSuccess;
    Alloc *a = live_alloc_at(ptr, MEM_DEVICE);
    if (!a) return ret(cudaErrorInvalidValue);
    device_free(a);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags) {
    Lock l;
    COUNT();
    *ptr = NULL;
    Alloc *a = new_mapping(bytes, MEM_PINNED);
    if (!a) return ret(cudaErrorMemoryAllocation);
    *ptr = a->ptr;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void *ptr) {
    Lock l;
    COUNT();
    if (!ptr) return cudaSuccess;
    Alloc *a = live_alloc_at(ptr, MEM_PINNED);
    if (!a) return ret(cudaErrorInvalidValue);
    free_mapping(a);
    return cudaSuccess;
}

// Stream-ordered: the memory is there for work queued after this on the
// stream; the free waits for the work queued before it.
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream) {
    Lock l;
    COUNT();
    (void)stream;  // freed memory is never reused, so it is ready for any stream at once
    return device_alloc(ptr, bytes);
}
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
    Lock l;
    COUNT();
    if (!ptr) return cudaSuccess;
    if (!live_alloc_at(ptr, MEM_DEVICE)) return ret(cudaErrorInvalidValue);
    enqueue(stream, make_op("cudaFreeAsync", [ptr]() { device_free(live_alloc_at(ptr, MEM_DEVICE)); }));
    return cudaSuccess;
}

// The workbench's device region (see "the workbench's device region" above).
cudaError_t emuReserveRegion(void **ptr, size_t bytes) {
    Lock l;
    COUNT();
    install_fault_handler();
    *ptr = NULL;
    if (bytes == 0 || bytes > DEVICE_BYTES - device_in_use) return ret(cudaErrorMemoryAllocation);
    size_t len = pages_of(bytes) + 2 * GUARD;
    void *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
    char *map = (char *)m;
    Alloc &a = allocs[(uintptr_t)map];
    a = Alloc{map + GUARD, bytes, map, len, MEM_DEVICE, false, ++alloc_serial, true};
    device_in_use += bytes;
    *ptr = a.ptr;
    return cudaSuccess;
}

cudaError_t emuRegionBlock(void *ptr, size_t bytes, int handed_out, cudaStream_t stream) {
    Lock l;
    COUNT();
    char *p = (char *)ptr;
    const Alloc *a = find_alloc(p);
    if (!a || !a->region || a->freed || p < a->ptr || bytes == 0 || p + pages_of(bytes) > a->ptr + pages_of(a->bytes) ||
        ((uintptr_t)p - (uintptr_t)a->ptr) % PAGE)
        return ret(cudaErrorInvalidValue);
    size_t open = pages_of(bytes);
    if (handed_out) {
        long serial = ++alloc_serial;
        enqueue(stream, make_op("region block handed out", [p, bytes, open, serial]() {
            // records of earlier blocks over these pages say nothing any more
            for (auto it = region_blocks.begin(); it != region_blocks.end();) {
                const RegionBlock &b = it->second;
                bool overlaps = b.ptr < p + open + PAGE && p < b.ptr + pages_of(b.bytes) + PAGE;
                it = overlaps ? region_blocks.erase(it) : std::next(it);
            }
            mprotect(p, open, PROT_READ | PROT_WRITE);
            memset(p, 0xff, bytes);
            memset(p + bytes, CANARY, open - bytes);
            region_blocks[(uintptr_t)p] = RegionBlock{p, bytes, true, serial};
        }));
    } else {
        enqueue(stream, make_op("region block taken back", [p, open]() {
            auto it = region_blocks.find((uintptr_t)p);
            if (it != region_blocks.end()) {
                region_block_canaries(it->second, "work before the block was taken back");
                it->second.live = false;
            }
            madvise(p, open, MADV_DONTNEED);
            mprotect(p, open, PROT_NONE);
        }));
    }
    return cudaSuccess;
}

// One pool per device; what it keeps after a free does not change here (freed
// memory is never reused), so its attributes are accepted and kept.
struct EmuMemPool {
    uint64_t release_threshold;
};
static EmuMemPool default_pool;
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
    if (device != 0) return ret(cudaErrorInvalidDevice);
    *pool = &default_pool;
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
    if (pool != &default_pool || attr != cudaMemPoolAttrReleaseThreshold) return ret(cudaErrorInvalidValue);
    memcpy(&pool->release_threshold, value, sizeof pool->release_threshold);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    Lock l;
    *total_bytes = DEVICE_BYTES;
    *free_bytes = DEVICE_BYTES - device_in_use;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr) {
    Lock l;
    memset(attr, 0, sizeof *attr);
    const Alloc *a = find_alloc(ptr);
    if (!a || a->freed || (const char *)ptr < a->ptr || (const char *)ptr >= a->ptr + std::max(a->bytes, (size_t)1)) {
        attr->type = cudaMemoryTypeUnregistered;
        attr->hostPointer = (void *)ptr;
        return cudaSuccess;
    }
    attr->type = a->kind == MEM_DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attr->devicePointer = (void *)ptr;
    attr->hostPointer = a->kind == MEM_PINNED ? (void *)ptr : NULL;
    return cudaSuccess;
}

// ---- copies --------------------------------------------------------------------------------------------

enum Where { HOST_PAGEABLE, HOST_PINNED, DEVICE };
static const char *where_name(Where w) {
    return w == HOST_PAGEABLE ? "pageable host" : w == HOST_PINNED ? "pinned host" : "device";
}
static Where where_is(const void *p, size_t bytes, const char *role, const char *call) {
    const Alloc *a = find_alloc(p);
    if (!a) return HOST_PAGEABLE;
    if (a->freed) die("%s: the %s (%p) is freed %s memory", call, role, p, kind_name(a->kind));
    if ((const char *)p < a->ptr || (const char *)p + bytes > a->ptr + a->bytes)
        die("%s: %zu bytes at the %s (%p) run past %s allocation #%ld (%zu bytes at %p)", call, bytes, role, p,
            kind_name(a->kind), a->serial, a->bytes, (void *)a->ptr);
    return a->kind == MEM_DEVICE ? DEVICE : HOST_PINNED;
}

static cudaError_t copy_async(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                              cudaStream_t stream, const char *call) {
    if (bytes == 0) return cudaSuccess;
    Where d = where_is(dst, bytes, "destination", call), s = where_is(src, bytes, "source", call);
    bool dst_dev = d == DEVICE, src_dev = s == DEVICE;
    static const bool expect_dst[] = {false, true, false, true}, expect_src[] = {false, false, true, true};
    if (kind != cudaMemcpyDefault && (expect_dst[kind] != dst_dev || expect_src[kind] != src_dev))
        die("%s: the direction given (%d) does not match the pointers (destination on the %s, source on the %s)",
            call, (int)kind, dst_dev ? "device" : "host", src_dev ? "device" : "host");
    char what[160];
    snprintf(what, sizeof what, "%s of %zu bytes (%s -> %s)", call, bytes, where_name(s), where_name(d));
    // over PCIe from or to pageable memory the driver copies through a
    // bounce buffer of its own, and the call waits for it (EMU_STATS counts them)
    if ((s == HOST_PAGEABLE && d == DEVICE) || (s == DEVICE && d == HOST_PAGEABLE)) count_call("copy_pageable_host");
    if (s == HOST_PAGEABLE && d != HOST_PAGEABLE) {
        // from pageable memory CUDA stages the source before returning
        std::shared_ptr<std::vector<char>> staged = std::make_shared<std::vector<char>>((const char *)src,
                                                                                         (const char *)src + bytes);
        enqueue(stream, make_op(what, [dst, staged]() { memcpy(dst, staged->data(), staged->size()); }));
        return cudaSuccess;
    }
    OpRef op = enqueue(stream, make_op(what, [dst, src, bytes]() { memmove(dst, src, bytes); }));
    // into pageable memory the call returns once the copy is done
    if (d == HOST_PAGEABLE) sync_op(op);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    Lock l;
    COUNT();
    return copy_async(dst, src, bytes, kind, stream, "cudaMemcpyAsync");
}

// Both sides on the device (what the trainers ask of it): each side's span
// checked against its allocation, the rows moved as one operation on the stream.
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
    Lock l;
    COUNT();
    const char *call = "cudaMemcpy2DAsync";
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > dpitch || width > spitch) die("%s: width %zu is wider than a pitch (%zu, %zu)", call, width, dpitch, spitch);
    size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
    if (where_is(dst, dspan, "destination", call) != DEVICE || where_is(src, sspan, "source", call) != DEVICE)
        die("%s: the emulator copies device to device only", call);
    if (kind != cudaMemcpyDefault && kind != cudaMemcpyDeviceToDevice)
        die("%s: the direction given (%d) is not device to device", call, (int)kind);
    char what[160];
    snprintf(what, sizeof what, "%s of %zu rows of %zu bytes", call, height, width);
    enqueue(stream, make_op(what, [=]() {
                for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
            }));
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    Lock l;
    COUNT();
    cudaError_t e = copy_async(dst, src, bytes, kind, NULL, "cudaMemcpy");
    if (legacy_stream.tail) sync_op(legacy_stream.tail);
    return e;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
    Lock l;
    COUNT();
    if (bytes == 0) return cudaSuccess;
    if (where_is(dst, bytes, "destination", "cudaMemsetAsync") != DEVICE) return ret(cudaErrorInvalidValue);
    char what[96];
    snprintf(what, sizeof what, "cudaMemsetAsync of %zu bytes", bytes);
    enqueue(stream, make_op(what, [dst, value, bytes]() { memset(dst, value, bytes); }));
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, NULL);
    Lock l;
    if (legacy_stream.tail) sync_op(legacy_stream.tail);
    return e;
}

// ---- streams ---------------------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority) {
    Lock l;
    COUNT();
    EmuStream *s = new EmuStream{flags, priority, false, false, {}, NULL, 0, ++streams_made};
    streams.push_back(s);
    *stream = (cudaStream_t)s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    return cudaStreamCreateWithPriority(stream, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags) {
    *flags = stream_of(stream)->flags;
    return cudaSuccess;
}

// Work still queued runs; the stream is released after it (never reused here).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    Lock l;
    COUNT();
    EmuStream *s = stream_of(stream);
    if (s->legacy || s->destroyed) return ret(cudaErrorInvalidResourceHandle);
    s->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    Lock l;
    COUNT();
    EmuStream *s = stream_of(stream);
    count_wait(!s->tail || s->tail->done, s, false);
    if (s->tail) sync_op(s->tail);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    Lock l;
    EmuStream *s = stream_of(stream);
    bool done = !s->tail || s->tail->done;
    count_wait(done, s, true);
    if (done) return cudaSuccess;
    step();
    if (!s->tail->done) return cudaErrorNotReady;
    polled = NULL;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    Lock l;
    COUNT();
    EmuEvent *e = (EmuEvent *)event;
    if (!e || e->destroyed) return ret(cudaErrorInvalidResourceHandle);
    if (!e->record) return cudaSuccess;  // never recorded: nothing to wait for
    OpRef op = make_op("cudaStreamWaitEvent", NULL);
    op->deps.push_back(e->record);
    enqueue(stream, op);
    return cudaSuccess;
}

// The function runs when the stream reaches it, on the thread that runs the queue.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
    Lock l;
    COUNT();
    if (!fn) return ret(cudaErrorInvalidValue);
    enqueue(stream, make_op("host function", [fn, userData]() { fn(userData); }));
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    Lock l;
    COUNT();
    count_wait(!anything_queued(), NULL, false);
    progress_until([] { return !anything_queued(); });
    return cudaSuccess;
}

// ---- events ---------------------------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    Lock l;
    COUNT();
    *event = (cudaEvent_t) new EmuEvent{flags, NULL, false};
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    Lock l;
    COUNT();
    EmuEvent *e = (EmuEvent *)event;
    if (!e || e->destroyed) return ret(cudaErrorInvalidResourceHandle);
    e->destroyed = true;  // kept: a handle used after this is found
    e->record = NULL;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    Lock l;
    COUNT();
    EmuEvent *e = (EmuEvent *)event;
    if (!e || e->destroyed) return ret(cudaErrorInvalidResourceHandle);
    e->record = enqueue(stream, make_op("cudaEventRecord", NULL));
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    Lock l;
    COUNT();
    EmuEvent *e = (EmuEvent *)event;
    if (!e || e->destroyed) return ret(cudaErrorInvalidResourceHandle);
    bool done = !e->record || e->record->done;
    count_wait(done, e, true);
    if (done) return cudaSuccess;
    step();  // a poll lets the device move on by one operation
    if (!e->record->done) return cudaErrorNotReady;
    polled = NULL;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    Lock l;
    COUNT();
    EmuEvent *e = (EmuEvent *)event;
    if (!e || e->destroyed) return ret(cudaErrorInvalidResourceHandle);
    count_wait(!e->record || e->record->done, e, false);
    if (e->record) sync_op(e->record);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    Lock l;
    COUNT();
    EmuEvent *a = (EmuEvent *)start, *b = (EmuEvent *)end;
    if (!a || !b || a->destroyed || b->destroyed) return ret(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
    if (!a->record || !b->record) return ret(cudaErrorInvalidResourceHandle);
    if (!a->record->done || !b->record->done) return ret(cudaErrorNotReady);
    *ms = (float)((b->record->end_us - a->record->end_us) / 1000.0);
    return cudaSuccess;
}

// ---- errors ---------------------------------------------------------------------------------------------------

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "error in the cuda emulator";
    }
}

}  // extern "C"
