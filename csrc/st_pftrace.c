/* st_pftrace: see st_pftrace.h.  Mirrors streamtrace/fuse/pftrace.py
 * RankEncoder step by step; the field numbers are the ones named there. */
#include "st_pftrace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUF ((size_t)1 << 31) /* any one buffer: far beyond a chunk's needs */
#define MAX_DEPTH 200             /* nesting in args (the reference recurses) */
#define MAX_REASONS 32

/* ------------------------------------------------------------ buffers */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static int grow(buf *b, size_t extra) {
    if (extra > MAX_BUF - b->n) return ST_PFT_LIMIT;
    size_t need = b->n + extra;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > MAX_BUF / 2 ? MAX_BUF : cap * 2;
    uint8_t *q = realloc(b->p, cap);
    if (!q) return ST_PFT_NOMEM;
    b->p = q;
    b->cap = cap;
    return 0;
}

static inline int put(buf *b, const void *s, size_t n) {
    if (b->cap - b->n < n) {
        int rc = grow(b, n);
        if (rc) return rc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static inline int putc_(buf *b, uint8_t c) {
    if (b->n == b->cap) {
        int rc = grow(b, 1);
        if (rc) return rc;
    }
    b->p[b->n++] = c;
    return 0;
}

static size_t vlen(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

static inline int varint(buf *b, uint64_t v) {
    uint8_t t[10];
    size_t n = 0;
    while (v >= 0x80) { t[n++] = (uint8_t)(v | 0x80); v >>= 7; }
    t[n++] = (uint8_t)v;
    return put(b, t, n);
}

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static inline int fvar(buf *b, unsigned field, uint64_t v) { TRY(varint(b, (uint64_t)field << 3)); return varint(b, v); }
static int fbytes(buf *b, unsigned field, const void *s, size_t n) {
    TRY(varint(b, ((uint64_t)field << 3) | 2));
    TRY(varint(b, n));
    return put(b, s, n);
}
static int ffixed(buf *b, unsigned field, uint64_t v) {
    uint8_t t[8];
    for (int i = 0; i < 8; i++) t[i] = (uint8_t)(v >> (8 * i));
    TRY(varint(b, ((uint64_t)field << 3) | 1));
    return put(b, t, 8);
}
static int fdouble(buf *b, unsigned field, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    return ffixed(b, field, v);
}

static int64_t int32_clamp(int64_t v) { return v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v; }

/* ------------------------------------------------------------ a byte-string map */

typedef struct {
    uint64_t hash;
    size_t off, len; /* key in the map's arena */
    uint64_t val;
    int used;
} slot;

typedef struct {
    slot *s;
    size_t cap, n;
    buf keys;
    size_t *order; /* slot indices in insertion order (for export) */
} map;

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    h ^= h >> 32;
    return h;
}

static slot *map_find(map *m, const uint8_t *k, size_t n, uint64_t h) {
    if (!m->cap) return NULL;
    size_t i = h & (m->cap - 1);
    for (;;) {
        slot *s = &m->s[i];
        if (!s->used) return s;
        if (s->hash == h && s->len == n && memcmp(m->keys.p + s->off, k, n) == 0) return s;
        i = (i + 1) & (m->cap - 1);
    }
}

static int map_get(map *m, const uint8_t *k, size_t n, uint64_t *val) {
    slot *s = map_find(m, k, n, hash_bytes(k, n));
    if (!s || !s->used) return 0;
    *val = s->val;
    return 1;
}

static int map_put(map *m, const uint8_t *k, size_t n, uint64_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        slot *ns = calloc(cap, sizeof(slot));
        size_t *no = realloc(m->order, cap * sizeof(size_t));
        if (!ns || !no) { free(ns); if (no) m->order = no; return ST_PFT_NOMEM; }
        m->order = no;
        for (size_t j = 0; j < m->n; j++) {
            slot *o = &m->s[m->order[j]];
            size_t i = o->hash & (cap - 1);
            while (ns[i].used) i = (i + 1) & (cap - 1);
            ns[i] = *o;
            m->order[j] = i;
        }
        free(m->s);
        m->s = ns;
        m->cap = cap;
    }
    uint64_t h = hash_bytes(k, n);
    slot *s = map_find(m, k, n, h);
    if (s->used) { s->val = val; return 0; }
    size_t off = m->keys.n;
    TRY(put(&m->keys, k, n));
    s->used = 1; s->hash = h; s->off = off; s->len = n; s->val = val;
    m->order[m->n++] = (size_t)(s - m->s);
    return 0;
}

static void map_clear(map *m) {
    if (m->cap) memset(m->s, 0, m->cap * sizeof(slot));
    m->n = 0;
    m->keys.n = 0;
}

static void map_free(map *m) { free(m->s); free(m->order); free(m->keys.p); memset(m, 0, sizeof *m); }

/* ------------------------------------------------------------ parsed values */

enum { J_MISSING, J_NULL, J_TRUE, J_FALSE, J_INT, J_DEC, J_STR, J_NEST, J_BIG, J_OTHER };

typedef struct {
    int t;
    int64_t i;
    size_t off, len;       /* J_STR: decoded text in the arena; J_NEST: its json.dumps text there */
    const uint8_t *raw;    /* J_DEC / J_BIG: the number's text in the chunk */
    size_t raw_len;
} jv;

typedef struct {
    size_t koff, klen;
    jv v;
} pair;

typedef struct {
    jv ph, name, cat, ts, dur, pid, tid;
    size_t args, n_args;  /* into the pairs array */
    int args_obj;
    int64_t ts_ns, dur_ns;
    int has_ts, has_dur;
} event;

typedef struct {
    int64_t ts;
    uint64_t n, track;
} pending_end;

struct st_pft {
    uint32_t seq;
    buf out, arena, ev, pend, tmp, exp, kbuf, endev;
    const uint8_t *chunk; /* the chunk being fed: strings without escapes are read in place */
    int has_clock;    /* a clock snapshot written: clock is the incremental clock's time (ns) */
    int64_t clock;
    pending_end *ends; /* complete events' ends not yet written: a heap, earliest first */
    size_t n_ends, cap_ends;
    uint64_t ends_made;
    map tables[3]; /* categories, names, annotation names -> iid */
    map uuids, procs, threads;
    buf proc_rest;               /* procs' values: offset << 32 | length into this */
    buf thread_info;             /* threads' values: offset into this of {has_name, name_len, name, has_sort, sort} */
    int cleared;
    int64_t interned, max_interned;
    int64_t counts[4];
    char reasons[MAX_REASONS][64];
    int64_t reason_counts[MAX_REASONS];
    int n_reasons;
    event *events;
    size_t n_events, cap_events;
    pair *pairs;
    size_t n_pairs, cap_pairs;
};

int st_pft_create(st_pft **out, uint32_t seq, int64_t max_interned) {
    st_pft *p = calloc(1, sizeof *p);
    if (!p) return ST_PFT_NOMEM;
    p->seq = seq;
    p->max_interned = max_interned;
    p->cleared = 1;
    *out = p;
    return 0;
}

void st_pft_destroy(st_pft *p) {
    if (!p) return;
    buf *bs[] = {&p->out, &p->arena, &p->ev, &p->pend, &p->tmp, &p->exp, &p->kbuf, &p->endev, &p->proc_rest,
                  &p->thread_info};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) free(bs[i]->p);
    for (int i = 0; i < 3; i++) map_free(&p->tables[i]);
    map_free(&p->uuids); map_free(&p->procs); map_free(&p->threads);
    free(p->events); free(p->pairs); free(p->ends);
    free(p);
}

