/* Interval sweeps.  See st_sweep.h. */
#include "st_sweep.h"
#include "st_lex.h"

#include <math.h>
#include <stdlib.h>

static int check_sorted(const int64_t *starts, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (starts[i] < starts[i - 1])
            return 0;
    return 1;
}

/* a disjoint sorted union, as st_union makes */
static int check_union(const int64_t *u_starts, const int64_t *u_ends, size_t nu)
{
    for (size_t j = 1; j < nu; j++)
        if (u_starts[j] < u_ends[j - 1] || u_ends[j] < u_ends[j - 1])
            return 0;
    return 1;
}

int st_union(const int64_t *starts, const int64_t *ends, size_t n,
             int64_t *out_starts, int64_t *out_ends, size_t *out_n)
{
    size_t m = 0;
    *out_n = 0;
    if (!check_sorted(starts, n))
        return ST_SWEEP_UNSORTED;
    for (size_t i = 0; i < n; i++) {
        if (ends[i] <= starts[i])
            continue;
        if (m && starts[i] <= out_ends[m - 1]) {
            if (ends[i] > out_ends[m - 1])
                out_ends[m - 1] = ends[i];
        } else {
            out_starts[m] = starts[i];
            out_ends[m] = ends[i];
            m++;
        }
    }
    *out_n = m;
    return ST_SWEEP_OK;
}

