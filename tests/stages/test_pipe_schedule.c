// test_pipe_schedule.c: pipeline schedules as tables (issue 48's first
// part; common/training/pipe_schedule.c). The tables of AFAB and 1F1B hold
// what the schedules promise (each stage's micro-batches in flight, the
// bubble of their chart beside (P-1)/(m+P-1)); a table that deadlocks, runs
// a backward before its forward or leaves a micro-batch unfinished is
// refused with the fault named; and 3d_parallel runs each stage's forwards
// and backwards (under zb-h1 its F, B and W) in the order of its table
// (read from a run's --trace), its --print-schedule draws that table, and
// its measured micro-batches in flight (and waiting for W) are the table's.
// Run from the repository root.
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include "runs.h"
#include "pipe_schedule.h"

#define CMD_LEN 2048

static const char *const PATHS[] = {"./3d_parallel", NULL};

static int setup(void **state) { return run_dir_setup(state, "test_pipe_schedule", PATHS); }
static int teardown(void **state) { return run_dir_teardown(state); }

static void test_tables_keep_their_promises(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        PipeSchedule sched = k ? PIPE_AFAB : PIPE_1F1B;
        for (int P = 1; P <= 6; P++)
            for (int m = 1; m <= 10; m++) {
                ScheduleTable t;
                schedule_build(&t, sched, P, m, 1);
                for (int s = 0; s < P; s++) {
                    int want = sched == PIPE_AFAB ? m : (P - s < m ? P - s : m);
                    if (schedule_in_flight(&t, s) != want)
                        fail_msg("%s P %d m %d: stage %d holds %d micro-batches, the schedule %d", k ? "afab" : "1f1b",
                                 P, m, s, schedule_in_flight(&t, s), want);
                }
                double bubble = schedule_bubble(&t), formula = (double)(P - 1) / (m + P - 1);
                if (fabs(bubble - formula) > 1e-12)
                    fail_msg("%s P %d m %d: the chart's bubble %.6f, (P-1)/(m+P-1) = %.6f", k ? "afab" : "1f1b", P, m,
                             bubble, formula);
                schedule_free(&t);
            }
    }
}

// A table of `schedule` with P = 2 stages, m = 2 micro-batches and v
// chunks, with the rows given ("F0 F1 B0 B1", "F0.1 W1"), checked: returns
// the fault (static), or "" for none.
static const char *fault_of(PipeSchedule schedule, int v, const char *row0, const char *row1) {
    static char err[256];
    ScheduleTable t;
    schedule_alloc(&t, schedule, 2, 2, v);
    const char *rows[2] = {row0, row1};
    for (int s = 0; s < 2; s++) {
        char kind;
        int micro, used, chunk;
        for (const char *p = rows[s]; sscanf(p, " %c%d%n", &kind, &micro, &used) == 2; p += used) {
            chunk = 0;
            if (p[used] == '.') sscanf(p + used, ".%d%n", &chunk, &(int){0}), used += 2;
            SchedKind k = kind == 'F' ? SCHED_F : kind == 'B' ? SCHED_B : SCHED_W;
            t.ops[(size_t)s * (size_t)t.per_stage + (size_t)t.count[s]++] = (SchedOp){k, micro, chunk};
        }
    }
    err[0] = 0;
    schedule_check(&t, err, sizeof err);
    schedule_free(&t);
    return err;
}

