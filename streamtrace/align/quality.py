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

