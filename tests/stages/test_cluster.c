// test_cluster.c: runs across hosts, on the emulated cluster of
// scripts/cluster.sh (2 hosts as network namespaces, 2 ranks each, TCP
// between them through tc-shaped links). dp_baseline, zero2, zero3 and
// 3d_parallel (tp inside a host, pp across) at 4 ranks give the losses of
// the same run on one host to the bit (the collectives and their order are
// the same; only the transport differs) and count the same bytes; the ranks
// do sit on two hosts; zero3's ZeRO++ switches count their bytes in the host
// and across hosts as their formulas say, hpZ keeps zero3's bits and its
// backward gathers in the host, all three move at most 0.3 of zero3's bytes
// across hosts; a second `up` is refused in one line; a failed or
// interrupted run leaves no process on the hosts, and `down` leaves no
// namespace, link or file. Failures are named as on one host (a rank killed
// by a signal, a program that cannot be started), a run needs no settings
// from the caller's shell, SIGTERM to `run` stops the ranks with rank 0's
// line and a checkpoint, `status` says when a host is gone, and a folder
// `up` did not make is never used or removed. Needs root and network
// namespaces: without them every test skips and says why. Run from the repository root after make;
// records go under one mkdtemp folder.
// uses: cluster (the emulated hosts' network namespaces, zw-*: one set at a time)
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 4096
#define STATE_DIR "\"${ZW_CLUSTER_DIR:-/tmp/zw-cluster}\""
#define STEPS 5
#define CLUSTER "scripts/cluster.sh"
#define NSTAGES 4

static const char *const STAGE[NSTAGES] = {"dp_baseline", "zero2", "zero3", "3d_parallel"};
static const char *const FLAGS[NSTAGES] = {"", "--bucket-mb 0.01", "--prefetch 1", "--tp 2 --pp 2"};

typedef struct Ctx {
    char root[64];
    int up;              // this group brought the cluster up (and takes it down)
    char why_skip[512];  // set when the machine cannot make the cluster
} Ctx;

// Skips a test of a group that could not bring the cluster up, saying why.
#define NEED_CLUSTER(c)                                                   \
    do {                                                                  \
        if (!(c)->up) {                                                   \
            fprintf(stderr, "test_cluster: skipped: %s\n", (c)->why_skip); \
            skip();                                                       \
        }                                                                 \
    } while (0)

static int setup(void **state) {
    static const char *const needs[] = {"./dp_baseline", "./zero2", "./zero3", "./3d_parallel", CLUSTER, NULL};
    if (run_dir_setup(state, "cluster", needs)) return 1;
    RunDir *dir = *state;
    Ctx *c = calloc(1, sizeof *c);
    memcpy(c->root, dir->root, sizeof c->root);
    free(dir);
    *state = c;
    char *out = NULL;
    int rc = test_run(CLUSTER " status", &out);
    if (rc != 0 || !strstr(out, "no cluster is up")) {
        // someone else's cluster: leave it be
        snprintf(c->why_skip, sizeof c->why_skip, "a cluster is already up on this machine (" CLUSTER " status)");
    } else {
        free(out);
        // a fast link: this tests the transport, not its speed
        rc = test_run(CLUSTER " up 2 --link 10gbit --slots 2", &out);
        if (rc == 0)
            c->up = 1;
        else
            snprintf(c->why_skip, sizeof c->why_skip, "%s(exit %d)", out, rc);
    }
    free(out);
    return 0;
}

static int teardown(void **state) {
    Ctx *c = *state;
    if (c->up) test_run(CLUSTER " down", NULL);
    int rc = test_remove_dir(c->root);
    free(c);
    return rc;
}

// One record of STAGE s at 4 ranks, on one host or on the cluster.
static char *run_stage(Ctx *c, int s, int on_cluster) {
    char cmd[CMD_LEN], json[PATH_LEN];
    snprintf(json, sizeof json, "%s/%s-%s.json", c->root, STAGE[s], on_cluster ? "cluster" : "host");
    snprintf(cmd, sizeof cmd, "%smpirun -np 4 ./%s --model tiny --batch 2 --steps %d --quiet --json %s %s",
             on_cluster ? CLUSTER " run -- " : "", STAGE[s], STEPS, json, FLAGS[s]);
    return train(cmd, json);
}

// The text of the object "key":{...} in a record (malloc'd).
static char *object_of(const char *json, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":{", key);
    const char *p = strstr(json, pat);
    if (!p) fail_msg("no %s in the record:\n%.300s", key, json);
    const char *end = strchr(p, '}');
    return strndup(p, (size_t)(end - p + 1));
}

