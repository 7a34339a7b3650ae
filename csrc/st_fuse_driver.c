/*
 * Standalone driver for the fuse rewriter (st_fuse.c), for sanitizer runs and
 * profiling; not part of the Python package.
 *
 *   st_fuse_driver [-s SEED] [-c MAX_CHUNK] [-b BUDGET] [-m MUTATIONS] FILE...
 *
 * A built-in document (nested duplicate keys), then each file (gzip sniffed),
 * is scanned and rewritten in pseudo-random chunk
 * sizes, with a small interval budget so sorted runs are spilled and merged
 * back in random chunk sizes, into a tiny output buffer grown on demand; then
 * MUTATIONS mutated copies of its first 256 KiB go through the same passes.
 * Prints one line per file.  Exit 0 when every input was fused or refused
 * with an error code; 2 on usage errors.  Memory errors abort under
 * AddressSanitizer/UBSan.
 *
 *   cc -std=c99 -O1 -g -fsanitize=address,undefined -Icsrc \
 *      csrc/st_fuse_driver.c csrc/st_fuse.c csrc/st_inflate.c -lz -o st_fuse_driver_asan
 */
#include "st_fuse.h"
#include "st_tokenizer.h" /* st_inflate */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long rng_state = 88172645463325252ull;
static size_t next_rand(size_t max)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return 1 + (size_t)(rng_state % max);
}

typedef struct {
    char **data;
    size_t *n;
    size_t count, record_size;
} runs;

static void take_run(st_fuse *f, runs *r)
{
    const void *p;
    size_t n, size;
    if (st_fuse_take_run(f, &p, &n, &size) != ST_FUSE_OK)
        return;
    r->data = realloc(r->data, (r->count + 1) * sizeof *r->data);
    r->n = realloc(r->n, (r->count + 1) * sizeof *r->n);
    r->data[r->count] = malloc(n * size + 1);
    memcpy(r->data[r->count], p, n * size);
    r->n[r->count++] = n;
    r->record_size = size;
}

/* One pass over doc in random chunks; returns the last status. */
static int pass(st_fuse *f, const char *doc, size_t len, size_t max_chunk, int write, runs *r,
                unsigned long long *written)
{
    size_t out_cap = 16, pos = 0, have = 0, consumed;
    char *out = malloc(out_cap);
    char *buf = malloc(len + 1);
    st_fuse_out o;
    memset(&o, 0, sizeof o);
    int rc, want_input = 1, stuck = 0;
    for (;;) {
        /* new input only when the scanner asked for it; when the buffered
         * bytes hold one unfinished item (it consumed nothing), at least
         * double them, as the Python side does, so restarts cost O(item) */
        size_t add = want_input ? next_rand(max_chunk) : 0;
        if (stuck && add < have)
            add = have;
        if (add > len - pos - have)
            add = len - pos - have;
        have += add;
        memcpy(buf, doc + pos, have); /* the unconsumed tail, then the new bytes */
        int eof = pos + have >= len;
        o.buf = out;
        o.cap = out_cap;
        o.len = 0;
        rc = st_fuse_feed(f, buf, have, eof, write ? &o : NULL, &consumed);
        if (rc < 0)
            break;
        pos += consumed;
        have -= consumed;
        *written += o.len;
        want_input = rc == ST_FUSE_OK || rc == ST_FUSE_DONE;
        stuck = rc == ST_FUSE_OK && consumed == 0;
        if (rc == ST_FUSE_RUN)
            take_run(f, r);
        else if (rc == ST_FUSE_OUTPUT_SMALL)
            out = realloc(out, out_cap *= 2);
        else if (rc == ST_FUSE_NAME)
            st_fuse_decide_name(f, 1);
        else if (rc == ST_FUSE_TRUNCATED || (rc == ST_FUSE_DONE && eof) || (rc == ST_FUSE_OK && eof))
            break;
    }
    free(buf);
    free(out);
    return rc;
}

