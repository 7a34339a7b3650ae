/*
 * Streaming rewriter for `streamtrace fuse`.  See st_fuse.h.
 *
 * Each event is handled in two phases over the caller's buffer:
 *   A. scan: walk the object, validate every value as strict JSON, record
 *      the spans of its members (and of its args' members) and the fields
 *      the filters and rewrites need.  Nothing is committed, so an event cut
 *      by the end of the buffer, or one whose output does not fit, is simply
 *      handled again on the next call.
 *   B. decide and (write mode) emit: members are copied in input order,
 *      compacted; a value already compact and valid is copied with one
 *      memcpy, anything else is walked again with output on.
 * Per-event counters live in the event record and are added to the context's
 * statistics only when the event is committed.
 */
#include "st_fuse.h"
#include "st_lex.h"
#include "st_members.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define DEFAULT_MAX_DEPTH 256u
#define MAX_MEMBERS (1u << 20)     /* per object */
#define MAX_LANES 64u              /* per track */
#define BIG_DIGITS 96              /* exact ts arithmetic beyond int64 */
#define DEFAULT_INTERVAL_BUDGET (1u << 18) /* X intervals held before a run is handed out */
#define NONE_I64 INT64_MIN

enum { P_OK = 0, P_MORE = 1, P_ERR = 2 };

enum doc_state { S_START, S_ROOT_KEY, S_ROOT_NEXT, S_EVENTS, S_EVENTS_NEXT, S_DONE };

/* walk flags: how a value's output differs from its input bytes */
#define W_WS 1u       /* whitespace removed */
#define W_REPAIR 2u   /* a string was repaired */
#define W_BADLIT 4u   /* a bare word or malformed number became null */
#define W_ESC 8u      /* a string holds an escape (its text differs from its bytes) */
#define W_DUP 16u     /* a nested object repeats a key: the earlier ones are not written */

/* how walk_value treats the keys of nested objects */
enum { KEYS_NONE, KEYS_RECORD, KEYS_APPLY };

/* member kinds */
enum {
    K_OTHER, K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ID, K_ARGS,
    A_OTHER, A_CORR, A_EXT, A_EXT_LC, A_RESERVED, A_NAME, A_SORT
};

/* kinds of pid / tid / id values */
enum { V_NONE = 0, V_INT = 1, V_STR = 2, V_OTHER = 3 };

typedef struct {
    const char *s;
    size_t n;
} span;

/* A key's decoded text (escapes resolved, repairs applied as they are
 * written): two keys are the same key when these are equal.  The raw bytes
 * when they are the text already, else a run of f->kbuf (which may move). */
typedef struct {
    const char *s;      /* the raw key content, or NULL: the text is in f->kbuf */
    size_t off, n;
} dkey;

/* a key of an object nested in a member's value (phase A, write mode) */
typedef struct {
    dkey k;
    size_t idx;         /* its place in f->kdup */
    uint8_t dup;
} nkey;

typedef struct {
    span key;           /* raw key content, without quotes */
    dkey dk;            /* its decoded text */
    span val;           /* the value's bytes as in the input */
    size_t nk;          /* f->kdup index of the first key nested in the value */
    uint8_t kind;
    uint8_t key_clean;  /* key needs no repair */
    uint8_t val_clean;  /* value is compact valid JSON: copy as is */
    uint8_t dup;        /* a later member has the same key: not written */
} member;

typedef struct {
    uint8_t pid_k, tid_k, id_k;
    int64_t pid, tid, id;
    span pid_s, tid_s;          /* string contents */
    span ph, cat, name;         /* string contents; s == NULL when absent */
    int has_ts, has_dur;
    int64_t ts, dur;            /* ns, unshifted */
    int corr_k, ext_k, ext_lc_k;
    int64_t corr, ext, ext_lc;
    int args_kind;              /* 0 absent, 1 object, 2 another value */
    size_t args_member;         /* index of the args member */
    span thread_label;          /* args.name of a thread_name record */
    int has_sort;
    int64_t sort_index;
    uint64_t bad_literals, repaired;
} ev_info;

typedef struct {
    int64_t ts, end;
    uint32_t idx, track;
} interval;

typedef struct {
    uint32_t idx, track, lane;
} move;

typedef struct {
    int64_t *ends;
    size_t n, cap;
} lane_stack;

typedef struct {
    const interval *p;
    size_t n, pos;
    int last;
} run_cursor;

typedef struct {
    uint8_t pid_k, tid_k;
    int64_t pid, tid;
    uint64_t pid_off, tid_off;  /* string bytes in the arena */
    uint32_t pid_len, tid_len;
    uint64_t name_off;
    uint32_t name_len;
    int64_t sort_index;
    uint64_t n_kept, n_moved;
    uint32_t n_lanes, flags;
    int64_t lane_base;
    uint64_t hash;
} track;

typedef struct {
    char *p;
    size_t len, cap;
    int full;
} obuf;

struct st_fuse {
    st_fuse_config cfg;
    int mode;
    enum doc_state state;
    int first_in_container;
    int bare_array;
    int saw_events;
    int wrote_any;
    st_fuse_stats st;
    char err[256];
    uint64_t err_offset;
    int err_code;

    char *stack;                /* bracket kinds, max_depth */

    /* keys, for one event: the decoded text of escaped keys (every mode);
     * in write mode the keys of the nested objects open during phase A, and
     * per nested key in walk order whether a later key of its object
     * overrides it */
    char *kbuf;
    size_t kbuf_len, kbuf_cap;
    nkey *kst;
    size_t n_kst, kst_cap;
    uint8_t *kdup;
    size_t n_kdup, kdup_cap;
    size_t *kopen;              /* per depth: kst index where the object's keys start */
    uint8_t *kwrote;            /* per depth: a member was written (comma before the next) */
    uint32_t *kslot;            /* hash table for the duplicate check of large objects */
    size_t kslot_cap;

    member *members, *args;
    size_t n_members, n_args, members_cap, args_cap;

    /* byte arena for track strings and names */
    char *arena;
    uint64_t arena_len, arena_cap;

    /* tracks: array + open-addressing hash (index + 1; 0 empty) */
    track *tracks;
    uint32_t n_tracks, tracks_cap;
    uint32_t *tslots;
    uint32_t n_tslots;
    uint32_t last_track;        /* one-entry cache, index + 1 */

    /* names for ST_FUSE_NAME_FILTER: arena offsets + state */
    uint64_t *name_off;
    uint32_t *name_len;
    uint8_t *name_state;        /* 0 pending, 1 keep, 2 drop */
    uint32_t n_names, names_cap;
    uint32_t *nslots;
    uint32_t n_nslots;
    int64_t pending_name;       /* name id awaiting a decision, or -1 */

    /* cats */
    char **cats;
    size_t *cat_lens;
    size_t n_cats;

    uint8_t *mask;
    uint64_t mask_events;

    int64_t *pid_raw, *pid_new;
    size_t n_pids;

    /* X intervals of the scan: a bounded buffer, sorted and handed to the
     * caller as a run when full (external sort), then merged back */
    interval *ivl;
    size_t n_ivl, ivl_cap, ivl_budget;
    int run_pending, run_taken;
    uint64_t runs_taken;
    run_cursor *cursors;
    size_t n_cursors;
    /* the greedy lane assignment, resumable across merge calls */
    lane_stack stacks[MAX_LANES];
    uint32_t g_track, g_lanes;
    int g_active;
    move *moves;
    size_t n_moves, moves_cap, move_cursor;
    int lanes_done;

    st_members meta;         /* top-level members (scan mode) */
};

static void sort_intervals(interval *a, size_t n);
static int run_release(st_fuse *f);

/* ------------------------------------------------------------------ errors */

static void set_error(st_fuse *f, int code, const char *base, const char *at, const char *fmt, ...)
{
    va_list ap;
    f->err_code = code;
    va_start(ap, fmt);
    vsnprintf(f->err, sizeof f->err, fmt, ap);
    va_end(ap);
    f->err_offset = f->st.bytes_consumed + (uint64_t)(base && at ? at - base : 0);
}

static void set_char_error(st_fuse *f, const char *base, const char *at, const char *what)
{
    unsigned char c = (unsigned char)*at;
    if (c >= 0x20 && c < 0x7f)
        set_error(f, ST_FUSE_ERR_SYNTAX, base, at, "%s, found '%c'", what, c);
    else
        set_error(f, ST_FUSE_ERR_SYNTAX, base, at, "%s, found byte 0x%02x", what, c);
}

/* ------------------------------------------------------------------ output */

static inline void put(obuf *o, const void *s, size_t n)
{
    if (o->full)
        return;
    if (o->cap - o->len < n) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static inline void putc1(obuf *o, char c)
{
    if (o->full)
        return;
    if (o->len >= o->cap) {
        o->full = 1;
        return;
    }
    o->p[o->len++] = c;
}

#define PUTS(o, lit) put((o), (lit), sizeof(lit) - 1)

static void put_i64(obuf *o, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        tmp[n++] = '-';
    char out[24];
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    put(o, out, (size_t)n);
}

/* ------------------------------------------------------------------ lexing */

/* First byte in [p, end) that is '"', '\\', a control byte or a non-ASCII
 * byte; end if none.  (A signed compare with 0x20 catches both control bytes
 * and bytes >= 0x80.) */
static inline const char *str_special(const char *p, const char *end)
{
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                 _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(m);
        if (mask)
            return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80)
            return p;
        p++;
    }
    return end;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static unsigned hex_val(char c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
}

/* four hex digits (checked by the caller) */
static unsigned hex4(const char *h)
{
    return hex_val(h[0]) << 12 | hex_val(h[1]) << 8 | hex_val(h[2]) << 4 | hex_val(h[3]);
}

/* 1 if four hex digits start at h, 0 if not, -1 if end comes first. */
static int hex4_at(const char *h, const char *end)
{
    for (int i = 0; i < 4; i++) {
        if (h + i >= end)
            return -1;
        if (!is_hex(h[i]))
            return 0;
    }
    return 1;
}

/* Length of the valid UTF-8 sequence at s (2..4); -k if invalid, k being the
 * length of its maximal invalid prefix (one U+FFFD replaces it, as decoders
 * such as Python's do); 0 if cut by end. */
static int utf8_len(const unsigned char *s, const unsigned char *end)
{
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    int n;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c == 0xE0) {
        n = 3;
        lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
        n = 3;
    } else if (c == 0xED) {
        n = 3;
        hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c == 0xF0) {
        n = 4;
        lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
        n = 4;
    } else if (c == 0xF4) {
        n = 4;
        hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < n; i++) {
        if (s + i >= end)
            return 0;
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
            return -i;
    }
    return n;
}

/*
 * A string value.  p points at the opening quote; *next ends up just past
 * the closing quote.  With o, the string is written, repaired where needed.
 * Never fails: only P_OK or P_MORE.
 */
static int walk_string(const char *p, const char *end, obuf *o, const char **next, unsigned *wf)
{
    static const char HEX[] = "0123456789abcdef";
    const char *s = p + 1, *run = p; /* run: first byte not yet written */
    for (;;) {
        const char *q = str_special(s, end);
        if (q >= end)
            return P_MORE;
        unsigned char c = (unsigned char)*q;
        if (c == '"') {
            if (o)
                put(o, run, (size_t)(q + 1 - run));
            *next = q + 1;
            return P_OK;
        }
        if (c == '\\') {
            *wf |= W_ESC;
            if (end - q < 2)
                return P_MORE;
            char e = q[1];
            if (e == 'u') {
                /* Each look ahead stops at the first byte that decides (at
                 * the latest the closing quote, which is no hex digit, '\\'
                 * or 'u'): a string is walked again later with its closing
                 * quote as the end of the buffer (put_key, decode_key). */
                int h = hex4_at(q + 2, end);
                if (h < 0)
                    return P_MORE;
                if (h) {
                    unsigned cp = hex4(q + 2);
                    if (cp < 0xD800 || cp > 0xDFFF) {
                        s = q + 6;
                        continue;
                    }
                    if (cp <= 0xDBFF) { /* a high surrogate: valid only before a low one */
                        if (end - q < 7)
                            return P_MORE;
                        if (q[6] == '\\') {
                            if (end - q < 8)
                                return P_MORE;
                            int l = q[7] == 'u' ? hex4_at(q + 8, end) : 0;
                            if (l < 0)
                                return P_MORE;
                            unsigned lo = l ? hex4(q + 8) : 0;
                            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                                s = q + 12;
                                continue;
                            }
                        }
                    }
                    /* a lone surrogate is no Unicode text (RFC 8259 8.2): U+FFFD */
                    *wf |= W_REPAIR;
                    if (o) {
                        put(o, run, (size_t)(q - run));
                        PUTS(o, "\\ufffd");
                    }
                    run = s = q + 6;
                    continue;
                }
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                s = q + 2;
                continue;
            }
            /* an invalid escape: keep the backslash as a character */
            *wf |= W_REPAIR;
            if (o) {
                put(o, run, (size_t)(q - run));
                PUTS(o, "\\\\");
            }
            run = s = q + 1;
            continue;
        }
        if (c < 0x20) {
            *wf |= W_REPAIR;
            if (o) {
                char u[6] = {'\\', 'u', '0', '0', HEX[c >> 4], HEX[c & 15]};
                put(o, run, (size_t)(q - run));
                put(o, u, 6);
            }
            run = s = q + 1;
            continue;
        }
        int n = utf8_len((const unsigned char *)q, (const unsigned char *)end);
        if (n == 0)
            return P_MORE;
        if (n < 0) {
            *wf |= W_REPAIR;
            if (o) {
                put(o, run, (size_t)(q - run));
                PUTS(o, "\xEF\xBF\xBD");
            }
            run = s = q - n;
            continue;
        }
        s = q + n;
    }
}

