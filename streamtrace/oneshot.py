"""The one-shot collective report: extract -> align -> report in one process.

Apart from ``report`` and free of pandas at import time on purpose:
``generate_collective_report`` starts reading the ranks (C tokenizer threads,
which release the GIL) before it imports ``report`` -- and with it pandas,
about 0.2 s -- so that the import and the first ranks' tokenizing overlap.
"""
import functools
import os

from .errors import Interrupted, StreamtraceError

DEFAULT_AGG_METRICS = ("mean", "median", "min", "max")
#: aggregations pandas' groupby.agg takes by name (TraceLens passes the user's list to it)
ALLOWED_AGGS = ("mean", "median", "min", "max", "std", "var", "sum", "count", "first", "last", "sem", "prod",
                "nunique", "size")


def check_aggs(agg_metrics):
    """The aggregation names to use; a StreamtraceError for an unknown one."""
    aggs = list(agg_metrics or DEFAULT_AGG_METRICS)
    for a in aggs:
        if a not in ALLOWED_AGGS:
            raise StreamtraceError(f"--agg_metrics: unknown aggregation {a!r} (use any of {', '.join(ALLOWED_AGGS)})")
    return aggs


def available_cpus():
    """CPUs this process may run on (its affinity mask, e.g. under taskset or
    a container's cpuset), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class RankReading:
    """Ranks being extracted and reduced to their collective rows
    (``rankcollect.collected_rank``) in up to ``jobs`` threads, started at once.

    Threads, not processes: the C tokenizer (most of the time) runs without
    the GIL, and threads share one copy of the interpreter and its imports --
    worker processes measured the same speed at ~1.5x the summed RSS
    (4 x 500 MB: 190 MB in threads, 280 MB in processes).  ``jobs`` 1 reads
    the ranks one after another (in one thread)."""

    def __init__(self, inputs, world_size=None, jobs=1, strict=False, progress=None):
        from concurrent.futures import ThreadPoolExecutor

        self.inputs = inputs
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(inputs))),
                                        thread_name_prefix="streamtrace-rank")
        self._futures = [self._pool.submit(_read_rank, inp, world_size, strict, cb)
                         for inp, cb in zip(inputs, _summed_progress(progress, len(inputs)))]

    def results(self):
        """Every rank's RankResult, in input order.  The first failure (in
        input order) is raised; ranks not started by then are not read.

        The reading threads only collect a rank's rows; this thread finishes
        each rank (``RankCollector.finish``, ~80 ms of GIL-held numpy on a
        dense rank) as it comes, so the threads go straight on to the next
        ranks.  (Finishing in the reading threads held the next ranks back
        by the finish and delayed it, two finishes contending for the GIL
        at once.)"""
        try:
            results = [f.result().finish() for f in self._futures]
        except BaseException as exc:
            # after a signal the ranks being read are left to end with the process
            self.close(wait=not isinstance(exc, (Interrupted, KeyboardInterrupt)))
            raise
        self.close()
        seen = {}
        for inp, res in zip(self.inputs, results):
            if res.rank in seen:
                raise StreamtraceError(f"{inp.path}: rank {res.rank} appears twice in the input "
                                       f"(also {seen[res.rank]})")
            seen[res.rank] = inp.path
        return results

    def tables(self, align_clocks=None, gpus_per_node=None):
        """The ``align.*`` tables of the ranks (waits for them)."""
        from .align import align_options_table, match_ranks

        tables = match_ranks(self.results(), align_clocks=align_clocks, gpus_per_node=gpus_per_node)
        tables["align.options"] = align_options_table(align_clocks, gpus_per_node)
        return tables

    def close(self, wait=True):
        """Stop: ranks not started are not read; waits for the running ones
        (unless not ``wait``)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)


#: bytes per memory-mapped window of a plain trace read for the report.  A
#: window is a few GIL hand-offs of its reading thread, which wait while
#: pandas is imported and the other rank is finished.  Dense set (6
#: interleaved rounds): 2.50 s at 4 MiB, 2.41 s at 8, 2.39 s at 16; peak RSS
#: of 4 x 500 MB: 152, 177 and 223 MB (two readers, three windows each)
READ_MAP_WINDOW = 8 << 20


def _read_rank(inp, world_size, strict, progress):
    from .extract import extract_rank
    from .rankcollect import collected_rank

    # align reads only kernels, their launches and collective CPU ops: the
    # tokenizer leaves the other events out unparsed (flows alone are two per
    # kernel launch, often a quarter of the events)
    return collected_rank(extract_rank(inp.path, inp.rank, world_size, False, inp.position, strict=strict,
                                       progress=progress, drop_flows=True, align_only=True,
                                       map_window=READ_MAP_WINDOW), inp.rank)


def _summed_progress(progress, n):
    """Per-rank progress callbacks that report the sum over all ranks (the
    ranks are read in parallel threads)."""
    if progress is None:
        return [None] * n
    import threading

    latest = [{} for _ in range(n)]
    lock = threading.Lock()

    def callback(i):
        def report(counts):
            with lock:
                latest[i] = counts
                progress({key: sum(c.get(key, 0) for c in latest) for key in ("bytes_consumed", "events_stored")})
        return report

    return [callback(i) for i in range(n)]


