// ckpt_save.c: writing a sharded checkpoint (see ckpt.h).
//
// A save never writes into a step folder that exists. Every rank writes its
// part into DIR/step-N.partial; rank 0 adds the manifest and renames the
// folder to DIR/step-N, then moves `latest`. So a step folder on disk is
// complete or absent: a save that fails (a full disk, a file size limit on
// one rank) or is killed leaves every earlier checkpoint as it was, and a
// folder that holds another run's checkpoint at the same step is refused,
// not merged into. A .partial folder left by a killed save is removed by
// the next save into DIR (it holds only names a save writes).
#include "ckpt.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "ckpt_manifest.h"
#include "out_file.h"
#include "stop.h"

#define PATH_BYTES CKPT_PATH_BYTES
#define FNV_OFFSET 14695981039346656037ull  // FNV-1a 64 offset basis

static int mkdir_one(const char *path, char *msg) {
    struct stat st;
    if (mkdir(path, 0755) == 0) return 0;
    if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    if (errno == EEXIST) errno = ENOTDIR;
    return ckpt_msgf(msg, "cannot create checkpoint folder %s: %s; choose a folder this job can write",
                path, strerror(errno));
}

static int mkdir_p(const char *path, char *msg) {
    char buf[PATH_BYTES];
    ckpt_pathf(buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir_one(buf, msg);
        *p = '/';
        if (rc) return rc;
    }
    return mkdir_one(buf, msg);
}

static int fsync_dir(const char *dir, char *msg) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY), bad = fd < 0 || stop_fsync(fd) != 0;
    if (bad) ckpt_msgf(msg, "cannot sync checkpoint folder %s: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    return bad;
}

static int write_all(int fd, const void *data, size_t bytes) {
    const char *p = data;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes > (1u << 30) ? (1u << 30) : bytes);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 1;
        p += w;
        bytes -= (size_t)w;
    }
    return 0;
}

// dir/name written as dir/name.tmp, fsynced, renamed over dir/name, and the
// rename made durable by fsyncing dir: a crash leaves the old file or the new.
// A failure names `shown`, the file as the finished checkpoint holds it.
// `held`: SIGTERM and SIGINT wait from the rename until the caller, which
// notes what the rename did, releases them and flushes dir itself; the
// flushes, which can take seconds, are never held (stop_fsync).
static int write_atomic(const char *dir, const char *name, const char *shown, const void *const *chunk,
                        const size_t *bytes, int nchunks, int held, char *msg) {
    char tmp[PATH_BYTES], final[PATH_BYTES];
    ckpt_pathf(tmp, "%s/%s.tmp", dir, name);
    ckpt_pathf(final, "%s/%s", dir, name);
    // a temporary file left by a killed run is removed (a link, not its
    // target), and the new one is created: never a file someone put there;
    // the signals wait from its creation to its tracking
    stop_hold();
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644), bad = fd < 0;
    if (!bad) stop_track(tmp, 0);  // a signal mid-write leaves no temporary file
    stop_release();
    for (int i = 0; i < nchunks && !bad; i++) bad = write_all(fd, chunk[i], bytes[i]);
    if (!bad) bad = stop_fsync(fd) != 0;
    if (fd >= 0 && close(fd) != 0) bad = 1;
    if (held) stop_hold();
    if (!bad) bad = rename(tmp, final) != 0;
    if (bad) {
        int why = errno;
        unlink(tmp);  // a failed save leaves no temporary file behind
        stop_forget(tmp);
        if (held) stop_release();
        return ckpt_msgf(msg, "cannot write checkpoint %s: %s; check the folder, free space and file size limit",
                    shown, strerror(why));
    }
    stop_forget(tmp);
    return held ? 0 : fsync_dir(dir, msg);  // held: the caller notes, releases, then flushes the folder
}