static inline int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* What a number token holds, from one pass over it. */
typedef struct {
    uint8_t valid;        /* JSON number grammar */
    uint8_t is_int;       /* valid, no fraction, no exponent */
    uint8_t int_fits;     /* is_int and the value fits int64 (ival) */
    uint8_t neg, has_exp;
    uint8_t il, fl;       /* integer / fraction digit counts (saturate at 255) */
    uint64_t ipart, fpart;/* their values when il <= 19 / fl <= 19 */
    int64_t ival;
} numinfo;

/* JSON number grammar, with the values the rewrite needs. */
static int scan_number(const char *s, size_t n, numinfo *ni)
{
    size_t i = 0, d;
    memset(ni, 0, sizeof *ni);
    if (i < n && s[i] == '-') {
        ni->neg = 1;
        i++;
    }
    if (i >= n)
        return 0;
    d = i;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        uint64_t v = 0;
        while (i < n && is_digit(s[i])) {
            v = v * 10 + (uint64_t)(s[i] - '0'); /* wraps beyond 19 digits: unused then */
            i++;
        }
        ni->ipart = v;
    } else {
        return 0;
    }
    ni->il = (uint8_t)(i - d > 255 ? 255 : i - d);
    if (i < n && s[i] == '.') {
        d = ++i;
        uint64_t v = 0;
        while (i < n && is_digit(s[i])) {
            v = v * 10 + (uint64_t)(s[i] - '0');
            i++;
        }
        if (i == d)
            return 0;
        ni->fpart = v;
        ni->fl = (uint8_t)(i - d > 255 ? 255 : i - d);
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        d = i;
        while (i < n && is_digit(s[i]))
            i++;
        if (i == d)
            return 0;
        ni->has_exp = 1;
    }
    if (i != n)
        return 0;
    ni->valid = 1;
    ni->is_int = !ni->fl && !ni->has_exp;
    if (ni->is_int && ni->il <= 19) { /* 19 digits cannot wrap a uint64 */
        uint64_t v = ni->ipart;
        if (!ni->neg && v <= (uint64_t)INT64_MAX) {
            ni->ival = (int64_t)v;
            ni->int_fits = 1;
        } else if (ni->neg && v <= (uint64_t)INT64_MAX + 1) {
            ni->ival = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
            ni->int_fits = 1;
        }
    }
    return 1;
}

static int valid_number(const char *s, size_t n, int *is_int)
{
    numinfo ni;
    int ok = scan_number(s, n, &ni);
    *is_int = ni.is_int;
    return ok;
}

#define TOKEN_IS(p, n, lit) ((n) == sizeof(lit) - 1 && memcmp((p), (lit), sizeof(lit) - 1) == 0)

/* A number or a bare word.  *next is the first byte after it; ni (optional)
 * receives the number's values (ni->valid == 0 for words). */
static int walk_scalar_ni(st_fuse *f, const char *base, const char *p, const char *end, obuf *o,
                          const char **next, unsigned *wf, numinfo *ni)
{
    const char *q = p;
    if (*q == '-' || is_digit(*q)) {
        /* fast path: parse a well-formed number in one pass; anything odd
         * (leading zeros, a word right after the digits, ...) falls through
         * to the token scan below */
        const char *d;
        uint64_t ipart = 0, fpart = 0;
        int neg = *q == '-', has_exp = 0;
        size_t il, fl = 0;
        q += neg;
        d = q;
        if (q < end && *q == '0') {
            q++;
        } else {
            while (q < end && is_digit(*q))
                ipart = ipart * 10 + (uint64_t)(*q++ - '0');
        }
        il = (size_t)(q - d);
        int ok = il > 0;
        if (ok && q < end && *q == '.') {
            d = ++q;
            while (q < end && is_digit(*q))
                fpart = fpart * 10 + (uint64_t)(*q++ - '0');
            fl = (size_t)(q - d);
            ok = fl > 0;
        }
        if (ok && q < end && (*q == 'e' || *q == 'E')) {
            q++;
            if (q < end && (*q == '+' || *q == '-'))
                q++;
            d = q;
            while (q < end && is_digit(*q))
                q++;
            ok = q > d;
            has_exp = 1;
        }
        if (q == end)
            return P_MORE;
        if (ok && !ST_SCALAR_CHAR[(unsigned char)*q]) {
            if (ni) {
                /* locals first, one store each: no narrow-store/wide-load stalls */
                int is_int = !fl && !has_exp, fits = 0;
                int64_t ival = 0;
                if (is_int && il <= 19) { /* 19 digits cannot wrap a uint64 */
                    if (!neg && ipart <= (uint64_t)INT64_MAX) {
                        ival = (int64_t)ipart;
                        fits = 1;
                    } else if (neg && ipart <= (uint64_t)INT64_MAX + 1) {
                        ival = ipart == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)ipart;
                        fits = 1;
                    }
                }
                ni->valid = 1;
                ni->is_int = (uint8_t)is_int;
                ni->int_fits = (uint8_t)fits;
                ni->neg = (uint8_t)neg;
                ni->has_exp = (uint8_t)has_exp;
                ni->il = (uint8_t)(il > 255 ? 255 : il);
                ni->fl = (uint8_t)(fl > 255 ? 255 : fl);
                ni->ipart = ipart;
                ni->fpart = fpart;
                ni->ival = ival;
            }
            if (o)
                put(o, p, (size_t)(q - p));
            *next = q;
            return P_OK;
        }
        q = p;
    }
    while (q < end && ST_SCALAR_CHAR[(unsigned char)*q])
        q++;
    if (q == end)
        return P_MORE; /* the token may go on in the next chunk */
    if (q == p) {
        set_char_error(f, base, p, "expected a JSON value");
        return P_ERR;
    }
    size_t n = (size_t)(q - p);
    numinfo local;
    if (!ni)
        ni = &local;
    if (scan_number(p, n, ni) || TOKEN_IS(p, n, "true") || TOKEN_IS(p, n, "false") ||
        TOKEN_IS(p, n, "null")) {
        if (o)
            put(o, p, n);
    } else {
        *wf |= W_BADLIT;
        if (o)
            PUTS(o, "null");
    }
    *next = q;
    return P_OK;
}

static int walk_scalar(st_fuse *f, const char *base, const char *p, const char *end, obuf *o,
                       const char **next, unsigned *wf)
{
    return walk_scalar_ni(f, base, p, end, o, next, wf, NULL);
}

/* ------------------------------------------------------------------ keys */

/* memcmp for byte runs that may be empty (then either pointer may be NULL,
 * which memcmp itself does not allow). */
static inline int bytes_equal(const char *a, const char *b, size_t n)
{
    return n == 0 || memcmp(a, b, n) == 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *a = realloc(*p, c * size);
    if (!a)
        return 0;
    *p = a;
    *cap = c;
    return 1;
}

static void put_utf8(char *out, size_t *j, unsigned cp)
{
    if (cp < 0x80) {
        out[(*j)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*j)++] = (char)(0xC0 | cp >> 6);
        out[(*j)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*j)++] = (char)(0xE0 | cp >> 12);
        out[(*j)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*j)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*j)++] = (char)(0xF0 | cp >> 18);
        out[(*j)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*j)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*j)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* The text of string content as walk_string writes it (only valid escapes,
 * surrogates in pairs), decoded in place: the text never grows. */
static size_t unescape_in_place(char *s, size_t n)
{
    size_t i = 0, j = 0;
    while (i < n) {
        char c = s[i];
        if (c != '\\') {
            s[j++] = c;
            i++;
            continue;
        }
        char e = s[i + 1];
        if (e != 'u') {
            s[j++] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
            i += 2;
            continue;
        }
        unsigned cp = hex4(s + i + 2);
        i += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* the low half follows: walk_string pairs them */
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(s + i + 2) - 0xDC00);
            i += 6;
        }
        put_utf8(s, &j, cp);
    }
    return j;
}

static inline const char *dkey_text(const st_fuse *f, const dkey *k)
{
    return k->s ? k->s : f->kbuf + k->off;
}

/* The decoded text of the key whose raw content is k (flags: walk_string's
 * for it).  Compared as the output reads it, so the key is first written as
 * walk_string writes it (a lone surrogate is U+FFFD there, an invalid escape
 * a backslash), at most 6 bytes per input byte, then decoded. */
static int decode_key(st_fuse *f, span k, unsigned flags, dkey *out)
{
    if (!(flags & (W_ESC | W_REPAIR))) {
        out->s = k.s;
        out->off = 0;
        out->n = k.n;
        return P_OK;
    }
    size_t room = 6 * k.n + 2;
    if (!grow((void **)&f->kbuf, &f->kbuf_cap, f->kbuf_len + room, 1))
        return P_ERR;
    obuf o = {f->kbuf + f->kbuf_len, 0, room, 0};
    unsigned wf = 0;
    const char *next;
    if (walk_string(k.s - 1, k.s + k.n + 1, &o, &next, &wf) != P_OK || o.full || o.len < 2) {
        out->s = k.s; /* cannot happen: the walk stops at the closing quote */
        out->off = 0;
        out->n = k.n;
        return P_OK;
    }
    memmove(o.p, o.p + 1, o.len - 2); /* without the quotes */
    out->s = NULL;
    out->off = f->kbuf_len;
    out->n = unescape_in_place(o.p, o.len - 2);
    f->kbuf_len += out->n;
    return P_OK;
}

static inline int same_key(const st_fuse *f, const dkey *a, const dkey *b)
{
    return a->n == b->n && bytes_equal(dkey_text(f, a), dkey_text(f, b), a->n);
}

static uint64_t key_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

#define KEY_AT(i) ((const dkey *)(const void *)(first + (i) * stride + key_off))
#define DUP_AT(i) ((uint8_t *)(void *)(first + (i) * stride + dup_off))

/* The n keys of one object, at first + i * stride + key_off: set the flag at
 * first + i * stride + dup_off for each key a later one equals (strict JSON
 * has unique keys; readers keep the last).  Returns how many were set, or -1
 * when out of memory. */
