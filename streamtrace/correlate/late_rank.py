"""Why was the late rank late (spec blocking-analysis.md, part 1): per
matched collective instance, the late rank's delay split into host launch
lateness, GPU dependency wait and GPU backlog, the backlog attributed to
compute kernels by their excess over the other ranks, the host lateness to
CPU ops on the launching thread; summed up per kernel and per host op."""
import collections
import math

import numpy as np
import pandas as pd

from .columns import BLOCKER_COLUMNS, BLOCKING_HOST_COLUMNS, BLOCKING_KERNEL_COLUMNS
from .. import _native
from .constants import NS_PER_US, TOP_N
from .summary import unpack_ops
from .timeline import _union

P2P_NAMES = ("send", "recv")
NOISE_FRACTION, NOISE_NS = 0.05, 1000   # excess below max(5 % of baseline, 1 us) is noise


def _late_rank_analysis(inputs):
    """collective_blockers (one row per instance in ``_Waits``),
    blocking_kernels and blocking_host_ops, as DataFrames."""
    comp, timelines = inputs.compute, inputs.timelines
    collective_ends = {int(r): np.sort(g["end"].to_numpy()) for r, g in inputs.instances.groupby("rank")}
    waits = _Waits(inputs.instances, timelines, collective_ends)
    blocking = _blocking_kernels(comp, timelines, waits, collective_ends)
    late_tid = waits.launch_tid[waits.last]
    has_tid = ~np.isnan(late_tid)
    host_ops = _host_ops_in_gaps(timelines, waits.late_rank, np.where(has_tid, late_tid, -1).astype(np.int64),
                                 waits.reference_arrival, waits.reference_arrival + waits.host,
                                 (waits.host > 0) & has_tid)

    rows, kernel_hits, host_hits = [], [], []
    for i in range(len(waits.first)):
        cid = waits.instance[waits.first[i]]
        late = int(waits.late_rank[i])
        if waits.no_launch[i] and waits.delta[i] > 0:
            inputs.quality.append(("no launch record", late, f"collective {cid}: the late rank's kernel has no "
                                                             "launch record; host lateness counted as 0"))
        top = []
        for k in blocking.order[blocking.ptr[i]:blocking.ptr[i + 1]]:
            j = blocking.kernel[k]
            name, grid, block = comp.triples[comp.key[j]]
            attributed, excess = int(blocking.attributed[k]), blocking.excess[k]
            kernel_hits.append((name, grid, block, attributed, cid, late, excess, int(blocking.duration[k]),
                                blocking.baseline[k]))
            top.append((name, int(comp.column(late, "stream", j)), excess, attributed))
        ops = host_ops.get(i, [])
        host_hits.extend((name, t, cid, late) for name, t in ops)
        rows.append(_blocker_row(waits, i, top, ops[:TOP_N]))

    blockers_df = pd.DataFrame(rows).reindex(columns=BLOCKER_COLUMNS)
    return blockers_df, _summarize_kernels(kernel_hits), _summarize_host(host_hits)


