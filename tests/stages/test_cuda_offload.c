// test_cuda_offload.c: the offload stages' schedule on the cuda device, read
// from the cuda emulator's op log (EMU_OPLOG: every operation in issue
// order, its stream and its span on the device clock, and the host's waits)
// and its call counts (EMU_STATS), at 2 ranks (issue 35):
// - no copy of a training step crosses PCIe from or to pageable memory:
//   cpu_offload (plain, --grad-clip 0, --dpu) and infinity with every tier
//   on the host or on NVMe;
// - infinity's param slices go up on a stream of their own (not the
//   kernels'), ordered by events only: the host waits as often per step
//   with 6 blocks as with 2, so never between the copies of two units;
// - --prefetch 0 (the synchronous block swap) and --prefetch 1 (the
//   prefetched one) issue the same copies, the prefetched ones earlier among
//   the kernels, and give the same losses;
// - cpu_offload --grad-clip 0: a host function that hands a sub-group to the
//   CPU Adam is issued before backward's last bucket is reduced, and on the
//   device clock the first one runs before that reduction ends;
// - cpu_offload --dpu on cuda keeps its one-step lag: its losses are the cpu
//   device's --dpu losses (within bf16's tolerance), not the plain run's.
// Where no cuda device can run (no GPU and not the emulator's build) every
// test is skipped; on a GPU the op log is not there and those checks skip.
#include <sys/stat.h>
#include "device.h"
#include "runs.h"

#define CMD_LEN 2048
#define MAX_OPS 200000

typedef struct Op {
    int stream;        // -1: a host wait
    double start, end; // device clock, us (0 where it never ran)
    char what[112];
} Op;

static int skip_without_cuda(void) {
    if (device_cuda_available()) return 0;
    print_message("no cuda device (no GPU visible, and this is not the emulator's build): skipped\n");
    return 1;
}

// Runs `cmd` with the op log of every rank at ROOT/TAG-oplog-R; returns the
// number of rank `rank`'s entries read into ops (-1: no log: not the emulator).
static int run_logged(const RunDir *c, const char *tag, const char *cmd, int rank, Op *ops) {
    char full[CMD_LEN], path[256];
    snprintf(full, sizeof full, "EMU_OPLOG=%s/%s-oplog-%%r %s", c->root, tag, cmd);
    char *out = NULL;
    int rc = test_run(full, &out);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", full, rc, out);
    free(out);
    snprintf(path, sizeof path, "%s/%s-oplog-%d", c->root, tag, rank);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (n < MAX_OPS && fgets(line, sizeof line, f)) {
        Op *o = &ops[n];
        char t0[32], t1[32];
        int at = 0;
        line[strcspn(line, "\n")] = 0;
        if (!strcmp(line, "host_wait")) {
            *o = (Op){.stream = -1};
        } else if (sscanf(line, "op %d %31s %31s %n", &o->stream, t0, t1, &at) == 3 && at > 0) {
            o->start = strcmp(t0, "-") ? atof(t0) : 0;
            o->end = strcmp(t1, "-") ? atof(t1) : 0;
            snprintf(o->what, sizeof o->what, "%s", line + at);
        } else {
            fail_msg("%s: unreadable line: %s", path, line);
        }
        n++;
    }
    fclose(f);
    return n;
}

#define TOKEN_COPY_BYTES (4L * 32 * 4)  // a micro-batch's token ids (tiny: B 4, T 32, int32), on the kernels' stream

static int is_kernel(const Op *o) { return o->stream >= 0 && !strncmp(o->what, "kernel ", 7); }
static int is_copy_up(const Op *o) { return o->stream >= 0 && strstr(o->what, "(pinned host -> device)"); }
static long copy_bytes(const Op *o) { return atol(strstr(o->what, " of ") + 4); }

// ---- no pageable memory ----