// ---- tests ----

static void test_ranks_on_two_hosts(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char *out = NULL;
    int rc = test_run(CLUSTER " run -- mpirun -np 4 hostname", &out);
    assert_int_equal(rc, 0);
    // by slot: ranks 0-1 on node0, 2-3 on node1
    int on0 = 0, on1 = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        on0 += strcmp(line, "node0") == 0;
        on1 += strcmp(line, "node1") == 0;
    }
    if (on0 != 2 || on1 != 2)
        fail_msg("expected 2 ranks on node0 and 2 on node1; mpirun -np 4 hostname said:\n%s", out);
    free(out);
}

static void test_same_losses_and_bytes_as_one_host(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    for (int s = 0; s < NSTAGES; s++) {
        char *host = run_stage(c, s, 0), *cluster = run_stage(c, s, 1);
        double lh[RUN_MAX_STEPS] = {0}, lc[RUN_MAX_STEPS] = {0};
        losses_of(host, lh, STEPS);
        losses_of(cluster, lc, STEPS);
        for (int i = 0; i < STEPS; i++)
            if (lh[i] != lc[i])
                fail_msg("%s step %d: loss %.9g on 2 hosts, %.9g on one (the same collectives in the same "
                         "order must give the same bits)", STAGE[s], i + 1, lc[i], lh[i]);
        double bh = number_of(host, "comm_bytes_per_step"), bc = number_of(cluster, "comm_bytes_per_step");
        if (bh != bc) fail_msg("%s: %.0f bytes per step counted on 2 hosts, %.0f on one", STAGE[s], bc, bh);
        char *oh = object_of(host, "comm_bytes_by_op_per_step"), *oc = object_of(cluster, "comm_bytes_by_op_per_step");
        if (strcmp(oh, oc) != 0) fail_msg("%s: bytes by collective differ: 2 hosts %s, one %s", STAGE[s], oc, oh);
        free(oh);
        free(oc);
        free(host);
        free(cluster);
    }
}

// ---- ZeRO++ across hosts (issue 37) ----

#define ZPP_STEPS 40
#define ZPP_TOL 0.05  // |mean of the last 10 losses - zero3's|, |validation - zero3's| after ZPP_STEPS

// zero3 on the cluster with `args`, small at batch 2 (a record, malloc'd).
static char *run_zero3(Ctx *c, const char *args, int steps) {
    char cmd[CMD_LEN], json[PATH_LEN];
    snprintf(json, sizeof json, "%s/zeropp.json", c->root);
    remove(json);
    snprintf(cmd, sizeof cmd, CLUSTER " run -- mpirun -np 4 ./zero3 --model small --batch 2 --steps %d --quiet "
             "--json %s %s", steps, json, args);
    return train(cmd, json);
}

// The number `key` in the object that starts with `object` (e.g. "\"backward_gather\":{").
static double number_in(const char *json, const char *object, const char *key) {
    const char *o = strstr(json, object);
    if (!o) fail_msg("no %s in the record:\n%.300s", object, json);
    return number_of(o, key);
}

static const char *const HOPS[4] = {"forward_gather", "backward_gather", "grads_in_host", "grads_across"};

// Each hop's bytes in the host and across hosts, counted, equal its formula
// (means over 4 ranks of whole bytes, written to 0.1).
static void expect_hops_as_formula(const char *what, const char *json) {
    for (int h = 0; h < 4; h++) {
        char obj[64];
        snprintf(obj, sizeof obj, "\"%s\":{", HOPS[h]);
        double intra = number_in(json, obj, "intra"), intra_f = number_in(json, obj, "intra_formula");
        double cross = number_in(json, obj, "cross"), cross_f = number_in(json, obj, "cross_formula");
        if (fabs(intra - intra_f) > 0.1 || fabs(cross - cross_f) > 0.1)
            fail_msg("%s, %s on 2 hosts: in the host %.1f B (formula %.1f), across %.1f B (formula %.1f)", what,
                     HOPS[h], intra, intra_f, cross, cross_f);
    }
}

// Step 1's gradient norm.
static double first_norm(const char *json) {
    double norms[RUN_MAX_STEPS];
    if (json_numbers(json, "grad_norms", norms, RUN_MAX_STEPS) < 1) fail_msg("no grad_norms in the record");
    return norms[0];
}

