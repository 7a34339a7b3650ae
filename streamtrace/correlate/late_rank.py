"""Why was the late rank late (spec blocking-analysis.md, part 1): per
matched collective instance, the late rank's delay split into host launch
lateness, GPU dependency wait and GPU backlog, the backlog attributed to
compute kernels by their excess over the other ranks, the host lateness to
CPU ops on the launching thread; summed up per kernel and per host op."""
import math

import numpy as np
import pandas as pd

from .. import _native
from .constants import NS_PER_US, TOP_N
from .timeline import _union

P2P_NAMES = ("send", "recv")
NOISE_FRACTION, NOISE_NS = 0.05, 1000   # excess below max(5 % of baseline, 1 us) is noise


BLOCKER_COLUMNS = [
    "collective_id", "Process Group Name", "Collective name", "late_rank", "reference_rank", "delta_us", "blame_us",
    "host_launch_lateness_us", "gpu_dependency_wait_us", "gpu_backlog_us", "dominant_cause",
    "top_blockers", "blocker_1", "blocker_1_stream", "blocker_1_excess_us",
    "blocker_2", "blocker_2_stream", "blocker_2_excess_us", "blocker_3", "blocker_3_stream", "blocker_3_excess_us",
]
BLOCKING_KERNEL_COLUMNS = ["kernel", "grid", "block", "total_blocking_us", "instances_delayed", "ranks",
                           "mean_excess_us", "max_excess_us", "mean_duration_us", "baseline_median_us"]
BLOCKING_HOST_COLUMNS = ["op", "total_blocking_us", "instances_delayed", "ranks", "mean_self_us_in_gap",
                         "max_self_us_in_gap"]


