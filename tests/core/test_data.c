// test_data.c: data loading (built-in corpus, text file, text folder, token
// shard, shard folder with a val split), the row layout that makes every rank
// count see the same data, and the one-line errors for bad --data.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "testutil.h"
#include "data.h"

#define MAGIC 20240520
#define LICENSES "/usr/share/common-licenses"
#define PATH_LEN 1024  // every path buffer; the temp root is short

// ---- helpers ---------------------------------------------------------------

// Each test's own scratch folder under the run's temp root; *state is the root.
static char *scratch(void **state, const char *name, char *out) {
    assert_true(snprintf(out, PATH_LEN, "%s/%s", (const char *)*state, name) < PATH_LEN);
    assert_int_equal(mkdir(out, 0755), 0);
    return out;
}

static char *join(const char *dir, const char *name, char *out) {
    assert_true(snprintf(out, PATH_LEN, "%s/%s", dir, name) < PATH_LEN);
    return out;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

// An llm.c shard: 256 int32 header {magic, version, count}, then uint16 tokens.
static void write_shard(const char *path, const uint16_t *tok, int n, int magic, int version,
                        int count) {
    int32_t header[256] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(header, sizeof header, 1, f), 1);
    assert_int_equal(fwrite(tok, sizeof(uint16_t), (size_t)n, f), (size_t)n);
    fclose(f);
}

static uint16_t *ramp(int n, int first, int modulo) {
    uint16_t *t = malloc((size_t)n * sizeof(uint16_t));
    for (int i = 0; i < n; i++) t[i] = (uint16_t)((first + i) % modulo);
    return t;
}

// The text "line 0\nline 1\n..." up to n bytes.
static char *lines(size_t n) {
    char *s = malloc(n + 32);
    size_t len = 0;
    for (int i = 0; len < n; i++) len += (size_t)sprintf(s + len, "line %d\n", i);
    return s;
}

static void assert_split_equals(const DataSet *ds, int split, const void *expect, size_t n,
                                int is_bytes) {
    assert_int_equal(ds->count[split], n);
    for (size_t i = 0; i < n; i++) {
        int want = is_bytes ? ((const unsigned char *)expect)[i] : ((const uint16_t *)expect)[i];
        if (ds->tokens[split][i] != want) fail_msg("split %d token %zu: %d, want %d", split, i,
                                                   ds->tokens[split][i], want);
    }
}

// ---- loading ---------------------------------------------------------------

// Bytes of the license texts, each once (links such as GPL -> GPL-3 skipped).
static size_t license_bytes(int *files) {
    DIR *d = opendir(LICENSES);
    size_t sum = 0;
    *files = 0;
    if (!d) return 0;
    struct dirent *e;
    char path[PATH_LEN];
    struct stat st;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && lstat(join(LICENSES, e->d_name, path), &st) == 0 &&
            S_ISREG(st.st_mode)) {
            sum += (size_t)st.st_size;
            (*files)++;
        }
    closedir(d);
    return sum;
}

static void test_builtin_corpus(void **state) {
    DataSet ds;
    char err[PATH_LEN] = "";
    assert_int_equal(data_open(&ds, NULL, 256, 64, err, sizeof err), 0);
    int files;
    size_t bytes = license_bytes(&files);
    size_t n = ds.count[0] + ds.count[1];
    assert_int_equal(ds.vocab, 256);
    if (files > 0) {
        char want[128];
        sprintf(want, "built-in corpus: %d license texts from " LICENSES, files);
        assert_non_null(strstr(ds.desc, want));
        assert_int_equal(n, bytes);
    } else {
        assert_non_null(strstr(ds.desc, "generated sequence task"));
    }
    assert_int_equal(ds.count[1], n / 10);  // the last 10% is validation
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < ds.count[s]; i++) assert_true(ds.tokens[s][i] < 256);
    DataSet again;  // "" is the built-in corpus too, and loading is deterministic
    assert_int_equal(data_open(&again, "", 256, 64, err, sizeof err), 0);
    assert_int_equal(again.count[0], ds.count[0]);
    assert_memory_equal(again.tokens[0], ds.tokens[0], ds.count[0] * sizeof(uint16_t));
    data_free(&again);
    data_free(&ds);
}

static void test_text_file(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, "text_file", dir);
    char *text = lines(2000);
    write_bytes(join(dir, "story.txt", path), text, 2000);
    DataSet ds;
    assert_int_equal(data_open(&ds, path, 256, 16, err, sizeof err), 0);
    assert_non_null(strstr(ds.desc, "story.txt"));
    assert_int_equal(ds.vocab, 256);
    assert_split_equals(&ds, SPLIT_TRAIN, text, 1800, 1);
    assert_split_equals(&ds, SPLIT_VAL, text + 1800, 200, 1);
    data_free(&ds);
    free(text);
}

