"""``extract``: trace files -> event stream, in fixed-size chunks.

``extract_rank`` is a generator of frames for one trace file: the C tokenizer
fills record arrays from a bounded buffer, and each full batch becomes frames.
Memory is the buffer (grown only for a single item larger than it) plus the
rank's interned strings, whatever the size of the trace.
"""
import collections
import contextlib
import io
import json
import logging
import os
import shutil
import tempfile

import numpy as np

from . import _native
from .errors import StreamtraceError, TraceError
from .io.reading import chunk_reader, input_extent, open_source
from .parallel.dask import as_executor
from .parallel.executor import Serial, local_executor
from .parallel.threads import prefetched
from .progress import rank_done, rank_reporters
from .remote import local_path, redact, source_label
from .stream.format import MAX_RANK, Frame, Kind, StreamWriter, json_frame, record_frame, strings_frames
from .stream.limits import writer_frame_bytes

log = logging.getLogger("streamtrace")

STITCH_BYTES = 64 << 10  # first bytes of a chunk tried when completing a carried item
#: records per frame written to a stream: ~1.5 MB of events, which keeps
#: ``extract``'s peak RSS under 64 MB
BATCH_EVENTS = 16384
MAX_ITEM_BYTES = 256 << 20  # one event or top-level member larger than this is refused
VERSION = "0.1.0"


def decode_raw_string(raw):
    """JSON-escaped bytes (without quotes) -> str; never raises."""
    if b"\\" not in raw:
        return raw.decode("utf-8", "replace")
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        try:
            return json.loads('"' + raw.decode("utf-8", "replace") + '"', strict=False)
        except ValueError:
            return raw.decode("utf-8", "replace")


def _parse_meta_value(path, key, raw):
    try:
        return json.loads(raw)
    except ValueError:
        # the C scanner is lenient inside values it skips; keep the text
        return {"unparsed": raw.decode("utf-8", "replace")}


def extract_rank(path, rank=None, world_size=None, keep_pyfunc=False, position=0,
                 chunk_size=None, progress=None, gzip_backend=None, strict=False, drop_flows=False,
                 align_only=False, batch_events=BATCH_EVENTS, map_window=None, summarize=True):
    """Yield the frames of one trace file.

    ``rank`` is the rank the caller assigned (flag, position, regex); when None
    the trace's ``distributedInfo.rank`` is used, else ``position``.  Raises
    TraceError for unreadable, corrupt or non-trace input.  A truncated trace
    yields every complete event and records a warning in the metadata.
    ``drop_flows`` leaves flow events (ph s/f/t) out, in the C tokenizer: for
    in-process consumers that use none (the one-shot report's align); the
    metadata then says so.  ``align_only`` also leaves out, unparsed, the
    complete events align never reads (every one but kernels, kernel
    launches and collective CPU ops; ``align_wants`` in the C tokenizer).
    ``batch_events``: records per output array, so at most that many
    records per frame (the tokenizer's buffers grow with it).
    ``map_window``: bytes per memory-mapped window of a plain file (None:
    ``chunk_size``, else ``MappedChunks.WINDOW``); each window is one hand-off
    between the read-ahead thread and the tokenizer's, and a few feeds.
    ``summarize``: count what ``dump --what summary`` shows into the META
    frame (kernels, streams, time span: a few numpy passes over every EVENTS
    frame, ~10 % of extraction); readers that write no stream leave it out.
    """
    path = str(path)
    source, close = open_source(path, gzip_backend)
    try:
        # named without a URL's credentials in messages, warnings and the metadata
        yield from _extract(redact(path), source, rank, world_size, keep_pyfunc, position, chunk_size, progress,
                            strict, drop_flows, align_only, batch_events, map_window, summarize)
    finally:
        close()


