"""``--mark critical_path`` (``--critical_path``): each profiler step's
critical path (streamtrace.critical, docs/critical-path.md) drawn on the
fused timeline, on one top-level track, ``critical path``.

Per step, a slice ``step N: <time> ms, ranks <visited>`` spans the path and
holds its segments as child slices, one per row of the ``critical_path``
sheet, named ``<category>: <detail>`` (``late rank wait: rank 3: compute
slow_gemm...``, ``compute <kernel identity>``), the sheet's columns as args.
A step whose path overlaps the one before it on the track (the last GPU work
of a step can end after the next step starts) goes to a sibling row,
``critical path (lane k)``, so every row stays properly nested.

The analysis' times are on the clocks the blocking analysis uses (each
rank's base time, minus the clock offset the clock rule applied); a
segment is placed on the fused timeline with the shift of the rank it is on
(``rank``), so it lines up with that rank's kernels.  When the fused
timeline keeps clock offsets the analysis applied (fuse without
``--align_clocks``), consecutive segments on different ranks can overlap
there: the later one is clipped to start where the earlier ends (its args
keep the analysis' times) and a warning says how many.
"""
import logging
import math

from ..errors import StreamtraceError

log = logging.getLogger("streamtrace")

PID = "critical path"
CAT, STEP_CAT = "streamtrace.critical_path", "streamtrace.critical_step"
SORT_INDEX = -1          # above every rank's processes


def no_path_error(ranks_):
    names = [str(rk.path) for rk in ranks_]
    where = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
    return StreamtraceError(f"--mark critical_path: {where}: no GPU collective or send/recv the align stage "
                            "matched across the ranks: no cross-rank critical path to mark; nothing written")


def critical_path_marks(ranks_, tables, window=None):
    """The track's events (Chrome-trace dicts, ts in us on the fused
    timeline) from ``chain.correlated_tables(..., critical=True)``'s tables."""
    from .. import critical

    coll, p2p = tables.get("align.collectives"), tables.get("align.p2p")
    if (coll is None or not len(coll)) and (p2p is None or not len(p2p)):
        raise no_path_error(ranks_)
    result = critical.compute(tables)
    path, steps = result["critical_path"], result["critical_steps"]
    if not len(path):
        raise no_path_error(ranks_)
    to_fused = _to_fused(ranks_, tables)
    # each step's origin on the analysis' clocks: its earliest rank's start (critical.steps)
    origin = tables["critical.steps"].groupby("step")["start"].min().to_dict()
    info = {int(s): (float(us), str(v)) for s, us, v in zip(steps["step"], steps["step_us"], steps["ranks_visited"])}
    lo, hi = window if window is not None else (None, None)
    lanes, events, clipped = [], [], 0
    for step, rows in path.groupby("step", sort=True):
        step = int(step)
        segs, end = [], None
        for r in rows.sort_values("order").to_dict("records"):
            rank = int(r["rank"])
            s = int(origin[step]) + int(round(r["start_us"] * 1000)) + to_fused[rank]
            e = int(origin[step]) + int(round(r["end_us"] * 1000)) + to_fused[rank]
            if end is not None and s < end:   # the fused timeline's clocks disagree with the analysis'
                clipped += 1
                s, e = end, max(e, end)
            end = e
            segs.append((s, e, r))
        first, last = segs[0][0], segs[-1][1]
        if (lo is not None and last < lo) or (hi is not None and first > hi):
            continue
        lane = next((k for k, free in enumerate(lanes) if free <= first), None)
        if lane is None:
            lanes.append(last)
            lane = len(lanes) - 1
        lanes[lane] = last
        tid = PID if lane == 0 else f"{PID} (lane {lane + 1})"
        step_us, visited = info.get(step, (None, ""))
        events.append({"ph": "X", "cat": STEP_CAT, "name": f"step {step}: {(step_us or 0) / 1000:.3f} ms, ranks "
                       f"{visited}", "pid": PID, "tid": tid, "ts": first / 1000, "dur": (last - first) / 1000,
                       "args": {"step": step, "step_us": step_us, "ranks_visited": visited,
                                "segments": len(segs)}})
        for s, e, r in segs:
            if (lo is not None and e < lo) or (hi is not None and s > hi):
                continue
            args = {"step": step, "order": int(r["order"]), "category": r["category"], "detail": r["detail"],
                    "on_rank": int(r["rank"]), "waited_for": _plain(r["waited_for"]),
                    "start_us": float(r["start_us"]), "end_us": float(r["end_us"]), "dur_us": float(r["dur_us"]),
                    "share_pct": float(r["share_pct"])}
            events.append({"ph": "X", "cat": CAT, "name": f"{r['category']}: {r['detail']}", "pid": PID, "tid": tid,
                           "ts": s / 1000, "dur": (e - s) / 1000,
                           "args": {k: v for k, v in args.items() if v is not None}})
    if clipped:
        log.warning(f"--mark critical_path: {clipped} segment(s) overlapped the one before them on the fused "
                    "timeline (its clocks keep offsets the analysis applied) and were clipped; --align_clocks "
                    "places the ranks as the analysis does")
    labels = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": PID}},
              {"name": "process_sort_index", "ph": "M", "pid": PID, "tid": 0, "args": {"sort_index": SORT_INDEX}}]
    for lane in range(len(lanes)):
        tid = PID if lane == 0 else f"{PID} (lane {lane + 1})"
        labels.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": tid}})
    return labels + events


def _to_fused(ranks_, tables):
    """{rank: ns to add to the analysis' times to reach the fused timeline}:
    the analysis' clock is the trace's own plus its base time minus the
    clock offset the blocking analysis applied; the fused one the trace's
    own plus the rank's shift."""
    offsets = {}
    clocks = tables.get("blocking.clocks")
    if clocks is not None and len(clocks):
        for r, off, applied in zip(clocks["rank"], clocks["offset_ns"], clocks["applied"]):
            if str(applied).lower() == "true" and _finite(off):
                offsets[int(r)] = int(off)
    return {rk.rank: rk.shift_ns - rk.base_ns + offsets.get(rk.rank, 0) for rk in ranks_}


def _finite(v):
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _plain(v):
    if v is None:
        return None
    try:
        if v != v:   # NaN, pd.NA raises
            return None
    except TypeError:
        return None
    return v.item() if hasattr(v, "item") else v
