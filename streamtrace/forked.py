"""Running independent pieces of work on two cores with ``fork``.

Formatting report sheets as text is Python code that holds the GIL, so threads
do not make it faster.  A forked child sees the parent's sheets copy-on-write
(nothing is pickled) and writes its share of the files while the parent
writes the rest.  ``fork`` is used only where it is safe: on POSIX, and only
when the process runs no other thread (a forked child of a multi-threaded
process may inherit a lock held by a thread that does not exist in it).
"""
import os
import threading

from .errors import StreamtraceError


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
    mine, theirs = _balanced(tasks, weights)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its tasks, then exit without running any cleanup of the parent's
        os.close(read_end)
        status = 0
        try:
            for task in theirs:
                task()
        except BaseException as exc:  # noqa: B036 - every failure is reported to the parent
            os.write(write_end, (str(exc) or type(exc).__name__).encode("utf-8", "replace")[:4000])
            status = 1
        os._exit(status)
    os.close(write_end)
    reaped = False
    try:
        for task in mine:
            task()
        message = _read_all(read_end)
        _, status = os.waitpid(pid, 0)
        reaped = True
        if status != 0:
            if os.WIFSIGNALED(status):
                message = f"killed by signal {os.WTERMSIG(status)}"
            raise StreamtraceError(message or "a writer process failed")
    finally:
        os.close(read_end)
        if not reaped:  # the parent failed first: stop the child and reap it
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _balanced(tasks, weights):
    """Two lists of tasks with about equal weight (heaviest first, each to
    the lighter list)."""
    groups, totals = ([], []), [0, 0]
    for w, i in sorted(((w, i) for i, w in enumerate(weights)), reverse=True):
        g = 0 if totals[0] <= totals[1] else 1
        groups[g].append(tasks[i])
        totals[g] += w
    return groups


def _read_all(fd):
    chunks = []
    while True:
        data = os.read(fd, 65536)
        if not data:
            return b"".join(chunks).decode("utf-8", "replace")
        chunks.append(data)
