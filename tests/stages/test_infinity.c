// test_infinity.c: stage 06, infinity, run as a program under mpirun, its
// swap files in a folder on a disk ($WB_AIO_TEST_DIR, else /var/tmp: O_DIRECT
// needs one). With every --offload-params it does zero3's math: the same
// per-step losses and final master weights as zero3 at 2 and 4 ranks, with
// several sub-group sizes and with gradient accumulation. Save and resume
// reproduce the uninterrupted run with the swap files deleted in between.
// Per-rank bytes by tier and the bytes to and from NVMe and between tiers per
// step equal the formulas; the file I/O is on its own row of the trace; the
// files go at the end. With --offload-optimizer cpu (master, m and v in
// pinned host memory) the same, at every --offload-params, with --nvme-path
// only where the params go to NVMe; with nothing on NVMe it is refused in one
// line, and a DeepSpeed config's nvme_path is ignored. Bad input exits 2 with
// one line, before any file is made; a write that fails mid-run (the
// file-size limit of the running ranks lowered from outside) stops the run
// with the reason and leaves the last checkpoint intact.
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 4096
#define SMALL_C 128  // channels of --model small: the head's layernorm holds 2C params

static const char *const MODES[3] = {"none", "cpu", "nvme"};

typedef struct Ctx {
    char root[64];         // records and checkpoints
    char nvme[PATH_LEN];   // the swap files' folder, on a disk
} Ctx;

static char *run(Ctx *c, const char *tag, const char *cmd_fmt, const char *flags) {
    char cmd[CMD_LEN], path[PATH_LEN];
    snprintf(path, sizeof path, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, cmd_fmt, flags, path);
    return train(cmd, path);
}

static void same_losses(const char *what, const char *a, const char *b, int steps, int from) {
    double la[RUN_MAX_STEPS] = {0}, lb[RUN_MAX_STEPS] = {0};
    losses_of(a, la, steps);
    losses_of(b, lb, steps - from);
    for (int i = from; i < steps; i++)  // exact: both printed with %.9g
        if (la[i] != lb[i - from]) fail_msg("%s: step %d loss %.9g vs %.9g", what, i + 1, la[i], lb[i - from]);
}

static void same_master(const char *what, const char *dir_a, const char *dir_b, int ranks) {
    size_t na, nb;
    float *a = ckpt_master(dir_a, ranks, &na), *b = ckpt_master(dir_b, ranks, &nb);
    assert_int_equal(na, nb);
    if (memcmp(a, b, na * sizeof(float))) fail_msg("%s: final master weights differ", what);
    free(a);
    free(b);
}

static char *whole_file(const char *path) {
    char *s = read_file(path, NULL);
    if (!s) fail_msg("cannot open %s", path);
    return s;
}

// ---- 1. zero3's math, to the bit ----

// Each call's runs save into folders of their own (a run saves only into a
// folder of the same run's checkpoints): the call's number names them.
static void compare_with_zero3(Ctx *c, int ranks, const char *model, const char *const infinity_flags[3]) {
    static int call;
    call++;
    char fmt[CMD_LEN], flags[CMD_LEN], tag[64], ck[3 + 1][PATH_LEN], dir[2][PATH_LEN + 32];
    snprintf(fmt, sizeof fmt, "mpirun -np %d ./zero3 %s %%s --quiet --json %%s", ranks, model);
    snprintf(ck[3], PATH_LEN, "%s/z3-%d-%d", c->root, ranks, call);
    snprintf(flags, sizeof flags, "--save %s", ck[3]);
    snprintf(tag, sizeof tag, "z3-%d", ranks);
    char *ref = run(c, tag, fmt, flags);
    snprintf(fmt, sizeof fmt, "mpirun -np %d ./infinity %s %%s --quiet --json %%s", ranks, model);
    for (int m = 0; m < 3; m++) {
        if (!infinity_flags[m]) continue;
        snprintf(ck[m], PATH_LEN, "%s/inf-%d-%d-%d", c->root, ranks, m, call);
        snprintf(flags, sizeof flags, "--offload-params %s %s --nvme-path %s --save %s", MODES[m],
                 infinity_flags[m], c->nvme, ck[m]);
        snprintf(tag, sizeof tag, "inf-%d-%d", ranks, m);
        char *json = run(c, tag, fmt, flags);
        char what[256];
        snprintf(what, sizeof what, "infinity --offload-params %s %s vs zero3, N=%d, %s", MODES[m],
                 infinity_flags[m], ranks, model);
        int steps = (int)number_of(json, "steps");
        same_losses(what, json, ref, steps, 0);
        snprintf(dir[0], sizeof dir[0], "%s/step-%08d", ck[m], steps);
        snprintf(dir[1], sizeof dir[1], "%s/step-%08d", ck[3], steps);
        same_master(what, dir[0], dir[1], ranks);
        free(json);
    }
    free(ref);
}

