// ckpt.c: sharded, atomic, checksummed checkpoints (see ckpt.h).
//
// A part file (one per rank): PartHeader, then one PartEntry per tensor
// (name, bytes, FNV-1a 64 of its data), then the tensors' bytes in order.
// The part's checksum, which the manifest repeats, is FNV-1a 64 of the header
// and entries: they hold every tensor's checksum, so it covers the whole file
// while the data is hashed only once.
//
// Every step that can fail on some ranks ends in ckpt_agree(): all ranks learn
// whether any failed, and all return the message of the lowest failing rank.
#include "ckpt.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "ckpt_manifest.h"

#define PART_MAGIC CKPT_PART_MAGIC
#define PART_VERSION CKPT_PART_VERSION
#define NAME_BYTES CKPT_NAME_BYTES
#define PATH_BYTES CKPT_PATH_BYTES
#define DIR_MAX_LEN (PATH_BYTES - 128)  // room for "/step-N.partial/rank-N.bin.tmp" under DIR
#define FNV_OFFSET 14695981039346656037ull  // FNV-1a 64 offset basis, 0xcbf29ce484222325
#define FNV_PRIME 1099511628211ull

_Static_assert(sizeof(PartHeader) == 32 && sizeof(PartEntry) == 48, "part layout has no padding");


uint64_t fnv1a64(const void *data, size_t bytes, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

int ckpt_msgf(char *msg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, MSG_BYTES, fmt, ap);
    va_end(ap);
    return 1;
}

void ckpt_pathf(char *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, PATH_BYTES, fmt, ap);
    va_end(ap);
}

int ckpt_dir_too_long(const char *dir, char *msg) {
    if (strlen(dir) <= DIR_MAX_LEN) return 0;
    return ckpt_msgf(msg, "checkpoint folder name is %zu characters long; give one of at most %d",
                strlen(dir), DIR_MAX_LEN);
}

int ckpt_agree(Comm *world, int failed, char *msg, char *err, size_t err_len) {
    if (comm_first_failure(world, failed, msg, MSG_BYTES) < 0) return 0;
    snprintf(err, err_len, "%s", msg);
    return 1;
}

// ---- loading ---------------------------------------------------------------

static char *read_text(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    rewind(f);
    char *text = xmalloc((size_t)*len + 1);
    if (fread(text, 1, (size_t)*len, f) != (size_t)*len) *len = 0;
    text[*len] = 0;
    fclose(f);
    return text;
}

static int holds_latest(const char *folder) {
    char path[PATH_BYTES];
    ckpt_pathf(path, "%s/latest", folder);
    return access(path, F_OK) == 0;
}

void ckpt_root(const char *dir, char *out, size_t n) {
    char real[PATH_MAX], parent[PATH_MAX];
    if (!realpath(dir, real)) {
        snprintf(out, n, "%s", dir);
        return;
    }
    snprintf(out, n, "%s", real);
    char *slash = strrchr(real, '/');
    if (holds_latest(real) || !slash || strncmp(slash + 1, "step-", 5) != 0) return;
    snprintf(parent, sizeof parent, "%.*s", slash == real ? 1 : (int)(slash - real), real);
    if (holds_latest(parent)) snprintf(out, n, "%s", parent);
}

