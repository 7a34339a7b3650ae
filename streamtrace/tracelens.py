"""AMD TraceLens's public API for the multi-rank collective report and trace
fusion, run by streamtrace's engine.

Migrating a TraceLens script is one import::

    # from TraceLens.Reporting.generate_multi_rank_collective_report_pytorch import generate_collective_report
    # from TraceLens.TraceFusion.trace_fuse import TraceFuse
    from streamtrace.tracelens import generate_collective_report, TraceFuse

Here every name has TraceLens's signature, parameter order and defaults, and
raises the built-in exception TraceLens raises in the same situation
(``ValueError``, ``FileNotFoundError``; streamtrace's classes subclass them,
see ``streamtrace.errors``).  Clock offsets are never applied here (TraceLens
has no clock alignment): the report's columns mean what they mean in
TraceLens.  The top-level ``streamtrace.generate_collective_report`` and
``streamtrace.TraceFuse`` keep streamtrace's richer options.  What still
differs, and why, is listed in docs/tracelens.md ("Differences from
TraceLens").
"""
import argparse
import glob
import logging
import numbers
import os
import sys

from .fuse import TraceFuse as _StreamingTraceFuse
from .errors import InputNotFoundError, InvalidArgumentError, StreamtraceError
from .io.ranks import DEFAULT_RANK_REGEX, TRACE_SUFFIXES, _from_glob
from .remote import is_url

__all__ = ["DEFAULT_RANK_REGEX", "TraceFuse", "find_trace_files", "generate_collective_report", "infer_world_size",
           "main"]

log = logging.getLogger("streamtrace")

#: TraceLens's default aggregations for the implicit-sync and all2allv summaries
_TRACELENS_AGG_METRICS = ("mean", "median", "min", "max")


def find_trace_files(input_dir, pattern="rank*_trace.json"):
    """The files in ``input_dir`` matching the glob ``pattern``, sorted (an
    empty list when there are none).  Prints TraceLens's line on stdout, as
    TraceLens does: scripts and tests written for it look for "No trace files
    found"."""
    files = sorted(glob.glob(os.path.join(input_dir, pattern)))
    if not files:
        print(f"No trace files found matching pattern '{pattern}' in {input_dir}")
    else:
        print(f"Found {len(files)} trace files in {input_dir}")
    return files


def infer_world_size(trace_files):
    """The world size a list of per-rank trace files stands for: its length."""
    return len(trace_files)


def _resolve_trace_files_glob(trace_glob, world_size, rank_regex=DEFAULT_RANK_REGEX):
    """One path per rank 0..world_size-1 from a recursive glob and a rank
    regex (the first path in sorted order wins a rank).  FileNotFoundError
    when nothing matches or a rank is missing; ValueError when no path
    yields a rank."""
    return [inp.path for inp in _from_glob(trace_glob, rank_regex, world_size, False)]


