// data.c: loading training tokens (see data.h). Everything is read into host
// memory as uint16 once, at start-up; data_rows then cuts windows out of it.
// Shard headers are read as little-endian int32, as llm.c writes them.
#include "data.h"
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * (long)sizeof(int32_t))
#ifndef BUILTIN_DIR  // overridable at compile time, to try the generated fallback
#define BUILTIN_DIR "/usr/share/common-licenses"
#endif
#define GENERATED_BYTES (256 * 1024)

typedef struct TokenList {
    uint16_t *tok;
    size_t n, cap;
} TokenList;

typedef struct FileList {
    char **path;
    int n;
} FileList;

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t err_len, const char *fmt,
                                                       ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return 1;
}

static uint16_t *tokens_grow(TokenList *l, size_t more) {
    if (l->n + more > l->cap) {
        size_t cap = l->cap ? l->cap : 4096;
        while (cap < l->n + more) cap *= 2;
        uint16_t *p = xmalloc(cap * sizeof(uint16_t));
        if (l->n) memcpy(p, l->tok, l->n * sizeof(uint16_t));
        free(l->tok);
        l->tok = p;
        l->cap = cap;
    }
    return l->tok + l->n;
}

static void files_free(FileList *f) {
    for (int i = 0; i < f->n; i++) free(f->path[i]);
    free(f->path);
    f->path = NULL;
    f->n = 0;
}

static int fopen_error(const char *path, char *err, size_t err_len) {
    if (errno == ENOENT) return fail(err, err_len, "--data %s: no such file or directory", path);
    return fail(err, err_len, "--data %s: cannot read (%s)", path, strerror(errno));
}

// The first int32 of the file, or 0 when it is shorter than 4 bytes.
static int32_t file_magic(const char *path) {
    int32_t magic = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    if (fread(&magic, sizeof magic, 1, f) != 1) magic = 0;
    fclose(f);
    return magic;
}

// A file with a shard's shape: a header whose token count matches the file's
// size and whose unused ints are zero, which text never has (1012 zero
// bytes). With another magic it is a damaged shard, or another format's,
// and reading it as byte text would train on its binary bytes: refused.
static int misread_shard(const char *path, char *err, size_t err_len) {
    int32_t h[SHARD_HEADER_INTS];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int whole = fread(h, sizeof h, 1, f) == 1 && fseek(f, 0, SEEK_END) == 0;
    long file_bytes = whole ? ftell(f) : 0;
    fclose(f);
    if (!whole || h[0] == SHARD_MAGIC || h[2] < 0 || file_bytes != SHARD_HEADER_BYTES + 2L * h[2]) return 0;
    for (int i = 3; i < SHARD_HEADER_INTS; i++)
        if (h[i] != 0) return 0;
    return fail(err, err_len, "--data %s has an llm.c token shard's shape (a header counting %d tokens, as "
                "many as the file holds) but magic %d where a shard has %d: a damaged shard or another format",
                path, h[2], h[0], SHARD_MAGIC);
}

// Finds the first token >= model_vocab; model_vocab <= 0 means no limit.
// `what` names the data as the user gave it ("--data FILE", "the built-in corpus").
static int check_vocab(const uint16_t *tok, size_t n, int model_vocab, const char *what, char *err,
                       size_t err_len) {
    if (model_vocab <= 0) return 0;
    size_t first_bad = n;
    int max = 0;
    for (size_t i = 0; i < n; i++) {
        if (tok[i] > max) max = tok[i];
        if (tok[i] >= model_vocab && first_bad == n) first_bad = i;
    }
    if (first_bad == n) return 0;
    return fail(err, err_len,
                "%s: token %d at position %zu is outside the model's vocabulary: the "
                "model's vocabulary is %d; these tokens need at least %d",
                what, tok[first_bad], first_bad, model_vocab, max + 1);
}

