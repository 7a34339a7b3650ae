"""The one place that composes stages in one process.

* in-process frame chains: trace files -> extract -> align -> correlate,
  generator to generator with no serialisation between stages
  (``trace_frames``, ``stage_frames``, ``correlated_frames``);
* the one-shot collective report (``generate_collective_report``): the ranks
  read in threads and reduced to their collective rows, then matched and
  reported;
* ``blockers``: the short answer from streams or traces.

Free of pandas at import time on purpose: ``generate_collective_report``
starts reading the ranks (C tokenizer threads, which release the GIL) before
it imports ``report`` -- and with it pandas, about 0.2 s -- so that the
import and the first ranks' tokenizing overlap.
"""
import contextlib
import functools
import inspect
import itertools
import logging
import os

from .align.custom import custom_collectives
from .errors import InvalidArgumentError, StreamtraceError, os_error
from .parallel.dask import as_executor
from .parallel.executor import local_executor, stopping
from .parallel.heap import give_back_freed_memory
from .parallel.threads import interleaved, prefetched
from .progress import phase, rank_reporters
from .remote import is_url, local_path
from .report.options import DEFAULT_AGG_METRICS, check_aggs
from .stream.format import MAGIC, Kind, iter_frames, table_names

log = logging.getLogger("streamtrace")


def is_stream(path):
    """True when ``path`` starts with the event-stream magic."""
    if str(path) == "-":
        return True
    if is_url(str(path)):
        from .remote import open_input

        with open_input(str(path)) as f:
            return f.read(len(MAGIC)) == MAGIC
    try:
        with open(local_path(path), "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError as exc:
        raise os_error(path, exc) from None


def _isdir(path):
    """A directory of traces, local or at a URL (a prefix with objects under it)."""
    if is_url(str(path)):
        from .remote import isdir

        return isdir(str(path))
    return os.path.isdir(local_path(path))


#: records per frame in the in-process chains: 4x the stream's frames.  The
#: stages' Python code runs once per frame (a few hundred numpy calls,
#: whatever its size), so fewer frames cost the consumer less CPU; much
#: larger frames no longer stay in cache.  See docs/performance.md.
PIPELINE_BATCH_EVENTS = 65536

#: frames extracted ahead of the consumer (an EVENTS frame is about 6 MB,
#: and a batch is 2-3 frames): enough to cover a rank's finishing work in
#: align and correlate, during which the consumer reads nothing, so the
#: extractor does not stand still; the queue is full only at rank ends, so
#: it costs little memory.  See docs/performance.md.
PREFETCH_FRAMES = 48

#: frames a rank's extraction runs ahead of the blocking analysis' map,
#: which collects them on its own thread: enough to smooth the per-frame
#: jitter (a rank's finishing runs on the consuming thread, not here)
RANK_PREFETCH_FRAMES = 8

#: bytes per memory-mapped window of a plain trace in the in-process chains:
#: 16 MiB windows mean fewer GIL hand-offs for the extracting thread (its
#: feeds, the read-ahead queue), each of which waits while the stages run
#: Python, for a little more RSS; ``streamtrace extract`` keeps 4 MiB windows
#: for its bounded RSS.  See docs/performance.md.
PIPELINE_MAP_WINDOW = 16 << 20

#: the same for the blocking analysis' map, which holds each rank it reads
#: whole until the rank's end: there the mapped windows queued ahead of two
#: ranks were a fifth of the peak RSS (16 MiB: ~50 MB more on 4 x 512 MB,
#: for no time measurable).  See docs/performance.md.
BLOCKING_MAP_WINDOW = 4 << 20


def trace_frames(inputs, world_size=None, jobs=1, keep_pyfunc=False, prefetch=True, strict=False, progress=None,
                 drop_flows=False):
    """Frames of every RankInput, extracted in-process in a background thread
    ``PREFETCH_FRAMES`` frames ahead (``prefetch``): the C tokenizer releases
    the GIL, so the stages consuming the frames (align, correlate) work
    meanwhile.

    ``jobs`` > 1: that many ranks are extracted at once, each in its own
    thread, and their frames come interleaved as they are made (each rank's
    in order; every stage keeps its state per rank); ``progress`` is then
    not called.  Threads, because that was faster than extracting the ranks
    in parallel processes into a temporary stream read back afterwards (see
    docs/performance.md).
    ``drop_flows``: flow events are left out (``extract_rank``), for
    consumers that read none (``stage_frames``)."""
    from .extract import extract_rank

    frames = [extract_rank(i.path, i.rank, world_size, keep_pyfunc, i.position, strict=strict,
                           progress=progress if jobs <= 1 else None, batch_events=PIPELINE_BATCH_EVENTS,
                           map_window=PIPELINE_MAP_WINDOW, drop_flows=drop_flows)
              for i in inputs]
    if jobs > 1 and len(inputs) > 1:
        return interleaved(frames, workers=jobs, depth=PREFETCH_FRAMES, name="streamtrace-extract")
    frames = itertools.chain.from_iterable(frames)
    return prefetched(frames, depth=PREFETCH_FRAMES, name="streamtrace-extract") if prefetch else frames


def stage_frames(inputs, world_size=None, jobs=1, strict=False, progress=None):
    """``trace_frames`` for the in-process align and correlate, which read
    complete events only: flow events (two per kernel launch, a quarter to
    a third of a Kineto trace's events) are left out in the tokenizer, so
    the stages have that many fewer records to pass over while the
    extractor runs."""
    return trace_frames(inputs, world_size=world_size, jobs=jobs, strict=strict, progress=progress, drop_flows=True)


def _spooled(spooled):
    """stdin copied to a temporary file (its path added to ``spooled``, which
    the caller removes), so that it can be read twice."""
    import shutil
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="streamtrace-", suffix=".stev", delete=False) as tmp:
        spooled.append(tmp.name)
        shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
    return tmp.name