def _extract(path, source, rank, world_size, keep_pyfunc, position, chunk_size, progress, strict, drop_flows,
             align_only, batch_events, map_window, summarize=True):
    ex = _RankExtraction(path, source, rank, position, progress,
                         _native.Tokenizer(keep_pyfunc=keep_pyfunc, capacity=batch_events, drop_flows=drop_flows,
                                           align_only=align_only, source=path), summarize)
    yield from ex.tokenize(chunk_reader(source, chunk_size, map_window))
    ex.check_document(strict)
    yield from ex.drain()
    meta = ex.metadata(world_size)
    meta["keep_pyfunc"] = bool(keep_pyfunc)
    meta["streamtrace_version"] = VERSION
    if drop_flows:
        meta["drop_flows"] = True
    if align_only:
        meta["align_only"] = True
    yield json_frame(Kind.META, ex.resolved_rank, meta)


class _RankExtraction:
    """One file's extraction: the tokenizer and what is learnt on the way (the
    top-level members, the rank, warnings, where a truncated file ends).  Its
    methods run per chunk or per full record batch, never per event."""

    def __init__(self, path, source, rank, position, progress, tok, summarize=True):
        self.path, self.source, self.rank, self.position, self.progress = path, source, rank, position, progress
        self.tok = tok
        self.trace_meta = {}
        self.warnings = []
        self.resolved_rank = None
        self.truncated_at = None
        self.carry = bytearray()
        self.counts = None
        self.tally = _Tally() if summarize else None

    def warn(self, message):
        self.warnings.append(message)
        log.warning(message)

    def resolve_rank(self):
        """The rank given, else distributedInfo.rank, else the position."""
        path, rank, position = self.path, self.rank, self.position
        dist = self.trace_meta.get("distributedInfo")
        trace_rank = dist.get("rank") if isinstance(dist, dict) else None
        if rank is not None:
            if isinstance(trace_rank, int) and trace_rank != rank:
                self.warn(f"{path}: rank {rank} from the file name/flags, but distributedInfo.rank is {trace_rank}; "
                          f"using {rank}")
            return rank
        if isinstance(trace_rank, int) and trace_rank > MAX_RANK:
            self.warn(f"{path}: distributedInfo.rank {trace_rank} is not a valid rank (0 to {MAX_RANK}); "
                      f"using {position}, its position among the inputs")
            return position
        return trace_rank if isinstance(trace_rank, int) and trace_rank >= 0 else position

    def drain(self):
        """Frames for the strings and records the tokenizer holds (the rank is
        resolved at the first drain: the members before the events are read)."""
        if self.resolved_rank is None:
            self.resolved_rank = self.resolve_rank()
        tok, rank = self.tok, self.resolved_rank
        first, raw = tok.take_new_strings()
        if raw:
            strings = [decode_raw_string(r) for r in raw]
            if self.tally is not None:
                self.tally.strings(first, strings)
            yield from strings_frames(rank, first, strings)   # several when they are over a frame's limit
        events, kernels, comms = tok.take_records()
        for kind, payload in ((Kind.EVENTS, events), (Kind.KERNELS, kernels), (Kind.COMMS, comms)):
            if payload:
                frame = record_frame(kind, rank, payload)
                if kind == Kind.EVENTS and self.tally is not None:
                    self.tally.events(frame.records())
                yield frame

    def run(self, data, start, length, at_eof):
        """Feed ``data[start:start + length]`` until the tokenizer needs more
        input, draining full record arrays; returns (status, bytes consumed)."""
        tok, trace_meta, progress, path = self.tok, self.trace_meta, self.progress, self.path
        total = 0
        while True:
            status, consumed = tok.feed(data, length - total, eof=at_eof, start=start + total)
            total += consumed
            for key, raw in tok.take_meta():
                k = decode_raw_string(key)
                trace_meta[k] = _parse_meta_value(path, k, raw)
            if progress:
                counts = tok.counts()
                progress({**counts, **input_extent(self.source, counts["bytes_consumed"])})
            if status != _native.OUTPUT_FULL:
                return status, total
            yield from self.drain()

    def trailing_data(self):
        return TraceError(self.path, "unexpected data after the end of the JSON document",
                          self.tok.counts()["bytes_consumed"])

    # Chunks come from a read-ahead thread.  An item (event or top-level
    # member) cut by a chunk boundary is carried over: its bytes plus the
    # start of the next chunk go through the small ``carry`` buffer, then
    # tokenizing continues in the chunk itself, so the bulk of the input is
    # never copied.
    def tokenize(self, reader):
        """Every chunk through the tokenizer, yielding frames as record arrays
        fill; stops at the end of the document, the input or a truncation."""
        status = _native.OK
        try:
            while status == _native.OK:
                chunk, n = reader.next_chunk()
                if n == 0:  # end of input: the last feed says done or truncated
                    reader.recycle(chunk)
                    carry = self.carry
                    status, consumed = yield from self.run(carry, 0, len(carry), True)
                    if status == _native.DONE and bytes(carry[consumed:]).strip():
                        raise self.trailing_data()
                    break
                status, pos = yield from self.feed_chunk(chunk, n)
                if status == _native.DONE:
                    self.expect_only_whitespace(reader, chunk, pos, n)
                    break
                reader.recycle(chunk)
        finally:
            reader.close()
        if status == _native.TRUNCATED:
            self.truncated_at = self.tok.counts()["bytes_consumed"]

    def feed_chunk(self, chunk, n):
        """One chunk: first completes a carried item, then tokenizes in place;
        an item cut at the chunk's end is carried.  Returns (status, bytes used)."""
        carry = self.carry
        status, pos = _native.OK, 0
        while carry and pos < n and status == _native.OK:
            if len(carry) >= MAX_ITEM_BYTES:
                raise TraceError(self.path, f"a single event or top-level value is larger than "
                                            f"{MAX_ITEM_BYTES >> 20} MiB", self.tok.counts()["bytes_consumed"])
            carried = len(carry)
            take = min(n - pos, max(STITCH_BYTES, carried))  # doubling: O(item size) in total
            carry += memoryview(chunk)[pos:pos + take]
            pos += take
            status, consumed = yield from self.run(carry, 0, len(carry), False)
            if consumed >= carried:  # the carried item is done: back to the chunk
                pos -= len(carry) - consumed
                carry.clear()
            else:
                del carry[:consumed]
        if status == _native.OK and not carry:
            status, consumed = yield from self.run(chunk, pos, n - pos, False)
            pos += consumed
            if status == _native.OK:
                carry += memoryview(chunk)[pos:n]
        return status, pos

    def expect_only_whitespace(self, reader, chunk, pos, n):
        """After the document: the rest of the input must be whitespace."""
        rest = bytes(self.carry) + bytes(chunk[pos:n])
        if rest.strip():
            raise self.trailing_data()
        self.carry.clear()
        reader.recycle(chunk)
        while True:
            chunk, n = reader.next_chunk()
            if n == 0:
                break
            if bytes(chunk[:n]).strip():
                raise self.trailing_data()
            reader.recycle(chunk)

    def check_document(self, strict):
        """Refuse what is not a trace; warn (or, ``strict``, refuse) a truncated one."""
        self.counts = counts = self.tok.counts()   # as the document ends: the META frame's counts
        path, truncated_at, source = self.path, self.truncated_at, self.source
        cut = getattr(source, "read_error", lambda: None)()   # a URL whose connection failed mid-read
        if not counts["doc_started"]:
            if cut:
                raise TraceError(path, f"no data ({cut})")
            if source.truncated:
                raise TraceError(path, f"the {source.kind} stream ends before any data (truncated file)")
            raise TraceError(path, "empty file (no JSON)")
        if not counts["saw_events"]:
            if truncated_at is not None:
                raise TraceError(path, "truncated before the traceEvents array (no events to keep)", truncated_at)
            raise TraceError(path, "not a trace: the JSON has no traceEvents array")
        if truncated_at is not None:
            why = f" ({cut})" if cut else " (the compressed stream ends early)" if source.truncated else ""
            if strict:
                raise TraceError(path, f"truncated{why} (--strict)", truncated_at)
            self.warn(f"{path}: truncated at byte {truncated_at}{why}; {counts['events_seen']} complete events "
                      f"before the cut")
        elif source.truncated or cut:
            why = cut or "the compressed stream ends early"
            if strict:
                raise TraceError(path, f"{why} (--strict)")
            self.warn(f"{path}: {why}, but the JSON document is complete")

    def metadata(self, world_size):
        """The META frame's dict (after the last drain), with the warnings
        only the whole document can give."""
        path, counts, trace_meta = self.path, self.counts, self.trace_meta
        dist = trace_meta.get("distributedInfo") if isinstance(trace_meta.get("distributedInfo"), dict) else {}
        trace_ws = dist.get("world_size")
        if world_size is not None and isinstance(trace_ws, int) and trace_ws != world_size:
            self.warn(f"{path}: --world_size is {world_size} but distributedInfo.world_size is {trace_ws}")
        if counts.get("string_times"):
            self.warn(f"{path}: {counts['string_times']} ts/dur values were strings, not numbers "
                      f"(\"ts\": \"123\"; left empty)")
        if counts["bad_numbers"]:
            self.warn(f"{path}: {counts['bad_numbers']} numeric fields were not numbers or out of range (left empty)")
        if self.rank is not None:
            rank_from = "flag"
        elif self.resolved_rank != self.position or "rank" in dist:
            rank_from = "distributedInfo"
        else:
            rank_from = "position"
        return {
            "source": source_label(path),
            "rank": self.resolved_rank,
            "world_size": world_size if world_size is not None else trace_ws,
            "rank_from": rank_from,
            "compression": self.source.kind,
            "layout": "array" if counts["bare_array"] else "object",
            "trace": trace_meta,
            "counts": counts,
            "truncated_at_byte": self.truncated_at,
            "warnings": self.warnings,
            **({"summary": self.tally.summary()} if self.tally is not None else {}),
        }