static void test_equals_zero3(void **state) {
    Ctx *c = *state;
    // sub-groups: many and a short last one, the default (one here), a few
    const char *const groups[3] = {"--sub-group-mb 0.3", "", "--sub-group-mb 1"};
    // N=2 and N=4: bit-equal (tolerance 0, measured so at both): the
    // collectives are zero3's own calls in zero3's order, the gradient shard
    // adds in bf16 on the host as zero3 does on the device, and the CPU Adam
    // gives adamw_element's bits, sub-group by sub-group as on the whole shard
    compare_with_zero3(c, 2, "--model small --batch 4 --steps 8", groups);
    compare_with_zero3(c, 4, "--model small --batch 2 --steps 8", groups);
    // gradient accumulation: later micro-batches add into the pinned shard
    const char *const accum[3] = {NULL, NULL, "--sub-group-mb 0.5"};
    compare_with_zero3(c, 2, "--model small --batch 2 --grad-accum 2 --steps 6", accum);
}

// ---- 2. save and resume, without the swap files ----

static void test_resume_without_swap_files(void **state) {
    Ctx *c = *state;
    for (int m = 0; m < 3; m += 2) {  // params on the device, and on NVMe
        char fmt[CMD_LEN], flags[CMD_LEN], tag[64], ck[PATH_LEN];
        snprintf(fmt, sizeof fmt, "mpirun -np 2 ./infinity --model small --batch 2 --steps 12 "
                 "--offload-params %s --sub-group-mb 0.3 %%s --quiet --json %%s", MODES[m]);
        snprintf(ck, sizeof ck, "%s/resume-%d", c->root, m);
        snprintf(flags, sizeof flags, "--nvme-path %s --save %s --save-every 6", c->nvme, ck);
        snprintf(tag, sizeof tag, "whole-%d", m);
        char *whole = run(c, tag, fmt, flags);
        // the swap files of the first run are gone (it removed them; make sure
        // nothing is left), and the resumed run makes its own somewhere else
        char other[PATH_LEN + 16], cmd[CMD_LEN];
        snprintf(other, sizeof other, "%s/elsewhere", c->nvme);
        snprintf(cmd, sizeof cmd, "rm -rf %s/rank-* && mkdir -p %s", c->nvme, other);
        assert_int_equal(test_run(cmd, NULL), 0);
        snprintf(flags, sizeof flags, "--nvme-path %s --resume %s/step-00000006", other, ck);
        snprintf(tag, sizeof tag, "resumed-%d", m);
        char *resumed = run(c, tag, fmt, flags);
        assert_int_equal((int)number_of(resumed, "first_step"), 6);
        char what[64];
        snprintf(what, sizeof what, "resumed --offload-params %s", MODES[m]);
        same_losses(what, whole, resumed, 12, 6);
        snprintf(cmd, sizeof cmd, "rm -rf %s", other);
        assert_int_equal(test_run(cmd, NULL), 0);
        free(whole);
        free(resumed);
    }
}

// ---- 3. bytes: by tier, to and from NVMe, between tiers ----

static double nested(const char *json, const char *within, const char *key) {
    const char *p = strstr(json, within);
    if (!p) fail_msg("no %s in the record:\n%.300s", within, json);
    return number_of(p, key);
}

static void check_tier(const char *what, const char *json, const char *tier) {
    static const char *const cats[5] = {"params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v"};
    const char *m = strstr(json, "\"mem\":{"), *f = strstr(json, "\"mem_formula\":{");
    char t[32];
    snprintf(t, sizeof t, "\"%s\":{", tier);
    m = strstr(m, t);
    f = strstr(f, t);
    for (int k = 0; k < 5; k++) {
        char cat[32];
        snprintf(cat, sizeof cat, "\"%s\":", cats[k]);
        double got = nested(m, cat, "current"), want = strtod(strstr(f, cat) + strlen(cat), NULL);
        if (got != want) fail_msg("%s %s %s: measured %.0f, formula %.0f", what, tier, cats[k], got, want);
    }
}