def correlated_sheets(paths, jobs=None, world_size=None, executor=None, align_clocks=None):
    """{sheet: DataFrame} of correlate's results for ``correlated_tables``' inputs."""
    from .correlate.stage import sheets_from_tables

    return sheets_from_tables(correlated_tables(paths, jobs=jobs, world_size=world_size, executor=executor,
                                                align_clocks=align_clocks))


def correlated_tables(paths, jobs=None, world_size=None, executor=None, align_clocks=None, critical=False,
                      finished=None):
    """{name: DataFrame} of the align and correlate tables, running what is
    missing: ``paths`` are event streams at any stage (``-``: stdin), trace
    files, or one directory of traces (resolved as ``--trace_dir`` is).
    Trace files run as the blocking analysis' map and reduce
    (``_correlated_tables``); streams run the stages they still need over
    their frames.  ``align_clocks``: whether align applies the clock
    offsets, when it runs here (None: the clock rule, confidence.clock_rule);
    a stream aligned already keeps its clocks.  ``critical``: also the
    ``critical.*`` tables (the critical path's graph; a stream's correlate
    runs again for them).  ``finished``: called with (the ranks' timelines
    on correlate's clocks, align's tables as correlate read them), as
    ``correlate_frames`` calls it, for a caller that makes the graph, or
    reads the timelines, itself (a stream's correlate runs again for it)."""
    from .correlate.stage import TABLE_PREFIX, correlate_frames
    from .io.ranks import resolve_inputs
    from .steps import TABLE as STEPS, StreamSteps, step_table

    spooled = []
    try:
        paths = [_spooled(spooled) if str(p) == "-" else p for p in paths]
        directories = [p for p in paths if _isdir(p)]
        if directories:   # a run's directory of traces, as --trace_dir takes it
            if len(paths) > 1:
                raise StreamtraceError(f"{directories[0]}: a directory of traces must be the only input")
            inputs = resolve_inputs(trace_dir=directories[0], world_size=world_size)
        else:
            streams = [is_stream(p) for p in paths]
            if any(streams) and not all(streams):
                raise StreamtraceError("give either event streams or trace files, not both")
            inputs = None if all(streams) else resolve_inputs(paths=paths, world_size=world_size)
        if inputs is not None:
            executor = as_executor(executor)
            return _correlated_tables(inputs, world_size, jobs, align_clocks, None, False, None, executor=executor,
                                      blocking_clocks=align_clocks, critical=critical, finished=finished)
        names = set().union(*(table_names(p) for p in paths))
        steps = StreamSteps()
        frames = steps.watch(f for p in paths for f in iter_frames(p))
        if "align.collectives" in names and align_clocks is not None:
            log.warning("the stream was aligned already: --align_clocks/--no-align_clocks has no effect on it "
                        "(run 'streamtrace align' with it)")
        collected = []
        timelines_needed = critical or finished is not None
        if timelines_needed and any(n.startswith(TABLE_PREFIX) for n in names):
            # correlate's own tables are made again, with its timelines
            frames = (f for f in frames if not (f.kind == Kind.TABLE and f.table_name().startswith(TABLE_PREFIX)))
            names = {n for n in names if not n.startswith(TABLE_PREFIX)}
        if not any(n.startswith(TABLE_PREFIX) for n in names):
            if "align.collectives" not in names:
                from .align.stage import CLOCK_RULE, align_frames

                frames = align_frames(frames, align_clocks=CLOCK_RULE if align_clocks is None else align_clocks)
            frames = correlate_frames(frames, finished=collected.append if timelines_needed else None)
        tables = {}
        for f in frames:
            if f.kind == Kind.TABLE:
                name, df = f.table()
                tables[name] = df
        tables[STEPS] = step_table(steps.finish(), tables)
        if collected and finished is not None:
            finished(collected[0])
        if collected and critical:
            tables.update(_critical_tables(*collected[0]))
        return tables
    finally:
        for path in spooled:
            with contextlib.suppress(OSError):
                os.unlink(path)