class _Tally:
    """What ``dump --what summary`` shows of a rank, counted as its event
    frames go by, so that it reads the META frame instead of every record.
    Strings are classified once each, events one numpy pass per frame."""

    def __init__(self):
        self.kernel_cats, self.nccl_names = [], []   # string ids
        self.kernels = self.nccl_kernels = 0
        self.streams = set()
        self.first_ts = self.last_end = None

    def strings(self, first, strings):
        for i, s in enumerate(strings, first):
            if s in ("kernel", "Kernel"):
                self.kernel_cats.append(i)
            low = s.lower()
            if "nccl" in low or "rccl" in low:
                self.nccl_names.append(i)

    def events(self, e):
        kernel = np.isin(e["cat"], self.kernel_cats)
        if kernel.any():
            self.kernels += int(kernel.sum())
            self.nccl_kernels += int(np.isin(e["name"][kernel], self.nccl_names).sum())
            self.streams.update(np.unique(e["stream"][kernel]).tolist())
        x = (e["ph"] == ord("X")) & ((e["flags"] & _native.FLAGS["has_ts"]) != 0)
        if x.any():
            ts = e["ts"][x]
            first, end = int(ts.min()), int((ts + e["dur"][x]).max())
            self.first_ts = first if self.first_ts is None else min(first, self.first_ts)
            self.last_end = end if self.last_end is None else max(end, self.last_end)

    def summary(self):
        return {"kernels": self.kernels, "nccl_kernels": self.nccl_kernels, "gpu_streams": len(self.streams),
                "first_ts": self.first_ts, "last_end": self.last_end}


