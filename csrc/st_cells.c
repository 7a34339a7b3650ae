/* Report rows as text.  See st_cells.h. */
#include "st_cells.h"

#include <string.h>

/* the longest formatted number: "-" 20 digits "." 3 digits */
#define NUMBER_MAX 25

/* Append len bytes at out + *pos when they fit in cap; 0 when they do not. */
static int put(char *out, size_t cap, size_t *pos, const char *s, size_t len)
{
    if (cap - *pos < len)
        return 0;
    if (len)
        memcpy(out + *pos, s, len);
    *pos += len;
    return 1;
}

/* Decimal digits of u at p; returns how many (1..20). */
static size_t put_digits(char *p, uint64_t u)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    for (size_t i = 0; i < n; i++)
        p[i] = tmp[n - 1 - i];
    return n;
}

/* v (scale 0) or v / 1000 (scale 3) at p; returns the length (<= NUMBER_MAX). */
static size_t put_number(char *p, int64_t v, int32_t scale)
{
    size_t n = 0;
    /* magnitude in unsigned arithmetic: -INT64_MIN does not fit an int64 */
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (v < 0)
        p[n++] = '-';
    if (scale == 0)
        return n + put_digits(p + n, u);
    n += put_digits(p + n, u / 1000);
    p[n++] = '.';
    unsigned frac = (unsigned)(u % 1000);
    if (frac == 0) {
        p[n++] = '0';
        return n;
    }
    char d[3] = {(char)('0' + frac / 100), (char)('0' + frac / 10 % 10), (char)('0' + frac % 10)};
    size_t keep = d[2] != '0' ? 3 : d[1] != '0' ? 2 : 1;
    memcpy(p + n, d, keep);
    return n + keep;
}

static int check_column(const st_cell_column *c)
{
    if (c->scale != 0 && c->scale != 3)
        return ST_CELLS_BAD_SCALE;
    if (!c->values && !c->codes)
        return ST_CELLS_BAD_CODE;
    if (c->table_n) {
        if (!c->table_off || (!c->table && c->table_len))
            return ST_CELLS_BAD_TABLE;
        if (c->table_off[0] < 0)
            return ST_CELLS_BAD_TABLE;
        for (size_t j = 0; j < c->table_n; j++)
            if (c->table_off[j + 1] < c->table_off[j])
                return ST_CELLS_BAD_TABLE;
        if ((uint64_t)c->table_off[c->table_n] > c->table_len)
            return ST_CELLS_BAD_TABLE;
    }
    return 0;
}

/* Append one cell of column c, row r; 1 written, 0 no room, < 0 an error. */
static int put_cell(const st_cell_column *c, size_t r, const st_row_format *fmt, char *out, size_t cap,
                    size_t *pos)
{
    int32_t code = c->codes ? c->codes[r] : -1;
    if (code >= 0) {
        if ((size_t)code >= c->table_n)
            return ST_CELLS_BAD_CODE;
        int64_t a = c->table_off[code], b = c->table_off[code + 1];
        return put(out, cap, pos, c->table + a, (size_t)(b - a));
    }
    if (code != -1 || !c->values)
        return ST_CELLS_BAD_CODE;
    if (cap - *pos < fmt->num_open_len + NUMBER_MAX + fmt->num_close_len)
        return 0;
    put(out, cap, pos, fmt->num_open, fmt->num_open_len);
    *pos += put_number(out + *pos, c->values[r], c->scale);
    put(out, cap, pos, fmt->num_close, fmt->num_close_len);
    return 1;
}

int64_t st_format_rows(const st_cell_column *cols, size_t n_cols, size_t first, size_t n_rows,
                       const st_row_format *fmt, char *out, size_t cap, size_t *used)
{
    *used = 0;
    for (size_t k = 0; k < n_cols; k++) {
        int rc = check_column(&cols[k]);
        if (rc)
            return rc;
    }
    size_t pos = 0;
    int64_t rows = 0;
    for (size_t r = first; r < n_rows; r++) {
        size_t row_start = pos;
        int ok = put(out, cap, &pos, fmt->row_open, fmt->row_open_len);
        for (size_t k = 0; ok > 0 && k < n_cols; k++) {
            if (k && !put(out, cap, &pos, fmt->sep, fmt->sep_len)) {
                ok = 0;
                break;
            }
            ok = put_cell(&cols[k], r, fmt, out, cap, &pos);
        }
        if (ok > 0)
            ok = put(out, cap, &pos, fmt->row_close, fmt->row_close_len);
        if (ok < 0)
            return ok;
        if (!ok) {  /* the row does not fit: it is left out whole */
            pos = row_start;
            break;
        }
        rows++;
    }
    *used = pos;
    return rows;
}
