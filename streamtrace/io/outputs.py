"""Outputs that appear only when complete.

Every output file is written under a temporary name in its target directory,
renamed over the target on success (given the usual permissions, which
``mkstemp``'s 0600 would not), and deleted on failure, so no command ever
leaves a partial file behind under the name the user asked for.
"""
import contextlib
import os
import tempfile

from ..errors import StreamtraceError


def umask():
    """The process umask (reading it requires setting it; set it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path, suffix=""):
    """A temporary path next to ``path``, renamed to ``path`` if the block succeeds."""
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise StreamtraceError(f"{path}: the output directory does not exist")
    if os.path.isdir(path):   # found before the work, not at the rename after it
        raise StreamtraceError(f"{path}: is a directory, not an output file")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".streamtrace-", suffix=suffix, dir=directory)
    except OSError as exc:   # read-only, no permission
        raise StreamtraceError(f"{path}: cannot write in its directory: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())
        try:
            os.replace(tmp, path)
        except OSError as exc:   # e.g. a directory put in its place during the run
            raise StreamtraceError(f"{path}: cannot replace it: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path):
    """A binary file object whose contents appear at ``path`` only on success."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            yield f