/* first index j with u_ends[j] > x (u_ends is increasing for a union) */
static size_t first_end_after(const int64_t *u_ends, size_t nu, int64_t x)
{
    size_t lo = 0, hi = nu;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (u_ends[mid] > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int st_overlap_with_union(const int64_t *q_starts, const int64_t *q_ends, size_t nq,
                          const int64_t *u_starts, const int64_t *u_ends, size_t nu,
                          int64_t *out_overlap)
{
    if (!check_union(u_starts, u_ends, nu))
        return ST_SWEEP_UNSORTED;
    for (size_t i = 0; i < nq; i++) {
        int64_t s = q_starts[i], e = q_ends[i], total = 0;
        for (size_t j = first_end_after(u_ends, nu, s); j < nu && u_starts[j] < e; j++) {
            int64_t lo = u_starts[j] > s ? u_starts[j] : s;
            int64_t hi = u_ends[j] < e ? u_ends[j] : e;
            if (hi > lo)
                total += hi - lo;
        }
        out_overlap[i] = total;
    }
    return ST_SWEEP_OK;
}

int st_meeting_union(const int64_t *q_starts, const int64_t *q_ends, size_t nq,
                     const int64_t *u_starts, const int64_t *u_ends, size_t nu,
                     int64_t *out, size_t *out_n)
{
    size_t m = 0, j = 0;
    *out_n = 0;
    if (!check_union(u_starts, u_ends, nu))
        return ST_SWEEP_UNSORTED;
    for (size_t i = 0; i < nq; i++) {
        int64_t s = q_starts[i];
        if (i && s >= q_starts[i - 1]) {   /* sorted so far: walk on from the last window */
            while (j < nu && u_ends[j] <= s)
                j++;
        } else {
            j = first_end_after(u_ends, nu, s);
        }
        if (j < nu && u_starts[j] < q_ends[i])
            out[m++] = (int64_t)i;
    }
    *out_n = m;
    return ST_SWEEP_OK;
}

int st_prefix_max(const int64_t *starts, const int64_t *ends, size_t n, int64_t *out)
{
    if (!check_sorted(starts, n))
        return ST_SWEEP_UNSORTED;
    int64_t m = INT64_MIN;
    for (size_t i = 0; i < n; i++) {
        if (ends[i] > m)
            m = ends[i];
        out[i] = m;
    }
    return ST_SWEEP_OK;
}

size_t st_pairs(const int64_t *a_starts, const int64_t *a_ends, size_t na,
                const int64_t *b_starts, const int64_t *b_ends,
                const int64_t *b_prefix_max_end, size_t nb,
                int64_t *out_a, int64_t *out_b, int64_t *out_len, size_t cap,
                size_t *a_pos, size_t *b_pos)
{
    size_t k = 0;
    size_t i = *a_pos, j = *b_pos;
    while (i < na) {
        int64_t s = a_starts[i], e = a_ends[i];
        if (j == 0) /* fresh query: skip every B that ended before s */
            j = first_end_after(b_prefix_max_end, nb, s);
        for (; j < nb && b_starts[j] < e; j++) {
            int64_t lo = b_starts[j] > s ? b_starts[j] : s;
            int64_t hi = b_ends[j] < e ? b_ends[j] : e;
            if (hi <= lo)
                continue;
            if (k == cap) {
                *a_pos = i;
                *b_pos = j;
                return k;
            }
            out_a[k] = (int64_t)i;
            out_b[k] = (int64_t)j;
            out_len[k] = hi - lo;
            k++;
        }
        i++;
        j = 0;
    }
    *a_pos = i;
    *b_pos = 0;
    return k;
}

/* ------------------------------------------------------------ factorize */

static int rows_equal(const int64_t *a, const int64_t *b, size_t width)
{
    for (size_t w = 0; w < width; w++)
        if (a[w] != b[w])
            return 0;
    return 1;
}

int st_factorize_rows(const int64_t *rows, size_t n, size_t width,
                      int64_t *table, size_t table_cap,
                      int64_t *codes, int64_t *first, size_t *n_codes)
{
    *n_codes = 0;
    if (n == 0)
        return ST_SWEEP_OK;
    /* a power of two with room to spare keeps linear probing short and finite */
    if (table_cap < 2 * n || (table_cap & (table_cap - 1)) != 0)
        return ST_SWEEP_SMALL;
    for (size_t s = 0; s < table_cap; s++)
        table[s] = -1;
    size_t mask = table_cap - 1, m = 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t *row = rows + i * width;
        size_t s = (size_t)st_hash_bytes((const char *)row, width * sizeof *row, 0) & mask;
        for (;;) {
            int64_t at = table[s];
            if (at < 0) { /* new row: its code is the next one */
                table[s] = (int64_t)m;
                first[m] = (int64_t)i;
                codes[i] = (int64_t)m;
                m++;
                break;
            }
            if (rows_equal(rows + (size_t)first[at] * width, row, width)) {
                codes[i] = at;
                break;
            }
            s = (s + 1) & mask;
        }
    }
    *n_codes = m;
    return ST_SWEEP_OK;
}

/* ------------------------------------------------------------ window medians */

/* Rearranges a[0..n) so that a[k] is the k-th smallest and nothing before it
 * is larger (Hoare's selection; equal values split evenly).  n > k. */
static int64_t select_kth(int64_t *a, size_t n, size_t k)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)n - 1, kk = (ptrdiff_t)k;
    while (lo < hi) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        int64_t x = a[lo], y = a[mid], z = a[hi], pivot;
        /* median of three */
        if ((x <= y && y <= z) || (z <= y && y <= x))
            pivot = y;
        else if ((y <= x && x <= z) || (z <= x && x <= y))
            pivot = x;
        else
            pivot = z;
        ptrdiff_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot)
                i++;
            while (a[j] > pivot)
                j--;
            if (i <= j) {
                int64_t t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (kk <= j)
            hi = j;
        else if (kk >= i)
            lo = i;
        else
            break; /* a[j+1 .. i-1] all equal the pivot */
    }
    return a[k];
}

static double median_of(int64_t *a, size_t n)
{
    int64_t upper = select_kth(a, n, n / 2);
    if (n % 2)
        return (double)upper;
    int64_t lower = a[0];
    for (size_t i = 1; i < n / 2; i++)
        if (a[i] > lower)
            lower = a[i];
    return ((double)lower + (double)upper) / 2.0;
}

static int window_ok(int64_t lo, int64_t hi, size_t n)
{
    return lo >= 0 && hi >= lo && (uint64_t)hi <= (uint64_t)n;
}