class RankReading:
    """The collective report's per-rank map, started at once: each rank
    extracted (align's events only) and reduced to its collective rows, a
    RankResult.  ``results`` and ``tables`` are the reduce.

    Threads by default, not processes: the C tokenizer (most of the time)
    runs without the GIL, and threads share one copy of the interpreter and
    its imports (worker processes cost more memory for the same speed; see
    docs/performance.md).  The reading threads only collect a rank's rows;
    the consuming thread finishes each rank (``align.stage.finish_rank``,
    GIL-held numpy) as it comes, so the threads go straight on to the next
    ranks."""

    def __init__(self, inputs, world_size=None, jobs=1, strict=False, progress=None, executor=None, custom=None):
        self.inputs = inputs
        executor = as_executor(executor)
        self._executor = executor if executor is not None else local_executor(jobs, len(inputs))
        self._owns_executor = executor is None
        read = functools.partial(_read_rank, world_size=world_size, strict=strict, custom=custom)
        items = _rank_items(inputs, progress, self._executor)
        self._results = self._executor.map(read, items, finish=_finish_rank)

    def results(self):
        """Every rank's RankResult, in input order.  The first failure (in
        input order) is raised; ranks not started by then are not read."""
        try:
            pairs = list(self._results)
        except BaseException as exc:
            self.close(wait=not stopping(exc))
            raise
        self.close()
        results = [result for result, _ in pairs]
        self.steps = [steps for _, steps in pairs]
        _check_distinct_ranks(self.inputs, results)
        return results

    def tables(self, align_clocks=None, gpus_per_node=None, p2p_clocks="align"):
        """The ``align.*`` tables of the ranks (waits for them), and their
        profiler steps (``steps.TABLE``).  ``p2p_clocks``: the clocks of the
        point-to-point tables (streamtrace's own analysis): "align", those
        of the other tables; else as ``_correlated_tables``' blocking_clocks
        (None: the clock rule)."""
        from .align.p2p_match import P2P_TABLE_NAMES
        from .align.stage import align_options_table, match_ranks
        from .confidence import BLOCKING_CLOCKS
        from .steps import TABLE as STEPS, step_table

        results = self.results()   # sets self.steps
        tables = match_ranks(results, align_clocks=align_clocks, gpus_per_node=gpus_per_node, steps=self.steps)
        if p2p_clocks != "align" and any(name in tables for name in P2P_TABLE_NAMES):
            own = _blocking_align(results, tables, p2p_clocks, gpus_per_node, self.steps)
            tables.update({name: own[name] for name in P2P_TABLE_NAMES if name in own})
            tables[BLOCKING_CLOCKS] = own["align.clocks"]
        tables["align.options"] = align_options_table(align_clocks, gpus_per_node)
        tables[STEPS] = step_table(self.steps, tables)
        return tables

    def close(self, wait=True):
        """Stop: ranks not started are not read; waits for the running ones
        (unless not ``wait``: after a signal they end with the process)."""
        if wait:
            self._results.close()
        if self._owns_executor:
            self._executor.close(wait=wait)


#: bytes per memory-mapped window of a plain trace read for the report.  A
#: window is a few GIL hand-offs of its reading thread, which wait while
#: pandas is imported and the other rank is finished; 8 MiB balances fewer
#: hand-offs against the mapped windows' RSS.  See docs/performance.md.
READ_MAP_WINDOW = 8 << 20


def _read_rank(item, world_size, strict, custom=None):
    """The map: one rank's trace -> its RankCollector (the rows align keeps)
    and StepCollector (its profiler steps); ``custom``:
    align.custom.CustomCollectives or None."""
    from .align.collect import collected_rank
    from .extract import extract_rank
    from .steps import StepCollector

    inp, progress = item
    # align reads only kernels, their launches and collective CPU ops (and
    # the report its ProfilerStep ops): the tokenizer leaves the other events
    # out unparsed (flows alone are two per kernel launch, often a quarter of
    # the events)
    steps = StepCollector(inp.rank)
    frames = extract_rank(inp.path, inp.rank, world_size, False, inp.position, strict=strict, progress=progress,
                          drop_flows=True, align_only=True, map_window=READ_MAP_WINDOW, summarize=False)
    return collected_rank(steps.watch(frames), inp.rank, custom), steps


def _finish_rank(pair):
    from .align.describe import finish_rank

    collector, steps = pair
    return finish_rank(collector), steps.finish()


def _rank_items(inputs, progress, executor):
    """The map's items: (RankInput, its progress callback: progress.rank_reporters).
    None from executors that ship the work (a callback here cannot be called
    there): a Progress then knows the ranks' sizes, and counts them read when
    the reading is over."""
    reporters = rank_reporters(progress, inputs)
    if not executor.shares_memory:
        reporters = [None] * len(inputs)
    return list(zip(inputs, reporters))


def collect_tables_from_traces(inputs, world_size=None, jobs=1, align_clocks=None, gpus_per_node=None,
                               strict=False, progress=None):
    """extract -> align for a list of RankInput, in-process: ``{name: DataFrame}``
    (ranks read in up to ``jobs`` threads at a time)."""
    return RankReading(inputs, world_size, jobs, strict, progress).tables(align_clocks, gpus_per_node)


