// out_file.c: outputs and locks that touch only what is the run's own (see
// out_file.h). The check before step 1 refuses in one line; the opens at the
// end repeat it with O_NOFOLLOW and fstat, so that a link or device put in
// place during the run is not written either.
#define _GNU_SOURCE  // mkostemps
#include "out_file.h"
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "stop.h"

#define PATH_BYTES 4096

const char *file_kind(mode_t m) {
    if (S_ISREG(m)) return NULL;
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISDIR(m)) return "a folder";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

const char *out_file_kind(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 ? file_kind(st.st_mode) : NULL;
}

// The folder a new file goes in must exist and take new files.
static int folder_takes_files(const char *flag, const char *path, char *msg) {
    char copy[PATH_BYTES];
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return snprintf(msg, OUT_MSG_BYTES, "%s %s: the folder %s does not exist; create it or give another path",
                        flag, path, dir), 1;
    if (access(dir, W_OK | X_OK) != 0)
        return snprintf(msg, OUT_MSG_BYTES, "%s %s: cannot create files in %s (%s)", flag, path, dir,
                        strerror(errno)), 1;
    return 0;
}

int out_file_check(const char *flag, const char *path, int renamed, char *msg) {
    struct stat st;
    if (lstat(path, &st) != 0) return folder_takes_files(flag, path, msg);
    if (S_ISLNK(st.st_mode))
        return snprintf(msg, OUT_MSG_BYTES, "%s %s is a symbolic link; outputs are never written through a link "
                        "nor replace one: give the file it points to, or a new name", flag, path), 1;
    if (S_ISDIR(st.st_mode))
        return snprintf(msg, OUT_MSG_BYTES, "%s %s is a folder; give a file name", flag, path), 1;
    if (!S_ISREG(st.st_mode))
        return snprintf(msg, OUT_MSG_BYTES, "%s %s is %s, not a regular file; give a file name (outputs are "
                        "written only to regular files or new names)", flag, path, file_kind(st.st_mode)), 1;
    if (access(path, W_OK) != 0)
        return snprintf(msg, OUT_MSG_BYTES, "%s %s: cannot write (%s)", flag, path, strerror(errno)), 1;
    return renamed ? folder_takes_files(flag, path, msg) : 0;
}

// fd if it is a regular file, else closed and -1 with errno EINVAL.
static int regular_or_close(int fd) {
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) return fd;
    close(fd);
    errno = EINVAL;
    return -1;
}

FILE *in_file_open(const char *path, const char **why) {
    *why = NULL;
    // O_NONBLOCK: a FIFO opens without waiting for a writer, and is then refused
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return NULL;
    int known = fstat(fd, &st) == 0;
    if (!known || !S_ISREG(st.st_mode)) {
        *why = known ? file_kind(st.st_mode) : "not a regular file";
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) close(fd);
    return f;
}

// A record appended in one write() is not interleaved with another
// process's append (O_APPEND); a write that stops short (a full disk, a file
// size limit) is cut back off, so the file ends where it ended before.
int out_file_append_whole(const char *path, const void *data, size_t bytes) {
    // O_NONBLOCK: a FIFO put in place opens without waiting for a reader, and is then refused
    int fd = regular_or_close(open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
    if (fd < 0) return -1;
    const char *p = data;
    size_t left = bytes;
    off_t start = -1;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        if (start < 0) start = lseek(fd, 0, SEEK_CUR) - w;  // where this record began
        p += w;
        left -= (size_t)w;
    }
    int why = errno;
    if (left > 0 && start >= 0 && ftruncate(fd, start) != 0) why = errno;
    if (close(fd) != 0 && left == 0) return -1;
    errno = why;
    return left > 0 ? -1 : 0;
}

FILE *out_file_begin(const char *path, char *tmp, size_t tmp_bytes) {
    if (snprintf(tmp, tmp_bytes, "%s.XXXXXX.tmp", path) >= (int)tmp_bytes) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    int fd = mkostemps(tmp, 4, O_CLOEXEC);
    if (fd < 0) return NULL;
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0644 & ~mask);  // mkostemps makes 0600; the result reads as any new file would
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return NULL;
    }
    stop_track(tmp, 0);  // removed if the run stops before out_file_commit
    return f;
}

int out_file_commit(const char *tmp, const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        out_file_abandon(tmp);
        errno = S_ISLNK(st.st_mode) ? ELOOP : EINVAL;
        return 1;
    }
    if (rename(tmp, path) == 0) {
        stop_forget(tmp);
        return 0;
    }
    int why = errno;
    out_file_abandon(tmp);
    errno = why;
    return 1;
}

void out_file_abandon(const char *tmp) {
    unlink(tmp);
    stop_forget(tmp);
}