static void check_transfer(const char *what, const char *json, const char *key, double below) {
    const char *x = strstr(json, "\"transfer_bytes_per_step\":{");
    char k[32];
    snprintf(k, sizeof k, "\"%s\":{", key);
    double got = nested(x, k, "counted"), want = nested(x, k, "formula");
    // the record prints whole bytes: within 1 of the formula less `below`
    if (!(want > 0) || fabs(got - (want - below)) > 1)
        fail_msg("%s %s: counted %.0f, formula %.0f less %.1f", what, key, got, want, below);
}

static void test_bytes_equal_formulas(void **state) {
    Ctx *c = *state;
    const int N = 3, k = 2;  // Ψ = 834304 pads to 834432 at N = 3: the last shard holds padding
    for (int m = 0; m < 3; m++) {
        char fmt[CMD_LEN], flags[CMD_LEN], tag[32];
        snprintf(fmt, sizeof fmt, "mpirun -np %d ./infinity --model small --batch 2 --grad-accum %d --steps 4 "
                 "--sub-group-mb 0.5 %%s --quiet --json %%s", N, k);
        snprintf(flags, sizeof flags, "--offload-params %s --nvme-path %s", MODES[m], c->nvme);
        snprintf(tag, sizeof tag, "bytes-%d", m);
        char *json = run(c, tag, fmt, flags);
        const char *what = MODES[m];
        check_tier(what, json, "device");
        check_tier(what, json, "pinned");
        check_tier(what, json, "nvme");
        // Off the device, a unit's slice goes up once per gather: zero3
        // gathers the head (its layernorm, 2C params) once for the end of
        // forward and the start of backward, where the formula counts two
        // fetches: 2 B x 2C / N fewer per micro-batch, mean over ranks.
        double head = m == 0 ? 0 : 2.0 * 2 * SMALL_C * k / N;
        check_transfer(what, json, "d2h", 0);
        check_transfer(what, json, "h2d", head);
        check_transfer(what, json, "nvme_read", m == 2 ? head : 0);
        check_transfer(what, json, "nvme_write", 0);
        free(json);
    }
}

// ---- 3b. the optimizer on the host ----

// A transfer the formula says is 0 (no state on NVMe): counted 0 too.
static void check_no_transfer(const char *what, const char *json, const char *key) {
    const char *x = strstr(json, "\"transfer_bytes_per_step\":{");
    char k[32];
    snprintf(k, sizeof k, "\"%s\":{", key);
    if (!strstr(x, k)) return;  // the record leaves out what neither counted nor formula has
    double got = nested(x, k, "counted"), want = nested(x, k, "formula");
    if (got != 0 || want != 0) fail_msg("%s %s: counted %.0f, formula %.0f, expected none", what, key, got, want);
}

// Issue 35: --offload-optimizer cpu keeps master, m and v in pinned host
// memory. At every --offload-params: zero3's losses and final master weights
// to the bit (sub-groups of 0.3 MB: several per shard), the bytes by tier
// and between tiers as the formulas say, no file I/O, and --nvme-path only
// with the params on NVMe (with nothing there the run needs no disk at all).
static void test_optimizer_on_host(void **state) {
    Ctx *c = *state;
    char fmt[CMD_LEN], flags[CMD_LEN], ck[2][PATH_LEN], dir[2][PATH_LEN + 32];
    snprintf(ck[0], PATH_LEN, "%s/z3-host", c->root);
    snprintf(flags, sizeof flags, "--save %s", ck[0]);
    const char *model = "--model small --batch 2 --grad-accum 2 --steps 6";
    snprintf(fmt, sizeof fmt, "mpirun -np 2 ./zero3 %s %%s --quiet --json %%s", model);
    char *ref = run(c, "z3-host", fmt, flags);
    snprintf(fmt, sizeof fmt, "mpirun -np 2 ./infinity %s --offload-optimizer cpu --sub-group-mb 0.3 %%s --quiet "
             "--json %%s", model);
    for (int m = 0; m < 3; m++) {
        snprintf(ck[1], PATH_LEN, "%s/host-%d", c->root, m);
        snprintf(flags, sizeof flags, "--offload-params %s --save %s%s%s", MODES[m], ck[1],
                 m == 2 ? " --nvme-path " : "", m == 2 ? c->nvme : "");
        char tag[32], what[96];
        snprintf(tag, sizeof tag, "host-%d", m);
        snprintf(what, sizeof what, "infinity --offload-params %s --offload-optimizer cpu", MODES[m]);
        char *json = run(c, tag, fmt, flags);
        same_losses(what, json, ref, 6, 0);
        snprintf(dir[0], sizeof dir[0], "%s/step-00000006", ck[1]);
        snprintf(dir[1], sizeof dir[1], "%s/step-00000006", ck[0]);
        same_master(what, dir[0], dir[1], 2);
        check_tier(what, json, "device");
        check_tier(what, json, "pinned");
        check_tier(what, json, "nvme");
        double head = m == 0 ? 0 : 2.0 * 2 * SMALL_C * 2 / 2;  // the head gathered once for both passes (k = 2, N = 2)
        check_transfer(what, json, "d2h", 0);
        check_transfer(what, json, "h2d", head);
        if (m == 2) {  // the params alone: read for every gather, written once a step
            check_transfer(what, json, "nvme_read", head);
            check_transfer(what, json, "nvme_write", 0);
        } else {
            check_no_transfer(what, json, "nvme_read");
            check_no_transfer(what, json, "nvme_write");
            if (number_of(strstr(json, "\"times_ms_per_step\":{"), "io") != 0) fail_msg("%s: file I/O", what);
        }
        // the two step times of the block swap, from the record's own spans (4 decimals each)
        const char *tm = strstr(json, "\"times_ms_per_step\":{");
        double compute = number_of(tm, "compute"), copy = number_of(tm, "copy");
        double sum = number_of(tm, "compute_plus_transfer"), most = number_of(tm, "max_compute_transfer");
        if (!(copy > 0) || fabs(sum - (compute + copy)) > 2e-4 || fabs(most - fmax(compute, copy)) > 1e-4)
            fail_msg("%s: compute %.4f, copies %.4f: compute + transfer %.4f, max %.4f", what, compute, copy, sum,
                     most);
        free(json);
    }
    free(ref);
    snprintf(fmt, sizeof fmt, "test -z \"$(ls -A %s)\"", c->nvme);
    if (test_run(fmt, NULL) != 0) fail_msg("files left in %s", c->nvme);
}