def _correlated_tables(inputs, world_size, jobs, align_clocks, gpus_per_node, strict, progress, executor=None,
                       custom=None, blocking_clocks=None, critical=False, finished=None):
    """extract -> align -> correlate of trace files as a map and a reduce:
    ``{name: DataFrame}`` with the ``align.*`` and ``correlate.*`` tables.

    The map reads each rank once into what align keeps (its collective rows)
    and what correlate keeps (its Timeline); the reduce matches the ranks'
    collectives and runs the cross-rank analyses over the timelines.
    ``align_clocks``: the clocks of the ``align.*`` tables (the report's
    sheets); ``blocking_clocks``: those correlate and the point-to-point
    tables use; None for either: the clock rule (confidence.clock_rule).
    ``finished``: as ``correlated_tables`` takes it."""
    from .align.p2p_match import P2P_TABLE_NAMES
    from .align.stage import TABLE_NAMES, align_options_table, match_by_rule
    from .confidence import BLOCKING_CLOCKS
    from .correlate.compute import compute_table
    from .correlate.inputs import ALIGN_COLUMNS_USED
    from .correlate.stage import TABLE_PREFIX, analyze_collected
    from .steps import STEPS_TABLE as ALIGN_STEPS, TABLE as STEPS, rank_steps, step_table
    from .stream.format import table_frame

    read = functools.partial(_summarize_rank_for_blocking, world_size=world_size, strict=strict, custom=custom)
    executor = as_executor(executor)
    with contextlib.ExitStack() as owned:
        executor_ = executor if executor is not None else owned.enter_context(local_executor(jobs, len(inputs)))
        items = _rank_items(inputs, progress, executor_)
        summaries = list(executor_.map(read, items))
    _check_distinct_ranks(inputs, [result for result, _ in summaries])
    summaries.sort(key=lambda s: s[0].rank)
    results = [result for result, _ in summaries]
    timelines = {tl.rank: tl for _, tl in summaries}
    # the steps in each trace's own ns (a timeline holds them moved by its ``shift``)
    step_rows = [rank_steps(tl.rank, tl.steps[0], tl.steps[1] - tl.shift, tl.steps[2] - tl.shift)
                 for tl in timelines.values()]
    align = match_by_rule(results, align_clocks=align_clocks, gpus_per_node=gpus_per_node, steps=step_rows)
    align["align.options"] = align_options_table(align_clocks, gpus_per_node)
    blocking = _blocking_align(results, align, blocking_clocks, gpus_per_node, step_rows)
    # every table as the staged chain hands it on (a table frame's decoded form)
    tables = {name: table_frame(name, align[name]).table()[1] for name in TABLE_NAMES + (ALIGN_STEPS,)
              if name in align}
    tables.update({name: table_frame(name, blocking[name]).table()[1] for name in P2P_TABLE_NAMES
                   if name in blocking})
    tables[BLOCKING_CLOCKS] = blocking["align.clocks"]
    used = {"align.collectives": table_frame("align.collectives", blocking["align.collectives"])
            .table(ALIGN_COLUMNS_USED)[1], **{n: tables[n] for n in P2P_TABLE_NAMES if n in tables}}
    sheets = analyze_collected(timelines, used, compute=compute_table(timelines))
    for name, df in sheets.items():
        tables[TABLE_PREFIX + name] = table_frame(TABLE_PREFIX + name, df).table()[1]
    tables[STEPS] = step_table(step_rows, tables)
    if finished is not None:
        finished((timelines, used))
    if critical:   # the critical path's graph, from the timelines correlate put on its clocks
        tables.update(_critical_tables(timelines, used))
    return tables


def _critical_tables(timelines, used):
    """The ``critical.*`` tables (critical.graph) of the reduce's timelines."""
    from .critical import instance_rows, node_tables

    return node_tables(timelines, instance_rows(used["align.collectives"], used.get("align.p2p")))


def _blocking_align(results, align, blocking_clocks, gpus_per_node, steps=None):
    """The align tables streamtrace's own analyses read: ``align`` itself
    when its clocks are those ``blocking_clocks`` (None: the clock rule)
    asks for, else the ranks matched again with them."""
    from .align.match import match_ranks
    from .confidence import _applied, clock_rule

    want = clock_rule(align).apply if blocking_clocks is None else bool(blocking_clocks)
    if want == bool(_applied(align["align.clocks"])):
        return align
    return match_ranks(results, align_clocks=want, gpus_per_node=gpus_per_node, steps=steps)


def _summarize_rank_for_blocking(item, world_size, strict, custom=None):
    """The blocking analysis' map, read and finished on the same worker: a
    rank's collection is reduced to its summary before the worker reads the
    next rank, so at most ``jobs`` ranks are held whole at once (finished on
    the consuming thread instead, read ranks queued behind the one being
    finished)."""
    return _finish_rank_for_blocking(_read_rank_for_blocking(item, world_size, strict, custom))


def _read_rank_for_blocking(item, world_size, strict, custom=None):
    """The blocking analysis' map: one rank's trace read once, into align's
    RankCollector and correlate's RankTimeline (flows left out: neither reads them)."""
    from .align.collect import RankCollector
    from .correlate.collect import RankTimeline
    from .extract import extract_rank

    inp, progress = item
    rows = timeline = None
    frames = extract_rank(inp.path, inp.rank, world_size, False, inp.position, strict=strict, progress=progress,
                          batch_events=PIPELINE_BATCH_EVENTS, map_window=BLOCKING_MAP_WINDOW, drop_flows=True,
                          summarize=False)
    # the tokenizer (no GIL) reads on in its own thread while this one collects
    for frame in prefetched(frames, depth=RANK_PREFETCH_FRAMES, name="streamtrace-extract"):
        if rows is None:   # the rank is the trace's own when the input names none
            rows, timeline = RankCollector(frame.rank, custom, squeeze=True), RankTimeline(frame.rank, squeeze=True)
        rows.add(frame)
        timeline.add(frame)
    return rows, timeline


def _finish_rank_for_blocking(pair):
    """A rank's RankResult and correlate's summary of it (its Timeline
    reduced to what the cross-rank analyses read: correlate/summary.py)."""
    from .align.describe import finish_rank
    from .correlate.summary import compact

    rows, timeline = pair
    result = finish_rank(rows)
    summary = compact(timeline.finish(), result.rows["event"], result.rows["launch_tid"])
    # ~290 MB less RSS after the map on 8 x 1 GB, about 3 % more CPU
    give_back_freed_memory()
    return result, summary


