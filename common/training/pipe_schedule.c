// pipe_schedule.c: pipeline schedules as tables (see pipe_schedule.h).
#include "pipe_schedule.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define COST_F 1
#define COST_B 2

static SchedOp *row(const ScheduleTable *t, int s) { return t->ops + (size_t)s * 2 * t->micro_batches; }

static void put(ScheduleTable *t, int s, SchedKind kind, int micro) {
    CHECK(t->count[s] < 2 * t->micro_batches, "schedule: stage %d has more than 2m operations", s);
    row(t, s)[t->count[s]++] = (SchedOp){kind, micro};
}

// GPipe: every forward, then every backward, in micro-batch order.
static void build_afab(ScheduleTable *t, int s) {
    for (int i = 0; i < t->micro_batches; i++) put(t, s, SCHED_F, i);
    for (int j = 0; j < t->micro_batches; j++) put(t, s, SCHED_B, j);
}

// PipeDream-Flush: w = min(P - s - 1, m) warm-up forwards, then forward
// w + j and backward j in turn, then the last w backwards.
static void build_1f1b(ScheduleTable *t, int s) {
    int m = t->micro_batches, w = t->stages - s - 1 < m ? t->stages - s - 1 : m;
    for (int i = 0; i < w; i++) put(t, s, SCHED_F, i);
    for (int j = 0; j < m - w; j++) {
        put(t, s, SCHED_F, w + j);
        put(t, s, SCHED_B, j);
    }
    for (int j = m - w; j < m; j++) put(t, s, SCHED_B, j);
}

void schedule_alloc(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches) {
    if (stages < 1 || micro_batches < 1)
        fail_usage("a pipeline schedule needs at least one stage and one micro-batch (here --pp %d, %d micro-batches)",
                   stages, micro_batches);
    *t = (ScheduleTable){.schedule = schedule, .stages = stages, .micro_batches = micro_batches};
    t->ops = xcalloc((size_t)stages * 2 * (size_t)micro_batches, sizeof *t->ops);
    t->count = xcalloc((size_t)stages, sizeof *t->count);
}

void schedule_build(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches) {
    schedule_alloc(t, schedule, stages, micro_batches);
    for (int s = 0; s < stages; s++) {
        if (schedule == PIPE_AFAB) build_afab(t, s);
        else build_1f1b(t, s);
    }
    char err[256];
    if (schedule_check(t, err, sizeof err)) fail_usage("pipeline schedule refused: %s", err);
}

void schedule_free(ScheduleTable *t) {
    free(t->ops);
    free(t->count);
    memset(t, 0, sizeof *t);
}

// ---- running the table on a model of the pipeline ----

// When each stage's operations end on the chart's clock (-1: not run), and
// when each stage starts them.
typedef struct Run {
    int *f_end, *b_end;  // [s * m + i]
    int *start;          // [s * 2m + k]: operation k of stage s
    int end;             // the last operation's end
} Run;

static int run_table(const ScheduleTable *t, Run *r, char *err, size_t n) {
    int P = t->stages, m = t->micro_batches;
    size_t cells = (size_t)P * (size_t)m;
    r->f_end = xmalloc(cells * sizeof(int));
    r->b_end = xmalloc(cells * sizeof(int));
    r->start = xmalloc(2 * cells * sizeof(int));
    r->end = 0;
    for (size_t k = 0; k < cells; k++) r->f_end[k] = r->b_end[k] = -1;
    // every stage runs F i and B i of every micro-batch once
    for (int s = 0; s < P; s++) {
        int fs = 0, bs = 0;
        for (int k = 0; k < t->count[s]; k++) {
            SchedOp o = row(t, s)[k];
            if (o.micro < 0 || o.micro >= m) {
                snprintf(err, n, "stage %d runs micro-batch %d of %d", s, o.micro, m);
                return 1;
            }
            int *seen = o.kind == SCHED_F ? &r->f_end[(size_t)s * m + o.micro] : &r->b_end[(size_t)s * m + o.micro];
            if (*seen == -2) {
                snprintf(err, n, "stage %d runs %c %d twice", s, o.kind == SCHED_F ? 'F' : 'B', o.micro);
                return 1;
            }
            *seen = -2;
            fs += o.kind == SCHED_F, bs += o.kind == SCHED_B;
        }
        if (fs != m || bs != m) {
            snprintf(err, n, "stage %d runs %d forwards and %d backwards of %d micro-batches: one is left unfinished",
                     s, fs, bs, m);
            return 1;
        }
    }
    for (size_t k = 0; k < cells; k++) r->f_end[k] = r->b_end[k] = -1;
    int *pc = xcalloc((size_t)P, sizeof(int)), *free_at = xcalloc((size_t)P, sizeof(int)), left = 2 * m * P;
    for (int progress = 1; progress && left;) {
        progress = 0;
        for (int s = 0; s < P; s++) {
            if (pc[s] == t->count[s]) continue;
            SchedOp o = row(t, s)[pc[s]];
            int ready;  // when what it needs has arrived; -1: not yet
            if (o.kind == SCHED_F) {
                ready = s == 0 ? 0 : r->f_end[(size_t)(s - 1) * m + o.micro];
            } else {
                int own = r->f_end[(size_t)s * m + o.micro];
                int next = s == P - 1 ? 0 : r->b_end[(size_t)(s + 1) * m + o.micro];
                ready = own < 0 || next < 0 ? -1 : own > next ? own : next;
            }
            if (ready < 0) continue;
            int start = ready > free_at[s] ? ready : free_at[s], end = start + (o.kind == SCHED_F ? COST_F : COST_B);
            r->start[(size_t)s * 2 * m + pc[s]] = start;
            (o.kind == SCHED_F ? r->f_end : r->b_end)[(size_t)s * m + o.micro] = end;
            free_at[s] = end;
            if (end > r->end) r->end = end;
            pc[s]++, left--, progress = 1;
        }
    }
    // the fault: a backward before its own forward, or else stages waiting on each other
    int stuck = -1, early = -1;
    for (int s = 0; s < P; s++) {
        if (pc[s] == t->count[s]) continue;
        SchedOp o = row(t, s)[pc[s]];
        if (stuck < 0) stuck = s;
        if (early < 0 && o.kind == SCHED_B && r->f_end[(size_t)s * m + o.micro] < 0) early = s;
    }
    if (early >= 0) {
        SchedOp o = row(t, early)[pc[early]];
        snprintf(err, n, "stage %d runs B %d before its F %d", early, o.micro, o.micro);
    } else if (stuck >= 0) {
        SchedOp o = row(t, stuck)[pc[stuck]];
        int from = o.kind == SCHED_F ? stuck - 1 : stuck + 1;
        SchedOp theirs = row(t, from)[pc[from]];
        snprintf(err, n, "stage %d waits at %c %d for stage %d, which waits at %c %d: a deadlock", stuck,
                 o.kind == SCHED_F ? 'F' : 'B', o.micro, from, theirs.kind == SCHED_F ? 'F' : 'B', theirs.micro);
    }
    free(pc);
    free(free_at);
    return stuck >= 0;
}