// Appends the file's bytes, one token per byte (vocab 256).
static int load_text(const char *path, const char *what, int model_vocab, TokenList *out, char *err,
                     size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return fopen_error(path, err, err_len);
    size_t first = out->n, at = 0;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        // text has no NUL bytes; a file that does is binary (an image, an archive, a shard without
        // .bin): told by the first block that holds one, before the rest is read (a 1 GB file of NULs)
        const unsigned char *nul = memchr(buf, 0, got);
        if (nul) {
            fclose(f);
            return fail(err, err_len, "--data %s: a NUL byte at byte %zu: not a text file; give text files, or "
                        "llm.c token shards named *.bin", path, at + (size_t)(nul - buf));
        }
        uint16_t *dst = tokens_grow(out, got);
        for (size_t i = 0; i < got; i++) dst[i] = buf[i];
        out->n += got;
        at += got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return fail(err, err_len, "--data %s: read error", path);
    return check_vocab(out->tok + first, out->n - first, model_vocab, what, err, err_len);
}

static int load_shard(const char *path, int model_vocab, TokenList *out, char *err,
                      size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return fopen_error(path, err, err_len);
    int32_t h[SHARD_HEADER_INTS];
    fseek(f, 0, SEEK_END);
    long file_bytes = ftell(f);
    rewind(f);
    int rc = 0;
    if (file_bytes < SHARD_HEADER_BYTES || fread(h, sizeof h, 1, f) != 1) {
        rc = fail(err, err_len, "--data %s: shard header is truncated (%ld bytes; an llm.c shard "
                  "starts with %ld)", path, file_bytes, SHARD_HEADER_BYTES);
    } else if (h[0] != SHARD_MAGIC) {
        rc = fail(err, err_len, "--data %s: not an llm.c token shard (magic %d, expected %d)",
                  path, h[0], SHARD_MAGIC);
    } else if (h[1] != SHARD_VERSION) {
        rc = fail(err, err_len, "--data %s: shard version %d is not supported (expected %d: "
                  "uint16 tokens)", path, h[1], SHARD_VERSION);
    } else if (h[2] < 0) {
        rc = fail(err, err_len, "--data %s: shard header says %d tokens, a negative count: damaged or not an "
                  "llm.c shard", path, h[2]);
    } else if (file_bytes - SHARD_HEADER_BYTES != 2L * h[2]) {
        rc = fail(err, err_len, "--data %s: shard header says %d tokens but the file holds %ld "
                  "bytes after the header (expected %ld): truncated or not an llm.c shard",
                  path, h[2], file_bytes - SHARD_HEADER_BYTES, 2L * h[2]);
    } else if (h[2] > 0) {  // an empty shard adds nothing (too few tokens in all is refused later)
        uint16_t *dst = tokens_grow(out, (size_t)h[2]);
        if (fread(dst, sizeof(uint16_t), (size_t)h[2], f) != (size_t)h[2])
            rc = fail(err, err_len, "--data %s: read error", path);
        else
            out->n += (size_t)h[2];
        if (!rc) {
            char what[300];
            snprintf(what, sizeof what, "--data %s", path);
            rc = check_vocab(dst, (size_t)h[2], model_vocab, what, err, err_len);
        }
    }
    fclose(f);
    return rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

// Regular files of a folder (following links), sorted by name, without dot
// files, each file once: a link to a file already listed (GPL -> GPL-3) is
// dropped, so the same text is not read twice.
static int list_folder(const char *dir, FileList *out, char *err, size_t err_len) {
    DIR *d = opendir(dir);
    if (!d) return fopen_error(dir, err, err_len);
    int cap = 16, n = 0;
    char **names = xmalloc(cap * sizeof(char *));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            char **p = xmalloc(2 * cap * sizeof(char *));
            memcpy(p, names, cap * sizeof(char *));
            free(names);
            names = p;
            cap *= 2;
        }
        names[n] = xmalloc(strlen(dir) + strlen(e->d_name) + 2);
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(char *), by_name);
    struct stat *st = xcalloc(n ? n : 1, sizeof(struct stat));
    int *is_link = xcalloc(n ? n : 1, sizeof(int));
    for (int i = 0; i < n; i++) {
        struct stat l;
        if (lstat(names[i], &l) != 0 || stat(names[i], &st[i]) != 0) st[i].st_mode = 0;
        else is_link[i] = S_ISLNK(l.st_mode);
    }
    out->path = xmalloc((n ? n : 1) * sizeof(char *));
    out->n = 0;
    for (int i = 0; i < n; i++) {
        int keep = S_ISREG(st[i].st_mode);
        for (int j = 0; keep && j < n; j++) {
            int same = j != i && S_ISREG(st[j].st_mode) && st[j].st_dev == st[i].st_dev &&
                       st[j].st_ino == st[i].st_ino;
            // keep the real file over a link to it; of two links, the first
            if (same && is_link[i] && (!is_link[j] || j < i)) keep = 0;
        }
        if (keep) out->path[out->n++] = names[i];
        else free(names[i]);
    }
    free(names);
    free(st);
    free(is_link);
    return 0;
}

