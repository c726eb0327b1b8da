// ckpt_folder.c: what a --save folder may hold (see ckpt.h). A run saves
// into a new or empty folder, or into one that holds checkpoints of the same
// run, beside what saves leave there: `latest`, `lock`, and a killed save's
// step-N.partial folder and latest.tmp. Anything else is someone's: the run
// would write over their `latest` or `lock`, or make `--resume DIR` continue
// another run than the one they saved there, so it is refused before step 1.
//
// The same run, in the manifest's terms: the same model, seed, data (its
// tokens and checksum), global batch (rows of seq_len tokens) and settings
// of the update (ckpt_math_changes, the LR schedule's horizon among them).
// The stage, rank count and grid may differ: a resume at another one goes on
// with the same run.
#include "ckpt.h"
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"
#include "ckpt_manifest.h"
#include "out_file.h"

#define RULE "a run saves only into a new or empty folder, or one that holds checkpoints of the same run (the same " \
             "model, seed, data, global batch and settings of the update, whatever the stage, ranks or grid)"

// `name` is step-NNNNNNNN (8 digits, as ckpt_save names them), with `suffix` after it.
static int step_name(const char *name, const char *suffix) {
    if (strncmp(name, "step-", 5) != 0 || strlen(name) != 13 + strlen(suffix)) return 0;
    for (int i = 5; i < 13; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return strcmp(name + 13, suffix) == 0;
}

static int is_folder(const struct stat *st) { return S_ISDIR(st->st_mode); }
static int is_file(const struct stat *st) { return S_ISREG(st->st_mode); }

// `latest` as a save writes it: one line naming a step folder.
static int latest_of_a_save(const char *path) {
    const char *kind;
    FILE *f = in_file_open(path, &kind);
    char text[32] = "";
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    if (got != 14 || text[13] != '\n') return 0;
    text[13] = 0;
    return step_name(text, "");
}

// Whether DIR/name is one of the entries a save writes (lock is checked
// where it is taken: out_folder_lock).
static int written_by_a_save(const char *dir, const char *name, const struct stat *st) {
    char path[CKPT_PATH_BYTES];
    ckpt_pathf(path, "%s/%s", dir, name);
    if (strcmp(name, "lock") == 0) return 1;
    if (strcmp(name, "latest") == 0) return is_file(st) && latest_of_a_save(path);
    if (strcmp(name, "latest.tmp") == 0) return is_file(st);
    return is_folder(st) && (step_name(name, "") || step_name(name, ".partial"));
}

int ckpt_folder_only_saves(const char *dir, char *err, size_t err_len) {
    DIR *d = opendir(dir);
    if (!d) return 0;  // a new folder, or no folder: creating it says why
    int foreign = 0;
    for (struct dirent *e = readdir(d); e && !foreign; e = readdir(d)) {
        char path[CKPT_PATH_BYTES];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        ckpt_pathf(path, "%s/%s", dir, e->d_name);
        int known = lstat(path, &st) == 0;
        foreign = !known || !written_by_a_save(dir, e->d_name, &st);
        if (foreign)
            snprintf(err, err_len, "--save %s holds %s, which no save wrote (%s); %s: give --save another folder, "
                     "or move it away", dir, e->d_name, known && S_ISLNK(st.st_mode) ? "a symbolic link" : "not a "
                     "checkpoint", RULE);
    }
    closedir(d);
    return foreign;
}

// The manifest of step folder `step_dir`, parsed; 1 where it has none
// (a regular file) or it is damaged.
static int read_manifest(const char *step_dir, CkptManifest *m) {
    char path[CKPT_PATH_BYTES], msg[MSG_BYTES];
    const char *kind;
    ckpt_pathf(path, "%s/manifest.txt", step_dir);
    FILE *f = in_file_open(path, &kind);
    if (!f) return 1;
    size_t cap = 1 << 16;  // a manifest is 1 KB and a line per rank
    char *text = xmalloc(cap);
    size_t len = fread(text, 1, cap - 1, f);
    fclose(f);
    text[len] = 0;
    int bad = manifest_parse(text, step_dir, -1, m, NULL, msg);
    free(text);
    return bad;
}

static void model_text(const CkptManifest *m, char *out, size_t n) {
    snprintf(out, n, "L=%d C=%d H=%d V=%d context %d", m->cfg.num_layers, m->cfg.channels, m->cfg.num_heads,
             m->cfg.vocab_size, m->cfg.max_seq_len);
}

// "" when `got` is a checkpoint of the run `mine` describes, else how it differs ("seed 7 there, 1337 here").
static void how_they_differ(const CkptManifest *got, const CkptManifest *mine, char *why, size_t n) {
    char a[96], b[96], changes[512];
    CkptManifest same = *mine;
    // the horizon is the schedule's; a resumed run takes the saved one as --schedule-steps
    if (same.total_steps == got->total_steps) same.schedule_steps = got->schedule_steps;
    model_text(got, a, sizeof a);
    model_text(mine, b, sizeof b);
    why[0] = 0;
    if (strcmp(a, b) != 0)
        snprintf(why, n, "another model: %s there, %s here", a, b);
    else if (got->seed != mine->seed)
        snprintf(why, n, "another seed: %llu there, %llu here", (unsigned long long)got->seed,
                 (unsigned long long)mine->seed);
    else if (got->data_tokens != mine->data_tokens || got->data_checksum != mine->data_checksum)
        snprintf(why, n, "other data: %llu tokens there (%s), %llu here (%s)", (unsigned long long)got->data_tokens,
                 got->data, (unsigned long long)mine->data_tokens, mine->data);
    else if (ckpt_global_rows(got) != ckpt_global_rows(mine) || got->seq_len != mine->seq_len)
        snprintf(why, n, "another global batch: %ld rows of %d tokens there, %ld of %d here", ckpt_global_rows(got),
                 got->seq_len, ckpt_global_rows(mine), mine->seq_len);
    else if (ckpt_math_changes(got, &same, changes, sizeof changes))
        snprintf(why, n, "other settings of the update, there -> here: %s", changes);
}

int ckpt_folder_same_run(const char *dir, const CkptManifest *mine, char *err, size_t err_len) {
    DIR *d = opendir(dir);
    int other = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e && !other; e = readdir(d)) {
        char step_dir[CKPT_PATH_BYTES], why[1024];
        if (!step_name(e->d_name, "")) continue;
        ckpt_pathf(step_dir, "%s/%s", dir, e->d_name);
        CkptManifest got;
        if (read_manifest(step_dir, &got)) snprintf(why, sizeof why, "its manifest.txt is missing or damaged");
        else how_they_differ(&got, mine, why, sizeof why);
        other = why[0] != 0;
        if (other)
            snprintf(err, err_len, "--save %s holds %s, not a checkpoint of this run (%s); %s: give --save another "
                     "folder", dir, e->d_name, why, RULE);
    }
    if (d) closedir(d);
    return other;
}
