// ckpt_tool.c: a sharded checkpoint of any stage (01-06 at any rank count,
// 3d_parallel at any grid), read from its files alone, with no MPI job:
// what it holds, whether its bytes are intact, the weights as llm.c reads
// them, and the whole state consolidated into one part that any stage
// resumes at any rank count or grid. A grid's parts are pieces of the
// model (gpt_grid.h); each whole tensor is gathered from the parts that
// hold its pieces (ckpt_reshard.c), so the consolidated file is the same
// whatever grid saved it. A tool of its own rather than a trainer's flag: it needs no model,
// no device and no ranks, and its memory stays bounded (a chunk at a time)
// whatever the model's size. DeepSpeed's zero_to_fp32.py and
// ds_to_universal.py answer the same two needs.
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "ckpt.h"
#include "ckpt_manifest.h"
#include "gpt_grid.h"
#include "llmc.h"
#include "out_file.h"
#include "states.h"
#include "stop.h"

#define PATH_BYTES 4096
#define CHUNK_ELEMS ((size_t)1 << 20)  // elements read and written at a time

static const char *const STATE_TENSORS[3] = {"master", "adam_m", "adam_v"};

static void usage(FILE *f) {
    fprintf(f, "usage: ckpt_tool info CKPT | verify CKPT | export-llmc CKPT OUT.bin | consolidate CKPT OUT_DIR\n"
               "  CKPT: a --save folder (its latest step) or a step folder, of dp_baseline, zero1-3, cpu_offload\n"
               "        or infinity at any rank count, or of 3d_parallel at any grid\n"
               "  info         the run, and the flat range of the parameters each part holds (the layout a\n"
               "               resharded --resume reads)\n"
               "  verify       every part read whole against its checksums\n"
               "  export-llmc  the fp32 master weights as an llm.c GPT-2 checkpoint (version 3), as the run's\n"
               "               own --export-llmc writes them\n"
               "  consolidate  the whole training state (master, Adam m and v over all parameters, the step and\n"
               "               data position) as one part beside its manifest: dp_baseline's layout at 1 rank,\n"
               "               which every stage resumes at any rank count or grid (--resume OUT_DIR);\n"
               "               a --dpu checkpoint's device_params (the params a step behind) are not carried\n");
}

typedef struct Ckpt {
    char step_dir[PATH_BYTES];
    char *text;  // the manifest
    CkptManifest m;  // num_params: the whole model's, also for a grid's (whose manifest has its tp part's)
    int replicas;    // data-parallel replicas: the ranks, or a grid's D (its cp ranks included: the parts' shards)
    int data_replicas;  // of them, those that read rows of their own (a grid's D / cp)
    CkptSource *src;  // the parts, mapped once
} Ckpt;

