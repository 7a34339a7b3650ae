/*
 * Incremental Chrome-trace / Kineto JSON tokenizer.  See st_tokenizer.h.
 *
 * Strategy: the document is a sequence of items (top-level members and the
 * events of traceEvents).  Each item is parsed only when it is complete in the
 * caller's buffer; if the buffer ends inside an item, the item is abandoned and
 * its first byte is reported as the consumption point, so the caller passes it
 * again with more bytes.  Parsing an event collects spans into the buffer and
 * commits them (interning strings, writing records) only once the closing '}'
 * has been seen, so an abandoned item leaves no trace.
 */
#include "st_tokenizer.h"
#include "st_lex.h"
#include "st_members.h"
#include "st_scan.h" /* SIMD scanner (issue #44): hooks marked "st_scan" */

#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define DEFAULT_MAX_DEPTH 256u
#define DEFAULT_MAX_STRING_BYTES (1ull << 30)
#define MAX_STRINGS 0x7fffffffu

/* item parse results */
enum { P_OK = 0, P_MORE = 1, P_ERR = 2 };

enum doc_state {
    S_START,        /* before the root value */
    S_ROOT_KEY,     /* in the root object, expecting a key or '}' */
    S_ROOT_NEXT,    /* after a root member: ',' or '}' */
    S_EVENTS,       /* in the events array, expecting an event or ']' */
    S_EVENTS_NEXT,  /* after an event: ',' or ']' */
    S_DONE
};

typedef struct {
    uint64_t offset;
    uint32_t len;
} str_ref;

struct st_tok {
    st_tok_options opt;
    enum doc_state state;
    int bare_array;         /* legacy layout: the root is the events array */
    uint32_t saw_events;    /* an events array has begun */
    int first_in_container; /* no member/event seen yet in current container */
    st_tok_counts counts;
    char err[256];
    uint64_t err_offset;
    int err_code;           /* ST_ERR_* of the last error */

    /* string table: arena + refs + open-addressing hash of ids */
    char *arena;
    uint64_t arena_len, arena_cap;
    str_ref *refs;
    uint32_t n_strings, refs_cap;
    uint32_t *slots;        /* id + 1, 0 = empty */
    uint32_t n_slots;       /* power of two */

    st_members meta;        /* top-level members seen, not yet taken */
};

/* ------------------------------------------------------------------ errors */

static void set_error(st_tok *t, const char *base, const char *at, const char *fmt, ...)
{
    va_list ap;
    t->err_code = ST_ERR_SYNTAX;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
    t->err_offset = t->counts.bytes_consumed + (uint64_t)(at - base);
}

/* -------------------------------------------------------------- lexing */

/* First '"' or '\\' in [p, end), or end.  SSE2 (x86-64 baseline) scans 16
 * bytes at a time; other targets use the byte loop. */
static inline const char *find_quote_or_backslash(const char *p, const char *end)
{
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        int m = _mm_movemask_epi8(
            _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)));
        if (m)
            return p + __builtin_ctz((unsigned)m);
        p += 16;
        /* st_scan: past the first 16 bytes (most strings end sooner), 32/64 at a time */
        if (st_scan_path != ST_SCAN_OFF)
            return st_scan_quote_or_backslash(p, end);
    }
#else
    if (st_scan_path != ST_SCAN_OFF) /* st_scan */
        return st_scan_quote_or_backslash(p, end);
#endif
    while (p < end && *p != '"' && *p != '\\')
        p++;
    return p;
}

/* p points at the opening quote.  On P_OK, (*s, *slen) is the raw content and
 * *next is just past the closing quote. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int scan_string(const char *p, const char *end, const char **s, size_t *slen,
                              const char **next)
{
    const char *q = p + 1;
    for (;;) {
        q = find_quote_or_backslash(q, end);
        if (q >= end)
            return P_MORE;
        if (*q == '"') {
            *s = p + 1;
            *slen = (size_t)(q - (p + 1));
            *next = q + 1;
            return P_OK;
        }
        q += 2; /* a backslash escapes the next byte (\uXXXX needs no more care) */
    }
}

#define is_scalar_char(c) (ST_SCALAR_CHAR[(unsigned char)(c)])
#define skip_ws st_skip_ws
#define POW10 ST_POW10

/* numbers and the literals true/false/null/NaN/Infinity */
static int scan_scalar(const char *p, const char *end, const char **next)
{
    const char *q = p;
    while (q < end && is_scalar_char((unsigned char)*q))
        q++;
    if (q == end)
        return P_MORE; /* the token may continue in the next chunk */
    *next = q;
    return q > p ? P_OK : P_ERR;
}

/* First byte in [p, end) that is a quote or a bracket, or end: inside a
 * skipped container nothing else matters.  ('{' and '[' differ from '}' and
 * ']' only in bit 0x20, so clearing it folds four compares into two.) */
static inline const char *find_structural(const char *p, const char *end)
{
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), fold = _mm_set1_epi8((char)0xDF);
    const __m128i open = _mm_set1_epi8('['), close = _mm_set1_epi8(']');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i f = _mm_and_si128(v, fold);
        int m = _mm_movemask_epi8(_mm_or_si128(
            _mm_cmpeq_epi8(v, quote), _mm_or_si128(_mm_cmpeq_epi8(f, open), _mm_cmpeq_epi8(f, close))));
        if (m)
            return p + __builtin_ctz((unsigned)m);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '{' && *p != '}' && *p != '[' && *p != ']')
        p++;
    return p;
}

/* One bracket of a skipped container: push or pop, checking kinds for the
 * first 64 levels (deeper ones are only counted; max_depth bounds the count).
 * Returns P_OK when the outermost container closed (*next set), P_ERR on a
 * bad bracket, P_MORE to go on. */
static inline int skip_bracket(st_tok *t, const char *base, const char *p, char *stack,
                               uint32_t *depth, const char **next)
{
    char c = *p;
    if (c == '{' || c == '[') {
        if (*depth >= t->opt.max_depth) {
            set_error(t, base, p, "JSON nested deeper than %u levels", t->opt.max_depth);
            t->err_code = ST_ERR_LIMIT;
            return P_ERR;
        }
        if (*depth < 64)
            stack[*depth] = c;
        (*depth)++;
        return P_MORE;
    }
    if (*depth == 0) {
        set_error(t, base, p, "unbalanced '%c'", c);
        return P_ERR;
    }
    (*depth)--;
    if (*depth < 64 && stack[*depth] != (c == '}' ? '{' : '[')) {
        set_error(t, base, p, "mismatched '%c'", c);
        return P_ERR;
    }
    if (*depth == 0) {
        *next = p + 1;
        return P_OK;
    }
    return P_MORE;
}

#if defined(__SSE2__)
/* Bit i set where byte i of the 64 at p equals c (or, with fold, equals c
 * after clearing bit 0x20: '[' folds '{' in, ']' folds '}'). */
static inline uint64_t mask64(const char *p, char c, int fold)
{
    const __m128i want = _mm_set1_epi8(c), f = _mm_set1_epi8(fold ? (char)0xDF : (char)0xFF);
    uint64_t m = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_and_si128(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)), f);
        m |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, want)) << (16 * i);
    }
    return m;
}

