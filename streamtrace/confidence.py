"""How far an answer can be trusted: one model, shown with every answer
(``blockers``' first lines, the HTML report's header, ``collective-report``'s
closing line, the blocking sheets' ``confidence`` sheet, the Python API).

It is computed from what align and correlate already know -- the
``align.ranks``, ``align.collectives`` and ``align.clocks`` tables and the
``steps`` table -- and gives a level (high / medium / low) and the reasons
in words, each naming its number.  A clean run is "high" with no reasons.

It also holds the clock rule of streamtrace's own analyses (``clock_rule``):
whether the estimated per-rank clock offsets are applied before waiting is
read from start times.  docs/confidence.md is the one page that describes
both, with the numbers below.
"""
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .steps import STEPS_TABLE, rows_in_left_out_steps

LEVELS = ("high", "medium", "low")

# ---- the clock rule's numbers (docs/confidence.md)
#: an offset is well determined when it rests on at least this many collectives ...
CLOCK_MIN_COLLECTIVES = 8
#: ... and the collective ends still disagree by at most this median after applying it (ns)
CLOCK_MAX_RESIDUAL_NS = 5_000
#: offsets are large when they spread over more than this (ns) ...
CLOCK_LARGE_NS = 10_000
#: ... and over more than this share of the median skew in start time, which
#: they would otherwise be read as
CLOCK_LARGE_SHARE = 0.25

# ---- the model's numbers
#: a collective with fewer of its members present than this share is no
#: evidence of who arrived last (the last may be among the absent)
MOSTLY_ABSENT_SHARE = 0.5
#: an answer that rests on fewer matched collectives than this is thin
FEW_COLLECTIVES = 5
#: fewer ranks present than this share of the world size: low (else medium)
FEW_RANKS_SHARE = 0.5
#: fewer collectives matched on all their members than this share: low (else medium)
FEW_MATCHED_SHARE = 0.5

#: the table of the clocks streamtrace's own analyses (correlate, p2p) used,
#: when the collective report's ``align.*`` tables keep TraceLens's clocks
BLOCKING_CLOCKS = "blocking.clocks"

TABLE_COLUMNS = ["check", "level", "value", "detail"]


@dataclass
class Reason:
    check: str
    level: str
    value: object
    text: str


@dataclass
class ClockRule:
    """What the clock rule says of a run's offsets.  ``state``: "none" (no
    offsets estimated), "small" (kept: too small to matter), "apply" (well
    determined and large: applied), "unreliable" (large, not well determined:
    kept, and waiting figures are not reliable)."""
    state: str
    spread_ns: int = 0
    skew_ns: float = 0.0
    collectives: int = 0
    residual_ns: float = float("nan")

    @property
    def apply(self):
        return self.state == "apply"

    def words(self):
        spread, skew = _us(self.spread_ns), _us(self.skew_ns)
        rest = f"rest on as few as {self.collectives} collectives, median residual up to {_us(self.residual_ns)}"
        if self.state == "none":
            return "no clock offsets could be estimated"
        if self.state == "small":
            return f"clock offsets of up to {spread} are small against the median skew of {skew}: kept as recorded"
        if self.state == "apply":
            return f"clock offsets of up to {spread} (median skew {skew}) are well determined ({rest})"
        return (f"clock offsets of up to {spread} (median skew {skew}) are not well determined ({rest}; "
                f"well determined needs >= {CLOCK_MIN_COLLECTIVES} collectives and <= "
                f"{_us(CLOCK_MAX_RESIDUAL_NS)})")


