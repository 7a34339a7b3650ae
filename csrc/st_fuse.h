/*
 * st_fuse: the streaming rewriter behind `streamtrace fuse`.
 *
 * One st_fuse context handles one rank's trace.  Like the tokenizer, it walks
 * the document item by item (top-level members, then the events of the
 * traceEvents array) over a caller buffer; an item cut by the end of the
 * buffer is abandoned and its first byte reported as the consumption point, so
 * the caller passes it again followed by more input.  Nothing is global.
 *
 * Every event is validated as strict JSON while it is scanned (strings,
 * escapes, UTF-8, numbers, nesting).  What cannot be written as strict JSON is
 * repaired in the output rather than refused: NaN/Infinity and other bare
 * words become null, invalid escapes keep their backslash as a character,
 * control characters are escaped, invalid UTF-8 and lone surrogate escapes
 * become U+FFFD, and of keys repeated in an object (at any depth, compared
 * decoded) only the last is written.  Broken structure (a missing ',' or
 * ':', mismatched brackets) is an error.
 *
 * Three passes use the same scanner, so they agree on event indices and on
 * which events are kept:
 *
 *   ST_FUSE_MODE_SCAN   filters each event and aggregates what the rewrite
 *                       needs: id ranges, the (pid, tid) tracks with their
 *                       thread names and whether they are GPU rows, the
 *                       top-level members, and the X intervals from which
 *                       st_fuse_finish_scan() assigns sibling lanes to X
 *                       events that overlap without nesting (with an external
 *                       sort: memory stays bounded, see below).
 *   ST_FUSE_MODE_WRITE  writes each kept event, rewritten, as compact JSON
 *                       into the caller's output buffer (events separated by
 *                       ','; see ST_FUSE_COMMA_FIRST).
 *   ST_FUSE_MODE_SPANS  reports the byte span of every event (except
 *                       process_* metadata) so a caller can run its own
 *                       predicate; the result comes back as a keep mask.
 *
 * Rewrites in write mode (see docs/fuse.md): int pids through the pid map;
 * string pids get " (rank R)" appended ("" becomes "(rank R)"); int `id`,
 * args.correlation and args["External id"] / args["external id"] get
 * id_offset added; ts gets ts_shift_ns added with exact decimal arithmetic;
 * an X event moved to a sibling lane gets that lane's tid; args (created if
 * absent) gets "rank" and the originals of every rewritten field ("pid_raw",
 * "tid_raw", "lane", "id_raw", "correlation_raw", "External id_raw",
 * "external id_raw").
 */
#ifndef ST_FUSE_H
#define ST_FUSE_H

#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define ST_FUSE_OK 0            /* consumed all it could: feed more input */
#define ST_FUSE_OUTPUT_FULL 1   /* the output buffer (or span array) is full: drain it */
#define ST_FUSE_DONE 2          /* the JSON document is complete */
#define ST_FUSE_TRUNCATED 3     /* eof inside the document: complete events handled */
#define ST_FUSE_NAME 4          /* an event name needs a decision: st_fuse_pending_name() */
#define ST_FUSE_OUTPUT_SMALL 5  /* one event does not fit the empty output buffer: grow it */
#define ST_FUSE_RUN 6           /* scan: a sorted run of intervals awaits st_fuse_take_run() */
#define ST_FUSE_MERGE 7         /* finish_scan: runs were handed out: merge them */
#define ST_FUSE_NEED_RUN 8      /* st_fuse_merge(): feed the next chunk of run *need_run */
#define ST_FUSE_ERR_SYNTAX -1   /* malformed JSON or not a trace */
#define ST_FUSE_ERR_LIMIT -2    /* nesting, member count or event count limit */
#define ST_FUSE_ERR_NOMEM -3
#define ST_FUSE_ERR_USAGE -5    /* the API was called out of order */

#define ST_FUSE_MODE_SCAN 0
#define ST_FUSE_MODE_WRITE 1
#define ST_FUSE_MODE_SPANS 2