// A DeepSpeed config with both devices "cpu" and an nvme_path beside them
// (as DeepSpeed's own examples have): infinity with every state on the host,
// the keys mapped onto --offload-params and --offload-optimizer, the
// nvme_path keys ignored, saying why, and no disk touched.
static void test_config_keeps_everything_on_host(void **state) {
    Ctx *c = *state;
    char path[PATH_LEN], cmd[CMD_LEN];
    snprintf(path, sizeof path, "%s/host.json", c->root);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", \"nvme_path\": "
               "\"%s/absent\"}, \"offload_param\": {\"device\": \"cpu\"}}}\n", c->root);
    fclose(f);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --model tiny --steps 2 --deepspeed-config %s --quiet", path);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    const char *want[] = {"host: nothing on NVMe; bf16 params in pinned host memory; master, m, v in pinned host "
                          "memory",
                          "zero_optimization.offload_optimizer.nvme_path (nothing goes to NVMe with --offload-params "
                          "cpu --offload-optimizer cpu)"};
    for (int i = 0; i < 2; i++)
        if (rc != 0 || !strstr(out, want[i])) fail_msg("%s: exit %d, no '%s':\n%s", cmd, rc, want[i], out);
    free(out);
}

// ---- 4. the I/O on its own row; the files go at the end ----

// 4 steps of small at 2 ranks with the params on NVMe and `extra` flags,
// traced into trace_path (the tag's .json beside the record); the record.
static char *traced_run(Ctx *c, const char *tag, const char *extra, char trace_path[PATH_LEN]) {
    char fmt[CMD_LEN], flags[CMD_LEN];
    snprintf(trace_path, PATH_LEN, "%s/%s-trace.json", c->root, tag);
    snprintf(fmt, sizeof fmt, "mpirun -np 2 ./infinity --model small --batch 2 --steps 4 --offload-params nvme "
             "%%s --quiet --json %%s");
    snprintf(flags, sizeof flags, "--nvme-path %s %s --trace %s", c->nvme, extra, trace_path);
    return run(c, tag, fmt, flags);
}

