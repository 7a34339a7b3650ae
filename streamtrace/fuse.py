"""``fuse``: every rank's trace on one timeline, as one Perfetto/Chrome JSON file.

The events are never parsed into Python objects on this path.  Each rank goes
through the C rewriter (csrc/st_fuse.h) twice, in fixed-size chunks:

1. **scan**: filters every event and aggregates, per rank, the id ranges, the
   (pid, tid) tracks with their thread names and whether they are GPU rows,
   the top-level members (``deviceProperties``, ``distributedInfo``,
   ``baseTimeNanoseconds``, ...) and the X intervals of each track.  At the
   end it assigns sibling lanes to X events that overlap without nesting
   (Perfetto drops those): intervals sorted by (track, ts, longest first),
   each put in the first lane where it nests.  Only the moved events are
   remembered (their index in the file).
2. **write**: with the strides, pid maps and lane tids computed from all
   ranks' scans, each kept event is rewritten (ids, pids, ts, lane tid,
   ``args.rank`` and the ``*_raw`` originals) and streamed to the output.

Ranks run in parallel threads (``jobs``): the C calls and the compressors
release the GIL.  Output: ``.json`` plain, ``.json.gz`` one gzip member
(ISA-L level 1; ranks compressed in parallel as raw deflate segments, joined
with a combined CRC, because Perfetto stops at the end of the first member),
``.json.zst`` zstd frames, ``-`` stdout.  Written atomically.

Memory per rank in flight: the read buffer (1 MiB, grown for one huge event),
the output buffer, the compressor, and during the scan a bounded buffer of X
intervals (sorted runs beyond it are spilled to a temporary file and merged
back in C: an external sort), so memory does not grow with the trace.

``TraceFuse`` is the TraceLens-compatible API over the same machinery; its
``filter_fn`` is the slow path (each event parsed into a dict).
"""
import contextlib
import json
import logging
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import numpy as np

from . import _native
from .io.outputs import atomic_file, check_suffix, refuse_input_as_output, resolve_output, stdout_buffer
from .errors import StreamtraceError, TraceError
from .extract import VERSION, decode_raw_string, peek_metadata
from .io.reading import open_source
from .io.ranks import RankInput
from .parallel.executor import Threads, worker_count
from .userregex import UserRegex

log = logging.getLogger("streamtrace")

CHUNK_SIZE = 1 << 20
OUT_SIZE = 4 << 20
MAX_ITEM_BYTES = 256 << 20      # one event or top-level member larger than this is refused
GZIP_LEVEL = 1                  # ISA-L levels are 0-3; 1 compresses JSON ~8x at ~0.8 GB/s
ZSTD_LEVEL = 1
PID_LIMIT = (1 << 31) - 1       # Perfetto and chrome://tracing keep pids as 32-bit ints
INTERVAL_BUDGET = 0             # X intervals a scan holds before spilling a sorted run (0: 2^18, ~6 MiB)
SORT_SLOTS = 1000               # process_sort_index = rank * 1000 + slot
GPU_SLOT, STR_SLOT = 100, 900

F = _native.Fuser.FLAGS


# ---------------------------------------------------------------- options and results

@dataclass
class FuseOptions:
    """What to keep and how to place it (the CLI flags, in API form)."""

    include_pyfunc: bool = False
    keep_spans: bool = False         # keep cat "Trace" (the profiler window span)
    cats: tuple = ()                 # keep only these categories
    name_regex: str = None           # keep only events whose name matches (search, time-bounded: userregex)
    window: tuple = None             # (lo_ns, hi_ns) on the fused timeline; None ends are open
    nccl_only: bool = False          # keep only kernels whose name contains "nccl"
    align_clocks: bool = False
    time_base: bool = False

    def flags(self):
        fl = F["comma_first"]
        if self.include_pyfunc:
            fl |= F["keep_pyfunc"]
        if self.keep_spans:
            fl |= F["keep_spans"]
        if self.cats:
            fl |= F["cat_filter"]
        if self.name_regex is not None:
            fl |= F["name_filter"]
        if self.window is not None:
            fl |= F["window"]
        if self.nccl_only:
            fl |= F["nccl_only"]
        return fl


@dataclass
class _Rank:
    rank: int
    path: str
    position: int
    fz: object = None
    stats: dict = None
    tracks: list = None
    trace: dict = field(default_factory=dict)   # top-level members, parsed
    warnings: list = field(default_factory=list)
    base_ns: int = 0
    clock_offset_ns: int = None
    shift_ns: int = 0
    pid_map: dict = field(default_factory=dict)
    truncated_at: int = None
    source_truncated: bool = False
    write_stats: dict = None
    mask: tuple = None                          # (bits, n_events) from a filter_fn
    spilled_runs: int = 0
    id_offset: int = 0


