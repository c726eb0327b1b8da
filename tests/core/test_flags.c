// test_flags.c: the shared flag parser's one rule for numbers (finite and
// within the range the spec declares, else one message naming the flag and
// the range), empty strings refused, and a numeric flag without a range
// caught as the bug it is; a refusal is one line whatever it quotes. The
// parser is called through flags_parse_args, which returns instead of
// exiting.
#include <float.h>
#include <limits.h>
#include "testutil.h"
#include "flags.h"

typedef struct Vals {
    int n;
    double x, count;
    const char *path;
} Vals;

enum { NSPECS = 4 };

static void specs_of(Vals *v, FlagSpec *s) {
    memset(v, 0, sizeof *v);
    v->n = 4;
    v->x = 0.5;
    FlagSpec t[NSPECS] = {
        {.name = "n", .type = FLAG_INT, .dst = &v->n, .meta = "N", .help = "an int", .min = 1, .max = 100},
        {.name = "x", .type = FLAG_DOUBLE, .dst = &v->x, .meta = "X", .help = "a rate", .min = 0, .min_open = 1,
         .max = FLT_MAX},
        {.name = "count", .type = FLAG_COUNT, .dst = &v->count, .meta = "COUNT", .help = "a count", .min = 1,
         .max = 1e15},
        {.name = "path", .type = FLAG_STRING, .dst = &v->path, .meta = "PATH", .help = "a path"},
    };
    memcpy(s, t, sizeof t);
}

// Parses one "--flag value" pair; returns the parser's code, message in err.
static int parse1(const char *flag, const char *value, Vals *v, char *err) {
    FlagSpec s[NSPECS];
    specs_of(v, s);
    char *argv[] = {"prog", (char *)flag, (char *)value, NULL};
    err[0] = 0;
    return flags_parse_args(value ? 3 : 2, argv, s, NSPECS, err, 256);
}

static void expect_bad(const char *flag, const char *value, const char *want) {
    Vals v;
    char err[256];
    int rc = parse1(flag, value, &v, err);
    if (rc != FLAGS_BAD || !strstr(err, want))
        fail_msg("%s %s: code %d, message '%s'; expected it refused with '%s'", flag, value, rc, err, want);
}

static void test_numbers_out_of_range(void **state) {
    (void)state;
    expect_bad("--n", "0", "--n 0 is out of range: give 1 <= N <= 100");
    expect_bad("--n", "101", "1 <= N <= 100");
    expect_bad("--n", "99999999999999999999", "out of range");  // beyond a long
    expect_bad("--n", "2.5", "whole number");
    expect_bad("--x", "0", "--x 0 is out of range: give 0 < X <= 3.40282e+38");
    expect_bad("--x", "-1", "0 < X");
    expect_bad("--x", "1e39", "out of range");  // finite as a double, not as the fp32 it becomes
    expect_bad("--count", "2e15", "1 <= COUNT <= 1e+15");
}

static void test_non_finite_refused(void **state) {
    (void)state;
    const char *vals[] = {"nan", "inf", "-inf", "NAN", "infinity", "1e400"};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        expect_bad("--x", vals[i], "not a finite number");
        if (vals[i][0] != '-') expect_bad("--count", vals[i], "not a finite number");
    }
}

static void test_values_in_range_are_set(void **state) {
    (void)state;
    Vals v;
    char err[256];
    assert_int_equal(parse1("--n", "100", &v, err), FLAGS_OK);
    assert_int_equal(v.n, 100);
    assert_int_equal(parse1("--x=1e-30", NULL, &v, err), FLAGS_OK);
    assert_true(v.x == 1e-30);
    assert_int_equal(parse1("--count", "7.5B", &v, err), FLAGS_OK);
    assert_true(v.count == 7.5e9);
    assert_int_equal(parse1("--path", "a", &v, err), FLAGS_OK);
    assert_string_equal(v.path, "a");
    assert_int_equal(parse1("--help", NULL, &v, err), FLAGS_HELP);
}

static void test_empty_string_refused(void **state) {
    (void)state;
    expect_bad("--path", "", "--path was given an empty PATH");
    expect_bad("--path=", NULL, "empty");
}

