"""Command line: one Click command per API function.

Errors from the library (StreamtraceError) become one-line messages with exit
code 1; usage errors exit 2 (Click).  Stream-producing commands write to
``-o FILE`` (atomically: a temp file renamed on success) or to stdout when it
is not a terminal.
"""
import contextlib
import functools
import gc
import logging
import os
import signal
import sys
import threading

import click

from .extract import VERSION
from .chain import extract as extract_api
from .io.outputs import atomic_file as atomic_output
from .io.outputs import check_suffix, refuse_input_as_output, stdout_buffer
from .io.outputs import committed as outputs_committed
from .errors import Interrupted, StreamtraceError, os_reason
from .io.ranks import DEFAULT_RANK_REGEX, MAX_WORLD_SIZE, resolve_inputs
from .progress import echo, progress_for, shown
from .remote import redact_text
from .stream.format import MAX_RANK

log = logging.getLogger("streamtrace")


# ------------------------------------------------------------------ plumbing

class _StderrHandler(logging.Handler):
    def emit(self, record):
        prefix = "warning: " if record.levelno == logging.WARNING else ""
        echo(f"{prefix}{redact_text(record.getMessage())}")   # no URL credentials; above a progress bar


def _setup_logging(quiet):
    log.handlers[:] = [_StderrHandler()]
    log.setLevel(logging.ERROR if quiet else logging.INFO)
    log.propagate = False