static size_t total_bytes(const FileList *f) {
    size_t sum = 0;
    struct stat st;
    for (int i = 0; i < f->n; i++)
        if (stat(f->path[i], &st) == 0) sum += (size_t)st.st_size;
    return sum;
}

// A learnable stand-in corpus: lines like "c0f1i2l3\n". Each line counts
// through the alphabet from a start letter with a step of 1-3 (interleaved
// with a position counter 0-9), and line lengths cycle with period 13, so
// after two letters a small model can predict the rest of the line.
static void generate_sequence_task(TokenList *out) {
    for (long k = 0; out->n < GENERATED_BYTES; k++) {
        int len = 4 + (int)(k % 13), start = (int)(k * 7 % 26), step = 1 + (int)(k % 3);
        uint16_t *dst = tokens_grow(out, 2 * len + 1);
        for (int i = 0; i < len; i++) {
            *dst++ = (uint16_t)('a' + (start + i * step) % 26);
            *dst++ = (uint16_t)('0' + i % 10);
        }
        *dst = '\n';
        out->n += 2 * len + 1;
    }
}

static int open_builtin(TokenList *train, int model_vocab, char *desc, char *err, size_t err_len) {
    FileList files = {0};
    char ignored[256];
    if (list_folder(BUILTIN_DIR, &files, ignored, sizeof ignored) != 0 || files.n == 0) {
        generate_sequence_task(train);
        snprintf(desc, DATA_DESC_BYTES, "built-in generated sequence task: %zu KB of counting runs, "
                 "byte-level (no license texts in " BUILTIN_DIR ")", train->n / 1024);
        return check_vocab(train->tok, train->n, model_vocab, "the built-in sequence task (byte-level)", err,
                           err_len);
    }
    int rc = 0;
    for (int i = 0; i < files.n && !rc; i++)
        rc = load_text(files.path[i], "the built-in corpus (byte-level text)", model_vocab, train, err, err_len);
    snprintf(desc, DATA_DESC_BYTES, "built-in corpus: %d license texts from " BUILTIN_DIR " (%zu KB, "
             "byte-level)", files.n, total_bytes(&files) / 1024);
    files_free(&files);
    return rc;
}

// A folder: llm.c shards if any *.bin file has the magic (files naming "val"
// are the validation split), else every regular file as text.
static int open_folder(const char *path, int model_vocab, TokenList split[2], int *byte_level,
                       char *desc, char *err, size_t err_len) {
    FileList files = {0};
    if (list_folder(path, &files, err, err_len)) return 1;
    int shards = 0, rc = 0;
    for (int i = 0; i < files.n && !rc; i++) {
        if (has_suffix(files.path[i], ".bin") && file_magic(files.path[i]) == SHARD_MAGIC) shards++;
        else rc = misread_shard(files.path[i], err, err_len);
    }
    if (rc) {
        files_free(&files);
        return 1;
    }
    *byte_level = shards == 0;
    if (shards > 0) {
        int nval = 0;
        for (int i = 0; i < files.n && !rc; i++) {
            if (!has_suffix(files.path[i], ".bin")) continue;
            const char *base = strrchr(files.path[i], '/') + 1;
            int is_val = strstr(base, "val") != NULL;
            nval += is_val;
            rc = load_shard(files.path[i], model_vocab, &split[is_val], err, err_len);
        }
        if (!rc && nval == shards)
            rc = fail(err, err_len, "--data %s holds only validation shards (names with \"val\"); "
                      "add training shards", path);
        snprintf(desc, DATA_DESC_BYTES, "%d token shards from %s (%d for validation)", shards, path, nval);
    } else {
        for (int i = 0; i < files.n && !rc; i++) {
            char what[300];
            snprintf(what, sizeof what, "--data %s (byte-level text)", files.path[i]);
            rc = load_text(files.path[i], what, model_vocab, &split[0], err, err_len);
        }
        snprintf(desc, DATA_DESC_BYTES, "%d text files from %s (%zu KB, byte-level)", files.n, path,
                 split[0].n / 1024);
    }
    files_free(&files);
    return rc;
}