def _late_rank_analysis(inputs):
    inst = inputs.instances
    # every matched multi-rank collective makes ranks wait for the last one;
    # point-to-point send/recv only pair two ranks and are left out
    sync = inst[~inst["collective_name"].isin(P2P_NAMES)].sort_values(["instance", "start", "rank"], kind="stable")
    comp, tls = inputs.compute, inputs.timelines
    coll_ends = {int(r): np.sort(g["end"].to_numpy()) for r, g in inst.groupby("rank")}

    inst_ids = sync["instance"].to_numpy()
    ranks, starts = sync["rank"].to_numpy(np.int64), sync["start"].to_numpy(np.int64)
    launch_end, launch_tid = sync["launch_end"].to_numpy(float), sync["launch_tid"].to_numpy(float)
    pgs, names = sync["pg_name"].to_numpy(object), sync["collective_name"].to_numpy(object)
    bounds = np.flatnonzero(np.r_[True, inst_ids[1:] != inst_ids[:-1], True])
    lo_i, hi_i = bounds[:-1], bounds[1:]
    # instances with at least two ranks whose late rank has a timeline
    keep = hi_i - lo_i >= 2
    lo_i, last = lo_i[keep], hi_i[keep] - 1
    keep = np.isin(ranks[last], list(tls))
    lo_i, last = lo_i[keep], last[keep]
    n = len(lo_i)
    L, R = ranks[last], ranks[lo_i]
    a_L, a_R = starts[last], starts[lo_i]
    delta = a_L - a_R
    blame = a_L - starts[np.maximum(last - 1, 0)]
    no_launch = np.isnan(launch_end[last])
    le = np.where(no_launch, 0, launch_end[last]).astype(np.int64)
    host = np.where(no_launch, 0, np.minimum(np.maximum(le - a_R, 0), delta))
    g0 = a_R + host   # from here the kernel was launched and the GPU side waited
    gap_busy = np.zeros(n, dtype=np.int64)
    prev_L = np.zeros(n, dtype=np.int64)
    for r in np.unique(L):
        q = np.flatnonzero(L == r)
        gap_busy[q] = _native.overlap_with_union(g0[q], a_L[q], *tls[int(r)].unions["compute"])
        prev_L[q] = _previous_ends(coll_ends.get(int(r)), a_L[q])
    backlog = np.minimum(gap_busy, delta - host)
    dependency = delta - host - backlog

    # kernels that ran on L between its previous collective's end and a_L,
    # against the same kernels on the other ranks in their own windows
    q_lo, q_hi = _windows(comp, L, prev_L, a_L)
    others = np.concatenate([np.arange(a, b) for a, b in zip(lo_i, last)]) if n else np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(n), last - lo_i)
    present = np.isin(ranks[others], list(tls))
    others, owner = others[present], owner[present]
    prev_o = np.zeros(len(others), dtype=np.int64)
    for r in np.unique(ranks[others]):
        q = np.flatnonzero(ranks[others] == r)
        prev_o[q] = _previous_ends(coll_ends.get(int(r)), starts[others[q]])
    r_lo, r_hi = _windows(comp, ranks[others], prev_o, starts[others])
    ref_ptr = np.searchsorted(owner, np.arange(n + 1), side="left")
    ptr, kern, baseline = _native.window_medians(comp.start, comp.end, comp.ident, comp.n_ident, q_lo, q_hi, prev_L,
                                                 ref_ptr, r_lo, r_hi, prev_o)
    q_of = np.repeat(np.arange(n), np.diff(ptr))
    k_start, k_end = comp.start[kern], comp.end[kern]
    dur = k_end - k_start
    excess = dur - baseline
    in_gap = np.clip(np.minimum(k_end, a_L[q_of]) - np.maximum(k_start, g0[q_of]), 0, None)
    # a kernel blocks by at most its time in the gap, and only by what it
    # took beyond its usual duration elsewhere (when that is known);
    # an excess within timing noise is no excess
    significant = np.nan_to_num(excess) > np.maximum(NOISE_FRACTION * np.nan_to_num(baseline), NOISE_NS)
    attributed = np.where(np.isnan(excess), in_gap,
                          np.where(significant, np.minimum(in_gap, np.clip(np.nan_to_num(excess), 0, None)), 0))
    hit = np.flatnonzero(attributed > 0)
    hit = hit[np.lexsort((-attributed[hit], q_of[hit]))]   # per instance, largest first (stable)
    hit_ptr = np.searchsorted(q_of[hit], np.arange(n + 1), side="left")

    has_tid = ~np.isnan(launch_tid[last])
    host_ops = _host_ops_in_gaps(tls, L, np.where(has_tid, launch_tid[last], -1).astype(np.int64),
                                 a_R, a_R + host, (host > 0) & has_tid)

    rows, kernel_hits, host_hits = [], [], []
    for i in range(n):
        cid = inst_ids[lo_i[i]]
        Li = int(L[i])
        d, h, bl, dep = int(delta[i]), int(host[i]), int(backlog[i]), int(dependency[i])
        if no_launch[i] and d > 0:
            inputs.quality.append(("no launch record", Li, f"collective {cid}: the late rank's kernel has no launch "
                                                           "record; host lateness counted as 0"))
        parts = {"host launch lateness": h, "GPU dependency wait": dep, "GPU backlog": bl}
        cause = max(parts, key=parts.get) if d > 0 else "none"
        top = []
        for k in hit[hit_ptr[i]:hit_ptr[i + 1]]:
            j = kern[k]
            name, grid, block = comp.triples[comp.key[j]]
            kernel_hits.append((name, grid, block, int(attributed[k]), cid, Li, excess[k], int(dur[k]), baseline[k]))
            top.append((name, int(comp.column(Li, "stream", j)), excess[k], int(attributed[k])))

        ops = host_ops.get(i, [])
        host_hits.extend((name, t, cid, Li) for name, t in ops)
        host_top = ops[:TOP_N]

        row = {
            "collective_id": cid, "Process Group Name": pgs[last[i]], "Collective name": names[last[i]],
            "late_rank": Li, "reference_rank": int(R[i]), "delta_us": d / NS_PER_US, "blame_us": int(blame[i]) / NS_PER_US,
            "host_launch_lateness_us": h / NS_PER_US, "gpu_dependency_wait_us": dep / NS_PER_US,
            "gpu_backlog_us": bl / NS_PER_US, "dominant_cause": cause,
        }
        if cause == "host launch lateness" and host_top:
            row["top_blockers"] = "; ".join(f"{name} ({t / NS_PER_US:.1f} us)" for name, t in host_top)
        else:
            row["top_blockers"] = "; ".join(f"{name} ({a / NS_PER_US:.1f} us)" for name, _, _, a in top[:TOP_N])
        for b, (name, stream, exc, _) in enumerate(top[:TOP_N], 1):
            row[f"blocker_{b}"] = name
            row[f"blocker_{b}_stream"] = stream
            row[f"blocker_{b}_excess_us"] = None if np.isnan(exc) else exc / NS_PER_US
        rows.append(row)

    blockers_df = pd.DataFrame(rows).reindex(columns=BLOCKER_COLUMNS)
    return blockers_df, _summarize_kernels(kernel_hits), _summarize_host(host_hits)


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
        ops = _ops_meeting(tl.cpu_parts, tids[mine], q_lo, q_hi)
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