@dataclass
class Confidence:
    """A level, the reasons behind it (none for a clean run), and the facts
    every summary states (``ranks_present`` of ``world_size``)."""
    level: str
    reasons: list = field(default_factory=list)
    ranks_present: int = 0
    world_size: int = 0
    absent: list = field(default_factory=list)
    collectives: int = 0
    matched_full: int = 0
    clocks: str = "clocks as recorded"
    no_gpu_collectives: bool = False
    left_out: int = 0   # collectives in steps not every rank's window holds (not counted)
    # collective_ids that are no evidence of who arrived last: most of their
    # members absent, or in a step not every rank's window holds
    not_evidence: frozenset = frozenset()

    def ranks_words(self):
        return f"{self.ranks_present} of {self.world_size} ranks"

    def headline(self):
        """One line: the level and the facts it rests on."""
        facts = [self.ranks_words()]
        if self.no_gpu_collectives:
            facts.append("no GPU collectives in these traces")
        elif not self.collectives and self.left_out:
            facts += ["no collective in a step every rank's window holds", self.clocks]
        elif not self.collectives:
            facts += ["point-to-point transfers only", self.clocks]
        else:
            facts.append(f"{self.matched_full} of {self.collectives} collectives matched on all their members"
                         + (" present" if self.absent else ""))
            facts.append(self.clocks)
        return f"Confidence: {self.level} ({'; '.join(facts)})"

    def lines(self):
        """The headline, then one line per caveat (none when clean)."""
        return [self.headline()] + [f"  - {r.level}: {r.text}" for r in self.reasons]

    def one_line(self):
        """Everything on one line (a command's closing stderr line)."""
        text = self.headline()
        return text + ("; " + "; ".join(r.text for r in self.reasons) if self.reasons else "")

    def table(self):
        """The ``confidence`` sheet: the overall level, the facts, then the caveats."""
        rows = [("overall", self.level, self.level, self.headline()),
                ("ranks present", "high" if not self.absent else _worst(r.level for r in self.reasons
                                                                         if r.check == "ranks present"),
                 self.ranks_present, self.ranks_words() + (f" (absent: {_rank_words(self.absent)})"
                                                           if self.absent else "")),
                ("clocks used", "high", self.clocks, self.clocks)]
        rows += [(r.check, r.level, r.value, r.text) for r in self.reasons if r.check != "ranks present"]
        return pd.DataFrame(rows, columns=TABLE_COLUMNS).astype({"value": str})

    def __str__(self):
        return "\n".join(self.lines())


# ====================================================================== the clock rule

def clock_rule(tables, rows=None):
    """The clock rule (docs/confidence.md) over a run's ``align.clocks`` and
    ``align.collectives``, applied or not: a ``ClockRule``.  ``rows``:
    align.collectives without its point-to-point rows, when known."""
    est = _estimated(tables.get("align.clocks"))
    if est is None:
        return ClockRule("none")
    return _rule(est, _median_skew(_collective_rows(tables.get("align.collectives")) if rows is None else rows))


def rule_of(clocks, skew_ns):
    """The clock rule over ``clocks`` (align.clocks) given the median skew
    in start time (ns) it would otherwise be read as: what align's own
    findings use, before the tables exist."""
    est = _estimated(clocks)
    return ClockRule("none") if est is None else _rule(est, skew_ns)


def well_determined(clocks):
    """(whether the offsets are well determined, the fewest collectives a
    rank's offset rests on, the largest median residual in ns), or None
    when no offsets were estimated."""
    est = _estimated(clocks)
    if est is None:
        return None
    collectives = int(est["collectives"].min())
    residual = float(pd.to_numeric(est["residual_ns"], errors="coerce").max())
    well = collectives >= CLOCK_MIN_COLLECTIVES and residual == residual and residual <= CLOCK_MAX_RESIDUAL_NS
    return well, collectives, residual


def _estimated(clocks):
    """The rows of align.clocks with an estimate, None when fewer than two."""
    if clocks is None or not len(clocks):
        return None
    est = clocks[clocks["method"].astype(str) != "none"]
    return est if len(est) >= 2 else None


def _rule(est, skew):
    offsets = est["offset_ns"].astype(np.int64)
    spread = int(offsets.max() - offsets.min())
    well, collectives, residual = well_determined(est)
    rule = ClockRule("small", spread, float(skew), collectives, residual)
    if spread <= max(CLOCK_LARGE_NS, CLOCK_LARGE_SHARE * skew):
        return rule
    rule.state = "apply" if well else "unreliable"
    return rule


def _median_skew(df):
    """The median spread of start times, on the clocks as recorded, over the
    implicit-sync collectives (rows of align.collectives but point-to-point
    ones) with two or more members (all collectives when there are none of
    those)."""
    if df is None or not len(df):
        return 0.0
    order, starts = _instances(df)
    start = (df["ts_aligned_ns"].to_numpy(np.int64) + df["clock_offset_ns"].to_numpy(np.int64))[order]
    skew = np.maximum.reduceat(start, starts) - np.minimum.reduceat(start, starts)
    size = np.diff(np.r_[starts, len(order)])
    sync = np.logical_or.reduceat(df["implicit_sync"].to_numpy(bool)[order], starts)
    keep = size > 1
    if (keep & sync).any():
        keep &= sync
    return float(np.median(skew[keep])) if keep.any() else 0.0