// Each split needs n >= T + 2 so that the window start (i*T) mod (n-T-1) is
// defined. Without validation files the last 10% (at least T + 2) is held out.
static int make_splits(TokenList split[2], const char *label, int T, char *err, size_t err_len) {
    size_t need = (size_t)T + 2;
    if (split[1].n == 0) {
        if (split[0].n < 2 * need)
            return fail(err, err_len, "%s has %zu tokens; sequence length %d needs at least %zu "
                        "(%zu for training and %zu for validation)", label, split[0].n, T,
                        2 * need, need, need);
        size_t nval = split[0].n / 10 < need ? need : split[0].n / 10;
        split[0].n -= nval;
        memcpy(tokens_grow(&split[1], nval), split[0].tok + split[0].n, nval * sizeof(uint16_t));
        split[1].n = nval;
    }
    for (int s = 0; s < 2; s++)
        if (split[s].n < need)
            return fail(err, err_len, "%s has %zu %s tokens; sequence length %d needs at least %zu",
                        label, split[s].n, s ? "validation" : "training", T, need);
    return 0;
}

// What a path that is neither a regular file nor a folder is, for the message.
static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

// A regular file of size 0 that still reads (a /proc or /sys file) is not
// empty, and its content is not fixed: refused, as what it is.
static int empty_file(const char *path, char *err, size_t err_len) {
    FILE *f = fopen(path, "rb");
    int has_content = f && fgetc(f) != EOF;
    if (f) fclose(f);
    if (has_content)
        return fail(err, err_len, "--data %s reports a size of 0 but has content (a /proc or /sys file?); "
                    "copy it to a regular file", path);
    return fail(err, err_len, "--data %s is empty; give a text file or llm.c token shards", path);
}

static int open_path(const char *path, int model_vocab, TokenList split[2], int *byte_level,
                     char *desc, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) != 0) return fopen_error(path, err, err_len);
    if (S_ISDIR(st.st_mode))
        return open_folder(path, model_vocab, split, byte_level, desc, err, err_len);
    if (!S_ISREG(st.st_mode))
        return fail(err, err_len, "--data %s is %s; give a text file, a folder or llm.c token shards", path,
                    file_kind(st.st_mode));
    if (st.st_size == 0) return empty_file(path, err, err_len);
    if (misread_shard(path, err, err_len)) return 1;
    if (file_magic(path) == SHARD_MAGIC) {
        *byte_level = 0;
        snprintf(desc, DATA_DESC_BYTES, "token shard %s", path);
        return load_shard(path, model_vocab, &split[0], err, err_len);
    }
    *byte_level = 1;
    snprintf(desc, DATA_DESC_BYTES, "text file %s (%lld KB, byte-level)", path, (long long)st.st_size / 1024);
    char what[PATH_MAX + 64];  // the path whole
    snprintf(what, sizeof what, "--data %s (byte-level text)", path);
    return load_text(path, what, model_vocab, &split[0], err, err_len);
}

