// ckpt_fixture.h: what the 2-rank checkpoint tests (test_ckpt.c,
// test_ckpt_save.c) share: each rank's tensors (sizes differ by rank, values
// by rank and seed), a manifest, saving and loading them, and the temporary
// folder rank 0 makes for all ranks.
#pragma once
#include "testutil.h"
#include "ckpt.h"

#define PATH_LEN 1024

typedef struct Ctx {
    Comm world;
    char root[256];  // temp folder made by rank 0, shared by all ranks
} Ctx;

// This rank's tensors: sizes differ by rank; values depend on (rank, seed).
typedef struct Tensors {
    float *master, *moment;
    CkptTensor t[2];
} Tensors;

static __attribute__((unused)) void tensors_make(Tensors *x, int rank, uint64_t seed) {
    size_t n0 = 1000 + 37 * (size_t)rank, n1 = 257 + 500 * (size_t)rank;
    x->master = malloc(n0 * sizeof(float));
    x->moment = malloc(n1 * sizeof(float));
    test_fill(x->master, n0, seed * 10 + (uint64_t)rank, -1, 1);
    test_fill(x->moment, n1, seed * 10 + (uint64_t)rank + 5, 0, 3);
    x->t[0] = (CkptTensor){.name = "master", .host = x->master, .bytes = n0 * sizeof(float)};
    x->t[1] = (CkptTensor){.name = "adam_m", .host = x->moment, .bytes = n1 * sizeof(float)};
}

static __attribute__((unused)) void tensors_clear(Tensors *x) {  // same shapes, zero values
    memset(x->master, 0, x->t[0].bytes);
    memset(x->moment, 0, x->t[1].bytes);
}

static __attribute__((unused)) int tensors_equal(const Tensors *a, const Tensors *b) {
    return memcmp(a->master, b->master, a->t[0].bytes) == 0 &&
           memcmp(a->moment, b->moment, a->t[1].bytes) == 0;
}

static __attribute__((unused)) int tensors_zero(const Tensors *x) {
    for (int i = 0; i < 2; i++)
        for (size_t k = 0; k < x->t[i].bytes; k++)
            if (((const unsigned char *)x->t[i].host)[k]) return 0;
    return 1;
}

static __attribute__((unused)) void tensors_free(Tensors *x) {
    free(x->master);
    free(x->moment);
}

static __attribute__((unused)) CkptManifest manifest(long step, int ranks) {
    CkptManifest m;
    memset(&m, 0, sizeof m);
    snprintf(m.stage, sizeof m.stage, "zero1");
    m.ranks = ranks;
    m.step = step;
    m.data_rows = 64 * (uint64_t)step;
    m.seed = 42;
    m.rng_state = 0xdeadbeefcafebabeull;  // above 2^63: must survive the text manifest
    m.cfg = (GPTConfig){.max_seq_len = 64, .vocab_size = 256, .num_layers = 2, .num_heads = 2,
                        .channels = 32};
    m.vocab_padded = 256;
    m.num_params = 12345;
    m.batch = 4;
    m.seq_len = 64;
    m.grad_accum = 2;
    m.lr = 1.2345678901234567e10;  // beyond what an integer count of nano-units holds; must read back exactly
    // the rest as a run's defaults: every field is read within its flag's range
    m.total_steps = 20, m.warmup = 2, m.beta1 = 0.9, m.beta2 = 0.95, m.adam_eps = 1e-8, m.min_lr_frac = 0.1;
    m.loss_scale = 1, m.scale_last_overflow = -1, m.scale_hysteresis_left = 2;
    snprintf(m.data, sizeof m.data, "built-in");
    snprintf(m.data_order, sizeof m.data_order, "permuted");
    snprintf(m.lr_schedule, sizeof m.lr_schedule, "cosine");
    snprintf(m.warmup_type, sizeof m.warmup_type, "log");
    snprintf(m.precision, sizeof m.precision, "bf16");
    return m;
}

static __attribute__((unused)) int all_ranks(Ctx *c, int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c->world.mpi);
    return all;
}

// A subfolder of the temp root for one test (made by rank 0).
static __attribute__((unused)) char *test_dir(Ctx *c, const char *name, char *out) {
    assert_true(snprintf(out, PATH_LEN, "%s/%s", c->root, name) < PATH_LEN);
    return out;
}

static __attribute__((unused)) void on_rank0(Ctx *c, const char *shell_cmd) {
    int rc = c->world.rank == 0 ? system(shell_cmd) : 0;
    assert_true(all_ranks(c, rc == 0));
}

static __attribute__((unused)) int save(Ctx *c, const char *dir, long step, Tensors *x, char *err) {
    CkptManifest m = manifest(step, c->world.size);
    return ckpt_save(&c->world, dir, &m, x->t, 2, err, 512);
}

// Loads into zeroed copies of this rank's tensors; reports the step and
// whether the values equal `want`.
static __attribute__((unused)) int load(Ctx *c, const char *dir, const CkptManifest *expect, const Tensors *want,
                long *step, int *equal, char *err) {
    Tensors got;
    tensors_make(&got, c->world.rank, 0);
    tensors_clear(&got);
    CkptManifest m;
    int rc = ckpt_load(&c->world, dir, expect, &m, got.t, 2, NULL, err, 512);
    *step = rc == 0 ? m.step : -1;
    *equal = rc == 0 ? tensors_equal(&got, want) : tensors_zero(&got);
    tensors_free(&got);
    return rc;
}

// Loads `dir` expecting step 10 with the values of seed 1.
static __attribute__((unused)) int still_step10(Ctx *c, const char *dir) {
    Tensors a;
    tensors_make(&a, c->world.rank, 1);
    char err[512] = "";
    long step;
    int equal, rc = load(c, dir, NULL, &a, &step, &equal, err);
    tensors_free(&a);
    return all_ranks(c, rc == 0 && step == 10 && equal);
}

// MPI is up: rank 0 makes the temporary folder `name`, every rank learns it.
// 1 (and a line) unless there are 2 ranks and a folder.
static __attribute__((unused)) int ckpt_fixture_init(Ctx *c, const char *name) {
    *c = (Ctx){.world = {.mpi = MPI_COMM_WORLD}};
    MPI_Comm_rank(MPI_COMM_WORLD, &c->world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world.size);
    if (c->world.rank == 0 && test_make_dir(c->root, sizeof c->root, name)) c->root[0] = 0;
    MPI_Bcast(c->root, sizeof c->root, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (c->root[0] && c->world.size == 2) return 0;
    if (c->world.rank == 0) fprintf(stderr, "%s needs 2 ranks and a temp folder\n", name);
    return 1;
}