def generate_collective_report(trace_dir=None, trace_pattern=None, trace_glob=None, world_size=None,
                               output_xlsx_path=None, output_csvs_dir=None, detailed_analysis=True,
                               agg_metrics=list(_TRACELENS_AGG_METRICS), strict_world_size_check=True,
                               use_multiprocessing=False, max_workers=None, rank_regex=DEFAULT_RANK_REGEX,
                               gpus_per_node=None, all2allv_heatmap=False):
    """The multi-rank collective report, as TraceLens's function of this name.

    Exactly one of ``trace_dir`` (``rank{i}_trace.json``; ``.json.gz`` and
    ``.json.zst`` too), ``trace_pattern`` (one ``*`` replaced by the rank) or
    ``trace_glob`` (with ``rank_regex``); ``world_size`` is required.
    Writes the CSVs and/or workbook asked for -- nothing when neither path is
    given -- and returns ``{sheet name: DataFrame}``.

    ValueError: no ``world_size``, a ``world_size`` or ``max_workers`` below 1, not exactly one input mode, a pattern
    without exactly one ``*``, ``gpus_per_node`` <= 0, a glob whose files
    yield no rank.  FileNotFoundError: a rank's file is missing (with
    ``strict_world_size_check``; without it the ranks present are analysed
    under their own numbers), a glob that matches nothing or misses a rank.
    """
    if world_size is None:
        raise InvalidArgumentError("world_size must be provided")
    _check_count("world_size", world_size)
    if max_workers is not None:
        _check_count("max_workers", max_workers)
    if sum(bool(x) for x in (trace_dir, trace_pattern, trace_glob)) != 1:
        raise InvalidArgumentError("Provide exactly one of trace_dir, trace_pattern, or trace_glob")
    if trace_dir and not is_url(trace_dir) and not any(
            os.path.isfile(os.path.join(trace_dir, f"rank{r}_trace{suffix}"))
            for r in range(world_size) for suffix in TRACE_SUFFIXES):
        # TraceLens looks for these names only; streamtrace's fallback (every
        # trace of the directory, ranks from distributedInfo) is not asked for here
        raise InputNotFoundError(f"Expected trace file not found: {os.path.join(trace_dir, 'rank0_trace.json')} "
                                 f"(no rank{{i}}_trace.json[.gz|.zst] for i < {world_size} in {trace_dir})")
    from .chain import generate_collective_report as oneshot_report

    return oneshot_report(
        trace_dir=trace_dir, trace_pattern=trace_pattern, trace_glob=trace_glob, world_size=world_size,
        output_xlsx_path=output_xlsx_path, output_csvs_dir=output_csvs_dir, detailed_analysis=detailed_analysis,
        agg_metrics=agg_metrics,
        # TraceLens's glob mode always wants every rank, whatever this flag says
        strict_world_size_check=strict_world_size_check or bool(trace_glob),
        use_multiprocessing=use_multiprocessing, max_workers=max_workers, rank_regex=rank_regex,
        gpus_per_node=gpus_per_node, all2allv_heatmap=all2allv_heatmap,
        align_clocks=False)