// A runtime counter of rank 0 per training step: counted over 2 and over 4
// steps, the difference over 2 (a line of EMU_STATS is "NAME... COUNT").
static double stat_per_step(const RunDir *c, const char *args, const char *name) {
    double count[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        char cmd[CMD_LEN], path[256];
        snprintf(path, sizeof path, "%s/stats-%d-0", c->root, k);
        remove(path);
        snprintf(cmd, sizeof cmd, "EMU_STATS=%s/stats-%d-%%r mpirun -np 2 %s --device cuda --model tiny --steps %d "
                 "--eval-batches 1 --quiet", c->root, k, args, k ? 4 : 2);
        char *out = NULL;
        int rc = test_run(cmd, &out);
        if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, out);
        free(out);
        char *stats = read_file(path, NULL);
        if (!stats) return -1;
        for (char *line = strtok(stats, "\n"); line; line = strtok(NULL, "\n")) {
            char *last = strrchr(line, ' ');
            if (last && (size_t)(last - line) == strlen(name) && !strncmp(line, name, strlen(name)))
                count[k] = atof(last + 1);
        }
        free(stats);
    }
    return (count[1] - count[0]) / 2;
}

static void test_no_pageable_copy_in_a_step(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    char nvme[128], args[6][256];
    snprintf(nvme, sizeof nvme, "%s/nvme", c->root);
    mkdir(nvme, 0755);
    snprintf(args[0], sizeof args[0], "./cpu_offload");
    snprintf(args[1], sizeof args[1], "./cpu_offload --grad-clip 0");
    snprintf(args[2], sizeof args[2], "./cpu_offload --dpu --dpu-warmup 1");
    snprintf(args[3], sizeof args[3], "./infinity --offload-params cpu --offload-optimizer cpu");
    snprintf(args[4], sizeof args[4], "./infinity --offload-params nvme --nvme-path %s", nvme);
    snprintf(args[5], sizeof args[5], "./infinity --nvme-path %s", nvme);
    for (int i = 0; i < 6; i++) {
        double per = stat_per_step(c, args[i], "copy_pageable_host");
        if (per < 0) {
            print_message("the runtime calls are counted on the emulator only: skipped\n");
            skip();
        }
        print_message("%s: %g copies from or to pageable memory per step\n", args[i], per);
        if (per != 0) fail_msg("%s: %g copies per step between the device and pageable host memory", args[i], per);
    }
}

// ---- the block swap: copies by events, in two orders ----

// The param copies of a run of infinity with every tier on the host (rank
// 0), and for each the kernels issued before it; fails where a slice goes up
// on the kernels' stream. Returns how many copies.
static int param_copies(const RunDir *c, const char *tag, int prefetch, Op *ops, long *kernels_before,
                        long *bytes, double *losses) {
    char cmd[CMD_LEN], json[256];
    snprintf(json, sizeof json, "%s/%s.json", c->root, tag);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./infinity --device cuda --model tiny --steps 3 --eval-batches 1 --offload-params cpu "
             "--offload-optimizer cpu --prefetch %d --quiet --json %s", prefetch, json);
    int n = run_logged(c, tag, cmd, 0, ops);
    if (n < 0) return -1;
    char *rec = read_file(json, NULL);
    losses_of(rec, losses, 3);
    free(rec);
    int copies = 0, compute_stream = -1;
    long kernels = 0;
    for (int i = 0; i < n; i++) {
        if (is_kernel(&ops[i])) kernels++, compute_stream = ops[i].stream;
        if (!is_copy_up(&ops[i])) continue;
        if (ops[i].stream == compute_stream) {  // only the token ids go up on the kernels' stream
            if (copy_bytes(&ops[i]) != TOKEN_COPY_BYTES)
                fail_msg("%s: a param slice goes up on the kernels' stream %d: %s", tag, compute_stream, ops[i].what);
            continue;
        }
        kernels_before[copies] = kernels;
        bytes[copies++] = copy_bytes(&ops[i]);
    }
    return copies;
}

