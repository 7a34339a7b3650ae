"""The profiler steps of a run, for the HTML report's time axis.

PyTorch's profiler writes one ``ProfilerStep#<n>`` CPU op (category
``user_annotation``, ``cpu_op`` or ``Operator``) per step on each rank.
``StepCollector`` picks a rank's out of its frames as they stream past (one C
row selection per EVENTS frame, skipped while the rank has no such name);
``step_table`` puts every rank's on the report's time axis.

A step starts, on the report's timeline, when its **earliest rank** starts
it: every collective of step n then lies at or after step n's mark (a rank's
collective kernels start after it entered the step, so the first arrival at
an instance does too), which a per-rank median would not guarantee.  The
timeline is the sheets' own: microseconds since the earliest rank's base
time, with the clock offsets subtracted when the report applied them.

The table travels beside the report's sheets (``tables[TABLE]``, then the
HTML writer's ``steps``), never as a sheet or a stream table: the workbook
and CSVs stay TraceLens's.
"""
import re

import numpy as np

from . import _native
from .stream.format import Kind

#: the key of the step table in the report's ``{name: DataFrame}`` tables
TABLE = "steps"

_CPU_CATEGORIES = ("cpu_op", "Operator", "user_annotation")
_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
# string classes: a CPU category; a ProfilerStep#<n> name
_CAT, _NAME = 1, 2


class StepCollector:
    """One rank's ProfilerStep#<n> ops, from its frames (a STRINGS frame
    before the EVENTS frames that use its strings, as extract writes them)."""

    def __init__(self, rank):
        self.rank = rank
        self.strings = []
        self._cls = np.zeros(1024, dtype=np.uint16)   # slot len(strings) stays 0: ids not yet defined
        self._step_names = 0
        self._parts = []

    def add(self, frame):
        if self.rank is None:   # the trace's own rank, when the input named none
            self.rank = frame.rank
        if frame.kind == Kind.STRINGS:
            self._add_strings(frame.strings()[1])
        elif frame.kind == Kind.EVENTS and self._step_names:
            self._add_events(frame.records())

    def watch(self, frames):
        """``frames``, unchanged, taking each on the way."""
        for frame in frames:
            self.add(frame)
            yield frame

    def _add_strings(self, strings):
        n0 = len(self.strings)
        if n0 + len(strings) + 1 > len(self._cls):
            grown = np.zeros(max(n0 + len(strings) + 1, 2 * len(self._cls)), dtype=np.uint16)
            grown[:n0] = self._cls[:n0]
            self._cls = grown
        for i, s in enumerate(strings, start=n0):
            if s in _CPU_CATEGORIES:
                self._cls[i] = _CAT
            elif s.startswith("ProfilerStep#"):
                self._cls[i] = _NAME
                self._step_names += 1
        self.strings.extend(strings)

    def _add_events(self, records):
        (rows,) = _native.select_many(records, self._cls, len(self.strings), (
            dict(cat_any=_CAT, name_any=_NAME, flags_all=_native.FLAGS["has_ts"], ph=b"X"),))
        if len(rows):
            ts = records["ts"][rows]
            self._parts.append((records["name"][rows], ts, ts + records["dur"][rows]))

    def finish(self):
        """(rank, step numbers, starts, ends): raw ns of the rank's trace (from
        its base time), one row per step number (its earliest op)."""
        if self._parts:
            names, starts, ends = (np.concatenate(c) for c in zip(*self._parts))
        else:
            names = starts = ends = np.empty(0, np.int64)
        return rank_steps(self.rank, names, starts, ends, strings=self.strings)