static long mark_overridden(st_fuse *f, char *first, size_t stride, size_t n, size_t key_off, size_t dup_off)
{
    long found = 0;
    if (n <= 32) {
        for (size_t i = 0; i + 1 < n; i++) {
            uint8_t d = 0;
            for (size_t j = i + 1; j < n && !d; j++)
                d = (uint8_t)same_key(f, KEY_AT(i), KEY_AT(j));
            *DUP_AT(i) = d;
            found += d;
        }
        if (n)
            *DUP_AT(n - 1) = 0;
        return found;
    }
    size_t cap = 64;
    while (cap < 2 * n)
        cap *= 2;
    if (!grow((void **)&f->kslot, &f->kslot_cap, cap, sizeof *f->kslot))
        return -1;
    uint32_t *slot = f->kslot; /* key index + 1; 0 is empty */
    memset(slot, 0, cap * sizeof *slot);
    for (size_t i = n; i-- > 0;) { /* from the last: a key seen already is overridden */
        const dkey *k = KEY_AT(i);
        size_t h = (size_t)key_hash(dkey_text(f, k), k->n) & (cap - 1);
        uint8_t d = 0;
        while (slot[h]) {
            if (same_key(f, KEY_AT(slot[h] - 1), k)) {
                d = 1;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
        *DUP_AT(i) = d;
        found += d;
        if (!d)
            slot[h] = (uint32_t)(i + 1);
    }
    return found;
}

#undef KEY_AT
#undef DUP_AT

/* Phase A: a key of a nested object (raw content k), numbered in walk order. */
static int record_key(st_fuse *f, span k, unsigned flags)
{
    if (!grow((void **)&f->kst, &f->kst_cap, f->n_kst + 1, sizeof *f->kst) ||
        !grow((void **)&f->kdup, &f->kdup_cap, f->n_kdup + 1, 1))
        return P_ERR;
    nkey *e = &f->kst[f->n_kst];
    if (decode_key(f, k, flags, &e->k) != P_OK)
        return P_ERR;
    e->idx = f->n_kdup;
    f->kdup[f->n_kdup++] = 0;
    f->n_kst++;
    return P_OK;
}

/* Phase A: the nested object whose keys start at kst[from] closes; returns
 * how many of its keys are overridden, -1 when out of memory. */
static long close_object_keys(st_fuse *f, size_t from)
{
    nkey *a = f->kst + from;
    size_t n = f->n_kst - from;
    long found = mark_overridden(f, (char *)a, sizeof *a, n, offsetof(nkey, k), offsetof(nkey, dup));
    if (found > 0)
        for (size_t i = 0; i < n; i++)
            if (a[i].dup)
                f->kdup[a[i].idx] = 1;
    f->n_kst = from;
    return found;
}

/*
 * Any JSON value at p (no leading whitespace), validated; with o, written
 * compact and repaired.  Iterative, bounded by max_depth.
 *
 * keys: KEYS_RECORD (phase A) numbers the keys of the nested objects in walk
 * order from f->n_kdup, marks in f->kdup those a later key of the same
 * object overrides, and sets W_DUP if there is one.  KEYS_APPLY (writing)
 * leaves out the members so marked, kpos being the number of the value's
 * first key.
 */
static int walk_value(st_fuse *f, const char *base, const char *p, const char *end, obuf *o,
                      const char **next, unsigned *wf, int keys, size_t kpos)
{
    enum { W_VALUE, W_VALUE_OR_CLOSE, W_KEY, W_KEY_OR_CLOSE, W_AFTER } st = W_VALUE;
    uint32_t depth = 0;
    uint32_t mute = 0;  /* KEYS_APPLY: depth of the object whose overridden member is skipped */
    obuf *out = o;      /* o, or NULL while a member is skipped */
    char *stack = f->stack;
    int r;
    for (;;) {
        if (depth) {
            const char *q = st_skip_ws(p, end);
            if (q != p) {
                *wf |= W_WS;
                p = q;
            }
        }
        if (p >= end)
            return P_MORE;
        char c = *p;
        switch (st) {
        case W_VALUE_OR_CLOSE:
            if (c == ']')
                goto close;
            /* fall through */
        case W_VALUE:
            if (c == '"') {
                r = walk_string(p, end, out, &p, wf);
            } else if (c == '{' || c == '[') {
                if (depth >= f->cfg.max_depth) {
                    set_error(f, ST_FUSE_ERR_LIMIT, base, p, "JSON nested deeper than %u levels",
                              f->cfg.max_depth);
                    return P_ERR;
                }
                f->kopen[depth] = f->n_kst;
                f->kwrote[depth] = 0;
                stack[depth++] = c;
                if (out)
                    putc1(out, c);
                p++;
                st = c == '{' ? W_KEY_OR_CLOSE : W_VALUE_OR_CLOSE;
                continue;
            } else {
                r = walk_scalar(f, base, p, end, out, &p, wf);
            }
            if (r != P_OK)
                return r;
            if (depth == 0) {
                *next = p;
                return P_OK;
            }
            st = W_AFTER;
            continue;
        case W_KEY_OR_CLOSE:
            if (c == '}')
                goto close;
            /* fall through */
        case W_KEY:
            if (c != '"') {
                set_char_error(f, base, p, "expected a key string");
                return P_ERR;
            }
            if (keys == KEYS_APPLY) {
                if (!mute && kpos < f->n_kdup && f->kdup[kpos]) {
                    mute = depth;
                    out = NULL;
                }
                kpos++;
            }
            if (out) { /* the comma goes before a member written, not after one read */
                if (f->kwrote[depth - 1])
                    putc1(out, ',');
                f->kwrote[depth - 1] = 1;
            }
            {
                const char *k = p;
                unsigned kf = 0;
                r = walk_string(p, end, out, &p, &kf);
                if (r != P_OK)
                    return r;
                *wf |= kf;
                if (keys == KEYS_RECORD && record_key(f, (span){k + 1, (size_t)(p - k - 2)}, kf) != P_OK) {
                    set_error(f, ST_FUSE_ERR_NOMEM, base, k, "out of memory");
                    return P_ERR;
                }
            }
            {
                const char *q = st_skip_ws(p, end);
                if (q != p) {
                    *wf |= W_WS;
                    p = q;
                }
            }
            if (p >= end)
                return P_MORE;
            if (*p != ':') {
                set_char_error(f, base, p, "expected ':' after a key");
                return P_ERR;
            }
            if (out)
                putc1(out, ':');
            p++; /* whitespace after ':' is skipped at the top of the loop */
            st = W_VALUE;
            continue;
        case W_AFTER:
            if (mute == depth) { /* the skipped member's value ended */
                mute = 0;
                out = o;
            }
            if (c == ',') {
                p++;
                if (stack[depth - 1] == '{') {
                    st = W_KEY;
                } else {
                    if (out)
                        putc1(out, ',');
                    st = W_VALUE;
                }
                continue;
            }
            if (c == '}' || c == ']')
                goto close;
            set_char_error(f, base, p, "expected ',' or a closing bracket");
            return P_ERR;
        }
    close:
        if ((c == '}') != (stack[depth - 1] == '{')) {
            set_char_error(f, base, p, "mismatched closing bracket");
            return P_ERR;
        }
        if (keys == KEYS_RECORD && c == '}') {
            long found = close_object_keys(f, f->kopen[depth - 1]);
            if (found < 0) {
                set_error(f, ST_FUSE_ERR_NOMEM, base, p, "out of memory");
                return P_ERR;
            }
            if (found)
                *wf |= W_DUP;
        }
        if (out)
            putc1(out, c);
        p++;
        depth--;
        if (depth == 0) {
            *next = p;
            return P_OK;
        }
        st = W_AFTER;
    }
}

/* Lenient skip of a top-level member's value (it is parsed again by the
 * caller): strings and bracket balance only. */
static int skip_value(st_fuse *f, const char *base, const char *p, const char *end,
                      const char **next)
{
    unsigned wf = 0;
    uint32_t depth = 0;
    if (p >= end)
        return P_MORE;
    if (*p == '"')
        return walk_string(p, end, NULL, next, &wf);
    if (*p != '{' && *p != '[')
        return walk_scalar(f, base, p, end, NULL, next, &wf);
    while (p < end) {
        char c = *p;
        if (c == '"') {
            if (walk_string(p, end, NULL, &p, &wf) != P_OK)
                return P_MORE;
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth >= f->cfg.max_depth) {
                set_error(f, ST_FUSE_ERR_LIMIT, base, p, "JSON nested deeper than %u levels",
                          f->cfg.max_depth);
                return P_ERR;
            }
            f->stack[depth++] = c;
        } else if (c == '}' || c == ']') {
            if (depth == 0 || (c == '}') != (f->stack[depth - 1] == '{')) {
                set_char_error(f, base, p, "mismatched closing bracket");
                return P_ERR;
            }
            if (--depth == 0) {
                *next = p + 1;
                return P_OK;
            }
        }
        p++;
    }
    return P_MORE;
}

/* ------------------------------------------------------------------ numbers */

typedef struct {
    int neg;
    const char *ip, *fp;   /* integer and fraction digits */
    size_t il, fl;
    long exp;              /* decimal exponent (clamped) */
} decnum;

/* Split a valid JSON number. */
static void dec_split(const char *s, size_t n, decnum *d)
{
    const char *p = s, *end = s + n;
    d->neg = 0;
    if (*p == '-') {
        d->neg = 1;
        p++;
    }
    d->ip = p;
    while (p < end && is_digit(*p))
        p++;
    d->il = (size_t)(p - d->ip);
    d->fp = p;
    d->fl = 0;
    if (p < end && *p == '.') {
        d->fp = ++p;
        while (p < end && is_digit(*p))
            p++;
        d->fl = (size_t)(p - d->fp);
    }
    d->exp = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (*p == '+' || *p == '-')
            eneg = *p++ == '-';
        while (p < end) {
            if (d->exp < 1000000)
                d->exp = d->exp * 10 + (*p - '0');
            p++;
        }
        if (eneg)
            d->exp = -d->exp;
    }
}

/* value * 10^scale, rounded half to even, as int64; 0 if it does not fit. */
static int dec_scaled(const decnum *d, int scale, int64_t *out)
{
    long total = (long)(d->il + d->fl);
    long keep = (long)d->il + d->exp + scale;
    uint64_t v = 0;
    int round_digit = 0, sticky = 0;
    for (long i = 0; i < total; i++) {
        int dig = (i < (long)d->il ? d->ip[i] : d->fp[i - (long)d->il]) - '0';
        if (i < keep) {
            if (v > (UINT64_MAX - (uint64_t)dig) / 10)
                return 0;
            v = v * 10 + (uint64_t)dig;
        } else if (i == keep) {
            round_digit = dig;
        } else {
            sticky |= dig != 0;
        }
    }
    if (v)
        for (long i = total; i < keep; i++) {
            if (v > UINT64_MAX / 10)
                return 0;
            v *= 10;
        }
    if (round_digit > 5 || (round_digit == 5 && (sticky || (v & 1))))
        v++;
    if (d->neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return 0;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return 0;
        *out = (int64_t)v;
    }
    return 1;
}

/* Write sign * mag (decimal digits, most significant first, n digits) with
 * k digits after the point. */
static void put_decimal_digits(obuf *o, int neg, const char *digits, size_t n, size_t k)
{
    size_t lead = 0;
    while (lead < n && digits[lead] == '0')
        lead++;
    if (neg && lead < n)
        putc1(o, '-');
    if (n - lead > k) {
        put(o, digits + lead, n - lead - k);
    } else {
        putc1(o, '0');
    }
    if (k) {
        putc1(o, '.');
        if (n < k) {
            for (size_t i = n; i < k; i++)
                putc1(o, '0');
            put(o, digits, n);
        } else {
            put(o, digits + n - k, k);
        }
    }
}

/* Microseconds (a valid number token) -> ns; exact for up to 3 decimals,
 * rounded half to even beyond. */
static int token_ns(const char *s, size_t n, const numinfo *ni, int64_t *ns)
{
    if (!ni->valid)
        return 0;
    if (!ni->has_exp && ni->il <= 15 && ni->fl <= 3) {
        int64_t v = (int64_t)ni->ipart * 1000 + (int64_t)ni->fpart * ST_POW10[3 - ni->fl];
        *ns = ni->neg ? -v : v;
        return 1;
    }
    decnum d;
    dec_split(s, n, &d);
    return dec_scaled(&d, 3, ns);
}

/* v / 10^k written with exactly k decimals */
static void put_fixed(obuf *o, int64_t v, int k)
{
    char tmp[48];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u || n <= k);
    char out[50];
    int m = 0;
    if (v < 0)
        out[m++] = '-';
    for (int i = n - 1; i >= 0; i--) {
        out[m++] = tmp[i];
        if (i == k && k)
            out[m++] = '.';
    }
    put(o, out, (size_t)m);
}

static int count_digits(uint64_t u)
{
    int n = 1;
    while (u >= 10) {
        u /= 10;
        n++;
    }
    return n;
}

/*
 * Write the JSON number s (valid) plus shift_ns nanoseconds, where s is in
 * microseconds, exactly.  The result keeps the input's fraction digits and
 * adds only the ones the shift needs.  Returns 0 if the number is too long or
 * too large for exact arithmetic (it is then written unchanged).
 */
static int put_shifted(obuf *o, const char *s, size_t n, int64_t shift_ns)
{
    if (shift_ns == 0) {
        put(o, s, n);
        return 1;
    }
    /* shift = b * 10^eb microseconds with as few decimals as possible */
    int64_t b = shift_ns;
    long eb = -3;
    while (eb < 0 && b % 10 == 0) {
        b /= 10;
        eb++;
    }
    numinfo ni;
    scan_number(s, n, &ni);
    if (!ni.has_exp && ni.il <= 18 && ni.fl <= 18) {
        /* int64 fast path: both terms below 10^18, so the sum cannot overflow */
        long fl = ni.fl;
        long e = -fl < eb ? -fl : eb;
        long sa = -fl - e, sb = eb - e;
        uint64_t bu = b < 0 ? (uint64_t)0 - (uint64_t)b : (uint64_t)b;
        if (ni.il + fl + sa <= 18 && count_digits(bu) + sb <= 18) {
            int64_t A = ((int64_t)ni.ipart * ST_POW10[fl] + (int64_t)ni.fpart) * ST_POW10[sa];
            int64_t B = b * ST_POW10[sb];
            put_fixed(o, (ni.neg ? -A : A) + B, (int)-e);
            return 1;
        }
    }
    decnum d;
    dec_split(s, n, &d);
    long ea = d.exp - (long)d.fl; /* s = A * 10^ea */
    long e = ea < eb ? ea : eb;
    if (e > 0)
        e = 0;
    /* big-decimal: digits most significant first, aligned at exponent e */
    long a_zeros = ea - e, b_zeros = eb - e;
    long a_len = (long)(d.il + d.fl) + a_zeros;
    if (a_len > BIG_DIGITS || b_zeros > BIG_DIGITS - 20 || d.exp > BIG_DIGITS || d.exp < -BIG_DIGITS) {
        put(o, s, n);
        return 0;
    }
    char A[BIG_DIGITS + 2], B[BIG_DIGITS + 2], R[BIG_DIGITS + 2];
    long len = a_len;
    char bdig[24];
    int bn = 0;
    uint64_t bu = b < 0 ? (uint64_t)0 - (uint64_t)b : (uint64_t)b;
    do {
        bdig[bn++] = (char)('0' + bu % 10);
        bu /= 10;
    } while (bu);
    long b_len = bn + b_zeros;
    if (b_len > len)
        len = b_len;
    len += 1; /* room for a carry */
    if (len > BIG_DIGITS + 1) {
        put(o, s, n);
        return 0;
    }
    /* right-align both into len digits */
    memset(A, '0', (size_t)len);
    memset(B, '0', (size_t)len);
    {
        long pos = len - a_len;
        memcpy(A + pos, d.ip, d.il);
        memcpy(A + pos + (long)d.il, d.fp, d.fl);
        /* trailing a_zeros are already '0' */
        long bpos = len - b_len;
        for (int i = 0; i < bn; i++)
            B[bpos + i] = bdig[bn - 1 - i];
    }
    int aneg = d.neg, bneg = b < 0, rneg;
    if (aneg == bneg) {
        int carry = 0;
        for (long i = len - 1; i >= 0; i--) {
            int v = (A[i] - '0') + (B[i] - '0') + carry;
            R[i] = (char)('0' + v % 10);
            carry = v / 10;
        }
        rneg = aneg;
    } else {
        int cmp = memcmp(A, B, (size_t)len);
        const char *X = cmp >= 0 ? A : B, *Y = cmp >= 0 ? B : A;
        int borrow = 0;
        for (long i = len - 1; i >= 0; i--) {
            int v = (X[i] - '0') - (Y[i] - '0') - borrow;
            borrow = v < 0;
            R[i] = (char)('0' + (v + 10) % 10);
        }
        rneg = cmp >= 0 ? aneg : bneg;
    }
    put_decimal_digits(o, rneg, R, (size_t)len, (size_t)(-e));
    return 1;
}