// Rank 0's spans named `name` on the trace's row `tid`: start and end (us).
static int spans_of(const char *trace, const char *name, int tid, double *start, double *end, int max) {
    char key[128];
    snprintf(key, sizeof key, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,", name, tid);
    int n = 0;
    for (const char *p = strstr(trace, key); p && n < max; p = strstr(p + 1, key)) {
        double ts, dur;
        if (sscanf(p + strlen(key), "\"ts\":%lf,\"dur\":%lf", &ts, &dur) != 2) fail_msg("unreadable span: %.200s", p);
        start[n] = ts;
        end[n++] = ts + dur;
    }
    return n;
}

// A step's first units wait for the last update's write of their params;
// once it is out, their reads go to the disk together. With one sub-group
// (small at the default --sub-group-mb) one write holds every unit's params,
// so in every step after the first the step's first params read has another
// one beside it (they were one after the other before). And the update's
// master, m and v writes wait until those reads are in: none starts between
// the update's CPU Adam and the end of the next step's first params read
// (they went out right behind the params write before, and the disk shared
// itself between them and the reads the forward was waiting for).
static void test_step_start_reads_params_first(void **state) {
    Ctx *c = *state;
    char trace_path[PATH_LEN];
    free(traced_run(c, "start", "", trace_path));
    char *trace = whole_file(trace_path);
    enum { MAX_SPANS = 4096 };
    static double s0[MAX_SPANS], s1[MAX_SPANS], r0[MAX_SPANS], r1[MAX_SPANS], a0[MAX_SPANS], a1[MAX_SPANS],
        w0[MAX_SPANS], w1[MAX_SPANS];
    int steps = spans_of(trace, "step", 4, s0, s1, MAX_SPANS);
    int reads = spans_of(trace, "nvme read params", 3, r0, r1, MAX_SPANS);
    int adams = spans_of(trace, "cpu adam", 5, a0, a1, MAX_SPANS);
    int writes = spans_of(trace, "nvme write", 3, w0, w1, MAX_SPANS);  // master, m, v (params: "nvme write params")
    if (steps < 2 || reads < 2 || adams < 1 || writes < 3)
        fail_msg("%d steps, %d params reads, %d cpu adam and %d state writes in rank 0's trace", steps, reads, adams,
                 writes);
    for (int k = 1; k < steps; k++) {
        int first = -1;
        for (int i = 0; i < reads; i++)
            if (r0[i] >= s0[k] && r0[i] < s1[k] && (first < 0 || r0[i] < r0[first])) first = i;
        if (first < 0) fail_msg("step %d reads no params", k + 1);
        int beside = 0;
        for (int i = 0; i < reads; i++) beside |= i != first && r0[i] >= r0[first] && r0[i] < r1[first];
        if (!beside)
            fail_msg("step %d: its first params read [%.0f, %.0f] us ran alone; the reads ahead waited for it", k + 1,
                     r0[first] - s0[k], r1[first] - s0[k]);
        double adam = -1;  // the update at the end of step k (1-based)
        for (int i = 0; i < adams; i++)
            if (a0[i] >= s0[k - 1] && a0[i] < s1[k - 1] && a0[i] > adam) adam = a0[i];
        if (adam < 0) fail_msg("no cpu adam in step %d", k);
        for (int i = 0; i < writes; i++)
            if (w0[i] >= adam && w0[i] < r1[first])
                fail_msg("step %d: a state write of the update began %.0f us before the first params read it "
                         "waited for ended (that read: [%.0f, %.0f] us into the step)", k + 1, r1[first] - w0[i],
                         r0[first] - s0[k], r1[first] - s0[k]);
    }
    free(trace);
}

static void test_io_row_and_cleanup(void **state) {
    Ctx *c = *state;
    char trace[PATH_LEN];
    char *json = traced_run(c, "trace", "--sub-group-mb 0.5", trace);
    const char *tm = strstr(json, "\"times_ms_per_step\":{");
    double io = number_of(tm, "io"), hidden = number_of(tm, "io_hidden"), step = number_of(tm, "step");
    if (!(io > 0 && hidden >= 0 && hidden <= io + 1e-3 && io <= step + 1e-3))
        fail_msg("file I/O %.3f ms, hidden %.3f ms, step %.3f ms break the bounds", io, hidden, step);
    char *spans = whole_file(trace);
    // tid 3 is the I/O row, tid 5 the host optimizer's (common/runtime/trace.h)
    const char *want[3][2] = {{"\"nvme read\"", "\"tid\":3"}, {"\"nvme write\"", "\"tid\":3"},
                              {"\"cpu adam\"", "\"tid\":5"}};
    for (int i = 0; i < 3; i++) {
        const char *p = strstr(spans, want[i][0]);
        if (!p) fail_msg("no %s span in the trace", want[i][0]);
        const char *end = strchr(p, '}');
        char span[512];
        snprintf(span, sizeof span, "%.*s", (int)(end - p), p);
        if (!strstr(span, want[i][1])) fail_msg("%s is not on row %s: %s", want[i][0], want[i][1], span);
    }
    free(spans);
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", c->nvme);
    if (test_run(cmd, NULL) != 0) fail_msg("%s still holds files after the run", c->nvme);
    free(json);
}

// ---- 5. bad input: one line, exit 2, no file made ----

static void test_refusals(void **state) {
    Ctx *c = *state;
    char file[PATH_LEN + 16], missing[PATH_LEN + 16], cmd[CMD_LEN];
    snprintf(file, sizeof file, "%s/a-file", c->root);
    snprintf(missing, sizeof missing, "%s/missing", c->root);
    FILE *f = fopen(file, "w");
    fclose(f);
    struct {
        const char *flags, *also;
    } cases[] = {
        {"", "--nvme-path"},
        {"--nvme-path MISSING", "does not exist"},
        {"--nvme-path FILE", "not a directory"},
        {"--nvme-path /dev/shm", "tmpfs"},
        {"--nvme-path NVME --offload-params gpu", "--offload-params"},
        {"--nvme-path NVME --sub-group-mb 0", "--sub-group-mb"},
        {"--nvme-path NVME --aio-block-kb 6", "--aio-block-kb"},
        {"--nvme-path NVME --aio-queue-depth 0", "--aio-queue-depth"},
        // 12 C^2 L = 8e11 params: 11 TB of files, more than any test disk
        {"--nvme-path NVME --model tiny --d-model 16384 --heads 16 --layers 250", "free"},
        {"--nvme-path NVME --offload-optimizer gpu", "--offload-optimizer gpu: choose cpu"},
        // nothing on NVMe: the flags that only the files use are refused
        {"--nvme-path NVME --offload-params cpu --offload-optimizer cpu", "--nvme-path: nothing goes to NVMe"},
        {"--offload-optimizer cpu --aio-queue-depth 4", "--aio-queue-depth: nothing goes to NVMe"},
        {"--offload-params cpu", "--nvme-path DIR is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char flags[CMD_LEN];
        const char *p = cases[i].flags;
        flags[0] = 0;
        for (; *p; p++) {  // MISSING, FILE, NVME -> the paths
            const char *sub = strncmp(p, "MISSING", 7) == 0 ? missing : strncmp(p, "FILE", 4) == 0 ? file
                              : strncmp(p, "NVME", 4) == 0 ? c->nvme : NULL;
            if (sub) {
                strcat(flags, sub);
                p += strncmp(p, "MISSING", 7) == 0 ? 6 : 3;
            } else {
                strncat(flags, p, 1);
            }
        }
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --steps 1 %s", flags);
        char *out = expect_refusal(cmd, cases[i].also);
        free(out);
    }
    // the space check came before any rank made a file
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", c->nvme);
    if (test_run(cmd, NULL) != 0) fail_msg("a refused run left files in %s", c->nvme);
}

// ---- 6. a write that fails mid-run ----

// Runs infinity (small, 2 ranks, a checkpoint every 2 steps into ROOT/NAME)
// and, once its first checkpoint is saved, the shell command `act` ($m is
// mpirun's pid); its output goes to ROOT/NAME.out and .err (*err holds that
// path). Returns what the shell printed: "exit N" of the run.
static char *run_then_act(const Ctx *c, const char *name, const char *act, char *err, size_t err_len) {
    char ck[PATH_LEN], log[PATH_LEN], cmd[CMD_LEN];
    snprintf(ck, sizeof ck, "%s/%s", c->root, name);
    snprintf(log, sizeof log, "%s/%s.out", c->root, name);
    snprintf(err, err_len, "%s/%s.err", c->root, name);
    snprintf(cmd, sizeof cmd,
             "mpirun -np 2 ./infinity --model small --batch 2 --steps 300 --save %s --save-every 2 "
             "--nvme-path %s --sub-group-mb 0.5 --quiet < /dev/null > %s 2> %s & m=$!; "
             "for i in $(seq 600); do grep -q 'saved checkpoint' %s && break; sleep 0.1; done; "
             "%s; wait $m; echo \"exit $?\"",
             ck, c->nvme, log, err, log, act);
    char *out = NULL;
    assert_int_equal(test_run(cmd, &out), 0);
    return out;
}

// The ranks' file-size limit is lowered from outside once a checkpoint is
// saved (prlimit on mpirun's children): their next write past 4 KiB fails
// with EFBIG, as a full disk would with ENOSPC.
static void test_write_fails_mid_run(void **state) {
    Ctx *c = *state;
    char err[PATH_LEN], ck[PATH_LEN], cmd[CMD_LEN];
    snprintf(ck, sizeof ck, "%s/failing", c->root);
    char *out = run_then_act(c, "failing", "for p in $(pgrep -P $m -x infinity); do prlimit --pid $p --fsize=4096; done",
                             err, sizeof err);
    char *errors = last_line(err);
    int lines = 0;
    FILE *f = fopen(err, "r");
    for (int ch; (ch = fgetc(f)) != EOF;) lines += ch == '\n';
    fclose(f);
    // the swap files' write fails first, or (when the limit lands just as
    // the update's writes are out) the next checkpoint's: either way one
    // line, and the checkpoint before it stays whole
    int said_kept = errors && (strstr(errors, "last checkpoint") || strstr(errors, "previous checkpoint"));
    if (!strstr(out, "exit 2") || lines != 1 || !errors || !strstr(errors, "error") ||
        !strstr(errors, "file size limit") || !said_kept)
        fail_msg("expected exit 2 and one line naming the failed write; got %s and %d line(s):\n%s", out, lines,
                 errors ? errors : "");
    free(out);
    free(errors);
    // the last checkpoint is whole: it loads (every part's checksum is checked) and trains on
    char latest[PATH_LEN + 16];
    snprintf(latest, sizeof latest, "%s/latest", ck);
    char *name = last_line(latest);
    assert_non_null(name);
    long step = strtol(name + strlen("step-"), NULL, 10);
    free(name);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --model small --batch 2 --steps %ld --resume %s "
             "--nvme-path %s --sub-group-mb 0.5 --quiet %%s--json %%s", step + 1, ck, c->nvme);
    char *json = run(c, "after-failure", cmd, "");
    assert_int_equal((int)number_of(json, "first_step"), step);
    free(json);
}

// ---- 7. only the run's own files ----

// Issue 28, item 2: with N/rank-0/master.bin a link to a user's file, the
// run wrote its fp32 states into that file. A file left in a rank folder is
// removed (the link, not its target) and the swap file created anew.
static void test_swap_files_never_follow_links(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN], *out = NULL;
    snprintf(cmd, sizeof cmd, "mkdir -p %s/rank-0 && echo keep > %s/target && ln -sf %s/target %s/rank-0/master.bin",
             c->nvme, c->root, c->root, c->nvme);
    assert_int_equal(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --model tiny --steps 2 --quiet --nvme-path %s", c->nvme);
    int rc = test_run(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "[ \"$(cat %s/target)\" = keep ] && test -z \"$(ls -A %s)\"", c->root, c->nvme);
    if (test_run(cmd, NULL) != 0) fail_msg("the link's target was written, or files were left in %s", c->nvme);
}

// Issue 28, item 4: a second run on the same --nvme-path finished with
// wrong losses while the first drifted. Each rank folder is locked for the
// run, so the second is refused in one line and leaves nothing behind.
static void test_nvme_path_locked(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "(./infinity --model small --steps 1000000 --quiet --nvme-path %s >/dev/null 2>&1 & "
             "a=$!; for i in $(seq 600); do grep -qs process %s/rank-0/lock && break; sleep 0.1; done; "
             "timeout 120 mpirun -np 2 ./infinity --model tiny --steps 2 --quiet --nvme-path %s; rc=$?; "
             "kill $a; wait $a 2>/dev/null; exit $rc)", c->nvme, c->nvme, c->nvme);
    char *out = expect_refusal(cmd, "is in use by another run (process ");
    free(out);
    // the refused run made rank-1 and took it back; the first run was killed,
    // so its files stay: clear them for the next test
    snprintf(cmd, sizeof cmd, "test ! -e %s/rank-1 && rm -rf %s/rank-0", c->nvme, c->nvme);
    if (test_run(cmd, NULL) != 0) fail_msg("the refused run left %s/rank-1 behind", c->nvme);
}

