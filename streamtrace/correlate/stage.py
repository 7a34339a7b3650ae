"""``correlate`` as a stage: frames in, every frame passed on plus the
``correlate.*`` tables (``correlate_frames``); ``analyze`` runs the three
analyses (see the package docstring) in turn; ``blockers_text`` is the short
answer a user reads first.
"""
import logging

from ..align.stage import preload
from ..stream.format import Kind
from .collect import StreamCollector
from .columns import QUALITY_COLUMNS, empty_sheets

log = logging.getLogger("streamtrace")

#: the analyses' modules (they load pandas): imported where they run, and
#: in a background thread once a rank's frames come (``correlate_frames``)
ANALYSES = ("streamtrace.correlate.late_rank", "streamtrace.correlate.overlap", "streamtrace.correlate.inflation",
            "streamtrace.correlate.exposed")

#: the align tables correlate reads (StreamCollector keeps them)
ALIGN_TABLES_READ = ("align.collectives", "align.p2p")


TABLE_PREFIX = "correlate."

#: the record frames correlate unpacks (a reader may unpack them ahead: stream.format.read_ahead)
RECORDS_READ = (Kind.EVENTS, Kind.KERNELS)


def correlate_frames(frames, finished=None):
    """The correlate stage: yield every input frame as it is read, then the
    ``correlate.*`` result tables and one END frame.

    The input must carry align's tables (run ``align`` first): without them
    there are no matched collectives and every table comes out empty, with a
    data-quality note.  ``correlate.*`` tables already in the input (a stream
    correlated twice) are dropped with a warning, as align does with its own:
    the output is that of one run.  ``finished``: called with (the ranks'
    timelines on correlate's clocks, align's tables as correlate read them)
    once the analyses ran (the critical path's graph is made of them).
    """
    from ..stream.format import Kind, json_frame, table_frame

    sc = StreamCollector()
    replaced = False
    # align's tables, handed to the collector at the end: decoding them loads
    # pandas, which a stream with no rank and no collective never needs
    align_read = []
    ranks_seen = False
    for frame in frames:
        if frame.kind == Kind.END:
            continue
        if frame.kind == Kind.TABLE:
            name = frame.table_name()
            if name.startswith(TABLE_PREFIX):
                replaced = True
                continue
            if name in ALIGN_TABLES_READ:
                align_read.append(frame)
            yield frame
            continue
        if not ranks_seen:
            ranks_seen = True
            preload(*ANALYSES)
        sc.add(frame)
        yield frame
    if replaced:
        log.warning("the input already held correlate tables; they are replaced by this run's")
    if finished is None and not ranks_seen and all(f.table_rows() == 0 for f in align_read):
        # nothing to analyze: the sheets analyze gives such a run, without pandas
        sheets = empty_sheets([] if any(f.table_name() == "align.collectives" for f in align_read)
                              else [_NO_ALIGN_TABLES])
    else:
        for frame in align_read:
            sc.add(frame)
        timelines, tables = sc.finish()
        sheets = analyze_collected(timelines, tables, compute=sc.compute)
        if finished is not None:
            finished((timelines, tables))
    for name, df in sheets.items():
        yield table_frame(TABLE_PREFIX + name, df)
    yield json_frame(Kind.END, 0, {"stage": "correlate"})


def analyze_collected(timelines, tables, compute=None):
    """Sheets from collected timelines and align's tables (``compute``: the
    StreamCollector's table of compute kernels)."""
    from .inputs import Inputs, _empty_instances, instances_from_align, instances_from_p2p, offsets_from_align
    from .late_rank import _late_rank_analysis

    coll = tables.get("align.collectives")
    if coll is None:
        inputs = Inputs(timelines, _empty_instances(), {}, compute)
        inputs.quality.append(_NO_ALIGN_TABLES)
    else:
        inputs = Inputs(timelines, instances_from_align(coll), offsets_from_align(coll), compute)
    sheets = analyze(inputs)
    pairs = tables.get("align.p2p")
    if coll is not None and pairs is not None and len(pairs):   # runs with send/recv only
        p2p_inputs = Inputs(timelines, instances_from_p2p(pairs, coll), offsets_from_align(coll), inputs.compute)
        sheets["p2p_blockers"] = _late_rank_analysis(p2p_inputs)[0]
    return sheets


_NO_ALIGN_TABLES = ("no align tables", None, "the stream has no align.collectives table: "
                                             "run 'streamtrace align' before correlate")

SHEET_NAMES = ["collective_blockers", "blocking_kernels", "blocking_host_ops", "collective_overlap",
               "contention_pairs", "nccl_inflation", "compute_inflation", "exposed_comm", "correlate_quality"]


def analyze(inputs):
    """All correlate sheets as ``{name: DataFrame}`` plus ``data_quality`` rows.

    The analyses run one after another in this process, each adding its
    data-quality notes to ``inputs.quality`` in turn: splitting them with a
    forked child made the whole slower on two cores (see
    docs/performance.md)."""
    import pandas as pd

    from .exposed import _exposed_comm
    from .inflation import _compute_inflation, _nccl_inflation
    from .late_rank import _late_rank_analysis
    from .overlap import _overlap_analysis

    blockers, blocking_kernels, blocking_host_ops = _late_rank_analysis(inputs)
    sheets = {"collective_blockers": blockers, "blocking_kernels": blocking_kernels,
              "blocking_host_ops": blocking_host_ops, "compute_inflation": _compute_inflation(inputs)}
    overlap, pairs = _overlap_analysis(inputs)
    sheets.update({"collective_overlap": overlap, "contention_pairs": pairs,
                   "nccl_inflation": _nccl_inflation(inputs, overlap), "exposed_comm": _exposed_comm(inputs)})
    sheets["correlate_quality"] = pd.DataFrame(inputs.quality, columns=QUALITY_COLUMNS)
    return {name: sheets[name] for name in SHEET_NAMES}


