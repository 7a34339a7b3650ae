/*
 * Incremental tokenizer for Chrome-trace / Kineto JSON.
 *
 * The caller owns every buffer.  It feeds bytes with st_tok_feed(); the
 * tokenizer consumes whole items (a top-level member, or one event) and
 * reports how many bytes it consumed.  A chunk may end anywhere, even inside a
 * token: the unconsumed tail must be passed again, followed by more input, on
 * the next call.  Records go into caller-provided arrays; when one is full the
 * call returns ST_OUTPUT_FULL and the caller drains and calls again.  Every
 * byte of a stored record is written (padding included), so the arrays need
 * not be cleared beforehand.
 *
 * A context holds the per-rank string table and the top-level metadata members
 * (copied, so they outlive the caller's buffer); there is no global state.
 */
#ifndef ST_TOKENIZER_H
#define ST_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "st_records.h"

/* CDEF BEGIN */
/* Return codes (negative = error; st_tok_error() has the message). */
#define ST_OK 0             /* consumed all it could; feed more input */
#define ST_OUTPUT_FULL 1    /* an output array is full: drain it, call again */
#define ST_DONE 2           /* the JSON document is complete */
#define ST_TRUNCATED 3      /* eof inside the document: complete items kept */
#define ST_ERR_SYNTAX -1    /* malformed JSON or not a trace */
#define ST_ERR_LIMIT -2     /* a configured limit was exceeded */
#define ST_ERR_NOMEM -3
#define ST_ERR_DATA -4      /* corrupt compressed data */

typedef struct st_tok st_tok;

typedef struct st_tok_options {
    int keep_pyfunc;            /* keep cat=python_function events */
    uint32_t max_depth;         /* JSON nesting limit (0: default 256) */
    uint64_t max_string_bytes;  /* interned bytes limit (0: default 1 GiB) */
    int drop_flows;             /* drop flow events (ph "s", "f", "t"), for consumers that use none */
    int align_only;             /* drop complete ("X") events align never reads: see align_wants() */
} st_tok_options;

typedef struct st_tok_out {
    st_event *events;
    size_t events_cap;
    size_t n_events;
    st_kernel *kernels;
    size_t kernels_cap;
    size_t n_kernels;
    st_comm *comms;
    size_t comms_cap;
    size_t n_comms;
    size_t n_meta;      /* set by st_tok_feed: top-level members waiting in st_tok_meta (lets the
                           caller skip the calls that take them, each a GIL hand-off in Python) */
} st_tok_out;

typedef struct st_tok_counts {
    uint64_t events_seen;       /* every event object in the array */
    uint64_t events_stored;
    uint64_t pyfunc_skipped;
    uint64_t flows_skipped;     /* with drop_flows */
    uint64_t align_skipped;     /* with align_only */
    uint64_t bad_numbers;       /* numbers out of int64 range or not numbers */
    uint64_t string_times;      /* "ts" or "dur" given as a JSON string ("ts": "123"): left empty */
    uint64_t bytes_consumed;    /* absolute offset of the next unconsumed byte */
    uint32_t doc_started;       /* the root '{' or '[' has been read */
    uint32_t saw_events;        /* a traceEvents array (or a bare root array) began */
    uint32_t bare_array;        /* legacy layout: the root is the events array */
    uint32_t doc_done;          /* the root value is complete */
} st_tok_counts;

int st_tok_create(st_tok **out, const st_tok_options *options);
void st_tok_destroy(st_tok *tok);
int st_tok_feed(st_tok *tok, const char *buf, size_t len, int eof,
                st_tok_out *out, size_t *consumed);
const char *st_tok_error(const st_tok *tok);
uint64_t st_tok_error_offset(const st_tok *tok);
void st_tok_get_counts(const st_tok *tok, st_tok_counts *counts);

/* Interned strings: ids 0..count-1, raw JSON-escaped bytes (no quotes). */
uint32_t st_tok_string_count(const st_tok *tok);
int st_tok_string(const st_tok *tok, uint32_t id, const char **ptr, size_t *len);

/* Top-level members other than traceEvents, raw JSON text, in input order.
 * st_tok_meta_clear() forgets the ones the caller has taken. */
size_t st_tok_meta_count(const st_tok *tok);
int st_tok_meta(const st_tok *tok, size_t i, const char **key, size_t *key_len,
                const char **value, size_t *value_len);
void st_tok_meta_clear(st_tok *tok);

/* Streaming gzip/zlib inflate (multi-member gzip supported). */
typedef struct st_inflate st_inflate;
int st_inflate_create(st_inflate **out);
void st_inflate_destroy(st_inflate *inf);
/* Returns ST_OK, ST_DONE (at a member end with no input left), or an error. */
int st_inflate_run(st_inflate *inf, const unsigned char *in, size_t in_len,
                   unsigned char *out, size_t out_cap,
                   size_t *in_used, size_t *out_made);
int st_inflate_at_member_end(const st_inflate *inf);
const char *st_inflate_error(const st_inflate *inf);
/* CDEF END */

#endif
