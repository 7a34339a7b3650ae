"""Inputs and outputs at URLs (``s3://``, ``gs://``, ``https://``, any fsspec
protocol), through fsspec.

fsspec and its protocol packages (the ``remote`` extra) are imported only
when a URL is used: a run on local paths never pays for them.  ``file://``
URLs are turned into local paths (``local_path``) and take the local code
paths, memory maps and atomic renames included.

Reads are one ranged request per large block (``BLOCK_SIZE``), never a
whole download.  Every request of a read -- the size, a listing, a block --
runs on fsspec's event loop under a deadline (``net_timeouts``, ``_wait``),
and is cancelled at a stop signal, so neither a silent server nor a signal
leaves a reading thread waiting.  A connection cut in the middle of a read
ends the input there, with a warning: what was read is kept, as for a
truncated local file; a timeout is an error.  An output is written to a local temporary file and
uploaded once complete, with the run's other outputs (``io.outputs.OutputSet``),
so nothing appears at the URL when a run fails.  http(s) URLs are read only.

Credentials and endpoints come from the environment and the protocols' own
config files, as each package reads them (for S3, botocore honours
``AWS_ENDPOINT_URL``); opening a URL needs nothing but the URL, so worker
processes on other hosts open it the same way.  Messages never show a URL's
user name, password or query string (``redact``).
"""
import contextlib
import io
import logging
import os
import posixpath
import re
import tempfile
import time
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from .errors import Interrupted, StreamtraceError, TraceError, TraceNotFoundError
from .settings import env_seconds

log = logging.getLogger("streamtrace")

#: bytes per ranged request: large, as the read is one sequential pass
#: (STREAMTRACE_REMOTE_BLOCK_SIZE overrides it)
BLOCK_SIZE = 8 << 20

#: seconds one network operation may take -- an object's size, a listing, one
#: block of a body -- retries included (STREAMTRACE_NET_TIMEOUT_S overrides it);
#: also the longest a socket may stay silent
NET_TIMEOUT_S = 30
#: seconds a connection to a server may take (STREAMTRACE_NET_CONNECT_TIMEOUT_S)
NET_CONNECT_TIMEOUT_S = 10

#: a protocol, or a chain of them (``simplecache::s3://``), then ://
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(?:::[A-Za-z][A-Za-z0-9+.\-]*)*://")
#: a URL inside a message: scheme://[userinfo@]host/path[?query][#fragment]
_URL_IN_TEXT = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)(?:[^/\s@]*@)?([^\s?#'\"]*)(?:[?#][^\s'\"]*)?")


def is_url(path):
    """True for a URL that fsspec opens (``file://`` excluded: see ``local_path``)."""
    if not isinstance(path, str):
        return False
    return bool(_SCHEME.match(path)) and not path.lower().startswith("file://")


def local_path(path):
    """``file:///x/y`` as ``/x/y``; anything else unchanged."""
    if isinstance(path, str) and path.lower().startswith("file://"):
        parts = urlsplit(path)
        if parts.netloc not in ("", "localhost"):
            raise StreamtraceError(f"{redact(path)}: a file:// URL names a file on this machine "
                                   "(file:///path or file://localhost/path)")
        return unquote(parts.path) or "/"
    return path


def redact(url):
    """``url`` without user name, password, query string or fragment (where
    signed URLs and some stores keep credentials)."""
    url = str(url)
    if "://" not in url:
        return url
    return redact_text(url)


def redact_text(text):
    """``text`` with every URL in it redacted."""
    return _URL_IN_TEXT.sub(lambda m: m.group(1) + m.group(2), str(text))


def source_label(path):
    """How an input is named in outputs' metadata: a URL redacted, a local
    path absolute, stdin as '-'."""
    path = str(path)
    if path == "-":
        return path
    if is_url(path):
        return redact(path)
    return os.path.abspath(local_path(path))


def normalised(url):
    """A URL as compared for 'the same object': scheme and host in lower case,
    the path without '.', '..' or doubled slashes, no trailing slash."""
    parts = urlsplit(url)
    path = posixpath.normpath(re.sub("/+", "/", parts.path)) if parts.path else ""
    if path in (".", "/"):
        path = ""
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def join(url, name):
    return url.rstrip("/") + "/" + name


# ------------------------------------------------------------------ file systems

def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise StreamtraceError("reading or writing URLs needs fsspec: pip install 'streamtrace[remote]'") from None
    return fsspec


def net_timeouts():
    """``(connect, operation)`` seconds: NET_CONNECT_TIMEOUT_S and
    NET_TIMEOUT_S, or what the environment sets."""
    return (env_seconds("STREAMTRACE_NET_CONNECT_TIMEOUT_S", NET_CONNECT_TIMEOUT_S),
            env_seconds("STREAMTRACE_NET_TIMEOUT_S", NET_TIMEOUT_S))


def _timeout_options(scheme):
    """The protocol's own socket timeouts, so that a silent server fails the
    request itself (aiohttp for http(s), botocore for s3); ``_wait`` bounds
    the whole operation whatever the protocol."""
    connect, idle = net_timeouts()
    if scheme in ("http", "https"):
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=connect,
                                                                   sock_read=idle)}}
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": connect, "read_timeout": idle}}
    return {}


