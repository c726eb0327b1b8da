// stop.c: files removed and one line printed however a run stops (see
// stop.h). A signal handler can reach only what is static, so this file
// keeps the one piece of global state of the runtime: what to remove and
// what to say. The handler calls only async-signal-safe functions (unlink,
// rmdir, write, sigaction, raise) and formats its numbers itself.
#include "stop.h"
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PATH_BYTES 4096
#define NOTE_BYTES (PATH_BYTES + 64)

extern char *program_invocation_short_name;

typedef struct Tracked {
    char path[PATH_BYTES];
    int is_folder;
    unsigned long order;         // when it was added: a folder made inside another goes first
    volatile sig_atomic_t used;  // set last, cleared first: the handler sees whole entries
} Tracked;

static struct {
    Tracked tracked[STOP_MAX_PATHS];
    unsigned long added;
    volatile long step;
    // two copies of the checkpoint's words, so that one is whole while the other is written
    char checkpoint[2][NOTE_BYTES];
    volatile sig_atomic_t current;  // -1: no checkpoint yet
    char task[2][NOTE_BYTES];        // a tool's words (stop_note_task), two copies as the checkpoint's
    volatile sig_atomic_t task_current;  // -1: none, the run's line
    volatile sig_atomic_t ending;   // the process is already on its way out (stop_ending)
    atomic_int held, pending;       // stop_hold's, and the signal that came meanwhile
    int rank;
} g_stop = {.current = -1, .task_current = -1};

void stop_ending(void) { g_stop.ending = 1; }

void stop_track(const char *path, int is_folder) {
    for (int i = 0; i < STOP_MAX_PATHS; i++) {
        Tracked *e = &g_stop.tracked[i];
        if (e->used) continue;
        snprintf(e->path, sizeof e->path, "%s", path);
        e->is_folder = is_folder;
        e->order = ++g_stop.added;
        e->used = 1;
        return;
    }
    // full: the file is still removed by the code that made it, when it gets there
}

void stop_forget(const char *path) {
    for (int i = 0; i < STOP_MAX_PATHS; i++)
        if (g_stop.tracked[i].used && strcmp(g_stop.tracked[i].path, path) == 0) g_stop.tracked[i].used = 0;
}

void stop_remove_files(void) {
    for (int i = 0; i < STOP_MAX_PATHS; i++) {  // files, then the folders they were in
        Tracked *e = &g_stop.tracked[i];
        if (e->used && !e->is_folder && (unlink(e->path) == 0 || errno == ENOENT)) e->used = 0;
    }
    // folders the latest added first, so that one made inside another is empty when its turn comes
    for (unsigned long before = (unsigned long)-1;;) {
        Tracked *latest = NULL;
        for (int i = 0; i < STOP_MAX_PATHS; i++) {
            Tracked *e = &g_stop.tracked[i];
            if (e->used && e->is_folder && e->order < before && (!latest || e->order > latest->order)) latest = e;
        }
        if (!latest) return;
        before = latest->order;
        if (rmdir(latest->path) == 0 || errno == ENOENT) latest->used = 0;
    }
}

void stop_note_step(long step) { g_stop.step = step; }

void stop_note_checkpoint(const char *dir, long step) {
    int next = g_stop.current == 0 ? 1 : 0;
    snprintf(g_stop.checkpoint[next], NOTE_BYTES, "resume with --resume %s (step %ld)", dir, step);
    g_stop.current = next;
}

void stop_note_task(const char *what) {
    if (!what) {
        g_stop.task_current = -1;
        return;
    }
    int next = g_stop.task_current == 0 ? 1 : 0;
    snprintf(g_stop.task[next], NOTE_BYTES, "%s", what);
    g_stop.task_current = next;
}

static sigset_t stop_signals(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    return set;
}

// A process-directed signal goes to any thread that does not block it (an
// OpenMP worker, MPI's progress thread), so the mask of the thread that
// holds keeps only its own system calls free of EINTR; `held` is what the
// handler sees on every thread. A signal that comes while held is left in
// `pending` for stop_release, or taken back by the handler when the release
// came between its two looks: whoever exchanges it out of `pending` acts.
void stop_hold(void) {
    sigset_t set = stop_signals();
    sigprocmask(SIG_BLOCK, &set, NULL);
    atomic_store(&g_stop.held, 1);
}

void stop_release(void) {
    atomic_store(&g_stop.held, 0);
    sigset_t set = stop_signals();
    sigprocmask(SIG_UNBLOCK, &set, NULL);  // one that came to this thread is handled here
    int sig = atomic_exchange(&g_stop.pending, 0);
    if (sig) raise(sig);
}

typedef struct Flush {
    int fd, rc, err;
} Flush;

static void *flush_thread(void *arg) {
    Flush *f = arg;
    f->rc = fsync(f->fd);
    f->err = errno;
    return NULL;
}

