// settings.c: the record of where each setting came from (see settings.h).
// The JSON part is built with jansson, so paths and messages are escaped; a
// build without jansson records no settings in the --json record (null).
#include "settings.h"
#ifdef WB_HAVE_JANSSON
#include <jansson.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "check.h"

void settings_begin(Settings *s, const FlagSpec *specs, int n) {
    CHECK(n <= SETTINGS_MAX, "settings: %d flags, at most %d", n, SETTINGS_MAX);
    memset(s, 0, sizeof *s);
    s->n = n;
    s->config_path = "";
    for (int i = 0; i < n; i++) s->item[i] = (Setting){.flag = specs[i], .from = FROM_DEFAULT};
}

// A flag given on the command line over a config key's value: the key's line
// says so, where it showed the value the run no longer uses. The setting's
// `why` names the key (with its unit after a space, for a scaled one).
static void note_overridden(Settings *s, const Setting *x) {
    for (int k = 0; k < s->nkeys; k++) {
        size_t len = strlen(s->key[k].key);
        if (strncmp(x->why, s->key[k].key, len) == 0 && (x->why[len] == 0 || x->why[len] == ' '))
            snprintf(s->key[k].effect, sizeof s->key[k].effect, "overridden: --%s on the command line", x->flag.name);
    }
}

void settings_after_parse(Settings *s, const FlagSpec *specs, int n) {
    for (int i = 0; i < n; i++) {
        if (!specs[i].seen) continue;
        const Setting *x = settings_find(s, specs[i].name);
        if (x && x->from == FROM_CONFIG) note_overridden(s, x);
        settings_mark(s, specs[i].name, FROM_COMMAND_LINE, "%s", "");
    }
}

Setting *settings_find(const Settings *s, const char *flag) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->item[i].flag.name, flag) == 0) return (Setting *)&s->item[i];
    return NULL;
}

void settings_mark(Settings *s, const char *flag, SettingFrom from, const char *why, ...) {
    Setting *x = settings_find(s, flag);
    CHECK(x, "settings: no flag --%s", flag);
    x->from = from;
    va_list ap;
    va_start(ap, why);
    vsnprintf(x->why, sizeof x->why, why, ap);
    va_end(ap);
}

int settings_given(const Settings *s, const char *flag) {
    const Setting *x = settings_find(s, flag);
    return x && (x->from == FROM_CONFIG || x->from == FROM_COMMAND_LINE);
}

const char *settings_source(const Setting *x, char *buf, size_t n) {
    switch (x->from) {
    case FROM_DEFAULT: snprintf(buf, n, "default"); break;
    case FROM_DS_DEFAULT: snprintf(buf, n, "DeepSpeed's default (%s)", x->why); break;
    case FROM_CONFIG: snprintf(buf, n, "config: %s", x->why); break;
    case FROM_COMMAND_LINE: snprintf(buf, n, "command line"); break;
    case FROM_DERIVED: snprintf(buf, n, "derived: %s", x->why); break;
    }
    return buf;
}

const char *settings_keep(Settings *s, const char *v) {
    size_t len = strlen(v) + 1;
    if (len > sizeof s->text - s->text_used)
        fail_usage("the config's strings take more than %zu bytes; shorten its paths", sizeof s->text);
    char *copy = s->text + s->text_used;
    memcpy(copy, v, len);
    s->text_used += len;
    return copy;
}

void settings_key(Settings *s, const char *key, const char *effect, ...) {
    int i = 0;
    while (i < s->nkeys && strcmp(s->key[i].key, key) != 0) i++;
    CHECK(i < SETTINGS_MAX_KEYS, "settings: more than %d config keys", SETTINGS_MAX_KEYS);
    if (i == s->nkeys) s->nkeys++;
    snprintf(s->key[i].key, sizeof s->key[i].key, "%s", key);
    va_list ap;
    va_start(ap, effect);
    vsnprintf(s->key[i].effect, sizeof s->key[i].effect, effect, ap);
    va_end(ap);
}

