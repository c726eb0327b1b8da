// nvme_files.c: the rank's files on the NVMe tier (see nvme_files.h).
#include "nvme_files.h"
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "out_file.h"
#include "stop.h"

static const char *const FILE_NAMES[SWAP_TENSORS] = {"master.bin", "adam_m.bin", "adam_v.bin", "params_bf16.bin"};
static const MemCategory FILE_CATS[SWAP_TENSORS] = {CAT_MASTER, CAT_ADAM_M, CAT_ADAM_V, CAT_PARAMS};
// Elements of initial values per write: 4 MiB of fp32 and 2 MiB of bf16,
// both whole 4 KiB blocks.
#define INIT_CHUNK ((size_t)1 << 20)

void nvme_agree(const Trainer *t, int failed, const char *msg) {
    char text[2 * AIO_ERR_BYTES] = "";
    if (failed) snprintf(text, sizeof text, "%s", msg);
    if (comm_first_failure(&t->world, failed, text, (int)sizeof text) >= 0) fail_usage("%s", text);
}

// Ranks on one node whose folder is on the same device share its free space:
// the sum of their bytes, and how many they are in *ranks. (Ranks on other
// nodes have disks of their own.)
static size_t bytes_on_same_disk(const Trainer *t, const char *path, size_t mine, int *ranks) {
    struct stat st;
    unsigned long long me[2] = {stat(path, &st) == 0 ? (unsigned long long)st.st_dev : 0, mine};
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(t->world.mpi, MPI_COMM_TYPE_SHARED, t->world.rank, MPI_INFO_NULL, &node));
    int n = 0;
    mpiCheck(MPI_Comm_size(node, &n));
    unsigned long long *all = xmalloc(2 * (size_t)n * sizeof *all);
    mpiCheck(MPI_Allgather(me, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG, node));
    size_t sum = 0;
    *ranks = 0;
    for (int q = 0; q < n; q++)
        if (all[2 * q] == me[0]) sum += all[2 * q + 1], ++*ranks;
    free(all);
    mpiCheck(MPI_Comm_free(&node));
    return sum;
}

void nvme_files_check(NvmeFiles *f, const Trainer *t, const StatesLayout *states, size_t shard, const char *path) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < SWAP_TENSORS; i++) f->file[i] = (AioFile){.fd = -1};
    CHECK(states->optim == STATE_SHARD && states->params == STATE_SHARD, "nvme files hold shards");
    if (states->optim_tier == TIER_NVME)
        for (int i = SWAP_MASTER; i <= SWAP_V; i++) f->payload[i] = shard * sizeof(float);
    if (states->params_tier == TIER_NVME) f->payload[SWAP_PARAMS] = shard * sizeof(bf16);
    size_t need = 0;
    for (int i = 0; i < SWAP_TENSORS; i++) need += aio_round_up(f->payload[i]);
    int sharing = 1;
    size_t shared = bytes_on_same_disk(t, path, need, &sharing);
    char err[AIO_ERR_BYTES] = "", msg[2 * AIO_ERR_BYTES] = "";
    f->lock_fd = -1;
    int rc = aio_rank_dir(path, t->world.rank, shared, f->dir, sizeof f->dir, err);
    if (rc) snprintf(msg, sizeof msg, "--nvme-path %s (%d rank%s on this file system): %s", path, sharing,
                     sharing == 1 ? "" : "s", err);
    else rc = out_folder_lock("--nvme-path", f->dir, &f->lock_fd, msg, sizeof msg);
    if (!rc) {  // however the run ends, its swap files and their folder go (stop.h)
        snprintf(f->lock_path, sizeof f->lock_path, "%s/lock", f->dir);
        stop_track(f->dir, 1);
        stop_track(f->lock_path, 0);
    }
    int any = 0;
    mpiCheck(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, t->world.mpi));
    if (any && f->lock_fd >= 0) {  // a refused run leaves no folder of its own behind
        out_folder_unlock(f->dir, f->lock_fd);
        f->lock_fd = -1;
        rmdir(f->dir);
    }
    nvme_agree(t, rc != 0, msg);
}

static void close_all(NvmeFiles *f, int unlink_them) {
    for (int i = 0; i < SWAP_TENSORS; i++) {
        if (!f->file[i].path) continue;
        if (unlink_them) unlink(f->file[i].path);
        stop_forget(f->file[i].path);
        aio_file_close(&f->file[i]);
    }
}

static void track(Trainer *t, const NvmeFiles *f, int i, int alloc) {
    size_t slack = aio_round_up(f->payload[i]) - f->payload[i];
    MemCtx *m = &t->dev.mem;
    if (alloc) {
        mem_track_alloc(m, TIER_NVME, FILE_CATS[i], f->payload[i], FILE_NAMES[i]);
        if (slack) mem_track_alloc(m, TIER_NVME, CAT_WORKSPACE, slack, "NVMe files rounded to 4 KiB blocks");
    } else {
        mem_track_free(m, TIER_NVME, FILE_CATS[i], f->payload[i]);
        if (slack) mem_track_free(m, TIER_NVME, CAT_WORKSPACE, slack);
    }
}

