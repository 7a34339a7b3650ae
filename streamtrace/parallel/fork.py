"""Running independent pieces of work on two cores with ``fork``.

Building and formatting report sheets and estimating clock offsets are
Python code that holds the GIL, so threads do not make them faster.  A
forked child sees the parent's data copy-on-write (nothing is pickled on the
way in): it writes its share of a report's files while the parent writes the
rest (``split_in_two``), or computes one part of a result and sends it back
pickled (``both``: small tables, not the data they come from).  ``fork`` is used only
where it is safe: on POSIX, and only when the process runs no other thread (a
forked child of a multi-threaded process may inherit a lock held by a thread
that does not exist in it).
"""
import os
import pickle
import signal
import sys
import threading

from ..errors import StreamtraceError

PR_SET_PDEATHSIG = 1   # linux/prctl.h


def become_worker(parent_pid, keep_stdout=False):
    """Set up a freshly forked worker process so that it never outlives its
    parent nor holds the parent's pipes open.

    * It is killed (SIGKILL) when the parent dies, however the parent dies
      (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing).
    * SIGTERM and SIGHUP get their default action back (the parent's Python
      handlers were inherited with the fork), and SIGINT is ignored: a
      Ctrl-C reaches the whole process group, and the parent ends its
      workers itself.
    * Its stdout is /dev/null (unless ``keep_stdout``): a worker holding the
      write end of ``streamtrace extract | ...`` would keep the reader
      waiting after the parent is gone."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            pass
    if os.getppid() != parent_pid:   # the parent died before prctl took effect
        os._exit(1)
    if not keep_stdout:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)


def can_fork():
    """True when ``split_in_two`` would fork: POSIX, one thread running."""
    return hasattr(os, "fork") and threading.active_count() == 1


def split_in_two(tasks, weights):
    """Run ``tasks`` (callables without arguments) in two groups of about
    equal total ``weight``: one group in a forked child process, the other
    here.  Falls back to running every task here when ``can_fork()`` is
    false.  Returns when all tasks are done; a failure in the child is raised
    here as a StreamtraceError carrying the child's message."""
    if len(tasks) < 2 or not can_fork():
        for task in tasks:
            task()
        return
    mine, theirs = balanced(tasks, weights)
    child = Child(theirs)
    try:
        for task in mine:
            task()
        child.wait()
    finally:
        child.stop()


def both(here, there, fork=True):
    """``(here(), there())``, with ``there`` run in a forked child meanwhile
    when ``fork`` (the caller's judgement that it pays) and ``can_fork()``;
    else after ``here``, in this process.  The child's result comes back
    pickled, so it should be small (tables, not timelines); an exception in
    it is raised here, as itself when it pickles."""
    if not (fork and can_fork()):
        return here(), there()
    child = Child([there], send_result=True)
    try:
        mine = here()
        return mine, child.wait()
    finally:
        child.stop()


class Child:
    """A forked child process running ``tasks`` (callables without
    arguments) while this process goes on; ``wait()`` returns when it is done
    and raises its failure here (a StreamtraceError with the child's
    message); ``stop()`` kills it if it is still running.  With
    ``send_result`` the last task's return value (pickled) is what ``wait()``
    returns.  Fork only where ``can_fork()``."""

    def __init__(self, tasks, send_result=False):
        self._send_result = send_result
        self._read, write_end = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the child: its tasks, then exit without running any cleanup of the parent's
            os.close(self._read)
            status = 0
            try:
                become_worker(parent)
                result = None
                for task in tasks:
                    result = task()
                if send_result:
                    _write_all(write_end, pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
            except BaseException as exc:  # noqa: B036 - every failure is reported to the parent
                _write_all(write_end, _failure(exc, send_result))
                status = 1
            os._exit(status)
        os.close(write_end)

    def wait(self):
        data = _read_all(self._read)
        _, status = os.waitpid(self.pid, 0)
        self._close()
        if status == 0:
            return pickle.loads(data) if self._send_result else None
        if os.WIFSIGNALED(status):
            raise StreamtraceError(f"a worker process was killed by signal {os.WTERMSIG(status)}")
        if self._send_result:
            raise pickle.loads(data)
        raise StreamtraceError(data.decode("utf-8", "replace") or "a writer process failed")

    def stop(self):
        if self.pid is None:
            return
        try:  # this process failed first: stop the child and reap it
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self._close()

    def _close(self):
        if self.pid is not None:
            os.close(self._read)
            self.pid = None


def balanced(items, weights):
    """Two lists of ``items`` with about equal total weight (heaviest first,
    each to the lighter list)."""
    groups, totals = ([], []), [0, 0]
    for w, i in sorted(((w, i) for i, w in enumerate(weights)), reverse=True):
        g = 0 if totals[0] <= totals[1] else 1
        groups[g].append(items[i])
        totals[g] += w
    return groups


def _failure(exc, pickled):
    """What a failed child sends: the exception pickled (when it pickles and
    the parent expects pickles), else its message."""
    message = (str(exc) or type(exc).__name__).encode("utf-8", "replace")[:4000]
    if not pickled:
        return message
    try:
        data = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # some exceptions pickle but cannot be rebuilt
        return data
    except Exception:  # noqa: BLE001 - then the message, as a StreamtraceError
        return pickle.dumps(StreamtraceError(message.decode("utf-8", "replace")))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd):
    chunks = []
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