static const char *value_text(const FlagSpec *f, char *buf, size_t n) {
    switch (f->type) {
    case FLAG_INT: snprintf(buf, n, "%d", *(const int *)f->dst); break;
    case FLAG_DOUBLE: case FLAG_COUNT: snprintf(buf, n, "%.9g", *(const double *)f->dst); break;
    case FLAG_STRING: snprintf(buf, n, "%s", *(const char *const *)f->dst ? *(const char *const *)f->dst : "(none)"); break;
    case FLAG_BOOL: snprintf(buf, n, "%s", *(const int *)f->dst ? "on" : "off"); break;
    }
    return buf;
}

void settings_print(const Settings *s, FILE *f, const char *binary) {
    fprintf(f, "%s: settings (value, and where it came from)%s%s\n", binary, s->config_path[0] ? "; config " : "",
            s->config_path);
    for (int i = 0; i < s->n; i++) {
        char v[160], src[300];
        fprintf(f, "  --%-18s %-14s %s\n", s->item[i].flag.name, value_text(&s->item[i].flag, v, sizeof v),
                settings_source(&s->item[i], src, sizeof src));
    }
    for (int i = 0; i < s->nkeys; i++)
        fprintf(f, "  config key %-40s %s\n", s->key[i].key, s->key[i].effect);
}

#ifndef WB_HAVE_JANSSON
void settings_json(const Settings *s, FILE *f) {
    (void)s;
    fprintf(f, ",\"settings\":null,\"deepspeed_config\":null");
}
#else
// Strings are the user's (paths, names), encoded as given: JSON text is
// UTF-8, and a trainer given --json refuses a string setting that is not
// before step 1 (trainer_flags.c), so that the dump below cannot fail.
static json_t *text_json(const char *v) { return v ? json_string_nocheck(v) : json_null(); }

static json_t *value_json(const FlagSpec *f) {
    switch (f->type) {
    case FLAG_INT: return json_integer(*(const int *)f->dst);
    case FLAG_DOUBLE: case FLAG_COUNT: {
        double v = *(const double *)f->dst;
        return isfinite(v) ? json_real(v) : json_null();  // JSON has no inf or nan
    }
    case FLAG_STRING: return text_json(*(const char *const *)f->dst);
    case FLAG_BOOL: return json_boolean(*(const int *)f->dst);
    }
    return json_null();
}

static const char *const FROM_NAME[] = {"default", "deepspeed default", "config", "command line", "derived"};

void settings_json(const Settings *s, FILE *f) {
    json_t *all = json_object(), *settings = json_object();
    for (int i = 0; i < s->n; i++) {
        const Setting *x = &s->item[i];
        json_t *one = json_object();
        json_object_set_new(one, "value", value_json(&x->flag));
        json_object_set_new(one, "from", json_string(FROM_NAME[x->from]));
        if (x->why[0]) json_object_set_new(one, "why", text_json(x->why));
        json_object_set_new(settings, x->flag.name, one);
    }
    json_object_set_new(all, "settings", settings);
    json_t *config = json_null();
    if (s->config_path[0]) {
        json_t *keys = json_object();
        for (int i = 0; i < s->nkeys; i++) json_object_set_new(keys, s->key[i].key, text_json(s->key[i].effect));
        config = json_object();
        json_object_set_new(config, "file", text_json(s->config_path));
        json_object_set_new(config, "keys", keys);
    }
    json_object_set_new(all, "deepspeed_config", config);
    // the members of `all` without its braces: the caller's object goes on around them
    char *text = json_dumps(all, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK(text, "settings_json: jansson could not encode the settings");
    size_t len = strlen(text);
    fprintf(f, ",%.*s", (int)(len - 2), text + 1);
    free(text);
    json_decref(all);
}
#endif