@dataclass
class FuseResult:
    """What ``fuse`` wrote: the output path, per-rank facts, warnings."""

    output: str
    ranks: dict
    events_written: int
    warnings: list
    id_stride: int
    pid_stride: int
    time_base_ns: int
    lane_moves: int


# ---------------------------------------------------------------- inputs

def _as_rank_inputs(inputs):
    """RankInputs from RankInput/paths (list) or a {rank: path} dict."""
    if isinstance(inputs, dict):
        return [RankInput(str(p), int(r), i) for i, (r, p) in enumerate(inputs.items())]
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    out = []
    for i, x in enumerate(inputs):
        out.append(x if isinstance(x, RankInput) else RankInput(str(x), None, i))
    return out


def _resolve_ranks(inputs, ranks):
    """Assign every input its rank (given, else distributedInfo.rank, else
    position), refuse duplicates, and keep the selected ``ranks``."""
    out = []
    seen = {}
    for inp in inputs:
        r = inp.rank
        if r is None:
            try:
                dist = peek_metadata(inp.path).get("distributedInfo")
            except TraceError:
                dist = None  # reported by the scan, with the reason
            trace_rank = dist.get("rank") if isinstance(dist, dict) else None
            r = trace_rank if isinstance(trace_rank, int) and trace_rank >= 0 else inp.position
        if r in seen:
            raise StreamtraceError(f"{inp.path} and {seen[r]} are both rank {r}: give each rank once")
        seen[r] = inp.path
        out.append(_Rank(rank=int(r), path=inp.path, position=inp.position))
    if ranks is not None:
        wanted = set(int(r) for r in ranks)
        missing = sorted(wanted - set(seen))
        if missing:
            shown = ",".join(map(str, missing[:10])) + (f",... ({len(missing)} in all)" if len(missing) > 10 else "")
            raise StreamtraceError(f"--ranks {shown}: no input has "
                                   f"{'that rank' if len(missing) == 1 else 'those ranks'} "
                                   f"(ranks present: {','.join(map(str, sorted(seen)))})")
        out = [x for x in out if x.rank in wanted]
    if not out:
        raise StreamtraceError("no trace to fuse")
    return sorted(out, key=lambda x: x.rank)


_WINDOW_LIMIT_NS = 1 << 63   # the C core's timestamps are int64 nanoseconds


def parse_window(text):
    """``START:END`` in microseconds (decimals allowed, either end may be empty)
    -> (lo_ns, hi_ns) with None for an open end."""
    if text is None:
        return None
    if ":" not in text:
        raise StreamtraceError(f"--window {text!r}: expected START:END in microseconds (either may be empty)")
    lo, hi = text.split(":", 1)

    def ns(v):
        v = v.strip()
        if not v:
            return None
        try:
            d = Decimal(v)
        except InvalidOperation:
            raise StreamtraceError(f"--window {text!r}: {v!r} is not a number of microseconds") from None
        if not d.is_finite():
            raise StreamtraceError(f"--window {text!r}: {v!r} is not a finite number")
        # checked before converting: 1e999999999 as an int would take minutes and gigabytes
        if d.adjusted() > 18 or abs(d) * 1000 >= _WINDOW_LIMIT_NS:   # (the exponent first: no overflow)
            raise StreamtraceError(f"--window {text!r}: {v!r} is out of range (at most "
                                   f"{_WINDOW_LIMIT_NS // 1000:.3e} us either way)")
        return int((d * 1000).to_integral_value())

    lo_ns, hi_ns = ns(lo), ns(hi)
    if lo_ns is not None and hi_ns is not None and hi_ns < lo_ns:
        raise StreamtraceError(f"--window {text!r}: END is before START")
    return lo_ns, hi_ns


# ---------------------------------------------------------------- the chunk loop

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
                progress(consumed)
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


# ---------------------------------------------------------------- pass 1: scan

def _window_ns(opts):
    if opts.window is None:
        return None
    lo, hi = opts.window
    return (lo if lo is not None else -(1 << 63), hi if hi is not None else (1 << 63) - 1)


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


#: environment variable: the most bytes of sorted intervals one fuse run may
#: spill to $TMPDIR, all ranks together (e.g. 500M, 2G; unset: no limit but
#: the folder's free space)
SPILL_LIMIT_ENV = "STREAMTRACE_SPILL_LIMIT"
SPILL_RESERVE = 64 << 20   # bytes a spill always leaves free in its folder


