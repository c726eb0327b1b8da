// test_llmc.c: llm.c GPT-2 checkpoints, run as programs. The test writes and
// reads the format itself (header of 256 int32, tensors of one kind for all
// layers together, wte padded to Vp rows) from llm.c's description, apart
// from common/training/ckpt/llmc.c, and checks: --init-from of a model's initial
// weights gives the seed's losses bit for bit on every stage, version 5
// (bf16) reads as its values; --export-llmc writes the fp32 master weights
// (as the checkpoint of the same run holds them) with zero padding rows; the
// round trip export -> --init-from continues with the loss the exporting run
// would have had, at a vocabulary that needs padding and at one that does
// not; bad files are refused in one line. Run from the repository root after
// `make GPU=0`.
#include <sys/stat.h>
#include <unistd.h>
#include "runs.h"
#include "gpt.h"

#define PATH_LEN 512
#define CMD_LEN 2048
#define MAGIC 20240326
#define SEED 7
// tiny with a vocabulary of 300: llm.c pads it to Vp = 384, so 84 padding rows
#define SHAPE "--model tiny --vocab 300"
static const GPTConfig TINY300 = {.max_seq_len = 32, .vocab_size = 300, .num_layers = 2, .num_heads = 2,
                                  .channels = 32};
#define VP 384

typedef RunDir Ctx;

// ---- the format, written from llm.c's description ----

// Our flat layout, per unit: wte (Vp,C) as llm.c stores it (V rounded up to
// 128 rows, those past V zero), wpe (maxT,C); per block ln1w, ln1b, qkvw,
// qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb; lnfw, lnfb.
static void block_sizes(size_t C, size_t out[12]) {
    size_t s[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    memcpy(out, s, sizeof s);
}

static int padded_vocab(const GPTConfig *c) { return (c->vocab_size + 127) / 128 * 128; }

static size_t num_params(const GPTConfig *c) {
    size_t C = (size_t)c->channels, blk[12], per_block = 0;
    block_sizes(C, blk);
    for (int t = 0; t < 12; t++) per_block += blk[t];
    return (size_t)(padded_vocab(c) + c->max_seq_len) * C + (size_t)c->num_layers * per_block + 2 * C;
}

// Calls visit(file_elem, our_elem, count) for every tensor in the file's
// order (our_elem = -1 for wte's padding rows: zero in the file and in ours).
typedef void (*Visit)(void *arg, long our, size_t n);
static void walk_file_order(const GPTConfig *c, int vp, Visit visit, void *arg) {
    size_t C = (size_t)c->channels, L = (size_t)c->num_layers, blk[12], per_block = 0, off[13] = {0};
    block_sizes(C, blk);
    for (int t = 0; t < 12; t++) off[t + 1] = off[t] + blk[t], per_block += blk[t];
    assert_int_equal(vp, padded_vocab(c));  // the file's rows are ours
    size_t emb = (size_t)(vp + c->max_seq_len) * C;
    visit(arg, 0, (size_t)c->vocab_size * C);
    visit(arg, -1, (size_t)(vp - c->vocab_size) * C);
    visit(arg, (long)((size_t)vp * C), (size_t)c->max_seq_len * C);
    for (int t = 0; t < 12; t++)
        for (size_t l = 0; l < L; l++) visit(arg, (long)(emb + l * per_block + off[t]), blk[t]);
    visit(arg, (long)(emb + L * per_block), 2 * C);
}

typedef struct Writer {
    FILE *f;
    const float *ours;
    int bf16;
} Writer;

static void write_tensor(void *arg, long our, size_t n) {
    Writer *w = arg;
    for (size_t i = 0; i < n; i++) {
        float v = our < 0 ? 0.0f : w->ours[our + (long)i];
        if (w->bf16) {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h = (uint16_t)(u >> 16);  // the values given are bf16 already: truncation is exact
            assert_int_equal(fwrite(&h, 2, 1, w->f), 1);
        } else {
            assert_int_equal(fwrite(&v, 4, 1, w->f), 1);
        }
    }
}

static void write_llmc(const char *path, const GPTConfig *c, int version, const float *ours) {
    int32_t h[256] = {MAGIC, version, c->max_seq_len, c->vocab_size, c->num_layers, c->num_heads, c->channels, VP};
    Writer w = {fopen(path, "wb"), ours, version == 5};
    assert_non_null(w.f);
    assert_int_equal(fwrite(h, sizeof h, 1, w.f), 1);
    walk_file_order(c, VP, write_tensor, &w);
    fclose(w.f);
}

typedef struct Reader {
    const float *file;  // the parameters after the header
    size_t at;
    float *ours;
    double padding_abs_sum;
} Reader;

static void read_tensor(void *arg, long our, size_t n) {
    Reader *r = arg;
    for (size_t i = 0; i < n; i++, r->at++)
        if (our < 0) r->padding_abs_sum += fabs(r->file[r->at]);
        else r->ours[our + (long)i] = r->file[r->at];
}

// Reads a version-3 file into our layout; checks the header and the size.
static float *read_llmc(const char *path, const GPTConfig *c, double *padding_abs_sum) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    rewind(f);
    char *b = malloc(len);
    assert_int_equal(fread(b, 1, len, f), len);
    fclose(f);
    int32_t h[8];
    memcpy(h, b, sizeof h);
    int32_t want[8] = {MAGIC, 3, c->max_seq_len, c->vocab_size, c->num_layers, c->num_heads, c->channels, VP};
    assert_memory_equal(h, want, sizeof want);
    assert_int_equal(len, 1024 + 4 * num_params(c));  // our Ψ counts wte's Vp rows, as the file does
    Reader r = {(const float *)(b + 1024), 0, calloc(num_params(c), sizeof(float)), 0};
    walk_file_order(c, VP, read_tensor, &r);
    free(b);
    *padding_abs_sum = r.padding_abs_sum;
    return r.ours;
}

