// printer.c: text tables or one JSON object (see printer.h).
#include "printer.h"
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

// Characters on screen, not bytes: "Ψ" is two bytes of UTF-8.
static int display_width(const char *s) {
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void pad_text(FILE *f, const char *s, int width, int right_align) {
    int gap = width - display_width(s);
    if (right_align) for (int i = 0; i < gap; i++) fputc(' ', f);
    fputs(s, f);
    if (!right_align) for (int i = 0; i < gap; i++) fputc(' ', f);
}

// The digits of |v|: whole numbers below 2^53 exactly (a double holds every
// one of them), with two decimals below 1e13 (|v| x 100 still exact); past
// 2^53 a double keeps about 16 significant digits, so 15 are printed and
// the rest are zeros rather than the binary value's noise.
static void whole_digits(double a, char *digits, size_t n, int *cents) {
    *cents = 0;
    if (a < 1e13) {
        double c = floor(a * 100 + 0.5), whole = floor(c / 100);
        *cents = (int)(c - whole * 100);
        snprintf(digits, n, "%.0f", whole);
    } else if (a < 9007199254740992.0) {
        snprintf(digits, n, "%.0f", floor(a + 0.5));
    } else {
        char e[40];
        snprintf(e, sizeof e, "%.14e", a);  // "8.75008750000000e+19"
        int exp10 = atoi(strchr(e, 'e') + 1);
        size_t k = 0;
        for (const char *p = e; *p != 'e' && k + 1 < n; p++)
            if (*p != '.') digits[k++] = *p;
        while ((int)k <= exp10 && k + 1 < n) digits[k++] = '0';
        digits[k] = 0;
    }
}

const char *format_grouped(double v, char *buf, size_t n) {
    if (isnan(v)) { snprintf(buf, n, "-"); return buf; }
    if (isinf(v)) { snprintf(buf, n, "unbounded"); return buf; }
    char digits[400], out[600];
    int frac;
    whole_digits(fabs(v), digits, sizeof digits, &frac);
    size_t len = strlen(digits), o = 0;
    if (v < 0 && (frac > 0 || strcmp(digits, "0") != 0)) out[o++] = '-';
    for (size_t i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0) out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = 0;
    if (frac) snprintf(buf, n, "%s.%02d", out, frac);
    else snprintf(buf, n, "%s", out);
    return buf;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_number(FILE *f, double v) {
    if (!isfinite(v)) fputs("null", f);
    else if (v == floor(v) && fabs(v) < 9e15) fprintf(f, "%.0f", v);
    else fprintf(f, "%.15g", v);
}

// Starts a member of the open JSON container: comma, then "key": when keyed.
static void json_member(Printer *p, const char *key) {
    if (p->count[p->depth]++ > 0) fputc(',', p->f);
    if (key) {
        json_string(p->f, key);
        fputc(':', p->f);
    }
}

static void json_open(Printer *p, const char *key, char bracket) {
    json_member(p, key);
    fputc(bracket, p->f);
    CHECK(p->depth + 1 < PRINTER_MAX_DEPTH, "printer: nesting deeper than %d", PRINTER_MAX_DEPTH);
    p->count[++p->depth] = 0;
}

static void json_close(Printer *p, char bracket) {
    fputc(bracket, p->f);
    p->depth--;
}

void printer_begin(Printer *p, FILE *f, int json, int enabled) {
    memset(p, 0, sizeof *p);
    p->f = f;
    p->json = json;
    p->enabled = enabled;
    if (enabled && json) {
        fputc('{', f);
        p->depth = 0;
        p->count[0] = 0;
    }
}

void printer_end(Printer *p) {
    if (!p->enabled) return;
    fputs(p->json ? "}\n" : "", p->f);
    fflush(p->f);
}

void printer_section(Printer *p, const char *key, const char *title) {
    if (!p->enabled) return;
    p->nnotes = 0;
    if (p->json) json_open(p, key, '{');
    else fprintf(p->f, "\n%s\n", title);
}

void printer_section_end(Printer *p) {
    if (!p->enabled || !p->json) return;
    if (p->nnotes) {
        json_open(p, "notes", '[');
        for (int i = 0; i < p->nnotes; i++) {
            json_member(p, NULL);
            json_string(p->f, p->notes[i]);
        }
        json_close(p, ']');
    }
    p->nnotes = 0;
    json_close(p, '}');
}

// A fixed-point format ("%.1f") past 1e12 prints the binary value's noise
// to the last digit (63 of them at a link of 1e-300 Gbit/s): four significant
// digits there say all the figure knows.
static void text_number(char *buf, size_t n, double v, const char *fmt) {
    if (isnan(v)) snprintf(buf, n, "-");
    else if (isinf(v)) snprintf(buf, n, "unbounded");
    else if (strcmp(fmt, PRINT_GROUPED) == 0) format_grouped(v, buf, n);
    else if (fabs(v) >= 1e12 && strchr(fmt, 'f')) snprintf(buf, n, "%.4g", v);
    else snprintf(buf, n, fmt, v);
}

void printer_num(Printer *p, const char *key, const char *label, double v, const char *fmt,
                 const char *unit) {
    if (!p->enabled) return;
    if (p->json) {
        json_member(p, key);
        json_number(p->f, v);
        return;
    }
    char buf[64];
    text_number(buf, sizeof buf, v, fmt);
    fprintf(p->f, "  %s: %s%s%s\n", label, buf, unit ? " " : "", unit ? unit : "");
}

void printer_str(Printer *p, const char *key, const char *label, const char *s) {
    if (!p->enabled) return;
    if (p->json) {
        json_member(p, key);
        json_string(p->f, s);
    } else {
        fprintf(p->f, "  %s: %s\n", label, s);
    }
}

void printer_bool(Printer *p, const char *key, const char *label, int v) {
    if (!p->enabled) return;
    if (p->json) {
        json_member(p, key);
        fputs(v ? "true" : "false", p->f);
    } else {
        fprintf(p->f, "  %s: %s\n", label, v ? "yes" : "no");
    }
}

void printer_note(Printer *p, const char *fmt, ...) {
    if (!p->enabled) return;
    char buf[PRINTER_NOTE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    // a note cut short would read as whole (issue 39: "A trainer adds " ended one)
    CHECK(len >= 0 && (size_t)len < sizeof buf, "printer: a note of %d bytes, past the %zu the printer holds: "
          "\"%.60s...\"", len, sizeof buf, buf);
    if (!p->json) {
        fprintf(p->f, "  %s\n", buf);
    } else {
        CHECK(p->nnotes < PRINTER_MAX_NOTES, "printer: more than %d notes in one section", PRINTER_MAX_NOTES);
        memcpy(p->notes[p->nnotes++], buf, sizeof buf);
    }
}

void printer_table(Printer *p, const char *key, const Col *cols, int ncols) {
    p->cols = cols;
    p->ncols = ncols;
    if (!p->enabled) return;
    if (p->json) {
        json_open(p, key, '[');
        return;
    }
    int total = 0;
    fputs("  ", p->f);
    for (int i = 0; i < ncols; i++) {
        int last = i + 1 == ncols;
        pad_text(p->f, cols[i].header, last && !cols[i].fmt ? 0 : cols[i].width, cols[i].fmt != NULL);
        fputs(i + 1 < ncols ? "  " : "\n", p->f);
        total += cols[i].width + (i + 1 < ncols ? 2 : 0);
    }
    fputs("  ", p->f);
    for (int i = 0; i < total; i++) fputc('-', p->f);
    fputc('\n', p->f);
}

void printer_row(Printer *p, const Cell *cells) {
    if (!p->enabled) return;
    if (p->json) {
        json_open(p, NULL, '{');
        for (int i = 0; i < p->ncols; i++) {
            json_member(p, p->cols[i].key);
            if (cells[i].s) json_string(p->f, cells[i].s);
            else json_number(p->f, cells[i].v);
        }
        json_close(p, '}');
        return;
    }
    fputs("  ", p->f);
    for (int i = 0; i < p->ncols; i++) {
        char buf[64];
        const char *text = cells[i].s;
        if (!text) text_number(buf, sizeof buf, cells[i].v, p->cols[i].fmt ? p->cols[i].fmt : "%g");
        int last = i + 1 == p->ncols;  // no trailing blanks after a left-aligned last column
        pad_text(p->f, text ? text : buf, last && cells[i].s ? 0 : p->cols[i].width, cells[i].s == NULL);
        fputs(i + 1 < p->ncols ? "  " : "\n", p->f);
    }
}

void printer_table_end(Printer *p) {
    if (p->enabled && p->json) json_close(p, ']');
    p->cols = NULL;
    p->ncols = 0;
}