def _instances(df):
    """(the rows' order by instance, where each instance starts in it)."""
    inst = df["instance"].to_numpy(np.int64)
    order = np.argsort(inst, kind="stable")   # align writes them sorted: a quick pass
    inst = inst[order]
    return order, np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])


def _collective_rows(collectives):
    """align.collectives without point-to-point rows."""
    if collectives is None or not len(collectives):
        return None
    # align matches every send/recv kernel (batch_isend_irecv's too) as "p2p", never as a collective
    p2p = collectives["match_method"].isin(["p2p"]).to_numpy(bool)
    return collectives[~p2p] if p2p.any() else collectives


# ====================================================================== the model

def assess(tables, clocks_used=None):
    """The Confidence of an answer made from ``tables`` (align's, and the
    ``steps`` table when there is one).  ``clocks_used``: words for the
    clocks the answer used, when not those of ``align.clocks`` (e.g. the
    collective report's, which differ between its sheets)."""
    reasons = []
    ranks = tables.get("align.ranks")
    present = sorted(int(r) for r in ranks["rank"].tolist()) if ranks is not None else []
    world = _world_size(ranks, present)
    absent = sorted(set(range(world)) - set(present)) if world else []
    if absent:
        level = "low" if len(present) < FEW_RANKS_SHARE * world else "medium"
        reasons.append(Reason("ranks present", level, len(present),
                              f"only {len(present)} of {world} ranks are present (absent: {_rank_words(absent)}); "
                              "every figure is over the ranks present"))
    truncated = [] if ranks is None else [int(r) for r, t in zip(ranks["rank"], ranks["truncated_at_byte"])
                                          if not pd.isna(t)]
    if truncated:
        reasons.append(Reason("truncated inputs", "medium", len(truncated),
                              f"{len(truncated)} rank(s) truncated ({_rank_words(truncated)}): events after the "
                              "cut are missing"))
    every = tables.get("align.collectives")
    rows = _collective_rows(every)
    no_gpu = every is None or not len(every)   # point-to-point kernels are GPU communication too
    n_inst = full = multi = left_out = 0
    not_evidence = frozenset()
    if no_gpu:
        reasons.append(Reason("collectives", "low", 0, "no GPU collectives in these traces: nothing to say about "
                                                       "waiting between ranks"))
    elif len(rows):
        # a collective of a step not every rank's window holds lacks members by
        # construction: counted neither as matched nor as missing (the steps reason says so)
        left = _in_left_out_steps(rows, tables.get(STEPS_TABLE))
        if left.any():
            left = rows["instance"].isin(rows.loc[left, "instance"].unique()).to_numpy(bool)
            left_out = int(rows.loc[left, "instance"].nunique())
        counted = rows[~left] if left_out else rows
        if len(counted):
            n_inst, full, multi, not_evidence = _matching(counted, present, world)
            if full < n_inst:
                level = "low" if full < FEW_MATCHED_SHARE * n_inst else "medium"
                reasons.append(Reason("matched on all members", level, f"{full}/{n_inst}",
                                      f"{n_inst - full} of {n_inst} collectives miss some of their members present"))
            if not_evidence:
                level = "low" if len(not_evidence) == n_inst else "medium"
                reasons.append(Reason("mostly absent", level, len(not_evidence),
                                      f"{len(not_evidence)} of {n_inst} collectives have most of their members "
                                      "absent: they are not counted as evidence of who arrived last"))
        if left_out:
            not_evidence = not_evidence | frozenset(rows.loc[left, "collective_id"].astype(str).unique())
        if multi < FEW_COLLECTIVES:
            reasons.append(Reason("evidence", "medium", multi, f"the answer rests on {multi} collective(s) matched "
                                                               f"across ranks (fewer than {FEW_COLLECTIVES})"))
        holding = set(np.unique(rows["rank"].to_numpy(np.int64)).tolist())
        with_none = [r for r in present if r not in holding]
        if with_none:
            reasons.append(Reason("ranks without collectives", "medium", len(with_none),
                                  f"{len(with_none)} of {len(present)} ranks present hold no collective kernels "
                                  f"({_rank_words(with_none)})"))
    p2p = _p2p_reason(tables.get("align.p2p"), tables.get("align.p2p_unmatched"))
    if p2p:
        reasons.append(p2p)
    rule = clock_rule(tables, rows)
    applied = _applied(tables.get("align.clocks"))
    words = "clock offsets applied" if applied else "clocks as recorded"
    if rule.state == "unreliable" and not applied:
        reasons.append(Reason("clocks", "low", _us(rule.spread_ns), rule.words() + ": kept as recorded, so the "
                              "waiting figures are not reliable"))
    elif rule.state == "unreliable":
        reasons.append(Reason("clocks", "medium", _us(rule.spread_ns), rule.words() + ": applied as asked"))
    elif rule.state == "apply" and not applied:
        reasons.append(Reason("clocks", "medium", _us(rule.spread_ns), rule.words() + " but not applied: waits "
                              "read from these start times include the clocks' disagreement"))
    elif rule.state == "apply":
        words = f"clock offsets of up to {_us(rule.spread_ns)} applied"
    steps = _step_reason(tables.get(STEPS_TABLE), tables.get("steps"), left_out)
    if steps:
        reasons.append(steps)
    level = _worst(r.level for r in reasons)
    return Confidence(level, reasons, len(present), world or len(present), absent, n_inst, full,
                      clocks_used or words, no_gpu, left_out, not_evidence)