// ---- runs ----

static char *run_json(Ctx *c, const char *tag, const char *cmd_fmt, const char *arg) {
    char cmd[CMD_LEN], json[PATH_LEN], full[CMD_LEN + PATH_LEN + 32];
    snprintf(json, sizeof json, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, cmd_fmt, arg);
    snprintf(full, sizeof full, "%s --quiet --json %s", cmd, json);
    return train(full, json);
}

static void assert_same_losses(const char *a, const char *b, int n, const char *what) {
    double la[RUN_MAX_STEPS], lb[RUN_MAX_STEPS];
    losses_of(a, la, n);
    losses_of(b, lb, n);
    for (int i = 0; i < n; i++)
        if (la[i] != lb[i]) fail_msg("%s: step %d loss %.9g, expected %.9g", what, i + 1, la[i], lb[i]);
}

// ---- tests ----

// The seed's initial weights written as llm.c's file: --init-from it is the
// seed's run, on every stage (each rank reads its own range).
static void test_init_from_is_the_seed(void **state) {
    Ctx *c = *state;
    GPTLayout l;
    gpt_layout(&l, &TINY300);
    assert_int_equal(l.num_params, num_params(&TINY300));
    float *w = malloc(l.num_params * sizeof(float));
    gpt_init_values(&l, SEED, 0, l.num_params, w);
    char path[PATH_LEN], cmd[CMD_LEN];
    snprintf(path, sizeof path, "%s/init.bin", c->root);
    write_llmc(path, &TINY300, 3, w);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./dp_baseline " SHAPE " --seed %d --steps 3", SEED);
    char *seed = run_json(c, "seed", "%s", cmd);
    static const char *const STAGES[] = {"dp_baseline", "zero1", "zero2", "zero3", "cpu_offload"};
    for (int s = 0; s < 5; s++) {
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./%s --init-from %s --steps 3", STAGES[s], path);
        char *from = run_json(c, STAGES[s], "%s", cmd);
        assert_non_null(strstr(from, "\"vocab\":300"));
        assert_same_losses(from, seed, 3, STAGES[s]);
        free(from);
    }
    free(seed);
    // version 5 holds bf16 values: the same run as version 3 holding those values
    for (size_t i = 0; i < l.num_params; i++) {
        uint32_t u;
        memcpy(&u, &w[i], 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // round to nearest even (no NaN here)
        memcpy(&w[i], &u, 4);
    }
    char p3[PATH_LEN], p5[PATH_LEN];
    snprintf(p3, sizeof p3, "%s/rounded3.bin", c->root);
    snprintf(p5, sizeof p5, "%s/rounded5.bin", c->root);
    write_llmc(p3, &TINY300, 3, w);
    write_llmc(p5, &TINY300, 5, w);
    char *a = run_json(c, "v3", "mpirun -np 2 ./zero3 --init-from %s --steps 2", p3);
    char *b = run_json(c, "v5", "mpirun -np 2 ./zero3 --init-from %s --steps 2", p5);
    assert_same_losses(b, a, 2, "version 5");
    free(a);
    free(b);
    free(w);
}

// Appends the "master" tensor of a checkpoint part (ckpt.c's layout: a
// 32-byte header with the tensor count at offset 20, 48 bytes per tensor:
// name[32], bytes, checksum; then the data in entry order).
static void append_master(const char *path, float **out, size_t *count) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    rewind(f);
    char *b = malloc(len);
    assert_int_equal(fread(b, 1, len, f), len);
    fclose(f);
    uint32_t n;
    memcpy(&n, b + 20, 4);
    size_t off = 32 + 48 * (size_t)n;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t bytes;
        memcpy(&bytes, b + 32 + 48 * i + 32, 8);
        if (strcmp(b + 32 + 48 * i, "master") == 0) {
            *out = realloc(*out, (*count + bytes / 4) * sizeof(float));
            memcpy(*out + *count, b + off, bytes);
            *count += bytes / 4;
            break;
        }
        off += bytes;
    }
    free(b);
}