def filesystem(url, params=None):
    """``(fs, path)`` for ``url``: the protocol's file system (credentials and
    endpoint from the environment and config) and the path within it.
    ``params``: a query sent with every http(s) request (a listing's)."""
    fsspec = _fsspec()
    try:
        options = _timeout_options(urlsplit(url).scheme.lower())
        if params:
            options["params"] = params
        # listings are never cached: a run sees the store as it is now
        fs, path = fsspec.core.url_to_fs(url, use_listings_cache=False, **options)
    except ImportError as exc:   # the protocol's package is missing (s3fs, gcsfs, aiohttp...)
        raise StreamtraceError(f"{redact(url)}: this protocol needs a package that is not installed "
                               f"({exc.name or exc}); pip install 'streamtrace[remote]' covers s3 and http(s)") from None
    except (ValueError, TypeError) as exc:   # an unknown protocol, a malformed URL
        raise StreamtraceError(f"{redact(url)}: {redact_text(exc)}") from None
    return fs, path


def _root_cause(exc):
    """The error under fsspec's own: its HTTP file system reports a refusal
    (403) or an unreachable server as FileNotFoundError raised from the real one."""
    seen = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


class _TimedOut(Exception):
    """A network operation that did not finish in time (``_wait``)."""

    def __init__(self, seconds):
        super().__init__(f"timed out after {seconds:g} s (STREAMTRACE_NET_TIMEOUT_S)")


class NetTimeoutError(StreamtraceError, TimeoutError):
    """A URL whose server did not answer in time: one line, exit 1.  Not a
    TraceError: nothing may take it for an unreadable file and try again."""