class _Waits:
    """The collective instances where ranks waited for the last one: every
    matched instance but send/recv, with at least two ranks and a timeline
    for its last arriver.

    Arrival rows (``instance``, ``rank``, ``start``, ``launch_end``,
    ``launch_tid``, ``pg_name``, ``collective_name``) are sorted by
    (instance, start, rank); per instance, ``first`` and ``last`` are the rows
    of its first (the reference) and its last (the late) arriver.  Per
    instance, the late rank's delay behind the reference (``delta``) splits
    into ``host`` launch lateness, GPU ``dependency`` wait and GPU
    ``backlog``, which add up to it."""

    def __init__(self, instances, timelines, collective_ends):
        # every matched multi-rank collective makes ranks wait for the last one;
        # point-to-point send/recv only pair two ranks and are left out
        sync = instances[~instances["collective_name"].isin(P2P_NAMES)].sort_values(["instance", "start", "rank"],
                                                                                     kind="stable")
        self.instance = sync["instance"].to_numpy()
        self.rank, self.start = sync["rank"].to_numpy(np.int64), sync["start"].to_numpy(np.int64)
        self.launch_end, self.launch_tid = sync["launch_end"].to_numpy(float), sync["launch_tid"].to_numpy(float)
        self.pg_name, self.collective_name = sync["pg_name"].to_numpy(object), sync["collective_name"].to_numpy(object)
        self.first, self.last = self._first_and_last(timelines)
        self._split_delays(timelines, collective_ends)

    def _first_and_last(self, timelines):
        """The first and last arrival rows of the instances with at least two
        ranks whose late rank has a timeline."""
        bounds = np.flatnonzero(np.r_[True, self.instance[1:] != self.instance[:-1], True])
        first, end = bounds[:-1], bounds[1:]
        keep = end - first >= 2
        first, last = first[keep], end[keep] - 1
        keep = np.isin(self.rank[last], list(timelines))
        return first[keep], last[keep]

    def _split_delays(self, timelines, collective_ends):
        first, last = self.first, self.last
        self.late_rank, self.reference_rank = self.rank[last], self.rank[first]
        self.late_arrival, self.reference_arrival = self.start[last], self.start[first]
        self.delta = self.late_arrival - self.reference_arrival
        # what the late rank alone kept the others waiting: behind the rank that arrived just before it
        self.blame = self.late_arrival - self.start[np.maximum(last - 1, 0)]
        self.no_launch = np.isnan(self.launch_end[last])
        launch_end = np.where(self.no_launch, 0, self.launch_end[last]).astype(np.int64)
        self.host = np.where(self.no_launch, 0,
                             np.minimum(np.maximum(launch_end - self.reference_arrival, 0), self.delta))
        # from here the kernel was launched and the GPU side waited
        self.gap_start = self.reference_arrival + self.host
        gap_busy = np.zeros(len(first), dtype=np.int64)
        for r in np.unique(self.late_rank):
            q = np.flatnonzero(self.late_rank == r)
            gap_busy[q] = _native.overlap_with_union(self.gap_start[q], self.late_arrival[q],
                                                     *timelines[int(r)].compute_union())
        self.late_previous_end = _previous_ends_by_rank(collective_ends, self.late_rank, self.late_arrival)
        self.backlog = np.minimum(gap_busy, self.delta - self.host)
        self.dependency = self.delta - self.host - self.backlog


#: the compute kernels that blocked late ranks: ``kernel`` (indices into the
#: _Compute table), with its ``duration``, the median ``baseline`` of the same
#: kernel on the other ranks (NaN: unknown), the ``excess`` over it and the
#: time ``attributed`` to it; ``order[ptr[i]:ptr[i + 1]]`` are the kernels that
#: blocked instance i, largest first
_Blocking = collections.namedtuple("_Blocking", "kernel duration baseline excess attributed order ptr")


def _blocking_kernels(comp, timelines, waits, collective_ends):
    """The kernels that ran on each late rank between its previous
    collective's end and its arrival, against the same kernels on the other
    ranks in their own windows (a ``_Blocking``)."""
    n, first, last = len(waits.first), waits.first, waits.last
    late_lo, late_hi = _windows(comp, waits.late_rank, waits.late_previous_end, waits.late_arrival)
    # the other ranks' arrival rows of each instance (owner: the instance)
    others = np.concatenate([np.arange(a, b) for a, b in zip(first, last)]) if n else np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(n), last - first)
    present = np.isin(waits.rank[others], list(timelines))
    others, owner = others[present], owner[present]
    other_ranks, other_arrivals = waits.rank[others], waits.start[others]
    other_previous_end = _previous_ends_by_rank(collective_ends, other_ranks, other_arrivals)
    other_lo, other_hi = _windows(comp, other_ranks, other_previous_end, other_arrivals)
    other_ptr = np.searchsorted(owner, np.arange(n + 1), side="left")
    ptr, kernel, baseline = _native.window_medians(comp.start, comp.end, comp.ident, comp.n_ident, late_lo, late_hi,
                                                   waits.late_previous_end, other_ptr, other_lo, other_hi,
                                                   other_previous_end)
    instance_of = np.repeat(np.arange(n), np.diff(ptr))
    k_start, k_end = comp.start[kernel], comp.end[kernel]
    duration = k_end - k_start
    excess = duration - baseline
    in_gap = np.clip(np.minimum(k_end, waits.late_arrival[instance_of])
                     - np.maximum(k_start, waits.gap_start[instance_of]), 0, None)
    # a kernel blocks by at most its time in the gap, and only by what it
    # took beyond its usual duration elsewhere (when that is known);
    # an excess within timing noise is no excess
    significant = np.nan_to_num(excess) > np.maximum(NOISE_FRACTION * np.nan_to_num(baseline), NOISE_NS)
    attributed = np.where(np.isnan(excess), in_gap,
                          np.where(significant, np.minimum(in_gap, np.clip(np.nan_to_num(excess), 0, None)), 0))
    hit = np.flatnonzero(attributed > 0)
    hit = hit[np.lexsort((-attributed[hit], instance_of[hit]))]   # per instance, largest first (stable)
    hit_ptr = np.searchsorted(instance_of[hit], np.arange(n + 1), side="left")
    return _Blocking(kernel, duration, baseline, excess, attributed, hit, hit_ptr)


