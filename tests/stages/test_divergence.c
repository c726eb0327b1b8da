// test_divergence.c: a run that diverges stops, on every stage, with one line
// and exit status 1: a loss that explodes but stays finite, a last update
// that leaves the model non-finite (judged by the validation loss before it
// is saved, also when cpu_offload --dpu applies it late), and states that are
// not finite where a checkpoint is about to be written. Run from the
// repository root after make.
#include <dirent.h>
#include "runs.h"
#include "trainer.h"

// The command must exit 1 with exactly one line of error output containing
// `want`, and no end-of-run summary.
static void expect_divergence(const char *cmd, const char *want) {
    char *out = NULL;
    int rc = test_run(cmd, &out);
    const char *line = strstr(out, "error: ");
    int ok = rc == 1 && line && strstr(line, want) && strstr(line, "training diverged") &&
             !strstr(line + 1, "error: ") && !strstr(out, "summary");
    if (!ok) fail_msg("%s: expected exit 1 and one error line with '%s'; got exit %d:\n%s", cmd, want, rc, out);
    free(out);
}

// Issue 15, item 1: --lr 1e6 sent the loss to 1.9e13 and the run exited 0.
static void test_exploding_loss_stops(void **state) {
    (void)state;
    expect_divergence("mpirun -np 2 ./zero2 --model tiny --steps 20 --lr 1e6 --quiet", "the loss is");
    expect_divergence("mpirun -np 2 ./zero3 --model small --steps 20 --lr 1e6 --quiet", "more than ln V = 5.55");
    expect_divergence("mpirun -np 2 ./cpu_offload --model tiny --steps 20 --lr 1e6 --dpu --dpu-warmup 2 --quiet",
                      "step ");
    expect_divergence("./dp_baseline --model tiny --steps 20 --lr 1e6 --quiet", "step ");
}

static int folder_is_empty_or_absent(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 1;
    int n = 0;  // the run's lock on the folder is no part of a checkpoint
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.' && strcmp(e->d_name, "lock") != 0;
    closedir(d);
    return n == 0;
}

// Issue 15, item 2: one step at --lr 1e30 printed "val loss -nan", exited 0
// and saved the model. The last update is judged before anything is saved,
// also where it runs a step late (cpu_offload --dpu from step 1).
static void test_last_update_checked_before_save(void **state) {
    (void)state;
    char root[64], cmd[512], ck[128];
    assert_int_equal(test_make_dir(root, sizeof root, "divergence"), 0);
    const char *runs[] = {"mpirun -np 2 ./zero2 --model tiny --steps 1 --lr 1e30",
                          "mpirun -np 2 ./cpu_offload --model tiny --steps 1 --lr 1e30 --dpu --dpu-warmup 0",
                          "./zero1 --model tiny --steps 1 --lr 1e30"};
    for (int i = 0; i < 3; i++) {
        snprintf(ck, sizeof ck, "%s/ck%d", root, i);
        snprintf(cmd, sizeof cmd, "%s --quiet --save %s", runs[i], ck);
        expect_divergence(cmd, "the validation loss is");
        if (!folder_is_empty_or_absent(ck)) fail_msg("%s: a checkpoint was written in %s", cmd, ck);
    }
    assert_int_equal(test_remove_dir(root), 0);
}

// ---- the states checked where a checkpoint is about to be written ----

static const Strategy named = {.name = "zero2"};

static Trainer *trainer_on_one_rank(void) {
    Trainer *t = calloc(1, sizeof *t);
    int local_rank, local_size, argc = 1;
    char *args[] = {"test_divergence", NULL}, **argv = args;
    comm_world_init(&t->world, &argc, &argv, &local_rank, &local_size, 0);
    t->strategy = &named;
    t->step = 7;
    return t;
}

static void check_states_with(float bad) {
    Trainer *t = trainer_on_one_rank();
    float master[8] = {0}, v[8] = {0};
    v[5] = bad;
    CkptTensor st[2] = {{.name = "master", .host = master, .bytes = sizeof master},
                        {.name = "adam_v", .host = v, .bytes = sizeof v}};
    divergence_check_states(t, st, 2);
    comm_world_finalize(&t->world);
    exit(0);  // finite: the check returned
}
static void states_with_inf(void) { check_states_with(INFINITY); }
static void states_finite(void) { check_states_with(1e30f); }

static void test_non_finite_states_refused(void **state) {
    (void)state;
    char *err = NULL;
    int rc = run_child(states_with_inf, &err);
    if (rc != 1 || !strstr(err, "zero2: error: after step 7: rank 0's adam_v holds inf at element 5"))
        fail_msg("exit %d:\n%s", rc, err);
    free(err);
    rc = run_child(states_finite, &err);
    if (rc != 0 || strstr(err, "error")) fail_msg("finite states: exit %d:\n%s", rc, err);
    free(err);
}

static int group_setup(void **state) {
    (void)state;
    return need_paths("test_divergence", (const char *const[]){"./zero2", "./cpu_offload", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exploding_loss_stops),
        cmocka_unit_test(test_last_update_checked_before_save),
        cmocka_unit_test(test_non_finite_states_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