def _parse_bytes(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        value = int(t[: len(t) - len(unit)]) * units[unit]
    except ValueError:
        value = -1
    if value < 0:
        raise StreamtraceError(f"{SPILL_LIMIT_ENV}={text!r}: expected a size in bytes such as 500M or 2G")
    return value


class _SpillBudget:
    """What the scans of one fuse run may spill, all ranks together: at most
    ``$STREAMTRACE_SPILL_LIMIT`` bytes, and never so much that the spill
    folder keeps less than ``SPILL_RESERVE`` free (checked before each run
    is written, so a bomb fails early, naming the folder, instead of filling
    the disk)."""

    def __init__(self):
        text = os.environ.get(SPILL_LIMIT_ENV)
        self.limit = _parse_bytes(text) if text else None
        self.folder = tempfile.gettempdir()
        self.used = 0
        self._lock = threading.Lock()

    def claim(self, nbytes):
        with self._lock:
            if self.limit is not None and self.used + nbytes > self.limit:
                raise StreamtraceError(
                    f"{self.folder}: the sorted intervals fuse spills there would exceed {SPILL_LIMIT_ENV}="
                    f"{self.limit} bytes (the traces hold too many X events; select fewer with --ranks, "
                    f"--cat, --window or --name, or raise the limit)")
            free = shutil.disk_usage(self.folder).free
            if free - nbytes < SPILL_RESERVE:
                raise StreamtraceError(
                    f"{self.folder}: not enough free space for fuse's sorted intervals ({nbytes >> 20} MiB "
                    f"more needed, {free >> 20} MiB free; {self.used >> 20} MiB spilled so far): "
                    f"point TMPDIR at a larger folder")
            self.used += nbytes


class _Runs:
    """Sorted runs of X intervals spilled by a scan (an external sort, so the
    scan's memory does not grow with the trace), merged back in C.  A run
    holds one fixed-size record per kept X event (each one also written to
    the output), so the spill is at most about the output's size; the
    ``budget`` bounds it further."""

    MERGE_RECORDS = 1 << 18  # records held while merging, all runs together

    def __init__(self, fz, budget=None):
        self.fz, self.file, self.runs, self.size = fz, None, [], 0
        self.budget = budget

    def take(self):
        buf, n, size = self.fz.take_run()
        if self.budget is not None:
            self.budget.claim(len(buf))
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="streamtrace-fuse-runs-")
        offset = self.file.seek(0, os.SEEK_END)
        self.file.write(buf)
        self.runs.append((offset, n))
        self.size = size

    def merge(self):
        fz, k = self.fz, len(self.runs)
        chunk = max(1024, self.MERGE_RECORDS // max(k, 1))
        bufs = [bytearray(chunk * self.size) for _ in range(k)]
        done = [0] * k
        fz.merge_begin(k)
        self.file.flush()
        fd = self.file.fileno()
        while True:
            status, run = fz.merge()
            if status == fz.OK:
                break
            offset, n = self.runs[run]
            take = min(chunk, n - done[run])
            got = os.preadv(fd, [memoryview(bufs[run])[: take * self.size]], offset + done[run] * self.size)
            if got != take * self.size:
                raise StreamtraceError("the temporary file of sorted intervals was cut short")
            done[run] += take
            fz.merge_feed(run, bufs[run], take, done[run] >= n)

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None


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


# ---------------------------------------------------------------- clocks

def _clock_offsets(ranks, jobs):
    """{rank: (offset_ns, base_ns)} from the align stage's estimate (its
    ``align.clocks`` table, the report's clock_alignment sheet)."""
    try:
        from .align import stage as align
        from .extract import extract_rank
    except ImportError as exc:  # pragma: no cover - align ships with streamtrace
        raise StreamtraceError(f"--align_clocks needs the align stage ({exc})") from None
    if not (hasattr(align, "collect_rank") and hasattr(align, "match_ranks")):
        raise StreamtraceError("--align_clocks needs streamtrace.align.collect_rank/match_ranks")

    def collect(rk):
        return align.collect_rank(extract_rank(rk.path, rk.rank, None, False, rk.position), rk.rank)

    results = _run_parallel(collect, ranks, max(1, jobs))
    tables = align.match_ranks(results, align_clocks=True)
    clocks = tables["align.clocks"]
    offsets = {int(r): int(o) for r, o in zip(clocks["rank"], clocks["offset_ns"])}
    bases = {int(res.rank): int(res.meta.get("base_ns") or 0) for res in results}
    return offsets, bases, clocks


# ---------------------------------------------------------------- between the passes

def _pow10_above(span):
    """Smallest power of ten strictly greater than span (>= 10)."""
    m = 10
    while m <= span:
        m *= 10
    return m


def _id_stride(ranks):
    lo = min((rk.stats["id_min"] for rk in ranks if rk.stats["id_max"] >= rk.stats["id_min"]), default=0)
    hi = max((rk.stats["id_max"] for rk in ranks if rk.stats["id_max"] >= rk.stats["id_min"]), default=0)
    stride = _pow10_above(hi - min(lo, 0))
    top = max(rk.rank for rk in ranks)
    if top * stride + hi > (1 << 63) - 1 or top * stride + lo < -(1 << 63):
        raise StreamtraceError(f"ids up to {hi} and rank {top} do not fit 64-bit ids with a per-rank range; "
                               "fuse fewer or lower ranks")
    return stride


def _process_pids(rk):
    """int pid -> is_gpu, for pids with kept events; string pids (raw) likewise."""
    ints, strs = {}, {}
    for t in rk.tracks:
        if not t["n_kept"]:
            continue
        pid = t["pid"]
        if isinstance(pid, int):
            ints[pid] = ints.get(pid, False) or t["gpu"]
        elif isinstance(pid, bytes):
            strs[pid] = True
    return ints, strs


def _pid_maps(ranks):
    """Per-rank int pid maps: rank * stride + pid (stride a power of ten above
    every kept pid of every rank), or a dense rank * K + ordinal numbering when
    that would not fit 31 bits."""
    per_rank = {rk.rank: _process_pids(rk)[0] for rk in ranks}
    all_pids = [p for pids in per_rank.values() for p in pids]
    lo, hi = (min(all_pids), max(all_pids)) if all_pids else (0, 0)
    stride = _pow10_above(hi - min(lo, 0))
    top = max(rk.rank for rk in ranks)
    dense = top * stride + hi > PID_LIMIT
    if dense:
        stride = _pow10_above(max((len(p) for p in per_rank.values()), default=1) - 1)
    maps = {}
    for rk in ranks:
        pids = sorted(per_rank[rk.rank])
        if dense:
            maps[rk.rank] = {p: rk.rank * stride + i for i, p in enumerate(pids)}
        else:
            maps[rk.rank] = {p: rk.rank * stride + p for p in pids}
    if dense and top * stride + stride > PID_LIMIT:
        raise StreamtraceError(f"rank {top} is too large for 32-bit pids in the fused trace")
    return maps, stride, dense


def rank_pid_string(raw, rank):
    """The fused form of a string pid (raw JSON-escaped bytes): "Spans" ->
    "Spans (rank 3)", "" -> "(rank 3)"."""
    text = decode_raw_string(raw)
    return f"{text} (rank {rank})" if text else f"(rank {rank})"


def _labels(rk, pid_map):
    """The metadata events fuse adds for one rank: process names and sort
    indices, and names for sibling-lane threads.  They carry no args.rank."""
    ints, strs = _process_pids(rk)
    r = rk.rank
    base = r * SORT_SLOTS
    out = []

    def meta(name, pid, tid, args):
        out.append({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args})

    # names exactly as TraceLens's TraceFuse writes them ("RANK r - CPU" /
    # "RANK r - GPU": scripts match them); what tells a rank's processes
    # apart (the device, or the pid of one of several CPU processes) goes in
    # a process_labels record, which Perfetto shows next to the name
    cpu = sorted(p for p, gpu in ints.items() if not gpu)
    for i, p in enumerate(cpu):
        meta("process_name", pid_map[p], 0, {"name": f"RANK {r} - CPU"})
        if len(cpu) > 1:
            meta("process_labels", pid_map[p], 0, {"labels": f"pid {p}"})
        meta("process_sort_index", pid_map[p], 0, {"sort_index": base + min(i, GPU_SLOT - 1)})
    for p in sorted(p for p, gpu in ints.items() if gpu):
        meta("process_name", pid_map[p], 0, {"name": f"RANK {r} - GPU"})
        meta("process_labels", pid_map[p], 0, {"labels": f"GPU {p}"})
        meta("process_sort_index", pid_map[p], 0,
             {"sort_index": base + GPU_SLOT + min(max(p, 0), STR_SLOT - GPU_SLOT - 1)})
    for i, raw in enumerate(sorted(strs)):
        pid = rank_pid_string(raw, r)
        meta("process_name", pid, 0, {"name": pid})
        meta("process_sort_index", pid, 0, {"sort_index": base + min(STR_SLOT + i, SORT_SLOTS - 1)})
    return out


def _lanes(rk, pid_map):
    """Give each track with sibling lanes its lane tids (in C) and return the
    thread metadata naming them."""
    out = []
    used = {}
    for t in rk.tracks:
        if isinstance(t["pid"], int) and isinstance(t["tid"], int):
            used.setdefault(t["pid"], set()).add(t["tid"])
    next_tid = {p: max(tids) + 1 for p, tids in used.items()}
    for t in sorted(rk.tracks, key=lambda t: (str(t["pid"]), str(t["tid"]))):
        if t["n_lanes"] <= 1:
            continue
        pid, tid = t["pid"], t["tid"]
        if isinstance(pid, int):
            out_pid = pid_map.get(pid, pid)
        elif isinstance(pid, bytes):
            out_pid = rank_pid_string(pid, rk.rank)
        else:
            continue
        name = decode_raw_string(t["name"]).strip() if t["name"] is not None else None
        if isinstance(tid, int):
            first = next_tid.get(pid, tid + 1)
            rk.fz.set_lane_base(t["index"], first)
            next_tid[pid] = first + t["n_lanes"] - 1
            lane_tids = [first + k - 1 for k in range(1, t["n_lanes"])]
            label = name or f"thread {tid}"
        elif isinstance(tid, bytes):
            text = decode_raw_string(tid)
            lane_tids = [f"{text} (lane {k})" for k in range(1, t["n_lanes"])]
            label = name or text
        else:
            continue
        sort = t["sort_index"] if t["sort_index"] is not None else (tid if isinstance(tid, int) else None)
        for k, lt in enumerate(lane_tids, start=1):
            out.append({"name": "thread_name", "ph": "M", "pid": out_pid, "tid": lt,
                        "args": {"name": f"{label} (lane {k})"}})
            if sort is not None:
                out.append({"name": "thread_sort_index", "ph": "M", "pid": out_pid, "tid": lt,
                            "args": {"sort_index": sort}})
    return out


def _rank_warnings(rk):
    s, w = rk.stats, []
    if s["lane_moves"]:
        tracks = sum(1 for t in rk.tracks if t["n_lanes"] > 1)
        w.append(f"rank {rk.rank}: {s['lane_moves']} X events overlapped another on the same track without "
                 f"nesting (Perfetto would drop them); moved to sibling lanes on {tracks} track(s)")
    if s["lanes_forced"]:
        w.append(f"rank {rk.rank}: {s['lanes_forced']} X events still overlap after {64} lanes on one track")
    ws = rk.write_stats or {}
    for key, what in (("bad_literals", "values that are not JSON (NaN, Infinity, ...) were written as null"),
                      ("repaired_strings", "strings with invalid escapes, control bytes or invalid UTF-8 "
                                           "were repaired"),
                      ("ts_unshifted", "ts values too long for exact shifting were left unshifted"),
                      ("id_overflow", "ids were left as is because the rank offset would overflow")):
        if ws.get(key):
            w.append(f"rank {rk.rank}: {ws[key]} {what}")
    return w


# ---------------------------------------------------------------- output

class _Segment:
    """Compressed bytes for one piece of the output, written to ``f``.

    gzip: a raw deflate stream ended by a sync flush (byte-aligned, not final),
    so segments compressed independently and in parallel can be joined into
    one gzip member; the CRC and length are kept for the trailer.  zstd: one
    frame.  plain: as is.
    """

    def __init__(self, f, compression):
        self.f, self.kind = f, compression
        self.crc, self.size = 0, 0
        if compression == "gzip":
            from isal import isal_zlib

            self._z = isal_zlib
            self._c = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, -15)
        elif compression == "zstd":
            import zstandard

            self._c = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj()
        else:
            self._c = None

    def write(self, data):
        self.size += len(data)
        if self.kind == "gzip":
            self.crc = self._z.crc32(data, self.crc)
            self.f.write(self._c.compress(data))
        elif self.kind == "zstd":
            self.f.write(self._c.compress(data))
        else:
            self.f.write(data)

    def close(self, last=False):
        if self.kind == "gzip":
            self.f.write(self._c.flush(self._z.Z_FINISH if last else self._z.Z_SYNC_FLUSH))
        elif self.kind == "zstd":
            self.f.write(self._c.flush())