static void run_free(Run *r) {
    free(r->f_end);
    free(r->b_end);
    free(r->start);
}

int schedule_check(const ScheduleTable *t, char *err, size_t n) {
    Run r;
    int bad = run_table(t, &r, err, n);
    run_free(&r);
    return bad;
}

int schedule_in_flight(const ScheduleTable *t, int s) {
    int now = 0, most = 0;
    for (int k = 0; k < t->count[s]; k++) {
        now += row(t, s)[k].kind == SCHED_F ? 1 : -1;
        if (now > most) most = now;
    }
    return most;
}

double schedule_bubble(const ScheduleTable *t) {
    Run r;
    char err[256];
    CHECK(!run_table(t, &r, err, sizeof err), "schedule_bubble: %s", err);
    double busy = (double)t->micro_batches * (COST_F + COST_B), idle = 0;
    for (int s = 0; s < t->stages; s++) idle += 1.0 - busy / r.end;
    run_free(&r);
    return idle / t->stages;
}

void schedule_print(const ScheduleTable *t, FILE *f) {
    Run r;
    char err[256];
    CHECK(!run_table(t, &r, err, sizeof err), "schedule_print: %s", err);
    int P = t->stages, m = t->micro_batches;
    int w = snprintf(NULL, 0, "F%d", m - 1) + 1;  // a slot's width
    fprintf(f, "%s schedule, P = %d stages, m = %d micro-batches (one slot: a forward F i; a backward B i takes two; "
            ". idle; time runs right)\n", t->schedule == PIPE_AFAB ? "afab" : "1f1b", P, m);
    char *line = xmalloc((size_t)r.end * (size_t)w + 1);
    for (int s = 0; s < P; s++) {
        for (int k = 0; k < r.end; k++) snprintf(line + (size_t)k * w, (size_t)w + 1, "%-*s", w, ".");
        for (int k = 0; k < t->count[s]; k++) {
            SchedOp o = row(t, s)[k];
            int at = r.start[(size_t)s * 2 * m + k];
            char cell[24];
            snprintf(cell, sizeof cell, "%c%d", o.kind == SCHED_F ? 'F' : 'B', o.micro);
            memcpy(line + (size_t)at * w, cell, strlen(cell));
            for (int c = (int)strlen(cell); c < w; c++) line[(size_t)at * w + c] = ' ';
            if (o.kind == SCHED_B)
                for (int c = 0; c < w; c++) line[(size_t)(at + 1) * w + c] = c < w - 1 ? '-' : ' ';
        }
        size_t len = (size_t)r.end * w;
        while (len && line[len - 1] == ' ') len--;  // no trailing spaces
        line[len] = 0;
        fprintf(f, "stage %d | %s\n", s, line);
    }
    free(line);
    fprintf(f, "in flight at most:");
    for (int s = 0; s < P; s++) fprintf(f, " stage %d %d%s", s, schedule_in_flight(t, s), s < P - 1 ? "," : "");
    fprintf(f, "; bubble %.3f on this chart, formula (P-1)/(m+P-1) = %.3f\n", schedule_bubble(t),
            (double)(P - 1) / (m + P - 1));
    run_free(&r);
}