# ---------------------------------------------------------------- many ranks

class _RankClaims:
    """Which input each rank came from: the same rank from two files would
    make every later stage refuse the stream, so extract refuses it first."""

    def __init__(self):
        self._by_rank = {}

    def claim(self, rank, index, path):
        first = self._by_rank.setdefault(rank, (index, path))
        if first[0] != index:
            raise StreamtraceError(f"{path}: rank {rank} appears twice in the input (also {first[1]}); "
                                   "give each rank's trace once")

    def frames(self, frames, index, path):
        for frame in frames:
            self.claim(frame.rank, index, path)
            yield frame


PACK_AHEAD = 4   # frames packed ahead of the writer: ~6 MB of records


def packed_ahead(frames, depth=PACK_AHEAD):
    """``frames`` in order, each one's payload packed in a helper thread up
    to ``depth`` frames ahead of the caller: compressing the records
    (numpy copies and zstd, both without the GIL) overlaps the tokenizer
    instead of following it.  An error packing a frame is raised where
    that frame would have been yielded."""
    from concurrent.futures import ThreadPoolExecutor

    pending = collections.deque()
    with ThreadPoolExecutor(1, thread_name_prefix="streamtrace-pack") as pool:
        try:
            for frame in frames:
                pending.append((frame, pool.submit(getattr, frame, "payload")))
                if len(pending) > depth:
                    done, future = pending.popleft()
                    future.result()
                    yield done
            while pending:
                done, future = pending.popleft()
                future.result()
                yield done
        finally:
            for _, future in pending:   # stopped early (an error, an interrupt): no more packing
                future.cancel()


