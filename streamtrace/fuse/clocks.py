"""Where each rank goes on the fused timeline: the align stage's clock offsets
(``--align_clocks``) and the common ``baseTimeNanoseconds`` epoch."""
from ..errors import StreamtraceError
from .passes import _run_parallel


def _clock_offsets(ranks, jobs):
    """{rank: (offset_ns, base_ns)} from the align stage's estimate (its
    ``align.clocks`` table, the report's clock_alignment sheet)."""
    try:
        from ..align import stage as align
        from ..extract import extract_rank
    except ImportError as exc:  # pragma: no cover - align ships with streamtrace
        raise StreamtraceError(f"--align_clocks needs the align stage ({exc})") from None
    if not (hasattr(align, "collect_rank") and hasattr(align, "match_ranks")):
        raise StreamtraceError("--align_clocks needs streamtrace.align.collect_rank/match_ranks")

    def collect(rk):
        return align.collect_rank(extract_rank(rk.path, rk.rank, None, False, rk.position), rk.rank)

    results = _run_parallel(collect, ranks, max(1, jobs))
    tables = align.match_ranks(results, align_clocks=True)
    clocks = tables["align.clocks"]
    offsets = {int(r): int(o) for r, o in zip(clocks["rank"], clocks["offset_ns"])}
    bases = {int(res.rank): int(res.meta.get("base_ns") or 0) for res in results}
    return offsets, bases, clocks


def _common_base(bases):
    present = [b for b in bases if b]
    return min(present) if present else 0