class _GzipJoin:
    """Joins gzip segments into one member: header, segments, CRC + size."""

    def __init__(self):
        from isal import isal_zlib

        self._z = isal_zlib
        self.crc, self.size = 0, 0

    @staticmethod
    def header():
        return b"\x1f\x8b\x08\x00" + struct.pack("<I", int(time.time())) + b"\x00\xff"

    def add(self, seg):
        self.crc = self._z.crc32_combine(self.crc, seg.crc, seg.size) if self.size else seg.crc
        self.size += seg.size

    def trailer(self):
        return struct.pack("<II", self.crc & 0xFFFFFFFF, self.size & 0xFFFFFFFF)


def compression_for(path):
    name = str(path).lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zstd"
    return "none"


@contextlib.contextmanager
def _atomic(path):
    """A binary file at ``path`` that appears only if the block succeeds ('-': stdout)."""
    if path == "-":
        out = stdout_buffer("the fused trace")
        yield out
        out.flush()
        return
    with atomic_file(path) as f:
        yield f


def _copy(src_path, dst):
    with open(src_path, "rb") as src:
        dst.flush()
        try:
            n = os.fstat(src.fileno()).st_size
            while n > 0:
                sent = os.copy_file_range(src.fileno(), dst.fileno(), n)
                if sent == 0:
                    break
                n -= sent
            if n == 0:
                return
        except (AttributeError, OSError, ValueError):
            src.seek(0)
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            dst.write(block)