def summary_versions():
    """What a rank's announcement lists: {summary name: version}, one per
    stage that can read a summary instead of the rank's events."""
    from .align.describe import SUMMARY_NAME as ALIGN_SUMMARY, SUMMARY_VERSION as ALIGN_VERSION
    from .correlate.summary import SUMMARY_NAME as CORRELATE_SUMMARY, SUMMARY_VERSION as CORRELATE_VERSION

    return {ALIGN_SUMMARY: ALIGN_VERSION, CORRELATE_SUMMARY: CORRELATE_VERSION}


def summarized(frames):
    """One rank's frames (an ``extract_rank`` generator) with its per-rank
    summaries: an announcement before the first frame, then every frame,
    then, after the META frame, the summaries the blocking analysis' map
    makes of the rank (align's RankResult, correlate's compacted
    Timeline), so that ``align`` and ``correlate`` read those instead of
    collecting the rank's events again.  What ``extract`` writes."""
    from .align.collect import RankCollector
    from .align.describe import SUMMARY_NAME as ALIGN_SUMMARY, result_summary
    from .correlate.collect import RankTimeline
    from .correlate.summary import SUMMARY_NAME as CORRELATE_SUMMARY, timeline_summary
    from .stream.format import summary_frame
    from .stream.summaries import ANNOUNCE

    versions = summary_versions()
    rows = timeline = None
    for frame in frames:
        if rows is None:   # a trace's frames are all of one rank
            rank = frame.rank
            rows, timeline = RankCollector(rank, squeeze=True), RankTimeline(rank, squeeze=True)
            yield summary_frame(rank, ANNOUNCE, 1, versions)
        rows.add(frame)
        timeline.add(frame)
        yield frame
    if rows is None:
        return
    result, summary = _finish_rank_for_blocking((rows, timeline))
    yield summary_frame(rank, ALIGN_SUMMARY, versions[ALIGN_SUMMARY], result_summary(result))
    yield summary_frame(rank, CORRELATE_SUMMARY, versions[CORRELATE_SUMMARY], timeline_summary(summary))


def extract(inputs, output, world_size=None, keep_pyfunc=False, jobs=None, strict=False, progress=None,
            executor=None, summaries=True):
    """Every RankInput extracted into one stream written to ``output`` (a
    binary file object): ``extract.extract``, with each rank's summaries
    (``summarized``) unless ``summaries`` is False."""
    from .extract import extract as extract_events

    extract_events(inputs, output, world_size=world_size, keep_pyfunc=keep_pyfunc, jobs=jobs, strict=strict,
                   progress=progress, executor=executor, summarized=summarized if summaries else None)


def _check_distinct_ranks(inputs, results):
    seen = {}
    for inp, res in zip(inputs, results):
        if res.rank in seen:
            raise StreamtraceError(f"{inp.path}: rank {res.rank} appears twice in the input (also {seen[res.rank]})")
        seen[res.rank] = inp.path


def generate_collective_report(trace_dir=None, trace_pattern=None, trace_glob=None, world_size=None,
                               output_xlsx_path=None, output_csvs_dir=None, detailed_analysis=True,
                               agg_metrics=DEFAULT_AGG_METRICS, strict_world_size_check=True,
                               use_multiprocessing=False, max_workers=None, rank_regex=None, gpus_per_node=None,
                               all2allv_heatmap=False, *, align_clocks=None, allow_missing_ranks=False,
                               strict=False, jobs=None, paths=(), write_files=True, progress=None,
                               blocking_analysis=False, output_html_path=None, executor=None,
                               custom_collective_patterns=None):
    """The whole chain (extract -> align -> report) in one process.

    TraceLens's ``generate_collective_report`` parameters in its order (a
    positional call means the same), then streamtrace's, keyword-only
    (``align_clocks``, ``allow_missing_ranks``, ``strict``, ``jobs``,
    ``paths``...).  ``align_clocks`` None is False: times as recorded, as in
    TraceLens (the align stage's None means "on across nodes").  ``jobs``
    None: ranks in parallel threads, one per rank up to the CPUs available
    (``use_multiprocessing`` with ``max_workers`` sets the count, as in
    TraceLens); 1 reads the ranks one after another; ``executor`` runs the
    per-rank map instead (``parallel.executor``; a ``distributed.Client`` runs it on
    that Dask cluster).
    Returns ``{sheet name: DataFrame}`` (its ``confidence`` attribute: how
    far the answers can be trusted, confidence.Confidence).  Unless ``write_files`` is false it
    also writes the outputs asked for; with no output path given nothing is
    written, as TraceLens's function does.
    ``strict_world_size_check=False`` is ``allow_missing_ranks=True`` (rank
    labels never shift).  ``blocking_analysis`` also runs ``correlate`` and
    adds its sheets.  ``output_html_path``: also write the HTML report
    (``html_report``; needs plotly); given alone, it is the only output.
    ``custom_collective_patterns``: ``(regex, Collective name)`` pairs, as
    TraceLens's: kernels whose names match are collectives (align.custom).
    """
    args = dict(locals())
    return _collective_report(args, files_only=False)[0]


