"""Per-rank clock offsets estimated from the ends of collectives that end
together on every rank (spec B4), and the ``align.clocks`` table."""
import math

import numpy as np

from .tables import CLOCK_COLUMNS, frame_of, unestimated_clocks_columns


def estimate_clock_offsets(inst, rank, end):
    """Per-rank clock offsets from collective end times (B4).

    ``inst``, ``rank``, ``end`` (ns) describe participations in collectives
    that end together on every rank.  Model: end = common_end[inst] +
    offset[rank] + noise.  Offsets start from a weighted least-squares fit of
    the per-pair median differences and are refined by alternating medians, so
    a few outliers do not move them.  The lowest rank of each connected set of
    ranks is the reference (offset 0).

    Returns ``{rank: dict(offset_ns, residual_ns, max_residual_ns, collectives,
    reference_rank)}`` for every rank in ``rank``.
    """
    inst = np.asarray(inst, dtype=np.int64)
    rank = np.asarray(rank, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    out = {}
    if not len(inst):
        return out
    ranks = np.unique(rank)
    rank_index = np.searchsorted(ranks, rank).astype(np.int64)
    order = np.lexsort((rank_index, inst))
    inst_o, ri_o, end_o = inst[order], rank_index[order], end[order]
    first = np.r_[True, inst_o[1:] != inst_o[:-1]]
    head = np.maximum.accumulate(np.where(first, np.arange(len(inst_o)), 0))   # each row's instance's first row
    comp = _components(ri_o[head], ri_o, len(ranks))
    offset = _least_squares_offsets(ri_o[head], ri_o, (end_o - end_o[head]).astype(np.float64), comp)
    # refine with alternating medians (robust to outliers)
    # float64 only after removing the common part: epoch ns do not fit a double's 53 bits
    ends = (end_o - end_o.min()).astype(np.float64)
    # instance ids as 0..n-1 (rows are sorted by instance): a row's common end is its group's
    inst_id = np.cumsum(first) - 1
    # every rank has rows (ranks come from them), so per-rank results are
    # indexed by the rank's position 0..len(ranks)-1
    for _ in range(4):
        common = _medians_by(inst_id, ends - offset[ri_o])[1][inst_id]
        offset = _medians_by(ri_o, ends - common)[1]
        offset -= offset[comp]
    common = _medians_by(inst_id, ends - offset[ri_o])[1][inst_id]
    resid = np.abs(ends - offset[ri_o] - common)
    _, res_med, size = _medians_by(ri_o, resid)
    res_max = np.full(len(ranks), -np.inf)
    np.maximum.at(res_max, ri_o, resid)
    for i, r in enumerate(ranks):
        out[int(r)] = {"offset_ns": int(round(offset[i])), "residual_ns": float(res_med[i]),
                       "max_residual_ns": float(res_max[i]), "collectives": int(size[i]),
                       "reference_rank": int(ranks[comp[i]])}
    return out


def _components(head_rank, row_rank, n_ranks):
    """Per rank (0..n_ranks-1): the lowest rank of its connected set, ranks
    being connected by taking part in one instance (union-find over the
    (instance's first rank, rank) pairs of the rows)."""
    parent = list(range(n_ranks))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    # each (head rank, rank) pair once, as one integer: np.unique of plain
    # integers instead of rows of a 2-column array
    pair_keys = np.unique(head_rank * n_ranks + row_rank)
    links = np.stack([pair_keys // n_ranks, pair_keys % n_ranks], axis=1)
    for x, y in links.tolist():
        fx, fy = find(x), find(y)
        if fx != fy:
            parent[max(fx, fy)] = min(fx, fy)
    return np.array([find(i) for i in range(n_ranks)])


#: ranks up to which the first fit is one dense least-squares solve; beyond,
#: its (pairs x ranks) matrix and O(ranks^3) time grow too fast (4,096 ranks:
#: 270 MB and minutes), and the same fit is solved sparsely (_sparse_fit)
DENSE_FIT_RANKS = 512


def _least_squares_offsets(head_rank, row_rank, diff, comp):
    """First offsets per rank: a least-squares fit of the median end
    difference of each (instance's first rank, rank) pair, weighted by the
    square root of its count; the reference of each component held at 0."""
    n_ranks = len(comp)
    keep = head_rank != row_rank
    offset = np.zeros(n_ranks)
    if keep.any():
        pair, d_med, size = _medians_by(head_rank[keep] * n_ranks + row_rank[keep], diff[keep])   # sorted pairs
        if n_ranks > DENSE_FIT_RANKS:
            return _sparse_fit(pair // n_ranks, pair % n_ranks, d_med, size.astype(np.float64), comp)
        rows_a = np.zeros((len(pair) + n_ranks, n_ranks))
        rhs = np.zeros(len(pair) + n_ranks)
        w = np.sqrt(size.astype(np.float64))
        idx = np.arange(len(pair))
        rows_a[idx, pair % n_ranks] = w
        rows_a[idx, pair // n_ranks] -= w
        rhs[: len(pair)] = d_med * w
        big = 1e3 * (w.max() if len(w) else 1.0)
        for i in range(n_ranks):  # gauge: the reference of each component is 0
            if comp[i] == i:
                rows_a[len(pair) + i, i] = big
        offset = np.linalg.lstsq(rows_a, rhs, rcond=None)[0]
    return offset


def _sparse_fit(a, b, d, weight, comp, tol=1e-12):
    """The fit of ``_least_squares_offsets`` for many ranks: minimise
    sum(weight * (offset[b] - offset[a] - d)^2) with each component's
    reference held at exactly 0, by conjugate gradients on the normal
    equations (a weighted graph Laplacian, one row per rank), preconditioned
    by its diagonal.  Every step is a pass over the pairs, so time and memory
    grow with the pairs, not with ranks squared."""
    n = len(comp)
    free = comp != np.arange(n)   # the references stay 0

    def laplacian(x):
        y = weight * (x[b] - x[a])
        out = np.bincount(b, y, n) - np.bincount(a, y, n)
        out[~free] = 0.0
        return out

    rhs = np.bincount(b, weight * d, n) - np.bincount(a, weight * d, n)
    rhs[~free] = 0.0
    diag = np.bincount(a, weight, n) + np.bincount(b, weight, n)
    diag[~free | (diag == 0)] = 1.0
    x = np.zeros(n)
    r = rhs.copy()
    z = r / diag
    p = z.copy()
    rz = r @ z
    stop = tol * max(np.linalg.norm(rhs), 1.0)
    for _ in range(10 * n):
        if np.linalg.norm(r) <= stop:
            break
        q = laplacian(p)
        alpha = rz / (p @ q)
        x += alpha * p
        r -= alpha * q
        z = r / diag
        rz, rz_old = r @ z, rz
        p = z + (rz / rz_old) * p
    return x


def _medians_by(group, values):
    """(group ids present, sorted; the median of each one's values; its
    count): pandas' groupby median (the mean of the two middle values for an
    even count) without building a grouper.  ``group`` holds non-negative
    ints; values must not be NaN."""
    g, v = group, values
    if len(g) > 1 and (g[1:] < g[:-1]).any():
        small = g.max() < 1 << 16
        order = np.argsort(g.astype(np.uint16) if small else g, kind="stable")   # 16 bits: a radix sort
        g, v = g[order], v[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, dtype=np.int64)
    counts = np.diff(np.r_[starts, len(g)])
    n_groups, width = len(starts), int(counts.max()) if len(counts) else 0
    if n_groups * width <= 4 * len(v) + 4096:
        # groups of similar sizes (an instance's ranks, a rank's instances):
        # sorted as the rows of one block, padded with +inf past their ends
        block = np.full(n_groups * width, np.inf)
        block[np.arange(len(v)) + np.repeat(np.arange(n_groups) * width - starts, counts)] = v
        block = block.reshape(n_groups, width)
        block.sort(axis=1)
        rows = np.arange(n_groups)
        lower, upper = block[rows, (counts - 1) // 2], block[rows, counts // 2]
    else:
        v = v[np.lexsort((v, g))]
        lower, upper = v[starts + (counts - 1) // 2], v[starts + counts // 2]
    return g[starts], (upper + lower) / 2, counts


def _clocks_table(est, present, apply, clock_method):
    """align.clocks: a row per rank present, from ``estimate_clock_offsets``'
    result (a rank it has no estimate of gets offset 0, method "none")."""
    import pandas as pd   # here: the stage without collectives does not load it

    clock_rows = []
    for r in present:
        e = est.get(r)
        if e is None:
            clock_rows.append({"rank": r, "offset_ns": 0, "residual_ns": math.nan, "max_residual_ns": math.nan,
                               "collectives": 0, "reference_rank": r, "applied": apply, "method": "none"})
        else:
            clock_rows.append({"rank": r, **e, "applied": apply, "method": clock_method})
    values = {c: [row[c] for row in clock_rows] for c in CLOCK_COLUMNS}
    dtypes = {"rank": np.int64, "offset_ns": np.int64, "collectives": np.int64, "reference_rank": np.int64,
              "applied": bool, "residual_ns": np.float64, "max_residual_ns": np.float64}
    return pd.DataFrame({c: np.array(v, dtype=dtypes[c]) if c in dtypes else pd.Series(v)
                         for c, v in values.items()})


def _unestimated_clocks_table(present, apply):
    """align.clocks when there are no collectives: offset 0, method "none"."""
    return frame_of(unestimated_clocks_columns(present, apply))
