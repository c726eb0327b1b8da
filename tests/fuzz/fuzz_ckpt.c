// fuzz_ckpt.c: libFuzzer target for the checkpoint reader (ckpt_load on one
// rank): the manifest's text and the rank's part file. The input is a
// 2-byte little-endian length L, the manifest (L bytes), then the part.
// A damaged checkpoint must be refused with one line, never crash, report
// to a sanitizer or exit; one that loads fills the tensors it names.
//
// FUZZ_CKPT_SEED=FILE writes a checkpoint of this target's tensors in that
// format and exits (the seed corpus's valid input).
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt.h"

static Comm world;
static char root[64], step_dir[128];
static float master[16], moment[8];

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();  // the fuzzer's own file
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    void *p = malloc(*n + 1);
    if (fread(p, 1, *n, f) != *n) abort();
    fclose(f);
    return p;
}

static void write_seed(const char *out) {
    CkptManifest m;
    memset(&m, 0, sizeof m);
    snprintf(m.stage, sizeof m.stage, "zero2");
    m.ranks = 1;
    m.step = 1;
    m.cfg = (GPTConfig){.max_seq_len = 32, .vocab_size = 256, .num_layers = 2, .num_heads = 2, .channels = 32};
    m.num_params = 24;
    m.batch = 4, m.seq_len = 32, m.grad_accum = 1, m.total_steps = 4, m.warmup = 2, m.lr = 1e-3;
    snprintf(m.data, sizeof m.data, "built-in");
    snprintf(m.data_order, sizeof m.data_order, "permuted");
    snprintf(m.lr_schedule, sizeof m.lr_schedule, "cosine");
    snprintf(m.warmup_type, sizeof m.warmup_type, "log");
    m.grad_clip = 1, m.beta1 = 0.9, m.beta2 = 0.95, m.adam_eps = 1e-8, m.min_lr_frac = 0.1;
    snprintf(m.precision, sizeof m.precision, "bf16");  // every field within its flag's range, or it is refused
    m.loss_scale = 1, m.scale_last_overflow = -1, m.scale_hysteresis_left = 2;
    for (int i = 0; i < 16; i++) master[i] = 0.25f * (float)i;
    for (int i = 0; i < 8; i++) moment[i] = 1.0f / (float)(i + 1);
    CkptTensor t[2] = {{"master", master, sizeof master}, {"adam_m", moment, sizeof moment}};
    char err[512], dir[128], path[256];
    snprintf(dir, sizeof dir, "%s/seed", root);
    if (ckpt_save(&world, dir, &m, t, 2, err, sizeof err)) {
        fprintf(stderr, "fuzz_ckpt: %s\n", err);
        exit(1);
    }
    size_t nm, np;
    snprintf(path, sizeof path, "%s/step-00000001/manifest.txt", dir);
    char *text = read_file(path, &nm);
    snprintf(path, sizeof path, "%s/step-00000001/rank-00000.bin", dir);
    char *part = read_file(path, &np);
    FILE *f = fopen(out, "wb");
    unsigned char len[2] = {(unsigned char)(nm & 0xff), (unsigned char)(nm >> 8)};
    if (!f || fwrite(len, 1, 2, f) != 2 || fwrite(text, 1, nm, f) != nm || fwrite(part, 1, np, f) != np) abort();
    fclose(f);
    exit(0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    world = (Comm){.mpi = MPI_COMM_WORLD, .rank = 0, .size = 1};
    snprintf(root, sizeof root, "/tmp/wb-fuzz-ckpt-%d", (int)getpid());
    snprintf(step_dir, sizeof step_dir, "%s/step-00000001", root);
    mkdir(root, 0755);
    mkdir(step_dir, 0755);
    if (getenv("FUZZ_CKPT_SEED")) write_seed(getenv("FUZZ_CKPT_SEED"));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t len = (size_t)data[0] | (size_t)data[1] << 8;
    if (len > size - 2) len = size - 2;
    char path[256];
    snprintf(path, sizeof path, "%s/manifest.txt", step_dir);
    write_file(path, data + 2, len);
    snprintf(path, sizeof path, "%s/rank-00000.bin", step_dir);
    write_file(path, data + 2 + len, size - 2 - len);
    CkptTensor t[2] = {{"master", master, sizeof master}, {"adam_m", moment, sizeof moment}};
    CkptManifest got;
    char err[512] = "";
    if (ckpt_load(&world, step_dir, NULL, &got, t, 2, NULL, err, sizeof err) != 0 && (!err[0] || strchr(err, '\n')))
        abort();  // a refusal is one line
    return 0;
}