def handle_errors(fn):
    """Turn library and operating-system errors into one-line Click errors
    (exit 1); after a stop signal, any error is the signal's (its
    ``Interrupted`` may have been swallowed or replaced on the way)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise click.Abort() from None
        except Exception as exc:
            if Interrupted.pending is not None:
                raise Interrupted(Interrupted.pending) from None
            _raise_as_click_error(exc)

    return wrapper


def _raise_as_click_error(exc):
    if isinstance(exc, StreamtraceError):
        raise click.ClickException(redact_text(exc)) from None   # a URL's credentials never shown
    if isinstance(exc, BrokenPipeError):  # e.g. `streamtrace dump ... | head`
        with contextlib.suppress(Exception):
            sys.stdout = open(os.devnull, "w")
        sys.exit(0)
    if isinstance(exc, OSError):   # the machine's, not ours (a full disk, an I/O error): one line too
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(redact_text(f"{where}{os_reason(exc)}")) from None
    raise exc


def _check_stream_output(output, inputs):
    """Before any work: an output name that no stream writer honours, or an input as the output."""
    if output and output != "-":
        check_suffix(output)
        refuse_input_as_output(output, list(inputs) or ["-"])   # none: stdin


@contextlib.contextmanager
def stream_output(path):
    """Where a stream-producing command writes: -o FILE, or a non-terminal stdout."""
    if path and path != "-":
        with atomic_output(path) as f:
            yield f
        return
    out = stdout_buffer("the event stream")
    if out.isatty():
        raise click.UsageError("refusing to write a binary event stream to a terminal: use -o FILE or a pipe")
    yield out
    out.flush()


def output_option(required=False, help="Write the stream here (default: stdout if not a terminal)."):
    """``-o/--output``: where a command writes its one output."""
    return click.option("-o", "--output", required=required, type=click.Path(), help=help)


def jobs_option(fn):
    """``-j/--jobs``: how many ranks every rank-parallel command runs at once."""
    return click.option("-j", "--jobs", type=click.IntRange(min=1),
                        help="Ranks processed at once [default: the CPUs available, at most one per rank].")(fn)


def scheduler_option(fn):
    """``--scheduler``: run the per-rank map on a Dask cluster (parallel.dask)."""
    return click.option("--scheduler", metavar="ADDRESS|auto|local",
                        help="Run the per-rank work on a Dask cluster: its scheduler's address (tcp://host:port), "
                             "auto (DASK_SCHEDULER_ADDRESS or dask's scheduler-address config), or local (a "
                             "LocalCluster of -j worker processes started and stopped for this run: its start-up, "
                             "seconds, is paid every run; for many runs keep a cluster up and pass its address). "
                             "Needs streamtrace[dask]; the workers read the traces by the paths given.")(fn)


@contextlib.contextmanager
def cluster_executor(scheduler, jobs, items=None):
    """The executor ``--scheduler`` asks for (None without it: each command's
    local default), closed when the command ends.  An empty ``--scheduler ''``
    is refused by open_executor, not taken as no scheduler."""
    if scheduler is None:
        yield None
        return
    from .parallel.dask import open_executor, quiet_logs

    quiet_logs()   # a failure Dask cannot recover from comes back as this command's one line
    executor = open_executor(scheduler, jobs, items)
    try:
        yield executor
    except BaseException:
        executor.close(wait=False)
        raise
    executor.close()


def align_clocks_option(default):
    """``--align_clocks/--no-align_clocks``: whether to apply the per-rank
    clock offsets estimated from collective ends; ``default`` says what
    neither flag means for the command."""
    return click.option("--align_clocks/--no-align_clocks", "--align-clocks/--no_align_clocks", "align_clocks",
                        default=None, help=f"Apply the per-rank clock offsets estimated from collective ends "
                                           f"[default: {default}].")


def trace_input_options(fn):
    """Trace discovery flags, shared by every command that reads traces."""
    opts = [
        click.argument("paths", nargs=-1, type=click.Path()),
        click.option("--trace_dir", "--trace-dir", "trace_dir", type=click.Path(),
               help="Directory with rank{i}_trace.json[.gz|.zst] (else every trace in it, rank from distributedInfo)."),
        click.option("--trace_pattern", "--trace-pattern", "trace_pattern",
               help="Path with one '*' replaced by the rank 0..world_size-1."),
        click.option("--trace_glob", "--trace-glob", "trace_glob",
               help="Glob (** allowed); the rank comes from --rank_regex."),
        click.option("--rank_regex", "--rank-regex", "rank_regex", default=DEFAULT_RANK_REGEX, show_default=True,
               help="Regex with a 'rank' group, searched in the file name then the path (with --trace_glob)."),
        click.option("--world_size", "--world-size", "world_size", type=click.IntRange(min=1, max=MAX_WORLD_SIZE),
               help="Number of ranks."),
        click.option("--allow_missing_ranks", "--allow-missing-ranks", "allow_missing_ranks", is_flag=True,
               help="Analyse the ranks present when some rank files are missing."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def quiet_option(fn):
    return click.option("-q", "--quiet", is_flag=True, help="No progress or warnings on stderr.")(fn)


def _resolve(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks):
    return resolve_inputs(paths=paths, trace_dir=trace_dir, trace_pattern=trace_pattern, trace_glob=trace_glob,
                          rank_regex=rank_regex, world_size=world_size, allow_missing_ranks=allow_missing_ranks)


# ------------------------------------------------------------------ commands

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="streamtrace")
def main():
    """Fast, bounded-memory analysis of multi-rank PyTorch profiler traces.

    Stages pass a compact binary event stream, through files or pipes:

    \b
      streamtrace extract --trace_dir run/ --world_size 8 | streamtrace dump --what meta

    Any input or output path may be a URL (s3://, gs://, https://, any fsspec
    protocol; the 'remote' extra): read in ranged blocks, written when complete.

    Exit status: 0 on success; 1 with one line on stderr for bad input or an
    unreachable URL or scheduler; 2 for unknown options (Click's usage
    error); 128 + the signal's number after SIGTERM, SIGINT or SIGHUP, once
    workers are ended and partial outputs removed (at most 15 s of clean-up).
    """


@main.command()
@trace_input_options
@output_option()
@click.option("--rank", type=click.IntRange(min=0, max=MAX_RANK),
              help="Rank of a single input path (else distributedInfo.rank).")
@click.option("--keep_pyfunc", "--keep-pyfunc", "keep_pyfunc", is_flag=True, help="Keep python_function events (skipped by default).")
@jobs_option
@scheduler_option
@click.option("--strict", is_flag=True, help="Treat a truncated trace as an error (exit 1, no output).")
@click.option("--summaries/--no_summaries", " /--no-summaries", "summaries", default=True, show_default=True,
              help="Also write each rank's summaries (what align and correlate keep of it), so that those "
                   "stages read them instead of the rank's events.")
@quiet_option
@handle_errors
def extract(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks,
            output, rank, keep_pyfunc, jobs, scheduler, strict, summaries, quiet):
    """Trace files -> event stream.

    Reads each rank's trace (.json, .json.gz or .json.zst, sniffed; '-' is
    stdin) in fixed-size chunks and writes its events, kernel geometry, comm
    arguments and metadata as frames; then, unless --no_summaries, the
    rank's summaries: its collective rows and what the blocking analysis
    keeps of it, which align and correlate read instead of its events.

    \b
      streamtrace extract run/rank3_trace.json.gz -o r3.stev
      streamtrace extract --trace_dir run/ --world_size 8 -j 2 -o run.stev
    """
    _setup_logging(quiet)
    inputs = _resolve(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks)
    if rank is not None:
        if len(inputs) != 1:
            raise click.UsageError("--rank goes with a single input path")
        inputs[0].rank = rank
    _check_stream_output(output, [i.path for i in inputs])
    with shown(progress_for(quiet)) as progress, cluster_executor(scheduler, jobs, len(inputs)) as executor, \
            stream_output(output) as out:
        extract_api(inputs, out, world_size=world_size, keep_pyfunc=keep_pyfunc, jobs=jobs,
                    strict=strict, progress=progress, executor=executor, summaries=summaries)


@main.command()
@click.argument("streams", nargs=-1, type=click.Path())
@click.option("--what", type=click.Choice(["summary", "events", "kernels", "collectives", "meta", "strings"]),
              default="meta", show_default=True, help="Which part of the stream to print.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "table"]), default="jsonl", show_default=True,
              help="table: aligned text for reading in a terminal.")
@click.option("--rank", "ranks", type=int, multiple=True, help="Only these ranks (repeatable).")
@handle_errors
def dump(streams, what, fmt, ranks):
    """Print part of an event stream as JSON lines or CSV (stdin if no file)."""
    from .dump import dump_stream

    stdout_buffer("the dump")
    dump_stream(list(streams) or ["-"], what, fmt, sys.stdout, ranks=set(ranks) or None)


@main.command()
@click.argument("streams", nargs=-1, type=click.Path())
@output_option()
@quiet_option
@handle_errors
def correlate(streams, output, quiet):
    """Blocking and contention analysis: stream in (after align) -> stream out.

    Passes every frame through and appends correlate.* tables: why each late
    rank was late (host launch lateness / GPU dependency wait / GPU backlog,
    with the blocking kernels and CPU ops), what ran alongside each collective,
    and how much communication was exposed.

    \b
      streamtrace extract --trace_dir run/ --world_size 8 | streamtrace align | streamtrace correlate -o analysed.stev
    """
    from .correlate.stage import RECORDS_READ, correlate_frames
    from .stream.format import StreamWriter

    _setup_logging(quiet)
    _check_stream_output(output, streams)
    with stream_output(output) as out, contextlib.closing(_input_frames(streams, unpack=RECORDS_READ)) as frames:
        writer = StreamWriter(out)
        writer.write_all(correlate_frames(frames))
        out.flush()


@main.command()
@click.argument("inputs", nargs=-1, type=click.Path())
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True, help="Rows per list.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Also write the self-contained HTML report (charts; needs plotly) here.")
@align_clocks_option("the clock rule: applied when well determined and large against the skew, else kept "
                     "(docs/confidence.md); a stream aligned already keeps its clocks")
@jobs_option
@scheduler_option
@quiet_option
@handle_errors
def blockers(inputs, top, html_path, align_clocks, jobs, scheduler, quiet):
    """The short answer: which kernels and host ops blocked the collectives.

    INPUTS are event streams (at any stage: extracted, aligned or correlated;
    none: stdin), the per-rank trace files themselves, or one directory of
    them (as --trace_dir takes it); whatever stages are missing run
    in-process.  Prints the answer's confidence first (high, medium or low
    and why: docs/confidence.md), then the straggler, the dominant cause of
    waiting, the top blocking kernels and host ops, and the top contention
    pairs.

    \b
      streamtrace blockers analysed.stev
      streamtrace blockers run/rank*_trace.json.gz
      streamtrace blockers run/
    """
    from .chain import blockers as blockers_api

    _setup_logging(quiet)
    with cluster_executor(scheduler, jobs) as executor:
        text = blockers_api(list(inputs) or ["-"], top=top, jobs=jobs, html_path=html_path, executor=executor,
                            align_clocks=align_clocks)
    click.echo(text)
    if html_path and not quiet:
        click.echo(redact_text(f"wrote {html_path}"), err=True)


@main.command()
@trace_input_options
@click.option("--scenario", "scenarios", multiple=True,
              help="Replay this scenario only (repeatable): rank:R, host:R, kernel:P:IDENTITY, compute:P, "
                   "contention:IDENTITY, link:A-B (docs/critical-path.md).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True, help="Scenarios listed.")
@click.option("--percent", type=click.FloatRange(min=0, max=100, min_open=True, max_open=True), default=20,
              show_default=True, help="How much faster the suggested kernel scenarios make a kernel.")
@click.option("--output_xlsx_path", "--output-xlsx-path", "output_xlsx_path", type=click.Path(dir_okay=False),
              help="Write the sheets whatif, critical_path and critical_path_summary to this workbook.")
@click.option("--output_csvs_dir", "--output-csvs-dir", "output_csvs_dir", type=click.Path(file_okay=False),
              help="Write the same sheets as CSVs into this directory.")
@align_clocks_option("the clock rule: applied when well determined and large against the skew, else kept "
                     "(docs/confidence.md); a stream aligned already keeps its clocks")
@jobs_option
@scheduler_option
@quiet_option
@handle_errors
def whatif(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks, scenarios,
           top, percent, output_xlsx_path, output_csvs_dir, align_clocks, jobs, scheduler, quiet):
    """What bounds each step, and what each fix would save.

    Builds every profiler step's dependency graph across ranks, walks its
    critical path and replays it with one change per scenario (a late rank
    at the median rank's speed, a kernel faster, a link at the median
    bandwidth, host launch gaps removed).  PATHS as blockers takes them
    (streams at any stage, trace files, one directory; none: stdin), or the
    traces the discovery flags find.  Prints the answer's confidence first,
    then the top scenarios by step time saved.

    \b
      streamtrace whatif run/
      streamtrace whatif --trace_dir run/ --world_size 8 --output_csvs_dir whatif/
      streamtrace whatif run/ --scenario rank:4 --scenario link:0-1
    """
    from .chain import whatif as whatif_api

    _setup_logging(quiet)
    with cluster_executor(scheduler, jobs) as executor:
        sheets = whatif_api(list(paths), scenario=list(scenarios) or None, top=top, percent=percent, jobs=jobs,
                            world_size=world_size, executor=executor, align_clocks=align_clocks,
                            trace_dir=trace_dir, trace_pattern=trace_pattern, trace_glob=trace_glob,
                            rank_regex=rank_regex, allow_missing_ranks=allow_missing_ranks,
                            output_xlsx_path=output_xlsx_path, output_csvs_dir=output_csvs_dir)
    click.echo(sheets.text)
    if not quiet:
        for p in getattr(sheets, "written", []):
            click.echo(redact_text(f"wrote {p}"), err=True)


# ------------------------------------------------------------------ diff (issue #43)

def _side_options(side):
    """--<side>_dir, --<side>_pattern, --<side>_glob, --<side>_world_size: one run's trace discovery."""
    def add(fn):
        opts = [
            click.option(f"--{side}_dir", f"--{side}-dir", f"{side}_dir", type=click.Path(),
                         help=f"The {side}: a directory of traces (as --trace_dir)."),
            click.option(f"--{side}_pattern", f"--{side}-pattern", f"{side}_pattern",
                         help=f"The {side}: a path with one '*' replaced by the rank (as --trace_pattern)."),
            click.option(f"--{side}_glob", f"--{side}-glob", f"{side}_glob",
                         help=f"The {side}: a glob, the rank from --rank_regex (as --trace_glob)."),
            click.option(f"--{side}_world_size", f"--{side}-world-size", f"{side}_world_size",
                         type=click.IntRange(min=1, max=MAX_WORLD_SIZE), help=f"The {side}'s number of ranks."),
        ]
        for opt in reversed(opts):
            fn = opt(fn)
        return fn
    return add


