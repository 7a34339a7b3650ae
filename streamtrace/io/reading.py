"""Opening trace files: sniff the format from magic bytes, decompress in chunks.

Every source offers ``read_into(buf, start) -> int``: it fills ``buf[start:]``
(a bytearray) and returns the count, 0 at the end; after the end,
``truncated`` says whether the compressed stream stopped early.
gzip goes through ISA-L (the ``isal`` package, ~2-3x zlib) when it is
installed, else through the C core's zlib inflater; zstd through
``zstandard``; anything else is read as plain JSON.
"""
import functools
import io
import mmap
import os
import stat
import sys

from .. import _native
from ..errors import TraceError, TraceNotFoundError, os_reason
from ..parallel.threads import prefetched
from ..remote import is_url, local_path

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_SIZE = 1 << 18  # compressed bytes per read
BUFFER_CHUNK = 1 << 20  # uncompressed bytes per tokenizer chunk

try:  # optional fast path; the zlib path in the C core is always there
    from isal import igzip_lib as _isal
except ImportError:  # pragma: no cover - isal is a declared dependency
    _isal = None


def sniff(head):
    if head[:2] == GZIP_MAGIC:
        return "gzip"
    # a zstd frame, or a skippable frame (magic 0x184D2A50..5F, little-endian),
    # which pzstd writes first; zstandard skips those
    if head[:4] == ZSTD_MAGIC or (len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18"):
        return "zstd"
    return "json"


def _zeros_to_end(data, f):
    """True if ``data`` and the rest of ``f`` are zero bytes only: the padding
    that tape and tar tools leave after a gzip file (gzip -d accepts it)."""
    while data:
        if data.count(0) != len(data):
            return False
        data = f.read(READ_SIZE)
    return True


class PlainSource:
    kind = "json"

    def __init__(self, f, from_path=False):
        self._f = f
        self.from_path = from_path  # a named file (not stdin): may be memory-mapped
        self.truncated = False

    def read_into(self, buf, start):
        with memoryview(buf) as mv:
            return self._f.readinto(mv[start:]) or 0


class ZlibGzipSource:
    """gzip through the C core (zlib)."""

    kind = "gzip"

    def __init__(self, f, path):
        self._f, self._path = f, path
        self._inf = _native.Inflater(source=path)
        self._in = b""
        self._eof = False
        self.truncated = False

    def read_into(self, buf, start):
        made = start
        while made < len(buf):
            if not self._in and not self._eof:
                self._in = self._f.read(READ_SIZE)
                self._eof = not self._in
            if not self._in and self._eof:
                self.truncated = not self._inf.at_member_end
                break
            used, n = self._inf.run(self._in, buf, made)
            self._in = self._in[used:]
            made += n
            if used == 0 and n == 0:  # needs more input than the partial buffer has
                if self._eof:
                    self.truncated = True
                    break
                more = self._f.read(READ_SIZE)
                self._eof = not more
                self._in = self._in + more
        return made - start


class IsalGzipSource:
    """gzip through ISA-L, member by member."""

    kind = "gzip"

    def __init__(self, f, path):
        self._f, self._path = f, path
        self._d = _isal.IgzipDecompressor(flag=_isal.DECOMP_GZIP)
        self._pending = b""
        self._eof = False
        self.truncated = False

    def read_into(self, buf, start):
        made = start
        while made < len(buf):
            if self._d.eof:  # member finished: another may follow
                rest = self._d.unused_data
                if not rest and not self._eof:
                    rest = self._f.read(READ_SIZE)
                    self._eof = not rest
                if not rest:
                    break
                if rest[:1] == b"\x00" and _zeros_to_end(rest, self._f):
                    self._eof = True
                    break
                if rest[:2] != GZIP_MAGIC:
                    raise TraceError(self._path, "corrupt gzip data (data after the end of the gzip stream)")
                self._d = _isal.IgzipDecompressor(flag=_isal.DECOMP_GZIP)
                self._pending = rest
            if self._d.needs_input and not self._pending:
                if self._eof:
                    self.truncated = True
                    break
                self._pending = self._f.read(READ_SIZE)
                if not self._pending:
                    self._eof = True
                    self.truncated = True
                    break
            try:
                out = self._d.decompress(self._pending, len(buf) - made)
            except Exception as exc:  # isal raises IsalError / EOFError
                raise TraceError(self._path, f"corrupt gzip data ({exc})") from None
            self._pending = b""
            buf[made:made + len(out)] = out
            made += len(out)
        return made - start


class ZstdSource:
    kind = "zstd"

    def __init__(self, f, path):
        import zstandard

        self._path = path
        self._zerr = zstandard.ZstdError
        self._r = zstandard.ZstdDecompressor().stream_reader(f, read_size=READ_SIZE, read_across_frames=True)
        self.truncated = False

    def read_into(self, buf, start):
        try:
            with memoryview(buf) as mv:
                return self._r.readinto(mv[start:])
        except self._zerr as exc:
            msg = str(exc)
            if "incomplete" in msg or "truncated" in msg or "end of stream" in msg:
                self.truncated = True
                return 0
            raise TraceError(self._path, f"corrupt zstd data ({msg})") from None


def _no_read_error():
    return None


def open_source(path, gzip_backend=None):
    """Open ``path`` ('-' for stdin; a URL through fsspec) and return ``(source, closer)``.

    Raises TraceError with a one-line reason for unreadable paths.
    """
    path = str(path)
    cut = _no_read_error   # a URL's reader says why it ended early
    if path == "-":
        f = sys.stdin.buffer
        if not isinstance(f, io.BufferedReader):
            f = io.BufferedReader(f)
        closer = lambda: None  # noqa: E731 - stdin stays open
        label = "<stdin>"
    elif is_url(path):   # ranged reads through fsspec; never memory-mapped
        from ..remote import open_input, read_error, redact

        f = open_input(path)
        closer = f.close
        label = redact(path)
        cut = functools.partial(read_error, f)
    else:
        path = local_path(path)
        label = path
        if os.path.isdir(path):
            raise TraceError(path, "is a directory, not a trace file (use --trace_dir for a directory)")
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise TraceNotFoundError(path, "no such file") from None
        except PermissionError:
            raise TraceError(path, "permission denied") from None
        except OSError as exc:
            raise TraceError(path, os_reason(exc)) from None
        closer = f.close
    head = f.peek(4)[:4]
    kind = sniff(head)
    if kind == "gzip":
        backend = gzip_backend or os.environ.get("STREAMTRACE_GZIP") or ("isal" if _isal else "zlib")
        src = IsalGzipSource(f, label) if backend == "isal" and _isal else ZlibGzipSource(f, label)
    elif kind == "zstd":
        src = ZstdSource(f, label)
    else:
        src = PlainSource(f, from_path=path != "-" and not is_url(path))
    src.read_error = cut
    src.stored = f   # the input as stored: progress counts its bytes (input_extent)
    return src, closer


def input_extent(source, consumed):
    """``{"input_read": bytes of the input as stored read so far,
    "input_size": its size}`` (None where unknown: stdin): what progress
    counts -- compressed bytes for .gz/.zst, fetched bytes of a URL.
    ``consumed``: the tokenizer's offset, which is the input's own for plain
    JSON (a memory-mapped file is never read through ``stored``)."""
    f = getattr(source, "stored", None)
    raw = getattr(f, "raw", None)
    # a URL's reader (remote._CutSafeRaw) knows its size from the first request
    size = getattr(raw, "_size", None) if raw is not None and hasattr(raw, "_pos") else None
    if size is None and f is not None:
        try:
            st = os.fstat(f.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
        except (OSError, ValueError, AttributeError):
            size = None
    if source.kind == "json":
        read = consumed
    elif raw is not None and hasattr(raw, "_pos"):
        read = raw._pos
    else:
        try:
            read = f.tell()
        except (OSError, ValueError, AttributeError):   # a pipe
            read = None
    return {"input_read": read, "input_size": size}



# ------------------------------------------------------------ chunking
#
# The tokenizer takes input in chunks.  A *producer* makes them: ``produce()``
# returns ``(chunk, length)`` (length 0 at the end of input) and
# ``release(chunk)`` takes one back once the tokenizer is done with it.  A
# *reader* (ReadAhead or ReadInline) decides on which thread producing runs.


class BufferChunks:
    """Chunks read or decompressed from a source into reusable bytearrays."""

    def __init__(self, source, chunk_size):
        import collections

        self._source = source
        self._size = chunk_size
        self._free = collections.deque()  # append/pop are atomic: two threads may use it

    def produce(self):
        buf = self._free.pop() if self._free else bytearray(self._size)
        n = 0
        while n < len(buf):  # fill the chunk: fewer, larger tokenizer calls
            got = self._source.read_into(buf, n)
            if got == 0:
                break
            n += got
        return buf, n

    def release(self, buf):
        self._free.append(buf)


class MappedChunks:
    """Chunks of a plain regular file as read-only memory maps: the tokenizer
    reads the page cache directly, with no copy.  Windows are mapped with
    MAP_POPULATE, so the page faults happen where the window is made (the
    read-ahead thread) rather than in the tokenizer; only a few windows are
    mapped at a time, so resident memory stays bounded."""

    WINDOW = 4 << 20  # a multiple of mmap.ALLOCATIONGRANULARITY

    def __init__(self, f, window=None):
        if window:  # a multiple of the granularity mmap offsets need
            gran = mmap.ALLOCATIONGRANULARITY
            self.WINDOW = -(-window // gran) * gran
        self._fd = f.fileno()
        self._size = os.fstat(self._fd).st_size
        self._offset = 0
        self._flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)

    def produce(self):
        n = min(self.WINDOW, self._size - self._offset)
        if n <= 0:
            return b"", 0
        if self._flags is not None:
            try:
                window = mmap.mmap(self._fd, n, flags=self._flags, prot=mmap.PROT_READ, offset=self._offset)
                self._offset += n
                return window, n
            except (OSError, ValueError):  # a file system without mmap: plain reads from here on
                self._flags = None
        data = os.pread(self._fd, n, self._offset)
        self._offset += len(data)
        return data, len(data)

    def release(self, window):
        close = getattr(window, "close", None)  # a map (reads give bytes)
        if close is not None:
            try:
                close()
            except BufferError:  # still exported somewhere: unmapped when collected
                pass


def _mappable(source):
    """True for plain JSON in a named, non-empty regular file."""
    if not getattr(source, "from_path", False):
        return False
    try:
        st = os.fstat(source._f.fileno())
        return source._f.tell() == 0 and stat.S_ISREG(st.st_mode) and st.st_size > 0
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


class ReadAhead:
    """Runs a producer in a background thread, a few chunks ahead
    (``parallel.threads.prefetched``).

    File reads, memory mapping and decompression (ISA-L, zstandard, the C
    core's zlib) release the GIL, as does the tokenizer, so producing chunk
    k+1 overlaps tokenizing chunk k: on two cores a ``.json.gz`` extracts at
    the speed of the slower of the two instead of their sum.  A chunk belongs
    to one side at a time (handed over through the queue, never resized);
    ``close()`` stops and joins the thread before the caller closes the
    source.  Errors raised while producing are re-raised in the consumer.
    """

    def __init__(self, producer, depth=1):
        """``depth`` chunks wait in the queue; with the one being made and the
        one being tokenized, depth + 2 are in memory at most."""
        import collections

        self._producer = producer
        self._returned = collections.deque()  # append/popleft are atomic: two threads use it
        self._chunks = prefetched(_produced(producer, self._returned), depth=depth,
                                  name="streamtrace-read-ahead")

    def next_chunk(self):
        return next(self._chunks)

    def recycle(self, chunk):
        """Give a chunk back once the tokenizer is done with it; the thread
        releases it (unmapping costs time better spent off the tokenizer's)."""
        self._returned.append(chunk)

    def close(self):
        self._chunks.close()
        while self._returned:
            self._producer.release(self._returned.popleft())


def _produced(producer, returned):
    """A producer's chunks, up to and including the empty one at the end,
    releasing the chunks handed back before making each next one."""
    while True:
        while returned:
            producer.release(returned.popleft())
        chunk, n = producer.produce()
        yield chunk, n
        if n == 0:
            return


class ReadInline:
    """ReadAhead's interface without the thread: each chunk is produced when
    the consumer asks for it (``STREAMTRACE_READ_AHEAD=0``; the benchmarks
    use it for the single-threaded figure)."""

    def __init__(self, producer):
        self._producer = producer

    def next_chunk(self):
        return self._producer.produce()

    def recycle(self, chunk):
        self._producer.release(chunk)

    def close(self):
        pass


def chunk_reader(source, chunk_size=None, map_window=None):
    """The reader for one source: memory-mapped windows for a plain regular
    file (``map_window`` bytes, else ``chunk_size``), else reusable buffers
    (``chunk_size``; None: each kind's default); produced in a read-ahead
    thread unless STREAMTRACE_READ_AHEAD=0."""
    if _mappable(source):
        producer = MappedChunks(source._f, map_window or chunk_size)
    else:
        producer = BufferChunks(source, chunk_size or BUFFER_CHUNK)
    if os.environ.get("STREAMTRACE_READ_AHEAD", "1") == "0":
        return ReadInline(producer)
    return ReadAhead(producer)
