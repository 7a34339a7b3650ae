"""``fuse()``: one run, in order: options and inputs checked, clocks placed,
every rank scanned, the layout decided from all scans, then the output written
(labels, each rank's rewritten events, the trailer)."""
import logging
import time
from dataclasses import dataclass

from ..errors import StreamtraceError
from ..io.outputs import check_suffix, refuse_input_as_output
from ..parallel.dask import as_executor
from ..parallel.executor import worker_count
from ..progress import fuse_progress
from ..userregex import UserRegex
from .clocks import _align_tables, _clock_offsets, _common_base
from .focus import needs_analysis, parse_focus, resolve as resolve_focus
from .marks import analysis_marks, parse_marks
from .inputs import _as_rank_inputs, _resolve_ranks
from .layout import _id_stride, _labels, _lanes, _pid_maps, configure_rank
from .options import FuseOptions, FuseResult, compression_for, parse_window
from .remote import scan_ranks, write_ranks
from .passes import _base_prepass, _Progress, _run_parallel, _scan, _write_parallel, _write_rank
from .segments import _atomic, _check_target_room, _GzipJoin, _Segment
from .spill import _SpillBudget
from .trailer import _rank_summary, _rank_warnings
from .writers import format_for, writer_for

log = logging.getLogger("streamtrace")


@dataclass
class _Plan:
    """What the write pass needs beyond the ranks: decided before it starts."""

    opts: FuseOptions
    compression: str
    jobs: int
    executor: object = None       # a cluster's (fuse.remote); None: local threads
    common_base: int = None
    clocks: object = None         # the align stage's clock table (--align_clocks)
    align_tables: dict = None     # the align stage's tables, when it ran (--align_clocks)
    focus: object = None          # focus.FocusSpec (--focus)
    mark: tuple = ()              # --mark: what the analysis adds (marks.MARKS)
    marks: list = None            # their events (Chrome-trace dicts), written before the ranks
    id_stride: int = 0
    pid_stride: int = 0
    dense: bool = False           # pids numbered rank * K + ordinal (they would not fit 31 bits)
    labels: list = None
    writer: object = None         # writers.JsonWriter / PftraceWriter
    extra: dict = None            # members the trailer adds (the focus window)


