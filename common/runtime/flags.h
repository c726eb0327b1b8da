// flags.h: the one long-option parser every binary uses. A binary describes
// its flags in a table; --help prints them; an unknown flag or a bad value
// exits 2 with one line that says what was wrong and what to do. One rule
// for every number: finite and within the range its spec declares.
#pragma once
#include <stddef.h>

typedef enum {
    FLAG_INT,     // int
    FLAG_DOUBLE,  // double
    FLAG_COUNT,   // double, accepts 7.5e9, 7.5B, 350M, 12k (a parameter count)
    FLAG_STRING,  // const char *
    FLAG_BOOL,    // int set to 1, takes no value
} FlagType;

typedef struct FlagSpec {
    const char *name;   // without the leading "--"
    FlagType type;
    void *dst;
    const char *meta;   // value placeholder in --help ("N", "FILE"), NULL for bools
    const char *help;   // one line; the default is printed after it
    int seen;           // set by flags_parse when given on the command line
    const char *shown_default;  // --help shows this instead of the value; "" shows none
    int *given;                 // optional: set to 1 when the flag appears (a stage's own flags
                                // cannot see `seen`: the parser works on a copy of their specs)
    // FLAG_INT, FLAG_DOUBLE, FLAG_COUNT: a value given must be finite and in
    // [min, max], or (min, max] with min_open; max = INFINITY (or INT_MAX for
    // an int) leaves it unbounded above. Every numeric flag declares its range
    // (max > min), and --help shows it. Defaults are not checked: a default
    // outside the range (0 = "the preset's") is how a flag says "not given".
    double min, max;
    int min_open;
} FlagSpec;

// Parses --name value and --name=value. --help (or -h) prints `usage` (the
// synopsis line and a paragraph), then the table with defaults, and exits 0
// on rank 0 (other ranks exit 0 silently). Positional arguments are errors.
void flags_parse(int argc, char **argv, FlagSpec *specs, int nspecs, const char *usage);
// The parser itself, for callers that must not exit (tests, the fuzzer):
// returns 0, FLAGS_HELP when --help or -h was given (nothing is printed), or
// FLAGS_BAD with the one-line message in err.
enum { FLAGS_OK = 0, FLAGS_BAD = 1, FLAGS_HELP = 2 };
int flags_parse_args(int argc, char **argv, FlagSpec *specs, int nspecs, char *err, size_t err_len);
// "1 <= B <= 1048576", "X > 0": the range of a numeric flag, with its meta as the name.
void flags_range_text(const FlagSpec *f, char *out, size_t n);
// The value as text ("0.001", "20", "on", the string, or "" when unset):
// exact for doubles (%.17g), so that text compares equal only for equal values.
void flags_value_text(const FlagSpec *f, char *out, size_t n);
// The bytes at the start of `text` that are well-formed UTF-8: strlen(text)
// when all are. JSON text is UTF-8, so a value for a JSON record must be.
size_t flags_utf8_prefix(const char *text);
const FlagSpec *flags_find(const FlagSpec *specs, int nspecs, const char *name);
// Whether --name (or --name=...) is on the command line, for the rare flag
// that must be known before parsing (MPI's thread level is set at MPI_Init).
int flags_present(int argc, char **argv, const char *name);
// The value of --name VALUE or --name=VALUE on the command line, or NULL when
// the flag is absent (for a file that must be read before parsing, such as
// --deepspeed-config, whose values become the other flags' defaults).
const char *flags_value(int argc, char **argv, const char *name);
// Parses `value` into f's destination by the rules of the command line (a
// number finite and in its range, a string not empty); 0, or
// nonzero with what was wrong in err ("expects a whole number, got 'x'"),
// naming neither the flag nor where the value came from: the caller does.
int flags_parse_value(const FlagSpec *f, const char *value, char *err, size_t err_len);
// Parses "7.5e9", "7.5B", "350M", "12k", "124000000"; returns 0 on success.
int parse_count(const char *s, double *out);