def _blocker_row(waits, i, top, host_top):
    """collective_blockers' row of instance i: the delay split and its
    dominant cause; ``top``: the blocking kernels as (name, stream, excess,
    attributed), largest first; ``host_top``: the top host ops as (name, self
    ns), shown as the top blockers when host launch lateness dominates."""
    d, h, bl, dep = int(waits.delta[i]), int(waits.host[i]), int(waits.backlog[i]), int(waits.dependency[i])
    parts = {"host launch lateness": h, "GPU dependency wait": dep, "GPU backlog": bl}
    cause = max(parts, key=parts.get) if d > 0 else "none"
    last = waits.last[i]
    row = {
        "collective_id": waits.instance[waits.first[i]], "Process Group Name": waits.pg_name[last],
        "Collective name": waits.collective_name[last], "late_rank": int(waits.late_rank[i]),
        "reference_rank": int(waits.reference_rank[i]), "delta_us": d / NS_PER_US,
        "blame_us": int(waits.blame[i]) / NS_PER_US, "host_launch_lateness_us": h / NS_PER_US,
        "gpu_dependency_wait_us": dep / NS_PER_US, "gpu_backlog_us": bl / NS_PER_US, "dominant_cause": cause,
    }
    if cause == "host launch lateness" and host_top:
        row["top_blockers"] = "; ".join(f"{name} ({t / NS_PER_US:.1f} us)" for name, t in host_top)
    else:
        row["top_blockers"] = "; ".join(f"{name} ({a / NS_PER_US:.1f} us)" for name, _, _, a in top[:TOP_N])
    for b, (name, stream, exc, _) in enumerate(top[:TOP_N], 1):
        row[f"blocker_{b}"] = name
        row[f"blocker_{b}_stream"] = stream
        row[f"blocker_{b}_excess_us"] = None if np.isnan(exc) else exc / NS_PER_US
    return row


def _previous_ends_by_rank(collective_ends, ranks, t):
    """``_previous_ends`` of times t on their ranks (``collective_ends``:
    {rank: its collectives' sorted ends})."""
    out = np.zeros(len(ranks), dtype=np.int64)
    for r in np.unique(ranks):
        q = np.flatnonzero(ranks == r)
        out[q] = _previous_ends(collective_ends.get(int(r)), t[q])
    return out


def _previous_ends(ends, t):
    """Per time in t, the latest collective end on the rank at or before it
    (-2**62 when none)."""
    t = np.asarray(t, dtype=np.int64)
    if ends is None or not len(ends):
        return np.full(len(t), -(1 << 62), dtype=np.int64)
    i = np.searchsorted(ends, t, side="right")
    return np.where(i > 0, ends[np.maximum(i - 1, 0)], -(1 << 62)).astype(np.int64)


def _windows(comp, ranks, lo, hi):
    """Index ranges [a, b) into comp of the kernels that may meet [lo, hi) on
    each rank (those also need end > lo): binary search on start."""
    a = np.zeros(len(ranks), dtype=np.int64)
    b = np.zeros(len(ranks), dtype=np.int64)
    for r in np.unique(ranks):
        q = np.flatnonzero(ranks == r)
        s = comp.start[comp.rank_slice(int(r))]
        off = comp.offset[int(r)]
        a[q] = off + np.searchsorted(s, lo[q] - comp.max_dur[int(r)], side="left")
        b[q] = off + np.searchsorted(s, hi[q], side="left")
    return a, b


def _host_ops_in_gaps(tls, ranks, tids, lo, hi, wanted):
    """{instance: [(op name, self ns), ...]} of the CPU ops on the launching
    thread during [lo, hi), by self time within it (the innermost op at each
    instant), largest first; one pass over a rank's ops, then one C sweep per
    (rank, thread)."""
    out = {}
    todo = np.flatnonzero(wanted)
    for r in sorted(set(ranks[todo].tolist())):
        tl = tls[r]
        mine = todo[ranks[todo] == r]
        q_lo, q_hi = lo[mine] - tl.shift, hi[mine] - tl.shift     # CPU ops are raw ns
        ops = _ops_meeting((unpack_ops(p) for p in tl.cpu_ops), tids[mine], q_lo, q_hi)   # one part at a time
        for tid, (start, end, name_ids) in ops.items():
            on = tids[mine] == tid
            q, w_lo, w_hi = mine[on], q_lo[on], q_hi[on]
            max_dur = int((end - start).max())
            a = np.searchsorted(start, w_lo - max_dur, side="left")
            b = np.searchsorted(start, w_hi, side="left")
            qq, op, self_ns, first = _native.innermost_self(start, end, a, b, w_lo, w_hi)
            order = np.lexsort((first, qq))   # per query, names in order of first appearance
            for k, o, t in zip(qq[order].tolist(), op[order].tolist(), self_ns[order].tolist()):
                totals = out.setdefault(int(q[k]), {})
                name = tl.names[name_ids[o]]
                totals[name] = totals.get(name, 0) + t
    return {i: sorted(totals.items(), key=lambda kv: -kv[1]) for i, totals in out.items()}


