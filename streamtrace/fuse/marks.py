"""``--mark blockers``: the blocking analysis' answer drawn on the fused
timeline, so the view opens on it.  One track per rank (``RANK r -
blockers``, thread ``late arrivals``) with a slice per late arrival: from when
the reference rank arrived to when this rank did (``delta_us`` of the
``collective_blockers`` sheet), named after the collective, its args the
dominant cause and the kernels that blocked it (``blocker_1..3`` with their
streams and excess, ``top_blockers``: the names ``streamtrace blockers``
prints).  ``--mark critical_path``: each step's critical path on one
track (critical_marks.py).  The marks are ordinary events (string pid),
written by both formats' writers before the ranks' events."""
import math

from ..errors import StreamtraceError

MARKS = ("blockers", "critical_path")
MARK_SLOT = 899            # process_sort_index r * 1000 + 899: after the rank's processes, before string pids


def parse_marks(marks):
    marks = tuple(marks or ())
    for m in marks:
        if m not in MARKS:
            raise StreamtraceError(f"--mark {m!r}: expected one of {', '.join(MARKS)}")
    return marks


def analysis_marks(ranks_, marks, jobs, align_clocks, window=None):
    """The events of the marks asked for, from one run of the blocking
    analysis (with the critical path's graph when that is marked)."""
    from ..chain import correlated_tables
    from .critical_marks import critical_path_marks

    tables = correlated_tables([rk.path for rk in ranks_], jobs=jobs, align_clocks=True if align_clocks else None,
                               critical="critical_path" in marks)
    events = []
    if "critical_path" in marks:
        events += critical_path_marks(ranks_, tables, window)
    if "blockers" in marks:
        events += blocker_marks(ranks_, jobs, align_clocks, window, tables=tables)
    return events


def blocker_marks(ranks_, jobs, align_clocks, window=None, tables=None):
    """The mark events (Chrome-trace dicts, ts in us on the fused timeline);
    ``tables``: the blocking analysis' (None: run it here)."""
    from ..chain import correlated_tables

    if tables is None:
        tables = correlated_tables([rk.path for rk in ranks_], jobs=jobs,
                                   align_clocks=True if align_clocks else None)
    late = tables.get("correlate.collective_blockers")
    coll = tables.get("align.collectives")
    if late is None or coll is None:
        return []
    shift = {rk.rank: rk.shift_ns for rk in ranks_}
    arrivals = {(str(c), int(r)): int(t) for c, r, t in zip(coll["collective_id"], coll["rank"], coll["ts_ns"])}
    lo, hi = window if window is not None else (None, None)
    events, tracks = [], set()
    for row in late.to_dict("records"):
        rank, cid, delta = row.get("late_rank"), str(row.get("collective_id")), _num(row.get("delta_us"))
        if rank is None or _num(rank) is None or not delta or delta <= 0 or int(rank) not in shift:
            continue
        rank = int(rank)
        arrival = arrivals.get((cid, rank))
        if arrival is None:
            continue
        end = arrival + shift[rank]
        start = end - int(round(delta * 1000))
        if (lo is not None and end < lo) or (hi is not None and start > hi):
            continue
        args = {"collective_id": cid, "collective": row.get("Collective name"), "pg": row.get("Process Group Name"),
                "reference_rank": row.get("reference_rank"), "delta_us": delta, "blame_us": row.get("blame_us"),
                "dominant_cause": row.get("dominant_cause"), "top_blockers": row.get("top_blockers")}
        for i in (1, 2, 3):
            for suffix in ("", "_stream", "_excess_us"):
                args[f"blocker_{i}{suffix}"] = row.get(f"blocker_{i}{suffix}")
        args = {k: _plain(v) for k, v in args.items() if _plain(v) is not None}
        blocker = args.get("blocker_1") or (args.get("top_blockers") or "").split(";")[0].strip()
        name = f"late {args.get('collective', '')} {cid} +{delta:.1f} us" + (f": {blocker}" if blocker else "")
        pid = f"RANK {rank} - blockers"
        tracks.add((rank, pid))
        events.append({"ph": "X", "cat": "streamtrace.blockers", "name": name, "pid": pid, "tid": "late arrivals",
                       "ts": start / 1000, "dur": (end - start) / 1000, "args": dict(args, rank=rank)})
    labels = []
    for rank, pid in sorted(tracks):
        labels.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": pid}})
        labels.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": rank * 1000 + MARK_SLOT}})
    return labels + events


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _plain(v):
    """A table cell as JSON: numpy scalars as Python ones, NaN as None."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