// Waits for a buffer's writes; the first failure's message goes to err.
static int wait_writes(Aio *aio, AioRequest req[2], int active[2], int rc, char err[AIO_ERR_BYTES]) {
    for (int i = 0; i < 2; i++) {
        if (!active[i]) continue;
        if (aio_wait(aio, &req[i]) && !rc) {
            rc = req[i].status;
            memcpy(err, req[i].error, AIO_ERR_BYTES);  // both AIO_ERR_BYTES, terminated
        }
        active[i] = 0;
    }
    return rc;
}

// The shard's initial master weights (and their bf16, when the params are
// here too), computed a chunk at a time into one buffer while the other is
// being written.
static int write_initial(NvmeFiles *f, Trainer *t, Aio *aio, char err[AIO_ERR_BYTES]) {
    const AioFile *dst[2] = {f->payload[SWAP_MASTER] ? &f->file[SWAP_MASTER] : NULL,
                             f->payload[SWAP_PARAMS] ? &f->file[SWAP_PARAMS] : NULL};
    Buf buf[2];
    AioRequest req[2][2];
    int active[2][2] = {{0}}, rc = 0;
    for (int b = 0; b < 2; b++)
        buf[b] = buf_alloc(&t->dev, TIER_PINNED, CAT_WORKSPACE, INIT_CHUNK * (sizeof(float) + sizeof(bf16)),
                           "initial values on their way to NVMe");
    size_t n = t->part.shard;
    for (size_t done = 0, b = 0; done < n && !rc; done += INIT_CHUNK, b ^= 1) {
        rc = wait_writes(aio, req[b], active[b], rc, err);
        size_t k = n - done < INIT_CHUNK ? n - done : INIT_CHUNK;
        float *values = buf[b].ptr;
        bf16 *values16 = (bf16 *)(values + INIT_CHUNK);
        size_t k32 = aio_round_up(k * sizeof(float)) / sizeof(float), k16 = aio_round_up(k * sizeof(bf16)) / sizeof(bf16);
        states_init_values(&t->layout, (uint64_t)t->cfg.seed, t->part.begin + done, k, values);
        memset(values + k, 0, (k32 - k) * sizeof(float));
        for (size_t i = 0; i < k16; i++) values16[i] = i < k ? f32_to_half(t->dev.half, values[i]) : 0;
        if (dst[0]) aio_submit(aio, &req[b][0], AIO_WRITE, dst[0], done * sizeof(float), values, k32 * sizeof(float));
        if (dst[1]) aio_submit(aio, &req[b][1], AIO_WRITE, dst[1], done * sizeof(bf16), values16, k16 * sizeof(bf16));
        active[b][0] = dst[0] != NULL;
        active[b][1] = dst[1] != NULL;
    }
    for (int b = 0; b < 2; b++) rc = wait_writes(aio, req[b], active[b], rc, err);
    for (int b = 0; b < 2; b++) buf_free(&t->dev, &buf[b]);
    return rc;
}

void nvme_files_create(NvmeFiles *f, Trainer *t, Aio *aio) {
    char err[AIO_ERR_BYTES] = "";
    int rc = 0;
    for (int i = 0; i < SWAP_TENSORS && !rc; i++) {
        if (!f->payload[i]) continue;
        char path[NVME_DIR_BYTES + 32];
        snprintf(path, sizeof path, "%s/%s", f->dir, FILE_NAMES[i]);
        rc = aio_file_create(&f->file[i], path, aio_round_up(f->payload[i]), err);
        if (f->file[i].path) stop_track(f->file[i].path, 0);
    }
    if (!rc) rc = write_initial(f, t, aio, err);
    int any = 0;
    mpiCheck(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, t->world.mpi));
    if (any) close_all(f, 1);  // nothing half-made stays behind on any rank
    nvme_agree(t, rc != 0, err);
    for (int i = 0; i < SWAP_TENSORS; i++)
        if (f->payload[i]) track(t, f, i, 1);
}

void nvme_files_remove(NvmeFiles *f, Trainer *t) {
    for (int i = 0; i < SWAP_TENSORS; i++)
        if (f->file[i].path) track(t, f, i, 0);
    close_all(f, 1);
    out_folder_unlock(f->dir, f->lock_fd);
    f->lock_fd = -1;
    rmdir(f->dir);
    stop_forget(f->lock_path);
    stop_forget(f->dir);  // only if empty: a folder the user put more in stays
}
