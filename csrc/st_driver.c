/*
 * Standalone driver for the C core: tokenizes files (gzip sniffed) with
 * pseudo-random chunk sizes.  Used for sanitizer runs (make sanitize) and
 * profiling; not part of the Python package.
 *
 *   st_driver [-s SEED] [-q] FILE...
 * Exit 0 when every file was tokenized or refused with an error code, 2 on
 * usage errors.  Prints one line per file: status, events, bytes.
 */
#include "st_tokenizer.h"
#include "st_sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_CAP 4096

static unsigned long long rng_state = 88172645463325252ull;
static size_t next_chunk(size_t max)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return 1 + (size_t)(rng_state % max);
}

static st_event events[OUT_CAP];
static st_kernel kernels[OUT_CAP];
static st_comm comms[OUT_CAP];

static int run_file(const char *path, size_t max_chunk)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    st_tok *tok;
    st_tok_create(&tok, NULL);
    st_inflate *inf = NULL;
    unsigned char head[2] = {0, 0};
    size_t got = fread(head, 1, 2, f);
    int gz = got == 2 && head[0] == 0x1f && head[1] == 0x8b;
    rewind(f);
    if (gz)
        st_inflate_create(&inf);

    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    unsigned char in[1 << 15];
    size_t in_len = 0, in_pos = 0;
    int eof = 0, rc = ST_OK;
    unsigned long long events_total = 0;
    st_tok_out out = {events, OUT_CAP, 0, kernels, OUT_CAP, 0, comms, OUT_CAP, 0};
    for (;;) {
        /* fill buf with up to a random number of new bytes */
        size_t want = next_chunk(max_chunk);
        if (len + want > cap) {
            while (len + want > cap)
                cap *= 2;
            buf = realloc(buf, cap);
        }
        size_t added = 0;
        while (added < want && !eof) {
            if (in_pos == in_len) {
                in_len = fread(in, 1, next_chunk(sizeof in), f);
                in_pos = 0;
                if (in_len == 0) {
                    eof = 1;
                    break;
                }
            }
            if (inf) {
                size_t used, made;
                int r = st_inflate_run(inf, in + in_pos, in_len - in_pos,
                                       (unsigned char *)buf + len + added, want - added, &used, &made);
                if (r < 0) {
                    printf("%s: inflate error: %s\n", path, st_inflate_error(inf));
                    rc = r;
                    goto done;
                }
                in_pos += used;
                added += made;
                if (used == 0 && made == 0)
                    break;
            } else {
                size_t n = in_len - in_pos < want - added ? in_len - in_pos : want - added;
                memcpy(buf + len + added, in + in_pos, n);
                in_pos += n;
                added += n;
            }
        }
        len += added;
        for (;;) {
            size_t consumed;
            rc = st_tok_feed(tok, buf, len, eof, &out, &consumed);
            memmove(buf, buf + consumed, len - consumed);
            len -= consumed;
            events_total += out.n_events;
            out.n_events = out.n_kernels = out.n_comms = 0;
            if (rc != ST_OUTPUT_FULL)
                break;
        }
        if (rc < 0 || rc == ST_DONE || rc == ST_TRUNCATED)
            break;
    }
done:
    if (rc < 0)
        printf("%s: error %d at byte %llu: %s\n", path, rc,
               (unsigned long long)st_tok_error_offset(tok), st_tok_error(tok));
    else
        printf("%s: status %d, %llu events, %u strings\n", path, rc, events_total,
               st_tok_string_count(tok));
    free(buf);
    st_inflate_destroy(inf);
    st_tok_destroy(tok);
    fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    size_t max_chunk = 1 << 16;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-s") == 0 && i + 1 < argc)
            rng_state = strtoull(argv[++i], NULL, 10) | 1;
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            max_chunk = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: st_driver [-s SEED] [-c MAX_CHUNK] FILE...\n");
            return 2;
        }
    }
    if (max_chunk == 0)
        max_chunk = 1;
    for (; i < argc; i++)
        run_file(argv[i], max_chunk);
    return 0;
}