static double late_mean(const char *json) {
    double l[RUN_MAX_STEPS];
    losses_of(json, l, ZPP_STEPS);
    double sum = 0;
    for (int i = ZPP_STEPS - 10; i < ZPP_STEPS; i++) sum += l[i];
    return sum / 10;
}

// On 2 hosts of 2 ranks: hpZ alone gives zero3's losses to the bit (zero3's
// on one host too) and none of its backward gathers' bytes leave a host;
// qwZ, qgZ (int8, int4) and all three count each hop's bytes in the host and
// across hosts as the formulas say, give step 1 (the same weights) a
// gradient norm within 1% of zero3's and stay within ZPP_TOL of zero3's
// losses after ZPP_STEPS; all three move at most 0.3 of zero3's bytes
// across hosts.
static void test_zeropp_on_two_hosts(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char *zero3 = run_zero3(c, "", ZPP_STEPS), *hpz = run_zero3(c, "--hpz-size 2", ZPP_STEPS);
    double lz[RUN_MAX_STEPS], lh[RUN_MAX_STEPS];
    losses_of(zero3, lz, ZPP_STEPS);
    losses_of(hpz, lh, ZPP_STEPS);
    for (int i = 0; i < ZPP_STEPS; i++)
        if (lz[i] != lh[i]) fail_msg("--hpz-size 2 on 2 hosts, step %d: loss %.9g, zero3's %.9g", i + 1, lh[i], lz[i]);
    expect_hops_as_formula("--hpz-size 2", hpz);
    if (number_in(hpz, "\"backward_gather\":{", "cross") != 0 || !(number_in(hpz, "\"backward_gather\":{", "intra") > 0))
        fail_msg("--hpz-size 2: backward's gathers must stay in the host:\n%s", strstr(hpz, "\"zeropp\""));
    double zero3_cross = number_in(zero3, "\"zeropp\":{", "cross_host_bytes_per_step");
    assert_true(zero3_cross > 0 && zero3_cross == number_in(zero3, "\"zeropp\":{", "cross_host_formula_bytes_per_step"));
    const char *modes[] = {"--quantize-weights", "--quantize-grads", "--quantize-grads --grad-quant-bits 4",
                           "--quantize-weights --hpz-size 2 --quantize-grads"};
    for (int i = 0; i < 4; i++) {
        char *m = run_zero3(c, modes[i], ZPP_STEPS);
        expect_hops_as_formula(modes[i], m);
        double late = late_mean(m), base = late_mean(zero3);
        double val = number_of(m, "val_loss"), base_val = number_of(zero3, "val_loss");
        double cross = number_in(m, "\"zeropp\":{", "cross_host_bytes_per_step");
        // the first step's gradient comes from the same weights: quantized, its norm within 1% of zero3's
        double norm = first_norm(m), base_norm = first_norm(zero3);
        if (fabs(norm - base_norm) > 0.01 * base_norm)
            fail_msg("%s on 2 hosts: step 1's gradient norm %.6g, zero3's %.6g", modes[i], norm, base_norm);
        print_message("%-50s across hosts %.3f of zero3's; last 10 losses %.4f (zero3 %.4f), validation %.4f (%.4f)\n",
                      modes[i], cross / zero3_cross, late, base, val, base_val);
        if (fabs(late - base) > ZPP_TOL || fabs(val - base_val) > ZPP_TOL)
            fail_msg("%s on 2 hosts: losses %.4f, validation %.4f: more than %g from zero3's %.4f, %.4f", modes[i], late,
                     val, ZPP_TOL, base, base_val);
        if (i == 3 && cross > 0.3 * zero3_cross)
            fail_msg("all three switches move %.0f bytes across hosts, more than 0.3 x zero3's %.0f", cross, zero3_cross);
        free(m);
    }
    free(zero3);
    free(hpz);
}

static void test_second_up_refused(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    free(expect_refusal(CLUSTER " up 2", "already up"));
}

// Processes left in the cluster's namespaces (0 when none); fails on a bad answer.
static int processes_on_hosts(void) {
    char *out = NULL;
    int rc = test_run("for ns in $(ip netns list | awk '/^zw-/{print $1}'); do ip netns pids $ns; done | wc -l", &out);
    assert_int_equal(rc, 0);
    int n = atoi(out);
    free(out);
    return n;
}