# ---------------------------------------------------------------- pass 2: write

def _write_rank(rk, opts, f, compression, progress=None):
    """The rank's kept events, rewritten, as one segment into ``f``."""
    seg = _Segment(f, compression)
    fz = rk.fz
    fz.begin(fz.WRITE)
    _feed_file(fz, rk.path, fz.WRITE, on_output=seg.write, progress=progress)
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


def fuse(inputs, output, ranks=None, include_pyfunc=False, cats=None, name_regex=None, window=None,
         nccl_only=False, align_clocks=False, time_base=False, jobs=None, *, keep_spans=False,
         compression=None, progress=None, _masks=None):
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
    than there are ranks).  Returns a FuseResult.
    """
    t_start = time.time()
    if isinstance(window, str):
        window = parse_window(window)
    if name_regex is not None:
        UserRegex(name_regex, "--name")   # refuses a bad pattern before any work
    cats = tuple(c for c in (cats or ()) if c)
    opts = FuseOptions(include_pyfunc=include_pyfunc, keep_spans=keep_spans, cats=cats,
                       name_regex=name_regex, window=window, nccl_only=nccl_only,
                       align_clocks=align_clocks, time_base=time_base)
    if compression is None and output != "-":
        check_suffix(output, allowed=(".gz", ".zst", ".zstd"))
    compression = compression or compression_for(output)
    budget = _SpillBudget()
    rank_inputs = _as_rank_inputs(inputs)
    jobs = worker_count(jobs, len(rank_inputs) or 1)
    refuse_input_as_output(output, [i.path for i in rank_inputs])
    ranks_ = _resolve_ranks(rank_inputs, ranks)
    if _masks is not None:
        for rk in ranks_:
            rk.mask = _masks[rk.rank]
    prog = _Progress(progress)

    # clocks: offsets (and time bases) before the scan, so --window can use them
    clocks = None
    offsets, bases = {}, None
    if align_clocks:
        offsets, bases, clocks = _clock_offsets(ranks_, jobs)
    elif time_base and window is not None:
        bases = dict(zip([rk.rank for rk in ranks_], _run_parallel(_base_prepass, ranks_, jobs)))
    common_base = None
    if bases is not None:
        common_base = _common_base(bases.values())
        for rk in ranks_:
            rk.clock_offset_ns = offsets.get(rk.rank) if align_clocks else None
            rk.shift_ns = bases[rk.rank] - common_base - (offsets.get(rk.rank, 0) if align_clocks else 0)

    # pass 1
    _run_parallel(lambda rk: _scan(rk, opts, prog, budget), ranks_, jobs)
    if (time_base or align_clocks) and bases is None:
        common_base = _common_base(rk.base_ns for rk in ranks_)
        for rk in ranks_:
            rk.shift_ns = rk.base_ns - common_base

    # between the passes: strides, pid maps, lanes, labels
    id_stride = _id_stride(ranks_)
    pid_maps, pid_stride, dense = _pid_maps(ranks_)
    labels = []
    for rk in ranks_:
        rk.pid_map = pid_maps[rk.rank]
        rk.id_offset = rk.rank * id_stride
        rk.fz.configure(rank=rk.rank, flags=_flags_for(rk, opts), id_offset=rk.id_offset,
                        ts_shift_ns=rk.shift_ns, window=_window_ns(opts))
        rk.fz.set_pid_map(list(rk.pid_map), list(rk.pid_map.values()))
        labels += _labels(rk, rk.pid_map)
        labels += _lanes(rk, rk.pid_map)
    if not labels:
        labels.append({"name": "process_name", "ph": "M", "pid": "streamtrace", "tid": 0,
                       "args": {"name": "streamtrace fuse: no events selected"}})

    if output != "-" and compression == "none":
        _check_target_room(output, sum(rk.stats["events_kept"] for rk in ranks_))

    # pass 2 + output
    with _atomic(output) as f:
        joiner = _GzipJoin() if compression == "gzip" else None
        if joiner:
            f.write(joiner.header())
        head = _Segment(f, compression)
        head.write(b'{"traceEvents":[' + b",".join(
            json.dumps(e, separators=(",", ":")).encode() for e in labels))
        head.close()
        segments = [head]
        if jobs <= 1 or len(ranks_) <= 1:
            for rk in ranks_:
                segments.append(_write_rank(rk, opts, f, compression, prog))
        else:
            segments += _write_parallel(ranks_, opts, f, compression, jobs, output, prog)
        warnings = []
        for rk in ranks_:
            warnings += rk.warnings + _rank_warnings(rk)
        for w in warnings:
            log.warning(w)
        written = sum(rk.write_stats["events_kept"] for rk in ranks_)
        trailer = _trailer(ranks_, opts, warnings, id_stride, pid_stride, dense, common_base, clocks,
                           time.time() - t_start)
        tail = _Segment(f, compression)
        tail.write(trailer)
        tail.close(last=True)
        segments.append(tail)
        if joiner:
            for seg in segments:
                joiner.add(seg)
            f.write(joiner.trailer())
    return FuseResult(output=str(output), ranks={rk.rank: _rank_summary(rk) for rk in ranks_},
                      events_written=written, warnings=warnings, id_stride=id_stride, pid_stride=pid_stride,
                      time_base_ns=common_base, lane_moves=sum(rk.stats["lane_moves"] for rk in ranks_))


MIN_EVENT_BYTES = 41   # the shortest X event: {"ph":"X","pid":1,"tid":1,"ts":0,"dur":1}


def _check_target_room(output, events):
    """Refuse, before writing, a plain output that cannot fit in its folder:
    each kept event takes at least ``MIN_EVENT_BYTES`` (a compressed
    output's size is not knowable in advance: not checked)."""
    folder = os.path.dirname(os.path.abspath(output))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return   # reported when the output is opened
    needed = events * MIN_EVENT_BYTES
    if needed > free:
        raise StreamtraceError(f"{folder}: not enough free space for {output} ({events:,} events need at "
                               f"least {needed >> 20} MiB, {free >> 20} MiB free)")


def _flags_for(rk, opts):
    if rk.mask is not None:
        return F["comma_first"] | F["keep_mask"]
    return opts.flags()


def _common_base(bases):
    present = [b for b in bases if b]
    return min(present) if present else 0


def _write_parallel(ranks_, opts, f, compression, jobs, output, prog):
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
                return _write_rank(rk, opts, pf, compression, prog)

        segs = _run_parallel(work, ranks_, jobs)
        for rk in ranks_:
            _copy(parts[rk.rank], f)
            os.unlink(parts.pop(rk.rank))
        return segs
    finally:
        for path in parts.values():
            with contextlib.suppress(OSError):
                os.unlink(path)


def _rank_summary(rk):
    ws = rk.write_stats or {}
    return {
        "source": os.path.abspath(rk.path) if rk.path != "-" else "-",
        "events_seen": rk.stats["events_seen"],
        "events_written": ws.get("events_kept", 0),
        "dropped": {k[len("dropped_"):]: v for k, v in (ws or rk.stats).items() if k.startswith("dropped_") and v},
        "ts_shift_ns": rk.shift_ns,
        "clock_offset_ns": rk.clock_offset_ns,
        "base_time_ns": rk.base_ns or None,
        "id_offset": rk.id_offset,
        "pid_map": {str(k): v for k, v in sorted(rk.pid_map.items())},
        "lane_moves": rk.stats["lane_moves"],
        "interval_runs": rk.spilled_runs,
        "truncated_at_byte": rk.truncated_at,
        "timeline_ns": [rk.stats["ts_min_ns"], rk.stats["ts_max_ns"]]
        if rk.stats["ts_max_ns"] >= rk.stats["ts_min_ns"] else None,
    }


def _trailer(ranks_, opts, warnings, id_stride, pid_stride, dense, common_base, clocks, seconds):
    units = {rk.trace.get("displayTimeUnit") for rk in ranks_}
    inputs = {}
    for rk in ranks_:
        inputs[str(rk.rank)] = _rank_summary(rk)
    meta = {
        "version": VERSION,
        "tool": "streamtrace fuse",
        "ranks": {str(rk.rank): rk.trace for rk in ranks_},
        "inputs": inputs,
        "id_stride": id_stride,
        "pid_stride": pid_stride,
        "pid_numbering": "dense" if dense else "rank*stride+pid",
        "time_base_ns": common_base,
        "options": {"include_pyfunc": opts.include_pyfunc, "keep_spans": opts.keep_spans,
                    "cats": list(opts.cats), "name_regex": opts.name_regex,
                    "window_ns": list(opts.window) if opts.window else None, "nccl_only": opts.nccl_only,
                    "align_clocks": opts.align_clocks, "time_base": opts.time_base},
        "warnings": warnings,
        "seconds": round(seconds, 3),
    }
    if clocks is not None:
        meta["clock_alignment"] = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in json.loads(clocks.to_json(orient="records"))]
    tail = b"]"
    if len(units) == 1 and isinstance(next(iter(units)), str):
        tail += b',"displayTimeUnit":' + json.dumps(next(iter(units))).encode()
    tail += b',"streamtrace":' + json.dumps(meta, separators=(",", ":"), allow_nan=False,
                                            default=_json_default).encode() + b"}"
    return tail


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return None if math.isnan(o) else float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ---------------------------------------------------------------- TraceLens-compatible API

