// ckpt_reshard.c: a checkpoint read into another stage's, rank count's or
// grid's layout. Every stage keeps the same state (master, Adam m and v,
// and under cpu_offload --dpu the device's params); only the cut differs.
// So a load goes through the whole model's flat layout (tp 1, stages
// 01-06's buffer): each part's elements and each of the run's tensors are
// runs of whole-model indices, and a rank reads from a part exactly the
// runs the two share.
//   - data parallel (01-06): dp_baseline's part 0 holds all Ψ elements (its
//     other parts none); a sharded stage's part q holds q's shard of Ψ_pad,
//     Ψ rounded up to a multiple of ranks x 64 (states.h's partition), whose
//     padding past Ψ is zero. So a zero3 shard and a zero1 shard of the
//     same parameters are the same bytes at the same flat offsets.
//   - 3d_parallel (manifest line `grid = tp T x pp P x dp D`): part q holds
//     rank q's ZeRO-1 shard of its states, [wte copy | its stage's units] of
//     its tp part (gpt_grid.h), pieces of the whole model (a row-parallel
//     matrix's rows cut in T, the wte rows of its vocabulary part; a
//     layernorm whole on every tp rank, wte on both ends of a pipeline).
//
// Each rank reads from each part only the bytes of its own runs (a
// replicated run's rank 0 reads all Ψ; trainer_resume broadcasts them); a
// whole-model element a grid keeps twice (a tp-replicated layernorm, the
// tied wte) is read once, from one part (grid_part_whole_once). Rank q mod N
// reads part q's tensors whole to check their checksums, so every byte on
// disk is verified once.
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "ckpt.h"
#include "ckpt_manifest.h"
#include "gpt_grid.h"
#include "states.h"

#define PATH_BYTES 4096
#define VERIFY_CHUNK ((size_t)4 << 20)  // the bounded buffer a part's checksums are computed through

// What part q of the saved run holds: `count` elements per tensor, whose
// whole-model indices are `runs` (in the part's order).
typedef struct PartMap {
    size_t count;
    CkptRun *runs;
    size_t nruns;
} PartMap;

typedef struct RunList {
    CkptRun *runs;
    size_t n, cap;
} RunList;

// Element `at` is whole-model element `whole`: extends the last run or opens one.
static void run_add(RunList *l, size_t at, size_t whole) {
    CkptRun *last = l->n ? &l->runs[l->n - 1] : NULL;
    if (last && last->at + last->count == at && last->whole + last->count == whole) {
        last->count++;
        return;
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->runs = realloc(l->runs, l->cap * sizeof *l->runs);
        CHECK(l->runs, "out of host memory for %zu checkpoint runs", l->cap);
    }
    l->runs[l->n++] = (CkptRun){at, whole, 1};
}

static int by_whole(const void *a, const void *b) {
    size_t x = ((const CkptRun *)a)->whole, y = ((const CkptRun *)b)->whole;
    return (x > y) - (x < y);
}

CkptRun *ckpt_runs_of(size_t (*whole)(const void *ctx, size_t s), const void *ctx, size_t begin, size_t n,
                      size_t *nruns) {
    RunList l = {0};
    for (size_t i = 0; i < n; i++) {
        size_t g = whole(ctx, begin + i);
        if (g != GPT_PADDING) run_add(&l, i, g);
    }
    if (l.n) qsort(l.runs, l.n, sizeof *l.runs, by_whole);
    *nruns = l.n;
    return l.runs;
}

static size_t grid_part_at(const void *gp, size_t i) { return grid_part_whole_once(gp, i); }

static void part_map(const CkptManifest *m, int q, PartMap *pm) {
    int T, P, D;
    if (m->grid[0] && !grid_parse(m->grid, &T, &P, &D)) {
        GridPart *gp = xmalloc(sizeof *gp);
        grid_part_init(gp, &m->cfg, T, P, D, grid_chunks(m->grid), q);
        pm->count = gp->shard.shard;
        pm->runs = ckpt_runs_of(grid_part_at, gp, 0, pm->count, &pm->nruns);
        grid_part_free(gp);
        free(gp);
        return;
    }
    size_t begin = 0;
    if (strcmp(m->stage, "dp_baseline") == 0) {  // replicated: rank 0 saved all of it
        pm->count = q == 0 ? m->num_params : 0;
    } else {
        Partition p;
        partition_init(&p, m->num_params, m->ranks, q);
        begin = p.begin;
        pm->count = p.shard;
    }
    pm->nruns = pm->count > 0;
    pm->runs = xmalloc(sizeof *pm->runs);
    pm->runs[0] = (CkptRun){0, begin, pm->count};
}

