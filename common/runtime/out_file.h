// out_file.h: the files a run writes that the user names (--json, --trace,
// --export-llmc) and the lock files of the folders it holds (--save,
// --nvme-path). A run writes only into what is its own: a regular file or a
// new name. A device, FIFO, socket or folder is refused, and so is a
// symbolic link: an output is never written through a link (its target may
// be anyone's file) nor replaces one. Inputs (in_file_open) are read only
// from regular files.
#pragma once
#include <stdio.h>
#include <sys/types.h>

#define OUT_MSG_BYTES (3 * 4096 + 512)  // three paths of PATH_MAX and the words around them

// A file type in words ("a folder", "a FIFO", ...), NULL for a regular file.
const char *file_kind(mode_t mode);

// Opens an input the user names (a checkpoint, a config) for reading, only
// when it is a regular file: a FIFO or /dev/stdin would block the run or
// never end. NULL with errno, or with `why` set to its kind ("a FIFO").
FILE *in_file_open(const char *path, const char **why);

// What `path` is, in words, when it is not a regular file ("a symbolic
// link", "a character device", "a FIFO", "a socket", "a folder"), or NULL
// for a regular file or a path that does not exist.
const char *out_file_kind(const char *path);

// Before step 1: 0 when `flag path` can be written, else nonzero with one
// line in msg (msg holds OUT_MSG_BYTES). A new name needs a folder that takes
// files; `renamed` outputs are written beside and renamed over the name, so
// their folder must take files even where the file exists.
int out_file_check(const char *flag, const char *path, int renamed, char *msg);

// Appends `bytes` of data to `path` whole or not at all, creating it if it
// is new (0644), without following a link and only when it is a regular
// file: 0, or -1 and errno (ELOOP for a link, EINVAL for anything else that
// is not a regular file), the file as it was.
int out_file_append_whole(const char *path, const void *data, size_t bytes);

// A new file beside `path` for writing it whole: PATH.XXXXXX.tmp, created
// (O_EXCL) so that no file of anyone else's is opened; its name goes in tmp.
// NULL and errno on failure.
FILE *out_file_begin(const char *path, char *tmp, size_t tmp_bytes);

// Removes a tmp of out_file_begin that is not to be committed.
void out_file_abandon(const char *tmp);

// Renames the finished tmp over `path` when `path` is still a regular file
// or absent (0), else removes tmp and returns nonzero with errno set.
int out_file_commit(const char *tmp, const char *path);

// Ends a file of out_file_begin (f NULL: it could not be begun): closes it
// and renames tmp over `path`, or removes tmp; 0, or 1 after one line on
// stderr, "PROGRAM: error: FLAG PATH: writing failed (why); the WHAT was
// not written" (a link or a non-regular file at `path` said as such).
int out_file_finish(FILE *f, const char *tmp, const char *path, const char *flag, const char *what);

// The path with its folder resolved (realpath of the folder, then the last
// name), so that two flags naming one file by different paths compare equal;
// the path as given when its folder cannot be resolved.
void out_file_resolve(const char *path, char *out, size_t out_bytes);

// Whether `path` is the folder `folder` or lies inside it (both resolved,
// as out_file_resolve or realpath give them).
int out_path_within(const char *path, const char *folder);

// Opens and locks DIR/lock for as long as *lock_fd stays open (flock, not
// blocking), noting "process P on HOST" in it for a refused run's message.
// The lock file is opened without following a link and must be a regular
// file; one that is there already must hold such a note alone (a lock a run
// left), never anyone's file of that name. Returns 0, or nonzero with one
// line in err naming `flag DIR`.
int out_folder_lock(const char *flag, const char *dir, int *lock_fd, char *err, size_t err_len);
// Removes DIR/lock and drops the lock (lock_fd from out_folder_lock; -1: nothing).
void out_folder_unlock(const char *dir, int lock_fd);
