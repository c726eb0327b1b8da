// trainer_agree.c: every rank must run the same program with the same
// settings. Ranks given different flags (mpirun -np 1 ./zero2 --steps 3 :
// -np 1 ./zero2 --steps 5), or different stages (./dp_baseline : ./zero1),
// or two builds of one stage, would call different collectives and wait
// for each other forever; so at start-up the ranks compare a hash of what
// they run (the stage and its build) and of their effective settings (every
// flag's value, whatever its source), and where the hashes differ the
// lowest rank that differs from rank 0 names the first difference, in one
// line, whole.
#define _GNU_SOURCE  // dl_iterate_phdr
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "trainer.h"

#define PROGRAM "program"  // the first line's name: the stage and its build, not a flag

// The linker's build ID of the executable (its GNU build-id note, a hash of
// the linked program), its first 6 bytes in hex; "unknown" where it has none.
static int note_build_id(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    char *out = arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        const char *at = (const char *)(info->dlpi_addr + ph->p_vaddr), *end = at + ph->p_memsz;
        while (at + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *n = (const ElfW(Nhdr) *)at;
            const unsigned char *desc = (const unsigned char *)(at + sizeof *n + ((n->n_namesz + 3) & ~3u));
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && memcmp(at + sizeof *n, "GNU", 4) == 0) {
                for (unsigned k = 0; k < n->n_descsz && k < 6; k++) sprintf(out + 2 * k, "%02x", desc[k]);
                return 1;
            }
            at += sizeof *n + ((n->n_namesz + 3) & ~3u) + ((n->n_descsz + 3) & ~3u);
        }
    }
    return 1;  // the first object is the executable: stop there
}

static void build_id(char out[13]) {
    strcpy(out, "unknown");
    dl_iterate_phdr(note_build_id, out);
}

// "steps=3": one setting per line, the exact text of its value, whole
// (two --data paths may differ past any length a buffer would keep). The
// first line says what the rank runs: "program=zero2 (build 3e22537a89ab)".
static char *settings_text(const char *stage, const Settings *s, size_t *len) {
    char *text = NULL, build[13];
    FILE *f = open_memstream(&text, len);
    CHECK(f, "settings: open_memstream failed; hint: the host is out of memory");
    build_id(build);
    fprintf(f, PROGRAM "=%s (build %s)\n", stage, build);
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

// The first line of `mine` that rank 0's text lacks, as "rank 1 has
// --steps 5 where rank 0 has --steps 3; give every rank the same flags"
// (malloc'd, n bytes: room for both lines whole).
static char *first_difference(int rank, const char *mine, const char *theirs, size_t n) {
    char *out = xcalloc(n, 1);
    while (*mine && *theirs) {
        size_t a = strcspn(mine, "\n"), b = strcspn(theirs, "\n");
        if (a != b || memcmp(mine, theirs, a) != 0) {
            const char *eq_a = memchr(mine, '=', a), *eq_b = memchr(theirs, '=', b);
            int name_len = (int)(eq_a - mine), mine_len = (int)(mine + a - eq_a - 1),
                theirs_len = (int)(theirs + b - eq_b - 1);
            if (name_len == (int)strlen(PROGRAM) && memcmp(mine, PROGRAM, strlen(PROGRAM)) == 0)
                snprintf(out, n, "rank %d runs %.*s where rank 0 runs %.*s; start every rank with the same "
                         "trainer binary", rank, mine_len, eq_a + 1, theirs_len, eq_b + 1);
            else
                snprintf(out, n, "rank %d has --%.*s %.*s where rank 0 has --%.*s %.*s; give every rank the same "
                         "flags", rank, name_len, mine, mine_len, eq_a + 1, (int)(eq_b - theirs), theirs,
                         theirs_len, eq_b + 1);
            return out;
        }
        mine += a + (mine[a] != 0);
        theirs += b + (theirs[b] != 0);
    }
    snprintf(out, n, "rank %d has other flags than rank 0; give every rank the same flags", rank);
    return out;
}

void trainer_check_same_settings(Trainer *t) {
    Comm *w = &t->world;
    if (w->size == 1) return;
    size_t len;
    char *text = settings_text(t->strategy->name, &t->cfg.settings, &len);
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
    char *what = first_difference(w->rank, text, theirs, n), *msg = xcalloc(n + 256, 1);
    if (differs)
        snprintf(msg, n + 256, "the ranks were given different %s: %s",
                 strncmp(text, theirs, strcspn(text, "\n") + 1) ? "programs" : "settings", what);
    comm_first_failure(w, differs, msg, (int)(n + 256));
    fail_usage("%s", msg);
}
