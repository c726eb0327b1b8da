// aio_file.c: the files behind the NVMe tier: a rank's folder DIR/rank-R
// (checked for room before anything is made), and files opened for O_DIRECT
// and preallocated with fallocate.
#define _GNU_SOURCE  // O_DIRECT, fallocate, GNU strerror_r
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "aio.h"

#define DISK_HINT "hint: use a directory on a disk-backed file system (ext4, xfs), not tmpfs such as /dev/shm"

static int set_error(char err[AIO_ERR_BYTES], int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, AIO_ERR_BYTES, fmt, ap);
    va_end(ap);
    return code;
}

void aio_ignore_sigxfsz(void) {
    struct sigaction now;
    if (sigaction(SIGXFSZ, NULL, &now) == 0 && now.sa_handler == SIG_DFL) {
        struct sigaction ignore = {.sa_handler = SIG_IGN};
        sigemptyset(&ignore.sa_mask);
        sigaction(SIGXFSZ, &ignore, NULL);
    }
}

// The NVMe tier must be a disk: tmpfs and ramfs live in the memory that the
// tier exists to relieve. (Older kernels refuse O_DIRECT on tmpfs with
// EINVAL; since Linux 6.6 tmpfs accepts it, so the type is checked here.)
static int check_on_disk(const char *dir, char err[AIO_ERR_BYTES]) {
    struct statfs fs;
    if (statfs(dir, &fs) != 0) {
        char reason[128];
        return set_error(err, errno, "aio: cannot inspect the file system of '%s': %s", dir,
                         strerror_r(errno, reason, sizeof reason));
    }
    if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)
        return set_error(err, EINVAL, "aio: '%s' is on %s, which lives in memory, not on a disk; "
                         DISK_HINT, dir, fs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
    return 0;
}

int aio_rank_dir(const char *dir, int rank, size_t bytes_needed, char *rank_dir,
                 size_t rank_dir_bytes, char err[AIO_ERR_BYTES]) {
    struct stat st;
    char reason[128];
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT)
            return set_error(err, ENOENT, "aio: directory '%s' does not exist; hint: create it, "
                             "on a disk with room for the states", dir);
        return set_error(err, errno, "aio: cannot reach '%s': %s", dir,
                         strerror_r(errno, reason, sizeof reason));
    }
    if (!S_ISDIR(st.st_mode))
        return set_error(err, ENOTDIR, "aio: '%s' is not a directory; hint: pass a directory "
                         "(the files go in DIR/rank-R/)", dir);
    int rc = check_on_disk(dir, err);
    if (rc) return rc;
    int n = snprintf(rank_dir, rank_dir_bytes, "%s/rank-%d", dir, rank);
    if (n < 0 || (size_t)n >= rank_dir_bytes)
        return set_error(err, ENAMETOOLONG, "aio: the path '%s/rank-%d' is longer than %zu bytes; "
                         "hint: use a shorter directory", dir, rank, rank_dir_bytes - 1);
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0)
        return set_error(err, errno, "aio: cannot ask '%s' for its free space: %s", dir,
                         strerror_r(errno, reason, sizeof reason));
    // f_bavail: the blocks an unprivileged user may still take
    size_t free_bytes = (size_t)vfs.f_bavail * vfs.f_frsize;
    if (bytes_needed > free_bytes) {
        int earlier = stat(rank_dir, &st) == 0 && S_ISDIR(st.st_mode);
        return set_error(err, ENOSPC, "aio: not enough room under '%s': the files need %zu bytes "
                         "(%.2f GB), the file system has %zu bytes (%.2f GB) free; hint: free "
                         "space or use a bigger disk%s", dir, bytes_needed, bytes_needed * 1e-9,
                         free_bytes, free_bytes * 1e-9, earlier ? " (files of an earlier run in "
                         "its rank-R folders take space too)" : "");
    }
    if (mkdir(rank_dir, 0755) != 0 && errno != EEXIST)
        return set_error(err, errno, "aio: cannot make '%s': %s", rank_dir,
                         strerror_r(errno, reason, sizeof reason));
    // lstat: a link planted in place of the folder would send the files to its target
    if (lstat(rank_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return set_error(err, ENOTDIR, "aio: '%s' exists and is not a directory%s; hint: move it away",
                         rank_dir, S_ISLNK(st.st_mode) ? " (a symbolic link, which the swap files never follow)" : "");
    if (st.st_uid != geteuid())
        return set_error(err, EPERM, "aio: '%s' belongs to another user (uid %d); hint: give a folder of your own",
                         rank_dir, (int)st.st_uid);
    return 0;
}

// One line for an open() that failed with `code`.
static int open_error(const char *path, int code, int creating, char err[AIO_ERR_BYTES]) {
    char reason[128];
    const char *verb = creating ? "create" : "open";
    switch (code) {
    case ENOENT:
        return set_error(err, code, creating ? "aio: cannot create '%s': its directory does not "
                         "exist; hint: make it first (aio_rank_dir makes DIR/rank-R)"
                         : "aio: '%s' does not exist; hint: was it created by this run?", path);
    case EINVAL:
        return set_error(err, code, "aio: the file system of '%s' refuses O_DIRECT (open: %s); "
                         DISK_HINT, path, strerror_r(code, reason, sizeof reason));
    default:
        return set_error(err, code, "aio: cannot %s '%s': %s", verb, path,
                         strerror_r(code, reason, sizeof reason));
    }
}

// The folder part of `path` ("." when there is none) in dir.
static void parent_dir(const char *path, char *dir, size_t dir_bytes) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, dir_bytes, ".");
    else if (slash == path) snprintf(dir, dir_bytes, "/");
    else snprintf(dir, dir_bytes, "%.*s", (int)(slash - path), path);
}