def _fail_if(ctx, param, values):
    """--fail_if conditions, each checked before any work: a malformed one is a usage error naming it."""
    from .diff.gate import parse_condition

    out = []
    for v in values:
        try:
            out.append(parse_condition(v))
        except StreamtraceError as exc:
            raise click.BadParameter(str(exc)) from None
    return out


@main.command()
@click.argument("runs", nargs=-1, type=click.Path(), metavar="[BASELINE] [CANDIDATE]")
@_side_options("baseline")
@_side_options("candidate")
@click.option("--rank_regex", "--rank-regex", "rank_regex", default=DEFAULT_RANK_REGEX, show_default=True,
              help="Regex with a 'rank' group, for --baseline_glob / --candidate_glob.")
@click.option("--allow_missing_ranks", "--allow-missing-ranks", "allow_missing_ranks", is_flag=True,
              help="Analyse the ranks present when some rank files of a run are missing.")
@click.option("--fail_if", "--fail-if", "fail_if", multiple=True, callback=_fail_if, metavar="METRIC[:+-N%|us|ms]",
              help="CI gate (repeatable): exit 3 when the candidate breaks this condition beyond the run-to-run "
                   "spread, e.g. step_time:+5%, busbw:-10% (any size bucket), transfer:+200us, new_straggler "
                   "(docs/diff.md lists the metrics).")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True, help="Changes explained in words.")
