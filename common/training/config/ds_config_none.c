// ds_config_none.c: the DeepSpeed-config reader of a build without jansson
// (the Makefile compiles this file instead of ds_config*.c where jansson is
// not found, and says so). No config is read: --deepspeed-config FILE is
// refused in one line that says how to get a build that reads it.
#include "check.h"
#include "ds_config.h"

void ds_config_load(DsConfig *ds, const char *path) {
    *ds = (DsConfig){.root = NULL, .path = path};
    if (path)
        fail_usage("--deepspeed-config %s: this build reads no JSON (jansson was not found when it was built); "
                   "make deps installs it, then make rebuilds with it", path);
}

void ds_config_check_binary(const DsConfig *ds, const char *binary) { (void)ds, (void)binary; }

void ds_config_apply(const DsConfig *ds, FlagSpec *specs, int n, Settings *s, const char *binary) {
    (void)ds, (void)specs, (void)n, (void)s, (void)binary;
}

void ds_config_after_model(Settings *s, const GPTLayout *l) { (void)s, (void)l; }

void ds_config_ignored_line(const Settings *s, char *out, size_t n) {
    (void)s;
    if (n) out[0] = 0;
}

void ds_config_free(DsConfig *ds) { ds->root = NULL; }
