// mpirun: 2
// test_ckpt.c: sharded checkpoints on 2 ranks: bit-exact round trip, `latest`
// moving, refusals (stage, grid, ranks, model, batch, tensor shape, a
// manifest's value out of range) and corruption caught on every rank (failed
// saves: test_ckpt_save.c). Every assertion is on values reduced over the
// ranks, after all collectives, so no rank leaves a collective early.
#define TEST_WITH_MPI
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "testutil.h"
#include "ckpt.h"
#include "comm.h"
#include "ckpt_fixture.h"

// FNV-1a 64 test vectors (offset basis 0xcbf29ce484222325 = 14695981039346656037)
static void test_fnv1a64_reference_values(void **state) {
    const uint64_t h0 = 14695981039346656037ull;
    assert_true(fnv1a64("", 0, h0) == 0xcbf29ce484222325ull);
    assert_true(fnv1a64("a", 1, h0) == 0xaf63dc4c8601ec8cull);
    assert_true(fnv1a64("foobar", 6, h0) == 0x85944171f73967e8ull);
    assert_true(fnv1a64("bar", 3, fnv1a64("foo", 3, h0)) == fnv1a64("foobar", 6, h0));
}

static void test_roundtrip_bit_exact(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "", latest[64] = "";
    test_dir(c, "roundtrip", dir);
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    int saved = save(c, dir, 10, &x, err) == 0;

    CkptManifest want = manifest(10, c->world.size), got;
    Tensors y;
    tensors_make(&y, c->world.rank, 0);
    tensors_clear(&y);
    int loaded = ckpt_load(&c->world, dir, &want, &got, y.t, 2, NULL, err, sizeof err) == 0;
    int same_manifest = strcmp(got.stage, "zero1") == 0 && got.ranks == 2 && got.step == 10 &&
                        got.data_rows == 640 && got.seed == 42 &&
                        got.rng_state == 0xdeadbeefcafebabeull &&
                        memcmp(&got.cfg, &want.cfg, sizeof got.cfg) == 0 &&
                        got.num_params == 12345 && got.batch == 4 && got.seq_len == 64 &&
                        got.grad_accum == 2 && got.lr == want.lr;
    char path[PATH_LEN + 16];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(latest, sizeof latest, f)) latest[0] = 0;
        fclose(f);
    }
    assert_true(all_ranks(c, saved));
    assert_true(all_ranks(c, loaded));
    assert_true(all_ranks(c, same_manifest));
    assert_true(all_ranks(c, tensors_equal(&x, &y)));
    assert_string_equal(latest, "step-00000010\n");
    tensors_free(&x);
    tensors_free(&y);
}

static void test_second_save_moves_latest(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], step10[PATH_LEN + 32], err[512] = "";
    test_dir(c, "two_saves", dir);
    snprintf(step10, sizeof step10, "%s/step-00000010", dir);
    Tensors a, b;
    tensors_make(&a, c->world.rank, 1);
    tensors_make(&b, c->world.rank, 2);
    int saved = save(c, dir, 10, &a, err) == 0 && save(c, dir, 20, &b, err) == 0;
    long step_latest, step_old;
    int eq_latest, eq_old;
    int ok_latest = load(c, dir, NULL, &b, &step_latest, &eq_latest, err) == 0;
    int ok_old = load(c, step10, NULL, &a, &step_old, &eq_old, err) == 0;  // a step folder itself
    assert_true(all_ranks(c, saved && ok_latest && ok_old));
    assert_true(all_ranks(c, step_latest == 20 && eq_latest));
    assert_true(all_ranks(c, step_old == 10 && eq_old));
    tensors_free(&a);
    tensors_free(&b);
}

