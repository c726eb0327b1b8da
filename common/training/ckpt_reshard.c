// ckpt_reshard.c: a checkpoint of the data-parallel stages (01-06) read into
// another stage's or rank count's layout. They all keep the same state
// (master, Adam m and v, and under cpu_offload --dpu the device's params)
// over the same flat parameter layout; only the cut differs. dp_baseline's
// part 0 holds all Ψ elements (its other parts none); a sharded stage's part
// q holds q's shard of Ψ_pad, Ψ rounded up to a multiple of ranks x 64
// (states.h's partition), whose padding past Ψ is zero. So a zero3 shard
// and a zero1 shard of the same parameters are the same bytes at the same
// flat offsets.
//
// Each rank reads from each part only the bytes of its own range (a
// replicated run's rank 0 reads all Ψ; trainer_resume broadcasts them), and
// rank q mod N reads part q's tensors whole to check their checksums, so
// every byte on disk is verified once, by one rank.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "ckpt.h"
#include "ckpt_manifest.h"
#include "states.h"

#define PATH_BYTES 4096
#define VERIFY_CHUNK ((size_t)4 << 20)  // the bounded buffer a part's checksums are computed through

// The flat elements part q of the saved run holds, [*begin, *begin + *count).
static void part_range(const CkptManifest *m, int q, size_t *begin, size_t *count) {
    if (strcmp(m->stage, "dp_baseline") == 0) {  // replicated: rank 0 saved all of it
        *begin = 0;
        *count = q == 0 ? m->num_params : 0;
        return;
    }
    Partition p;
    partition_init(&p, m->num_params, m->ranks, q);
    *begin = p.begin;
    *count = p.shard;
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

// The tensors of part q (holding [qb, qb + qn)) against what this run loads:
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

// This rank's part of t[k] that part q holds, into its host buffer.
static int copy_overlap(int fd, const PartHeader *h, const CkptTensor *t, size_t qb, size_t qn,
                        const char *part, uint64_t *bytes, char *msg) {
    size_t count = t->bytes / t->elem_bytes;
    size_t lo = t->flat_begin > qb ? t->flat_begin : qb;
    size_t hi = t->flat_begin + count < qb + qn ? t->flat_begin + count : qb + qn;
    if (hi <= lo) return 0;
    off_t off = 0;
    find_entry(h, t->name, &off);  // check_tensors found it
    size_t n = (hi - lo) * t->elem_bytes;
    *bytes += n;
    return read_at(fd, (char *)t->host + (lo - t->flat_begin) * t->elem_bytes, n,
                   off + (off_t)((lo - qb) * t->elem_bytes), part, msg);
}

static int wants(const CkptTensor *t, int n, size_t qb, size_t qn) {
    for (int k = 0; k < n; k++) {
        size_t count = t[k].bytes / t[k].elem_bytes;
        if (t[k].flat_begin < qb + qn && qb < t[k].flat_begin + count) return 1;
    }
    return 0;
}

// Parts 0..M-1 of the step folder: each one holding some of t[]'s ranges is
// read for them; part q is also read whole for its checksums when q mod
// `verifiers` is `me` (verifiers 0: none).
static int read_parts(const char *step_dir, const char *manifest, const CkptManifest *m, CkptTensor *t, int n,
                      int whole, int verifiers, int me, CkptLoadInfo *info, char *msg) {
    for (int k = 0; k < n; k++) {
        CHECK(t[k].elem_bytes > 0, "checkpoint tensor %s: no element size for a resharded load", t[k].name);
        memset(t[k].host, 0, t[k].bytes);  // past Ψ: the padding, zero
    }
    CkptLoadInfo got = {1, 0, 0, 0};
    int rc = 0;
    for (int q = 0; q < m->ranks && !rc; q++) {
        size_t qb, qn;
        part_range(m, q, &qb, &qn);
        int need = qn > 0 && wants(t, n, qb, qn), verify = verifiers > 0 && q % verifiers == me;
        if (!need && !verify) continue;
        char part[PATH_BYTES];
        snprintf(part, sizeof part, "%s/rank-%05d.bin", step_dir, q);
        PartInfo want;
        if (manifest_part(manifest, q, &want))
            return ckpt_msgf(msg, "checkpoint %s: manifest.txt has no line for rank-%05d.bin: it is damaged; use "
                             "an earlier step folder or start fresh", step_dir, q);
        int fd = open(part, O_RDONLY);
        if (fd < 0) return ckpt_corrupt(part, strerror(errno), msg);
        PartHeader *h = NULL;
        rc = ckpt_read_part_header(fd, part, &want, &h, msg);
        if (!rc && (memcmp(h->magic, "WBCKPT01", 8) || h->rank != q || h->ranks != m->ranks || h->step != m->step))
            rc = ckpt_corrupt(part, "its header names another rank, step or format", msg);
        if (!rc && qn > 0 && n > 0) rc = check_tensors(h, t, n, qn, whole, part, msg);
        for (int k = 0; k < n && !rc && need; k++) rc = copy_overlap(fd, h, &t[k], qb, qn, part, &got.bytes_read, msg);
        if (!rc && verify) rc = verify_part(fd, h, part, msg);
        got.parts_read += need;
        got.parts_verified += verify;
        free(h);
        close(fd);
    }
    if (info) *info = got;
    return rc;
}

int ckpt_reshard_read(Comm *world, const char *step_dir, const char *manifest, const CkptManifest *m,
                      CkptTensor *t, int n, CkptLoadInfo *info, char *msg) {
    return read_parts(step_dir, manifest, m, t, n, 1, world->size, world->rank, info, msg);
}

int ckpt_read_flat(const char *step_dir, const char *manifest, const CkptManifest *m, const char *name,
                   size_t elem_bytes, size_t begin, size_t n, void *out, char *msg) {
    CkptTensor t = {name, out, n * elem_bytes, begin, elem_bytes};
    return read_parts(step_dir, manifest, m, &t, 1, 0, 0, 0, NULL, msg);
}

int ckpt_verify_parts(const char *step_dir, const char *manifest, const CkptManifest *m, char *msg) {
    return read_parts(step_dir, manifest, m, NULL, 0, 0, 1, 0, NULL, msg);
}