void out_file_resolve(const char *path, char *out, size_t out_bytes) {
    char copy[PATH_BYTES], name_copy[PATH_BYTES], dir[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(name_copy, sizeof name_copy, "%s", path);
    const char *name = basename(name_copy);
    if (!realpath(dirname(copy), dir)) {
        snprintf(out, out_bytes, "%s", path);
        return;
    }
    snprintf(out, out_bytes, "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, name);
}

int out_path_within(const char *path, const char *folder) {
    size_t n = strlen(folder);
    if (n > 1 && folder[n - 1] == '/') n--;  // "/" itself: any absolute path
    return strncmp(path, folder, n) == 0 && (path[n] == 0 || path[n] == '/' || (n == 1 && folder[0] == '/'));
}

// Whether the lock file holds the note out_folder_lock writes in it,
// "process P on HOST\n", and nothing else.
static int note_of_a_run(int fd) {
    char text[256], host[128];
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    int pid, end = 0;
    if (got <= 0) return 0;
    text[got] = 0;
    return sscanf(text, "process %d on %127[^\n]%n", &pid, host, &end) == 2 && end + 1 == got && text[end] == '\n';
}

// DIR/lock created anew (*created), or the one there opened; not through a link.
static int open_lock_file(const char *path, int *created) {
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    *created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    return regular_or_close(fd);
}

int out_folder_lock(const char *flag, const char *dir, int *lock_fd, char *err, size_t err_len) {
    char path[PATH_BYTES];
    *lock_fd = -1;
    snprintf(path, sizeof path, "%s/lock", dir);
    const char *kind = out_file_kind(path);
    int created = 0, fd = kind ? -1 : open_lock_file(path, &created);
    if (fd < 0) {
        if (!kind && (errno == ELOOP || errno == EINVAL)) kind = out_file_kind(path);
        if (kind)
            snprintf(err, err_len, "%s %s: its lock file %s is %s, which this run does not open; remove it, or "
                     "give another folder", flag, dir, path, kind);
        else
            snprintf(err, err_len, "%s %s: cannot create %s: %s; choose a folder this job can write", flag, dir,
                     path, strerror(errno));
        return 1;
    }
    // a lock file removed by its holder (out_folder_unlock) after we opened it
    // is no longer the folder's: taking it would not exclude the next run
    struct stat mine, now;
    int stale = flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &mine) == 0 &&
                (lstat(path, &now) != 0 || now.st_ino != mine.st_ino || now.st_dev != mine.st_dev);
    if (stale) {
        close(fd);
        snprintf(err, err_len, "%s %s is in use by another run that was just ending; run again", flag, dir);
        return 1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[128] = "";
        ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
        holder[got > 0 ? got : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        snprintf(err, err_len, "%s %s is in use by another run (%s holds its lock); give another folder, or "
                 "wait for that run to end", flag, dir, holder[0] ? holder : "a process");
        close(fd);
        return 1;
    }
    // a lock file a run left is taken over; one of anyone else's is theirs
    if (!created && !note_of_a_run(fd)) {
        close(fd);
        snprintf(err, err_len, "%s %s: its lock file %s is not one a run left (a run's reads 'process N on "
                 "HOST'), and a run writes over no file it did not make: move it away, or give another folder",
                 flag, dir, path);
        return 1;
    }
    char host[64] = "?", me[128];
    gethostname(host, sizeof host - 1);
    int len = snprintf(me, sizeof me, "process %d on %s\n", (int)getpid(), host);
    // the note names the holder in a refused run's message; the lock holds without it
    int noted = ftruncate(fd, 0) == 0 && pwrite(fd, me, (size_t)len, 0) == len;
    (void)noted;
    *lock_fd = fd;
    return 0;
}

void out_folder_unlock(const char *dir, int lock_fd) {
    char path[PATH_BYTES];
    if (lock_fd < 0) return;
    snprintf(path, sizeof path, "%s/lock", dir);
    unlink(path);  // while still held, so no run takes the removed file
    close(lock_fd);
}

int out_file_finish(FILE *f, const char *tmp, const char *path, const char *flag, const char *what) {
    int bad = f == NULL;
    if (f) {
        bad = ferror(f) != 0;
        bad |= fclose(f) != 0;
        if (bad) out_file_abandon(tmp);
        else bad = out_file_commit(tmp, path) != 0;  // it removes tmp when it cannot rename
    }
    if (!bad) return 0;
    int why = errno;
    fprintf(stderr, "%s: error: %s %s: writing failed (%s); the %s was not written\n", program_invocation_short_name,
            flag, path,
            why == ELOOP ? "it became a symbolic link during the run; nothing replaces a link"
            : why == EINVAL ? "it is no longer a regular file" : strerror(why), what);
    return 1;
}