// One line and exit 2; what the tool made of an output goes first
// (consolidate's files are tracked: stop.h), so a rerun finds no half of it.
__attribute__((noreturn, format(printf, 1, 2))) static void fail_tool(const char *fmt, ...) {
    stop_remove_files();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ckpt_tool: error: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void open_ckpt(const char *dir, Ckpt *c) {
    char msg[MSG_BYTES] = "";
    long len = 0;
    if (ckpt_find_manifest(dir, c->step_dir, &c->text, &len, msg)) fail_tool("%s", msg);
    char *copy = xmalloc((size_t)len + 1);
    memcpy(copy, c->text, (size_t)len + 1);
    int bad = manifest_parse(copy, dir, -1, &c->m, NULL, msg);
    free(copy);
    // what a resume refuses, verify refuses: ckpt_manifest_consistent is both's
    if (bad || ckpt_manifest_consistent(dir, &c->m, msg)) fail_tool("%s", msg);
    c->replicas = c->data_replicas = c->m.ranks;
    int T, P;
    if (c->m.grid[0]) {  // manifest_parse checked it against the ranks
        grid_parse(c->m.grid, &T, &P, &c->replicas);
        c->data_replicas = c->replicas / grid_seq_parts(c->m.grid);
        GPTLayout whole;
        gpt_layout(&whole, &c->m.cfg);
        c->m.num_params = whole.num_params;
    }
    c->src = ckpt_source_open(c->step_dir, c->text, &c->m);
}

// An output inside the checkpoint folder the tool reads (a part, the
// manifest, `latest`, a step folder a later save would meet) would write
// over it: refused, as a trainer's outputs inside its --save folder are.
static void check_output_outside(const char *cmd, const char *ckpt, const char *out) {
    char root[PATH_BYTES], resolved[PATH_BYTES];
    ckpt_root(ckpt, root, sizeof root);
    out_file_resolve(out, resolved, sizeof resolved);
    if (out_path_within(resolved, root))
        fail_tool("%s %s is inside the checkpoint folder it reads (%s); give it a path of its own", cmd, out, root);
}

// A grid's parts: what part q holds (gpt_grid.h).
static void grid_info(const Ckpt *c) {
    printf("layout: the grid %s; part q = (stage·%d + replica)·T + tp rank holds its ZeRO-1 shard (of the %d "
           "replicas) of its states: [its wte part (last stage of a pipeline) | its stage's units], each tensor's "
           "tp part; a tensor's whole-model elements come from the parts holding its pieces\n", c->m.grid,
           c->replicas, c->replicas);
    int T, P, D;
    grid_parse(c->m.grid, &T, &P, &D);
    GridPart *g = xmalloc(sizeof *g);
    for (int q = 0; q < c->m.ranks; q++) {
        grid_part_init(g, &c->m.cfg, T, P, D, grid_chunks(c->m.grid), q);
        printf("  part %d: tp rank %d, stage %d, replica %d: state elements [%zu, %zu) of %zu\n", q, g->tp_rank,
               g->stage, g->replica, g->shard.begin, g->shard.end, g->shard.num_params);
        grid_part_free(g);
    }
    free(g);
}

// A data-parallel stage's parts: each one's range of the flat layout.
static void flat_info(const CkptManifest *m) {
    if (strcmp(m->stage, "dp_baseline") == 0) {
        printf("layout: replicated, saved whole by rank 0\n  part 0: flat elements [0, %zu)\n", m->num_params);
        for (int q = 1; q < m->ranks; q++) printf("  part %d: none\n", q);
        return;
    }
    Partition p;
    partition_init(&p, m->num_params, m->ranks, 0);
    printf("layout: Ψ = %zu padded to %zu (a multiple of %d ranks x 64), cut into shards of %zu, zero past Ψ\n",
           m->num_params, p.padded, m->ranks, p.shard);
    for (int q = 0; q < m->ranks; q++) {
        partition_init(&p, m->num_params, m->ranks, q);
        char padding[64] = "";
        if (p.end > p.num_params)
            snprintf(padding, sizeof padding, " (padding from %zu)", p.begin > p.num_params ? p.begin : p.num_params);
        printf("  part %d: flat elements [%zu, %zu)%s\n", q, p.begin, p.end, padding);
    }
}

static void info(const Ckpt *c) {
    const CkptManifest *m = &c->m;
    printf("%s: %s at %d ranks, step %ld, data row %" PRIu64 "\n", c->step_dir, m->stage, m->ranks, m->step,
           m->data_rows);
    printf("model: %zu parameters (L=%d C=%d H=%d V=%d, wte of %d rows, T=%d); global batch %d x %d %s x %d = %d "
           "rows of %d tokens\n", m->num_params, m->cfg.num_layers, m->cfg.channels, m->cfg.num_heads,
           m->cfg.vocab_size, m->vocab_padded, m->cfg.max_seq_len, m->batch, c->data_replicas,
           m->grid[0] ? "replicas" : "ranks", m->grad_accum,
           m->batch * c->data_replicas * m->grad_accum, m->seq_len);
    if (m->grid[0]) {
        grid_info(c);
        return;
    }
    flat_info(m);
    printf("tensors of each part: master, adam_m, adam_v (fp32) over its range, and device_params (bf16) "
           "under cpu_offload --dpu\n");
    if (strcmp(m->precision, "fp16") == 0)
        printf("precision: fp16; loss scale %g at the save, %ld step%s skipped for an overflow so far\n", m->loss_scale,
               m->skipped_steps, m->skipped_steps == 1 ? "" : "s");
    else printf("precision: %s\n", m->precision);
}

static int from_checkpoint(void *ctx, size_t begin, size_t n, float *out) {
    const Ckpt *c = ctx;
    char msg[MSG_BYTES] = "";
    if (ckpt_source_read(c->src, "master", sizeof(float), begin, n, out, msg) == 0) return 0;
    fprintf(stderr, "ckpt_tool: error: %s\n", msg);
    exit(2);
}

static void export_llmc(const Ckpt *c, const char *out) {
    GPTLayout l;
    gpt_layout(&l, &c->m.cfg);
    CHECK(l.num_params == c->m.num_params, "the manifest's model shape gives %zu parameters, its num_params %zu",
          l.num_params, c->m.num_params);
    char err[1024];
    if (llmc_write_from(out, "export-llmc", &l, from_checkpoint, (void *)c, err, sizeof err)) fail_tool("%s", err);
    printf("exported: %s (llm.c version 3, fp32 master weights of step %ld, %zu parameters)\n", out, c->m.step,
           c->m.num_params);
}

static void write_all_at(int fd, const void *p, size_t n, off_t off, const char *path) {
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(fd, (const char *)p + done, n - done, off + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail_tool("cannot write %s: %s; check free space and the file size limit", path,
                              w < 0 ? strerror(errno) : "nothing written");
        done += (size_t)w;
    }
}

// A new file or folder of the consolidated checkpoint: tracked until the
// whole is written, so that a failure or a signal removes it (fail_tool,
// stop.h). The signals wait from its creation to its tracking: one between
// them would leave it behind.
static int create_file(const char *path) {
    stop_hold();
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644), err = errno;
    if (fd >= 0) stop_track(path, 0);
    stop_release();
    if (fd < 0) fail_tool("cannot create %s: %s", path, strerror(err));
    return fd;
}