/* ------------------------------------------------------------------ arena / hashing */


static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Copy bytes into the arena; returns 0 on failure. */
static int arena_add(st_fuse *f, const char *s, size_t n, uint64_t *off)
{
    if (f->arena_len + n > f->arena_cap) {
        uint64_t cap = f->arena_cap ? f->arena_cap : 4096;
        while (cap < f->arena_len + n)
            cap *= 2;
        char *a = realloc(f->arena, cap);
        if (!a)
            return 0;
        f->arena = a;
        f->arena_cap = cap;
    }
    if (n)
        memcpy(f->arena + f->arena_len, s, n);
    *off = f->arena_len;
    f->arena_len += n;
    return 1;
}

/* ------------------------------------------------------------------ tracks */

static uint64_t track_hash(uint8_t pk, int64_t pid, span ps, uint8_t tk, int64_t tid, span ts)
{
    uint64_t h = mix64(((uint64_t)pk << 8) | tk);
    h = mix64(h ^ (pk == V_STR ? st_hash_bytes(ps.s, ps.n, 1) : (uint64_t)(pk == V_INT ? pid : 0)));
    h = mix64(h ^ (tk == V_STR ? st_hash_bytes(ts.s, ts.n, 2) : (uint64_t)(tk == V_INT ? tid : 0)));
    return h;
}

static int track_matches(const st_fuse *f, const track *t, uint8_t pk, int64_t pid, span ps,
                         uint8_t tk, int64_t tid, span ts)
{
    if (t->pid_k != pk || t->tid_k != tk)
        return 0;
    if (pk == V_INT && t->pid != pid)
        return 0;
    if (pk == V_STR && (t->pid_len != ps.n || !bytes_equal(f->arena + t->pid_off, ps.s, ps.n)))
        return 0;
    if (tk == V_INT && t->tid != tid)
        return 0;
    if (tk == V_STR && (t->tid_len != ts.n || !bytes_equal(f->arena + t->tid_off, ts.s, ts.n)))
        return 0;
    return 1;
}

static int grow_tslots(st_fuse *f)
{
    uint32_t n = f->n_tslots ? f->n_tslots * 2 : 256;
    if (n == 0 || n > (1u << 30))
        return 0;
    uint32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return 0;
    for (uint32_t i = 0; i < f->n_tracks; i++) {
        uint32_t j = (uint32_t)f->tracks[i].hash & (n - 1);
        while (slots[j])
            j = (j + 1) & (n - 1);
        slots[j] = i + 1;
    }
    free(f->tslots);
    f->tslots = slots;
    f->n_tslots = n;
    return 1;
}

/* Index of the event's track, created if new; -1 when out of memory. */
static int64_t find_track(st_fuse *f, const ev_info *ev)
{
    uint8_t pk = ev->pid_k == V_OTHER ? V_NONE : ev->pid_k;
    uint8_t tk = ev->tid_k == V_OTHER ? V_NONE : ev->tid_k;
    if (f->last_track) {
        const track *t = &f->tracks[f->last_track - 1];
        if (track_matches(f, t, pk, ev->pid, ev->pid_s, tk, ev->tid, ev->tid_s))
            return f->last_track - 1;
    }
    uint64_t h = track_hash(pk, ev->pid, ev->pid_s, tk, ev->tid, ev->tid_s);
    if ((uint64_t)f->n_tracks * 2 >= f->n_tslots && !grow_tslots(f))
        return -1;
    uint32_t mask = f->n_tslots - 1, j = (uint32_t)h & mask;
    while (f->tslots[j]) {
        uint32_t i = f->tslots[j] - 1;
        if (f->tracks[i].hash == h &&
            track_matches(f, &f->tracks[i], pk, ev->pid, ev->pid_s, tk, ev->tid, ev->tid_s)) {
            f->last_track = i + 1;
            return i;
        }
        j = (j + 1) & mask;
    }
    if (f->n_tracks == f->tracks_cap) {
        uint32_t cap = f->tracks_cap ? f->tracks_cap * 2 : 64;
        if (cap > (1u << 30))
            return -1;
        track *t = realloc(f->tracks, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        f->tracks = t;
        f->tracks_cap = cap;
    }
    track *t = &f->tracks[f->n_tracks];
    memset(t, 0, sizeof *t);
    t->pid_k = pk;
    t->tid_k = tk;
    t->pid = pk == V_INT ? ev->pid : 0;
    t->tid = tk == V_INT ? ev->tid : 0;
    t->hash = h;
    t->n_lanes = 1;
    t->flags = (pk == V_INT ? ST_FUSE_T_PID_INT : 0) | (pk == V_STR ? ST_FUSE_T_PID_STR : 0) |
               (tk == V_INT ? ST_FUSE_T_TID_INT : 0) | (tk == V_STR ? ST_FUSE_T_TID_STR : 0);
    if (pk == V_STR) {
        if (!arena_add(f, ev->pid_s.s, ev->pid_s.n, &t->pid_off))
            return -1;
        t->pid_len = (uint32_t)ev->pid_s.n;
    }
    if (tk == V_STR) {
        if (!arena_add(f, ev->tid_s.s, ev->tid_s.n, &t->tid_off))
            return -1;
        t->tid_len = (uint32_t)ev->tid_s.n;
    }
    f->tslots[j] = f->n_tracks + 1;
    f->last_track = f->n_tracks + 1;
    return f->n_tracks++;
}

/* ------------------------------------------------------------------ names */

static int grow_nslots(st_fuse *f)
{
    uint32_t n = f->n_nslots ? f->n_nslots * 2 : 1024;
    if (n == 0 || n > (1u << 31))
        return 0;
    uint32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return 0;
    for (uint32_t i = 0; i < f->n_names; i++) {
        uint32_t j = (uint32_t)st_hash_bytes(f->arena + f->name_off[i], f->name_len[i], 3) & (n - 1);
        while (slots[j])
            j = (j + 1) & (n - 1);
        slots[j] = i + 1;
    }
    free(f->nslots);
    f->nslots = slots;
    f->n_nslots = n;
    return 1;
}

/* The decision for a name: 1 keep, 2 drop, 0 pending (added), -1 no memory. */
static int name_state(st_fuse *f, span name)
{
    const char *s = name.s ? name.s : "";
    size_t n = name.s ? name.n : 0;
    if ((uint64_t)f->n_names * 2 >= f->n_nslots && !grow_nslots(f))
        return -1;
    uint32_t mask = f->n_nslots - 1;
    uint32_t j = (uint32_t)st_hash_bytes(s, n, 3) & mask;
    while (f->nslots[j]) {
        uint32_t i = f->nslots[j] - 1;
        if (f->name_len[i] == n && bytes_equal(f->arena + f->name_off[i], s, n)) {
            if (f->name_state[i] == 0)
                f->pending_name = i;
            return f->name_state[i];
        }
        j = (j + 1) & mask;
    }
    if (n > UINT32_MAX)
        return -1;
    if (f->n_names == f->names_cap) {
        uint32_t cap = f->names_cap ? f->names_cap * 2 : 256;
        uint64_t *off = realloc(f->name_off, (size_t)cap * sizeof *off);
        if (!off)
            return -1;
        f->name_off = off;
        uint32_t *len = realloc(f->name_len, (size_t)cap * sizeof *len);
        if (!len)
            return -1;
        f->name_len = len;
        uint8_t *state = realloc(f->name_state, (size_t)cap);
        if (!state)
            return -1;
        f->name_state = state;
        f->names_cap = cap;
    }
    if (!arena_add(f, s, n, &f->name_off[f->n_names]))
        return -1;
    f->name_len[f->n_names] = (uint32_t)n;
    f->name_state[f->n_names] = 0;
    f->nslots[j] = f->n_names + 1;
    f->pending_name = f->n_names++;
    return 0;
}

/* ------------------------------------------------------------------ one event: phase A */

#define KEY_IS(sp, lit) ((sp).n == sizeof(lit) - 1 && memcmp((sp).s, (lit), sizeof(lit) - 1) == 0)

static int push_member(st_fuse *f, member **arr, size_t *n, size_t *cap, const member *m,
                       const char *base, const char *at)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 32;
        if (c > MAX_MEMBERS) {
            set_error(f, ST_FUSE_ERR_LIMIT, base, at, "an object has more than %u members", MAX_MEMBERS);
            return P_ERR;
        }
        member *a = realloc(*arr, c * sizeof *a);
        if (!a) {
            set_error(f, ST_FUSE_ERR_NOMEM, base, at, "out of memory");
            return P_ERR;
        }
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = *m;
    return P_OK;
}

static int event_key_kind(span k)
{
    switch (k.n) {
    case 2:
        if (KEY_IS(k, "ph"))
            return K_PH;
        if (KEY_IS(k, "ts"))
            return K_TS;
        if (KEY_IS(k, "id"))
            return K_ID;
        break;
    case 3:
        if (KEY_IS(k, "cat"))
            return K_CAT;
        if (KEY_IS(k, "pid"))
            return K_PID;
        if (KEY_IS(k, "tid"))
            return K_TID;
        if (KEY_IS(k, "dur"))
            return K_DUR;
        break;
    case 4:
        if (KEY_IS(k, "name"))
            return K_NAME;
        if (KEY_IS(k, "args"))
            return K_ARGS;
        break;
    }
    return K_OTHER;
}

static int arg_key_kind(span k)
{
    switch (k.n) {
    case 4:
        if (KEY_IS(k, "rank") || KEY_IS(k, "lane"))
            return A_RESERVED;
        if (KEY_IS(k, "name"))
            return A_NAME;
        break;
    case 6:
        if (KEY_IS(k, "id_raw"))
            return A_RESERVED;
        break;
    case 7:
        if (KEY_IS(k, "pid_raw") || KEY_IS(k, "tid_raw"))
            return A_RESERVED;
        break;
    case 8:
        if (KEY_IS(k, "args_raw"))
            return A_RESERVED;
        break;
    case 10:
        if (KEY_IS(k, "sort_index"))
            return A_SORT;
        break;
    case 11:
        if (KEY_IS(k, "correlation"))
            return A_CORR;
        if (KEY_IS(k, "External id"))
            return A_EXT;
        if (KEY_IS(k, "external id"))
            return A_EXT_LC;
        break;
    case 15:
        if (KEY_IS(k, "correlation_raw") || KEY_IS(k, "External id_raw") ||
            KEY_IS(k, "external id_raw"))
            return A_RESERVED;
        break;
    }
    return A_OTHER;
}

static void account(ev_info *ev, unsigned wf)
{
    if (wf & W_BADLIT)
        ev->bad_literals++;
    if (wf & W_REPAIR)
        ev->repaired++;
}

static int is_number_token(const member *m)
{
    int is_int;
    return *m->val.s != '"' && valid_number(m->val.s, m->val.n, &is_int);
}

/* pid / tid / id: an int that fits, a string, or something else */
static uint8_t id_kind(const char *v, size_t n, const numinfo *ni, unsigned wf, int64_t *num, span *str)
{
    if (*v == '"') {
        str->s = v + 1;
        str->n = n - 2;
        return V_STR;
    }
    if (!(wf & W_BADLIT) && ni->int_fits) {
        *num = ni->ival;
        return V_INT;
    }
    return V_OTHER;
}

/*
 * Walk "{ key: value, ... }" at p; for an event (is_args 0) or its args
 * object (is_args 1).  The fields the filters and rewrites need go into ev.
 * Write and spans modes validate every value strictly and record each member
 * (f->members / f->args) for the emitter; scan mode only looks closely at the
 * values it needs and skips the rest leniently (write mode validates them).
 */