// --export-llmc writes the master weights that the run's own checkpoint
// holds, bit for bit, gathered from the shards (zero3) or from rank 0's
// whole copy (dp_baseline); wte's padding rows are zero.
static void test_export_is_the_master(void **state) {
    Ctx *c = *state;
    static const char *const STAGES[] = {"zero3", "dp_baseline"};
    for (int s = 0; s < 2; s++) {
        char bin[PATH_LEN], ck[PATH_LEN], cmd[CMD_LEN], part[PATH_LEN + 64];
        snprintf(bin, sizeof bin, "%s/export-%s.bin", c->root, STAGES[s]);
        snprintf(ck, sizeof ck, "%s/export-%s.ckpt", c->root, STAGES[s]);
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./%s " SHAPE " --steps 3 --save %s --export-llmc %s", STAGES[s],
                 ck, bin);
        free(run_json(c, STAGES[s], "%s", cmd));
        float *master = NULL;
        size_t n = 0;
        for (int r = 0; r < (s == 0 ? 2 : 1); r++) {
            snprintf(part, sizeof part, "%s/step-00000003/rank-%05d.bin", ck, r);
            append_master(part, &master, &n);
        }
        size_t psi = num_params(&TINY300);
        assert_true(n >= psi);
        double pad;
        float *w = read_llmc(bin, &TINY300, &pad);
        assert_true(pad == 0);
        if (memcmp(w, master, psi * sizeof(float)) != 0) fail_msg("%s: exported weights differ from master", STAGES[s]);
        free(w);
        free(master);
    }
}

// A train shard of exactly one global batch (G*T+1 tokens) and a constant
// rate: every step reads the same rows, so the run that exported after 2
// steps and the run that loads the export continue alike: the loader's
// first loss is the 3-step run's third, bit for bit (on another stage too).
// At 256 tokens (no padding) and at 300 (wte stored and exported as 384
// rows, the file's 84 padding rows read back as zero).
static void test_round_trip(void **state) {
    Ctx *c = *state;
    enum { B = 2, RANKS = 2, T = 32, NTRAIN = B * RANKS * T + 1, NVAL = 200 };
    char dir[PATH_LEN], path[PATH_LEN + 32], bin[PATH_LEN];
    snprintf(dir, sizeof dir, "%s/one-batch", c->root);
    assert_int_equal(mkdir(dir, 0755), 0);
    for (int s = 0; s < 2; s++) {
        int n = s ? NVAL : NTRAIN;
        int32_t h[256] = {20240520, 1, n};
        snprintf(path, sizeof path, "%s/%s.bin", dir, s ? "round_val" : "round_train");
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
        for (int i = 0; i < n; i++) {
            uint16_t tok = (uint16_t)((i * 37 + s * 11) % 251);
            assert_int_equal(fwrite(&tok, 2, 1, f), 1);
        }
        fclose(f);
    }
    static const char *const SHAPES[2] = {"--model tiny", SHAPE};
    for (int v = 0; v < 2; v++) {
        snprintf(bin, sizeof bin, "%s/round-%d.bin", c->root, v);
        char common[CMD_LEN / 2], cmd[CMD_LEN + PATH_LEN], tag[32];
        snprintf(common, sizeof common, "--batch %d --seq-len %d --data %s --data-order sequential --lr 3e-3 "
                 "--lr-schedule WarmupLR --warmup-start-frac 1 --eval-batches 1", B, T, dir);
        snprintf(cmd, sizeof cmd, "mpirun -np %d ./zero2 %s %s --steps 2 --export-llmc %s", RANKS, SHAPES[v], common,
                 bin);
        snprintf(tag, sizeof tag, "round-2-%d", v);
        char *two = run_json(c, tag, "%s", cmd);
        snprintf(cmd, sizeof cmd, "mpirun -np %d ./zero2 %s %s --steps 3", RANKS, SHAPES[v], common);
        snprintf(tag, sizeof tag, "round-3-%d", v);
        char *three = run_json(c, tag, "%s", cmd);
        snprintf(cmd, sizeof cmd, "mpirun -np %d ./zero3 --init-from %s %s --steps 1", RANKS, bin, common);
        snprintf(tag, sizeof tag, "round-loaded-%d", v);
        char *loaded = run_json(c, tag, "%s", cmd);
        double l2[2], l3[3], l1[1];
        losses_of(two, l2, 2);
        losses_of(three, l3, 3);
        losses_of(loaded, l1, 1);
        assert_true(l2[0] == l3[0] && l2[1] == l3[1]);  // a constant rate: the first two steps are the same
        assert_true(l3[2] < l3[0]);                     // it learns the one batch
        if (l1[0] != l3[2])
            fail_msg("%s, loaded from the export: loss %.9g, the exporting run's next %.9g", SHAPES[v], l1[0], l3[2]);
        free(two);
        free(three);
        free(loaded);
    }
}