def write_collective_report(**options):
    """What ``streamtrace collective-report`` runs: the report's files, for
    ``generate_collective_report``'s arguments (by keyword).  With no output
    path, ``nccl_analysis_report.xlsx`` goes where TraceLens's command puts
    it (A1.5).  Returns (the paths written, the sheet names, the answer's
    confidence.Confidence).  The sheets are
    not kept: with CSVs alone they are written by the forked processes that
    build them (``report.build_report``'s ``deliver``)."""
    bound = inspect.signature(generate_collective_report).bind(**options)
    bound.apply_defaults()
    sheets, paths_written = _collective_report(bound.arguments, files_only=True)
    return paths_written, list(sheets), sheets.confidence


def _collective_report(a, files_only):
    """``(sheets, paths written)`` for generate_collective_report's arguments
    ``a``; ``files_only``: the command line's run (see write_collective_report)."""
    inputs = _checked_report_inputs(a)
    xlsx, csvs, page = a["output_xlsx_path"], a["output_csvs_dir"], a["output_html_path"]
    if files_only and not (xlsx or csvs or page):
        from .report.files import default_output_path

        xlsx = _default_output(default_output_path([i.path for i in inputs], a["trace_dir"], a["trace_pattern"],
                                                   a["world_size"]))
    tables, report = _report_tables(inputs, a)
    options = dict(detailed_analysis=a["detailed_analysis"], agg_metrics=a["agg_metrics"],
                   gpus_per_node=a["gpus_per_node"], all2allv_heatmap=a["all2allv_heatmap"], strict=a["strict"],
                   world_size=a["world_size"])
    phase(a["progress"], "writing sheets")
    if files_only and csvs and not xlsx and not page:
        sheets, paths_written = _report_into_csvs(report, tables, csvs, options)
        return _with_confidence(sheets, tables), paths_written
    sheets = _with_confidence(report.build_report(tables, **options), tables)
    if not a["write_files"] or not (xlsx or csvs or page or files_only):
        return sheets, []
    from .report.writers import write_report
    from .steps import TABLE as STEPS

    # every output staged, then committed together: all of them appear, or none
    html = dict(sources=[i.path for i in inputs], world_size=a["world_size"], steps=tables.get(STEPS),
                confidence=sheets.confidence)
    return sheets, write_report(sheets, xlsx, csvs, page, html=html, write_html=_html_writer(page))


def _default_output(path):
    """``path``, the default workbook beside the traces, unless the traces
    are at http(s) URLs, where nothing can be written: then one line saying
    so and how to choose another place, before any work."""
    if is_url(path) and path.split(":", 1)[0].lower() in ("http", "https"):
        from .remote import redact

        raise StreamtraceError(f"{redact(path)}: no output path was given, and the default workbook goes beside the "
                               "traces, where writing to http(s) URLs is not supported; choose another place "
                               "with --output_xlsx_path or --output_csvs_dir")
    return path


class Sheets(dict):
    """A report's ``{sheet name: DataFrame}``, with the answer's
    ``confidence`` (a confidence.Confidence: ``.level``, ``.reasons``,
    ``.table()``)."""

    confidence = None


def _with_confidence(sheets, tables):
    from .confidence import report_confidence

    out = Sheets(sheets)
    out.confidence = report_confidence(tables)
    return out


def _checked_report_inputs(a):
    """The RankInputs of a report's arguments, every argument and output
    checked before any work."""
    from .io.ranks import DEFAULT_RANK_REGEX, resolve_inputs

    if a["gpus_per_node"] is not None and a["gpus_per_node"] <= 0:
        raise InvalidArgumentError(f"--gpus_per_node must be > 0 (got {a['gpus_per_node']})")
    check_aggs(a["agg_metrics"])
    custom_collectives(a["custom_collective_patterns"])   # checked before any work
    if a["output_html_path"] and a["write_files"]:
        from .html_report import check_output

        check_output(a["output_html_path"])
    inputs = resolve_inputs(paths=a["paths"], trace_dir=a["trace_dir"], trace_pattern=a["trace_pattern"],
                            trace_glob=a["trace_glob"], rank_regex=a["rank_regex"] or DEFAULT_RANK_REGEX,
                            world_size=a["world_size"],
                            allow_missing_ranks=a["allow_missing_ranks"] or not a["strict_world_size_check"])
    if a["write_files"]:
        from .report.files import check_report_outputs

        check_report_outputs(a["output_xlsx_path"], a["output_csvs_dir"], [i.path for i in inputs])
    return inputs


def _report_tables(inputs, a):
    """The align (and with ``blocking_analysis`` correlate) tables of the
    ranks, and the report module (imported while the first ranks are read)."""
    # TraceLens's columns mean the times as the traces recorded them; the
    # offsets are still estimated, and data_quality says when they matter
    align_clocks = bool(a["align_clocks"])
    jobs = a["jobs"] if a["jobs"] is not None or not a["use_multiprocessing"] else a["max_workers"]
    custom = custom_collectives(a["custom_collective_patterns"])
    if a["blocking_analysis"]:
        # streamtrace's own analyses (correlate, p2p) use the clock rule unless told
        tables = _correlated_tables(inputs, a["world_size"], jobs, align_clocks, a["gpus_per_node"], a["strict"],
                                    a["progress"], executor=a["executor"], custom=custom,
                                    blocking_clocks=a["align_clocks"])
        from .report import sheets as report

        return tables, report
    reading = RankReading(inputs, a["world_size"], jobs, a["strict"], a["progress"], executor=a["executor"],
                          custom=custom)
    try:
        from .report import sheets as report  # pandas loads while the first ranks are tokenized
    except BaseException as exc:
        reading.close(wait=not stopping(exc))
        raise
    # the point-to-point sheets are streamtrace's own analysis: the clock rule unless told
    return reading.tables(align_clocks, a["gpus_per_node"], p2p_clocks=a["align_clocks"]), report


