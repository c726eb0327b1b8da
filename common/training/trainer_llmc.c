// trainer_llmc.c: llm.c GPT-2 checkpoints in a run (see trainer.h and
// llmc.h). What crosses the format is the fp32 master weights: --init-from
// loads them into the range of the flat buffer this rank's optimizer owns,
// exactly as a resume does, and --export-llmc writes them. The bf16 params
// are bf16(master) on both sides, so a model exported here and loaded back
// runs the same forward pass bit for bit.
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "llmc.h"
#include "out_file.h"
#include "trainer.h"

// The master weights of this rank's range, from or to a host buffer.
static void copy_master(Trainer *t, float *host, int to_host) {
    if (!t->st.master.ptr)
        fail_usage("%s keeps its master weights in files, which --init-from and --export-llmc do not reach yet",
                   t->strategy->name);
    size_t bytes = t->st.optim_count * sizeof(float);
    dev_sync(&t->dev, STREAM_COMPUTE);  // the update wrote them on the compute stream
    if (to_host) dev_copy(&t->dev, host, t->st.master.ptr, bytes, STREAM_COPY);
    else dev_copy(&t->dev, t->st.master.ptr, host, bytes, STREAM_COPY);
    dev_sync(&t->dev, STREAM_COPY);
}

void trainer_init_from(Trainer *t) {
    const char *path = t->cfg.init_from;
    LlmcHeader h;
    char err[512];
    if (llmc_read_header(path, &h, err, sizeof err)) fail_usage("%s", err);
    size_t begin = t->st.optim_begin, n = t->st.optim_count;
    Buf host = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, n * sizeof(float), "llm.c weights staging");
    if (llmc_read_range(path, &h, &t->layout, begin, begin + n, host.ptr, err, sizeof err))
        fail_rank(EXIT_USAGE, "%s", err);
    copy_master(t, host.ptr, 0);
    buf_free(&t->dev, &host);
    t->strategy->params_from_master(t);  // m and v are zero from states_init: a fresh AdamW
    if (t->world.rank == 0)
        printf("initial weights: %s (llm.c version %d, %s; wte's %d padding rows dropped)\n", path, h.version,
               h.version == LLMC_VERSION_FP32 ? "fp32" : "bf16", h.padded_vocab - h.cfg.vocab_size);
}

// Rank 0 checks the path (a regular file or a new name: out_file.h) and
// tries a file beside it (then removes it), and tells the others, so a path
// that cannot be written stops the run before step 1, not after the last.
void trainer_check_export(Trainer *t) {
    const char *path = t->cfg.export_llmc;
    char msg[OUT_MSG_BYTES] = "", tmp[4096];
    int rc = 0;
    if (t->world.rank == 0 && !(rc = out_file_check("--export-llmc", path, 1, msg))) {
        FILE *f = out_file_begin(path, tmp, sizeof tmp);
        rc = !f;
        if (f) {
            fclose(f);
            unlink(tmp);
        } else {
            snprintf(msg, sizeof msg, "--export-llmc %s: cannot write there (%s)", path, strerror(errno));
        }
    }
    mpiCheck(MPI_Bcast(&rc, 1, MPI_INT, 0, t->world.mpi));
    if (rc) fail_usage("%s", msg);  // rank 0 prints it
}

void trainer_export_llmc(Trainer *t) {
    size_t n = t->st.optim_count;
    int ranks = t->world.size, me = t->world.rank;
    Buf mine = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, n * sizeof(float), "llm.c export staging");
    copy_master(t, mine.ptr, 1);
    // a sharded optimizer: equal shards in rank order make the padded flat buffer
    int sharded = t->st.layout.optim == STATE_SHARD && ranks > 1;
    Buf all = {0};
    if (sharded) {
        CHECK(n <= INT_MAX, "export: a shard of %zu elements is more than one MPI_Gather moves", n);
        if (me == 0) all = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, n * ranks * sizeof(float), "llm.c export");
        mpiCheck(MPI_Gather(mine.ptr, (int)n, MPI_FLOAT, all.ptr, (int)n, MPI_FLOAT, 0, t->world.mpi));
    }
    char err[512] = "";
    int rc = 0;
    if (me == 0) rc = llmc_write(t->cfg.export_llmc, &t->layout, sharded ? all.ptr : mine.ptr, err, sizeof err);
    mpiCheck(MPI_Bcast(&rc, 1, MPI_INT, 0, t->world.mpi));
    if (rc) fail_usage("%s", err);  // rank 0 prints its message
    if (me == 0)
        printf("exported: %s (llm.c GPT-2 checkpoint, version 3, fp32 master weights of step %ld)\n",
               t->cfg.export_llmc, t->step);
    if (sharded && me == 0) buf_free(&t->dev, &all);
    buf_free(&t->dev, &mine);
}
