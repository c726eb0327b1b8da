// infinity_ops.c: what stage 06 needs around its technique: its flags and
// their refusals, where things live (one line), stopping every rank on an
// I/O error, the bytes the swapper moved, and checkpoints of the states in
// the files (see infinity.h).
#include <string.h>
#include "check.h"
#include "infinity.h"

// ---- flags ----

int infinity_flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    z->offload_params = "none";
    z->offload_optimizer = "nvme";
    z->sub_group_mb = SUB_GROUP_MB_DEFAULT;
    z->aio_block_kb = AIO_BLOCK_KB_DEFAULT;
    z->aio_queue_depth = AIO_QUEUE_DEPTH_DEFAULT;
    out[0] = (FlagSpec){.name = "nvme-path", .type = FLAG_STRING, .dst = &z->nvme_path, .meta = "DIR",
                        .help = "folder on a disk for the swap files (DIR/rank-R/, locked for the run), removed "
                                "however the run ends (an error, SIGTERM, SIGINT; not SIGKILL)",
                        .shown_default = "none: required where a state is on NVMe, refused where none is"};
    out[1] = (FlagSpec){.name = "offload-params", .type = FLAG_STRING, .dst = &z->offload_params,
                        .meta = "none|cpu|nvme", .help = "where the bf16 param shard lives: device, pinned host memory, NVMe"};
    out[7] = (FlagSpec){.name = "offload-optimizer", .type = FLAG_STRING, .dst = &z->offload_optimizer,
                        .meta = "cpu|nvme", .help = "where fp32 master, m and v live: pinned host memory, or files on "
                        "NVMe swapped through pinned slots (DeepSpeed's offload_optimizer.device)"};
    out[2] = (FlagSpec){.name = "sub-group-mb", .type = FLAG_DOUBLE, .dst = &z->sub_group_mb, .meta = "MB",
                        .help = "fp32 master, m and v per sub-group of the swapper (three in pinned memory at once)",
                        .min = 0, .min_open = 1, .max = 1e6};
    out[3] = (FlagSpec){.name = "aio-block-kb", .type = FLAG_INT, .dst = &z->aio_block_kb, .meta = "KB",
                        .help = "size of one aio request to the disk (a multiple of 4)", .min = 4, .max = 1 << 20};
    out[4] = (FlagSpec){.name = "aio-queue-depth", .type = FLAG_INT, .dst = &z->aio_queue_depth, .meta = "N",
                        .help = "aio requests kept in the disk's queue", .min = 1, .max = 1024};
    out[5] = grad_shard_flag(&z->bucket_mb);
    out[6] = param_shard_flag(&z->prefetch);
    return 8;
}

static ParamsAt params_at_of(const char *s) {
    if (strcmp(s, "none") == 0) return PARAMS_DEVICE;
    if (strcmp(s, "cpu") == 0) return PARAMS_CPU;
    if (strcmp(s, "nvme") == 0) return PARAMS_NVME;
    fail_usage("--offload-params %s: choose none (the param shard on the device), cpu (pinned host memory) "
               "or nvme", s);
}

static OptimAt optim_at_of(const char *s) {
    if (strcmp(s, "cpu") == 0) return OPTIM_CPU;
    if (strcmp(s, "nvme") == 0) return OPTIM_NVME;
    fail_usage("--offload-optimizer %s: choose cpu (master, m and v in pinned host memory) or nvme (in files on "
               "NVMe)", s);
}