#: frames the tokenizer runs ahead of a rank's summaries (``summarized``)
SUMMARY_PREFETCH_FRAMES = 8


#: a trace smaller than this on disk is extracted without summaries:
#: collecting such a rank again takes milliseconds, and its summaries would
#: be a good part of its stream (a 25 KB trace's stream grew from 1/9.8 to
#: 1/4.6 of its JSON).  ``STREAMTRACE_SUMMARIES_MIN_BYTES`` overrides it
#: (the tests summarize their small fixtures with 0).
SUMMARIES_MIN_BYTES = 1 << 20


def _worth_summarizing(path):
    setting = os.environ.get("STREAMTRACE_SUMMARIES_MIN_BYTES", str(SUMMARIES_MIN_BYTES))
    try:
        limit = int(setting)
    except ValueError:
        raise StreamtraceError(f"STREAMTRACE_SUMMARIES_MIN_BYTES={setting!r}: not a number of bytes") from None
    try:
        return os.path.getsize(local_path(path)) >= limit
    except (OSError, ValueError, TypeError):   # a URL, stdin: of a size not known here
        return True


def _rank_frames(inp, world_size, keep_pyfunc, strict, summarized, progress=None):
    """One rank's frames as extract writes them: its events, and with
    ``summarized`` (a function of the frames, e.g. ``chain.summarized``)
    its per-rank summaries around them (traces of ``SUMMARIES_MIN_BYTES``
    or more).  The tokenizer (no GIL) then runs in a thread of its own,
    ahead of the summaries' collecting."""
    frames = extract_rank(inp.path, inp.rank, world_size, keep_pyfunc, inp.position, progress=progress,
                          strict=strict, batch_events=stream_batch_events())
    if summarized is not None and _worth_summarizing(inp.path):
        frames = summarized(prefetched(frames, depth=SUMMARY_PREFETCH_FRAMES, name="streamtrace-extract"))
    return packed_ahead(frames)


