// test_cuda_stages.c: whole trainers on the cuda device at 2 ranks (NCCL
// between them): every stage's losses within the bf16 tolerance of the cpu
// device (each per-step loss within 0.05 of the cpu run, as test_cuda_model
// states it), and stage against stage to the bit, as on the cpu: the math
// of dp_baseline, zero1-3, cpu_offload and infinity is the same. Tensor
// parallelism (3d_parallel --tp 2) within the same tolerance of its cpu run.
// Where no cuda device can run (no GPU and not the emulator's build) every
// test is skipped; the emulator's build runs them on the CPU (make test).
#include <sys/stat.h>
#include <unistd.h>
#include "device.h"
#include "runs.h"

#define STEPS 4
#define TOL_LOSS 0.05

typedef struct Ctx {
    char root[64];
} Ctx;

static int setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", "./zero1", "./zero2", "./zero3", "./cpu_offload",
                                        "./infinity", "./3d_parallel", NULL};
    return run_dir_setup(state, "cuda_stages", needs);
}

static int skip_without_cuda(void) {
    if (device_cuda_available()) return 0;
    print_message("no cuda device (no GPU visible, and this is not the emulator's build): skipped\n");
    return 1;
}

// losses of `cmd` (STEPS of them) at `ranks` ranks on `device`
static void losses(const RunDir *c, const char *name, const char *device, const char *args, double *out) {
    char json[128], cmd[1024];
    snprintf(json, sizeof json, "%s/%s-%s.json", c->root, name, device);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 %s --device %s --model small --steps %d --quiet --json %s", args, device,
             STEPS, json);
    char *rec = train(cmd, json);
    losses_of(rec, out, STEPS);
    free(rec);
}

static void test_stages_match_cpu_and_each_other(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    char nvme[128], args[256];
    snprintf(nvme, sizeof nvme, "%s/nvme", c->root);
    assert_int_equal(mkdir(nvme, 0755), 0);
    double cpu[STEPS], base[STEPS];
    losses(c, "dp_baseline", "cpu", "./dp_baseline", cpu);
    losses(c, "dp_baseline", "cuda", "./dp_baseline", base);
    for (int i = 0; i < STEPS; i++) {
        print_message("step %d: cpu %.6f cuda %.6f\n", i + 1, cpu[i], base[i]);
        assert_true(fabs(base[i] - cpu[i]) <= TOL_LOSS);
    }
    const char *stages[] = {"zero1", "zero2", "zero3", "cpu_offload", "infinity"};
    for (size_t s = 0; s < sizeof stages / sizeof *stages; s++) {
        double l[STEPS];
        snprintf(args, sizeof args, "./%s%s%s", stages[s], strcmp(stages[s], "infinity") ? "" : " --nvme-path ",
                 strcmp(stages[s], "infinity") ? "" : nvme);
        losses(c, stages[s], "cuda", args, l);
        for (int i = 0; i < STEPS; i++)
            if (l[i] != base[i])
                fail_msg("%s on cuda, step %d: loss %.9g where dp_baseline has %.9g (same math: must be equal)",
                         stages[s], i + 1, l[i], base[i]);
        print_message("%s: the %d losses of dp_baseline, to the bit\n", stages[s], STEPS);
    }
}

static void test_tensor_parallel_matches_cpu(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    double cpu[STEPS], gpu[STEPS];
    losses(c, "3d_tp2", "cpu", "./3d_parallel --tp 2", cpu);
    losses(c, "3d_tp2", "cuda", "./3d_parallel --tp 2", gpu);
    for (int i = 0; i < STEPS; i++) {
        print_message("step %d: cpu %.6f cuda %.6f\n", i + 1, cpu[i], gpu[i]);
        assert_true(fabs(gpu[i] - cpu[i]) <= TOL_LOSS);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_match_cpu_and_each_other),
        cmocka_unit_test(test_tensor_parallel_matches_cpu),
    };
    return cmocka_run_group_tests(tests, setup, run_dir_teardown);
}