int st_pft_add_process(st_pft *p, const uint8_t *key, size_t key_len, const uint8_t *rest, size_t rest_len) {
    if (rest_len > UINT32_MAX || p->proc_rest.n > UINT32_MAX) return ST_PFT_LIMIT;
    uint64_t v = ((uint64_t)p->proc_rest.n << 32) | rest_len;
    TRY(put(&p->proc_rest, rest, rest_len));
    return map_put(&p->procs, key, key_len, v);
}

int st_pft_add_thread(st_pft *p, const uint8_t *key, size_t key_len, int has_name, const uint8_t *name,
                      size_t name_len, int has_sort, int64_t sort) {
    uint64_t v = p->thread_info.n;
    uint8_t h = (uint8_t)(has_name ? 1 : 0) | (uint8_t)(has_sort ? 2 : 0);
    TRY(putc_(&p->thread_info, h));
    TRY(put(&p->thread_info, &sort, 8));
    TRY(put(&p->thread_info, &name_len, sizeof name_len));
    TRY(put(&p->thread_info, name, name_len));
    return map_put(&p->threads, key, key_len, v);
}

/* A string's offset: into the chunk (IN_CHUNK set: a string without escapes, not copied) or into the arena
   (decoded strings, nested values' dumps). */
#define IN_CHUNK ((size_t)1 << 62)
static inline const uint8_t *S(const st_pft *p, size_t off) {
    return off & IN_CHUNK ? p->chunk + (off ^ IN_CHUNK) : p->arena.p + off;
}

/* ------------------------------------------------------------ the parser */

typedef struct {
    const uint8_t *s, *e;
    st_pft *p;
    int rc; /* first problem: ST_PFT_UNSUPPORTED or an error */
} parser;

static void ws(parser *q) {
    while (q->s < q->e && (*q->s == ' ' || *q->s == '\t' || *q->s == '\n' || *q->s == '\r')) q->s++;
}

static int fail(parser *q, int rc) { if (!q->rc) q->rc = rc; return rc; }

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const uint8_t *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) { int h = hexval(s[i]); if (h < 0) return -1; v = v * 16 + h; }
    return v;
}

static int put_utf8(buf *b, uint32_t c) {
    uint8_t t[4];
    size_t n;
    if (c < 0x80) { t[0] = (uint8_t)c; n = 1; }
    else if (c < 0x800) { t[0] = 0xC0 | (c >> 6); t[1] = 0x80 | (c & 0x3F); n = 2; }
    else if (c < 0x10000) { t[0] = 0xE0 | (c >> 12); t[1] = 0x80 | ((c >> 6) & 0x3F); t[2] = 0x80 | (c & 0x3F); n = 3; }
    else { t[0] = 0xF0 | (c >> 18); t[1] = 0x80 | ((c >> 12) & 0x3F); t[2] = 0x80 | ((c >> 6) & 0x3F);
           t[3] = 0x80 | (c & 0x3F); n = 4; }
    return put(b, t, n);
}

/* A string (at its opening quote), decoded into the arena. */
static int parse_string(parser *q, size_t *off, size_t *len) {
    buf *a = &q->p->arena;
    q->s++;
    const uint8_t *r0 = q->s;
    while (r0 < q->e && *r0 != '"' && *r0 != '\\' && *r0 >= 0x20) r0++;
    if (r0 < q->e && *r0 == '"') {   /* no escape: the text is the chunk's bytes */
        *off = (size_t)(q->s - q->p->chunk) | IN_CHUNK;
        *len = (size_t)(r0 - q->s);
        q->s = r0 + 1;
        return 0;
    }
    *off = a->n;
    for (;;) {
        const uint8_t *r = q->s;
        while (r < q->e && *r != '"' && *r != '\\' && *r >= 0x20) r++;
        TRY(put(a, q->s, (size_t)(r - q->s)));
        q->s = r;
        if (r >= q->e || *r < 0x20) return fail(q, ST_PFT_UNSUPPORTED);
        if (*r == '"') { q->s++; break; }
        if (q->e - r < 2) return fail(q, ST_PFT_UNSUPPORTED);
        uint8_t c = r[1];
        q->s = r + 2;
        switch (c) {
        case '"': case '\\': case '/': TRY(putc_(a, c)); break;
        case 'b': TRY(putc_(a, '\b')); break;
        case 'f': TRY(putc_(a, '\f')); break;
        case 'n': TRY(putc_(a, '\n')); break;
        case 'r': TRY(putc_(a, '\r')); break;
        case 't': TRY(putc_(a, '\t')); break;
        case 'u': {
            if (q->e - q->s < 4) return fail(q, ST_PFT_UNSUPPORTED);
            int u = hex4(q->s);
            if (u < 0) return fail(q, ST_PFT_UNSUPPORTED);
            q->s += 4;
            uint32_t cp = (uint32_t)u;
            if (u >= 0xD800 && u < 0xDC00) {
                /* a pair, or a lone surrogate (the reference writes "?": not reproduced here) */
                if (q->e - q->s < 6 || q->s[0] != '\\' || q->s[1] != 'u') return fail(q, ST_PFT_UNSUPPORTED);
                int lo = hex4(q->s + 2);
                if (lo < 0xDC00 || lo >= 0xE000) return fail(q, ST_PFT_UNSUPPORTED);
                q->s += 6;
                cp = 0x10000 + (((uint32_t)u - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (u >= 0xDC00 && u < 0xE000) {
                return fail(q, ST_PFT_UNSUPPORTED);
            }
            TRY(put_utf8(a, cp));
            break;
        }
        default: return fail(q, ST_PFT_UNSUPPORTED);
        }
    }
    *len = a->n - *off;
    return 0;
}

/* json.dumps (ensure_ascii) of a decoded string, into b. */
static int dump_string(buf *b, const uint8_t *s, size_t n) {
    static const char hx[] = "0123456789abcdef";
    TRY(putc_(b, '"'));
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        uint32_t cp;
        size_t k;
        if (c < 0x80) { cp = c; k = 1; }
        else if ((c & 0xE0) == 0xC0 && i + 1 < n) { cp = ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); k = 2; }
        else if ((c & 0xF0) == 0xE0 && i + 2 < n) {
            cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); k = 3; }
        else if ((c & 0xF8) == 0xF0 && i + 3 < n) {
            cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6)
                 | (s[i + 3] & 0x3F); k = 4; }
        else return ST_PFT_UNSUPPORTED;
        i += k;
        if (cp == '"') TRY(put(b, "\\\"", 2));
        else if (cp == '\\') TRY(put(b, "\\\\", 2));
        else if (cp == '\n') TRY(put(b, "\\n", 2));
        else if (cp == '\r') TRY(put(b, "\\r", 2));
        else if (cp == '\t') TRY(put(b, "\\t", 2));
        else if (cp == '\b') TRY(put(b, "\\b", 2));
        else if (cp == '\f') TRY(put(b, "\\f", 2));
        else if (cp >= 0x20 && cp < 0x7F) TRY(putc_(b, (uint8_t)cp));
        else {
            uint32_t units[2];
            int nu = 1;
            if (cp >= 0x10000) {
                units[0] = 0xD800 + ((cp - 0x10000) >> 10);
                units[1] = 0xDC00 + ((cp - 0x10000) & 0x3FF);
                nu = 2;
            } else units[0] = cp;
            for (int j = 0; j < nu; j++) {
                char t[6] = {'\\', 'u', hx[(units[j] >> 12) & 15], hx[(units[j] >> 8) & 15], hx[(units[j] >> 4) & 15],
                             hx[units[j] & 15]};
                TRY(put(b, t, 6));
            }
        }
    }
    return putc_(b, '"');
}

