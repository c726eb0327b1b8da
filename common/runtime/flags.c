// flags.c: the shared long-option parser (see flags.h).
#include "flags.h"
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

int parse_count(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s) return 1;  // out of a double's range (errno ERANGE): the caller's range check says so
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

// The continuation bytes a UTF-8 lead byte announces; -1 for a byte that
// starts no character (a continuation byte, an overlong 2-byte lead, past U+10FFFF).
static int utf8_more(unsigned c) {
    if (c < 0x80) return 0;
    if (c >= 0xc2 && c <= 0xdf) return 1;
    if (c >= 0xe0 && c <= 0xef) return 2;
    if (c >= 0xf0 && c <= 0xf4) return 3;
    return -1;
}

// RFC 3629: no overlong forms, no surrogates (U+D800..U+DFFF), nothing past U+10FFFF.
size_t flags_utf8_prefix(const char *text) {
    const unsigned char *s = (const unsigned char *)text, *start = s;
    while (*s) {
        unsigned c = *s;
        int more = utf8_more(c);
        if (more < 0) break;
        unsigned lo = 0x80, hi = 0xbf;  // the second byte's range
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
        int ok = 1;
        for (int k = 1; k <= more && ok; k++)
            ok = k == 1 ? s[k] >= lo && s[k] <= hi : s[k] >= 0x80 && s[k] <= 0xbf;
        if (!ok) break;
        s += 1 + more;
    }
    return (size_t)(s - start);
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

// A bound as it reads: whole numbers in full (1048576), others as %g.
static void format_bound(double v, char *out, size_t n) {
    if (v == floor(v) && fabs(v) < 1e15) snprintf(out, n, "%.0f", v);
    else snprintf(out, n, "%g", v);
}

static int has_range(const FlagSpec *f) { return f->type == FLAG_INT || f->type == FLAG_DOUBLE || f->type == FLAG_COUNT; }

static int unbounded_above(const FlagSpec *f) {
    return isinf(f->max) || (f->type == FLAG_INT && f->max >= INT_MAX);
}

void flags_range_text(const FlagSpec *f, char *out, size_t n) {
    char lo[32], hi[32];
    const char *name = f->meta ? f->meta : "X";
    format_bound(f->min, lo, sizeof lo);
    format_bound(f->max, hi, sizeof hi);
    if (unbounded_above(f)) snprintf(out, n, "%s %s %s", name, f->min_open ? ">" : ">=", lo);
    else snprintf(out, n, "%s %s %s <= %s", lo, f->min_open ? "<" : "<=", name, hi);
}

void flags_value_text(const FlagSpec *f, char *out, size_t n) {
    switch (f->type) {
    case FLAG_INT: snprintf(out, n, "%d", *(int *)f->dst); break;
    case FLAG_DOUBLE:
    case FLAG_COUNT: snprintf(out, n, "%.17g", *(double *)f->dst); break;
    case FLAG_STRING: snprintf(out, n, "%s", *(const char **)f->dst ? *(const char **)f->dst : ""); break;
    case FLAG_BOOL: snprintf(out, n, "%s", *(int *)f->dst ? "on" : "off"); break;
    }
}

static void print_default(const FlagSpec *f) {
    if (f->shown_default) {
        if (*f->shown_default) printf("default %s", f->shown_default);
        return;
    }
    switch (f->type) {
    case FLAG_INT: printf("default %d", *(int *)f->dst); break;
    case FLAG_DOUBLE: printf("default %g", *(double *)f->dst); break;
    case FLAG_COUNT: if (*(double *)f->dst > 0) printf("default %g", *(double *)f->dst); break;
    case FLAG_STRING:
        if (*(const char **)f->dst) printf("default %s", *(const char **)f->dst);
        break;
    case FLAG_BOOL: break;
    }
}

// " (default 4; 1 <= B <= 1048576)" after the help text
static void print_default_and_range(const FlagSpec *f) {
    char range[96] = "";
    if (has_range(f)) flags_range_text(f, range, sizeof range);
    int has_default = f->shown_default ? *f->shown_default != 0
                                       : f->type != FLAG_BOOL && (f->type != FLAG_COUNT || *(double *)f->dst > 0) &&
                                             (f->type != FLAG_STRING || *(const char **)f->dst);
    if (!has_default && !range[0]) return;
    printf(" (");
    if (has_default) print_default(f);
    printf("%s%s)", has_default && range[0] ? "; " : "", range);
}

static void print_help(const FlagSpec *specs, int nspecs, const char *usage) {
    if (world_rank() != 0) return;
    printf("%s\n\nOptions:\n", usage);
    for (int i = 0; i < nspecs; i++) {
        const FlagSpec *f = &specs[i];
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", f->name, f->meta ? " " : "", f->meta ? f->meta : "");
        printf("  %-22s %s", left, f->help);
        print_default_and_range(f);
        printf("\n");
    }
    printf("  %-22s %s\n", "--help", "print this help and exit");
}

// The message quotes what was given, which may hold a line break or other
// control characters: they become '?', so that it stays one line.
__attribute__((format(printf, 3, 4))) static int bad(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return FLAGS_BAD;
}

// Every numeric flag declares its range: a table without one is a bug, found
// by the first run of the binary rather than by a user's bad value.
static void check_spec(const FlagSpec *f) {
    CHECK(!has_range(f) || f->max > f->min, "--%s declares no range; hint: give its FlagSpec .min and .max", f->name);
    CHECK(f->type != FLAG_INT || (f->min >= -INT_MAX && f->min <= INT_MAX), "--%s: .min %g is not an int", f->name,
          f->min);
}

// Finite and in range; the message says what was given and the range.
static int check_range(const FlagSpec *f, double x, const char *v, char *err, size_t n) {
    int below = f->min_open ? !(x > f->min) : !(x >= f->min);
    if (isfinite(x) && !below && x <= f->max) return FLAGS_OK;
    char range[96];
    flags_range_text(f, range, sizeof range);
    return bad(err, n, "%s is %s: give %s", v, isfinite(x) ? "out of range" : "not a finite number", range);
}

int flags_parse_value(const FlagSpec *f, const char *v, char *err, size_t n) {
    check_spec(f);
    char *end;
    double x = 0;
    errno = 0;
    switch (f->type) {
    case FLAG_INT: {
        long i = strtol(v, &end, 10);
        if (end == v || *end) return bad(err, n, "expects a whole number, got '%s'", v);
        x = (double)i;  // beyond a long (ERANGE): LONG_MIN or LONG_MAX, out of every int range
        break;
    }
    case FLAG_DOUBLE:
        x = strtod(v, &end);  // ERANGE: +-HUGE_VAL or a value near 0, which the range then judges
        if (end == v || *end) return bad(err, n, "expects a number, got '%s'", v);
        break;
    case FLAG_COUNT:
        if (parse_count(v, &x)) return bad(err, n, "expects a count such as 7.5e9, 7.5B, 350M or 12k, got '%s'", v);
        break;
    case FLAG_STRING:
        if (!*v) return bad(err, n, "was given an empty %s; give one, or leave the option out", f->meta ? f->meta : "value");
        *(const char **)f->dst = v;
        break;
    case FLAG_BOOL: *(int *)f->dst = 1; break;
    }
    if (has_range(f)) {
        if (check_range(f, x, v, err, n)) return FLAGS_BAD;
        if (f->type == FLAG_INT) *(int *)f->dst = (int)x;
        else *(double *)f->dst = x;
    }
    return FLAGS_OK;
}

static int set_value(FlagSpec *f, const char *v, char *err, size_t n) {
    char why[400];
    if (flags_parse_value(f, v, why, sizeof why)) return bad(err, n, "--%s %s", f->name, why);
    f->seen = 1;
    if (f->given) *f->given = 1;
    return FLAGS_OK;
}

static void check_specs(const FlagSpec *specs, int nspecs) {
    for (int i = 0; i < nspecs; i++) check_spec(&specs[i]);
}

int flags_parse_args(int argc, char **argv, FlagSpec *specs, int nspecs, char *err, size_t err_len) {
    check_specs(specs, nspecs);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return FLAGS_HELP;
        if (strncmp(arg, "--", 2) != 0)
            return bad(err, err_len, "unexpected argument '%s'; options start with -- (see --help)", arg);
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, arg + 2, len);
        name[len] = 0;
        FlagSpec *f = (FlagSpec *)flags_find(specs, nspecs, name);
        if (!f) return bad(err, err_len, "unknown option --%s (see --help for the options of this program)", name);
        if (f->type == FLAG_BOOL) {
            if (eq) return bad(err, err_len, "--%s takes no value", name);
            set_value(f, "1", err, err_len);
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return bad(err, err_len, "--%s needs a value (%s)", name, f->meta ? f->meta : "see --help");
        if (set_value(f, v, err, err_len)) return FLAGS_BAD;
    }
    return FLAGS_OK;
}

void flags_parse(int argc, char **argv, FlagSpec *specs, int nspecs, const char *usage) {
    char err[512];
    int rc = flags_parse_args(argc, argv, specs, nspecs, err, sizeof err);
    if (rc == FLAGS_HELP) {
        print_help(specs, nspecs, usage);
        exit_all(0);
    }
    if (rc == FLAGS_BAD) fail_usage("%s", err);
}
