"""Data-quality findings: the rows of ``align.quality``, as plain dicts
(``_finding``), and the checks over ranks, matched instances and clock
estimates that make most of them.  No pandas: the per-rank description uses
``_finding`` too."""
import math

import numpy as np

from .._native import NONE
from .p2p import odd_peers

#: a rank whose median clock residual exceeds this is reported (ns)
CLOCK_RESIDUAL_WARN_NS = 5_000
#: estimated offsets above this, when not applied, are reported (ns)
CLOCK_OFFSET_NOTE_NS = 10_000
#: offsets not applied that change the last-arriving rank of at least this
#: share of the collectives are a warning (they change the report's answers)
STORY_CHANGE_SHARE = 0.1
#: estimated offsets above this, when not applied, are an error finding (ns).
#: Offsets come from the ends of implicit-sync collectives, which coincide on
#: every rank within microseconds however late a rank arrives, and NTP keeps
#: hosts within milliseconds of each other (ranks on one node share a clock);
#: a second or more can only be a wrong clock or time base (a day, a time
#: zone), and it turns every skew, wait and xfer_latency into nonsense.
CLOCK_OFFSET_ERROR_NS = 1_000_000_000


def _finding(severity, category, message, rank=None, pg=None, collective_id=None, count=None):
    return {"severity": severity, "category": category, "rank": rank, "pg": pg,
            "collective_id": collective_id, "count": count, "message": message}


def _world_size(results):
    sizes = [res.meta.get("world_size") for res in results if res.meta.get("world_size")]
    return max(sizes) if sizes else (len(results) if results else None)



def _rank_findings(results):
    out = []
    world = _world_size(results)
    p2p_world = max([res.meta["world_size"] for res in results if res.meta.get("world_size")], default=None)
    present = {res.rank for res in results}
    if world and len(present) < world:
        missing = sorted(set(range(world)) - present)
        if missing:
            shown = missing if len(missing) <= 20 else missing[:20] + ["..."]
            out.append(_finding("warning", "missing_ranks", f"{len(missing)} of {world} ranks are absent from the "
                                f"input: {shown}; collectives are matched across the ranks present",
                                count=len(missing)))
    for res in results:
        m = res.meta
        if m.get("truncated_at_byte") is not None:
            out.append(_finding("warning", "truncated_input", f"rank {res.rank}: {m.get('source')} is truncated at "
                                f"byte {m['truncated_at_byte']}; events after the cut are missing", rank=res.rank))
        for w in m.get("warnings") or []:
            if "truncated" in w and m.get("truncated_at_byte") is not None:
                continue
            out.append(_finding("warning", "extract_warning", w, rank=res.rank))
        counts = m.get("counts") or {}
        bad = counts.get("bad_numbers")
        if bad:
            out.append(_finding("info", "events_dropped", f"rank {res.rank}: {bad} numeric field(s) were unreadable "
                                "and left empty", rank=res.rank, count=bad))
        if getattr(res, "p2p", None) is not None:
            out += _p2p_findings(res.rank, res.p2p["halves"]["peer"], p2p_world)
            out += _rank_disagrees_findings(res.rank, res.p2p.get("rank_disagrees"))
    return out


def _p2p_findings(rank, peer, world):
    """A rank's send/recv ops whose peer is the rank itself or outside the
    world (``world``: the size the traces state, or None): never paired."""
    out = []
    itself, outside = odd_peers(rank, peer, world)
    n = int(np.count_nonzero(itself))
    if n:
        out.append(_finding("warning", "p2p_self_peer", f"rank {rank}: {n} send/recv op(s) name the rank itself as "
                            "their peer; not paired (listed in p2p_unmatched)", rank=rank, count=n))
    n = int(np.count_nonzero(outside))
    if n:
        shown = np.unique(peer[outside])[:5].tolist()
        size = f"world size {world}" if world else "beyond any rank"
        out.append(_finding("warning", "p2p_peer_out_of_range", f"rank {rank}: {n} send/recv op(s) name a peer "
                            f"outside the world ({size}): {', '.join(map(str, shown))}"
                            f"{', ...' if len(shown) == 5 else ''}; not paired (listed in p2p_unmatched)",
                            rank=rank, count=n))
    return out