/* Bit i = parity of the set bits at positions <= i. */
static inline uint64_t prefix_xor(uint64_t x)
{
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
}
#endif

/* Skip to the end of the container whose opening bracket `open` has been
 * read (p is just past it, or at it when `open` is 0); *next is just past the
 * matching close.
 *
 * Fast path: 64-byte blocks without a backslash are done with bitmasks (the
 * quotes' prefix parity says which brackets are inside strings), so a
 * dropped event costs a few instructions per 64 bytes instead of a string
 * scan per quote.  A block that ends inside a string hands that string to
 * the byte path; a block with a backslash (an escape) is done by the byte
 * path entirely. */
static int skip_nested(st_tok *t, const char *base, const char *p, const char *end, char open,
                       const char **next)
{
    char stack[64];
    uint32_t depth = 0;
    const char *s;
    size_t slen;
    const char *bytewise_until = p; /* no block fast path before here */
    if (open) {
        stack[0] = open;
        depth = 1;
    }
    while (p < end) {
#if defined(__SSE2__)
        while (p >= bytewise_until && end - p >= 64) {
            uint64_t backslashes, quotes, brackets;
            if (st_scan_path != ST_SCAN_OFF) { /* st_scan: the three masks in 2 (AVX2) or 1 (AVX-512) loads */
                st_scan_masks64(p, &backslashes, &quotes, &brackets);
            } else {
                backslashes = mask64(p, '\\', 0);
                quotes = backslashes ? 0 : mask64(p, '"', 0);
                brackets = backslashes ? 0 : mask64(p, '[', 1) | mask64(p, ']', 1);
            }
            if (backslashes) {
                bytewise_until = p + 64;
                break;
            }
            uint64_t in_string = prefix_xor(quotes); /* opening quotes included */
            brackets &= ~in_string;
            while (brackets) {
                int r = skip_bracket(t, base, p + __builtin_ctzll(brackets), stack, &depth, next);
                if (r != P_MORE)
                    return r;
                brackets &= brackets - 1;
            }
            if (in_string >> 63) { /* a string runs past the block: from its opening quote */
                p += 63 - __builtin_clzll(quotes);
                break;
            }
            p += 64;
        }
        if (p >= end)
            break;
#endif
        p = find_structural(p, end);
        if (p >= end)
            break;
        if (*p == '"') {
            if (scan_string(p, end, &s, &slen, &p) != P_OK)
                return P_MORE;
            continue;
        }
        int r = skip_bracket(t, base, p, stack, &depth, next);
        if (r != P_MORE)
            return r;
        p++;
    }
    return P_MORE;
}

/* Skip one JSON value of any kind; *next is just past it. */
static int skip_value(st_tok *t, const char *base, const char *p, const char *end,
                      const char **next)
{
    const char *s;
    size_t slen;
    if (p >= end)
        return P_MORE;
    if (*p == '"')
        return scan_string(p, end, &s, &slen, next);
    if (*p == '{' || *p == '[')
        return skip_nested(t, base, p, end, 0, next);
    int r = scan_scalar(p, end, next);
    if (r == P_ERR)
        set_error(t, base, p, "unexpected character '%c'", *p);
    return r;
}

/* Skip the rest of an object whose '{' has been read: used to drop unwanted
 * events without parsing their members. */
static int skip_object_rest(st_tok *t, const char *base, const char *p, const char *end,
                            const char **next)
{
    return skip_nested(t, base, p, end, '{', next);
}

/* ---------------------------------------------------------- numbers */

/* The leading ASCII digits of the 8 bytes at p: returns their count (0..8)
 * and puts their value in *value, with no branch per digit.  A byte is a
 * digit when its high nibble is 3 and adding 6 keeps it so; a carry out of a
 * non-digit byte can only disturb bytes after the first non-digit, which do
 * not count. */
