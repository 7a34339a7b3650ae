/* Interval sweeps.  See st_sweep.h. */
#include "st_sweep.h"

static int check_sorted(const int64_t *starts, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (starts[i] < starts[i - 1])
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
    for (size_t j = 1; j < nu; j++)
        if (u_starts[j] < u_ends[j - 1] || u_ends[j] < u_ends[j - 1])
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
