// llmc.c: llm.c's GPT-2 checkpoints (see llmc.h). The header is read as
// little-endian int32, as llm.c writes it; every size is computed in 64 bits
// after the shape has been checked, so a hostile header cannot overflow it.
#include "llmc.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "out_file.h"
#include "stop.h"

#define HEADER_BYTES ((long long)LLMC_HEADER_INTS * 4)
#define SHARD_MAGIC 20240520           // data.h: a token shard, not a model
#define MAX_FILE_BYTES 1e15            // a shape promising more is not a checkpoint we can hold
#define COPY_ELEMS ((size_t)1 << 20)   // elements per read or write call

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return 1;
}

int llmc_padded_vocab(int vocab) { return (vocab + 127) / 128 * 128; }

// What the trainer cannot build, in words; NULL when the shape is fine.
static const char *shape_problem(const int32_t *h) {
    int maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp = h[7];
    if (maxT < 1 || V < 1 || L < 1 || NH < 1 || C < 1) return "every size must be positive";
    if (C % NH != 0) return "the heads do not divide the channels";
    if (L + 2 > GPT_MAX_UNITS) return "more layers than this build supports (gpt.h GPT_MAX_UNITS)";
    if (Vp < V) return "the padded vocabulary Vp is smaller than V";
    return NULL;
}

int llmc_read_header(const char *path, LlmcHeader *h, char *err, size_t err_len) {
    memset(h, 0, sizeof *h);
    const char *kind;
    FILE *f = in_file_open(path, &kind);
    if (!f && kind)
        return fail(err, err_len, "--init-from %s is %s, not a regular file; give an llm.c checkpoint", path, kind);
    if (!f) return fail(err, err_len, "--init-from %s: %s", path, errno == ENOENT ? "no such file" : strerror(errno));
    int32_t hd[LLMC_HEADER_INTS];
    struct stat st;
    int got = fstat(fileno(f), &st) == 0 && fread(hd, sizeof hd, 1, f) == 1;
    fclose(f);
    if (!got)
        return fail(err, err_len, "--init-from %s: %lld bytes, shorter than an llm.c checkpoint's %lld-byte header",
                    path, (long long)st.st_size, HEADER_BYTES);
    if (hd[0] != LLMC_MAGIC)
        return fail(err, err_len, "--init-from %s: not an llm.c GPT-2 checkpoint (magic %d, expected %d)%s", path,
                    hd[0], LLMC_MAGIC, hd[0] == SHARD_MAGIC ? "; it is a token shard: give it to --data" : "");
    if (hd[1] != LLMC_VERSION_FP32 && hd[1] != LLMC_VERSION_BF16)
        return fail(err, err_len, "--init-from %s: checkpoint version %d is not supported (3: fp32 parameters, "
                    "5: bf16)", path, hd[1]);
    const char *problem = shape_problem(hd);
    if (problem)
        return fail(err, err_len, "--init-from %s: the header's shape (maxT %d, V %d, L %d, NH %d, C %d, Vp %d) "
                    "cannot be trained here: %s", path, hd[2], hd[3], hd[4], hd[5], hd[6], hd[7], problem);
    double C = hd[6], elem = hd[1] == LLMC_VERSION_FP32 ? 4 : 2;
    double approx = HEADER_BYTES + elem * ((double)hd[7] * C + (double)hd[2] * C + hd[4] * (12 * C * C + 13 * C) + 2 * C);
    if (approx > MAX_FILE_BYTES)
        return fail(err, err_len, "--init-from %s: the header's shape (L %d, C %d, V %d) needs %.3g bytes: not a "
                    "checkpoint this trainer can hold", path, hd[4], hd[6], hd[3], approx);
    h->version = hd[1];
    h->cfg = (GPTConfig){.max_seq_len = hd[2], .vocab_size = hd[3], .num_layers = hd[4], .num_heads = hd[5],
                         .channels = hd[6]};
    h->padded_vocab = hd[7];
    h->elem_bytes = (size_t)elem;
    size_t c = (size_t)hd[6], L = (size_t)hd[4];
    h->file_params = (size_t)hd[7] * c + (size_t)hd[2] * c + L * (12 * c * c + 13 * c) + 2 * c;
    long long want = HEADER_BYTES + (long long)(h->file_params * h->elem_bytes);
    if ((long long)st.st_size != want)
        return fail(err, err_len, "--init-from %s: the header's shape (maxT %d, V %d, Vp %d, L %d, NH %d, C %d, "
                    "version %d) needs %lld bytes but the file holds %lld: %s", path, hd[2], hd[3], hd[7], hd[4],
                    hd[5], hd[6], hd[1], want, (long long)st.st_size,
                    (long long)st.st_size < want ? "truncated" : "not a checkpoint of this shape");
    return 0;
}

