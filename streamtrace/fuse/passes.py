"""The per-rank passes over the C rewriter (csrc/st_fuse.h): the chunk loop
every pass shares, the scan (pass 1), the ``baseTimeNanoseconds`` prepass and
the write (pass 2), and the threads that run one pass over many ranks."""
import contextlib
import json
import math
import os
import re
import tempfile
import threading

from .. import _native
from ..errors import TraceError
from ..extract import decode_raw_string
from ..io.outputs import resolve_output
from ..io.reading import input_extent, open_source
from ..parallel.executor import Threads
from ..userregex import UserRegex
from .options import F, _window_ns
from .segments import _Segment, _copy
from .spill import _Runs

CHUNK_SIZE = 1 << 20
OUT_SIZE = 4 << 20
MAX_ITEM_BYTES = 256 << 20      # one event or top-level member larger than this is refused
INTERVAL_BUDGET = 0             # X intervals a scan holds before spilling a sorted run (0: 2^18, ~6 MiB)


def _feed_file(fz, path, mode, on_output=None, on_spans=None, decide_name=None, progress=None, on_run=None):
    """Run one pass of ``fz`` over the file.

    Returns ``(status, source_truncated)`` with status DONE or TRUNCATED.
    """
    Fz = _native.Fuser
    fz.source = path   # named in its errors
    source, close = open_source(path)
    try:
        buf = bytearray(CHUNK_SIZE)
        out = bytearray(OUT_SIZE) if mode == Fz.WRITE else None
        filled, eof = 0, False
        status = Fz.OK
        offset = reported = 0   # the fuser's offset in the JSON; the input's bytes (as stored) reported
        while True:
            if not eof and filled < len(buf):
                n = _read_into(source, buf, filled)
                if n == 0:
                    eof = True
                filled += n
            status, consumed, out_len = fz.feed(memoryview(buf)[:filled], eof, out)
            if out_len:
                on_output(memoryview(out)[:out_len])
            if on_spans is not None:
                on_spans(memoryview(buf)[:filled], fz.spans())
            if consumed:
                memoryview(buf)[: filled - consumed] = memoryview(buf)[consumed:filled]
                filled -= consumed
            if progress and consumed:
                offset += consumed
                read = input_extent(source, offset)["input_read"]
                read = offset if read is None else read   # compressed stdin: the JSON's bytes
                if read > reported:
                    progress(read - reported)
                    reported = read
            if status == Fz.NAME:
                fz.decide_name(decide_name(fz.pending_name()))
                continue
            if status == Fz.RUN:
                on_run()
                continue
            if status == Fz.OUTPUT_FULL:
                continue
            if status == Fz.OUTPUT_SMALL:
                if len(out) >= 8 * MAX_ITEM_BYTES:  # cannot happen: output <= 6 x input per event
                    raise TraceError(path, "an event's rewritten form is too large", fz.stats()["bytes_consumed"])
                out = bytearray(2 * len(out))
                continue
            if status == Fz.TRUNCATED:
                break
            if status == Fz.DONE:
                if eof:
                    break
                continue  # anything after the document must be whitespace: the scanner checks
            if eof:
                break
            if consumed == 0 and filled == len(buf):
                if len(buf) >= MAX_ITEM_BYTES:
                    raise TraceError(path, f"a single event or top-level value is larger than "
                                           f"{MAX_ITEM_BYTES >> 20} MiB", fz.stats()["bytes_consumed"])
                buf.extend(bytes(len(buf)))  # geometric: restarts cost O(item size) in total
        return status, source.truncated
    finally:
        close()


def _read_into(source, buf, start):
    """Fill buf[start:] from an inputs source (``read_into(buf, start)``; older
    sources had ``readinto(view)``)."""
    if hasattr(source, "read_into"):
        return source.read_into(buf, start)
    with memoryview(buf) as mv:  # pragma: no cover - older inputs API
        return source.readinto(mv[start:])


def _name_decider(rx):
    def decide(raw):
        return rx.search(decode_raw_string(raw)) is not None
    return decide


def _new_fuser(rk, opts):
    flags = opts.flags()
    if rk.mask is not None:
        flags = F["comma_first"] | F["keep_mask"]
    fz = _native.Fuser(rank=rk.rank, flags=flags, ts_shift_ns=rk.shift_ns, window=_window_ns(opts),
                       interval_budget=INTERVAL_BUDGET)
    for cat in opts.cats:
        fz.add_cat(json.dumps(cat)[1:-1].encode())
    if rk.mask is not None:
        fz.set_keep_mask(*rk.mask)
    return fz


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads has joined the valid pairs