// Rank 0: DIR/latest names the step folder; without it DIR must be one.
int ckpt_find_manifest(const char *dir, char *step_dir, char **text, long *len, char *msg) {
    char path[PATH_BYTES], name[64] = "";
    ckpt_pathf(path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    int have_latest = f != NULL;
    if (f) {
        int ok = fscanf(f, "%63s", name) == 1 && strncmp(name, "step-", 5) == 0;
        fclose(f);
        if (!ok)
            return ckpt_msgf(msg, "checkpoint %s/latest is damaged (it should name a step folder); "
                        "give one of the step folders instead", dir);
        ckpt_pathf(step_dir, "%s/%s", dir, name);
    } else {
        ckpt_pathf(step_dir, "%s", dir);
    }
    ckpt_pathf(path, "%s/manifest.txt", step_dir);
    *text = read_text(path, len);
    if (*text) return 0;
    if (!have_latest)
        return ckpt_msgf(msg, "checkpoint %s: no checkpoint there (neither latest nor manifest.txt); "
                    "give the folder a run saved into, or one of its step folders", dir);
    return ckpt_msgf(msg, "checkpoint %s: cannot read %s (%s); use an earlier step folder or start "
                "fresh", dir, path, strerror(errno));
}

int ckpt_corrupt(const char *part, const char *why, char *msg) {
    return ckpt_msgf(msg, "checkpoint %s is corrupt (%s): not loaded; use an earlier step folder or "
                "start fresh", part, why);
}

// Reads the header and entries (into malloc'd *head) and checks them
// against the manifest's line for this part.
int ckpt_read_part_header(int fd, const char *part, const PartInfo *want, PartHeader **head, char *msg) {
    struct stat st;
    PartHeader ph;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != want->bytes)
        return ckpt_corrupt(part, "its size differs from the manifest's", msg);
    if (pread(fd, &ph, sizeof ph, 0) != (ssize_t)sizeof ph ||
        sizeof ph + (uint64_t)ph.ntensors * sizeof(PartEntry) > want->bytes)
        return ckpt_corrupt(part, "bad header", msg);
    size_t head_bytes = sizeof ph + ph.ntensors * sizeof(PartEntry);
    *head = xmalloc(head_bytes);
    if (pread(fd, *head, head_bytes, 0) != (ssize_t)head_bytes ||
        fnv1a64(*head, head_bytes, FNV_OFFSET) != want->checksum)
        return ckpt_corrupt(part, "checksum mismatch", msg);
    return 0;
}

// The header's identity and tensor list against this rank and t[].
static int check_part_header(const PartHeader *ph, const char *part, uint64_t part_bytes,
                             Comm *world, long step, const CkptTensor *t, int n, char *msg) {
    if (memcmp(ph->magic, PART_MAGIC, 8) || ph->version != PART_VERSION ||
        ph->rank != world->rank || ph->ranks != world->size || ph->step != step)
        return ckpt_corrupt(part, "its header names another rank, step or format", msg);
    const PartEntry *e = (const PartEntry *)(ph + 1);
    // cpu_offload --dpu's own tensor: the flag, named
    int has_dpu = 0, wants_dpu = 0;
    for (uint32_t i = 0; i < ph->ntensors; i++) has_dpu |= strncmp(e[i].name, "device_params", NAME_BYTES) == 0;
    for (int i = 0; i < n; i++) wants_dpu |= strcmp(t[i].name, "device_params") == 0;
    if (has_dpu != wants_dpu)
        return ckpt_msgf(msg, "checkpoint %s was saved %s --dpu (%s device_params, the device's params a step "
                         "behind); this run is %s it: resume %s --dpu", part, has_dpu ? "under" : "without",
                         has_dpu ? "it holds" : "no", wants_dpu ? "under" : "without", has_dpu ? "with" : "without");
    if ((int)ph->ntensors != n)
        return ckpt_msgf(msg, "checkpoint %s holds %u tensors; this run saves %d: resume with the "
                    "same stage and flags", part, ph->ntensors, n);
    uint64_t sum = sizeof *ph + (uint64_t)n * sizeof *e;
    for (int i = 0; i < n; i++) {
        if (strncmp(e[i].name, t[i].name, NAME_BYTES) != 0 || e[i].bytes != t[i].bytes)
            return ckpt_msgf(msg, "checkpoint %s holds %.31s of %" PRIu64 " bytes where this run "
                        "expects %s of %zu bytes: resume with the same stage, model and ranks",
                        part, e[i].name, e[i].bytes, t[i].name, t[i].bytes);
        sum += e[i].bytes;
    }
    return sum == part_bytes ? 0 : ckpt_corrupt(part, "its size differs from its header's", msg);
}

