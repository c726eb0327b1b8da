// test_cluster.c: runs across hosts, on the emulated cluster of
// scripts/cluster.sh (2 hosts as network namespaces, 2 ranks each, TCP
// between them through tc-shaped links). dp_baseline, zero2, zero3 and
// 3d_parallel (tp inside a host, pp across) at 4 ranks give the losses of
// the same run on one host to the bit (the collectives and their order are
// the same; only the transport differs) and count the same bytes; the ranks
// do sit on two hosts; a second `up` is refused in one line; a failed or
// interrupted run leaves no process on the hosts, and `down` leaves no
// namespace, link or file. Needs root and network namespaces: without them
// every test skips and says why. Run from the repository root after make;
// records go under one mkdtemp folder.
#include "runs.h"

#define PATH_LEN 512
#define CMD_LEN 2048
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
                      "ls -d /etc/netns/zw-* \"${ZW_CLUSTER_DIR:-/tmp/zw-cluster}\" 2>/dev/null; "
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
        cmocka_unit_test(test_second_up_refused),
        cmocka_unit_test(test_failed_run_leaves_nothing),
        cmocka_unit_test(test_down_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