def collect_tables_from_traces(inputs, world_size=None, jobs=1, align_clocks=None, gpus_per_node=None,
                               strict=False, progress=None):
    """extract -> align for a list of RankInput, in-process: ``{name: DataFrame}``
    (ranks read in up to ``jobs`` threads at a time)."""
    return RankReading(inputs, world_size, jobs, strict, progress).tables(align_clocks, gpus_per_node)


def _correlated_tables(inputs, world_size, jobs, align_clocks, gpus_per_node, strict, progress):
    """extract -> align -> correlate in-process (``jobs`` > 1: that many ranks
    extracted at once, in threads): ``{name: DataFrame}``."""
    from .align import align_frames
    from .correlate import correlate_frames
    from .pipeline import stage_frames
    from .report import collect_tables

    frames = stage_frames(inputs, world_size=world_size, jobs=jobs, strict=strict, progress=progress)
    return collect_tables(correlate_frames(align_frames(frames, align_clocks=align_clocks,
                                                        gpus_per_node=gpus_per_node)))


def generate_collective_report(trace_dir=None, trace_pattern=None, trace_glob=None, world_size=None,
                               rank_regex=None, output_xlsx_path=None, output_csvs_dir=None,
                               detailed_analysis=True, agg_metrics=DEFAULT_AGG_METRICS, use_multiprocessing=False,
                               max_workers=None, gpus_per_node=None, all2allv_heatmap=False,
                               strict_world_size_check=True, align_clocks=None, allow_missing_ranks=False,
                               strict=False, jobs=None, paths=(), write_files=True, progress=None, written=None,
                               blocking_analysis=False, keep_sheets=True):
    """The whole chain (extract -> align -> report) in one process.

    Same arguments as TraceLens's ``generate_collective_report`` plus
    streamtrace's (``align_clocks``, ``allow_missing_ranks``, ``strict``,
    ``jobs``, ``paths``).  ``jobs`` None: ranks in parallel threads, one per
    rank up to the CPUs available (``use_multiprocessing`` with ``max_workers`` sets the
    count, as in TraceLens); 1 reads the ranks one after another.
    Returns ``{sheet name: DataFrame}``.  Unless
    ``write_files`` is false it also writes the outputs; with neither output
    given, ``nccl_analysis_report.xlsx`` goes where TraceLens puts it (A1.5).
    ``strict_world_size_check=False`` is ``allow_missing_ranks=True`` (rank
    labels never shift).  ``written``, a dict, receives ``{"paths": [...]}``.
    ``blocking_analysis`` also runs ``correlate`` and adds its sheets.
    ``keep_sheets=False``, for a caller that needs only the files (the CLI):
    with CSV output alone, sheets written by a forked child are returned as
    None (see ``report.build_report``'s ``deliver``).
    """
    from .sources import DEFAULT_RANK_REGEX, resolve_inputs

    if gpus_per_node is not None and gpus_per_node <= 0:
        raise StreamtraceError(f"--gpus_per_node must be > 0 (got {gpus_per_node})")
    check_aggs(agg_metrics)
    inputs = resolve_inputs(paths=paths, trace_dir=trace_dir, trace_pattern=trace_pattern, trace_glob=trace_glob,
                            rank_regex=rank_regex or DEFAULT_RANK_REGEX, world_size=world_size,
                            allow_missing_ranks=allow_missing_ranks or not strict_world_size_check)
    if jobs is None:
        jobs = (max_workers or available_cpus()) if use_multiprocessing else min(len(inputs), available_cpus())
    if blocking_analysis:
        tables = _correlated_tables(inputs, world_size, jobs, align_clocks, gpus_per_node, strict, progress)
        from . import report
    else:
        reading = RankReading(inputs, world_size, jobs, strict, progress)
        try:
            from . import report  # pandas loads while the first ranks are tokenized
        except BaseException as exc:
            reading.close(wait=not isinstance(exc, (Interrupted, KeyboardInterrupt)))
            raise
        tables = reading.tables(align_clocks, gpus_per_node)
    options = dict(detailed_analysis=detailed_analysis, agg_metrics=agg_metrics, gpus_per_node=gpus_per_node,
                   all2allv_heatmap=all2allv_heatmap, strict=strict, world_size=world_size)
    if write_files and output_csvs_dir and not output_xlsx_path and not keep_sheets:
        sheets, paths_written = _report_into_csvs(report, tables, output_csvs_dir, options)
    else:
        sheets = report.build_report(tables, **options)
        if not write_files:
            return sheets
        if not output_xlsx_path and not output_csvs_dir:
            output_xlsx_path = report.default_output_path([i.path for i in inputs], trace_dir, trace_pattern,
                                                          world_size)
        paths_written = report.write_report(sheets, output_xlsx_path, output_csvs_dir)
    if written is not None:
        written["paths"] = paths_written
    return sheets


def _report_into_csvs(report, tables, directory, options):
    """Build the report and write its CSVs, each forked process writing the
    sheets it built (``build_report``'s ``deliver``): (sheets, with None for
    those written by the child; the paths written)."""
    out = report.CsvDir(directory)
    try:
        sheets = report.build_report(tables, deliver=functools.partial(out.write, parallel=False), **options)
        out.write({name: df for name, df in sheets.items() if df is not None})
        return sheets, [out.commit(list(sheets))]
    finally:
        out.discard()
