// test_bad_input.c: the trainers and memory_math given hostile input, run as
// programs from the repository root. Every case must end with exit status 2
// and one line that names what was wrong (issue 15's list, and more).
#include "runs.h"

typedef struct Case {
    const char *cmd, *names;  // the command, and what its one line must contain
} Case;

static void refuse_all(const Case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) free(expect_refusal(cases[i].cmd, cases[i].names));
}

// Numbers: finite and within the flag's range, else the flag and its range.
static void test_numbers_out_of_range(void **state) {
    (void)state;
    const Case cases[] = {
        {"./zero2 --model tiny --steps 1 --lr inf", "--lr inf is not a finite number: give 0 < X"},
        {"./zero2 --model tiny --steps 1 --lr 0", "--lr 0 is out of range"},
        {"./zero2 --model tiny --steps 1 --hbm-gb nan", "--hbm-gb nan is not a finite number"},
        {"./zero2 --model tiny --steps 1 --hbm-gb inf", "--hbm-gb inf"},
        {"./zero2 --model tiny --steps 1 --hbm-gb 1e300", "--hbm-gb 1e300 is out of range: give 0 <= GB <="},
        {"./zero2 --model tiny --steps 1 --bucket-mb inf", "--bucket-mb inf"},
        {"./zero2 --model tiny --steps 1 --bucket-mb 1e14", "--bucket-mb 1e14 is out of range"},
        {"./zero2 --model tiny --steps 1 --global-batch -4", "--global-batch -4 is out of range: give G >= 1"},
        {"./zero2 --model tiny --steps 1 --layers 0", "--layers 0"},
        {"./zero2 --model tiny --steps 1 --heads 0", "--heads 0"},
        {"./zero2 --model tiny --steps 1 --vocab 0", "--vocab 0"},
        {"./zero2 --model tiny --steps 1 --vocab 2147483600", "--vocab 2147483600 is out of range"},
        {"./zero2 --model tiny --steps 1 --d-model 0", "--d-model 0"},
        {"./zero2 --model tiny --steps 1 --grad-clip nan", "--grad-clip nan"},
        {"./zero2 --model tiny --steps 1 --grad-clip -1", "--grad-clip -1 is out of range: give X >= 0"},
        {"./zero2 --model tiny --steps 1 --weight-decay -5", "--weight-decay -5 is out of range"},
        {"./zero2 --model tiny --steps 1 --batch 1500000000 --global-batch 3", "--batch 1500000000 is out of range"},
        {"./zero3 --model tiny --steps 1 --prefetch -1", "--prefetch -1 is out of range"},
        {"./zero2 --model tiny --steps 1 --grad-accum 2 --eval-batches 1048576",
         "--eval-batches 1048576 x 2 micro-batches = 2097152 held-out micro-batches per validation; at most 1048576"},
        {"./cpu_offload --model tiny --steps 1 --dpu --dpu-warmup -1", "--dpu-warmup -1 is out of range"},
        {"./cpu_offload --model tiny --steps 1 --host-threads 0", "--host-threads 0 is out of range: give 1 <= N <= 1024"},
        {"./memory_math --params nan", "--params nan is not a finite number"},
        {"./memory_math --params 1e3 --hbm-gb inf", "--hbm-gb inf"},
        {"./memory_math --params 1e16", "--params 1e16 is out of range"},
        {"mpirun -np 2 ./zero2 --model tiny --steps 1 --lr nan", "--lr nan"},
    };
    refuse_all(cases, sizeof cases / sizeof cases[0]);
}

static void test_empty_strings(void **state) {
    (void)state;
    const Case cases[] = {
        {"./zero2 --model tiny --steps 1 --data ''", "--data was given an empty PATH"},
        {"./zero2 --model '' --steps 1", "--model"},
        {"./zero2 --model tiny --steps 1 --json=", "--json"},
    };
    refuse_all(cases, sizeof cases / sizeof cases[0]);
}