// A small file still gets a validation split of T+2 tokens.
static void test_small_file_keeps_one_row_per_split(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, "small_file", dir);
    char *text = lines(40);
    write_bytes(join(dir, "small.txt", path), text, 40);
    DataSet ds;
    assert_int_equal(data_open(&ds, path, 256, 16, err, sizeof err), 0);
    assert_int_equal(ds.count[SPLIT_VAL], 18);
    assert_int_equal(ds.count[SPLIT_TRAIN], 22);
    data_free(&ds);
    free(text);
}

static void test_text_folder(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, "text_folder", dir);
    char *a = lines(700), *b = lines(900), both[1600];
    write_bytes(join(dir, "b.txt", path), b, 900);  // written first, read second (by name)
    write_bytes(join(dir, "a.txt", path), a, 700);
    write_bytes(join(dir, ".hidden", path), "xxxx", 4);
    assert_int_equal(symlink("a.txt", join(dir, "c-link-to-a", path)), 0);
    assert_int_equal(mkdir(join(dir, "subfolder", path), 0755), 0);
    memcpy(both, a, 700);
    memcpy(both + 700, b, 900);
    DataSet ds;
    assert_int_equal(data_open(&ds, dir, 256, 16, err, sizeof err), 0);
    assert_non_null(strstr(ds.desc, "2 text files"));
    assert_split_equals(&ds, SPLIT_TRAIN, both, 1440, 1);
    assert_split_equals(&ds, SPLIT_VAL, both + 1440, 160, 1);
    data_free(&ds);
    free(a);
    free(b);
}

static void test_shard_file(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, "shard_file", dir);
    uint16_t *tok = ramp(1000, 50000, 50257);  // wraps past the top of GPT-2's vocabulary
    write_shard(join(dir, "tokens.bin", path), tok, 1000, MAGIC, 1, 1000);
    DataSet ds;
    assert_int_equal(data_open(&ds, path, 50257, 8, err, sizeof err), 0);
    assert_non_null(strstr(ds.desc, "tokens.bin"));
    assert_int_equal(ds.vocab, 50257);  // the largest id + 1
    assert_split_equals(&ds, SPLIT_TRAIN, tok, 900, 0);
    assert_split_equals(&ds, SPLIT_VAL, tok + 900, 100, 0);
    data_free(&ds);
    free(tok);
}

static void test_shard_folder_with_val(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, "shard_folder", dir);
    uint16_t *t0 = ramp(300, 0, 1000), *t1 = ramp(200, 300, 1000), *v = ramp(50, 900, 1000);
    write_shard(join(dir, "shard_train_001.bin", path), t1, 200, MAGIC, 1, 200);
    write_shard(join(dir, "shard_train_000.bin", path), t0, 300, MAGIC, 1, 300);
    write_shard(join(dir, "shard_val_000.bin", path), v, 50, MAGIC, 1, 50);
    write_bytes(join(dir, "README.txt", path), "not a shard", 11);
    DataSet ds;
    assert_int_equal(data_open(&ds, dir, 1000, 8, err, sizeof err), 0);
    assert_non_null(strstr(ds.desc, "3 token shards"));
    uint16_t *train = ramp(500, 0, 1000);  // shard 000 then 001
    assert_split_equals(&ds, SPLIT_TRAIN, train, 500, 0);
    assert_split_equals(&ds, SPLIT_VAL, v, 50, 0);
    data_free(&ds);
    free(t0);
    free(t1);
    free(v);
    free(train);
}

// scripts/make_shard.py (run from the repository root, as tests/run.sh does)
// writes what data_open reads.
static void test_make_shard_script(void **state) {
    char dir[PATH_LEN], ids[PATH_LEN], shard[PATH_LEN], cmd[3 * PATH_LEN], err[512] = "";
    if (access("scripts/make_shard.py", R_OK) != 0) skip();
    scratch(state, "script", dir);
    uint16_t *tok = ramp(300, 65400, 65536);  // up to the top of uint16
    FILE *f = fopen(join(dir, "ids.txt", ids), "w");
    assert_non_null(f);
    for (int i = 0; i < 300; i++) fprintf(f, i % 7 ? "%d, " : "%d\n", tok[i]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "python3 scripts/make_shard.py %s --tokens-file %s",
             join(dir, "s.bin", shard), ids);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d: %s", cmd, rc, out);
    free(out);
    DataSet ds;
    assert_int_equal(data_open(&ds, shard, 65536, 8, err, sizeof err), 0);
    assert_split_equals(&ds, SPLIT_TRAIN, tok, 270, 0);
    assert_split_equals(&ds, SPLIT_VAL, tok + 270, 30, 0);
    data_free(&ds);
    free(tok);
}