static void create_folder(const char *path) {
    stop_hold();
    int failed = mkdir(path, 0755), err = errno;
    if (!failed) stop_track(path, 1);
    stop_release();
    if (failed) fail_tool("cannot create %s: %s", path, strerror(err));
}

static void close_file(int fd, const char *path) {
    if (stop_fsync(fd) || close(fd))
        fail_tool("cannot write %s: %s; check free space and the file size limit", path, strerror(errno));
}

static void write_text(const char *path, const char *text, size_t len) {
    int fd = create_file(path);
    write_all_at(fd, text, len, 0, path);
    close_file(fd, path);
}

typedef struct WholePart {
    PartHeader h;
    PartEntry e[3];
} WholePart;

// master, m and v over all Ψ into the part after its header, a chunk at a
// time, each tensor's checksum into its entry; returns the part's size.
static off_t stream_states(const Ckpt *c, int fd, const char *part, WholePart *head) {
    size_t psi = c->m.num_params;
    float *buf = xmalloc(CHUNK_ELEMS * sizeof(float));
    off_t off = (off_t)sizeof *head;
    char msg[MSG_BYTES] = "";
    for (int k = 0; k < 3; k++) {
        snprintf(head->e[k].name, sizeof head->e[k].name, "%s", STATE_TENSORS[k]);
        head->e[k].bytes = psi * sizeof(float);
        uint64_t sum = 14695981039346656037ull;
        for (size_t done = 0; done < psi; done += CHUNK_ELEMS) {
            size_t n = psi - done < CHUNK_ELEMS ? psi - done : CHUNK_ELEMS;
            if (ckpt_source_read(c->src, STATE_TENSORS[k], sizeof(float), done, n, buf, msg))
                fail_tool("%s", msg);
            sum = fnv1a64(buf, n * sizeof(float), sum);
            write_all_at(fd, buf, n * sizeof(float), off, part);
            off += (off_t)(n * sizeof(float));
        }
        head->e[k].checksum = sum;
    }
    free(buf);
    return off;
}