def _timeout_reason(exc):
    """The reason for a timeout anywhere in ``exc``'s chain (ours, aiohttp's,
    botocore's), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, _TimedOut):
            return str(exc)
        name = type(exc).__name__
        if "ConnectTimeout" in name or "ConnectionTimeout" in name:
            return f"cannot reach the server: no connection within {net_timeouts()[0]:g} s " \
                   "(STREAMTRACE_NET_CONNECT_TIMEOUT_S)"
        if "Timeout" in name or isinstance(exc, TimeoutError):
            return f"timed out after {net_timeouts()[1]:g} s (STREAMTRACE_NET_TIMEOUT_S)"
        exc = exc.__cause__ or exc.__context__
    return None


def reason(exc):
    """A one-line reason for a failed remote operation, with no credentials."""
    timed_out = _timeout_reason(exc)
    if timed_out:
        return timed_out
    if any("Payload" in type(e).__name__ or "ContentLength" in type(e).__name__ for e in (exc, _root_cause(exc))):
        return "the connection closed before the end of the response"
    cause = _root_cause(exc)
    if cause is not exc and not isinstance(cause, FileNotFoundError):
        status = getattr(cause, "status", None)
        if status != 404:
            exc = cause
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(exc, FileNotFoundError):
        return "no such object"
    if isinstance(exc, PermissionError) or status in (401, 403):
        return "access denied" + (f" (HTTP {status})" if isinstance(status, int) else "")
    if isinstance(exc, IsADirectoryError):
        return "is a directory (a prefix), not an object"
    if isinstance(status, int):
        return f"HTTP {status}"
    name = type(exc).__name__
    text = redact_text(str(exc)).strip().splitlines()
    if "Connect" in name or isinstance(exc, (ConnectionError, TimeoutError)) or "Could not connect" in str(exc):
        return "cannot reach the server" + (f" ({text[0]})" if text else "")
    return f"{name}: {text[0]}" if text else name


def _block_size():
    value = os.environ.get("STREAMTRACE_REMOTE_BLOCK_SIZE")
    return int(value) if value and value.isdigit() and int(value) > 0 else BLOCK_SIZE


# ------------------------------------------------------------------ reading

def _wait(fs, coro, seconds):
    """``coro`` run on ``fs``'s event loop, waited for at most ``seconds``
    (then _TimedOut) and never past a stop signal (then Interrupted, also in
    a reading thread, whose join the main thread's clean-up waits on).  The
    operation is cancelled either way, its connection closed."""
    import asyncio
    import concurrent.futures

    future = asyncio.run_coroutine_threadsafe(coro, fs.loop)
    deadline = time.monotonic() + seconds
    try:
        while not future.done():
            if Interrupted.pending is not None:
                raise Interrupted(Interrupted.pending)
            left = deadline - time.monotonic()
            if left <= 0:
                raise _TimedOut(seconds)
            concurrent.futures.wait([future], timeout=min(0.1, left))
    except BaseException:
        future.cancel()
        raise
    return future.result()


def _is_async(fs):
    """fsspec's asynchronous file systems (http(s), s3, gcs...): their
    operations can be bounded and cancelled (``_wait``); others' cannot."""
    return getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None


def split_query(url):
    """``(url without its query and fragment, the query)`` for an http(s)
    URL (a signed or token URL); ``(url, "")`` for any other."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return url, ""
    return urlunsplit(parts._replace(query="", fragment="")), parts.query


class _CutSafeRaw(io.RawIOBase):
    """A remote file as a raw stream, read one block per request
    (``fetch(start, size)``), whose read error ends the input instead of the
    run: the reader above sees a short file and handles it as a truncated one
    (events kept; --strict refuses it), naming ``cut``, the reason, in its
    message.  A timeout is not a cut but an error: the run stops, exit 1."""

    def __init__(self, fetch, url, size, block, close=None):
        self._fetch, self._url, self._size, self._block, self._close = fetch, url, size, block, close
        self._pos = 0
        self._data, self._at = memoryview(b""), 0   # the block last fetched, and how far it was read
        self.cut = None   # the reason, once a read failed

    def readable(self):
        return True

    def readinto(self, buf):
        if self._at == len(self._data):
            if self.cut is not None or (self._size is not None and self._pos >= self._size):
                return 0
            try:
                want = self._block if self._size is None else min(self._block, self._size - self._pos)
                self._data, self._at = memoryview(self._fetch(self._pos, want)), 0
            except Exception as exc:   # aiohttp, botocore, OSError: whatever the protocol raises
                problem = reason(exc)
                if _timeout_reason(exc):
                    raise NetTimeoutError(f"{redact(self._url)}: the read at byte {self._pos} {problem}") from None
                self.cut = f"the read failed at byte {self._pos}: {problem}"   # a failed request loses one block at most
                return 0
            if not len(self._data):
                return 0
        n = min(len(buf), len(self._data) - self._at)
        buf[:n] = self._data[self._at:self._at + n]
        self._at += n
        self._pos += n
        return n

    def close(self):
        if not self.closed and self._close is not None:
            with contextlib.suppress(Exception):
                self._close()
        super().close()


def _reader(fs, path, url, block, seconds):
    """``_CutSafeRaw``'s arguments for ``path``: its size from one request,
    then ranged reads of a block each, every request bounded by ``_wait``."""
    if not _is_async(fs):   # sftp, ftp...: fsspec's own reads, bounded by the protocol if at all
        # "readahead": one ranged request per block as the read moves on
        f = fs.open(path, "rb", block_size=block, cache_type="readahead")
        return (lambda start, n: f.read(n)), f.size, f.close
    info = _wait(fs, fs._info(path), seconds)
    if info.get("type") == "directory":
        raise IsADirectoryError(path)
    size = info.get("size")
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    http = "http" in protocols
    if size == 0:
        return (lambda start, n: b""), 0, None
    if size is None or (http and info.get("partial") is False):   # a server that cannot send ranges: one stream
        f = _wait(fs, fs.open_async(path, "rb"), seconds)
        return (lambda start, n: _wait(fs, f.read(n), seconds)), None, (lambda: _wait(fs, f.close(), seconds))
    if http:   # fsspec's ranged GET for http: refuses a server that ignores the range past the start
        f = fs.open(path, "rb", size=size, block_size=block, cache_type="none")
        return (lambda start, n: _wait(fs, f.async_fetch_range(start, start + n), seconds)), size, None
    return (lambda start, n: _wait(fs, fs._cat_file(path, start=start, end=start + n), seconds)), size, None


def open_input(url):
    """A buffered binary reader for ``url`` (``peek`` works, for sniffing);
    one line naming the URL when it cannot be opened.  After a short read,
    ``read_error(reader)`` says whether a failed request ended it.  Every
    request is bounded by ``net_timeouts()``."""
    fs, path = filesystem(url)
    block = _block_size()
    try:
        fetch, size, close = _reader(fs, path, url, block, net_timeouts()[1])
    except Exception as exc:
        problem = reason(exc)
        if _timeout_reason(exc):
            raise NetTimeoutError(f"{redact(url)}: {problem}") from None
        cls = TraceNotFoundError if problem == "no such object" else TraceError
        raise cls(redact(url), problem) from None
    return io.BufferedReader(_CutSafeRaw(fetch, url, size, block, close), buffer_size=1 << 20)


def read_error(reader):
    """Why ``open_input``'s reader ended early (None: it reached the end)."""
    return getattr(getattr(reader, "raw", None), "cut", None)


def _call(fs, name, seconds, *args, **kwargs):
    """``fs.<name>(*args)``: its asynchronous form under ``_wait`` where there is one."""
    if _is_async(fs):
        return _wait(fs, getattr(fs, "_" + name)(*args, **kwargs), seconds)
    return getattr(fs, name)(*args, **kwargs)


def isdir(url):
    """True when ``url`` names a directory (a prefix with objects under it);
    one line when the server does not answer in time."""
    fs, path = filesystem(url)
    try:
        return _call(fs, "isdir", net_timeouts()[1], path)
    except Exception as exc:
        if _timeout_reason(exc):
            raise NetTimeoutError(f"{redact(url)}: {reason(exc)}") from None
        return False   # reported when it is opened as a file


def list_files(url):
    """The names (not paths) of the objects directly under ``url``; one line
    when it cannot be listed.  An http(s) URL's query is sent with the listing."""
    base, query = split_query(url)
    fs, path = filesystem(base, params=parse_qsl(query, keep_blank_values=True) if query else None)
    try:
        entries = _call(fs, "ls", net_timeouts()[1], path, detail=True)
    except FileNotFoundError as exc:
        if _timeout_reason(exc):   # fsspec's http reports any failure so
            raise NetTimeoutError(f"{redact(url)}: cannot list it: {reason(exc)}") from None
        return []
    except Exception as exc:
        cls = NetTimeoutError if _timeout_reason(exc) else StreamtraceError
        raise cls(f"{redact(url)}: cannot list it: {reason(exc)}") from None
    return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "file")