static void test_failed_run_leaves_nothing(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char *out = NULL;
    // refused by the trainer: every rank exits 2
    int rc = test_run(CLUSTER " run -- mpirun -np 4 ./zero2 --no-such-flag", &out);
    if (rc == 0) fail_msg("a bad flag was not refused:\n%s", out);
    free(out);
    assert_int_equal(processes_on_hosts(), 0);
    // stopped from outside while its ranks run
    rc = test_run("timeout 3 " CLUSTER " run -- mpirun -np 4 sleep 60", &out);
    assert_int_equal(rc, 124);
    free(out);
    assert_int_equal(processes_on_hosts(), 0);
}

// Issue 39 item 3: `ZW_CLUSTER_DIR=FOLDER cluster.sh down` removed FOLDER,
// whatever it held. A folder that `up` did not make is refused in one line
// by up, run, status and down, and stays as it was. (No cluster is needed:
// the folder is refused first.)
static void test_folder_not_made_by_up_left_alone(void **state) {
    Ctx *c = *state;
    char cmd[CMD_LEN];
    snprintf(cmd, sizeof cmd, "mkdir %s/theirs && echo work > %s/theirs/notes.txt", c->root, c->root);
    assert_int_equal(test_run(cmd, NULL), 0);
    const char *actions[] = {"up 2", "run -- true", "status", "down"};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "ZW_CLUSTER_DIR=%s/theirs " CLUSTER " %s", c->root, actions[i]);
        free(expect_refusal(cmd, "was not made by cluster.sh up"));
    }
    snprintf(cmd, sizeof cmd, "test \"$(ls -A %s/theirs)\" = notes.txt && grep -qx work %s/theirs/notes.txt", c->root,
             c->root);
    if (test_run(cmd, NULL) != 0) fail_msg("the folder %s/theirs was changed or removed", c->root);
}

// Issue 39 item 13: on the cluster, a rank killed by SIGKILL was reported
// only by rank 0's "stopped by SIGTERM after step N" (mpirun's own report was
// quiet), and a program that could not be started by nothing (exit 132).
// Both are named as on one host, also when run is called from another folder.
static void test_failures_named(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char here[PATH_LEN], cmd[CMD_LEN], *out = NULL;
    assert_non_null(getcwd(here, sizeof here));
    // rank 2, on node1, kills itself after 3 s
    int rc = test_run(CLUSTER " run -- mpirun -np 4 bash -c 'if [ $OMPI_COMM_WORLD_RANK = 2 ]; then "
                      "(sleep 3; kill -9 $$) & fi; exec ./zero2 --model small --steps 1000000 --quiet'", &out);
    if (rc == 0 || !strstr(out, "mpirun: rank 2 died of signal 9 (Killed) on node node1; the job was stopped"))
        fail_msg("rank 2 killed: exit %d, no line naming it:\n%s", rc, out);
    free(out);
    assert_int_equal(processes_on_hosts(), 0);
    snprintf(cmd, sizeof cmd, "cd / && %s/" CLUSTER " run -- mpirun -np 4 ./zero2 --model tiny", here);
    rc = test_run(cmd, &out);
    // whichever host's daemon reports first is named: node0 or node1
    if (rc == 0 || !strstr(out, "mpirun: cannot start ./zero2 on node node") ||
        !strstr(out, ": no such program there, or not executable"))
        fail_msg("%s: exit %d, no line naming ./zero2:\n%s", cmd, rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "cd / && %s/" CLUSTER " run -- mpirun -np 4 %s/zero2 --model tiny --steps 1 --quiet", here,
             here);
    rc = test_run(cmd, &out);
    if (rc != 0 || !strstr(out, "summary zero2")) fail_msg("%s: exit %d\n%s", cmd, rc, out);
    free(out);
}

// Issue 39 items 13 and 16: README's `cluster.sh run -- mpirun ...`, in a
// shell without mpi-env.sh's settings, met Open MPI's refusal as root; the
// script sets them itself.
static void test_run_needs_no_settings(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char *out = NULL;
    int rc = test_run("unset $(env | grep -o '^OMPI_[A-Za-z_]*'); " CLUSTER " run -- mpirun -np 4 hostname", &out);
    if (rc != 0 || count_lines(out) != 4) fail_msg("without OMPI_* settings: exit %d\n%s", rc, out);
    free(out);
}

