// ds_config.c: reading --deepspeed-config and deciding which binary runs it
// (see ds_config.h); the keys' meanings are in ds_config_keys.c.
#include "ds_config.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "check.h"
#include "ds_config_keys.h"
#include "out_file.h"

#ifndef WB_BUILT_STAGES
#error "the Makefile defines WB_BUILT_STAGES, the stages of this tree (\"00 01 02 ...\")"
#endif

static const DsStage STAGES[] = {
    {"01", "dp_baseline", "plain data parallelism (ZeRO stage 0)"},
    {"02", "zero1", "ZeRO-1"},
    {"03", "zero2", "ZeRO-2"},
    {"04", "zero3", "ZeRO-3"},
    {"05", "cpu_offload", "ZeRO-Offload (ZeRO-2 with the optimizer on the host)"},
    {"06", "infinity", "ZeRO-Infinity (ZeRO-3 with the optimizer on NVMe)"},
    {"07", "3d_parallel", "3D parallelism (tensor x pipeline x ZeRO-1 data parallel)"},
};

const DsStage *ds_stage_of(const char *binary) {
    for (size_t i = 0; i < sizeof STAGES / sizeof STAGES[0]; i++)
        if (strcmp(STAGES[i].binary, binary) == 0) return &STAGES[i];
    return NULL;
}

int ds_stage_built(const DsStage *st) { return strstr(WB_BUILT_STAGES, st->id) != NULL; }

void ds_fail(const DsConfig *ds, const char *key, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_usage("--deepspeed-config %s: %s: %s", ds->path, key, msg);
}

// A section on the way to the key that is not an object ("zero_optimization":
// 3, "scheduler": "WarmupLR") is refused naming it, as a value of the wrong
// type is; null stands for an absent section.
json_t *ds_lookup(const DsConfig *ds, const char *key) {
    char part[96], section[96];
    json_t *at = ds->root;
    for (const char *p = key; at && *p;) {
        size_t len = strcspn(p, ".");
        if (json_is_null(at)) return NULL;
        if (!json_is_object(at)) {
            snprintf(section, sizeof section, "%.*s", (int)(p - key - 1), key);
            ds_fail(ds, section, "expected an object (a section of keys), got %s", ds_kind(at));
        }
        if (len >= sizeof part) return NULL;
        memcpy(part, p, len);
        part[len] = 0;
        at = json_object_get(at, part);
        p += len + (p[len] == '.');
    }
    return at;
}

const char *ds_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "a whole number";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "true or false";
    case JSON_NULL: return "null";
    }
    return "?";
}

int ds_is_auto(const json_t *v) { return json_is_string(v) && strcmp(json_string_value(v), "auto") == 0; }

double ds_number(const DsConfig *ds, const char *key, const json_t *v, int whole) {
    if (!json_is_number(v)) ds_fail(ds, key, "expected %s, got %s", whole ? "a whole number" : "a number", ds_kind(v));
    double x = json_number_value(v);
    // trunc, not a cast to an integer: 1e300 is whole, and out of range for any integer type (the key's range
    // check refuses it)
    if (whole && x != trunc(x)) ds_fail(ds, key, "expected a whole number, got %.17g", x);
    return x;
}

const char *ds_string(const DsConfig *ds, const char *key, const json_t *v) {
    if (!json_is_string(v)) ds_fail(ds, key, "expected a string, got %s", ds_kind(v));
    return json_string_value(v);
}

int ds_bool(const DsConfig *ds, const char *key, const json_t *v) {
    if (!json_is_boolean(v)) ds_fail(ds, key, "expected true or false, got %s", ds_kind(v));
    return json_is_true(v);
}

// An offload section's device: none (also when absent), cpu or nvme.
static const char *offload_device(const DsConfig *ds, const char *key) {
    json_t *v = ds_lookup(ds, key);
    if (!v || json_is_null(v) || ds_is_auto(v)) return "none";
    const char *d = ds_string(ds, key, v);
    if (strcmp(d, "none") && strcmp(d, "cpu") && strcmp(d, "nvme"))
        ds_fail(ds, key, "'%s' is not a device: choose none, cpu or nvme", d);
    return d;
}

static void choose(DsConfig *ds, const char *binary, const char *fmt, ...) {
    snprintf(ds->binary, sizeof ds->binary, "%s", binary);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ds->binary_why, sizeof ds->binary_why, fmt, ap);
    va_end(ap);
}