// One part of the whole state: its header and entries are written last,
// once the tensors' checksums are known (the data streams a chunk at a time).
static void consolidate(const Ckpt *c, const char *out) {
    struct stat st;
    if (lstat(out, &st) == 0) fail_tool("%s exists; give a new folder", out);
    if (strlen(out) > PATH_BYTES - 64) fail_tool("%s: the folder's name is too long", out);
    if ((long long)c->m.batch * c->data_replicas > GPT_MAX_BATCH)
        fail_tool("%s: its global batch of %d x %d replicas rows per micro-batch is more than one part's batch takes "
                  "(%d): resume the checkpoint itself instead", out, c->m.batch, c->data_replicas, GPT_MAX_BATCH);
    char step_dir[PATH_BYTES], part[PATH_BYTES + 32], manifest[PATH_BYTES + 32], latest_path[PATH_BYTES + 32];
    snprintf(step_dir, sizeof step_dir, "%s/step-%08ld", out, c->m.step);
    create_folder(out);
    create_folder(step_dir);
    snprintf(part, sizeof part, "%s/rank-00000.bin", step_dir);
    int fd = create_file(part);
    WholePart head;
    memset(&head, 0, sizeof head);
    memcpy(head.h.magic, "WBCKPT01", 8);
    head.h.version = 1;
    head.h.ranks = 1;
    head.h.ntensors = 3;
    head.h.step = c->m.step;
    off_t off = stream_states(c, fd, part, &head);
    write_all_at(fd, &head, sizeof head, 0, part);
    close_file(fd, part);
    // dp_baseline at 1 rank, with the saved run's global batch in that one rank's batch
    CkptManifest m = c->m;
    snprintf(m.stage, sizeof m.stage, "dp_baseline");
    m.batch = c->m.batch * c->data_replicas;
    m.ranks = 1;
    m.grid[0] = 0;
    PartInfo info = {fnv1a64(&head, sizeof head, 14695981039346656037ull), (uint64_t)off};
    size_t len = 0;
    char *text = manifest_text(&m, 1, &info, &len);
    snprintf(manifest, sizeof manifest, "%s/manifest.txt", step_dir);
    write_text(manifest, text, len);
    free(text);
    char latest[32];
    snprintf(latest, sizeof latest, "step-%08ld\n", m.step);
    snprintf(latest_path, sizeof latest_path, "%s/latest", out);
    write_text(latest_path, latest, strlen(latest));
    const char *made[] = {out, step_dir, part, manifest, latest_path};  // all written: none goes now
    char done[PATH_BYTES + 64];
    snprintf(done, sizeof done, "after consolidating into %s, which is whole", out);
    stop_hold();  // a signal now finds the whole folder, and says so
    for (int i = 0; i < 5; i++) stop_forget(made[i]);
    stop_note_task(done);
    stop_release();
    printf("consolidated: %s (step %ld: master, adam_m, adam_v over all %zu parameters in one part of %" PRIu64
           " bytes); resume it with --resume %s under any stage at any rank count or grid with a global batch "
           "of %d rows\n", out, m.step, m.num_params, (uint64_t)off, out, m.batch * m.grad_accum);
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    // past the file size limit a write fails (EFBIG) and is said in one line, not a kill by SIGXFSZ
    signal(SIGXFSZ, SIG_IGN);
    int two = argc == 3, three = argc == 4;
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!(two && (!strcmp(cmd, "info") || !strcmp(cmd, "verify"))) &&
        !(three && (!strcmp(cmd, "export-llmc") || !strcmp(cmd, "consolidate")))) {
        usage(stderr);
        return 2;
    }
    Ckpt c;
    open_ckpt(argv[2], &c);
    if (three) check_output_outside(cmd, argv[2], argv[3]);
    if (three) {
        // SIGINT or SIGTERM mid-way removes what was written (the files are
        // tracked), so that a rerun finds no half of the output
        char task[PATH_BYTES + 96];
        snprintf(task, sizeof task, "while %s %s; what it had written is removed",
                 !strcmp(cmd, "consolidate") ? "consolidating into" : "exporting to", argv[3]);
        stop_note_task(task);
        stop_catch_signals(0);
    }
    if (!strcmp(cmd, "info")) info(&c);
    if (!strcmp(cmd, "verify")) {
        char msg[MSG_BYTES] = "";
        if (ckpt_verify_parts(c.step_dir, c.text, &c.m, msg)) fail_tool("%s", msg);
        printf("verified: %d parts of %s, every tensor against its checksum\n", c.m.ranks, c.step_dir);
    }
    if (!strcmp(cmd, "export-llmc")) export_llmc(&c, argv[3]);
    if (!strcmp(cmd, "consolidate")) consolidate(&c, argv[3]);
    ckpt_source_close(c.src);
    free(c.text);
    return 0;
}