// This rank's part into the partial folder; `step_dir` is where it will lie.
static int write_part(Comm *world, const char *partial, const char *step_dir, long step, const CkptTensor *t,
                      int n, PartInfo *info, char *msg) {
    size_t head_bytes = sizeof(PartHeader) + (size_t)n * sizeof(PartEntry);
    PartHeader *ph = xcalloc(1, head_bytes);
    PartEntry *pe = (PartEntry *)(ph + 1);
    memcpy(ph->magic, CKPT_PART_MAGIC, sizeof ph->magic);
    ph->version = CKPT_PART_VERSION;
    ph->rank = world->rank;
    ph->ranks = world->size;
    ph->ntensors = (uint32_t)n;
    ph->step = step;
    const void **chunk = xmalloc((size_t)(n + 1) * sizeof(void *));
    size_t *bytes = xmalloc((size_t)(n + 1) * sizeof(size_t));
    chunk[0] = ph;
    bytes[0] = head_bytes;
    info->bytes = head_bytes;
    for (int i = 0; i < n; i++) {
        CHECK(strlen(t[i].name) < CKPT_NAME_BYTES, "checkpoint tensor name '%s' is longer than %d",
              t[i].name, CKPT_NAME_BYTES - 1);
        strcpy(pe[i].name, t[i].name);
        pe[i].bytes = t[i].bytes;
        pe[i].checksum = fnv1a64(t[i].host, t[i].bytes, FNV_OFFSET);
        chunk[i + 1] = t[i].host;
        bytes[i + 1] = t[i].bytes;
        info->bytes += t[i].bytes;
    }
    info->checksum = fnv1a64(ph, head_bytes, FNV_OFFSET);
    char name[32], shown[PATH_BYTES];
    snprintf(name, sizeof name, "rank-%05d.bin", world->rank);
    ckpt_pathf(shown, "%s/%s", step_dir, name);
    int rc = write_atomic(partial, name, shown, chunk, bytes, n + 1, 0, msg);
    free(chunk);
    free(bytes);
    free(ph);
    return rc;
}

int ckpt_lock(const char *dir, int *lock_fd, char *err, size_t err_len) {
    char msg[MSG_BYTES] = "";
    *lock_fd = -1;
    if (ckpt_dir_too_long(dir, msg)) return snprintf(err, err_len, "%s", msg), 1;
    if (ckpt_folder_only_saves(dir, err, err_len)) return 1;
    if (mkdir_p(dir, msg)) return snprintf(err, err_len, "%s", msg), 1;
    return out_folder_lock("--save", dir, lock_fd, err, err_len);
}

// The files a save writes into a step folder: rank-NNNNN.bin, manifest.txt
// and their .tmp names while they are written.
static int save_file_name(const char *name) {
    int rank, len = 0;
    if (strcmp(name, "manifest.txt") == 0 || strcmp(name, "manifest.txt.tmp") == 0) return 1;
    if (sscanf(name, "rank-%5d.bin%n", &rank, &len) != 1 || len == 0) return 0;
    return name[len] == 0 || strcmp(name + len, ".tmp") == 0;
}

// Rank 0: a partial folder of a save that was killed goes (its files, if
// they are all a save's, then the folder); `partial` does not exist after.
static int clear_partial(const char *partial, char *msg) {
    struct stat st;
    if (lstat(partial, &st) != 0) return 0;
    int gone = 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(partial);
        for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
            char path[PATH_BYTES];
            ckpt_pathf(path, "%s/%s", partial, e->d_name);
            if (save_file_name(e->d_name)) unlink(path);
        }
        if (d) closedir(d);
        gone = rmdir(partial) == 0;
    } else {
        gone = unlink(partial) == 0;  // a link or file in its place: never followed
    }
    return gone ? 0 : ckpt_msgf(msg, "cannot remove %s, left by a save that did not finish (%s): remove it, or save "
                                "into another folder", partial, strerror(errno));
}

// Rank 0, before any part is written: DIR exists, step-N does not (a save
// never replaces one), and an empty step-N.partial is ready for the parts.
static int begin_save(const char *dir, const char *step_dir, const char *partial, char *msg) {
    struct stat st;
    if (ckpt_dir_too_long(dir, msg) || mkdir_p(dir, msg)) return 1;
    if (lstat(step_dir, &st) == 0)
        return ckpt_msgf(msg, "checkpoint %s already exists (a checkpoint at this step, or a file): a save never "
                         "replaces it; save into another folder, or move it away", step_dir);
    if (clear_partial(partial, msg)) return 1;
    if (mkdir(partial, 0755) != 0)
        return ckpt_msgf(msg, "cannot create checkpoint folder %s: %s; choose a folder this job can write", partial,
                         strerror(errno));
    stop_track(partial, 1);  // a signal removes it, once the ranks removed their parts
    return 0;
}