static int parse_object(st_fuse *f, const char *base, const char *p, const char *end, int is_args,
                        ev_info *ev, const char **next)
{
    const int record = f->mode != ST_FUSE_MODE_SCAN;
    p = st_skip_ws(p + 1, end);
    if (p >= end)
        return P_MORE;
    if (*p == '}') {
        *next = p + 1;
        return P_OK;
    }
    for (;;) {
        member m;
        numinfo ni;
        unsigned wf = 0;
        const char *k = p, *v;
        int r;
        if (p >= end)
            return P_MORE;
        if (*p != '"') {
            set_char_error(f, base, p, is_args ? "expected a key string in args" : "expected a key string in an event");
            return P_ERR;
        }
        if (walk_string(p, end, NULL, &p, &wf) != P_OK)
            return P_MORE;
        m.key.s = k + 1;
        m.key.n = (size_t)(p - k - 2);
        m.key_clean = !(wf & W_REPAIR);
        m.dup = 0;
        if (decode_key(f, m.key, wf, &m.dk) != P_OK) {
            set_error(f, ST_FUSE_ERR_NOMEM, base, k, "out of memory");
            return P_ERR;
        }
        account(ev, wf);
        p = st_skip_ws(p, end);
        if (p >= end)
            return P_MORE;
        if (*p != ':') {
            set_char_error(f, base, p, "expected ':' after a key");
            return P_ERR;
        }
        p = st_skip_ws(p + 1, end);
        if (p >= end)
            return P_MORE;
        {
            /* by the decoded text: "p\u0069d" is pid */
            span text = {dkey_text(f, &m.dk), m.dk.n};
            m.kind = (uint8_t)(is_args ? arg_key_kind(text) : event_key_kind(text));
        }
        if (m.kind == K_ARGS && ev->args_kind) {
            /* a second args member: the last of duplicate keys is kept, so
             * it replaces what the first one set */
            ev->args_kind = 0;
            ev->corr_k = ev->ext_k = ev->ext_lc_k = V_NONE;
            ev->thread_label = (span){NULL, 0};
            ev->has_sort = 0;
            if (record)
                f->n_args = 0;
        }
        v = p;
        wf = 0;
        ni.valid = 0;
        m.nk = f->n_kdup;
        if (*p == '"') {
            r = walk_string(p, end, NULL, &p, &wf);
        } else if (*p == '{' || *p == '[') {
            if (m.kind == K_ARGS && *p == '{') {
                ev->args_kind = 1;
                r = parse_object(f, base, p, end, 1, ev, &p);
            } else if (record) {
                r = walk_value(f, base, p, end, NULL, &p, &wf, KEYS_RECORD, 0);
            } else {
                r = skip_value(f, base, p, end, &p);
            }
        } else {
            r = walk_scalar_ni(f, base, p, end, NULL, &p, &wf, &ni);
        }
        if (r != P_OK)
            return r;
        if (m.kind == K_ARGS && !ev->args_kind)
            ev->args_kind = 2;
        account(ev, wf);
        m.val.s = v;
        m.val.n = (size_t)(p - v);
        m.val_clean = !(wf & (W_WS | W_REPAIR | W_BADLIT | W_DUP));
        switch (m.kind) {
        case K_PH:
            if (*v == '"' && m.val_clean)
                ev->ph = (span){v + 1, m.val.n - 2};
            break;
        case K_CAT:
            if (*v == '"' && m.val_clean)
                ev->cat = (span){v + 1, m.val.n - 2};
            break;
        case K_NAME:
            if (*v == '"' && m.val_clean)
                ev->name = (span){v + 1, m.val.n - 2};
            break;
        case K_PID:
            ev->pid_k = id_kind(v, m.val.n, &ni, wf, &ev->pid, &ev->pid_s);
            break;
        case K_TID:
            ev->tid_k = id_kind(v, m.val.n, &ni, wf, &ev->tid, &ev->tid_s);
            break;
        case K_ID: {
            span ignored;
            ev->id_k = id_kind(v, m.val.n, &ni, wf, &ev->id, &ignored);
            break;
        }
        case K_TS:
            ev->has_ts = m.val_clean && token_ns(v, m.val.n, &ni, &ev->ts);
            break;
        case K_DUR:
            ev->has_dur = m.val_clean && token_ns(v, m.val.n, &ni, &ev->dur);
            break;
        case K_ARGS:
            ev->args_member = f->n_members;
            break;
        case A_CORR:
            ev->corr_k = m.val_clean && ni.int_fits ? V_INT : V_OTHER;
            ev->corr = ni.ival;
            break;
        case A_EXT:
            ev->ext_k = m.val_clean && ni.int_fits ? V_INT : V_OTHER;
            ev->ext = ni.ival;
            break;
        case A_EXT_LC:
            ev->ext_lc_k = m.val_clean && ni.int_fits ? V_INT : V_OTHER;
            ev->ext_lc = ni.ival;
            break;
        case A_NAME:
            if (*v == '"' && m.val_clean)
                ev->thread_label = (span){v + 1, m.val.n - 2};
            break;
        case A_SORT:
            ev->has_sort = m.val_clean && ni.int_fits;
            ev->sort_index = ni.ival;
            break;
        }
        if (record) {
            member **arr = is_args ? &f->args : &f->members;
            size_t *n = is_args ? &f->n_args : &f->n_members;
            size_t *cap = is_args ? &f->args_cap : &f->members_cap;
            if (*n < *cap)
                (*arr)[(*n)++] = m;
            else if (push_member(f, arr, n, cap, &m, base, k) != P_OK)
                return P_ERR;
        }
        p = st_skip_ws(p, end);
        if (p >= end)
            return P_MORE;
        if (*p == ',') {
            p = st_skip_ws(p + 1, end);
            continue;
        }
        if (*p == '}') {
            *next = p + 1;
            return P_OK;
        }
        set_char_error(f, base, p, is_args ? "expected ',' or '}' in args" : "expected ',' or '}' in an event");
        return P_ERR;
    }
}

/* ------------------------------------------------------------------ decisions */

enum { D_KEEP, D_PROCESS_META, D_PYFUNC, D_TRACE, D_CAT, D_NAME, D_NCCL, D_WINDOW, D_MASK,
       D_NO_PROCESS, D_PENDING, D_NOMEM };

static int is_meta(const ev_info *ev)
{
    return ev->ph.s && ev->ph.n == 1 && ev->ph.s[0] == 'M';
}

static int is_process_meta(const ev_info *ev)
{
    return is_meta(ev) && (KEY_IS(ev->name, "process_name") || KEY_IS(ev->name, "process_sort_index") ||
                           KEY_IS(ev->name, "process_labels"));
}

static int contains_nccl(span s)
{
    for (size_t i = 0; i + 4 <= s.n; i++) {
        if ((s.s[i] | 0x20) == 'n' && (s.s[i + 1] | 0x20) == 'c' && (s.s[i + 2] | 0x20) == 'c' &&
            (s.s[i + 3] | 0x20) == 'l')
            return 1;
    }
    return 0;
}

static int is_gpu_cat(span c)
{
    return KEY_IS(c, "kernel") || KEY_IS(c, "gpu_memcpy") || KEY_IS(c, "gpu_memset") ||
           KEY_IS(c, "gpu_user_annotation") || KEY_IS(c, "Kernel") || KEY_IS(c, "Memcpy") ||
           KEY_IS(c, "Memset");
}

static int64_t sat_add(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b)
        return INT64_MIN;
    return a + b;
}

static int pid_lookup(const st_fuse *f, int64_t pid, int64_t *out)
{
    size_t lo = 0, hi = f->n_pids;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->pid_raw[mid] < pid)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < f->n_pids && f->pid_raw[lo] == pid) {
        *out = f->pid_new[lo];
        return 1;
    }
    return 0;
}

static int decide(st_fuse *f, const ev_info *ev, uint64_t idx)
{
    if (is_process_meta(ev))
        return D_PROCESS_META;
    if (f->cfg.flags & ST_FUSE_KEEP_MASK) {
        if (idx >= f->mask_events || !(f->mask[idx >> 3] & (1u << (idx & 7))))
            return D_MASK;
    } else if (!is_meta(ev)) {
        uint32_t fl = f->cfg.flags;
        if (!(fl & ST_FUSE_KEEP_PYFUNC) && KEY_IS(ev->cat, "python_function"))
            return D_PYFUNC;
        if (!(fl & ST_FUSE_KEEP_SPANS) && KEY_IS(ev->cat, "Trace"))
            return D_TRACE;
        if (fl & ST_FUSE_CAT_FILTER) {
            int ok = 0;
            for (size_t i = 0; ev->cat.s && i < f->n_cats && !ok; i++)
                ok = f->cat_lens[i] == ev->cat.n && bytes_equal(f->cats[i], ev->cat.s, ev->cat.n);
            if (!ok)
                return D_CAT;
        }
        if ((fl & ST_FUSE_NCCL_ONLY) &&
            !((KEY_IS(ev->cat, "kernel") || KEY_IS(ev->cat, "Kernel")) && contains_nccl(ev->name)))
            return D_NCCL;
        if ((fl & ST_FUSE_WINDOW) && ev->has_ts) {
            int64_t t0 = sat_add(ev->ts, f->cfg.ts_shift_ns);
            int64_t t1 = sat_add(t0, ev->has_dur && ev->dur > 0 ? ev->dur : 0);
            if (t1 < f->cfg.window_lo_ns || t0 > f->cfg.window_hi_ns)
                return D_WINDOW;
        }
        if (fl & ST_FUSE_NAME_FILTER) {
            int s = name_state(f, ev->name);
            if (s < 0)
                return D_NOMEM;
            if (s == 0)
                return D_PENDING;
            if (s == 2)
                return D_NAME;
        }
    }
    if (f->mode == ST_FUSE_MODE_WRITE && is_meta(ev) && ev->pid_k == V_INT) {
        int64_t mapped;
        if (!pid_lookup(f, ev->pid, &mapped))
            return D_NO_PROCESS;
    }
    return D_KEEP;
}

static void count_drop(st_fuse *f, int d)
{
    switch (d) {
    case D_PROCESS_META: f->st.dropped_process_meta++; break;
    case D_PYFUNC: f->st.dropped_pyfunc++; break;
    case D_TRACE: f->st.dropped_trace++; break;
    case D_CAT: f->st.dropped_cat++; break;
    case D_NAME: f->st.dropped_name++; break;
    case D_NCCL: f->st.dropped_nccl++; break;
    case D_WINDOW: f->st.dropped_window++; break;
    case D_MASK: f->st.dropped_mask++; break;
    case D_NO_PROCESS: f->st.dropped_no_process++; break;
    }
}

/* ------------------------------------------------------------------ phase B: emit */

/* Write a member's value: as is when clean, else walked again with output
 * on.  The walk may look one byte past the value (a number ends at the first
 * byte that cannot continue it); phase A saw that byte, so it is in the
 * buffer. */
static void put_value(st_fuse *f, obuf *o, const member *m)
{
    if (m->val_clean) {
        put(o, m->val.s, m->val.n);
    } else {
        unsigned wf = 0;
        const char *next;
        walk_value(f, NULL, m->val.s, m->val.s + m->val.n + 1, o, &next, &wf, KEYS_APPLY, m->nk);
    }
}

static void put_key(obuf *o, const member *m)
{
    if (m->key_clean) {
        putc1(o, '"');
        put(o, m->key.s, m->key.n);
        putc1(o, '"');
    } else {
        unsigned wf = 0;
        const char *next;
        walk_string(m->key.s - 1, m->key.s + m->key.n + 1, o, &next, &wf);
    }
    putc1(o, ':');
}

/* A string value with a suffix before its closing quote. */
static void put_string_suffixed(obuf *o, const member *m, const char *suffix, int64_t num)
{
    unsigned wf = 0;
    const char *next;
    walk_string(m->val.s, m->val.s + m->val.n, o, &next, &wf);
    if (!o->full)
        o->len--; /* the closing quote */
    put(o, suffix, strlen(suffix));
    put_i64(o, num);
    PUTS(o, ")\"");
}

static void put_shifted_id(st_fuse *f, obuf *o, const member *m, int kind, int64_t v, uint64_t *overflow)
{
    int64_t off = f->cfg.id_offset;
    if (kind == V_INT && !((off > 0 && v > INT64_MAX - off) || (off < 0 && v < INT64_MIN - off))) {
        put_i64(o, v + off);
        return;
    }
    if (kind == V_INT)
        (*overflow)++;
    put_value(f, o, m);
}

/* Mark every member of one object that a later one with the same key
 * (decoded) overrides: strict JSON has unique keys, and most parsers keep
 * the last. */
static int mark_duplicates(st_fuse *f, member *a, size_t n)
{
    return mark_overridden(f, (char *)a, sizeof *a, n, offsetof(member, dk), offsetof(member, dup)) < 0
               ? P_ERR : P_OK;
}

typedef struct {
    const member *pid, *tid, *id, *corr, *ext, *ext_lc, *args_other;
    uint32_t lane;
    uint64_t id_overflow, ts_unshifted;
} emit_ctx;

static void put_args_tail(st_fuse *f, obuf *o, emit_ctx *c, int first)
{
    if (!first)
        putc1(o, ',');
    PUTS(o, "\"rank\":");
    put_i64(o, f->cfg.rank);
    if (c->pid) {
        PUTS(o, ",\"pid_raw\":");
        put_value(f, o, c->pid);
    }
    if (c->lane) {
        PUTS(o, ",\"tid_raw\":");
        if (c->tid)
            put_value(f, o, c->tid);
        else
            PUTS(o, "null");
        PUTS(o, ",\"lane\":");
        put_i64(o, c->lane);
    }
    if (c->id) {
        PUTS(o, ",\"id_raw\":");
        put_value(f, o, c->id);
    }
    if (c->corr) {
        PUTS(o, ",\"correlation_raw\":");
        put_value(f, o, c->corr);
    }
    if (c->ext) {
        PUTS(o, ",\"External id_raw\":");
        put_value(f, o, c->ext);
    }
    if (c->ext_lc) {
        PUTS(o, ",\"external id_raw\":");
        put_value(f, o, c->ext_lc);
    }
    if (c->args_other) {
        PUTS(o, ",\"args_raw\":");
        put_value(f, o, c->args_other);
    }
}