// ---- rows ------------------------------------------------------------------

// One shard of distinct tokens, so a window identifies its start.
static void open_distinct(void **state, const char *name, int n, DataSet *ds) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, name, dir);
    uint16_t *tok = ramp(n, 0, 65536);
    write_shard(join(dir, "d.bin", path), tok, n, MAGIC, 1, n);
    assert_int_equal(data_open(ds, path, 65536, 16, err, sizeof err), 0);
    free(tok);
}

static void test_row_formula_and_shift(void **state) {
    DataSet ds;
    open_distinct(state, "rows_formula", 10000, &ds);
    const int T = 16, rows = 5;
    int32_t in[5 * 16], tgt[5 * 16];
    uint64_t firsts[] = {0, 1, 561, 562, 1000000000000ull};  // 562 rows pass the 562 windows of the train split
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < 5; k++) {
            data_rows(&ds, s, firsts[k], rows, T, in, tgt);
            for (int r = 0; r < rows; r++) {
                uint64_t start = data_row_start(&ds, s, firsts[k] + r, T);
                for (int t = 0; t < T; t++) {
                    assert_int_equal(in[r * T + t], ds.tokens[s][start + t]);
                    assert_int_equal(tgt[r * T + t], ds.tokens[s][start + t + 1]);
                    if (t + 1 < T) assert_int_equal(tgt[r * T + t], in[r * T + t + 1]);
                }
            }
        }
    }
    data_free(&ds);
}

// One pass of W rows reads every window (start a multiple of T, T+1 tokens
// inside the split) exactly once; the next pass repeats it; consecutive rows
// are not neighbouring windows (the batch mixes the text).
static void test_rows_visit_every_window_once_per_pass(void **state) {
    DataSet ds;
    open_distinct(state, "rows_perm", 10000, &ds);
    const int T = 16;
    for (int s = 0; s < 2; s++) {
        uint64_t n = ds.count[s], W = (n - T - 1) / T + 1;
        char *seen = calloc(W, 1);
        int adjacent = 0;
        for (uint64_t i = 0; i < W; i++) {
            uint64_t start = data_row_start(&ds, s, i, T);
            assert_int_equal(start % T, 0);
            assert_true(start + T + 1 <= n);
            assert_int_equal(seen[start / T], 0);
            seen[start / T] = 1;
            assert_int_equal(data_row_start(&ds, s, i + W, T), start);
            if (i > 0 && (data_row_start(&ds, s, i - 1, T) + T == start)) adjacent++;
        }
        assert_true(adjacent <= 1);
        free(seen);
    }
    data_free(&ds);
}

// Global micro-batch j = rows [j*G, (j+1)*G); rank r of R reads its B = G/R.
// Concatenated over ranks, every R must give the same tokens.
static void test_rows_same_for_any_rank_count(void **state) {
    DataSet ds;
    open_distinct(state, "rows_ranks", 3000, &ds);
    enum { T = 16, G = 8, STEPS = 40 };  // 40*8 rows of 16 wrap the 2700-token train split
    int32_t ref_in[STEPS * G * T], ref_tgt[STEPS * G * T];
    int32_t in[STEPS * G * T], tgt[STEPS * G * T];
    int rank_counts[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int R = rank_counts[k], B = G / R;
        for (int j = 0; j < STEPS; j++)
            for (int r = 0; r < R; r++) {
                size_t at = ((size_t)j * G + (size_t)r * B) * T;
                data_rows(&ds, SPLIT_TRAIN, (uint64_t)j * G + (uint64_t)r * B, B, T, in + at,
                          tgt + at);
            }
        if (R == 1) {
            memcpy(ref_in, in, sizeof in);
            memcpy(ref_tgt, tgt, sizeof tgt);
        }
        assert_memory_equal(in, ref_in, sizeof in);
        assert_memory_equal(tgt, ref_tgt, sizeof tgt);
    }
    data_free(&ds);
}