/* An integer's decimal digits (as str(int)). */
static int dump_int(buf *b, int64_t i) {
    char t[24];
    size_t n = sizeof t;
    uint64_t u = i < 0 ? 0 - (uint64_t)i : (uint64_t)i;
    do { t[--n] = (char)('0' + u % 10); u /= 10; } while (u);
    if (i < 0) t[--n] = '-';
    return put(b, t + n, sizeof t - n);
}

/* Python's repr of a float (as json.dumps writes it). */
static int dump_double(buf *b, double d) {
    if (isnan(d)) return put(b, "NaN", 3);
    if (isinf(d)) return d > 0 ? put(b, "Infinity", 8) : put(b, "-Infinity", 9);
    char t[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*e", prec - 1, d);
        if (strtod(t, NULL) == d) break;
    }
    /* t: [-]D[.DDD]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *c = t;
    if (*c == '-') { neg = 1; c++; }
    while (*c && *c != 'e') { if (*c != '.') digits[nd++] = *c; c++; }
    int exp10 = atoi(c + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char o[64];
    int n = 0;
    if (neg) o[n++] = '-';
    int decpt = exp10 + 1;
    if (decpt <= -4 || decpt > 16) {
        o[n++] = digits[0];
        if (nd > 1) { o[n++] = '.'; for (int i = 1; i < nd; i++) o[n++] = digits[i]; }
        n += snprintf(o + n, sizeof o - (size_t)n, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        o[n++] = '0'; o[n++] = '.';
        for (int i = 0; i < -decpt; i++) o[n++] = '0';
        for (int i = 0; i < nd; i++) o[n++] = digits[i];
    } else if (decpt >= nd) {
        for (int i = 0; i < nd; i++) o[n++] = digits[i];
        for (int i = nd; i < decpt; i++) o[n++] = '0';
        o[n++] = '.'; o[n++] = '0';
    } else {
        for (int i = 0; i < decpt; i++) o[n++] = digits[i];
        o[n++] = '.';
        for (int i = decpt; i < nd; i++) o[n++] = digits[i];
    }
    return put(b, o, (size_t)n);
}

/* A J_DEC's value, as float(Decimal(text)) (both correctly rounded). */
static int dec_value(const jv *v, double *d) {
    char t[64];
    if (v->raw_len < sizeof t) {
        memcpy(t, v->raw, v->raw_len);
        t[v->raw_len] = 0;
        *d = strtod(t, NULL);
        return 0;
    }
    char *big = malloc(v->raw_len + 1);
    if (!big) return ST_PFT_NOMEM;
    memcpy(big, v->raw, v->raw_len);
    big[v->raw_len] = 0;
    *d = strtod(big, NULL);
    free(big);
    return 0;
}

/* A number: J_INT (int64), J_BIG (an integer beyond) or J_DEC (its value made when needed). */
static int parse_number(parser *q, jv *v) {
    const uint8_t *s = q->s, *r = s;
    if (r < q->e && *r == '-') r++;
    if (r >= q->e || *r < '0' || *r > '9') return fail(q, ST_PFT_UNSUPPORTED);
    if (*r == '0') r++;
    else while (r < q->e && *r >= '0' && *r <= '9') r++;
    int dec = 0;
    if (r < q->e && *r == '.') {
        dec = 1; r++;
        if (r >= q->e || *r < '0' || *r > '9') return fail(q, ST_PFT_UNSUPPORTED);
        while (r < q->e && *r >= '0' && *r <= '9') r++;
    }
    if (r < q->e && (*r == 'e' || *r == 'E')) {
        dec = 1; r++;
        if (r < q->e && (*r == '+' || *r == '-')) r++;
        if (r >= q->e || *r < '0' || *r > '9') return fail(q, ST_PFT_UNSUPPORTED);
        while (r < q->e && *r >= '0' && *r <= '9') r++;
    }
    q->s = r;
    v->raw = s;
    v->raw_len = (size_t)(r - s);
    if (dec) {
        v->t = J_DEC;
        return 0;
    }
    int neg = *s == '-';
    uint64_t acc = 0;
    for (const uint8_t *c = s + neg; c < r; c++) {
        if (acc > (UINT64_MAX - 9) / 10) { v->t = J_BIG; return 0; }
        acc = acc * 10 + (uint64_t)(*c - '0');
    }
    if (neg ? acc > (uint64_t)INT64_MAX + 1 : acc > (uint64_t)INT64_MAX) { v->t = J_BIG; return 0; }
    v->t = J_INT;
    v->i = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return 0;
}

static int parse_value(parser *q, jv *v, buf *dump, int depth);

static int lit(parser *q, const char *w, size_t n) {
    if ((size_t)(q->e - q->s) < n || memcmp(q->s, w, n)) return fail(q, ST_PFT_UNSUPPORTED);
    q->s += n;
    return 0;
}

/* A value; with dump, nested values are written there as json.dumps would. */
static int parse_value(parser *q, jv *v, buf *dump, int depth) {
    ws(q);
    if (q->s >= q->e) return fail(q, ST_PFT_UNSUPPORTED);
    uint8_t c = *q->s;
    v->t = J_OTHER;
    if (c == '"') {
        size_t off, len;
        TRY(parse_string(q, &off, &len));
        v->t = J_STR; v->off = off; v->len = len;
        if (dump) TRY(dump_string(dump, S(q->p, off), len));
        return 0;
    }
    if (c == '{' || c == '[') {
        if (depth >= MAX_DEPTH) return fail(q, ST_PFT_UNSUPPORTED);
        uint8_t close = c == '{' ? '}' : ']';
        q->s++;
        if (dump) TRY(putc_(dump, c));
        ws(q);
        if (q->s < q->e && *q->s == close) { q->s++; if (dump) TRY(putc_(dump, close)); v->t = J_NEST; return 0; }
        for (int first = 1;; first = 0) {
            if (!first && dump) TRY(putc_(dump, ','));
            if (c == '{') {
                ws(q);
                if (q->s >= q->e || *q->s != '"') return fail(q, ST_PFT_UNSUPPORTED);
                size_t off, len;
                TRY(parse_string(q, &off, &len));
                if (dump) { TRY(dump_string(dump, S(q->p, off), len)); TRY(putc_(dump, ':')); }
                ws(q);
                if (q->s >= q->e || *q->s != ':') return fail(q, ST_PFT_UNSUPPORTED);
                q->s++;
            }
            jv inner;
            TRY(parse_value(q, &inner, dump, depth + 1));
            ws(q);
            if (q->s >= q->e) return fail(q, ST_PFT_UNSUPPORTED);
            if (*q->s == ',') { q->s++; continue; }
            if (*q->s == close) { q->s++; break; }
            return fail(q, ST_PFT_UNSUPPORTED);
        }
        if (dump) TRY(putc_(dump, close));
        v->t = J_NEST;
        return 0;
    }
    if (c == 't') { TRY(lit(q, "true", 4)); v->t = J_TRUE; if (dump) TRY(put(dump, "true", 4)); return 0; }
    if (c == 'f') { TRY(lit(q, "false", 5)); v->t = J_FALSE; if (dump) TRY(put(dump, "false", 5)); return 0; }
    if (c == 'n') { TRY(lit(q, "null", 4)); v->t = J_NULL; if (dump) TRY(put(dump, "null", 4)); return 0; }
    if (c == '-' || (c >= '0' && c <= '9')) {
        TRY(parse_number(q, v));
        if (dump) {
            if (v->t == J_DEC) {
                double d;
                TRY(dec_value(v, &d));
                TRY(dump_double(dump, d));
            }
            else if (v->t == J_INT) {
                TRY(dump_int(dump, v->i));
            }
            else TRY(put(dump, v->raw, v->raw_len)); /* a big integer: its digits (JSON forbids leading zeros) */
        }
        return 0;
    }
    return fail(q, ST_PFT_UNSUPPORTED);
}

static inline int key_is_n(const st_pft *p, size_t off, size_t len, const char *w, size_t n) {
    return len == n && memcmp(S(p, off), w, n) == 0;
}
#define key_is(p, off, len, lit) key_is_n((p), (off), (len), (lit), sizeof(lit) - 1)

static int parse_event(parser *q, event *ev) {
    st_pft *p = q->p;
    memset(ev, 0, sizeof *ev);
    q->s++; /* '{' */
    ws(q);
    if (q->s < q->e && *q->s == '}') { q->s++; return 0; }
    for (;;) {
        ws(q);
        if (q->s >= q->e || *q->s != '"') return fail(q, ST_PFT_UNSUPPORTED);
        size_t off, len;
        TRY(parse_string(q, &off, &len));
        ws(q);
        if (q->s >= q->e || *q->s != ':') return fail(q, ST_PFT_UNSUPPORTED);
        q->s++;
        ws(q);
        jv *slotv = NULL;
        if (len > 4) ;   /* none of the keys read */
        else if (key_is(p, off, len, "ph")) slotv = &ev->ph;
        else if (key_is(p, off, len, "name")) slotv = &ev->name;
        else if (key_is(p, off, len, "cat")) slotv = &ev->cat;
        else if (key_is(p, off, len, "ts")) slotv = &ev->ts;
        else if (key_is(p, off, len, "dur")) slotv = &ev->dur;
        else if (key_is(p, off, len, "pid")) slotv = &ev->pid;
        else if (key_is(p, off, len, "tid")) slotv = &ev->tid;
        int is_args = key_is(p, off, len, "args");
        if (is_args && q->s < q->e && *q->s == '{') {
            /* the last "args" wins, as in a dict */
            ev->args_obj = 1;
            ev->args = p->n_pairs;
            ev->n_args = 0;
            q->s++;
            ws(q);
            if (q->s < q->e && *q->s == '}') q->s++;
            else for (;;) {
                ws(q);
                if (q->s >= q->e || *q->s != '"') return fail(q, ST_PFT_UNSUPPORTED);
                if (p->n_pairs == p->cap_pairs) {
                    size_t cap = p->cap_pairs ? p->cap_pairs * 2 : 1024;
                    pair *np = realloc(p->pairs, cap * sizeof(pair));
                    if (!np) return fail(q, ST_PFT_NOMEM);
                    p->pairs = np; p->cap_pairs = cap;
                }
                pair *pr = &p->pairs[p->n_pairs];
                TRY(parse_string(q, &pr->koff, &pr->klen));
                ws(q);
                if (q->s >= q->e || *q->s != ':') return fail(q, ST_PFT_UNSUPPORTED);
                q->s++;
                ws(q);
                /* nested values: their json.dumps text in the arena */
                int nested = q->s < q->e && (*q->s == '{' || *q->s == '[');
                size_t doff = p->arena.n;
                if (nested) {
                    p->tmp.n = 0;
                    TRY(parse_value(q, &pr->v, &p->tmp, 0));
                    doff = p->arena.n;
                    TRY(put(&p->arena, p->tmp.p, p->tmp.n));
                    pr->v.off = doff; pr->v.len = p->tmp.n;
                } else {
                    TRY(parse_value(q, &pr->v, NULL, 0));
                }
                p->n_pairs++;
                ev->n_args++;
                ws(q);
                if (q->s < q->e && *q->s == ',') { q->s++; continue; }
                if (q->s < q->e && *q->s == '}') { q->s++; break; }
                return fail(q, ST_PFT_UNSUPPORTED);
            }
        } else {
            jv v;
            memset(&v, 0, sizeof v);
            TRY(parse_value(q, &v, NULL, 0));
            if (slotv) *slotv = v;
            if (is_args) ev->args_obj = 0;
        }
        ws(q);
        if (q->s < q->e && *q->s == ',') { q->s++; continue; }
        if (q->s < q->e && *q->s == '}') { q->s++; return 0; }
        return fail(q, ST_PFT_UNSUPPORTED);
    }
}

/* ------------------------------------------------------------ checks */

/* _ns: a number of microseconds -> integer ns (half to even); 0: none; -1: not reproduced */
static int to_ns(const jv *v, int64_t *ns) {
    const int64_t lim = INT64_MAX / 1000;
    if (v->t == J_INT) {
        if (v->i > lim || v->i < -lim) return -1;
        *ns = v->i * 1000;
        return 1;
    }
    if (v->t == J_BIG) return -1;
    if (v->t != J_DEC) return 0;
    const uint8_t *s = v->raw, *e = v->raw + v->raw_len;
    int neg = 0;
    if (*s == '-') { neg = 1; s++; }
    int64_t acc = 0;
    int digits = 0;
    if (v->raw_len > 26) return -1; /* the reference's Decimal product keeps 28 digits */
    for (; s < e && *s != '.'; s++) {
        if (*s < '0' || *s > '9') return -1; /* an exponent */
        if (++digits > 16) return -1;
        acc = acc * 10 + (*s - '0');
    }
    if (s < e) s++;
    for (int i = 0; i < 3; i++) {
        int d = 0;
        if (s < e) { if (*s < '0' || *s > '9') return -1; d = *s++ - '0'; }
        acc = acc * 10 + d;
    }
    int first = -1, rest = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9') return -1;
        if (first < 0) first = *s - '0';
        else if (*s != '0') rest = 1;
    }
    if (first > 5 || (first == 5 && (rest || (acc & 1)))) acc++;
    if (acc > INT64_MAX / 2) return -1;
    *ns = neg ? -acc : acc;
    return 1;
}

