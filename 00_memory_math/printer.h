// printer.h: memory_math's output, written once and printed either as text
// tables or as one JSON object (--json). A section holds values, tables and
// notes; in JSON a section is an object, a table an array of row objects and
// the notes an array of strings.
#pragma once
#include <stdio.h>

#define PRINTER_MAX_NOTES 16
#define PRINTER_NOTE_BYTES 1024  // a note's text; a longer one is an error, never cut
#define PRINTER_MAX_DEPTH 8

// A column: JSON key, text header, text width in characters, and how a number
// prints in text: a printf format for a double, or PRINT_GROUPED for a byte or
// element count with thousands separators. fmt NULL: the cell is a string.
#define PRINT_GROUPED ","
typedef struct Col {
    const char *key, *header;
    int width;
    const char *fmt;
} Col;

// A cell: a string (s != NULL) or a number v. NAN (not applicable) prints
// "-", an infinity "unbounded"; both are null in JSON.
typedef struct Cell {
    const char *s;
    double v;
} Cell;
static inline Cell cell_num(double v) { Cell c = {NULL, v}; return c; }
static inline Cell cell_str(const char *s) { Cell c = {s, 0}; return c; }

typedef struct Printer {
    FILE *f;
    int json, enabled;              // enabled: this rank prints (rank 0)
    int depth, count[PRINTER_MAX_DEPTH];  // JSON nesting and members written at each level
    const Col *cols;                // the open table
    int ncols;
    char notes[PRINTER_MAX_NOTES][PRINTER_NOTE_BYTES];
    int nnotes;
} Printer;

void printer_begin(Printer *p, FILE *f, int json, int enabled);
void printer_end(Printer *p);
void printer_section(Printer *p, const char *key, const char *title);
void printer_section_end(Printer *p);  // writes the section's notes
// "  label: value unit" in text; "key": value in JSON
void printer_num(Printer *p, const char *key, const char *label, double v, const char *fmt,
                 const char *unit);
void printer_str(Printer *p, const char *key, const char *label, const char *s);
void printer_bool(Printer *p, const char *key, const char *label, int v);
__attribute__((format(printf, 2, 3))) void printer_note(Printer *p, const char *fmt, ...);
void printer_table(Printer *p, const char *key, const Col *cols, int ncols);
void printer_row(Printer *p, const Cell *cells);
void printer_table_end(Printer *p);

// 7500001280 -> "7,500,001,280"; up to two decimals when not whole.
const char *format_grouped(double v, char *buf, size_t n);