def fuse(inputs, output, ranks=None, include_pyfunc=False, cats=None, name_regex=None, window=None,
         nccl_only=False, align_clocks=False, time_base=False, jobs=None, *, keep_spans=False,
         compression=None, progress=None, _masks=None, executor=None, format=None, focus=None, mark=None):
    """Merge per-rank traces into one Chrome-trace JSON for Perfetto, streamed.

    ``inputs``: RankInputs or paths (list; rank from the RankInput, else
    ``distributedInfo.rank``, else position) or a ``{rank: path}`` dict.
    ``output``: a path (``.json``, ``.json.gz``, ``.json.zst``) or ``"-"``.
    ``ranks``: keep only these ranks.  ``cats``: keep only these categories.
    ``name_regex``: keep events whose name matches (a search, time-bounded: userregex).
    ``window``: ``"START:END"`` (us, either end open) or ``(lo_ns, hi_ns)``:
    keep events meeting it on the fused timeline.  ``nccl_only``: keep only
    kernels whose name contains "nccl".  ``align_clocks``: shift each rank by
    the align stage's clock offset (puts ranks on one epoch too).
    ``time_base``: put ``baseTimeNanoseconds``-relative ranks on one epoch.
    ``jobs``: ranks processed at once (None: the CPUs available; never more
    than there are ranks).  ``executor``: a cluster's executor (``--scheduler``;
    or a ``distributed.Client``) runs both per-rank passes on its workers
    (``fuse.remote``).  ``format``: ``"json"`` or ``"pftrace"`` (Perfetto's
    protobuf trace); None: from the output's suffix (``.pftrace``,
    ``.pftrace.gz``), else JSON.  ``focus``: ``"worst"``, ``"collective:ID"``,
    ``"step:N"`` or ``"time:T0:T1"`` (focus.py): only the events meeting that
    window of the fused timeline (instead of ``window``).  ``mark``:
    ``("blockers",)`` adds a track per rank with its late arrivals and what
    blocked them, ``("critical_path",)`` a track with each step's critical
    path (marks.py, critical_marks.py; both run the blocking analysis).  Returns a FuseResult.
    """
    t_start = time.time()
    opts = _options(include_pyfunc, keep_spans, cats, name_regex, window, nccl_only, align_clocks, time_base)
    fmt = format_for(output, format)
    if compression is None and output != "-":
        check_suffix(output, allowed=(".gz", ".zst", ".zstd"))
    compression = compression or compression_for(output)
    budget = _SpillBudget()
    rank_inputs = _as_rank_inputs(inputs)
    executor = as_executor(executor)
    if executor is not None and not getattr(executor, "remote", False):
        executor = None   # a local executor: fuse runs its own threads (-j)
    plan = _Plan(opts, compression, worker_count(jobs, len(rank_inputs) or 1), executor, writer=writer_for(fmt),
                 focus=parse_focus(focus), mark=parse_marks(mark))
    if plan.focus is not None and opts.window is not None:
        raise StreamtraceError("--focus and --window both choose the window: give one")
    if fmt == "pftrace" and executor is not None:
        raise StreamtraceError(f"{output}: a .pftrace is written on this machine only; leave out --scheduler "
                               "(or write .json.gz on the cluster)")
    refuse_input_as_output(output, [i.path for i in rank_inputs])
    ranks_ = _resolve_ranks(rank_inputs, ranks)
    if _masks is not None:
        for rk in ranks_:
            rk.mask = _masks[rk.rank]
    prog = _Progress(fuse_progress(progress, [rk.path for rk in ranks_]))

    _place_before_scan(ranks_, plan)   # before the scan, so --window can use the shifts
    if plan.focus is not None:
        _focus(ranks_, plan)
    if plan.executor is not None:
        scan_ranks(ranks_, opts, plan.executor)
    else:
        _run_parallel(lambda rk: _scan(rk, opts, prog, budget), ranks_, plan.jobs)
    if (time_base or align_clocks) and plan.common_base is None:
        _place_after_scan(ranks_, plan)
    if plan.focus is not None and not any(rk.stats["ts_max_ns"] >= rk.stats["ts_min_ns"] for rk in ranks_):
        # (metadata records have no ts: they are kept whatever the window)
        raise StreamtraceError(f"--focus {plan.focus.text}: no event in the window {plan.extra['focus']['window_us']} "
                               "us (outside the traces, or a gap in them); nothing written")
    _lay_out(ranks_, plan)
    if plan.mark:
        plan.marks = analysis_marks(ranks_, plan.mark, plan.jobs, opts.align_clocks, opts.window)
        plan.labels += plan.marks
    if output != "-" and compression == "none" and fmt == "json":
        _check_target_room(output, sum(rk.stats["events_kept"] for rk in ranks_))
    warnings = _write_output(output, ranks_, plan, prog, t_start)
    return FuseResult(output=str(output), ranks={rk.rank: _rank_summary(rk) for rk in ranks_},
                      events_written=sum(rk.write_stats["events_kept"] for rk in ranks_), warnings=warnings,
                      id_stride=plan.id_stride, pid_stride=plan.pid_stride, time_base_ns=plan.common_base,
                      lane_moves=sum(rk.stats["lane_moves"] for rk in ranks_),
                      focus=(plan.extra or {}).get("focus"))


def _options(include_pyfunc, keep_spans, cats, name_regex, window, nccl_only, align_clocks, time_base):
    """FuseOptions from the API's arguments; a bad window or pattern is refused before any work."""
    if isinstance(window, str):
        window = parse_window(window)
    if name_regex is not None:
        UserRegex(name_regex, "--name")
    cats = tuple(c for c in (cats or ()) if c)
    return FuseOptions(include_pyfunc=include_pyfunc, keep_spans=keep_spans, cats=cats,
                       name_regex=name_regex, window=window, nccl_only=nccl_only,
                       align_clocks=align_clocks, time_base=time_base)