def _spans_mask(args):
    """Run ``filter_fn`` on every event of one file; return (bits, n_events)."""
    path, rank, filter_fn = args
    fz = _native.Fuser(rank=rank, flags=0)
    fz.begin(fz.SPANS)
    bits = bytearray()
    state = {"n": 0}

    def on_spans(view, spans):
        if not len(spans):
            return
        top = int(spans[-1, 0]) + 1
        if len(bits) * 8 < top:
            bits.extend(bytes((top + 7) // 8 - len(bits)))
        for idx, off, length in spans.tolist():
            event = json.loads(bytes(view[off:off + length]))
            if filter_fn(event):
                bits[idx >> 3] |= 1 << (idx & 7)

    _feed_file(fz, path, fz.SPANS, on_spans=on_spans)
    state["n"] = fz.stats()["events_seen"]
    if len(bits) * 8 < state["n"]:
        bits.extend(bytes((state["n"] + 7) // 8 - len(bits)))
    return bytes(bits), state["n"]


class TraceFuse:
    """TraceLens's ``TraceFuse`` API over streamtrace's streaming fuse.

    ``TraceFuse(files, use_multiprocessing=False, max_workers=None)``:
    ``files`` is a list of per-rank paths (rank = position) or a
    ``{rank: path}`` dict (e.g. rank 0 of each node).  ``merge_and_save``
    writes the fused trace and returns its path; ``merge`` returns the event
    list.  Without ``filter_fn``, ``cat == "Trace"`` and (unless
    ``include_pyfunc``) ``python_function`` events are dropped, as in
    TraceLens; a ``filter_fn`` alone decides which events are kept (it sees
    each event as a dict: the slow path).  ``use_multiprocessing`` processes
    ranks in parallel (threads over the C core; worker processes for a
    ``filter_fn``, which must then be picklable).

    Beyond TraceLens: ids never collide across ranks, process names are
    TraceLens's ``RANK r - CPU``/``RANK r - GPU`` with the device in a
    ``process_labels`` record, overlapping X events get sibling
    lanes, and each rank's top-level metadata is kept under ``streamtrace``
    (see docs/fuse.md).
    """

    def __init__(self, files, use_multiprocessing=False, max_workers=None):
        if isinstance(files, dict):
            self.rank2file = {int(r): str(p) for r, p in files.items()}
        else:
            self.rank2file = {i: str(p) for i, p in enumerate(files)}
        if not self.rank2file:
            raise StreamtraceError("TraceFuse needs at least one trace file")
        self.rank2filepath = self.rank2file   # TraceLens's name for it
        self.files = list(self.rank2file.values())
        self.ranks = list(self.rank2file)
        self.use_multiprocessing = bool(use_multiprocessing)
        self.max_workers = max_workers
        self.last_result = None

    def _jobs(self):
        if not self.use_multiprocessing:
            return 1
        return max(1, self.max_workers or os.cpu_count() or 1)

    def _masks(self, filter_fn):
        items = [(p, r, filter_fn) for r, p in self.rank2file.items()]
        if self.use_multiprocessing and len(items) > 1:
            from concurrent.futures import ProcessPoolExecutor  # here: multiprocessing is slow to import

            with ProcessPoolExecutor(max_workers=min(self._jobs(), len(items))) as pool:
                results = list(pool.map(_spans_mask, items))
        else:
            results = [_spans_mask(x) for x in items]
        return {r: res for (_, r, _), res in zip(items, results)}

    def _fuse(self, output, filter_fn, include_pyfunc, compression=None):
        masks = self._masks(filter_fn) if filter_fn is not None else None
        self.last_result = fuse(dict(self.rank2file), output, include_pyfunc=include_pyfunc,
                                jobs=self._jobs(), compression=compression, _masks=masks)
        return self.last_result

    def merge_and_save(self, output_file="merged_trace.json", filter_fn=None, include_pyfunc=False):
        """Write the fused trace; returns the path written.

        Like TraceLens, a name that does not end in ``.gz`` (or ``.zst``) gets
        ``.gz`` appended and gzip output; a ``.gz``/``.zst`` name is used as given.
        """
        path = str(output_file)
        if compression_for(path) == "none":
            path += ".gz"
        self._fuse(path, filter_fn, include_pyfunc)
        return path

    def merge(self, filter_fn=None, include_pyfunc=False):
        """The fused events as a list of dicts (holds them all in memory)."""
        fd, tmp = tempfile.mkstemp(prefix="streamtrace-fuse-", suffix=".json")
        os.close(fd)
        try:
            self._fuse(tmp, filter_fn, include_pyfunc, compression="none")
            with open(tmp, "rb") as fh:
                return json.load(fh)["traceEvents"]
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
