"""Data-quality findings: the rows of ``align.quality``, as plain dicts
(``_finding``), and the checks over ranks, matched instances and clock
estimates that make most of them.  No pandas: the per-rank description uses
``_finding`` too."""
import math

#: a rank whose median clock residual exceeds this is reported (ns)
CLOCK_RESIDUAL_WARN_NS = 5_000
#: estimated offsets above this, when not applied, are reported (ns)
CLOCK_OFFSET_NOTE_NS = 10_000


def _finding(severity, category, message, rank=None, pg=None, collective_id=None, count=None):
    return {"severity": severity, "category": category, "rank": rank, "pg": pg,
            "collective_id": collective_id, "count": count, "message": message}


def _world_size(results):
    sizes = [res.meta.get("world_size") for res in results if res.meta.get("world_size")]
    return max(sizes) if sizes else (len(results) if results else None)



def _rank_findings(results):
    out = []
    world = _world_size(results)
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
    return out


def _clock_findings(clocks, applied, multi_node, G):
    out = []
    for row in clocks.itertuples(index=False):
        if row.method == "none":
            continue
        if not math.isnan(row.residual_ns) and row.residual_ns > CLOCK_RESIDUAL_WARN_NS:
            out.append(_finding("warning", "clock_residual", f"rank {row.rank}: collective ends disagree by a median "
                                f"{row.residual_ns / 1000:.1f} us after clock alignment (threshold "
                                f"{CLOCK_RESIDUAL_WARN_NS / 1000:.0f} us)", rank=row.rank))
        if not applied and abs(row.offset_ns) > CLOCK_OFFSET_NOTE_NS:
            out.append(_finding("info", "clock_offset", f"rank {row.rank}: its clock appears offset by "
                                f"{row.offset_ns / 1000:.1f} us from rank {row.reference_rank}'s (estimated from "
                                "collective ends, not applied; use --align_clocks)", rank=row.rank))
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
