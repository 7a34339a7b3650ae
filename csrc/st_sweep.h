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

/* Indices (increasing) of the intervals q (any order; empty ones too) that
 * meet the disjoint sorted union U: some u with u_start < q_end and
 * u_end > q_start.  out needs room for nq; *out_n is how many.  O(nq + nu)
 * when the queries come sorted by start, O(nq log nu) otherwise. */
int st_meeting_union(const int64_t *q_starts, const int64_t *q_ends, size_t nq,
                     const int64_t *u_starts, const int64_t *u_ends, size_t nu,
                     int64_t *out, size_t *out_n);

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
#define ST_SWEEP_SMALL -12    /* a caller-provided buffer is too small */
#define ST_SWEEP_RANGE -13    /* an index or code is out of range */

/* Codes for n rows of `width` int64 values: equal rows get equal codes,
 * numbered 0, 1, ... in order of first appearance (as pandas.factorize).
 * table: table_cap int64 slots, a power of two >= 2n (overwritten).
 * first[c] = index of the first row with code c (room for n).
 * *n_codes = the number of distinct rows. */
int st_factorize_rows(const int64_t *rows, size_t n, size_t width,
                      int64_t *table, size_t table_cap,
                      int64_t *codes, int64_t *first, size_t *n_codes);

/* Baseline medians across windows of kernels.  Kernel j has start[j],
 * end[j] and code[j] in [0, n_codes).  A window (lo, hi, t) is the kernels j
 * in [lo, hi) with end[j] > t.  Query q is the window (q_lo[q], q_hi[q],
 * q_t[q]) with the reference windows r_* [ref_ptr[q], ref_ptr[q + 1]).
 * For every kernel j of query q's window, in order, writes out_kernel[k] = j
 * and out_median[k] = the median of end - start over the kernels of the
 * query's reference windows with the same code (the mean of the two middle
 * values for an even count, as numpy.median), NaN when there is none;
 * query q's kernels are out_ptr[q] .. out_ptr[q + 1].
 * Scratch: count, slot and median (n_codes each; count zero on entry, left
 * zero), bucket (bucket_cap >= the kernels of any query's reference
 * windows), touched (touched_cap >= the kernels of any query window). */
int st_window_medians(const int64_t *start, const int64_t *end, const int64_t *code, size_t n, size_t n_codes,
                      const int64_t *q_lo, const int64_t *q_hi, const int64_t *q_t, size_t nq,
                      const int64_t *ref_ptr, const int64_t *r_lo, const int64_t *r_hi, const int64_t *r_t,
                      size_t n_refs,
                      int64_t *count, int64_t *slot, double *median, int64_t *bucket, size_t bucket_cap,
                      int64_t *touched, size_t touched_cap,
                      int64_t *out_kernel, double *out_median, size_t out_cap, int64_t *out_ptr);

/* Self time of the innermost interval, for windows over n intervals sorted
 * by start.  Query q takes the intervals i in [q_a[q], q_b[q]) with
 * end[i] > q_lo[q] and the window [q_lo[q], q_hi[q]), cut at its ends and at
 * every start and end clipped to it; each piece [x, y) goes to the covering
 * interval (start <= x and end >= y) of least duration, the lowest index on
 * ties.  For every interval with a non-zero total, in order, writes out_q,
 * out_i (its index), out_self (its total) and out_first (the x of its first
 * piece); *out_n is the count.  Scratch: sel and heap (scratch_cap each),
 * acc (2 * scratch_cap), cuts (2 * scratch_cap + 2), scratch_cap >= every
 * q_b - q_a; out_cap >= the sum of q_b - q_a. */
int st_innermost(const int64_t *start, const int64_t *end, size_t n,
                 const int64_t *q_a, const int64_t *q_b, const int64_t *q_lo, const int64_t *q_hi, size_t nq,
                 int64_t *sel, int64_t *heap, int64_t *acc, int64_t *cuts, size_t scratch_cap,
                 int64_t *out_q, int64_t *out_i, int64_t *out_self, int64_t *out_first, size_t out_cap,
                 size_t *out_n);
/* CDEF END */

#endif
