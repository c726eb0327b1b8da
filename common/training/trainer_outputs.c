// trainer_outputs.c: the files a run writes are checked before step 1, so a
// run cannot end by failing to write what it was run for: --json and
// --trace must be creatable (rank 0 writes them), and the --save folder is
// created and locked for the run (ckpt_lock), which every rank then checks it
// can write into.
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "trainer.h"

#define MSG_LEN 600

// The folder a file goes in must exist and take new files.
static int folder_takes_files(const char *flag, const char *path, char *msg) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return snprintf(msg, MSG_LEN, "%s %s: the folder %s does not exist; create it or give another path", flag,
                        path, dir), 1;
    if (access(dir, W_OK | X_OK) != 0)
        return snprintf(msg, MSG_LEN, "%s %s: cannot create files in %s (%s)", flag, path, dir, strerror(errno)), 1;
    return 0;
}

// `path` can be written: an existing file that is not a folder and is
// writable, or a new one in a folder that takes files (also needed where a
// regular file is written beside and renamed, as the trace is).
static int file_writable(const char *flag, const char *path, int renamed, char *msg) {
    struct stat st;
    if (stat(path, &st) != 0) return folder_takes_files(flag, path, msg);
    if (S_ISDIR(st.st_mode))
        return snprintf(msg, MSG_LEN, "%s %s is a folder; give a file name", flag, path), 1;
    if (access(path, W_OK) != 0)
        return snprintf(msg, MSG_LEN, "%s %s: cannot write (%s)", flag, path, strerror(errno)), 1;
    return renamed && S_ISREG(st.st_mode) ? folder_takes_files(flag, path, msg) : 0;
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
        failed = (c->json && file_writable("--json", c->json, 0, msg)) ||
                 (c->trace && file_writable("--trace", c->trace, 1, msg)) ||
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