int stop_fsync(int fd) {
    Flush f = {.fd = fd};
    pthread_t thread;
    sigset_t stops = stop_signals(), before;
    pthread_sigmask(SIG_BLOCK, &stops, &before);  // the new thread starts with this mask
    int started = pthread_create(&thread, NULL, flush_thread, &f) == 0;
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (!started) return fsync(fd);  // no thread to be had: flushed here
    pthread_join(thread, NULL);
    errno = f.err;
    return f.rc;
}

// ---- the signal's line, built without stdio ----

typedef struct Line {
    char text[2 * NOTE_BYTES];
    size_t len;
} Line;

static void put(Line *l, const char *s) {
    while (*s && l->len + 1 < sizeof l->text) l->text[l->len++] = *s++;
}

static void put_long(Line *l, long v) {
    char digits[24];
    int n = 0;
    unsigned long u = v < 0 ? 0UL - (unsigned long)v : (unsigned long)v;
    do digits[n++] = (char)('0' + u % 10);
    while ((u /= 10) && n < (int)sizeof digits);
    if (v < 0) put(l, "-");
    while (n > 0 && l->len + 1 < sizeof l->text) l->text[l->len++] = digits[--n];
}

static void on_stop_signal(int sig) {
    if (atomic_load(&g_stop.held)) {
        atomic_store(&g_stop.pending, sig);
        if (atomic_load(&g_stop.held) || !atomic_exchange(&g_stop.pending, 0)) return;
    }
    int saved = errno;
    stop_remove_files();
    // a rank that is already ending (an error it printed, or the run's end)
    // and is stopped on the way out by mpirun has nothing to add
    if (g_stop.rank == 0 && !g_stop.ending) {
        static Line l;  // static: the handler's stack may be small
        l.len = 0;
        put(&l, program_invocation_short_name);
        put(&l, sig == SIGINT ? ": stopped by SIGINT " : ": stopped by SIGTERM ");
        int c = g_stop.current, t = g_stop.task_current;
        if (t >= 0) {
            put(&l, g_stop.task[t]);
        } else {
            put(&l, "after step ");
            put_long(&l, g_stop.step);
            put(&l, "; ");
            put(&l, c >= 0 ? g_stop.checkpoint[c] : "no checkpoint to resume from (--save DIR keeps one)");
        }
        for (int i = 0; i < STOP_MAX_PATHS; i++)
            if (g_stop.tracked[i].used) {
                put(&l, "; left behind: ");
                put(&l, g_stop.tracked[i].path);
            }
        put(&l, "\n");
        ssize_t w = write(STDERR_FILENO, l.text, l.len);
        (void)w;
    }
    errno = saved;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(sig, &dfl, NULL);
    raise(sig);  // ends the process as the signal would have
}

// ---- a crash: one line and the stack ----

static const char *crash_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV (segmentation fault: a pointer to memory the process does not own)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (arithmetic exception: an integer divided by zero?)";
    case SIGILL: return "SIGILL (illegal instruction)";
    default: return "SIGABRT (aborted)";
    }
}

// The frames go out as backtrace_symbols_fd writes them: "binary(+0xOFFSET)"
// for functions the dynamic symbol table lacks (static ones, and every one
// of a binary linked without -rdynamic); `addr2line -f -e binary 0xOFFSET`
// names them, as the labs' checker does.
static void on_crash_signal(int sig) {
    stop_remove_files();
    static Line l;  // static: the handler's stack may be small
    l.len = 0;
    put(&l, program_invocation_short_name);
    put(&l, ": rank ");
    put_long(&l, g_stop.rank);
    put(&l, ": crashed: ");
    put(&l, crash_name(sig));
    put(&l, "; its stack, innermost first:\n");
    ssize_t w = write(STDERR_FILENO, l.text, l.len);
    (void)w;
    void *frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(sig, &dfl, NULL);
    raise(sig);  // ends the process as the signal would have
}

// Under AddressSanitizer its own report names the line: it keeps the signals.
#if defined(__SANITIZE_ADDRESS__)
static void catch_crashes(void) {}
#else
static void catch_crashes(void) {
    static char alt[1 << 16];  // a stack overflow leaves none to run the handler on
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
    sigaltstack(&ss, NULL);
    void *warm[1];
    backtrace(warm, 1);  // loads what backtrace needs now, not inside the handler
    struct sigaction on = {.sa_handler = on_crash_signal, .sa_flags = SA_ONSTACK};
    sigemptyset(&on.sa_mask);
    const int crashes[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof crashes / sizeof crashes[0]; i++) sigaction(crashes[i], &on, NULL);
}
#endif

void stop_catch_signals(int rank) {
    catch_crashes();
    g_stop.rank = rank;
    struct sigaction on = {.sa_handler = on_stop_signal, .sa_mask = stop_signals()};
    sigaction(SIGTERM, &on, NULL);
    sigaction(SIGINT, &on, NULL);
}