// Interleaved (v = 2) and ZB-H1 at P = 2 and 4, m = 4 and 8 (the issue's
// shapes): interleaved's stage s holds 2(P - s - 1) + (v - 1)P + 1 chunk
// micro-batches (Megatron's warm-up and one), stage 0 1 + (P-1)/(Pv) times
// 1F1B's activations where m·v allows that warm-up (a chunk is 1/v of a
// stage); ZB-H1 holds 1F1B's
// min(P - s, m) through B. Each chart's bubble is its formula's, and
// ZB-H1's is below interleaved's, below 1F1B's.
static void test_interleaved_and_zero_bubble(void **state) {
    (void)state;
    const int v = 2;
    for (int P = 2; P <= 4; P += 2)
        for (int m = 4; m <= 8; m += 4) {
            ScheduleTable one, inter, zb;
            schedule_build(&one, PIPE_1F1B, P, m, 1);
            schedule_build(&inter, PIPE_INTERLEAVED, P, m, v);
            schedule_build(&zb, PIPE_ZB_H1, P, m, 1);
            for (int s = 0; s < P; s++) {
                int want = 2 * (P - s - 1) + (v - 1) * P + 1, base = P - s < m ? P - s : m;
                if (want > m * v) want = m * v;
                if (schedule_in_flight(&inter, s) != want || schedule_in_flight(&zb, s) != base)
                    fail_msg("P %d m %d stage %d: interleaved holds %d chunk micro-batches (want %d), zb-h1 %d (want "
                             "%d)", P, m, s, schedule_in_flight(&inter, s), want, schedule_in_flight(&zb, s), base);
            }
            // (where the warm-up is not cut short by the m·v chunk micro-batches there are)
            double ratio = (double)schedule_in_flight(&inter, 0) / v / schedule_in_flight(&one, 0);
            if (2 * (P - 1) + (v - 1) * P + 1 <= m * v && fabs(ratio - (1 + (P - 1.0) / (P * v))) > 1e-12)
                fail_msg("P %d m %d: interleaved's stage 0 holds %.4f of 1F1B's, not 1 + (P-1)/(Pv)", P, m, ratio);
            double b1 = schedule_bubble(&one), bi = schedule_bubble(&inter), bz = schedule_bubble(&zb);
            if (fabs(bi - schedule_bubble_formula(&inter)) > 1e-12 || fabs(bz - schedule_bubble_formula(&zb)) > 1e-12)
                fail_msg("P %d m %d: bubbles interleaved %.4f (formula %.4f), zb-h1 %.4f (formula %.4f)", P, m, bi,
                         schedule_bubble_formula(&inter), bz, schedule_bubble_formula(&zb));
            if (!(bz < bi && bi < b1)) fail_msg("P %d m %d: bubbles 1f1b %.4f, interleaved %.4f, zb-h1 %.4f", P, m, b1, bi, bz);
            // ZB-H1's other staircase: stage s keeps s + 1 micro-batches' W stashes (1F1B's P - s in flight)
            int pending = 0;
            for (int s = 0; s < P; s++) {
                int want = s + 1 < m ? s + 1 : m;
                if (schedule_pending_w(&zb, s) != want)
                    fail_msg("P %d m %d stage %d: %d waiting for W, want min(s + 1, m) = %d", P, m, s,
                             schedule_pending_w(&zb, s), want);
                pending = schedule_pending_w(&zb, s) > pending ? schedule_pending_w(&zb, s) : pending;
            }
            print_message("P %d m %d: bubble 1f1b %.3f, interleaved v 2 %.3f, zb-h1 %.3f (W pending at most %d)\n", P,
                          m, b1, bi, bz, pending);
            schedule_free(&one);
            schedule_free(&inter);
            schedule_free(&zb);
        }
    // --print-schedule draws them (runs of them: test_zero_bubble, test_interleaved), and refuses the shapes
    // they cannot take
    char *out = NULL;
    run_ok("./3d_parallel --model small --layers 8 --pp 4 --grad-accum 8 --schedule interleaved --virtual-stages 2 "
           "--print-schedule", &out);
    if (!strstr(out, "stage 0 | F0.0 F1.0 F2.0 F3.0 F0.1") || !strstr(out, "formula (P-1)/(v·m+P-1) = 0.158"))
        fail_msg("--print-schedule interleaved:\n%s", out);
    free(out);
    run_ok("./3d_parallel --pp 4 --grad-accum 8 --schedule zb-h1 --print-schedule", &out);
    if (!strstr(out, "stage 0 | F0 F1 F2 F3 .  .  .  B0 W0 F4 B1 W1") || !strstr(out, "stage 3 | .  .  .  F0 B0 F1 B1") ||
        !strstr(out, "formula (P-1)/(3m+P-1) = 0.111"))
        fail_msg("--print-schedule zb-h1:\n%s", out);
    free(out);
    const char *cases[][2] = {
        {"./3d_parallel --model tiny --layers 4 --pp 2 --schedule interleaved --virtual-stages 3 --grad-accum 4 "
         "--print-schedule", "--virtual-stages 3 with --pp 2 cuts the 4 layers into 6 chunks"},
        {"./3d_parallel --pp 1 --schedule zb-h1 --print-schedule", "it needs --pp 2 or more"},
        {"./3d_parallel --pp 2 --schedule gpipe --print-schedule", "--schedule gpipe: choose 1f1b, afab, interleaved"},
        {"./3d_parallel --pp 2 --grad-accum 3 --schedule interleaved --virtual-stages 2 --print-schedule",
         "3 micro-batches are not a multiple of it"},
        {"./3d_parallel --pp 2 --schedule interleaved --print-schedule", "give --virtual-stages 2 or more"},
        {"./3d_parallel --pp 2 --virtual-stages 2 --print-schedule", "only the interleaved schedule cuts a stage"},
        {"mpirun -np 2 ./3d_parallel --model tiny --pp 2 --grad-accum 2 --schedule zb-h1 --tiled-mlp 2 --steps 1",
         "W reads each block's whole GELU output"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) free(expect_refusal(cases[i][0], cases[i][1]));
}

static void test_bad_tables_are_refused(void **state) {
    (void)state;
    // 1F1B's (v = 1), then zero bubble's with W (the lab's planted mistakes:
    // a W before its B, a W never run), then interleaved chunks (v = 2)
    const struct {
        PipeSchedule schedule;
        int v;
        const char *rows[2], *fault;
    } cases[] = {
        {PIPE_1F1B, 1, {"F0 F1 B0 B1", "F0 B0 F1 B1"}, ""},
        {PIPE_1F1B, 1, {"F0 F1 B0 B1", "B0 F0 F1 B1"}, "stage 1 runs B0 before its F0"},
        {PIPE_1F1B, 1, {"F0 F1 B0", "F0 B0 F1 B1"},
         "stage 0 runs 2 forwards, 1 backwards and 0 weight gradients of 2 micro-batches x 1 chunks: one is left "
         "unfinished"},
        {PIPE_1F1B, 1, {"F0 F1 B0 B0", "F0 B0 F1 B1"}, "stage 0 runs B0 twice"},
        {PIPE_1F1B, 1, {"F0 B0 F1 B1", "F1 F0 B0 B1"}, "a deadlock"},
        {PIPE_1F1B, 1, {"F0 F1 B0 W0 B1", "F0 B0 F1 B1"}, "stage 0 runs W0, but 1f1b does not split the backward"},
        {PIPE_ZB_H1, 1, {"F0 F1 B0 W0 B1 W1", "F0 B0 W0 F1 B1 W1"}, ""},
        {PIPE_ZB_H1, 1, {"F0 F1 W0 B0 B1 W1", "F0 B0 W0 F1 B1 W1"}, "stage 0 runs W0 before its B0"},
        {PIPE_ZB_H1, 1, {"F0 F1 B0 W0 B1", "F0 B0 W0 F1 B1 W1"}, "one is left unfinished"},
        {PIPE_INTERLEAVED, 2, {"F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0", "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0"},
         ""},
        {PIPE_INTERLEAVED, 2, {"F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0", "F0.1 F1.0 F0.0 B0.1 F1.1 B1.1 B0.0 B1.0"},
         "a deadlock"},
        {PIPE_INTERLEAVED, 2, {"F0.0 F1.0 F0.2 F1.1 B0.1 B1.1 B0.0 B1.0", "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0"},
         "stage 0 runs F0.2: micro-batches 0 to 1, chunks 0 to 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = fault_of(cases[i].schedule, cases[i].v, cases[i].rows[0], cases[i].rows[1]);
        if (cases[i].fault[0] ? !strstr(got, cases[i].fault) : got[0] != 0)
            fail_msg("%s: stage 0 \"%s\", stage 1 \"%s\": \"%s\", expected \"%s\"", schedule_name(cases[i].schedule),
                     cases[i].rows[0], cases[i].rows[1], got, cases[i].fault);
        print_message("%s: stage 0 \"%s\", stage 1 \"%s\": %s\n", schedule_name(cases[i].schedule), cases[i].rows[0],
                      cases[i].rows[1], got[0] ? got : "runs");
    }
}

// Each rank's first step in a --trace: the names of its compute spans F i,
// B i and (zb-h1) W i, the first `ops` of them (every span of a pipeline
// stage's rank is one of them or another kind of span; the evaluation's
// forwards come after the step's).
static int step_ops(json_t *events, int pid, int ops, char out[][8]) {
    int n = 0;
    double last = -1;
    for (size_t k = 0; k < json_array_size(events) && n < ops; k++) {
        json_t *e = json_array_get(events, k);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (json_integer_value(json_object_get(e, "pid")) != pid || !name || !strchr("FBW", name[0]) ||
            !isdigit((unsigned char)name[1]))
            continue;
        double ts = json_number_value(json_object_get(e, "ts"));
        if (ts < last) fail_msg("rank %d's spans are not in time order in the trace", pid);
        last = ts;
        snprintf(out[n++], 8, "%s", name);
    }
    return n;
}

static void test_runs_follow_their_tables(void **state) {
    RunDir *c = *state;
    const int shapes[][2] = {{2, 4}, {4, 8}, {4, 2}};
    const PipeSchedule kinds[4] = {PIPE_1F1B, PIPE_AFAB, PIPE_ZB_H1, PIPE_INTERLEAVED};
    for (int k = 0; k < 4; k++)
        for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++) {
            int P = shapes[h][0], m = shapes[h][1], zb = kinds[k] == PIPE_ZB_H1, v = kinds[k] == PIPE_INTERLEAVED ? 2 : 1;
            if (v > 1 && m % P) continue;  // interleaved takes the micro-batches by groups of P
            int ops_per_stage = (zb ? 3 : 2) * m * v;
            char name[64];  // (small has 4 layers: 8 for 4 stages of 2 chunks)
            snprintf(name, sizeof name, v > 1 ? "%s --virtual-stages 2 --layers 8" : "%s", schedule_name(kinds[k]));
            char cmd[CMD_LEN], trace[256], json[256], *printed = NULL;
            snprintf(cmd, sizeof cmd, "./3d_parallel --model small --pp %d --grad-accum %d --schedule %s "
                     "--print-schedule", P, m, name);
            run_ok(cmd, &printed);
            snprintf(trace, sizeof trace, "%s/%d-%d-%d.trace.json", c->root, k, P, m);
            snprintf(json, sizeof json, "%s/%d-%d-%d.json", c->root, k, P, m);
            snprintf(cmd, sizeof cmd, "mpirun -np %d ./3d_parallel --model small --pp %d --grad-accum %d --schedule %s "
                     "--steps 1 --eval-every 0 --eval-batches 1 --quiet --trace %s --json %s", P, P, m, name, trace, json);
            char *rec = train(cmd, json);
            json_error_t e;
            json_t *tr = json_load_file(trace, 0, &e), *r = json_loads(rec, 0, &e);
            if (!tr || !r) fail_msg("%s: trace or record not JSON (%s)", cmd, e.text);
            json_t *events = json_is_array(tr) ? tr : json_object_get(tr, "traceEvents");
            json_t *ranks = json_object_get(json_object_get(r, "grid"), "ranks");
            ScheduleTable t;
            schedule_build(&t, kinds[k], P, m, v);
            for (int s = 0; s < P; s++) {  // tp 1, dp 1: rank s is stage s
                char ops[64][8], want[16];
                int n = step_ops(events, s, ops_per_stage, ops);
                if (n != ops_per_stage)
                    fail_msg("%s: rank %d ran %d operations in its step, not %d", cmd, s, n, ops_per_stage);
                // the printed row: stage s's operations in the same order
                char label[32];
                snprintf(label, sizeof label, "stage %d | ", s);
                const char *line = strstr(printed, label);
                if (!line) fail_msg("--print-schedule printed no row for stage %d:\n%s", s, printed);
                line += strlen(label);
                for (int i = 0; i < n; i++) {
                    SchedOp o = schedule_op(&t, s, i);
                    if (v > 1) snprintf(want, sizeof want, "%c%d.%d", "FBW"[o.kind], o.micro, o.chunk);
                    else snprintf(want, sizeof want, "%c%d", "FBW"[o.kind], o.micro);
                    if (strcmp(ops[i], want))
                        fail_msg("%s: rank %d's operation %d is %s, its table's %s", cmd, s, i + 1, ops[i], want);
                    char tok[16];
                    int used;
                    while (sscanf(line, " %15s%n", tok, &used) == 1 && (tok[0] == '.' || tok[0] == '-')) line += used;
                    if (sscanf(line, " %15s%n", tok, &used) != 1 || strcmp(tok, want))
                        fail_msg("--print-schedule row %d: %s where the table has %s:\n%s", s, tok, want, printed);
                    line += used;
                }
                json_t *x = json_array_get(ranks, (size_t)s);
                long measured = json_integer_value(json_object_get(x, "peak_in_flight"));
                long waited = json_integer_value(json_object_get(x, "w_pending"));
                if (measured != schedule_in_flight(&t, s) || waited != (zb ? schedule_pending_w(&t, s) : 0))
                    fail_msg("%s: stage %d held %ld micro-batches and %ld waiting for W, its table %d and %d", cmd, s,
                             measured, waited, schedule_in_flight(&t, s), zb ? schedule_pending_w(&t, s) : 0);
            }
            print_message("%s P %d m %d: every rank ran its table's %d operations in order; in flight%s as the "
                          "table\n", name, P, m, ops_per_stage, zb ? " and W waiting" : "");
            schedule_free(&t);
            json_decref(tr);
            json_decref(r);
            free(rec);
            free(printed);
        }
    free(expect_refusal("./3d_parallel --pp 2 --grad-accum 0 --print-schedule", "--grad-accum"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_keep_their_promises),
        cmocka_unit_test(test_bad_tables_are_refused),
        cmocka_unit_test(test_interleaved_and_zero_bubble),
        cmocka_unit_test(test_runs_follow_their_tables),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