def _rank_disagrees_findings(rank, disagree):
    """A rank's send/recv ops whose ``Rank`` arg and ``Dst Rank``/``Src
    Rank`` name different peers (``p2p.rank_p2p``'s ``rank_disagrees``)."""
    if not disagree:
        return []
    n = int(disagree["count"])
    seq = f"Seq {disagree['seq']}, " if disagree["seq"] != NONE else ""
    return [_finding("warning", "p2p_rank_disagrees", f"rank {rank}: {n} send/recv op(s) name another peer by their "
                     f"Rank arg (through the process group's ranks) than by their Dst Rank/Src Rank (first: {seq}"
                     f"Rank gives rank {disagree['peer']}, Dst/Src Rank {disagree['named']}); paired by the Rank arg",
                     rank=rank, count=n)]


def _last_arrivers(inst, rank, ts):
    """Per instance (``inst`` codes, any order) with two or more rows: its
    last-arriving rank (largest start, ties -> lowest rank) and its skew in
    start time, as arrays in instance order."""
    order = np.lexsort((rank, -ts, inst))
    i_sorted = inst[order]
    first = np.flatnonzero(np.r_[True, i_sorted[1:] != i_sorted[:-1]])
    counts = np.diff(np.r_[first, len(order)])
    keep = counts > 1
    last = rank[order][first][keep]
    lo = np.minimum.reduceat(ts[order], first)[keep]
    hi = ts[order][first][keep]
    return last, hi - lo


def _story_findings(clocks, inst, rank, ts):
    """A warning when the clock offsets estimated (and not applied) would
    change the answers of the skew, wait and straggler columns: the
    last-arriving rank of at least STORY_CHANGE_SHARE of the implicit-sync
    collectives differs with the offsets applied."""
    if not len(inst):
        return []
    offs = dict(zip(clocks["rank"].tolist(), clocks["offset_ns"].tolist()))
    if not any(offs.values()):
        return []
    ranks_u, inv = np.unique(rank, return_inverse=True)
    off = np.array([offs.get(r, 0) for r in ranks_u.tolist()], dtype=np.int64)[inv]
    last, skew = _last_arrivers(inst, rank, ts)
    last_al, skew_al = _last_arrivers(inst, rank, ts - off)
    n = len(last)
    changed = int((last != last_al).sum())
    if not n or changed < max(1, STORY_CHANGE_SHARE * n):
        return []
    spread = (max(offs.values()) - min(offs.values())) / 1000
    from ..confidence import rule_of   # pandas, which match_ranks has loaded

    rule = rule_of(clocks, float(np.median(skew)))
    if rule.state == "unreliable":   # applying offsets this thin could make the answers worse: no advice to
        return [_finding("warning", "clock_offsets_unreliable",
                         f"CLOCK OFFSETS UNRELIABLE: the per-rank clock offsets estimated from collective ends (up "
                         f"to {spread:.1f} us apart, clock_alignment sheet) {_thin_words(rule)}: they are not "
                         f"applied, yet applying them would change the last-arriving rank of {changed} of {n} "
                         f"collectives and the median skew in start time from {np.median(skew) / 1000:.1f} to "
                         f"{np.median(skew_al) / 1000:.1f} us, so the waiting figures are not reliable either way: "
                         "the skew, wait, earliest arrival and straggler columns use the clocks as recorded (as "
                         "TraceLens does)", count=changed)]
    return [_finding("warning", "clock_offsets_change_results",
                     f"CLOCKS DISAGREE: the per-rank clock offsets estimated from collective ends (up to {spread:.1f} "
                     f"us apart, clock_alignment sheet) are not applied, and applying them changes the last-arriving "
                     f"rank of {changed} of {n} collectives and the median skew in start time from "
                     f"{np.median(skew) / 1000:.1f} to {np.median(skew_al) / 1000:.1f} us: the skew, wait, earliest "
                     "arrival and straggler columns use the clocks as recorded (as TraceLens does); rerun with "
                     "--align_clocks for the aligned view", count=changed)]


def _thin_words(rule):
    """Why offsets are not well determined (``rule``: a confidence.ClockRule or
    the ``well_determined`` triple's last two), in words."""
    from ..confidence import CLOCK_MAX_RESIDUAL_NS, CLOCK_MIN_COLLECTIVES

    return (f"rest on as few as {rule.collectives} collectives (median residual up to "
            f"{rule.residual_ns / 1000:.1f} us; the clock rule trusts offsets resting on >= {CLOCK_MIN_COLLECTIVES} "
            f"with <= {CLOCK_MAX_RESIDUAL_NS / 1000:g} us)")


