// timeline.c: interval rows, their unions and intersections (see timeline.h).
#include "timeline.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"

void timeline_add(Timeline *tl, int row, double t0_us, double t1_us) {
    CHECK(row >= 0 && row < TIMELINE_ROWS, "timeline: no row %d", row);
    if (!(t1_us > t0_us)) return;  // empty intervals add nothing to a union
    if (tl->n[row] == tl->cap[row]) {
        size_t cap = tl->cap[row] ? 2 * tl->cap[row] : 256;
        Interval *grown = realloc(tl->iv[row], cap * sizeof *grown);
        CHECK(grown, "timeline: growing row %d to %zu intervals failed; hint: the host is out of memory", row, cap);
        tl->iv[row] = grown;
        tl->cap[row] = cap;
    }
    tl->iv[row][tl->n[row]++] = (Interval){t0_us, t1_us};
}

static int by_start(const void *a, const void *b) {
    double x = ((const Interval *)a)->t0_us, y = ((const Interval *)b)->t0_us;
    return (x > y) - (x < y);
}

// The intervals of the rows in `mask` clipped to [w0, w1), sorted and
// merged into disjoint ones; returns their number (the caller frees *out).
static size_t merged_rows(const Timeline *tl, unsigned mask, double w0, double w1, Interval **out) {
    size_t total = 1;
    for (int r = 0; r < TIMELINE_ROWS; r++)
        if (mask >> r & 1) total += tl->n[r];
    Interval *m = xmalloc(total * sizeof *m);
    size_t k = 0;
    for (int r = 0; r < TIMELINE_ROWS; r++) {
        if (!(mask >> r & 1)) continue;
        for (size_t i = 0; i < tl->n[r]; i++) {
            double a = tl->iv[r][i].t0_us > w0 ? tl->iv[r][i].t0_us : w0;
            double b = tl->iv[r][i].t1_us < w1 ? tl->iv[r][i].t1_us : w1;
            if (b > a) m[k++] = (Interval){a, b};
        }
    }
    qsort(m, k, sizeof *m, by_start);
    size_t d = 0;
    for (size_t i = 0; i < k; i++) {
        if (d > 0 && m[i].t0_us <= m[d - 1].t1_us) {
            if (m[i].t1_us > m[d - 1].t1_us) m[d - 1].t1_us = m[i].t1_us;
        } else {
            m[d++] = m[i];
        }
    }
    *out = m;
    return d;
}

static size_t merged(const Timeline *tl, int row, double w0, double w1, Interval **out) {
    CHECK(row >= 0 && row < TIMELINE_ROWS, "timeline: no row %d", row);
    return merged_rows(tl, 1u << row, w0, w1, out);
}

double timeline_union_us(const Timeline *tl, int row, double w0_us, double w1_us) {
    Interval *m;
    size_t n = merged(tl, row, w0_us, w1_us, &m);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += m[i].t1_us - m[i].t0_us;
    free(m);
    return sum;
}

double timeline_overlap_us(const Timeline *tl, int a, int b, double w0_us, double w1_us) {
    CHECK(b >= 0 && b < TIMELINE_ROWS, "timeline: no row %d", b);
    return timeline_overlap_any_us(tl, a, 1u << b, w0_us, w1_us);
}

double timeline_overlap_any_us(const Timeline *tl, int a, unsigned mask, double w0_us, double w1_us) {
    Interval *x, *y;
    size_t nx = merged(tl, a, w0_us, w1_us, &x), ny = merged_rows(tl, mask, w0_us, w1_us, &y);
    double sum = 0;
    // two sorted lists of disjoint intervals: walk both, adding each meeting
    for (size_t i = 0, j = 0; i < nx && j < ny;) {
        double lo = x[i].t0_us > y[j].t0_us ? x[i].t0_us : y[j].t0_us;
        double hi = x[i].t1_us < y[j].t1_us ? x[i].t1_us : y[j].t1_us;
        if (hi > lo) sum += hi - lo;
        if (x[i].t1_us < y[j].t1_us) i++;
        else j++;
    }
    free(x);
    free(y);
    return sum;
}

void timeline_prune(Timeline *tl, double t_us) {
    for (int r = 0; r < TIMELINE_ROWS; r++) {
        size_t k = 0;
        for (size_t i = 0; i < tl->n[r]; i++)
            if (tl->iv[r][i].t1_us >= t_us) tl->iv[r][k++] = tl->iv[r][i];
        tl->n[r] = k;
    }
}

void timeline_free(Timeline *tl) {
    for (int r = 0; r < TIMELINE_ROWS; r++) free(tl->iv[r]);
    memset(tl, 0, sizeof *tl);
}
