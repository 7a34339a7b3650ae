/*
 * st_pftrace: one rank's Perfetto protobuf encoder for `fuse -o x.pftrace`.
 *
 * The C twin of streamtrace/fuse/pftrace.py's RankEncoder (the reference):
 * it takes the rewriter's JSON output chunks (compact, strict JSON events,
 * each after a comma) and writes the same TracePacket bytes.  A chunk holding
 * anything this encoder does not reproduce exactly (an exponent in a time, a
 * phase with an odd name, a lone surrogate escape, a huge integer where a
 * number is used...) is refused whole with ST_PFT_UNSUPPORTED before any
 * state changes; the caller then exports the state (st_pft_export) and goes
 * on with the Python encoder.
 *
 * Memory: the chunk's parse and the output grow with the chunk; the
 * interning tables restart past max_interned entries (the reference's
 * MAX_INTERNED, 65,536); tracks are capped at ST_PFT_MAX_TRACKS.
 */
#ifndef ST_PFTRACE_H
#define ST_PFTRACE_H

#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define ST_PFT_OK 0
#define ST_PFT_UNSUPPORTED 1
#define ST_PFT_NOMEM -1
#define ST_PFT_LIMIT -2

typedef struct st_pft st_pft;

/* max_interned: entries before the interning tables restart (the reference's MAX_INTERNED) */
int st_pft_create(st_pft **out, uint32_t seq, int64_t max_interned);
void st_pft_destroy(st_pft *p);
/* Before the first feed: a known process (key: canonical pid, see
   pftrace.py _ckey) and the descriptor bytes after its uuid; a known
   thread (key: pid then tid) with its name and sort index (has_* = 0: none). */
int st_pft_add_process(st_pft *p, const uint8_t *key, size_t key_len, const uint8_t *rest, size_t rest_len);
int st_pft_add_thread(st_pft *p, const uint8_t *key, size_t key_len, int has_name, const uint8_t *name,
                      size_t name_len, int has_sort, int64_t sort);
/* One chunk; on ST_PFT_OK the packets are at *out (valid until the next call). */
int st_pft_feed(st_pft *p, const uint8_t *chunk, size_t len, const uint8_t **out, size_t *out_len);
/* slices, instants, counters, flow_events */
void st_pft_counts(st_pft *p, int64_t *counts4);
/* The skipped reasons in first-seen order: "reason\0" then an 8-byte count, repeated. */
int st_pft_skipped(st_pft *p, const uint8_t **out, size_t *out_len);
/* The state for the Python encoder to go on from (see pftrace.py _import). */
int st_pft_export(st_pft *p, const uint8_t **out, size_t *out_len);
/* CDEF END */

#define ST_PFT_MAX_TRACKS (1 << 22)

#endif