def _clock_findings(clocks, applied, multi_node, G):
    from ..confidence import ClockRule, well_determined

    out = []
    judged = None if applied else well_determined(clocks)
    # offsets not well determined (confidence.clock_rule) get no advice to apply them
    thin = None if judged is None or judged[0] else _thin_words(ClockRule("unreliable", collectives=judged[1],
                                                                          residual_ns=judged[2]))
    for row in clocks.itertuples(index=False):
        if row.method == "none":
            continue
        if not math.isnan(row.residual_ns) and row.residual_ns > CLOCK_RESIDUAL_WARN_NS:
            out.append(_finding("warning", "clock_residual", f"rank {row.rank}: collective ends disagree by a median "
                                f"{row.residual_ns / 1000:.1f} us after clock alignment (threshold "
                                f"{CLOCK_RESIDUAL_WARN_NS / 1000:.0f} us)", rank=row.rank))
        if not applied and abs(row.offset_ns) > CLOCK_OFFSET_ERROR_NS:
            out.append(_finding("error", "clock_offset", f"rank {row.rank}: its clock is offset by "
                                f"{row.offset_ns / 1e9:.3f} s from rank {row.reference_rank}'s (estimated from "
                                f"collective ends), beyond any real clock skew (> {CLOCK_OFFSET_ERROR_NS / 1e9:g} s): "
                                + ("skews, waits and xfer_latency in the other sheets are wrong by that much; "
                                   "rerun with --align_clocks to apply the offsets" if thin is None else
                                   f"the offsets {thin}, too few to apply them: skews, waits and xfer_latency in "
                                   "the other sheets are not reliable"), rank=row.rank))
        elif not applied and abs(row.offset_ns) > CLOCK_OFFSET_NOTE_NS:
            out.append(_finding("info", "clock_offset", f"rank {row.rank}: its clock appears offset by "
                                f"{row.offset_ns / 1000:.1f} us from rank {row.reference_rank}'s (estimated from "
                                + ("collective ends, not applied; use --align_clocks)" if thin is None else
                                   f"collective ends, not applied: the offsets {thin})"), rank=row.rank))
    if applied:
        out.append(_finding("info", "clocks_aligned", "per-rank clock offsets (clock_alignment sheet) were applied "
                            "before computing skews and waits" + (" (ranks span more than one node)" if multi_node
                                                                  else "")))
    return out


def _described_findings(rank, rows, no_ids, sel_by):
    """Findings about one rank's described collective kernels (``rows``)."""
    quality = []
    n_nolaunch = int((rows["launch_event"] < 0).sum())
    if n_nolaunch:
        quality.append(_finding("info", "no_launch", f"rank {rank}: {n_nolaunch} collective kernel(s) without a launch "
                                "record (launched before the profiling window opened); kept, unattributed",
                                rank=rank, count=n_nolaunch))
    n_noop = int((rows["cpu_op_event"] < 0).sum())
    if n_noop:
        quality.append(_finding("info", "no_cpu_op", f"rank {rank}: {n_noop} collective kernel(s) not linked to a "
                                "collective CPU op (record_param_comms / nccl:* / c10d::*)", rank=rank, count=n_noop))
    n_noids = int(no_ids.sum())
    if n_noids:
        quality.append(_finding("info", "no_ids", f"rank {rank}: {n_noids} NCCL kernel(s) with neither correlation nor "
                                "External id (TraceLens drops these; kept here)", rank=rank, count=n_noids))
    n_cpu = int((sel_by == "cpu_op").sum() + (sel_by == "comm_args").sum())
    if n_cpu:
        quality.append(_finding("info", "linked_kernels", f"rank {rank}: {n_cpu} kernel(s) without an NCCL/RCCL name "
                                "identified as collectives through their CPU op or comm args", rank=rank, count=n_cpu))
    n_unknown = int((rows["collective_name"] == None).sum())  # noqa: E711 - elementwise, on an object array
    if n_unknown:
        quality.append(_finding("info", "unknown_kind", f"rank {rank}: {n_unknown} collective kernel(s) whose "
                                "collective kind is unknown (no Collective name arg, no collective CPU op)",
                                rank=rank, count=n_unknown))
    return quality