// --data-order sequential is llm.c's DataLoader without shuffling: rank r of
// P, batch i, row b reads the B*T+1 tokens from ((i*P + r)*B + b)*T, and a
// pass holds floor((n-1) / (P*B*T)) global batches (written here from the
// loader's description, independently of data.c). Compared over several
// passes for a train and a val shard, at 1, 2 and 4 ranks.
static void test_sequential_is_llmc_order(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], err[512] = "";
    scratch(state, "sequential", dir);
    enum { T = 8, G = 4, NTRAIN = 1000, NVAL = 300 };
    uint16_t *train = ramp(NTRAIN, 0, 60000), *val = ramp(NVAL, 7, 60000);
    write_shard(join(dir, "data_train.bin", path), train, NTRAIN, MAGIC, 1, NTRAIN);
    write_shard(join(dir, "data_val.bin", path), val, NVAL, MAGIC, 1, NVAL);
    DataSet ds;
    assert_int_equal(data_open(&ds, dir, 65536, T, err, sizeof err), 0);
    assert_int_equal(data_set_sequential(&ds, T, G, err, sizeof err), 0);
    const uint16_t *split[2] = {train, val};
    const int count[2] = {NTRAIN, NVAL};
    int rank_counts[] = {1, 2, 4};
    int32_t in[G * T], tgt[G * T];
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 3; k++) {
            int P = rank_counts[k], B = G / P;
            long passes = (count[s] - 1) / (G * T);  // llm.c: global batches before it starts over
            for (long i = 0; i < 3 * passes + 1; i++)
                for (int r = 0; r < P; r++) {
                    data_rows(&ds, s, (uint64_t)i * G + (uint64_t)r * B, B, T, in, tgt);
                    for (int b = 0; b < B; b++) {
                        long at = (((i % passes) * P + r) * B + b) * T;
                        for (int t = 0; t < T; t++) {
                            assert_int_equal(in[b * T + t], split[s][at + t]);
                            assert_int_equal(tgt[b * T + t], split[s][at + t + 1]);
                        }
                    }
                }
        }
    // less than one global batch in a split: one line that says so
    assert_int_not_equal(data_set_sequential(&ds, T, 64, err, sizeof err), 0);
    assert_non_null(strstr(err, "less than one global micro-batch"));
    assert_null(strchr(err, '\n'));
    data_free(&ds);
    free(train);
    free(val);
}

// ---- errors ----------------------------------------------------------------

// data_open must fail with one line that names `names` and contains `what`.
static void expect_error(const char *path, int vocab, int T, const char *names, const char *what) {
    DataSet ds;
    char err[PATH_LEN] = "";
    int rc = data_open(&ds, path, vocab, T, err, sizeof err);
    if (rc == 0) fail_msg("data_open(%s) succeeded; expected an error with '%s'", path, what);
    if (!strstr(err, names) || !strstr(err, what) || strchr(err, '\n'))
        fail_msg("error '%s' should name '%s' and say '%s' on one line", err, names, what);
}

static void test_error_missing_and_empty(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], file[PATH_LEN];
    scratch(state, "err_missing", dir);
    join(dir, "nope.txt", path);
    expect_error(path, 256, 16, path, "no such file or directory");
    write_bytes(join(dir, "empty.txt", file), "", 0);
    expect_error(file, 256, 16, file, "is empty; give a text file or llm.c token shards");
    char sub[PATH_LEN];
    assert_int_equal(mkdir(join(dir, "empty_folder", sub), 0755), 0);
    expect_error(sub, 256, 16, sub, "is empty");
}

// Not a regular file, or one that reports size 0 and still reads: said as
// what it is, not "empty".
static void test_error_not_a_file(void **state) {
    char dir[PATH_LEN], fifo[PATH_LEN];
    scratch(state, "err_kind", dir);
    assert_int_equal(mkfifo(join(dir, "fifo", fifo), 0644), 0);
    expect_error(fifo, 256, 16, fifo, "is a FIFO (named pipe)");
    expect_error("/dev/zero", 256, 16, "/dev/zero", "is a character device");
    expect_error("/proc/self/status", 256, 16, "/proc/self/status", "reports a size of 0 but has content");
}

// Issue 28: a binary file in a --data folder was read as text. A NUL byte
// marks it: the file is named, with where the byte is.
static void test_error_binary_in_text(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], img[PATH_LEN];
    scratch(state, "err_binary", dir);
    char *text = lines(2000);
    write_bytes(join(dir, "a.txt", path), text, 2000);
    write_bytes(join(dir, "b.png", img), "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
    expect_error(dir, 256, 16, img, "a NUL byte at byte 8: not a text file");
    expect_error(img, 256, 16, img, "not a text file");
    free(text);
}

