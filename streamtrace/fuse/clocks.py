"""Where each rank goes on the fused timeline: the align stage's clock offsets
(``--align_clocks``) and the common ``baseTimeNanoseconds`` epoch."""
from ..errors import StreamtraceError
from .passes import _run_parallel


def _align_tables(ranks, jobs, align_clocks):
    """The align stage over ``ranks`` (extract + align, one read of each):
    its tables (with ``align.steps``: the ranks' ProfilerSteps) and each
    rank's ``baseTimeNanoseconds``."""
    try:
        from ..align import stage as align
        from ..extract import extract_rank
        from ..steps import StepCollector
    except ImportError as exc:  # pragma: no cover - align ships with streamtrace
        raise StreamtraceError(f"--align_clocks needs the align stage ({exc})") from None
    if not (hasattr(align, "collect_rank") and hasattr(align, "match_ranks")):
        raise StreamtraceError("--align_clocks needs streamtrace.align.collect_rank/match_ranks")

    def collect(rk):
        steps = StepCollector(rk.rank)
        # align reads kernels, launches, collective CPU ops and ProfilerSteps: the rest is left unparsed
        frames = extract_rank(rk.path, rk.rank, None, False, rk.position, drop_flows=True, align_only=True)
        result = align.collect_rank(steps.watch(frames), rk.rank)
        return result, steps.finish()

    collected = _run_parallel(collect, ranks, max(1, jobs))
    results = [r for r, _ in collected]
    tables = align.match_ranks(results, align_clocks=align_clocks, steps=[s for _, s in collected])
    bases = {int(res.rank): int(res.meta.get("base_ns") or 0) for res in results}
    return tables, bases


def _clock_offsets(ranks, jobs):
    """{rank: (offset_ns, base_ns)} from the align stage's estimate (its
    ``align.clocks`` table, the report's clock_alignment sheet), and the tables."""
    tables, bases = _align_tables(ranks, jobs, True)
    clocks = tables["align.clocks"]
    offsets = {int(r): int(o) for r, o in zip(clocks["rank"], clocks["offset_ns"])}
    return offsets, bases, clocks, tables


def _common_base(bases):
    present = [b for b in bases if b]
    return min(present) if present else 0