// DeepSpeed's stage and offload devices -> the binary of this workbench
// that runs them, or one line saying why none does.
static void decide_binary(DsConfig *ds) {
    static const char *const OPT = "zero_optimization.offload_optimizer.device";
    static const char *const PARAM = "zero_optimization.offload_param.device";
    if (ds_lookup(ds, "zero_optimization.cpu_offload"))
        ds_fail(ds, "zero_optimization.cpu_offload", "DeepSpeed's old spelling; write \"offload_optimizer\": "
                "{\"device\": \"cpu\"} in zero_optimization");
    const char *opt = offload_device(ds, OPT), *param = offload_device(ds, PARAM);
    snprintf(ds->params_device, sizeof ds->params_device, "%s", param);
    snprintf(ds->optimizer_device, sizeof ds->optimizer_device, "%s", opt);
    json_t *v = ds_lookup(ds, "zero_optimization.stage");
    if (!v || ds_is_auto(v)) {
        if (strcmp(opt, "none") || strcmp(param, "none"))
            ds_fail(ds, strcmp(opt, "none") ? OPT : PARAM, "offloading needs zero_optimization.stage "
                    "(2 with offload_optimizer cpu: cpu_offload; 3 with offload_optimizer cpu or nvme: infinity)");
        return;
    }
    double stage = ds_number(ds, "zero_optimization.stage", v, 1);
    if (stage < 0 || stage > 3) ds_fail(ds, "zero_optimization.stage", "%g is not a ZeRO stage: give 0 to 3", stage);
    static const char *const PLAIN[4] = {"dp_baseline", "zero1", "zero2", "zero3"};
    int z = (int)stage;
    if (strcmp(param, "none") && z != 3)
        ds_fail(ds, PARAM, "%s needs zero_optimization.stage 3 (parameters are partitioned only there), "
                "not %d", param, z);
    if (!strcmp(opt, "none") && strcmp(param, "none"))
        ds_fail(ds, PARAM, "%s with the optimizer on the device has no stage here: infinity (stage 06) moves "
                "the parameters with offload_optimizer.device cpu or nvme", param);
    if (!strcmp(opt, "none")) {
        choose(ds, PLAIN[z], "zero_optimization.stage %d", z);
    } else if (!strcmp(opt, "cpu") && z == 2) {
        choose(ds, "cpu_offload", "zero_optimization.stage 2 with offload_optimizer.device cpu");
    } else {
        if (z != 3)
            ds_fail(ds, OPT, "%s with zero_optimization.stage %d has no stage here: cpu_offload (stage 05) offloads "
                    "ZeRO-2's optimizer to the host, infinity (stage 06) ZeRO-3's to the host or NVMe", opt, z);
        choose(ds, "infinity", "zero_optimization.stage 3 with offload_optimizer.device %s%s%s", opt,
               strcmp(param, "none") ? " and offload_param.device " : "", strcmp(param, "none") ? param : "");
    }
}

#define CONFIG_MAX_BYTES (1 << 20)  // DeepSpeed's configs are a few KB

// The file's text (malloc'd, *len bytes) without a UTF-8 byte-order mark,
// which editors on some systems write and JSON parsers refuse. A folder, a
// FIFO or a device, or a file past CONFIG_MAX_BYTES, is refused in one line.
static char *read_config(const char *path, size_t *len) {
    const char *kind;
    FILE *f = in_file_open(path, &kind);
    if (!f && kind) fail_usage("--deepspeed-config %s is %s, not a file; give a JSON file", path, kind);
    if (!f) fail_usage("--deepspeed-config %s: unable to open: %s", path, strerror(errno));
    char *text = xmalloc(CONFIG_MAX_BYTES + 1);
    *len = fread(text, 1, CONFIG_MAX_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) fail_usage("--deepspeed-config %s: read error", path);
    if (*len > CONFIG_MAX_BYTES)
        fail_usage("--deepspeed-config %s is more than %d bytes; a DeepSpeed config is a few KB", path,
                   CONFIG_MAX_BYTES);
    if (*len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        memmove(text, text + 3, *len - 3);
        *len -= 3;
    }
    return text;
}

void ds_config_load(DsConfig *ds, const char *path) {
    memset(ds, 0, sizeof *ds);
    if (!path) return;
    ds->path = path;
    json_error_t e;
    size_t len;
    char *text = read_config(path, &len);
    ds->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    free(text);
    for (char *c = e.text; *c; c++)  // it quotes the file, whose line breaks would split the refusal
        if ((unsigned char)*c < 0x20) *c = '?';
    if (!ds->root && e.line < 1) fail_usage("--deepspeed-config %s: %s", path, e.text);
    if (!ds->root)
        fail_usage("--deepspeed-config %s: line %d, column %d: %s (not valid JSON)", path, e.line, e.column, e.text);
    if (!json_is_object(ds->root))
        fail_usage("--deepspeed-config %s: the top level is %s; a DeepSpeed config is one JSON object", path,
                   ds_kind(ds->root));
    decide_binary(ds);
}