static inline int leading_digits8(const char *p, uint64_t *value)
{
    uint64_t w;
    memcpy(&w, p, 8);
    uint64_t t = (w & 0xF0F0F0F0F0F0F0F0ull) |
                 (((w + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4);
    uint64_t x = t ^ 0x3333333333333333ull; /* zero bytes = digits */
    int n = x ? __builtin_ctzll(x) >> 3 : 8;
    if (n == 0) {
        *value = 0;
        return 0;
    }
    /* the n digits moved to the high end, '0' padding before them */
    uint64_t d = w << (8 * (8 - n));
    if (n < 8)
        d |= 0x3030303030303030ull >> (8 * n);
    d -= 0x3030303030303030ull;
    d = (d * 10) + (d >> 8);
    *value = (((d & 0x000000FF000000FFull) * 0x000F424000000064ull) +
              (((d >> 16) & 0x000000FF000000FFull) * 0x0000271000000001ull)) >> 32;
    return n;
}

/*
 * Parse a JSON number exactly as value * 10^scale, rounded half to even, into
 * an int64.  Returns 1 on success, 0 if the token is not a finite number or
 * the result does not fit.
 */
/* Common case: [-]digits[.digits] with few enough digits that no rounding or
 * overflow can happen.  Returns 1 if it handled the token. */
static int number_fast(const char *s, size_t n, int scale, int64_t *out)
{
    const char *p = s, *end = s + n;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    uint64_t v = 0; /* at most 19 digits below: cannot wrap */
    int digits = 0, frac = 0;
    while (p < end && (unsigned)(*p - '0') < 10 && digits < 20) {
        v = v * 10 + (uint64_t)(*p++ - '0');
        digits++;
    }
    if (digits == 0 || digits + scale > 19)
        return 0;
    if (p < end && *p == '.') {
        p++;
        if (p == end)
            return 0;
        while (p < end && (unsigned)(*p - '0') < 10 && frac < scale) {
            v = v * 10 + (uint64_t)(*p++ - '0');
            frac++;
        }
    }
    if (p != end)
        return 0; /* more fraction digits, an exponent, or junk: slow path */
    v *= (uint64_t)POW10[scale - frac];
    if (v > (uint64_t)INT64_MAX)
        return 0;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

static int number_to_scaled_int(const char *s, size_t n, int scale, int64_t *out)
{
    if (scale >= 0 && scale <= 3 && number_fast(s, n, scale, out))
        return 1;
    const char *p = s, *end = s + n;
    int neg = 0;
    if (p < end && (*p == '-' || *p == '+')) {
        neg = *p == '-';
        p++;
    }
    const char *digits = p;
    size_t int_len = 0, frac_len = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        p++;
        int_len++;
    }
    const char *frac = p;
    if (p < end && *p == '.') {
        p++;
        frac = p;
        while (p < end && *p >= '0' && *p <= '9') {
            p++;
            frac_len++;
        }
    }
    if (int_len + frac_len == 0)
        return 0;
    long exp10 = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '-' || *p == '+')) {
            eneg = *p == '-';
            p++;
        }
        if (p == end)
            return 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp10 < 100000)
                exp10 = exp10 * 10 + (*p - '0');
            p++;
        }
        if (eneg)
            exp10 = -exp10;
    }
    if (p != end)
        return 0;

    /* digit i (0-based over int then frac digits) has weight 10^(keep-1-i) in
     * the scaled integer, where keep = int_len + exp10 + scale */
    long total = (long)(int_len + frac_len);
    long keep = (long)int_len + exp10 + scale;
    uint64_t v = 0;
    int round_digit = 0, sticky = 0; /* keep < 0: the first dropped digit is an implicit 0 */
    for (long i = 0; i < total; i++) {
        char c = i < (long)int_len ? digits[i] : frac[i - (long)int_len];
        int d = c - '0';
        if (i < keep) {
            if (v > (UINT64_MAX - (uint64_t)d) / 10)
                return 0;
            v = v * 10 + (uint64_t)d;
        } else if (i == keep) {
            round_digit = d;
        } else {
            sticky |= d != 0;
        }
    }
    for (long i = total; i < keep; i++) {
        if (v > UINT64_MAX / 10)
            return 0;
        v *= 10;
    }
    if (round_digit > 5 || (round_digit == 5 && (sticky || (v & 1))))
        v++;
    if (neg) {
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

/* Exact powers of ten as doubles (10^22 is the largest exactly representable). */
static const double POW10_D[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* [-]digits[.digits] with at most 15 digits: the digits form an exact
 * integer m < 2^53 and m / 10^k is one correctly rounded IEEE division, so
 * the result equals strtod's.  Returns 0 when the token needs strtod. */
static int float_fast(const char *s, size_t n, double *out)
{
    const char *p = s, *end = s + n;
    int neg = p < end && *p == '-';
    p += neg;
    uint64_t m = 0;
    int digits = 0, frac = 0;
    while (p < end && (unsigned)(*p - '0') < 10 && digits < 16) {
        m = m * 10 + (uint64_t)(*p++ - '0');
        digits++;
    }
    if (digits == 0)
        return 0;
    if (p < end && *p == '.') {
        const char *d = ++p;
        while (p < end && (unsigned)(*p - '0') < 10 && digits < 16) {
            m = m * 10 + (uint64_t)(*p++ - '0');
            digits++;
        }
        frac = (int)(p - d);
        if (frac == 0)
            return 0;
    }
    if (p != end || digits > 15)
        return 0;
    double v = (double)m / POW10_D[frac];
    *out = neg ? -v : v;
    return 1;
}

static float number_to_float(const char *s, size_t n)
{
    char small[128];
    double fast;
    if (float_fast(s, n, &fast))
        return (float)fast;
    if (n == 0 || n > (1u << 20)) /* a megabyte of digits is not a measurement */
        return NAN;
    /* only plain number syntax: strtod would also accept hex and "nan" */
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'))
            return NAN;
    }
    /* strtod needs a NUL-terminated copy; long ones (many digits) on the heap */
    char *tmp = n < sizeof small ? small : malloc(n + 1);
    if (!tmp)
        return NAN;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *endp;
    double d = strtod(tmp, &endp);
    int whole = endp == tmp + n;
    if (tmp != small)
        free(tmp);
    return whole ? (float)d : NAN;
}

/* ---------------------------------------------------------- strings */

static int grow_slots(st_tok *t)
{
    uint32_t n = t->n_slots ? t->n_slots * 2 : 1024;
    if (n == 0 || n > (1u << 31))
        return 0;
    uint32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return 0;
    for (uint32_t id = 0; id < t->n_strings; id++) {
        str_ref r = t->refs[id];
        uint32_t i = (uint32_t)st_hash_bytes(t->arena + r.offset, r.len, 0) & (n - 1);
        while (slots[i])
            i = (i + 1) & (n - 1);
        slots[i] = id + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = n;
    return 1;
}

/* Equality of short byte runs; with a constant n it compiles to a few word
 * compares instead of a memcmp call. */
static inline int bytes_eq(const char *a, const char *b, size_t n)
{
    uint64_t x, y;
    uint32_t u, v;
    if (n >= 8) {
        for (; n > 8; a += 8, b += 8, n -= 8) {
            memcpy(&x, a, 8);
            memcpy(&y, b, 8);
            if (x != y)
                return 0;
        }
        memcpy(&x, a + n - 8, 8); /* the last 8 bytes, overlapping */
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        memcpy(&u, a, 4);
        memcpy(&v, b, 4);
        if (u != v)
            return 0;
        memcpy(&u, a + n - 4, 4);
        memcpy(&v, b + n - 4, 4);
        return u == v;
    }
    if (n >= 2) { /* 2 or 3 bytes: two overlapping 16-bit compares */
        uint16_t h, g;
        memcpy(&h, a, 2);
        memcpy(&g, b, 2);
        if (h != g)
            return 0;
        memcpy(&h, a + n - 2, 2);
        memcpy(&g, b + n - 2, 2);
        return h == g;
    }
    return n == 0 || *a == *b;
}

/* Returns the id of s, adding it if new; ST_NOSTR on failure (error set). */
static uint32_t intern(st_tok *t, const char *base, const char *s, size_t n)
{
    if (n > UINT32_MAX) {
        set_error(t, base, s, "string longer than 4 GiB");
        return ST_NOSTR;
    }
    if ((uint64_t)t->n_strings * 2 >= t->n_slots && !grow_slots(t)) {
        set_error(t, base, s, "out of memory for the string table");
        t->err_code = ST_ERR_NOMEM;
        return ST_NOSTR;
    }
    uint64_t h = st_hash_bytes(s, n, 0);
    uint32_t mask = t->n_slots - 1;
    uint32_t i = (uint32_t)h & mask;
    while (t->slots[i]) {
        str_ref r = t->refs[t->slots[i] - 1];
        if (r.len == n && (n <= 32 ? bytes_eq(t->arena + r.offset, s, n)
                                   : memcmp(t->arena + r.offset, s, n) == 0))
            return t->slots[i] - 1;
        i = (i + 1) & mask;
    }
    if (t->n_strings >= MAX_STRINGS || t->arena_len + n > t->opt.max_string_bytes) {
        set_error(t, base, s, "more than %llu bytes of distinct names (limit)",
                  (unsigned long long)t->opt.max_string_bytes);
        t->err_code = ST_ERR_LIMIT;
        return ST_NOSTR;
    }
    if (t->arena_len + n > t->arena_cap) {
        uint64_t cap = t->arena_cap ? t->arena_cap : 65536;
        while (cap < t->arena_len + n)
            cap *= 2;
        char *a = realloc(t->arena, cap);
        if (!a) {
            set_error(t, base, s, "out of memory for the string table");
            t->err_code = ST_ERR_NOMEM;
            return ST_NOSTR;
        }
        t->arena = a;
        t->arena_cap = cap;
    }
    if (t->n_strings == t->refs_cap) {
        uint32_t cap = t->refs_cap ? t->refs_cap * 2 : 1024;
        str_ref *r = realloc(t->refs, (size_t)cap * sizeof *r);
        if (!r) {
            set_error(t, base, s, "out of memory for the string table");
            t->err_code = ST_ERR_NOMEM;
            return ST_NOSTR;
        }
        t->refs = r;
        t->refs_cap = cap;
    }
    if (n)
        memcpy(t->arena + t->arena_len, s, n);
    t->refs[t->n_strings].offset = t->arena_len;
    t->refs[t->n_strings].len = (uint32_t)n;
    t->arena_len += n;
    t->slots[i] = t->n_strings + 1;
    return t->n_strings++;
}

/* ---------------------------------------------------------- one event */

typedef struct {
    const char *s;
    size_t n;
} span;

/* Everything an event may carry, as spans into the buffer, plus parsed
 * numbers.  Committed to records only when the event is complete. */
/* Communication and launch-geometry fields: most events have neither, so
 * these parts are initialised only when a first such key is seen. */
typedef struct {
    span coll, dtype, pg_name, pg_desc, pg_ranks, in_split, out_split, comms_id;
    int64_t in_nelems, out_nelems, group_size, pg_id, seq, rank, dst_rank, src_rank;
} comm_fields;

typedef struct {
    int32_t grid[3], block[3];
    int64_t regs, smem;
    float bpsm, wpsm, occ;
} kernel_fields;

/* Everything an event may carry, as spans into the buffer, plus parsed
 * numbers.  Committed to records only when the event is complete. */
typedef struct {
    span ph, cat, name, s_scope, bp;
    span pid_str, tid_str, id_str;
    span label;
    span input_dims, input_type;
    int64_t ts, dur, pid, tid, id, correlation, external_id, value;
    int64_t stream, device, cbid;
    int has_ts, has_dur, has_kernel, has_comm;
    int skip_rest; /* the event is dropped: skip its remaining members */
    int string_times; /* "ts"/"dur" given as strings; counted when the event is complete
                         (a cut event is parsed again from its start) */
    comm_fields comm;   /* valid when has_comm */
    kernel_fields kern; /* valid when has_kernel */
} event_fields;

/* Copied by assignment per event (cheaper than memset + stores). */
static const event_fields FIELDS_INIT = {
    .ts = ST_NONE, .dur = ST_NONE, .pid = ST_NONE, .tid = ST_NONE, .id = ST_NONE,
    .correlation = ST_NONE, .external_id = ST_NONE, .value = ST_NONE,
    .stream = ST_NONE, .device = ST_NONE, .cbid = ST_NONE,
};
static const comm_fields COMM_INIT = {
    .in_nelems = ST_NONE, .out_nelems = ST_NONE, .group_size = ST_NONE,
    .pg_id = ST_NONE, .seq = ST_NONE, .rank = ST_NONE, .dst_rank = ST_NONE, .src_rank = ST_NONE,
};
static const kernel_fields KERNEL_INIT = {
    .grid = {-1, -1, -1}, .block = {-1, -1, -1},
    .regs = ST_NONE, .smem = ST_NONE, .bpsm = NAN, .wpsm = NAN, .occ = NAN,
};

static inline comm_fields *comm_of(event_fields *f)
{
    if (!f->has_comm) {
        f->comm = COMM_INIT;
        f->has_comm = 1;
    }
    return &f->comm;
}

static inline kernel_fields *kernel_of(event_fields *f)
{
    if (!f->has_kernel) {
        f->kern = KERNEL_INIT;
        f->has_kernel = 1;
    }
    return &f->kern;
}

#define KEY_IS(k, kn, lit) ((kn) == sizeof(lit) - 1 && bytes_eq((k), (lit), sizeof(lit) - 1))
#define SPAN_IS(sp, lit) ((sp).s && KEY_IS((sp).s, (sp).n, lit))

/* a flow event's phase: "s" (start), "f" (finish) or "t" (step) */
static int is_flow(span ph)
{
    return ph.s && ph.n == 1 && (ph.s[0] == 's' || ph.s[0] == 'f' || ph.s[0] == 't');
}

/* Read a scalar or string value; numbers go to *num, strings to *str. */
static int read_int_value(st_tok *t, const char *base, const char *p, const char *end,
                          int scale, int64_t *num, span *str, const char **next)
{
    if (p >= end)
        return P_MORE;
    if (*p == '"') {
        if (scan_string(p, end, &str->s, &str->n, next) != P_OK)
            return P_MORE;
        return P_OK;
    }
    if (*p == '{' || *p == '[') {
        t->counts.bad_numbers++;
        return skip_value(t, base, p, end, next);
    }
    /* fast path, one pass: [-]digits[.digits] short enough to need no
     * rounding or overflow check, followed by a delimiter */
    {
        const char *q = p;
        int neg = q < end && *q == '-';
        q += neg;
        uint64_t v = 0;
        int digits = 0, frac = 0;
        if (end - q >= 24) { /* room for two 8-byte loads and the fraction */
            digits = leading_digits8(q, &v);
            q += digits;
            if (digits == 8) {
                uint64_t lo;
                int more = leading_digits8(q, &lo);
                if (more) {
                    v = v * (uint64_t)POW10[more] + lo;
                    q += more;
                    digits += more;
                }
            }
        }
        while (q < end && (unsigned)(*q - '0') < 10 && digits < 16) {
            v = v * 10 + (uint64_t)(*q++ - '0');
            digits++;
        }
        if (digits && q < end && *q == '.' && scale > 0) {
            const char *d = ++q;
            while (q < end && (unsigned)(*q - '0') < 10 && frac < scale) {
                v = v * 10 + (uint64_t)(*q++ - '0');
                frac++;
            }
            if (q == d)
                digits = 0; /* "1." : let the slow path judge it */
        }
        if (digits && q < end && !is_scalar_char(*q)) {
            v *= (uint64_t)POW10[scale - frac]; /* < 10^19: no wrap in 64 bits */
            /* below 10^18 it fits; 19 digits may not (16 of them and
             * scale 3): past INT64_MAX the slow path rejects it */
            if (digits + scale <= 18 || v <= (uint64_t)INT64_MAX) {
                *num = neg ? -(int64_t)v : (int64_t)v;
                *next = q;
                return P_OK;
            }
        }
    }
    int r = scan_scalar(p, end, next);
    if (r == P_ERR) {
        set_error(t, base, p, "unexpected character '%c'", *p);
        return P_ERR;
    }
    if (r == P_MORE)
        return P_MORE;
    size_t n = (size_t)(*next - p);
    if (KEY_IS(p, n, "null"))
        return P_OK;
    if (!number_to_scaled_int(p, n, scale, num)) {
        *num = ST_NONE;
        t->counts.bad_numbers++;
    }
    return P_OK;
}

static int read_arg_int(st_tok *t, const char *base, const char *p, const char *end,
                        int64_t *num, const char **next)
{
    span ignored = {0, 0};
    return read_int_value(t, base, p, end, 0, num, &ignored, next);
}

static int read_arg_float(st_tok *t, const char *base, const char *p, const char *end,
                          float *num, const char **next)
{
    if (p < end && *p != '"' && *p != '{' && *p != '[') {
        int r = scan_scalar(p, end, next);
        if (r == P_OK)
            *num = number_to_float(p, (size_t)(*next - p));
        else if (r == P_ERR)
            set_error(t, base, p, "unexpected character '%c'", *p);
        return r;
    }
    return skip_value(t, base, p, end, next);
}

/* The common "[a, b, c]" of small non-negative ints, read in one pass.
 * Returns 1 when it handled the value (dims and *next set). */
static int dim3_fast(const char *p, const char *end, int32_t dims[3], const char **next)
{
    int32_t v[3];
    const char *q = p + 1;
    for (int i = 0; i < 3; i++) {
        q = skip_ws(q, end);
        int digits = 0;
        int32_t x = 0;
        while (q < end && (unsigned)(*q - '0') < 10 && digits < 9) {
            x = x * 10 + (*q++ - '0');
            digits++;
        }
        q = skip_ws(q, end);
        if (digits == 0 || q >= end || *q != (i < 2 ? ',' : ']'))
            return 0;
        v[i] = x;
        q++;
    }
    memcpy(dims, v, sizeof v);
    *next = q;
    return 1;
}

/* [a, b, c] of ints into dims; anything else is skipped and left absent. */
static int read_dim3(st_tok *t, const char *base, const char *p, const char *end,
                     int32_t dims[3], const char **next)
{
    if (p < end && *p == '[' && dim3_fast(p, end, dims, next))
        return P_OK;
    int r = skip_value(t, base, p, end, next);
    if (r != P_OK || *p != '[')
        return r;
    int32_t v[3];
    int n = 0;
    const char *q = skip_ws(p + 1, *next);
    while (q < *next && *q != ']') {
        const char *after;
        int64_t x = ST_NONE;
        if (scan_scalar(q, *next, &after) != P_OK || n == 3 ||
            !number_to_scaled_int(q, (size_t)(after - q), 0, &x) || x < INT32_MIN ||
            x > INT32_MAX)
            return P_OK;
        v[n++] = (int32_t)x;
        q = skip_ws(after, *next);
        if (q < *next && *q == ',')
            q = skip_ws(q + 1, *next);
    }
    if (n == 3)
        memcpy(dims, v, sizeof v);
    return P_OK;
}

static int read_raw_value(st_tok *t, const char *base, const char *p, const char *end,
                          span *sp, const char **next)
{
    int r = skip_value(t, base, p, end, next);
    if (r == P_OK) {
        if (*p == '"') { /* strings: the content, without quotes */
            sp->s = p + 1;
            sp->n = (size_t)(*next - p - 2);
        } else {
            sp->s = p;
            sp->n = (size_t)(*next - p);
        }
    }
    return r;
}

static int read_string_value(st_tok *t, const char *base, const char *p, const char *end,
                             span *sp, const char **next)
{
    if (p < end && *p == '"')
        return scan_string(p, end, &sp->s, &sp->n, next) == P_OK ? P_OK : P_MORE;
    return skip_value(t, base, p, end, next);
}

static int parse_arg(st_tok *t, const char *base, const char *k, size_t kn, const char *p,
                     const char *end, event_fields *f, const char **next)
{
    switch (kn) {
    case 3:
        if (KEY_IS(k, kn, "Seq"))
            return read_arg_int(t, base, p, end, &comm_of(f)->seq, next);
        if (KEY_IS(k, kn, "cid"))
            return read_arg_int(t, base, p, end, &f->cbid, next);
        break;
    case 4:
        if (KEY_IS(k, kn, "cbid"))
            return read_arg_int(t, base, p, end, &f->cbid, next);
        if (KEY_IS(k, kn, "grid"))
            return read_dim3(t, base, p, end, kernel_of(f)->grid, next);
        if (KEY_IS(k, kn, "Rank"))
            return read_arg_int(t, base, p, end, &comm_of(f)->rank, next);
        if (KEY_IS(k, kn, "name"))
            return read_string_value(t, base, p, end, &f->label, next);
        break;
    case 5:
        if (KEY_IS(k, kn, "bytes"))
            return read_arg_int(t, base, p, end, &f->value, next);
        if (KEY_IS(k, kn, "block"))
            return read_dim3(t, base, p, end, kernel_of(f)->block, next);
        if (KEY_IS(k, kn, "dtype"))
            return read_raw_value(t, base, p, end, &comm_of(f)->dtype, next);
        break;
    case 6:
        if (KEY_IS(k, kn, "stream"))
            return read_arg_int(t, base, p, end, &f->stream, next);
        if (KEY_IS(k, kn, "device"))
            return read_arg_int(t, base, p, end, &f->device, next);
        if (KEY_IS(k, kn, "labels"))
            return read_string_value(t, base, p, end, &f->label, next);
        break;
    case 8:
        if (KEY_IS(k, kn, "Dst Rank"))
            return read_arg_int(t, base, p, end, &comm_of(f)->dst_rank, next);
        if (KEY_IS(k, kn, "Src Rank"))
            return read_arg_int(t, base, p, end, &comm_of(f)->src_rank, next);
        if (KEY_IS(k, kn, "Comms Id")) /* a uint64 written as a bare number: kept as its text */
            return read_raw_value(t, base, p, end, &comm_of(f)->comms_id, next);
        break;
    case 10:
        if (KEY_IS(k, kn, "sort_index"))
            return read_arg_int(t, base, p, end, &f->value, next);
        if (KEY_IS(k, kn, "Group size"))
            return read_arg_int(t, base, p, end, &comm_of(f)->group_size, next);
        if (KEY_IS(k, kn, "Input Dims"))
            return read_raw_value(t, base, p, end, &f->input_dims, next);
        if (KEY_IS(k, kn, "Input type"))
            return read_raw_value(t, base, p, end, &f->input_type, next);
        break;
    case 11:
        if (KEY_IS(k, kn, "External id") || KEY_IS(k, kn, "external id"))
            return read_arg_int(t, base, p, end, &f->external_id, next);
        if (KEY_IS(k, kn, "correlation"))
            return read_arg_int(t, base, p, end, &f->correlation, next);
        break;
    case 12:
        if (KEY_IS(k, kn, "warps per SM"))
            return read_arg_float(t, base, p, end, &kernel_of(f)->wpsm, next);
        break;
    case 13:
        if (KEY_IS(k, kn, "blocks per SM"))
            return read_arg_float(t, base, p, end, &kernel_of(f)->bpsm, next);
        if (KEY_IS(k, kn, "shared memory"))
            return read_arg_int(t, base, p, end, &kernel_of(f)->smem, next);
        if (KEY_IS(k, kn, "In split size"))
            return read_raw_value(t, base, p, end, &comm_of(f)->in_split, next);
        if (KEY_IS(k, kn, "In msg nelems"))
            return read_arg_int(t, base, p, end, &comm_of(f)->in_nelems, next);
        break;
    case 14:
        if (KEY_IS(k, kn, "Out split size"))
            return read_raw_value(t, base, p, end, &comm_of(f)->out_split, next);
        if (KEY_IS(k, kn, "Out msg nelems"))
            return read_arg_int(t, base, p, end, &comm_of(f)->out_nelems, next);
        break;
    case 15:
        if (KEY_IS(k, kn, "Collective name"))
            return read_raw_value(t, base, p, end, &comm_of(f)->coll, next);
        break;
    case 16:
        if (KEY_IS(k, kn, "Process Group ID"))
            return read_arg_int(t, base, p, end, &comm_of(f)->pg_id, next);
        break;
    case 18:
        if (KEY_IS(k, kn, "Process Group Name"))
            return read_raw_value(t, base, p, end, &comm_of(f)->pg_name, next);
        break;
    case 19:
        if (KEY_IS(k, kn, "Process Group Ranks"))
            return read_raw_value(t, base, p, end, &comm_of(f)->pg_ranks, next);
        break;
    case 20:
        if (KEY_IS(k, kn, "registers per thread"))
            return read_arg_int(t, base, p, end, &kernel_of(f)->regs, next);
        break;
    case 25:
        if (KEY_IS(k, kn, "Process Group Description"))
            return read_raw_value(t, base, p, end, &comm_of(f)->pg_desc, next);
        if (KEY_IS(k, kn, "est. achieved occupancy %"))
            return read_arg_float(t, base, p, end, &kernel_of(f)->occ, next);
        break;
    }
    return skip_value(t, base, p, end, next);
}

/* Generic "{ key: value, ... }" walker; calls member() for each key. */
typedef int (*member_fn)(st_tok *t, const char *base, const char *k, size_t kn,
                         const char *p, const char *end, event_fields *f, const char **next);

/* Always inlined, so each call site gets its member function inlined too. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int parse_object(st_tok *t, const char *base, const char *p, const char *end,
                               member_fn member, event_fields *f, const char **next)
{
    /* p points at '{' */
    p = skip_ws(p + 1, end);
    if (p >= end)
        return P_MORE;
    if (*p == '}') {
        *next = p + 1;
        return P_OK;
    }
    for (;;) {
        const char *k;
        size_t kn;
        if (p >= end)
            return P_MORE;
        if (*p != '"') {
            set_error(t, base, p, "expected a key string, found '%c'", *p);
            return P_ERR;
        }
        if (scan_string(p, end, &k, &kn, &p) != P_OK)
            return P_MORE;
        p = skip_ws(p, end);
        if (p >= end)
            return P_MORE;
        if (*p != ':') {
            set_error(t, base, p, "expected ':' after a key, found '%c'", *p);
            return P_ERR;
        }
        p = skip_ws(p + 1, end);
        if (p >= end)
            return P_MORE;
        int r = member(t, base, k, kn, p, end, f, &p);
        if (r != P_OK)
            return r;
        if (f->skip_rest)
            return skip_object_rest(t, base, p, end, next);
        p = skip_ws(p, end);
        if (p >= end)
            return P_MORE;
        if (*p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (*p == '}') {
            *next = p + 1;
            return P_OK;
        }
        set_error(t, base, p, "expected ',' or '}' in an object, found '%c'", *p);
        return P_ERR;
    }
}

static int args_member(st_tok *t, const char *base, const char *k, size_t kn, const char *p,
                       const char *end, event_fields *f, const char **next)
{
    return parse_arg(t, base, k, kn, p, end, f, next);
}

static int span_has_backslash(span sp)
{
    return sp.s && memchr(sp.s, '\\', sp.n) != NULL;
}

static int span_starts(span sp, const char *lit, size_t n)
{
    return sp.s && sp.n >= n && memcmp(sp.s, lit, n) == 0;
}

static int span_contains(span sp, const char *lit, size_t n)
{
    for (size_t i = 0; sp.s && i + n <= sp.n; i++)
        if (memcmp(sp.s + i, lit, n) == 0)
            return 1;
    return 0;
}

/* align_only: can align use this event?  Align reads only complete ("X")
 * events: kernels, kernel launches, the collective CPU ops (nccl:*,
 * record_param_comms, c10d::*) and user annotations -- the string classes of
 * streamtrace/align/collect.py, which this mirrors.  The ProfilerStep#N
 * ops (a few per rank) are kept too: the report marks the steps on its time
 * axis from them (streamtrace/steps.py).  Conservative: an event
 * whose phase, category or name is missing, or escaped, is kept (align's
 * own selection decides). */
static int align_wants(const event_fields *f)
{
    if (!f->ph.s || !f->cat.s || !f->name.s || !SPAN_IS(f->ph, "X"))
        return 1;
    span cat = f->cat, name = f->name;
    if (span_has_backslash(cat) || span_has_backslash(name))
        return 1;
    if (SPAN_IS(cat, "kernel") || SPAN_IS(cat, "Kernel"))
        return 1;
    if (SPAN_IS(cat, "cuda_runtime") || SPAN_IS(cat, "Runtime") || SPAN_IS(cat, "cuda_driver"))
        return (span_starts(name, "cu", 2) || span_starts(name, "hi", 2)) && span_contains(name, "Launch", 6) &&
               (span_contains(name, "Kernel", 6) || span_contains(name, "Graph", 5));
    if (SPAN_IS(cat, "user_annotation")) /* nccl:* ops, and the user labels around launches */
        return 1;
    if (SPAN_IS(cat, "cpu_op") || SPAN_IS(cat, "Operator"))
        return span_starts(name, "nccl:", 5) || SPAN_IS(name, "record_param_comms") ||
               span_starts(name, "c10d::", 6) || span_starts(name, "ProfilerStep#", 13);
    return 0;
}

/* once phase, category and name are known, an event align cannot use is skipped */
static inline void check_align(const st_tok *t, event_fields *f)
{
    if (t->opt.align_only && f->ph.s && f->cat.s && f->name.s && !align_wants(f))
        f->skip_rest = 1;
}

static int event_member(st_tok *t, const char *base, const char *k, size_t kn,
                        const char *p, const char *end, event_fields *f, const char **next)
{
    switch (kn) {
    case 1:
        if (*k == 's')
            return read_string_value(t, base, p, end, &f->s_scope, next);
        break;
    case 2:
        if (KEY_IS(k, kn, "ph")) {
            int r = read_string_value(t, base, p, end, &f->ph, next);
            if (r == P_OK && t->opt.drop_flows && is_flow(f->ph))
                f->skip_rest = 1;
            if (r == P_OK)
                check_align(t, f);
            return r;
        }
        if (KEY_IS(k, kn, "ts")) {
            span ignored = {0, 0};
            int r = read_int_value(t, base, p, end, 3, &f->ts, &ignored, next);
            f->has_ts = f->ts != ST_NONE;
            if (r == P_OK && ignored.s)
                f->string_times++;
            return r;
        }
        if (KEY_IS(k, kn, "id"))
            return read_int_value(t, base, p, end, 0, &f->id, &f->id_str, next);
        if (KEY_IS(k, kn, "bp"))
            return read_string_value(t, base, p, end, &f->bp, next);
        break;
    case 3:
        if (KEY_IS(k, kn, "cat")) {
            int r = read_string_value(t, base, p, end, &f->cat, next);
            if (r == P_OK && !t->opt.keep_pyfunc && SPAN_IS(f->cat, "python_function"))
                f->skip_rest = 1;
            if (r == P_OK)
                check_align(t, f);
            return r;
        }
        if (KEY_IS(k, kn, "pid"))
            return read_int_value(t, base, p, end, 0, &f->pid, &f->pid_str, next);
        if (KEY_IS(k, kn, "tid"))
            return read_int_value(t, base, p, end, 0, &f->tid, &f->tid_str, next);
        if (KEY_IS(k, kn, "dur")) {
            span ignored = {0, 0};
            int r = read_int_value(t, base, p, end, 3, &f->dur, &ignored, next);
            f->has_dur = f->dur != ST_NONE;
            if (r == P_OK && ignored.s)
                f->string_times++;
            return r;
        }
        break;
    case 4:
        if (KEY_IS(k, kn, "name")) {
            int r = read_string_value(t, base, p, end, &f->name, next);
            if (r == P_OK)
                check_align(t, f);
            return r;
        }
        if (KEY_IS(k, kn, "args") && p < end && *p == '{')
            return parse_object(t, base, p, end, args_member, f, next);
        break;
    }
    return skip_value(t, base, p, end, next);
}

static int wants_input_dims(span name)
{
    return (name.n >= 5 && memcmp(name.s, "nccl:", 5) == 0) ||
           (name.n >= 6 && memcmp(name.s, "c10d::", 6) == 0) ||
           SPAN_IS(name, "record_param_comms");
}

/* intern an optional span; ok stays 1 unless interning failed */
static uint32_t intern_opt(st_tok *t, const char *base, span sp, int *ok)
{
    if (!sp.s)
        return ST_NOSTR;
    uint32_t id = intern(t, base, sp.s, sp.n);
    if (id == ST_NOSTR)
        *ok = 0;
    return id;
}

/* int64 field -> int32 record field; absent or out of range -> -1 */
static inline int32_t to_int32(int64_t v)
{
    return v == ST_NONE || v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v;
}

static int commit_event(st_tok *t, const char *base, event_fields *f, st_tok_out *out)
{
    int ok = 1;
    st_event *e = &out->events[out->n_events];
    e->reserved = 0;
    e->ts = f->has_ts ? f->ts : 0;
    e->dur = f->has_dur ? f->dur : 0;
    e->flags = (uint16_t)((f->has_ts ? ST_F_HAS_TS : 0) | (f->has_dur ? ST_F_HAS_DUR : 0));
    e->ph = f->ph.n ? (uint8_t)f->ph.s[0] : 0;
    e->scope = f->s_scope.n ? (uint8_t)f->s_scope.s[0] : 0;
    if (f->bp.n == 1 && f->bp.s[0] == 'e')
        e->flags |= ST_F_BP_E;
    e->name = intern_opt(t, base, f->name, &ok);
    e->cat = intern_opt(t, base, f->cat, &ok);
    e->label = e->ph == 'M' ? intern_opt(t, base, f->label, &ok) : ST_NOSTR;
    if (f->pid_str.s) {
        e->pid = intern_opt(t, base, f->pid_str, &ok);
        e->flags |= ST_F_PID_STR;
    } else {
        e->pid = f->pid;
    }
    if (f->tid_str.s) {
        e->tid = intern_opt(t, base, f->tid_str, &ok);
        e->flags |= ST_F_TID_STR;
    } else {
        e->tid = f->tid;
    }
    if (f->id_str.s) {
        e->id = intern_opt(t, base, f->id_str, &ok);
        e->flags |= ST_F_ID_STR | ST_F_HAS_ID;
    } else {
        e->id = f->id;
        if (f->id != ST_NONE)
            e->flags |= ST_F_HAS_ID;
    }
    e->correlation = f->correlation;
    e->external_id = f->external_id;
    e->value = f->value;
    e->stream = to_int32(f->stream);
    e->device = to_int32(f->device);
    e->cbid = to_int32(f->cbid);

    uint32_t index = (uint32_t)t->counts.events_stored;
    if (f->has_kernel) {
        const kernel_fields *g = &f->kern;
        st_kernel *k = &out->kernels[out->n_kernels++];
        k->event = index;
        memcpy(k->grid, g->grid, sizeof k->grid);
        memcpy(k->block, g->block, sizeof k->block);
        k->registers_per_thread = to_int32(g->regs);
        k->shared_memory = to_int32(g->smem);
        k->blocks_per_sm = g->bpsm;
        k->warps_per_sm = g->wpsm;
        k->occupancy_pct = g->occ;
    }
    int dims = (f->input_dims.s || f->input_type.s) && wants_input_dims(f->name);
    if (f->has_comm || dims) {
        const comm_fields *m = comm_of(f);
        st_comm *c = &out->comms[out->n_comms++];
        memset(c, 0, sizeof *c);
        c->event = index;
        c->collective_name = intern_opt(t, base, m->coll, &ok);
        c->dtype = intern_opt(t, base, m->dtype, &ok);
        c->pg_name = intern_opt(t, base, m->pg_name, &ok);
        c->pg_desc = intern_opt(t, base, m->pg_desc, &ok);
        c->pg_ranks = intern_opt(t, base, m->pg_ranks, &ok);
        c->in_split = intern_opt(t, base, m->in_split, &ok);
        c->out_split = intern_opt(t, base, m->out_split, &ok);
        span none = {0, 0};
        c->input_dims = intern_opt(t, base, dims ? f->input_dims : none, &ok);
        c->input_type = intern_opt(t, base, dims ? f->input_type : none, &ok);
        c->comms_id = intern_opt(t, base, m->comms_id, &ok);
        c->in_nelems = m->in_nelems;
        c->out_nelems = m->out_nelems;
        c->group_size = m->group_size;
        c->pg_id = m->pg_id;
        c->seq = m->seq;
        c->rank = m->rank;
        c->dst_rank = to_int32(m->dst_rank);
        c->src_rank = to_int32(m->src_rank);
    }
    if (!ok)
        return P_ERR;
    out->n_events++;
    t->counts.events_stored++;
    return P_OK;
}

/* ------------------------------------------------------------- document */

static int store_meta(st_tok *t, const char *base, const char *k, size_t kn, const char *v,
                      size_t vn)
{
    if (st_members_add(&t->meta, k, kn, v, vn) == 0)
        return P_OK;
    set_error(t, base, k, "out of memory for top-level metadata");
    t->err_code = ST_ERR_NOMEM;
    return P_ERR;
}

static int out_full(const st_tok_out *out)
{
    return out->n_events >= out->events_cap || out->n_kernels >= out->kernels_cap ||
           out->n_comms >= out->comms_cap;
}

/* Parse one item in the current state.  *next is the end of the item. */
static int parse_item(st_tok *t, const char *base, const char *p, const char *end,
                      st_tok_out *out, const char **next)
{
    const char *k;
    size_t kn;
    int r;

    switch (t->state) {
    case S_START:
        if ((unsigned char)*p == 0xEF && end - p < 3)
            return P_MORE; /* maybe a UTF-8 BOM cut by the chunk boundary */
        if (end - p >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) /* UTF-8 BOM */
            p = skip_ws(p + 3, end);
        if (p >= end)
            return P_MORE;
        if (*p == '{') {
            t->state = S_ROOT_KEY;
        } else if (*p == '[') {
            t->state = S_EVENTS;
            t->bare_array = 1;
            t->saw_events = 1;
        } else {
            set_error(t, base, p, "not a trace: expected a JSON object or array");
            return P_ERR;
        }
        t->first_in_container = 1;
        *next = p + 1;
        return P_OK;

    case S_ROOT_KEY:
        if (*p == '}' && t->first_in_container) {
            t->state = S_DONE;
            *next = p + 1;
            return P_OK;
        }
        if (*p != '"') {
            set_error(t, base, p, "expected a key string in the top-level object, found '%c'", *p);
            return P_ERR;
        }
        if (scan_string(p, end, &k, &kn, &p) != P_OK)
            return P_MORE;
        p = skip_ws(p, end);
        if (p >= end)
            return P_MORE;
        if (*p != ':') {
            set_error(t, base, p, "expected ':' after a top-level key, found '%c'", *p);
            return P_ERR;
        }
        p = skip_ws(p + 1, end);
        if (p >= end)
            return P_MORE;
        t->first_in_container = 0;
        if (KEY_IS(k, kn, "traceEvents")) {
            if (*p != '[') {
                set_error(t, base, p, "not a trace: traceEvents is not an array");
                return P_ERR;
            }
            t->state = S_EVENTS;
            t->saw_events = 1;
            t->first_in_container = 1;
            *next = p + 1;
            return P_OK;
        }
        {
            const char *v = p;
            r = skip_value(t, base, p, end, next);
            if (st_is_log_member(k, kn) && *v == '[' &&
                !(r == P_OK && st_value_ends_member(*next, end))) {
                const char *e = NULL;
                int found = st_log_member_end(v, end, &e); /* maybe not valid JSON: see st_lex.h */
                if (found > 0) {
                    *next = e;
                    r = P_OK;
                    t->err_code = ST_OK;
                } else if (found < 0) {
                    t->err_code = ST_OK;
                    return P_MORE; /* its line is not all in the buffer yet */
                }
            }
            if (r != P_OK)
                return r;
            if (store_meta(t, base, k, kn, v, (size_t)(*next - v)) != P_OK)
                return P_ERR;
            t->state = S_ROOT_NEXT;
            return P_OK;
        }

    case S_ROOT_NEXT:
        if (*p == ',') {
            t->state = S_ROOT_KEY;
            *next = p + 1;
            return P_OK;
        }
        if (*p == '}') {
            t->state = S_DONE;
            *next = p + 1;
            return P_OK;
        }
        set_error(t, base, p, "expected ',' or '}' in the top-level object, found '%c'", *p);
        return P_ERR;

    case S_EVENTS:
        if (*p == ']' && t->first_in_container)
            goto close_events;
        if (*p != '{') {
            set_error(t, base, p, "expected an event object, found '%c'", *p);
            return P_ERR;
        }
        {
            /* only the fields before comm/kern: those two are set up when
             * a first such key is seen (copying all ~450 bytes per event
             * cost more than parsing the small events) */
            event_fields f;
            /* in two halves: one copy of this size compiles to "rep movsq",
             * whose start-up cost showed as ~5 % of tokenizing small events */
            memcpy(&f, &FIELDS_INIT, offsetof(event_fields, comm) / 2);
            memcpy((char *)&f + offsetof(event_fields, comm) / 2,
                   (const char *)&FIELDS_INIT + offsetof(event_fields, comm) / 2,
                   offsetof(event_fields, comm) - offsetof(event_fields, comm) / 2);
            r = parse_object(t, base, p, end, event_member, &f, next);
            if (r != P_OK)
                return r;
            t->first_in_container = 0;
            t->counts.events_seen++;
            t->counts.string_times += (uint64_t)f.string_times;
            t->state = S_EVENTS_NEXT;
            if (!t->opt.keep_pyfunc && SPAN_IS(f.cat, "python_function")) {
                t->counts.pyfunc_skipped++;
                return P_OK;
            }
            if (t->opt.drop_flows && is_flow(f.ph)) {
                t->counts.flows_skipped++;
                return P_OK;
            }
            if (t->opt.align_only && !align_wants(&f)) {
                t->counts.align_skipped++;
                return P_OK;
            }
            return commit_event(t, base, &f, out);
        }

    case S_EVENTS_NEXT:
        if (*p == ',') {
            t->state = S_EVENTS;
            *next = p + 1;
            return P_OK;
        }
        if (*p == ']')
            goto close_events;
        set_error(t, base, p, "expected ',' or ']' after an event, found '%c'", *p);
        return P_ERR;

    case S_DONE:
        set_error(t, base, p, "unexpected data after the end of the JSON document");
        return P_ERR;
    }
    set_error(t, base, p, "internal: bad tokenizer state");
    return P_ERR;

close_events:
    *next = p + 1;
    if (t->bare_array) {
        t->state = S_DONE;
    } else {
        t->state = S_ROOT_NEXT;
    }
    return P_OK;
}

int st_tok_feed(st_tok *t, const char *buf, size_t len, int eof, st_tok_out *out,
                size_t *consumed)
{
    const char *p = buf, *end = buf + len;
    int rc = ST_OK;
    *consumed = 0;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end) {
            if (t->state == S_DONE)
                rc = ST_DONE;
            else if (eof)
                rc = ST_TRUNCATED;
            break;
        }
        if (t->state == S_EVENTS && out_full(out)) {
            rc = ST_OUTPUT_FULL;
            break;
        }
        const char *next = p;
        int r = parse_item(t, buf, p, end, out, &next);
        if (r == P_ERR) {
            rc = t->err_code;
            break;
        }
        if (r == P_MORE) {
            rc = eof ? ST_TRUNCATED : ST_OK;
            break;
        }
        p = next;
    }
    /* consumption stops at the start of the first incomplete item */
    if (rc == ST_TRUNCATED || rc == ST_OK || rc == ST_OUTPUT_FULL || rc == ST_DONE) {
        size_t n = (size_t)(p - buf);
        *consumed = n;
        t->counts.bytes_consumed += n;
    }
    if (rc == ST_TRUNCATED) {
        t->err_offset = t->counts.bytes_consumed;
        snprintf(t->err, sizeof t->err, "truncated at byte %llu",
                 (unsigned long long)t->counts.bytes_consumed);
    }
    out->n_meta = t->meta.n;
    return rc;
}