def report_confidence(tables):
    """``assess`` for a report whose TraceLens sheets and whose own
    analyses (``BLOCKING_CLOCKS``) may use different clocks: judged on the
    clocks of its own analyses, the words naming each sheet's clocks."""
    blocking = tables.get(BLOCKING_CLOCKS)
    if blocking is None:
        return assess(tables)
    own, tracelens = _clock_words(blocking), _clock_words(tables.get("align.clocks"))
    words = None if own == tracelens else f"TraceLens's sheets: {tracelens}; blocking and p2p sheets: {own}"
    return assess(dict(tables, **{"align.clocks": blocking}), clocks_used=words)


def _clock_words(clocks):
    return "clock offsets applied" if _applied(clocks) else "clocks as recorded"


def _matching(rows, present, world):
    """(collectives, matched on all their members present, with two or more
    members, the collective_ids most of whose members are absent).  A
    collective's members: its ``Group size`` (else the world size in traces
    without process groups, else the most members seen);
    those present: its ``Process Group Ranks`` among the ranks present (else
    at most as many as are present)."""
    from .collectives import parse_rank_list

    present = set(present)

    def members_present(text):
        """How many of a rank list's ranks are present (NaN: no complete list)."""
        listed, truncated = parse_rank_list(text)
        return math.nan if listed is None or truncated else len(present.intersection(listed))

    expected = pd.to_numeric(rows["group_size"], errors="coerce")
    if world and expected.isna().any():   # traces without process groups (one group, "all"): every rank is a member
        expected = expected.where(expected.notna() | ~rows["pg"].isin(["all"]), world)
    order, starts = _instances(rows)
    members = np.maximum.reduceat(rows["participants"].to_numpy(np.int64)[order], starts)
    expected = np.fmax.reduceat(expected.to_numpy(np.float64)[order], starts)   # NaN: unknown
    expected = np.where(np.isnan(expected), members, expected)
    first = order[starts]
    codes, texts = pd.factorize(rows["pg_ranks"].to_numpy(object)[first])   # -1: no list
    listed = np.array([members_present(t) for t in texts.tolist()] + [math.nan], dtype=np.float64)[codes]
    here = np.where(np.isnan(listed), np.minimum(expected, len(present)), listed)
    full = int((members >= here).sum())
    mostly_absent = members < MOSTLY_ABSENT_SHARE * expected
    multi = int((members > 1).sum())
    return len(starts), full, multi, frozenset(rows["collective_id"].astype(str).to_numpy()[first[mostly_absent]])


def _p2p_reason(pairs, unmatched):
    """A Reason when send/recv halves (align.p2p: one row per matched pair;
    align.p2p_unmatched: one per half without a partner) went unpaired."""
    left = 0 if unmatched is None else len(unmatched)
    if not left:
        return None
    paired = 2 * (0 if pairs is None else len(pairs))
    halves = paired + left
    if not paired:
        return Reason("point-to-point", "low", f"0/{halves}",
                      f"none of the {halves} send/recv halves was paired with its peer's ({left} listed in "
                      "p2p_unmatched): the point-to-point figures rest on no matched transfer")
    level = "low" if paired < FEW_MATCHED_SHARE * halves else "medium"
    return Reason("point-to-point", level, f"{paired}/{halves}",
                  f"{paired} of {halves} send/recv halves paired with their peer's; {left} without a partner "
                  "(listed in p2p_unmatched)")


