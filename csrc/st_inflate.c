/*
 * Streaming gzip inflate on zlib, with multi-member support (concatenated
 * gzip files are valid gzip).  See st_tokenizer.h for the interface.
 */
#include "st_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

struct st_inflate {
    z_stream zs;
    int member_end;   /* the last call ended exactly at a member's end */
    int padding;      /* zero bytes after the last member (tape/tar padding): only zeros may follow */
    char err[160];
};

int st_inflate_create(st_inflate **out)
{
    st_inflate *inf = calloc(1, sizeof *inf);
    *out = NULL;
    if (!inf)
        return ST_ERR_NOMEM;
    /* 16 + MAX_WBITS: gzip wrapper only */
    if (inflateInit2(&inf->zs, 16 + MAX_WBITS) != Z_OK) {
        free(inf);
        return ST_ERR_NOMEM;
    }
    *out = inf;
    return ST_OK;
}

void st_inflate_destroy(st_inflate *inf)
{
    if (!inf)
        return;
    inflateEnd(&inf->zs);
    free(inf);
}

int st_inflate_run(st_inflate *inf, const unsigned char *in, size_t in_len,
                   unsigned char *out, size_t out_cap, size_t *in_used, size_t *out_made)
{
    z_stream *zs = &inf->zs;
    size_t used = 0, made = 0;
    int rc = ST_OK;
    *in_used = *out_made = 0;
    while (made < out_cap) {
        if (inf->member_end) {
            if (used == in_len)
                break; /* at a boundary, nothing more to read yet */
            if (inf->padding || in[used] == 0) {
                /* gzip -d ignores trailing zeros; anything else after them is an error */
                inf->padding = 1;
                while (used < in_len && in[used] == 0)
                    used++;
                if (used < in_len) {
                    snprintf(inf->err, sizeof inf->err, "data after the end of the gzip stream");
                    return ST_ERR_DATA;
                }
                break;
            }
            if (in[used] != 0x1f) {
                snprintf(inf->err, sizeof inf->err, "data after the end of the gzip stream");
                return ST_ERR_DATA;
            }
            inflateReset(zs);
            inf->member_end = 0;
        }
        /* zlib counts in uInt: feed at most 1 GiB per step */
        size_t in_step = in_len - used, out_step = out_cap - made;
        if (in_step > (1u << 30))
            in_step = 1u << 30;
        if (out_step > (1u << 30))
            out_step = 1u << 30;
        zs->next_in = (unsigned char *)(uintptr_t)(in + used);
        zs->avail_in = (uInt)in_step;
        zs->next_out = out + made;
        zs->avail_out = (uInt)out_step;
        int z = inflate(zs, Z_NO_FLUSH);
        used += in_step - zs->avail_in;
        made += out_step - zs->avail_out;
        if (z == Z_STREAM_END) {
            inf->member_end = 1;
            continue;
        }
        if (z == Z_BUF_ERROR || (z == Z_OK && zs->avail_in == 0 && used == in_len))
            break; /* needs more input (or more room) */
        if (z != Z_OK) {
            snprintf(inf->err, sizeof inf->err, "corrupt gzip data (%s)",
                     zs->msg ? zs->msg : "zlib error");
            return z == Z_MEM_ERROR ? ST_ERR_NOMEM : ST_ERR_DATA;
        }
    }
    *in_used = used;
    *out_made = made;
    if (inf->member_end && used == in_len)
        rc = ST_DONE;
    return rc;
}

int st_inflate_at_member_end(const st_inflate *inf) { return inf->member_end; }
const char *st_inflate_error(const st_inflate *inf) { return inf->err; }