// A setting that only the files on NVMe use, with nothing on NVMe: refused
// from the command line; from a DeepSpeed config (which may name an
// nvme_path beside device "cpu", as DeepSpeed's own examples do) ignored,
// its value back to the default and its key saying why.
static void nvme_only(Settings *s, const char *flag, const char *where) {
    Setting *x = settings_find(s, flag);
    if (!x || x->from == FROM_DEFAULT) return;
    if (x->from == FROM_COMMAND_LINE)
        fail_usage("--%s: nothing goes to NVMe with %s; leave it out, or put a state there (--offload-optimizer "
                   "nvme or --offload-params nvme)", flag, where);
    char set[64];
    snprintf(set, sizeof set, "--%s ", flag);  // the effect of a key that set the flag (ds_config_keys.c)
    for (int i = 0; i < s->nkeys; i++) {
        if (strncmp(s->key[i].effect, set, strlen(set)) != 0) continue;
        char key[sizeof s->key[i].key];
        snprintf(key, sizeof key, "%s", s->key[i].key);  // settings_key rewrites the entry it names
        settings_key(s, key, "ignored by infinity: nothing goes to NVMe with %s", where);
    }
    settings_mark(s, flag, FROM_DEFAULT, "%s", "");
}

void infinity_check_flags(Stage *z, Settings *s) {
    z->params_at = params_at_of(z->offload_params);
    z->optim_at = optim_at_of(z->offload_optimizer);
    z->on_nvme = z->params_at == PARAMS_NVME || z->optim_at == OPTIM_NVME;
    if (!z->on_nvme) {
        char where[96];
        snprintf(where, sizeof where, "--offload-params %s --offload-optimizer cpu", z->offload_params);
        nvme_only(s, "nvme-path", where);
        nvme_only(s, "aio-block-kb", where);
        nvme_only(s, "aio-queue-depth", where);
        z->nvme_path = NULL;
        z->aio_block_kb = AIO_BLOCK_KB_DEFAULT;
        z->aio_queue_depth = AIO_QUEUE_DEPTH_DEFAULT;
        return;
    }
    if (!z->nvme_path)
        fail_usage("--nvme-path DIR is missing: give a folder on a disk-backed file system (ext4, xfs) with room "
                   "for the states (memory_math --model NAME --ranks N prints the nvme bytes), or keep every state "
                   "on the host: --offload-params cpu --offload-optimizer cpu");
    if (z->aio_block_kb % 4)  // the flag's range holds the rest
        fail_usage("--aio-block-kb %d: give a multiple of 4 (O_DIRECT moves whole 4 KiB blocks) from 4 to 1048576",
                   z->aio_block_kb);
}

void infinity_say_where(Trainer *t, Stage *z) {
    if (t->world.rank != 0) return;
    static const char *const where[3] = {"on the device", "in pinned host memory", "on NVMe"};
    const char *optim = z->optim_at == OPTIM_CPU ? "; master, m, v in pinned host memory" : "";
    if (!z->on_nvme) {
        printf("host: nothing on NVMe; bf16 params %s%s; %d sub-group%s of %zu elements\n", where[z->params_at],
               optim, z->swap.groups, z->swap.groups == 1 ? "" : "s", z->swap.group_elems);
        return;
    }
    double file_gb = 0;
    for (int i = 0; i < SWAP_TENSORS; i++) file_gb += aio_round_up(z->files.payload[i]) / 1e9;
    printf("nvme: %.3f GB of files per rank under %s/rank-*/; bf16 params %s%s; %d sub-group%s of %zu "
           "elements; aio %d KiB x %d deep\n", file_gb, z->nvme_path, where[z->params_at], optim, z->swap.groups,
           z->swap.groups == 1 ? "" : "s", z->swap.group_elems, z->aio_block_kb, z->aio_queue_depth);
}

// ---- I/O errors and bytes ----

// A read or write that failed on any rank stops every rank here, where all
// of them arrive, with one line (the job may not go on with a state it could
// not save or read back). The swap files are scratch: they go first.
void infinity_stop_on_io_error(Trainer *t, Stage *z, int rc) {
    int any = 0;
    mpiCheck(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, t->world.mpi));
    if (!any) return;
    if (z->params_at != PARAMS_DEVICE) param_fetch_forget(&z->fetch, t);
    swapper_drain(&z->swap);
    if (z->on_nvme) nvme_files_remove(&z->files, t);
    char msg[2 * AIO_ERR_BYTES] = "";
    if (rc)
        snprintf(msg, sizeof msg, "step %ld: %s; the run stops here (%s)", t->step + 1, z->swap.error_msg,
                 t->cfg.save ? "the last checkpoint in --save is as it was: it does not need the swap files"
                             : "no --save: there is no checkpoint to resume from");
    nvme_agree(t, rc != 0, msg);
}