static void emit_event(st_fuse *f, obuf *o, const ev_info *ev, uint32_t lane, uint32_t track_i,
                       emit_ctx *c)
{
    memset(c, 0, sizeof *c);
    c->lane = lane;
    for (size_t i = 0; i < f->n_members; i++) {
        const member *m = &f->members[i];
        if (m->dup)
            continue;
        switch (m->kind) {
        case K_PID: c->pid = m; break;
        case K_TID: c->tid = m; break;
        case K_ID: c->id = m; break;
        }
    }
    for (size_t i = 0; i < f->n_args; i++) {
        const member *m = &f->args[i];
        if (m->dup)
            continue;
        switch (m->kind) {
        case A_CORR: c->corr = m; break;
        case A_EXT: c->ext = m; break;
        case A_EXT_LC: c->ext_lc = m; break;
        }
    }
    if (f->wrote_any)
        putc1(o, ',');
    putc1(o, '{');
    int written = 0;
    for (size_t i = 0; i < f->n_members; i++) {
        const member *m = &f->members[i];
        if (m->dup)
            continue;
        if (written++)
            putc1(o, ',');
        put_key(o, m);
        switch (m->kind) {
        case K_PID:
            if (ev->pid_k == V_INT) {
                int64_t mapped;
                if (!pid_lookup(f, ev->pid, &mapped))
                    mapped = sat_add(ev->pid, f->cfg.pid_offset);
                put_i64(o, mapped);
            } else if (ev->pid_k == V_STR) {
                put_string_suffixed(o, m, ev->pid_s.n ? " (rank " : "(rank ", f->cfg.rank);
            } else {
                put_value(f, o, m);
            }
            break;
        case K_TID:
            if (lane && ev->tid_k == V_STR) {
                put_string_suffixed(o, m, " (lane ", lane);
            } else if (lane && ev->tid_k == V_INT) {
                put_i64(o, sat_add(f->tracks[track_i].lane_base, (int64_t)lane - 1));
            } else {
                put_value(f, o, m);
            }
            break;
        case K_ID:
            put_shifted_id(f, o, m, ev->id_k, ev->id, &c->id_overflow);
            break;
        case K_TS:
            if (m->val_clean && is_number_token(m)) {
                if (!put_shifted(o, m->val.s, m->val.n, f->cfg.ts_shift_ns))
                    c->ts_unshifted++;
            } else {
                put_value(f, o, m);
            }
            break;
        case K_ARGS:
            if (ev->args_kind == 1) {
                int first = 1;
                putc1(o, '{');
                for (size_t j = 0; j < f->n_args; j++) {
                    const member *a = &f->args[j];
                    if (a->kind == A_RESERVED || a->dup)
                        continue;
                    if (!first)
                        putc1(o, ',');
                    first = 0;
                    put_key(o, a);
                    if (a->kind == A_CORR)
                        put_shifted_id(f, o, a, ev->corr_k, ev->corr, &c->id_overflow);
                    else if (a->kind == A_EXT)
                        put_shifted_id(f, o, a, ev->ext_k, ev->ext, &c->id_overflow);
                    else if (a->kind == A_EXT_LC)
                        put_shifted_id(f, o, a, ev->ext_lc_k, ev->ext_lc, &c->id_overflow);
                    else
                        put_value(f, o, a);
                }
                put_args_tail(f, o, c, first);
                putc1(o, '}');
            } else {
                c->args_other = m;
                putc1(o, '{');
                put_args_tail(f, o, c, 1);
                putc1(o, '}');
            }
            break;
        default:
            put_value(f, o, m);
        }
    }
    if (!ev->args_kind) {
        if (written)
            putc1(o, ',');
        PUTS(o, "\"args\":{");
        put_args_tail(f, o, c, 1);
        putc1(o, '}');
    }
    putc1(o, '}');
}

/* ------------------------------------------------------------------ commit (scan mode) */

static int push_interval(st_fuse *f, int64_t ts, int64_t end, uint64_t idx, uint32_t track_i)
{
    if (idx > UINT32_MAX)
        return 0;
    if (f->n_ivl == f->ivl_cap) {
        size_t cap = f->ivl_cap ? f->ivl_cap * 2 : 4096;
        if (cap > f->ivl_budget)
            cap = f->ivl_budget;
        if (cap <= f->n_ivl)
            return 0; /* cannot happen: the feed hands out a run first */
        interval *a = realloc(f->ivl, cap * sizeof *a);
        if (!a)
            return 0;
        f->ivl = a;
        f->ivl_cap = cap;
    }
    interval *v = &f->ivl[f->n_ivl++];
    v->ts = ts;
    v->end = end;
    v->idx = (uint32_t)idx;
    v->track = track_i;
    return 1;
}

static void minmax(int64_t *lo, int64_t *hi, int64_t v)
{
    if (v < *lo)
        *lo = v;
    if (v > *hi)
        *hi = v;
}

static int commit_scan(st_fuse *f, const char *base, const char *at, const ev_info *ev, uint64_t idx)
{
    int64_t ti = find_track(f, ev);
    if (ti < 0) {
        set_error(f, ST_FUSE_ERR_NOMEM, base, at, "out of memory for tracks");
        return P_ERR;
    }
    track *t = &f->tracks[ti];
    if (ev->pid_k == V_INT)
        minmax(&f->st.pid_min, &f->st.pid_max, ev->pid);
    if (ev->id_k == V_INT)
        minmax(&f->st.id_min, &f->st.id_max, ev->id);
    if (ev->corr_k == V_INT)
        minmax(&f->st.id_min, &f->st.id_max, ev->corr);
    if (ev->ext_k == V_INT)
        minmax(&f->st.id_min, &f->st.id_max, ev->ext);
    if (ev->ext_lc_k == V_INT)
        minmax(&f->st.id_min, &f->st.id_max, ev->ext_lc);
    if (is_meta(ev)) {
        if (KEY_IS(ev->name, "thread_name") && ev->thread_label.s) {
            if (!arena_add(f, ev->thread_label.s, ev->thread_label.n, &t->name_off)) {
                set_error(f, ST_FUSE_ERR_NOMEM, base, at, "out of memory for thread names");
                return P_ERR;
            }
            t->name_len = (uint32_t)(ev->thread_label.n > UINT32_MAX ? UINT32_MAX : ev->thread_label.n);
            t->flags |= ST_FUSE_T_NAMED;
        } else if (KEY_IS(ev->name, "thread_sort_index") && ev->has_sort) {
            t->sort_index = ev->sort_index;
            t->flags |= ST_FUSE_T_SORTED;
        }
        return P_OK;
    }
    t->n_kept++;
    if (ev->cat.s && is_gpu_cat(ev->cat))
        t->flags |= ST_FUSE_T_GPU;
    if (ev->has_ts) {
        int64_t t0 = sat_add(ev->ts, f->cfg.ts_shift_ns);
        int64_t t1 = sat_add(t0, ev->has_dur && ev->dur > 0 ? ev->dur : 0);
        minmax(&f->st.ts_min_ns, &f->st.ts_max_ns, t0);
        minmax(&f->st.ts_min_ns, &f->st.ts_max_ns, t1);
        if (ev->ph.s && ev->ph.n == 1 && ev->ph.s[0] == 'X') {
            int64_t end = sat_add(ev->ts, ev->has_dur && ev->dur > 0 ? ev->dur : 0);
            if (!push_interval(f, ev->ts, end, idx, (uint32_t)ti)) {
                set_error(f, ST_FUSE_ERR_NOMEM, base, at,
                          idx > UINT32_MAX ? "more than 2^32 events in one trace" : "out of memory for intervals");
                return P_ERR;
            }
        }
    }
    return P_OK;
}

/* ------------------------------------------------------------------ one event */

enum { E_DONE = 0, E_MORE = 1, E_ERR = 2, E_FULL = 3, E_NAME = 4, E_SMALL = 5, E_RUN = 6 };

static int handle_event(st_fuse *f, const char *base, const char *p, const char *end,
                        st_fuse_out *out, const char **next)
{
    ev_info ev;
    memset(&ev, 0, sizeof ev);
    f->n_members = f->n_args = 0;
    f->kbuf_len = f->n_kst = f->n_kdup = 0;
    int r = parse_object(f, base, p, end, 0, &ev, next);
    if (r == P_MORE)
        return E_MORE;
    if (r == P_ERR)
        return E_ERR;
    uint64_t idx = f->st.events_seen;

    if (f->mode == ST_FUSE_MODE_SPANS) {
        if (!is_process_meta(&ev)) {
            if (out->n_spans >= out->spans_cap)
                return E_FULL;
            st_fuse_span *sp = &out->spans[out->n_spans++];
            sp->index = idx;
            sp->offset = (uint64_t)(p - base);
            sp->length = (uint64_t)(*next - p);
        } else {
            f->st.dropped_process_meta++;
        }
        f->st.events_seen++;
        return E_DONE;
    }

    int d = decide(f, &ev, idx);
    if (d == D_PENDING)
        return E_NAME;
    if (d == D_NOMEM) {
        set_error(f, ST_FUSE_ERR_NOMEM, base, p, "out of memory for event names");
        return E_ERR;
    }
    if (d != D_KEEP) {
        count_drop(f, d);
        f->st.events_seen++;
        return E_DONE;
    }

    if (f->mode == ST_FUSE_MODE_SCAN) {
        if (commit_scan(f, base, p, &ev, idx) != P_OK)
            return E_ERR;
    } else {
        uint32_t lane = 0, track_i = 0;
        while (f->move_cursor < f->n_moves && f->moves[f->move_cursor].idx < idx)
            f->move_cursor++;
        if (f->move_cursor < f->n_moves && f->moves[f->move_cursor].idx == idx) {
            lane = f->moves[f->move_cursor].lane;
            track_i = f->moves[f->move_cursor].track;
        }
        if (mark_duplicates(f, f->members, f->n_members) != P_OK || mark_duplicates(f, f->args, f->n_args) != P_OK) {
            set_error(f, ST_FUSE_ERR_NOMEM, base, p, "out of memory");
            return E_ERR;
        }
        obuf o = {out->buf, out->len, out->cap, 0};
        emit_ctx c;
        emit_event(f, &o, &ev, lane, track_i, &c);
        if (o.full)
            return out->len ? E_FULL : E_SMALL;
        f->st.bytes_written += o.len - out->len;
        out->len = o.len;
        f->wrote_any = 1;
        f->st.id_overflow += c.id_overflow;
        f->st.ts_unshifted += c.ts_unshifted;
    }
    f->st.bad_literals += ev.bad_literals;
    f->st.repaired_strings += ev.repaired;
    f->st.events_kept++;
    f->st.events_seen++;
    return E_DONE;
}

/* ------------------------------------------------------------------ document */

static int store_meta(st_fuse *f, const char *base, span k, const char *v, size_t vn)
{
    if (st_members_add(&f->meta, k.s, k.n, v, vn) == 0)
        return P_OK;
    set_error(f, ST_FUSE_ERR_NOMEM, base, k.s, "out of memory for top-level members");
    return P_ERR;
}