// Found by the fuzzer (tests/fuzz/corpus/fuzz_flags/line_break_in_name): a
// message quoting what was given printed its line break, so the refusal
// took two lines. Control characters in it read as '?'.
static void test_refusal_is_one_line(void **state) {
    (void)state;
    expect_bad("--n", "4\r", "expects a whole number, got '4?'");
    expect_bad("--x", "inf\n--n", "expects a number, got 'inf?--n'");
    Vals v;
    FlagSpec s[NSPECS];
    specs_of(&v, s);
    char *argv[] = {"prog", "--n\n5--x", NULL}, err[256];
    assert_int_equal(flags_parse_args(2, argv, s, NSPECS, err, sizeof err), FLAGS_BAD);
    if (!strstr(err, "unknown option --n?5--x") || strchr(err, '\n')) fail_msg("message '%s'", err);
}

static void test_range_text(void **state) {
    (void)state;
    char buf[96];
    int i = 0;
    FlagSpec a = {.name = "a", .type = FLAG_INT, .dst = &i, .meta = "N", .min = 0, .max = INT_MAX};
    flags_range_text(&a, buf, sizeof buf);
    assert_string_equal(buf, "N >= 0");
    FlagSpec b = {.name = "b", .type = FLAG_DOUBLE, .meta = "X", .min = 0, .min_open = 1, .max = INFINITY};
    flags_range_text(&b, buf, sizeof buf);
    assert_string_equal(buf, "X > 0");
    FlagSpec c = {.name = "c", .type = FLAG_INT, .meta = "B", .min = 1, .max = 1 << 20};
    flags_range_text(&c, buf, sizeof buf);
    assert_string_equal(buf, "1 <= B <= 1048576");
}

static void test_value_text_is_exact(void **state) {
    (void)state;
    double x = 0.1 + 0.2;  // not 0.3: its text must say so
    FlagSpec f = {.name = "x", .type = FLAG_DOUBLE, .dst = &x, .min = 0, .max = 1};
    char buf[64];
    flags_value_text(&f, buf, sizeof buf);
    assert_true(strtod(buf, NULL) == x);
    assert_string_not_equal(buf, "0.3");
}

// What JSON's UTF-8 takes (and jansson's encoder): the valid prefix ends
// at a stray byte, a cut character, an overlong form, a surrogate or past U+10FFFF.
static void test_utf8_prefix(void **state) {
    (void)state;
    const struct {
        const char *text;
        size_t ok;
    } cases[] = {
        {"plain.txt", 9},         {"caf\xc3\xa9.txt", 9},      {"caf\xe9.txt", 3},
        {"\xf0\x9f\x98\x80!", 5}, {"cut \xe2\x82", 4},         {"\xc0\xaf overlong", 0},
        {"\xe0\x80\xaf", 0},       {"\xed\xa0\x80 surrogate", 0}, {"\xf4\x90\x80\x80", 0},
        {"\x80 alone", 0},         {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (flags_utf8_prefix(cases[i].text) != cases[i].ok)
            fail_msg("case %zu: %zu bytes valid, expected %zu", i, flags_utf8_prefix(cases[i].text), cases[i].ok);
}

// A numeric flag with no range is a bug in the program's table: the first
// parse stops with an internal error (status 1), whatever the command line.
static void parse_unranged(void) {
    int n = 0;
    FlagSpec s = {.name = "n", .type = FLAG_INT, .dst = &n, .meta = "N", .help = "no range"};
    char *argv[] = {"prog", NULL};
    char err[256];
    flags_parse_args(1, argv, &s, 1, err, sizeof err);
}

static void test_spec_without_range_is_a_bug(void **state) {
    (void)state;
    char *err = NULL;
    int rc = run_child(parse_unranged, &err);
    if (rc != 1 || !strstr(err, "--n declares no range")) fail_msg("exit %d:\n%s", rc, err);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers_out_of_range),
        cmocka_unit_test(test_non_finite_refused),
        cmocka_unit_test(test_values_in_range_are_set),
        cmocka_unit_test(test_empty_string_refused),
        cmocka_unit_test(test_refusal_is_one_line),
        cmocka_unit_test(test_range_text),
        cmocka_unit_test(test_value_text_is_exact),
        cmocka_unit_test(test_spec_without_range_is_a_bug),
        cmocka_unit_test(test_utf8_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
