// stage_record.h: a trainer's --json record, parsed (jansson), for the tests
// that compare whole records or their members across runs.
#pragma once
#include <jansson.h>
#include "runs.h"

// `mpirun -np RANKS ./STAGE ARGS --quiet --json ROOT/STAGE-TAG.json` (infinity
// with its swap files in c->nvme): its record. Fails with the command when
// the run fails or its record is not JSON.
static __attribute__((unused)) json_t *stage_record(const RunFolders *c, const char *stage, int ranks,
                                                    const char *args, const char *tag) {
    char cmd[4096], path[600], nvme[600] = "";
    snprintf(path, sizeof path, "%s/%s-%s.json", c->root, stage, tag);
    if (!strcmp(stage, "infinity")) snprintf(nvme, sizeof nvme, " --nvme-path %s", c->nvme);
    snprintf(cmd, sizeof cmd, "mpirun -np %d ./%s %s%s --quiet --json %s", ranks, stage, args, nvme, path);
    char *line = train(cmd, path);
    json_error_t e;
    json_t *j = json_loads(line, 0, &e);
    if (!j) fail_msg("%s: not JSON (%s)", cmd, e.text);
    free(line);
    return j;
}