#define str_is(p, v, lit) ((v)->t == J_STR && key_is((p), (v)->off, (v)->len, lit))

static int ok_key_value(const jv *v) { return v->t == J_INT || v->t == J_STR || v->t == J_MISSING || v->t == J_NULL; }

static const pair *arg_n(st_pft *p, const event *ev, const char *k, size_t n) {
    if (!ev->args_obj) return NULL;
    for (size_t i = ev->n_args; i-- > 0;) {
        const pair *a = &p->pairs[ev->args + i];
        if (key_is_n(p, a->koff, a->klen, k, n)) return a;
    }
    return NULL;
}
#define arg(p, ev, lit) arg_n((p), (ev), (lit), sizeof(lit) - 1)

/* Could the reference's output for this event differ from ours?  1: yes. */
static int unsupported(st_pft *p, event *ev) {
    if (ev->ph.t != J_STR) return 1;
    int x = str_is(p, &ev->ph, "X");
    int r = to_ns(&ev->ts, &ev->ts_ns);
    if (r < 0) return 1;
    ev->has_ts = r;
    ev->dur_ns = 0;
    if (x) {
        r = to_ns(&ev->dur, &ev->dur_ns);
        if (r < 0) return 1;
        ev->has_dur = r;
        if (!r) ev->dur_ns = 0;
    }
    if (ev->ph.len == 1 && memchr("Mstf", S(p, ev->ph.off)[0], 4)) return 0;
    for (size_t i = 0; i < ev->n_args; i++) {
        const pair *a = &p->pairs[ev->args + i];
        if (a->v.t == J_OTHER) return 1;
        /* a huge integer is an annotation's JSON text; as a lane, a flow id or a counter value it is not reproduced */
        if (a->v.t == J_BIG && (key_is(p, a->koff, a->klen, "lane") || key_is(p, a->koff, a->klen, "correlation")
                                || str_is(p, &ev->ph, "C")))
            return 1;
    }
    if (!ev->has_ts || ev->ts_ns < 0) {
        /* skipped: its reason names the phase */
        for (size_t i = 0; i < ev->ph.len; i++) {
            uint8_t c = S(p, ev->ph.off)[i];
            if (c < 0x20 || c > 0x7E || c == '\'' || c == '\\') return 1;
        }
        return ev->ph.len > 40;
    }
    if (!ok_key_value(&ev->pid)) return 1;
    int c = str_is(p, &ev->ph, "C");
    if (c) return 0;
    int k;
    k = ev->ph.len == 1 && memchr("XBEiIR", S(p, ev->ph.off)[0], 6);
    if (!k) {
        for (size_t i = 0; i < ev->ph.len; i++) {
            uint8_t ch = S(p, ev->ph.off)[i];
            if (ch < 0x20 || ch > 0x7E || ch == '\'' || ch == '\\') return 1;
        }
        return ev->ph.len > 40;
    }
    if (!ok_key_value(&ev->tid)) return 1;
    if (ev->name.t != J_MISSING && ev->name.t != J_NULL && ev->name.t != J_STR) return 1;
    if (ev->cat.t == J_NEST || ev->cat.t == J_OTHER) return 1;
    if (x) {
        const pair *lane = arg(p, ev, "lane");
        if (lane && (lane->v.t == J_TRUE)) return 1; /* a bool lane (True == 1 in the reference's dict) */
        const pair *tr = arg(p, ev, "tid_raw");
        if (tr && !ok_key_value(&tr->v)) return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ tracks */

/* canonical keys, as pftrace.py _ckey builds them */
static int ckey(buf *b, st_pft *p, const jv *v) {
    if (v->t == J_INT) { TRY(putc_(b, 'i')); return put(b, &v->i, 8); }
    if (v->t == J_STR) {
        uint32_t n = (uint32_t)v->len;
        TRY(putc_(b, 's')); TRY(put(b, &n, 4));
        return put(b, S(p, v->off), v->len);
    }
    return putc_(b, 'n');
}

static int ckey_text(buf *b, const uint8_t *s, size_t n) {
    uint32_t m = (uint32_t)n;
    TRY(putc_(b, 's')); TRY(put(b, &m, 4));
    return put(b, s, n);
}

static uint64_t new_uuid(st_pft *p) {
    uint64_t n = p->uuids.n + 1;
    return (n < 4096 && p->seq < (1u << 20)) ? (((uint64_t)p->seq << 12) | n) : (((uint64_t)p->seq << 32) | n);
}

/* packet(seq + track_descriptor(body)) */
static int descriptor(st_pft *p, const buf *body) {
    size_t inner = vlen((uint64_t)10 << 3) + vlen(p->seq) + vlen((uint64_t)60 << 3 | 2) + vlen(body->n) + body->n;
    TRY(varint(&p->out, (1 << 3) | 2));
    TRY(varint(&p->out, inner));
    TRY(fvar(&p->out, 10, p->seq));
    return fbytes(&p->out, 60, body->p, body->n);
}

static int str_of_value(buf *b, st_pft *p, const jv *v) {
    /* str(pid) for a non-int pid: a string is itself, a missing one "None" */
    if (v->t == J_STR) return put(b, S(p, v->off), v->len);
    return put(b, "None", 4);
}

static int process_track(st_pft *p, const jv *pid, uint64_t *uuid) {
    buf *k = &p->exp;
    k->n = 0;
    TRY(putc_(k, 'p'));
    TRY(ckey(k, p, pid));
    if (map_get(&p->uuids, k->p, k->n, uuid)) return 0;
    if (p->uuids.n >= ST_PFT_MAX_TRACKS) return ST_PFT_LIMIT;
    uint64_t u = new_uuid(p);
    buf body = {0};
    int rc = fvar(&body, 1, u);
    uint64_t info;
    if (!rc && map_get(&p->procs, k->p + 1, k->n - 1, &info)) {
        rc = put(&body, p->proc_rest.p + (info >> 32), info & 0xFFFFFFFFu);
    } else if (!rc) {
        rc = fvar(&body, 11, 3);
        buf t = {0};
        if (!rc && pid->t == J_INT) {
            char name[40];
            int n = snprintf(name, sizeof name, "pid %lld", (long long)pid->i);
            rc = fvar(&t, 1, (uint64_t)int32_clamp(pid->i));
            if (!rc) rc = fbytes(&t, 6, name, (size_t)n);
            if (!rc) rc = fbytes(&body, 3, t.p, t.n);
        } else if (!rc) {
            rc = str_of_value(&t, p, pid);
            if (!rc) rc = fbytes(&body, 2, t.p, t.n);
        }
        free(t.p);
    }
    if (!rc) rc = descriptor(p, &body);
    free(body.p);
    if (rc) return rc;
    k->n = 0;
    TRY(putc_(k, 'p'));
    TRY(ckey(k, p, pid));
    TRY(map_put(&p->uuids, k->p, k->n, u));
    *uuid = u;
    return 0;
}

static int thread_track(st_pft *p, const jv *pid, const jv *tid, int64_t lane, uint64_t *uuid) {
    /* the common case, a known track: its key in a reused buffer */
    buf *k = &p->kbuf;
    k->n = 0;
    TRY(putc_(k, 't'));
    TRY(ckey(k, p, pid));
    TRY(ckey(k, p, tid));
    TRY(put(k, &lane, 8));
    if (map_get(&p->uuids, k->p, k->n, uuid)) return 0;
    buf key = {0};
    int rc = putc_(&key, 't');
    if (!rc) rc = ckey(&key, p, pid);
    if (!rc) rc = ckey(&key, p, tid);
    if (!rc) rc = put(&key, &lane, 8);
    if (rc) { free(key.p); return rc; }
    if (map_get(&p->uuids, key.p, key.n, uuid)) { free(key.p); return 0; }
    buf name = {0}, body = {0};
    int64_t sort = 0;
    int has_sort = 0, has_name = 0;
    uint64_t info;
    if (map_get(&p->threads, key.p + 1, key.n - 9, &info)) {
        const uint8_t *r = p->thread_info.p + info;
        size_t nl;
        has_name = r[0] & 1;
        has_sort = (r[0] & 2) != 0;
        memcpy(&sort, r + 1, 8);
        memcpy(&nl, r + 9, sizeof nl);
        if (has_name) rc = put(&name, r + 9 + sizeof nl, nl);
    }
    if (!rc && !has_name) {
        if (tid->t == J_INT) {
            char t[40];
            int n = snprintf(t, sizeof t, "thread %lld", (long long)tid->i);
            rc = put(&name, t, (size_t)n);
        } else if (tid->t == J_STR && tid->len) rc = put(&name, S(p, tid->off), tid->len);
        else rc = put(&name, "(no tid)", 8);
    }
    uint64_t parent = 0;
    if (!rc && lane) {
        char t[40];
        int n = snprintf(t, sizeof t, " (lane %lld)", (long long)lane);
        rc = put(&name, t, (size_t)n);
        sort = lane;
        if (!rc) rc = thread_track(p, pid, tid, 0, &parent);
    } else if (!rc) {
        rc = process_track(p, pid, &parent);
        if (!has_sort) sort = tid->t == J_INT ? tid->i : 0;
    }
    uint64_t u = 0;
    if (!rc && p->uuids.n >= ST_PFT_MAX_TRACKS) rc = ST_PFT_LIMIT;
    if (!rc) {
        u = new_uuid(p);
        rc = fvar(&body, 1, u);
        if (!rc) rc = fvar(&body, 5, parent);
        if (!rc) rc = fbytes(&body, 2, name.p, name.n);
        if (!rc) rc = fvar(&body, 11, 3);
        if (!rc) rc = fvar(&body, 12, (uint64_t)int32_clamp(sort));
        if (!rc) rc = descriptor(p, &body);
        if (!rc) rc = map_put(&p->uuids, key.p, key.n, u);
    }
    free(key.p); free(name.p); free(body.p);
    if (!rc) *uuid = u;
    return rc;
}

static int counter_track(st_pft *p, const jv *pid, const uint8_t *name, size_t nlen, const uint8_t *series,
                         size_t slen, uint64_t *uuid) {
    buf key = {0}, body = {0}, title = {0};
    int rc = putc_(&key, 'c');
    if (!rc) rc = ckey(&key, p, pid);
    if (!rc) rc = ckey_text(&key, name, nlen);
    if (!rc) rc = ckey_text(&key, series, slen);
    if (!rc && map_get(&p->uuids, key.p, key.n, uuid)) { free(key.p); return 0; }
    uint64_t parent = 0, u = 0;
    if (!rc) rc = process_track(p, pid, &parent);
    if (!rc && p->uuids.n >= ST_PFT_MAX_TRACKS) rc = ST_PFT_LIMIT;
    if (!rc) {
        u = new_uuid(p);
        rc = put(&title, name, nlen);
        if (!rc) rc = putc_(&title, ' ');
        if (!rc) rc = put(&title, series, slen);
        if (!rc) rc = fvar(&body, 1, u);
        if (!rc) rc = fvar(&body, 5, parent);
        if (!rc) rc = fbytes(&body, 2, title.p, title.n);
        if (!rc) rc = fbytes(&body, 8, "", 0);
        if (!rc) rc = descriptor(p, &body);
        if (!rc) rc = map_put(&p->uuids, key.p, key.n, u);
    }
    free(key.p); free(body.p); free(title.p);
    if (!rc) *uuid = u;
    return rc;
}

/* ------------------------------------------------------------ interning and packets */

static int iid(st_pft *p, int kind, const uint8_t *s, size_t n, uint64_t *out) {
    map *t = &p->tables[kind];
    if (map_get(t, s, n, out)) return 0;
    uint64_t v = t->n + 1;
    TRY(map_put(t, s, n, v));
    p->interned++;
    /* pending: (kind + 1){iid = 1, name = 2} */
    size_t inner = 1 + vlen(v) + 1 + vlen(n) + n;
    TRY(varint(&p->pend, ((uint64_t)(kind + 1) << 3) | 2));
    TRY(varint(&p->pend, inner));
    TRY(fvar(&p->pend, 1, v));
    TRY(fbytes(&p->pend, 2, s, n));
    *out = v;
    return 0;
}

/* The clock snapshot that (re)starts the sequence's incremental clock (64) at 0, beside BOOTTIME at 0:
   packet{seq, clock_snapshot(6){clocks(1){clock_id 64, timestamp 0, is_incremental 1}, clocks{clock_id 6, timestamp 0}}} */
static int snapshot_packet(st_pft *p) {
    static const uint8_t snap[] = {0x32, 14, 0x0a, 6, 0x08, 64, 0x10, 0, 0x18, 1, 0x0a, 4, 0x08, 6, 0x10, 0};
    TRY(varint(&p->out, (1 << 3) | 2));
    TRY(varint(&p->out, 1 + vlen(p->seq) + sizeof snap));
    TRY(fvar(&p->out, 10, p->seq));
    return put(&p->out, snap, sizeof snap);
}

/* One event packet: its time as a delta on the incremental clock; with the flag clearing the incremental
   state, the sequence's defaults (trace_packet_defaults(59){timestamp_clock_id(58) 64}) again. */
static int packet_at(st_pft *p, int64_t ts, const uint8_t *ev, size_t evn) {
    static const uint8_t defaults[] = {0xda, 0x03, 3, 0xd0, 0x03, 64};
    int64_t clock = p->clock;
    if (!p->has_clock || ts < clock) {
        TRY(snapshot_packet(p));
        p->has_clock = 1;
        clock = 0;
    }
    p->clock = ts;
    uint64_t delta = (uint64_t)(ts - clock);
    uint64_t flags = 2;
    if (p->cleared) { flags |= 1; p->cleared = 0; }
    size_t body = 1 + vlen(delta) + 1 + vlen(p->seq) + 1 + 1 + 1 + vlen(evn) + evn;
    if (flags & 1) body += sizeof defaults;
    if (p->pend.n) body += 1 + vlen(p->pend.n) + p->pend.n;
    TRY(varint(&p->out, (1 << 3) | 2));
    TRY(varint(&p->out, body));
    TRY(fvar(&p->out, 8, delta));
    TRY(fvar(&p->out, 10, p->seq));
    TRY(fvar(&p->out, 13, flags));
    if (flags & 1) TRY(put(&p->out, defaults, sizeof defaults));
    TRY(fbytes(&p->out, 11, ev, evn));
    if (p->pend.n) { TRY(fbytes(&p->out, 12, p->pend.p, p->pend.n)); p->pend.n = 0; }
    return 0;
}

/* the heap's order: earlier end first; equal ends: the later pushed (the inner slice) first */
static int end_before(const pending_end *a, const pending_end *b) {
    return a->ts != b->ts ? a->ts < b->ts : a->n > b->n;
}

static int push_end(st_pft *p, int64_t ts, uint64_t track) {
    if (p->n_ends == p->cap_ends) {
        size_t cap = p->cap_ends ? p->cap_ends * 2 : 256;
        pending_end *ne = realloc(p->ends, cap * sizeof *ne);
        if (!ne) return ST_PFT_NOMEM;
        p->ends = ne; p->cap_ends = cap;
    }
    pending_end e = {ts, ++p->ends_made, track};
    size_t i = p->n_ends++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!end_before(&e, &p->ends[up])) break;
        p->ends[i] = p->ends[up];
        i = up;
    }
    p->ends[i] = e;
    return 0;
}