/* st_fuse_config.flags */
#define ST_FUSE_KEEP_PYFUNC 1   /* keep cat "python_function" */
#define ST_FUSE_KEEP_SPANS 2    /* keep cat "Trace" (the profiler window span) */
#define ST_FUSE_NCCL_ONLY 4     /* only kernel events whose name contains "nccl" (any case) */
#define ST_FUSE_WINDOW 8        /* only events meeting [window_lo_ns, window_hi_ns] after the shift */
#define ST_FUSE_NAME_FILTER 16  /* event names are decided by the caller (ST_FUSE_NAME) */
#define ST_FUSE_CAT_FILTER 32   /* only events whose cat was given to st_fuse_add_cat() */
#define ST_FUSE_KEEP_MASK 64    /* the mask of st_fuse_set_keep_mask() alone decides */
#define ST_FUSE_COMMA_FIRST 128 /* write mode: put ',' before the first event too */

/* st_fuse_track.flags */
#define ST_FUSE_T_PID_INT 1
#define ST_FUSE_T_PID_STR 2
#define ST_FUSE_T_TID_INT 4
#define ST_FUSE_T_TID_STR 8
#define ST_FUSE_T_GPU 16        /* a kept kernel / memcpy / memset / GPU annotation is on it */
#define ST_FUSE_T_NAMED 32      /* a thread_name record was seen */
#define ST_FUSE_T_SORTED 64     /* a thread_sort_index record was seen */

typedef struct st_fuse st_fuse;

typedef struct st_fuse_config {
    int64_t rank;            /* written as args.rank and into string pids */
    int64_t id_offset;       /* added to int id, args.correlation, args.External id */
    int64_t pid_offset;      /* added to int pids that are not in the pid map */
    int64_t ts_shift_ns;     /* added to every ts */
    int64_t window_lo_ns;    /* ST_FUSE_WINDOW, on the shifted timeline */
    int64_t window_hi_ns;
    uint32_t flags;          /* ST_FUSE_* filters and options */
    uint32_t max_depth;      /* JSON nesting limit (0: 256) */
    uint32_t interval_budget;/* X intervals held by a scan before a run is handed out (0: 2^18) */
    uint32_t reserved;
} st_fuse_config;

typedef struct st_fuse_span {
    uint64_t index;          /* event index in the array */
    uint64_t offset;         /* first byte, relative to this call's buffer */
    uint64_t length;
} st_fuse_span;

typedef struct st_fuse_out {
    char *buf;               /* write mode: rewritten events are appended at buf + len */
    size_t cap;
    size_t len;
    st_fuse_span *spans;     /* spans mode */
    size_t spans_cap;
    size_t n_spans;
} st_fuse_out;

typedef struct st_fuse_stats {
    uint64_t events_seen;         /* event objects in the array */
    uint64_t events_kept;         /* kept (written, in write mode) */
    uint64_t dropped_process_meta;/* process_name / process_sort_index / process_labels */
    uint64_t dropped_pyfunc;
    uint64_t dropped_trace;       /* cat "Trace" */
    uint64_t dropped_cat;
    uint64_t dropped_name;
    uint64_t dropped_nccl;
    uint64_t dropped_window;
    uint64_t dropped_mask;
    uint64_t dropped_no_process;  /* write mode: metadata of a process with no kept event */
    uint64_t bad_literals;        /* values such as NaN written as null */
    uint64_t repaired_strings;    /* strings with bad escapes, control bytes or bad UTF-8 */
    uint64_t ts_unshifted;        /* ts too long or too large to shift exactly: left as is */
    uint64_t id_overflow;         /* ids left as is because the offset would overflow */
    uint64_t lanes_forced;        /* X events still overlapping after the lane limit */
    uint64_t bytes_consumed;      /* absolute input offset of the next unconsumed byte */
    uint64_t bytes_written;
    int64_t pid_min, pid_max;     /* int pids of kept events (max < min: none) */
    int64_t id_min, id_max;       /* int id / correlation / External id of kept events */
    int64_t ts_min_ns, ts_max_ns; /* kept events, shifted; ts_max_ns includes dur */
    uint64_t lane_moves;          /* X events assigned to a lane >= 1 (st_fuse_finish_scan) */
    uint32_t doc_started;
    uint32_t saw_events;
    uint32_t bare_array;
    uint32_t doc_done;
} st_fuse_stats;

