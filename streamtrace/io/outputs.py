"""Outputs that appear only when complete, and never clobber what is not a file.

A regular output file (or a new one) is written under a temporary name in
its target directory, renamed over the target on success (given the usual
permissions, which ``mkstemp``'s 0600 would not), and deleted on failure, so
no command ever leaves a partial file behind under the name the user asked
for.  A symlink is followed first: the file it points to is replaced, the
link stays a link.

A URL (``s3://...``, see ``streamtrace.remote``) is written to a local
temporary file and uploaded when complete: nothing appears at it on failure.

Anything else -- a character device (``/dev/null``), a FIFO, a terminal, or a
``/dev/stdout``-style link into ``/proc/<pid>/fd`` -- is written straight
into: renaming over it would replace the device or the pipe with a regular
file (as root, ``/dev/null`` itself).  Such a write cannot be taken back, so
a failure there may leave part of the output in the pipe.
"""
import contextlib
import errno
import os
import stat
import sys
import tempfile

from ..errors import StreamtraceError, os_error
from ..remote import is_url, local_path

#: compression suffixes an output path could ask for that no writer honours
#: (fuse writes .gz and .zst; every other output is uncompressed by design)
UNSUPPORTED_COMPRESSION = (".bz2", ".xz", ".lzma", ".lz4", ".zip", ".z", ".br", ".7z", ".tgz", ".sz")


#: errors of a write (not of reading an input) that come without a file name
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


def umask():
    """The process umask (reading it requires setting it; set it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _under_proc(directory):
    return directory == "/proc" or directory.startswith("/proc/")


def resolve_output(path):
    """Where an output at ``path`` really goes: ``(target, direct)``.

    ``target`` is ``path`` with every symlink followed, one link at a time
    (a link to a link to a file: the file); ``direct`` is true when the
    target is an existing non-regular file, or when a link led into
    ``/proc`` (``/dev/stdout``, ``/dev/fd/1``: the process's own open file,
    whatever it is, must be written as the shell opened it, not replaced).
    A directory, a socket or a link loop is refused with one line.  A URL
    is its own target, with ``direct`` true: there is nothing beside it to
    write temporary files into."""
    path = local_path(str(path))
    if is_url(path):
        return path, True
    target = os.path.abspath(path)
    for _ in range(40):   # the kernel's own limit on links in a path
        head, tail = os.path.split(target)
        head = os.path.realpath(head)   # the directories: their links never matter, only where they lead
        target = os.path.join(head, tail)
        if _under_proc(head) and os.path.lexists(target):   # /proc/<pid>/fd/N: a process's open file
            return target, True
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return target, False   # a new file (or a dangling link's target): created atomically
        except OSError as exc:
            raise os_error(path, exc, "cannot use it as an output") from None
        if stat.S_ISLNK(st.st_mode):
            target = os.path.join(head, os.readlink(target))
            continue
        if stat.S_ISREG(st.st_mode):
            return target, False
        if stat.S_ISDIR(st.st_mode):
            raise StreamtraceError(f"{path}: is a directory, not an output file")
        if stat.S_ISSOCK(st.st_mode):
            raise StreamtraceError(f"{path}: is a socket, not an output file")
        return target, True   # a character or block device, a FIFO
    raise StreamtraceError(f"{path}: too many levels of symbolic links")


def check_suffix(path, allowed=()):
    """Refuse an output name asking for a compression nothing here writes."""
    name = str(path).lower()
    for suffix in UNSUPPORTED_COMPRESSION:
        if name.endswith(suffix) and suffix not in allowed:
            raise StreamtraceError(f"{path}: {suffix} output is not supported "
                                   f"(write the uncompressed file and compress it, or pipe it: -o - | ...)")


def same_file(a, b):
    """Whether paths ``a`` and ``b`` are one existing file (any links, names or mounts)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def refuse_input_as_output(output, inputs, what="output"):
    """One line, before any work, when ``output`` is one of ``inputs`` (the
    same file, not just the same name): writing it would destroy the input.
    A special file (/dev/stdout, a pipe) being both is fine: nothing is
    replaced."""
    if not output or output == "-":
        return
    output = local_path(str(output))
    if is_url(output):
        _refuse_url_as_output(output, inputs, what)
        return
    try:
        st = os.stat(output)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(st.st_mode):
        return
    for inp in inputs:
        if inp == "-":   # stdin redirected from the output file: compared by its fd
            try:
                si = os.fstat(0)
            except OSError:
                continue
            same, inp = (si.st_dev, si.st_ino) == (st.st_dev, st.st_ino), "<stdin>"
        else:
            same = bool(inp) and same_file(output, local_path(str(inp)))
        if same:
            raise StreamtraceError(f"{output}: the {what} is also an input ({inp}); writing it would destroy "
                                   "the input: choose another name")