// Issue 28, items 10 and 11: SIGTERM, SIGINT or a diverged run left 12Ψ/N
// of swap files per rank, and a signal stopped the job without a word. The
// files go on every exit the process controls, and rank 0 says in one line
// the step reached and the checkpoint to resume from. mpirun passes SIGTERM
// and SIGINT on to the ranks as SIGTERM; a terminal's Ctrl-C reaches the
// ranks themselves, as SIGINT.
static void test_stops_remove_swap_files(void **state) {
    Ctx *c = *state;
    char ck[PATH_LEN], log[PATH_LEN], cmd[CMD_LEN];
    const char *senders[2][2] = {{"kill -TERM $m", "stopped by SIGTERM after step "},
                                 {"for p in $(pgrep -P $m -x infinity); do kill -INT $p; done",
                                  "stopped by SIGINT after step "}};
    for (int i = 0; i < 2; i++) {
        snprintf(ck, sizeof ck, "%s/stopped-%d", c->root, i);
        snprintf(log, sizeof log, "%s/stopped-%d.log", c->root, i);
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --model small --steps 1000000 --save %s --save-every 3 "
                 "--nvme-path %s --quiet < /dev/null > %s 2>&1 & m=$!; "
                 "for i in $(seq 600); do grep -q 'saved checkpoint' %s && break; sleep 0.1; done; %s; wait $m",
                 ck, c->nvme, log, log, senders[i][0]);
        int rc = test_run(cmd, NULL);
        char *out = whole_file(log), want[PATH_LEN + 32];
        snprintf(want, sizeof want, "; resume with --resume %s (step ", ck);
        const char *line = strstr(out, senders[i][1]);
        if (rc == 0 || !line || !strstr(line, want) || strstr(line + 1, senders[i][1]))
            fail_msg("%s: exit %d; expected one line '%s...%s':\n%s", cmd, rc, senders[i][1], want, out);
        free(out);
        snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\" && test -z \"$(find %s -name '*.tmp')\" || "
                 "{ find %s; find %s -name '*.tmp'; exit 1; }", c->nvme, ck, c->nvme, ck);
        char *left = NULL;
        if (test_run(cmd, &left) != 0) fail_msg("the stopped run left files in %s or %s:\n%s", c->nvme, ck, left);
        free(left);
    }
    // a diverged run ends through exit_all: the swap files go too
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --model tiny --steps 20 --lr 1e6 --quiet --nvme-path %s",
             c->nvme);
    char *out = NULL;
    if (test_run(cmd, &out) == 0 || !strstr(out, "diverged")) fail_msg("%s: expected divergence:\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", c->nvme);
    if (test_run(cmd, NULL) != 0) fail_msg("the diverged run left files in %s", c->nvme);
}

