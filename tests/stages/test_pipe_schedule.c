// test_pipe_schedule.c: pipeline schedules as tables (issue 48's first
// part; common/training/pipe_schedule.c). The tables of AFAB and 1F1B hold
// what the schedules promise (each stage's micro-batches in flight, the
// bubble of their chart beside (P-1)/(m+P-1)); a table that deadlocks, runs
// a backward before its forward or leaves a micro-batch unfinished is
// refused with the fault named; and 3d_parallel runs each stage's forwards
// and backwards in the order of its table (read from a run's --trace), its
// --print-schedule draws that table, and its measured micro-batches in
// flight are the table's. Run from the repository root.
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
                schedule_build(&t, sched, P, m);
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

// A table of P = 2 stages and m = 2 micro-batches with the rows given
// ("F0 F1 B0 B1"), checked: returns the fault (static), or "" for none.
static const char *fault_of(const char *row0, const char *row1) {
    static char err[256];
    ScheduleTable t;
    schedule_alloc(&t, PIPE_1F1B, 2, 2);
    const char *rows[2] = {row0, row1};
    for (int s = 0; s < 2; s++) {
        char kind;
        int micro, used;
        for (const char *p = rows[s]; sscanf(p, " %c%d%n", &kind, &micro, &used) == 2; p += used)
            t.ops[(size_t)s * 4 + (size_t)t.count[s]++] = (SchedOp){kind == 'F' ? SCHED_F : SCHED_B, micro};
    }
    err[0] = 0;
    schedule_check(&t, err, sizeof err);
    schedule_free(&t);
    return err;
}

static void test_bad_tables_are_refused(void **state) {
    (void)state;
    const char *cases[][3] = {
        {"F0 F1 B0 B1", "F0 B0 F1 B1", ""},
        {"F0 F1 B0 B1", "B0 F0 F1 B1", "stage 1 runs B 0 before its F 0"},
        {"F0 F1 B0", "F0 B0 F1 B1", "stage 0 runs 2 forwards and 1 backwards of 2 micro-batches: one is left unfinished"},
        {"F0 F1 B0 B0", "F0 B0 F1 B1", "stage 0 runs B 0 twice"},
        {"F0 B0 F1 B1", "F1 F0 B0 B1", "a deadlock"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = fault_of(cases[i][0], cases[i][1]);
        if (cases[i][2][0] ? !strstr(got, cases[i][2]) : got[0] != 0)
            fail_msg("stage 0 \"%s\", stage 1 \"%s\": \"%s\", expected \"%s\"", cases[i][0], cases[i][1], got,
                     cases[i][2]);
        print_message("stage 0 \"%s\", stage 1 \"%s\": %s\n", cases[i][0], cases[i][1], got[0] ? got : "runs");
    }
}

// Each rank's first step in a --trace: the names of its compute spans F i
// and B i (every span of a pipeline stage's rank is one of them or another
// kind of span; the evaluation's forwards come after the step's 2m).
static int step_ops(json_t *events, int pid, int m, char out[][8]) {
    int n = 0;
    double last = -1;
    for (size_t k = 0; k < json_array_size(events) && n < 2 * m; k++) {
        json_t *e = json_array_get(events, k);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (json_integer_value(json_object_get(e, "pid")) != pid || !name || (name[0] != 'F' && name[0] != 'B') ||
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
    for (int k = 0; k < 2; k++)
        for (size_t h = 0; h < sizeof shapes / sizeof shapes[0]; h++) {
            int P = shapes[h][0], m = shapes[h][1];
            const char *name = k ? "afab" : "1f1b";
            char cmd[CMD_LEN], trace[256], json[256], *printed = NULL;
            snprintf(cmd, sizeof cmd, "./3d_parallel --pp %d --grad-accum %d --schedule %s --print-schedule", P, m, name);
            run_ok(cmd, &printed);
            snprintf(trace, sizeof trace, "%s/%s-%d-%d.trace.json", c->root, name, P, m);
            snprintf(json, sizeof json, "%s/%s-%d-%d.json", c->root, name, P, m);
            snprintf(cmd, sizeof cmd, "mpirun -np %d ./3d_parallel --model small --pp %d --grad-accum %d --schedule %s "
                     "--steps 1 --eval-every 0 --eval-batches 1 --quiet --trace %s --json %s", P, P, m, name, trace, json);
            char *rec = train(cmd, json);
            json_error_t e;
            json_t *tr = json_load_file(trace, 0, &e), *r = json_loads(rec, 0, &e);
            if (!tr || !r) fail_msg("%s: trace or record not JSON (%s)", cmd, e.text);
            json_t *events = json_is_array(tr) ? tr : json_object_get(tr, "traceEvents");
            json_t *ranks = json_object_get(json_object_get(r, "grid"), "ranks");
            ScheduleTable t;
            schedule_build(&t, k ? PIPE_AFAB : PIPE_1F1B, P, m);
            for (int s = 0; s < P; s++) {  // tp 1, dp 1: rank s is stage s
                char ops[64][8], want[8];
                int n = step_ops(events, s, m, ops);
                if (n != 2 * m) fail_msg("%s: rank %d ran %d forwards and backwards in its step, not %d", cmd, s, n, 2 * m);
                // the printed row: stage s's operations in the same order
                char label[32];
                snprintf(label, sizeof label, "stage %d | ", s);
                const char *line = strstr(printed, label);
                if (!line) fail_msg("--print-schedule printed no row for stage %d:\n%s", s, printed);
                line += strlen(label);
                for (int i = 0; i < n; i++) {
                    SchedOp o = t.ops[(size_t)s * 2 * m + (size_t)i];
                    snprintf(want, sizeof want, "%c%d", o.kind == SCHED_F ? 'F' : 'B', o.micro);
                    if (strcmp(ops[i], want))
                        fail_msg("%s: rank %d's operation %d is %s, its table's %s", cmd, s, i + 1, ops[i], want);
                    char tok[8];
                    int used;
                    while (sscanf(line, " %7s%n", tok, &used) == 1 && (tok[0] == '.' || tok[0] == '-')) line += used;
                    if (sscanf(line, " %7s%n", tok, &used) != 1 || strcmp(tok, want))
                        fail_msg("--print-schedule row %d: %s where the table has %s:\n%s", s, tok, want, printed);
                    line += used;
                }
                long measured = json_integer_value(json_object_get(json_array_get(ranks, (size_t)s), "peak_in_flight"));
                if (measured != schedule_in_flight(&t, s))
                    fail_msg("%s: stage %d held %ld micro-batches, its table %d", cmd, s, measured,
                             schedule_in_flight(&t, s));
            }
            print_message("%s P %d m %d: every rank ran its table's %d operations in order; in flight as the table\n",
                          name, P, m, 2 * m);
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
        cmocka_unit_test(test_runs_follow_their_tables),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