// Reads tensor e into `into` and compares its checksum with its entry.
// (pread moves at most ~2 GB a call, hence the loop.)
static int read_tensor(int fd, off_t off, const PartEntry *e, void *into, const char *part,
                       char *msg) {
    for (uint64_t done = 0; done < e->bytes;) {
        ssize_t r = pread(fd, (char *)into + done, e->bytes - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return ckpt_corrupt(part, r < 0 ? strerror(errno) : "truncated", msg);
        done += (uint64_t)r;
    }
    if (fnv1a64(into, e->bytes, FNV_OFFSET) != e->checksum)
        return ckpt_corrupt(part, "checksum mismatch", msg);
    return 0;
}

// The header is checked before any data is read, so t[] is only written
// within the sizes the caller gave.
static int load_part(const char *part, const PartInfo *want, Comm *world, long step,
                     CkptTensor *t, int n, char *msg) {
    int fd = open(part, O_RDONLY);
    if (fd < 0) return ckpt_corrupt(part, strerror(errno), msg);
    PartHeader *head = NULL;
    int rc = ckpt_read_part_header(fd, part, want, &head, msg);
    if (!rc) rc = check_part_header(head, part, want->bytes, world, step, t, n, msg);
    const PartEntry *e = rc ? NULL : (const PartEntry *)(head + 1);
    off_t off = (off_t)(sizeof(PartHeader) + (size_t)n * sizeof(PartEntry));
    for (int i = 0; i < n && !rc; i++) {
        rc = read_tensor(fd, off, &e[i], t[i].host, part, msg);
        off += (off_t)e[i].bytes;
    }
    free(head);
    close(fd);
    return rc;
}

int ckpt_load(Comm *world, const char *dir, const CkptManifest *expect, CkptManifest *got,
              CkptTensor *t, int n, CkptLoadInfo *info, char *err, size_t err_len) {
    char msg[MSG_BYTES] = "", step_dir[PATH_BYTES] = "", part[PATH_BYTES];
    char *text = NULL;
    long len = 0;
    int failed = world->rank == 0 &&
                 (ckpt_dir_too_long(dir, msg) || ckpt_find_manifest(dir, step_dir, &text, &len, msg));
    if (ckpt_agree(world, failed, msg, err, err_len)) return 1;

    // rank 0 read the manifest; every rank parses the same text
    mpiCheck(MPI_Bcast(step_dir, PATH_BYTES, MPI_CHAR, 0, world->mpi));
    mpiCheck(MPI_Bcast(&len, 1, MPI_LONG, 0, world->mpi));
    if (world->rank != 0) text = xmalloc((size_t)len + 1);
    mpiCheck(MPI_Bcast(text, (int)len + 1, MPI_CHAR, 0, world->mpi));
    CkptManifest m;
    PartInfo mine = {0, 0};
    char *parsed = xmalloc((size_t)len + 1);  // manifest_parse edits the text it reads
    memcpy(parsed, text, (size_t)len + 1);
    failed = manifest_parse(parsed, dir, -1, &m, &mine, msg);
    int reshard = !failed && ckpt_reshardable(&m, expect, world->size);
    if (!failed && !reshard) {  // this rank's own part, which a resharded load may not have
        memcpy(parsed, text, (size_t)len + 1);
        failed = manifest_parse(parsed, dir, world->rank, &m, &mine, msg);
    }
    failed = failed || manifest_check(dir, &m, expect, world->size, msg);
    free(parsed);
    if (got) *got = m;
    if (info) memset(info, 0, sizeof *info);
    if (ckpt_agree(world, failed, msg, err, err_len)) {
        free(text);
        return 1;
    }
    if (reshard) {
        failed = ckpt_reshard_read(world, step_dir, text, &m, t, n, info, msg);
    } else {
        ckpt_pathf(part, "%s/rank-%05d.bin", step_dir, world->rank);
        failed = load_part(part, &mine, world, m.step, t, n, msg);
    }
    free(text);
    return ckpt_agree(world, failed, msg, err, err_len);
}

int manifest_part(const char *text, int q, PartInfo *out) {
    char key[40];
    snprintf(key, sizeof key, "\nrank-%05d.bin = ", q);
    const char *p = strstr(text, key);
    return !p || sscanf(p + strlen(key), "%" SCNx64 " %" SCNu64, &out->checksum, &out->bytes) != 2;
}