// Issue 28, item 7: zeros written over master.bin during a run were trained
// on (the loss jumped from 2.98 to 5.53 and training went on). Each
// sub-group's master, m and v carry a checksum from their write-back, checked
// when read: the run stops in one line naming the file and the bytes.
static void test_swap_file_changed_stops_run(void **state) {
    Ctx *c = *state;
    char err[PATH_LEN], act[CMD_LEN], cmd[CMD_LEN];
    snprintf(act, sizeof act, "f=%s/rank-0/master.bin; dd if=/dev/zero of=$f bs=4096 "
             "count=$(($(stat -c %%s $f) / 4096)) conv=notrunc status=none", c->nvme);
    char *out = run_then_act(c, "changed", act, err, sizeof err);
    char *errors = whole_file(err);
    char want[PATH_LEN + 32];
    snprintf(want, sizeof want, "%s/rank-0/master.bin: bytes ", c->nvme);
    if (!strstr(out, "exit 2") || count_lines(errors) != 1 || !strstr(errors, want) ||
        !strstr(errors, "(checksum)"))
        fail_msg("expected exit 2 and one line naming the changed file; got %s\n%s", out, errors);
    free(errors);
    free(out);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", c->nvme);
    if (test_run(cmd, NULL) != 0) fail_msg("the stopped run left files in %s", c->nvme);
}