def _place_before_scan(ranks_, plan):
    """Each rank's shift when it must be known during the scan: the align
    stage's clock offsets (with the time bases), or the time bases alone for
    ``--time_base`` with ``--window`` (a prepass: the base comes after the events)."""
    opts = plan.opts
    offsets, bases = {}, None
    if opts.align_clocks:
        offsets, bases, plan.clocks, plan.align_tables = _clock_offsets(ranks_, plan.jobs)
    elif opts.time_base and (opts.window is not None or plan.focus is not None):
        bases = dict(zip([rk.rank for rk in ranks_], _run_parallel(_base_prepass, ranks_, plan.jobs)))
    if bases is None:
        return
    plan.common_base = _common_base(bases.values())
    for rk in ranks_:
        rk.clock_offset_ns = offsets.get(rk.rank) if opts.align_clocks else None
        rk.shift_ns = bases[rk.rank] - plan.common_base - (offsets.get(rk.rank, 0) if opts.align_clocks else 0)


def _focus(ranks_, plan):
    """The --focus window, on the fused timeline (the shifts are placed):
    it becomes the scan's window, and goes into the output's metadata."""
    tables = None
    if needs_analysis(plan.focus):
        tables = plan.align_tables or _align_tables(ranks_, plan.jobs, None)[0]
    lo, hi, info = resolve_focus(plan.focus, ranks_, tables)
    plan.opts.window = (lo, hi)
    plan.extra = {"focus": info}
    log.info("focus %s: %s, window %s us", plan.focus.text, info["label"], info["window_us"])   # before the work


def _place_after_scan(ranks_, plan):
    """``--time_base`` without a window: the scan has read each rank's base."""
    plan.common_base = _common_base(rk.base_ns for rk in ranks_)
    for rk in ranks_:
        rk.shift_ns = rk.base_ns - plan.common_base


def _lay_out(ranks_, plan):
    """From all ranks' scans: id and pid strides, each rewriter configured for
    the write pass, and the metadata events fuse adds (labels, lanes)."""
    plan.id_stride = _id_stride(ranks_)
    pid_maps, plan.pid_stride, plan.dense = _pid_maps(ranks_)
    labels = []
    for rk in ranks_:
        rk.pid_map = pid_maps[rk.rank]
        rk.id_offset = rk.rank * plan.id_stride
        if rk.fz is not None:   # None: the rank is written on a cluster's worker (fuse.remote)
            configure_rank(rk, plan.opts)
        labels += _labels(rk, rk.pid_map)
        labels += _lanes(rk, rk.pid_map)
    if not labels:
        labels.append({"name": "process_name", "ph": "M", "pid": "streamtrace", "tid": 0,
                       "args": {"name": "streamtrace fuse: no events selected"}})
    plan.labels = labels


def _write_output(output, ranks_, plan, prog, t_start):
    """The fused file, atomically: the labels, each rank's events (pass 2),
    the trailer; gzip segments joined into one member.  Returns the warnings."""
    compression = plan.compression
    with _atomic(output) as f:
        joiner = _GzipJoin() if compression == "gzip" else None
        if joiner:
            f.write(joiner.header())
        head = _Segment(f, compression)
        head.write(plan.writer.head(plan))
        head.close()
        segments = [head]
        if plan.executor is not None:
            segments += write_ranks(ranks_, plan.opts, f, compression, plan.executor)
        elif plan.jobs <= 1 or len(ranks_) <= 1:
            for rk in ranks_:
                segments.append(_write_rank(rk, plan.opts, f, compression, prog, plan.writer))
        else:
            segments += _write_parallel(ranks_, plan.opts, f, compression, plan.jobs, output, prog, plan.writer)
        warnings = []
        for rk in ranks_:
            warnings += rk.warnings + _rank_warnings(rk)
        for w in warnings:
            log.warning(w)
        trailer = plan.writer.tail(ranks_, plan, warnings, time.time() - t_start, plan.extra)
        tail = _Segment(f, compression)
        tail.write(trailer)
        tail.close(last=True)
        segments.append(tail)
        if joiner:
            for seg in segments:
                joiner.add(seg)
            f.write(joiner.trailer())
    return warnings
