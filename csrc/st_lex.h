/*
 * Lexing helpers shared by the tokenizer (st_tokenizer.c) and the fuse
 * rewriter (st_fuse.c): whitespace skipping, the bytes a bare JSON scalar may
 * contain, powers of ten, and the byte hash (also used by st_sweep.c to
 * number kernel identities).  Header-only (static inline), no state.
 */
#ifndef ST_LEX_H
#define ST_LEX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* First non-whitespace byte in [p, end), or end. */
static inline const char *st_skip_ws(const char *p, const char *end)
{
    if (p < end && (unsigned char)*p > ' ')
        return p; /* the common cases: no whitespace, or one space */
    if (end - p >= 2 && *p == ' ' && (unsigned char)p[1] > ' ')
        return p + 1;
#if defined(__SSE2__)
    while (end - p >= 16) { /* pretty-printed JSON: newline + indentation */
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')),
                                               _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'))),
                                  _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\r')),
                                               _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'))));
        unsigned m = ~(unsigned)_mm_movemask_epi8(ws) & 0xFFFFu;
        if (m)
            return p + __builtin_ctz(m);
        p += 16;
    }
#endif
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* Bytes that may continue a number or a bare word (true, NaN, Infinity...). */
static const unsigned char ST_SCALAR_CHAR[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1,
    ['7'] = 1, ['8'] = 1, ['9'] = 1, ['-'] = 1, ['+'] = 1, ['.'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1,
    ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1,
    ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1,
    ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1,
    ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1,
    ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1,
    ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1, ['_'] = 1,
};

static const int64_t ST_POW10[19] = {
    1LL, 10LL, 100LL, 1000LL, 10000LL, 100000LL, 1000000LL, 10000000LL, 100000000LL,
    1000000000LL, 10000000000LL, 100000000000LL, 1000000000000LL, 10000000000000LL,
    100000000000000LL, 1000000000000000LL, 10000000000000000LL, 100000000000000000LL,
    1000000000000000000LL};

/* FNV-1a over 8-byte words, then a final mix. */
static inline uint64_t st_hash_bytes(const char *s, size_t n, uint64_t seed)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/*
 * Kineto's top-level log members ("WARNING": [...], "ERROR": [...]; removed
 * in 2026 by kineto#1460) held log lines that Kineto did not escape before
 * kineto#1453: a double quote in a message makes the value invalid JSON.
 * Kineto writes each such member on a line of its own and its messages never
 * hold a newline, so the value [v, ...) -- v at its '[' -- ends at the last
 * ']' of that line followed (after whitespace) by ',' or '}'.  Returns 1
 * with *vend after that ']', 0 when the line has no such ']', -1 when the
 * line is not complete in [v, end) (more input needed).
 */
static inline int st_is_log_member(const char *k, size_t kn)
{
    return (kn == 7 && memcmp(k, "WARNING", 7) == 0) || (kn == 5 && memcmp(k, "ERROR", 5) == 0);
}

static inline int st_log_member_end(const char *v, const char *end, const char **vend)
{
    const char *nl = memchr(v, '\n', (size_t)(end - v));
    if (!nl)
        return -1;
    for (const char *q = nl; q > v; q--) {
        if (q[-1] != ']')
            continue;
        const char *a = st_skip_ws(q, end);
        if (a >= end)
            return -1;
        if (*a == ',' || *a == '}') {
            *vend = q;
            return 1;
        }
    }
    return 0;
}

/* Whether a value that ends at `vend` ends its member cleanly: ',' or '}'
 * follows.  (A valid value always does; the line rule above is for the rest.) */
static inline int st_value_ends_member(const char *vend, const char *end)
{
    const char *a = st_skip_ws(vend, end);
    return a < end && (*a == ',' || *a == '}');
}

#endif