def stream_batch_events():
    """Records per frame of a stream: ``BATCH_EVENTS``, fewer when the
    frame limit is set lower than its 1.5 MiB (an event record, the
    largest, is 96 bytes), so that the stream is read with that setting."""
    return max(1, min(BATCH_EVENTS, writer_frame_bytes() // Kind.RECORDS[Kind.EVENTS].itemsize))


def _extract_to_file(args):
    inp, world_size, keep_pyfunc, strict, summarized, out_path = args
    ranks = set()
    with open(out_path, "wb") as f:
        writer = StreamWriter(f, write_header=False)
        for frame in _rank_frames(inp, world_size, keep_pyfunc, strict, summarized):
            ranks.add(frame.rank)
            writer.write(frame)
    return out_path, ranks


def _extract_to_bytes(args):
    """The map on a cluster, whose workers may not share this machine's
    files: one rank's stream frames (no header) as bytes, and its ranks."""
    inp, world_size, keep_pyfunc, strict, summarized = args
    ranks = set()
    buf = io.BytesIO()
    writer = StreamWriter(buf, write_header=False)
    for frame in _rank_frames(inp, world_size, keep_pyfunc, strict, summarized):
        ranks.add(frame.rank)
        writer.write(frame)
    return buf.getvalue(), ranks


def _extract_remote(inputs, output, writer, claims, executor, options, progress=None):
    """``extract``'s map on a cluster (``executor.remote``): each rank's
    frames come back as bytes and are written here in rank order (a rank's
    stream waits on its worker until its turn)."""
    items = [(inp, *options) for inp in inputs]
    # one rank's stream on this side at a time: a stream is the size of its events
    for i, (data, ranks) in enumerate(executor.map(_extract_to_bytes, items, fetch_ahead=1)):
        for r in ranks:
            claims.claim(r, i, inputs[i].path)
        output.write(data)
        rank_done(progress, i)
    writer.close()


def extract(inputs, output, world_size=None, keep_pyfunc=False, jobs=None, strict=False, progress=None,
            executor=None, summarized=None):
    """Extract every RankInput into one stream written to ``output`` (a binary
    file object).  The map extracts a rank into a stream file of its own; the
    reduce copies those out in rank order.  ``jobs`` > 1 (or an
    ``executor``): ranks in parallel worker processes (at most one per rank
    and per CPU); an executor on a cluster (``remote``; or a
    ``distributed.Client``) sends each rank's frames back as bytes.  One
    worker: the ranks are extracted here, straight to the output.
    ``summarized``: a function of a rank's frames that adds its per-rank
    summaries (``chain.summarized``, what the CLI and ``streamtrace.extract``
    pass; None writes the events alone).  However this ends (an error, ``Interrupted`` from a signal), the
    workers are gone and the temporary files removed when it returns."""
    writer = StreamWriter(output)
    claims = _RankClaims()
    reporters = rank_reporters(progress, inputs)
    executor = as_executor(executor)
    executor_ = executor if executor is not None else local_executor(jobs, len(inputs), kind="processes")
    if getattr(executor_, "remote", False):
        _extract_remote(inputs, output, writer, claims, executor_, (world_size, keep_pyfunc, strict, summarized),
                        progress)
        return
    if isinstance(executor_, Serial):
        for (i, inp), report in zip(enumerate(inputs), reporters):
            writer.write_all(claims.frames(_rank_frames(inp, world_size, keep_pyfunc, strict, summarized, report),
                                           i, inp.path))
        writer.close()
        return
    tmpdir = tempfile.mkdtemp(prefix="streamtrace-")
    try:
        jobs_args = [(inp, world_size, keep_pyfunc, strict, summarized, os.path.join(tmpdir, f"{i}.stev"))
                     for i, inp in enumerate(inputs)]
        with contextlib.ExitStack() as owned:
            if executor is None:
                owned.enter_context(executor_)
            for i, (out_path, ranks) in enumerate(executor_.map(_extract_to_file, jobs_args)):
                for r in ranks:
                    claims.claim(r, i, inputs[i].path)
                with open(out_path, "rb") as part:
                    shutil.copyfileobj(part, output, 1 << 20)
                os.unlink(out_path)
                rank_done(progress, i)   # worker processes cannot report as they read
        writer.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def peek_metadata(path, limit=16 << 20):
    """Top-level members before the first event, reading at most ``limit`` bytes.

    Cheap: it stops at the first event, so ``distributedInfo`` and
    ``deviceProperties`` (which Kineto writes first) come back without reading
    the whole trace.
    """
    source, close = open_source(path)
    try:
        tok = _native.Tokenizer(capacity=1, source=path)
        meta, buf, filled = {}, bytearray(1 << 16), 0
        while filled < limit:
            n = source.read_into(buf, filled)
            filled += n
            status, consumed = tok.feed(buf, filled, eof=n == 0)
            for key, raw in tok.take_meta():
                meta[decode_raw_string(key)] = _parse_meta_value(path, key, raw)
            buf[: filled - consumed] = buf[consumed:filled]
            filled -= consumed
            if status != _native.OK or n == 0 or tok.counts()["events_seen"]:
                break
            if filled == len(buf):
                buf.extend(bytes(len(buf)))
        return meta
    finally:
        close()