static void write_header_file(const char *path, const int32_t *h8, long extra_bytes) {
    int32_t h[256] = {0};
    memcpy(h, h8, 8 * sizeof(int32_t));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    for (long i = 0; i < extra_bytes; i++) fputc(0, f);
    fclose(f);
}

static void test_bad_files_refused(void **state) {
    Ctx *c = *state;
    long full = 4 * (long)num_params(&TINY300);
    const struct {
        const char *name;
        int32_t h[8];
        long extra;
        const char *says;
    } cases[] = {
        {"shard.bin", {20240520, 1, 32, 300, 2, 2, 32, VP}, full, "token shard"},
        {"magic.bin", {12345, 3, 32, 300, 2, 2, 32, VP}, full, "magic 12345"},
        {"version.bin", {MAGIC, 4, 32, 300, 2, 2, 32, VP}, full, "version 4"},
        {"truncated.bin", {MAGIC, 3, 32, 300, 2, 2, 32, VP}, full - 4, "truncated"},
        {"longer.bin", {MAGIC, 3, 32, 300, 2, 2, 32, VP}, full + 4, "not a checkpoint of this shape"},
        {"heads.bin", {MAGIC, 3, 32, 300, 2, 3, 32, VP}, full, "heads do not divide"},
        {"vp.bin", {MAGIC, 3, 32, 300, 2, 2, 32, 256}, full, "smaller than V"},
        {"huge.bin", {MAGIC, 3, 32, 300, 200, 2, 1 << 20, VP}, 0, "this trainer can hold"},
    };
    char path[PATH_LEN], cmd[CMD_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", c->root, cases[i].name);
        write_header_file(path, cases[i].h, cases[i].extra);
        snprintf(cmd, sizeof cmd, "./dp_baseline --init-from %s --steps 1 --quiet", path);
        free(expect_refusal(cmd, cases[i].says));
    }
    snprintf(path, sizeof path, "%s/short.bin", c->root);
    write_header_file(path, cases[0].h, 0);
    assert_int_equal(truncate(path, 100), 0);
    snprintf(cmd, sizeof cmd, "./dp_baseline --init-from %s --steps 1 --quiet", path);
    free(expect_refusal(cmd, "shorter than"));
    free(expect_refusal("./dp_baseline --init-from /nonexistent.bin --steps 1", "no such file"));
    // issue 28: a FIFO or an endless /dev/stdin hung at start-up (timeout: code that reads them hangs)
    snprintf(path, sizeof path, "%s/fifo.bin", c->root);
    snprintf(cmd, sizeof cmd, "rm -f %s && mkfifo %s && timeout 60 ./dp_baseline --init-from %s --steps 1", path,
             path, path);
    free(expect_refusal(cmd, "fifo.bin is a FIFO, not a regular file"));
    free(expect_refusal("timeout 60 ./dp_baseline --init-from /dev/stdin --steps 1 < /dev/zero",
                        "--init-from /dev/stdin is a character device, not a regular file"));
    snprintf(path, sizeof path, "%s/truncated.bin", c->root);
    snprintf(cmd, sizeof cmd, "./dp_baseline --init-from %s --model small --steps 1", path);
    free(expect_refusal(cmd, "leave out --model"));
    free(expect_refusal("mpirun -np 2 ./zero2 --model tiny --steps 1 --export-llmc /nonexistent/x.bin",
                        "the folder /nonexistent does not exist"));
}

static int group_setup(void **state) {
    return run_dir_setup(state, "test_llmc", (const char *const[]){"./zero3", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_from_is_the_seed),
        cmocka_unit_test(test_export_is_the_master),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_files_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, run_dir_teardown);
}
