/*
 * Interval sweeps over caller-owned arrays of half-open [start, end) integer
 * nanosecond intervals.  Inputs must be sorted by start (callers sort with
 * numpy); functions check that and return ST_SWEEP_UNSORTED otherwise.
 */
#ifndef ST_SWEEP_H
#define ST_SWEEP_H

#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define ST_SWEEP_OK 0
#define ST_SWEEP_UNSORTED -10
#define ST_SWEEP_BAD_INTERVAL -11

/* Merge intervals into their disjoint, sorted union.  out_* need room for n.
 * Empty intervals (end <= start) are dropped. */
int st_union(const int64_t *starts, const int64_t *ends, size_t n,
             int64_t *out_starts, int64_t *out_ends, size_t *out_n);

/* For each query interval q (any order), the length of q ∩ U where U is a
 * disjoint sorted union (from st_union).  O(nq log nu). */
int st_overlap_with_union(const int64_t *q_starts, const int64_t *q_ends, size_t nq,
                          const int64_t *u_starts, const int64_t *u_ends, size_t nu,
                          int64_t *out_overlap);

/* Resumable enumeration of intersecting pairs between queries A (any order)
 * and intervals B sorted by start.  b_prefix_max_end[j] must be the maximum
 * end of B[0..j] (st_prefix_max computes it).  Writes (a index, b index,
 * intersection length) triples until cap is reached; *a_pos / *b_pos carry
 * the position between calls (start both at 0).  Returns the number of pairs
 * written; the enumeration is finished when *a_pos == na. */
size_t st_pairs(const int64_t *a_starts, const int64_t *a_ends, size_t na,
                const int64_t *b_starts, const int64_t *b_ends,
                const int64_t *b_prefix_max_end, size_t nb,
                int64_t *out_a, int64_t *out_b, int64_t *out_len, size_t cap,
                size_t *a_pos, size_t *b_pos);

int st_prefix_max(const int64_t *starts, const int64_t *ends, size_t n, int64_t *out);
/* CDEF END */

#endif
