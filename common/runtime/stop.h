// stop.h: how a run ends when it does not finish. The files it made for
// itself (the swap files of the NVMe tier and their folders, the temporary
// file of a write in progress) are removed on every exit path the process
// controls: an error (exit_all, fail_rank, fail_at call stop_remove_files),
// and SIGTERM or SIGINT, after which rank 0 prints one line with the step
// reached and the checkpoint to resume from. Only SIGKILL leaves them, and
// mpirun sends it 1 s after its SIGTERM (odls_base_sigkill_timeout): a rank
// must act on the signal within that second, so it never waits on the disk
// where a signal cannot reach it (stop_fsync).
#pragma once

#define STOP_MAX_PATHS 32

// Removed however the run ends, until stop_forget (folders with rmdir, so
// only when empty; the latest added goes first). Paths up to 4095 bytes.
void stop_track(const char *path, int is_folder);
void stop_forget(const char *path);
// Removes what is tracked (async-signal-safe; a failure leaves the entry,
// named by the signal line).
void stop_remove_files(void);

// What the signal line says: steps completed, and the newest complete
// checkpoint (saved by this run, or the one it resumed from).
void stop_note_step(long step);
void stop_note_checkpoint(const char *dir, long step);
// A tool's line instead of a run's: "PROG: stopped by SIGINT " + what, e.g.
// "while consolidating into uni; what it had written is removed" (up to
// 4095 bytes; NULL: the run's line again).
void stop_note_task(const char *what);
// SIGTERM and SIGINT held back from stop_hold to stop_release, which lets
// one that came meanwhile through: what the line names and what is on disk
// change together (ckpt_save's commit of `latest` and its note).
void stop_hold(void);
void stop_release(void);
// fsync(fd), its result and errno. A flush can take seconds on a busy disk
// (ext4 commits its journal, and with it other processes' writes), and a
// thread inside fsync handles no signal until it returns: the flush runs on
// a thread of its own that takes no SIGTERM or SIGINT, while the caller
// waits in pthread_join, where the handler runs at once. Not while held.
int stop_fsync(int fd);

// Catches SIGTERM and SIGINT: removes the tracked files, rank 0 prints
// "PROG: stopped by SIGTERM after step N; resume with --resume DIR (step M)"
// (or that no checkpoint was saved), and the process ends by the signal.
// And a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT; not under
// AddressSanitizer, whose report says more): the tracked files removed, the
// crashing rank prints "PROG: rank R: crashed: SIGNAL (what it means)" and
// its stack, and the process ends by the signal.
void stop_catch_signals(int rank);
// The process is ending on its own (exit_all, an error's abort): a signal
// that reaches it now (mpirun stopping the job) prints no line.
void stop_ending(void);