// Every rank must refuse, with the same one-line message containing `what`;
// refusals from the manifest must also leave the caller's tensors untouched.
static void expect_refused(Ctx *c, const char *dir, const CkptManifest *expect, const char *what,
                           int untouched_too) {
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    char err[512] = "", err0[512];
    long step;
    int untouched;
    int rc = load(c, dir, expect, &x, &step, &untouched, err);
    memcpy(err0, err, sizeof err);
    MPI_Bcast(err0, sizeof err0, MPI_CHAR, 0, c->world.mpi);
    int ok = rc != 0 && (untouched || !untouched_too) && strstr(err, what) &&
             strcmp(err, err0) == 0 && !strchr(err, '\n');
    if (!all_ranks(c, ok))
        fail_msg("expected a refusal with '%s'; rank 0 got %d: '%s'", what, rc, err);
    tensors_free(&x);
}

static void test_refuses_other_run_shapes(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    test_dir(c, "refusals", dir);
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    assert_true(all_ranks(c, save(c, dir, 10, &x, err) == 0));
    tensors_free(&x);

    CkptManifest e = manifest(0, c->world.size);
    snprintf(e.stage, sizeof e.stage, "zero4");  // a stage this build does not know; 01-07 reshard it (ckpt_reshard.c)
    expect_refused(c, dir, &e, "was written by zero1; this is zero4: resume with the same stage", 1);
    e = manifest(0, c->world.size);
    e.cfg.num_layers = 3;
    expect_refused(c, dir, &e, "model differs: num_layers is 2 there and 3 in this run", 1);
    e = manifest(0, c->world.size);
    e.num_params = 999;
    expect_refused(c, dir, &e, "model differs: num_params is 12345 there and 999", 1);
    e = manifest(0, c->world.size);
    e.batch = 8;
    expect_refused(c, dir, &e, "saved with batch 4; this run has 8", 1);
    e = manifest(0, c->world.size);
    e.grad_accum = 1;
    expect_refused(c, dir, &e, "saved with grad_accum 2; this run has 1", 1);
}

// A checkpoint of a stage that splits the model records its grid: the same
// grid loads; under a stage that cannot reshard it (3d_parallel's parts are
// read at any grid: ckpt_reshard.c), another grid (or none) is refused with
// both grids named.
static void test_refuses_other_grid(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    test_dir(c, "grid", dir);
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    CkptManifest m = manifest(10, c->world.size);
    snprintf(m.stage, sizeof m.stage, "zero4_grid");
    snprintf(m.grid, sizeof m.grid, "tp 2 x pp 1 x dp 1");
    assert_true(all_ranks(c, ckpt_save(&c->world, dir, &m, x.t, 2, err, sizeof err) == 0));
    long step;
    int equal;
    CkptManifest e = manifest(0, c->world.size);
    snprintf(e.stage, sizeof e.stage, "zero4_grid");
    snprintf(e.grid, sizeof e.grid, "tp 2 x pp 1 x dp 1");
    assert_true(all_ranks(c, load(c, dir, &e, &x, &step, &equal, err) == 0 && equal && step == 10));
    tensors_free(&x);
    snprintf(e.grid, sizeof e.grid, "tp 1 x pp 2 x dp 1");
    expect_refused(c, dir, &e, "saved on the grid tp 2 x pp 1 x dp 1 (2 ranks); this run's is tp 1 x pp 2 x dp 1", 1);
    e.grid[0] = 0;
    expect_refused(c, dir, &e, "this run's is of data parallelism alone", 1);
}

// A checkpoint of 1 rank (rank 0 alone, over MPI_COMM_SELF) loaded by 2.
static void test_refuses_other_rank_count(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    test_dir(c, "one_rank", dir);
    int saved = 1;
    if (c->world.rank == 0) {
        Comm self = {.mpi = MPI_COMM_SELF, .rank = 0, .size = 1};
        Tensors x;
        tensors_make(&x, 0, 1);
        CkptManifest m = manifest(10, 1);
        saved = ckpt_save(&self, dir, &m, x.t, 2, err, sizeof err) == 0;
        tensors_free(&x);
    }
    assert_true(all_ranks(c, saved));
    expect_refused(c, dir, NULL, "has 1 ranks' shards; this run has 2: resume with mpirun -np 1", 1);
    // a data-parallel stage reshards another rank count's checkpoint, at the same global batch only
    CkptManifest e = manifest(0, c->world.size);
    expect_refused(c, dir, &e, "was saved with a global batch of 8 rows of 64 tokens (batch 4 x 1 ranks x "
                   "grad_accum 2); this run's is 16 of 64", 1);
}

