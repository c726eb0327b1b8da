// fuzz_flags.c: libFuzzer target for the flag parser (flags_parse_args): the
// input is an argument list, NUL-separated, against a table with a flag of
// every type and range. The parser must accept or refuse with one line;
// every number it accepts must be finite and within its flag's range.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "flags.h"

#define MAX_ARGS 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    char *argv[MAX_ARGS + 1] = {"fuzz"};
    int argc = 1;
    for (size_t at = 0; at <= size && argc < MAX_ARGS; at += strlen(text + at) + 1) argv[argc++] = text + at;
    int steps = 20, seed = 0, quiet = 0;
    double lr = 1e-3, clip = 1, params = 0;
    const char *name = NULL;
    FlagSpec specs[] = {
        {.name = "steps", .type = FLAG_INT, .dst = &steps, .meta = "N", .help = "", .min = 1, .max = 10000000},
        {.name = "seed", .type = FLAG_INT, .dst = &seed, .meta = "N", .help = "", .min = 0, .max = 2147483647},
        {.name = "lr", .type = FLAG_DOUBLE, .dst = &lr, .meta = "X", .help = "", .min = 0, .min_open = 1, .max = 1e38},
        {.name = "grad-clip", .type = FLAG_DOUBLE, .dst = &clip, .meta = "X", .help = "", .min = 0, .max = INFINITY},
        {.name = "params", .type = FLAG_COUNT, .dst = &params, .meta = "COUNT", .help = "", .min = 1, .max = 1e15},
        {.name = "model", .type = FLAG_STRING, .dst = &name, .meta = "NAME", .help = ""},
        {.name = "quiet", .type = FLAG_BOOL, .dst = &quiet, .help = ""},
    };
    char err[512] = "";
    int rc = flags_parse_args(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]), err, sizeof err);
    if (rc == FLAGS_BAD && (!err[0] || strchr(err, '\n'))) abort();
    if (rc == FLAGS_OK) {
        if (steps < 1 || steps > 10000000 || seed < 0) abort();
        if (!(lr > 0 && lr <= 1e38) || !(clip >= 0 && isfinite(clip))) abort();
        if (specs[4].seen && !(params >= 1 && params <= 1e15)) abort();
        if (specs[5].seen && (!name || !name[0])) abort();
    }
    free(text);
    return 0;
}