// The pass's reads and writes counted for the step, or dropped (set-up,
// checkpoints: not a step's traffic).
void infinity_take_nvme_bytes(Trainer *t, Stage *z, int count) {
    double read_bytes, write_bytes;
    long waited, ahead;
    swapper_take_bytes(&z->swap, &read_bytes, &write_bytes);
    swapper_take_reads(&z->swap, &waited, &ahead);
    if (!count) return;
    count_transfer(t, XFER_NVME_READ, read_bytes);
    count_transfer(t, XFER_NVME_WRITE, write_bytes);
    z->update_passes++;
    z->reads_waited += waited;
    z->reads_asked_ahead += ahead;
}

// The pipeline's promise, in counts rather than times: a sub-group's read
// is asked for before the pass needs it (swapper_progress asks for the first
// ones during forward and backward, the pass for k + 1 before the work on
// k), so that it can overlap the work; whether the disk is done by then is
// timing, and the trace shows it.
void infinity_report(Trainer *t, FILE *json) {
    Stage *z = t->sctx;
    param_shard_report(&z->params, t, json);  // zero3's gathers
    if (t->world.rank != 0 || !z->update_passes || z->optim_at != OPTIM_NVME) return;
    double n = (double)z->update_passes;
    if (!t->cfg.quiet)
        printf("swap reads per update: %.2f waited for, %.2f of them asked for ahead (formula: every sub-group, "
               "%d)\n", (double)z->reads_waited / n, (double)z->reads_asked_ahead / n, z->swap.groups);
    if (json)
        fprintf(json, ",\"swap_reads\":{\"passes\":%ld,\"waited\":%ld,\"asked_ahead\":%ld,"
                      "\"per_pass_formula\":%d}", z->update_passes, z->reads_waited, z->reads_asked_ahead,
                z->swap.groups);
}

// ---- checkpoints: master, m and v through the swapper ----

typedef struct HostCopy {
    void *const *host;
    int saving;
} HostCopy;

static void copy_group(const SwapGroup *g, void *arg) {
    const HostCopy *c = arg;
    float *slot[3] = {g->master, g->m, g->v};
    for (int i = 0; i < 3; i++) {
        float *host = (float *)c->host[i] + g->first;
        if (c->saving) memcpy(host, slot[i], g->count * sizeof(float));
        else memcpy(slot[i], host, g->count * sizeof(float));
    }
}

// Between the files and the checkpoint's host copies, either way.
static void copy_states(Trainer *t, Stage *z, CkptStates *c, int saving) {
    CHECK(c->optim_bytes == t->part.shard * sizeof(float), "checkpoint tensors of %zu bytes, shard of %zu",
          c->optim_bytes, t->part.shard * sizeof(float));
    HostCopy hc = {.host = c->optim, .saving = saving};
    // in files: read them to save, write them after a load; in memory the pass's slots are the states
    unsigned io = z->optim_at == OPTIM_NVME ? (saving ? SWAP_READ : SWAP_WRITE) : 0;
    int rc = swapper_pass(&z->swap, io, copy_group, &hc);
    if (!rc) rc = swapper_drain(&z->swap);  // in the files before anything reads them
    infinity_take_nvme_bytes(t, z, 0);
    infinity_stop_on_io_error(t, z, rc);
}

// The checkpoint holds the states themselves, never the swap files: a run
// resumes into fresh files wherever its --nvme-path points.
void infinity_ckpt_out(Trainer *t, CkptStates *c) { copy_states(t, t->sctx, c, 1); }

void infinity_ckpt_in(Trainer *t, CkptStates *c, int loaded) {
    if (!loaded) return;
    copy_states(t, t->sctx, c, 0);
    infinity_params_from_master(t);
}

