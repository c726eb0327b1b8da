// pipe_schedule.c: pipeline schedules as tables (see pipe_schedule.h).
#include "pipe_schedule.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"

static const char *const NAMES[] = {"afab", "1f1b", "interleaved", "zb-h1"};

const char *schedule_name(PipeSchedule s) { return s >= PIPE_AFAB && s <= PIPE_ZB_H1 ? NAMES[s] : "?"; }

int schedule_of(const char *name) {
    for (int s = PIPE_AFAB; s <= PIPE_ZB_H1; s++)
        if (strcmp(name, NAMES[s]) == 0) return s;
    return -1;
}

// Zero bubble splits the backward into B and W.
static int split(const ScheduleTable *t) { return t->schedule == PIPE_ZB_H1; }

// Slots an operation takes on the chart's clock.
static int cost(const ScheduleTable *t, SchedKind k) { return k == SCHED_B && !split(t) ? 2 : 1; }

static SchedOp *row(const ScheduleTable *t, int s) { return t->ops + (size_t)s * (size_t)t->per_stage; }

static void put(ScheduleTable *t, int s, SchedKind kind, int micro, int chunk) {
    CHECK(t->count[s] < t->per_stage, "schedule: stage %d has more than %d operations", s, t->per_stage);
    row(t, s)[t->count[s]++] = (SchedOp){kind, micro, chunk};
}

// The virtual stage of chunk c of stage s: the (c·P + s)-th piece of the
// model a micro-batch passes through.
static int virtual_stage(const ScheduleTable *t, int s, int c) { return c * t->stages + s; }

static char kind_letter(SchedKind k) { return k == SCHED_F ? 'F' : k == SCHED_B ? 'B' : 'W'; }

// "F3", or "F3.1" (chunk 1) when the stages hold several chunks
static void label(const ScheduleTable *t, SchedOp o, char *out, size_t n) {
    if (t->chunks > 1) snprintf(out, n, "%c%d.%d", kind_letter(o.kind), o.micro, o.chunk);
    else snprintf(out, n, "%c%d", kind_letter(o.kind), o.micro);
}

// ---- one function per schedule ----

// GPipe: every forward, then every backward, in micro-batch order.
static void build_afab(ScheduleTable *t, int s) {
    for (int i = 0; i < t->micro_batches; i++) put(t, s, SCHED_F, i, 0);
    for (int j = 0; j < t->micro_batches; j++) put(t, s, SCHED_B, j, 0);
}

// PipeDream-Flush: w = min(P - s - 1, m) warm-up forwards, then forward
// w + j and backward j in turn, then the last w backwards.
static void build_1f1b(ScheduleTable *t, int s) {
    int m = t->micro_batches, w = t->stages - s - 1 < m ? t->stages - s - 1 : m;
    for (int i = 0; i < w; i++) put(t, s, SCHED_F, i, 0);
    for (int j = 0; j < m - w; j++) {
        put(t, s, SCHED_F, w + j, 0);
        put(t, s, SCHED_B, j, 0);
    }
    for (int j = m - w; j < m; j++) put(t, s, SCHED_B, j, 0);
}

// LAB 07: build_interleaved -- the interleaved 1F1B table of stage s
// Megatron-LM's interleaved 1F1B: the k-th forward of a stage is
// micro-batch (k / Pv)·P + k mod P on chunk (k / P) mod v, so the chunks
// take turns by groups of P micro-batches; its k-th backward is the same
// micro-batch on chunk v - 1 - (k / P) mod v. 2(P - s - 1) + (v - 1)P
// warm-up forwards (at most m·v), then a forward and a backward in turn.
static int interleaved_micro(const ScheduleTable *t, int k) {
    int P = t->stages;
    return k / (P * t->chunks) * P + k % P;
}

static void build_interleaved(ScheduleTable *t, int s) {
    int P = t->stages, v = t->chunks, total = t->micro_batches * v;
    int warm = 2 * (P - s - 1) + (v - 1) * P;
    if (warm > total) warm = total;
    for (int k = 0; k < total; k++) {
        if (k >= warm) {  // the backward paired with this forward (none during the warm-up)
            int j = k - warm;
            put(t, s, SCHED_F, interleaved_micro(t, k), k / P % v);
            put(t, s, SCHED_B, interleaved_micro(t, j), v - 1 - j / P % v);
        } else {
            put(t, s, SCHED_F, interleaved_micro(t, k), k / P % v);
        }
    }
    for (int j = total - warm; j < total; j++) put(t, s, SCHED_B, interleaved_micro(t, j), v - 1 - j / P % v);
}
// LAB END