static pending_end pop_end(st_pft *p) {
    pending_end top = p->ends[0], last = p->ends[--p->n_ends];
    size_t i = 0, n = p->n_ends;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && end_before(&p->ends[c + 1], &p->ends[c])) c++;
        if (!end_before(&p->ends[c], &last)) break;
        p->ends[i] = p->ends[c];
        i = c;
    }
    if (n) p->ends[i] = last;
    return top;
}

/* The ends due at or before ts (all with ts = INT64_MAX), as SLICE_END packets. */
static int flush_ends(st_pft *p, int64_t ts, int all) {
    while (p->n_ends && (all || p->ends[0].ts <= ts)) {
        pending_end e = pop_end(p);
        p->endev.n = 0;
        TRY(fvar(&p->endev, 9, 2));
        TRY(fvar(&p->endev, 11, e.track));
        TRY(packet_at(p, e.ts, p->endev.p, p->endev.n));
    }
    return 0;
}

/* The event in p->ev at ts, after the ends due by then. */
static int event_packet(st_pft *p, int64_t ts) {
    TRY(flush_ends(p, ts, 0));
    return packet_at(p, ts, p->ev.p, p->ev.n);
}

static void maybe_reset(st_pft *p) {
    if (p->interned > p->max_interned) {
        p->interned = 0;
        for (int i = 0; i < 3; i++) map_clear(&p->tables[i]);
        p->cleared = 1;
    }
}