def glob(pattern, stripped=False):
    """The URLs of the objects matching ``pattern`` (fsspec's glob, ``**``
    allowed), sorted; ``stripped``: ``(pattern's path, matching paths)``
    within the file system instead, for callers that rebuild the URLs in the
    user's spelling.  An http(s) pattern's query (a token) is sent with the
    listing, matched against no name, and kept on each URL returned."""
    base, query = split_query(pattern)
    fs, path = filesystem(base, params=parse_qsl(query, keep_blank_values=True) if query else None)
    try:
        found = _call(fs, "glob", net_timeouts()[1], path, detail=True)
    except FileNotFoundError as exc:
        if _timeout_reason(exc):
            raise NetTimeoutError(f"{redact(pattern)}: cannot list it: {reason(exc)}") from None
        found = {}
    except Exception as exc:
        cls = NetTimeoutError if _timeout_reason(exc) else StreamtraceError
        raise cls(f"{redact(pattern)}: cannot list it: {reason(exc)}") from None
    files = sorted(p for p, info in found.items() if info.get("type") == "file")
    if stripped:
        return path, files
    return [fs.unstrip_protocol(p) + (f"?{query}" if query else "") for p in files]


# ------------------------------------------------------------------ writing

def check_output(url):
    """Before any work: the place the output goes exists (the bucket, or the
    parent 'directory' on stores that have real ones) and ``url`` is not a
    directory.  http(s) URLs are refused: a web server offers no way to
    write an object that fsspec could use, nor to remove one."""
    if urlsplit(url).scheme.lower() in ("http", "https"):
        raise StreamtraceError(f"{redact(url)}: writing to http(s) URLs is not supported "
                               "(write to a local path or an object store such as s3://)")
    fs, path = filesystem(url)
    try:
        if fs.isdir(path):
            raise StreamtraceError(f"{redact(url)}: is a directory (objects exist under it), not an output")
        root = path.split("/", 1)[0]   # the bucket, on object stores
        if root and "/" in path and not fs.exists(root):
            raise StreamtraceError(f"{redact(url)}: the bucket {root!r} does not exist")
    except StreamtraceError:
        raise
    except Exception as exc:
        raise StreamtraceError(f"{redact(url)}: cannot write it: {reason(exc)}") from None