// LAB 07: build_zb_h1 -- the zero-bubble (ZB-H1) table of every stage
// ZB-H1 (Qi et al. 2024), built by playing the pipeline slot by slot. Each
// stage runs its F's and B's in 1F1B's order (the next is an F while fewer
// than min(P - s, m) micro-batches are forwarded and not yet through B,
// else a B), so the transfers between neighbours are 1F1B's; a stage that
// is free runs that next F or B once its input has ended (an F: the
// previous stage's F of it; a B: its own F and the next stage's B) and
// fewer than s + 1 micro-batches wait for their W; otherwise its oldest
// pending W (a slot 1F1B leaves idle); otherwise it idles. B, a slot
// where 1F1B's backward takes two, goes back down the pipeline sooner; the
// last stage, whose Bs come first, defers the most Ws. At most P - s
// micro-batches in flight (1F1B's) and s + 1 W stashes on stage s; the
// chart's bubble is the formula's (P-1)/(3m+P-1) (test_pipe_schedule).
static void build_zb_h1(ScheduleTable *t) {
    int P = t->stages, m = t->micro_batches;
    size_t cells = (size_t)P * (size_t)m;
    int *f_end = xmalloc(cells * sizeof(int)), *b_end = xmalloc(cells * sizeof(int));
    for (size_t k = 0; k < cells; k++) f_end[k] = b_end[k] = -1;
    int *nf = xcalloc((size_t)P, sizeof(int)), *nb = xcalloc((size_t)P, sizeof(int));
    int *nw = xcalloc((size_t)P, sizeof(int)), *free_at = xcalloc((size_t)P, sizeof(int));
    int left = 3 * m * P;
    // ended by `now`: an operation that has run and finished
#define ENDED(x) ((x) >= 0 && (x) <= now)
    for (int now = 0; left; now++) {
        CHECK(now <= 3 * m * P, "zb-h1: the pipeline stalled at slot %d", now);
        for (int s = 0; s < P; s++) {
            if (free_at[s] > now) continue;
            int limit = P - s < m ? P - s : m;
            int forward = nf[s] < m && nf[s] - nb[s] < limit;  // 1F1B's next operation
            int ready = forward ? s == 0 || ENDED(f_end[(size_t)(s - 1) * m + nf[s]])
                                : nb[s] < nf[s] && ENDED(f_end[(size_t)s * m + nb[s]]) &&
                                      (s == P - 1 || ENDED(b_end[(size_t)(s + 1) * m + nb[s]]));
            SchedKind kind;
            int i;
            if (ready && nb[s] - nw[s] < s + 1 && forward) {
                kind = SCHED_F, i = nf[s]++;
                f_end[(size_t)s * m + i] = now + 1;
            } else if (ready && nb[s] - nw[s] < s + 1) {
                kind = SCHED_B, i = nb[s]++;
                b_end[(size_t)s * m + i] = now + 1;
            } else if (nw[s] < nb[s]) {
                kind = SCHED_W, i = nw[s]++;
            } else {
                continue;
            }
            put(t, s, kind, i, 0);
            free_at[s] = now + 1;
            left--;
        }
    }
#undef ENDED
    free(f_end);
    free(b_end);
    free(nf);
    free(nb);
    free(nw);
    free(free_at);
}
// LAB END

void schedule_alloc(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches, int chunks) {
    if (stages < 1 || micro_batches < 1 || chunks < 1)
        fail_usage("a pipeline schedule needs at least one stage, one micro-batch and one chunk per stage (here --pp "
                   "%d, %d micro-batches, %d chunks)", stages, micro_batches, chunks);
    *t = (ScheduleTable){.schedule = schedule, .stages = stages, .micro_batches = micro_batches, .chunks = chunks};
    t->per_stage = 3 * micro_batches * chunks;
    t->ops = xcalloc((size_t)stages * (size_t)t->per_stage, sizeof *t->ops);
    t->count = xcalloc((size_t)stages, sizeof *t->count);
}

