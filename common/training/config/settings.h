// settings.h: where each effective setting of a run came from. Every flag
// of a binary has a source: its default, DeepSpeed's default for a section
// that --deepspeed-config names (optimizer AdamW: betas 0.9, 0.999), a key of
// the config, the command line (which overrides the config), or a rule that
// derived it (DeepSpeed's batch rule, the model's context). The record also
// keeps what became of every key of the config. --verbose-config prints it
// at start-up and the --json record carries it.
#pragma once
#include <stdio.h>
#include "flags.h"

typedef enum {
    FROM_DEFAULT,       // the flag's own default
    FROM_DS_DEFAULT,    // DeepSpeed's default for a section the config names
    FROM_CONFIG,        // a key of --deepspeed-config
    FROM_COMMAND_LINE,
    FROM_DERIVED,       // computed from other settings by a stated rule
} SettingFrom;

typedef struct Setting {
    FlagSpec flag;      // a copy of the flag's spec; flag.dst holds the effective value
    SettingFrom from;
    char why[200];      // the key, the section, or the rule ("" for the default and the command line)
    double config_value;  // FROM_CONFIG: the key's value in its own units (for a conversion made later)
} Setting;

// What became of one key of the config: the flag it set, "checked: ...",
// "ignored: ...", "auto: ...".
typedef struct ConfigKey {
    char key[96];
    char effect[200];
} ConfigKey;

#define SETTINGS_MAX 96
#define SETTINGS_MAX_KEYS 96

typedef struct Settings {
    int n, nkeys;
    int keys_unlisted;      // ignored keys past the table's SETTINGS_MAX_KEYS: counted, not named
    Setting item[SETTINGS_MAX];
    ConfigKey key[SETTINGS_MAX_KEYS];
    const char *config_path;  // --deepspeed-config FILE (the argument itself, whole), "" when none
    char text[4096];        // string values taken from the config: string flags point here
    size_t text_used;
} Settings;

// Starts the record from a binary's flags, each at its default.
void settings_begin(Settings *s, const FlagSpec *specs, int n);
// After flags_parse: the flags given on the command line (spec.seen) take that source.
void settings_after_parse(Settings *s, const FlagSpec *specs, int n);
// The record of --flag, or NULL; from a const record as strchr does from a
// const string (the caller that holds it writable may write it).
Setting *settings_find(const Settings *s, const char *flag);
// Sets a flag's source; `why` is a printf format (the key, the rule).
__attribute__((format(printf, 4, 5))) void settings_mark(Settings *s, const char *flag, SettingFrom from,
                                                         const char *why, ...);
// Whether the user gave it: a config key or the command line.
int settings_given(const Settings *s, const char *flag);
// Where it came from, in words: "command line", "ds.json: optimizer.params.lr", ...
const char *settings_source(const Setting *x, char *buf, size_t n);
// A copy of v that lives as long as the record (a string flag's value from the config).
const char *settings_keep(Settings *s, const char *v);
// Records what became of a config key (once per key; a later call replaces it).
__attribute__((format(printf, 3, 4))) void settings_key(Settings *s, const char *key, const char *effect, ...);

// The table of --verbose-config (rank 0 prints it).
void settings_print(const Settings *s, FILE *f, const char *binary);
// `,"settings":{...},"deepspeed_config":{...}` for the --json record: every
// flag's value and source, and every config key's effect.
void settings_json(const Settings *s, FILE *f);