static void skip(st_pft *p, const char *reason) {
    for (int i = 0; i < p->n_reasons; i++)
        if (!strcmp(p->reasons[i], reason)) { p->reason_counts[i]++; return; }
    if (p->n_reasons < MAX_REASONS) {
        snprintf(p->reasons[p->n_reasons], sizeof p->reasons[0], "%s", reason);
        p->reason_counts[p->n_reasons++] = 1;
    }
}

static const char *const BOOKKEEPING[] = {"rank", "lane", "pid_raw", "tid_raw", "id_raw", "correlation_raw",
                                          "External id_raw", "external id_raw"};

static int annotations(st_pft *p, const event *ev) {
    for (size_t i = 0; i < ev->n_args; i++) {
        const pair *a = &p->pairs[ev->args + i];
        int book = 0;
        if (a->klen >= 4 && a->klen <= 15)   /* the bookkeeping keys' lengths */
            for (size_t j = 0; j < sizeof BOOKKEEPING / sizeof BOOKKEEPING[0] && !book; j++)
                book = key_is_n(p, a->koff, a->klen, BOOKKEEPING[j], strlen(BOOKKEEPING[j]));
        if (book) continue;
        uint64_t name;
        TRY(iid(p, 2, S(p, a->koff), a->klen, &name));
        buf *t = &p->tmp;
        t->n = 0;
        TRY(fvar(t, 1, name));
        const jv *v = &a->v;
        switch (v->t) {
        case J_INT: TRY(fvar(t, 4, (uint64_t)v->i)); break;
        case J_TRUE: TRY(fvar(t, 2, 1)); break;
        case J_FALSE: TRY(fvar(t, 2, 0)); break;
        case J_DEC: {
            double d;
            TRY(dec_value(v, &d));
            TRY(fdouble(t, 5, d));
            break;
        }
        case J_STR: TRY(fbytes(t, 6, S(p, v->off), v->len)); break;
        case J_NULL: TRY(fbytes(t, 9, "null", 4)); break;
        case J_NEST: TRY(fbytes(t, 9, S(p, v->off), v->len)); break;
        case J_BIG: TRY(fbytes(t, 9, v->raw, v->raw_len)); break;
        default: return ST_PFT_UNSUPPORTED; /* refused before (unsupported()) */
        }
        TRY(fbytes(&p->ev, 4, t->p, t->n));
    }
    return 0;
}

