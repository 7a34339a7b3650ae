"""The fused file's last bytes: ``displayTimeUnit`` and the ``streamtrace``
member (every rank's top-level metadata, per-rank facts, options, warnings),
and the warnings each rank's passes produced."""
import json
import math

import numpy as np

from ..extract import VERSION
from ..remote import source_label


def _rank_warnings(rk):
    s, w = rk.stats, []
    if s["lane_moves"]:
        tracks = sum(1 for t in rk.tracks if t["n_lanes"] > 1)
        w.append(f"rank {rk.rank}: {s['lane_moves']} X events overlapped another on the same track without "
                 f"nesting (Perfetto would drop them); moved to sibling lanes on {tracks} track(s)")
    if s["lanes_forced"]:
        w.append(f"rank {rk.rank}: {s['lanes_forced']} X events still overlap after {64} lanes on one track")
    ws = rk.write_stats or {}
    for key, what in (("bad_literals", "values that are not JSON (NaN, Infinity, ...) were written as null"),
                      ("repaired_strings", "strings with invalid escapes, control bytes or invalid UTF-8 "
                                           "were repaired"),
                      ("ts_unshifted", "ts values too long for exact shifting were left unshifted"),
                      ("id_overflow", "ids were left as is because the rank offset would overflow")):
        if ws.get(key):
            w.append(f"rank {rk.rank}: {ws[key]} {what}")
    return w


def _rank_summary(rk):
    ws = rk.write_stats or {}
    return {
        "source": source_label(rk.path),
        "events_seen": rk.stats["events_seen"],
        "events_written": ws.get("events_kept", 0),
        "dropped": {k[len("dropped_"):]: v for k, v in (ws or rk.stats).items() if k.startswith("dropped_") and v},
        "ts_shift_ns": rk.shift_ns,
        "clock_offset_ns": rk.clock_offset_ns,
        "base_time_ns": rk.base_ns or None,
        "id_offset": rk.id_offset,
        "pid_map": {str(k): v for k, v in sorted(rk.pid_map.items())},
        "lane_moves": rk.stats["lane_moves"],
        "interval_runs": rk.spilled_runs,
        "truncated_at_byte": rk.truncated_at,
        "timeline_ns": [rk.stats["ts_min_ns"], rk.stats["ts_max_ns"]]
        if rk.stats["ts_max_ns"] >= rk.stats["ts_min_ns"] else None,
    }


def _trailer(ranks_, opts, warnings, id_stride, pid_stride, dense, common_base, clocks, seconds, extra=None):
    units = {rk.trace.get("displayTimeUnit") for rk in ranks_}
    meta = _meta(ranks_, opts, warnings, id_stride, pid_stride, dense, common_base, clocks, seconds, extra)
    tail = b"]"
    if len(units) == 1 and isinstance(next(iter(units)), str):
        tail += b',"displayTimeUnit":' + json.dumps(next(iter(units))).encode()
    tail += b',"streamtrace":' + json.dumps(meta, separators=(",", ":"), allow_nan=False,
                                            default=_json_default).encode() + b"}"
    return tail


def _meta(ranks_, opts, warnings, id_stride, pid_stride, dense, common_base, clocks, seconds, extra=None):
    """The ``streamtrace`` member: every rank's metadata, per-rank facts, the
    options, the warnings (``extra``: members a format or an option adds)."""
    inputs = {}
    for rk in ranks_:
        inputs[str(rk.rank)] = _rank_summary(rk)
    meta = {
        "version": VERSION,
        "tool": "streamtrace fuse",
        "ranks": {str(rk.rank): rk.trace for rk in ranks_},
        "inputs": inputs,
        "id_stride": id_stride,
        "pid_stride": pid_stride,
        "pid_numbering": "dense" if dense else "rank*stride+pid",
        "time_base_ns": common_base,
        "options": {"include_pyfunc": opts.include_pyfunc, "keep_spans": opts.keep_spans,
                    "cats": list(opts.cats), "name_regex": opts.name_regex,
                    "window_ns": list(opts.window) if opts.window else None, "nccl_only": opts.nccl_only,
                    "align_clocks": opts.align_clocks, "time_base": opts.time_base},
        "warnings": warnings,
        "seconds": round(seconds, 3),
    }
    if clocks is not None:
        meta["clock_alignment"] = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in json.loads(clocks.to_json(orient="records"))]
    meta.update(extra or {})
    return meta


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return None if math.isnan(o) else float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
