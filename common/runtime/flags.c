// flags.c: the shared long-option parser (see flags.h).
#include "flags.h"
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

int parse_count(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno) return 1;
    double scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1e3; end++; break;
    case 'M': scale = 1e6; end++; break;
    case 'B': case 'G': scale = 1e9; end++; break;
    case 'T': scale = 1e12; end++; break;
    default: break;
    }
    if (*end != 0 || v < 0) return 1;
    *out = v * scale;
    return 0;
}

const FlagSpec *flags_find(const FlagSpec *specs, int nspecs, const char *name) {
    for (int i = 0; i < nspecs; i++)
        if (strcmp(specs[i].name, name) == 0) return &specs[i];
    return NULL;
}

// Index in argv of --name or --name=..., or 0 when absent.
static int flag_index(int argc, char **argv, const char *name) {
    size_t len = strlen(name);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, len) &&
            (argv[i][2 + len] == 0 || argv[i][2 + len] == '='))
            return i;
    return 0;
}

int flags_present(int argc, char **argv, const char *name) { return flag_index(argc, argv, name) > 0; }

const char *flags_value(int argc, char **argv, const char *name) {
    int i = flag_index(argc, argv, name);
    if (i == 0) return NULL;
    const char *eq = strchr(argv[i], '=');
    if (eq) return eq + 1;
    if (i + 1 >= argc) fail_usage("--%s needs a value (see --help)", name);
    return argv[i + 1];
}

static void print_default(const FlagSpec *f) {
    if (f->shown_default) {
        if (*f->shown_default) printf(" (default %s)", f->shown_default);
        return;
    }
    switch (f->type) {
    case FLAG_INT: printf(" (default %d)", *(int *)f->dst); break;
    case FLAG_DOUBLE: printf(" (default %g)", *(double *)f->dst); break;
    case FLAG_COUNT: if (*(double *)f->dst > 0) printf(" (default %g)", *(double *)f->dst); break;
    case FLAG_STRING:
        if (*(const char **)f->dst) printf(" (default %s)", *(const char **)f->dst);
        break;
    case FLAG_BOOL: break;
    }
}

static void print_help(const FlagSpec *specs, int nspecs, const char *usage) {
    if (world_rank() != 0) return;
    printf("%s\n\nOptions:\n", usage);
    for (int i = 0; i < nspecs; i++) {
        const FlagSpec *f = &specs[i];
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", f->name, f->meta ? " " : "", f->meta ? f->meta : "");
        printf("  %-22s %s", left, f->help);
        print_default(f);
        printf("\n");
    }
    printf("  %-22s %s\n", "--help", "print this help and exit");
}

__attribute__((format(printf, 3, 4))) static int bad_value(char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return 1;
}

int flags_parse_value(const FlagSpec *f, const char *v, char *err, size_t err_len) {
    char *end;
    errno = 0;
    switch (f->type) {
    case FLAG_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < -2147483647L || x > 2147483647L)
            return bad_value(err, err_len, "expects a whole number, got '%s'", v);
        *(int *)f->dst = (int)x;
        break;
    }
    case FLAG_DOUBLE: {
        double x = strtod(v, &end);
        if (end == v || *end || errno) return bad_value(err, err_len, "expects a number, got '%s'", v);
        *(double *)f->dst = x;
        break;
    }
    case FLAG_COUNT:
        if (parse_count(v, (double *)f->dst))
            return bad_value(err, err_len, "expects a count such as 7.5e9, 7.5B, 350M or 12k, got '%s'", v);
        break;
    case FLAG_STRING: *(const char **)f->dst = v; break;
    case FLAG_BOOL: *(int *)f->dst = 1; break;
    }
    return 0;
}

static void set_value(FlagSpec *f, const char *v) {
    char err[256];
    if (flags_parse_value(f, v, err, sizeof err)) fail_usage("--%s %s", f->name, err);
    f->seen = 1;
    if (f->given) *f->given = 1;
}

void flags_parse(int argc, char **argv, FlagSpec *specs, int nspecs, const char *usage) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_help(specs, nspecs, usage);
            exit_all(0);
        }
        if (strncmp(arg, "--", 2) != 0)
            fail_usage("unexpected argument '%s'; options start with -- (see --help)", arg);
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, arg + 2, len);
        name[len] = 0;
        FlagSpec *f = (FlagSpec *)flags_find(specs, nspecs, name);
        if (!f) fail_usage("unknown option --%s (see --help for the options of this program)", name);
        if (f->type == FLAG_BOOL) {
            if (eq) fail_usage("--%s takes no value", name);
            set_value(f, "1");
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) fail_usage("--%s needs a value (%s)", name, f->meta ? f->meta : "see --help");
        set_value(f, v);
    }
}
