// trainer_agree.c: every rank must run with the same settings. Ranks given
// different flags (mpirun -np 1 ./zero2 --steps 3 : -np 1 ./zero2 --steps 5)
// would call different collectives and wait for each other forever; so at
// start-up the ranks compare a hash of their effective settings (every
// flag's value, whatever its source), and where the hashes differ the
// lowest rank that differs from rank 0 names the first setting, in one line.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "trainer.h"

// "steps=3": one setting per line, the exact text of its value, whole
// (two --data paths may differ past any length a buffer would keep).
static char *settings_text(const Settings *s, size_t *len) {
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    CHECK(f, "settings: open_memstream failed; hint: the host is out of memory");
    for (int i = 0; i < s->n; i++) {
        const FlagSpec *flag = &s->item[i].flag;
        char number[64];
        const char *value = number;
        if (flag->type == FLAG_STRING) value = *(const char **)flag->dst ? *(const char **)flag->dst : "";
        else flags_value_text(flag, number, sizeof number);
        fprintf(f, "%s=%s\n", flag->name, value);
    }
    CHECK(fclose(f) == 0, "settings: the text could not be built; hint: the host is out of memory");
    return text;
}

// The first line of `mine` that rank 0's text lacks, as "--steps 5 where
// rank 0 has --steps 3" (msg, malloc'd, holds both lines whole).
static char *first_difference(const char *mine, const char *theirs, size_t n) {
    char *out = xcalloc(n, 1);
    while (*mine && *theirs) {
        size_t a = strcspn(mine, "\n"), b = strcspn(theirs, "\n");
        if (a != b || memcmp(mine, theirs, a) != 0) {
            const char *eq_a = memchr(mine, '=', a), *eq_b = memchr(theirs, '=', b);
            int name_len = (int)(eq_a - mine);
            snprintf(out, n, "--%.*s %.*s where rank 0 has --%.*s %.*s", name_len, mine, (int)(mine + a - eq_a - 1),
                     eq_a + 1, (int)(eq_b - theirs), theirs, (int)(theirs + b - eq_b - 1), eq_b + 1);
            return out;
        }
        mine += a + (mine[a] != 0);
        theirs += b + (theirs[b] != 0);
    }
    snprintf(out, n, "other flags than rank 0");
    return out;
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
    long theirs_len = (long)len, longest = (long)len;
    mpiCheck(MPI_Bcast(&theirs_len, 1, MPI_LONG, 0, w->mpi));
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &longest, 1, MPI_LONG, MPI_MAX, w->mpi));
    char *theirs = xcalloc((size_t)theirs_len + 1, 1);
    if (w->rank == 0) memcpy(theirs, text, len);
    mpiCheck(MPI_Bcast(theirs, (int)theirs_len, MPI_CHAR, 0, w->mpi));
    int differs = strcmp(text, theirs) != 0;
    // room for two whole lines (each at most the longest text) and the words
    size_t n = 2 * (size_t)longest + 256;
    char *what = first_difference(text, theirs, n), *msg = xcalloc(n + 256, 1);
    if (differs)
        snprintf(msg, n + 256, "the ranks were given different settings: rank %d has %s; give every rank the same "
                 "flags", w->rank, what);
    comm_first_failure(w, differs, msg, (int)(n + 256));
    fail_usage("%s", msg);
}
