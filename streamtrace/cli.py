"""Command line: one Click command per API function.

Errors from the library (StreamtraceError) become one-line messages with exit
code 1; usage errors exit 2 (Click).  Stream-producing commands write to
``-o FILE`` (atomically: a temp file renamed on success) or to stdout when it
is not a terminal.
"""
import contextlib
import functools
import logging
import os
import sys
import tempfile

import click

from .extract import VERSION
from .extract import extract as extract_api
from .errors import StreamtraceError
from .sources import DEFAULT_RANK_REGEX, resolve_inputs

log = logging.getLogger("streamtrace")


# ------------------------------------------------------------------ plumbing

class _StderrHandler(logging.Handler):
    def emit(self, record):
        prefix = "warning: " if record.levelno == logging.WARNING else ""
        click.echo(f"{prefix}{record.getMessage()}", err=True)


def _setup_logging(quiet):
    log.handlers[:] = [_StderrHandler()]
    log.setLevel(logging.ERROR if quiet else logging.INFO)
    log.propagate = False


def handle_errors(fn):
    """Turn library errors into one-line Click errors (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StreamtraceError as exc:
            raise click.ClickException(str(exc)) from None
        except BrokenPipeError:  # e.g. `streamtrace dump ... | head`
            with contextlib.suppress(Exception):
                sys.stdout = open(os.devnull, "w")
            sys.exit(0)
        except KeyboardInterrupt:
            raise click.Abort() from None

    return wrapper


@contextlib.contextmanager
def atomic_output(path):
    """A binary file at ``path`` that appears only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise StreamtraceError(f"{path}: the output directory does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".streamtrace-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def stream_output(path):
    """Where a stream-producing command writes: -o FILE, or a non-terminal stdout."""
    if path and path != "-":
        with atomic_output(path) as f:
            yield f
        return
    if sys.stdout.isatty():
        raise click.UsageError("refusing to write a binary event stream to a terminal: use -o FILE or a pipe")
    yield sys.stdout.buffer
    sys.stdout.buffer.flush()


def _alias(*names, **kwargs):
    """An option accepting TraceLens's underscore spelling and a dash alias."""
    return click.option(*names, **kwargs)


def trace_input_options(fn):
    """Trace discovery flags, shared by every command that reads traces."""
    opts = [
        click.argument("paths", nargs=-1, type=click.Path()),
        _alias("--trace_dir", "--trace-dir", "trace_dir", type=click.Path(),
               help="Directory with rank{i}_trace.json[.gz|.zst] (else every trace in it, rank from distributedInfo)."),
        _alias("--trace_pattern", "--trace-pattern", "trace_pattern",
               help="Path with one '*' replaced by the rank 0..world_size-1."),
        _alias("--trace_glob", "--trace-glob", "trace_glob",
               help="Glob (** allowed); the rank comes from --rank_regex."),
        _alias("--rank_regex", "--rank-regex", "rank_regex", default=DEFAULT_RANK_REGEX, show_default=True,
               help="Regex with a 'rank' group, searched in the file name then the path (with --trace_glob)."),
        _alias("--world_size", "--world-size", "world_size", type=click.IntRange(min=1),
               help="Number of ranks."),
        _alias("--allow_missing_ranks", "--allow-missing-ranks", "allow_missing_ranks", is_flag=True,
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


def _progress_printer(quiet):
    if quiet or not sys.stderr.isatty():
        return None
    state = {"last": 0}

    def show(counts):
        mb = counts["bytes_consumed"] >> 20
        if mb - state["last"] >= 64:
            state["last"] = mb
            click.echo(f"\r  {mb} MiB read, {counts['events_stored']:,} events", err=True, nl=False)

    return show


# ------------------------------------------------------------------ commands

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="streamtrace")
def main():
    """Fast, bounded-memory analysis of multi-rank PyTorch profiler traces.

    Stages pass a compact binary event stream, through files or pipes:

    \b
      streamtrace extract --trace_dir run/ --world_size 8 | streamtrace dump --what meta
    """


@main.command()
@trace_input_options
@click.option("-o", "--output", type=click.Path(), help="Write the stream here (default: stdout if not a terminal).")
@click.option("--rank", type=click.IntRange(min=0), help="Rank of a single input path (else distributedInfo.rank).")
@_alias("--keep_pyfunc", "--keep-pyfunc", "keep_pyfunc", is_flag=True, help="Keep python_function events (skipped by default).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks extracted in parallel.")
@click.option("--strict", is_flag=True, help="Treat a truncated trace as an error (exit 1, no output).")
@quiet_option
@handle_errors
def extract(paths, trace_dir, trace_pattern, trace_glob, rank_regex, world_size, allow_missing_ranks,
            output, rank, keep_pyfunc, jobs, strict, quiet):
    """Trace files -> event stream.

    Reads each rank's trace (.json, .json.gz or .json.zst, sniffed; '-' is
    stdin) in fixed-size chunks and writes its events, kernel geometry, comm
    arguments and metadata as frames.

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
    with stream_output(output) as out:
        extract_api(inputs, out, world_size=world_size, keep_pyfunc=keep_pyfunc, jobs=jobs,
                            strict=strict, progress=_progress_printer(quiet))


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

    dump_stream(list(streams) or ["-"], what, fmt, sys.stdout, ranks=set(ranks) or None)


if __name__ == "__main__":  # pragma: no cover
    main()