void ds_config_check_binary(const DsConfig *ds, const char *binary) {
    if (!ds->root || !ds->binary[0] || strcmp(ds->binary, binary) == 0) return;
    // 3d_parallel's data parallelism is ZeRO-1 over its replicas (Megatron-DeepSpeed's 3D configs say stage 1)
    if (strcmp(binary, "3d_parallel") == 0 && strcmp(ds->binary, "zero1") == 0) return;
    const DsStage *want = ds_stage_of(ds->binary);
    CHECK(want, "ds_config: no stage runs %s", ds->binary);
    fail_usage("--deepspeed-config %s: %s is %s: run ./%s (stage %s%s) with this config, not ./%s", ds->path,
               ds->binary_why, want->what, want->binary, want->id,
               ds_stage_built(want) ? "" : ", which this build does not have yet", binary);
}

void ds_config_free(DsConfig *ds) {
    if (ds->root) json_decref(ds->root);
    ds->root = NULL;
}

#define NO_USE "the workbench has no use for it"

// Every leaf key of the config ("zero_optimization.offload_param.device"),
// lists included as one value; the ones nothing recorded are ignored.
static void note_unused(const DsConfig *ds, Settings *s, json_t *obj, const char *prefix) {
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char key[96];
        snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", name);
        if (json_is_object(v) && json_object_size(v) > 0) {
            note_unused(ds, s, v, key);
            continue;
        }
        int known = 0;
        for (int i = 0; i < s->nkeys && !known; i++) known = strcmp(s->key[i].key, key) == 0;
        if (known) continue;
        if (s->nkeys < SETTINGS_MAX_KEYS) settings_key(s, key, "ignored: %s", NO_USE);
        else s->keys_unlisted++;  // a config of hundreds of keys: the line names the first ones
    }
}

void ds_config_apply(const DsConfig *ds, FlagSpec *specs, int n, Settings *s, const char *binary) {
    if (!ds->root) return;
    s->config_path = ds->path;
    DsApply a = {.ds = ds, .specs = specs, .n = n, .s = s, .binary = binary};
    if (ds->binary[0] && strcmp(binary, "3d_parallel") == 0)
        settings_key(s, "zero_optimization.stage", "checked: 3d_parallel runs ZeRO-1 over its data-parallel replicas "
                     "(%s)", ds->binary_why);
    else if (ds->binary[0]) {
        settings_key(s, "zero_optimization.stage", "checked: %s runs it (%s)", ds->binary, ds->binary_why);
        const char *opt = "zero_optimization.offload_optimizer.device";
        // infinity keeps master, m and v where it says; for cpu_offload it chose the binary
        if (ds_lookup(ds, opt) && flags_find(specs, n, "offload-optimizer"))
            ds_set_flag(&a, opt, "offload-optimizer", ds->optimizer_device, FROM_CONFIG, opt);
        else if (ds_lookup(ds, opt))
            settings_key(s, opt, "checked: %s runs it", ds->binary);
    }
    ds_apply_optimizer(&a);
    ds_apply_scheduler(&a);
    ds_apply_rules(&a);
    ds_apply_checks(&a);
    ds_apply_zeropp(&a);
    ds_apply_activation_checkpointing(&a);
    ds_apply_sequence_parallel(&a);
    ds_apply_precision(&a);
    ds_apply_grad_accum_dtype(&a);
    note_unused(ds, s, ds->root, "");
}

void ds_config_ignored_line(const Settings *s, char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < s->nkeys; i++) {
        const char *e = s->key[i].effect;
        if (strncmp(e, "ignored", 7) != 0) continue;
        // "ignored: why" or "ignored by zero1: why"; no why for a key the workbench does not know
        const char *why = strchr(e, ':') ? strchr(e, ':') + 2 : "";
        if (strcmp(why, NO_USE) == 0) why = "";
        len += (size_t)snprintf(out + len, len < n ? n - len : 0, "%s%s%s%s%s", len ? ", " : "", s->key[i].key,
                                why[0] ? " (" : "", why, why[0] ? ")" : "");
    }
    if (s->keys_unlisted)
        len += (size_t)snprintf(out + len, len < n ? n - len : 0, "%s%d more", len ? " and " : "", s->keys_unlisted);
    if (len == 0) return;
    char keys[4096];
    snprintf(keys, sizeof keys, "%s", out);
    snprintf(out, n, "%s: ignored: %s", s->config_path, keys);
}