int st_window_medians(const int64_t *start, const int64_t *end, const int64_t *code, size_t n, size_t n_codes,
                      const int64_t *q_lo, const int64_t *q_hi, const int64_t *q_t, size_t nq,
                      const int64_t *ref_ptr, const int64_t *r_lo, const int64_t *r_hi, const int64_t *r_t,
                      size_t n_refs,
                      int64_t *count, int64_t *slot, double *median, int64_t *bucket, size_t bucket_cap,
                      int64_t *touched, size_t touched_cap,
                      int64_t *out_kernel, double *out_median, size_t out_cap, int64_t *out_ptr)
{
    for (size_t j = 0; j < n; j++)
        if (code[j] < 0 || (uint64_t)code[j] >= n_codes)
            return ST_SWEEP_RANGE;
    /* every window is checked before any work, so scratch stays clean on errors */
    for (size_t q = 0; q < nq; q++)
        if (!window_ok(q_lo[q], q_hi[q], n) || ref_ptr[q] < 0 || ref_ptr[q + 1] < ref_ptr[q]
            || (uint64_t)ref_ptr[q + 1] > n_refs)
            return ST_SWEEP_RANGE;
    for (size_t r = 0; r < n_refs; r++)
        if (!window_ok(r_lo[r], r_hi[r], n))
            return ST_SWEEP_RANGE;
    size_t k = 0;
    out_ptr[0] = 0;
    for (size_t q = 0; q < nq; q++) {
        int64_t rp0 = ref_ptr[q], rp1 = ref_ptr[q + 1];
        /* codes wanted: those of the query's kernels; count holds 1 + hits */
        size_t nt = 0;
        for (int64_t j = q_lo[q]; j < q_hi[q]; j++) {
            if (end[j] <= q_t[q])
                continue;
            int64_t c = code[j];
            if (count[c] == 0) {
                if (nt == touched_cap) {
                    for (size_t t = 0; t < nt; t++)
                        count[touched[t]] = 0;
                    return ST_SWEEP_SMALL;
                }
                touched[nt++] = c;
                count[c] = 1;
            }
        }
        for (int64_t r = rp0; r < rp1; r++)
            for (int64_t j = r_lo[r]; j < r_hi[r]; j++)
                if (end[j] > r_t[r] && count[code[j]] > 0)
                    count[code[j]]++;
        /* bucket each wanted code's durations, contiguously */
        size_t used = 0;
        for (size_t t = 0; t < nt; t++) {
            slot[touched[t]] = (int64_t)used;
            used += (size_t)(count[touched[t]] - 1);
        }
        if (used > bucket_cap) {
            for (size_t t = 0; t < nt; t++)
                count[touched[t]] = 0;
            return ST_SWEEP_SMALL;
        }
        for (int64_t r = rp0; r < rp1; r++)
            for (int64_t j = r_lo[r]; j < r_hi[r]; j++)
                if (end[j] > r_t[r] && count[code[j]] > 0)
                    bucket[slot[code[j]]++] = end[j] - start[j];
        for (size_t t = 0; t < nt; t++) { /* slot now points past the code's bucket */
            int64_t c = touched[t], m = count[c] - 1;
            median[c] = m ? median_of(bucket + slot[c] - m, (size_t)m) : NAN;
        }
        for (int64_t j = q_lo[q]; j < q_hi[q]; j++) {
            if (end[j] <= q_t[q])
                continue;
            if (k == out_cap) {
                for (size_t t = 0; t < nt; t++)
                    count[touched[t]] = 0;
                return ST_SWEEP_SMALL;
            }
            out_kernel[k] = j;
            out_median[k] = median[code[j]];
            k++;
        }
        for (size_t t = 0; t < nt; t++)
            count[touched[t]] = 0;
        out_ptr[q + 1] = (int64_t)k;
    }
    return ST_SWEEP_OK;
}

/* ------------------------------------------------------------ innermost self time */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* heap of positions t in sel, ordered by (duration, position) */
static int heap_less(const int64_t *sel, const int64_t *start, const int64_t *end, int64_t a, int64_t b)
{
    int64_t da = end[sel[a]] - start[sel[a]], db = end[sel[b]] - start[sel[b]];
    return da < db || (da == db && a < b);
}