static int fuse_doc(const char *doc, size_t len, size_t max_chunk, uint32_t budget,
                    unsigned long long *events, unsigned long long *written, const char **err)
{
    st_fuse_config c;
    memset(&c, 0, sizeof c);
    c.rank = 3;
    c.id_offset = 3000000;
    c.ts_shift_ns = (int64_t)next_rand(1u << 30) - (1 << 29);
    c.flags = ST_FUSE_COMMA_FIRST | ST_FUSE_KEEP_PYFUNC | (next_rand(2) == 1 ? ST_FUSE_NAME_FILTER : 0);
    c.interval_budget = budget;
    st_fuse *f;
    if (st_fuse_create(&f, &c) != ST_FUSE_OK)
        return ST_FUSE_ERR_NOMEM;
    runs r = {NULL, NULL, 0, 0};
    int rc = pass(f, doc, len, max_chunk, 0, &r, written);
    if (rc >= 0) {
        int s = st_fuse_finish_scan(f);
        while (s == ST_FUSE_RUN) {
            take_run(f, &r);
            s = st_fuse_finish_scan(f);
        }
        if (s == ST_FUSE_MERGE) {
            size_t *at = calloc(r.count + 1, sizeof *at), need;
            st_fuse_merge_begin(f, r.count);
            while ((s = st_fuse_merge(f, &need)) == ST_FUSE_NEED_RUN) {
                size_t k = next_rand(64);
                if (k > r.n[need] - at[need])
                    k = r.n[need] - at[need];
                st_fuse_merge_feed(f, need, r.data[need] + at[need] * r.record_size, k,
                                   at[need] + k >= r.n[need]);
                at[need] += k;
            }
            free(at);
        }
        rc = s < 0 ? s : rc;
        for (size_t t = 0; rc >= 0 && t < st_fuse_track_count(f); t++)
            st_fuse_set_lane_base(f, t, 1000000 + 100 * (int64_t)t);
        if (rc >= 0 && st_fuse_begin(f, ST_FUSE_MODE_WRITE) == ST_FUSE_OK)
            rc = pass(f, doc, len, max_chunk, 1, &r, written);
    }
    st_fuse_stats st;
    st_fuse_get_stats(f, &st);
    *events = st.events_kept;
    if (rc < 0) {
        static char msg[300];
        snprintf(msg, sizeof msg, "%s", st_fuse_error(f));
        *err = msg;
    }
    for (size_t i = 0; i < r.count; i++)
        free(r.data[i]);
    free(r.data);
    free(r.n);
    st_fuse_destroy(f);
    return rc;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *raw = malloc(cap);
    size_t got;
    while ((got = fread(raw + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            raw = realloc(raw, cap *= 2);
    }
    fclose(f);
    if (n < 2 || (unsigned char)raw[0] != 0x1f || (unsigned char)raw[1] != 0x8b) {
        *len = n;
        return raw;
    }
    st_inflate *inf;
    st_inflate_create(&inf);
    size_t out_cap = 4 * n + 4096, out_len = 0, in_pos = 0;
    char *out = malloc(out_cap);
    for (;;) {
        if (out_len == out_cap)
            out = realloc(out, out_cap *= 2);
        size_t used, made;
        int r = st_inflate_run(inf, (unsigned char *)raw + in_pos, n - in_pos,
                               (unsigned char *)out + out_len, out_cap - out_len, &used, &made);
        in_pos += used;
        out_len += made;
        if (r < 0 || (used == 0 && made == 0))
            break;
    }
    st_inflate_destroy(inf);
    free(raw);
    *len = out_len;
    return out;
}

/* written over random places of mutated copies: escapes the rewriter
 * repairs (lone surrogates, pairs, cut escapes) and keys given twice */
static const char *const SNIPPETS[] = {
    "\\ud800", "\\udc00", "\\udbff\\udfff", "\\ud800\\u", "\\ud800\\ud800", "\\ud83d\\ude00",
    "\"ph\":\"X\",\"ph\":", "\"args\":{},\"args\":", "\"a\":1,\"a\":2,\"a\":",
    "\"k\":{\"k\":1,\"\\u006b\":[{\"k\":2,\"k\":3}]},\"\\u006B\":", "\"\\u0061rgs\":", "\"p\\u0069d\":",
    "\"\\ud800\":1,\"\\ufffd\":", "\"\\/\":1,\"/\":",
};

/* Events whose args nest objects with repeated keys, as written and equal
 * only once decoded, one of them too large for the pairwise check: the
 * duplicate checks at every depth, which the corpus may not reach. */
static char *nested_doc(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *d = malloc(cap);
    n += (size_t)snprintf(d + n, cap - n, "{\"traceEvents\":[");
    for (int e = 0; e < 20; e++) {
        n += (size_t)snprintf(d + n, cap - n,
                              "%s{\"ph\":\"X\",\"name\":\"n%d\",\"pid\":1,\"tid\":1,\"ts\":%d,\"dur\":3,"
                              "\"\\u0061rgs\":{\"e\":{\"\\u0061\":1, \"a\":[{\"b\":1,\"\\u0062\":{\"c\":1,\"c\":%d}}]},\"o\":{",
                              e ? "," : "", e, 10 * e, e);
        for (int k = 0; k < 40 + e; k++)
            n += (size_t)snprintf(d + n, cap - n, "%s\"k%d\":%d", k ? "," : "", k % 25, k);
        n += (size_t)snprintf(d + n, cap - n, "}}}");
    }
    n += (size_t)snprintf(d + n, cap - n, "]}");
    *len = n;
    return d;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t max_chunk = 1 << 16;
    uint32_t budget = 97;
    int mutations = 50;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i += 2) {
        if (i + 1 >= argc)
            return 2;
        if (!strcmp(argv[i], "-s"))
            rng_state ^= strtoull(argv[i + 1], NULL, 10) * 0x9e3779b97f4a7c15ull;
        else if (!strcmp(argv[i], "-c"))
            max_chunk = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-b"))
            budget = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-m"))
            mutations = atoi(argv[i + 1]);
        else
            return 2;
    }
    if (i >= argc || max_chunk == 0) {
        fprintf(stderr, "usage: st_fuse_driver [-s SEED] [-c MAX_CHUNK] [-b BUDGET] [-m MUTATIONS] FILE...\n");
        return 2;
    }
    for (int builtin = 1; i < argc; i += !builtin, builtin = 0) {
        size_t len;
        const char *name = builtin ? "(nested duplicate keys)" : argv[i];
        char *doc = builtin ? nested_doc(&len) : read_file(argv[i], &len);
        if (!doc) {
            perror(argv[i]);
            continue;
        }
        unsigned long long events = 0, written = 0;
        const char *err = NULL;
        int rc = fuse_doc(doc, len, max_chunk, budget, &events, &written, &err);
        if (rc < 0)
            printf("%s: error %d: %s\n", name, rc, err);
        else
            printf("%s: status %d, %llu events, %llu bytes written\n", name, rc, events, written);
        size_t small = len < (256u << 10) ? len : (256u << 10);
        char *m = malloc(small + 1);
        int refused = 0;
        for (int k = 0; k < mutations && small; k++) {
            memcpy(m, doc, small);
            for (size_t j = next_rand(6); j > 0; j--)
                m[next_rand(small) - 1] = (char)next_rand(256);
            for (size_t j = next_rand(3) - 1; j > 0; j--) { /* surrogates and repeated keys */
                const char *sn = SNIPPETS[next_rand(sizeof SNIPPETS / sizeof *SNIPPETS) - 1];
                size_t sl = strlen(sn), at = next_rand(small) - 1;
                if (at + sl <= small)
                    memcpy(m + at, sn, sl);
            }
            size_t cut = next_rand(small);
            refused += fuse_doc(m, cut, 1 + next_rand(4096), (uint32_t)next_rand(50), &events, &written, &err) < 0;
        }
        if (mutations)
            printf("%s: %d mutations, %d refused with an error code\n", name, mutations, refused);
        free(m);
        free(doc);
    }
    return 0;
}