def rank_steps(rank, names, starts, ends, strings=None):
    """(rank, step numbers, starts, ends) of one rank's ProfilerStep ops:
    ``names`` are string ids into ``strings``, or the names themselves.
    Names that are not ProfilerStep#<n> are left out; a step number seen
    twice keeps its earliest op."""
    names = [strings[int(i)] if strings is not None else str(i) for i in np.asarray(names).tolist()]
    numbers = np.array([int(m.group(1)) if m else -1 for m in map(_STEP_NAME.match, names)], dtype=np.int64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    keep = numbers >= 0
    numbers, starts, ends = numbers[keep], starts[keep], ends[keep]
    order = np.lexsort((starts, numbers))
    numbers, starts, ends = numbers[order], starts[order], ends[order]
    first = np.r_[True, numbers[1:] != numbers[:-1]] if len(numbers) else np.zeros(0, dtype=bool)
    return rank, numbers[first], starts[first], ends[first]


#: align's per-rank summary (its name and version live here, below align,
#: so that reading a stream's steps needs nothing above this layer)
SUMMARY_NAME, SUMMARY_VERSION = "align.rank", "2"


class StreamSteps:
    """The profiler steps of every rank of a stream (frames of any ranks,
    interleaved).  A rank whose announcement lists align's summary
    (``align.rank`` at the version align reads) takes its steps from that
    summary (RankResult.steps, the same ``rank_steps`` of the same ops)
    and none of its EVENTS frames is unpacked; any other rank's come from
    its events, through a StepCollector."""

    def __init__(self):
        self.ranks = {}       # rank -> its StepCollector, or its steps once read from its summary
        self.announced = set()

    def watch(self, frames):
        for frame in frames:
            kind = frame.kind
            if kind == Kind.SUMMARY:
                self._summary(frame)
            elif kind in (Kind.STRINGS, Kind.EVENTS) and frame.rank not in self.announced:
                collector = self.ranks.get(frame.rank)
                if collector is None:
                    collector = self.ranks[frame.rank] = StepCollector(frame.rank)
                collector.add(frame)
            yield frame

    def _summary(self, frame):
        from .stream.summaries import ANNOUNCE

        name, r = frame.summary_header()["name"], frame.rank
        if name == ANNOUNCE:
            versions = frame.summary()[2]   # a few bytes
            if isinstance(versions, dict) and versions.get(SUMMARY_NAME) == SUMMARY_VERSION \
                    and r not in self.ranks:
                self.announced.add(r)
                self.ranks[r] = None   # its place in the order, until its summary comes
        elif name == SUMMARY_NAME and r in self.announced and self.ranks.get(r) is None:
            value = frame.summary()[2]
            steps = value.get("steps") if isinstance(value, dict) else None
            if not (isinstance(steps, tuple) and len(steps) == 3
                    and all(isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype.kind == "i"
                            and len(a) == len(steps[0]) for a in steps)):
                raise frame.error("corrupt SUMMARY frame (its ProfilerSteps are not three arrays of integers "
                                  "of one length)")
            self.ranks[r] = (r, *steps)

    def finish(self):
        """Every rank's steps (``StepCollector.finish()`` results), or None
        when the stream had no events or summaries to look in (tables only)."""
        from .errors import StreamtraceError

        missing = sorted(r for r, v in self.ranks.items() if v is None)
        if missing:
            raise StreamtraceError(f"rank {missing[0]}: the stream announces its summary but holds none "
                                   "(extract the traces again)")
        return [v.finish() if isinstance(v, StepCollector) else v for v in self.ranks.values()] \
            if self.ranks else None


def step_table(per_rank, tables):
    """The run's steps on the report's timeline (a DataFrame, one row per
    step number, in order), from ``per_rank`` (``StepCollector.finish()``
    results) and the align tables in ``tables`` (``align.ranks``' base
    times, ``align.clocks``' offsets where applied).  None without
    ``per_rank`` (no step data to look in).

    Columns: ``step`` (n of ProfilerStep#n), ``start_us`` (the earliest
    rank's start), ``last_start_us`` (the latest rank's), ``end_us`` (the
    latest rank's end), ``ranks`` (how many ranks have it)."""
    import pandas as pd

    columns = ["step", "start_us", "last_start_us", "end_us", "ranks"]
    if per_rank is None:
        return None
    ranks = tables.get("align.ranks")
    if ranks is None or not len(ranks):
        return pd.DataFrame({c: [] for c in columns})
    base = dict(zip(ranks["rank"].astype(int).tolist(), ranks["base_ns"].astype(np.int64).tolist()))
    common_base = min(base.values())   # the sheets' origin (report.sheets)
    offset = {}
    clocks = tables.get("align.clocks")
    if clocks is not None and len(clocks):
        applied = clocks["applied"].astype(str).str.lower() == "true"
        offset = dict(zip(clocks["rank"].astype(int).tolist(),
                          np.where(applied, clocks["offset_ns"].astype(np.int64), 0).tolist()))
    parts = []
    for rank, numbers, starts, ends in per_rank:
        if rank not in base or not len(numbers):
            continue
        shift = base[rank] - common_base - offset.get(rank, 0)
        parts.append(pd.DataFrame({"step": numbers, "start": starts + shift, "end": ends + shift}))
    if not parts:
        return pd.DataFrame({c: [] for c in columns})
    by_step = pd.concat(parts, ignore_index=True).groupby("step", sort=True)
    out = pd.DataFrame({"start_us": by_step["start"].min() / 1000.0, "last_start_us": by_step["start"].max() / 1000.0,
                        "end_us": by_step["end"].max() / 1000.0, "ranks": by_step.size()})
    return out.reset_index()[columns]


# ---------------------------------------------------------------- steps in align

#: align's table of the profiler steps each rank's window holds (match_ranks, when given steps)
STEPS_TABLE = "align.steps"
STEPS_COLUMNS = ["rank", "step", "start_ns", "end_ns", "shared", "collectives"]


def _with_markers(per_rank):
    """{rank: (numbers, starts, ends)} of the ranks that have ProfilerStep ops."""
    return {int(r): (n, s, e) for r, n, s, e in (per_rank or []) if len(n)}


def row_steps(per_rank, rank, t, base):
    """(per row: the ProfilerStep number whose range holds ``t`` on its rank,
    -1 when none does or its rank has no markers; {rank: {number: start in
    ns with the rank's ``base``}}), or (None, None) when no rank has markers.
    ``t``: per row, the trace's ns from its base time (the kernel's launch)."""
    marked = _with_markers(per_rank)
    if not marked:
        return None, None
    out = np.full(len(rank), -1, dtype=np.int64)
    starts_of = {}
    for r, (numbers, starts, ends) in marked.items():
        starts_of[r] = {int(n): int(s) + base.get(r, 0) for n, s in zip(numbers.tolist(), starts.tolist())}
        mine = np.flatnonzero(rank == r)
        if not len(mine):
            continue
        order = np.argsort(starts, kind="stable")
        s_sorted, e_sorted, n_sorted = starts[order], ends[order], numbers[order]
        k = np.searchsorted(s_sorted, t[mine], "right") - 1
        inside = (k >= 0) & (t[mine] <= e_sorted[np.maximum(k, 0)])
        out[mine[inside]] = n_sorted[k[inside]]
    return out, starts_of


def step_coverage(per_rank, present, row_step, rank):
    """``align.steps``: a row per (rank, step) of the ranks present with
    ProfilerStep markers: the step's start and end (ns from the rank's base
    time), ``shared`` (every rank with markers holds it) and the rank's
    collective kernels launched in it.  None when no rank has markers."""
    import pandas as pd

    marked = {r: v for r, v in _with_markers(per_rank).items() if r in set(present)}
    if not marked:
        return None
    common = set.intersection(*(set(n.tolist()) for n, _, _ in marked.values()))
    rows = []
    for r in sorted(marked):
        numbers, starts, ends = marked[r]
        mine = row_step[rank == r] if row_step is not None else np.empty(0, np.int64)
        held, counts = np.unique(mine[mine >= 0], return_counts=True)
        count_of = dict(zip(held.tolist(), counts.tolist()))
        for n, s, e in zip(numbers.tolist(), starts.tolist(), ends.tolist()):
            rows.append((r, n, s, e, n in common, count_of.get(n, 0)))
    cols = list(zip(*rows))
    dtypes = (np.int64, np.int64, np.int64, np.int64, bool, np.int64)
    return pd.DataFrame({c: np.array(v, dtype=t) for c, v, t in zip(STEPS_COLUMNS, cols, dtypes)})


def left_out_steps(coverage):
    """{step number: [ranks holding it]} of the steps not every rank with markers holds."""
    out = {}
    if coverage is None:
        return out
    for r, n, shared in zip(coverage["rank"].tolist(), coverage["step"].tolist(), coverage["shared"].tolist()):
        if not shared:
            out.setdefault(int(n), []).append(int(r))
    return dict(sorted(out.items()))


def rows_in_left_out_steps(rank, t, coverage):
    """Per row (``rank``, ``t``: the kernel's launch, else its start, in ns
    of its rank's trace from its base time, as ``align.steps``' times):
    whether it lies in a step of its rank that ``coverage`` (``align.steps``)
    says not every rank holds."""
    out = np.zeros(len(rank), dtype=bool)
    if coverage is None or not len(coverage):
        return out
    left = coverage[~coverage["shared"].astype(bool)]
    for r, steps in left.groupby("rank"):
        mine = np.flatnonzero(rank == int(r))
        if not len(mine):
            continue
        starts, ends = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        k = np.searchsorted(starts, t[mine], "right") - 1
        out[mine] = (k >= 0) & (t[mine] <= ends[np.maximum(k, 0)])
    return out


def coverage_findings(coverage):
    """align.quality rows (finding dicts) for ``align.steps``: one warning
    ``steps_not_shared`` when the ranks' windows cover different steps."""
    left = left_out_steps(coverage)
    if not left:
        return []
    ranks = sorted(set(coverage["rank"].tolist()))
    shared = sorted(set(coverage.loc[coverage["shared"], "step"].tolist()))
    said = "; ".join(f"#{n} (only rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))})"
                     for n, rs in list(left.items())[:10]) + ("; ..." if len(left) > 10 else "")
    common = (f"they share {len(shared)} step(s) (#{shared[0]}..#{shared[-1]})" if shared
              else "they share no step")
    message = (f"profiled windows cover different steps: of {len(ranks)} rank(s) with ProfilerStep markers, {common}; "
               f"{len(left)} step(s) left out of the comparison: {said}; collectives pair only within one step")
    return [{"severity": "warning", "category": "steps_not_shared", "rank": None, "pg": None, "collective_id": None,
             "count": len(left), "message": message}]


def clock_step_findings(clocks, per_rank, base):
    """align.quality rows (finding dicts) for ranks whose estimated clock
    offset the ProfilerStep markers contradict.  Steps are synchronised by
    their collectives: a late rank starts a step late (a straggler) but
    hardly ends it late, or the reverse, so two ranks whose shared steps
    start, or end, close together on the clocks as recorded cannot have
    clocks much further apart.  A contradiction is an offset further than
    half the median step's length (at least 1 ms) from both the median
    difference of the shared steps' starts and that of their ends
    (``base``: {rank: base ns}, for the steps' times)."""
    marked = _with_markers(per_rank)
    out = []
    if clocks is None or not len(clocks) or len(marked) < 2:
        return out
    starts = {r: dict(zip(n.tolist(), (s + base.get(r, 0)).tolist())) for r, (n, s, _) in marked.items()}
    ends = {r: dict(zip(n.tolist(), (e + base.get(r, 0)).tolist())) for r, (n, _, e) in marked.items()}
    lengths = np.concatenate([e - s for _, s, e in marked.values()])
    bound = max(1_000_000, int(np.median(lengths)) // 2)
    for r, offset, ref, n in zip(clocks["rank"].tolist(), clocks["offset_ns"].tolist(),
                                 clocks["reference_rank"].tolist(), clocks["collectives"].tolist()):
        if r == ref or r not in starts or ref not in starts or not n:
            continue
        shared = sorted(set(starts[r]) & set(starts[ref]))
        if not shared:
            continue
        apart = float(np.median([starts[r][k] - starts[ref][k] for k in shared]))
        apart_end = float(np.median([ends[r][k] - ends[ref][k] for k in shared]))
        if min(abs(offset - apart), abs(offset - apart_end)) > bound:
            out.append({"severity": "warning", "category": "clock_offset_steps_disagree", "rank": int(r), "pg": None,
                        "collective_id": None, "count": len(shared),
                        "message": f"rank {r}: its clock offset estimated from {n} collective end(s), "
                                   f"{offset / 1000:.1f} us from rank {ref}'s, disagrees with their "
                                   f"{len(shared)} shared ProfilerStep(s), which start {apart / 1000:.1f} us and end "
                                   f"{apart_end / 1000:.1f} us apart (medians) on the clocks as recorded: the offset "
                                   "is doubtful"})
    return out
