"""Running the stages in one process, on whatever the user has.

An input is either an event stream (any stage) or trace files; the missing
stages run in-process, generator to generator, with no serialisation between
them.
"""
import contextlib
import itertools
import os

from .background import interleaved, prefetched
from .errors import StreamtraceError
from .stream import MAGIC, Kind, iter_frames


def is_stream(path):
    """True when ``path`` starts with the event-stream magic."""
    if str(path) == "-":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError as exc:
        raise StreamtraceError(f"{path}: {exc.strerror or exc}") from None


#: records per frame in the in-process chains: 4x the stream's frames.  The
#: stages' Python code runs once per frame (align and correlate make a few
#: hundred numpy calls per frame, whatever its size), so fewer frames cost
#: the consumer less CPU: in interleaved runs of extract | align | correlate
#: on 4 x 500 MB, the main thread's CPU went 2.15-2.37 -> 2.06-2.13 s and the
#: wall time 3.76-4.08 -> 3.54-3.97 s, extraction alone unchanged; at 16x the
#: extraction itself slowed (its buffers no longer stay in cache)
PIPELINE_BATCH_EVENTS = 65536

#: frames extracted ahead of the consumer (an EVENTS frame is about 6 MB,
#: and a batch is 2-3 frames): enough to cover a rank's finishing work in
#: align and correlate, during which the consumer reads nothing.  On
#: 4 x 500 MB the extractor stood still on a full queue for 0.05-0.07 s at
#: 24 and 0.01-0.02 s at 48, peak RSS the same (370 against 371 MB: the
#: queue is full only at rank ends).  (In frames a quarter the size: 0.2 s
#: at 32, none at 96.)
PREFETCH_FRAMES = 48

#: bytes per memory-mapped window of a plain trace in the in-process chains.
#: Each window costs the extracting thread a few GIL hand-offs (its feeds,
#: the read-ahead queue), and while the stages run Python each one waits
#: for the GIL.  In 12 interleaved rounds of extract | align | correlate on
#: 4 x 500 MB, 4 -> 16 MiB took the median chain 4.04 -> 3.78 s, the
#: rounds' median ratio to extraction +22 % -> +16 %, for 24 MB more peak
#: RSS (the mapped windows).  ``streamtrace extract`` keeps 4 MiB windows
#: and its ~45 MB RSS.
PIPELINE_MAP_WINDOW = 16 << 20


def trace_frames(inputs, world_size=None, jobs=1, keep_pyfunc=False, prefetch=True, strict=False, progress=None,
                 drop_flows=False):
    """Frames of every RankInput, extracted in-process in a background thread
    ``PREFETCH_FRAMES`` frames ahead (``prefetch``): the C tokenizer releases
    the GIL, so the stages consuming the frames (align, correlate) work
    meanwhile.

    ``jobs`` > 1: that many ranks are extracted at once, each in its own
    thread, and their frames come interleaved as they are made (each rank's
    in order; every stage keeps its state per rank); ``progress`` is then
    not called.  On this 2-core machine that beat extracting the ranks in
    parallel processes into a temporary stream read back afterwards.
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


def table_names(path):
    """Names of the TABLE frames in a stream file, reading only headers
    (payloads are skipped with seek)."""
    import json
    import struct

    names = set()
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        pos = 16  # after the stream header; concatenated headers are 16 bytes too
        while pos + 16 <= size:
            f.seek(pos)
            head = f.read(16)
            if head[:8] == MAGIC:
                pos += 16
                continue
            kind, _, length = struct.unpack("<IIQ", head)
            if kind == Kind.TABLE:
                (hlen,) = struct.unpack("<I", f.read(4))
                names.add(json.loads(f.read(hlen))["name"])
            pos += 16 + length
    return names


def _spool_stdin():
    """stdin to a temporary file, so it can be read twice; the caller removes it."""
    import shutil
    import sys
    import tempfile

    fd, path = tempfile.mkstemp(prefix="streamtrace-", suffix=".stev")
    try:
        with os.fdopen(fd, "wb") as tmp:
            shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
    except BaseException:
        os.unlink(path)
        raise
    return path


def correlated_frames(paths, jobs=1, world_size=None):
    """Frames with align and correlate results, running what is missing:
    ``paths`` are event streams (``-``: stdin), trace files, or one
    directory of traces (resolved as ``--trace_dir`` is).  stdin is spooled
    to a temporary file, removed when the frames are consumed or closed."""
    spooled = []
    try:
        paths = [p for p in paths]
        for i, p in enumerate(paths):
            if str(p) == "-":
                paths[i] = _spool_stdin()
                spooled.append(paths[i])
        yield from _correlated_frames(paths, jobs, world_size)
    finally:
        for path in spooled:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _correlated_frames(paths, jobs, world_size):
    from .align import align_frames
    from .correlate import TABLE_PREFIX, correlate_frames
    from .sources import resolve_inputs

    directories = [p for p in paths if os.path.isdir(p)]
    if directories:   # a run's directory of traces, as --trace_dir takes it
        if len(paths) > 1:
            raise StreamtraceError(f"{directories[0]}: a directory of traces must be the only input")
        inputs = resolve_inputs(trace_dir=directories[0], world_size=world_size)
        return correlate_frames(align_frames(stage_frames(inputs, world_size=world_size, jobs=jobs)))
    streams = [is_stream(p) for p in paths]
    if all(streams):
        names = set().union(*(table_names(p) for p in paths))
        frames = (f for p in paths for f in iter_frames(p))
        if any(n.startswith(TABLE_PREFIX) for n in names):
            return frames
        if "align.collectives" not in names:
            frames = align_frames(frames)
        return correlate_frames(frames)
    if any(streams):
        raise StreamtraceError("give either event streams or trace files, not both")
    inputs = resolve_inputs(paths=paths, world_size=world_size)
    return correlate_frames(align_frames(stage_frames(inputs, world_size=world_size, jobs=jobs)))


def correlated_sheets(paths, jobs=1, world_size=None):
    """{sheet: DataFrame} of correlate's results for streams or traces."""
    from .correlate import sheets_from_tables

    tables = {}
    for f in correlated_frames(paths, jobs=jobs, world_size=world_size):
        if f.kind == Kind.TABLE:
            name, df = f.table()
            tables[name] = df
    return sheets_from_tables(tables)