def _ops_meeting(parts, tids, lo, hi):
    """{tid: (start, end, name ids)} of the ops on the threads ``tids`` that
    meet any window [lo, hi), sorted by start (stable: stream order on ties):
    every op of any window's selection is among them, in the same relative
    order.  One pass over the rank's per-frame parts."""
    w_start, w_end = _union(lo, hi)
    picked = []
    for start, end, t, name in parts:
        # windows only (few ops meet one); the threads are picked once, below
        m = _native.meeting_union(start, end, w_start, w_end)
        if len(m):
            picked.append((start[m], end[m], t[m], name[m]))
    if not picked:
        return {}
    s, e, t, n = (np.concatenate(c) for c in zip(*picked))
    out = {}
    for tid in np.intersect1d(t, tids).tolist():
        on = np.flatnonzero(t == tid)
        order = on[np.argsort(s[on], kind="stable")]
        out[tid] = (s[order], e[order], n[order])
    return out


def _summarize_kernels(hits):
    """blocking_kernels: per (kernel, grid, block), in order of first
    appearance then by total blocking time, the aggregates of its hits
    (name, grid, block, attributed ns, instance, rank, excess, duration,
    baseline), NaN skipped, as pandas' groupby gives them.  Plain Python (a
    few thousand hits at most) but for the mean excess, a float sum that
    pandas compensates its own way: a sum of integer ns is exact anyway."""
    if not hits:
        return pd.DataFrame(columns=BLOCKING_KERNEL_COLUMNS)
    groups = {}
    for name, grid, block, *rest in hits:
        groups.setdefault((name, grid, block), []).append(rest)
    index = {key: c for c, key in enumerate(groups)}   # first appearance, as groupby(sort=False)
    code = [index[h[:3]] for h in hits]
    mean_excess = pd.Series([h[6] for h in hits], dtype=np.float64).groupby(np.array(code), sort=False).mean()
    rows = []
    for c, ((name, grid, block), g) in enumerate(groups.items()):
        attributed, instances, ranks, excess, dur, baseline = zip(*g)
        present = [float(x) for x in excess if x == x]
        rows.append((name, grid, block, sum(attributed) / NS_PER_US, len(set(instances)), _rank_list(ranks),
                     mean_excess.iloc[c] / NS_PER_US, (max(present) if present else math.nan) / NS_PER_US,
                     sum(dur) / len(dur) / NS_PER_US, _median([float(x) for x in baseline if x == x]) / NS_PER_US))
    out = pd.DataFrame(rows, columns=BLOCKING_KERNEL_COLUMNS)
    return out.sort_values(["total_blocking_us", "kernel"], ascending=[False, True]).reset_index(drop=True)


def _summarize_host(hits):
    """blocking_host_ops: per op, the aggregates of its (op, self ns,
    instance, rank) hits, as _summarize_kernels does them."""
    if not hits:
        return pd.DataFrame(columns=BLOCKING_HOST_COLUMNS)
    groups = {}
    for op, self_ns, instance, rank in hits:
        groups.setdefault(op, []).append((self_ns, instance, rank))
    rows = []
    for op, g in groups.items():
        self_ns, instances, ranks = zip(*g)
        rows.append((op, sum(self_ns) / NS_PER_US, len(set(instances)), _rank_list(ranks),
                     sum(self_ns) / len(self_ns) / NS_PER_US, max(self_ns) / NS_PER_US))
    out = pd.DataFrame(rows, columns=BLOCKING_HOST_COLUMNS)
    return out.sort_values(["total_blocking_us", "op"], ascending=[False, True]).reset_index(drop=True)


def _rank_list(ranks):
    return ",".join(str(r) for r in sorted(set(ranks)))


def _median(values):
    """The median as pandas' groupby median takes it: the middle value, or
    the mean of the two middle ones (NaN when empty)."""
    if not values:
        return math.nan
    s, n = sorted(values), len(values)
    return s[n // 2] if n % 2 else (s[n // 2] + s[n // 2 - 1]) / 2