def _refuse_url_as_output(output, inputs, what):
    """``refuse_input_as_output`` for a URL: the same object by its normalised URL."""
    from ..remote import normalised, redact

    key = normalised(output)
    for inp in inputs:
        if inp and is_url(str(inp)) and normalised(str(inp)) == key:
            raise StreamtraceError(f"{redact(output)}: the {what} is also an input ({redact(inp)}); writing it "
                                   "would destroy the input: choose another name")


def stdout_buffer(what="the output"):
    """The binary stdout, or one line when there is none (``>&-``: Python
    starts with ``sys.stdout`` None when its fd 1 is closed)."""
    out = sys.stdout
    closed = StreamtraceError(f"stdout is closed: nowhere to write {what} (give -o FILE)")
    if out is None:
        raise closed
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):   # not an fd at all (a caller's own text stream)
        return getattr(out, "buffer", out)
    try:
        os.fstat(fd)
    except OSError:
        raise closed from None
    return out.buffer


def _open_direct(path, target):
    """An existing non-regular file (or the process's own fd), opened for writing."""
    try:
        # /proc/<pid>/fd/N of this process: its own open file, shared as the
        # shell opened it (same offset, same append mode): `{ ...; } > f` keeps
        # what came before
        fd_dir = os.path.dirname(target)
        if fd_dir in (f"/proc/{os.getpid()}/fd", "/proc/self/fd") and os.path.basename(target).isdigit():
            return os.fdopen(os.dup(int(os.path.basename(target))), "wb")
        return open(target, "wb")   # O_TRUNC means nothing to a device or a FIFO
    except OSError as exc:
        raise os_error(path, exc, "cannot write to it") from None


@contextlib.contextmanager
def atomic_file(path, suffix=""):
    """A binary file object whose contents appear at ``path`` only on success
    (a non-regular ``path``: written straight into, see the module): a set
    of one output (``OutputSet``)."""
    with OutputSet() as outputs:
        with outputs.file(path, suffix) as f:
            yield f


class OutputSet:
    """The outputs of one run, staged, then committed together: all of them
    appear, or none does.

    ``file`` writes each one under a temporary name (beside its target; a
    URL's in $TMPDIR) and ``add`` takes an output that stages itself (a
    ``CsvDir``).  Leaving the ``with`` block without an error commits: the
    URLs are uploaded first (the slow step, the likeliest to fail), then the
    local files are renamed into place.  Any error or stop signal before the
    last of them is in place -- the commit included -- undoes what was
    committed: a replaced local file gets its earlier version back, an
    uploaded object is removed (an earlier object at that URL is not
    restored), and every temporary file is removed.  A file written straight
    into (a device, a FIFO, stdout) cannot be staged: it is written as it
    goes.  Once ``commit`` has returned the run is complete, and a stop
    signal that arrives later no longer changes its exit status
    (``committed``)."""

    def __init__(self):
        # staged outputs: .path, .remote, and place() (put it in place), rollback()
        # (undo place(), even one cut short), finish() (drop what a rollback
        # needed) and discard() (remove the temporary files)
        self._staged = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.discard()
        return False

    def add(self, staged):
        """An output staged by its own writer (``CsvDir``), committed with the others."""
        self._staged.append(staged)
        return staged

    @contextlib.contextmanager
    def file(self, path, suffix=""):
        """A binary file object for the output ``path``, staged on success."""
        path = local_path(str(path))
        if is_url(path):
            with _staged_url(path, suffix) as (f, staged):
                yield f
            self._staged.append(staged)
            return
        target, direct = resolve_output(path)
        if direct:
            with _direct(path, target) as f:
                yield f
            return
        with _staged_local(path, target, suffix) as (f, staged):
            yield f
        self._staged.append(staged)

    def commit(self):
        """Put every staged output in place, URLs first; on any failure
        (or a stop signal) undo the ones already in place and raise."""
        global _committed
        order = [s for s in self._staged if s.remote] + [s for s in self._staged if not s.remote]
        done = []
        try:
            for staged in order:
                done.append(staged)   # before: a signal inside commit() leaves it to be rolled back
                staged.place()
            _committed = True
        except BaseException:
            for staged in reversed(done):
                with contextlib.suppress(Exception):
                    staged.rollback()
            self.discard()
            raise
        for staged in order:   # the earlier versions kept for a rollback
            with contextlib.suppress(Exception):
                staged.finish()
        self._staged = []

    def discard(self):
        """Remove every staged output's temporary file (nothing was committed)."""
        for staged in self._staged:
            with contextlib.suppress(Exception):
                staged.discard()
        self._staged = []


