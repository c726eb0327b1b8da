// mpirun: 2
// test_ckpt_save.c: saves that fail or meet another run's checkpoint, on 2
// ranks. A failed save (a folder that cannot be made, one rank past its file
// size limit) and an interrupted one leave the last good checkpoint in place
// and loadable; a step folder that exists, whoever wrote it, is never
// written into (issue 39 item 1: a failed save into it replaced one rank's
// part, and a run of fewer ranks replaced the manifest and left the other
// parts behind). The checkpoint a SIGTERM's line names is the one `latest`
// names, from the moment of the commit, and a SIGTERM during a flush that
// outlasts mpirun's second before SIGKILL is acted on at once. Every
// assertion is on values reduced over the ranks.
#define TEST_WITH_MPI
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "testutil.h"
#include "ckpt.h"
#include "comm.h"
#include "stop.h"
#include "ckpt_fixture.h"

// A save with rank 1 under a file size limit below its part (1 KB; SIGXFSZ
// ignored, so its write fails with EFBIG), as on a disk that fills while
// rank 0 has written its part: rank 0 writes, rank 1 cannot.
static int save_rank1_limited(Ctx *c, const char *dir, long step, Tensors *x, char *err) {
    struct rlimit was;
    getrlimit(RLIMIT_FSIZE, &was);
    void (*handler)(int) = SIG_DFL;
    if (c->world.rank == 1) {
        handler = signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &(struct rlimit){1024, was.rlim_max});
    }
    int rc = save(c, dir, step, x, err);
    if (c->world.rank == 1) {
        setrlimit(RLIMIT_FSIZE, &was);
        signal(SIGXFSZ, handler);
    }
    return rc;
}

static int exists(const char *dir, const char *name) {
    char path[PATH_LEN + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return lstat(path, &st) == 0;
}

static void test_failed_save_keeps_latest(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], file[PATH_LEN], cmd[3 * PATH_LEN], err[512] = "";
    Tensors a, b;
    tensors_make(&a, c->world.rank, 1);
    tensors_make(&b, c->world.rank, 2);

    // the checkpoint folder is a regular file
    test_dir(c, "a_file", file);
    snprintf(cmd, sizeof cmd, "touch %s", file);
    on_rank0(c, cmd);
    int rc = save(c, file, 10, &a, err);
    assert_true(all_ranks(c, rc != 0 && strstr(err, "cannot create checkpoint folder")));

    // the step folder cannot be made: a file is in its place
    test_dir(c, "failed_save", dir);
    assert_true(all_ranks(c, save(c, dir, 10, &a, err) == 0));
    snprintf(cmd, sizeof cmd, "touch %s/step-00000020", dir);
    on_rank0(c, cmd);
    rc = save(c, dir, 20, &b, err);
    assert_true(all_ranks(c, rc != 0 && strstr(err, "step-00000020")));
    assert_true(still_step10(c, dir));

    // only rank 1 cannot write its part: everyone fails with rank 1's message,
    // and nothing of the save is left
    rc = save_rank1_limited(c, dir, 30, &b, err);
    int ok = rc != 0 && strstr(err, "cannot write checkpoint") &&
             strstr(err, "step-00000030/rank-00001.bin");
    if (!all_ranks(c, ok)) fail_msg("unexpected: %d '%s'", rc, err);
    assert_true(still_step10(c, dir));
    assert_false(exists(dir, "step-00000030") || exists(dir, "step-00000030.partial"));
    tensors_free(&a);
    tensors_free(&b);
}

// A crash mid-save leaves a step folder with partial or even complete parts
// but no manifest and no new `latest`: loading must not notice it.
static void test_interrupted_save_is_invisible(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], cmd[3 * PATH_LEN], err[512] = "";
    test_dir(c, "interrupted", dir);
    Tensors a;
    tensors_make(&a, c->world.rank, 1);
    assert_true(all_ranks(c, save(c, dir, 10, &a, err) == 0));
    assert_true(snprintf(cmd, sizeof cmd,
             "mkdir -p %s/step-00000020"
             " && head -c 100 /dev/urandom > %s/step-00000020/rank-00000.bin.tmp"
             " && cp %s/step-00000010/rank-00001.bin %s/step-00000020/rank-00001.bin"
             " && echo -n step-000 > %s/latest.tmp", dir, dir, dir, dir, dir) < (int)sizeof cmd);
    on_rank0(c, cmd);
    assert_true(still_step10(c, dir));
    tensors_free(&a);
}