@click.option("--output_xlsx_path", "--output-xlsx-path", "output_xlsx_path", type=click.Path(dir_okay=False),
              help="Write the diff's sheets to this workbook.")
@click.option("--output_csvs_dir", "--output-csvs-dir", "output_csvs_dir", type=click.Path(file_okay=False),
              help="Write one <sheet>.csv per diff sheet here.")
@click.option("--output_html_path", "--output-html-path", "output_html_path", type=click.Path(dir_okay=False),
              help="Self-contained HTML page: the changes charted, each run's report charts side by side "
                   "(needs plotly).")
@click.option("--critical_path/--no-critical_path", "--critical-path/--no_critical_path", "critical_path",
              default=True, show_default=True,
              help="Compare the runs' critical paths (the summary's first explanation of the step time).")
@align_clocks_option("the clock rule (docs/confidence.md); a stream aligned already keeps its clocks")
@jobs_option
@quiet_option
@handle_errors
def diff(runs, baseline_dir, baseline_pattern, baseline_glob, baseline_world_size, candidate_dir, candidate_pattern,
         candidate_glob, candidate_world_size, rank_regex, allow_missing_ranks, fail_if, top, output_xlsx_path,
         output_csvs_dir, output_html_path, critical_path, align_clocks, jobs, quiet):
    """Compare two runs rank by rank; with --fail_if, a gate for CI.

    Each run is an event stream (at any stage) or a directory of traces,
    given as BASELINE and CANDIDATE, or found with the --baseline_* and
    --candidate_* flags (then that run's positional argument is left out);
    whatever stages are missing run in-process.  Prints each run's
    confidence, the step time, the biggest changes beyond the run-to-run
    spread in words, and the straggler.  Exit status: 0, or 3 when a
    --fail_if condition is broken (the broken conditions are printed).

    \b
      streamtrace diff baseline.stev run/
      streamtrace diff --baseline_dir old/ --candidate_pattern 'new/rank*.json.gz' --candidate_world_size 8
      streamtrace diff baseline.stev run/ --fail_if step_time:+5% --fail_if busbw:-10% --fail_if new_straggler
    """
    from .diff import check_outputs, diff as diff_api, write_outputs

    _setup_logging(quiet)
    runs = list(runs)
    sides = []
    for side, d, p, g, w in (("baseline", baseline_dir, baseline_pattern, baseline_glob, baseline_world_size),
                             ("candidate", candidate_dir, candidate_pattern, candidate_glob, candidate_world_size)):
        flags = {k: v for k, v in (("trace_dir", d), ("trace_pattern", p), ("trace_glob", g)) if v}
        if len(flags) > 1:
            raise click.UsageError(f"the {side}: give one of --{side}_dir, --{side}_pattern, --{side}_glob")
        if flags:
            flags.update(world_size=w, rank_regex=rank_regex, allow_missing_ranks=allow_missing_ranks)
            sides.append(flags)
        elif runs:
            if w is not None:
                raise click.UsageError(f"--{side}_world_size goes with --{side}_pattern or --{side}_glob")
            sides.append(runs.pop(0))
        else:
            raise click.UsageError(f"no {side}: give it as an argument or with --{side}_dir/_pattern/_glob")
    if runs:
        raise click.UsageError(f"unexpected extra argument(s): {' '.join(runs)}")
    inputs = [s for s in sides if isinstance(s, str)]
    check_outputs(output_xlsx_path, output_csvs_dir, output_html_path, inputs)   # before any work
    result = diff_api(sides[0], sides[1], fail_if=fail_if, jobs=jobs, align_clocks=align_clocks,
                      critical=critical_path, top=top)
    if output_xlsx_path or output_csvs_dir or output_html_path:
        sources = [s if isinstance(s, str) else next(v for k, v in s.items() if k.startswith("trace_"))
                   for s in sides]
        for path in write_outputs(result, output_xlsx_path, output_csvs_dir, output_html_path, sources=sources):
            if not quiet:
                click.echo(redact_text(f"wrote {path}"), err=True)
    click.echo(redact_text(result.text))
    if result.violations:
        sys.exit(3)


