// trainer_agree.c: every rank must run with the same settings. Ranks given
// different flags (mpirun -np 1 ./zero2 --steps 3 : -np 1 ./zero2 --steps 5)
// would call different collectives and wait for each other forever; so at
// start-up the ranks compare a hash of their effective settings (every
// flag's value, whatever its source), and where the hashes differ the
// lowest rank that differs from rank 0 names the first setting, in one line.
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "trainer.h"

#define LINE_LEN 320

// "steps=3": one setting per line, the exact text of its value.
static char *settings_text(const Settings *s, size_t *len) {
    size_t cap = (size_t)s->n * LINE_LEN + 1, at = 0;
    char *text = xcalloc(cap, 1);
    for (int i = 0; i < s->n; i++) {
        char value[LINE_LEN - 64];
        flags_value_text(&s->item[i].flag, value, sizeof value);
        at += (size_t)snprintf(text + at, cap - at, "%.60s=%s\n", s->item[i].flag.name, value);
    }
    *len = at;
    return text;
}

// The first line of `mine` that rank 0's text lacks, as "--steps 5 where
// rank 0 has --steps 3".
static void first_difference(const char *mine, const char *theirs, char *out, size_t n) {
    while (*mine && *theirs) {
        size_t a = strcspn(mine, "\n"), b = strcspn(theirs, "\n");
        if (a != b || memcmp(mine, theirs, a) != 0) {
            const char *eq_a = memchr(mine, '=', a), *eq_b = memchr(theirs, '=', b);
            int name_len = (int)(eq_a - mine);
            snprintf(out, n, "--%.*s %.*s where rank 0 has --%.*s %.*s", name_len, mine, (int)(mine + a - eq_a - 1),
                     eq_a + 1, (int)(eq_b - theirs), theirs, (int)(theirs + b - eq_b - 1), eq_b + 1);
            return;
        }
        mine += a + (mine[a] != 0);
        theirs += b + (theirs[b] != 0);
    }
    snprintf(out, n, "other flags than rank 0");
}

void trainer_check_same_settings(Trainer *t) {
    Comm *w = &t->world;
    if (w->size == 1) return;
    size_t len;
    char *text = settings_text(&t->cfg.settings, &len);
    uint64_t hash = fnv1a64(text, len, 14695981039346656037ull), lo, hi;
    mpiCheck(MPI_Allreduce(&hash, &lo, 1, MPI_UINT64_T, MPI_MIN, w->mpi));
    mpiCheck(MPI_Allreduce(&hash, &hi, 1, MPI_UINT64_T, MPI_MAX, w->mpi));
    if (lo == hi) {
        free(text);
        return;
    }
    // they differ: rank 0's text to all, and the first rank that differs says how
    long theirs_len = (long)len;
    mpiCheck(MPI_Bcast(&theirs_len, 1, MPI_LONG, 0, w->mpi));
    char *theirs = xcalloc((size_t)theirs_len + 1, 1);
    if (w->rank == 0) memcpy(theirs, text, len);
    mpiCheck(MPI_Bcast(theirs, (int)theirs_len, MPI_CHAR, 0, w->mpi));
    int differs = strcmp(text, theirs) != 0;
    char what[LINE_LEN * 2] = "", msg[LINE_LEN * 3] = "";
    if (differs) {
        first_difference(text, theirs, what, sizeof what);
        snprintf(msg, sizeof msg, "the ranks were given different settings: rank %d has %s; give every rank the "
                 "same flags", w->rank, what);
    }
    comm_first_failure(w, differs, msg, sizeof msg);
    fail_usage("%s", msg);
}