// ---- set-up ----

static int group_setup(void **state) {
    if (need_paths("test_infinity", (const char *const[]){"./infinity", "./zero3", NULL})) return 1;
    Ctx *c = calloc(1, sizeof *c);
    if (make_disk_dir(c->nvme, sizeof c->nvme, "test-infinity")) return 1;
    if (test_make_dir(c->root, sizeof c->root, "test-infinity")) return 1;
    *state = c;
    return 0;
}

static int group_teardown(void **state) {
    Ctx *c = *state;
    int rc = test_remove_dir(c->root) | test_remove_dir(c->nvme);
    free(c);
    return rc;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_zero3),
        cmocka_unit_test(test_optimizer_on_host),
        cmocka_unit_test(test_config_keeps_everything_on_host),
        cmocka_unit_test(test_resume_without_swap_files),
        cmocka_unit_test(test_bytes_equal_formulas),
        cmocka_unit_test(test_io_row_and_cleanup),
        cmocka_unit_test(test_step_start_reads_params_first),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_write_fails_mid_run),
        cmocka_unit_test(test_swap_files_never_follow_links),
        cmocka_unit_test(test_nvme_path_locked),
        cmocka_unit_test(test_stops_remove_swap_files),
        cmocka_unit_test(test_swap_file_changed_stops_run),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