# ------------------------------------------------------------------ collective report (issue #3)

class _GreedyOption(click.Option):
    """An option that takes every following word up to the next option, like
    argparse's ``nargs='+'`` (TraceLens: ``--agg_metrics mean median max``).
    Repeating the option or separating values with commas also works."""

    def add_to_parser(self, parser, ctx):
        result = super().add_to_parser(parser, ctx)
        for name in self.opts:
            opt = getattr(parser, "_long_opt", {}).get(name) or getattr(parser, "_short_opt", {}).get(name)
            if opt is None:
                continue
            original = opt.process

            def process(value, state, _original=original):
                values = [value]
                while state.rargs and not state.rargs[0].startswith("-"):
                    values.append(state.rargs.pop(0))
                for v in values:
                    _original(v, state)

            opt.process = process
        return result


def _split_aggs(ctx, param, value):
    if not value:
        return None
    out = []
    for v in value:
        out += [x for x in v.replace(",", " ").split() if x]
    return tuple(out)


def report_options(fn):
    """Report flags shared by ``report`` and ``collective-report``."""
    opts = [
        click.option("--output_xlsx_path", "--output-xlsx-path", "output_xlsx_path", type=click.Path(dir_okay=False),
               help="Excel workbook to write (default: nccl_analysis_report.xlsx next to the traces, "
                    "when no --output_csvs_dir is given either)."),
        click.option("--output_csvs_dir", "--output-csvs-dir", "output_csvs_dir", type=click.Path(file_okay=False),
               help="Directory for one <sheet>.csv per sheet (full tables, no index)."),
        click.option("--output_html_path", "--output-html-path", "output_html_path", type=click.Path(dir_okay=False),
               help="Self-contained HTML report with charts (opens offline; needs plotly). "
                    "Given alone, the only output."),
        click.option("--detailed_analysis/--no-detailed_analysis", "--detailed-analysis/--no_detailed_analysis",
                     "detailed_analysis", default=True, show_default=True,
                     help="Write the detail sheets (nccl_long, nccl_implicit_sync, nccl_all2allv)."),
        click.option("--agg_metrics", "--agg-metrics", "agg_metrics", cls=_GreedyOption, multiple=True,
                     callback=_split_aggs, metavar="AGG...",
                     help="pandas aggregations for the implicit-sync and all2allv summaries "
                          "[default: mean median min max]."),
        click.option("--gpus_per_node", "--gpus-per-node", "gpus_per_node", type=click.IntRange(min=1),
               help="GPUs per node for node_id/node_span (default: the first rank's deviceProperties count)."),
        click.option("--all2allv_heatmap", "--all2allv-heatmap", "all2allv_heatmap", is_flag=True,
               help="Add the nccl_all2allv_heatmap sheet."),
        align_clocks_option("collective-report: off, times as recorded, as in TraceLens, and the clock rule "
                            "for the --blocking_analysis and p2p sheets (docs/confidence.md); report on a stream "
                            "not yet aligned: on when the ranks span more than one node; data_quality says when "
                            "offsets not applied change the answers"),
        click.option("--strict", is_flag=True,
                     help="Abort on metadata disagreements between ranks (TraceLens behaviour) and on truncated traces."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _stream_sources(streams):
    """The streams a stage reads: the files given, else stdin (not a terminal)."""
    sources = list(streams) or ["-"]
    if sources == ["-"] and sys.stdin.isatty():
        raise click.UsageError("no input: give an event stream file, or pipe one in "
                               "(e.g. streamtrace extract ... | streamtrace align | streamtrace report)")
    return sources


def _input_frames(streams, unpack=()):
    """The input streams' frames; with ``unpack`` (record kinds the stage
    reads), read and unpacked a few frames ahead in a thread, which
    ``close()`` stops (a stage that fails midway must not leave it running:
    a process with a second thread no longer forks, parallel.fork)."""
    from .stream.format import iter_frames, read_ahead

    frames = (frame for source in _stream_sources(streams) for frame in iter_frames(source))
    return read_ahead(frames, unpack) if unpack else frames


def _wrote(paths, sheets):
    from .report.files import SHEET_ORDER

    names = [n for n in SHEET_ORDER if n in sheets]
    for p in paths:
        click.echo(redact_text(f"wrote {p} ({len(names)} sheets)"), err=True)


def _custom_patterns(ctx, param, values):
    """--custom_collective_pattern REGEX=NAME (repeatable) -> [(regex, name)]; a bad one is a usage error."""
    from .align.custom import parse_cli_pattern

    try:
        return [parse_cli_pattern(v) for v in values]
    except StreamtraceError as exc:
        raise click.BadParameter(str(exc)) from None


custom_collective_option = click.option(
    "--custom_collective_pattern", "--custom-collective-pattern", "custom_collective_patterns",
    multiple=True, metavar="REGEX=NAME", callback=_custom_patterns,
    help="Kernels whose name REGEX finds (any case) are collectives, of Collective name NAME when their "
         "args do not say (TraceLens's custom_collective_patterns); repeatable.")


@main.command()
@click.argument("streams", nargs=-1, type=click.Path())
@output_option()
@align_clocks_option("on when the ranks span more than one node")
@click.option("--gpus_per_node", "--gpus-per-node", "gpus_per_node", type=click.IntRange(min=1),
        help="GPUs per node, to decide whether ranks span nodes (default: deviceProperties count).")
@custom_collective_option
@quiet_option
@handle_errors
def align(streams, output, align_clocks, gpus_per_node, custom_collective_patterns, quiet):
    """Event stream -> event stream + collective matches and clock offsets.

    Finds the collective kernels of every rank (NCCL/RCCL names and kernels
    linked to collective CPU ops), matches them across ranks (by process
    group and Seq, or by aligned ordinal), estimates per-rank clock offsets
    from implicit-sync collective ends, passes every input frame through and
    appends the tables align.ranks, align.collectives, align.clocks and
    align.quality (see docs/stream-format.md).

    \b
      streamtrace extract --trace_dir run/ --world_size 8 | streamtrace align -o run.aligned.stev
    """
    from .align.stage import RECORDS_READ, align_frames
    from .stream.format import StreamWriter

    _setup_logging(quiet)
    _check_stream_output(output, streams)
    with stream_output(output) as out, contextlib.closing(_input_frames(streams, unpack=RECORDS_READ)) as frames:
        writer = StreamWriter(out)
        for frame in align_frames(frames, align_clocks=align_clocks, gpus_per_node=gpus_per_node,
                                  custom_collective_patterns=custom_collective_patterns):
            writer.write(frame)
        out.flush()


@main.command()
@click.argument("streams", nargs=-1, type=click.Path())
@report_options
@click.option("-o", "output", type=click.Path(dir_okay=False), help="Same as --output_xlsx_path.")
@quiet_option
@handle_errors
def report(streams, output_xlsx_path, output_csvs_dir, output_html_path, detailed_analysis, agg_metrics,
           gpus_per_node, all2allv_heatmap, align_clocks, strict, output, quiet):
    """Aligned event stream -> collective report (.xlsx and/or CSVs).

    The TraceLens multi-rank collective report (same sheets, columns and
    formulas) plus clock_alignment, nccl_summary_by_size and data_quality.
    A stream that has not been through 'align' is aligned here.

    \b
      streamtrace extract --trace_dir run/ --world_size 8 | streamtrace align | streamtrace report -o report.xlsx
      streamtrace report run.aligned.stev --output_csvs_dir csvs/
    """
    from .chain import report_streams

    _setup_logging(quiet)
    sources = _stream_sources(streams)
    written, sheets = report_streams(sources, output_xlsx_path=output_xlsx_path or output,
                                     output_csvs_dir=output_csvs_dir, output_html_path=output_html_path,
                                     detailed_analysis=detailed_analysis, agg_metrics=agg_metrics,
                                     gpus_per_node=gpus_per_node, all2allv_heatmap=all2allv_heatmap,
                                     align_clocks=align_clocks, strict=strict)
    _wrote(written, sheets)


@main.command("collective-report")
@trace_input_options
@report_options
@click.option("--use_multiprocessing", "--use-multiprocessing", "use_multiprocessing", is_flag=True,
        help="Read rank files in parallel (as -j with --max_workers or the CPU count).")
@click.option("--max_workers", "--max-workers", "max_workers", type=click.IntRange(min=1),
        help="Pool size for --use_multiprocessing [default: CPU count].")
@jobs_option
@scheduler_option
@click.option("--blocking_analysis/--no-blocking_analysis", "--blocking-analysis/--no-blocking-analysis",
        "blocking_analysis", default=False, show_default=True,
        help="Also run correlate and add its sheets (collective_blockers, blocking_kernels, ...); "
             "costs several times the report's time and memory.")
@custom_collective_option
@quiet_option
@handle_errors
def collective_report(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks,
                      output_xlsx_path, output_csvs_dir, output_html_path, detailed_analysis, agg_metrics,
                      gpus_per_node, all2allv_heatmap, align_clocks, strict, use_multiprocessing, max_workers, jobs,
                      scheduler, blocking_analysis, custom_collective_patterns, quiet):
    """Trace files -> collective report, in one process (extract | align | report).

    TraceLens_generate_multi_rank_collective_report_pytorch's flags, sheets,
    columns and formulas (times as recorded unless --align_clocks), plus
    streamtrace's checks, extra columns and sheets (docs/tracelens.md).

    \b
      streamtrace collective-report --trace_dir run/ --world_size 8
      streamtrace collective-report --trace_glob 'logs/*.json.gz' --rank_regex 'worker(?P<rank>\\d+)' \\
          --world_size 8 --output_csvs_dir csvs/ -j 2
    """
    from .chain import write_collective_report

    if world_size is None and (trace_dir or trace_pattern or trace_glob):
        # TraceLens's command fails without it in every input mode; scanning
        # a directory instead would read whatever JSON happens to be there
        raise click.UsageError("--world_size is required with --trace_dir, --trace_pattern and --trace_glob "
                               "(as in TraceLens)")
    _setup_logging(quiet)
    with shown(progress_for(quiet, ("reading", "matching", "writing sheets"))) as progress, \
            cluster_executor(scheduler, jobs) as executor:
        written, sheets, confidence = write_collective_report(
            executor=executor, paths=paths, trace_dir=trace_dir, trace_pattern=trace_pattern, trace_glob=trace_glob,
            rank_regex=rank_regex, world_size=world_size, output_xlsx_path=output_xlsx_path,
            output_csvs_dir=output_csvs_dir, output_html_path=output_html_path, detailed_analysis=detailed_analysis,
            agg_metrics=agg_metrics, gpus_per_node=gpus_per_node, all2allv_heatmap=all2allv_heatmap,
            align_clocks=align_clocks, allow_missing_ranks=allow_missing_ranks, strict=strict, jobs=jobs,
            use_multiprocessing=use_multiprocessing, max_workers=max_workers, progress=progress,
            blocking_analysis=blocking_analysis, custom_collective_patterns=custom_collective_patterns)
    _wrote(written, sheets)
    if not quiet:
        click.echo(redact_text(confidence.one_line()), err=True)


# ------------------------------------------------------------------ fuse (issue #5)

#: ranks one --ranks may select: every one needs its own trace, so a range
#: wider than this is a typo, and expanding it would take minutes and gigabytes
MAX_SELECTED_RANKS = 1 << 20


def _parse_ranks(ctx, param, value):
    """--ranks 0,8,16 or ranges 0-7,16 -> sorted list of ints."""
    if value is None:
        return None
    out = set()
    ranges = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                ranges.append((lo, hi))
            else:
                out.add(int(part))
        except (TypeError, ValueError):
            raise click.BadParameter(f"{part!r} is not a rank or a range such as 0-7") from None
    selected = len(out) + sum(hi - lo + 1 for lo, hi in ranges)
    if selected > MAX_SELECTED_RANKS:
        raise click.BadParameter(f"selects {selected:,} ranks; at most {MAX_SELECTED_RANKS:,}")
    for lo, hi in ranges:
        out.update(range(lo, hi + 1))
    if not out or min(out) < 0:
        raise click.BadParameter("give ranks >= 0, e.g. 0,8,16 or 0-7")
    return sorted(out)


@main.command("fuse")
@trace_input_options
@output_option(required=True, help="merged.json, merged.json.gz (one gzip member), merged.json.zst, merged.pftrace or "
              "merged.pftrace.gz (Perfetto's protobuf format), or - for stdout.")
@click.option("--format", "fmt", type=click.Choice(["json", "pftrace"]),
              help="Output format (default: from the suffix, .pftrace* is Perfetto's protobuf trace, else JSON); "
                   "for stdout.")
@click.option("--ranks", callback=_parse_ranks, help="Only these ranks: 0,8,16 or ranges such as 0-7.")
@click.option("--include_pyfunc", "--include-pyfunc", "include_pyfunc", is_flag=True,
        help="Keep python_function events (dropped by default, as TraceFuse does).")
@click.option("--keep_spans", "--keep-spans", "keep_spans", is_flag=True,
        help="Keep cat 'Trace' (the profiler-window span; dropped by default, as TraceFuse does).")
@click.option("--cat", "cats", help="Only these categories, comma-separated (e.g. kernel,gpu_memcpy).")
@click.option("--name", "name_regex", help="Only events whose name matches this regular expression (Python syntax; refused after 20 s of matching).")
@click.option("--window", help="Only events meeting START:END, microseconds on the fused timeline (an end may be empty).")
@click.option("--focus", help="Only a window chosen from the analysis: worst (the collective instance with the most "
                              "waiting, with a margin), collective:ID (as in the report's sheets), step:N, or "
                              "time:T0:T1 (us); printed and kept in the output's metadata.")
@click.option("--mark", "marks", type=click.Choice(["blockers", "critical_path"]), multiple=True,
              help="Add the analysis' answer: blockers = a track per rank with its late arrivals and the kernels "
                   "that blocked them; critical_path = a 'critical path' track with each step's critical path "
                   "(both run the blocking analysis; repeatable).")
@click.option("--critical_path", "--critical-path", "critical_path", is_flag=True,
              help="The same as --mark critical_path.")
@click.option("--nccl_only", "--nccl-only", "nccl_only", is_flag=True,
        help="Only NCCL/RCCL kernels (kernel events whose name contains 'nccl', any case).")
@align_clocks_option("off; on shifts each rank by its clock offset (the report's clock_alignment sheet) and "
                     "implies --time_base")
@click.option("--time_base", "--time-base", "time_base", is_flag=True,
        help="Put ranks whose ts are relative to baseTimeNanoseconds on one epoch.")
@jobs_option
@scheduler_option
@quiet_option
@handle_errors
def fuse_command(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks,
                 output, fmt, ranks, include_pyfunc, keep_spans, cats, name_regex, window, focus, marks, critical_path,
                 nccl_only, align_clocks, time_base, jobs, scheduler, quiet):
    """Per-rank traces -> one Perfetto / chrome://tracing JSON file (or Perfetto's protobuf .pftrace), streamed.

    Every rank gets its own pid, flow-id, correlation and External id range,
    its processes are named RANK r - CPU / RANK r - GPU (as TraceLens does), X events that
    overlap without nesting move to sibling lanes, and each rank's metadata
    (deviceProperties, distributedInfo, ...) is kept under "streamtrace".

    \b
      streamtrace fuse --trace_dir run/ --world_size 8 -o merged.json.gz -j 2
      streamtrace fuse run/rank*_trace.json.gz --ranks 0,8 --nccl_only -o nccl.json.gz
      streamtrace fuse --trace_dir run/ --window 5000000000:5000050000 --cat kernel -o -
      streamtrace fuse --trace_dir run/ -o run.pftrace.gz
      streamtrace fuse --trace_dir run/ --focus worst -o worst.pftrace
      streamtrace fuse --trace_dir run/ --critical_path -o path.pftrace.gz
    """
    from .fuse import fuse as fuse_api

    _setup_logging(quiet)
    inputs = _resolve(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks)
    cat_list = [c.strip() for c in cats.split(",") if c.strip()] if cats else None
    if critical_path and "critical_path" not in marks:
        marks = (*marks, "critical_path")
    if cats is not None and not cat_list:
        raise click.BadParameter("give at least one category", param_hint="--cat")
    with shown(progress_for(quiet, ("scanning", "writing"))) as progress, \
            cluster_executor(scheduler, jobs, len(inputs)) as executor:
        result = fuse_api(inputs, output, ranks=ranks, include_pyfunc=include_pyfunc, cats=cat_list,
                          name_regex=name_regex, window=window, nccl_only=nccl_only, align_clocks=bool(align_clocks),
                          time_base=time_base, jobs=jobs, keep_spans=keep_spans, progress=progress,
                          executor=executor, format=fmt, focus=focus, mark=marks)
    if not quiet and output != "-":
        click.echo(redact_text(f"wrote {output}: {result.events_written:,} events from {len(result.ranks)} rank(s)"),
                   err=True)


#: what ``timeout``, Slurm, systemd, Ctrl-C and a closed terminal send
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _raise_interrupted(signum, frame):
    """The stop signals' handler: raise ``Interrupted`` in the main thread, so
    every ``finally`` and context manager on the way out runs (workers ended,
    temporary files removed, no partial output renamed into place).  Further
    stop signals are ignored meanwhile, so the cleaning up is not cut short.
    Once the run's outputs are all in place (``io.outputs.OutputSet``) a stop
    signal no longer interrupts: the exit status says the outputs are whole."""
    # the clean-up must not turn a stop into a hang (a `timeout` or Slurm
    # waiting on us): if it has not ended the process in time, end it here
    watchdog = threading.Timer(CLEANUP_SECONDS, _stop_now, args=(signum,))
    watchdog.daemon = True
    watchdog.start()
    if outputs_committed():   # every output is in place: the run has finished, and ends as it would have
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        return
    Interrupted.pending = signum
    _raise_interrupted_again(signum, frame)


#: the longest a signalled command spends cleaning up before it exits anyway
CLEANUP_SECONDS = 15


def _raise_interrupted_again(signum, frame):
    """Ignore further stop signals and raise ``Interrupted`` (the watchdog is
    armed already: the handler for a signal delivered again)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


def _redeliver_lost_interrupt(unraisable, previous=sys.unraisablehook):
    """``sys.unraisablehook``: the stop signal's ``Interrupted`` was raised
    while the main thread ran a finalizer (an object's ``__del__``, a
    generator closed by the garbage collector), where Python only reports an
    exception and drops it.  The command would then carry on as if no signal
    had come (found under load: a report waiting on a blocked reader until
    the watchdog).  The signal is sent to the main thread again, from another
    thread a moment later (sent from here, its handler would run in this hook,
    which drops exceptions too), to be raised once more where the finalizer
    returned to."""
    exc = unraisable.exc_value
    if isinstance(exc, Interrupted) and threading.current_thread() is threading.main_thread():
        signal.signal(exc.signum, _raise_interrupted_again)
        again = threading.Timer(0.01, signal.pthread_kill, args=(threading.main_thread().ident, exc.signum))
        again.daemon = True
        again.start()
        return
    previous(unraisable)


def _stop_now(signum):
    with contextlib.suppress(Exception):
        os.write(2, f"{Interrupted(signum)} (clean-up did not finish in {CLEANUP_SECONDS} s)\n".encode())
    os._exit(128 + signum)


def _one_malloc_arena_per_cpu():
    """glibc gives threads that allocate at once heaps of their own (arenas,
    up to 8 per CPU), and memory freed in one arena is not reused by a thread
    allocating from another: each reading thread kept its own high-water
    mark (8 x 1 GB ``--blocking_analysis``: ~30 MB of a ~420 MB peak).  One
    arena per CPU; a no-op without glibc.  See docs/performance.md."""
    from .parallel.cpus import available_cpus

    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, max(2, available_cpus()))   # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def run():
    """The ``streamtrace`` command: ``main``, then a fast exit.

    When a command returns, its outputs are written, closed and renamed into
    place; what is left is the interpreter's teardown -- freeing every row of
    the tables and pandas' modules, ~0.3 s after a large report, while the
    user waits for the prompt.  So the streams are flushed and the process
    ends with ``os._exit`` and the command's exit code.  An unexpected
    exception (not a SystemExit) still takes Python's normal way out, with
    its traceback.

    The cyclic garbage collector runs every 100,000 new container objects
    instead of every 700: this process's tables hold few cycles, and each
    collection walks every live object (pandas' too): ~60 ms in all on a
    large report."""
    gc.set_threshold(100_000)
    _one_malloc_arena_per_cpu()
    sys.unraisablehook = _redeliver_lost_interrupt
    code = None
    Interrupted.pending = None
    try:
        for s in STOP_SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:   # e.g. SIGHUP under nohup stays ignored
                signal.signal(s, _raise_interrupted)
        main()   # standalone mode: click ends every run, success or not, by raising SystemExit
    except SystemExit as exc:
        code = exc.code
    except Interrupted as exc:   # after the cleanup: one line, and the shell's code for a signal
        with contextlib.suppress(Exception):
            print(str(exc), file=sys.stderr)
        code = 128 + exc.signum
    if code is None:
        code = 0
    elif not isinstance(code, int):   # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):   # a closed pipe: nothing more can be written anyway
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