void schedule_build(ScheduleTable *t, PipeSchedule schedule, int stages, int micro_batches, int chunks) {
    if (schedule == PIPE_INTERLEAVED && chunks < 2)
        fail_usage("the interleaved schedule gives every stage several chunks of layers: give --virtual-stages 2 or "
                   "more");
    if (schedule != PIPE_INTERLEAVED && chunks != 1)
        fail_usage("--virtual-stages %d: only the interleaved schedule cuts a stage into chunks (here %s)", chunks,
                   schedule_name(schedule));
    if (schedule == PIPE_INTERLEAVED && micro_batches % stages)
        fail_usage("the interleaved schedule runs the micro-batches by groups of --pp %d: %d micro-batches are not a "
                   "multiple of it; give a --grad-accum that is", stages, micro_batches);
    if (schedule == PIPE_ZB_H1 && stages < 2)
        fail_usage("--schedule zb-h1 fills a pipeline's bubble with the weights' gradients: it needs --pp 2 or more");
    schedule_alloc(t, schedule, stages, micro_batches, chunks);
    if (schedule == PIPE_ZB_H1) build_zb_h1(t);
    for (int s = 0; s < stages && schedule != PIPE_ZB_H1; s++) {
        if (schedule == PIPE_AFAB) build_afab(t, s);
        else if (schedule == PIPE_1F1B) build_1f1b(t, s);
        else build_interleaved(t, s);
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

// When each (virtual stage, micro-batch)'s operations end on the chart's
// clock (-1: not run), and when each stage starts its operations.
typedef struct Run {
    int *f_end, *b_end, *w_end;  // [virtual stage * m + i]
    int *start;                  // [s * per_stage + k]: operation k of stage s
    int end;                     // the last operation's end
} Run;

static int *end_of(const Run *r, const ScheduleTable *t, SchedKind k, int vs, int i) {
    int *a = k == SCHED_F ? r->f_end : k == SCHED_B ? r->b_end : r->w_end;
    return a + (size_t)vs * (size_t)t->micro_batches + (size_t)i;
}

// Every stage runs each of its kinds on every micro-batch and chunk once.
static int check_counts(const ScheduleTable *t, Run *r, char *err, size_t n) {
    int m = t->micro_batches, v = t->chunks;
    for (int s = 0; s < t->stages; s++) {
        int seen[3] = {0, 0, 0};
        for (int k = 0; k < t->count[s]; k++) {
            SchedOp o = row(t, s)[k];
            char what[24];
            label(t, o, what, sizeof what);
            if (o.micro < 0 || o.micro >= m || o.chunk < 0 || o.chunk >= v) {
                snprintf(err, n, "stage %d runs %s: micro-batches 0 to %d, chunks 0 to %d", s, what, m - 1, v - 1);
                return 1;
            }
            if (o.kind == SCHED_W && !split(t)) {
                snprintf(err, n, "stage %d runs %s, but %s does not split the backward", s, what,
                         schedule_name(t->schedule));
                return 1;
            }
            int *e = end_of(r, t, o.kind, virtual_stage(t, s, o.chunk), o.micro);
            if (*e == -2) {
                snprintf(err, n, "stage %d runs %s twice", s, what);
                return 1;
            }
            *e = -2;
            seen[o.kind]++;
        }
        int want = m * v;
        if (seen[SCHED_F] != want || seen[SCHED_B] != want || seen[SCHED_W] != (split(t) ? want : 0)) {
            snprintf(err, n, "stage %d runs %d forwards, %d backwards and %d weight gradients of %d micro-batches x %d "
                     "chunks: one is left unfinished", s, seen[SCHED_F], seen[SCHED_B], seen[SCHED_W], m, v);
            return 1;
        }
    }
    return 0;
}

// When operation o of stage s may start: what it needs has ended; -1: not yet.
static int ready_at(const ScheduleTable *t, const Run *r, int s, SchedOp o) {
    int vs = virtual_stage(t, s, o.chunk), last = t->stages * t->chunks - 1;
    if (o.kind == SCHED_F) return vs == 0 ? 0 : *end_of(r, t, SCHED_F, vs - 1, o.micro);
    if (o.kind == SCHED_W) return *end_of(r, t, SCHED_B, vs, o.micro);
    int own = *end_of(r, t, SCHED_F, vs, o.micro), next = vs == last ? 0 : *end_of(r, t, SCHED_B, vs + 1, o.micro);
    return own < 0 || next < 0 ? -1 : own > next ? own : next;
}

// The fault of a table that stopped: an operation before its own
// prerequisite on the same stage, or else stages waiting on each other.
static void name_fault(const ScheduleTable *t, const Run *r, const int *pc, char *err, size_t n) {
    int stuck = -1;
    for (int s = 0; s < t->stages; s++) {
        if (pc[s] == t->count[s]) continue;
        SchedOp o = row(t, s)[pc[s]];
        int vs = virtual_stage(t, s, o.chunk);
        char what[24], before[24];
        label(t, o, what, sizeof what);
        SchedOp own = o;
        own.kind = o.kind == SCHED_W ? SCHED_B : SCHED_F;
        label(t, own, before, sizeof before);
        if ((o.kind == SCHED_B && *end_of(r, t, SCHED_F, vs, o.micro) < 0) ||
            (o.kind == SCHED_W && *end_of(r, t, SCHED_B, vs, o.micro) < 0)) {
            snprintf(err, n, "stage %d runs %s before its %s", s, what, before);
            return;
        }
        if (stuck < 0) stuck = s;
    }
    SchedOp o = row(t, stuck)[pc[stuck]];
    int vs = virtual_stage(t, stuck, o.chunk), P = t->stages;
    int from = (o.kind == SCHED_F ? vs - 1 : vs + 1) % P;
    char what[24], theirs[24];
    label(t, o, what, sizeof what);
    label(t, row(t, from)[pc[from]], theirs, sizeof theirs);
    snprintf(err, n, "stage %d waits at %s for stage %d, which waits at %s: a deadlock", stuck, what, from, theirs);
}

static int run_table(const ScheduleTable *t, Run *r, char *err, size_t n) {
    int P = t->stages;
    size_t cells = (size_t)P * (size_t)t->chunks * (size_t)t->micro_batches;
    r->f_end = xmalloc(cells * sizeof(int));
    r->b_end = xmalloc(cells * sizeof(int));
    r->w_end = xmalloc(cells * sizeof(int));
    r->start = xmalloc((size_t)P * (size_t)t->per_stage * sizeof(int));
    r->end = 0;
    for (size_t k = 0; k < cells; k++) r->f_end[k] = r->b_end[k] = r->w_end[k] = -1;
    if (check_counts(t, r, err, n)) return 1;
    for (size_t k = 0; k < cells; k++) r->f_end[k] = r->b_end[k] = r->w_end[k] = -1;
    int *pc = xcalloc((size_t)P, sizeof(int)), *free_at = xcalloc((size_t)P, sizeof(int)), left = 0;
    for (int s = 0; s < P; s++) left += t->count[s];
    for (int progress = 1; progress && left;) {
        progress = 0;
        for (int s = 0; s < P; s++) {
            if (pc[s] == t->count[s]) continue;
            SchedOp o = row(t, s)[pc[s]];
            int ready = ready_at(t, r, s, o);
            if (ready < 0) continue;
            int start = ready > free_at[s] ? ready : free_at[s], end = start + cost(t, o.kind);
            r->start[(size_t)s * t->per_stage + pc[s]] = start;
            *end_of(r, t, o.kind, virtual_stage(t, s, o.chunk), o.micro) = end;
            free_at[s] = end;
            if (end > r->end) r->end = end;
            pc[s]++, left--, progress = 1;
        }
    }
    if (left) name_fault(t, r, pc, err, n);
    free(pc);
    free(free_at);
    return left > 0;
}

static void run_free(Run *r) {
    free(r->f_end);
    free(r->b_end);
    free(r->w_end);
    free(r->start);
}

int schedule_check(const ScheduleTable *t, char *err, size_t n) {
    Run r;
    int bad = run_table(t, &r, err, n);
    run_free(&r);
    return bad;
}

// The most of stage s's operations of kind `up` not yet followed by their `down`.
static int most_between(const ScheduleTable *t, int s, SchedKind up, SchedKind down) {
    int now = 0, most = 0;
    for (int k = 0; k < t->count[s]; k++) {
        SchedKind kind = row(t, s)[k].kind;
        now += kind == up ? 1 : kind == down ? -1 : 0;
        if (now > most) most = now;
    }
    return most;
}

int schedule_in_flight(const ScheduleTable *t, int s) { return most_between(t, s, SCHED_F, SCHED_B); }

int schedule_slots(const ScheduleTable *t, int s) {
    int now = 0, most = 0;
    for (int k = 0; k < t->count[s]; k++) {
        SchedOp o = schedule_op(t, s, k);
        if (o.chunk != 0 || o.kind == SCHED_W) continue;
        now += o.kind == SCHED_F ? 1 : -1;
        if (now > most) most = now;
    }
    return most > 0 ? most : 1;
}

int schedule_pending_w(const ScheduleTable *t, int s) { return split(t) ? most_between(t, s, SCHED_B, SCHED_W) : 0; }

double schedule_bubble(const ScheduleTable *t) {
    Run r;
    char err[256];
    CHECK(!run_table(t, &r, err, sizeof err), "schedule_bubble: %s", err);
    double busy = (double)t->micro_batches * t->chunks * 3, idle = 0;  // F 1 + B 2, or F, B and W 1 each
    for (int s = 0; s < t->stages; s++) idle += 1.0 - busy / r.end;
    run_free(&r);
    return idle / t->stages;
}

double schedule_bubble_formula(const ScheduleTable *t) {
    double P = t->stages, m = t->micro_batches;
    if (t->schedule == PIPE_INTERLEAVED) return (P - 1) / (t->chunks * m + P - 1);
    if (t->schedule == PIPE_ZB_H1) return (P - 1) / (3 * m + P - 1);
    return (P - 1) / (m + P - 1);
}

static const char *formula_text(const ScheduleTable *t) {
    if (t->schedule == PIPE_INTERLEAVED) return "(P-1)/(v·m+P-1)";
    if (t->schedule == PIPE_ZB_H1) return "(P-1)/(3m+P-1)";
    return "(P-1)/(m+P-1)";
}

static const char *clock_text(const ScheduleTable *t) {
    if (t->schedule == PIPE_INTERLEAVED)
        return "one slot: a forward F i.c of micro-batch i through the stage's chunk c; a backward B i.c takes two";
    if (t->schedule == PIPE_ZB_H1)
        return "one slot each: a forward F i, the input's gradient B i and the weights' W i";
    return "one slot: a forward F i; a backward B i takes two";
}

void schedule_print(const ScheduleTable *t, FILE *f) {
    Run r;
    char err[256];
    CHECK(!run_table(t, &r, err, sizeof err), "schedule_print: %s", err);
    int P = t->stages, m = t->micro_batches;
    char widest[24];
    label(t, (SchedOp){SCHED_F, m - 1, t->chunks - 1}, widest, sizeof widest);
    int w = (int)strlen(widest) + 1;  // a slot's width
    fprintf(f, "%s schedule, P = %d stages, m = %d micro-batches", schedule_name(t->schedule), P, m);
    if (t->chunks > 1) fprintf(f, ", v = %d chunks per stage", t->chunks);
    fprintf(f, " (%s; . idle; time runs right)\n", clock_text(t));
    char *line = xmalloc((size_t)r.end * (size_t)w + 1);
    for (int s = 0; s < P; s++) {
        for (int k = 0; k < r.end; k++) snprintf(line + (size_t)k * w, (size_t)w + 1, "%-*s", w, ".");
        for (int k = 0; k < t->count[s]; k++) {
            SchedOp o = row(t, s)[k];
            int at = r.start[(size_t)s * t->per_stage + k];
            char cell[24];
            label(t, o, cell, sizeof cell);
            memcpy(line + (size_t)at * w, cell, strlen(cell));
            for (int c = (int)strlen(cell); c < w; c++) line[(size_t)at * w + c] = ' ';
            for (int slot = 1; slot < cost(t, o.kind); slot++)
                for (int c = 0; c < w; c++) line[(size_t)(at + slot) * w + c] = c < w - 1 ? '-' : ' ';
        }
        size_t len = (size_t)r.end * w;
        while (len && line[len - 1] == ' ') len--;  // no trailing spaces
        line[len] = 0;
        fprintf(f, "stage %d | %s\n", s, line);
    }
    free(line);
    fprintf(f, "in flight at most:");
    for (int s = 0; s < P; s++) fprintf(f, " stage %d %d%s", s, schedule_in_flight(t, s), s < P - 1 ? "," : "");
    if (split(t)) {
        fprintf(f, "; W pending at most:");
        for (int s = 0; s < P; s++) fprintf(f, " stage %d %d%s", s, schedule_pending_w(t, s), s < P - 1 ? "," : "");
    }
    fprintf(f, "; bubble %.3f on this chart, formula %s = %.3f\n", schedule_bubble(t), formula_text(t),
            schedule_bubble_formula(t));
    run_free(&r);
}