def _in_left_out_steps(rows, coverage):
    """Per row of align.collectives: whether it was launched (else started)
    in a step of its rank that not every rank's window holds (``coverage``:
    align.steps, or None)."""
    if coverage is None or not len(coverage) or coverage["shared"].astype(bool).all():
        return np.zeros(len(rows), dtype=bool)
    ts = rows["ts_ns"].to_numpy(np.int64)
    launch = pd.to_numeric(rows["launch_ts_ns"], errors="coerce").to_numpy(np.float64)
    t = np.where(np.isnan(launch), ts, np.nan_to_num(launch)).astype(np.int64)
    return rows_in_left_out_steps(rows["rank"].to_numpy(np.int64), t, coverage)


def _step_reason(coverage, steps, left_out=0):
    """A Reason when the ranks' profiled windows cover different steps:
    from align.steps (``coverage``: which steps every rank with markers
    holds), else from the report's ``steps`` table (how many ranks hold
    each).  ``left_out``: the collectives in those steps, not counted."""
    if coverage is not None and len(coverage):
        shared_of = coverage.groupby("step")["shared"].all()
        partial = sorted(int(n) for n, shared in shared_of.items() if not shared)
        shared, most = int(shared_of.sum()), int(coverage["rank"].nunique())
    elif steps is not None and len(steps):
        counts = steps["ranks"].astype(int)
        most = int(counts.max())
        partial = steps[counts < most]["step"].astype(int).tolist()
        shared = int((counts == most).sum())
    else:
        return None
    if not partial:
        return None
    held = f"{shared} step(s) held by all {most} ranks" if shared else f"no step held by all {most} ranks"
    text = (f"{_step_words(partial)} left out: not in every rank's window (the ranks' profiled windows cover "
            f"different steps; {held})")
    if left_out:
        text += (f"; their {left_out} collectives are counted neither as matched nor as missing, nor as evidence "
                 "of who arrived last")
    # no step in common: no collective can be compared across every rank
    return Reason("profiled windows", "medium" if shared else "low", len(partial), text)


def _runs(numbers):
    """Sorted distinct integers as (first, last) runs of consecutive ones."""
    numbers = sorted(set(int(n) for n in numbers))
    runs, i = [], 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        runs.append((numbers[i], numbers[j]))
        i = j + 1
    return runs


def _step_words(numbers, shown=8):
    """"step #7", "steps #12, #14" or "steps #3..#5, #9": runs as ranges."""
    parts = [f"#{a}" if a == b else f"#{a}..#{b}" for a, b in _runs(numbers)]
    more = f" and {len(parts) - shown} more" if len(parts) > shown else ""
    return ("step " if len(set(int(n) for n in numbers)) == 1 else "steps ") + ", ".join(parts[:shown]) + more


def _applied(clocks):
    return clocks is not None and bool(len(clocks)) and bool(clocks["applied"].astype(str).str.lower().eq("true").any())


def _world_size(ranks, present):
    if ranks is None or not len(ranks):
        return 0
    sizes = [int(x) for x in pd.to_numeric(ranks["world_size"], errors="coerce").dropna().tolist()]
    return max(sizes + [len(present), max(present) + 1 if present else 0]) if sizes else len(present)


def _worst(levels):
    levels = list(levels)
    return max(levels, key=LEVELS.index) if levels else "high"


def _us(ns):
    ns = float(ns)
    if ns != ns:
        return "n/a"
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e3:.3g} us"


def _rank_words(ranks, shown=12):
    """Rank numbers, runs as ranges: "2-127" or "0, 3, 5"."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in _runs(ranks)]
    return ", ".join(parts[:shown]) + (f" and {len(parts) - shown} more" if len(parts) > shown else "")


def tie_words(ranks):
    """"rank 4" or "ranks 4, 5 and 7"."""
    ranks = [str(int(r)) for r in sorted(ranks)]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(ranks[:-1]) + " and " + ranks[-1]


def most_often_last(last_ranks):
    """(the ranks most often last -- several on a tie --, how often) of a
    sequence of last-arriving ranks (NaN skipped)."""
    s = pd.Series(list(last_ranks), dtype=np.float64).dropna()
    if not len(s):
        return [], 0
    counts = s.astype(int).value_counts()
    top = int(counts.max())
    return sorted(int(r) for r in counts.index[counts == top]), top