/* One item in the current state; E_* codes. */
static int parse_item(st_fuse *f, const char *base, const char *p, const char *end,
                      st_fuse_out *out, const char **next)
{
    unsigned wf = 0;
    switch (f->state) {
    case S_START:
        if ((unsigned char)*p == 0xEF) { /* a UTF-8 BOM, possibly cut by the chunk end */
            if (end - p < 3)
                return E_MORE;
            if (memcmp(p, "\xEF\xBB\xBF", 3) == 0) {
                *next = p + 3;
                return E_DONE;
            }
        }
        if (*p == '{') {
            f->state = S_ROOT_KEY;
        } else if (*p == '[') {
            f->state = S_EVENTS;
            f->bare_array = 1;
            f->saw_events = 1;
        } else {
            set_error(f, ST_FUSE_ERR_SYNTAX, base, p, "not a trace: expected a JSON object or array");
            return E_ERR;
        }
        f->first_in_container = 1;
        *next = p + 1;
        return E_DONE;

    case S_ROOT_KEY: {
        if (*p == '}' && f->first_in_container) {
            f->state = S_DONE;
            *next = p + 1;
            return E_DONE;
        }
        if (*p != '"') {
            set_char_error(f, base, p, "expected a key string in the top-level object");
            return E_ERR;
        }
        const char *k = p;
        if (walk_string(p, end, NULL, &p, &wf) != P_OK)
            return E_MORE;
        span key = {k + 1, (size_t)(p - k - 2)};
        p = st_skip_ws(p, end);
        if (p >= end)
            return E_MORE;
        if (*p != ':') {
            set_char_error(f, base, p, "expected ':' after a top-level key");
            return E_ERR;
        }
        p = st_skip_ws(p + 1, end);
        if (p >= end)
            return E_MORE;
        if (KEY_IS(key, "traceEvents")) {
            if (*p != '[') {
                set_error(f, ST_FUSE_ERR_SYNTAX, base, p, "not a trace: traceEvents is not an array");
                return E_ERR;
            }
            f->state = S_EVENTS;
            f->saw_events = 1;
            f->first_in_container = 1;
            *next = p + 1;
            return E_DONE;
        }
        const char *v = p;
        int r = skip_value(f, base, p, end, next);
        if (st_is_log_member(key.s, key.n) && *v == '[' &&
            !(r == P_OK && st_value_ends_member(*next, end))) {
            const char *e = NULL;
            int found = st_log_member_end(v, end, &e); /* maybe not valid JSON: see st_lex.h */
            if (found > 0) {
                *next = e;
                r = P_OK;
                f->err_code = ST_FUSE_OK;
            } else if (found < 0) {
                f->err_code = ST_FUSE_OK;
                return E_MORE; /* its line is not all in the buffer yet */
            }
        }
        if (r == P_MORE)
            return E_MORE;
        if (r == P_ERR)
            return E_ERR;
        if (f->mode == ST_FUSE_MODE_SCAN && store_meta(f, base, key, v, (size_t)(*next - v)) != P_OK)
            return E_ERR;
        f->first_in_container = 0;
        f->state = S_ROOT_NEXT;
        return E_DONE;
    }

    case S_ROOT_NEXT:
        if (*p == ',') {
            f->state = S_ROOT_KEY;
            *next = p + 1;
            return E_DONE;
        }
        if (*p == '}') {
            f->state = S_DONE;
            *next = p + 1;
            return E_DONE;
        }
        set_char_error(f, base, p, "expected ',' or '}' in the top-level object");
        return E_ERR;

    case S_EVENTS: {
        if (*p == ']' && f->first_in_container)
            goto close_events;
        if (f->mode == ST_FUSE_MODE_SCAN && f->n_ivl >= f->ivl_budget) {
            sort_intervals(f->ivl, f->n_ivl);
            f->run_pending = 1;
            return E_RUN;
        }
        if (*p != '{') {
            set_char_error(f, base, p, "expected an event object");
            return E_ERR;
        }
        int r = handle_event(f, base, p, end, out, next);
        if (r == E_DONE) {
            f->first_in_container = 0;
            f->state = S_EVENTS_NEXT;
        }
        return r;
    }

    case S_EVENTS_NEXT:
        if (*p == ',') {
            f->state = S_EVENTS;
            *next = p + 1;
            return E_DONE;
        }
        if (*p == ']')
            goto close_events;
        set_char_error(f, base, p, "expected ',' or ']' after an event");
        return E_ERR;

    case S_DONE:
        set_error(f, ST_FUSE_ERR_SYNTAX, base, p, "unexpected data after the end of the JSON document");
        return E_ERR;
    }
    set_error(f, ST_FUSE_ERR_SYNTAX, base, p, "internal: bad state");
    return E_ERR;

close_events:
    *next = p + 1;
    f->state = f->bare_array ? S_DONE : S_ROOT_NEXT;
    f->first_in_container = 0;
    return E_DONE;
}

int st_fuse_feed(st_fuse *f, const char *buf, size_t len, int eof, st_fuse_out *out,
                 size_t *consumed)
{
    const char *p = buf, *end = buf + len;
    int rc = ST_FUSE_OK;
    *consumed = 0;
    if (f->pending_name >= 0) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "a name awaits st_fuse_decide_name()");
        return ST_FUSE_ERR_USAGE;
    }
    if (f->mode == ST_FUSE_MODE_WRITE && (!out || !out->buf)) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "write mode needs an output buffer");
        return ST_FUSE_ERR_USAGE;
    }
    if (f->mode == ST_FUSE_MODE_SPANS && (!out || !out->spans)) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "spans mode needs a span array");
        return ST_FUSE_ERR_USAGE;
    }
    if (!run_release(f))
        return ST_FUSE_ERR_USAGE;
    for (;;) {
        p = st_skip_ws(p, end);
        if (p >= end) {
            if (f->state == S_DONE)
                rc = ST_FUSE_DONE;
            else if (eof)
                rc = ST_FUSE_TRUNCATED;
            break;
        }
        const char *next = p;
        int r = parse_item(f, buf, p, end, out, &next);
        if (r == E_ERR) {
            rc = f->err_code;
            break;
        }
        if (r == E_MORE) {
            rc = eof ? ST_FUSE_TRUNCATED : ST_FUSE_OK;
            break;
        }
        if (r == E_FULL) {
            rc = ST_FUSE_OUTPUT_FULL;
            break;
        }
        if (r == E_NAME) {
            rc = ST_FUSE_NAME;
            break;
        }
        if (r == E_SMALL) {
            rc = ST_FUSE_OUTPUT_SMALL;
            break;
        }
        if (r == E_RUN) {
            rc = ST_FUSE_RUN;
            break;
        }
        p = next;
    }
    if (rc >= 0) {
        size_t n = (size_t)(p - buf);
        *consumed = n;
        f->st.bytes_consumed += n;
    }
    if (rc == ST_FUSE_TRUNCATED) {
        f->err_offset = f->st.bytes_consumed;
        snprintf(f->err, sizeof f->err, "truncated at byte %llu",
                 (unsigned long long)f->st.bytes_consumed);
    }
    return rc;
}

/* ------------------------------------------------------------------ lanes */

/* Interval order: track, ts, longest first (the parent), then file order. */
static inline int ivl_less(const interval *x, const interval *y)
{
    if (x->track != y->track)
        return x->track < y->track;
    if (x->ts != y->ts)
        return x->ts < y->ts;
    if (x->end != y->end)
        return x->end > y->end;
    return x->idx < y->idx;
}

/* In-place heapsorts: no scratch memory (glibc's qsort may allocate a copy). */
#define DEFINE_HEAPSORT(name, type, less)                                          \
    static void name(type *a, size_t n)                                            \
    {                                                                              \
        if (n < 2)                                                                 \
            return;                                                                \
        for (size_t start = n / 2; start-- > 0;) {                                 \
            size_t root = start;                                                   \
            for (;;) {                                                             \
                size_t child = 2 * root + 1;                                       \
                if (child >= n)                                                    \
                    break;                                                         \
                if (child + 1 < n && less(&a[child], &a[child + 1]))               \
                    child++;                                                       \
                if (!less(&a[root], &a[child]))                                    \
                    break;                                                         \
                type t = a[root];                                                  \
                a[root] = a[child];                                                \
                a[child] = t;                                                      \
                root = child;                                                      \
            }                                                                      \
        }                                                                          \
        for (size_t end = n - 1; end > 0; end--) {                                 \
            type t = a[0];                                                         \
            a[0] = a[end];                                                         \
            a[end] = t;                                                            \
            size_t root = 0;                                                       \
            for (;;) {                                                             \
                size_t child = 2 * root + 1;                                       \
                if (child >= end)                                                  \
                    break;                                                         \
                if (child + 1 < end && less(&a[child], &a[child + 1]))             \
                    child++;                                                       \
                if (!less(&a[root], &a[child]))                                    \
                    break;                                                         \
                t = a[root];                                                       \
                a[root] = a[child];                                                \
                a[child] = t;                                                      \
                root = child;                                                      \
            }                                                                      \
        }                                                                          \
    }

static inline int move_less(const move *x, const move *y)
{
    return x->idx < y->idx;
}

DEFINE_HEAPSORT(heapsort_intervals, interval, ivl_less)
DEFINE_HEAPSORT(sort_moves, move, move_less)

/* Introsort, in place: quicksort (median of three) with insertion sort for
 * short ranges and heapsort when the recursion gets too deep.  Recursion is
 * on the smaller side only, so the stack stays O(log n). */
static void introsort_intervals(interval *a, size_t n, int depth)
{
    while (n > 16) {
        if (depth-- == 0) {
            heapsort_intervals(a, n);
            return;
        }
        size_t mid = n / 2;
        interval t;
        if (ivl_less(&a[mid], &a[0])) {
            t = a[mid]; a[mid] = a[0]; a[0] = t;
        }
        if (ivl_less(&a[n - 1], &a[mid])) {
            t = a[n - 1]; a[n - 1] = a[mid]; a[mid] = t;
            if (ivl_less(&a[mid], &a[0])) {
                t = a[mid]; a[mid] = a[0]; a[0] = t;
            }
        }
        interval pivot = a[mid];
        size_t i = 0, j = n - 1;
        for (;;) { /* Hoare partition */
            while (ivl_less(&a[i], &pivot))
                i++;
            while (ivl_less(&pivot, &a[j]))
                j--;
            if (i >= j)
                break;
            t = a[i]; a[i] = a[j]; a[j] = t;
            i++;
            j--;
        }
        size_t left = j + 1; /* [0, left) <= pivot <= [left, n) */
        if (left < n - left) {
            introsort_intervals(a, left, depth);
            a += left;
            n -= left;
        } else {
            introsort_intervals(a + left, n - left, depth);
            n = left;
        }
    }
    for (size_t i = 1; i < n; i++) {
        interval v = a[i];
        size_t k = i;
        while (k > 0 && ivl_less(&v, &a[k - 1])) {
            a[k] = a[k - 1];
            k--;
        }
        a[k] = v;
    }
}

static void sort_intervals(interval *a, size_t n)
{
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1)
        depth += 2;
    introsort_intervals(a, n, depth);
}

static int lane_push(lane_stack *s, int64_t end)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        int64_t *e = realloc(s->ends, cap * sizeof *e);
        if (!e)
            return 0;
        s->ends = e;
        s->cap = cap;
    }
    s->ends[s->n++] = end;
    return 1;
}

static int add_move(st_fuse *f, uint32_t idx, uint32_t track_i, uint32_t lane)
{
    if (f->n_moves == f->moves_cap) {
        size_t cap = f->moves_cap ? f->moves_cap * 2 : 256;
        move *m = realloc(f->moves, cap * sizeof *m);
        if (!m)
            return 0;
        f->moves = m;
        f->moves_cap = cap;
    }
    f->moves[f->n_moves].idx = idx;
    f->moves[f->n_moves].track = track_i;
    f->moves[f->n_moves].lane = lane;
    f->n_moves++;
    return 1;
}

static void lanes_track_done(st_fuse *f)
{
    if (f->g_active && f->g_lanes > f->tracks[f->g_track].n_lanes)
        f->tracks[f->g_track].n_lanes = f->g_lanes;
    f->g_active = 0;
}

/*
 * Lanes, one interval at a time in interval order: each goes to the first
 * lane where, after closing the intervals that ended by its start, it nests
 * inside the innermost open one (or the lane is empty).  Every lane is then
 * properly nested, which is what Perfetto needs.
 */
static int lane_place(st_fuse *f, const interval *v)
{
    if (!f->g_active || v->track != f->g_track) {
        lanes_track_done(f);
        f->g_track = v->track;
        f->g_lanes = 0;
        f->g_active = 1;
    }
    uint32_t lane = f->g_lanes;
    for (uint32_t l = 0; l < f->g_lanes; l++) {
        lane_stack *s = &f->stacks[l];
        while (s->n && s->ends[s->n - 1] <= v->ts)
            s->n--;
        if (!s->n || s->ends[s->n - 1] >= v->end) {
            lane = l;
            break;
        }
    }
    if (lane == f->g_lanes) {
        if (f->g_lanes < MAX_LANES) {
            f->stacks[f->g_lanes].n = 0;
            f->g_lanes++;
        } else {
            lane = MAX_LANES - 1;
            f->st.lanes_forced++;
        }
    }
    if (!lane_push(&f->stacks[lane], v->end))
        return 0;
    if (lane) {
        if (!add_move(f, v->idx, v->track, lane))
            return 0;
        f->tracks[v->track].n_moved++;
    }
    return 1;
}

static void lanes_reset(st_fuse *f)
{
    for (uint32_t l = 0; l < MAX_LANES; l++) {
        free(f->stacks[l].ends);
        f->stacks[l].ends = NULL;
        f->stacks[l].n = f->stacks[l].cap = 0;
    }
    f->g_active = 0;
    f->g_lanes = 0;
    free(f->cursors);
    f->cursors = NULL;
    f->n_cursors = 0;
}

static int lanes_finish(st_fuse *f)
{
    lanes_track_done(f);
    lanes_reset(f);
    free(f->ivl);
    f->ivl = NULL;
    f->n_ivl = f->ivl_cap = 0;
    sort_moves(f->moves, f->n_moves);
    f->st.lane_moves = f->n_moves;
    f->lanes_done = 1;
    return ST_FUSE_OK;
}

/* the caller has taken the pending run: forget it */
static int run_release(st_fuse *f)
{
    if (!f->run_pending)
        return 1;
    if (!f->run_taken) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "a run of intervals awaits st_fuse_take_run()");
        return 0;
    }
    f->n_ivl = 0;
    f->run_pending = f->run_taken = 0;
    f->runs_taken++;
    return 1;
}

int st_fuse_take_run(st_fuse *f, const void **records, size_t *n_records, size_t *record_size)
{
    if (!f->run_pending) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "no run of intervals is pending");
        return ST_FUSE_ERR_USAGE;
    }
    *records = f->ivl;
    *n_records = f->n_ivl;
    *record_size = sizeof(interval);
    f->run_taken = 1;
    return ST_FUSE_OK;
}