#: set once an OutputSet has committed: the CLI's stop-signal handler then
#: lets the command finish (its outputs are complete) instead of exiting 128+n
_committed = False


def committed():
    """Whether this process has put a run's outputs in place (``OutputSet``)."""
    return _committed


@contextlib.contextmanager
def _direct(path, target):
    f = _open_direct(path, target)
    try:
        yield f
        f.flush()
    except OSError as exc:
        if exc.filename is None and exc.errno in _WRITE_ERRNOS:
            raise os_error(path, exc, "cannot write to it") from None
        raise
    finally:
        with contextlib.suppress(OSError):
            f.close()


@contextlib.contextmanager
def _staged_local(path, target, suffix):
    """``(file object, _LocalFile)``: the output written under a temporary
    name in its target's directory."""
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise StreamtraceError(f"{path}: the output directory does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".streamtrace-", suffix=suffix, dir=directory)
    except OSError as exc:   # read-only, no permission
        raise os_error(path, exc, "cannot write in its directory") from None
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                yield f, _LocalFile(path, target, tmp)
        except OSError as exc:   # a full disk, an I/O error: the user's path, never the hidden one
            if exc.filename == tmp or (exc.filename is None and exc.errno in _WRITE_ERRNOS):
                raise os_error(path, exc, "cannot write it") from None
            raise
        os.chmod(tmp, 0o666 & ~umask())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _LocalFile:
    """A local output staged as ``tmp`` beside ``target``.  Its commit keeps
    the file it replaces as ``tmp + '.prev'`` (a hard link: the target never
    goes missing) until the whole set is in place, so a rollback restores it.
    Every step is read back from the file system, so a rollback is right
    wherever a signal cut the commit short."""

    remote = False

    def __init__(self, path, target, tmp):
        self.path, self.target, self.tmp = path, target, tmp
        self.prev = tmp + ".prev"

    def place(self):
        target = self.target
        try:
            # the target as it is now: a directory or a device put in its place during
            # the run is refused, not replaced
            if os.path.lexists(target) and (os.path.islink(target) or not os.path.isfile(target)):
                raise StreamtraceError(f"{self.path}: cannot replace it: it is no longer a regular file")
            if os.path.lexists(target):
                try:
                    os.link(target, self.prev)
                except OSError:   # no hard links here: the earlier file is moved aside instead
                    os.rename(target, self.prev)
            os.replace(self.tmp, target)
        except OSError as exc:   # e.g. a directory put in its place during the run
            raise os_error(self.path, exc, "cannot replace it") from None

    def rollback(self):
        if os.path.lexists(self.tmp):   # never moved in: the target is as it was (or aside, below)
            os.unlink(self.tmp)
            if os.path.lexists(self.prev) and not os.path.lexists(self.target):
                os.rename(self.prev, self.target)
        elif os.path.lexists(self.prev):
            os.replace(self.prev, self.target)
        else:
            os.unlink(self.target)
        self.finish()

    def finish(self):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.prev)

    def discard(self):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


@contextlib.contextmanager
def _staged_url(url, suffix):
    """``(file object, _UrlFile)``: the output written to a local temporary
    file, uploaded by the commit."""
    from ..remote import check_output

    check_output(url)
    fd, tmp = tempfile.mkstemp(prefix=".streamtrace-upload-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, _UrlFile(url, tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _UrlFile:
    """An output at a URL, staged as the local file ``tmp``.  The object's
    version before the upload is noted, so that a rollback removes only an
    object this run put there."""

    remote = True

    def __init__(self, url, tmp):
        self.path, self.tmp = url, tmp
        self.before = _NOT_READ

    def place(self):
        from ..remote import object_state, upload

        self.before = object_state(self.path)
        upload(self.tmp, self.path)   # cancelled and ended if it fails or is interrupted
        self.discard()

    def rollback(self):
        from ..remote import remove_if_changed

        if self.before is not _NOT_READ:
            remove_if_changed(self.path, self.before)

    def finish(self):
        pass

    def discard(self):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


_NOT_READ = object()