static void test_refuses_other_tensor_shapes(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    test_dir(c, "shapes", dir);
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    int saved = save(c, dir, 10, &x, err) == 0;
    x.t[1].bytes -= 4;  // one float fewer on every rank
    CkptManifest m;
    int rc = ckpt_load(&c->world, dir, NULL, &m, x.t, 2, NULL, err, sizeof err);
    int ok = saved && rc != 0 && strstr(err, "rank-00000.bin holds adam_m of 1028 bytes where "
                                        "this run expects adam_m of 1024 bytes");
    if (!all_ranks(c, ok)) fail_msg("unexpected: %d '%s'", rc, err);
    tensors_free(&x);
}

// Flips one byte of rank 1's part at `offset` (from the end when negative).
static void corrupt_rank1(Ctx *c, const char *dir, long offset) {
    int ok = 1;
    if (c->world.rank == 0) {
        char path[PATH_LEN + 32];
        snprintf(path, sizeof path, "%s/step-00000010/rank-00001.bin", dir);
        int fd = open(path, O_RDWR);
        off_t at = offset >= 0 ? offset : lseek(fd, 0, SEEK_END) + offset;
        unsigned char byte = 0;
        ok = fd >= 0 && pread(fd, &byte, 1, at) == 1;
        byte ^= 0x10;
        ok = ok && pwrite(fd, &byte, 1, at) == 1 && close(fd) == 0;
    }
    assert_true(all_ranks(c, ok));
}

static void test_corrupt_part_refused_everywhere(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "";
    long offsets[] = {-100, 40};  // in the tensor data; in the header's first entry
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "corrupt%d", k);
        test_dir(c, name, dir);
        Tensors x;
        tensors_make(&x, c->world.rank, 1);
        assert_true(all_ranks(c, save(c, dir, 10, &x, err) == 0));
        corrupt_rank1(c, dir, offsets[k]);
        char what[PATH_LEN + 128];
        snprintf(what, sizeof what, "checkpoint %s/step-00000010/rank-00001.bin is corrupt "
                 "(checksum mismatch): not loaded; use an earlier step folder or start fresh", dir);
        CkptManifest e = manifest(0, c->world.size);
        expect_refused(c, dir, &e, what, 0);
        tensors_free(&x);
    }
}

static void test_truncated_part_refused(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "", cmd[PATH_LEN + 64];
    test_dir(c, "truncated", dir);
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    assert_true(all_ranks(c, save(c, dir, 10, &x, err) == 0));
    snprintf(cmd, sizeof cmd, "truncate -s -8 %s/step-00000010/rank-00000.bin", dir);
    on_rank0(c, cmd);
    CkptManifest e = manifest(0, c->world.size);
    expect_refused(c, dir, &e, "rank-00000.bin is corrupt (its size differs", 0);
    tensors_free(&x);
}