def _report_into_csvs(report, tables, directory, options):
    """Build the report (``report``: report.sheets) and write its CSVs, each
    forked process writing the sheets it built (``build_report``'s
    ``deliver``): (sheets, with None for those written by the child; the
    paths written)."""
    from .report.writers import CsvDir

    out = CsvDir(directory)
    try:
        sheets = report.build_report(tables, deliver=functools.partial(out.write, parallel=False), **options)
        out.write({name: df for name, df in sheets.items() if df is not None})
        return sheets, [out.commit(list(sheets))]
    finally:
        out.discard()


def report_streams(streams, output_xlsx_path=None, output_csvs_dir=None, output_html_path=None,
                   detailed_analysis=True, agg_metrics=DEFAULT_AGG_METRICS, gpus_per_node=None,
                   all2allv_heatmap=False, align_clocks=None, strict=False):
    """What ``streamtrace report`` runs: the collective report of event
    streams (``-``: stdin), aligned here when they have not been through
    ``align``.  Writes the outputs asked for -- with none,
    ``nccl_analysis_report.xlsx`` beside the traces the streams came from --
    and returns (the paths written, the sheets)."""
    from .report.files import check_report_outputs, default_output_path
    from .report.sheets import build_report
    from .report.tables import collect_tables
    from .report.writers import write_report
    from .steps import StreamSteps, step_table

    check_report_outputs(output_xlsx_path, output_csvs_dir, streams)
    if output_html_path:
        from .html_report import check_output

        check_output(output_html_path)
    frames = (f for s in streams for f in iter_frames(s))
    steps = StreamSteps() if output_html_path else None   # from the streams' events, when they hold them
    if steps is not None:
        frames = steps.watch(frames)
    tables = collect_tables(frames, align_clocks=align_clocks, gpus_per_node=gpus_per_node)
    sheets = build_report(tables, detailed_analysis=detailed_analysis, agg_metrics=agg_metrics,
                          gpus_per_node=gpus_per_node, all2allv_heatmap=all2allv_heatmap, strict=strict)
    sources = [s for s in tables["align.ranks"]["source"].dropna().tolist() if s != "-"]
    html = None
    if output_html_path:
        from .confidence import report_confidence

        html = dict(sources=sources, steps=step_table(steps.finish(), tables), confidence=report_confidence(tables))
    if not output_xlsx_path and not output_csvs_dir and not output_html_path:
        output_xlsx_path = default_output_path(sources)   # beside the traces, at their URL when they had one
    # every output staged, then committed together: all of them appear, or none
    return write_report(sheets, output_xlsx_path, output_csvs_dir, output_html_path, html=html,
                        write_html=_html_writer(output_html_path)), sheets


def blockers(paths, top=5, jobs=None, world_size=None, executor=None, html_path=None, align_clocks=None):
    """The short answer as text: its confidence first (docs/confidence.md),
    then straggler, dominant cause of waiting, top blocking kernels and host
    ops, top contention pairs.  ``paths`` as ``correlated_tables`` takes
    them; ``align_clocks`` too (None: the clock rule).  ``html_path``: also
    the HTML report of the whole run there (waits, bandwidth and clocks
    beside the blocking answer; needs plotly).  The text's ``confidence``
    attribute is the confidence.Confidence."""
    from . import critical
    from .align.p2p_match import pipeline_text
    from .confidence import report_confidence
    from .correlate.stage import blockers_text, sheets_from_tables

    if html_path:
        from .html_report import check_output

        check_output(html_path)   # before the work, not after it
    tables = correlated_tables(paths, jobs=jobs, world_size=world_size, executor=executor, align_clocks=align_clocks,
                               critical=True)
    sheets = sheets_from_tables(tables)
    confidence = report_confidence(tables)
    text = blockers_text(sheets, top=top, confidence=confidence)
    pipeline = pipeline_text(tables.get("align.pipeline"), tables.get("align.p2p"), sheets.get("p2p_blockers"))
    if pipeline:   # the pipeline's answer first after the confidence; alone when no collective was waited on
        blocked = sheets.get("collective_blockers")
        head = confidence.lines()
        rest = text.splitlines()[len(head):]
        text = "\n".join(head + pipeline.splitlines() + ([] if blocked is None or not len(blocked) else rest))
    win = biggest_win(tables)
    if win:   # what fixing it is worth (streamtrace whatif lists the others)
        text += "\n" + win
    if html_path:
        from .html_report import write_html
        from .report.sheets import build_report
        from .steps import TABLE as STEPS

        sources = [s for s in tables["align.ranks"]["source"].dropna().tolist() if s != "-"]
        page = build_report(tables)
        if critical.NODES in tables:   # the critical path of each step, charted
            page["critical_path"] = critical.compute(tables)["critical_path"]
        write_html(page, html_path, title="streamtrace blockers", sources=sources,
                   steps=tables.get(STEPS), confidence=confidence)
    return Answer(text, confidence)