// Rank 0, after every part is in the partial folder: the manifest, the
// folder renamed to step-N (*placed), then `latest` (the commit).
static int commit(const char *dir, const char *partial, const char *step_dir, const CkptManifest *m, int ranks,
                  const PartInfo *parts, int *placed, char *msg) {
    size_t len = 0;
    char *text = manifest_text(m, ranks, parts, &len), shown[PATH_BYTES], latest[32];
    ckpt_pathf(shown, "%s/manifest.txt", step_dir);
    snprintf(latest, sizeof latest, "step-%08ld\n", m->step);
    int rc = write_atomic(partial, "manifest.txt", shown, (const void *[]){text}, &len, 1, 0, msg);
    free(text);
    if (rc) return rc;
    // rename does not replace a folder that holds files: step-N appearing
    // since begin_save is refused here too
    if (rename(partial, step_dir) != 0)
        return ckpt_msgf(msg, "cannot move the finished checkpoint %s to %s: %s; save into another folder",
                         partial, step_dir, strerror(errno));
    *placed = 1;
    char path[PATH_BYTES];
    ckpt_pathf(path, "%s/latest", dir);
    if (fsync_dir(dir, msg)) return 1;
    // the checkpoint a SIGTERM's line names moves with `latest`: noted after
    // the save returned, a signal in between named the step before, which
    // `latest` no longer was (issue 39 item 22's test met it). Held from
    // the rename to the note; the folder's flush comes after the release.
    rc = write_atomic(dir, "latest", path, (const void *[]){latest}, (size_t[]){strlen(latest)}, 1, 1, msg);
    if (rc) return rc;
    stop_note_checkpoint(dir, m->step);
    stop_release();
    return fsync_dir(dir, msg);
}

// Rank 0, after a failed save: its folder goes (the parts the ranks did
// write, the manifest, the folder), so that only complete checkpoints that
// `latest` reached stay on disk.
static void discard_save(const char *folder, int ranks) {
    char path[PATH_BYTES];
    for (int r = 0; r < ranks; r++) {
        ckpt_pathf(path, "%s/rank-%05d.bin", folder, r);
        unlink(path);
    }
    ckpt_pathf(path, "%s/manifest.txt", folder);
    unlink(path);
    rmdir(folder);
}

int ckpt_save(Comm *world, const char *dir, const CkptManifest *m, const CkptTensor *t, int n,
              char *err, size_t err_len) {
    char msg[MSG_BYTES] = "", step_dir[PATH_BYTES], partial[PATH_BYTES], part[PATH_BYTES];
    ckpt_pathf(step_dir, "%s/step-%08ld", dir, m->step);
    ckpt_pathf(partial, "%s.partial", step_dir);
    ckpt_pathf(part, "%s/rank-%05d.bin", partial, world->rank);
    int failed = world->rank == 0 && begin_save(dir, step_dir, partial, msg);
    if (ckpt_agree(world, failed, msg, err, err_len)) return 1;

    PartInfo mine = {0, 0};
    failed = write_part(world, partial, step_dir, m->step, t, n, &mine, msg);
    if (!failed) stop_track(part, 0);  // a signal before the commit removes it
    int placed = 0;
    if (!ckpt_agree(world, failed, msg, err, err_len)) {
        PartInfo *parts = world->rank == 0 ? xmalloc((size_t)world->size * sizeof(PartInfo)) : NULL;
        mpiCheck(MPI_Gather(&mine, 2, MPI_UINT64_T, parts, 2, MPI_UINT64_T, 0, world->mpi));
        failed = world->rank == 0 && commit(dir, partial, step_dir, m, world->size, parts, &placed, msg);
        free(parts);
        failed = ckpt_agree(world, failed, msg, err, err_len);
    } else {
        failed = 1;
    }
    stop_forget(part);
    if (world->rank == 0) {
        stop_forget(partial);
        if (failed) discard_save(placed ? step_dir : partial, world->size);
    }
    return failed;
}