int data_open(DataSet *ds, const char *path, int model_vocab, int T, char *err, size_t err_len) {
    memset(ds, 0, sizeof *ds);
    TokenList split[2] = {{0}, {0}};
    int builtin = path == NULL || path[0] == 0, byte_level = 1, rc;
    char label[PATH_MAX + 32];  // the path whole
    if (builtin) {
        rc = open_builtin(&split[0], model_vocab, ds->desc, err, err_len);
        snprintf(label, sizeof label, "the built-in corpus");
    } else {
        rc = open_path(path, model_vocab, split, &byte_level, ds->desc, err, err_len);
        snprintf(label, sizeof label, "--data %s", path);
    }
    if (!rc && split[0].n + split[1].n == 0)
        rc = fail(err, err_len, "%s is empty; give a text file or llm.c token shards", label);
    if (!rc) rc = make_splits(split, label, T, err, err_len);
    if (rc) {
        free(split[0].tok);
        free(split[1].tok);
        return rc;
    }
    // byte-level text has the 256-symbol byte vocabulary; shards carry no
    // vocabulary size, so theirs is the largest token id + 1
    int max = 0;
    for (int s = 0; s < 2; s++) {
        ds->tokens[s] = split[s].tok;
        ds->count[s] = split[s].n;
        for (size_t i = 0; !byte_level && i < split[s].n; i++)
            if (split[s].tok[i] > max) max = split[s].tok[i];
    }
    ds->vocab = byte_level ? 256 : max + 1;
    return 0;
}

void data_free(DataSet *ds) {
    free(ds->tokens[0]);
    free(ds->tokens[1]);
    memset(ds, 0, sizeof *ds);
}

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

// llm.c's loader reads global micro-batch j at token j*G*T while a whole one
// fits, then starts over: floor((n-1) / (G*T)) micro-batches per pass.
int data_set_sequential(DataSet *ds, int T, int rows_per_batch, char *err, size_t err_len) {
    for (int s = 0; s < 2; s++) {
        uint64_t batches = (ds->count[s] - 1) / ((uint64_t)T * rows_per_batch);
        if (batches == 0)
            return fail(err, err_len, "--data-order sequential: the %s split holds %zu tokens, less than one "
                        "global micro-batch of %d rows of %d+1 tokens; give more data or a smaller batch",
                        s ? "validation" : "training", ds->count[s], rows_per_batch, T);
        ds->sequential_rows[s] = batches * (uint64_t)rows_per_batch;
    }
    return 0;
}

// Row i reads window k = (a * (i mod W)) mod W of the W windows that start
// at multiples of T. With a coprime to W this visits every window once per
// pass; a near W/golden-ratio puts consecutive rows far apart, so a batch
// mixes documents instead of reading one text in order.
uint64_t data_rows_per_pass(const DataSet *ds, int split, int T) {
    if (ds->sequential_rows[split]) return ds->sequential_rows[split];
    return (ds->count[split] - (uint64_t)T - 1) / (uint64_t)T + 1;  // as data_row_start's windows
}

uint64_t data_row_start(const DataSet *ds, int split, uint64_t row, int T) {
    CHECK(split == SPLIT_TRAIN || split == SPLIT_VAL, "data_rows: bad split %d", split);
    size_t n = ds->count[split];
    CHECK(T > 0 && n >= (size_t)T + 2, "data_rows: split %d has %zu tokens, too few for T=%d "
          "(data_open was given a different T?)", split, n, T);
    if (ds->sequential_rows[split]) return row % ds->sequential_rows[split] * (uint64_t)T;
    uint64_t windows = (n - (uint64_t)T - 1) / (uint64_t)T + 1;  // start k*T needs k*T + T + 1 <= n
    uint64_t a = (uint64_t)((double)windows * 0.6180339887498949) | 1;
    while (gcd_u64(a, windows) != 1) a++;
    uint64_t k = (unsigned __int128)a * (row % windows) % windows;
    return k * (uint64_t)T;
}

void data_rows(const DataSet *ds, int split, uint64_t row_begin, int rows, int T,
               int32_t *inputs, int32_t *targets) {
    const uint16_t *tok = ds->tokens[split];
    for (int r = 0; r < rows; r++) {
        const uint16_t *w = tok + data_row_start(ds, split, row_begin + (uint64_t)r, T);
        int32_t *in = inputs + (size_t)r * T, *tg = targets + (size_t)r * T;
        for (int t = 0; t < T; t++) {
            in[t] = w[t];
            tg[t] = w[t + 1];
        }
    }
}