// The copies of consecutive units are ordered by events, never by the
// host: the host waits about as often per step with 6 blocks as with 2, in
// the synchronous and the prefetched swap, where a wait per unit would add 8
// per step (4 more units, forward and backward). "About": a wait counts only
// where the work was unfinished, and how much of it the MPI calls' progress
// had already run varies from run to run (a CI run counted 3.5 and 3 for the
// same code), so the bound is half of what a wait per unit adds.
static void test_unit_copies_ordered_by_events(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    for (int p = 0; p < 2; p++) {
        double waits[2];
        for (int l = 0; l < 2; l++) {
            char args[256];
            snprintf(args, sizeof args, "./infinity --offload-params cpu --offload-optimizer cpu --prefetch %d "
                     "--layers %d", p, l ? 6 : 2);
            waits[l] = stat_per_step(c, args, "host_wait");
            if (waits[l] < 0) {
                print_message("the runtime calls are counted on the emulator only: skipped\n");
                skip();
            }
        }
        print_message("--prefetch %d: host waits per step %g with 2 blocks, %g with 6\n", p, waits[0], waits[1]);
        if (waits[1] >= waits[0] + 4)
            fail_msg("--prefetch %d: %g host waits per step with 6 blocks, %g with 2: a wait per unit", p, waits[1],
                     waits[0]);
    }
}

// The synchronous swap (--prefetch 0: each unit's slice copied up when the
// unit is needed) and the prefetched one (--prefetch 1): the same copies in
// the same order and the same losses, the prefetched copies issued before
// more of the compute that precedes them in the synchronous swap.
static void test_sync_and_prefetched_swaps(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    static Op ops[2][MAX_OPS];
    static long before[2][4096], bytes[2][4096];
    double losses[2][3];
    int n[2];
    for (int p = 0; p < 2; p++) {
        char tag[32];
        snprintf(tag, sizeof tag, "swap-prefetch-%d", p);
        n[p] = param_copies(c, tag, p, ops[p], before[p], bytes[p], losses[p]);
        if (n[p] < 0) {
            print_message("no op log: not the emulator: skipped\n");
            skip();
        }
    }
    print_message("%d param copies at --prefetch 0, %d at 1\n", n[0], n[1]);
    if (n[0] != n[1] || n[0] < 3 * 4) fail_msg("--prefetch 0 issues %d copies, --prefetch 1 %d", n[0], n[1]);
    int earlier = 0;
    for (int k = 0; k < n[0]; k++) {
        if (bytes[0][k] != bytes[1][k]) fail_msg("copy %d: %ld bytes at --prefetch 0, %ld at 1", k, bytes[0][k],
                                                 bytes[1][k]);
        if (before[1][k] > before[0][k])
            fail_msg("copy %d: after %ld kernels with --prefetch 1, %ld with 0", k, before[1][k], before[0][k]);
        earlier += before[1][k] < before[0][k];
    }
    print_message("%d of %d copies issued ahead of compute they waited behind at --prefetch 0\n", earlier, n[0]);
    if (earlier < n[0] / 2) fail_msg("only %d of %d copies issued earlier with --prefetch 1", earlier, n[0]);
    for (int i = 0; i < 3; i++)
        if (losses[0][i] != losses[1][i]) fail_msg("step %d: loss %.9g vs %.9g", i + 1, losses[0][i], losses[1][i]);
}

// ---- ZeRO-Offload's CPU Adam during backward ----

static int is_reduce(const Op *o) { return o->stream >= 0 && !strncmp(o->what, "ncclReduce", 10); }
static int is_gather(const Op *o) {
    return o->stream >= 0 && (!strncmp(o->what, "ncclAllGather", 13) || !strncmp(o->what, "ncclBroadcast", 13));
}

