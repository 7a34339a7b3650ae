/*
 * SIMD structural scanner: see st_scan.h.
 */
#include "st_scan.h"

#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define ST_SCAN_X86 1
#include <immintrin.h>
#endif

int st_scan_path = ST_SCAN_OFF;

int st_scan_supported(int path)
{
    if (path == ST_SCAN_OFF)
        return 1;
#if defined(ST_SCAN_X86)
    __builtin_cpu_init();
    if (path == ST_SCAN_AVX2)
        return __builtin_cpu_supports("avx2") != 0;
    if (path == ST_SCAN_AVX512)
        return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0;
#endif
    return 0;
}

int st_scan_best(void)
{
    if (st_scan_supported(ST_SCAN_AVX512))
        return ST_SCAN_AVX512;
    if (st_scan_supported(ST_SCAN_AVX2))
        return ST_SCAN_AVX2;
    return ST_SCAN_OFF;
}

int st_scan_set(int path)
{
    if (path == ST_SCAN_AUTO)
        path = st_scan_best();
    if (!st_scan_supported(path))
        return -1;
    if (st_scan_path != path) /* written only on a change: tokenizers in other threads read it */
        st_scan_path = path;
    return 0;
}

int st_scan_get(void) { return st_scan_path; }

/* The byte loops: the tails shorter than a vector, and the OFF path here. */
static const char *qb_bytes(const char *p, const char *end)
{
    while (p < end && *p != '"' && *p != '\\')
        p++;
    return p;
}

static void masks_bytes(const char *p, uint64_t *bs, uint64_t *q, uint64_t *br)
{
    uint64_t b = 0, u = 0, k = 0;
    for (int i = 0; i < 64; i++) {
        char c = p[i];
        b |= (uint64_t)(c == '\\') << i;
        u |= (uint64_t)(c == '"') << i;
        k |= (uint64_t)(c == '{' || c == '}' || c == '[' || c == ']') << i;
    }
    *bs = b;
    *q = u;
    *br = k;
}

#if defined(ST_SCAN_X86)

/* ------------------------------------------------------------------ AVX2 */

__attribute__((target("avx2"))) static const char *qb_avx2(const char *p, const char *end)
{
    const __m256i quote = _mm256_set1_epi8('"'), bslash = _mm256_set1_epi8('\\');
    while (end - p >= 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
        unsigned m = (unsigned)_mm256_movemask_epi8(
            _mm256_or_si256(_mm256_cmpeq_epi8(v, quote), _mm256_cmpeq_epi8(v, bslash)));
        if (m)
            return p + __builtin_ctz(m);
        p += 32;
    }
    return qb_bytes(p, end);
}

/* '{' and '[' differ from '}' and ']' only in bit 0x20: clearing it folds
 * four compares into two. */
__attribute__((target("avx2"))) static void masks_avx2(const char *p, uint64_t *bs, uint64_t *q,
                                                      uint64_t *br)
{
    const __m256i quote = _mm256_set1_epi8('"'), bslash = _mm256_set1_epi8('\\');
    const __m256i fold = _mm256_set1_epi8((char)0xDF), open = _mm256_set1_epi8('['),
                  close = _mm256_set1_epi8(']');
    uint64_t b = 0, u = 0, k = 0;
    for (int i = 0; i < 2; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
        __m256i f = _mm256_and_si256(v, fold);
        b |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, bslash)) << (32 * i);
        u |= (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, quote)) << (32 * i);
        k |= (uint64_t)(uint32_t)_mm256_movemask_epi8(
                 _mm256_or_si256(_mm256_cmpeq_epi8(f, open), _mm256_cmpeq_epi8(f, close)))
             << (32 * i);
    }
    *bs = b;
    *q = u;
    *br = k;
}

/* ------------------------------------------------------------- AVX-512BW */

__attribute__((target("avx512f,avx512bw"))) static const char *qb_avx512(const char *p, const char *end)
{
    const __m512i quote = _mm512_set1_epi8('"'), bslash = _mm512_set1_epi8('\\');
    while (end - p >= 64) {
        __m512i v = _mm512_loadu_si512((const void *)p);
        uint64_t m = _mm512_cmpeq_epi8_mask(v, quote) | _mm512_cmpeq_epi8_mask(v, bslash);
        if (m)
            return p + __builtin_ctzll(m);
        p += 64;
    }
    return qb_bytes(p, end);
}

__attribute__((target("avx512f,avx512bw"))) static void masks_avx512(const char *p, uint64_t *bs,
                                                                    uint64_t *q, uint64_t *br)
{
    __m512i v = _mm512_loadu_si512((const void *)p);
    __m512i f = _mm512_and_si512(v, _mm512_set1_epi8((char)0xDF));
    *bs = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\\'));
    *q = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('"'));
    *br = _mm512_cmpeq_epi8_mask(f, _mm512_set1_epi8('[')) | _mm512_cmpeq_epi8_mask(f, _mm512_set1_epi8(']'));
}

#endif /* ST_SCAN_X86 */

const char *st_scan_quote_or_backslash(const char *p, const char *end)
{
#if defined(ST_SCAN_X86)
    if (st_scan_path == ST_SCAN_AVX512)
        return qb_avx512(p, end);
    if (st_scan_path == ST_SCAN_AVX2)
        return qb_avx2(p, end);
#endif
    return qb_bytes(p, end);
}

void st_scan_masks64(const char *p, uint64_t *bs, uint64_t *q, uint64_t *br)
{
#if defined(ST_SCAN_X86)
    if (st_scan_path == ST_SCAN_AVX512) {
        masks_avx512(p, bs, q, br);
        return;
    }
    if (st_scan_path == ST_SCAN_AVX2) {
        masks_avx2(p, bs, q, br);
        return;
    }
#endif
    masks_bytes(p, bs, q, br);
}
