/*
 * Row selection over an EVENTS record array by the classes of its string
 * ids: one pass over the records, for the in-process consumers (align,
 * correlate) that keep a few kinds of events out of every frame; and the
 * gather of the selected rows' fields into the consumers' own arrays, also
 * in one pass.  The caller owns every array; nothing is allocated.
 */
#ifndef ST_SELECT_H
#define ST_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "st_records.h"

/* CDEF BEGIN */
typedef struct st_select_rule {
    uint16_t cat_any;    /* the category's class has one of these bits */
    uint16_t name_any;   /* and the name's class one of these (0: any name) */
    uint16_t flags_all;  /* and the record has every one of these ST_F_* flags */
    uint8_t ph;          /* and this phase character (0: any phase) */
} st_select_rule;

/* Indices of the records ev[0..n) that meet the rule, in increasing order,
 * written to out[0..cap); returns how many were written (at most cap: give
 * cap >= n for all of them).  cls[id] holds the class bits of string id
 * id for id < n_cls; any other id (ST_NOSTR, not yet defined) has none. */
size_t st_select(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                 const st_select_rule *rule, int64_t *out, size_t cap);

/* Several selections in one pass over the records (each record's classes
 * looked up once): out[k][0..cap) receives the indices of the records
 * meeting rules[k], in increasing order, and counts[k] how many were
 * written (at most cap). */
void st_select_many(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                    const st_select_rule *rules, size_t n_rules, int64_t *const *out, size_t cap,
                    size_t *counts);

/* The same selection written as time spans, in one pass: start (ts), end
 * (ts + dur), thread (tid; a string tid, ST_F_TID_STR, as -1 - its string id
 * so that it never equals an integer tid) and name of each row kept.  Each
 * output holds cap entries; returns how many rows were written. */
size_t st_select_spans(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                       const st_select_rule *rule, int64_t *start, int64_t *end, int64_t *thread,
                       uint32_t *name, size_t cap);

/* st_gather return codes */
#define ST_GATHER_OK 0
#define ST_GATHER_BAD_FIELD -1   /* a field outside the record, or a size not 1, 2, 4 or 8, or narrowing */
#define ST_GATHER_BAD_ROW -2     /* a row index outside [0, n_rec) */

/* One output column of st_gather: the record field of src_size bytes at
 * byte offset src_off, as an integer (sign-extended when src_signed), is
 * written in dst_size (>= src_size) bytes to dst + k * dst_stride for the
 * k-th row.  Same sizes copy the bytes as they are (floats too). */
typedef struct st_gather_field {
    size_t src_off;
    size_t dst_stride;
    void *dst;
    uint8_t src_size;
    uint8_t dst_size;
    uint8_t src_signed;
} st_gather_field;

/* The fields of records rows[0..n_rows) of rec (n_rec records of rec_size
 * bytes each), written to each field's destination, in one pass over the
 * rows.  Every field and every row index is checked before anything is
 * written: on an error nothing is. */
int st_gather(const void *rec, size_t n_rec, size_t rec_size, const int64_t *rows, size_t n_rows,
              const st_gather_field *fields, size_t n_fields);
/* CDEF END */

#endif