// fallocate reserves the blocks without writing them; where the file system
// lacks it, posix_fallocate writes them, through a descriptor without O_DIRECT
// (glibc's emulation writes single bytes, which O_DIRECT refuses).
static int preallocate(int fd, const char *path, size_t bytes) {
    if (fallocate(fd, 0, 0, (off_t)bytes) == 0) return 0;
    if (errno != EOPNOTSUPP) return errno;
    int plain_fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (plain_fd < 0) return errno;
    int rc = posix_fallocate(plain_fd, 0, (off_t)bytes);
    close(plain_fd);
    return rc;
}

int aio_file_create(AioFile *f, const char *path, size_t bytes, char err[AIO_ERR_BYTES]) {
    *f = (AioFile){.fd = -1};
    if (bytes % AIO_ALIGN_BYTES != 0)
        return set_error(err, EINVAL, "aio: size %zu of '%s' is not a multiple of %d bytes "
                         "(O_DIRECT); hint: size it with aio_round_up", bytes, path, AIO_ALIGN_BYTES);
    char dir[4096];
    parent_dir(path, dir, sizeof dir);
    struct stat st;
    if (stat(dir, &st) == 0) {  // a missing folder is reported by open below
        int rc = check_on_disk(dir, err);
        if (rc) return rc;
    }
    aio_ignore_sigxfsz();
    // a file left by a killed run is removed (a link, not its target) and the
    // new one created: never a file someone else put there (O_EXCL, O_NOFOLLOW)
    unlink(path);
    int fd = open(path, O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) return open_error(path, errno, 1, err);
    int rc = bytes ? preallocate(fd, path, bytes) : 0;
    if (rc != 0) {
        char reason[128];
        close(fd);
        unlink(path);  // ours, and empty: leave no half-made file behind
        return set_error(err, rc, "aio: preallocating %zu bytes (%.2f GB) for '%s' failed: %s; %s",
                         bytes, bytes * 1e-9, path, strerror_r(rc, reason, sizeof reason),
                         rc == ENOSPC ? "hint: free space or use a bigger disk"
                         : rc == EFBIG ? "hint: the file size limit (ulimit -f) is below it; raise it"
                         : "hint: check the disk");
    }
    f->path = strdup(path);
    if (!f->path) {
        close(fd);
        return set_error(err, ENOMEM, "aio: out of host memory naming '%s'", path);
    }
    f->fd = fd;
    f->bytes = bytes;
    return 0;
}

int aio_file_open(AioFile *f, const char *path, char err[AIO_ERR_BYTES]) {
    *f = (AioFile){.fd = -1};
    int fd = open(path, O_RDWR | O_DIRECT | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return open_error(path, errno, 0, err);
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? errno : 0;
    if (rc == 0 && !S_ISREG(st.st_mode))
        rc = set_error(err, EINVAL, "aio: '%s' is not a regular file", path);
    else if (rc != 0) {
        char reason[128];
        set_error(err, rc, "aio: cannot stat '%s': %s", path, strerror_r(rc, reason, sizeof reason));
    }
    if (rc == 0) {
        char dir[4096];
        parent_dir(path, dir, sizeof dir);
        rc = check_on_disk(dir, err);
    }
    if (rc == 0 && !(f->path = strdup(path)))
        rc = set_error(err, ENOMEM, "aio: out of host memory naming '%s'", path);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    f->fd = fd;
    f->bytes = (size_t)st.st_size;
    return 0;
}

void aio_file_close(AioFile *f) {
    if (!f->path) return;  // closed, or never opened (fd 0 of a zeroed struct is not ours)
    close(f->fd);
    free(f->path);
    *f = (AioFile){.fd = -1};
}