// The tensors of unit u: their offsets within the unit (n + 1 entries).
static const size_t *unit_tensors(const GPTLayout *l, int u, int *n) {
    if (u == GPT_UNIT_EMBED) { *n = EMB_NTENSORS; return l->emb_off; }
    if (u == gpt_unit_head(l)) { *n = HEAD_NTENSORS; return l->head_off; }
    *n = BLK_NTENSORS;
    return l->blk_off;
}

// Element of the file (after the header) where our tensor t of unit u
// starts. llm.c stores tensor kind t of every layer together, kinds in the
// order of our block's tensors, so kind t starts at L * (our offset of t in
// a block) and layer i's copy i tensor-sizes further on.
static size_t file_offset(const GPTLayout *l, int Vp, int u, int t) {
    size_t C = (size_t)l->cfg.channels, L = (size_t)l->cfg.num_layers;
    size_t blocks = (size_t)Vp * C + (size_t)l->cfg.max_seq_len * C;  // after wte (Vp rows) and wpe
    if (u == GPT_UNIT_EMBED) return t == EMB_WTE ? 0 : (size_t)Vp * C;
    if (u == gpt_unit_head(l)) return blocks + L * l->blk_off[BLK_NTENSORS] + l->head_off[t];
    size_t layer = (size_t)(u - 1), size = l->blk_off[t + 1] - l->blk_off[t];
    return blocks + L * l->blk_off[t] + layer * size;
}

static int read_elems(FILE *f, const LlmcHeader *h, size_t file_elem, size_t n, float *out) {
    if (fseeko(f, (off_t)(HEADER_BYTES + (long long)(file_elem * h->elem_bytes)), SEEK_SET)) return 1;
    if (h->version == LLMC_VERSION_FP32) return fread(out, sizeof(float), n, f) != n;
    bf16 buf[4096];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 4096 ? n - done : 4096;
        if (fread(buf, sizeof(bf16), k, f) != k) return 1;
        for (size_t i = 0; i < k; i++) out[done + i] = bf16_to_f32(buf[i]);
        done += k;
    }
    return 0;
}

int llmc_read_range(const char *path, const LlmcHeader *h, const GPTLayout *l, size_t begin, size_t end,
                    float *out, char *err, size_t err_len) {
    CHECK(begin <= end, "llmc_read_range: [%zu, %zu)", begin, end);
    const char *kind;
    FILE *f = in_file_open(path, &kind);
    if (!f) return fail(err, err_len, "--init-from %s: %s", path, kind ? kind : strerror(errno));
    // zeros first: a shard's padding past Ψ, and wte's padding rows, which
    // stay zero whatever the file holds there (llm.c writes zeros)
    memset(out, 0, (end - begin) * sizeof(float));
    size_t real_end = end < l->num_params ? end : l->num_params;
    int bad = 0;
    for (int u = 0; u < l->num_units && !bad; u++) {
        int nt;
        const size_t *off = unit_tensors(l, u, &nt);
        for (int t = 0; t < nt && !bad; t++) {
            size_t start = l->unit[u].offset + off[t], lo = start, hi = l->unit[u].offset + off[t + 1];
            if (u == GPT_UNIT_EMBED && t == EMB_WTE) hi = start + (size_t)l->cfg.vocab_size * l->cfg.channels;
            if (hi <= begin || lo >= real_end) continue;
            if (lo < begin) lo = begin;
            if (hi > real_end) hi = real_end;
            bad = read_elems(f, h, file_offset(l, h->padded_vocab, u, t) + (lo - start), hi - lo, out + (lo - begin));
        }
    }
    fclose(f);
    return bad ? fail(err, err_len, "--init-from %s: read error (the file changed while it was read?)", path) : 0;
}

