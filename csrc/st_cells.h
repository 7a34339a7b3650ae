/*
 * Report rows as text: the cells of a table, column by column, written row
 * after row into a caller's buffer (CSV lines, or the <row>/<c> elements of
 * an xlsx sheet).  Numbers are formatted here; every other cell is a text
 * the caller prepared once per distinct value and refers to by code.  The
 * caller owns every array; nothing is allocated.
 */
#ifndef ST_CELLS_H
#define ST_CELLS_H

#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define ST_CELLS_BAD_CODE -20   /* a code outside the column's table */
#define ST_CELLS_BAD_TABLE -21  /* table offsets not increasing, or past the table's bytes */
#define ST_CELLS_BAD_SCALE -22  /* a scale other than 0 or 3 */

typedef struct st_cell_column {
    const int64_t *values;    /* the numbers (NULL: every row has a code) */
    const int32_t *codes;     /* per row: a text of the table, or -1 for values[row]
                                 (NULL: every row is a number) */
    int32_t scale;            /* 0: values are integers, written in decimal;
                                 3: values are thousandths k, written as k / 1000
                                 with the fewest fraction digits, at least one
                                 ("1.5", "-0.001", "2.0") */
    const char *table;        /* the texts, back to back */
    size_t table_len;         /* bytes in table */
    const int64_t *table_off; /* text j is table[table_off[j] .. table_off[j + 1]) */
    size_t table_n;           /* texts in the table (table_off holds table_n + 1) */
} st_cell_column;

typedef struct st_row_format {
    const char *sep;        /* between two cells of a row */
    size_t sep_len;
    const char *row_open;   /* before a row's first cell */
    size_t row_open_len;
    const char *row_close;  /* after its last */
    size_t row_close_len;
    const char *num_open;   /* around every formatted number (texts come whole) */
    size_t num_open_len;
    const char *num_close;
    size_t num_close_len;
} st_row_format;

/* Write rows first .. n_rows - 1 of the n_cols columns into out[0..cap),
 * whole rows only, as many as fit.  Returns the number of rows written
 * (0 when not even one row fits: give a larger buffer) and their bytes in
 * *used, or a negative ST_CELLS_* code (nothing to be used).  Rows are
 * indices into every column's arrays, which must hold n_rows entries. */
int64_t st_format_rows(const st_cell_column *cols, size_t n_cols, size_t first, size_t n_rows,
                       const st_row_format *fmt, char *out, size_t cap, size_t *used);
/* CDEF END */

#endif