def _unicode(value):
    """``value`` with every lone surrogate ("\\ud800") replaced by U+FFFD, keys
    too: the output is strict JSON, as the C core makes the events."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_unicode(k): _unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unicode(v) for v in value]
    return value


def _parse_meta(members):
    out = {}
    for key, raw in members:
        k = decode_raw_string(key)
        try:
            value = json.loads(raw)  # duplicate keys: the last is kept
            json.dumps(value, allow_nan=False)
        except ValueError:
            value = {"unparsed": raw.decode("utf-8", "replace")}
        out[_unicode(k)] = _unicode(value)
    return out


def _finish_scan(fz, runs):
    status = fz.finish_scan()
    while status == fz.RUN:
        runs.take()
        status = fz.finish_scan()
    if status == fz.MERGE:
        runs.merge()


def _scan(rk, opts, progress=None, budget=None):
    fz = rk.fz = _new_fuser(rk, opts)
    fz.begin(fz.SCAN)
    decide = _name_decider(UserRegex(opts.name_regex, "--name")) if opts.name_regex is not None else None
    runs = _Runs(fz, budget)
    try:
        status, rk.source_truncated = _feed_file(fz, rk.path, fz.SCAN, decide_name=decide, progress=progress,
                                                 on_run=runs.take)
        rk.spilled_runs = len(runs.runs)
        _scan_checks(rk, fz, status)
        _finish_scan(fz, runs)
    finally:
        runs.close()
    _scan_result(rk, fz, status)
    return rk


def _scan_checks(rk, fz, status):
    stats = fz.stats()
    if not stats["doc_started"]:
        raise TraceError(rk.path, "empty file (no JSON)")
    if not stats["saw_events"]:
        if status == fz.TRUNCATED:
            raise TraceError(rk.path, "truncated before the traceEvents array (no events to keep)",
                             stats["bytes_consumed"])
        raise TraceError(rk.path, "not a trace: the JSON has no traceEvents array")


def _scan_result(rk, fz, status):
    stats = fz.stats()
    rk.stats = stats
    rk.tracks = fz.tracks()
    rk.trace = _parse_meta(fz.meta())
    rk.base_ns = _base_of(rk.trace)
    if status == fz.TRUNCATED:
        rk.truncated_at = stats["bytes_consumed"]
        why = " (the compressed stream ends early)" if rk.source_truncated else ""
        rk.warnings.append(f"{rk.path}: truncated at byte {rk.truncated_at}{why}; kept the "
                           f"{stats['events_seen']} complete events before the cut")
    elif rk.source_truncated:
        rk.warnings.append(f"{rk.path}: the compressed stream ends early, but the JSON document is complete")
    dist = rk.trace.get("distributedInfo")
    trace_rank = dist.get("rank") if isinstance(dist, dict) else None
    if isinstance(trace_rank, int) and trace_rank != rk.rank:
        rk.warnings.append(f"{rk.path}: fused as rank {rk.rank}, but distributedInfo.rank is {trace_rank}")
    mark = rk.trace.get("streamtrace")
    if isinstance(mark, dict) and mark.get("tool") == "streamtrace fuse":
        rk.warnings.append(f"{rk.path}: this input is itself a fused trace (an earlier fuse output?); "
                           f"its events are fused again as rank {rk.rank}")


def _base_prepass(rk):
    """baseTimeNanoseconds comes after the events: read the file once to get it."""
    fz = _native.Fuser(rank=rk.rank, flags=0)
    fz.begin(fz.SCAN)
    _feed_file(fz, rk.path, fz.SCAN, on_run=fz.take_run)  # intervals are not needed here
    return _base_of(_parse_meta(fz.meta()))


def _base_of(trace):
    """baseTimeNanoseconds as an int (0 when absent or not a finite number)."""
    base = trace.get("baseTimeNanoseconds")
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        return 0
    return int(base) if math.isfinite(base) else 0


def _write_rank(rk, opts, f, compression, progress=None, writer=None):
    """The rank's kept events, rewritten, as one segment into ``f`` (in the
    writer's format; None: JSON as the rewriter makes it)."""
    seg = _Segment(f, compression)
    feed, finish = writer.rank_sink(rk, seg.write) if writer is not None else (seg.write, None)
    fz = rk.fz
    fz.begin(fz.WRITE)
    _feed_file(fz, rk.path, fz.WRITE, on_output=feed, progress=progress)
    if finish is not None:
        finish()
    seg.close()
    rk.write_stats = fz.stats()
    rk.fz = None  # free the C context (tracks, lanes, names) as soon as the rank is done
    return seg


def _run_parallel(fn, items, jobs):
    """``[fn(rank) for rank in items]``: one per-rank pass, ``jobs`` ranks at
    a time in threads (the C rewriter and the compressors release the GIL).
    An error waits for the running ranks; a signal does not (the executor's
    rules)."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with Threads(min(jobs, len(items)), name="streamtrace-fuse") as pool:
        return list(pool.map(fn, items))


def _write_parallel(ranks_, opts, f, compression, jobs, output, prog, writer=None):
    """Each rank written by a worker thread into its own part file (next to
    the output), then copied into place in rank order."""
    # beside the output's target; $TMPDIR for stdout, a device or a pipe (never /dev)
    target, direct = (None, True) if output == "-" else resolve_output(output)
    directory = tempfile.gettempdir() if direct else os.path.dirname(target)
    parts = {}
    try:
        def work(rk):
            fd, path = tempfile.mkstemp(prefix=f".streamtrace-fuse-rank{rk.rank}-", dir=directory)
            parts[rk.rank] = path
            with os.fdopen(fd, "wb") as pf:
                return _write_rank(rk, opts, pf, compression, prog, writer)

        segs = _run_parallel(work, ranks_, jobs)
        for rk in ranks_:
            _copy(parts[rk.rank], f)
            os.unlink(parts.pop(rk.rank))
        return segs
    finally:
        for path in parts.values():
            with contextlib.suppress(OSError):
                os.unlink(path)


class _Progress:
    """Thread-safe byte counter forwarded to a callback."""

    def __init__(self, callback):
        self._cb, self._lock = callback, threading.Lock()
        self.done = 0

    def __call__(self, n):
        if self._cb is None:
            return
        with self._lock:
            self.done += n
            self._cb(self.done)