static int read_at(int fd, void *into, size_t bytes, off_t off, const char *part, char *msg) {
    for (size_t done = 0; done < bytes;) {
        ssize_t r = pread(fd, (char *)into + done, bytes - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return ckpt_corrupt(part, r < 0 ? strerror(errno) : "truncated", msg);
        done += (size_t)r;
    }
    return 0;
}

// Every tensor of the part against its entry's checksum, through a bounded buffer.
static int verify_part(int fd, const PartHeader *h, const char *part, char *msg) {
    const PartEntry *e = (const PartEntry *)(h + 1);
    char *buf = xmalloc(VERIFY_CHUNK);
    off_t off = (off_t)(sizeof *h + h->ntensors * sizeof *e);
    int rc = 0;
    for (uint32_t i = 0; i < h->ntensors && !rc; i++) {
        uint64_t sum = 14695981039346656037ull;
        for (uint64_t done = 0; done < e[i].bytes && !rc; done += VERIFY_CHUNK) {
            size_t n = e[i].bytes - done < VERIFY_CHUNK ? (size_t)(e[i].bytes - done) : VERIFY_CHUNK;
            rc = read_at(fd, buf, n, off + (off_t)done, part, msg);
            if (!rc) sum = fnv1a64(buf, n, sum);
        }
        if (!rc && sum != e[i].checksum) rc = ckpt_corrupt(part, "checksum mismatch", msg);
        off += (off_t)e[i].bytes;
    }
    free(buf);
    return rc;
}

// The part's entry named like t, and the file offset of its data; NULL with
// msg when the part has none.
static const PartEntry *find_entry(const PartHeader *h, const char *name, off_t *data_off) {
    const PartEntry *e = (const PartEntry *)(h + 1);
    off_t off = (off_t)(sizeof *h + h->ntensors * sizeof *e);
    for (uint32_t i = 0; i < h->ntensors; i++) {
        if (strncmp(e[i].name, name, CKPT_NAME_BYTES) == 0) {
            *data_off = off;
            return &e[i];
        }
        off += (off_t)e[i].bytes;
    }
    return NULL;
}

// The tensors of part q (qn elements each) against what this run loads:
// each of t[] present with t's element size, and (`whole`) nothing the run
// would drop.
static int check_tensors(const PartHeader *h, const CkptTensor *t, int n, size_t qn, int whole, const char *part,
                         char *msg) {
    const PartEntry *e = (const PartEntry *)(h + 1);
    for (uint32_t i = 0; i < h->ntensors && whole; i++) {
        int wanted = 0;
        for (int k = 0; k < n; k++) wanted |= strncmp(e[i].name, t[k].name, CKPT_NAME_BYTES) == 0;
        if (!wanted && strncmp(e[i].name, "device_params", CKPT_NAME_BYTES) == 0)
            return ckpt_msgf(msg, "checkpoint %s holds device_params, the device's params a step behind "
                             "(saved by cpu_offload --dpu): resume it under cpu_offload --dpu", part);
        if (!wanted && n > 0)
            return ckpt_msgf(msg, "checkpoint %s holds %.31s, which this run does not keep: resume with the "
                             "stage and flags that saved it", part, e[i].name);
    }
    for (int k = 0; k < n; k++) {
        off_t off;
        const PartEntry *f = find_entry(h, t[k].name, &off);
        if (!f && strcmp(t[k].name, "device_params") == 0)
            return ckpt_msgf(msg, "checkpoint %s was not saved under --dpu (it holds no device_params): "
                             "resume it without --dpu", part);
        if (!f) return ckpt_msgf(msg, "checkpoint %s holds no %s: resume with the stage that saved it", part,
                                 t[k].name);
        if (f->bytes != qn * t[k].elem_bytes)
            return ckpt_corrupt(part, "a tensor's size is not its shard's", msg);
    }
    return 0;
}

// A tensor of this run as runs of whole-model indices sorted by them: its
// own, or [flat_begin, flat_begin + count) as one.
static const CkptRun *target_runs(const CkptTensor *t, CkptRun *one, size_t *n) {
    if (t->runs) {
        *n = t->nruns;
        return t->runs;
    }
    *one = (CkptRun){0, t->flat_begin, t->bytes / t->elem_bytes};
    *n = 1;
    return one;
}

// The elements of t that source run `src` of a part holds: counted, and
// (fd >= 0) read from the tensor's data at data_off into t's host buffer.
static int copy_run(int fd, off_t data_off, const CkptTensor *t, const CkptRun *src, const char *part,
                    uint64_t *bytes, char *msg) {
    CkptRun one;
    size_t n, lo_i = 0, hi_i;
    const CkptRun *r = target_runs(t, &one, &n);
    for (hi_i = n; lo_i < hi_i;) {  // the first run ending past src->whole
        size_t mid = (lo_i + hi_i) / 2;
        if (r[mid].whole + r[mid].count <= src->whole) lo_i = mid + 1;
        else hi_i = mid;
    }
    int found = 0;
    for (size_t k = lo_i; k < n && r[k].whole < src->whole + src->count; k++) {
        size_t lo = r[k].whole > src->whole ? r[k].whole : src->whole;
        size_t hi = r[k].whole + r[k].count < src->whole + src->count ? r[k].whole + r[k].count
                                                                       : src->whole + src->count;
        if (hi <= lo) continue;
        found = 1;
        if (fd < 0) return 1;
        size_t eb = t->elem_bytes, len = (hi - lo) * eb;
        *bytes += len;
        if (read_at(fd, (char *)t->host + (r[k].at + lo - r[k].whole) * eb, len,
                    data_off + (off_t)((src->at + lo - src->whole) * eb), part, msg))
            return -1;
    }
    return found;
}

static int wants(const CkptTensor *t, int n, const PartMap *pm) {
    for (int k = 0; k < n; k++)
        for (size_t j = 0; j < pm->nruns; j++)
            if (copy_run(-1, 0, &t[k], &pm->runs[j], NULL, NULL, NULL) > 0) return 1;
    return 0;
}

// This rank's elements of t that part q holds, into its host buffer.
static int copy_part(int fd, const PartHeader *h, const CkptTensor *t, const PartMap *pm, const char *part,
                     uint64_t *bytes, char *msg) {
    off_t off = 0;
    find_entry(h, t->name, &off);  // check_tensors found it
    for (size_t j = 0; j < pm->nruns; j++)
        if (copy_run(fd, off, t, &pm->runs[j], part, bytes, msg) < 0) return 1;
    return 0;
}

// A step folder's parts and what each holds, mapped once: a grid's maps
// cost a walk over its elements, which a reader of many chunks (ckpt_tool)
// would otherwise repeat for each.
struct CkptSource {
    const char *step_dir, *manifest;
    const CkptManifest *m;
    PartMap *maps;  // one per part
};

CkptSource *ckpt_source_open(const char *step_dir, const char *manifest, const CkptManifest *m) {
    CkptSource *s = xmalloc(sizeof *s);
    *s = (CkptSource){step_dir, manifest, m, xcalloc((size_t)m->ranks, sizeof(PartMap))};
    for (int q = 0; q < m->ranks; q++) part_map(m, q, &s->maps[q]);
    return s;
}

void ckpt_source_close(CkptSource *s) {
    for (int q = 0; q < s->m->ranks; q++) free(s->maps[q].runs);
    free(s->maps);
    free(s);
}

// Part q's tensors as its stage's cut gives them, checked when a part is
// verified whole (what a read for given tensors checks of those alone):
// master, adam_m and adam_v of the part's `count` fp32 elements each, and
// cpu_offload --dpu's device_params of `count` bf16; no tensor in a part of
// none (dp_baseline's parts past the first). So a stage or grid line that
// does not describe the parts is caught by verify as by a read.
static int check_layout(const PartHeader *h, size_t count, const char *part, char *msg) {
    const PartEntry *e = (const PartEntry *)(h + 1);
    const char *states[] = {"master", "adam_m", "adam_v"};
    int found = 0;
    for (uint32_t i = 0; i < h->ntensors; i++) {
        int state = 0;
        for (int k = 0; k < 3; k++) state |= strncmp(e[i].name, states[k], CKPT_NAME_BYTES) == 0;
        int dpu = strncmp(e[i].name, "device_params", CKPT_NAME_BYTES) == 0;
        if (!state && !dpu)
            return ckpt_msgf(msg, "checkpoint %s holds %.31s, a tensor no stage saves: it is not this manifest's part",
                             part, e[i].name);
        if (e[i].bytes != count * (state ? sizeof(float) : sizeof(uint16_t)))
            return ckpt_msgf(msg, "checkpoint %s holds %.31s of %" PRIu64 " bytes, where its manifest's stage and grid "
                             "put %zu elements in this part: the manifest does not describe its parts", part,
                             e[i].name, e[i].bytes, count);
        found += state;
    }
    if (count > 0 && found != 3)
        return ckpt_msgf(msg, "checkpoint %s holds %d of master, adam_m and adam_v, where its manifest's stage and grid "
                         "put %zu elements of each in this part: the manifest does not describe its parts", part,
                         found, count);
    return 0;
}

// Part q: read for t[]'s elements it holds (`need`), and whole for its
// checksums and layout (`verify`).
static int read_part(const CkptSource *s, int q, CkptTensor *t, int n, int whole, int need, int verify,
                     CkptLoadInfo *got, char *msg) {
    const PartMap *pm = &s->maps[q];
    char part[PATH_BYTES];
    snprintf(part, sizeof part, "%s/rank-%05d.bin", s->step_dir, q);
    PartInfo want;
    if (manifest_part(s->manifest, q, &want))
        return ckpt_msgf(msg, "checkpoint %s: manifest.txt has no line for rank-%05d.bin: it is damaged; use "
                         "an earlier step folder or start fresh", s->step_dir, q);
    int fd = open(part, O_RDONLY);
    if (fd < 0) return ckpt_corrupt(part, strerror(errno), msg);
    PartHeader *h = NULL;
    int rc = ckpt_read_part_header(fd, part, &want, &h, msg);
    if (!rc && (memcmp(h->magic, "WBCKPT01", 8) || h->rank != q || h->ranks != s->m->ranks || h->step != s->m->step))
        rc = ckpt_corrupt(part, "its header names another rank, step or format", msg);
    if (!rc && pm->count > 0 && n > 0) rc = check_tensors(h, t, n, pm->count, whole, part, msg);
    for (int k = 0; k < n && !rc && need; k++) rc = copy_part(fd, h, &t[k], pm, part, &got->bytes_read, msg);
    if (!rc && verify) rc = check_layout(h, pm->count, part, msg);
    if (!rc && verify) rc = verify_part(fd, h, part, msg);
    got->parts_read += need;
    got->parts_verified += verify;
    free(h);
    close(fd);
    return rc;
}

// Parts 0..M-1 of the step folder: each one holding some of t[]'s elements
// is read for them; part q is also read whole for its checksums when q mod
// `verifiers` is `me` (verifiers 0: none).
static int read_parts(const CkptSource *s, CkptTensor *t, int n, int whole, int verifiers, int me,
                      CkptLoadInfo *info, char *msg) {
    for (int k = 0; k < n; k++) {
        CHECK(t[k].elem_bytes > 0, "checkpoint tensor %s: no element size for a resharded load", t[k].name);
        memset(t[k].host, 0, t[k].bytes);  // past Ψ and a grid's padding rows: zero
    }
    CkptLoadInfo got = {1, 0, 0, 0};
    int rc = 0;
    for (int q = 0; q < s->m->ranks && !rc; q++) {
        int need = s->maps[q].count > 0 && wants(t, n, &s->maps[q]), verify = verifiers > 0 && q % verifiers == me;
        if (need || verify) rc = read_part(s, q, t, n, whole, need, verify, &got, msg);
    }
    if (info) *info = got;
    return rc;
}

int ckpt_reshard_read(Comm *world, const char *step_dir, const char *manifest, const CkptManifest *m,
                      CkptTensor *t, int n, CkptLoadInfo *info, char *msg) {
    CkptSource *s = ckpt_source_open(step_dir, manifest, m);
    int rc = read_parts(s, t, n, 1, world->size, world->rank, info, msg);
    ckpt_source_close(s);
    return rc;
}

int ckpt_source_read(const CkptSource *s, const char *name, size_t elem_bytes, size_t begin, size_t n, void *out,
                     char *msg) {
    CkptTensor t = {.name = name, .host = out, .bytes = n * elem_bytes, .flat_begin = begin, .elem_bytes = elem_bytes};
    return read_parts(s, &t, 1, 0, 0, 0, NULL, msg);
}

int ckpt_verify_parts(const char *step_dir, const char *manifest, const CkptManifest *m, char *msg) {
    CkptSource *s = ckpt_source_open(step_dir, manifest, m);
    int rc = read_parts(s, NULL, 0, 0, 1, 0, NULL, msg);
    ckpt_source_close(s);
    return rc;
}
