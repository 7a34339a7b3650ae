"""Per-rank clock offsets estimated from the ends of collectives that end
together on every rank (spec B4), and the ``align.clocks`` table."""
import math

import numpy as np
import pandas as pd

from .tables import CLOCK_COLUMNS


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
    ri = np.searchsorted(ranks, rank).astype(np.int64)
    # connected components (union-find over instances)
    parent = list(range(len(ranks)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    order = np.lexsort((ri, inst))
    inst_o, ri_o, end_o = inst[order], ri[order], end[order]
    first = np.r_[True, inst_o[1:] != inst_o[:-1]]
    head = np.maximum.accumulate(np.where(first, np.arange(len(inst_o)), 0))
    R = len(ranks)
    pair_keys = np.unique(ri_o[head] * R + ri_o)  # (head rank, rank) pairs as one integer: 10x faster than axis=0
    links = np.stack([pair_keys // R, pair_keys % R], axis=1)
    for x, y in links.tolist():
        fx, fy = find(x), find(y)
        if fx != fy:
            parent[max(fx, fy)] = min(fx, fy)
    comp = np.array([find(i) for i in range(len(ranks))])
    # pairwise medians against the lowest rank of each instance
    pa, pb = ri_o[head], ri_o
    diff = (end_o - end_o[head]).astype(np.float64)
    keep = pa != pb
    offset = np.zeros(len(ranks))
    if keep.any():
        pair, d_med, size = _medians_by(pa[keep] * R + pb[keep], diff[keep])   # by (a, b), sorted
        rows_a = np.zeros((len(pair) + R, R))
        rhs = np.zeros(len(pair) + R)
        w = np.sqrt(size.astype(np.float64))
        idx = np.arange(len(pair))
        rows_a[idx, pair % R] = w
        rows_a[idx, pair // R] -= w
        rhs[: len(pair)] = d_med * w
        big = 1e3 * (w.max() if len(w) else 1.0)
        for i in range(R):  # gauge: the reference of each component is 0
            if comp[i] == i:
                rows_a[len(pair) + i, i] = big
        offset = np.linalg.lstsq(rows_a, rhs, rcond=None)[0]
    # refine with alternating medians (robust to outliers)
    # float64 only after removing the common part: epoch ns do not fit a double's 53 bits
    e = (end_o - end_o.min()).astype(np.float64)
    # instance ids as 0..n-1 (rows are sorted by instance): a row's common end is its group's
    inst_id = np.cumsum(first) - 1
    # every rank has rows (ranks come from them), so per-rank results are
    # indexed by the rank's position 0..R-1
    for _ in range(4):
        common = _medians_by(inst_id, e - offset[ri_o])[1][inst_id]
        offset = _medians_by(ri_o, e - common)[1]
        offset -= offset[comp]
    common = _medians_by(inst_id, e - offset[ri_o])[1][inst_id]
    resid = np.abs(e - offset[ri_o] - common)
    _, res_med, size = _medians_by(ri_o, resid)
    res_max = np.full(len(ranks), -np.inf)
    np.maximum.at(res_max, ri_o, resid)
    for i, r in enumerate(ranks):
        out[int(r)] = {"offset_ns": int(round(offset[i])), "residual_ns": float(res_med[i]),
                       "max_residual_ns": float(res_max[i]), "collectives": int(size[i]),
                       "reference_rank": int(ranks[comp[i]])}
    return out


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
    return pd.DataFrame({"rank": pd.Series(present, dtype="int64"),
                         "offset_ns": np.zeros(len(present), dtype=np.int64),
                         "residual_ns": np.full(len(present), np.nan),
                         "max_residual_ns": np.full(len(present), np.nan),
                         "collectives": np.zeros(len(present), dtype=np.int64),
                         "reference_rank": pd.Series(present, dtype="int64"),
                         "applied": np.full(len(present), apply), "method": ["none"] * len(present)})