static int in_list(st_pft *p, const jv *v, const char *const *list, int n) {
    for (int i = 0; i < n; i++)
        if (v->t == J_STR && key_is_n(p, v->off, v->len, list[i], strlen(list[i]))) return 1;
    return 0;
}

static const char *const LAUNCH[] = {"cuda_runtime", "cuda_driver", "Runtime"};
static const char *const GPU[] = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"};
#define TS_LIMIT INT64_MAX /* 2^63 - 1: the last usable ns is one below 2^63 */

static int encode_event(st_pft *p, const event *ev) {
    const uint8_t *ph = S(p, ev->ph.off);
    size_t phn = ev->ph.len;
    if (phn == 1 && ph[0] == 'M') return 0;
    if (phn == 1 && (ph[0] == 's' || ph[0] == 't' || ph[0] == 'f')) { p->counts[3]++; return 0; }
    if (!ev->has_ts || ev->ts_ns < 0) {
        char r[64];
        snprintf(r, sizeof r, "%.*s without a usable ts", (int)phn, (const char *)ph);
        skip(p, r);
        return 0;
    }
    int64_t ts = ev->ts_ns;
    if (phn == 1 && ph[0] == 'C') {
        const uint8_t *name = (const uint8_t *)"";
        size_t nlen = 0;
        if (ev->name.t == J_STR) { name = S(p, ev->name.off); nlen = ev->name.len; }
        for (size_t i = 0; ev->args_obj && i < ev->n_args; i++) {
            const pair *a = &p->pairs[ev->args + i];
            const uint8_t *k = S(p, a->koff);
            if (key_is(p, a->koff, a->klen, "rank") || (a->klen >= 4 && !memcmp(k + a->klen - 4, "_raw", 4))) continue;
            double d;
            if (a->v.t == J_INT) d = (double)a->v.i;
            else if (a->v.t == J_DEC) TRY(dec_value(&a->v, &d));
            else continue;
            uint64_t track;
            TRY(counter_track(p, &ev->pid, name, nlen, k, a->klen, &track));
            p->ev.n = 0;
            TRY(fvar(&p->ev, 9, 4));
            TRY(fvar(&p->ev, 11, track));
            TRY(fdouble(&p->ev, 44, d));
            TRY(event_packet(p, ts));
            p->counts[2]++;
        }
        return 0;
    }
    int x = phn == 1 && ph[0] == 'X', b = phn == 1 && ph[0] == 'B', e = phn == 1 && ph[0] == 'E';
    int inst = phn == 1 && (ph[0] == 'i' || ph[0] == 'I' || ph[0] == 'R');
    if (!x && !b && !e && !inst) {
        char r[64];
        snprintf(r, sizeof r, "ph '%.*s'", (int)phn, (const char *)ph);
        skip(p, r);
        return 0;
    }
    uint64_t track;
    const pair *lane = x ? arg(p, ev, "lane") : NULL;
    const pair *tr = arg(p, ev, "tid_raw");
    if (lane && lane->v.t == J_INT && lane->v.i > 0 && tr) TRY(thread_track(p, &ev->pid, &tr->v, lane->v.i, &track));
    else TRY(thread_track(p, &ev->pid, &ev->tid, 0, &track));
    p->ev.n = 0;
    if (e) {
        TRY(fvar(&p->ev, 9, 2));
        TRY(fvar(&p->ev, 11, track));
        return event_packet(p, ts);
    }
    TRY(fvar(&p->ev, 9, inst ? 3 : 1));
    TRY(fvar(&p->ev, 11, track));
    uint64_t id;
    if (ev->name.t == J_STR) {
        TRY(iid(p, 1, S(p, ev->name.off), ev->name.len, &id));
        TRY(fvar(&p->ev, 10, id));
    }
    if (ev->cat.t == J_STR) {
        TRY(iid(p, 0, S(p, ev->cat.off), ev->cat.len, &id));
        TRY(fvar(&p->ev, 3, id));
    }
    if (ev->args_obj) TRY(annotations(p, ev));
    if (x) {
        const pair *corr = arg(p, ev, "correlation");
        if (corr && corr->v.t == J_INT) {
            if (in_list(p, &ev->cat, LAUNCH, 3)) TRY(ffixed(&p->ev, 47, (uint64_t)corr->v.i));
            else if (in_list(p, &ev->cat, GPU, 6)) TRY(ffixed(&p->ev, 48, (uint64_t)corr->v.i));
        }
    }
    TRY(event_packet(p, ts));
    if (x) {
        p->counts[0]++;
        int64_t dur = ev->dur_ns > 0 ? ev->dur_ns : 0;
        int64_t end = dur > TS_LIMIT - 1 - ts ? TS_LIMIT - 1 : ts + dur;
        TRY(push_end(p, end, track));
    } else if (b) p->counts[0]++;
    else p->counts[1]++;
    return 0;
}