// A save into a step folder that exists fails and leaves it as it was: one
// of the same ranks that fails on rank 1 (the full disk), and one of
// another run at 1 rank (which replaced part 0 and the manifest).
static void test_existing_step_never_written(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    test_dir(c, "existing_step", dir);
    Tensors a, b;
    tensors_make(&a, c->world.rank, 1);
    tensors_make(&b, c->world.rank, 2);
    assert_true(all_ranks(c, save(c, dir, 10, &a, err) == 0));

    int rc = save_rank1_limited(c, dir, 10, &b, err);
    assert_true(all_ranks(c, rc != 0));
    if (!still_step10(c, dir)) fail_msg("a failed save at the same step damaged it: '%s'", err);

    int refused = 1;
    if (c->world.rank == 0) {
        Comm self = {.mpi = MPI_COMM_SELF, .rank = 0, .size = 1};
        CkptManifest m = manifest(10, 1);
        refused = ckpt_save(&self, dir, &m, b.t, 2, err, sizeof err) != 0 &&
                  strstr(err, "step-00000010 already exists") && strstr(err, "never replaces it");
        if (!refused) print_message("1 rank's save at step 10: '%s'\n", err);
    }
    assert_true(all_ranks(c, refused));
    if (!still_step10(c, dir)) fail_msg("another run's save at the same step replaced it");
    tensors_free(&a);
    tensors_free(&b);
}

// The .partial folder of a save that was killed (its parts, a temporary
// manifest) is cleared by the next save of that step, which then loads.
static void test_killed_save_leftover_cleared(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], cmd[3 * PATH_LEN], err[512] = "";
    test_dir(c, "leftover", dir);
    assert_true(snprintf(cmd, sizeof cmd, "mkdir -p %s/step-00000010.partial && cd %s/step-00000010.partial && "
                         "head -c 100 /dev/urandom > rank-00000.bin && head -c 10 /dev/urandom > rank-00003.bin.tmp && "
                         "echo x > manifest.txt.tmp", dir, dir) < (int)sizeof cmd);
    on_rank0(c, cmd);
    Tensors a;
    tensors_make(&a, c->world.rank, 1);
    int rc = save(c, dir, 10, &a, err);
    if (!all_ranks(c, rc == 0)) fail_msg("save over a leftover: '%s'", err);
    assert_true(still_step10(c, dir));
    assert_false(exists(dir, "step-00000010.partial"));
    tensors_free(&a);
}

static void *idle_thread(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

// What rank 0's line says when SIGTERM stops it now, with this process's
// notes (stop.h): a child catches the signals as a trainer does and is sent
// SIGTERM. When `held`, the signal comes while the child holds it back and
// notes step 7 a moment later; a thread of its own, as a trainer's OpenMP
// and MPI threads, is where the kernel delivers it then. The child's stderr,
// or NULL when it did not end by the signal.
static char *sigterm_line(int held) {
    int fds[2];
    if (pipe(fds) != 0) return NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        stop_catch_signals(0);
        pthread_t other;
        if (held && pthread_create(&other, NULL, idle_thread, NULL) != 0) _exit(4);
        if (held) stop_hold();
        kill(getpid(), SIGTERM);
        if (held) {
            usleep(200 * 1000);  // the other thread's handler has long run by now
            stop_note_checkpoint("held", 7);
            stop_release();
        }
        _exit(3);
    }
    close(fds[1]);
    static char text[8192];
    size_t len = 0;
    for (ssize_t got; (got = read(fds[0], text + len, sizeof text - 1 - len)) > 0;) len += (size_t)got;
    text[len] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? text : NULL;
}

static int line_names(const char *line, const char *dir, long step) {
    char want[PATH_LEN + 64];
    snprintf(want, sizeof want, "; resume with --resume %s (step %ld)", dir, step);
    if (line && strstr(line, want)) return 1;
    print_message("expected '%s' in the SIGTERM line: %s", want, line ? line : "(the child did not end by SIGTERM)\n");
    return 0;
}