// Issue 39 items 5 and 10: a manifest line edited out of its flag's range,
// or out of step with the others, was trusted (ranks = 0 read no part, a
// skipped_steps past the step gave a negative learning rate, a loss scale of
// 1e300 was taken). Each is refused in one line naming the line, the tensors
// untouched.
static void test_damaged_values_refused(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], damaged[PATH_LEN], cmd[6 * PATH_LEN], err[512] = "";
    test_dir(c, "values", dir);
    test_dir(c, "values_damaged", damaged);
    Tensors x;
    tensors_make(&x, c->world.rank, 1);
    assert_true(all_ranks(c, save(c, dir, 10, &x, err) == 0));
    tensors_free(&x);
    const char *cases[][2] = {
        {"skipped_steps = 100", "skipped_steps = 100 is more than the 10 steps it ran"},
        {"loss_scale = 1e300", "loss_scale = 1e+300 is outside (0, 1e+30], the range of --loss-scale"},
        {"ranks = 0", "ranks = 0 is outside [1, 2147483647]"},
        {"ranks = -3", "ranks = -3 is outside [1, 2147483647]"},
        {"ranks = 2147483647", "ranks = 2147483647, but it lists 2 parts"},
        {"beta2 = 1", "beta2 = 1 is outside [0, 1), the range of --beta2"},
        {"lr = -0.001", "lr = -0.001 is outside (0, 3.402823466e+38], the range of --lr"},
        {"precision = fp8", "precision = fp8 is none of bf16|fp16"},
        {"seq_len = 65", "seq_len = 65 is longer than its model's context (max_seq_len = 64)"},
        {"scale_last_overflow = 10", "scale_last_overflow = 10 is not one of the 10 steps it ran"},
        // no flag's range: --hysteresis starts at 1, the overflows left reach 0
        {"scale_hysteresis_left = -1", "scale_hysteresis_left = -1 is outside [0, 2147483647]: it is damaged"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(cases[k][0], " "), cases[k][0]);
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && sed -i 's/^%s = .*/%s/' %s/step-00000010/manifest.txt",
                 damaged, dir, damaged, key, cases[k][0], damaged);
        on_rank0(c, cmd);
        expect_refused(c, damaged, NULL, cases[k][1], 1);
    }
}

// dp_baseline saves its replicated state from rank 0 only: rank 1 has no tensors.
static void test_rank_without_tensors(void **state) {
    Ctx *c = *state;
    char dir[PATH_LEN], err[512] = "", part[PATH_LEN + 32];
    test_dir(c, "no_tensors", dir);
    Tensors x, y;
    tensors_make(&x, c->world.rank, 1);
    tensors_make(&y, c->world.rank, 0);
    tensors_clear(&y);
    int n = c->world.rank == 0 ? 2 : 0;
    CkptManifest m = manifest(10, c->world.size), got;
    int saved = ckpt_save(&c->world, dir, &m, x.t, n, err, sizeof err) == 0;
    int loaded = ckpt_load(&c->world, dir, &m, &got, y.t, n, NULL, err, sizeof err) == 0;
    snprintf(part, sizeof part, "%s/step-00000010/rank-00001.bin", dir);
    struct stat st;
    int header_only = stat(part, &st) == 0 && st.st_size == 32;
    int values = n == 0 ? tensors_zero(&y) : tensors_equal(&x, &y);
    assert_true(all_ranks(c, saved && loaded && header_only && values));
    tensors_free(&x);
    tensors_free(&y);
}

int main(int argc, char **argv) {
    comm_single_copy_choose();  // as the trainers do (comm.h)
    MPI_Init(&argc, &argv);
    Ctx c;
    if (ckpt_fixture_init(&c, "test-ckpt")) {
        MPI_Finalize();
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fnv1a64_reference_values),
        cmocka_unit_test_prestate(test_roundtrip_bit_exact, &c),
        cmocka_unit_test_prestate(test_second_save_moves_latest, &c),
        cmocka_unit_test_prestate(test_refuses_other_run_shapes, &c),
        cmocka_unit_test_prestate(test_refuses_other_grid, &c),
        cmocka_unit_test_prestate(test_refuses_other_rank_count, &c),
        cmocka_unit_test_prestate(test_refuses_other_tensor_shapes, &c),
        cmocka_unit_test_prestate(test_corrupt_part_refused_everywhere, &c),
        cmocka_unit_test_prestate(test_truncated_part_refused, &c),
        cmocka_unit_test_prestate(test_rank_without_tensors, &c),
        cmocka_unit_test_prestate(test_damaged_values_refused, &c),
    };
    int failed = run_mpi_tests(tests);
    if (c.world.rank == 0) test_remove_dir(c.root);
    MPI_Finalize();
    return failed;
}
