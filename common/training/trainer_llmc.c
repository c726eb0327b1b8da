// trainer_llmc.c: llm.c GPT-2 checkpoints in a run (see trainer.h and
// llmc.h). What crosses the format is the fp32 master weights: --init-from
// loads them into the range of the flat buffer this rank's optimizer owns,
// exactly as a resume does, and --export-llmc gathers and writes them; under
// 3d_parallel that range is of the rank's part of the model
// (trainer_whole_index). The bf16 params are bf16(master) on both sides, so
// a model exported here and loaded back runs the same forward pass bit for bit.
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "gpt_grid.h"
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

size_t trainer_whole_index(const Trainer *t, size_t s) {
    return grid_whole_index(&t->layout, t->state_ranges, t->nstate_ranges, s);
}
// State elements [begin, begin + n) from the file, read per state range as
// the whole-model span its elements cover (a stage's units, or one tp part
// of wte), so no rank reads more than its pipeline stage of the model.
static void read_state_range(Trainer *t, const LlmcHeader *h, const GPTLayout *whole, size_t begin, size_t n,
                             float *out) {
    char err[512];
    memset(out, 0, n * sizeof(float));  // padding, and wte's padding rows under tp
    size_t at = 0;
    for (int k = 0; k < t->nstate_ranges; at += t->state_ranges[k].count, k++) {
        size_t lo = begin > at ? begin : at, end = at + t->state_ranges[k].count;
        size_t hi = begin + n < end ? begin + n : end;
        size_t first = SIZE_MAX, last = 0;  // the whole-model span of [lo, hi)
        for (size_t s = lo; s < hi; s++) {
            size_t g = trainer_whole_index(t, s);
            if (g == GPT_PADDING) continue;
            if (g < first) first = g;
            if (g + 1 > last) last = g + 1;
        }
        if (first >= last) continue;
        float *span = xmalloc((last - first) * sizeof(float));
        if (llmc_read_range(t->cfg.init_from, h, whole, first, last, span, err, sizeof err))
            fail_rank(EXIT_USAGE, "%s", err);
        for (size_t s = lo; s < hi; s++) {
            size_t g = trainer_whole_index(t, s);
            if (g != GPT_PADDING) out[s - begin] = span[g - first];
        }
        free(span);
    }
}

void trainer_init_from(Trainer *t) {
    const char *path = t->cfg.init_from;
    LlmcHeader h;
    char err[512];
    if (llmc_read_header(path, &h, err, sizeof err)) fail_usage("%s", err);
    GPTLayout whole;
    gpt_layout(&whole, &t->layout.cfg);
    size_t n = t->st.optim_count;
    Buf host = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, n * sizeof(float), "llm.c weights staging");
    read_state_range(t, &h, &whole, t->st.optim_begin, n, host.ptr);
    copy_master(t, host.ptr, 0);
    buf_free(&t->dev, &host);
    t->strategy->params_from_master(t);  // m and v are zero from states_init: a fresh AdamW
    if (t->world.rank == 0)
        printf("initial weights: %s (llm.c version %d, %s; wte's %d rows read, its padding to %d rows zero)\n",
               path, h.version, h.version == LLMC_VERSION_FP32 ? "fp32" : "bf16", h.cfg.vocab_size,
               gpt_vocab_padded(h.cfg.vocab_size, 1));
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
            out_file_abandon(tmp);
        } else {
            snprintf(msg, sizeof msg, "--export-llmc %s: cannot write there (%s)", path, strerror(errno));
        }
    }
    mpiCheck(MPI_Bcast(&rc, 1, MPI_INT, 0, t->world.mpi));
    if (rc) fail_usage("%s", msg);  // rank 0 prints it
}

// Every rank sends rank 0 the master weights of its optimizer range with
// their whole-model indices (an unsharded optimizer's replicas: dp rank 0
// only); rank 0 puts them in place and writes the whole model. Under tp and
// pp the parts come from every stage and tp rank; a tensor held twice (a tp
// replicated layernorm, the last stage's wte copy) holds the same values.
void trainer_export_llmc(Trainer *t) {
    size_t n = t->st.optim_count;
    int ranks = t->world.size, me = t->world.rank;
    GPTLayout whole;
    gpt_layout(&whole, &t->layout.cfg);
    Buf mine = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, n * sizeof(float), "llm.c export staging");
    copy_master(t, mine.ptr, 1);
    int sends = t->st.layout.optim == STATE_SHARD || t->dp->rank == 0;
    float *val = xmalloc((n ? n : 1) * sizeof(float));
    uint64_t *idx = xmalloc((n ? n : 1) * sizeof(uint64_t));
    size_t count = 0;
    for (size_t i = 0; i < n && sends; i++) {
        size_t g = trainer_whole_index(t, t->st.optim_begin + i);
        if (g == GPT_PADDING) continue;
        val[count] = ((const float *)mine.ptr)[i];
        idx[count++] = g;
    }
    CHECK(count <= INT_MAX, "export: %zu elements are more than one MPI_Gatherv moves", count);
    int mine_count = (int)count, *counts = xcalloc((size_t)ranks, sizeof(int)), *displs = xcalloc((size_t)ranks, sizeof(int));
    mpiCheck(MPI_Gather(&mine_count, 1, MPI_INT, counts, 1, MPI_INT, 0, t->world.mpi));
    size_t total = 0;
    for (int q = 0; q < ranks && me == 0; q++) {
        CHECK(total + (size_t)counts[q] <= INT_MAX, "export: the model's %zu+ elements are more than one "
              "MPI_Gatherv moves", total + (size_t)counts[q]);
        displs[q] = (int)total;
        total += (size_t)counts[q];
    }
    float *all_val = me == 0 ? xmalloc((total ? total : 1) * sizeof(float)) : NULL;
    uint64_t *all_idx = me == 0 ? xmalloc((total ? total : 1) * sizeof(uint64_t)) : NULL;
    mpiCheck(MPI_Gatherv(val, mine_count, MPI_FLOAT, all_val, counts, displs, MPI_FLOAT, 0, t->world.mpi));
    mpiCheck(MPI_Gatherv(idx, mine_count, MPI_UINT64_T, all_idx, counts, displs, MPI_UINT64_T, 0, t->world.mpi));
    char err[512] = "";
    int rc = 0;
    if (me == 0) {
        Buf model = buf_alloc(&t->dev, TIER_HOST, CAT_WORKSPACE, whole.num_params * sizeof(float), "llm.c export");
        float *w = model.ptr;
        memset(w, 0, whole.num_params * sizeof(float));
        for (size_t j = 0; j < total; j++) w[all_idx[j]] = all_val[j];
        rc = llmc_write(t->cfg.export_llmc, &whole, w, err, sizeof err);
        buf_free(&t->dev, &model);
    }
    mpiCheck(MPI_Bcast(&rc, 1, MPI_INT, 0, t->world.mpi));
    if (rc) fail_usage("%s", err);  // rank 0 prints its message
    if (me == 0)
        printf("exported: %s (llm.c GPT-2 checkpoint, version 3, fp32 master weights of step %ld)\n",
               t->cfg.export_llmc, t->step);
    free(all_val);
    free(all_idx);
    free(counts);
    free(displs);
    free(val);
    free(idx);
    buf_free(&t->dev, &mine);
}
