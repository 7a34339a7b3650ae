"""``--focus``: a window of the fused timeline chosen from the analysis, for
jobs too big to look at whole.

- ``worst``: the collective instance with the most waiting (the sum over its
  ranks of how long each started before the last one), all its ranks, with a
  margin before and after;
- ``collective:ID``: that instance (``collective_id`` as in the report's sheets);
- ``step:N``: ProfilerStep#N from its first start to its last end over the ranks;
- ``time:T0:T1``: microseconds on the fused timeline (as ``--window``).

The collectives and steps come from the align stage over the ranks being
fused (extract + align: one more read of each input; shared with
``--align_clocks``); their times are moved to the fused timeline with each
rank's shift, so the window is right with and without ``--time_base`` or
``--align_clocks``.
"""
from dataclasses import dataclass

from ..errors import StreamtraceError
from .options import parse_window

MARGIN_FRACTION = 0.5      # a collective's window: its span plus half of it on each side ...
MIN_MARGIN_NS = 100_000    # ... and at least 100 us, to show what led to it


@dataclass
class FocusSpec:
    kind: str            # worst, collective, step, time
    arg: object = None
    text: str = ""


def parse_focus(text):
    """``worst``, ``collective:ID``, ``step:N`` or ``time:T0:T1`` -> FocusSpec (a bad one: one line)."""
    if text is None:
        return None
    kind, _, arg = str(text).partition(":")
    if kind == "worst" and not arg:
        return FocusSpec("worst", None, text)
    if kind == "collective" and arg:
        return FocusSpec("collective", arg, text)
    if kind == "step":
        try:
            return FocusSpec("step", int(arg), text)
        except ValueError:
            raise StreamtraceError(f"--focus {text!r}: step:N takes a ProfilerStep number, e.g. step:12") from None
    if kind == "time":
        lo, hi = parse_window(arg) if ":" in arg else (None, None)
        if lo is None or hi is None:
            raise StreamtraceError(f"--focus {text!r}: time:T0:T1 takes both ends, microseconds on the fused "
                                   "timeline")
        return FocusSpec("time", (lo, hi), text)
    raise StreamtraceError(f"--focus {text!r}: expected worst, collective:ID, step:N or time:T0:T1")


def needs_analysis(spec):
    return spec is not None and spec.kind != "time"


def resolve(spec, ranks_, tables):
    """(lo_ns, hi_ns, info) on the fused timeline; ``tables``: the align
    stage's tables over ``ranks_`` (None for ``time``)."""
    if spec.kind == "time":
        lo, hi = spec.arg
        return lo, hi, _info(spec, lo, hi, f"time {spec.text[5:]}")
    shift = {rk.rank: rk.shift_ns for rk in ranks_}
    if spec.kind == "step":
        return _step(spec, tables["align.steps"], shift)
    return _collective(spec, tables["align.collectives"], shift)


def _info(spec, lo, hi, label, **more):
    return dict(spec=spec.text, label=label, window_ns=[int(lo), int(hi)],
                window_us=f"{lo / 1000:.3f}:{hi / 1000:.3f}", **more)


def _step(spec, steps, shift):
    rows = steps[(steps["step"] == spec.arg) & steps["rank"].isin(list(shift))]
    if rows.empty:
        have = sorted({int(s) for s in steps["step"]})
        what = f"the traces hold steps {have[0]} to {have[-1]}" if have else "the traces hold no ProfilerStep"
        raise StreamtraceError(f"--focus {spec.text}: no ProfilerStep#{spec.arg} ({what})")
    lo = min(int(r.start_ns) + shift[int(r.rank)] for r in rows.itertuples())
    hi = max(int(r.end_ns) + shift[int(r.rank)] for r in rows.itertuples())
    return lo, hi, _info(spec, lo, hi, f"ProfilerStep#{spec.arg}", step=spec.arg,
                         ranks=sorted(int(r) for r in rows["rank"].unique()))


def _collective(spec, coll, shift):
    coll = coll[coll["rank"].isin(list(shift))]
    if coll.empty:
        raise StreamtraceError(f"--focus {spec.text}: the traces hold no collective the align stage matched")
    if spec.kind == "collective":
        cid = spec.arg
        rows = coll[coll["collective_id"].astype(str) == cid]
        if rows.empty:
            ids = sorted(coll["collective_id"].astype(str).unique())
            raise StreamtraceError(f"--focus {spec.text}: no collective {cid!r} (ids as in the report's sheets, "
                                   f"e.g. {', '.join(ids[:3])})")
        wait = _waits(coll).get(cid, 0)
    else:
        waits = _waits(coll)
        cid = max(waits, key=lambda c: (waits[c], c))   # ties: the same answer every run
        wait = waits[cid]
        rows = coll[coll["collective_id"].astype(str) == cid]
    start = min(int(r.ts_ns) + shift[int(r.rank)] for r in rows.itertuples())
    end = max(int(r.ts_ns) + int(r.dur_ns) + shift[int(r.rank)] for r in rows.itertuples())
    margin = max(int((end - start) * MARGIN_FRACTION), MIN_MARGIN_NS)
    first = rows.iloc[0]
    name = first.get("collective_name") or first.get("kernel_name")
    label = f"collective {cid} ({name}, pg {first.get('pg')})"
    return start - margin, end + margin, _info(
        spec, start - margin, end + margin, label, collective_id=cid, collective_name=str(name),
        pg=str(first.get("pg")), waiting_us=round(wait / 1000, 3), instance_ns=[start, end],
        ranks=sorted(int(r) for r in rows["rank"].unique()))


def _waits(coll):
    """collective_id -> ns the ranks spent waiting for the last one to start
    (on the align stage's timeline: the clocks as it estimated them)."""
    t = coll[["collective_id", "ts_aligned_ns"]].dropna().copy()
    t["collective_id"] = t["collective_id"].astype(str)
    t["ts_aligned_ns"] = t["ts_aligned_ns"].astype("int64")
    last = t.groupby("collective_id")["ts_aligned_ns"].transform("max")
    return (last - t["ts_aligned_ns"]).groupby(t["collective_id"]).sum().astype("int64").to_dict()