# ---------------------------------------------------------------------- the short answer


def blockers_text(sheets, top=5, confidence=None):
    """What a user reads first: the answer's confidence (``confidence``: a
    confidence.Confidence, None: not shown), then straggler, dominant cause,
    top blockers, top contention pairs -- as plain text lines.  Collectives
    most of whose members are absent are no evidence of who arrived last."""
    lines = confidence.lines() if confidence is not None else []
    b = sheets.get("collective_blockers")
    if confidence is not None and confidence.no_gpu_collectives:
        lines.append("No GPU collectives in these traces: nothing to say about waiting between ranks.")
        return "\n".join(lines)
    if b is None or not len(b):
        if confidence is not None and confidence.ranks_present == 1:
            lines.append("One rank only: no collective can be matched across ranks, so nothing can be said about "
                         "waiting.")
            return "\n".join(lines)
        # no matched collective is no evidence that nothing waited: the
        # members may be outside the windows, or the waits on send/recv
        lines.append("No implicit-sync collective was matched across ranks, so no wait at a collective "
                     "can be measured.")
        return "\n".join(lines)
    if confidence is not None and confidence.not_evidence:
        b = b[~b["collective_id"].astype(str).isin(confidence.not_evidence)]
        if not len(b):
            lines.append("Every collective waited on misses most of its members: no evidence of who arrived last.")
            return "\n".join(lines)
    by_rank = b.groupby("late_rank").agg(n=("collective_id", "size"), delta=("delta_us", "sum"),
                                         blame=("blame_us", "sum")).sort_values("delta", ascending=False)
    lines.append(_straggler_line(by_rank, len(b), confidence))
    parts = {"host launch lateness": b["host_launch_lateness_us"].sum(), "GPU dependency wait": b["gpu_dependency_wait_us"].sum(),
             "GPU backlog": b["gpu_backlog_us"].sum()}
    total = sum(parts.values())
    cause = max(parts, key=parts.get)
    share = 100.0 * parts[cause] / total if total else 0.0
    lines.append(f"Dominant cause of waiting: {cause} ({parts[cause]:.1f} of {total:.1f} us, {share:.0f}%)  "
                 + "  ".join(f"{k}: {v:.1f} us" for k, v in parts.items() if k != cause))
    k = sheets.get("blocking_kernels")
    lines.append("Top blocking kernels:" if k is not None and len(k) else "Top blocking kernels: none")
    if k is not None:
        for i, row in enumerate(k.head(top).itertuples(), 1):
            excess = f", excess {row.mean_excess_us:.1f} us" if row.mean_excess_us == row.mean_excess_us else ""
            lines.append(f"  {i}. {row.total_blocking_us:10.1f} us  {_short(row.kernel)} grid {row.grid} block {row.block}"
                         f"  ({row.instances_delayed} collectives, rank {row.ranks}{excess})")
    h = sheets.get("blocking_host_ops")
    if h is not None and len(h):
        lines.append("Top blocking host ops:")
        for i, row in enumerate(h.head(top).itertuples(), 1):
            lines.append(f"  {i}. {row.total_blocking_us:10.1f} us  {_short(row.op)}  ({row.instances_delayed} collectives, rank {row.ranks})")
    p = sheets.get("contention_pairs")
    if p is not None and len(p):
        lines.append("Top contention pairs (compute kernel x collective, overlap):")
        for i, row in enumerate(p.head(top).itertuples(), 1):
            risk = "  tail-effect risk" if row.tail_effect_risk is True else ""
            lines.append(f"  {i}. {row.overlap_us:10.1f} us  {_short(row.compute_kernel)} x {row.signature}{risk}")
    return "\n".join(lines)


def _straggler_line(by_rank, n, confidence):
    """The straggler: the rank the others waited longest for, over the ranks
    present; several ranks on a tie."""
    top = by_rank.iloc[0]
    where = f", among the {confidence.ranks_words()} present" if confidence is not None else ""
    tied = by_rank[(by_rank["delta"] == top["delta"]) & (by_rank["n"] == top["n"])]
    if len(tied) > 1:
        from ..confidence import tie_words

        return (f"Straggler: a tie: {tie_words(tied.index)} were each last to arrive at {int(top['n'])} of {n} "
                f"collectives{where}; others waited {top['delta']:.1f} us for each")
    return (f"Straggler: rank {int(by_rank.index[0])} (last to arrive at {int(top['n'])} of {n} collectives{where}; "
            f"others waited {top['delta']:.1f} us for it, blame {top['blame']:.1f} us)")


def _short(name, width=70):
    name = str(name)
    return name if len(name) <= width else name[: width - 3] + "..."


def sheets_from_tables(tables):
    """{sheet: DataFrame} of the correlate.* tables in a stream."""
    return {n[len(TABLE_PREFIX):]: df for n, df in tables.items() if n.startswith(TABLE_PREFIX)}