/* ------------------------------------------------------------ feed */

typedef struct {
    int64_t key_ts, key_dur;
    size_t index;
} sortkey;

static int cmp_events(const void *a, const void *b) {
    const sortkey *x = a, *y = b;
    if (x->key_ts != y->key_ts) return x->key_ts < y->key_ts ? -1 : 1;
    if (x->key_dur != y->key_dur) return x->key_dur < y->key_dur ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int st_pft_feed(st_pft *p, const uint8_t *chunk, size_t len, const uint8_t **out, size_t *out_len) {
    p->out.n = p->arena.n = 0;
    p->chunk = chunk;
    p->n_events = p->n_pairs = 0;
    *out = NULL;
    *out_len = 0;
    parser q = {chunk, chunk + len, p, 0};
    ws(&q);
    if (q.s < q.e && *q.s == ',') q.s++;
    ws(&q);
    if (q.s >= q.e) return ST_PFT_OK;
    /* phase 1: parse every event of the chunk (nothing of the state changes) */
    for (;;) {
        ws(&q);
        if (q.s >= q.e) return ST_PFT_UNSUPPORTED;
        if (*q.s == '{') {
            if (p->n_events == p->cap_events) {
                size_t cap = p->cap_events ? p->cap_events * 2 : 1024;
                event *ne = realloc(p->events, cap * sizeof(event));
                if (!ne) return ST_PFT_NOMEM;
                p->events = ne; p->cap_events = cap;
            }
            event *ev = &p->events[p->n_events];
            if (parse_event(&q, ev)) return q.rc ? q.rc : ST_PFT_UNSUPPORTED;
            p->n_events++;
        } else {
            jv v;
            if (parse_value(&q, &v, NULL, 0)) return q.rc ? q.rc : ST_PFT_UNSUPPORTED; /* not an event: ignored */
        }
        ws(&q);
        if (q.s >= q.e) break;
        if (*q.s != ',') return ST_PFT_UNSUPPORTED;
        q.s++;
    }
    /* phase 2: everything reproducible? and the sort keys (the reference's: time, longer first, then order) */
    p->tmp.n = 0;
    TRY(grow(&p->tmp, p->n_events * sizeof(sortkey)));
    sortkey *keys = (sortkey *)(void *)p->tmp.p;
    for (size_t i = 0; i < p->n_events; i++) {
        event *ev = &p->events[i];
        if (unsupported(p, ev)) return ST_PFT_UNSUPPORTED;
        keys[i].key_ts = ev->has_ts ? ev->ts_ns : -1;
        keys[i].key_dur = -ev->dur_ns;
        keys[i].index = i;
    }
    qsort(keys, p->n_events, sizeof(sortkey), cmp_events);
    /* phase 3: encode (annotations reuse tmp: the order goes to sorted first) */
    size_t *order = malloc((p->n_events ? p->n_events : 1) * sizeof(size_t));
    if (!order) return ST_PFT_NOMEM;
    for (size_t i = 0; i < p->n_events; i++) order[i] = keys[i].index;
    for (size_t i = 0; i < p->n_events; i++) {
        int rc = encode_event(p, &p->events[order[i]]);
        if (rc) { free(order); return rc; }
        maybe_reset(p);
    }
    free(order);
    TRY(flush_ends(p, 0, 1));
    *out = p->out.p;
    *out_len = p->out.n;
    return ST_PFT_OK;
}

void st_pft_counts(st_pft *p, int64_t *counts4) { memcpy(counts4, p->counts, sizeof p->counts); }

int st_pft_skipped(st_pft *p, const uint8_t **out, size_t *out_len) {
    p->exp.n = 0;
    for (int i = 0; i < p->n_reasons; i++) {
        TRY(put(&p->exp, p->reasons[i], strlen(p->reasons[i]) + 1));
        TRY(put(&p->exp, &p->reason_counts[i], 8));
    }
    *out = p->exp.p;
    *out_len = p->exp.n;
    return 0;
}

/* cleared (1 byte), interned (8), then per entry: table (1 byte: 0-2 interning, 3 uuids),
   key length (4), key, value (8); in insertion order; last, table 4: the incremental clock's time + 1
   (0: no snapshot yet), no key */
int st_pft_export(st_pft *p, const uint8_t **out, size_t *out_len) {
    buf *b = &p->exp;
    b->n = 0;
    TRY(putc_(b, (uint8_t)p->cleared));
    TRY(put(b, &p->interned, 8));
    for (int t = 0; t < 4; t++) {
        map *m = t < 3 ? &p->tables[t] : &p->uuids;
        for (size_t i = 0; i < m->n; i++) {
            slot *s = &m->s[m->order[i]];
            uint32_t n = (uint32_t)s->len;
            TRY(putc_(b, (uint8_t)t));
            TRY(put(b, &n, 4));
            TRY(put(b, m->keys.p + s->off, s->len));
            TRY(put(b, &s->val, 8));
        }
    }
    uint32_t zero = 0;
    uint64_t clock = p->has_clock ? (uint64_t)p->clock + 1 : 0;
    TRY(putc_(b, 4));
    TRY(put(b, &zero, 4));
    TRY(put(b, &clock, 8));
    *out = b->p;
    *out_len = b->n;
    return 0;
}