// Activation settings that cannot work together: one line that says what to change.
static void test_activation_combinations(void **state) {
    (void)state;
    const Case cases[] = {
        {"./zero2 --model tiny --steps 1 --recompute some", "--recompute some: choose none"},
        {"./zero2 --model tiny --steps 1 --offload-activations", "add --recompute full"},
        {"./zero3 --model tiny --steps 1 --offload-activations --recompute selective", "(here --recompute selective)"},
        {"./memory_math --model tiny --recompute partial", "--recompute partial: choose none"},
        {"mpirun -np 2 ./3d_parallel --model tiny --tp 2 --steps 1 --partition-activations", "add --recompute full"},
        {"./3d_parallel --model tiny --steps 1 --recompute full --partition-activations", "give --tp 2 or more"},
        {"./3d_parallel --model tiny --steps 1 --sequence-parallel", "--sequence-parallel splits"},
        {"mpirun -np 2 ./3d_parallel --model tiny --tp 2 --steps 1 --sequence-parallel --recompute full "
         "--partition-activations", "leave out --partition-activations"},
        {"mpirun -np 2 ./3d_parallel --model tiny --tp 2 --batch 1 --seq-len 7 --steps 1 --sequence-parallel",
         "7 tokens do not split over --tp 2"},
    };
    refuse_all(cases, sizeof cases / sizeof cases[0]);
}

// --help shows every numeric flag's range beside its default.
static void test_help_shows_ranges(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(test_run("./zero2 --help", &out), 0);
    const char *want[] = {"(default 4; 1 <= B <= 1048576)", "(default 0.001; 0 < X <=", "(default 1; X >= 0)",
                          "0 <= MB <= 1000000"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("--help lacks '%s':\n%s", want[i], out);
    free(out);
}

// ---- large values: printed and recorded without overflow ----

// memory_math's grouped figures past 2^53 keep 15 significant digits and no
// fraction; before, 8.75e19 printed as "87,500,875,000,000,004,096.-458752".
static void test_memory_math_large_figures(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("./memory_math --params 1e15 --grad-accum 100000", &out);
    assert_int_equal(rc, 0);
    if (strstr(out, ".-") || !strstr(out, "87,500,875,000,000,000,000"))
        fail_msg("expected 87,500,875,000,000,000,000 elements for cpu_offload and no '.-':\n%s", out);
    free(out);
}

// Resident peak (KB) and exit status of a trainer command that must be refused; its error line into *out.
static double refused_peak_kb(const char *cmd, char **out) {
    char py[1024];
    snprintf(py, sizeof py, "python3 -c \"import resource, subprocess, sys; "
             "r = subprocess.run(sys.argv[1], shell=True, capture_output=True, text=True); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stderr.strip())\" '%s'",
             cmd);
    assert_int_equal(test_run(py, out), 0);
    int rc = -1;
    double kb = 0;
    if (sscanf(*out, "%d %lf", &rc, &kb) != 2 || rc != 2) fail_msg("%s: expected exit 2; got:\n%s", cmd, *out);
    return kb;
}

// Issue 49, item 22: a 1 GB --data of NUL bytes was read whole (2 bytes a
// token: 2 GB of memory) before the NUL check refused it. The check now
// meets the first block that holds a NUL: a 512 MB file (sparse: all NULs)
// is refused at byte 0 within 64 MB of a refusal that reads nothing (the
// whole file as tokens is 1 GB).
static void test_nul_data_refused_before_read(void **state) {
    (void)state;
    char root[64], cmd[512], *out = NULL;
    assert_int_equal(test_make_dir(root, sizeof root, "nul-data"), 0);
    snprintf(cmd, sizeof cmd, "truncate -s 512M %s/nul.txt", root);
    assert_int_equal(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --data %s/none.txt", root);
    double base_kb = refused_peak_kb(cmd, &out);
    free(out);
    snprintf(cmd, sizeof cmd, "./zero2 --model tiny --steps 1 --data %s/nul.txt", root);
    double kb = refused_peak_kb(cmd, &out);
    if (kb > base_kb + 64 * 1024 || !strstr(out, "a NUL byte at byte 0: not a text file"))
        fail_msg("expected a NUL at byte 0 within 64 MB of %.0f KB resident; got %.0f KB:\n%s", base_kb, kb, out);
    free(out);
    assert_int_equal(test_remove_dir(root), 0);
}

static int group_setup(void **state) {
    (void)state;
    return need_paths("test_bad_input", (const char *const[]){"./zero2", "./memory_math", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers_out_of_range),
        cmocka_unit_test(test_empty_strings),
        cmocka_unit_test(test_activation_combinations),
        cmocka_unit_test(test_help_shows_ranges),
        cmocka_unit_test(test_memory_math_large_figures),
        cmocka_unit_test(test_nul_data_refused_before_read),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