// Issue 39 item 22, on the cluster: SIGTERM to `cluster.sh run` (what a
// batch system sends) killed every process of the run outright, so rank 0
// never said where it got to. It goes on to mpirun: the ranks on both hosts
// stop, rank 0 names the checkpoint, and the run resumes from it.
static void test_sigterm_stops_every_rank(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char ck[PATH_LEN], log[PATH_LEN], cmd[CMD_LEN], *out = NULL;
    snprintf(ck, sizeof ck, "%s/stopped", c->root);
    snprintf(log, sizeof log, "%s/stopped.log", c->root);
    snprintf(cmd, sizeof cmd, "timeout 300 bash -c '" CLUSTER " run -- mpirun -np 4 ./zero2 --model tiny --steps 100000 "
             "--save %s --save-every 2 --quiet > %s 2>&1 & m=$!; "
             "for i in $(seq 1200); do grep -q \"saved checkpoint\" %s && break; sleep 0.1; done; kill -TERM $m; wait $m'",
             ck, log, log);
    int rc = test_run(cmd, NULL);
    char *said = read_file(log, NULL), want[PATH_LEN + 32];
    assert_non_null(said);
    snprintf(want, sizeof want, "; resume with --resume %s (step ", ck);
    const char *line = strstr(said, "zero2: stopped by SIGTERM after step ");
    if (rc != 143 || !line || !strstr(line, want))
        fail_msg("exit %d (want 143); expected 'zero2: stopped by SIGTERM after step N%s...':\n%s", rc, want, said);
    long step = atol(strstr(line, want) + strlen(want));
    free(said);
    assert_int_equal(processes_on_hosts(), 0);
    snprintf(cmd, sizeof cmd, CLUSTER " run -- mpirun -np 4 ./zero2 --model tiny --steps %ld --resume %s --quiet",
             step + 1, ck);
    rc = test_run(cmd, &out);
    snprintf(want, sizeof want, "resumed from %s at step %ld ", ck, step);
    if (rc != 0 || !strstr(out, want)) fail_msg("%s: exit %d, no \"%s\":\n%s", cmd, rc, want, out);
    free(out);
}

// Issue 39 item 13: with a host's namespace gone, `status` still said
// hosts=2 and exited 0. It names the host and exits 1; the cluster is then
// made again for the tests after this one.
static void test_status_names_a_lost_host(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char *out = NULL;
    assert_int_equal(test_run("ip netns del zw-node1", NULL), 0);
    int rc = test_run(CLUSTER " status", &out);
    if (rc != 1 || !strstr(out, "error: the cluster is damaged: node1 gone"))
        fail_msg(CLUSTER " status with node1's namespace deleted: exit %d\n%s", rc, out);
    free(out);
    c->up = 0;
    snprintf(c->why_skip, sizeof c->why_skip, "the cluster could not be made again after test_status_names_a_lost_host");
    // (down also takes the hosts file of the namespace that was deleted)
    rc = test_run(CLUSTER " down && test -z \"$(ls -d /etc/netns/zw-* 2>/dev/null)\" && "
                  CLUSTER " up 2 --link 10gbit --slots 2", &out);
    if (rc != 0) fail_msg("down (leaving no /etc/netns/zw-*) and up again: exit %d\n%s", rc, out);
    c->up = 1;
    free(out);
}

// Last: takes the cluster down and finds nothing of it.
static void test_down_leaves_nothing(void **state) {
    Ctx *c = *state;
    NEED_CLUSTER(c);
    char *out = NULL;
    assert_int_equal(test_run(CLUSTER " down", &out), 0);
    free(out);
    c->up = 0;
    snprintf(c->why_skip, sizeof c->why_skip, "the cluster was taken down");
    int rc = test_run("ip netns list | grep '^zw-'; "
                      "ls -d /etc/netns/zw-* " STATE_DIR " 2>/dev/null; "
                      "ip link show | grep -E 'port[0-9]+@|zw-'; true", &out);
    assert_int_equal(rc, 0);
    if (out[0]) fail_msg("after down, still there:\n%s", out);
    free(out);
    out = NULL;
    assert_int_equal(test_run(CLUSTER " status", &out), 0);
    assert_non_null(strstr(out, "no cluster is up"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_on_two_hosts),
        cmocka_unit_test(test_same_losses_and_bytes_as_one_host),
        cmocka_unit_test(test_zeropp_on_two_hosts),
        cmocka_unit_test(test_second_up_refused),
        cmocka_unit_test(test_failed_run_leaves_nothing),
        cmocka_unit_test(test_folder_not_made_by_up_left_alone),
        cmocka_unit_test(test_failures_named),
        cmocka_unit_test(test_run_needs_no_settings),
        cmocka_unit_test(test_sigterm_stops_every_rank),
        cmocka_unit_test(test_status_names_a_lost_host),
        cmocka_unit_test(test_down_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