// Writes flat elements [begin, begin + n) that src gives, through buf
// (COPY_ELEMS floats).
typedef struct Source {
    LlmcSource read;
    void *ctx;
    float *buf;
} Source;

static int write_elems(FILE *f, const Source *src, size_t begin, size_t n) {
    for (size_t done = 0; done < n;) {
        size_t k = n - done < COPY_ELEMS ? n - done : COPY_ELEMS;
        if (src->read(src->ctx, begin + done, k, src->buf)) return 1;
        if (fwrite(src->buf, sizeof(float), k, f) != k) return 1;
        done += k;
    }
    return 0;
}

// The parameters in the file's order: wte with its padding rows (ours are
// llm.c's Vp rows, zero past V), wpe, each tensor kind of every layer, the
// final layernorm.
static int write_params(FILE *f, const GPTLayout *l, const Source *src) {
    const GPTConfig *c = &l->cfg;
    CHECK(l->tp_size == 1 && l->vocab_padded == llmc_padded_vocab(c->vocab_size), "llm.c export: wte of %d rows, "
          "llm.c's Vp is %d; hint: the whole model's layout (gpt_layout) stores llm.c's rows", l->vocab_padded,
          llmc_padded_vocab(c->vocab_size));
    size_t emb = l->unit[GPT_UNIT_EMBED].offset;
    int bad = write_elems(f, src, emb, l->emb_off[EMB_NTENSORS]);  // wte, then wpe
    for (int t = 0; t < BLK_NTENSORS && !bad; t++)
        for (int i = 0; i < c->num_layers && !bad; i++)
            bad = write_elems(f, src, l->unit[gpt_unit_block(i)].offset + l->blk_off[t],
                              l->blk_off[t + 1] - l->blk_off[t]);
    if (!bad) bad = write_elems(f, src, l->unit[gpt_unit_head(l)].offset, l->head_off[HEAD_NTENSORS]);
    return bad;
}

static int from_memory(void *ctx, size_t begin, size_t n, float *out) {
    memcpy(out, (const float *)ctx + begin, n * sizeof(float));
    return 0;
}

int llmc_write(const char *path, const GPTLayout *l, const float *params, char *err, size_t err_len) {
    return llmc_write_from(path, "--export-llmc", l, from_memory, (void *)params, err, err_len);
}

int llmc_write_from(const char *path, const char *what, const GPTLayout *l, LlmcSource read, void *ctx, char *err,
                    size_t err_len) {
    char tmp[4096];
    FILE *f = out_file_begin(path, tmp, sizeof tmp);
    if (!f) return fail(err, err_len, "%s %s: cannot create a file beside it (%s)", what, path, strerror(errno));
    const GPTConfig *c = &l->cfg;
    int32_t hd[LLMC_HEADER_INTS] = {LLMC_MAGIC, LLMC_VERSION_FP32, c->max_seq_len, c->vocab_size,
                                    c->num_layers, c->num_heads, c->channels, llmc_padded_vocab(c->vocab_size)};
    Source src = {read, ctx, xmalloc(COPY_ELEMS * sizeof(float))};
    int bad = fwrite(hd, sizeof hd, 1, f) != 1 || write_params(f, l, &src) || fflush(f) || stop_fsync(fileno(f));
    free(src.buf);
    int write_errno = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        write_errno = errno;
    }
    if (bad) out_file_abandon(tmp);
    else if (out_file_commit(tmp, path) == 0) return 0;  // it removes tmp when it cannot rename
    else write_errno = errno;
    return fail(err, err_len, "%s %s: not written (%s)", what, path,
                write_errno == ELOOP ? "it became a symbolic link during the run; nothing replaces a link"
                : write_errno == EINVAL ? "it is no longer a regular file" : strerror(write_errno));
}
