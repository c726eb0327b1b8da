// timeline.h: wall-clock intervals by row (compute, comm, copy, ...) and the
// two measures every overlap figure is made of: the length of a row's union
// within a window, and the length of the intersection of two rows' unions.
// Concurrent things are intervals, so "overlap" is the time both were
// happening, never a sum of durations that could exceed the window.
#pragma once
#include <stddef.h>

#define TIMELINE_ROWS 8

typedef struct Interval {
    double t0_us, t1_us;
} Interval;

typedef struct Timeline {
    Interval *iv[TIMELINE_ROWS];
    size_t n[TIMELINE_ROWS], cap[TIMELINE_ROWS];
} Timeline;

void timeline_add(Timeline *tl, int row, double t0_us, double t1_us);
// |∪ row| within [w0, w1)
double timeline_union_us(const Timeline *tl, int row, double w0_us, double w1_us);
// |(∪ row a) ∩ (∪ row b)| within [w0, w1); never more than either union
double timeline_overlap_us(const Timeline *tl, int a, int b, double w0_us, double w1_us);
// |(∪ row a) ∩ (∪ of the rows in mask, bit r for row r)| within [w0, w1)
double timeline_overlap_any_us(const Timeline *tl, int a, unsigned mask, double w0_us, double w1_us);
// Forgets the intervals that end before t (they cannot touch a later window).
void timeline_prune(Timeline *tl, double t_us);
void timeline_free(Timeline *tl);
