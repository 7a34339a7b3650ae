"""Inputs and outputs at URLs (``s3://``, ``gs://``, ``https://``, any fsspec
protocol), through fsspec.

fsspec and its protocol packages (the ``remote`` extra) are imported only
when a URL is used: a run on local paths never pays for them.  ``file://``
URLs are turned into local paths (``local_path``) and take the local code
paths, memory maps and atomic renames included.

Reads stream through a read-ahead cache in large ranged blocks
(``BLOCK_SIZE``), never a whole download.  A connection cut in the middle of
a read ends the input there, with a warning: what was read is kept, as for a
truncated local file.  An output is written to a local temporary file and
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
from urllib.parse import unquote, urlsplit, urlunsplit

from .errors import StreamtraceError, TraceError, TraceNotFoundError

log = logging.getLogger("streamtrace")

#: bytes per ranged request: large, as the read is one sequential pass
#: (STREAMTRACE_REMOTE_BLOCK_SIZE overrides it)
BLOCK_SIZE = 8 << 20

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


def filesystem(url):
    """``(fs, path)`` for ``url``: the protocol's file system (credentials and
    endpoint from the environment and config) and the path within it."""
    fsspec = _fsspec()
    try:
        # listings are never cached: a run sees the store as it is now
        fs, path = fsspec.core.url_to_fs(url, use_listings_cache=False)
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


def reason(exc):
    """A one-line reason for a failed remote operation, with no credentials."""
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

class _CutSafeRaw(io.RawIOBase):
    """A remote file as a raw stream whose read error ends the input instead
    of the run: the reader above sees a short file and handles it as a
    truncated one (events kept; --strict refuses it), naming ``cut``, the
    reason, in its message."""

    def __init__(self, f, url, block):
        self._f, self._url, self._block = f, url, block
        self._pos = 0
        self.cut = None   # the reason, once a read failed

    def readable(self):
        return True

    def readinto(self, buf):
        if self.cut is not None:
            return 0
        try:
            data = self._f.read(min(len(buf), self._block))   # a failed request loses one block at most
        except Exception as exc:   # aiohttp, botocore, OSError: whatever the protocol raises
            self.cut = f"the read failed at byte {self._pos}: {reason(exc)}"
            return 0
        n = len(data)
        buf[:n] = data
        self._pos += n
        return n

    def close(self):
        if not self.closed:
            with contextlib.suppress(Exception):
                self._f.close()
        super().close()


def open_input(url):
    """A buffered binary reader for ``url`` (``peek`` works, for sniffing);
    one line naming the URL when it cannot be opened.  After a short read,
    ``read_error(reader)`` says whether a failed request ended it."""
    fs, path = filesystem(url)
    block = _block_size()
    try:
        # "readahead": one ranged request per block as the read moves on (suits
        # one sequential pass; fsspec's default caches suit random access)
        f = fs.open(path, "rb", block_size=block, cache_type="readahead")
    except Exception as exc:
        problem = reason(exc)
        cls = TraceNotFoundError if problem == "no such object" else TraceError
        raise cls(redact(url), problem) from None
    return io.BufferedReader(_CutSafeRaw(f, url, block), buffer_size=1 << 20)


def read_error(reader):
    """Why ``open_input``'s reader ended early (None: it reached the end)."""
    return getattr(getattr(reader, "raw", None), "cut", None)


def isdir(url):
    """True when ``url`` names a directory (a prefix with objects under it)."""
    fs, path = filesystem(url)
    try:
        return fs.isdir(path)
    except Exception:   # reported when it is opened as a file
        return False


def list_files(url):
    """The names (not paths) of the objects directly under ``url``; one line
    when it cannot be listed."""
    fs, path = filesystem(url)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    except Exception as exc:
        raise StreamtraceError(f"{redact(url)}: cannot list it: {reason(exc)}") from None
    return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "file")


def glob(pattern, stripped=False):
    """The URLs of the objects matching ``pattern`` (fsspec's glob, ``**``
    allowed), sorted; ``stripped``: ``(pattern's path, matching paths)``
    within the file system instead, for callers that rebuild the URLs in the
    user's spelling."""
    fs, path = filesystem(pattern)
    try:
        found = fs.glob(path, detail=True)
    except FileNotFoundError:
        found = {}
    except Exception as exc:
        raise StreamtraceError(f"{redact(pattern)}: cannot list it: {reason(exc)}") from None
    files = sorted(p for p, info in found.items() if info.get("type") == "file")
    return (path, files) if stripped else [fs.unstrip_protocol(p) for p in files]


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
UPLOAD_CANCEL_SECONDS = 5


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