int st_fuse_finish_scan(st_fuse *f)
{
    if (f->mode != ST_FUSE_MODE_SCAN || f->lanes_done || f->n_cursors) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "st_fuse_finish_scan() belongs after a scan pass");
        return ST_FUSE_ERR_USAGE;
    }
    if (!run_release(f))
        return ST_FUSE_ERR_USAGE;
    sort_intervals(f->ivl, f->n_ivl);
    if (f->runs_taken == 0) { /* everything fit: no merge */
        f->n_moves = 0;
        for (size_t i = 0; i < f->n_ivl; i++)
            if (!lane_place(f, &f->ivl[i])) {
                lanes_reset(f);
                set_error(f, ST_FUSE_ERR_NOMEM, NULL, NULL, "out of memory for lanes");
                return ST_FUSE_ERR_NOMEM;
            }
        return lanes_finish(f);
    }
    if (f->n_ivl) {
        f->run_pending = 1;
        return ST_FUSE_RUN;
    }
    return ST_FUSE_MERGE;
}

int st_fuse_merge_begin(st_fuse *f, size_t n_runs)
{
    if (f->mode != ST_FUSE_MODE_SCAN || f->lanes_done || f->run_pending || n_runs != f->runs_taken) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "st_fuse_merge_begin() needs every run taken (%llu)",
                  (unsigned long long)f->runs_taken);
        return ST_FUSE_ERR_USAGE;
    }
    free(f->ivl); /* the runs live with the caller now */
    f->ivl = NULL;
    f->n_ivl = f->ivl_cap = 0;
    free(f->cursors);
    f->cursors = calloc(n_runs ? n_runs : 1, sizeof *f->cursors);
    if (!f->cursors)
        return ST_FUSE_ERR_NOMEM;
    f->n_cursors = n_runs;
    f->n_moves = 0;
    f->g_active = 0;
    return ST_FUSE_OK;
}

int st_fuse_merge_feed(st_fuse *f, size_t run, const void *records, size_t n_records, int last)
{
    if (run >= f->n_cursors) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "no run %zu", run);
        return ST_FUSE_ERR_USAGE;
    }
    run_cursor *c = &f->cursors[run];
    c->p = records;
    c->n = n_records;
    c->pos = 0;
    c->last = last;
    return ST_FUSE_OK;
}

int st_fuse_merge(st_fuse *f, size_t *need_run)
{
    if (!f->n_cursors && !f->runs_taken) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "st_fuse_merge() without st_fuse_merge_begin()");
        return ST_FUSE_ERR_USAGE;
    }
    for (size_t i = 0; i < f->n_cursors; i++)
        if (f->cursors[i].pos >= f->cursors[i].n && !f->cursors[i].last) {
            *need_run = i;
            return ST_FUSE_NEED_RUN;
        }
    for (;;) {
        run_cursor *best = NULL;
        for (size_t i = 0; i < f->n_cursors; i++) {
            run_cursor *c = &f->cursors[i];
            if (c->pos < c->n && (!best || ivl_less(&c->p[c->pos], &best->p[best->pos])))
                best = c;
        }
        if (!best)
            return lanes_finish(f);
        if (best->pos && ivl_less(&best->p[best->pos], &best->p[best->pos - 1])) {
            set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "a run given to st_fuse_merge_feed() is not sorted");
            return ST_FUSE_ERR_USAGE;
        }
        if (!lane_place(f, &best->p[best->pos])) {
            set_error(f, ST_FUSE_ERR_NOMEM, NULL, NULL, "out of memory for lanes");
            return ST_FUSE_ERR_NOMEM;
        }
        if (++best->pos >= best->n && !best->last) {
            *need_run = (size_t)(best - f->cursors);
            return ST_FUSE_NEED_RUN;
        }
    }
}

/* ------------------------------------------------------------------ lifecycle */

static void clear_meta(st_fuse *f) { st_members_clear(&f->meta); }

int st_fuse_configure(st_fuse *f, const st_fuse_config *config)
{
    if (!config)
        return ST_FUSE_ERR_USAGE;
    uint32_t depth = config->max_depth ? config->max_depth : DEFAULT_MAX_DEPTH;
    if (depth > (1u << 20)) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "max_depth too large");
        return ST_FUSE_ERR_USAGE;
    }
    if (!f->stack || depth != f->cfg.max_depth) {
        char *s = realloc(f->stack, depth);
        if (!s)
            return ST_FUSE_ERR_NOMEM;
        f->stack = s;
        size_t *ko = realloc(f->kopen, depth * sizeof *ko);
        if (!ko)
            return ST_FUSE_ERR_NOMEM;
        f->kopen = ko;
        uint8_t *kw = realloc(f->kwrote, depth);
        if (!kw)
            return ST_FUSE_ERR_NOMEM;
        f->kwrote = kw;
    }
    f->cfg = *config;
    f->cfg.max_depth = depth;
    f->ivl_budget = config->interval_budget ? config->interval_budget : DEFAULT_INTERVAL_BUDGET;
    return ST_FUSE_OK;
}

int st_fuse_create(st_fuse **out, const st_fuse_config *config)
{
    st_fuse *f = calloc(1, sizeof *f);
    *out = NULL;
    if (!f)
        return ST_FUSE_ERR_NOMEM;
    st_fuse_config dflt;
    memset(&dflt, 0, sizeof dflt);
    int rc = st_fuse_configure(f, config ? config : &dflt);
    if (rc != ST_FUSE_OK) {
        free(f->stack);
        free(f->kopen);
        free(f->kwrote);
        free(f);
        return rc;
    }
    f->pending_name = -1;
    st_fuse_begin(f, ST_FUSE_MODE_SCAN);
    *out = f;
    return ST_FUSE_OK;
}

int st_fuse_begin(st_fuse *f, int mode)
{
    if (mode != ST_FUSE_MODE_SCAN && mode != ST_FUSE_MODE_WRITE && mode != ST_FUSE_MODE_SPANS) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "unknown mode %d", mode);
        return ST_FUSE_ERR_USAGE;
    }
    f->mode = mode;
    f->state = S_START;
    f->first_in_container = 0;
    f->bare_array = 0;
    f->saw_events = 0;
    f->wrote_any = (f->cfg.flags & ST_FUSE_COMMA_FIRST) ? 1 : 0;
    f->pending_name = -1;
    f->move_cursor = 0;
    uint64_t lane_moves = f->st.lane_moves;
    memset(&f->st, 0, sizeof f->st);
    f->st.pid_min = f->st.id_min = f->st.ts_min_ns = INT64_MAX;
    f->st.pid_max = f->st.id_max = f->st.ts_max_ns = INT64_MIN;
    f->err[0] = 0;
    if (mode == ST_FUSE_MODE_SCAN) {
        /* a new scan starts from nothing */
        clear_meta(f);
        f->n_tracks = 0;
        f->last_track = 0;
        if (f->tslots)
            memset(f->tslots, 0, (size_t)f->n_tslots * sizeof *f->tslots);
        f->n_ivl = 0;
        f->run_pending = f->run_taken = 0;
        f->runs_taken = 0;
        lanes_reset(f);
        f->n_moves = 0;
        f->lanes_done = 0;
        f->arena_len = 0;
        f->n_names = 0;
        if (f->nslots)
            memset(f->nslots, 0, (size_t)f->n_nslots * sizeof *f->nslots);
    } else {
        f->st.lane_moves = lane_moves;
    }
    return ST_FUSE_OK;
}

void st_fuse_destroy(st_fuse *f)
{
    if (!f)
        return;
    st_members_free(&f->meta);
    free(f->stack);
    free(f->kopen);
    free(f->kwrote);
    free(f->kbuf);
    free(f->kst);
    free(f->kdup);
    free(f->kslot);
    free(f->members);
    free(f->args);
    free(f->arena);
    free(f->tracks);
    free(f->tslots);
    free(f->name_off);
    free(f->name_len);
    free(f->name_state);
    free(f->nslots);
    for (size_t i = 0; i < f->n_cats; i++)
        free(f->cats[i]);
    free(f->cats);
    free(f->cat_lens);
    free(f->mask);
    free(f->pid_raw);
    free(f->pid_new);
    free(f->ivl);
    free(f->moves);
    lanes_reset(f);
    free(f);
}

const char *st_fuse_error(const st_fuse *f) { return f->err; }
uint64_t st_fuse_error_offset(const st_fuse *f) { return f->err_offset; }

void st_fuse_get_stats(const st_fuse *f, st_fuse_stats *s)
{
    *s = f->st;
    s->doc_started = f->state != S_START;
    s->saw_events = (uint32_t)f->saw_events;
    s->bare_array = (uint32_t)f->bare_array;
    s->doc_done = f->state == S_DONE;
}

int st_fuse_add_cat(st_fuse *f, const char *cat, size_t len)
{
    char **cats = realloc(f->cats, (f->n_cats + 1) * sizeof *cats);
    if (!cats)
        return ST_FUSE_ERR_NOMEM;
    f->cats = cats;
    size_t *lens = realloc(f->cat_lens, (f->n_cats + 1) * sizeof *lens);
    if (!lens)
        return ST_FUSE_ERR_NOMEM;
    f->cat_lens = lens;
    char *c = malloc(len ? len : 1);
    if (!c)
        return ST_FUSE_ERR_NOMEM;
    if (len)
        memcpy(c, cat, len);
    f->cats[f->n_cats] = c;
    f->cat_lens[f->n_cats] = len;
    f->n_cats++;
    return ST_FUSE_OK;
}

int st_fuse_pending_name(const st_fuse *f, const char **ptr, size_t *len)
{
    if (f->pending_name < 0)
        return 0;
    *ptr = f->arena + f->name_off[f->pending_name];
    *len = f->name_len[f->pending_name];
    return 1;
}

int st_fuse_decide_name(st_fuse *f, int keep)
{
    if (f->pending_name < 0) {
        set_error(f, ST_FUSE_ERR_USAGE, NULL, NULL, "no name awaits a decision");
        return ST_FUSE_ERR_USAGE;
    }
    f->name_state[f->pending_name] = keep ? 1 : 2;
    f->pending_name = -1;
    return ST_FUSE_OK;
}

int st_fuse_set_keep_mask(st_fuse *f, const uint8_t *bits, uint64_t n_events)
{
    size_t n = (size_t)((n_events + 7) / 8);
    uint8_t *m = malloc(n ? n : 1);
    if (!m)
        return ST_FUSE_ERR_NOMEM;
    if (n)
        memcpy(m, bits, n);
    free(f->mask);
    f->mask = m;
    f->mask_events = n_events;
    return ST_FUSE_OK;
}

size_t st_fuse_track_count(const st_fuse *f) { return f->n_tracks; }

int st_fuse_get_track(const st_fuse *f, size_t i, st_fuse_track *out)
{
    if (i >= f->n_tracks)
        return ST_FUSE_ERR_USAGE;
    const track *t = &f->tracks[i];
    memset(out, 0, sizeof *out);
    out->pid = t->pid;
    out->tid = t->tid;
    if (t->pid_k == V_STR) {
        out->pid_str = f->arena + t->pid_off;
        out->pid_len = t->pid_len;
    }
    if (t->tid_k == V_STR) {
        out->tid_str = f->arena + t->tid_off;
        out->tid_len = t->tid_len;
    }
    if (t->flags & ST_FUSE_T_NAMED) {
        out->name = f->arena + t->name_off;
        out->name_len = t->name_len;
    }
    out->sort_index = t->sort_index;
    out->n_kept = t->n_kept;
    out->n_moved = t->n_moved;
    out->n_lanes = t->n_lanes;
    out->flags = t->flags;
    return ST_FUSE_OK;
}

int st_fuse_set_lane_base(st_fuse *f, size_t i, int64_t first_tid)
{
    if (i >= f->n_tracks)
        return ST_FUSE_ERR_USAGE;
    f->tracks[i].lane_base = first_tid;
    return ST_FUSE_OK;
}

typedef struct {
    int64_t raw, mapped;
} pid_pair;

static int cmp_pid_pair(const void *a, const void *b)
{
    const pid_pair *x = a, *y = b;
    return x->raw < y->raw ? -1 : (x->raw > y->raw);
}

int st_fuse_set_pid_map(st_fuse *f, const int64_t *raw, const int64_t *mapped, size_t n)
{
    pid_pair *pairs = malloc((n ? n : 1) * sizeof *pairs);
    int64_t *r = malloc((n ? n : 1) * sizeof *r);
    int64_t *m = malloc((n ? n : 1) * sizeof *m);
    if (!pairs || !r || !m) {
        free(pairs);
        free(r);
        free(m);
        return ST_FUSE_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pairs[i].raw = raw[i];
        pairs[i].mapped = mapped[i];
    }
    qsort(pairs, n, sizeof *pairs, cmp_pid_pair);
    for (size_t i = 0; i < n; i++) {
        r[i] = pairs[i].raw;
        m[i] = pairs[i].mapped;
    }
    free(pairs);
    free(f->pid_raw);
    free(f->pid_new);
    f->pid_raw = r;
    f->pid_new = m;
    f->n_pids = n;
    return ST_FUSE_OK;
}

size_t st_fuse_meta_count(const st_fuse *f) { return f->meta.n; }

int st_fuse_meta(const st_fuse *f, size_t i, const char **key, size_t *key_len,
                 const char **value, size_t *value_len)
{
    return st_members_get(&f->meta, i, key, key_len, value, value_len) == 0 ? ST_FUSE_OK : ST_FUSE_ERR_USAGE;
}