/* ------------------------------------------------------------ lifecycle */

int st_tok_create(st_tok **out, const st_tok_options *options)
{
    st_tok *t = calloc(1, sizeof *t);
    *out = NULL;
    if (!t)
        return ST_ERR_NOMEM;
    if (options)
        t->opt = *options;
    if (!t->opt.max_depth)
        t->opt.max_depth = DEFAULT_MAX_DEPTH;
    if (!t->opt.max_string_bytes)
        t->opt.max_string_bytes = DEFAULT_MAX_STRING_BYTES;
    t->state = S_START;
    *out = t;
    return ST_OK;
}

void st_tok_destroy(st_tok *t)
{
    if (!t)
        return;
    st_members_free(&t->meta);
    free(t->arena);
    free(t->refs);
    free(t->slots);
    free(t);
}

const char *st_tok_error(const st_tok *t) { return t->err; }
uint64_t st_tok_error_offset(const st_tok *t) { return t->err_offset; }
void st_tok_get_counts(const st_tok *t, st_tok_counts *c)
{
    *c = t->counts;
    c->doc_started = t->state != S_START;
    c->saw_events = t->saw_events;
    c->bare_array = (uint32_t)t->bare_array;
    c->doc_done = t->state == S_DONE;
}
uint32_t st_tok_string_count(const st_tok *t) { return t->n_strings; }

int st_tok_string(const st_tok *t, uint32_t id, const char **ptr, size_t *len)
{
    if (id >= t->n_strings)
        return ST_ERR_SYNTAX;
    *ptr = t->arena + t->refs[id].offset;
    *len = t->refs[id].len;
    return ST_OK;
}

size_t st_tok_meta_count(const st_tok *t) { return t->meta.n; }

int st_tok_meta(const st_tok *t, size_t i, const char **key, size_t *key_len,
                const char **value, size_t *value_len)
{
    return st_members_get(&t->meta, i, key, key_len, value, value_len) == 0 ? ST_OK : ST_ERR_SYNTAX;
}

void st_tok_meta_clear(st_tok *t) { st_members_clear(&t->meta); }