// Issue 39 item 22's test saw a run stopped by SIGTERM name the checkpoint
// at step 518 while `latest` named step 520: the trainer noted a save after
// ckpt_save returned, and rank 0 was signalled in between. The save notes
// its commit itself; a signal that comes while it moves `latest` and notes
// it waits, on whichever thread it lands.
static void test_sigterm_line_names_the_commit(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    test_dir(c, "sigterm_line", dir);
    Tensors a;
    tensors_make(&a, c->world.rank, 1);
    int ok = 1;
    for (long step = 10; step <= 20; step += 10) {
        assert_true(all_ranks(c, save(c, dir, step, &a, err) == 0));
        if (c->world.rank == 0) ok = ok && line_names(sigterm_line(0), dir, step);
    }
    if (c->world.rank == 0) ok = ok && line_names(sigterm_line(1), "held", 7);
    assert_true(all_ranks(c, ok));
    tensors_free(&a);
}

// A flush on a busy disk: this binary's fsync, while slow_flush is set,
// keeps its thread 3 s where no SIGTERM or SIGINT is handled, as a thread
// inside the kernel's fsync is (ext4's journal commit took more than a
// second beside other tests' writes), then flushes.
static volatile sig_atomic_t slow_flush;

int fsync(int fd) {
    if (slow_flush) {
        sigset_t stops, before;
        sigemptyset(&stops);
        sigaddset(&stops, SIGTERM);
        sigaddset(&stops, SIGINT);
        pthread_sigmask(SIG_BLOCK, &stops, &before);
        sleep(3);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
    }
    return (int)syscall(SYS_fsync, fd);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The CI failure of stop 52: mpirun sends SIGKILL 1 s after its SIGTERM,
// and a rank whose main thread was inside a checkpoint's fsync handled the
// SIGTERM only after it, so it was killed without its line and left its
// temporary files. stop_fsync flushes on a thread of its own: a child that
// catches the signals as a trainer does, sent SIGTERM 0.2 s into a 3 s
// flush, ends by it (its handler ran) within the second.
static void test_sigterm_during_a_slow_flush(void **state) {
    Ctx *c = *state;
    int ok = 1;
    if (c->world.rank == 0) {
        char path[PATH_LEN];
        snprintf(path, sizeof path, "%s/slow-flush", c->root);
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            stop_catch_signals(1);  // not rank 0: no line, the process ends by the signal
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0) _exit(4);
            slow_flush = 1;
            if (write(ready[1], "x", 1) != 1) _exit(5);
            stop_fsync(fd);
            _exit(3);  // the flush returned before the signal was acted on
        }
        close(ready[1]);
        char byte;
        assert_int_equal(read(ready[0], &byte, 1), 1);
        close(ready[0]);
        usleep(200 * 1000);  // inside the flush by now
        double t0 = now_s();
        kill(pid, SIGTERM);
        int status = 0;
        waitpid(pid, &status, 0);
        double took = now_s() - t0;
        ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM && took < 1.0;
        if (!ok)
            print_message("a SIGTERM 0.2 s into a 3 s flush: the child ended %s %d after %.2f s (want SIGTERM, "
                          "within mpirun's 1 s)\n", WIFSIGNALED(status) ? "by signal" : "with exit status",
                          WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), took);
        unlink(path);
    }
    assert_true(all_ranks(c, ok));
}

int main(int argc, char **argv) {
    comm_single_copy_choose();  // as the trainers do (comm.h)
    MPI_Init(&argc, &argv);
    Ctx c;
    if (ckpt_fixture_init(&c, "test-ckpt-save")) {
        MPI_Finalize();
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_failed_save_keeps_latest, &c),
        cmocka_unit_test_prestate(test_interrupted_save_is_invisible, &c),
        cmocka_unit_test_prestate(test_existing_step_never_written, &c),
        cmocka_unit_test_prestate(test_killed_save_leftover_cleared, &c),
        cmocka_unit_test_prestate(test_sigterm_line_names_the_commit, &c),
        cmocka_unit_test_prestate(test_sigterm_during_a_slow_flush, &c),
    };
    int failed = run_mpi_tests(tests);
    if (c.world.rank == 0) test_remove_dir(c.root);
    MPI_Finalize();
    return failed;
}