static void heap_push(int64_t *heap, size_t *len, int64_t v, const int64_t *sel, const int64_t *start,
                      const int64_t *end)
{
    size_t i = (*len)++;
    heap[i] = v;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(sel, start, end, heap[i], heap[p]))
            break;
        int64_t t = heap[i];
        heap[i] = heap[p];
        heap[p] = t;
        i = p;
    }
}

static void heap_pop(int64_t *heap, size_t *len, const int64_t *sel, const int64_t *start, const int64_t *end)
{
    heap[0] = heap[--(*len)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *len && heap_less(sel, start, end, heap[l], heap[m]))
            m = l;
        if (r < *len && heap_less(sel, start, end, heap[r], heap[m]))
            m = r;
        if (m == i)
            break;
        int64_t t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
}

static int64_t clip64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

int st_innermost(const int64_t *start, const int64_t *end, size_t n,
                 const int64_t *q_a, const int64_t *q_b, const int64_t *q_lo, const int64_t *q_hi, size_t nq,
                 int64_t *sel, int64_t *heap, int64_t *acc, int64_t *cuts, size_t scratch_cap,
                 int64_t *out_q, int64_t *out_i, int64_t *out_self, int64_t *out_first, size_t out_cap,
                 size_t *out_n)
{
    *out_n = 0;
    if (!check_sorted(start, n))
        return ST_SWEEP_UNSORTED;
    size_t total = 0;
    for (size_t q = 0; q < nq; q++) {
        if (!window_ok(q_a[q], q_b[q], n))
            return ST_SWEEP_RANGE;
        if ((uint64_t)(q_b[q] - q_a[q]) > scratch_cap)
            return ST_SWEEP_SMALL;
        total += (size_t)(q_b[q] - q_a[q]);
    }
    if (total > out_cap)
        return ST_SWEEP_SMALL;
    size_t k = 0;
    for (size_t q = 0; q < nq; q++) {
        int64_t lo = q_lo[q], hi = q_hi[q];
        size_t m = 0;
        for (int64_t i = q_a[q]; i < q_b[q]; i++)
            if (end[i] > lo)
                sel[m++] = i;
        if (hi <= lo || m == 0)
            continue;
        int64_t *self_ns = acc, *first = acc + m;
        size_t nc = 0;
        cuts[nc++] = lo;
        cuts[nc++] = hi;
        for (size_t t = 0; t < m; t++) {
            self_ns[t] = 0;
            first[t] = INT64_MAX;
            cuts[nc++] = clip64(start[sel[t]], lo, hi);
            cuts[nc++] = clip64(end[sel[t]], lo, hi);
        }
        qsort(cuts, nc, sizeof cuts[0], cmp_i64);
        size_t u = 1;
        for (size_t c = 1; c < nc; c++)
            if (cuts[c] != cuts[u - 1])
                cuts[u++] = cuts[c];
        /* heap entries are positions t in sel (ascending index = ascending start) */
        size_t next = 0, len = 0;
        for (size_t c = 0; c + 1 < u; c++) {
            int64_t x = cuts[c], y = cuts[c + 1];
            while (next < m && start[sel[next]] <= x)
                heap_push(heap, &len, (int64_t)next++, sel, start, end);
            while (len && end[sel[heap[0]]] < y) /* ended before this piece: never covers again */
                heap_pop(heap, &len, sel, start, end);
            if (len) {
                int64_t t = heap[0];
                self_ns[t] += y - x;
                if (first[t] == INT64_MAX)
                    first[t] = x;
            }
        }
        for (size_t t = 0; t < m; t++) {
            if (!self_ns[t])
                continue;
            out_q[k] = (int64_t)q;
            out_i[k] = sel[t];
            out_self[k] = self_ns[t];
            out_first[k] = first[t];
            k++;
        }
    }
    *out_n = k;
    return ST_SWEEP_OK;
}