// Step 1 of the last rank (its shard holds the last units, whose gradients
// come first): its reductions are the ncclReduce* before the first gather
// of the params the update made.
static void test_adam_starts_during_backward(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    static Op ops[MAX_OPS];
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./cpu_offload --device cuda --model tiny --steps 2 --eval-batches 1 --grad-clip 0 --quiet");
    int n = run_logged(c, "eager", cmd, 1, ops);
    if (n < 0) {
        print_message("no op log: not the emulator: skipped\n");
        skip();
    }
    int last_reduce = -1, first_handover = -1;
    for (int i = 0; i < n && !is_gather(&ops[i]); i++) {
        if (is_reduce(&ops[i])) last_reduce = i;
        if (first_handover < 0 && ops[i].stream >= 0 && !strcmp(ops[i].what, "host function")) first_handover = i;
    }
    if (last_reduce < 0 || first_handover < 0)
        fail_msg("step 1: last reduction at %d, first hand-over to the CPU Adam at %d", last_reduce, first_handover);
    const Op *h = &ops[first_handover], *r = &ops[last_reduce];
    print_message("step 1: the first sub-group handed over at op %d (device %.0f us), the last bucket reduced at op "
                  "%d (device %.0f to %.0f us)\n", first_handover, h->start, last_reduce, r->start, r->end);
    if (first_handover > last_reduce) fail_msg("the CPU Adam's first sub-group waited for the last reduction");
    if (!(h->end > 0 && r->end > 0 && h->start < r->end))
        fail_msg("on the device clock the first hand-over (%.0f us) is not before the last reduction's end (%.0f us)",
                 h->start, r->end);
    // and without --grad-clip 0 the norm of every gradient comes first: nothing is handed over during backward
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./cpu_offload --device cuda --model tiny --steps 2 --eval-batches 1 --quiet");
    n = run_logged(c, "clipped", cmd, 1, ops);
    for (int i = 0; i < n; i++)
        if (ops[i].stream >= 0 && !strcmp(ops[i].what, "host function"))
            fail_msg("with --grad-clip 1 a sub-group was handed over from the device (op %d)", i);
}

// ---- the delayed update keeps its lag on cuda ----

static void losses_on(const RunDir *c, const char *device, const char *flags, double *out) {
    char cmd[CMD_LEN], json[256];
    snprintf(json, sizeof json, "%s/dpu-%s-%zu.json", c->root, device, strlen(flags));
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./cpu_offload --device %s --model tiny --steps 5 %s --quiet --json %s",
             device, flags, json);
    char *rec = train(cmd, json);
    losses_of(rec, out, 5);
    free(rec);
}

// The new params went up on the copy stream while the next CPU Adam already
// wrote the same host buffer, so the device got some of step i's params
// where it should have had step i-1's: on the emulator steps 4 and 5 moved
// towards the plain run's (5.366 or 5.403 where the delayed run has 5.426,
// the plain one 5.363), in every one of 5 runs. The lag is what --dpu is:
// within 0.005 of the cpu device's --dpu (bf16 kernels against fp32
// activations differ by 1e-4 here).
#define DPU_TOL 0.005

static void test_dpu_lag_on_cuda(void **state) {
    if (skip_without_cuda()) skip();
    const RunDir *c = *state;
    double cuda[5], cpu_dpu[5], cpu_plain[5];
    const char *dpu = "--dpu --dpu-warmup 1";
    losses_on(c, "cuda", dpu, cuda);
    losses_on(c, "cpu", dpu, cpu_dpu);
    losses_on(c, "cpu", "", cpu_plain);
    for (int i = 2; i < 5; i++) {
        print_message("step %d: cuda --dpu %.6f, cpu --dpu %.6f, cpu plain %.6f\n", i + 1, cuda[i], cpu_dpu[i],
                      cpu_plain[i]);
        if (fabs(cuda[i] - cpu_dpu[i]) > DPU_TOL)
            fail_msg("step %d: --dpu on cuda %.6f, on cpu %.6f (the plain run: %.6f)", i + 1, cuda[i], cpu_dpu[i],
                     cpu_plain[i]);
    }
}

static int setup(void **state) {
    return run_dir_setup(state, "cuda_offload", (const char *const[]){"./cpu_offload", "./infinity", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_pageable_copy_in_a_step),
        cmocka_unit_test(test_unit_copies_ordered_by_events),
        cmocka_unit_test(test_sync_and_prefetched_swaps),
        cmocka_unit_test(test_adam_starts_during_backward),
        cmocka_unit_test(test_dpu_lag_on_cuda),
    };
    return cmocka_run_group_tests(tests, setup, run_dir_teardown);
}