typedef struct st_fuse_track {
    int64_t pid;             /* when ST_FUSE_T_PID_INT */
    int64_t tid;             /* when ST_FUSE_T_TID_INT */
    const char *pid_str;     /* raw JSON-escaped text (no quotes) when ST_FUSE_T_PID_STR */
    size_t pid_len;
    const char *tid_str;
    size_t tid_len;
    const char *name;        /* thread_name args.name, raw, when ST_FUSE_T_NAMED */
    size_t name_len;
    int64_t sort_index;      /* thread_sort_index, when ST_FUSE_T_SORTED */
    uint64_t n_kept;         /* kept events other than metadata */
    uint64_t n_moved;        /* X events moved to a lane >= 1 */
    uint32_t n_lanes;        /* 1 + sibling lanes */
    uint32_t flags;          /* ST_FUSE_T_* */
} st_fuse_track;

int st_fuse_create(st_fuse **out, const st_fuse_config *config);
void st_fuse_destroy(st_fuse *f);
/* Replace the configuration (filters must stay the same between passes). */
int st_fuse_configure(st_fuse *f, const st_fuse_config *config);
/* Start a pass over the document from its first byte. */
int st_fuse_begin(st_fuse *f, int mode);
int st_fuse_feed(st_fuse *f, const char *buf, size_t len, int eof, st_fuse_out *out,
                 size_t *consumed);
const char *st_fuse_error(const st_fuse *f);
uint64_t st_fuse_error_offset(const st_fuse *f);
void st_fuse_get_stats(const st_fuse *f, st_fuse_stats *stats);

/* Filters. Cats are raw JSON string contents, compared byte for byte. */
int st_fuse_add_cat(st_fuse *f, const char *cat, size_t len);
/* ST_FUSE_NAME: the raw name awaiting a decision; then st_fuse_decide_name(). */
int st_fuse_pending_name(const st_fuse *f, const char **ptr, size_t *len);
int st_fuse_decide_name(st_fuse *f, int keep);
/* Bit i (byte i / 8, bit i % 8) keeps event i; events beyond n_events are dropped. */
int st_fuse_set_keep_mask(st_fuse *f, const uint8_t *bits, uint64_t n_events);

/*
 * Lanes need each track's X intervals in time order, and Kineto writes them
 * far out of order, so the scan sorts them externally: it holds at most
 * interval_budget of them; when the buffer is full, feed returns ST_FUSE_RUN
 * and the caller copies the sorted run out (st_fuse_take_run) and feeds again.
 * After the scan, st_fuse_finish_scan() assigns the lanes (ST_FUSE_OK) when
 * no run was handed out; otherwise it hands out the last run (ST_FUSE_RUN:
 * take it, call again) and returns ST_FUSE_MERGE: then st_fuse_merge_begin()
 * with the number of runs, and st_fuse_merge() until ST_FUSE_OK, feeding the
 * next chunk of run *need_run (st_fuse_merge_feed, last = 1 for its final
 * chunk) whenever it returns ST_FUSE_NEED_RUN.  A chunk must stay valid until
 * the next chunk of the same run is fed or the merge ends.
 */
int st_fuse_finish_scan(st_fuse *f);
int st_fuse_take_run(st_fuse *f, const void **records, size_t *n_records, size_t *record_size);
int st_fuse_merge_begin(st_fuse *f, size_t n_runs);
int st_fuse_merge_feed(st_fuse *f, size_t run, const void *records, size_t n_records, int last);
int st_fuse_merge(st_fuse *f, size_t *need_run);
size_t st_fuse_track_count(const st_fuse *f);
int st_fuse_get_track(const st_fuse *f, size_t i, st_fuse_track *out);
/* Write mode: the tid of lane k >= 1 of an int-tid track is first_tid + k - 1
 * (string tids become "<tid> (lane k)"). */
int st_fuse_set_lane_base(st_fuse *f, size_t track, int64_t first_tid);
/* Write mode: int pid -> new pid (pairs copied; unlisted pids: metadata is
 * dropped, other events get pid + pid_offset). */
int st_fuse_set_pid_map(st_fuse *f, const int64_t *raw, const int64_t *mapped, size_t n);

/* Top-level members other than traceEvents seen by a scan pass (raw JSON). */
size_t st_fuse_meta_count(const st_fuse *f);
int st_fuse_meta(const st_fuse *f, size_t i, const char **key, size_t *key_len,
                 const char **value, size_t *value_len);
/* CDEF END */

#endif
