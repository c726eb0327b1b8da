// trainer_outputs.c: the files a run writes are checked before step 1, so a
// run cannot end by failing to write what it was run for, nor write over
// what is not its own: --json, --trace and --memory-timeline must be regular files or new names
// that can be created (rank 0 writes them; out_file.h), no two outputs may
// name one file, none may lie inside the --resume checkpoint nor be, under
// another name (a hard link), a file the run reads, and the --save
// folder is created and locked for the run (ckpt_lock), which every rank then
// checks it can write into.
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "out_file.h"
#include "trainer.h"

#define MSG_LEN OUT_MSG_BYTES
#define MAX_OUTPUTS 5

typedef struct Output {
    const char *flag, *path;
    char resolved[4096];
} Output;

// Two outputs naming one file (after resolving the folders) would write over
// each other, and a file inside the --save folder over a checkpoint's.
static int outputs_overlap(const TrainConfig *c, char *msg) {
    Output out[MAX_OUTPUTS] = {{"--json", c->json, ""}, {"--trace", c->trace, ""},
                               {"--memory-timeline", c->memory_timeline, ""},
                               {"--export-llmc", c->export_llmc, ""}, {"--save", c->save, ""}};
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (out[i].path) out_file_resolve(out[i].path, out[i].resolved, sizeof out[i].resolved);
    for (int i = 0; i < MAX_OUTPUTS; i++)
        for (int j = i + 1; j < MAX_OUTPUTS && out[i].path; j++) {
            if (!out[j].path) continue;
            size_t n = strlen(out[j].resolved);
            int same = strcmp(out[i].resolved, out[j].resolved) == 0;
            int inside = !same && strncmp(out[i].resolved, out[j].resolved, n) == 0 && out[i].resolved[n] == '/';
            if (same)
                return snprintf(msg, MSG_LEN, "%s %s and %s %s name the same file; give each output its own file",
                                out[i].flag, out[i].path, out[j].flag, out[j].path), 1;
            if (inside && strcmp(out[j].flag, "--save") == 0)
                return snprintf(msg, MSG_LEN, "%s %s is inside the checkpoint folder (%s %s); give it a path of "
                                "its own", out[i].flag, out[i].path, out[j].flag, out[j].path), 1;
        }
    return 0;
}

// An output inside the checkpoint folder this run resumes from would write
// over what it read (--json R/latest appends to `latest`, --export-llmc over
// a part). --save may be that folder itself (the run goes on saving where it
// resumed: its steps are new ones), never a folder inside it.
static int inside_resume(const TrainConfig *c, char *msg) {
    if (!c->resume) return 0;
    char root[4096], save[4096];
    ckpt_root(c->resume, root, sizeof root);
    const char *flags[] = {"--json", "--trace", "--memory-timeline", "--export-llmc"};
    const char *paths[] = {c->json, c->trace, c->memory_timeline, c->export_llmc};
    for (int i = 0; i < 4; i++) {
        char resolved[4096];
        if (!paths[i]) continue;
        out_file_resolve(paths[i], resolved, sizeof resolved);
        if (out_path_within(resolved, root))
            return snprintf(msg, MSG_LEN, "%s %s is inside the checkpoint folder this run resumes from (--resume %s); "
                            "give it a path of its own", flags[i], paths[i], c->resume), 1;
    }
    if (!c->save) return 0;
    if (!realpath(c->save, save)) out_file_resolve(c->save, save, sizeof save);
    if (strcmp(save, root) != 0 && out_path_within(save, root))
        return snprintf(msg, MSG_LEN, "--save %s is inside the checkpoint folder this run resumes from (--resume %s); "
                        "save into that folder itself or one outside it", c->save, c->resume), 1;
    return 0;
}

// Whether `path`, or a file in it down to `depth` folders, is the file `out`
// (its device and inode: a hard link is one file under two names); its name
// into `found`. Links are followed, as the run reads through them.
static int holds_file(const char *path, int depth, const struct stat *out, char *found, size_t n) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (S_ISREG(st.st_mode) && st.st_dev == out->st_dev && st.st_ino == out->st_ino)
        return snprintf(found, n, "%s", path), 1;
    DIR *d = S_ISDIR(st.st_mode) && depth > 0 ? opendir(path) : NULL;
    int hit = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e && !hit; e = readdir(d)) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        char *child = xmalloc(len);
        snprintf(child, len, "%s/%s", path, e->d_name);
        hit = holds_file(child, depth - 1, out, found, n);
        free(child);
    }
    if (d) closedir(d);
    return hit;
}

// An output that is, under another name, a file the run reads or a
// checkpoint file it keeps (--json F, F a hard link to a part, appended a
// record to the part) is refused: the names differ, so only the files'
// identities tell. Checkpoint folders hold files two levels down (DIR/step-N/part).
static int output_is_an_input(const TrainConfig *c, char *msg) {
    const char *out_flags[] = {"--json", "--trace", "--memory-timeline", "--export-llmc"};
    const char *outs[] = {c->json, c->trace, c->memory_timeline, c->export_llmc};
    const char *in_flags[] = {"--save", "--resume", "--init-from", "--data", "--deepspeed-config"};
    const char *ins[] = {c->save, c->resume, c->init_from, c->data, c->deepspeed_config};
    const char *what[] = {"a checkpoint file in that folder", "a checkpoint file this run resumes from",
                          "the checkpoint this run starts from", "data this run reads",
                          "the config this run reads"};
    for (int i = 0; i < 4; i++) {
        struct stat st;
        if (!outs[i] || stat(outs[i], &st) != 0 || !S_ISREG(st.st_mode)) continue;
        for (int k = 0; k < 5; k++) {
            char found[PATH_MAX];
            if (!ins[k] || !holds_file(ins[k], 2, &st, found, sizeof found)) continue;
            if (strcmp(found, outs[i]) == 0)  // one name: no link, the same file given twice
                return snprintf(msg, MSG_LEN, "%s %s is %s (%s %s); give the output a file of its own", out_flags[i],
                                outs[i], what[k], in_flags[k], ins[k]), 1;
            return snprintf(msg, MSG_LEN, "%s %s is the file %s (one device and inode: a hard link), %s (%s %s); "
                            "give the output a file of its own", out_flags[i], outs[i], found, what[k], in_flags[k],
                            ins[k]), 1;
        }
    }
    return 0;
}

