// nvme_files.h: the rank's files on the NVMe tier, one per state under
// DIR/rank-R/: master, m and v (fp32, the shard each) and, with
// --offload-params nvme, the bf16 param shard. They are sized before
// anything is made: every rank counts its own, the ranks that share a file
// system add theirs up, and all of them must pass the free-space check before
// any rank creates a file. Created preallocated (fallocate), so a full disk
// shows at set-up; accounted on the nvme tier (the state's bytes in its
// category, the rounding to whole 4 KiB blocks as workspace); scratch, not
// checkpoints: removed at the end of the run.
#pragma once
#include "aio.h"
#include "swapper.h"
#include "trainer.h"

#define NVME_DIR_BYTES 1024

typedef struct NvmeFiles {
    char dir[NVME_DIR_BYTES];        // DIR/rank-R
    AioFile file[SWAP_TENSORS];      // by swapper tensor; a state not on NVMe has none
    size_t payload[SWAP_TENSORS];    // bytes of the state in it (0: no file)
    int lock_fd;                     // DIR/rank-R/lock, held for the run (out_folder_lock), or -1
    char lock_path[NVME_DIR_BYTES + 8];
} NvmeFiles;

// Every rank runs it; if any failed, every rank exits 2 with the lowest
// failing rank's message, printed once (rank 0).
void nvme_agree(const Trainer *t, int failed, const char *msg);
// Collective, before any model state is allocated: checks --nvme-path on
// every rank (exists, is a folder, on a disk) and the room for the files of
// the states that `states` puts on NVMe, for a shard of `shard` elements;
// exits 2 with one line otherwise. Makes DIR/rank-R and locks it for the run,
// so that a second run on the same path is refused in one line.
void nvme_files_check(NvmeFiles *f, const Trainer *t, const StatesLayout *states, size_t shard, const char *path);
// Collective: creates and preallocates the files, then writes the initial
// values (master = the init weights, params = their bf16; m = v = 0 from
// fallocate, whose blocks read as zeros) through pinned buffers.
void nvme_files_create(NvmeFiles *f, Trainer *t, Aio *aio);
// Closes and deletes the files and the lock (and the folder DIR/rank-R if it is empty).
void nvme_files_remove(NvmeFiles *f, Trainer *t);