def whatif(paths=(), scenario=None, top=5, percent=None, jobs=None, world_size=None, executor=None,
           align_clocks=None, trace_dir=None, trace_pattern=None, trace_glob=None, rank_regex=None,
           allow_missing_ranks=False, output_xlsx_path=None, output_csvs_dir=None):
    """The critical path of every profiler step and what each fix is worth
    (docs/critical-path.md): ``Sheets`` {"whatif", "critical_path",
    "critical_path_summary"} with its ``confidence`` and ``text`` (the
    confidence first, then the top scenarios by step time saved, a line
    each).  ``paths`` as ``correlated_tables`` takes them, or the traces the
    discovery options find; ``scenario``: one or more names
    (critical.scenarios.parse) run instead of the ones the paths suggest;
    ``percent``: how much faster the suggested kernel scenarios make a
    kernel.  Writes the three sheets to ``output_xlsx_path`` /
    ``output_csvs_dir`` when given (all or none)."""
    from . import critical
    from .confidence import report_confidence

    scenarios = None if scenario is None else ([scenario] if isinstance(scenario, str) else list(scenario))
    if scenarios:
        from .critical.scenarios import parse

        for name in scenarios:
            parse(name)   # a bad name is refused before any work
    if output_xlsx_path or output_csvs_dir:
        from .report.files import check_report_outputs

        check_report_outputs(output_xlsx_path, output_csvs_dir, list(paths))
    if trace_dir or trace_pattern or trace_glob:
        from .io.ranks import DEFAULT_RANK_REGEX, resolve_inputs

        if paths:
            raise InvalidArgumentError("give traces either as paths or through --trace_dir/--trace_pattern/"
                                       "--trace_glob, not both")
        inputs = resolve_inputs(trace_dir=trace_dir, trace_pattern=trace_pattern, trace_glob=trace_glob,
                                rank_regex=rank_regex or DEFAULT_RANK_REGEX, world_size=world_size,
                                allow_missing_ranks=allow_missing_ranks)
        tables = _correlated_tables(inputs, world_size, jobs, align_clocks, None, False, None,
                                    executor=as_executor(executor), blocking_clocks=align_clocks, critical=True)
    else:
        tables = correlated_tables(list(paths) or ["-"], jobs=jobs, world_size=world_size, executor=executor,
                                   align_clocks=align_clocks, critical=True)
    confidence = report_confidence(tables)
    out = critical.whatif(tables, scenarios=scenarios, percent=percent)
    sheets = Sheets({name: out[name] for name in ("whatif", "critical_path", "critical_path_summary")})
    sheets.confidence = confidence
    sheets.text = whatif_text(out, confidence, top=top if scenarios is None else None)
    if output_xlsx_path or output_csvs_dir:
        from .report.writers import write_report

        sheets.written = write_report(dict(sheets), output_xlsx_path, output_csvs_dir)
    return sheets


def whatif_text(out, confidence=None, top=5):
    """``whatif``'s text: the confidence, the steps' critical paths in one
    line, then a line per scenario by step time saved (``top`` of them;
    None: all)."""
    from . import critical

    lines = confidence.lines() if confidence is not None else []
    steps = out["critical_steps"]
    if not len(steps):
        lines.append("No GPU work in any profiler step: no critical path to replay.")
        return "\n".join(lines)
    summary = out["critical_path_summary"]
    by_cat = summary.groupby("category", sort=False)["dur_us"].sum().sort_values(ascending=False)
    total = by_cat.sum()
    parts = ", ".join(f"{c} {100.0 * v / total:.0f} %" for c, v in by_cat.items() if total and v > 0)
    lines.append(f"Critical path of {len(steps)} step{'s' if len(steps) != 1 else ''} "
                 f"(mean {critical._time(steps['step_us'].mean())}): {parts}")
    ranked = critical.ranked(out["whatif"])
    if top is not None:
        ranked = ranked.head(top)
    lines.append("What if (step time saved, mean over steps):" if len(ranked) else "No scenario to replay.")
    for row in ranked.itertuples():
        lines.append("  " + critical.line(row))
    return "\n".join(lines)


def biggest_win(tables):
    """``blockers``' what-if line (the scenario the replays say saves most),
    or None without the critical tables or a win."""
    from . import critical

    if critical.NODES not in tables:
        return None
    # the first scenario of each kind the paths suggest (whatif replays them all)
    ranked = critical.ranked(critical.whatif(tables, one_per_kind=True)["whatif"])
    if not len(ranked) or ranked.iloc[0]["saving_us"] <= 0:
        return None
    best = next(ranked.head(1).itertuples())
    if not best.saving_pct >= WIN_WORTH_NAMING_PCT:
        # a saving this small is inside the steps' own jitter: naming it as a
        # win would send someone after nothing
        return (f"Biggest what-if win: none worth naming (no scenario saves {WIN_WORTH_NAMING_PCT:g} % of the "
                f"{critical._time(best.measured_step_us)} step; best: {critical.line(best)})")
    return "Biggest what-if win: " + critical.line(best)


#: the smallest mean saving, as a share of the step, that blockers names as a win
WIN_WORTH_NAMING_PCT = 1.0


class Answer(str):
    """``blockers``' text, with its ``confidence`` (a confidence.Confidence)."""

    def __new__(cls, text, confidence):
        out = super().__new__(cls, text)
        out.confidence = confidence
        return out


def _html_writer(path):
    """The HTML page's writer when a page is asked for (importing it costs
    plotting's imports, so only then)."""
    if not path:
        return None
    from .html_report import write_html

    return write_html