// zero-workbench's own files, by their name at the top of its tree: the
// sources, tests, scripts and docs (the stage folders 00_ to 07_ among
// them) and the binaries. An output there would write over the project.
// The build folders are make's (make bench writes its records into
// build/bench), and runs/ is the outputs' own.
static int project_entry(const char *name, size_t len) {
    static const char *const own[] = {".ci", ".git", ".gitignore", "Makefile", "README.md", "bench", "common",
                                      "scripts", "tests", "dp_baseline", "zero1", "zero2", "zero3", "cpu_offload",
                                      "infinity", "3d_parallel", "memory_math", "ckpt_tool"};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strlen(own[i]) == len && strncmp(name, own[i], len) == 0) return 1;
    return len > 3 && name[0] >= '0' && name[0] <= '9' && name[1] >= '0' && name[1] <= '9' && name[2] == '_';
}

// The tree this trainer was built in: the folder of its binary, where the
// Makefile is (through a link: the emulator's and sanitizer's builds run
// from a folder of links to the tree); 0 when the binary lies elsewhere.
static int project_root(char *out, size_t n) {
    char exe[PATH_MAX], makefile[PATH_MAX + 16], real[PATH_MAX];
    if (!realpath("/proc/self/exe", exe)) return 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return 0;
    *slash = 0;
    snprintf(makefile, sizeof makefile, "%s/Makefile", exe);
    if (!realpath(makefile, real)) return 0;
    *strrchr(real, '/') = 0;
    return snprintf(out, n, "%s", real) > 0;
}

// An output (--save too) that is one of the project's own files or inside
// one (--json Makefile, --save common, --export-llmc zero2 over the trainer
// itself) is refused: a run writes only what is its own.
static int output_over_project(const TrainConfig *c, char *msg) {
    char root[PATH_MAX];
    if (!project_root(root, sizeof root)) return 0;
    const char *flags[] = {"--json", "--trace", "--memory-timeline", "--export-llmc", "--save"};
    const char *paths[] = {c->json, c->trace, c->memory_timeline, c->export_llmc, c->save};
    for (int i = 0; i < 5; i++) {
        char resolved[PATH_MAX];
        if (!paths[i]) continue;
        if (i < 4 || !realpath(paths[i], resolved)) out_file_resolve(paths[i], resolved, sizeof resolved);
        if (!out_path_within(resolved, root)) continue;
        const char *rest = resolved + strlen(root);
        rest += *rest == '/';
        size_t first = strcspn(rest, "/");
        if (first > 0 && !project_entry(rest, first)) continue;  // runs/, a checkpoint folder of one's own
        const char *base = strrchr(resolved, '/') + 1;
        if (i == 4 || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) base = i == 4 ? "ck" : "out";
        return snprintf(msg, MSG_LEN, "%s %s would write into %s%s%.*s, zero-workbench's own (its sources, tests, "
                        "scripts, docs and binaries), which a run never writes over; give it a path of its own, "
                        "e.g. runs/%s", flags[i], paths[i], root, first ? "/" : "", (int)first, rest, base), 1;
    }
    return 0;
}

// Every rank: 0, or the lowest failing rank's message on all and exit 2.
static void agree_or_fail(Comm *world, int failed, char *msg) {
    if (comm_first_failure(world, failed, msg, MSG_LEN) >= 0) fail_usage("%s", msg);
}

void trainer_check_outputs(Trainer *t) {
    const TrainConfig *c = &t->cfg;
    char msg[MSG_LEN] = "";
    int failed = 0;
    t->save_lock = -1;
    if (t->world.rank == 0) {
        failed = (c->json && out_file_check("--json", c->json, 0, msg)) ||
                 (c->trace && out_file_check("--trace", c->trace, 1, msg)) ||
                 (c->memory_timeline && out_file_check("--memory-timeline", c->memory_timeline, 1, msg)) ||
                 outputs_overlap(c, msg) || inside_resume(c, msg) || output_is_an_input(c, msg) ||
                 output_over_project(c, msg) ||
                 (c->save && ckpt_lock(c->save, &t->save_lock, msg, sizeof msg));
    }
    agree_or_fail(&t->world, failed, msg);
    if (!c->save) return;
    // the folder exists now: every rank writes its part into it
    failed = access(c->save, W_OK | X_OK) != 0;
    if (failed)
        snprintf(msg, sizeof msg, "--save %s: rank %d cannot write into it (%s)", c->save, t->world.rank,
                 strerror(errno));
    agree_or_fail(&t->world, failed, msg);
}

void trainer_release_outputs(Trainer *t) {
    if (t->save_lock >= 0) close(t->save_lock);
    t->save_lock = -1;
}