#: longest wait, after a stop signal, for an upload under way to end before
#: it is cancelled: a server that has the whole body may still store the
#: object, and the clean-up that removes it must come after
UPLOAD_CANCEL_SECONDS = 2


def upload(local, url):
    """Put the complete local file ``local`` at ``url``; one line on failure.

    On an asynchronous file system (s3, gcs...) the transfer runs on fsspec's
    event loop: when a stop signal interrupts the wait, the request is given
    ``UPLOAD_CANCEL_SECONDS`` to end before it is cancelled, so that an
    object the server was storing has landed before the caller's clean-up
    (``remove_if_changed``) looks for it."""
    fs, path = filesystem(url)
    try:
        if getattr(fs, "async_impl", False) and hasattr(fs, "_put_file"):
            _put_async(fs, local, path)
        else:
            fs.put_file(local, path)
    except Exception as exc:
        raise StreamtraceError(f"{redact(url)}: cannot write it: {reason(exc)}") from None


def _put_async(fs, local, path):
    import asyncio
    import concurrent.futures

    future = asyncio.run_coroutine_threadsafe(fs._put_file(local, path), fs.loop)
    try:
        future.result()
    except BaseException:
        # a server that has the whole body may still store it: let the request
        # end (for a while) so that the caller's clean-up comes after it
        concurrent.futures.wait([future], timeout=UPLOAD_CANCEL_SECONDS)
        future.cancel()
        raise


#: the fields of fsspec's info() that change when an object is written again
_VERSION_FIELDS = ("ETag", "etag", "LastModified", "last_modified", "mtime", "updated", "generation", "md5Hash",
                   "VersionId", "size")


def object_state(url):
    """What identifies the version of the object at ``url`` now (None: there
    is none), for ``remove_if_changed``."""
    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise StreamtraceError(f"{redact(url)}: cannot write it: {reason(exc)}") from None
    return {k: str(info[k]) for k in _VERSION_FIELDS if k in info} or {k: str(v) for k, v in info.items()}


def remove_if_changed(url, before):
    """Take back an upload to ``url``: remove the object if it is not the one
    that was there before (``object_state``; an earlier object that was
    replaced is not restored)."""
    if object_state(url) != before:
        remove(url)


def remove(url):
    """Delete the object at ``url`` if it exists."""
    fs, path = filesystem(url)
    try:
        if fs.exists(path):
            fs.rm_file(path)
    except Exception as exc:
        raise StreamtraceError(f"{redact(url)}: cannot remove it: {reason(exc)}") from None