def _check_count(name, value):
    """ValueError unless ``value`` is an integer of at least 1 (TraceLens
    would go on with 0 or a negative and fail later, about something else)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidArgumentError(f"{name} must be an integer of at least 1, not {value!r}")


def _parser():
    p = argparse.ArgumentParser(description="Multi-rank NCCL/RCCL collective report (TraceLens's command, "
                                            "run by streamtrace)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--trace_dir", type=str, help="directory of rank{i}_trace.json files")
    mode.add_argument("--trace_pattern", type=str, help="path with one '*' standing for the rank")
    mode.add_argument("--trace_glob", type=str, help="glob of trace files ('**' allowed); ranks from --rank_regex")
    p.add_argument("--world_size", type=int, default=None, help="number of ranks (required)")
    p.add_argument("--rank_regex", type=str, default=DEFAULT_RANK_REGEX,
                   help=f"rank of a --trace_glob file: the group 'rank' or group 1 (default {DEFAULT_RANK_REGEX!r})")
    p.add_argument("--output_xlsx_path", type=str, default=None, help="Excel workbook to write")
    p.add_argument("--output_csvs_dir", type=str, default=None, help="directory for one CSV per sheet")
    p.add_argument("--detailed_analysis", action="store_true", default=True,
                   help="write the detail sheets (always on, as in TraceLens)")
    p.add_argument("--agg_metrics", type=str, nargs="+", default=list(_TRACELENS_AGG_METRICS),
                   help="aggregations of the summaries (default: mean median min max)")
    p.add_argument("--use_multiprocessing", action="store_true", help="read the rank files in parallel")
    p.add_argument("--max_workers", type=int, default=None, help="parallel readers with --use_multiprocessing")
    p.add_argument("--gpus_per_node", type=int, default=None,
                   help="GPUs per node for node_id/node_span (default: the first trace's deviceProperties)")
    p.add_argument("--all2allv_heatmap", action="store_true", help="add the nccl_all2allv_heatmap sheet")
    return p


def main(argv=None):
    """TraceLens's ``TraceLens_generate_multi_rank_collective_report_pytorch``
    command: the same flags; with no output flag the workbook
    ``nccl_analysis_report.xlsx`` goes next to the traces.  Bad input is one
    line on stderr and exit status 1 (usage errors: 2), not a traceback."""
    args = _parser().parse_args(argv)
    try:
        if args.world_size is None:
            raise InvalidArgumentError("world_size must be provided (--world_size)")
        if args.output_xlsx_path is None and args.output_csvs_dir is None:
            from .report.files import default_output_path

            paths = _resolve_trace_files_glob(args.trace_glob, args.world_size, args.rank_regex) \
                if args.trace_glob else []
            args.output_xlsx_path = default_output_path(paths, args.trace_dir, args.trace_pattern, args.world_size)
        generate_collective_report(
            trace_dir=args.trace_dir, trace_pattern=args.trace_pattern, trace_glob=args.trace_glob,
            world_size=args.world_size, output_xlsx_path=args.output_xlsx_path,
            output_csvs_dir=args.output_csvs_dir, detailed_analysis=args.detailed_analysis,
            agg_metrics=args.agg_metrics, use_multiprocessing=args.use_multiprocessing,
            max_workers=args.max_workers, rank_regex=args.rank_regex, gpus_per_node=args.gpus_per_node,
            all2allv_heatmap=args.all2allv_heatmap)
    except StreamtraceError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)
    for path in (args.output_csvs_dir, args.output_xlsx_path):
        if path:
            print(f"wrote {path}", file=sys.stderr)


class TraceFuse(_StreamingTraceFuse):
    """TraceLens's ``TraceFuse``: ``TraceFuse(files, use_multiprocessing=False,
    max_workers=None)``, ``merge(filter_fn=None, include_pyfunc=False)`` and
    ``merge_and_save(output_file="merged_trace.json", filter_fn=None,
    include_pyfunc=False)`` (writes ``<output_file>.gz``).

    ``rank2filepath`` is the ``{rank: path}`` dict TraceLens keeps (a list
    becomes ``{position: path}``); ``max_workers`` defaults to the CPU count,
    as there.  Processes are named ``RANK r - CPU`` / ``RANK r - GPU`` as
    TraceLens names them.  Like TraceLens, the first file is checked at
    construction: a missing one is a FileNotFoundError there.
    """

    def __init__(self, profile_filepaths_list_or_dict, use_multiprocessing=False, max_workers=None):
        if max_workers is not None:
            _check_count("max_workers", max_workers)
        if isinstance(profile_filepaths_list_or_dict, dict):
            rank2filepath = profile_filepaths_list_or_dict
            for rank in rank2filepath:
                # a rank numbers the fused trace's processes: a negative one gives negative pids
                if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 0:
                    raise InvalidArgumentError(f"TraceFuse: rank {rank!r} (for {rank2filepath[rank]}) is not a "
                                               "non-negative integer")
        elif isinstance(profile_filepaths_list_or_dict, list):
            rank2filepath = dict(enumerate(profile_filepaths_list_or_dict))
        else:
            raise InvalidArgumentError("TraceFuse takes a list of trace paths (rank = position) or a "
                                       f"{{rank: path}} dict, not {type(profile_filepaths_list_or_dict).__name__}")
        super().__init__(rank2filepath, use_multiprocessing=use_multiprocessing,
                         max_workers=max_workers if max_workers is not None else (os.cpu_count() or 8))
        self.rank2filepath = rank2filepath   # as given, as TraceLens keeps it
        first = next(iter(self.rank2filepath.values()))
        if not is_url(str(first)) and not os.path.exists(first):   # a URL: reported when it is opened
            from .errors import TraceNotFoundError

            raise TraceNotFoundError(first, "no such file")

    def merge_and_save(self, output_file="merged_trace.json", filter_fn=None, include_pyfunc=False):
        # TraceLens appends '.gz' to whatever it is given (None fails there on
        # None + str); a path is required here, so None never becomes ./None.gz
        if not isinstance(output_file, (str, os.PathLike)) or not str(output_file):
            raise InvalidArgumentError(f"TraceFuse.merge_and_save: output_file must be a path, not {output_file!r}")
        return super().merge_and_save(output_file, filter_fn=filter_fn, include_pyfunc=include_pyfunc)


if __name__ == "__main__":  # python -m streamtrace.tracelens --trace_dir ... --world_size N
    main()