static void test_error_too_short(void **state) {
    char dir[PATH_LEN], path[PATH_LEN];
    scratch(state, "err_short", dir);
    write_bytes(join(dir, "short.txt", path), "just a few bytes of text", 24);
    expect_error(path, 256, 16, path, "has 24 tokens; sequence length 16 needs at least 36");
}

static void test_error_bad_shards(void **state) {
    char dir[PATH_LEN], path[PATH_LEN], good[PATH_LEN];
    scratch(state, "err_shards", dir);
    uint16_t *tok = ramp(500, 0, 200);
    write_shard(join(dir, "version.bin", path), tok, 500, MAGIC, 2, 500);
    expect_error(path, 256, 8, path, "version 2");
    write_shard(join(dir, "count.bin", path), tok, 400, MAGIC, 1, 500);
    expect_error(path, 256, 8, path, "says 500 tokens");
    write_bytes(join(dir, "header.bin", path), (int32_t[]){MAGIC, 1, 10}, 12);
    expect_error(path, 256, 8, path, "header is truncated");
    // issue 39 item 15: a count of -1 was said to need "-2" bytes
    write_shard(join(dir, "negative.bin", path), tok, 2, MAGIC, 1, -1);
    expect_error(path, 256, 8, path, "says -1 tokens, a negative count: damaged or not an llm.c shard");

    char folder[PATH_LEN];  // a folder of shards with one foreign .bin among them
    assert_int_equal(mkdir(join(dir, "mixed", folder), 0755), 0);
    write_shard(join(folder, "a.bin", good), tok, 500, MAGIC, 1, 500);
    write_shard(join(folder, "b.bin", path), tok, 500, 12345, 1, 500);
    expect_error(folder, 256, 8, "mixed/b.bin", "magic 12345");

    // issue 15, item 5: alone, the foreign shard was trained on as byte text
    expect_error(path, 256, 8, path, "has an llm.c token shard's shape");
    expect_error(path, 256, 8, path, "magic 12345 where a shard has 20240520");

    assert_int_equal(mkdir(join(dir, "only_val", folder), 0755), 0);
    write_shard(join(folder, "val.bin", path), tok, 500, MAGIC, 1, 500);
    expect_error(folder, 256, 8, folder, "only validation shards");
    free(tok);
}

static void test_error_token_outside_vocab(void **state) {
    char dir[PATH_LEN], path[PATH_LEN];
    scratch(state, "err_vocab", dir);
    uint16_t *tok = ramp(500, 0, 200);
    tok[7] = 300;
    tok[99] = 50256;
    write_shard(join(dir, "gpt2.bin", path), tok, 500, MAGIC, 1, 500);
    expect_error(path, 256, 8, path, "token 300 at position 7");
    expect_error(path, 256, 8, path,
                 "the model's vocabulary is 256; these tokens need at least 50257");
    char *text = lines(1000);  // bytes of text against a model of 100 symbols
    write_bytes(join(dir, "text.txt", path), text, 1000);
    expect_error(path, 100, 8, path,
                 "the model's vocabulary is 100; these tokens need at least 111");
    free(text);
    free(tok);
    // the built-in corpus is named as such, not by a license file the user never gave
    expect_error("", 100, 8, "the built-in corpus", "these tokens need at least");
}

int main(void) {
    char root[64];
    if (test_make_dir(root, sizeof root, "test-data")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_builtin_corpus, root),
        cmocka_unit_test_prestate(test_text_file, root),
        cmocka_unit_test_prestate(test_small_file_keeps_one_row_per_split, root),
        cmocka_unit_test_prestate(test_text_folder, root),
        cmocka_unit_test_prestate(test_shard_file, root),
        cmocka_unit_test_prestate(test_shard_folder_with_val, root),
        cmocka_unit_test_prestate(test_make_shard_script, root),
        cmocka_unit_test_prestate(test_row_formula_and_shift, root),
        cmocka_unit_test_prestate(test_rows_visit_every_window_once_per_pass, root),
        cmocka_unit_test_prestate(test_rows_same_for_any_rank_count, root),
        cmocka_unit_test_prestate(test_sequential_is_llmc_order, root),
        cmocka_unit_test_prestate(test_error_missing_and_empty, root),
        cmocka_unit_test_prestate(test_error_not_a_file, root),
        cmocka_unit_test_prestate(test_error_binary_in_text, root),
        cmocka_unit_test_prestate(test_error_too_short, root),
        cmocka_unit_test_prestate(test_error_bad_shards, root),
        cmocka_unit_test_prestate(test_error_token_outside_vocab, root),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    test_remove_dir(root);
    return failed;
}
